// The NCCL plugin: one communicator, "nccl", running NVIDIA's NCCL on the buffers and streams of
// the "cuda" backend. Ranks are GPUs in one or many processes on one or many hosts; rank 0's id
// (get_unique_id) reaches the others through the host (the core broadcasts it over the MPI
// communicator when launched with mpirun).
//
// Communicators are created non-blocking (ncclConfig_t.blocking = 0), so that no NCCL call can
// keep the host waiting on a peer: a call that cannot finish at once returns ncclInProgress and
// the communicator's state (ncclCommGetAsyncError) says when it has; until then no other NCCL
// call may be made on it. Every wait here is such a poll, bounded by the configured timeout;
// past it the communicator is aborted (ncclCommAbort, which also makes running NCCL kernels give
// up) and marked failed.
//
// Work NCCL has put on a stream can still hang on the GPU (a peer died, or never issued the
// matching call). A watchdog thread per communicator watches each operation through two CUDA
// events recorded around it: once the first has completed (the operation has started on the
// GPU), the second must complete within the timeout, or the communicator is aborted and failed
// with a message naming the operation. It also polls NCCL's asynchronous error (a peer's
// connection dropped). Operations captured into a CUDA graph are not watched (their events would
// belong to the graph).
//
// Threads: one thread issues a rank's operations (NCCL groups are per thread); abort() and
// get_async_error may come from any other thread, and the watchdog is a thread of its own.
// NCCL's communicators are not thread-safe, so every NCCL call on one is made under comm_mu_.
// Lock order: comm_mu_ may be held while taking q_mu_, never the reverse; fail_mu_ is a leaf.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plexus/sdk.hpp"

namespace plexus::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

constexpr int32_t kDefaultTimeoutMs = 60000;
// How long abort waits for a thread that is inside an NCCL call on the communicator before it
// aborts regardless. Calls on a non-blocking communicator return at once, so only a thread
// stuck in CUDA (a launch queue full behind a hung NCCL kernel, which only the abort releases)
// holds the lock this long; aborting under its feet is then the lesser evil.
constexpr Ms kAbortLockWait{2000};
// Events kept ready at init, so that the first operations create none.
constexpr int kInitialEvents = 8;

static_assert(sizeof(ncclUniqueId) == sizeof(plx_comm_id), "an NCCL id must fit plx_comm_id");
static_assert(NCCL_UNIQUE_ID_BYTES == sizeof(plx_comm_id{}.bytes),
              "ncclUniqueId and plx_comm_id differ in size");

// "2.28.9" from an NCCL version code (X*10000 + Y*100 + Z since 2.9; X*1000 + Y*100 + Z before).
std::string version_string(int code) {
  if (code >= 10000) return sdk::format("%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
  return sdk::format("%d.%d.%d", code / 1000, code / 100 % 10, code % 100);
}

// ---- errors ----

const char* result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t(?)";
  }
}

// NCCL's own words for a failure: the result's name and string, and the last message NCCL
// logged (which says which socket or peer; it may belong to an earlier call).
std::string nccl_message(ncclResult_t r, ncclComm_t comm) {
  std::string s = sdk::format("NCCL error %s: %s", result_name(r), ncclGetErrorString(r));
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += sdk::format(" (NCCL's last message: %s)", last);
  return s;
}

// The status a failure of NCCL maps to: the caller's mistakes are invalid arguments, a broken
// peer or transport a communicator error, CUDA and NCCL's own failures backend errors.
plx_status status_of(ncclResult_t r) {
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return PLX_ERR_INVALID_ARGUMENT;
    case ncclSystemError:
    case ncclRemoteError:
      return PLX_ERR_COMM;
    default:
      return PLX_ERR_BACKEND;
  }
}

std::string cuda_message(cudaError_t e, const char* expr) {
  return sdk::format("CUDA error %s: %s in %s", cudaGetErrorName(e), cudaGetErrorString(e), expr);
}

[[noreturn]] void throw_cuda(cudaError_t e, const char* expr) {
  // A failed call leaves its error to be read once; clear it so that the next call (of this
  // plugin or the cuda backend's) does not report it again. Sticky errors stay.
  (void)cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) throw sdk::OutOfMemory(cuda_message(e, expr));
  throw sdk::BackendError(cuda_message(e, expr));
}

