// The GEMM a matmul or linear node asks of our own Tensor Core kernels (mma_gemm.cu for sm_80,
// wgmma_gemm.cu for sm_90a): one parser of the node for both, with the same declines.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common.hpp"

namespace plexus::cuda {

struct GemmProblem {
  bool a_kmajor = true;  // A stored (M, K) row-major; else (K, M)
  bool b_kmajor = true;  // B stored (N, K) row-major; else (K, N)
  int64_t M = 0, N = 0, K = 0, batch = 1;
  int64_t sa = 0, sb = 0;  // batch strides of A and B (elements), 0: shared
  bool bias = false;
  float alpha = 1.0f;
};

// How a split-K candidate (mma_sync_32x32x64_splitk, wgmma_128x128x64_splitk) cuts the K tiles
// of a GEMM whose `blocks` output tiles (the batch's included) leave the device's `sms` SMs idle:
// up to `want` splits (what fills the device at the kernel's blocks per SM), at least
// `min_tiles` K tiles each (fewer would leave the pipeline nothing to overlap), at most
// `max_splits` (each adds M·N f32 of partials and of reduction reads), none left empty. Declines
// the shapes that need no split and the grids that cannot hold the splits.
struct SplitK {
  int32_t splits = 1;
  int64_t per = 0;         // K tiles per split
  uint64_t workspace = 0;  // bytes of f32 partials: splits x batch x M x N
};
inline SplitK plan_split_k(const GemmProblem& s, int64_t blocks, int64_t ktiles, int64_t sms,
                           int64_t want, int64_t min_tiles, int64_t max_splits, const char* op) {
  PLX_DECLINE_UNLESS(blocks > 0 && ktiles > 0, "%s: nothing to split", op);
  const int64_t splits = std::min({want, ktiles / min_tiles, max_splits});
  PLX_DECLINE_UNLESS(splits >= 2,
                     "%s: %lld output tiles fill %lld SMs without splitting K, or K has too few "
                     "tiles (%lld)",
                     op, static_cast<long long>(blocks), static_cast<long long>(sms),
                     static_cast<long long>(ktiles));
  SplitK k;
  k.per = (ktiles + splits - 1) / splits;
  k.splits = static_cast<int32_t>((ktiles + k.per - 1) / k.per);
  PLX_DECLINE_UNLESS(k.splits >= 2 && s.batch * k.splits <= 65535,
                     "%s: %d splits of a batch of %lld do not fit the grid", op, k.splits,
                     static_cast<long long>(s.batch));
  k.workspace = static_cast<uint64_t>(k.splits) * static_cast<uint64_t>(s.batch * s.M * s.N) *
                sizeof(float);
  return k;
}

// Declines (our kernels take one dtype for every operand) unless t is of dtype d.
inline void require_gemm_dtype(const plx_tensor& t, plx_dtype d, const char* op, const char* what) {
  PLX_DECLINE_UNLESS(t.dtype == d, "%s: %s is %s, the kernel takes %s", op, what,
                     dtype_name(static_cast<plx_dtype>(t.dtype)), dtype_name(d));
}

// y (..., M, N) = alpha op(a) op(b): one GEMM when the batch folds into rows (one b for all,
// row-major a) or is 1, a strided batch when each operand's batch dims are all full or all
// broadcast; declines batch dims that broadcast partially (cuBLASLt's kernel loops over those).
inline GemmProblem matmul_problem(const NodeInfo& node, plx_dtype d) {
  const plx_tensor& a = node.input(0);   // (..., M, K) or (..., K, M) with trans_a
  const plx_tensor& b = node.input(1);   // (..., K, N) or (..., N, K) with trans_b
  const plx_tensor& y = node.output(0);  // (batch..., M, N)
  PLX_REQUIRE(a.ndim >= 2 && b.ndim >= 2 && y.ndim >= 2, "matmul: operands need 2 dimensions");
  require_gemm_dtype(a, d, "matmul", "a");
  require_gemm_dtype(b, d, "matmul", "b");
  require_gemm_dtype(y, d, "matmul", "y");
  const bool ta = node.attr_int("trans_a") != 0;
  const bool tb = node.attr_int("trans_b") != 0;
  GemmProblem s;
  s.a_kmajor = !ta;
  s.b_kmajor = tb;
  s.M = y.shape[y.ndim - 2];
  s.N = y.shape[y.ndim - 1];
  s.K = ta ? a.shape[a.ndim - 2] : a.shape[a.ndim - 1];
  s.alpha = static_cast<float>(node.attr_float("alpha"));
  // Batch entries of y, and of a and b (their batch dims are y's, right-aligned, or 1).
  int64_t batch = 1, a_batch = 1, b_batch = 1;
  for (int32_t i = 0; i < y.ndim - 2; ++i) batch *= y.shape[i];
  for (int32_t i = 0; i < a.ndim - 2; ++i) a_batch *= a.shape[i];
  for (int32_t i = 0; i < b.ndim - 2; ++i) b_batch *= b.shape[i];
  const bool a_full = a_batch == batch, b_full = b_batch == batch;
  if (batch > 1 && !ta && b_batch == 1 && a_full) {
    s.M *= batch;  // one b for all, row-major a: the batch is more rows of one GEMM
  } else if (batch > 1) {
    PLX_DECLINE_UNLESS((a_full || a_batch == 1) && (b_full || b_batch == 1),
                       "matmul: batch dims that broadcast partially");
    s.batch = batch;
    s.sa = a_full ? s.M * s.K : 0;
    s.sb = b_full ? s.K * s.N : 0;
  } else {
    s.batch = batch;  // 1, or 0 for an empty batch (nothing to launch)
  }
  return s;
}

// y (..., out) = x (..., in) w (out, in)^T [+ bias]: both operands K-major.
inline GemmProblem linear_problem(const NodeInfo& node, plx_dtype d) {
  const plx_tensor& x = node.input(0);  // (..., in)
  const plx_tensor& w = node.input(1);  // (out, in)
  PLX_REQUIRE(x.ndim >= 1 && w.ndim == 2, "linear: x (..., in) and w (out, in) expected");
  require_gemm_dtype(x, d, "linear", "x");
  require_gemm_dtype(w, d, "linear", "w");
  require_gemm_dtype(node.output(0), d, "linear", "y");
  GemmProblem s;
  s.bias = node.has_input(2);
  if (s.bias) require_gemm_dtype(node.input(2), d, "linear", "the bias");
  s.N = w.shape[0];
  s.K = w.shape[1];
  s.M = 1;
  for (int32_t i = 0; i + 1 < x.ndim; ++i) s.M *= x.shape[i];
  return s;
}

}  // namespace plexus::cuda
