// The NCCL plugin's "nccl" communicator. Without a GPU ([cpu][comm]): it is listed when the
// plugin was built, accepts only the cuda backend's buffers, refuses bad configurations before
// touching a device, and says "no CUDA device" when there is none. With a GPU ([cuda][comm]):
// a group of one rank runs every collective, reduce op and dtype with exact results, count 0,
// send/recv to itself in a group, barriers, overlapping-buffer refusals, abort, and the
// watchdog's timeout on an operation that never completes; with two GPUs, a group of two.
//
// As in test_comm_threads.cpp, rank threads only record what they saw; the main thread asserts.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_util.hpp"
#include "plexus/communicator.hpp"
#include "plexus/plugin.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

// Long enough never to fire in a passing test, short enough that a broken one ends.
constexpr int32_t kTimeoutMs = 20000;

std::string nccl_plugin_file() { return plugin_dir() + "/libplexus-nccl.so"; }

// The "nccl" communicator, or null with the reason in *why (and *load_failed set when the plugin
// was built but did not load, which is a failure rather than a reason to skip).
Communicator* find_nccl(std::string* why, bool* load_failed) {
  *load_failed = false;
  for (Communicator* c : runtime().communicators())
    if (c->name() == "nccl") return c;
  if (!std::filesystem::exists(nccl_plugin_file())) {
    *why = "the NCCL plugin was not built (no CUDA toolkit, or no NCCL >= 2.18 at configure time)";
    return nullptr;
  }
  *load_failed = true;
  *why = nccl_plugin_file() + " was built but did not load";
  for (const SkippedPlugin& s : runtime().skipped())
    if (std::filesystem::path(s.path).filename() == "libplexus-nccl.so") *why += ": " + s.reason;
  return nullptr;
}

// Skips the test when the plugin was not built, fails it when it was built but did not load.
#define PLX_REQUIRE_NCCL(var)                                                  \
  std::string plx_nccl_why_;                                                   \
  bool plx_nccl_load_failed_ = false;                                          \
  Communicator* var##_ptr = find_nccl(&plx_nccl_why_, &plx_nccl_load_failed_); \
  if (plx_nccl_load_failed_) FAIL(plx_nccl_why_);                              \
  if (!var##_ptr) PLX_SKIP(plx_nccl_why_.c_str());                             \
  Communicator& var = *var##_ptr

// A stand-in for the cuda backend's table: the name and stream_native are all init_rank reads
// before it asks CUDA for a device, so configurations can be checked on any machine.
plx_backend fake_backend(const char* name) {
  plx_backend b{};
  b.struct_size = sizeof b;
  b.name = name;
  b.stream_native = [](void*, plx_stream s) -> void* { return s; };
  return b;
}

// init_rank through the raw table; the status, and the plugin's message in *error.
plx_status raw_init(Communicator& c, const plx_backend& backend, int32_t rank, int32_t size,
                    int32_t device, int32_t timeout_ms, std::string* error,
                    plx_comm_handle* out = nullptr, const plx_comm_id& id = plx_comm_id{}) {
  const plx_comm& t = c.table();
  plx_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.size = size;
  cfg.device = device;
  cfg.backend = &backend;
  cfg.timeout_ms = timeout_ms;
  cfg.id = id;
  plx_comm_handle h = nullptr;
  const plx_status s = t.init_rank(t.ctx, &cfg, &h);
  *error = s == PLX_OK ? "" : c.plugin().last_error();
  if (out)
    *out = h;
  else if (h)
    t.destroy(h);
  return s;
}

// Whether this machine has a CUDA device, as the cuda backend sees it; false if it cannot say.
bool have_gpu() {
  Backend* b = cuda::backend();
  return b && b->device_count() > 0;
}

// Values every dtype stores exactly (small multiples of 0.5, non-negative integers below 100).
std::vector<double> values(plx_dtype d, int64_t n, int salt = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = (i * 7 + salt * 13) % 37;
    v[static_cast<size_t>(i)] = dtype_is_float(d) ? 0.5 * static_cast<double>(k) - 9.0
                                : d == PLX_U8     ? static_cast<double>(k)
                                                  : static_cast<double>(k - 18);
  }
  return v;
}

