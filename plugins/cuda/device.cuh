// Device-side helpers shared by the CUDA plugin's kernels (included by ops/*.cu only).
//
// Element types: f32 is float, f16 is __half, bf16 is __nv_bfloat16 (the same bits as the SDK's
// half/bfloat16). 16-bit values are loaded into f32, computed in f32 and rounded to nearest even
// once on store, as the CPU plugin does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common.hpp"

namespace plexus::cuda {

using f16 = __half;
using bf16 = __nv_bfloat16;

// ---- dtype traits ----
template <class T>
struct DeviceDtype;
template <> struct DeviceDtype<float> { static constexpr plx_dtype value = PLX_F32; };
template <> struct DeviceDtype<f16> { static constexpr plx_dtype value = PLX_F16; };
template <> struct DeviceDtype<bf16> { static constexpr plx_dtype value = PLX_BF16; };
template <> struct DeviceDtype<double> { static constexpr plx_dtype value = PLX_F64; };
template <> struct DeviceDtype<int32_t> { static constexpr plx_dtype value = PLX_I32; };
template <> struct DeviceDtype<int64_t> { static constexpr plx_dtype value = PLX_I64; };
template <> struct DeviceDtype<uint8_t> { static constexpr plx_dtype value = PLX_U8; };
template <class T>
inline constexpr plx_dtype dtype_v = DeviceDtype<T>::value;

// The type arithmetic on T is done in: f32 for the 16-bit floats, T otherwise.
template <class T> struct Accum { using type = T; };
template <> struct Accum<f16> { using type = float; };
template <> struct Accum<bf16> { using type = float; };
template <class T>
using accum_t = typename Accum<T>::type;

// Whether x is finite (neither infinite nor NaN), from its bits: the same on the device and in
// the emulator, whatever the math headers declare.
__device__ __forceinline__ bool finite_f32(float x) {
  return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

template <class T>
__device__ __forceinline__ accum_t<T> to_accum(T v) {
  if constexpr (std::is_same_v<T, f16>) return __half2float(v);
  else if constexpr (std::is_same_v<T, bf16>) return __bfloat162float(v);
  else return v;
}
template <class T>
__device__ __forceinline__ T from_accum(accum_t<T> v) {
  if constexpr (std::is_same_v<T, f16>) return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, bf16>) return __float2bfloat16_rn(v);
  else return v;
}
template <class T>
__device__ __forceinline__ accum_t<T> load(const T* p, int64_t i) {
  return to_accum<T>(p[i]);
}
template <class T>
__device__ __forceinline__ void store(T* p, int64_t i, accum_t<T> v) {
  p[i] = from_accum<T>(v);
}

// Typed pointer to a tensor's data (the core checked dtypes when the kernel was created).
template <class T>
inline T* ptr(const plx_tensor& t) {
  return static_cast<T*>(t.data);
}

// ---- division by a divisor fixed at kernel creation ----
//
// Index math in 32 bits (n < 2^31, as every kernel's I = int32_t path guarantees): a GPU has no
// integer divider, and n / d with d only known at run time costs about twenty instructions,
// where an elementwise kernel's whole body is a few dozen. With d known when the kernel is
// created, the quotient is a multiply-high, an add and a shift (Granlund and Montgomery,
// "Division by invariant integers using multiplication", PLDI 1994): s = ⌈log2 d⌉ and
// m = ⌊2^32·(2^s − d) / d⌋ + 1 (< 2^32), then n / d = (umulhi(n, m) + n) >> s, exact for every
// n < 2^31 (the add cannot overflow: umulhi(n, m) < n). d = 1 gives m = 1, s = 0.
// tests/cuda/fast_div_test.cu checks it against `/` for divisors and numerators at the edges.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  // d in [1, 2^31); anything else keeps the divisor 1 (a kernel's int64 path, which does not
  // use it).
  explicit FastDiv(int64_t divisor) {
    if (divisor < 1 || divisor >= (int64_t{1} << 31)) return;
    d = static_cast<uint32_t>(divisor);
    while ((uint64_t{1} << s) < d) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, m) + n) >> s; }
  // q = n / d and r = n − q·d.
  __device__ __forceinline__ void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * d;
  }
  // The same for the kernels' int indices, n >= 0.
  __device__ __forceinline__ void divmod(int n, int& q, int& r) const {
    const uint32_t uq = div(static_cast<uint32_t>(n));
    q = static_cast<int>(uq);
    r = n - q * static_cast<int>(d);
  }
};

