// The CUDA plugin's own Tensor Core GEMM (plugins/cuda/ops/mma_gemm.cu), candidate by candidate.
//
// The ordinary comparison (test_cuda_ops.cpp) only ever runs the first kernel that accepts a
// node, which is cuBLASLt's. Here every "mma_sync_*" candidate of matmul and linear is created
// explicitly, as the autotuner will create it, and run against the CPU reference on shapes with
// ragged edges (M, N, K not multiples of any tile), every operand layout (trans_a, trans_b),
// alpha, batches (folded, strided, shared operands), the bias, K = 0, empty outputs, and
// operands or outputs that are not 16-byte aligned (the SIMT fallback and the unpaired stores).
// Outputs sit in a poisoned buffer with guard bytes, so an unwritten element or a stray write
// fails; a second run must give the same bytes (the kernels claim determinism). f32 runs with
// TF32 on (and every candidate must decline it with TF32 off). Shapes a candidate must decline
// (rows that are not 16-byte multiples, batch dims that broadcast partially) are checked to be
// declined with a reason, never run.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/gemm_candidate.hpp"
#include "plexus/attrs.hpp"
#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::gemm_candidate;

namespace {

// `emulated`: the CUDA emulator runs every mma on the CPU, so the large shapes are smaller there.
std::vector<GemmCase> gemm_cases(bool emulated) {
  std::vector<GemmCase> v;
  auto lin = [&](Shape x, int64_t out, bool bias) {
    return add_linear(v, std::move(x), out, bias);
  };
  auto mm = [&](Shape a, Shape b, int64_t ta, int64_t tb, double alpha = 1) {
    return add_matmul(v, std::move(a), std::move(b), ta, tb, alpha);
  };
  // Our models' layers (convnet / mlp at batch 128 and 1024).
  lin({128, 784}, 128, true);
  lin({128, 784}, 256, true);
  lin({emulated ? 128 : 1024, 3136}, 256, true);
  lin({128, 256}, 10, true);
  // Ragged everything: M, N and K past tile multiples, N = 10 (odd pairs at the edge).
  lin({130, 200}, 300, true);
  lin({100, 72}, 10, true);
  lin({3, 37, 40}, 33, false);
  lin({16}, 5, true);  // a 1-D x: one row
  lin({1, 8}, 1, false);
  lin({64, 0}, 8, true);   // K = 0: y is the bias
  lin({64, 0}, 8, false);  // ... or zeros
  lin({0, 16}, 8, true);   // no rows
  // Misaligned: x one element into its buffer (SIMT fallback), y one element in (single stores).
  lin({100, 72}, 10, true)->in_offset = 1;
  lin({130, 200}, 300, true)->out_offset = 1;
  lin({45, 64}, 48, true)->out_offset = 1;
  // One output tile over a long K: split-K cuts it into 4 splits (on the emulator's 4 SMs and
  // on an H100 alike), the last one a partial K tile. With 2 splits a counter left at 1 by the
  // last block goes unseen (both blocks sum, the later one with every partial written); with 3
  // or more the early "last" block reads a poisoned partial.
  lin({24, 456}, 20, true);
  // Declined: rows of 10 elements are not 16-byte multiples.
  lin({4, 10}, 3, true)->decline = true;

  // matmul, every layout, ragged.
  mm({96, 80}, {80, 136}, 0, 0);
  mm({80, 96}, {80, 136}, 1, 0);
  mm({96, 80}, {136, 80}, 0, 1);
  mm({80, 96}, {136, 80}, 1, 1);
  mm({33, 24}, {24, 40}, 0, 0, 0.5);
  mm({200, 264}, {264, 72}, 0, 0, -2);
  mm({8, 136}, {8, 200}, 1, 0);  // K = 8, a quarter of one K tile
  mm({10, 16}, {10, 24}, 1, 0);  // K = 10 is no operand's contiguous dimension here
  mm({3, 0}, {0, 8}, 0, 0);      // K = 0: zeros
  mm({0, 8}, {8, 16}, 0, 0);
  // The square shapes of the large tile.
  const int64_t sq = emulated ? 256 : 1024;
  mm({sq, sq}, {sq, sq}, 0, 0);
  mm({sq, sq}, {sq, sq}, 0, 1);
  // Batches: folded into rows, strided (both full), a shared, b shared with trans_a.
  mm({3, 40, 48}, {48, 72}, 0, 0);
  mm({2, 3, 40, 48}, {2, 3, 48, 72}, 0, 0);
  mm({2, 3, 40, 48}, {2, 3, 72, 48}, 0, 1, 0.25);
  mm({40, 48}, {3, 48, 72}, 0, 0);
  mm({3, 48, 40}, {48, 72}, 1, 0);
  mm({2, 48, 40}, {2, 72, 48}, 1, 1);
  mm({3, 40, 48}, {1, 48, 72}, 0, 0);
  mm({2, 20, 520}, {2, 520, 24}, 0, 0);  // split-K per batch entry: 3 splits of 3 K tiles
  // Misaligned a (fallback), misaligned y.
  mm({96, 80}, {80, 136}, 0, 0)->in_offset = 1;
  mm({80, 96}, {136, 80}, 1, 1)->in_offset = 1;
  mm({2, 3, 40, 48}, {2, 3, 48, 72}, 0, 0)->in_offset = 1;
  mm({96, 80}, {80, 136}, 0, 0)->out_offset = 1;
  // Declined: batch dims that broadcast partially; rows that are not 16-byte multiples.
  {
    GemmCase* c = mm({2, 1, 16, 16}, {1, 3, 16, 16}, 0, 0);
    c->decline = c->simt_decline = true;
  }
  mm({7, 9}, {9, 5}, 0, 0)->decline = true;
  mm({16, 24}, {24, 10}, 0, 0)->decline = true;
  return v;
}

const plx_kernel* simt_kernel(Backend& gpu, const OpSchema& s, plx_dtype d) {
  for (const plx_kernel* k : gpu.kernels(s.id, d))
    if (k->impl && std::string(k->impl) == "simt_16x16") return k;
  return nullptr;
}

bool is_mma(const plx_kernel* k) {
  return k->impl && std::string(k->impl).rfind("mma_sync_", 0) == 0;
}

}  // namespace

