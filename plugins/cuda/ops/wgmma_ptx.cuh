// PTX wrappers of our Hopper GEMM (ops/wgmma_gemm.cu), sm_90a only: mbarriers, the TMA tensor
// copy (cp.async.bulk.tensor), wgmma and its groups, named barriers and the register
// reallocation (PTX ISA, "Asynchronous warpgroup level matrix instructions", "mbarrier",
// "cp.async.bulk.tensor"). The CUDA emulator (tests/cuda/emu) compiles the kernel with its own
// versions of these, plx_emu_wgmma.hpp: keep the two sets of signatures alike. Everything the
// kernel computes itself (descriptors, coordinates, stages and phases) stays in the kernel.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: libcuda is not linked)

#include <cstdint>
#include <type_traits>

#include "device.cuh"

namespace plexus::cuda::ptx {

// ---- mbarriers (64-bit objects in shared memory, addressed by their shared address) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival, and `bytes` more that asynchronous copies will complete (their complete_tx).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// True when the phase of parity `parity` has completed; may suspend the thread a while first
// (a potentially blocking instruction), and may return false: callers loop.
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0, and the
// phase "before" it (parity 1) counts as completed: a first wait with parity 1 returns at once.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// Initialised mbarriers made visible to the other threads and to the async proxy (the TMA unit).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Orders this thread's generic-proxy shared-memory accesses with the async proxy's (TMA, wgmma).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- TMA ----
// The box of tensor map `map` at coordinates (c0 inner, c1, c2) into shared memory at dst; the
// box's bytes are counted on mbarrier bar (complete_tx).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int32_t c0,
                                            int32_t c1, int32_t c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// The im2col form of a 4-D (C, W, H, N) tensor map (cuTensorMapEncodeIm2col): the map's pixels
// per column, each its channels per pixel from channel c, the first pixel's filter base at
// (w, h) in image n and each pixel read at its base plus (off_w, off_h); the bases walk the
// map's bounding box along W, then H, then the images (PTX ISA, "im2col mode").
__device__ __forceinline__ void tma_load_im2col_4d(uint32_t dst, const CUtensorMap* map, int32_t c,
                                                   int32_t w, int32_t h, int32_t n, uint16_t off_w,
                                                   uint16_t off_h, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar), "h"(off_w),
      "h"(off_h)
      : "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// The same box multicast to every CTA of the cluster in `mask` (bit r: CTA rank r): each gets
// the bytes at the same shared offset dst, counted on its own mbarrier at the same offset bar.
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map,
                                                      int32_t c0, int32_t c1, int32_t c2,
                                                      uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}

// ---- thread-block clusters ----
// This CTA's rank in its cluster, and the cluster's CTAs.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
// The shared::cluster address of the same offset as this CTA's shared address `addr` in CTA
// `rank` of the cluster.
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// One arrival on the mbarrier at a shared::cluster address (mapa_shared's): the stage it guards
// has been read (by wgmma, retired by wgmma.wait_group) and may be refilled. The default
// semantics (release at CTA scope), as CUTLASS's ClusterBarrier arrives: the arrival orders no
// generic-proxy writes, so a cluster-scope release would only add a GPU-wide fence (MEMBAR) per
// stage and warp.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr) : "memory");
}
// Every thread of every CTA of the cluster: each CTA's mbarrier inits (fence_mbarrier_init
// first) visible to the others before any of them is used from another CTA.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// ---- warpgroup-wide (all 128 threads of the warp group execute them) ----
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R) : "memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R) : "memory");
}
// Named barrier `Id` for `Count` threads (a multiple of the warp size).
template <int Id, int Count>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(Id), "n"(Count) : "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N of this warp group's committed wgmma groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across the asynchronous wgmma
// (it sees them as plain registers): each is "rewritten" by an empty volatile asm.
template <int R>
__device__ __forceinline__ void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x N f32, this thread's fragment) += A (64 x 16) · B (16 x N), both read from shared
// memory through the descriptors da and db. TA: A is M-major (else K-major); TB: B is N-major
// (else K-major). scale-d = 1: the accumulators are added to (they start at zero).
// Every accumulator register is an in/out operand of the one instruction: PLX_WG_R<g> is the
// register list of d[16 g .. 16 g + 15], PLX_WG_D16(i) their constraints; PLX_WGMMA's A, B, S,
// TA, TB number the operands after the N / 2 accumulators (da, db, scale-d, imm-trans-a, -b).
#define PLX_WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define PLX_WG_R1 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define PLX_WG_R2 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define PLX_WG_R3 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define PLX_WG_R4 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define PLX_WG_R5 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define PLX_WG_R6                                \
  "%96, %97, %98, %99, %100, %101, %102, %103, " \
  "%104, %105, %106, %107, %108, %109, %110, %111"
