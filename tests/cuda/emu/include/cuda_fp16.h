// The CUDA emulator's __half: 16 bits of storage, converted with the SDK's round-to-nearest-even
// functions (those the CPU plugin uses), arithmetic in f32 through the implicit conversion.
#pragma once

#include "cuda_runtime.h"
#include "plexus/sdk/dtype.hpp"

struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(plexus::f32_to_f16_bits(f)) {}
  __half(double d) : __x(plexus::f32_to_f16_bits(plexus::f64_to_f32_odd(d))) {}
  __half(int v) : __half(static_cast<float>(v)) {}
  operator float() const { return plexus::f16_bits_to_f32(__x); }
};
typedef __half half;

inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short v) {
  __half h;
  h.__x = v;
  return h;
}
inline bool __hisnan(__half h) { return (h.__x & 0x7fffu) > 0x7c00u; }

// Two halves as one 4-byte-aligned store.
struct alignas(4) __half2 {
  __half x, y;
};
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