TEST_CASE("every cuda tensor core gemm candidate matches the cpu", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_guard(gpu);
  const std::vector<GemmCase> cases = gemm_cases(cuda::emulated(gpu));
  int64_t runs = 0, declines = 0, split_runs = 0;
  for (plx_dtype d : {PLX_BF16, PLX_F16, PLX_F32}) {
    for (const GemmCase& c : cases) {
      const OpSchema& s = gpu.runtime().ops().get(c.op);
      std::vector<const plx_kernel*> mine;
      for (const plx_kernel* k : gpu.kernels(s.id, d))
        if (is_mma(k)) mine.push_back(k);
      // One candidate per tile and the split-K one, native (not PLX_KERNEL_LIBRARY),
      // deterministic and capturable.
      REQUIRE(mine.size() == 4);
      for (const plx_kernel* k : mine) {
        CHECK_FALSE(k->flags & PLX_KERNEL_LIBRARY);
        CHECK(k->flags & PLX_KERNEL_DETERMINISTIC);
        CHECK(k->flags & PLX_KERNEL_CAPTURABLE);
      }

      cmp::Gen g(d, 20261123 + static_cast<uint64_t>(runs));
      std::vector<Tensor> in = {g.uniform(c.a), g.uniform(c.b)};
      if (c.op == "linear") in.push_back(c.bias ? g.uniform({c.b[0]}) : Tensor());
      const Tensor want = c.decline ? Tensor() : call(cpu(), c.op, in, c.attrs()).at(0);

      for (const plx_kernel* k : mine) {
        // f32 without TF32: every candidate declines. With TF32 on, as 16-bit.
        for (bool tf32 : d == PLX_F32 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
          cuda::set_tf32(gpu, tf32);
          const std::string label =
              c.what() + " [" + dtype_name(d) + ", " + k->impl + (tf32 ? ", tf32" : "") + "]";
          INFO(label);
          if (c.decline) {
            const Outcome o = run_candidate(gpu, k, c, in, want, tf32, is_split(k));
            INFO(o.failure);
            CHECK(o.declined);
            CHECK_FALSE(o.reason.empty());
            ++declines;
            continue;
          }
          const Outcome o = run_candidate(gpu, k, c, in, want, tf32, is_split(k));
          if (d == PLX_F32 && !tf32) {
            CHECK(o.declined);
            CHECK(o.reason.find("tf32") != std::string::npos);
            ++declines;
            continue;
          }
          INFO("declined: " << o.reason);
          if (is_split(k) && o.declined) {
            // Split-K declines the shapes whose tiles fill the device, or that have too few
            // K tiles to split.
            CHECK(is_split_decline(o.reason));
            ++declines;
            continue;
          }
          CHECK_FALSE(o.declined);
          CHECK(o.failure == "");
          ++runs;
          if (is_split(k)) ++split_runs;
        }
        cuda::set_tf32(gpu, false);
      }
    }
  }
  // The model shapes (128 rows) leave a GPU idle with 32 x 32 tiles: split-K must have run.
  CHECK(split_runs > 0);
  WARN(runs << " candidate runs (" << split_runs << " split-K), " << declines
            << " expected declines");
}