// ---- launches: programmatic dependent launch (compute capability 9.0 and up) ----
//
// Every kernel of the plugin goes through launch_kernel, which lets it start while the kernel
// before it on the stream is still finishing, where the device and the kernel's code allow
// (CUDA's programmatic stream serialization; in a captured graph a programmatic edge). Its
// blocks are then scheduled as the earlier kernel's last blocks leave the SMs, so that the gap
// between two kernels (the next grid's launch and set-up, a few microseconds: a good part of a
// small step such as simplecnn's at batch 128, whose kernels run 7 to 82 µs) overlaps the earlier
// kernel's tail instead of following it. In exchange every kernel synchronises itself:
//
// pdl_wait(): waits until the kernels this one depends on have completed and their writes are
// visible (griddepcontrol.wait). Every thread calls it before its first access to global memory
// that another kernel reads or writes; what comes before uses only the kernel's parameters,
// registers and shared memory.
// pdl_trigger(): lets the next kernel on the stream launch once every block of this one has
// called it or exited (griddepcontrol.launch_dependents). It orders no memory: the next kernel's
// pdl_wait waits for this one to complete.
// pdl_begin(): both, first in a kernel with nothing to do before its inputs are ready. Since a
// kernel triggers only after its own wait, at most two kernels of a stream are in flight: the
// running one and the next one's blocks, waiting.
//
// Both compile to nothing below sm_90 and do nothing in a kernel launched the ordinary way. The
// CUDA emulator checks that every thread of a kernel launched this way waits before it exits,
// and before any copy, TMA load or atomic on device memory (tests/cuda/emu/README.md).
__device__ __forceinline__ void pdl_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization where
// programmatic_launch(kernel) says so (common.hpp). A launch that CUDA refuses (a bad
// configuration, too much shared memory) throws; a fault while the kernel runs shows at the next
// synchronisation.
// A grid launched in thread-block clusters of `cluster` blocks along x (sm_90; grid.x a multiple
// of it): launch_kernel(kernel, ClusterGrid{grid, 2}, ...).
struct ClusterGrid {
  dim3 grid;
  unsigned cluster;
};

template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), ClusterGrid grid, dim3 block, size_t smem,
                   cudaStream_t stream, A&&... args) {
  const void* fn = reinterpret_cast<const void*>(kernel);
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = grid.cluster;
  attrs[1].val.clusterDim.y = 1;
  attrs[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid.grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  // The PDL attribute where programmatic_launch says so, the cluster's where it has several
  // blocks.
  const bool pdl = programmatic_launch(fn);
  cfg.attrs = pdl ? attrs : attrs + 1;
  cfg.numAttrs = (pdl ? 1u : 0u) + (grid.cluster > 1 ? 1u : 0u);
  if (cfg.numAttrs == 0) cfg.attrs = nullptr;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  if (e != cudaSuccess) throw_launch(e, fn);
}

template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   A&&... args) {
  launch_kernel(kernel, ClusterGrid{grid, 1}, block, smem, stream, std::forward<A>(args)...);
}

