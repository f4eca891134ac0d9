// Element types for C++: f16 and bf16 storage types with f32 conversion, dtype traits.
// Header-only; usable from host code and (with PLX_HOST_DEVICE) from CUDA device code.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "plexus/abi/types.h"

#if defined(__CUDACC__)
#define PLX_HOST_DEVICE __host__ __device__
#else
#define PLX_HOST_DEVICE
#endif

// Host code built for a CPU with F16C (x86-64 since 2012; -march=native here) converts f16 with
// the hardware's instructions, which round exactly as the portable code below (tested over
// every half and a sweep of floats); anything else, device code included, uses the portable code.
#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#define PLX_HAVE_F16C 1
#else
#define PLX_HAVE_F16C 0
#endif

namespace plexus {

namespace detail {
PLX_HOST_DEVICE inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
PLX_HOST_DEVICE inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

// IEEE binary16 bits <-> f32, round to nearest even, in portable code. Bit-exact with the
// hardware conversion (NaN payloads aside: every NaN becomes the quiet NaN 0x7e00 with its sign).
PLX_HOST_DEVICE inline uint16_t f32_to_f16_bits_portable(float f) {
  const uint32_t x = detail::f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (ax < 0x38800000u) {
    // Below the smallest normal half: adding 0.5f puts the half's subnormal step (2^-24) in the
    // last mantissa bit of the sum, so the FPU's own rounding is the half rounding.
    const float v = detail::f32_from_bits(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (detail::f32_bits(v) - 0x3f000000u));
  }
  const uint32_t odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + odd;  // exponent 127 -> 15 bias, plus the round-to-nearest-even bias
  return static_cast<uint16_t>(sign | (ax >> 13));
}

PLX_HOST_DEVICE inline float f16_bits_to_f32_portable(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24
    return detail::f32_from_bits(detail::f32_bits(v) | sign);
  }
  if (exp == 31) return detail::f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return detail::f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

PLX_HOST_DEVICE inline uint16_t f32_to_f16_bits(float f) {
#if PLX_HAVE_F16C
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
  return f32_to_f16_bits_portable(f);
#endif
}
PLX_HOST_DEVICE inline float f16_bits_to_f32(uint16_t h) {
#if PLX_HAVE_F16C
  return _cvtsh_ss(h);
#else
  return f16_bits_to_f32_portable(h);
#endif
}

// bfloat16 bits <-> f32, round to nearest even; NaN stays a quiet NaN.
PLX_HOST_DEVICE inline uint16_t f32_to_bf16_bits(float f) {
  const uint32_t x = detail::f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
PLX_HOST_DEVICE inline float bf16_bits_to_f32(uint16_t b) {
  return detail::f32_from_bits(static_cast<uint32_t>(b) << 16);
}

// To f32 with "round to odd": truncate toward zero and set the last bit if anything was lost.
// A value rounded this way and then to f16/bf16 (round to nearest even) is rounded once, as if
// directly: f32 keeps more than the 2 extra bits the trick needs. Plain f32 rounding first
// could round twice and land on the wrong neighbour at a tie.
PLX_HOST_DEVICE inline float f64_to_f32_odd(double d) {
  const float f = static_cast<float>(d);
  const double back = static_cast<double>(f);
  if (d != d || back == d) return f;  // NaN, or exact
  uint32_t u = detail::f32_bits(f);
  if ((back > d) == (d > 0)) --u;  // rounded away from zero: one step back toward it
  return detail::f32_from_bits(u | 1u);
}
PLX_HOST_DEVICE inline float i64_to_f32_odd(int64_t v) {
  // Through f64 would round to 53 bits first and lose the bits that decide a tie.
  uint64_t u = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  uint32_t shift = 0;
  bool lost = false;
  while (u >= (uint64_t{1} << 24)) {
    lost = lost || (u & 1u);
    u >>= 1;
    ++shift;
  }
  if (lost) u |= 1u;
  // u < 2^24 is exact in f32; 2^shift (shift <= 40) is an exact power of two.
  const float f = static_cast<float>(u) * detail::f32_from_bits((127u + shift) << 23);
  return v < 0 ? -f : f;
}

// Storage types: 16 bits in memory, converted to f32 for arithmetic.
struct half {
  uint16_t bits = 0;
  half() = default;
  PLX_HOST_DEVICE explicit half(float f) : bits(f32_to_f16_bits(f)) {}
  PLX_HOST_DEVICE explicit operator float() const { return f16_bits_to_f32(bits); }
  PLX_HOST_DEVICE static half from_bits(uint16_t b) {
    half h;
    h.bits = b;
    return h;
  }
};
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  PLX_HOST_DEVICE explicit bfloat16(float f) : bits(f32_to_bf16_bits(f)) {}
  PLX_HOST_DEVICE explicit operator float() const { return bf16_bits_to_f32(bits); }
  PLX_HOST_DEVICE static bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};
static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2, "16-bit storage types");

// C++ type -> plx_dtype.
template <class T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr plx_dtype value = PLX_F32; };
template <> struct dtype_of<half> { static constexpr plx_dtype value = PLX_F16; };
template <> struct dtype_of<bfloat16> { static constexpr plx_dtype value = PLX_BF16; };
template <> struct dtype_of<int32_t> { static constexpr plx_dtype value = PLX_I32; };
template <> struct dtype_of<int64_t> { static constexpr plx_dtype value = PLX_I64; };
template <> struct dtype_of<uint8_t> { static constexpr plx_dtype value = PLX_U8; };
template <> struct dtype_of<double> { static constexpr plx_dtype value = PLX_F64; };
template <class T>
inline constexpr plx_dtype dtype_of_v = dtype_of<T>::value;