#define NCCL_PLX_CUDA_CHECK(expr)                                      \
  do {                                                                 \
    const cudaError_t nccl_plx_e_ = (expr);                            \
    if (nccl_plx_e_ != cudaSuccess) throw_cuda(nccl_plx_e_, #expr);    \
  } while (0)

// Makes `device` current for the scope and restores the caller's device after: the cuda backend
// remembers per thread which device it made current, so it must find the one it left.
class DeviceGuard {
 public:
  explicit DeviceGuard(int32_t device) {
    NCCL_PLX_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) {
      NCCL_PLX_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// The same without throwing, for destructors and the watchdog.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int32_t device) {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device)
      switched_ = cudaSetDevice(device) == cudaSuccess;
    (void)cudaGetLastError();
  }
  ~QuietDeviceGuard() {
    if (switched_) (void)cudaSetDevice(prev_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// ---- operations ----

ncclDataType_t nccl_type(plx_dtype d) {
  switch (d) {
    case PLX_F32: return ncclFloat32;
    case PLX_F16: return ncclFloat16;
    case PLX_BF16: return ncclBfloat16;
    case PLX_F64: return ncclFloat64;
    case PLX_I32: return ncclInt32;
    case PLX_I64: return ncclInt64;
    case PLX_U8: return ncclUint8;
    default: break;
  }
  throw sdk::InvalidArgument(
      sdk::format("NCCL has no type for dtype %s (%d)", dtype_name(d), static_cast<int>(d)));
}

ncclRedOp_t nccl_op(plx_reduce_op op) {
  switch (op) {
    case PLX_REDUCE_SUM: return ncclSum;
    case PLX_REDUCE_AVG: return ncclAvg;  // NCCL divides by the number of ranks itself
    case PLX_REDUCE_MAX: return ncclMax;
    case PLX_REDUCE_MIN: return ncclMin;
  }
  throw sdk::InvalidArgument(sdk::format("unknown reduce op %d", static_cast<int>(op)));
}

// What an operation was, kept (without allocating) until a message needs it.
struct OpDesc {
  const char* kind = "barrier";
  uint64_t count = 0;
  int32_t dtype = PLX_DTYPE_NONE;
  int32_t op = -1;    // reduce op, -1: none
  int32_t root = -1;  // broadcast
  int32_t peer = -1;  // send, recv
};

// "all_reduce (count 8, f32, sum)", "send (count 4, bf16) to rank 1", "barrier"
std::string describe(const OpDesc& d) {
  if (std::strcmp(d.kind, "barrier") == 0 || std::strcmp(d.kind, "group_begin") == 0 ||
      std::strcmp(d.kind, "group_end") == 0)
    return d.kind;
  std::string s = sdk::format("%s (count %llu, %s", d.kind, static_cast<unsigned long long>(d.count),
                              dtype_name(d.dtype));
  if (d.op >= 0) s += sdk::format(", %s", plx_reduce_op_string(d.op));
  if (d.root >= 0) s += sdk::format(", root %d", d.root);
  s += ")";
  if (d.peer >= 0)
    s += sdk::format(" %s rank %d", std::strcmp(d.kind, "send") == 0 ? "to" : "from", d.peer);
  return s;
}

bool overlap(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

struct Options {
  int32_t timeout_ms = kDefaultTimeoutMs;  // when the config says 0
  bool watchdog = true;
};

// ---- one rank ----

class NcclRank final : public sdk::CommRank {
 public:
  NcclRank(const plx_comm_config& cfg, Ms timeout, bool watch)
      : rank_(cfg.rank),
        size_(cfg.size),
        device_(cfg.device),
        backend_(cfg.backend),
        timeout_(timeout),
        watch_(watch),
        poll_(std::clamp<Ms>(timeout / 10, Ms(1), Ms(100))) {}

  ~NcclRank() override {
    // The watchdog first: it may be aborting the communicator right now.
    if (watchdog_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(q_mu_);
        stop_ = true;
      }
      q_cv_.notify_all();
      watchdog_.join();
    }
    QuietDeviceGuard guard(device_);
    // Still alive: destroy() was not reached or gave up. Aborting never waits for a peer.
    abort_comm(/*wait_for_lock=*/false, /*force=*/true);
    // An event still pending is released by CUDA once it completes.
    for (const Pending& p : pending_) {
      (void)cudaEventDestroy(p.start);
      (void)cudaEventDestroy(p.end);
    }
    for (const GroupStream& g : group_streams_)
      if (g.start) (void)cudaEventDestroy(g.start);
    for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
    if (barrier_buf_) (void)cudaFree(barrier_buf_);
    (void)cudaGetLastError();
  }

  // Joins the group: the collective part of init_rank. Throws, leaving the destructor to clean
  // up, if the group does not form within the timeout.
  void join(const plx_comm_id& id) {
    DeviceGuard guard(device_);
    // The barrier's operand, allocated now so that barrier() allocates nothing (capturable).
    NCCL_PLX_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int32_t)));
    NCCL_PLX_CUDA_CHECK(cudaMemset(barrier_buf_, 0, sizeof(int32_t)));
    if (watch_) {
      for (int i = 0; i < kInitialEvents; ++i) free_events_.push_back(create_event());
    }

    ncclUniqueId uid;
    std::memcpy(&uid, id.bytes, sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, uid, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string msg = nccl_message(r, comm);
      // NCCL frees a communicator whose creation failed at once and returns none; one it did
      // return is released here.
      if (comm) (void)ncclCommAbort(comm);
      throw sdk::Error(status_of(r), sdk::format("init_rank: rank %d of %d on device %d: "
                                                 "ncclCommInitRankConfig failed: %s",
                                                 rank_, size_, device_, msg.c_str()));
    }
    // The ranks meet in the background; the state leaves ncclInProgress when all have.
    const auto deadline = Clock::now() + timeout_;
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
      if (q != ncclSuccess) state = q;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        const std::string msg = nccl_message(state, comm);
        (void)ncclCommAbort(comm);
        throw sdk::Error(status_of(state),
                         sdk::format("init_rank: rank %d of %d on device %d could not join the "
                                     "group: %s",
                                     rank_, size_, device_, msg.c_str()));
      }
      if (Clock::now() >= deadline) {
        (void)ncclCommAbort(comm);
        throw sdk::Error(
            PLX_ERR_TIMEOUT,
            sdk::format("init_rank: timed out after %lld ms on rank %d of %d (device %d): not "
                        "every rank joined (all %d must call init_rank with the same id, made by "
                        "rank 0's get_unique_id); the communicator was aborted",
                        static_cast<long long>(timeout_.count()), rank_, size_, device_, size_));
      }
      backoff.wait();
    }
    comm_.store(comm);
    watchdog_ = std::thread([this] { watchdog_loop(); });
    PLX_LOG(PLX_LOG_INFO, "nccl", "rank %d of %d joined on CUDA device %d", rank_, size_, device_);
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }

  void all_reduce(const void* send, void* recv, uint64_t count, plx_dtype dtype, plx_reduce_op op,
                  plx_stream s) override {
    OpDesc d{"all_reduce", count, dtype, static_cast<int32_t>(op), -1, -1};
    const uint64_t bytes = check_buffers(d, send, recv);
    require(d, send == recv || !overlap(send, bytes, recv, bytes),
            "send and recv overlap without being the same buffer");
    const ncclDataType_t t = nccl_type(dtype);
    const ncclRedOp_t o = nccl_op(op);
    enqueue(d, s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclAllReduce(send, recv, count, t, o, c, cs);
    });
  }

  void broadcast(const void* send, void* recv, uint64_t count, plx_dtype dtype, int32_t root,
                 plx_stream s) override {
    OpDesc d{"broadcast", count, dtype, -1, root, -1};
    require(d, root >= 0 && root < size_, "root %d is not a rank of this group of %d", root, size_);
    check_count(d);
    require(d, count == 0 || recv != nullptr, "recv is null");
    const uint64_t bytes = count * dtype_size(dtype);
    if (root == rank_) {
      require(d, count == 0 || send != nullptr, "send is null on the root");
      require(d, send == recv || !overlap(send, bytes, recv, bytes),
              "send and recv overlap without being the same buffer");
    }
    const ncclDataType_t t = nccl_type(dtype);
    // send is read on the root only; elsewhere it may be null, which NCCL need not accept.
    const void* src = root == rank_ ? send : recv;
    enqueue(d, s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclBroadcast(src, recv, count, t, root, c, cs);
    });
  }

  void all_gather(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                  plx_stream s) override {
    OpDesc d{"all_gather", count, dtype, -1, -1, -1};
    check_count(d);
    require(d, count == 0 || (send && recv), "%s is null", send ? "recv" : "send");
    const uint64_t bytes = count * dtype_size(dtype);
    // In place in NCCL's sense: send is this rank's block of recv. Any other overlap would be
    // read after NCCL wrote it.
    const void* mine = static_cast<const unsigned char*>(recv) + bytes * static_cast<uint64_t>(rank_);
    require(d, send == mine || !overlap(send, bytes, recv, bytes * static_cast<uint64_t>(size_)),
            "send overlaps recv without being this rank's block of it (NCCL's in-place layout)");
    const ncclDataType_t t = nccl_type(dtype);
    enqueue(d, s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclAllGather(send, recv, count, t, c, cs);
    });
  }

  void reduce_scatter(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                      plx_reduce_op op, plx_stream s) override {
    OpDesc d{"reduce_scatter", count, dtype, static_cast<int32_t>(op), -1, -1};
    check_count(d);
    require(d, count == 0 || (send && recv), "%s is null", send ? "recv" : "send");
    const uint64_t bytes = count * dtype_size(dtype);
    // In place in NCCL's sense: recv is this rank's block of send.
    const void* mine = static_cast<const unsigned char*>(send) + bytes * static_cast<uint64_t>(rank_);
    require(d, recv == mine || !overlap(send, bytes * static_cast<uint64_t>(size_), recv, bytes),
            "recv overlaps send without being this rank's block of it (NCCL's in-place layout)");
    const ncclDataType_t t = nccl_type(dtype);
    const ncclRedOp_t o = nccl_op(op);
    enqueue(d, s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclReduceScatter(send, recv, count, t, o, c, cs);
    });
  }

  void send(const void* buf, uint64_t count, plx_dtype dtype, int32_t peer,
            plx_stream s) override {
    OpDesc d{"send", count, dtype, -1, -1, peer};
    check_p2p(d, buf);
    const ncclDataType_t t = nccl_type(dtype);
    enqueue(d, s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclSend(buf, count, t, peer, c, cs);
    });
  }

  void recv(void* buf, uint64_t count, plx_dtype dtype, int32_t peer, plx_stream s) override {
    OpDesc d{"recv", count, dtype, -1, -1, peer};
    check_p2p(d, buf);
    const ncclDataType_t t = nccl_type(dtype);
    enqueue(d, s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclRecv(buf, count, t, peer, c, cs);
    });
  }

  // A sum of one int32 in the buffer made at init: it completes on a rank's stream only once
  // every rank has contributed, so later work on the stream waits for all of them.
  void barrier(plx_stream s) override {
    OpDesc d;
    d.kind = "barrier";
    d.count = 1;
    d.dtype = PLX_I32;
    enqueue(d, s, [&](ncclComm_t c, cudaStream_t cs) {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, c, cs);
    });
  }

  bool has_group() const override { return true; }

  void group_begin() override {
    OpDesc d;
    d.kind = "group_begin";
    throw_if_failed(d);
    std::unique_lock<std::timed_mutex> lk(comm_mu_);
    if (!comm_.load()) throw_failed(d);
    const ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
      throw sdk::Error(status_of(r), where(d) + ": ncclGroupStart failed: " +
                                         nccl_message(r, comm_.load()));
    group_depth_.fetch_add(1);
  }

  void group_end() override {
    OpDesc d;
    d.kind = "group_end";
    DeviceGuard guard(device_);  // events are created and recorded on the communicator's device
    std::vector<GroupStream> streams;
    {
      std::unique_lock<std::timed_mutex> lk(comm_mu_);
      if (group_depth_.load() == 0) {
        lk.unlock();
        throw_if_failed(d);  // group_begin refused on a failed communicator: say why
        throw sdk::InvalidArgument(where(d) + ": no group_begin to end");
      }
      // Ends NCCL's group even on a failed communicator: the group is the thread's, and other
      // communicators' operations may be in it.
      const ncclResult_t r = ncclGroupEnd();
      const int depth = group_depth_.fetch_sub(1) - 1;
      if (depth == 0) streams.swap(group_streams_);
      if (depth == 0 && abort_deferred_) {
        // An abort came while the group was open; the group's operations are launched now,
        // and cancelled at once.
        abort_deferred_ = false;
        abort_locked();
      }
      try {
        if (failed_.load()) throw_failed(d);
        if (r != ncclSuccess && r != ncclInProgress) raise(lk, r, d);
        if (r == ncclInProgress) wait_ready(lk, d);
      } catch (...) {
        if (lk.owns_lock()) lk.unlock();
        for (GroupStream& g : streams) release_event(g.start);
        throw;
      }
    }
    for (GroupStream& g : streams) watch(g.start, g.stream, g.first, g.ops);
  }

  // The baseline of `plexus bench comm`: `iters` NCCL calls issued straight on the
  // communicator and stream, then one stream synchronisation, timed on the host clock after an
  // NCCL barrier (a one-int all-reduce, synchronised). No argument checks, events or watchdog;
  // only what NCCL itself asks of a non-blocking communicator (waiting out ncclInProgress).
  // The stream synchronisation is not bounded by the timeout: measurement only.
  double bench_native(plx_collective c, uint64_t count, plx_dtype dtype, int32_t iters, void* buf_a,
                      void* buf_b, plx_stream s) override {
    OpDesc d{"bench_native", count, dtype, -1, -1, -1};
    d.kind = plx_collective_string(c);
    throw_if_failed(d);
    check_count(d);
    const ncclDataType_t t = nccl_type(dtype);
    const cudaStream_t cs = native_stream(s);
    DeviceGuard guard(device_);
    auto run = [&](auto&& issue) {
      std::unique_lock<std::timed_mutex> lk(comm_mu_);
      if (!comm_.load()) throw_failed(d);
      const ncclResult_t r = issue(comm_.load());
      if (r != ncclSuccess && r != ncclInProgress) raise(lk, r, d);
      if (r == ncclInProgress) wait_ready(lk, d);
    };
    run([&](ncclComm_t comm) {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm, cs);
    });
    NCCL_PLX_CUDA_CHECK(cudaStreamSynchronize(cs));
    const auto t0 = Clock::now();
    for (int32_t i = 0; i < iters && count > 0; ++i)
      run([&](ncclComm_t comm) {
        switch (c) {
          case PLX_COLL_ALL_REDUCE:
            return ncclAllReduce(buf_a, buf_b, count, t, ncclSum, comm, cs);
          case PLX_COLL_BROADCAST:
            return ncclBroadcast(buf_b, buf_b, count, t, 0, comm, cs);
          case PLX_COLL_ALL_GATHER:
            return ncclAllGather(buf_a, buf_b, count, t, comm, cs);
          case PLX_COLL_REDUCE_SCATTER:
            return ncclReduceScatter(buf_a, buf_b, count, t, ncclSum, comm, cs);
        }
        return ncclInvalidArgument;
      });
    NCCL_PLX_CUDA_CHECK(cudaStreamSynchronize(cs));
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  void abort() override {
    fail(PLX_ERR_ABORTED, sdk::format("abort() was called on rank %d", rank_));
    abort_comm(/*wait_for_lock=*/true);
  }

  // Never blocks: the failure recorded so far, or NCCL's asynchronous error if the
  // communicator is free to ask.
  void check_async_error() override {
    if (!failed_.load()) poll_async_error(/*abort_here=*/false);
    if (failed_.load()) {
      std::lock_guard<std::mutex> lk(fail_mu_);
      throw sdk::Error(status_, sdk::format("rank %d of %d: %s", rank_, size_, error_.c_str()));
    }
  }

  // Leaves the group: NCCL flushes what was issued and the ranks part (ncclCommFinalize, polled
  // up to the timeout), then the communicator is freed. A failed communicator was aborted
  // already; one that does not finish in time is aborted.
  void finalize() override {
    QuietDeviceGuard guard(device_);
    std::unique_lock<std::timed_mutex> lk(comm_mu_);
    ncclComm_t c = comm_.load();
    if (!c) return;  // aborted: nothing left to leave
    if (group_depth_.load() > 0) {
      // Destroyed inside a group it never ended: close NCCL's group on this thread (the
      // issuing one) so that it does not outlive the communicator, and abort.
      while (group_depth_.load() > 0) {
        (void)ncclGroupEnd();
        group_depth_.fetch_sub(1);
      }
      abort_locked(/*force=*/true);
      throw sdk::InvalidArgument(sdk::format("destroy on rank %d of %d: a group was still open "
                                             "(group_begin without group_end); the communicator "
                                             "was aborted",
                                             rank_, size_));
    }
    if (failed_.load()) {
      // A failure not yet acted on (the watchdog is about to).
      abort_locked();
      return;
    }
    ncclResult_t r = ncclCommFinalize(c);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string msg = nccl_message(r, c);
      abort_locked();
      throw sdk::Error(status_of(r), sdk::format("destroy on rank %d of %d: ncclCommFinalize "
                                                 "failed: %s; the communicator was aborted",
                                                 rank_, size_, msg.c_str()));
    }
    if (r == ncclInProgress) {
      // Finalizing waits for the peers too: a dead one keeps it in progress forever.
      const auto deadline = Clock::now() + timeout_;
      Backoff backoff;
      for (;;) {
        c = comm_.load();
        if (!c) return;  // aborted meanwhile (abort() or the watchdog): nothing left to leave
        ncclResult_t state = ncclInProgress;
        const ncclResult_t q = ncclCommGetAsyncError(c, &state);
        if (q != ncclSuccess) state = q;
        if (state == ncclSuccess) break;
        if (state != ncclInProgress) {
          const std::string msg = nccl_message(state, c);
          abort_locked();
          throw sdk::Error(status_of(state), sdk::format("destroy on rank %d of %d: leaving the "
                                                         "group failed: %s; the communicator was "
                                                         "aborted",
                                                         rank_, size_, msg.c_str()));
        }
        if (Clock::now() >= deadline) {
          abort_locked();
          throw sdk::Error(PLX_ERR_TIMEOUT,
                           sdk::format("destroy on rank %d of %d: the ranks did not finish "
                                       "leaving the group within %lld ms (a peer hung, died or "
                                       "never destroyed its communicator); the communicator was "
                                       "aborted",
                                       rank_, size_, static_cast<long long>(timeout_.count())));
        }
        lk.unlock();
        backoff.wait();
        lk.lock();
      }
    }
    if (comm_.exchange(nullptr) != c) return;  // aborted by another thread meanwhile
    r = ncclCommDestroy(c);
    if (r != ncclSuccess)
      throw sdk::Error(status_of(r), sdk::format("destroy on rank %d of %d: ncclCommDestroy "
                                                 "failed: %s",
                                                 rank_, size_, nccl_message(r, nullptr).c_str()));
  }

 private:
  // One operation (or one stream's share of a group) the watchdog waits for.
  struct Pending {
    cudaEvent_t start = nullptr, end = nullptr;
    OpDesc first;  // the operation, or the first of the group's on this stream
    int ops = 1;
    bool started = false;
    Clock::time_point started_at{};
  };
  // A stream used inside the open group, and the event recorded on it before its first op.
  struct GroupStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr;  // null: not watched (capturing, or the watchdog is off)
    OpDesc first;
    int ops = 0;
  };

  // Polls with a growing pause: NCCL usually finishes within microseconds, a connection to a
  // slow peer takes milliseconds to seconds.
  struct Backoff {
    int n = 0;
    void wait() {
      ++n;
      if (n <= 64) {
        std::this_thread::yield();
      } else {
        const int us = std::min(1000, 10 << std::min(7, (n - 64) / 16));
        std::this_thread::sleep_for(std::chrono::microseconds(us));
      }
    }
  };

  // ---- argument checks ----

  std::string where(const OpDesc& d) const {
    return sdk::format("%s on rank %d of %d", describe(d).c_str(), rank_, size_);
  }

  template <class... A>
  void require(const OpDesc& d, bool cond, const char* fmt, A... args) const {
    if (cond) return;
    std::string why;
    if constexpr (sizeof...(A) == 0)
      why = fmt;
    else
      why = sdk::format(fmt, args...);
    throw sdk::InvalidArgument(where(d) + ": " + why);
  }

  void check_count(const OpDesc& d) const {
    // Room for size blocks of count elements of 8 bytes, whatever the collective.
    require(d, d.count <= UINT64_MAX / 8 / static_cast<uint64_t>(size_),
            "count %llu is too large", static_cast<unsigned long long>(d.count));
  }

  uint64_t check_buffers(const OpDesc& d, const void* send, const void* recv) const {
    check_count(d);
    require(d, d.count == 0 || recv != nullptr, "recv is null");
    require(d, d.count == 0 || send != nullptr, "send is null");
    return d.count * dtype_size(d.dtype);
  }

  void check_p2p(const OpDesc& d, const void* buf) const {
    require(d, d.peer >= 0 && d.peer < size_, "rank %d is not a rank of this group of %d", d.peer,
            size_);
    check_count(d);
    require(d, d.count == 0 || buf != nullptr, "buffer is null");
  }

  // ---- issuing ----

  cudaStream_t native_stream(plx_stream s) const {
    // NULL for the default stream (the backend's NULL plx_stream) is a valid answer.
    return static_cast<cudaStream_t>(backend_->stream_native(backend_->ctx, s));
  }

  // Issues one operation: `issue(comm, stream)` makes the NCCL call. A count of 0 moves
  // nothing and is not passed to NCCL (the ranks agree on counts, so all skip it alike).
  template <class Issue>
  void enqueue(const OpDesc& d, plx_stream s, Issue&& issue) {
    throw_if_failed(d);
    if (d.count == 0) return;
    const cudaStream_t cs = native_stream(s);
    DeviceGuard guard(device_);
    const bool grouped = group_depth_.load() > 0;  // changed only by this thread
    // Recorded before the NCCL call, so that it completes when the operation may start.
    cudaEvent_t start = grouped ? nullptr : record_start(cs);
    {
      std::unique_lock<std::timed_mutex> lk(comm_mu_);
      try {
        if (!comm_.load()) throw_failed(d);
        const ncclResult_t r = issue(comm_.load(), cs);
        if (r != ncclSuccess && r != ncclInProgress) raise(lk, r, d);
        // Inside a group NCCL only queues the operation; group_end issues it.
        if (r == ncclInProgress) wait_ready(lk, d);
        if (grouped) note_group_op(cs, d);
      } catch (...) {
        if (lk.owns_lock()) lk.unlock();
        release_event(start);
        throw;
      }
    }
    if (start) watch(start, cs, d, 1);
  }

  // After NCCL returned ncclInProgress: polls the communicator's state until NCCL has finished
  // issuing (it may be connecting to the peers), up to the timeout. Called with comm_mu_ held;
  // releases it between polls so that abort() and the watchdog can come in.
  void wait_ready(std::unique_lock<std::timed_mutex>& lk, const OpDesc& d) {
    const auto deadline = Clock::now() + timeout_;
    Backoff backoff;
    for (;;) {
      ncclComm_t c = comm_.load();
      if (!c) throw_failed(d);  // aborted while we waited
      ncclResult_t state = ncclInProgress;
      const ncclResult_t q = ncclCommGetAsyncError(c, &state);
      if (q != ncclSuccess) state = q;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fatal(lk, state, d);
      if (Clock::now() >= deadline) {
        fail(PLX_ERR_TIMEOUT,
             sdk::format("%s could not be issued within %lld ms: NCCL kept it in progress (a "
                         "peer did not connect: it hung, died or never issued the matching "
                         "call); the communicator was aborted",
                         where(d).c_str(), static_cast<long long>(timeout_.count())));
        abort_locked();
        throw_failed(d);
      }
      lk.unlock();
      backoff.wait();
      lk.lock();
    }
  }

  // An NCCL call returned an error. The caller's mistakes leave the communicator usable (NCCL
  // checked them before doing anything); anything else, or a communicator NCCL itself marks
  // broken, is fatal.
  [[noreturn]] void raise(std::unique_lock<std::timed_mutex>& lk, ncclResult_t r,
                          const OpDesc& d) {
    ncclComm_t c = comm_.load();
    ncclResult_t state = ncclSuccess;
    if (c && ncclCommGetAsyncError(c, &state) != ncclSuccess) state = ncclInternalError;
    if (status_of(r) == PLX_ERR_INVALID_ARGUMENT &&
        (state == ncclSuccess || state == ncclInProgress))
      throw sdk::InvalidArgument(where(d) + ": NCCL refused it: " + nccl_message(r, c));
    fatal(lk, r, d);
  }

  [[noreturn]] void fatal(std::unique_lock<std::timed_mutex>& lk, ncclResult_t r,
                          const OpDesc& d) {
    const plx_status st = status_of(r) == PLX_ERR_INVALID_ARGUMENT ? PLX_ERR_COMM : status_of(r);
    fail(st, sdk::format("%s failed: %s; the communicator was aborted", where(d).c_str(),
                         nccl_message(r, comm_.load()).c_str()));
    abort_locked();
    (void)lk;
    throw_failed(d);
  }

  // ---- failure ----

  // Records the first failure; later ones are consequences and are dropped.
  void fail(plx_status st, std::string message) {
    {
      std::lock_guard<std::mutex> lk(fail_mu_);
      if (status_ != PLX_OK) return;
      status_ = st;
      error_ = std::move(message);
      failed_.store(true);
    }
    PLX_LOG(PLX_LOG_ERROR, "nccl", "rank %d of %d: %s", rank_, size_, error_.c_str());
  }

  void throw_if_failed(const OpDesc& d) const {
    if (failed_.load()) throw_failed(d);
  }

  [[noreturn]] void throw_failed(const OpDesc& d) const {
    std::lock_guard<std::mutex> lk(fail_mu_);
    // Aborted from outside between our checks without a recorded reason cannot happen: every
    // path that clears comm_ records a failure first. Guard anyway.
    const plx_status st = status_ == PLX_OK ? PLX_ERR_ABORTED : status_;
    throw sdk::Error(st, where(d) + ": the communicator has failed: " +
                             (error_.empty() ? std::string("it was aborted") : error_));
  }

  // Aborts the NCCL communicator, from any thread. Waits (boundedly) for an NCCL call in
  // progress on another thread to return first. In an open group the abort waits for
  // group_end: the group's NCCL state is the issuing thread's and still refers to the
  // communicator.
  void abort_comm(bool wait_for_lock, bool force = false) {
    std::unique_lock<std::timed_mutex> lk(comm_mu_, std::defer_lock);
    const bool locked = wait_for_lock ? lk.try_lock_for(kAbortLockWait) : lk.try_lock();
    if (!locked && comm_.load())
      PLX_LOG(PLX_LOG_WARN, "nccl",
              "rank %d of %d: another thread has been inside an NCCL call on this communicator "
              "for %lld ms; aborting it regardless",
              rank_, size_, static_cast<long long>(wait_for_lock ? kAbortLockWait.count() : 0));
    if (locked && !force && group_depth_.load() > 0) {
      abort_deferred_ = true;
      return;
    }
    abort_locked(force);
  }

  // The abort itself; comm_mu_ held (or given up on, see abort_comm). Whoever takes comm_
  // aborts it, so two aborters never free it twice.
  void abort_locked(bool force = false) {
    if (!force && group_depth_.load() > 0) {
      abort_deferred_ = true;
      return;
    }
    ncclComm_t c = comm_.exchange(nullptr);
    if (!c) return;
    QuietDeviceGuard guard(device_);
    const ncclResult_t r = ncclCommAbort(c);
    if (r != ncclSuccess)
      PLX_LOG(PLX_LOG_WARN, "nccl", "rank %d of %d: ncclCommAbort: %s", rank_, size_,
              nccl_message(r, nullptr).c_str());
    PLX_LOG(PLX_LOG_INFO, "nccl", "rank %d of %d: communicator aborted", rank_, size_);
  }

  // Asks NCCL for an asynchronous error (a peer's connection broke) if no other thread is in an
  // NCCL call on the communicator; on one, fails the communicator and aborts it (here, or by
  // the watchdog when the caller must not block).
  void poll_async_error(bool abort_here) {
    std::unique_lock<std::timed_mutex> lk(comm_mu_, std::try_to_lock);
    if (!lk.owns_lock()) return;
    ncclComm_t c = comm_.load();
    if (!c) return;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(c, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess || state == ncclInProgress) return;
    const plx_status st =
        status_of(state) == PLX_ERR_INVALID_ARGUMENT ? PLX_ERR_COMM : status_of(state);
    fail(st, sdk::format("rank %d of %d: NCCL reported an asynchronous error: %s; the "
                         "communicator was aborted",
                         rank_, size_, nccl_message(state, c).c_str()));
    if (abort_here) {
      abort_locked();
    } else {
      lk.unlock();
      request_abort();
    }
  }

  void request_abort() {
    {
      std::lock_guard<std::mutex> lk(q_mu_);
      abort_requested_ = true;
    }
    q_cv_.notify_all();
  }

  // ---- the watchdog ----

  cudaEvent_t create_event() {
    cudaEvent_t e = nullptr;
    NCCL_PLX_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  cudaEvent_t take_event() {
    {
      std::lock_guard<std::mutex> lk(q_mu_);
      if (!free_events_.empty()) {
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
      }
    }
    return create_event();
  }

  void release_event(cudaEvent_t e) {
    if (!e) return;
    std::lock_guard<std::mutex> lk(q_mu_);
    free_events_.push_back(e);
  }

  // Whether work on `cs` can be watched: not while it is being captured into a graph (an event
  // recorded there becomes a node of the graph and cannot be queried).
  bool watchable(cudaStream_t cs) const {
    if (!watch_) return false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(cs, &status);
    if (e != cudaSuccess) {
      // The legacy stream while another thread captures: not watchable, and not our error.
      (void)cudaGetLastError();
      return false;
    }
    return status == cudaStreamCaptureStatusNone;
  }

  // An event recorded on `cs` now, or null when the stream is not watched.
  cudaEvent_t record_start(cudaStream_t cs) {
    if (!watchable(cs)) return nullptr;
    cudaEvent_t e = take_event();
    const cudaError_t r = cudaEventRecord(e, cs);
    if (r != cudaSuccess) {
      release_event(e);
      throw_cuda(r, "cudaEventRecord(start, stream)");
    }
    return e;
  }

  // Inside a group: remembers the stream (recording its start event before its first operation)
  // so that group_end can watch it. comm_mu_ held.
  void note_group_op(cudaStream_t cs, const OpDesc& d) {
    for (GroupStream& g : group_streams_) {
      if (g.stream == cs) {
        ++g.ops;
        return;
      }
    }
    GroupStream g;
    g.stream = cs;
    g.first = d;
    g.ops = 1;
    g.start = record_start(cs);
    group_streams_.push_back(g);
  }

  // Records the end event after the operation(s) on `cs` and hands both events to the watchdog.
  void watch(cudaEvent_t start, cudaStream_t cs, const OpDesc& d, int ops) {
    if (!start) return;
    cudaEvent_t end = nullptr;
    try {
      end = take_event();
    } catch (...) {
      release_event(start);
      throw;
    }
    const cudaError_t r = cudaEventRecord(end, cs);
    if (r != cudaSuccess) {
      release_event(start);
      release_event(end);
      throw_cuda(r, "cudaEventRecord(end, stream)");
    }
    Pending p;
    p.start = start;
    p.end = end;
    p.first = d;
    p.ops = ops;
    std::lock_guard<std::mutex> lk(q_mu_);
    pending_.push_back(p);
  }

  void watchdog_loop() {
    // Queries from this thread must not break a graph capture another thread runs in the
    // default (global) mode, which forbids "unsafe" calls such as cudaEventQuery process-wide.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    (void)cudaSetDevice(device_);
    (void)cudaGetLastError();
    std::unique_lock<std::mutex> lk(q_mu_);
    for (;;) {
      q_cv_.wait_for(lk, poll_, [&] { return stop_ || abort_requested_; });
      if (stop_) return;
      bool abort_now = abort_requested_;
      abort_requested_ = false;
      plx_status st = PLX_OK;
      std::string why;
      scan(st, why);
      lk.unlock();
      if (st != PLX_OK) {
        fail(st, why);
        abort_now = true;
      }
      if (!abort_now && !failed_.load()) poll_async_error(/*abort_here=*/true);
      if (abort_now) abort_comm(/*wait_for_lock=*/true);
      lk.lock();
    }
  }

  // Retires completed operations and judges the others; q_mu_ held. Sets st and why for the
  // first operation found hung (or a CUDA error), unless the communicator failed already.
  void scan(plx_status& st, std::string& why) {
    const auto now = Clock::now();
    const bool judged = !failed_.load();
    for (auto it = pending_.begin(); it != pending_.end();) {
      cudaError_t e = cudaEventQuery(it->end);
      if (e == cudaSuccess) {
        free_events_.push_back(it->start);
        free_events_.push_back(it->end);
        it = pending_.erase(it);
        continue;
      }
      if (e == cudaErrorNotReady && !it->started) {
        e = cudaEventQuery(it->start);
        if (e == cudaSuccess) {
          // Seen now, started up to one poll interval ago: the limit is a little generous.
          it->started = true;
          it->started_at = now;
          e = cudaErrorNotReady;
        }
      }
      if (judged && st == PLX_OK) {
        if (e != cudaErrorNotReady) {
          st = PLX_ERR_BACKEND;
          why = sdk::format("%s: the device reported %s while the watchdog waited for it; the "
                            "communicator was aborted",
                            what_pending(*it).c_str(), cuda_message(e, "cudaEventQuery").c_str());
        } else if (it->started && now - it->started_at > timeout_) {
          st = PLX_ERR_TIMEOUT;
          why = sdk::format("%s did not complete within %lld ms: a peer hung or died; the "
                            "communicator was aborted",
                            what_pending(*it).c_str(), static_cast<long long>(timeout_.count()));
        }
      }
      ++it;
    }
    (void)cudaGetLastError();
  }

  std::string what_pending(const Pending& p) const {
    if (p.ops == 1) return where(p.first);
    return sdk::format("a group of %d operations starting with %s", p.ops, where(p.first).c_str());
  }

  const int32_t rank_, size_, device_;
  const plx_backend* backend_;
  const Ms timeout_;
  const bool watch_;
  const Ms poll_;  // how often the watchdog looks

  // The NCCL communicator; null once aborted or destroyed. NCCL calls on it hold comm_mu_.
  std::timed_mutex comm_mu_;
  std::atomic<ncclComm_t> comm_{nullptr};
  std::atomic<int> group_depth_{0};        // open group_begin calls (the issuing thread's)
  bool abort_deferred_ = false;            // comm_mu_: abort at the outermost group_end
  std::vector<GroupStream> group_streams_;  // comm_mu_ (the issuing thread's)

  // The failure, set once and kept: a failed communicator does not recover.
  mutable std::mutex fail_mu_;
  std::atomic<bool> failed_{false};
  plx_status status_ = PLX_OK;
  std::string error_;

  // The watchdog's queue, its pool of spare events and its thread.
  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  bool stop_ = false;
  bool abort_requested_ = false;
  std::thread watchdog_;

  void* barrier_buf_ = nullptr;
};

