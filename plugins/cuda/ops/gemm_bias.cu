// The bias fill of gemm_bias.hpp.
#include "device.cuh"
#include "ops/gemm_bias.hpp"

namespace plexus::cuda {

namespace {

// One thread per output element, grid-stride. I is the index type: 32-bit when every index
// (plus one grid stride) fits, which avoids 64-bit divisions per element.
template <class T, class I>
__global__ void fill_bias_kernel(T* __restrict__ y, const T* __restrict__ bias, I total, I channels,
                                 I inner) {
  pdl_begin();
  const I step = static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
       i < total; i += step) {
    const I c = (inner == 1 ? i : i / inner) % channels;
    y[i] = bias[c];
  }
}

template <class T>
void launch(void* y, const void* bias, int64_t total, int64_t channels, int64_t inner,
            cudaStream_t stream) {
  const unsigned grid = grid_for(total);
  // i + step must not overflow I: step is at most grid_for's cap times the block.
  const int64_t step = int64_t{grid} * kBlock;
  if (total + step <= INT32_MAX) {
    launch_kernel(fill_bias_kernel<T, int32_t>, grid, kBlock, 0, stream, static_cast<T*>(y),
                  static_cast<const T*>(bias), static_cast<int32_t>(total),
                  static_cast<int32_t>(channels), static_cast<int32_t>(inner));
  } else {
    launch_kernel(fill_bias_kernel<T, int64_t>, grid, kBlock, 0, stream, static_cast<T*>(y),
                  static_cast<const T*>(bias), total, channels, inner);
  }
}

}  // namespace

void fill_bias(plx_dtype dtype, void* y, const void* bias, int64_t outer, int64_t channels,
               int64_t inner, cudaStream_t stream) {
  const int64_t total = outer * channels * inner;
  if (total == 0) return;
  switch (dtype) {
    case PLX_F32:
      launch<float>(y, bias, total, channels, inner, stream);
      break;
    case PLX_F16:
      launch<f16>(y, bias, total, channels, inner, stream);
      break;
    case PLX_BF16:
      launch<bf16>(y, bias, total, channels, inner, stream);
      break;
    default:
      throw sdk::Error(PLX_ERR_INTERNAL,
                       sdk::format("fill_bias: unexpected dtype %s", plexus::dtype_name(dtype)));
  }
}

}  // namespace plexus::cuda
