// Element access and TF32 rounding shared by the CUDA emulator's models of the PTX
// (plx_emu_ptx.hpp) and of cuBLASLt and cuDNN (cublaslt_emu.cpp, cudnn_emu.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "plexus/sdk/dtype.hpp"

namespace plx_emu {

// The element types the emulated libraries compute on.
enum class Elem { kF32, kF16, kBF16 };

inline float load_elem(const void* base, int64_t i, Elem t) {
  if (t == Elem::kF32) return static_cast<const float*>(base)[i];
  const uint16_t b = static_cast<const uint16_t*>(base)[i];
  return t == Elem::kF16 ? plexus::f16_bits_to_f32(b) : plexus::bf16_bits_to_f32(b);
}
inline void store_elem(void* base, int64_t i, Elem t, float v) {
  if (t == Elem::kF32) static_cast<float*>(base)[i] = v;
  else if (t == Elem::kF16) static_cast<uint16_t*>(base)[i] = plexus::f32_to_f16_bits(v);
  else static_cast<uint16_t*>(base)[i] = plexus::f32_to_bf16_bits(v);
}

// cvt.rna.tf32.f32: to nearest, ties away from zero, 10 mantissa bits kept (Inf and NaN as they
// are; a carry out of the largest finite values gives Inf). As bits, and as the f32 they hold.
inline uint32_t tf32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;
  return (u + 0x1000u) & ~0x1fffu;
}
// cvt.rn.tf32.f32 (sm_90 and later): to nearest, ties to even, 10 mantissa bits kept (Inf and NaN
// as they are; a carry out of the largest finite values gives Inf). What our kernels round with on
// sm_90, so what the emulated ones do (ops/mma_ptx.cuh).
inline uint32_t tf32_bits_rn(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;
  return (u + 0x0fffu + ((u >> 13) & 1u)) & ~0x1fffu;
}
inline float tf32_round(float x) {
  const uint32_t u = tf32_bits(x);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace plx_emu
