// Many casts in one launch: the fusion of a mixed-precision step's casts (its parameters to 16
// bits before the layers that read them, their gradients back to f32 for the optimizer), which
// node by node are one small launch each (ops/misc.cu, beside the per-node cast kernel, whose
// rounding it shares: the same bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common.hpp"

namespace plexus::cuda {

// Casts tensor i (numel[i] contiguous elements of `from`) from src[i] into dst[i] (`to`), for
// i < count: f32, f16 and bf16 each way. Where cl_c[i] > 0 (cl_c and cl_hw may be null: none),
// src[i] is (N, cl_c[i], cl_hw[i]) and dst[i] gets it channels-last, (N, cl_hw[i], cl_c[i]).
// Up to kMultiCastCapacity tensors per launch; longer lists take several. Allocates nothing and
// never waits (capturable).
constexpr int kMultiCastCapacity = 64;
void launch_multi_cast(plx_dtype from, plx_dtype to, int32_t count, const void* const* src,
                       void* const* dst, const int64_t* numel, const int32_t* cl_c,
                       const int64_t* cl_hw, cudaStream_t stream);

}  // namespace plexus::cuda