// ---- the communicator ----

class NcclCommunicator final : public sdk::Communicator {
 public:
  explicit NcclCommunicator(Options o) : sdk::Communicator("nccl", "cuda"), options_(o) {}
  bool has_bench_native() const override { return true; }

  plx_comm_id unique_id() override {
    ncclUniqueId uid;
    const ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess)
      throw sdk::Error(status_of(r) == PLX_ERR_INVALID_ARGUMENT ? PLX_ERR_BACKEND : status_of(r),
                       "get_unique_id: ncclGetUniqueId failed: " + nccl_message(r, nullptr));
    plx_comm_id id{};
    std::memcpy(id.bytes, &uid, sizeof uid);
    return id;
  }

  std::unique_ptr<sdk::CommRank> init_rank(const plx_comm_config& cfg) override {
    PLX_REQUIRE(cfg.rank != -1 && cfg.size != -1,
                "init_rank: the nccl communicator cannot take rank and size from a launcher "
                "(rank/size -1): NCCL has no launcher of its own. Launch with mpirun, where the "
                "MPI communicator bootstraps NCCL (rank 0's id is broadcast over it), or give "
                "each process its rank, the group size and rank 0's id");
    PLX_REQUIRE(cfg.size >= 1, "init_rank: size must be >= 1, got %d", cfg.size);
    PLX_REQUIRE(cfg.rank >= 0 && cfg.rank < cfg.size, "init_rank: rank %d is not in [0, %d)",
                cfg.rank, cfg.size);
    const char* backend = cfg.backend && cfg.backend->name ? cfg.backend->name : "(none)";
    PLX_REQUIRE(std::strcmp(backend, "cuda") == 0,
                "init_rank: the nccl communicator exchanges buffers of backend 'cuda', not '%s'",
                backend);
    PLX_REQUIRE(cfg.backend->struct_size >= offsetof(plx_backend, stream_native) + sizeof(void*) &&
                    cfg.backend->stream_native != nullptr,
                "init_rank: backend 'cuda' gives no native streams (stream_native), which NCCL "
                "needs");
    PLX_REQUIRE(cfg.timeout_ms >= 0, "init_rank: timeout_ms must be >= 0 (0: default), got %d",
                cfg.timeout_ms);
    PLX_REQUIRE(cfg.device >= 0, "init_rank: device must be >= 0, got %d", cfg.device);

    int version = 0;
    if (ncclGetVersion(&version) == ncclSuccess && version < NCCL_VERSION_CODE &&
        version / 100 != NCCL_VERSION_CODE / 100)
      throw sdk::Error(PLX_ERR_UNSUPPORTED,
                       sdk::format("init_rank: the NCCL library loaded (%s) is older than the "
                                   "nccl.h the plugin was built with (%s); put the matching "
                                   "libnccl first on the library path or rebuild the plugin",
                                   version_string(version).c_str(),
                                   version_string(NCCL_VERSION_CODE).c_str()));

    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw sdk::Error(PLX_ERR_NOT_FOUND,
                       sdk::format("init_rank: no CUDA device: %s", cudaGetErrorString(e)));
    }
    if (devices == 0)
      throw sdk::Error(PLX_ERR_NOT_FOUND, "init_rank: no CUDA device: cudaGetDeviceCount found none");
    if (cfg.device >= devices)
      throw sdk::Error(PLX_ERR_NOT_FOUND,
                       sdk::format("init_rank: CUDA device %d does not exist (%d devices)",
                                   cfg.device, devices));

    const Ms timeout(cfg.timeout_ms ? cfg.timeout_ms : options_.timeout_ms);
    auto r = std::make_unique<NcclRank>(cfg, timeout, options_.watchdog);
    r->join(cfg.id);
    return r;
  }

 private:
  Options options_;
};

