// The CUDA emulator: the CUDA plugin's own kernels (ops/*.cu), compiled as C++ by the host
// compiler, run on the CPU with CUDA's execution model. Every thread of a block is a fiber on its
// own stack; a block runs its fibers until each finishes or waits at a barrier (__syncthreads,
// __syncwarp, a warp shuffle), so barriers and shuffles have their CUDA meaning, and a barrier
// some threads never reach is reported as a deadlock instead of hanging. Blocks run one after
// another, so `__shared__` variables are plain statics. See tests/cuda/emu/README.md.
//
// This header is what the kernels see: the CUDA keywords, the built-in indices, barriers,
// shuffles, atomics and intrinsics. The runtime API (cuda_runtime.h) is declared beside it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- keywords ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __grid_constant__

struct uint3 {
  unsigned x, y, z;
};
// CUDA's vector types for 16-byte loads from shared memory (16-byte aligned, as on the GPU).
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

namespace plx_emu {

constexpr int kWarp = 32;

// The fiber being run (one CUDA thread) and the block it belongs to.
struct Thread {
  uint3 idx;
  int linear;  // x + y * bx + z * bx * by
};
extern thread_local Thread* g_thread;
extern thread_local uint3 g_block_idx;

// Barriers (the calling fiber waits until the others arrive).
void sync_block();
int sync_block_or(int v);
int sync_block_count(int v);
void sync_warp(unsigned mask);
// Warp exchange: every lane of `mask` offers `bytes` at `mine`; after the barrier the value of
// lane `src` is copied to `out` (a lane outside the mask or the block is an error).
void shfl(unsigned mask, const void* mine, void* out, size_t bytes, int src);
// The launch's dynamic shared memory (extern __shared__).
void* dynamic_smem();
// PTX the Tensor Core kernels use (plx_emu_ptx.hpp wraps these as ops/mma_ptx.cuh does):
// a shared address is an offset into the launch's dynamic shared memory; cp.async copies `bytes`
// (the first `src_bytes` from `src`, zeros after) and lands them as PLEXUS_EMU_CP_ASYNC says;
// ldmatrix loads `count` 8x8 matrices of 16-bit elements; mma multiplies one m16n8k16 (16-bit)
// or m16n8k8 (TF32) tile into the f32 accumulators `c`. The last three are warp-wide.
uint32_t shared_address(const void* p);
void cp_async(uint32_t dst, const void* src, int bytes, int src_bytes);
void cp_async_commit();
void cp_async_wait(int pending);
void ldmatrix(uint32_t* r, int count, uint32_t addr, bool trans);
enum class MmaKind { kF16, kBF16, kTF32 };
void mma(float* c, const uint32_t* a, const uint32_t* b, MmaKind kind);
// The Hopper PTX of our wgmma GEMM (plx_emu_wgmma.hpp wraps these as ops/wgmma_ptx.cuh does):
// mbarriers (init, arrive with an optional expect-tx, try_wait.parity, which suspends the thread
// until the phase completes); the TMA tensor copy (cp.async.bulk.tensor: a box of a tensor map
// into shared memory, counted on an mbarrier, landing as PLEXUS_EMU_CP_ASYNC says); named
// barriers (bar.sync id, count); setmaxnreg's operand checks; and wgmma.mma_async on shared-memory
// descriptors with its fence, commit and wait (evaluated at the wait that retires its group).
void mbarrier_init(uint32_t bar, uint32_t count);
void mbarrier_arrive(uint32_t bar, uint32_t expect_tx_bytes);
bool mbarrier_try_wait(uint32_t bar, uint32_t parity);
void tma_load(uint32_t dst, const void* map, const int32_t* coords, int rank, uint32_t bar);
// The im2col form (cuTensorMapEncodeIm2col's maps): coords (c, w[, h[, d]], n) and one offset per
// spatial dimension (w[, h[, d]]).
void tma_load_im2col(uint32_t dst, const void* map, const int32_t* coords, int rank,
                     const uint16_t* offsets, uint32_t bar);
void tensormap_prefetch(const void* map);
// Thread-block clusters (a cluster's blocks run together, README): %cluster_ctarank and
// %cluster_nctarank; mapa (a shared address of the calling block to the shared::cluster address
// of the same offset in block `rank`); an arrival on the mbarrier at a shared::cluster address
// (another block's, or the caller's own); a TMA load multicast to the blocks of `mask`, at the
// same offsets of the data and of the mbarrier in each; barrier.cluster's arrive and wait (the
// wait released once every thread of the cluster that has not exited has arrived).
unsigned cluster_ctarank();
unsigned cluster_nctarank();
uint32_t mapa(uint32_t addr, unsigned rank);
void mbarrier_arrive_cluster(uint32_t addr);
void tma_load_multicast(uint32_t dst, const void* map, const int32_t* coords, int rank,
                        uint32_t bar, uint16_t mask);
void cluster_barrier_arrive();
void cluster_barrier_wait();
void named_barrier(int id, int count);
void setmaxnreg(int regs);
void wgmma_fence();
void wgmma(float* d, int n, uint64_t desc_a, uint64_t desc_b, bool trans_a, bool trans_b,
           MmaKind kind);
void wgmma_commit();
void wgmma_wait(int pending);
[[noreturn]] void trap(const char* what);
// Programmatic dependent launch: cudaGridDependencySynchronize (griddepcontrol.wait) and
// cudaTriggerProgrammaticLaunchCompletion (griddepcontrol.launch_dependents). Kernels run one
// after another here, so the wait has nothing to wait for; what is checked is the contract of a
// kernel launched to overlap the one before it: every thread waits before it exits, and before
// any access to device memory the emulator sees (cp.async, TMA, atomics; not plain loads and
// stores), which fails the launch naming `what`.
void grid_dependency_wait();
void grid_dependency_trigger();
void check_device_access(const char* what, const void* p);
// Shared-memory wavefronts and global sectors of ldmatrix and cp.async (README, "Memory
// access counts"): counted from the first launch where PLEXUS_EMU_ACCESS names a file (written
// at exit) or after count_accesses(true); access_counts gives a key's sums ("KERNEL smem BYTES
// ldmatrix" or "KERNEL smem BYTES cpN", N the copy size), false where it has none.
struct AccessCounts {
  unsigned long long ldmatrix = 0, ldmatrix_wavefronts = 0, ldmatrix_ideal = 0;
  unsigned long long cp_async = 0, cp_async_wavefronts = 0, cp_async_ideal = 0;
  unsigned long long sectors = 0, sectors_ideal = 0;
};
void count_accesses(bool on);
bool access_counts(const char* key, AccessCounts* out);

inline int lane_id() { return g_thread->linear & (kWarp - 1); }

}  // namespace plx_emu

