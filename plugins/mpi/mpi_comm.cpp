// The "mpi" communicator: the plx_comm interface on MPI (OpenMPI from Debian) for buffers of the
// "cpu" backend. Launch with `mpirun -np N ...`; the launcher gives every process its rank.
//
// MPI is initialised the first time a group is joined or an id is made, not when the plugin
// loads, so `plexus info` and single-process runs never touch it; it is finalised when the plugin
// unloads, unless a communicator failed (then MPI_Finalize could wait forever for a dead peer, and
// exiting lets the launcher end the job).
//
// Groups. rank = size = -1 joins every process of the launch (a duplicate of MPI_COMM_WORLD).
// Explicit rank and size form a sub-group out of every process of the launch: each process
// calls init_rank, in the same order (it is MPI_Comm_split over the world, collective over all of
// them), with the id of the group it joins; processes with the same id form one group, ordered
// by the rank they give. So a 2 x 2 grid is two init_rank calls on every process.
//
// Every operation is a non-blocking MPI call completed by polling MPI_Test against the group's
// timeout, so a hung or dead peer ends in PLX_ERR_TIMEOUT naming the operation, never in a hang;
// after a timeout or abort() the group is failed and every later operation fails at once. The
// CPU backend's streams are synchronous, so an operation is complete when it returns.
//
// Reductions: sums of f32/f64 and all integer ops use MPI's own; f16/bf16 (which MPI lacks) and
// float max/min (which must let a NaN through, as the threads communicator does, so a diverged
// rank is seen everywhere) use our MPI_Op functions. avg is the sum divided by the group size
// (integers truncated toward zero). Integer sums wrap as C's do.
//
// Option `blocking = true` ([plugins.options.mpi]): the collectives call MPI's blocking functions
// (MPI_Allreduce, ...), which OpenMPI runs with faster algorithms than the non-blocking ones
// (docs/benchmarks.md). A blocking call cannot be abandoned, so the timeout is kept by a
// watchdog thread that ends the whole job (MPI_Abort, after printing the operation, rank and
// limit) when a call outlives it: no hang either way, but no recoverable PLX_ERR_TIMEOUT.
// Point to point stays non-blocking (group_begin/group_end needs it).
//
// Point to point is matched by (peer, order of issue), MPI's non-overtaking rule. A send and
// its matching recv issued in opposite orders on two ranks (a ring exchange) must sit between
// group_begin and group_end, as with NCCL: the requests are then completed together at
// group_end.
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <thread>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "plexus/sdk.hpp"

namespace plexus::mpi {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int32_t kDefaultTimeoutMs = 60000;
// A wait sleeps between polls only once it has lasted this long (where a sleep's delay is a
// small part of the operation).
constexpr std::chrono::milliseconds kSleepAfter{100};
// Ids this communicator made start with this tag; anything else is refused.
constexpr char kIdTag[16] = "plexus.mpi.id1";

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

#define PLX_MPI_CHECK(call)                                                                  \
  do {                                                                                       \
    const int plx_mpi_rc_ = (call);                                                          \
    if (plx_mpi_rc_ != MPI_SUCCESS)                                                          \
      throw ::plexus::sdk::Error(PLX_ERR_COMM, std::string("mpi: " #call ": ") +             \
                                                   ::plexus::mpi::mpi_error(plx_mpi_rc_));   \
  } while (0)

// ---- our reduce operators ----

template <class T>
float to_f(T v) {
  return static_cast<float>(v);
}

// max and min that let a NaN through from either side.
template <class A>
A max_nan(A a, A x) {
  return (x > a || x != x) ? x : a;
}
template <class A>
A min_nan(A a, A x) {
  return (x < a || x != x) ? x : a;
}

enum class Rop { Sum, Max, Min };

// inout[i] = in[i] op inout[i], in the storage type T computed through A.
template <class T, class A, Rop R>
void apply(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const A x = static_cast<A>(to_f(a[i])), y = static_cast<A>(to_f(b[i]));
    A r;
    if constexpr (R == Rop::Sum) r = x + y;
    else if constexpr (R == Rop::Max) r = max_nan(y, x);
    else r = min_nan(y, x);
    b[i] = T(static_cast<float>(r));
  }
}
// f32/f64 max and min work on the values directly.
template <class T, Rop R>
void apply_native(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = R == Rop::Max ? max_nan(b[i], a[i]) : min_nan(b[i], a[i]);
}

// Process-wide MPI state: initialised once, our operators, whether finalising is safe.
class World {
 public:
  static World& get() {
    static World w;
    return w;
  }

