// The device side of the fused conv + max-pool backward (ops/conv_pool.cpp): the sum over chunks
// of the weight and bias gradients. The convolution's own backward kernels write each chunk's
// gradient with beta = 0, so the chunks are added up here, in f32, in chunk order.
#include "device.cuh"
#include "ops/conv_pool.hpp"

namespace plexus::cuda {

namespace {

// One thread per element (grid-stride): no element is touched by two threads, so no atomics.
// acc and out may be the same memory for f32 (Add into the output itself); neither is
// __restrict__ for that reason.
template <class T>
__global__ void chunk_accumulate_kernel(const T* __restrict__ part, float* acc, T* out, int64_t n,
                                        ChunkAccum mode) {
  pdl_begin();
  PLX_GRID_STRIDE(i, n) {
    const float p = to_accum<T>(part[i]);
    if (mode == ChunkAccum::Set)
      acc[i] = p;
    else if (mode == ChunkAccum::Add)
      acc[i] += p;
    else
      out[i] = from_accum<T>(acc[i] + p);
  }
}

template <class T>
void launch_typed(const void* part, float* acc, void* out, int64_t n, ChunkAccum mode,
                  cudaStream_t s) {
  launch_kernel(chunk_accumulate_kernel<T>, grid_for(n), kBlock, 0, s, static_cast<const T*>(part),
                acc, static_cast<T*>(out), n, mode);
}

}  // namespace

void launch_chunk_accumulate(plx_dtype dtype, const void* part, float* acc, void* out, int64_t n,
                             ChunkAccum mode, cudaStream_t stream) {
  if (n <= 0) return;
  switch (dtype) {
    case PLX_F32: return launch_typed<float>(part, acc, out, n, mode, stream);
    case PLX_F16: return launch_typed<f16>(part, acc, out, n, mode, stream);
    case PLX_BF16: return launch_typed<bf16>(part, acc, out, n, mode, stream);
    default: break;
  }
  throw sdk::Error(PLX_ERR_INTERNAL, sdk::format("chunk accumulate: no %s kernel",
                                                 plexus::dtype_name(dtype)));
}

}  // namespace plexus::cuda
