// One store of an output and its right neighbour, as the GEMMs' epilogues write them
// (ops/mma_gemm.cu, ops/wgmma_gemm.cu).
#pragma once

#include <cstdint>
#include <type_traits>

#include "device.cuh"

namespace plexus::cuda {

// Rounds v0 (and v1, if `two`) to T and stores them at out[0] (and out[1]): one 4- or 8-byte
// store where `pair` says the row allows it.
template <class T>
__device__ __forceinline__ void put_pair(T* out, float v0, float v1, bool two, int32_t pair) {
  if (two && pair) {
    if constexpr (std::is_same_v<T, float>) {
      *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
    } else if constexpr (std::is_same_v<T, f16>) {
      *reinterpret_cast<__half2*>(out) = __floats2half2_rn(v0, v1);
    } else {
      *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(v0, v1);
    }
  } else {
    out[0] = from_accum<T>(v0);
    if (two) out[1] = from_accum<T>(v1);
  }
}

}  // namespace plexus::cuda
