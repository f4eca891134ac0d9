// Parallel training on the core side: where a process sits in a launch, and data parallelism's
// gradient synchronisation. Only the communicator interface (communicator.hpp) is used, so MPI,
// NCCL or a third party's plugin carries it.
//
// Data parallelism (docs/parallel.md): every rank runs the same training step on its slice of
// the global batch; GradientSync all-reduces the gradients in buckets. A bucket is started as soon
// as the kernel producing its last gradient has been enqueued, and waited for just before the
// first kernel reading one of its gradients (the optimizer's), so its communication overlaps the
// rest of backward. On a backend whose streams run asynchronously (CUDA) the bucket runs on a
// communication stream ordered by events, which a captured step records too; on a synchronous
// backend (the CPU) it runs on a communication thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plexus/abi/comm.h"
#include "plexus/graph.hpp"
#include "plexus/tensor.hpp"

namespace plexus {

class CommGroup;
class Executable;
class TensorStore;

// Where this process sits in a launch, from the launcher's environment: OpenMPI's
// OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, MPICH/Hydra's PMI_RANK, PMI_SIZE,
// MPI_LOCALRANKID, MPI_LOCALNRANKS, or Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
struct LaunchInfo {
  int32_t rank = 0, size = 1;
  int32_t local_rank = 0, local_size = 1;
  std::string source;  // "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"; "" if not launched
  bool launched() const { return !source.empty(); }
};
// Reads `getenv`-style lookups; throws ConfigError naming the variable for a value that is not
// a number or a rank outside [0, size).
LaunchInfo launch_info(const std::function<const char*(const char*)>& env);
LaunchInfo launch_info();  // from the process's environment

// Runs jobs one at a time, in the order submitted, on a thread of its own: the collectives of a
// group on a synchronous backend, so they overlap the host's work. A job that throws makes its
// wait() rethrow, and every job after it fails without running (the group is in an unknown state).
class CommWorker {
 public:
  CommWorker();
  ~CommWorker();  // finishes queued jobs, then joins
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;
  using Ticket = uint64_t;
  Ticket submit(std::function<void()> job);
  // Blocks until job `t` has run; rethrows its exception (or the earlier failure that kept it
  // from running).
  void wait(Ticket t);
  // Seconds spent running jobs.
  double busy_seconds() const;

 private:
  void loop();
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::pair<Ticket, std::function<void()>>> queue_;
  Ticket next_ = 1, finished_ = 0;  // tickets run up to finished_
  std::exception_ptr error_;
  Ticket error_at_ = 0;              // the ticket whose job failed first
  double busy_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

struct GradSyncOptions {
  uint64_t bucket_bytes = 25ull << 20;  // as PyTorch DDP's bucket_cap_mb = 25
  // false: every bucket starts after the last gradient is produced (no overlap with backward);
  // for measuring how much communication the overlap hides.
  bool overlap = true;
  plx_reduce_op op = PLX_REDUCE_SUM;
};

struct GradSyncStats {
  int64_t steps = 0;
  double comm_seconds = 0;  // time the buckets' all-reduces took (communication thread)
  double wait_seconds = 0;  // time the step waited for them: the communication not hidden
};

// All-reduces an executable's gradients in buckets, hooked into its run (Executable::add_hook).
class GradientSync {
 public:
  // `grads` are the gradient values (one per parameter; invalid entries are skipped) of `exe`'s
  // graph; `names` name them for logs. Bucket b holds consecutive gradients in the order their
  // kernels run, up to bucket_bytes (at least one), all of one dtype. Throws Error when a
  // gradient is read before another gradient of its bucket is written (the graph does not
  // separate backward from the update).
  GradientSync(CommGroup& group, Executable& exe, const std::vector<Var>& grads,
               const std::vector<std::string>& names, GradSyncOptions options = {});
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  struct Bucket {
    std::vector<Var> grads;
    std::vector<std::string> names;
    plx_dtype dtype = PLX_F32;
    uint64_t bytes = 0;
    int32_t ready = -1;  // the kernel after which every gradient is written
    int32_t need = -1;   // the first kernel that reads one
    Tensor flat;         // the bucket's buffer on the group's device
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }
  uint64_t bytes() const;  // all buckets' buffers
  GradSyncStats stats() const;
  // One line per bucket: "bucket 0: 3 gradients, 1.2 MiB, after kernel 40, before kernel 57".
  std::string describe() const;

 private:
  void start(size_t b);
  void finish(size_t b);
  CommGroup& group_;
  Executable& exe_;
  GradSyncOptions options_;
  std::vector<Bucket> buckets_;
  // Per bucket, fixed at construction (the executable's addresses never move): its gradients'
  // tensors and the name its errors carry.
  std::vector<std::vector<Tensor>> grad_tensors_;
  std::vector<std::string> labels_;
  bool async_ = false;  // the backend's streams run asynchronously: stream transport
  // Stream transport.
  plx_stream comm_stream_ = nullptr;
  std::vector<plx_event> ready_ev_, done_ev_;
  // Thread transport.
  std::unique_ptr<CommWorker> worker_;
  std::vector<CommWorker::Ticket> tickets_;
  double wait_seconds_ = 0;
  int64_t steps_ = 0;
};

// Copies every tensor of `store` from rank `root` to the other ranks of `group` (whose device
// must hold them), in name order.
void broadcast_store(CommGroup& group, const TensorStore& store, int32_t root,
                     const std::vector<std::string>& only = {});

}  // namespace plexus