// The type arithmetic on T is done in: f32 for the 16-bit floats, T otherwise.
template <class T>
struct acc_type { using type = T; };
template <> struct acc_type<half> { using type = float; };
template <> struct acc_type<bfloat16> { using type = float; };
template <class T>
using acc_t = typename acc_type<T>::type;

// Conversion between storage and arithmetic types that also works for the 16-bit floats.
template <class To, class From>
PLX_HOST_DEVICE inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, half> || std::is_same_v<From, bfloat16>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, half> || std::is_same_v<To, bfloat16>) {
    // One rounding from any source: f32 values directly, wider ones through round-to-odd.
    if constexpr (std::is_same_v<From, float>) {
      return To(v);
    } else if constexpr (std::is_same_v<From, int64_t>) {
      return To(i64_to_f32_odd(v));
    } else {
      return To(f64_to_f32_odd(static_cast<double>(v)));  // f64, or an integer exact in f64
    }
  } else {
    return static_cast<To>(v);
  }
}

constexpr bool dtype_is_valid(int32_t d) { return d >= 0 && d < PLX_DTYPE_COUNT; }

constexpr bool dtype_is_float(int32_t d) {
  return d == PLX_F32 || d == PLX_F16 || d == PLX_BF16 || d == PLX_F64;
}

constexpr size_t dtype_size(int32_t d) {
  switch (d) {
    case PLX_F32: return 4;
    case PLX_F16: return 2;
    case PLX_BF16: return 2;
    case PLX_I32: return 4;
    case PLX_I64: return 8;
    case PLX_U8: return 1;
    case PLX_F64: return 8;
    default: return 0;
  }
}

constexpr const char* dtype_name(int32_t d) {
  switch (d) {
    case PLX_F32: return "f32";
    case PLX_F16: return "f16";
    case PLX_BF16: return "bf16";
    case PLX_I32: return "i32";
    case PLX_I64: return "i64";
    case PLX_U8: return "u8";
    case PLX_F64: return "f64";
    case PLX_DTYPE_NONE: return "none";
    default: return "invalid";
  }
}

// Calls f(dtype_tag<T>{}) with T the C++ type of `dtype`, so code written once for a type T
// runs for a dtype known only at run time:
//   visit_dtype(d, [&](auto tag) { using T = typename decltype(tag)::type; ... });
// Returns false, without calling f, for an invalid dtype.
template <class T>
struct dtype_tag {
  using type = T;
};
template <class F>
bool visit_dtype(int32_t dtype, F&& f) {
  switch (dtype) {
    case PLX_F32: f(dtype_tag<float>{}); return true;
    case PLX_F16: f(dtype_tag<half>{}); return true;
    case PLX_BF16: f(dtype_tag<bfloat16>{}); return true;
    case PLX_I32: f(dtype_tag<int32_t>{}); return true;
    case PLX_I64: f(dtype_tag<int64_t>{}); return true;
    case PLX_U8: f(dtype_tag<uint8_t>{}); return true;
    case PLX_F64: f(dtype_tag<double>{}); return true;
    default: return false;
  }
}

// "f32" -> PLX_F32; PLX_DTYPE_NONE if the name is unknown.
inline plx_dtype dtype_from_name(std::string_view s) {
  for (int32_t d = 0; d < PLX_DTYPE_COUNT; ++d)
    if (s == dtype_name(d)) return static_cast<plx_dtype>(d);
  return PLX_DTYPE_NONE;
}

}  // namespace plexus