  // Initialises MPI if nobody has. Throws with MPI's message on failure.
  void ensure() {
    std::lock_guard<std::mutex> lock(mu_);
    int done = 0;
    MPI_Initialized(&done);
    if (!done) {
      promote_global();
      int provided = 0;
      PLX_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      we_initialized_ = true;
      // Errors come back as codes, never as the default handler's abort.
      PLX_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    }
    if (ops_ready_) return;
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
      const char* v = std::getenv(name);
      const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
      if (v && *v && cpus > 0) {
        oversubscribed_ = std::atol(v) > cpus;
        break;
      }
    }
    create(f16_ops_, apply<plexus::half, float, Rop::Sum>, apply<plexus::half, float, Rop::Max>,
           apply<plexus::half, float, Rop::Min>);
    create(bf16_ops_, apply<plexus::bfloat16, float, Rop::Sum>, apply<plexus::bfloat16, float, Rop::Max>,
           apply<plexus::bfloat16, float, Rop::Min>);
    PLX_MPI_CHECK(MPI_Op_create(apply_native<float, Rop::Max>, 1, &f32_max_));
    PLX_MPI_CHECK(MPI_Op_create(apply_native<float, Rop::Min>, 1, &f32_min_));
    PLX_MPI_CHECK(MPI_Op_create(apply_native<double, Rop::Max>, 1, &f64_max_));
    PLX_MPI_CHECK(MPI_Op_create(apply_native<double, Rop::Min>, 1, &f64_min_));
    ops_ready_ = true;
  }

  // A communicator failed: finalising could wait for a dead peer.
  void poison() { poisoned_ = true; }

  // More ranks of the launch on this node than CPUs (the launcher's local size, OpenMPI's or
  // MPICH's variable): a waiting rank then yields its CPU between polls.
  bool oversubscribed() const { return oversubscribed_; }

  void finalize() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!we_initialized_ || finalized || poisoned_) return;
    if (ops_ready_)
      for (MPI_Op* op : {&f16_ops_[0], &f16_ops_[1], &f16_ops_[2], &bf16_ops_[0], &bf16_ops_[1],
                         &bf16_ops_[2], &f32_max_, &f32_min_, &f64_max_, &f64_min_})
        MPI_Op_free(op);
    MPI_Finalize();
  }

  // The MPI datatype carrying `dtype` and the operator reducing it.
  static MPI_Datatype type(plx_dtype d) {
    switch (d) {
      case PLX_F32: return MPI_FLOAT;
      case PLX_F64: return MPI_DOUBLE;
      case PLX_F16:
      case PLX_BF16: return MPI_UINT16_T;
      case PLX_I32: return MPI_INT32_T;
      case PLX_I64: return MPI_INT64_T;
      case PLX_U8: return MPI_UINT8_T;
      default: break;
    }
    throw sdk::InvalidArgument(sdk::format("mpi: dtype %d is not a dtype", static_cast<int>(d)));
  }
  MPI_Op op(plx_dtype d, plx_reduce_op o) const {
    const int k = o == PLX_REDUCE_MAX ? 1 : o == PLX_REDUCE_MIN ? 2 : 0;  // avg: a sum first
    switch (d) {
      case PLX_F16: return f16_ops_[k];
      case PLX_BF16: return bf16_ops_[k];
      case PLX_F32: return k == 0 ? MPI_SUM : k == 1 ? f32_max_ : f32_min_;
      case PLX_F64: return k == 0 ? MPI_SUM : k == 1 ? f64_max_ : f64_min_;
      default: return k == 0 ? MPI_SUM : k == 1 ? MPI_MAX : MPI_MIN;
    }
  }

 private:
  static void create(MPI_Op (&ops)[3], MPI_User_function* sum, MPI_User_function* max,
                     MPI_User_function* min) {
    PLX_MPI_CHECK(MPI_Op_create(sum, 1, &ops[0]));
    PLX_MPI_CHECK(MPI_Op_create(max, 1, &ops[1]));
    PLX_MPI_CHECK(MPI_Op_create(min, 1, &ops[2]));
  }

  // The core loads plugins with local symbol binding; OpenMPI's own components, loaded later,
  // need libmpi's symbols globally visible. Re-open it RTLD_GLOBAL (it is already loaded).
  static void promote_global() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) && info.dli_fname)
      dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  }

  std::mutex mu_;
  bool we_initialized_ = false, ops_ready_ = false;
  std::atomic<bool> poisoned_{false};
  bool oversubscribed_ = false;
  MPI_Op f16_ops_[3]{}, bf16_ops_[3]{}, f32_max_{}, f32_min_{}, f64_max_{}, f64_min_{};
};

