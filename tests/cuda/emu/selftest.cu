// The CUDA emulator's own checks (tests/cuda/emu/README.md): that its threads, barriers, warp
// shuffles, launch checks (programmatic dependent launch among them), stream capture and the
// Tensor Core kernels' PTX (cp.async, ldmatrix, mma.sync; the Hopper GEMM's TMA, mbarriers,
// named barriers and wgmma), checked here against
// the PTX ISA's and the CUDA programming guide's own formulas ("element i of lane l is at row
// ..., column ...", "chunk x of row y lands at x ^ (y % 8)"), behave as CUDA specifies, so that a
// kernel passing on the emulator has passed something. Built by tests/cuda/emu/emu.cmake, run by
// ctest.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "plx_emu_numeric.hpp"

// The emulator's hook for EXPECT_FAULT, below (runtime.cpp).
namespace plx_emu {
void clear_fault();
}  // namespace plx_emu

namespace {

int g_failures = 0;
int* g_scratch = nullptr;  // device memory for the calls EXPECT_FAULT makes
#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "selftest.cu:%d: FAILED: %s\n", __LINE__, #cond);  \
      ++g_failures;                                                           \
    }                                                                         \
  } while (0)

// The emulator's faults are sticky, as a GPU's (runtime.cpp, "Faults"): a launch that must fail
// leaves every later call failing, reading the error does not clear it, and work queued after it
// does not run. Each expected fault is checked so and then cleared with the emulator's own hook,
// so that the selftest can go on (a process on a GPU could not).
#define EXPECT_FAULT(error)                                                                  \
  do {                                                                                     \
    EXPECT(cudaGetLastError() == (error));                                                 \
    EXPECT(cudaGetLastError() == (error));                                                 \
    EXPECT(cudaStreamSynchronize(nullptr) == (error));                                     \
    EXPECT(cudaMemsetAsync(g_scratch, 0, 4, nullptr) == (error));                          \
    ::plx_emu::clear_fault();                                                              \
    EXPECT(cudaGetLastError() == cudaSuccess);                                             \
  } while (0)

template <class T>
T* device_array(size_t n) {
  T* p = nullptr;
  EXPECT(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return p;
}

// A block sums its thread indices through shared memory and two barriers per step.
__global__ void block_sum_kernel(int* out) {
  __shared__ int s[256];
  s[threadIdx.x] = static_cast<int>(threadIdx.x + blockIdx.x * 1000);
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// Butterfly and tree sums, a broadcast within 16-lane groups, and an upward shift.
__global__ void shuffle_kernel(int* xor_sum, int* down_sum, int* bcast, int* up) {
  const int lane = threadIdx.x & 31;
  int v = lane + 1;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  xor_sum[threadIdx.x] = v;
  int d = lane + 1;
  for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
  down_sum[threadIdx.x] = d;
  bcast[threadIdx.x] = __shfl_sync(0xffffffffu, lane * 10, 3, 16);
  up[threadIdx.x] = __shfl_up_sync(0xffffffffu, lane, 1);
}

__global__ void vote_kernel(int* any, int* count) {
  const int a = __syncthreads_or(threadIdx.x == 77);
  const int c = __syncthreads_count(threadIdx.x % 3 == 0);
  if (threadIdx.x == 5) {
    *any = a;
    *count = c;
  }
}

// Threads past 100 exit; the rest still meet at the barrier.
__global__ void early_exit_kernel(int* out) {
  __shared__ int s[128];
  if (threadIdx.x >= 100) return;
  s[threadIdx.x] = 1;
  __syncthreads();
  if (threadIdx.x == 0) {
    int t = 0;
    for (int i = 0; i < 100; ++i) t += s[i];
    *out = t;
  }
}

// Half the warp waits for the whole warp at __syncwarp, the other half for the block at
// __syncthreads: neither barrier can complete.
__global__ void deadlock_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncwarp();
  } else {
    __syncthreads();
  }
  *out = 1;
}

// Lanes past 16 exit, then the others shuffle with a full mask.
__global__ void exited_lane_kernel(int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

__global__ void smem_kernel(float* out, int n) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = static_cast<float>(i);
  __syncthreads();
  if (threadIdx.x == 0) *out = buf[n - 1];
}

__global__ void add_one_kernel(int* p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *p += 1;
}

// ---- PTX ----

// Four 8x8 matrices of 16-bit values m·64 + r·8 + c in shared memory (rows of 16 elements, so
// each row starts 32 bytes apart); lane l addresses row l % 8 of matrix l / 8. Each lane writes
// its four registers, without and with .trans.
__global__ void ldmatrix_kernel(uint32_t* plain, uint32_t* trans) {
  extern __shared__ uint16_t mats[];
  const int lane = threadIdx.x;
  for (int i = lane; i < 4 * 8 * 16; i += 32) {
    const int m = i / 128, r = (i / 16) % 8, c = i % 16;
    mats[i] = static_cast<uint16_t>(c < 8 ? m * 64 + r * 8 + c : 0xDEAD);
  }
  __syncthreads();
  const uint32_t addr = ::plx_emu::shared_address(mats + (lane / 8) * 128 + (lane % 8) * 16);
  uint32_t r[4];
  ::plx_emu::ldmatrix(r, 4, addr, false);
  for (int i = 0; i < 4; ++i) plain[lane * 4 + i] = r[i];
  ::plx_emu::ldmatrix(r, 4, addr, true);
  for (int i = 0; i < 4; ++i) trans[lane * 4 + i] = r[i];
}

// One mma: each lane packs its fragments of A (16 x K) and B (K x 8), row-major 16-bit bit
// patterns or f32 (tf32) in global memory, by the PTX ISA's formulas, and writes D by C's.
__global__ void mma_kernel(const uint32_t* a, const uint32_t* b, float* d, int kind) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  uint32_t af[4], bf[2];
  if (kind == 2) {  // m16n8k8 .tf32: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
    for (int i = 0; i < 4; ++i) af[i] = a[(g + 8 * (i & 1)) * 8 + t + 4 * (i >> 1)];
    for (int i = 0; i < 2; ++i) bf[i] = b[(t + 4 * i) * 8 + g];  // b0 (t, g), b1 (t + 4, g)
  } else {  // m16n8k16: a_i at row g (+8 for i in 2,3,6,7), column 2t + (i & 1) (+8 for i >= 4)
    uint16_t ae[8], be[4];
    for (int i = 0; i < 8; ++i) {
      const int row = g + ((i >= 2 && i < 4) || i >= 6 ? 8 : 0);
      const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
      ae[i] = static_cast<uint16_t>(a[row * 16 + col]);
    }
    for (int i = 0; i < 4; ++i)  // b_i at row 2t + (i & 1) (+8 for i >= 2), column g
      be[i] = static_cast<uint16_t>(b[(2 * t + (i & 1) + (i >= 2 ? 8 : 0)) * 8 + g]);
    for (int j = 0; j < 4; ++j) af[j] = ae[2 * j] | static_cast<uint32_t>(ae[2 * j + 1]) << 16;
    for (int j = 0; j < 2; ++j) bf[j] = be[2 * j] | static_cast<uint32_t>(be[2 * j + 1]) << 16;
  }
  float c[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  ::plx_emu::mma(c, af, bf, static_cast<::plx_emu::MmaKind>(kind));
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = c[i];  // c_i
}