#define threadIdx (::plx_emu::g_thread->idx)
#define blockIdx (::plx_emu::g_block_idx)
// The launch's block and grid sizes: variables, not macros as the indices are, because
// cudaLaunchConfig_t has members of these names.
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

inline void __syncthreads() { ::plx_emu::sync_block(); }
inline void cudaGridDependencySynchronize() {
  ::plx_emu::grid_dependency_wait();
}
inline void cudaTriggerProgrammaticLaunchCompletion() {
  ::plx_emu::grid_dependency_trigger();
}
inline int __syncthreads_or(int v) { return ::plx_emu::sync_block_or(v); }
inline int __syncthreads_count(int v) { return ::plx_emu::sync_block_count(v); }
inline int __syncthreads_and(int v) {
  return ::plx_emu::sync_block_count(v != 0) ==
         static_cast<int>(::blockDim.x * ::blockDim.y * ::blockDim.z);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::plx_emu::sync_warp(mask); }
inline size_t __cvta_generic_to_shared(const void* p) { return ::plx_emu::shared_address(p); }
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
// Cache-hinted loads (__ldcg: through L2 only) are plain loads here: blocks run one at a time.
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}
[[noreturn]] inline void __trap() { ::plx_emu::trap("__trap()"); }

template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::plx_emu::lane_id();
  const int base = lane & ~(width - 1);
  T out;
  ::plx_emu::shfl(mask, &v, &out, sizeof(T), base + (src & (width - 1)));
  return out;
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::plx_emu::lane_id();
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  T out;
  ::plx_emu::shfl(mask, &v, &out, sizeof(T), src);
  return out;
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::plx_emu::lane_id();
  int src = lane + static_cast<int>(delta);
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  T out;
  ::plx_emu::shfl(mask, &v, &out, sizeof(T), src);
  return out;
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::plx_emu::lane_id();
  int src = lane - static_cast<int>(delta);
  if (src < (lane & ~(width - 1))) src = lane;
  T out;
  ::plx_emu::shfl(mask, &v, &out, sizeof(T), src);
  return out;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  unsigned out = 0;
  const unsigned mine = pred ? 1u << ::plx_emu::lane_id() : 0u;
  for (int l = 0; l < 32; ++l) {
    if (!(mask & (1u << l))) continue;
    unsigned v;
    ::plx_emu::shfl(mask, &mine, &v, sizeof v, l);
    out |= v;
  }
  return out;
}

