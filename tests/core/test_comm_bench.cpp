// `plexus bench comm`: the pure parts (option parsing, sizes, nccl-tests' bandwidth factors,
// the choice of iterations) and the native-baseline slot as the core reads it. The benchmark
// itself runs under mpirun in ctest (tests/CMakeLists.txt); nothing here asserts a speed.
#include <cmath>
#include <cstddef>
#include <cstring>

#include "plexus/comm_bench.hpp"
#include "plexus/communicator.hpp"
#include "plexus/error.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

TEST_CASE("comm bench sizes parse with K, M and G as powers of 1024", "[cpu][comm][bench]") {
  CHECK(parse_bytes("--max-bytes", "8") == 8);
  CHECK(parse_bytes("--max-bytes", "64K") == 64 * 1024);
  CHECK(parse_bytes("--max-bytes", "64k") == 64 * 1024);
  CHECK(parse_bytes("--max-bytes", "256M") == uint64_t{256} << 20);
  CHECK(parse_bytes("--max-bytes", "256MiB") == uint64_t{256} << 20);
  CHECK(parse_bytes("--max-bytes", "1G") == uint64_t{1} << 30);
  CHECK(parse_bytes("--max-bytes", "1gb") == uint64_t{1} << 30);
  CHECK(parse_bytes("--max-bytes", "100B") == 100);
}

TEST_CASE("comm bench size errors name the option and the value", "[cpu][comm][bench]") {
  CHECK_THROWS_WITH(parse_bytes("--max-bytes", "12Q"),
                    PLX_CONTAINS("--max-bytes: '12Q' is not a size"));
  CHECK_THROWS_WITH(parse_bytes("--min-bytes", ""), PLX_CONTAINS("--min-bytes: '' is not a size"));
  CHECK_THROWS_WITH(parse_bytes("--min-bytes", "-8"), PLX_CONTAINS("--min-bytes: '-8'"));
  CHECK_THROWS_WITH(parse_bytes("--min-bytes", "1.5M"), PLX_CONTAINS("--min-bytes: '1.5M'"));
  CHECK_THROWS_WITH(parse_bytes("--min-bytes", "0"), PLX_CONTAINS("must be at least 1 byte"));
  CHECK_THROWS_WITH(parse_bytes("--max-bytes", "99999999999999999999"), PLX_CONTAINS("too large"));
  CHECK_THROWS_WITH(parse_bytes("--max-bytes", "17179869184G"), PLX_CONTAINS("too large"));
  CHECK_THROWS_AS(parse_bytes("--max-bytes", "x"), ConfigError);
}

TEST_CASE("comm bench sizes double from min to max", "[cpu][comm][bench]") {
  const auto s = bench_sizes(8, uint64_t{256} << 20, 2);
  REQUIRE(s.size() == 26);  // 2^3 .. 2^28
  CHECK(s.front() == 8);
  CHECK(s.back() == uint64_t{256} << 20);
  for (size_t i = 1; i < s.size(); ++i) CHECK(s[i] == 2 * s[i - 1]);
  CHECK(bench_sizes(8, 8, 2) == std::vector<uint64_t>{8});
  CHECK(bench_sizes(3, 100, 4) == std::vector<uint64_t>{3, 12, 48});
  // No overflow near the top of uint64.
  CHECK(bench_sizes(uint64_t{1} << 62, ~uint64_t{0}, 2).size() == 2);
  CHECK_THROWS_WITH(bench_sizes(1024, 8, 2),
                    PLX_CONTAINS("--min-bytes 1024 is larger than --max-bytes 8"));
  CHECK_THROWS_WITH(bench_sizes(8, 1024, 1), PLX_CONTAINS("--factor: must be at least 2, got 1"));
}

