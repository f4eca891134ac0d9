// Filling an output with a per-channel bias before a GEMM or convolution adds onto it (beta = 1),
// so each output element is rounded once, as the CPU plugin does. Shared by linear (gemm.cpp),
// when cuBLASLt's bias epilogue cannot be used, and conv2d (conv.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "plexus/abi/types.h"

namespace plexus::cuda {

// y[(o·channels + c)·inner + i] = bias[c] for o < outer, c < channels, i < inner; y and bias of
// `dtype` (f32, f16 or bf16). Row-major rows of features: inner = 1; NCHW: outer = N,
// inner = H·W; NHWC: outer = N·H·W, inner = 1. Enqueued on `stream`; launches nothing when empty.
void fill_bias(plx_dtype dtype, void* y, const void* bias, int64_t outer, int64_t channels,
               int64_t inner, cudaStream_t stream);

}  // namespace plexus::cuda
