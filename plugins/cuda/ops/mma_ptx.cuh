// PTX wrappers shared by our Tensor Core kernels (ops/mma_gemm.cu, ops/igemm_conv.cuh), sm_80 and
// later: shared-memory addresses, cp.async copies and their groups, ldmatrix fragment loads, and
// the mma.sync tiles (PTX ISA, "Warp-level matrix instructions"). The CUDA emulator
// (tests/cuda/emu) compiles the kernels with its own versions of these, plx_emu_ptx.hpp: keep the
// two sets of signatures alike.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device.cuh"

namespace plexus::cuda::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// f32 -> TF32, rounded to nearest; the MMA alone would just drop the low 13 bits (round toward
// zero). sm_90 has cvt.rn (ties to even), one instruction (F2FP.TF32.F32.PACK_B); sm_80 has only
// cvt.rna (ties away from zero), which ptxas makes a test for Inf/NaN and a predicated add (and
// often a mask): with 48 per K tile of a 128x64 TF32 tile, that was a quarter of its K loop's
// instructions (docs/kernels.md). The two differ only on exact ties.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("cvt.rn.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#else
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#endif
  return r;
}

// 16 bytes global -> shared, or 16 zero bytes when !valid (src-size 0: nothing is read). A
// zero-filled copy reads no global memory, so its address may lie outside the tensor (a tap in
// the padding, a row past the last, a column past K): the gathers pass every copy's computed
// address and the predicate, as CUTLASS's zfill copies pass their iterators' (`get()` beside
// `valid()`), saving a 64-bit select per copy. It must still be aligned to the copy's size.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// The same copy allocating in L1 (cp.async.ca; .cg above caches in L2 only), for the implicit
// GEMMs' gathered activations: a KH x KW filter reads each input pixel for up to KH·KW output
// pixels, most of them in the same block's tile, so the block's later copies of a pixel hit L1
// instead of going back to L2 (a 128-pixel tile of a 3x3 convolution on 28-wide images gathers
// about 6 times the bytes its receptive field holds). CUTLASS's implicit-GEMM convolutions copy
// their activation operand through L1 the same way and stream the filter through L2; ours keep
// cp_async16 for the filter, the weight gradients' dy and the GEMMs' operands, which no copy of
// the same block reads twice.
__device__ __forceinline__ void cp_async16_ca(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// 4 bytes global -> shared (through L1: .cg takes 16 bytes only), or 4 zero bytes when !valid.
// The zero fill through the ignore-src predicate (PTX 7.5): with a src-size of valid ? 4 : 0 nvcc
// computed the 4 or 0 arithmetically from a table entry's sign (three instructions a copy in the
// TF32 gathers) before ptxas made it a predicate again.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile(
      "{\n .reg .pred p;\n setp.eq.u32 p, %2, 0;\n cp.async.ca.shared.global [%0], [%1], 4, p;\n}\n" ::
          "r"(dst),
      "l"(src), "r"(static_cast<uint32_t>(valid))
      : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// c (16x8, f32) += a (16x16) · b (16x8), 16-bit inputs.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
// c (16x8, f32) += a (16x8) · b (8x8), TF32 inputs.
__device__ __forceinline__ void mma_1688_tf32(float (&c)[4], const uint32_t (&a)[4],
                                              const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace plexus::cuda::ptx