#define PLX_WG_R7                                    \
  "%112, %113, %114, %115, %116, %117, %118, %119, " \
  "%120, %121, %122, %123, %124, %125, %126, %127"
#define PLX_WG_D8(i)                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define PLX_WG_D16(i) PLX_WG_D8(i), PLX_WG_D8(i + 8)
#define PLX_WGMMA_TY(N, TY, REGS, A, B, S, TA, TB, ...)                                        \
  asm volatile(                                                                                \
      "{\n"                                                                                    \
      ".reg .pred p;\n"                                                                        \
      "setp.ne.b32 p, %" #S                                                                    \
      ", 0;\n"                                                                                 \
      "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" REGS "}, %" #A ", %" #B \
      ", p, 1, 1, %" #TA ", %" #TB                                                             \
      ";\n"                                                                                    \
      "}\n"                                                                                    \
      : __VA_ARGS__                                                                            \
      : "l"(da), "l"(db), "r"(1), "n"(kTA), "n"(kTB))
#define PLX_WGMMA(N, REGS, A, B, S, TA, TB, ...)                 \
  if constexpr (std::is_same_v<T, bf16>)                         \
    PLX_WGMMA_TY(N, "bf16", REGS, A, B, S, TA, TB, __VA_ARGS__); \
  else                                                           \
    PLX_WGMMA_TY(N, "f16", REGS, A, B, S, TA, TB, __VA_ARGS__)

template <class T, int N, bool TA, bool TB>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], uint64_t da, uint64_t db) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "wgmma: bf16 or f16");
  constexpr int kTA = TA ? 1 : 0, kTB = TB ? 1 : 0;
  if constexpr (N == 32) {
    PLX_WGMMA(32, PLX_WG_R0, 16, 17, 18, 19, 20, PLX_WG_D16(0));
  } else if constexpr (N == 64) {
    PLX_WGMMA(64, PLX_WG_R0 ", " PLX_WG_R1, 32, 33, 34, 35, 36, PLX_WG_D16(0), PLX_WG_D16(16));
  } else if constexpr (N == 96) {
    PLX_WGMMA(96, PLX_WG_R0 ", " PLX_WG_R1 ", " PLX_WG_R2, 48, 49, 50, 51, 52, PLX_WG_D16(0),
              PLX_WG_D16(16), PLX_WG_D16(32));
  } else if constexpr (N == 128) {
    PLX_WGMMA(128, PLX_WG_R0 ", " PLX_WG_R1 ", " PLX_WG_R2 ", " PLX_WG_R3, 64, 65, 66, 67, 68,
              PLX_WG_D16(0), PLX_WG_D16(16), PLX_WG_D16(32), PLX_WG_D16(48));
  } else {
    static_assert(N == 256, "wgmma tiles: n32, n64, n96, n128, n256");
    PLX_WGMMA(256,
              PLX_WG_R0 ", " PLX_WG_R1 ", " PLX_WG_R2 ", " PLX_WG_R3 ", " PLX_WG_R4 ", " PLX_WG_R5
                        ", " PLX_WG_R6 ", " PLX_WG_R7,
              128, 129, 130, 131, 132, PLX_WG_D16(0), PLX_WG_D16(16), PLX_WG_D16(32),
              PLX_WG_D16(48), PLX_WG_D16(64), PLX_WG_D16(80), PLX_WG_D16(96), PLX_WG_D16(112));
  }
}
#undef PLX_WGMMA
#undef PLX_WGMMA_TY
#undef PLX_WG_D16
#undef PLX_WG_D8
#undef PLX_WG_R0
#undef PLX_WG_R1
#undef PLX_WG_R2
#undef PLX_WG_R3
#undef PLX_WG_R4
#undef PLX_WG_R5
#undef PLX_WG_R6
#undef PLX_WG_R7

}  // namespace plexus::cuda::ptx