// ---- atomics: the fibers of a launch run one at a time, so a read-modify-write is atomic ----
template <class T>
inline T atomicAdd(T* p, T v) {
  ::plx_emu::check_device_access("atomicAdd", p);
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
inline T atomicSub(T* p, T v) {
  ::plx_emu::check_device_access("atomicSub", p);
  const T old = *p;
  *p = old - v;
  return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
  ::plx_emu::check_device_access("atomicMin", p);
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
template <class T>
inline T atomicMax(T* p, T v) {
  ::plx_emu::check_device_access("atomicMax", p);
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <class T>
inline T atomicCAS(T* p, T compare, T v) {
  ::plx_emu::check_device_access("atomicCAS", p);
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
template <class T>
inline T atomicExch(T* p, T v) {
  ::plx_emu::check_device_access("atomicExch", p);
  const T old = *p;
  *p = v;
  return old;
}
template <class T>
inline T atomicOr(T* p, T v) {
  ::plx_emu::check_device_access("atomicOr", p);
  const T old = *p;
  *p = old | v;
  return old;
}

// ---- arithmetic intrinsics ----
// The kernels are built with -ffp-contract=fast where the host has FMA (emu.cmake), as nvcc
// contracts a * b + c into one fused multiply-add by default; the _rn intrinsics are what CUDA
// code writes to forbid that, so each result passes through an empty asm that the compiler
// cannot see into and so cannot fuse with its neighbour.
template <class T>
inline T plx_emu_rounded(T v) {
  asm volatile("" : "+x"(v));
  return v;
}
inline float __fadd_rn(float a, float b) { return plx_emu_rounded(a + b); }
inline float __fsub_rn(float a, float b) { return plx_emu_rounded(a - b); }
inline float __fmul_rn(float a, float b) { return plx_emu_rounded(a * b); }
inline float __fdiv_rn(float a, float b) { return plx_emu_rounded(a / b); }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return plx_emu_rounded(1.0f / a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return plx_emu_rounded(a + b); }
inline double __dsub_rn(double a, double b) { return plx_emu_rounded(a - b); }
inline double __dmul_rn(double a, double b) { return plx_emu_rounded(a * b); }
inline double __ddiv_rn(double a, double b) { return plx_emu_rounded(a / b); }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline long long __double2ll_rn(double a) { return std::llrint(a); }
inline long long __float2ll_rn(float a) { return std::llrint(a); }
inline int __float2int_rn(float a) { return static_cast<int>(std::lrint(a)); }
inline float __int_as_float(int v) {
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}
inline int __float_as_int(float f) {
  int v;
  std::memcpy(&v, &f, sizeof v);
  return v;
}
inline unsigned __float_as_uint(float f) {
  unsigned v;
  std::memcpy(&v, &f, sizeof v);
  return v;
}
inline float __uint_as_float(unsigned v) {
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}
inline float __expf(float a) { return std::exp(a); }
inline float __logf(float a) { return std::log(a); }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v)); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}

// CUDA's global min/max for the integer types (device code calls them unqualified).
#define PLX_EMU_MINMAX(T)                               \
  inline T min(T a, T b) { return b < a ? b : a; }      \
  inline T max(T a, T b) { return a < b ? b : a; }
PLX_EMU_MINMAX(int)
PLX_EMU_MINMAX(unsigned)
PLX_EMU_MINMAX(long)
PLX_EMU_MINMAX(unsigned long)
PLX_EMU_MINMAX(long long)
PLX_EMU_MINMAX(unsigned long long)
#undef PLX_EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