// Thread 0 copies 16 bytes into shared memory with cp.async and reads them before and after
// the wait; `zero` copies with src-size 0 (zero fill) instead.
__global__ void cp_async_kernel(const uint32_t* src, uint32_t* seen, bool zero) {
  extern __shared__ uint32_t buf[];
  if (threadIdx.x != 0) return;
  for (int i = 0; i < 4; ++i) buf[i] = 7;
  ::plx_emu::cp_async(::plx_emu::shared_address(buf), src, 16, zero ? 0 : 16);
  ::plx_emu::cp_async_commit();
  ::plx_emu::cp_async_commit();  // an empty group
  seen[0] = buf[0];
  ::plx_emu::cp_async_wait(1);  // the empty group may still be pending: the copy has landed
  for (int i = 0; i < 4; ++i) seen[1 + i] = buf[i];
}

// An ldmatrix in a block of 16 threads (the warp is not whole), and a cp.async past the end of
// the shared memory.
__global__ void half_warp_ldmatrix_kernel(uint32_t* out) {
  extern __shared__ uint16_t m[];
  uint32_t r[4];
  ::plx_emu::ldmatrix(r, 4, ::plx_emu::shared_address(m), false);
  out[threadIdx.x] = r[0];
}
__global__ void cp_async_out_of_range_kernel(const uint32_t* src) {
  extern __shared__ uint32_t buf[];
  ::plx_emu::cp_async(::plx_emu::shared_address(buf) + 64, src, 16, 16);
}

// ---- Hopper PTX ----

// The swizzles (CUDA programming guide, "TMA swizzle"; PTX ISA, "Swizzling modes"): the 16-byte
// chunk x of the `span`-byte row (128, 64 or 32) at shared address `row_addr` is stored at chunk
// x ^ ((row_addr / 128) % (span / 16)): the 128-byte swizzle's rows each have their own phase,
// the 64-byte swizzle's pairs of rows, the 32-byte swizzle's fours. Returns the shared address of
// byte `byte` (< span) of that row.
__host__ __device__ uint32_t swizzled(uint32_t row_addr, uint32_t byte, uint32_t span = 128) {
  return row_addr + ((((byte / 16) ^ ((row_addr / 128) % (span / 16))) * 16) | (byte % 16));
}

// Thread 0 loads one box of a tensor map with TMA at `c`, counted on an mbarrier, and copies the
// shared memory (from `dst_off` past the first 1024-byte boundary) out before the wait (`before`)
// and after it (`after`); `phases` gets the barrier's parity checks along the way.
__global__ void tma_kernel(const __grid_constant__ CUtensorMap map, int c0, int c1, int c2,
                           uint32_t dst_off, uint32_t bytes, uint16_t* before, uint16_t* after,
                           int* phases) {
  extern __shared__ unsigned char tma_smem[];
  if (threadIdx.x != 0) return;
  const uint32_t raw = ::plx_emu::shared_address(tma_smem);
  const uint32_t base = (raw + 1023) / 1024 * 1024;
  const uint32_t bar = base, dst = base + 1024 + dst_off;
  ::plx_emu::mbarrier_init(bar, 1);
  phases[0] = ::plx_emu::mbarrier_try_wait(bar, 1);  // the phase before the first: complete
  ::plx_emu::mbarrier_arrive(bar, bytes);
  const int32_t c[3] = {c0, c1, c2};
  ::plx_emu::tma_load(dst, &map, c, 3, bar);
  const unsigned char* d = tma_smem + (dst - raw);
  std::memcpy(before, d, bytes);
  phases[1] = ::plx_emu::mbarrier_try_wait(bar, 0);  // lands the copy, completes phase 0
  std::memcpy(after, d, bytes);
  phases[2] = ::plx_emu::mbarrier_try_wait(bar, 0);  // phase 0 stays complete in phase 1
}

// Thread 0 loads one im2col box of a 4-D map (coordinates c, w, h, n and offsets ow, oh), waits
// for it, and copies its `bytes` (from `dst_off` past the first 1024-byte boundary) to `out`.
__global__ void tma_im2col_kernel(const __grid_constant__ CUtensorMap map, int c, int w, int h,
                                  int n, int ow, int oh, uint32_t dst_off, uint32_t bytes,
                                  uint16_t* out) {
  extern __shared__ unsigned char tma_smem[];
  if (threadIdx.x != 0) return;
  const uint32_t raw = ::plx_emu::shared_address(tma_smem);
  const uint32_t base = (raw + 1023) / 1024 * 1024;
  const uint32_t bar = base, dst = base + 1024 + dst_off;
  ::plx_emu::mbarrier_init(bar, 1);
  ::plx_emu::mbarrier_arrive(bar, bytes);
  const int32_t co[4] = {c, w, h, n};
  const uint16_t off[2] = {static_cast<uint16_t>(ow), static_cast<uint16_t>(oh)};
  ::plx_emu::tma_load_im2col(dst, &map, co, 4, off, bar);
  while (!::plx_emu::mbarrier_try_wait(bar, 0)) {
  }
  std::memcpy(out, tma_smem + (dst - raw), bytes);
}

// mbarrier phases between two warps: warp 1 arrives twice (phases 0 and 1), warp 0 waits for each.
__global__ void mbarrier_phase_kernel(int* order) {
  extern __shared__ unsigned char bar_smem[];
  const uint32_t bar = ::plx_emu::shared_address(bar_smem);
  if (threadIdx.x == 0) ::plx_emu::mbarrier_init(bar, 32);
  __syncthreads();
  if (threadIdx.x < 32) {
    ::plx_emu::mbarrier_try_wait(bar, 0);
    if (threadIdx.x == 0) order[0] = order[2] + 1;  // after warp 1's first arrivals
    ::plx_emu::mbarrier_try_wait(bar, 1);
    if (threadIdx.x == 0) order[1] = order[3] + 1;
  } else {
    if (threadIdx.x == 32) order[2] = 10;
    ::plx_emu::mbarrier_arrive(bar, 0);
    __syncwarp();  // all 32 arrivals of phase 0 before any of phase 1
    if (threadIdx.x == 32) order[3] = 20;
    __syncwarp();
    ::plx_emu::mbarrier_arrive(bar, 0);
  }
}

// Waits for a phase nobody completes (a deadlock), or arrives on a barrier a plain store
// overwrote.
__global__ void mbarrier_fault_kernel(int overwrite) {
  extern __shared__ uint64_t bar_words[];
  if (threadIdx.x != 0) return;
  const uint32_t bar = ::plx_emu::shared_address(bar_words);
  ::plx_emu::mbarrier_init(bar, 2);
  if (overwrite) {
    bar_words[0] = 0;
    ::plx_emu::mbarrier_arrive(bar, 0);
  } else {
    ::plx_emu::mbarrier_arrive(bar, 0);
    ::plx_emu::mbarrier_try_wait(bar, 0);
  }
}

