// The CUDA plugin's Hopper GEMM (plugins/cuda/ops/wgmma_gemm.cu, sm_90a), candidate by candidate.
//
// The ordinary comparison (test_cuda_ops.cpp) only ever runs the first kernel that accepts a
// node, which is cuBLASLt's. Here every "wgmma_*" candidate of matmul and linear (bf16, f16) is
// created explicitly, as the autotuner will create it, and run against the CPU reference: the
// square 1024 shapes in every operand layout (trans_a, trans_b), ragged shapes (M, N, K not
// multiples of any tile: 1000 x 1000 x 1000, boxes wholly past the edge, K shorter than one
// tile), our models' skinny layers (128 x 784 -> 256, ...), alpha, the bias, batches (folded,
// strided, shared operands), empty outputs, and operands or outputs that are not 16-byte aligned
// (the SIMT fallback and the unpaired stores), and one-tile outputs over a long K, which the
// split-K candidate takes (its other declines are checked to say why). Outputs sit in a poisoned
// buffer with guard bytes, and split-K's workspace is poisoned before each run, so an unwritten
// element, a stray write or a partial read before it is written fails; a second run must give
// the same bytes (the kernels claim determinism). Shapes a candidate must decline (K = 0, rows
// that are not 16-byte multiples, batch dims that broadcast partially) are checked to be declined
// with a reason.
//
// Skipped without a GPU, on a GPU that is not compute capability 9.0 (the candidates decline it:
// sm_90a code runs nowhere else) and when the plugin was built without sm_90 (no candidates). On
// the CUDA emulator (an H100 to the plugin) the kernels run on its model of wgmma, TMA and the
// mbarriers (tests/cuda/emu/include/plx_emu_wgmma.hpp), with the large shapes made smaller.
#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/gemm_candidate.hpp"
#include "cuda/pinned_kernel.hpp"
#include "plexus/attrs.hpp"
#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::gemm_candidate;

