// GELU and its derivative as every CUDA kernel computes them: the gelu and gelu_backward ops
// (ops/elementwise.cu), our GEMMs' epilogues (ops/mma_gemm.cu, ops/wgmma_gemm.cu) and
// gelu_backward with a linear layer's bias sum (ops/pool.cu). One formula each, so fused and
// unfused kernels agree to the bit; the CPU's formulas and constants, rounded to f32 as its
// functors round them (the results differ from the CPU's by the libraries' erff, tanhf, expf).
#pragma once

namespace plexus::cuda::gelu {

constexpr float kSqrt2OverPi = static_cast<float>(0.7978845608028654);
constexpr float kInvSqrt2 = static_cast<float>(0.7071067811865476);
constexpr float kInvSqrt2Pi = static_cast<float>(0.3989422804014327);
constexpr float kCubic = static_cast<float>(0.044715);
constexpr float kCubic3 = static_cast<float>(3 * 0.044715);

// Every product and sum rounds on its own (the _rn intrinsics): nvcc contracts a * b + c into a
// fused multiply-add where it sees fit, which can differ between two kernels that inline the
// same expression, and then a fused kernel's GELU would not be the gelu op's to the bit (the
// CUDA emulator, which contracts as freely, showed it in gelu_backward's tanh form).

// u = sqrt(2/pi) · (x + 0.044715 x³), the tanh form's argument.
__device__ __forceinline__ float tanh_arg(float x) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kCubic, x), x), x);
  return __fmul_rn(kSqrt2OverPi, __fadd_rn(x, cube));
}

// gelu(x): x·Φ(x), or with `tanh_form` the tanh approximation.
__device__ __forceinline__ float forward(float x, bool tanh_form) {
  const float half_x = __fmul_rn(0.5f, x);
  if (tanh_form) return __fmul_rn(half_x, __fadd_rn(1.f, tanhf(tanh_arg(x))));
  return __fmul_rn(half_x, __fadd_rn(1.f, erff(__fmul_rn(x, kInvSqrt2))));
}

// dy · gelu'(x).
__device__ __forceinline__ float backward(float dy, float x, bool tanh_form) {
  if (tanh_form) {
    const float t = tanhf(tanh_arg(x));
    const float du = __fmul_rn(kSqrt2OverPi, __fadd_rn(1.f, __fmul_rn(__fmul_rn(kCubic3, x), x)));
    const float outer = __fmul_rn(0.5f, __fadd_rn(1.f, t));
    const float slope = __fmul_rn(__fmul_rn(0.5f, x), __fsub_rn(1.f, __fmul_rn(t, t)));
    const float inner = __fmul_rn(slope, du);
    return __fmul_rn(dy, __fadd_rn(outer, inner));
  }
  const float cdf = __fmul_rn(0.5f, __fadd_rn(1.f, erff(__fmul_rn(x, kInvSqrt2))));
  const float pdf = __fmul_rn(kInvSqrt2Pi, expf(__fmul_rn(__fmul_rn(-0.5f, x), x)));
  return __fmul_rn(dy, __fadd_rn(cdf, __fmul_rn(x, pdf)));
}

}  // namespace plexus::cuda::gelu