// Warps 1 and 2 meet at named barrier 1 (64 threads) and read each other's value; warp 0 exits.
__global__ void named_barrier_kernel(int* out) {
  __shared__ int v[96];
  if (threadIdx.x < 32) return;
  v[threadIdx.x] = static_cast<int>(threadIdx.x) * 3;
  ::plx_emu::named_barrier(1, 64);
  out[threadIdx.x - 32] = v[threadIdx.x < 64 ? threadIdx.x + 32 : threadIdx.x - 32];
}

// wgmma descriptor (PTX ISA, "Matrix Descriptor Format"): start, LBO, SBO (each >> 4, 14 bits),
// base offset 0, layout type in bits 62-63 (1, 2, 3: the 128-, 64- and 32-byte swizzles).
uint64_t wg_desc(uint32_t start, uint32_t lbo, uint32_t sbo, uint32_t span) {
  const uint64_t layout = span == 128 ? 1 : span == 64 ? 2 : 3;
  return uint64_t{(start & 0x3FFFF) >> 4} | uint64_t{(lbo & 0x3FFFF) >> 4} << 16 |
         uint64_t{(sbo & 0x3FFFF) >> 4} << 32 | layout << 62;
}

// One warp group: D (64 x 128, f32, starting at 0.5) += A (64 x 16) · B (16 x 128), bf16 values
// a[m][k], b[k][n] laid out in shared memory by the ISA's canonical swizzled layouts, rows of
// `span` bytes (128, 64 or 32) and atoms of 8 rows (8·span bytes):
//   K-major (a_kmajor / b_kmajor): rows of M or N (span / 2 of K), the wgmma's 16 K at bytes
//     32..63 of each row where the row has them (a start 32 bytes into the atom), else 0..31;
//     atoms 8·span bytes apart (SBO);
//   MN-major: rows of K (span / 2 of M or N), 8 rows per atom, the next 8 K rows an SBO of
//     8·span further, the next span / 2 of M or N an LBO of 16·span further.
// Each thread writes D by the accumulator fragment (warp w, lane l): d[4i + 2h + e] is row
// 16 w + l / 4 + 8 h, column 8 i + 2 (l % 4) + e.
__global__ void wgmma_kernel(const uint16_t* a, const uint16_t* b, float* d, int a_kmajor,
                             int b_kmajor, uint32_t span) {
  extern __shared__ unsigned char wg_smem[];
  const uint32_t raw = ::plx_emu::shared_address(wg_smem);
  const uint32_t base = (raw + 1023) / 1024 * 1024;
  const uint32_t sa = base, sb = base + 16384;
  const uint32_t atom = 8 * span, per_row = span / 2, lbo = 16 * span;
  const uint32_t koff = span >= 64 ? 32 : 0;
  auto put = [&](uint32_t addr, uint16_t v) { std::memcpy(wg_smem + (addr - raw), &v, 2); };
  if (threadIdx.x == 0) {
    for (uint32_t m = 0; m < 64; ++m)
      for (uint32_t k = 0; k < 16; ++k) {
        const uint16_t v = a[m * 16 + k];
        if (a_kmajor)
          put(swizzled(sa + (m / 8) * atom + (m % 8) * span, koff + 2 * k, span), v);
        else
          put(swizzled(sa + (m / per_row) * lbo + (k / 8) * atom + (k % 8) * span,
                       2 * (m % per_row), span),
              v);
      }
    for (uint32_t k = 0; k < 16; ++k)
      for (uint32_t n = 0; n < 128; ++n) {
        const uint16_t v = b[k * 128 + n];
        if (b_kmajor)
          put(swizzled(sb + (n / 8) * atom + (n % 8) * span, koff + 2 * k, span), v);
        else
          put(swizzled(sb + (n / per_row) * lbo + (k / 8) * atom + (k % 8) * span,
                       2 * (n % per_row), span),
              v);
      }
  }
  __syncthreads();
  const uint64_t da = a_kmajor ? wg_desc(sa + koff, 16, atom, span) : wg_desc(sa, lbo, atom, span);
  const uint64_t db = b_kmajor ? wg_desc(sb + koff, 16, atom, span) : wg_desc(sb, lbo, atom, span);
  float acc[64];
  for (float& x : acc) x = 0.5f;
  ::plx_emu::wgmma_fence();
  ::plx_emu::wgmma(acc, 128, da, db, !a_kmajor, !b_kmajor, ::plx_emu::MmaKind::kBF16);
  ::plx_emu::wgmma_commit();
  const float untouched = acc[0];  // before the wait: still the old value
  ::plx_emu::wgmma_wait(0);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  for (int i = 0; i < 16; ++i)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e)
        d[(16 * w + l / 4 + 8 * h) * 128 + 8 * i + 2 * (l % 4) + e] = acc[4 * i + 2 * h + e];
  if (untouched != 0.5f) d[0] = -1.f;
}
}  // namespace

// The memory access counts (count_accesses): one warp-wide cp.async of `bytes` a lane, lane l
// writing shared byte (l / per_row)·row_bytes + (l % per_row)·bytes and reading src + l·src_step,
// then one ldmatrix .x4 whose 32 rows lie ldm_row_bytes apart.
__global__ void access_kernel(const unsigned char* src, int bytes, int per_row, int row_bytes,
                              int src_step, int ldm_row_bytes) {
  extern __shared__ unsigned char access_smem[];
  const int l = threadIdx.x;
  const uint32_t base = ::plx_emu::shared_address(access_smem);
  ::plx_emu::cp_async(base + static_cast<uint32_t>((l / per_row) * row_bytes + (l % per_row) * bytes),
                      src + l * src_step, bytes, bytes);
  ::plx_emu::cp_async_commit();
  ::plx_emu::cp_async_wait(0);
  __syncthreads();
  uint32_t r[4];
  ::plx_emu::ldmatrix(r, 4, base + static_cast<uint32_t>(l * ldm_row_bytes), false);
}

// Programmatic dependent launch: a kernel that waits for the one before it, one that never
// waits, and one that adds to device memory before it waits.
__global__ void pdl_add_kernel(int* out) {
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  atomicAdd(out, 1);
}
__global__ void pdl_no_wait_kernel(int* out) {
  if (threadIdx.x == 0) out[1] = 7;  // a plain store: the emulator cannot see it, only the exit
}
__global__ void pdl_early_kernel(int* out) {
  __shared__ int local;
  if (threadIdx.x == 0) atomicExch(&local, 1);  // shared memory: allowed before the wait
  __syncthreads();
  atomicAdd(out, local);
  cudaGridDependencySynchronize();
}

cudaError_t launch_pdl(void (*k)(int*), int* out, int threads, bool programmatic) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = programmatic ? 1 : 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(2);
  cfg.blockDim = dim3(threads);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  ::plx_emu::name_next_launch("pdl kernel");
  return cudaLaunchKernelEx(&cfg, k, out);
}