TEST_CASE("comm bench collectives and dtypes parse, unknown ones are named", "[cpu][comm][bench]") {
  CHECK(parse_collectives("--ops", "all").size() == 4);
  CHECK(parse_collectives("--ops", "all_gather,all_reduce") ==
        std::vector<plx_collective>{PLX_COLL_ALL_GATHER, PLX_COLL_ALL_REDUCE});
  CHECK(parse_collectives("--ops", "broadcast,broadcast") ==
        std::vector<plx_collective>{PLX_COLL_BROADCAST});
  CHECK_THROWS_WITH(parse_collectives("--ops", "all_reduce,alltoall"),
                    PLX_CONTAINS("--ops: unknown collective 'alltoall' in 'all_reduce,alltoall'"));
  CHECK_THROWS_WITH(parse_collectives("--ops", ""), PLX_CONTAINS("--ops: unknown collective ''"));
  CHECK(parse_dtype("--dtype", "bf16") == PLX_BF16);
  CHECK_THROWS_WITH(parse_dtype("--dtype", "f8"), PLX_CONTAINS("--dtype: 'f8' is not a dtype"));
}

TEST_CASE("comm bench bus bandwidth factors are nccl-tests' factors", "[cpu][comm][bench]") {
  CHECK(busbw_factor(PLX_COLL_ALL_REDUCE, 1) == 0);
  CHECK(busbw_factor(PLX_COLL_ALL_REDUCE, 2) == Approx(1.0));
  CHECK(busbw_factor(PLX_COLL_ALL_REDUCE, 4) == Approx(1.5));
  CHECK(busbw_factor(PLX_COLL_ALL_REDUCE, 8) == Approx(1.75));
  CHECK(busbw_factor(PLX_COLL_ALL_GATHER, 4) == Approx(0.75));
  CHECK(busbw_factor(PLX_COLL_REDUCE_SCATTER, 2) == Approx(0.5));
  CHECK(busbw_factor(PLX_COLL_BROADCAST, 4) == 1);
}

TEST_CASE("comm bench shapes count bytes as nccl-tests does", "[cpu][comm][bench]") {
  // all_reduce: count elements each way.
  BenchShape s = bench_shape(PLX_COLL_ALL_REDUCE, 1024, 4, 4);
  CHECK(s.count == 256);
  CHECK(s.bytes == 1024);
  // all_gather: bytes is the whole recv buffer, count each rank's block.
  s = bench_shape(PLX_COLL_ALL_GATHER, 1024, 4, 4);
  CHECK(s.count == 64);
  CHECK(s.send_elems == 64);
  CHECK(s.recv_elems == 256);
  CHECK(s.bytes == 1024);
  // reduce_scatter: bytes is the whole send buffer.
  s = bench_shape(PLX_COLL_REDUCE_SCATTER, 1000, 4, 3);
  CHECK(s.count == 83);
  CHECK(s.send_elems == 249);
  CHECK(s.recv_elems == 83);
  CHECK(s.bytes == 996);
  // Too small to give every rank an element: no row.
  CHECK(bench_shape(PLX_COLL_ALL_GATHER, 8, 4, 4).count == 0);
  CHECK(bench_shape(PLX_COLL_ALL_REDUCE, 2, 4, 1).count == 0);
}

TEST_CASE("comm bench iterations fill the target time within bounds", "[cpu][comm][bench]") {
  CHECK(choose_iters(1e-3, 0.02) == 20);
  CHECK(choose_iters(0.5, 0.02) == 5);        // slow calls: at least min_iters
  CHECK(choose_iters(1e-9, 0.02) == 100000);  // fast ones: at most max_iters
  CHECK(choose_iters(0.0, 0.02) == 100000);   // a zero estimate: as many as allowed
  CHECK(choose_iters(3e-6, 0.02, 5, 1000) == 1000);
  CHECK(choose_iters(1e-4, 0.02, 1, 1000) == 200);
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 2, 3}) == 2.5);
  CHECK(std::isnan(median({})));
}

