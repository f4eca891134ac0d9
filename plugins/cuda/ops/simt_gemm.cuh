// The plain SIMT GEMM tile of the two GEMM files' fallback kernels: simt_gemm_kernel
// (ops/mma_gemm.cu, "simt_16x16": the shapes every Tensor Core tile declines, and operands that
// are not 16-byte aligned) and wgmma_simt_fallback_kernel (ops/wgmma_gemm.cu, unaligned
// operands). Each keeps its own epilogue.
//
// A block of 16 x 16 threads computes a 16 x 16 tile of outputs, one each, over element strides
// (A[m][k] at m·sam + k·sak, B[k][n] at k·sbk + n·sbn), in f32 (f32 inputs in full f32), summing
// in k order from 0 with one fmaf per k. The operands come through shared memory 64 values of k
// at a time, each thread's 4 + 4 loads issued before any is stored: with 16 at a time (before the
// thirty-second session) a thread waited for a dependent round trip and two barriers every 16
// values of k, 8 of each for the K = 128 of a batch-128 classifier's weight gradient.
#pragma once

#include <cstdint>

#include "device.cuh"

namespace plexus::cuda {

constexpr int kSimtTile = 16;   // outputs per block: kSimtTile x kSimtTile, a thread each
constexpr int kSimtDepth = 64;  // values of k staged per barrier

// The dot product of row mb + threadIdx.x / kSimtTile of A with column nb + threadIdx.x %
// kSimtTile of B (0 where either is past M or N). Every thread of the block calls it.
template <class T>
__device__ __forceinline__ float simt_tile_dot(const T* A, const T* B, int64_t M, int64_t N,
                                               int64_t K, int64_t sam, int64_t sak, int64_t sbk,
                                               int64_t sbn, int64_t mb, int64_t nb) {
  constexpr int kThreads = kSimtTile * kSimtTile;
  constexpr int kLoads = kSimtTile * kSimtDepth / kThreads;  // of each operand, per thread
  __shared__ float As[kSimtTile][kSimtDepth + 1];
  __shared__ float Bs[kSimtDepth][kSimtTile + 1];
  const int t = static_cast<int>(threadIdx.x);
  const int tx = t % kSimtTile, ty = t / kSimtTile;
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < K; k0 += kSimtDepth) {
    // Element e of each staged tile: A's with k fastest, B's with n fastest (as the 16 x 16
    // tiles were read), so a warp's loads are contiguous where that stride is 1.
    float av[kLoads], bv[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int e = t + j * kThreads;
      const int64_t am = mb + e / kSimtDepth, ak = k0 + e % kSimtDepth;
      av[j] = am < M && ak < K ? to_accum<T>(A[am * sam + ak * sak]) : 0.f;
      const int64_t bk = k0 + e / kSimtTile, bn = nb + e % kSimtTile;
      bv[j] = bk < K && bn < N ? to_accum<T>(B[bk * sbk + bn * sbn]) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int e = t + j * kThreads;
      As[e / kSimtDepth][e % kSimtDepth] = av[j];
      Bs[e / kSimtTile][e % kSimtTile] = bv[j];
    }
    __syncthreads();
    const int depth = K - k0 < kSimtDepth ? static_cast<int>(K - k0) : kSimtDepth;
    if (depth == kSimtDepth) {
#pragma unroll
      for (int k = 0; k < kSimtDepth; ++k) acc = fmaf(As[ty][k], Bs[k][tx], acc);
    } else {
      for (int k = 0; k < depth; ++k) acc = fmaf(As[ty][k], Bs[k][tx], acc);
    }
    __syncthreads();  // every thread has read the tiles before the next are stored
  }
  return acc;
}

}  // namespace plexus::cuda