// Launched with PLEXUS_EMU_FAULT_KERNEL naming it: faults instead of running.
// Thread-block clusters of two blocks: each block's warp 1 arrives on the other block's mbarrier
// (mapa: rank 0's twice a thread, rank 1's once, against counts of 32 and 64, so an arrival
// that lands on the caller's own barrier leaves rank 1's incomplete), warp 0 waits on its own; thread 0 of rank 0 multicasts one TMA box into both blocks,
// whose thread 0 each expect its bytes on a second barrier. out[block] = rank + 10 x the cluster's
// size + 100 once both barriers completed; the box each block received goes to box[block].
__global__ void cluster_kernel(const __grid_constant__ CUtensorMap map, uint32_t bytes,
                               int* out, uint16_t* box) {
  extern __shared__ unsigned char cl_smem[];
  const uint32_t raw = ::plx_emu::shared_address(cl_smem);
  const uint32_t base = (raw + 1023) / 1024 * 1024;
  const uint32_t bar = base, tma_bar = base + 8, dst = base + 1024;
  const unsigned rank = ::plx_emu::cluster_ctarank();
  if (threadIdx.x == 0) {
    ::plx_emu::mbarrier_init(bar, 32 * (rank + 1));  // the other block's warp 1
    ::plx_emu::mbarrier_init(tma_bar, 1);
  }
  ::plx_emu::cluster_barrier_arrive();  // the inits before any block touches another's barrier
  ::plx_emu::cluster_barrier_wait();
  if (threadIdx.x >= 32) {
    for (unsigned i = 0; i < 2 - rank; ++i)
      ::plx_emu::mbarrier_arrive_cluster(::plx_emu::mapa(bar, rank ^ 1u));
  } else {
    if (threadIdx.x == 0) {
      ::plx_emu::mbarrier_arrive(tma_bar, bytes);
      if (rank == 0) {
        const int32_t c[3] = {0, 0, 0};
        ::plx_emu::tma_load_multicast(dst, &map, c, 3, tma_bar, 0x3);
      }
      ::plx_emu::mbarrier_try_wait(tma_bar, 0);
      std::memcpy(box + blockIdx.x * (bytes / 2), cl_smem + (dst - raw), bytes);
    }
    ::plx_emu::mbarrier_try_wait(bar, 0);
    if (threadIdx.x == 0)
      out[blockIdx.x] = static_cast<int>(rank + 10 * ::plx_emu::cluster_nctarank()) + 100;
  }
  // No block exits while the other may still arrive on its barrier.
  ::plx_emu::cluster_barrier_arrive();
  ::plx_emu::cluster_barrier_wait();
}

// Rank 1 exits at once; rank 0 then arrives on rank 1's mbarrier: an error.
__global__ void cluster_exited_kernel(int) {
  extern __shared__ unsigned char cl_smem[];
  const uint32_t bar = ::plx_emu::shared_address(cl_smem);
  if (::plx_emu::cluster_ctarank() == 1) return;
  ::plx_emu::mbarrier_init(bar, 1);
  ::plx_emu::cluster_barrier_arrive();
  ::plx_emu::cluster_barrier_wait();
  ::plx_emu::mbarrier_arrive_cluster(::plx_emu::mapa(bar, 1));
}

__global__ void injected_fault_kernel(int* out) { *out = 1; }

