// Communicators on the core side: the plugin's plx_comm behind a C++ face. Data and pipeline
// parallelism use only this, so any communicator plugin can carry them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/abi/comm.h"

namespace plexus {

class Backend;
class LoadedPlugin;
class Runtime;
class Tensor;

class CommGroup;

class Communicator {
 public:
  Communicator(LoadedPlugin& plugin, const plx_comm* table);
  const std::string& name() const { return name_; }
  const std::vector<std::string>& backends() const { return backends_; }
  bool accepts(std::string_view backend) const;
  LoadedPlugin& plugin() const { return plugin_; }
  const plx_comm& table() const { return *t_; }

  plx_comm_id unique_id() const;
  // Joins a group of `size` ranks as `rank` (collective; blocks until all joined). rank and
  // size -1 take them from the launcher. timeout_ms 0: the plugin's default.
  std::unique_ptr<CommGroup> join(Backend& backend, int32_t device, int32_t rank, int32_t size,
                                  const plx_comm_id& id, int32_t timeout_ms = 0) const;

  [[noreturn]] void fail(plx_status s, std::string_view what) const;
  void check(plx_status s, std::string_view what) const {
    if (s != PLX_OK) fail(s, what);
  }

 private:
  LoadedPlugin& plugin_;
  const plx_comm* t_;
  std::string name_;
  std::vector<std::string> backends_;
};

// One rank's membership of a group. Operations are enqueued on the backend's stream for the
// group's device; tensors must live on that backend and device.
class CommGroup {
 public:
  CommGroup(const Communicator& comm, Backend& backend, int32_t device, plx_comm_handle h);
  ~CommGroup();
  CommGroup(const CommGroup&) = delete;
  CommGroup& operator=(const CommGroup&) = delete;

  int32_t rank() const;
  int32_t size() const;
  Backend& backend() const { return backend_; }
  int32_t device() const { return device_; }

  void all_reduce(const Tensor& send, const Tensor& recv, plx_reduce_op op);
  void all_reduce(const Tensor& inout, plx_reduce_op op) { all_reduce(inout, inout, op); }
  void broadcast(const Tensor& send, const Tensor& recv, int32_t root);
  void all_gather(const Tensor& send, const Tensor& recv);
  void reduce_scatter(const Tensor& send, const Tensor& recv, plx_reduce_op op);
  void send(const Tensor& t, int32_t peer);
  void recv(const Tensor& t, int32_t peer);
  void barrier();
  void group_begin();
  void group_end();
  void abort();
  // Throws if the plugin saw an asynchronous failure (a dead peer).
  void check_async_error();
  // Operations from now on go on `s`, a stream of the group's backend (data parallelism runs
  // gradient all-reduces on a stream of their own); nullptr: the backend's default stream.
  void set_stream(plx_stream s) { stream_ = s; }

  // Whether the plugin gives a native baseline (plx_comm.bench_native, ABI 1.1).
  bool has_bench_native() const;
  // The native baseline: `iters` calls of `collective` made straight on the plugin's library
  // (MPI, NCCL), nothing of Plexus between, for measuring our layer's overhead. Tensors as the
  // collective's method takes them (sums; broadcast in place in `recv` from root 0, `send`
  // unused). Collective and blocking; the seconds, or nullopt when the plugin has no baseline.
  std::optional<double> bench_native(plx_collective collective, const Tensor& send,
                                     const Tensor& recv, int32_t iters);

 private:
  plx_stream stream() const;
  const Communicator& comm_;
  Backend& backend_;
  int32_t device_;
  plx_comm_handle h_;
  plx_stream stream_ = nullptr;
};

// ---- launching: one rank per process under a launcher (mpirun) ----

// Where a process sits in the launch (rank, local rank): launch_info() in parallel.hpp.

// A group of every process of the launch. `group` is destroyed before `bootstrap`.
struct LaunchGroup {
  std::unique_ptr<CommGroup> bootstrap;  // the launcher's group that carried the id, if used
  std::unique_ptr<CommGroup> group;
};
// Joins `comm` on (backend, device) with every process of the launch. With `bootstrap` empty
// or naming `comm` itself, `comm` takes rank and size from the launcher (rank and size -1, as
// "mpi" does). Otherwise (NCCL, which has no launcher of its own) the communicator `bootstrap`
// joins that way first, on its first backend's device 0; rank 0 makes `comm`'s id and
// broadcasts it over that group, and every process joins `comm` with the group's rank and size.
LaunchGroup join_launch(Runtime& rt, const Communicator& comm, Backend& backend, int32_t device,
                        const std::string& bootstrap, int32_t timeout_ms = 0);

}  // namespace plexus