class NcclPlugin final : public sdk::Plugin {
 public:
  explicit NcclPlugin(const sdk::HostContext& host) {
    host.check_options({"timeout_ms", "watchdog"});
    Options o;
    const int64_t t = host.option_int("timeout_ms", kDefaultTimeoutMs);
    PLX_REQUIRE(t >= 1 && t <= INT32_MAX, "option 'timeout_ms': expected 1 to %d, got %lld",
                INT32_MAX, static_cast<long long>(t));
    o.timeout_ms = static_cast<int32_t>(t);
    o.watchdog = host.option_bool("watchdog", true);
    add_comm(std::make_unique<NcclCommunicator>(o));
    // Loading touches no GPU: a machine without one loads the plugin, and init_rank says why
    // it cannot join.
    int version = 0;
    if (ncclGetVersion(&version) == ncclSuccess)
      PLX_LOG(PLX_LOG_DEBUG, "nccl", "NCCL %s (built with %s), timeout %d ms, watchdog %s",
              version_string(version).c_str(), version_string(NCCL_VERSION_CODE).c_str(),
              o.timeout_ms, o.watchdog ? "on" : "off");
  }
};

}  // namespace
}  // namespace plexus::nccl

PLEXUS_PLUGIN(plexus::nccl::NcclPlugin, "nccl", "0.1.0",
              "NCCL communicator on the cuda backend's buffers: collectives and point to point "
              "between GPUs, with timeouts and abort")