int main() {
  // Read at the first launch: every launch of injected_fault_kernel faults (an illegal address).
  setenv("PLEXUS_EMU_FAULT_KERNEL", "no_such_kernel,injected_fault_*", 1);
  g_scratch = device_array<int>(1);
  {
    int* out = device_array<int>(1);
    *out = 0;
    std::fprintf(stderr, "selftest: the next launch must fail (a fault injected into it):\n");
    injected_fault_kernel<<<1, 1>>>(out);
    EXPECT_FAULT(cudaErrorIllegalAddress);
    EXPECT(*out == 0);
    cudaFree(out);
  }
  {
    int* out = device_array<int>(3);
    block_sum_kernel<<<3, 256>>>(out);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int b = 0; b < 3; ++b) EXPECT(out[b] == 255 * 256 / 2 + b * 1000 * 256);
    cudaFree(out);
  }
  {
    int *x = device_array<int>(64), *d = device_array<int>(64), *bc = device_array<int>(64),
        *up = device_array<int>(64);
    shuffle_kernel<<<1, 64>>>(x, d, bc, up);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int t = 0; t < 64; ++t) {
      const int lane = t & 31;
      EXPECT(x[t] == 32 * 33 / 2);
      if (lane == 0) EXPECT(d[t] == 32 * 33 / 2);
      EXPECT(bc[t] == (lane < 16 ? 3 : 19) * 10);
      EXPECT(up[t] == (lane == 0 ? 0 : lane - 1));
    }
    cudaFree(x), cudaFree(d), cudaFree(bc), cudaFree(up);
  }
  {
    int *any = device_array<int>(1), *count = device_array<int>(1);
    vote_kernel<<<1, 200>>>(any, count);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(*any == 1);
    EXPECT(*count == 67);
    cudaFree(any), cudaFree(count);
  }
  {
    int* out = device_array<int>(1);
    EXPECT(static_cast<unsigned>(*out) == 0xFFFFFFFFu);  // fresh device memory is garbage
    early_exit_kernel<<<1, 128>>>(out);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(*out == 100);
    std::fprintf(stderr, "selftest: the next two launches must fail (a deadlock, an exited lane):\n");
    deadlock_kernel<<<1, 32>>>(out);
    EXPECT_FAULT(cudaErrorLaunchFailure);
    exited_lane_kernel<<<1, 32>>>(out);
    EXPECT_FAULT(cudaErrorLaunchFailure);
    cudaFree(out);
  }
  {
    float* out = device_array<float>(1);
    const int n = 20000;  // 80,000 bytes: above the 48 KiB a launch gets without opting in
    std::fprintf(stderr, "selftest: the next launch must be refused (shared memory):\n");
    smem_kernel<<<1, 128, n * sizeof(float)>>>(out, n);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
    EXPECT(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                n * sizeof(float)) == cudaSuccess);
    smem_kernel<<<1, 128, n * sizeof(float)>>>(out, n);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(*out == static_cast<float>(n - 1));
    std::fprintf(stderr, "selftest: the next launch must be refused (block size):\n");
    smem_kernel<<<1, 2048>>>(out, 1);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration);
    cudaFree(out);
  }
  {
    int* p = device_array<int>(1);
    *p = 0;
    cudaStream_t s;
    EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    int* pinned = nullptr;
    EXPECT(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(int)) == cudaSuccess);
    int& v = *pinned;
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    add_one_kernel<<<2, 32, 0, s>>>(p);
    v = 5;
    EXPECT(cudaMemcpyAsync(p, &v, sizeof v, cudaMemcpyDefault, s) == cudaSuccess);
    add_one_kernel<<<1, 32, 0, s>>>(p);
    EXPECT(*p == 0);  // recorded, not run
    cudaGraph_t graph;
    EXPECT(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    cudaGraphExec_t exec;
    EXPECT(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    EXPECT(cudaGraphLaunch(exec, s) == cudaSuccess);
    EXPECT(*p == 6);
    v = 10;  // a graph copies from the address it captured, read when it runs
    EXPECT(cudaGraphLaunch(exec, s) == cudaSuccess);
    EXPECT(*p == 11);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    // An allocation or a synchronisation invalidates the capture.
    std::fprintf(stderr, "selftest: the next capture must be invalidated:\n");
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    void* q = nullptr;
    EXPECT(cudaMalloc(&q, 16) == cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    // So does a copy from or to pageable memory (a graph's copies take pinned memory), either way.
    int pageable = 3;
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    EXPECT(cudaMemcpyAsync(p, &pageable, sizeof pageable, cudaMemcpyDefault, s) == cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    EXPECT(cudaMemcpyAsync(&pageable, p, sizeof pageable, cudaMemcpyDefault, s) == cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    EXPECT(pageable == 3);
    // Outside a capture the copy runs.
    EXPECT(cudaMemcpyAsync(&pageable, p, sizeof pageable, cudaMemcpyDefault, s) == cudaSuccess);
    EXPECT(pageable == 11);
    (void)cudaGetLastError();
    cudaStreamDestroy(s);
    cudaFreeHost(pinned);
    cudaFree(p);
  }
  {
    // Stable by the key bits [0, 4): equal keys keep their order.
    const int n = 6;
    unsigned* k_in = device_array<unsigned>(n);
    unsigned* k_out = device_array<unsigned>(n);
    int* v_in = device_array<int>(n);
    int* v_out = device_array<int>(n);
    const unsigned keys[n] = {3, 1, 0x13, 2, 1, 0};
    for (int i = 0; i < n; ++i) k_in[i] = keys[i], v_in[i] = i;
    size_t bytes = 0;
    EXPECT(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k_in, k_out, v_in, v_out, n, 0, 4) == cudaSuccess);
    void* tmp = nullptr;
    EXPECT(cudaMalloc(&tmp, bytes) == cudaSuccess);
    EXPECT(cub::DeviceRadixSort::SortPairs(tmp, bytes, k_in, k_out, v_in, v_out, n, 0, 4) == cudaSuccess);
    const int order[n] = {5, 1, 4, 3, 0, 2};  // keys 0, 1, 1, 2, 3, 0x13 (3 in the low bits)
    for (int i = 0; i < n; ++i) EXPECT(v_out[i] == order[i]);
    cudaFree(tmp), cudaFree(k_in), cudaFree(k_out), cudaFree(v_in), cudaFree(v_out);
  }
  {
    // ldmatrix: lane l holds row l / 4, elements 2 (l % 4) and + 1 of each matrix (low half
    // first); with .trans, element l / 4 of rows 2 (l % 4) and + 1.
    uint32_t* plain = device_array<uint32_t>(128);
    uint32_t* trans = device_array<uint32_t>(128);
    ldmatrix_kernel<<<1, 32, 4 * 8 * 16 * sizeof(uint16_t)>>>(plain, trans);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m) {
        const uint32_t r = l / 4, c = 2 * (l % 4), base = m * 64;
        EXPECT(plain[l * 4 + m] == ((base + r * 8 + c) | (base + r * 8 + c + 1) << 16));
        EXPECT(trans[l * 4 + m] == ((base + c * 8 + r) | (base + (c + 1) * 8 + r) << 16));
      }
    cudaFree(plain), cudaFree(trans);
  }
  {
    // mma: D = A B + C with small integers (exact in every type), each kind against a direct
    // product.
    for (int kind = 0; kind < 3; ++kind) {
      const int K = kind == 2 ? 8 : 16;
      uint32_t* a = device_array<uint32_t>(16 * 16);
      uint32_t* b = device_array<uint32_t>(16 * 8);
      float* d = device_array<float>(16 * 8);
      std::vector<float> av(16 * K), bv(K * 8);
      auto bits = [&](float v) -> uint32_t {
        if (kind == 0) return __half_as_ushort(__half(v));
        if (kind == 1) return __bfloat16_as_ushort(__nv_bfloat16(v));
        uint32_t u;
        std::memcpy(&u, &v, sizeof u);
        return u;
      };
      for (int i = 0; i < 16 * K; ++i) av[i] = static_cast<float>((i * 7) % 11 - 5), a[i] = bits(av[i]);
      for (int i = 0; i < K * 8; ++i) bv[i] = static_cast<float>((i * 5) % 9 - 4), b[i] = bits(bv[i]);
      mma_kernel<<<1, 32>>>(a, b, d, kind);
      EXPECT(cudaGetLastError() == cudaSuccess);
      int bad = 0;
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c) {
          float want = 0.5f;
          for (int k = 0; k < K; ++k) want += av[r * K + k] * bv[k * 8 + c];
          bad += d[r * 8 + c] != want;
        }
      EXPECT(bad == 0);
      cudaFree(a), cudaFree(b), cudaFree(d);
    }
  }
  {
    // The TF32 roundings (PTX ISA, cvt: .rna ties away from zero, sm_80's; .rn ties to even,
    // sm_90's and what the emulated kernels use), as bits: {f32, rna, rn}.
    const uint32_t cases[][3] = {
        {0x3f800000u, 0x3f800000u, 0x3f800000u},  // 1: exact
        {0x3f801000u, 0x3f802000u, 0x3f800000u},  // a tie, even last kept bit: rn down
        {0x3f803000u, 0x3f804000u, 0x3f804000u},  // a tie, odd last kept bit: both up
        {0xbf801000u, 0xbf802000u, 0xbf800000u},  // a negative tie: rna away from zero
        {0x3f801001u, 0x3f802000u, 0x3f802000u},  // just above half: up
        {0x3f800fffu, 0x3f800000u, 0x3f800000u},  // just below half: down
        {0x00001000u, 0x00002000u, 0x00000000u},  // a subnormal tie
        {0x7f7fffffu, 0x7f800000u, 0x7f800000u},  // the largest finite: carries to Inf
        {0x7f800000u, 0x7f800000u, 0x7f800000u},  // Inf
        {0xffc00001u, 0xffc00001u, 0xffc00001u},  // NaN, as it is
    };
    for (const auto& c : cases) {
      float f;
      std::memcpy(&f, &c[0], sizeof f);
      EXPECT(::plx_emu::tf32_bits(f) == c[1]);
      EXPECT(::plx_emu::tf32_bits_rn(f) == c[2]);
    }
  }
  {
    // cp.async lands at the wait that retires its group (PLEXUS_EMU_CP_ASYNC unset: late); a
    // src-size of 0 fills zeros.
    uint32_t* src = device_array<uint32_t>(4);
    uint32_t* seen = device_array<uint32_t>(5);
    for (int i = 0; i < 4; ++i) src[i] = 100 + i;
    cp_async_kernel<<<1, 32, 16>>>(src, seen, false);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(seen[0] == 7);
    for (int i = 0; i < 4; ++i) EXPECT(seen[1 + i] == 100u + i);
    cp_async_kernel<<<1, 32, 16>>>(src, seen, true);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int i = 0; i < 4; ++i) EXPECT(seen[1 + i] == 0);
    std::fprintf(stderr, "selftest: the next two launches must fail (a half warp's ldmatrix, a "
                         "cp.async past the shared memory):\n");
    half_warp_ldmatrix_kernel<<<1, 16, 256>>>(seen);
    EXPECT_FAULT(cudaErrorLaunchFailure);
    cp_async_out_of_range_kernel<<<1, 32, 64>>>(src);
    EXPECT_FAULT(cudaErrorLaunchFailure);
    cudaFree(src), cudaFree(seen);
  }
  {
    // TMA: a (64, 16, 1) box of a (100, 30, 2) bf16 tensor (rows padded to 208 bytes) at
    // (64, 20, 1), partly past the tensor's edges, into shared memory 128 bytes past a 1024-byte
    // boundary (the swizzle pattern starts at row 1 there). Late (the default), the bytes land
    // at the wait; the box's rows follow the 128-byte swizzle, out-of-bounds elements are zero,
    // and the barrier completes with the whole box's bytes counted.
    const int X = 100, Y = 30, Z = 2;
    uint16_t* g = device_array<uint16_t>(104 * Y * Z);
    for (int z = 0; z < Z; ++z)
      for (int y = 0; y < Y; ++y)
        for (int x = 0; x < 104; ++x)
          g[(z * Y + y) * 104 + x] = static_cast<uint16_t>(1 + x + 100 * y + 3000 * z);
    CUtensorMap map;
    const cuuint64_t dims[3] = {X, Y, Z}, strides[2] = {208, 208 * Y};
    const cuuint32_t box[3] = {64, 16, 1}, es[3] = {1, 1, 1};
    auto encode = [&](const cuuint64_t* st, const cuuint32_t* bx, CUtensorMapSwizzle sw) {
      return cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, g, dims, st, bx, es,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    };
    std::fprintf(stderr,
                 "selftest: the next three tensor maps must be refused (a stride of 200 "
                 "bytes, a 256-byte inner box with the 128B swizzle, a batch stride "
                 "inside a matrix):\n");
    const cuuint64_t bad_stride[2] = {200, 200 * Y}, bad_batch[2] = {208, 208 * 8};
    const cuuint32_t wide[3] = {128, 16, 1};
    EXPECT(encode(bad_stride, box, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(encode(strides, wide, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(encode(bad_batch, box, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);
    // The same box with the 128-byte swizzle, and half its width (32 elements, 64-byte rows) with
    // the 64-byte swizzle, whose pairs of rows share a phase.
    const uint32_t bytes = 64 * 16 * 2;
    uint16_t* before = device_array<uint16_t>(bytes / 2);
    uint16_t* after = device_array<uint16_t>(bytes / 2);
    int* phases = device_array<int>(3);
    for (const uint32_t span : {128u, 64u}) {
      const uint32_t cols = span / 2, box_bytes = cols * 16 * 2;
      const cuuint32_t bx[3] = {cols, 16, 1};
      EXPECT(encode(strides, bx,
                    span == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B) ==
             CUDA_SUCCESS);
      tma_kernel<<<1, 32, 8192>>>(map, 64, 20, 1, 128, box_bytes, before, after, phases);
      EXPECT(cudaGetLastError() == cudaSuccess);
      for (int i = 0; i < 3; ++i) EXPECT(phases[i] == 1);
      int unlanded = 0, bad = 0;
      for (uint32_t i = 0; i < box_bytes / 2; ++i) unlanded += before[i] == 0xFFFF;
      const uint32_t dst = 1024 * 1000 + 128;  // any address with the same place in the pattern
      for (uint32_t r = 0; r < 16; ++r)
        for (uint32_t c = 0; c < cols; ++c) {
          const uint32_t x = 64 + c, y = 20 + r;
          const uint16_t want = x < X && y < Y ? static_cast<uint16_t>(1 + x + 100 * y + 3000) : 0;
          bad += after[(swizzled(dst + span * r, 2 * c, span) - dst) / 2] != want;
        }
      EXPECT(unlanded == static_cast<int>(box_bytes / 2));
      EXPECT(bad == 0);
    }
    cudaFree(g), cudaFree(before), cudaFree(after), cudaFree(phases);
  }
  {
    // TMA im2col (PTX ISA, "im2col mode"), against the convolution it serves, written out
    // independently: a box's row p is the output pixel p places after the first (in the order
    // n, oh, ow over OH x OW outputs, which the bounding box implies), read at its filter base
    // (ow·s + lower, oh·s + lower) plus the offsets; pixels outside the image, images past the
    // last and channels past C are zeros. (a) a 3x3 convolution of stride 1, padding 1 on
    // (N 2, H 5, W 6, C 64) bf16: 40 rows of all 64 channels (128 bytes, 128B swizzle) from
    // output pixel 53 (image 1, oh 3, ow 5: the base (4, 2)) at the tap (kw 2, kh 0), so past
    // the 60th pixel into a third image; (b) stride 2 on (1, 7, 7, 64), rows of 16 channels from
    // channel 56 (8 past C), no swizzle, 12 rows from output pixel 2 at the tap (1, 2); (c) (a)
    // with 32 channels, in rows of 64 bytes with the 64-byte swizzle.
    struct Case {
      int N, H, W, C, s, pad, k, cpp, ppc, c0, start, offw, offh;
      CUtensorMapSwizzle sw;
    };
    const Case cases[3] = {{2, 5, 6, 64, 1, 1, 3, 64, 40, 0, 53, 2, 0, CU_TENSOR_MAP_SWIZZLE_128B},
                           {1, 7, 7, 64, 2, 1, 3, 16, 12, 56, 2, 1, 2, CU_TENSOR_MAP_SWIZZLE_NONE},
                           {2, 5, 6, 32, 1, 1, 3, 32, 40, 0, 53, 2, 0, CU_TENSOR_MAP_SWIZZLE_64B}};
    for (const Case& k : cases) {
      const size_t elems = static_cast<size_t>(k.N) * k.H * k.W * k.C;
      uint16_t* g = device_array<uint16_t>(elems);
      for (size_t i = 0; i < elems; ++i) g[i] = static_cast<uint16_t>(1 + i);
      const cuuint64_t dims[4] = {static_cast<cuuint64_t>(k.C), static_cast<cuuint64_t>(k.W),
                                  static_cast<cuuint64_t>(k.H), static_cast<cuuint64_t>(k.N)};
      const cuuint64_t st[3] = {2ull * k.C, 2ull * k.C * k.W, 2ull * k.C * k.W * k.H};
      const int lo[2] = {-k.pad, -k.pad}, up[2] = {k.pad - (k.k - 1), k.pad - (k.k - 1)};
      const cuuint32_t es[4] = {1, static_cast<cuuint32_t>(k.s), static_cast<cuuint32_t>(k.s), 1};
      CUtensorMap map;
      auto encode = [&](const int* lower, cuuint32_t ppc) {
        return cuTensorMapEncodeIm2col(
            &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, g, dims, st, lower, up,
            static_cast<cuuint32_t>(k.cpp), ppc, es, CU_TENSOR_MAP_INTERLEAVE_NONE, k.sw,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      };
      if (&k == cases) {
        std::fprintf(stderr,
                     "selftest: the next two im2col maps must be refused (a corner of "
                     "-129 at rank 4, 1025 pixels per column):\n");
        const int far[2] = {-129, -1};
        EXPECT(encode(far, 40) == CUDA_ERROR_INVALID_VALUE);
        EXPECT(encode(lo, 1025) == CUDA_ERROR_INVALID_VALUE);
      }
      EXPECT(encode(lo, static_cast<cuuint32_t>(k.ppc)) == CUDA_SUCCESS);
      const int OH = (k.H + 2 * k.pad - k.k) / k.s + 1, OW = (k.W + 2 * k.pad - k.k) / k.s + 1;
      const int q0 = k.start % (OH * OW);
      const int w0 = (q0 % OW) * k.s - k.pad, h0 = (q0 / OW) * k.s - k.pad;
      const uint32_t bytes = static_cast<uint32_t>(k.cpp * k.ppc * 2);
      uint16_t* out = device_array<uint16_t>(bytes / 2);
      tma_im2col_kernel<<<1, 32, 1024 + 1024 + 128 + bytes>>>(
          map, k.c0, w0, h0, k.start / (OH * OW), k.offw, k.offh, 128, bytes, out);
      EXPECT(cudaGetLastError() == cudaSuccess);
      const uint32_t dst = 1024 * 1000 + 128;  // the same place in the swizzle pattern
      int bad = 0, nonzero = 0, zero = 0;
      for (int p = 0; p < k.ppc; ++p) {
        const int q = k.start + p, n = q / (OH * OW), oh = q % (OH * OW) / OW, ow = q % OW;
        const int ih = oh * k.s - k.pad + k.offh, iw = ow * k.s - k.pad + k.offw;
        for (int j = 0; j < k.cpp; ++j) {
          const int c = k.c0 + j;
          const bool in = n < k.N && ih >= 0 && ih < k.H && iw >= 0 && iw < k.W && c < k.C;
          const uint16_t want =
              in ? static_cast<uint16_t>(1 +
                                         ((static_cast<size_t>(n) * k.H + ih) * k.W + iw) * k.C + c)
                 : 0;
          const uint32_t span = static_cast<uint32_t>(2 * k.cpp);  // a swizzled row: the box's
          const uint32_t at =
              k.sw != CU_TENSOR_MAP_SWIZZLE_NONE
                  ? (swizzled(dst + span * p, 2 * static_cast<uint32_t>(j), span) - dst) / 2
                  : static_cast<uint32_t>(p * k.cpp + j);
          bad += out[at] != want;
          (want ? nonzero : zero) += 1;
        }
      }
      EXPECT(bad == 0);
      EXPECT(nonzero > 0);
      EXPECT(zero > 0);
      cudaFree(out);
      if (&k == cases) {
        // A tiled copy of an im2col map, and an im2col copy whose filter base lies outside the
        // bounding box (w 5 past its last position 4), trap.
        std::fprintf(stderr,
                     "selftest: the next two launches must fail (an im2col map in a "
                     "tiled copy, a filter base outside the bounding box):\n");
        uint16_t* before = device_array<uint16_t>(64);
        int* phases = device_array<int>(3);
        tma_kernel<<<1, 32, 8192>>>(map, 0, 0, 0, 0, 128, before, before, phases);
        EXPECT_FAULT(cudaErrorLaunchFailure);
        uint16_t* o2 = device_array<uint16_t>(bytes / 2);
        tma_im2col_kernel<<<1, 32, 1024 + 1024 + 128 + bytes>>>(map, 0, 5, 0, 0, 0, 0, 128, bytes,
                                                                o2);
        EXPECT_FAULT(cudaErrorLaunchFailure);
        cudaFree(before), cudaFree(phases), cudaFree(o2);
      }
      cudaFree(g);
    }
  }
  {
    // mbarrier phases: warp 0 waits for each of warp 1's two rounds of arrivals.
    int* order = device_array<int>(4);
    mbarrier_phase_kernel<<<1, 64, 16>>>(order);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(order[0] == 11);
    EXPECT(order[1] == 21);
    std::fprintf(stderr,
                 "selftest: the next two launches must fail (a phase nobody completes, an "
                 "mbarrier overwritten by a plain store):\n");
    mbarrier_fault_kernel<<<1, 32, 16>>>(0);
    EXPECT_FAULT(cudaErrorLaunchFailure);
    mbarrier_fault_kernel<<<1, 32, 16>>>(1);
    EXPECT_FAULT(cudaErrorLaunchFailure);
    // A named barrier for two of three warps, the third exited.
    int* out = device_array<int>(64);
    named_barrier_kernel<<<1, 96>>>(out);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int t = 32; t < 96; ++t) EXPECT(out[t - 32] == (t < 64 ? t + 32 : t - 32) * 3);
    cudaFree(order), cudaFree(out);
  }
  {
    // wgmma m64n128k16 (bf16) in every operand layout and swizzle against a direct product:
    // small integers, exact in bf16 and f32.
    uint16_t* a = device_array<uint16_t>(64 * 16);
    uint16_t* b = device_array<uint16_t>(16 * 128);
    float* d = device_array<float>(64 * 128);
    std::vector<float> av(64 * 16), bv(16 * 128);
    for (int i = 0; i < 64 * 16; ++i) {
      av[i] = static_cast<float>(((i / 16) * 7 + (i % 16) * 3) % 9 - 4);
      a[i] = __bfloat16_as_ushort(__nv_bfloat16(av[i]));
    }
    for (int i = 0; i < 16 * 128; ++i) {
      bv[i] = static_cast<float>(((i / 128) * 5 + (i % 128) * 11) % 7 - 3);
      b[i] = __bfloat16_as_ushort(__nv_bfloat16(bv[i]));
    }
    EXPECT(cudaFuncSetAttribute(wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 40000) ==
           cudaSuccess);
    for (int layout = 0; layout < 12; ++layout) {
      wgmma_kernel<<<1, 128, 40000>>>(a, b, d, layout & 1, (layout >> 1) & 1, 128u >> (layout / 4));
      EXPECT(cudaGetLastError() == cudaSuccess);
      int bad = 0;
      for (int m = 0; m < 64; ++m)
        for (int n = 0; n < 128; ++n) {
          float want = 0.5f;
          for (int k = 0; k < 16; ++k) want += av[m * 16 + k] * bv[k * 128 + n];
          bad += d[m * 128 + n] != want;
        }
      EXPECT(bad == 0);
    }
    cudaFree(a), cudaFree(b), cudaFree(d);
  }
  {
    int* out = device_array<int>(2);
    *out = 0;
    EXPECT(launch_pdl(pdl_add_kernel, out, 64, true) == cudaSuccess);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(*out == 128);
    cudaFuncAttributes fa{};
    EXPECT(cudaFuncGetAttributes(&fa, reinterpret_cast<const void*>(pdl_add_kernel)) ==
           cudaSuccess);
    EXPECT(fa.ptxVersion >= 90);
    const char* name = nullptr;
    EXPECT(cudaFuncGetName(&name, reinterpret_cast<const void*>(pdl_add_kernel)) == cudaSuccess);
    EXPECT(name && std::strcmp(name, "pdl kernel") == 0);
    std::fprintf(stderr,
                 "selftest: the next two launches must fail (no wait before the exit, an "
                 "atomic on device memory before the wait):\n");
    EXPECT(launch_pdl(pdl_no_wait_kernel, out, 32, true) == cudaSuccess);
    EXPECT_FAULT(cudaErrorLaunchFailure);
    EXPECT(launch_pdl(pdl_early_kernel, out, 32, true) == cudaSuccess);
    EXPECT_FAULT(cudaErrorLaunchFailure);
    // Launched the ordinary way, neither kernel has anything to wait for.
    *out = 0;
    EXPECT(launch_pdl(pdl_no_wait_kernel, out, 32, false) == cudaSuccess);
    EXPECT(launch_pdl(pdl_early_kernel, out, 32, false) == cudaSuccess);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(out[0] == 64 && out[1] == 7);
    // The emulator knows two launch attributes (this one and the cluster's dimensions); any
    // other is refused, not ignored.
    cudaLaunchAttribute other{};
    other.id = static_cast<cudaLaunchAttributeID>(2);  // cooperative
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    cfg.attrs = &other;
    cfg.numAttrs = 1;
    std::fprintf(stderr,
                 "selftest: the next launch must be refused (an attribute not modelled):\n");
    EXPECT(cudaLaunchKernelEx(&cfg, pdl_add_kernel, out) == cudaErrorInvalidValue);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
    cudaFree(out);
  }
  {
    // Memory access counts, by the README's model: 32 banks of 4 bytes, a request per 128 bytes
    // of lanes, one wavefront per word a bank serves; 32-byte sectors. Each case launches with
    // its own shared memory size, which keys its counts.
    unsigned char* src = device_array<unsigned char>(4096);
    ::plx_emu::count_accesses(true);
    struct Case {
      int bytes, per_row, row_bytes, src_step, ldm_row_bytes, smem;
      unsigned long long cp_waves, cp_ideal, sectors, sectors_ideal, ldm_waves;
    };
    const Case cases[] = {
        // a column of 32 rows 80 bytes apart: rows 8 apart share banks (4 wavefronts); 128
        // contiguous bytes (4 sectors); ldmatrix rows 64 bytes apart: two of the eight bank
        // groups, four rows each (4 wavefronts a matrix)
        {4, 1, 80, 4, 64, 4096, 4, 1, 4, 4, 16},
        // 8 rows of 4 consecutive words: 32 banks; a sector a lane; ldmatrix rows 80 apart: 1 each
        {4, 4, 80, 32, 80, 4160, 1, 1, 32, 4, 4},
        // 16-byte copies, 4 a row of 80 bytes: each 8-lane request's second row wraps onto the
        // first's first chunk (2 wavefronts each); 512 contiguous bytes (16 sectors)
        {16, 4, 80, 16, 80, 4224, 8, 4, 16, 16, 4},
        // the same rows 64 bytes apart: 4 requests of one wavefront
        {16, 4, 64, 16, 80, 4288, 4, 4, 16, 16, 4},
    };
    for (const Case& c : cases) {
      access_kernel<<<1, 32, c.smem>>>(src, c.bytes, c.per_row, c.row_bytes, c.src_step,
                                       c.ldm_row_bytes);
      EXPECT(cudaGetLastError() == cudaSuccess);
      const std::string key = "access_kernel smem " + std::to_string(c.smem);
      ::plx_emu::AccessCounts cp, ldm;
      EXPECT(::plx_emu::access_counts((key + " cp" + std::to_string(c.bytes)).c_str(), &cp));
      EXPECT(::plx_emu::access_counts((key + " ldmatrix").c_str(), &ldm));
      EXPECT(cp.cp_async == 1);
      EXPECT(cp.cp_async_wavefronts == c.cp_waves);
      EXPECT(cp.cp_async_ideal == c.cp_ideal);
      EXPECT(cp.sectors == c.sectors);
      EXPECT(cp.sectors_ideal == c.sectors_ideal);
      EXPECT(ldm.ldmatrix == 4 && ldm.ldmatrix_ideal == 4);
      EXPECT(ldm.ldmatrix_wavefronts == c.ldm_waves);
    }
    ::plx_emu::count_accesses(false);
    access_kernel<<<1, 32, 4352>>>(src, 4, 1, 4, 4, 16);
    ::plx_emu::AccessCounts none;
    EXPECT(!::plx_emu::access_counts("access_kernel smem 4352 cp4", &none));
    cudaFree(src);
  }
  {
    // Thread-block clusters: launches in clusters of 2 (the grid whole clusters), the blocks of
    // a cluster running together, remote mbarrier arrivals and a multicast TMA box.
    const uint32_t X = 64, Y = 8;
    uint16_t* g = device_array<uint16_t>(X * Y);
    for (uint32_t i = 0; i < X * Y; ++i) g[i] = static_cast<uint16_t>(i + 1);
    CUtensorMap map;
    const cuuint64_t dims[3] = {X, Y, 1}, strides[2] = {X * 2, X * Y * 2};
    const cuuint32_t box[3] = {64, 8, 1}, es[3] = {1, 1, 1};
    EXPECT(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, g, dims, strides, box,
                                  es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
    const uint32_t bytes = X * Y * 2;
    int* out = device_array<int>(4);
    uint16_t* got = device_array<uint16_t>(4 * X * Y);
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 2;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(4);
    cfg.blockDim = dim3(64);
    cfg.dynamicSmemBytes = 4096;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    EXPECT(cudaLaunchKernelEx(&cfg, cluster_kernel, map, bytes, out, got) == cudaSuccess);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int b = 0; b < 4; ++b) EXPECT(out[b] == b % 2 + 20 + 100);
    int wrong = 0;
    for (int b = 0; b < 4; ++b)
      for (uint32_t i = 0; i < X * Y; ++i) wrong += got[b * X * Y + i] != g[i];
    EXPECT(wrong == 0);
    // As many clusters as the 4 emulated SMs hold: 218 KiB blocks one an SM, 4 KiB ones 5 an SM
    // (2,048 threads of 384).
    int n = 0;
    cfg.blockDim = dim3(384);
    cfg.dynamicSmemBytes = 218 << 10;
    EXPECT(cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(cluster_kernel),
                                          &cfg) == cudaSuccess);
    EXPECT(n == 2);
    cfg.dynamicSmemBytes = 4096;
    EXPECT(cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(cluster_kernel),
                                          &cfg) == cudaSuccess);
    EXPECT(n == 10);
    std::fprintf(stderr,
                 "selftest: the next two launches must fail (a grid of 3 blocks in clusters of "
                 "2, an arrival on the barrier of a block that has exited):\n");
    cfg.gridDim = dim3(3);
    cfg.blockDim = dim3(64);
    EXPECT(cudaLaunchKernelEx(&cfg, cluster_kernel, map, bytes, out, got) ==
           cudaErrorInvalidValue);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
    EXPECT(cudaGetLastError() == cudaSuccess);
    cfg.gridDim = dim3(2);
    (void)cudaLaunchKernelEx(&cfg, cluster_exited_kernel, 0);
    EXPECT_FAULT(cudaErrorLaunchFailure);
    cudaFree(g), cudaFree(out), cudaFree(got);
  }
  if (g_failures) {
    std::fprintf(stderr, "cuda emulator selftest: %d checks failed\n", g_failures);
    return 1;
  }
  std::printf("cuda emulator selftest: all checks passed\n");
  return 0;
}
