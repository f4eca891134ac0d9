// The wgmma shared-memory matrix descriptor of our Hopper kernels (ops/wgmma_gemm.cu, the igemm
// convolution's wgmma tiles in ops/igemm_conv.cuh), sm_90a: computed by the kernel, so it is
// plain device code, the same on the GPU and on the CUDA emulator (which decodes and checks it,
// tests/cuda/emu/runtime.cpp).
#pragma once

#include <cstdint>

#include "device.cuh"

namespace plexus::cuda::ptx {

// The bytes of one 128-byte-swizzle atom: 8 rows of 128 bytes.
constexpr uint32_t kAtomBytes = 1024;

// A wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading and stride byte offsets, all >> 4; bits 49-51 (base offset) 0 since every atom is
// 1024-byte aligned; bits 62-63, the layout: the swizzle of kRow-byte rows, 1 for 128 bytes (the
// default), 2 for 64, 3 for 32.
template <uint32_t kRow = 128>
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  static_assert(kRow == 128 || kRow == 64 || kRow == 32, "the 128-, 64- and 32-byte swizzles");
  constexpr uint64_t kLayout = kRow == 128 ? 1 : kRow == 64 ? 2 : 3;
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (kLayout << 62);
}

// The descriptor of the matrix `bytes` further on in shared memory: the start address field
// (bits 0-13) holds the address >> 4, and shared addresses are below 2^18, so the sum never
// carries out of it.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

}  // namespace plexus::cuda::ptx