namespace {

// `emulated`: the CUDA emulator runs every wgmma on the CPU, so the large shapes are smaller
// there (still more K tiles than either tile's stages, so the rings wrap).
std::vector<GemmCase> wg_cases(bool emulated) {
  std::vector<GemmCase> v;
  auto lin = [&](Shape x, int64_t out, bool bias) {
    return add_linear(v, std::move(x), out, bias);
  };
  auto mm = [&](Shape a, Shape b, int64_t ta, int64_t tb, double alpha = 1) {
    return add_matmul(v, std::move(a), std::move(b), ta, tb, alpha);
  };
  // Square 1024 (the emulator: 256 x 640 x 256), every layout: 16 (10) K tiles, more than either
  // tile's stages (the ring wraps).
  const int64_t sq = emulated ? 256 : 1024, sk = emulated ? 640 : 1024;
  mm({sq, sk}, {sk, sq}, 0, 0);
  mm({sk, sq}, {sk, sq}, 1, 0);
  mm({sq, sk}, {sq, sk}, 0, 1);
  mm({sk, sq}, {sq, sk}, 1, 1);
  // Ragged squares: 1000 (328) is no multiple of 64, 128 or 256 (and keeps rows 16-byte multiples).
  const int64_t rg = emulated ? 328 : 1000;
  mm({rg, rg}, {rg, rg}, 0, 0);
  mm({rg, rg}, {rg, rg}, 1, 1);
  lin({rg, rg}, rg, true);
  // Our models' layers (convnet / mlp at batch 128 and 1024): skinny, long K.
  lin({128, 784}, 128, true);
  lin({128, 784}, 256, true);
  lin({emulated ? 128 : 1024, 3136}, 256, true);
  lin({128, 256}, 10, true);
  lin({emulated ? 128 : 1024, 784}, 512, false);
  // Ragged everything: M, N and K past tile multiples, N = 10 and 300 (odd pairs at the edge).
  lin({130, 200}, 300, true);
  lin({100, 72}, 10, true);
  lin({3, 37, 40}, 33, false);
  lin({16}, 5, true);  // a 1-D x: one row
  lin({1, 8}, 1, false);
  lin({0, 16}, 8, true);  // no rows: nothing to launch
  // Misaligned: x one element into its buffer (SIMT fallback), y one element in (single stores).
  lin({100, 72}, 10, true)->in_offset = 1;
  lin({130, 200}, 300, true)->out_offset = 1;
  lin({45, 64}, 48, true)->out_offset = 1;
  // x 8 elements (16 bytes) in: the TMA path with a global address 16-byte aligned, as the driver
  // API asks, but not 128-byte aligned (the programming guide's swizzle table lists 128).
  lin({100, 72}, 40, true)->in_offset = 8;
  // Split-K (the "_splitk" candidate), one output tile over a long K: 4 splits on the emulator's
  // 4 SMs, 8 on 37 and on an H100 (both of split_sum's levels, an uneven last group on 37 SMs);
  // odd N (unpaired partials), the last split a partial K tile (K = 1032 is 16 tiles and 8).
  lin({24, 2048}, 20, true);
  lin({24, 1032}, 33, true);
  // Declined: K = 0 (nothing for the Tensor Cores), rows of 10 elements (not 16-byte multiples).
  lin({64, 0}, 8, true)->decline = true;
  lin({4, 10}, 3, true)->decline = true;

  // matmul, every layout, ragged.
  mm({96, 80}, {80, 136}, 0, 0);
  mm({80, 96}, {80, 136}, 1, 0);
  mm({96, 80}, {136, 80}, 0, 1);
  mm({80, 96}, {136, 80}, 1, 1);
  mm({33, 24}, {24, 40}, 0, 0, 0.5);
  mm({200, 264}, {264, 72}, 0, 0, -2);
  // K = 8, an eighth of one K tile; trans_a with M = 136: the second 64-wide A box of the second
  // M tile lies wholly past the edge (TMA fills it with zeros).
  mm({8, 136}, {8, 200}, 1, 0);
  mm({8, 136}, {200, 8}, 1, 1);
  mm({10, 16}, {10, 24}, 1, 0);  // K = 10 is no operand's contiguous dimension here
  mm({0, 8}, {8, 16}, 0, 0);     // no rows
  // Batches: folded into rows, strided (both full), a shared, b shared with trans_a.
  mm({3, 40, 48}, {48, 72}, 0, 0);
  mm({2, 3, 40, 48}, {2, 3, 48, 72}, 0, 0);
  mm({2, 3, 40, 48}, {2, 3, 72, 48}, 0, 1, 0.25);
  mm({40, 48}, {3, 48, 72}, 0, 0);
  mm({3, 48, 40}, {48, 72}, 1, 0);
  mm({2, 48, 40}, {2, 72, 48}, 1, 1);
  mm({3, 40, 48}, {1, 48, 72}, 0, 0);
  mm({4, 200, 264}, {4, 264, 136}, 0, 0);  // batched, several tiles each
  // More output tiles than SMs (the emulator's 4, an H100's 132), so that each block of the
  // persistent tiles walks several, across batch entries, with 7 K tiles, more than either
  // ring's stages and a multiple of neither: the ring's stage and phase carry over from tile to
  // tile, and the ping-pong tile's warp groups take turns on tiles whose stages wrap the ring.
  if (emulated)
    mm({6, 136, 400}, {6, 400, 264}, 0, 0);
  else
    mm({12, 520, 400}, {12, 400, 520}, 0, 0);
  // Split-K per batch entry, M-major a, alpha: 17 K tiles in 2 splits on 4 SMs, 4 on an H100.
  mm({2, 1088, 40}, {2, 1088, 24}, 1, 0, -0.5);
  // Misaligned a (fallback), misaligned y.
  mm({96, 80}, {80, 136}, 0, 0)->in_offset = 1;
  mm({80, 96}, {136, 80}, 1, 1)->in_offset = 1;
  mm({2, 3, 40, 48}, {2, 3, 48, 72}, 0, 0)->in_offset = 1;
  mm({96, 80}, {80, 136}, 0, 0)->out_offset = 1;
  // Declined: batch dims that broadcast partially; rows that are not 16-byte multiples; K = 0.
  mm({2, 1, 16, 16}, {1, 3, 16, 16}, 0, 0)->decline = true;
  mm({7, 9}, {9, 5}, 0, 0)->decline = true;
  mm({16, 24}, {24, 10}, 0, 0)->decline = true;
  mm({3, 0}, {0, 8}, 0, 0)->decline = true;
  return v;
}

bool is_wgmma(const plx_kernel* k) {
  return k->impl && std::string(k->impl).rfind("wgmma_", 0) == 0;
}

// Whether `op` has wgmma candidates in bf16 (none when the plugin was built without sm_90).
bool has_wgmma(Backend& b, const char* op) {
  const OpSchema& s = b.runtime().ops().get(op);
  for (const plx_kernel* k : b.kernels(s.id, PLX_BF16))
    if (is_wgmma(k)) return true;
  return false;
}

// The reason the candidates give on a device that is not compute capability 9.0.
bool is_device_decline(const std::string& reason) {
  return reason.find("compute capability 9.0") != std::string::npos;
}

}  // namespace

