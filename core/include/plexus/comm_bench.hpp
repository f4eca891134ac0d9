// `plexus bench comm`: per collective and message size, the time, algorithm bandwidth and bus
// bandwidth as nccl-tests computes them, and our layer's overhead against the same collective
// called directly on the plugin's library (plx_comm.bench_native). docs/comm.md, "Benchmarking
// communicators", describes the output.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/abi/comm.h"

namespace plexus {

class CommGroup;
class Runtime;

struct CommBenchOptions {
  std::string comm;  // "": "mpi" for backend cpu, "nccl" for cuda
  std::string backend = "cpu";
  std::string bootstrap = "mpi";  // carries the id of a communicator without a launcher (NCCL)
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t{256} << 20;
  uint64_t factor = 2;           // each size is the previous times this
  int32_t iters = 0;             // calls per timed run; 0: chosen per size (choose_iters)
  int32_t warmup = 5;            // untimed calls before a size's timed runs
  int32_t rounds = 5;            // timed runs of ours and of native, interleaved; medians kept
  double target_seconds = 0.02;  // what a timed run should last when iters is 0
  std::vector<plx_collective> collectives = {PLX_COLL_ALL_REDUCE, PLX_COLL_BROADCAST,
                                             PLX_COLL_ALL_GATHER, PLX_COLL_REDUCE_SCATTER};
  plx_dtype dtype = PLX_F32;
  int32_t timeout_ms = 0;  // the group's timeout; 0: the plugin's default
};

// ---- the pure parts (tests/core/test_comm_bench.cpp) ----

// Parsers of option values; each throws ConfigError naming `option` and the value.
// A size in bytes: digits with an optional K, M or G (powers of 1024, as nccl-tests reads
// them), optionally followed by "iB" or "B", any case: "8", "64K", "256M", "1GiB".
uint64_t parse_bytes(std::string_view option, std::string_view text);
// "all" or a comma-separated list of all_reduce, broadcast, all_gather, reduce_scatter.
std::vector<plx_collective> parse_collectives(std::string_view option, std::string_view text);
// A dtype name: f32, f16, bf16, f64, i32, i64, u8.
plx_dtype parse_dtype(std::string_view option, std::string_view text);

// The nominal sizes: min, min * factor, ... up to max. Throws ConfigError when min > max, min
// is 0 or factor < 2.
std::vector<uint64_t> bench_sizes(uint64_t min_bytes, uint64_t max_bytes, uint64_t factor);

// What one row moves, with nccl-tests' meaning of "bytes": the whole buffer (recv of
// all_gather, send of reduce_scatter), so count is per rank's block there.
struct BenchShape {
  uint64_t count = 0;       // the count argument of the call; 0: the size is too small
  uint64_t bytes = 0;       // the size the bandwidths are computed from
  uint64_t send_elems = 0;  // elements of the send and recv buffers
  uint64_t recv_elems = 0;
};
BenchShape bench_shape(plx_collective c, uint64_t nominal_bytes, uint64_t elem_size, int32_t ranks);

// busbw = algbw * factor (nccl-tests' PERFORMANCE.md): all_reduce 2(n-1)/n, all_gather and
// reduce_scatter (n-1)/n, broadcast 1.
double busbw_factor(plx_collective c, int32_t ranks);

// Calls per timed run so that it lasts about `target_seconds` given one call's estimate, at
// least `min_iters`, at most `max_iters`.
int32_t choose_iters(double seconds_per_call, double target_seconds, int32_t min_iters = 5,
                     int32_t max_iters = 100000);

// The median of `v` (mean of the middle two for an even count); NaN when empty.
double median(std::vector<double> v);

// ---- the benchmark ----

struct CommBenchRow {
  plx_collective collective = PLX_COLL_ALL_REDUCE;
  uint64_t bytes = 0, count = 0;
  plx_dtype dtype = PLX_F32;
  int32_t iters = 0;
  double time_us = 0;    // median over rounds of the slowest rank's time per call
  double algbw_gbs = 0;  // bytes / time, 1e9 bytes per GB
  double busbw_gbs = 0;
  std::optional<double> native_us;     // the same for the native calls
  std::optional<double> overhead_pct;  // median over rounds of (ours - native) / native * 100
  std::vector<double> ours_rounds_us, native_rounds_us;  // the slowest rank's, per round
  uint64_t wrong = 0;  // wrong elements the checks saw (the most on any one rank)
};

struct CommBenchReport {
  std::string comm, backend;
  int32_t rank = 0;  // this process's
  int32_t ranks = 0;
  plx_dtype dtype = PLX_F32;
  bool has_native = false;
  CommBenchOptions options;
  std::vector<CommBenchRow> rows;
  // The largest overhead over the rows of at least 1 MiB, and its row; none without such rows
  // or a native baseline.
  std::optional<double> max_overhead_pct_1mib;
  int64_t max_overhead_row = -1;
  uint64_t wrong = 0;  // elements found wrong by the checks (a benchmark that moved garbage)
};

// Throws ConfigError naming the option when one is out of range (sizes, iters, warmup, rounds,
// collectives).
void check_comm_bench_options(const CommBenchOptions& o);

// The communicator the options name, or the backend's default (ConfigError when it has none).
std::string comm_bench_comm_name(const CommBenchOptions& o);

// Runs the benchmark as one rank of the launch (every process calls it). A communicator or
// backend that is not there is a PluginError naming it, the communicators and plugins found and
// the plugins skipped. Rank 0 writes the
// table to `out` as rows complete (others write nothing). Before each size is timed, one call of
// ours and one native are checked against the expected values; wrong results are counted and
// reported, not fatal.
CommBenchReport run_comm_bench(Runtime& rt, const CommBenchOptions& o, std::ostream* out);

// Pieces of the text report.
std::string comm_bench_header(const CommBenchReport& r);
std::string comm_bench_row_line(const CommBenchRow& row);
std::string comm_bench_summary(const CommBenchReport& r);
// The report as one JSON object (options, rows, summary).
std::string comm_bench_json(const CommBenchReport& r);

}  // namespace plexus