TEST_CASE("comm bench options out of range are named", "[cpu][comm][bench]") {
  CommBenchOptions o;
  CHECK_NOTHROW(check_comm_bench_options(o));
  o.rounds = 0;
  CHECK_THROWS_WITH(check_comm_bench_options(o), PLX_CONTAINS("--rounds: must be >= 1, got 0"));
  o = CommBenchOptions{};
  o.iters = -1;
  CHECK_THROWS_WITH(check_comm_bench_options(o), PLX_CONTAINS("--iters: must be >= 0"));
  o = CommBenchOptions{};
  o.max_bytes = 2;
  o.min_bytes = 1;
  CHECK_THROWS_WITH(check_comm_bench_options(o),
                    PLX_CONTAINS("--max-bytes 2 is smaller than one f32 element"));
  o = CommBenchOptions{};
  o.backend = "vulkan";
  CHECK_THROWS_WITH(comm_bench_comm_name(o),
                    PLX_CONTAINS("--comm: no default communicator for backend 'vulkan'"));
  o.backend = "cuda";
  CHECK(comm_bench_comm_name(o) == "nccl");
  o.comm = "mpi";
  CHECK(comm_bench_comm_name(o) == "mpi");
}

TEST_CASE("comm bench names a communicator that is not there and what was found",
          "[cpu][comm][bench]") {
  CommBenchOptions o;
  o.comm = "no-such-comm";
  CHECK_THROWS_WITH(run_comm_bench(runtime(), o, nullptr),
                    PLX_CONTAINS("communicator 'no-such-comm' is not available") &&
                        PLX_CONTAINS("communicators: threads") &&
                        PLX_CONTAINS("plugins loaded: cpu"));
}

namespace {
bool g_native_called = false;
plx_status fake_native(plx_comm_handle, int32_t, uint64_t, int32_t, int32_t, void*, void*,
                       plx_stream, double* seconds) {
  g_native_called = true;
  *seconds = 1;
  return PLX_OK;
}
}  // namespace

// The core reads bench_native only from a table that reaches it (ABI 1.1) and holds one: the
// threads communicator (no underlying library) has none, and an ABI 1.0 table, whose memory
// ends before the slot, is never read there.
TEST_CASE("bench_native is read only from tables of ABI 1.1 that hold it", "[cpu][comm][bench]") {
  Communicator& threads = runtime().communicator("threads");
  auto g = threads.join(cpu(), 0, 0, 1, threads.unique_id());
  CHECK_FALSE(g->has_bench_native());
  const Tensor t = Tensor::zeros(cpu(), {4}, PLX_F32);
  CHECK_FALSE(g->bench_native(PLX_COLL_ALL_REDUCE, t, t, 1).has_value());

  // The same table, as a plugin of ABI 1.0 would give it (160 bytes), with a slot past its end
  // that must not be called; then as 1.1 with the slot.
  plx_comm table = threads.table();
  table.struct_size = PLX_COMM_SIZE_1_0;
  table.bench_native = fake_native;
  const Communicator old(threads.plugin(), &table);
  auto g_old = old.join(cpu(), 0, 0, 1, old.unique_id());
  g_native_called = false;
  CHECK_FALSE(g_old->bench_native(PLX_COLL_ALL_REDUCE, t, t, 1).has_value());
  CHECK_FALSE(g_native_called);

  plx_comm table11 = threads.table();
  table11.bench_native = fake_native;
  const Communicator now(threads.plugin(), &table11);
  auto g_now = now.join(cpu(), 0, 0, 1, now.unique_id());
  const auto s = g_now->bench_native(PLX_COLL_ALL_REDUCE, t, t, 1);
  CHECK(g_native_called);
  REQUIRE(s.has_value());
  CHECK(*s == 1);
  // Shapes are checked before the plugin is called.
  const Tensor small = Tensor::zeros(cpu(), {3}, PLX_F32);
  CHECK_THROWS_WITH(g_now->bench_native(PLX_COLL_ALL_REDUCE, small, t, 1),
                    PLX_CONTAINS("all_reduce: send has 3 elements, expected 4"));
  CHECK_THROWS_WITH(g_now->bench_native(PLX_COLL_ALL_REDUCE, t, t, 0),
                    PLX_CONTAINS("iters must be >= 1"));
}