TEST_CASE("every cuda wgmma gemm candidate matches the cpu", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  const std::vector<GemmCase> cases = wg_cases(cuda::emulated(gpu));
  {
    // Built without sm_90 in the architectures: no candidates at all.
    if (!has_wgmma(gpu, "matmul"))
      PLX_SKIP("the CUDA plugin was built without sm_90 (no wgmma candidates)");
    // No f32 (TF32) wgmma candidates exist.
    const OpSchema& s = gpu.runtime().ops().get("matmul");
    for (const plx_kernel* k : gpu.kernels(s.id, PLX_F32)) CHECK_FALSE(is_wgmma(k));
  }
  int64_t runs = 0, declines = 0, split_runs = 0;
  for (plx_dtype d : {PLX_BF16, PLX_F16}) {
    for (const GemmCase& c : cases) {
      const OpSchema& s = gpu.runtime().ops().get(c.op);
      std::vector<const plx_kernel*> mine;
      for (const plx_kernel* k : gpu.kernels(s.id, d))
        if (is_wgmma(k)) mine.push_back(k);
      // One candidate per tile, the split-K one, the two persistent ones, the clustered one and
      // the two ping-pong ones (alone and in clusters), native (not PLX_KERNEL_LIBRARY),
      // deterministic and capturable, registered after cuBLASLt's (the first accepting kernel
      // wins without the tuner).
      REQUIRE(mine.size() == 8);
      for (const plx_kernel* k : mine) {
        CHECK_FALSE(k->flags & PLX_KERNEL_LIBRARY);
        CHECK(k->flags & PLX_KERNEL_DETERMINISTIC);
        CHECK(k->flags & PLX_KERNEL_CAPTURABLE);
      }
      CHECK_FALSE(is_wgmma(gpu.kernels(s.id, d).front()));

      cmp::Gen g(d, 20261123 + static_cast<uint64_t>(runs + declines));
      std::vector<Tensor> in = {g.uniform(c.a), g.uniform(c.b)};
      if (c.op == "linear") in.push_back(c.bias ? g.uniform({c.b[0]}) : Tensor());
      const Tensor want = c.decline ? Tensor() : call(cpu(), c.op, in, c.attrs()).at(0);

      for (const plx_kernel* k : mine) {
        const std::string label = c.what() + " [" + dtype_name(d) + ", " + k->impl + "]";
        INFO(label);
        const Outcome o = run_candidate(gpu, k, c, in, want, /*tf32=*/false, is_split(k));
        if (o.declined && is_device_decline(o.reason))
          PLX_SKIP(("the wgmma candidates decline this GPU: " + o.reason).c_str());
        if (c.decline) {
          INFO(o.failure);
          CHECK(o.declined);
          CHECK_FALSE(o.reason.empty());
          ++declines;
          continue;
        }
        INFO("declined: " << o.reason);
        if (is_split(k) && o.declined) {
          // Split-K declines the shapes whose tiles fill the device, or that have too few K
          // tiles to split.
          CHECK(is_split_decline(o.reason));
          ++declines;
          continue;
        }
        CHECK_FALSE(o.declined);
        CHECK(o.failure == "");
        ++runs;
        if (is_split(k)) ++split_runs;
      }
    }
  }
  // The model layers and the long-K cases leave the device's SMs idle: split-K must have run.
  CHECK(split_runs > 0);
  WARN(runs << " candidate runs (" << split_runs << " split-K), " << declines
            << " expected declines");
}

// A linear -> relu group whose linear node the host gave to a wgmma candidate (the tuner's
// choice, here pinned through the tuning cache) runs as that kernel with the ReLU in its
// epilogue (ops/fusion.cpp, make_act_pair), writing the relu's output directly; it
// matches the same graph on the CPU.
TEST_CASE("a linear -> relu group given to a wgmma candidate runs with the relu in its epilogue",
          "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  if (!has_wgmma(probe, "linear"))
    PLX_SKIP("the CUDA plugin was built without sm_90 (no wgmma candidates)");
  const int64_t rows = 130, in = 264, out = 72;  // ragged: two M tiles, one partial N tile
  auto build = [&](Graph& g) {
    const Var x = g.input("x", {PLX_BF16, {rows, in}});
    const Var w = g.parameter("fc.weight", {PLX_BF16, {out, in}}, init::uniform(-0.2, 0.2));
    const Var b = g.parameter("fc.bias", {PLX_BF16, {out}}, init::uniform(-0.5, 0.5));
    g.mark_output(g.add1("relu", {g.add1("linear", {x, w, b}, {}, "fc")}, {}, "fc.relu"), "y");
  };
  PinnedKernelRun pinned("wgmma-fusion", build, "fc",
                         random_doubles(static_cast<size_t>(rows * in), 7, -1, 1), 3);
  REQUIRE_FALSE(pinned.key().empty());
  for (const std::string tile :
       {"wgmma_128x128x64", "wgmma_128x256x64", "wgmma_128x128x64_persistent",
        "wgmma_128x256x64_persistent", "wgmma_128x256x64_cluster2", "wgmma_128x128x64_pingpong",
        "wgmma_128x128x64_pingpong_cluster2"}) {
    INFO(tile);
    const PinnedKernelRun::Result r = pinned.run(tile);
    // A GPU that is not compute capability 9.0 declines the candidate (the tuner keeps another).
    if (!cuda::runs_sm90a(probe) && r.report.impl != tile)
      PLX_SKIP("this GPU is not compute capability 9.0: the wgmma candidates decline it");
    CHECK(r.report.impl == tile);
    bool fused = false;
    for (const std::string& n : r.kernels)
      fused = fused || n.find("linear+relu:" + tile + "-epilogue") != std::string::npos;
    INFO("kernels: " << r.kernels.size()
                     << ", first: " << (r.kernels.empty() ? "" : r.kernels.front()));
    CHECK(fused);
    CHECK(r.kernels.size() == 1);
    // One rounding of the f32 sum to bf16 on each side, in different orders: a few bf16 ulps.
    CHECK_ALLCLOSE(r.got, r.want, (Tol{2e-2, 2e-2}));
  }
}