// Blocking mode's timeout: ends the job when an armed call outlives its deadline.
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  static Watchdog& get() {
    static Watchdog w;
    return w;
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // `message` is printed if the deadline passes first.
  uint64_t arm(std::string message, Clock::time_point deadline) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    const uint64_t id = ++next_;
    armed_.emplace(id, Armed{deadline, std::move(message)});
    return id;
  }
  void disarm(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    armed_.erase(id);
  }

 private:
  struct Armed {
    Clock::time_point deadline;
    std::string message;
  };
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(20));
      const auto now = Clock::now();
      for (const auto& [id, a] : armed_)
        if (now > a.deadline) {
          std::fprintf(stderr, "plexus: %s; ending the job (the mpi communicator's blocking mode "
                               "cannot abandon an MPI call)\n", a.message.c_str());
          std::fflush(stderr);
          World::get().poison();
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Armed> armed_;
  uint64_t next_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

size_t elem_size(plx_dtype d) { return plexus::dtype_size(d); }

// ---- one rank ----

class MpiRank final : public sdk::CommRank {
 public:
  MpiRank(MPI_Comm comm, int32_t timeout_ms, bool blocking)
      : comm_(comm), timeout_ms_(timeout_ms), blocking_(blocking) {
    PLX_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    PLX_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiRank() override {
    if (!failed_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }

  void all_reduce(const void* send, void* recv, uint64_t count, plx_dtype dtype, plx_reduce_op op,
                  plx_stream) override {
    const std::string what = describe("all_reduce", count, dtype) + " " + plx_reduce_op_string(op);
    start(what);
    const int n = to_int(count, what);
    if (n == 0) return;
    const void* in = send == recv ? MPI_IN_PLACE : send;
    const MPI_Datatype t = World::type(dtype);
    const MPI_Op o = World::get().op(dtype, op);
    collective(
        what, [&] { return MPI_Allreduce(in, recv, n, t, o, comm_); },
        [&](MPI_Request* r) { return MPI_Iallreduce(in, recv, n, t, o, comm_, r); });
    if (op == PLX_REDUCE_AVG) divide(recv, count, dtype);
  }

  void broadcast(const void* send, void* recv, uint64_t count, plx_dtype dtype, int32_t root,
                 plx_stream) override {
    const std::string what = describe("broadcast", count, dtype) + " from root " + std::to_string(root);
    start(what);
    PLX_REQUIRE(root >= 0 && root < size_, "mpi: %s: root must be in [0, %d)", what.c_str(), size_);
    const int n = to_int(count, what);
    if (n == 0) return;
    if (rank_ == root && send != recv) std::memmove(recv, send, count * elem_size(dtype));
    const MPI_Datatype t = World::type(dtype);
    collective(
        what, [&] { return MPI_Bcast(recv, n, t, root, comm_); },
        [&](MPI_Request* r) { return MPI_Ibcast(recv, n, t, root, comm_, r); });
  }

  void all_gather(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                  plx_stream) override {
    const std::string what = describe("all_gather", count, dtype);
    start(what);
    const int n = to_int(count, what);
    to_int(count * static_cast<uint64_t>(size_), what);
    if (n == 0) return;
    const auto* mine = static_cast<const unsigned char*>(recv) + count * elem_size(dtype) * static_cast<uint64_t>(rank_);
    const MPI_Datatype t = World::type(dtype);
    const void* in = send == mine ? MPI_IN_PLACE : send;
    collective(
        what, [&] { return MPI_Allgather(in, n, t, recv, n, t, comm_); },
        [&](MPI_Request* r) { return MPI_Iallgather(in, n, t, recv, n, t, comm_, r); });
  }

  void reduce_scatter(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                      plx_reduce_op op, plx_stream) override {
    const std::string what = describe("reduce_scatter", count, dtype) + " " + plx_reduce_op_string(op);
    start(what);
    const int n = to_int(count, what);
    to_int(count * static_cast<uint64_t>(size_), what);
    if (n == 0) return;
    const MPI_Datatype t = World::type(dtype);
    const MPI_Op o = World::get().op(dtype, op);
    collective(
        what, [&] { return MPI_Reduce_scatter_block(send, recv, n, t, o, comm_); },
        [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, recv, n, t, o, comm_, r); });
    if (op == PLX_REDUCE_AVG) divide(recv, count, dtype);
  }

  void send(const void* buf, uint64_t count, plx_dtype dtype, int32_t peer, plx_stream) override {
    const std::string what = describe("send", count, dtype) + " to rank " + std::to_string(peer);
    start(what);
    check_peer(peer, what);
    MPI_Request req;
    check(MPI_Isend(buf, to_int(count, what), World::type(dtype), peer, kTag, comm_, &req), what);
    finish(req, what, -1, dtype);
  }

  void recv(void* buf, uint64_t count, plx_dtype dtype, int32_t peer, plx_stream) override {
    const std::string what = describe("recv", count, dtype) + " from rank " + std::to_string(peer);
    start(what);
    check_peer(peer, what);
    // A longer message fails with MPI's truncation error, a shorter one in check_count.
    MPI_Request req;
    check(MPI_Irecv(buf, to_int(count, what), World::type(dtype), peer, kTag, comm_, &req), what);
    finish(req, what, static_cast<int64_t>(count), dtype);
  }

  void barrier(plx_stream) override {
    const std::string what = "barrier";
    start(what);
    collective(
        what, [&] { return MPI_Barrier(comm_); }, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

  bool has_group() const override { return true; }
  void group_begin() override {
    start("group_begin");
    ++group_depth_;
  }
  void group_end() override {
    PLX_REQUIRE(group_depth_ > 0, "mpi: group_end without group_begin");
    if (--group_depth_ > 0) return;
    std::vector<Pending> pending;
    pending.swap(pending_);
    for (Pending& p : pending) {
      MPI_Status st;
      wait(p.req, p.what, &st);
      if (p.expect >= 0) check_count(st, p);
    }
  }

  void abort() override { aborted_ = true; }

  // The baseline of `plexus bench comm`: the collective as the blocking MPI call a program
  // would make itself, on this group's communicator, timed with MPI_Wtime after MPI_Barrier.
  // No polling and no timeout (a blocking call cannot be bounded): measurement only.
  double bench_native(plx_collective c, uint64_t count, plx_dtype dtype, int32_t iters, void* buf_a,
                      void* buf_b, plx_stream) override {
    const std::string what =
        describe("bench_native", count, dtype) + " " + plx_collective_string(c);
    start(what);
    const int n = to_int(count, what);
    to_int(count * static_cast<uint64_t>(size_), what);
    const MPI_Datatype t = World::type(dtype);
    const MPI_Op sum = World::get().op(dtype, PLX_REDUCE_SUM);
    check(MPI_Barrier(comm_), what);
    const double t0 = MPI_Wtime();
    for (int32_t i = 0; i < iters && n > 0; ++i) {
      int rc = MPI_SUCCESS;
      switch (c) {
        case PLX_COLL_ALL_REDUCE:
          rc = MPI_Allreduce(buf_a, buf_b, n, t, sum, comm_);
          break;
        case PLX_COLL_BROADCAST:
          rc = MPI_Bcast(buf_b, n, t, 0, comm_);
          break;
        case PLX_COLL_ALL_GATHER:
          rc = MPI_Allgather(buf_a, n, t, buf_b, n, t, comm_);
          break;
        case PLX_COLL_REDUCE_SCATTER:
          rc = MPI_Reduce_scatter_block(buf_a, buf_b, n, t, sum, comm_);
          break;
      }
      check(rc, what);
    }
    return MPI_Wtime() - t0;
  }

  void check_async_error() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) throw sdk::Error(failure_status_, failure_);
  }

 private:
  static constexpr int kTag = 0x504c;  // "PL"

  struct Pending {
    MPI_Request req;
    std::string what;
    int64_t expect;  // recv: elements expected; -1 for a send
    plx_dtype dtype;
  };

  std::string describe(const char* op, uint64_t count, plx_dtype dtype) const {
    return std::string(op) + " (count " + std::to_string(count) + ", " +
           (dtype >= 0 && dtype < PLX_DTYPE_COUNT ? plexus::dtype_name(dtype) : "?") + ")";
  }

  // Refuses work on a failed or aborted group, and (outside a group) checks nothing is queued.
  void start(const std::string& what) {
    check_async_error();
    if (aborted_) fail(PLX_ERR_ABORTED, "mpi: " + what + " on rank " + std::to_string(rank_) +
                                            ": the communicator was aborted");
  }

  int to_int(uint64_t count, const std::string& what) const {
    if (count > static_cast<uint64_t>(INT_MAX))
      throw sdk::InvalidArgument("mpi: " + what + ": MPI counts stop at 2^31 - 1 elements");
    return static_cast<int>(count);
  }

  void check_peer(int32_t peer, const std::string& what) const {
    PLX_REQUIRE(peer >= 0 && peer < size_, "mpi: %s: peer must be in [0, %d)", what.c_str(), size_);
  }

  void check(int rc, const std::string& what) {
    if (rc != MPI_SUCCESS)
      fail(PLX_ERR_COMM, "mpi: " + what + " on rank " + std::to_string(rank_) + ": " + mpi_error(rc));
  }

  [[noreturn]] void fail(plx_status status, const std::string& msg) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_) {
        failed_ = true;
        failure_ = msg;
        failure_status_ = status;
      }
    }
    World::get().poison();
    throw sdk::Error(status, msg);
  }

  // Polls `req` to completion, or fails on timeout or abort. MPI_Test drives the transfer (a
  // non-blocking collective advances only inside it), so the loop polls as a blocking MPI call
  // does: back to back, yielding between polls when the node has more ranks than CPUs (OpenMPI
  // then does the same, mpi_yield_when_idle). Only a wait that has lasted kSleepAfter sleeps
  // between polls, to leave the CPU to others while a peer is slow or hung: a sleep lasts far
  // longer than asked (50 us took 194 us on the 2-core VM) and can delay a running operation by
  // as much, several percent of a 1-10 ms collective; and a yield on a busy machine can hand
  // the CPU to another process for a whole time slice.
  void wait(MPI_Request& req, const std::string& what, MPI_Status* status = nullptr) {
    const auto begin = Clock::now();
    const auto deadline = begin + std::chrono::milliseconds(timeout_ms_);
    const bool yield = World::get().oversubscribed();
    MPI_Status local;
    bool sleeping = false;
    for (uint64_t polls = 1;; ++polls) {
      int done = 0;
      check(MPI_Test(&req, &done, status ? status : &local), what);
      if (done) return;
      if (aborted_)
        fail(PLX_ERR_ABORTED, "mpi: " + what + " on rank " + std::to_string(rank_) +
                                  ": the communicator was aborted while it waited");
      if (sleeping || yield || polls % 256 == 0) {  // a yield can last a time slice
        const auto now = Clock::now();
        if (now > deadline)
          fail(PLX_ERR_TIMEOUT, "mpi: " + what + " on rank " + std::to_string(rank_) + " of " +
                                    std::to_string(size_) + " did not complete within " +
                                    std::to_string(timeout_ms_) +
                                    " ms: a peer is hung, dead or not making the same call");
        sleeping = now - begin > kSleepAfter;
      }
      if (sleeping)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else if (yield)
        std::this_thread::yield();
    }
  }

  // A collective: the blocking call under the watchdog (blocking mode), or the non-blocking one
  // polled against the timeout.
  template <class Blocking, class Start>
  void collective(const std::string& what, Blocking blocking_call, Start start_call) {
    if (blocking_) {
      Watchdog& w = Watchdog::get();
      const uint64_t id = w.arm("mpi: " + what + " on rank " + std::to_string(rank_) + " of " +
                                    std::to_string(size_) + " did not complete within " +
                                    std::to_string(timeout_ms_) +
                                    " ms: a peer is hung, dead or not making the same call",
                                Clock::now() + std::chrono::milliseconds(timeout_ms_));
      const int rc = blocking_call();
      w.disarm(id);
      check(rc, what);
      return;
    }
    MPI_Request req;
    check(start_call(&req), what);
    wait(req, what);
  }

  // A send or recv: completed now, or at group_end inside a group.
  void finish(MPI_Request& req, const std::string& what, int64_t expect_recv, plx_dtype dtype) {
    Pending p{req, what, expect_recv, dtype};
    if (group_depth_ > 0) {
      pending_.push_back(std::move(p));
      return;
    }
    MPI_Status st;
    wait(p.req, p.what, &st);
    if (p.expect >= 0) check_count(st, p);
  }

  void check_count(const MPI_Status& st, const Pending& p) {
    // (MPI_Test's own return code carried any error: a single request's status.MPI_ERROR is
    // not set.)
    int got = 0;
    check(MPI_Get_count(&st, World::type(p.dtype), &got), p.what);
    if (got != p.expect)
      fail(PLX_ERR_COMM, "mpi: " + p.what + " on rank " + std::to_string(rank_) + ": the message held " +
                             std::to_string(got) + " element(s), not " + std::to_string(p.expect));
  }

  // recv[i] /= size, after a sum: avg.
  void divide(void* buf, uint64_t count, plx_dtype dtype) const {
    const double n = size_;
    auto each = [&](auto* p) {
      using T = std::remove_pointer_t<decltype(p)>;
      for (uint64_t i = 0; i < count; ++i) {
        if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(p[i] / static_cast<T>(size_));
        else if constexpr (std::is_floating_point_v<T>) p[i] = static_cast<T>(p[i] / static_cast<T>(n));
        else p[i] = T(static_cast<float>(p[i]) / static_cast<float>(n));
      }
    };
    switch (dtype) {
      case PLX_F32: each(static_cast<float*>(buf)); break;
      case PLX_F64: each(static_cast<double*>(buf)); break;
      case PLX_F16: each(static_cast<plexus::half*>(buf)); break;
      case PLX_BF16: each(static_cast<plexus::bfloat16*>(buf)); break;
      case PLX_I32: each(static_cast<int32_t*>(buf)); break;
      case PLX_I64: each(static_cast<int64_t*>(buf)); break;
      case PLX_U8: each(static_cast<uint8_t*>(buf)); break;
      default: break;
    }
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  int32_t timeout_ms_;
  bool blocking_;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  bool failed_ = false;
  std::string failure_;
  plx_status failure_status_ = PLX_ERR_COMM;
  int group_depth_ = 0;
  std::vector<Pending> pending_;
};

