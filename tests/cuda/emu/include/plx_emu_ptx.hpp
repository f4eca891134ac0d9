// The CUDA emulator's ops/mma_ptx.cuh: the same wrappers (signatures alike, namespace alike), on
// the emulator's PTX (plx_emu.hpp) instead of inline assembly. translate.py includes this in
// place of ops/mma_ptx.cuh, so the Tensor Core kernels (ops/mma_gemm.cu, ops/igemm_conv.cuh) run
// on the CPU as they are written: cp.async and its groups, ldmatrix's row addresses and what each
// lane gets, and the mma fragments, modelled from the PTX ISA independently of the kernels.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device.cuh"
#include "plx_emu_numeric.hpp"

namespace plexus::cuda::ptx {

inline uint32_t smem_addr(const void* p) { return ::plx_emu::shared_address(p); }

// As sm_90 rounds (cvt.rn: ties to even); sm_80's cvt.rna (ties away) differs only on ties.
inline uint32_t to_tf32(float x) { return ::plx_emu::tf32_bits_rn(x); }

inline void cp_async16(uint32_t dst, const void* src, bool valid) {
  ::plx_emu::cp_async(dst, src, 16, valid ? 16 : 0);
}
// .ca and .cg differ only in which caches keep the line: the same copy here.
inline void cp_async16_ca(uint32_t dst, const void* src, bool valid) {
  ::plx_emu::cp_async(dst, src, 16, valid ? 16 : 0);
}
inline void cp_async4(uint32_t dst, const void* src, bool valid) {
  ::plx_emu::cp_async(dst, src, 4, valid ? 4 : 0);
}
inline void cp_async_commit() { ::plx_emu::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  ::plx_emu::cp_async_wait(N);
}

inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { ::plx_emu::ldmatrix(r, 4, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  ::plx_emu::ldmatrix(r, 4, addr, true);
}

template <class T>
inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "mma_16816: bf16 or f16");
  ::plx_emu::mma(c, a, b, std::is_same_v<T, bf16> ? ::plx_emu::MmaKind::kBF16 : ::plx_emu::MmaKind::kF16);
}
inline void mma_1688_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  ::plx_emu::mma(c, a, b, ::plx_emu::MmaKind::kTF32);
}

}  // namespace plexus::cuda::ptx