// The SIMT candidate ("simt_16x16", the native side's kernel where every tile declines) takes
// every case, the Tensor Cores' declines included (rows that are not 16-byte multiples, such as
// the weight gradient of a 10-class classifier: dlogitsᵀ x, M = 10 with rows of 10 elements),
// in every dtype, f32 in full f32 with TF32 off (against f32's own tolerance); only batch dims
// that broadcast partially are declined, as by every candidate. Registered last among the
// native kernels of matmul and linear.
TEST_CASE("the cuda simt gemm candidate takes every gemm the tiles decline and matches the cpu",
          "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_guard(gpu);
  std::vector<GemmCase> cases = gemm_cases(cuda::emulated(gpu));
  // The classifier's weight gradient as the step graph writes it: dlogits (N, 10) transposed
  // times the features (N, 256).
  add_matmul(cases, {128, 10}, {128, 256}, 1, 0);
  int64_t runs = 0, tile_declined = 0;
  for (plx_dtype d : {PLX_BF16, PLX_F16, PLX_F32}) {
    for (const GemmCase& c : cases) {
      const OpSchema& s = gpu.runtime().ops().get(c.op);
      const plx_kernel* k = simt_kernel(gpu, s, d);
      REQUIRE(k != nullptr);
      CHECK_FALSE(k->flags & PLX_KERNEL_LIBRARY);
      CHECK(k->flags & PLX_KERNEL_DETERMINISTIC);
      CHECK(k->flags & PLX_KERNEL_CAPTURABLE);
      const auto all = gpu.kernels(s.id, d);
      CHECK(all.back() == k);
      const std::string label = c.what() + " [" + dtype_name(d) + "]";
      INFO(label);
      cmp::Gen g(d, 20261125 + static_cast<uint64_t>(runs));
      std::vector<Tensor> in = {g.uniform(c.a), g.uniform(c.b)};
      if (c.op == "linear") in.push_back(c.bias ? g.uniform({c.b[0]}) : Tensor());
      const Tensor want = c.simt_decline ? Tensor() : call(cpu(), c.op, in, c.attrs()).at(0);
      const Outcome o = run_candidate(gpu, k, c, in, want, false, false);
      if (c.simt_decline) {
        CHECK(o.declined);
        CHECK_THAT(o.reason, PLX_CONTAINS("broadcast"));
        continue;
      }
      INFO("declined: " << o.reason);
      CHECK_FALSE(o.declined);
      CHECK(o.failure == "");
      ++runs;
      if (c.decline || d == PLX_F32) ++tile_declined;
    }
  }
  CHECK(tile_declined > 0);
  WARN(runs << " simt runs, " << tile_declined << " of them on what every tile declines");
}
