// The CUDA emulator's __nv_bfloat16 (see cuda_fp16.h).
#pragma once

#include "cuda_runtime.h"
#include "plexus/sdk/dtype.hpp"

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(plexus::f32_to_bf16_bits(f)) {}
  __nv_bfloat16(double d) : __x(plexus::f32_to_bf16_bits(plexus::f64_to_f32_odd(d))) {}
  __nv_bfloat16(int v) : __nv_bfloat16(static_cast<float>(v)) {}
  operator float() const { return plexus::bf16_bits_to_f32(__x); }
};

inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) {
  __nv_bfloat16 h;
  h.__x = v;
  return h;
}

// Two bf16 as one 4-byte-aligned store.
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__nv_bfloat16(a), __nv_bfloat16(b)};
}
