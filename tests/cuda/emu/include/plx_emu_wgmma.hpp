// The CUDA emulator's ops/wgmma_ptx.cuh: the same wrappers (signatures alike, namespace alike), on
// the emulator's Hopper PTX (plx_emu.hpp) instead of inline assembly. translate.py includes this
// in place of ops/wgmma_ptx.cuh, so the Hopper GEMM (ops/wgmma_gemm.cu) runs on the CPU as it is
// written: its mbarrier pipeline, TMA boxes with the 128- or 64-byte swizzle, wgmma descriptors and
// accumulator fragments, modelled from the PTX ISA and the driver API independently of the kernel.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "device.cuh"

namespace plexus::cuda::ptx {

inline void mbar_init(uint32_t bar, uint32_t count) {
  ::plx_emu::mbarrier_init(bar, count);
}
inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  ::plx_emu::mbarrier_arrive(bar, bytes);
}
inline void mbar_arrive(uint32_t bar) {
  ::plx_emu::mbarrier_arrive(bar, 0);
}
inline bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  return ::plx_emu::mbarrier_try_wait(bar, parity);
}
inline void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// One memory for every proxy and every thread: the fences order nothing further here.
inline void fence_mbarrier_init() {}
inline void fence_proxy_async() {}

inline void tma_load_3d(uint32_t dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                        uint32_t bar) {
  const int32_t c[3] = {c0, c1, c2};
  ::plx_emu::tma_load(dst, map, c, 3, bar);
}
inline void tma_load_im2col_4d(uint32_t dst, const CUtensorMap* map, int32_t c, int32_t w,
                               int32_t h, int32_t n, uint16_t off_w, uint16_t off_h, uint32_t bar) {
  const int32_t co[4] = {c, w, h, n};
  const uint16_t off[2] = {off_w, off_h};
  ::plx_emu::tma_load_im2col(dst, map, co, 4, off, bar);
}
inline void prefetch_tensormap(const CUtensorMap* map) {
  ::plx_emu::tensormap_prefetch(map);
}
inline void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                  int32_t c2, uint32_t bar, uint16_t mask) {
  const int32_t c[3] = {c0, c1, c2};
  ::plx_emu::tma_load_multicast(dst, map, c, 3, bar, mask);
}

inline uint32_t cluster_ctarank() {
  return ::plx_emu::cluster_ctarank();
}
inline uint32_t cluster_nctarank() {
  return ::plx_emu::cluster_nctarank();
}
inline uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
  return ::plx_emu::mapa(addr, rank);
}
inline void mbar_arrive_cluster(uint32_t cluster_addr) {
  ::plx_emu::mbarrier_arrive_cluster(cluster_addr);
}
inline void cluster_sync() {
  ::plx_emu::cluster_barrier_arrive();
  ::plx_emu::cluster_barrier_wait();
}

template <int R>
inline void setmaxnreg_dec() {
  ::plx_emu::setmaxnreg(R);
}
template <int R>
inline void setmaxnreg_inc() {
  ::plx_emu::setmaxnreg(R);
}
template <int Id, int Count>
inline void named_barrier_sync() {
  ::plx_emu::named_barrier(Id, Count);
}

inline void wgmma_fence() {
  ::plx_emu::wgmma_fence();
}
inline void wgmma_commit() {
  ::plx_emu::wgmma_commit();
}
template <int N>
inline void wgmma_wait() {
  ::plx_emu::wgmma_wait(N);
}
// The accumulators are written only at the wait that retires their wgmma (see runtime.cpp).
template <int R>
inline void fence_acc(float (&)[R]) {}

template <class T, int N, bool TA, bool TB>
inline void wgmma_m64k16(float (&d)[N / 2], uint64_t da, uint64_t db) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "wgmma: bf16 or f16");
  ::plx_emu::wgmma(d, N, da, db, TA, TB,
                   std::is_same_v<T, bf16> ? ::plx_emu::MmaKind::kBF16 : ::plx_emu::MmaKind::kF16);
}

}  // namespace plexus::cuda::ptx