// ---- launch geometry ----
constexpr int kBlock = 256;
// Blocks for a grid-stride loop over n elements: enough to fill the GPU, capped so that huge n
// loops inside the kernel instead of launching millions of blocks.
inline unsigned grid_for(int64_t n, int block = kBlock) {
  const int64_t b = (n + block - 1) / block;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, int64_t{1} << 16));
}
#define PLX_GRID_STRIDE(i, n)                                                         \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---- errors found on the device (DeviceErrorRecord in common.hpp) ----
__device__ __forceinline__ void report_error(DeviceErrorRecord* r, int32_t code, long long a,
                                             long long b, long long c) {
  if (atomicCAS(&r->flag, 0, 1) == 0) {
    r->code = code;
    r->a = a;
    r->b = b;
    r->c = c;
    __threadfence_system();
  }
}

// ---- warp and block reductions (sum in accumulator type) ----
template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) {
    const A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = (w > v || w != w) ? w : v;  // NaN wins
  }
  return v;
}
// Sum over the block; every thread gets the result. `shared` holds 32 values of A.
// Deterministic: the order of additions depends only on the block size.
template <class A>
__device__ __forceinline__ A block_sum(A v, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  A t = lane < nwarps ? shared[lane] : A(0);
  t = warp_sum(t);
  return t;
}
// Cross-block reductions in one launch: every thread of every block calls this after writing
// its block's partial results; true, for the whole block, in the last of `blocks` blocks to
// arrive, which may then read every block's partials (through volatile or __ldcg, not L1:
// another block wrote them in this launch) and must reset *done to 0 for the next launch (BlockCounter, common.hpp,
// owns it). The count only says which block is last, so the results stay deterministic.
//
// Team: the threads that take part, the whole block by default (WholeBlock); a kernel whose warps
// specialise passes its own (the Hopper GEMM's consumer warp groups, whose producer has exited):
// rank() from 0 to size() - 1, and sync(), a barrier over exactly those threads.
struct WholeBlock {
  __device__ static int rank() { return static_cast<int>(threadIdx.x); }
  __device__ static int size() { return static_cast<int>(blockDim.x); }
  __device__ static void sync() { __syncthreads(); }
};
template <class Team = WholeBlock>
__device__ __forceinline__ bool last_block_arrives(unsigned* done, unsigned blocks) {
  __shared__ bool last;
  __threadfence();  // this thread's partials are visible before the count
  Team::sync();
  if (Team::rank() == 0) last = atomicAdd(done, 1u) == blocks - 1;
  Team::sync();
  if (last) __threadfence();
  return last;
}

// ---- split reductions finished inside the launch ----
//
// S blocks ("slices") each write an f32 partial of the same elements: slice z's partial of
// element i lies at part[z·zstride + off(i)] (off(i) < 0: no element). The slices' sums are
// finished in the launch, deterministically, in two levels, so that no block reads all S
// partials (the first version's last block read them one dependent load at a time, a tail that
// ran on one SM after the others had finished): the slices are grouped G = ⌈√S⌉ at a time; the
// last slice of group g to finish adds the group's partials in slice order into its first slot,
// and the last group to finish adds the group sums in group order. The result depends on S
// only, never on which block finishes when; for S <= 3 it is the slices' sum in slice order.
//
// Counters: split_sum_counters(S) per reduction, zero before the first launch (BlockCounter) and
// left zero by every launch.
__host__ __device__ constexpr unsigned split_sum_group(unsigned S) {
  unsigned g = 1;
  while (g * g < S) ++g;
  return g;
}
__host__ __device__ constexpr unsigned split_sum_counters(unsigned S) {
  const unsigned g = split_sum_group(S), groups = (S + g - 1) / g;
  return groups > 1 ? groups + 1 : 1;
}

