// The cross-entropy loss's reduction, shared by softmax_cross_entropy (ops/softmax.cu) and the
// fused classifier head (ops/linear_ce.cu), so the two give the same bits.
#pragma once

#include <climits>
#include <cmath>

#include "device.cuh"

namespace plexus::cuda {

// ---- a classifier row in shared memory, over one warp (the fused head, ops/linear_ce.cu, and
// the whole-step kernel, ops/step_cnn.cu) ----

// The index a lane with no element holds in warp_argmax.
constexpr long long kNoArgmax = LLONG_MAX;

// (v, i) beats (bv, bi) for argmax: a NaN beats any number, a larger value a smaller one, and
// among equals (two NaNs included) the lower index. A lane with no element holds (-inf,
// kNoArgmax), which every element beats. The order is total, so every lane of the shuffle tree
// ends with the same winner: the first NaN, else the first maximum (docs/ops.md).
__device__ __forceinline__ bool argmax_beats(float v, long long i, float bv, long long bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  return v > bv || (v == bv && i < bi);
}

// The argmax of z[0, C): every lane of the warp calls it and gets it.
__device__ __forceinline__ long long warp_argmax(const float* z, int64_t C, int lane) {
  float bv = -INFINITY;
  long long bi = kNoArgmax;
  for (int64_t k = lane; k < C; k += 32)
    if (argmax_beats(z[k], k, bv, bi)) {
      bv = z[k];
      bi = k;
    }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (argmax_beats(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  return bi;
}

// log Σ exp(z[0, C)) as ce_forward computes it (the maximum first; NaNs are skipped by the
// maximum and poison the sum): every lane of the warp calls it and gets it.
__device__ __forceinline__ float warp_log_sum_exp(const float* z, int64_t C, int lane) {
  float mx = -INFINITY;
  for (int64_t k = lane; k < C; k += 32) mx = fmaxf(mx, z[k]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t k = lane; k < C; k += 32) sum += expf(z[k] - mx);
  sum = warp_sum(sum);
  return mx + logf(sum);
}

// One block: the sum of the row losses in a fixed order, in f64, divided for mean by the rows
// not ignored (0 when every row is ignored). L: the labels' type; T: the loss's. Every thread of
// the block calls it (block_sum's barriers). The row losses are read through volatile: the
// fused head's last block reads what the other blocks wrote in the same launch.
template <class T, class L>
__device__ __forceinline__ void ce_reduce_block(const volatile float* row_loss, const L* labels,
                                                T* loss, int64_t n, long long ignore, bool mean) {
  __shared__ double shared_sum[32];
  __shared__ long long shared_count[32];
  double s = 0;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    s += static_cast<double>(row_loss[i]);
    count += static_cast<long long>(labels[i]) != ignore ? 1 : 0;
  }
  s = block_sum(s, shared_sum);
  count = block_sum(count, shared_count);
  if (threadIdx.x == 0) {
    if (mean) s = count > 0 ? s / static_cast<double>(count) : 0.0;
    store(loss, 0, static_cast<float>(s));
  }
}

template <class T, class L>
__global__ void __launch_bounds__(kBlock)
    ce_reduce(const float* __restrict__ row_loss, const L* __restrict__ labels,
              T* __restrict__ loss, int64_t n, long long ignore, bool mean) {
  pdl_begin();
  ce_reduce_block<T, L>(row_loss, labels, loss, n, ignore, mean);
}

}  // namespace plexus::cuda