class MpiCommunicator final : public sdk::Communicator {
 public:
  explicit MpiCommunicator(bool blocking) : sdk::Communicator("mpi", "cpu"), blocking_(blocking) {}
  bool has_bench_native() const override { return true; }

  plx_comm_id unique_id() override {
    World::get().ensure();
    plx_comm_id id{};
    std::memcpy(id.bytes, kIdTag, sizeof kIdTag);
    std::random_device rd;
    const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    std::memcpy(id.bytes + sizeof kIdTag, &nonce, sizeof nonce);
    return id;
  }

  std::unique_ptr<sdk::CommRank> init_rank(const plx_comm_config& cfg) override {
    PLX_REQUIRE(cfg.backend && cfg.backend->name && std::strcmp(cfg.backend->name, "cpu") == 0,
                "mpi: buffers of backend '%s' are not host memory; the mpi communicator takes "
                "'cpu' buffers",
                cfg.backend && cfg.backend->name ? cfg.backend->name : "(none)");
    PLX_REQUIRE((cfg.rank == -1) == (cfg.size == -1),
                "mpi: rank and size are both -1 (from the launcher) or both given, not rank %d "
                "size %d",
                cfg.rank, cfg.size);
    PLX_REQUIRE(cfg.timeout_ms >= 0, "mpi: timeout_ms must be >= 0, got %d", cfg.timeout_ms);
    World::get().ensure();
    const int32_t timeout = cfg.timeout_ms > 0 ? cfg.timeout_ms : kDefaultTimeoutMs;
    int world_size = 0, world_rank = 0;
    PLX_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    PLX_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    MPI_Comm comm = MPI_COMM_NULL;
    if (cfg.rank == -1) {
      PLX_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
    } else {
      PLX_REQUIRE(cfg.size >= 1 && cfg.size <= world_size && cfg.rank >= 0 && cfg.rank < cfg.size,
                  "mpi: rank %d of size %d does not fit a launch of %d processes", cfg.rank,
                  cfg.size, world_size);
      PLX_REQUIRE(std::memcmp(cfg.id.bytes, kIdTag, sizeof kIdTag) == 0,
                  "mpi: the id was not made by the mpi communicator's get_unique_id");
      uint64_t nonce = 0;
      std::memcpy(&nonce, cfg.id.bytes + sizeof kIdTag, sizeof nonce);
      const int color = static_cast<int>(nonce & 0x3fffffff);
      PLX_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, cfg.rank, &comm));
    }
    PLX_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    auto r = std::make_unique<MpiRank>(comm, timeout, blocking_);
    if (cfg.rank != -1 && (r->size() != cfg.size || r->rank() != cfg.rank)) {
      const int got = r->size();
      throw sdk::InvalidArgument(sdk::format(
          "mpi: process %d asked for rank %d of a group of %d, but %d process(es) gave that id "
          "(each process of the launch must call init_rank in the same order)",
          world_rank, cfg.rank, cfg.size, got));
    }
    return r;
  }

 private:
  bool blocking_;
};

class MpiPlugin final : public sdk::Plugin {
 public:
  explicit MpiPlugin(const sdk::HostContext& host) {
    host.check_options({"blocking"});
    add_comm(std::make_unique<MpiCommunicator>(host.option_bool("blocking", false)));
  }
  ~MpiPlugin() override { World::get().finalize(); }
};

}  // namespace
}  // namespace plexus::mpi

PLEXUS_PLUGIN(plexus::mpi::MpiPlugin, "mpi", "0.1.0",
              "MPI communicator (OpenMPI) for cpu buffers; launch with mpirun")