// For each element i < count of this thread (i = rank + k·size of the Team), the sum of
// part[z·zstride + off(i)] over z = z0, z0 + dz, ... (n terms) in that order, from 0.f, passed
// to out(i, off(i), sum); kE elements at a time with kA slices read ahead, through L2 (not L1:
// other blocks wrote them in this launch). kE·kA = 8 loads in flight per thread: more made ptxas
// spill in some of the kernels that use it.
template <int kE, int kA, class Team, class Off, class Out>
__device__ __forceinline__ void ordered_sums_batched(const float* part, int64_t zstride,
                                                     unsigned z0, unsigned n, unsigned dz,
                                                     int count, Off off, Out out) {
  const int threads = Team::size();
  const int64_t step = static_cast<int64_t>(dz) * zstride;
  for (int base = Team::rank(); base < count; base += kE * threads) {
    int64_t o[kE];
    const float* p[kE];  // element e's partial of the next slice to read
    float s[kE];
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int i = base + e * threads;
      o[e] = i < count ? off(i) : int64_t{-1};
      p[e] = part + static_cast<int64_t>(z0) * zstride + (o[e] >= 0 ? o[e] : 0);
      s[e] = 0.f;
    }
    for (unsigned k = 0; k < n; k += kA) {  // the last round may hold fewer than kA slices
      float v[kA][kE];
#pragma unroll
      for (int a = 0; a < kA; ++a)
#pragma unroll
        for (int e = 0; e < kE; ++e) v[a][e] = o[e] >= 0 && k + a < n ? __ldcg(p[e] + a * step) : 0.f;
#pragma unroll
      for (int a = 0; a < kA; ++a)
#pragma unroll
        for (int e = 0; e < kE; ++e)
          if (k + a < n) s[e] += v[a][e];
#pragma unroll
      for (int e = 0; e < kE; ++e) p[e] += kA * step;
    }
#pragma unroll
    for (int e = 0; e < kE; ++e)
      if (o[e] >= 0) out(base + e * threads, o[e], s[e]);
  }
}
// ... with every thread's loads in flight for one element when the block has a thread per
// element (a column tile's 32 sums, a channel's one), two elements otherwise.
template <class Team, class Off, class Out>
__device__ __forceinline__ void block_ordered_sums(const float* part, int64_t zstride, unsigned z0,
                                                   unsigned n, unsigned dz, int count, Off off,
                                                   Out out) {
  if (count <= Team::size())
    ordered_sums_batched<1, 4, Team>(part, zstride, z0, n, dz, count, off, out);
  else
    ordered_sums_batched<2, 4, Team>(part, zstride, z0, n, dz, count, off, out);
}

// Every thread of slice z's block (of its Team) calls this after writing its partials; in the
// block that finishes the reduction it calls out(i, off(i), sum) for every element and returns
// true (that block may then do more of the launch's last work), elsewhere it returns false.
template <class Team = WholeBlock, class Off, class Out>
__device__ __forceinline__ bool split_sum(unsigned* counters, float* part, int64_t zstride,
                                          unsigned S, unsigned z, int count, Off off, Out out) {
  const unsigned G = split_sum_group(S), groups = (S + G - 1) / G;
  if (groups > 1) {
    const unsigned g = z / G, first = g * G, n = min(S, first + G) - first;
    if (!last_block_arrives<Team>(counters + g, n)) return false;
    if (n > 1)
      block_ordered_sums<Team>(part, zstride, first, n, 1, count, off,
                               [&](int, int64_t o, float s) {
                                 part[static_cast<int64_t>(first) * zstride + o] = s;
                               });
    if (Team::rank() == 0) counters[g] = 0;
  }
  unsigned* const final_count = counters + (groups > 1 ? groups : 0);
  if (!last_block_arrives<Team>(final_count, groups > 1 ? groups : S)) return false;
  if (groups > 1)
    block_ordered_sums<Team>(part, zstride, 0, groups, G, count, off, out);
  else
    block_ordered_sums<Team>(part, zstride, 0, S, 1, count, off, out);
  if (Team::rank() == 0) *final_count = 0;
  return true;
}

template <class A>
__device__ __forceinline__ A block_max(A v, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  A t = lane < nwarps ? shared[lane] : shared[0];
  return warp_max(t);
}

}  // namespace plexus::cuda