Tensor on_gpu(Backend& gpu, const std::vector<double>& v, plx_dtype d) {
  return from_doubles(v, {static_cast<int64_t>(v.size())}, d).to(gpu, 0);
}

constexpr plx_reduce_op kOps[] = {PLX_REDUCE_SUM, PLX_REDUCE_AVG, PLX_REDUCE_MAX, PLX_REDUCE_MIN};
const std::vector<plx_dtype> kDtypes = {PLX_F32, PLX_F16, PLX_BF16, PLX_F64,
                                        PLX_I32, PLX_I64, PLX_U8};
constexpr Tol kExact{0, 0};

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- without a GPU ----

TEST_CASE("nccl communicator is listed and accepts cuda buffers only", "[cpu][comm]") {
  PLX_REQUIRE_NCCL(c);
  CHECK(c.plugin().name() == "nccl");
  CHECK(c.accepts("cuda"));
  CHECK_FALSE(c.accepts("cpu"));
  REQUIRE(c.backends() == std::vector<std::string>{"cuda"});
  // Every slot is there, the optional ones included.
  const plx_comm& t = c.table();
  CHECK(t.group_begin != nullptr);
  CHECK(t.group_end != nullptr);
  CHECK(t.get_async_error != nullptr);
  CHECK(t.struct_size >= offsetof(plx_comm, bench_native) + sizeof(void*));
  CHECK(t.bench_native != nullptr);  // plexus bench comm's native baseline

  // The core refuses other backends before calling the plugin ...
  REQUIRE_THROWS_WITH(c.join(cpu(), 0, 0, 1, plx_comm_id{}),
                      PLX_CONTAINS("communicator 'nccl' does not work on backend 'cpu' "
                                   "(it accepts: cuda)"));
  // ... and the plugin refuses them on its own when called directly.
  std::string error;
  CHECK(raw_init(c, cpu().table(), 0, 1, 0, kTimeoutMs, &error) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(error, PLX_CONTAINS("exchanges buffers of backend 'cuda', not 'cpu'"));
}

TEST_CASE("nccl init_rank refuses bad configurations before touching a device",
          "[cpu][comm][errors]") {
  PLX_REQUIRE_NCCL(c);
  const plx_backend cuda_like = fake_backend("cuda");
  std::string error;
  CHECK(raw_init(c, cuda_like, -1, -1, 0, kTimeoutMs, &error) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(error, PLX_CONTAINS("cannot take rank and size from a launcher"));
  CHECK_THAT(error, PLX_CONTAINS("mpirun"));
  CHECK(raw_init(c, cuda_like, 0, -1, 0, kTimeoutMs, &error) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(error, PLX_CONTAINS("mpirun"));
  CHECK(raw_init(c, cuda_like, 0, 0, 0, kTimeoutMs, &error) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(error, PLX_CONTAINS("size must be >= 1"));
  CHECK(raw_init(c, cuda_like, 2, 2, 0, kTimeoutMs, &error) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(error, PLX_CONTAINS("rank 2 is not in [0, 2)"));
  CHECK(raw_init(c, cuda_like, 0, 1, 0, -5, &error) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(error, PLX_CONTAINS("timeout_ms must be >= 0"));
  CHECK(raw_init(c, cuda_like, 0, 1, -1, kTimeoutMs, &error) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(error, PLX_CONTAINS("device must be >= 0"));
  plx_backend no_streams = fake_backend("cuda");
  no_streams.stream_native = nullptr;
  CHECK(raw_init(c, no_streams, 0, 1, 0, kTimeoutMs, &error) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(error, PLX_CONTAINS("gives no native streams"));
}

TEST_CASE("nccl init_rank without a GPU fails saying there is no CUDA device", "[cpu][comm]") {
  PLX_REQUIRE_NCCL(c);
  if (!cuda::backend())
    PLX_SKIP("the cuda backend is not loaded, so whether this machine has a GPU is unknown");
  if (have_gpu()) PLX_SKIP("this machine has a CUDA device ([cuda][comm] tests cover it)");
  const plx_backend cuda_like = fake_backend("cuda");
  std::string error;
  CHECK(raw_init(c, cuda_like, 0, 1, 0, kTimeoutMs, &error) == PLX_ERR_NOT_FOUND);
  CHECK_THAT(error, PLX_CONTAINS("init_rank: no CUDA device: "));
  // Through the core, on the real cuda backend (which has no device to offer either).
  REQUIRE_THROWS_WITH(c.join(*cuda::backend(), 0, 0, 1, plx_comm_id{}),
                      PLX_CONTAINS("no CUDA device"));
  // get_unique_id needs no GPU in NCCL's design (it opens a socket); where the installed NCCL
  // still fails without one, the failure is NCCL's own words, not a crash.
  const std::string id_error = what_of([&] { (void)c.unique_id(); });
  if (!id_error.empty()) CHECK_THAT(id_error, PLX_CONTAINS("ncclGetUniqueId failed: NCCL error"));
}

// ---- with a GPU ----

TEST_CASE("nccl single rank: every collective, op and dtype, exact", "[cuda][comm]") {
  PLX_REQUIRE_CUDA(gpu);
  PLX_REQUIRE_NCCL(c);
  const plx_comm_id id = c.unique_id();
  std::unique_ptr<CommGroup> g = c.join(gpu, 0, 0, 1, id, kTimeoutMs);
  REQUIRE(g->rank() == 0);
  REQUIRE(g->size() == 1);
  const int64_t n = 37;
  for (plx_dtype d : kDtypes) {
    const std::vector<double> x = values(d, n);
    for (plx_reduce_op op : kOps) {
      INFO(dtype_name(d) << " " << plx_reduce_op_string(op));
      // One rank: sum, average, max and min of one value are the value.
      const Tensor send = on_gpu(gpu, x, d);
      const Tensor recv = on_gpu(gpu, values(d, n, 5), d);
      g->all_reduce(send, recv, op);
      CHECK_ALLCLOSE(recv.to_doubles(), x, kExact);
      CHECK_ALLCLOSE(send.to_doubles(), x, kExact);
      g->all_reduce(send, op);  // in place
      CHECK_ALLCLOSE(send.to_doubles(), x, kExact);
      const Tensor rs = on_gpu(gpu, values(d, n, 6), d);
      g->reduce_scatter(send, rs, op);
      CHECK_ALLCLOSE(rs.to_doubles(), x, kExact);
    }
    INFO(dtype_name(d));
    const Tensor src = on_gpu(gpu, x, d);
    const Tensor dst = on_gpu(gpu, values(d, n, 7), d);
    g->broadcast(src, dst, 0);
    CHECK_ALLCLOSE(dst.to_doubles(), x, kExact);
    const Tensor gathered = on_gpu(gpu, values(d, n, 8), d);
    g->all_gather(src, gathered);
    CHECK_ALLCLOSE(gathered.to_doubles(), x, kExact);
  }
  g->barrier();
  gpu.sync(0);
  g->check_async_error();
}

// plexus bench comm's baseline: NCCL called directly moves the same data as the plugin's slots.
TEST_CASE("nccl single rank: bench_native runs each collective, with the right results",
          "[cuda][comm][bench]") {
  PLX_REQUIRE_CUDA(gpu);
  PLX_REQUIRE_NCCL(c);
  std::unique_ptr<CommGroup> g = c.join(gpu, 0, 0, 1, c.unique_id(), kTimeoutMs);
  REQUIRE(g->has_bench_native());
  const int64_t n = 1000;
  const std::vector<double> x = values(PLX_F32, n);
  for (plx_collective coll :
       {PLX_COLL_ALL_REDUCE, PLX_COLL_BROADCAST, PLX_COLL_ALL_GATHER, PLX_COLL_REDUCE_SCATTER}) {
    INFO(plx_collective_string(coll));
    const Tensor send = on_gpu(gpu, x, PLX_F32);
    // Broadcast is in place in recv (root 0), so recv starts as the data there.
    const Tensor recv =
        on_gpu(gpu, coll == PLX_COLL_BROADCAST ? x : values(PLX_F32, n, 5), PLX_F32);
    const auto seconds = g->bench_native(coll, send, recv, 3);
    REQUIRE(seconds.has_value());
    CHECK(*seconds > 0);
    CHECK_ALLCLOSE(recv.to_doubles(), x, kExact);  // one rank: every collective copies
  }
  g->check_async_error();
}

TEST_CASE("nccl single rank: count 0, send/recv to itself in a group, barriers",
          "[cuda][comm]") {
  PLX_REQUIRE_CUDA(gpu);
  PLX_REQUIRE_NCCL(c);
  std::unique_ptr<CommGroup> g = c.join(gpu, 0, 0, 1, c.unique_id(), kTimeoutMs);

  // Nothing to move: every operation accepts it and does nothing.
  const Tensor empty = Tensor::zeros(gpu, {0}, PLX_F32);
  g->all_reduce(empty, empty, PLX_REDUCE_SUM);
  g->broadcast(empty, empty, 0);
  g->all_gather(empty, empty);
  g->reduce_scatter(empty, empty, PLX_REDUCE_MAX);
  g->send(empty, 0);
  g->recv(empty, 0);

  // To itself: both halves in one group, or the send would wait for a recv never issued.
  for (plx_dtype d : kDtypes) {
    INFO(dtype_name(d));
    const std::vector<double> x = values(d, 300, 3);
    const Tensor out = on_gpu(gpu, x, d);
    const Tensor in = Tensor::zeros(gpu, {300}, d);
    g->group_begin();
    g->send(out, 0);
    g->recv(in, 0);
    g->group_end();
    CHECK_ALLCLOSE(in.to_doubles(), x, kExact);
  }

  // Several messages in one group pair up in order.
  const Tensor a = on_gpu(gpu, values(PLX_F32, 5, 1), PLX_F32);
  const Tensor b = on_gpu(gpu, values(PLX_F32, 5, 2), PLX_F32);
  const Tensor ra = Tensor::zeros(gpu, {5}, PLX_F32), rb = Tensor::zeros(gpu, {5}, PLX_F32);
  g->group_begin();
  g->send(a, 0);
  g->send(b, 0);
  g->recv(ra, 0);
  g->recv(rb, 0);
  g->group_end();
  CHECK_ALLCLOSE(ra.to_doubles(), values(PLX_F32, 5, 1), kExact);
  CHECK_ALLCLOSE(rb.to_doubles(), values(PLX_F32, 5, 2), kExact);

  // Many operations in flight at once: the watchdog retires them as they complete.
  const Tensor t = on_gpu(gpu, values(PLX_F32, 1000), PLX_F32);
  for (int k = 0; k < 200; ++k) {
    g->barrier();
    g->all_reduce(t, PLX_REDUCE_MAX);
  }
  gpu.sync(0);
  CHECK_ALLCLOSE(t.to_doubles(), values(PLX_F32, 1000), kExact);
  g->check_async_error();
  // group_end without group_begin is the caller's mistake and harms nothing.
  REQUIRE_THROWS_WITH(g->group_end(), PLX_CONTAINS("no group_begin to end"));
  g->barrier();
  gpu.sync(0);
}

TEST_CASE("nccl refuses overlapping buffers NCCL cannot handle, and stays usable",
          "[cuda][comm][errors]") {
  PLX_REQUIRE_CUDA(gpu);
  PLX_REQUIRE_NCCL(c);
  // The raw table, for layouts the core's tensors cannot express.
  const plx_comm& t = c.table();
  plx_comm_handle h = nullptr;
  std::string error;
  const plx_status joined = raw_init(c, gpu.table(), 0, 1, 0, kTimeoutMs, &error, &h, c.unique_id());
  INFO(error);
  REQUIRE(joined == PLX_OK);
  const Tensor buf = on_gpu(gpu, values(PLX_F32, 9), PLX_F32);
  auto* p = static_cast<float*>(buf.data());
  const plx_stream s = gpu.stream(0);
  CHECK(t.all_reduce(h, p, p + 1, 8, PLX_F32, PLX_REDUCE_SUM, s) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(c.plugin().last_error(),
             PLX_CONTAINS("all_reduce (count 8, f32, sum) on rank 0 of 1: send and recv overlap"));
  CHECK(t.all_gather(h, p + 1, p, 4, PLX_F32, s) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(c.plugin().last_error(), PLX_CONTAINS("NCCL's in-place layout"));
  CHECK(t.broadcast(h, p, p, 4, PLX_F32, 1, s) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(c.plugin().last_error(), PLX_CONTAINS("root 1 is not a rank of this group of 1"));
  CHECK(t.send(h, p, 4, PLX_F32, 3, s) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(c.plugin().last_error(), PLX_CONTAINS("send (count 4, f32) to rank 3 on rank 0 of 1: "
                                                   "rank 3 is not a rank of this group of 1"));
  CHECK(t.all_reduce(h, p, p, 4, PLX_DTYPE_COUNT, PLX_REDUCE_SUM, s) == PLX_ERR_INVALID_ARGUMENT);
  // NCCL's in-place layouts are accepted: rank 0's block is the start of the buffer.
  CHECK(t.all_gather(h, p, p, 4, PLX_F32, s) == PLX_OK);
  CHECK(t.reduce_scatter(h, p, p, 4, PLX_F32, PLX_REDUCE_SUM, s) == PLX_OK);
  CHECK(t.get_async_error(h) == PLX_OK);
  CHECK(t.barrier(h, s) == PLX_OK);
  gpu.sync(0);
  CHECK(t.destroy(h) == PLX_OK);
}

TEST_CASE("nccl abort: later operations fail with aborted, destroy still works",
          "[cuda][comm][errors]") {
  PLX_REQUIRE_CUDA(gpu);
  PLX_REQUIRE_NCCL(c);
  std::unique_ptr<CommGroup> g = c.join(gpu, 0, 0, 1, c.unique_id(), kTimeoutMs);
  const Tensor t = on_gpu(gpu, values(PLX_F32, 16), PLX_F32);
  g->all_reduce(t, PLX_REDUCE_SUM);
  gpu.sync(0);
  // From another thread, as a supervisor would.
  std::thread([&] { g->abort(); }).join();
  const std::string later = what_of([&] { g->all_reduce(t, PLX_REDUCE_SUM); });
  CHECK_THAT(later, PLX_CONTAINS("all_reduce: aborted"));
  CHECK_THAT(later, PLX_CONTAINS("abort() was called on rank 0"));
  CHECK_THAT(what_of([&] { g->barrier(); }), PLX_CONTAINS("barrier: aborted"));
  CHECK_THAT(what_of([&] { g->group_begin(); }), PLX_CONTAINS("aborted"));
  CHECK_THAT(what_of([&] { g->check_async_error(); }),
             PLX_CONTAINS("communicator 'nccl': asynchronous error: aborted"));
  g.reset();  // destroy after abort: frees what is left, reports nothing
  // A new group forms as usual afterwards.
  std::unique_ptr<CommGroup> g2 = c.join(gpu, 0, 0, 1, c.unique_id(), kTimeoutMs);
  g2->all_reduce(t, PLX_REDUCE_MAX);
  CHECK_ALLCLOSE(t.to_doubles(), values(PLX_F32, 16), kExact);
}

TEST_CASE("nccl watchdog aborts an operation that never completes, naming it",
          "[cuda][comm][errors]") {
  PLX_REQUIRE_CUDA(gpu);
  PLX_REQUIRE_NCCL(c);
  // A receive from itself with no send: the GPU waits for data that never comes (as it would
  // for a dead peer). The watchdog gives up after the timeout and aborts, which also ends the
  // waiting kernel; if NCCL instead keeps the call in progress, the issue itself times out.
  std::unique_ptr<CommGroup> g = c.join(gpu, 0, 0, 1, c.unique_id(), 1500);
  const Tensor t = Tensor::zeros(gpu, {64}, PLX_F32);
  const auto start = std::chrono::steady_clock::now();
  const std::string issued = what_of([&] { g->recv(t, 0); });
  // The stream drains once the abort has ended the kernel (or at once if nothing was launched).
  const std::string synced = what_of([&] { gpu.sync(0); });
  std::string async;
  for (int k = 0; k < 100 && async.empty(); ++k) {
    async = what_of([&] { g->check_async_error(); });
    if (async.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("recv: " << issued << "\nsync: " << synced << "\nasync: " << async << "\nafter "
                << seconds << " s");
  const std::string seen = issued.empty() ? async : issued;
  CHECK_THAT(seen, PLX_CONTAINS("recv (count 64, f32) from rank 0 on rank 0 of 1"));
  CHECK_THAT(seen, PLX_CONTAINS("within 1500 ms"));
  CHECK_THAT(seen, PLX_CONTAINS("the communicator was aborted"));
  CHECK(seconds < 15);
  CHECK_THAT(what_of([&] { g->barrier(); }), PLX_CONTAINS("the communicator has failed"));
  g.reset();
}

TEST_CASE("nccl two ranks on two GPUs: collectives, point to point, a missing peer",
          "[cuda][comm]") {
  PLX_REQUIRE_CUDA(gpu);
  PLX_REQUIRE_NCCL(c);
  if (gpu.device_count() < 2) PLX_SKIP("needs two CUDA devices");
  const plx_comm_id id = c.unique_id();
  std::vector<std::string> out(2);
  std::vector<std::vector<double>> sums(2), gathered(2), got(2);
  const int64_t n = 1000;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<CommGroup> g = c.join(gpu, r, r, 2, id, kTimeoutMs);
        const Tensor x = from_doubles(values(PLX_F32, n, r), {n}, PLX_F32).to(gpu, r);
        const Tensor s = Tensor::zeros(gpu, {n}, PLX_F32, r);
        g->all_reduce(x, s, PLX_REDUCE_SUM);
        const Tensor all = Tensor::zeros(gpu, {2 * n}, PLX_F32, r);
        g->all_gather(x, all);
        const Tensor in = Tensor::zeros(gpu, {n}, PLX_F32, r);
        g->group_begin();
        g->send(x, 1 - r);
        g->recv(in, 1 - r);
        g->group_end();
        g->barrier();
        sums[static_cast<size_t>(r)] = s.to_doubles();
        gathered[static_cast<size_t>(r)] = all.to_doubles();
        got[static_cast<size_t>(r)] = in.to_doubles();
        g->check_async_error();
      } catch (const std::exception& e) {
        out[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << out[static_cast<size_t>(r)]);
    REQUIRE(out[static_cast<size_t>(r)].empty());
    std::vector<double> want(static_cast<size_t>(n)), cat;
    for (int64_t i = 0; i < n; ++i)
      want[static_cast<size_t>(i)] =
          values(PLX_F32, n, 0)[static_cast<size_t>(i)] + values(PLX_F32, n, 1)[static_cast<size_t>(i)];
    for (int k = 0; k < 2; ++k) {
      const auto v = values(PLX_F32, n, k);
      cat.insert(cat.end(), v.begin(), v.end());
    }
    CHECK_ALLCLOSE(sums[static_cast<size_t>(r)], want, kExact);
    CHECK_ALLCLOSE(gathered[static_cast<size_t>(r)], cat, kExact);
    CHECK_ALLCLOSE(got[static_cast<size_t>(r)], values(PLX_F32, n, 1 - r), kExact);
  }

  // Rank 1 joins, then never comes to the all_reduce: rank 0's times out and names it. (The
  // timeout also bounds the join, so it leaves NCCL's set-up of two ranks room.)
  const plx_comm_id id2 = c.unique_id();
  std::vector<std::string> seen(2);
  std::vector<std::thread> pair;
  std::atomic<bool> rank0_done{false};
  for (int r = 0; r < 2; ++r)
    pair.emplace_back([&, r] {
      try {
        std::unique_ptr<CommGroup> g = c.join(gpu, r, r, 2, id2, 5000);
        if (r == 0) {
          const Tensor x = Tensor::zeros(gpu, {n}, PLX_F32, 0);
          try {
            g->all_reduce(x, PLX_REDUCE_SUM);
            gpu.sync(0);
            for (int k = 0; k < 100; ++k) {
              g->check_async_error();
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
          } catch (const std::exception& e) {
            seen[0] = e.what();
          }
          rank0_done = true;
        } else {
          while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          g->abort();  // its peer gave up; leave without waiting for it
        }
      } catch (const std::exception& e) {
        seen[static_cast<size_t>(r)] += e.what();
        rank0_done = true;
      }
    });
  for (auto& th : pair) th.join();
  INFO("rank 0: " << seen[0] << "\nrank 1: " << seen[1]);
  CHECK_THAT(seen[0], PLX_CONTAINS("all_reduce (count 1000, f32, sum) on rank 0 of 2"));
  CHECK_THAT(seen[0], PLX_CONTAINS("within 5000 ms"));
}
