// The cross-entropy loss's reduction, shared by softmax_cross_entropy (ops/softmax.cu) and the
// fused classifier head (ops/linear_ce.cu), so the two give the same bits.
#pragma once

#include "device.cuh"

namespace plexus::cuda {

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
