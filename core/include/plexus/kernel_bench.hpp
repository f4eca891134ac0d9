// `plexus bench kernels`: every candidate kernel of a backend timed on the problems that matter,
// the nodes of a config's training step and given GEMM shapes, side by side: our kernels against
// the vendor libraries' (cuBLAS, cuDNN, OpenBLAS), with each one's time, GFLOP/s and ratio to the
// fastest library kernel. The numbers the tuner (plexus/tune.hpp) chooses by, shown whole.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "plexus/tune.hpp"

namespace plexus {

class Config;
class Runtime;

struct KernelBenchOptions {
  std::string backend;      // "": the config's backend.name
  int32_t device = -1;      // -1: the config's backend.device
  bool step = true;         // the nodes of the config's training step
  bool all = false;         // also nodes with a single kernel
  std::vector<std::array<int64_t, 3>> gemm;  // linear problems (M, N, K): x (M, K), w (N, K), b (N)
  plx_dtype gemm_dtype = PLX_DTYPE_NONE;      // NONE: the config's compute dtype (train.precision)
  double budget_ms = 50;    // timing per candidate
};

// "4096", "128x256x784" (M x N x K) -> shapes; throws ConfigError naming `option`.
std::vector<std::array<int64_t, 3>> parse_gemm_shapes(const std::string& list,
                                                      const std::string& option = "--gemm");

struct KernelBenchRow {
  std::string where;    // the node's name(s), or "gemm"
  std::string op;
  std::string problem;  // dtypes and shapes
  double gflop = 0;     // work of one run (0: not a GEMM or convolution)
  std::vector<CandidateTime> kernels;  // the backend's order
};

struct KernelBenchReport {
  std::string backend, device;
  std::vector<KernelBenchRow> rows;
};

KernelBenchReport run_kernel_bench(Runtime& rt, const Config& cfg, const KernelBenchOptions& o,
                                   std::ostream* out);
std::string kernel_bench_json(const KernelBenchReport& r);

}  // namespace plexus
