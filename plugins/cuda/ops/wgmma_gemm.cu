// CUDA kernels: our Hopper GEMM for matmul and linear (see docs/ops.md), bf16 and f16 with f32
// accumulation, registered as "native" candidates after cuBLASLt's and after our mma.sync ones
// (ops/mma_gemm.cu), one per tile ("wgmma_128x128x64", "wgmma_128x256x64", their persistent
// forms "..._persistent", the split-K "wgmma_128x128x64_splitk", the clustered
// "wgmma_128x256x64_cluster2" and the ping-pong "wgmma_128x128x64_pingpong", also in clusters),
// so that only the autotuner or backend.kernels = "native" ever picks them.
//
// This file's device code is built for sm_90a alone (plugins/cuda/CMakeLists.txt, only when the
// plugin's architectures include 90): wgmma and setmaxnreg exist only there, and sm_90a code runs
// only on compute capability 9.0, so the candidates decline every other device at creation.
//
// The kernel (hopper_wgmma_kernel) computes, per batch entry z,
//   y[z] (M, N) = act(alpha · A[z] (M, K) · B[z] (K, N) + bias (N)), rounded once to T,
// with A stored K-contiguous (matmul's a, linear's x) or M-contiguous (matmul's a with trans_a)
// and B stored K-contiguous (matmul's b with trans_b, linear's w) or N-contiguous (matmul's b):
// wgmma reads both "majors" of 16-bit operands from shared memory (its imm-trans-a/b), so every
// layout runs on the same path with its own shared-memory descriptors.
//
// - One block: 3 warp groups (384 threads). Warp group 0 is the producer: one thread issues the
//   TMA copies (cp.async.bulk.tensor) of each (A, B) K tile into a ring of kStages stages and
//   gives its registers away (setmaxnreg.dec). Warp groups 1 and 2 are the consumers: each owns
//   64 rows of the 128-row tile and all BN columns, i.e. one wgmma.m64nBNk16 per 16 of K, f32
//   accumulators in registers (BN / 2 per thread).
// - The pipeline: per stage a "full" mbarrier (the producer's arrive.expect_tx plus the TMA's
//   complete_tx: the stage has landed) and an "empty" mbarrier (one arrival per consumer warp
//   once its wgmmas reading the stage are complete: the stage may be refilled). Consumers keep
//   one wgmma group in flight: the stage of K tile kt - 1 is released after the group of kt is
//   committed and wgmma.wait_group 1 says kt - 1 is done.
// - Shared memory layout: TMA writes each tile with the 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_
//   128B: 16-byte chunk c of 128-byte row r lands at chunk c ^ (r % 8)), which is exactly the
//   wgmma "128B swizzle" canonical layout: 8 rows of 128 bytes form a 1024-byte atom.
//   K-major operand (rows of BK = 64 elements = 128 bytes): one box of (rows, 64), atoms of 8
//   rows stacked every 1024 bytes (the descriptor's stride byte offset, SBO); the leading byte
//   offset is unused for swizzled K-major layouts. The k-th 16-column slice starts 32 k bytes
//   into the row: the hardware applies the swizzle to the full address bits, so advancing the
//   start address inside a 1024-byte-aligned atom steps K (as CUTLASS's descriptor iterator
//   does; the descriptor's base offset stays 0).
//   MN-major operand (rows of M or N): boxes of (64 K rows, 64 elements = 128 bytes), one per 64
//   of M or N, each 8 KiB; in the descriptor SBO = 1024 (the next 8 K rows) and LBO = 8192 (the
//   next 64 of M or N). The k-th 16-row slice starts 2048 k bytes in.
// - Edges: TMA zero-fills every element outside the tensor (also whole boxes past the edge), and
//   counts the full box in complete_tx, so ragged M, N, K need no care in the main loop: zeros
//   add nothing. The tensor maps are 3-D (inner, outer, batch), so a box never reads into the
//   next batch entry. Stores are predicated per element.
// - Tensor maps hold the global address, which is only known in compute(): they are encoded on
//   the host per call (cuTensorMapEncodeTiled, a pure host function fetched once through
//   cudaGetDriverEntryPointByVersion: libcuda is not linked) and passed as __grid_constant__
//   kernel parameters, so a captured graph keeps its own copy. Creation encodes them once with a
//   stand-in address, so that every shape the driver would refuse is declined there.
// - TMA needs 16-byte aligned row strides (the contiguous dimension of each operand a multiple of
//   8 elements: declined otherwise) and base addresses: operands that are not 16-byte aligned
//   (a view into the middle of a tensor) go to a plain SIMT kernel with the same epilogue, so a
//   misaligned call is slow, never wrong.
// - Epilogue: the f32 sums are parked in the (then free) ring and each warp stores whole rows
//   (coalesced): alpha, the bias (along N), the activation (a kernel argument: none, ReLU, GELU
//   erf or tanh, as the relu and gelu ops compute them), one rounding to T; pairs of columns are
//   stored together when y's rows allow.
// - Persistent tiles: a grid of one block per SM (at most one per output tile) whose blocks
//   walk the output tiles t = blockIdx.x, + gridDim.x, ...; the producer's ring (stage, phase)
//   runs on from one output tile into the next, so it loads the next tile's first K tiles while
//   the consumers are still storing this one's outputs; each consumer warp stages its outputs in
//   a buffer of its own beside the ring (the ring is no longer free at the epilogue).
// - Ping-pong: persistent, but each output tile is one consumer warp group's (all 128 rows), the
//   two taking the block's tiles in turn, so one group's epilogue overlaps the other's wgmmas.
// - Deterministic (each output is one fixed sequence of wgmmas over K) and capturable (compute()
//   encodes two tensor maps on the host and launches). The >48 KiB shared memory is opted into
//   once, at creation.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device.cuh"
#include "ops/gelu.cuh"
#include "ops/gemm_problem.hpp"
#include "ops/mma_ptx.cuh"
#include "ops/pair_store.cuh"
#include "ops/simt_gemm.cuh"
#include "ops/tma_map.hpp"
#include "ops/wgmma_desc.cuh"
#include "ops/wgmma_gemm.hpp"
#include "ops/wgmma_ptx.cuh"

namespace plexus::cuda {

namespace {

// ---- tile configurations ----
// BM x BN outputs per block (BM = 128: two consumer warp groups of 64 rows), BK = 64 of K per
// stage (128 bytes of 16-bit elements: one swizzle row). Stages fill ~192 KiB of the 227 KiB a
// block may have.
constexpr int kBM = 128, kBK = 64;
constexpr int kThreads = 384;  // producer warp group + 2 consumer warp groups

// A tile: BN columns, the ring's stages, whether its blocks walk the output tiles (persistent),
// the blocks of its clusters (1: none) and whether its consumer warp groups take turns on whole
// output tiles (ping-pong); each candidate names its own.
template <int N, int Stages, bool Persistent = false, int Cluster = 1, bool PingPong = false>
struct Tile {
  static constexpr int BN = N, kStages = Stages, kCluster = Cluster;
  static constexpr bool kPersistent = Persistent, kPingPong = PingPong;
};
struct TileN128 : Tile<128, 6> {
  static constexpr const char* kName = "wgmma_128x128x64";
};
struct TileN256 : Tile<256, 4> {
  static constexpr const char* kName = "wgmma_128x256x64";
};
// The persistent ones: one block per SM walks the output tiles (tile, tile + grid, ...), so the
// producer loads the next tile's first stages while the consumers store this one's outputs, and
// a block's set-up (barriers, tensor-map prefetch, registers) is paid once, not once per tile.
// Their epilogue cannot park in the ring (the producer is refilling it): each consumer warp has
// a staging buffer of its own beside the ring, for 16 rows x 32 columns at a time.
struct TileN128P : Tile<128, 6, true> {
  static constexpr const char* kName = "wgmma_128x128x64_persistent";
};
struct TileN256P : Tile<256, 4, true> {
  static constexpr const char* kName = "wgmma_128x256x64_persistent";
};
// The persistent 128 x 256 tile in clusters of 2 blocks along M (thread-block clusters, sm_90):
// the two blocks of a cluster compute the two 128-row tiles over the same 256 columns, so they
// read the same B tile. Each loads half of it and multicasts it to both (TMA .multicast::cluster),
// so an SM reads 16 KiB of A and 16 KiB of B from L2 per K tile instead of 16 and 32. A stage is
// refilled once the consumers of both blocks have released it (each consumer warp arrives on the
// stage's "empty" barrier in both blocks).
struct TileN256C2 : Tile<256, 4, true, 2> {
  static constexpr const char* kName = "wgmma_128x256x64_cluster2";
};
// The persistent 128 x 128 tile in ping-pong: each consumer warp group computes whole output
// tiles (all 128 rows, two wgmma.m64n128k16 per 16 of K), the two taking the block's tiles in
// turn, so that one group's epilogue runs while the other's wgmmas keep the Tensor Cores busy.
// Their K loops take turns too (an mbarrier per group, "order", below), as CUTLASS's ping-pong
// kernel orders them: a group starts waiting on the ring only once the other has seen every
// earlier stage land.
struct TileN128PP : Tile<128, 6, true, 1, true> {
  static constexpr const char* kName = "wgmma_128x128x64_pingpong";
};
// The ping-pong tile in clusters of 2 blocks along M sharing B by multicast, as _cluster2: the
// two blocks walk the same cluster tiles, so a stage's fill belongs to the same warp group in
// both, and its "empty" barrier counts that group's warps in both blocks.
struct TileN128PPC2 : Tile<128, 6, true, 2, true> {
  static constexpr const char* kName = "wgmma_128x128x64_pingpong_cluster2";
};

template <class TL>
struct Cfg {
  static constexpr int BN = TL::BN, S = TL::kStages, CL = TL::kCluster;
  static constexpr bool P = TL::kPersistent, PP = TL::kPingPong;
  static_assert(CL == 1 || (P && CL == 2), "clusters: persistent tiles, of 2 blocks");
  static_assert(!PP || P, "ping-pong: persistent tiles");
  // The 64-row halves of the output tile each consumer warp group computes: its own (1), or in
  // ping-pong all of them (2).
  static constexpr int kHalves = PP ? 2 : 1;
  static_assert(BN % (64 * CL) == 0, "each block of a cluster loads whole 64-wide B boxes");
  static constexpr int kABytes = kBM * kBK * 2;          // one stage of A (16-bit elements)
  static constexpr int kBBytes = BN * kBK * 2;           // one stage of B
  static constexpr int kStageBytes = kABytes + kBBytes;  // what the TMA of one stage delivers
  // full[S], empty[S] (and in ping-pong order[2], one per consumer warp group).
  static constexpr int kBarBytes = 2 * S * 8 + (PP ? 16 : 0);
  // The persistent tiles' staging: per consumer warp 16 rows of kChunk f32 columns, rows padded
  // to kChunk + 8 floats (8 mod 32 words: conflict-free, as kLdPark below), after the barriers.
  static constexpr int kChunk = 32, kLdChunk = kChunk + 8;
  static constexpr int kWarpStageFloats = 16 * kLdChunk;
  static constexpr int kStagingBytes = P ? 8 * kWarpStageFloats * 4 : 0;
  // + 1024: the dynamic shared memory is realigned to the 1024-byte swizzle atom in the kernel.
  static constexpr int kSmemBytes = S * kStageBytes + kBarBytes + kStagingBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "a block's shared memory on sm_90");
  static_assert(kBarBytes % 16 == 0 && BN % kChunk == 0, "staging 16-byte aligned, whole chunks");
  // f32 accumulators per consumer thread and half (64 x BN / 128), kHalves of them.
  static constexpr int kAcc = BN / 2;
  // The epilogue parks the f32 tile (two warp groups x 64 rows) in the ring, rows padded to
  // BN + 8 floats (conflict-free, see the kernel).
  static constexpr int kLdPark = BN + 8;
  static_assert(2 * 64 * kLdPark * 4 <= S * kStageBytes, "the parked tile fits the ring");
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "stages keep atoms 1024-aligned");
  static_assert(BN % 64 == 0 && BN <= 256, "wgmma n and the TMA box (at most 256 rows)");
};

// The bytes of an MN-major box (a swizzle atom, kAtomBytes, is in ops/wgmma_desc.cuh).
constexpr uint32_t kMnBoxBytes = 64 * 128;  // 64 K rows of 64 elements

// Arguments of one launch beside the tensor maps (pointers as void: one struct for both dtypes).
struct WgArgs {
  void* y;
  void* pre;         // the pre-activation, laid out as y (fused linear -> gelu); null: none
  const void* bias;  // null: none
  int64_t M, N, K;
  int64_t sy;      // batch stride of y (elements)
  int64_t mt, nt;  // M and N tiles
  int32_t za, zb;  // 1: the operand has a batch dimension in its tensor map; 0: shared
  float alpha;
  int32_t act;   // MmaAct
  int32_t pair;  // y's rows allow storing two adjacent columns as one aligned access
  // Split-K (the "_splitk" candidate; else splits 1): grid y is batch x splits, split s sums
  // the K tiles [s·split_tiles, (s + 1)·split_tiles) into partial[(s·batch + z) M N ...] (f32)
  // and split_sum (device.cuh) adds each output tile's splits in a fixed order in the launch,
  // its last block applying the epilogue; done: split_sum_counters(splits) per batch entry and
  // output tile, zero between launches.
  float* partial;
  unsigned* done;
  int32_t batch, splits, split_tiles;
};

// ---- PTX (ops/wgmma_ptx.cuh; the descriptors, ops/wgmma_desc.cuh) ----
using namespace ptx;

// ---- epilogue ----
// act is uniform over the grid, so the switch costs a predictable branch per element and saves
// one kernel instantiation per activation.
__device__ __forceinline__ float activate(float x, int32_t act) {
  switch (static_cast<MmaAct>(act)) {
    case MmaAct::Relu:
      return x > 0.f ? x : 0.f;  // NaN gives 0, as the relu op does
    case MmaAct::Gelu:
      return gelu::forward(x, false);  // the gelu op's formula (ops/gelu.cuh)
    case MmaAct::GeluTanh:
      return gelu::forward(x, true);
    default:
      return x;
  }
}

// Stores outputs (row, col) and (row, col + 1) of one batch entry's y (and of its pre-activation
// `pre`, if not null), the second only if col + 1 < N; v0, v1 are the raw sums.
template <class T>
__device__ __forceinline__ void store_pair(const WgArgs& p, T* y, T* pre, const T* bias,
                                           int64_t row, int64_t col, float v0, float v1) {
  const bool two = col + 1 < p.N;
  v0 *= p.alpha;
  v1 *= p.alpha;
  if (bias) {
    v0 += to_accum<T>(bias[col]);
    if (two) v1 += to_accum<T>(bias[col + 1]);
  }
  const int64_t at = row * p.N + col;
  if (pre) put_pair<T>(pre + at, v0, v1, two, p.pair);
  put_pair<T>(y + at, activate(v0, p.act), activate(v1, p.act), two, p.pair);
}

// Batch entry z's pre-activation output (null: none).
template <class T>
__device__ __forceinline__ T* pre_of(const WgArgs& p, int64_t z) {
  return p.pre ? static_cast<T*>(p.pre) + z * p.sy : nullptr;
}

// The two consumer warp groups (threads 128..383) as split_sum's team: the producer warp group
// has exited by the epilogue, so a block-wide barrier would count threads that never come.
struct Consumers {
  __device__ static int rank() { return static_cast<int>(threadIdx.x) - 128; }
  __device__ static int size() { return 256; }
  __device__ static void sync() { named_barrier_sync<1, 256>(); }
};

// Split-K's epilogue, after each consumer warp parked its f32 sums (rows 16 warp .. + 15 of its
// warp group's 64, padded to ld floats): the raw sums into this split's slice of the partials,
// then split_sum over the tile's elements, in whose finishing block each output gets the
// unsplit epilogue's y = act(alpha · sum + bias) (and its pre-activation), one rounding.
template <class T, int BN>
__device__ __forceinline__ void split_epilogue(const WgArgs& p, const float* park, int ld,
                                               int64_t m0, int64_t n0, int32_t z, int32_t split,
                                               int64_t tile, int cw, int warp, int lane) {
  const int64_t MN = p.M * p.N;
  float* part = p.partial + (static_cast<int64_t>(split) * p.batch + z) * MN;
  constexpr int kPairs = BN / 2;
  const bool even = p.N % 2 == 0;  // pairs of the slice 8-byte aligned
#pragma unroll 4
  for (int idx = lane; idx < 16 * kPairs; idx += 32) {
    const int rl = 16 * warp + idx / kPairs, c = 2 * (idx % kPairs);
    const int64_t row = m0 + 64 * cw + rl, col = n0 + c;
    if (row < p.M && col < p.N) {
      const float2 v = *reinterpret_cast<const float2*>(park + rl * ld + c);
      float* at = part + row * p.N + col;
      if (even) {
        *reinterpret_cast<float2*>(at) = v;
      } else {
        at[0] = v.x;
        if (col + 1 < p.N) at[1] = v.y;
      }
    }
  }
  const T* bias = static_cast<const T*>(p.bias);
  T* const Y = static_cast<T*>(p.y) + static_cast<int64_t>(z) * p.sy;
  T* const pre = pre_of<T>(p, z);
  const unsigned S = static_cast<unsigned>(p.splits);
  // Element i of the tile: row m0 + i / BN, column n0 + i % BN (consecutive threads, consecutive
  // columns), at z M N + row N + col in every slice; -1 past the edges.
  auto off = [&](int i) -> int64_t {
    const int64_t row = m0 + i / BN, col = n0 + i % BN;
    return row < p.M && col < p.N ? static_cast<int64_t>(z) * MN + row * p.N + col : -1;
  };
  auto out = [&](int i, int64_t, float v) {
    const int64_t col = n0 + i % BN, at = (m0 + i / BN) * p.N + col;
    v *= p.alpha;
    if (bias) v += to_accum<T>(bias[col]);
    if (pre) pre[at] = from_accum<T>(v);
    Y[at] = from_accum<T>(activate(v, p.act));
  };
  unsigned* counters =
      p.done + (static_cast<int64_t>(z) * p.mt * p.nt + tile) * split_sum_counters(S);
  split_sum<Consumers>(counters, p.partial, static_cast<int64_t>(p.batch) * MN, S,
                       static_cast<unsigned>(split), kBM * BN, off, out);
}

// ---- the kernel ----
extern __shared__ unsigned char wgmma_smem[];

// AK: A is K-major (else M-major). BKM: B is K-major (else N-major). Grid: x over the M x N
// tiles (grouped, below), y over the batch (x the splits of K with SPLIT).
template <class T, class TL, bool AK, bool BKM, bool SPLIT>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_wgmma_kernel(const __grid_constant__ CUtensorMap tma_a,
                        const __grid_constant__ CUtensorMap tma_b, const WgArgs p) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma and setmaxnreg need sm_90a; the host declines every other device
#else
  using C = Cfg<TL>;
  constexpr int BN = C::BN, S = C::S;
  constexpr bool P = C::P, PP = C::PP;
  constexpr int CL = C::CL, H = C::kHalves;
  static_assert(!(P && SPLIT), "split-K runs one output tile per block");
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128;  // 0: producer, 1 and 2: consumers
  // The block's rank in its cluster: the rank-th M tile of each cluster tile.
  const uint32_t rank = CL > 1 ? cluster_ctarank() : 0;

  // Realigned to the 1024-byte swizzle atom (the launch asked for 1024 bytes more).
  const uint32_t raw = smem_addr(wgmma_smem);
  const uint32_t base = (raw + kAtomBytes - 1) & ~(kAtomBytes - 1);
  const uint32_t full0 = base + S * C::kStageBytes;  // full[s] at full0 + 8 s
  const uint32_t empty0 = full0 + 8 * S;             // empty[s] at empty0 + 8 s
  const uint32_t order0 = empty0 + 8 * S;            // ping-pong: order[c] at order0 + 8 c
  auto stage_a = [&](int s) { return base + static_cast<uint32_t>(s) * C::kStageBytes; };
  auto stage_b = [&](int s) { return stage_a(s) + C::kABytes; };

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full0 + 8 * s, 1);  // the producer's arrive.expect_tx (+ the TMA's bytes)
      // One arrival per consumer warp (2 warp groups x 4) of each block of the cluster; in
      // ping-pong a stage is read by one warp group (4 warps) of each block.
      mbar_init(empty0 + 8 * s, (PP ? 4 : 8) * CL);
    }
    // Ping-pong: order[c] completes a phase when the other consumer warp group (its 4 warps) has
    // issued its wgmmas of one of its output tiles: then it is consumer c's turn.
    if constexpr (PP) {
      mbar_init(order0, 4);
      mbar_init(order0 + 8, 4);
    }
    // The inits visible to the other threads and to the TMA unit (the async proxy), and in a
    // cluster to the other blocks.
    fence_mbarrier_init();
    fence_proxy_async();
  }
  // The last block-wide barrier: the producer's idle threads exit below. In a cluster, no block
  // multicasts into another's ring or arrives on its barriers before that block's inits.
  if constexpr (CL > 1)
    cluster_sync();
  else
    __syncthreads();

  // Grouped order of the output tiles: bands of kGroup M tiles, M fastest within a band, then
  // the next N tile, so that the blocks resident together share a few A row panels and B column
  // panels in L2 (a wave of ~132 blocks reads 16 A panels and ~8 B panels, not all of A).
  // In clusters, the unit is the cluster's CL consecutive M tiles (the last ones may lie past M:
  // their blocks still load and multicast their share of B, and store nothing).
  constexpr int64_t kGroup = 16 / CL;
  const int64_t mtc = CL > 1 ? (p.mt + CL - 1) / CL : p.mt;
  const int64_t per_group = kGroup * p.nt;
  // The tiles this block computes: its own (x, y) without P; with P, tiles blockIdx.x,
  // + gridDim.x, ... of all batch entries' (the batch outermost), so each wave of the grid covers
  // consecutive tiles in the grouped order, as the waves of the plain grid do (in clusters, the
  // cluster's index and the grid's clusters).
  const int64_t per_entry = mtc * p.nt;
  const int64_t first = P ? static_cast<int64_t>(blockIdx.x) / CL : 0;
  const int64_t end = P ? per_entry * p.batch : 1;
  const int64_t step = P ? static_cast<int64_t>(gridDim.x) / CL : 1;
  // Tile t's batch entry z, split, first row m0 and column n0, and its index within the entry.
  struct Origin {
    int64_t pid, m0, n0;
    int32_t z, split;
  };
  auto origin = [&](int64_t t) {
    Origin o{};
    if constexpr (P) {
      o.z = static_cast<int32_t>(t / per_entry);
      o.pid = t % per_entry;
    } else {
      o.z = static_cast<int32_t>(blockIdx.y);
      o.pid = blockIdx.x;
    }
    if constexpr (SPLIT) {
      o.split = o.z % p.splits;
      o.z /= p.splits;
    }
    const int64_t first_m = (o.pid / per_group) * kGroup;
    const int64_t group_m = mtc - first_m < kGroup ? mtc - first_m : kGroup;
    const int64_t in_group = o.pid % per_group;
    o.m0 = (CL * (first_m + in_group % group_m) + rank) * kBM;
    o.n0 = (in_group / group_m) * BN;
    return o;
  };
  // K >= 1 (creation declines K = 0) and K <= INT32_MAX. A tile's K tiles: kt0 ..
  // kt0 + ktiles - 1 (all of them without SPLIT; creation leaves no split empty). The block's
  // j-th K tile, counted over all its output tiles, sits in stage j % S, filled for the
  // (j / S)-th time: both loops below step (stage, phase = that count's parity) along.
  const int all_ktiles = static_cast<int>((p.K + kBK - 1) / kBK);
  auto k_range = [&](const Origin& o, int& kt0, int& ktiles) {
    kt0 = 0;
    ktiles = all_ktiles;
    if constexpr (SPLIT) {
      kt0 = o.split * p.split_tiles;
      ktiles = min(ktiles - kt0, p.split_tiles);
    }
  };

  if (wg == 0) {
    // The producer: 40 registers are plenty for one thread's address arithmetic; the rest go to
    // the consumers' accumulators (128 x (168 - 40) = 256 x (232 - 168)).
    setmaxnreg_dec<40>();
    if (tid == 0) {
      prefetch_tensormap(&tma_a);
      prefetch_tensormap(&tma_b);
      int s = 0;
      uint32_t phase = 0;
      for (int64_t t = first; t < end; t += step) {
        const Origin o = origin(t);
        int kt0, ktiles;
        k_range(o, kt0, ktiles);
        const int32_t za = o.z * p.za, zb = o.z * p.zb;
        const int32_t mc = static_cast<int32_t>(o.m0), nc = static_cast<int32_t>(o.n0);
        for (int kt = 0; kt < ktiles; ++kt) {
          // The consumers are done with the stage's previous tile (kt - S); in the first round
          // the wait on parity 1 returns at once.
          mbar_wait(empty0 + 8 * s, phase ^ 1);
          const uint32_t full = full0 + 8 * s;
          mbar_arrive_expect_tx(full, C::kStageBytes);
          const int32_t kc = (kt0 + kt) * kBK;
          if constexpr (AK) {
            tma_load_3d(stage_a(s), &tma_a, kc, mc, za, full);  // box (64 of K, 128 of M)
          } else {
#pragma unroll
            for (int j = 0; j < kBM / 64; ++j)  // boxes (64 of M, 64 of K)
              tma_load_3d(stage_a(s) + j * kMnBoxBytes, &tma_a, mc + 64 * j, kc, za, full);
          }
          if constexpr (CL > 1) {
            // This block's 1/CL of the B tile, into every block of the cluster.
            constexpr uint16_t kAll = (1u << CL) - 1;
            constexpr int kRows = BN / CL;
            if constexpr (BKM) {  // box (64 of K, BN / CL of N): rows of 128 bytes
              tma_load_3d_multicast(stage_b(s) + rank * kRows * 128, &tma_b, kc,
                                    nc + static_cast<int32_t>(rank) * kRows, zb, full, kAll);
            } else {
#pragma unroll
              for (int j = 0; j < kRows / 64; ++j) {
                const int box = static_cast<int>(rank) * (kRows / 64) + j;
                tma_load_3d_multicast(stage_b(s) + box * kMnBoxBytes, &tma_b, nc + 64 * box, kc, zb,
                                      full, kAll);
              }
            }
          } else if constexpr (BKM) {
            tma_load_3d(stage_b(s), &tma_b, kc, nc, zb, full);  // box (64 of K, BN of N)
          } else {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)  // boxes (64 of N, 64 of K)
              tma_load_3d(stage_b(s) + j * kMnBoxBytes, &tma_b, nc + 64 * j, kc, zb, full);
          }
          if (++s == S) {
            s = 0;
            phase ^= 1;
          }
        }
      }
      if constexpr (CL > 1) {
        // Not before every stage is released by the consumers of every block of the cluster:
        // their last arrivals on this block's barriers must find it running.
        for (int i = 0; i < S; ++i) {
          mbar_wait(empty0 + 8 * s, phase ^ 1);
          if (++s == S) {
            s = 0;
            phase ^= 1;
          }
        }
      }
    }
    return;
  }

  // A consumer warp group: rows m0 + 64 cw .. + 63, all BN columns; in ping-pong all 128 rows
  // of every other output tile of the block.
  setmaxnreg_inc<232>();
  const int cw = wg - 1;
  const int lane = tid & 31;
  const int warp = (tid >> 5) & 3;  // warp within the warp group
  // Accumulator fragment of m64nNk16 (PTX ISA, "Matrix Fragments for wgmma .m64nNk16"): warp w
  // holds rows 16 w + g and 16 w + g + 8 (g = lane / 4); d[4 i + {0, 1}] are row 16 w + g,
  // columns 8 i + 2 q + {0, 1} (q = lane % 4), d[4 i + {2, 3}] the same columns of row + 8.
  // acc[h] holds 64-row half h of the warp group's rows.
  const int g = lane >> 2, q = lane & 3;
  float acc[H][C::kAcc];
  // A stage this warp has finished reading: free for the producer of this block (and, in a
  // cluster, for those of the others, which multicast into it).
  auto release = [&](int stage) {
    if (lane != 0) return;
    if constexpr (CL > 1) {
#pragma unroll
      for (int r = 0; r < CL; ++r)
        mbar_arrive_cluster(mapa_shared(empty0 + 8 * stage, static_cast<uint32_t>(r)));
    } else {
      mbar_arrive(empty0 + 8 * stage);
    }
  };

  // The A rows of half h: K-major, 64 rows of 128 bytes = 8 atoms from row 64 x (the warp group,
  // or in ping-pong the half); M-major, that 64-wide box. Both start 8192 x bytes into the stage.
  auto a_off = [&](int h) { return static_cast<uint32_t>(PP ? h : cw) * 8192u; };
  int s = 0, prev = S - 1;  // the stages of K tiles kt and kt - 1
  uint32_t phase = 0;
  // The block's output tiles t, one after the other; in ping-pong the warp groups take turns,
  // tiles i = cw, cw + 2, ... of the block's (the i-th is t = first + i step).
  const int64_t t0 = PP ? first + cw * step : first;
  const int64_t tstep = PP ? 2 * step : step;
  for (int64_t t = t0, i = cw; t < end; t += tstep, i += 2) {
    const Origin o = origin(t);
    int kt0, ktiles;
    k_range(o, kt0, ktiles);
    const int64_t m0 = o.m0, n0 = o.n0;
    if constexpr (PP) {
      // The ring carries the other group's tiles between this one's: the block's i-th tile
      // starts at its (i · K tiles)-th stage fill (every tile has all K tiles: no split).
      const int64_t j = i * all_ktiles;
      s = static_cast<int>(j % S);
      phase = static_cast<uint32_t>(j / S) & 1u;
      // The turn: the other group has issued tile i - 1's wgmmas, so every stage filled before
      // this tile's has landed and been waited for, and a parity wait below cannot mistake an
      // earlier, still pending fill of a stage for the one it waits for.
      if (i > 0) mbar_wait(order0 + 8 * cw, static_cast<uint32_t>((i - 1) / 2) & 1u);
    }
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
      for (int r = 0; r < C::kAcc; ++r) acc[h][r] = 0.f;

    for (int kt = 0; kt < ktiles; ++kt) {
      mbar_wait(full0 + 8 * s, phase);  // tile kt has landed
#pragma unroll
      for (int h = 0; h < H; ++h) fence_acc(acc[h]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        // K-major: the 16-column slice kk starts 32 kk bytes into each row (LBO unused: 16);
        // MN-major: 16 K rows of 128 bytes further (2048 kk), LBO = the next 64-wide box.
#pragma unroll
        for (int h = 0; h < H; ++h) {
          const uint64_t da =
              AK ? make_desc(stage_a(s) + a_off(h) + 32u * kk, 16u, kAtomBytes)
                 : make_desc(stage_a(s) + a_off(h) + 2048u * kk, kMnBoxBytes, kAtomBytes);
          const uint64_t db = BKM ? make_desc(stage_b(s) + 32u * kk, 16u, kAtomBytes)
                                  : make_desc(stage_b(s) + 2048u * kk, kMnBoxBytes, kAtomBytes);
          wgmma_m64k16<T, BN, !AK, !BKM>(acc[h], da, db);
        }
      }
      wgmma_commit();
#pragma unroll
      for (int h = 0; h < H; ++h) fence_acc(acc[h]);
      // At most one group (this K tile's) still running: the previous tile's stage may be
      // reused. (With P, the previous output tile's last stage was released after its loop.)
      wgmma_wait<1>();
#pragma unroll
      for (int h = 0; h < H; ++h) fence_acc(acc[h]);
      if (kt > 0) release(prev);
      prev = s;
      if (++s == S) {
        s = 0;
        phase ^= 1;
      }
    }
    // Ping-pong: the other group's turn (its next tile's stages are the next the ring fills).
    if constexpr (PP) {
      if (lane == 0) mbar_arrive(order0 + 8 * (1 - cw));
    }
    wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < H; ++h) fence_acc(acc[h]);

    const T* bias = static_cast<const T*>(p.bias);
    T* const Y = static_cast<T*>(p.y) + static_cast<int64_t>(o.z) * p.sy;
    T* const pre = pre_of<T>(p, o.z);
    if constexpr (P) {
      // The last stage is free for the producer, which may already be loading the next output
      // tile's K tiles into the others while this warp stores its outputs.
      release(prev);
      // The epilogue through this warp's own staging buffer (no barrier with the other warps):
      // kChunk columns of its 16 rows (of each half) at a time, parked as below, then stored a
      // row pair per step, 16 lanes on 16 consecutive column pairs.
      float* const stage_w =
          reinterpret_cast<float*>(wgmma_smem + (base - raw) + S * C::kStageBytes + C::kBarBytes) +
          (4 * cw + warp) * C::kWarpStageFloats;
      constexpr int kRegGroups = C::kChunk / 8;  // register groups (8 columns) per chunk
      constexpr int kPairs = C::kChunk / 2;      // column pairs per chunk row
#pragma unroll
      for (int hv = 0; hv < H; ++hv) {
        const int64_t row0 = m0 + 64 * (PP ? hv : cw) + 16 * warp;
#pragma unroll
        for (int j = 0; j < BN / C::kChunk; ++j) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float* prow = stage_w + (g + 8 * h) * C::kLdChunk + 2 * q;
#pragma unroll
            for (int r4 = 0; r4 < kRegGroups; ++r4) {
              const int r = kRegGroups * j + r4;
              *reinterpret_cast<float2*>(prow + 8 * r4) =
                  make_float2(acc[hv][4 * r + 2 * h], acc[hv][4 * r + 2 * h + 1]);
            }
          }
          __syncwarp();
#pragma unroll 1
          for (int idx = lane; idx < 16 * kPairs; idx += 32) {
            const int rl = idx / kPairs, c = 2 * (idx % kPairs);
            const int64_t row = row0 + rl, col = n0 + C::kChunk * j + c;
            if (row < p.M && col < p.N) {
              const float2 v = *reinterpret_cast<const float2*>(stage_w + rl * C::kLdChunk + c);
              store_pair<T>(p, Y, pre, bias, row, col, v.x, v.y);
            }
          }
          __syncwarp();  // read back before the next chunk overwrites the buffer
        }
      }
      continue;
    }

    // The epilogue goes through shared memory: each warp parks its f32 sums there, then stores
    // its 16 rows with consecutive lanes on consecutive column pairs (a warp writes 32 pairs of
    // one row: coalesced), and the activation's code exists once instead of once per register.
    // The ring is free once both consumer warp groups are past their last wgmma (the other group
    // may still read the last stages) and every TMA has landed (each was waited for).
    named_barrier_sync<1, 256>();  // the 256 consumer threads
    fence_proxy_async();           // wgmma reads before our writes
    float* park = reinterpret_cast<float*>(wgmma_smem + (base - raw)) + cw * 64 * C::kLdPark;

    // Row stride kLdPark = 8 (mod 32) words: a half warp's 8-byte stores (g = 0..3, q = 0..3)
    // hit banks 8 g + 2 q + {0, 1}, all distinct.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* prow = park + (16 * warp + g + 8 * h) * C::kLdPark + 2 * q;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
        *reinterpret_cast<float2*>(prow + 8 * i) =
            make_float2(acc[0][4 * i + 2 * h], acc[0][4 * i + 2 * h + 1]);
    }
    __syncwarp();  // each warp reads back only its own 16 rows

    if constexpr (SPLIT) {
      split_epilogue<T, BN>(p, park, C::kLdPark, m0, n0, o.z, o.split, o.pid, cw, warp, lane);
      return;
    }
    constexpr int kPairs = BN / 2;  // column pairs per row, a multiple of 32
#pragma unroll 4
    for (int idx = lane; idx < 16 * kPairs; idx += 32) {
      const int rl = 16 * warp + idx / kPairs, c = 2 * (idx % kPairs);
      const int64_t row = m0 + 64 * cw + rl, col = n0 + c;
      if (row < p.M && col < p.N) {
        const float2 v = *reinterpret_cast<const float2*>(park + rl * C::kLdPark + c);
        store_pair<T>(p, Y, pre, bias, row, col, v.x, v.y);
      }
    }
  }
#endif
}

// ---- the fallback for operands that are not 16-byte aligned ----
// A plain SIMT GEMM over element strides (ops/simt_gemm.cuh: A[m][k] at m·sam + k·sak, B[k][n]
// at k·sbk + n·sbn, batch strides sa, sb), f32 accumulation; the same epilogue.
struct SimtArgs {
  const void* a;
  const void* b;
  int64_t sam, sak, sbk, sbn, sa, sb;
};

template <class T>
__global__ void __launch_bounds__(kSimtTile* kSimtTile)
    wgmma_simt_fallback_kernel(const WgArgs p, const SimtArgs q) {
  pdl_begin();
  const int tx = static_cast<int>(threadIdx.x) % kSimtTile;
  const int ty = static_cast<int>(threadIdx.x) / kSimtTile;
  const int64_t z = blockIdx.z;
  const T* A = static_cast<const T*>(q.a) + z * q.sa;
  const T* B = static_cast<const T*>(q.b) + z * q.sb;
  T* Y = static_cast<T*>(p.y) + z * p.sy;
  const int64_t mb = static_cast<int64_t>(blockIdx.x) * kSimtTile;
  const int64_t nb = static_cast<int64_t>(blockIdx.y) * kSimtTile;
  const float acc = simt_tile_dot(A, B, p.M, p.N, p.K, q.sam, q.sak, q.sbk, q.sbn, mb, nb);
  const int64_t row = mb + ty, col = nb + tx;
  if (row >= p.M || col >= p.N) return;
  float v = acc * p.alpha;
  if (p.bias) v += to_accum<T>(static_cast<const T*>(p.bias)[col]);
  if (T* pre = pre_of<T>(p, z)) pre[row * p.N + col] = from_accum<T>(v);
  Y[row * p.N + col] = from_accum<T>(activate(v, p.act));
}

// ---- host side ----

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// One GEMM (or a strided batch of them) as the kernel sees it, fixed at creation.
using WgShape = GemmProblem;

using WgFn = void (*)(CUtensorMap, CUtensorMap, WgArgs);

template <class T, class TL, bool SPLIT>
WgFn pick_kernel(bool ak, bool bk) {
  if (ak && bk) return hopper_wgmma_kernel<T, TL, true, true, SPLIT>;
  if (ak) return hopper_wgmma_kernel<T, TL, true, false, SPLIT>;
  if (bk) return hopper_wgmma_kernel<T, TL, false, true, SPLIT>;
  return hopper_wgmma_kernel<T, TL, false, false, SPLIT>;
}

// Split-K (the "_splitk" candidate): only where the output tiles alone leave SMs idle (a block
// fills an SM's shared memory, so one block per SM): enough splits for every SM, at least
// kMinTilesPerSplit K tiles each, at most kMaxSplits (plan_split_k, ops/gemm_problem.hpp).
constexpr int64_t kMinTilesPerSplit = 4;
constexpr int64_t kMaxSplits = 16;

// The launch of one WgShape with tile TL and activation act (and split K with SPLIT): checks at
// creation whether the kernel can take it (declining otherwise), then launches with no further
// checks.
template <class T, class TL, bool SPLIT = false>
class WgPlan {
 public:
  using C = Cfg<TL>;

  WgPlan(const WgShape& s, int32_t device, CudaBackend& backend, const char* op, MmaAct act)
      : s_(s), device_(device), act_(act) {
    constexpr plx_dtype kDtype = dtype_v<T>;
    PLX_DECLINE_UNLESS(s.K > 0, "%s: K = 0 leaves the Tensor Cores nothing to do", op);
    // TMA row strides must be multiples of 16 bytes: the contiguous dimension of each operand a
    // multiple of 8 elements (the cuBLASLt kernel takes the other shapes).
    const int64_t a_row = s.a_kmajor ? s.K : s.M;
    const int64_t b_row = s.b_kmajor ? s.K : s.N;
    PLX_DECLINE_UNLESS(a_row % 8 == 0,
                       "%s: the contiguous dimension of the first operand (%lld %s) is not a "
                       "multiple of 16 bytes, as TMA needs",
                       op, static_cast<long long>(a_row), dtype_name(kDtype));
    PLX_DECLINE_UNLESS(b_row % 8 == 0,
                       "%s: the contiguous dimension of the second operand (%lld %s) is not a "
                       "multiple of 16 bytes, as TMA needs",
                       op, static_cast<long long>(b_row), dtype_name(kDtype));
    // TMA coordinates are int32 (a tile's last box starts up to 256 past its first row, and
    // kt * 64 up to 63 past K); grid x spans the tiles (2^31 - 1), grid y (and z of the
    // fallback) the batch (65535); the fallback's grid y spans N / 16.
    constexpr int64_t kMaxDim = INT32_MAX - 512;
    PLX_DECLINE_UNLESS(s.M <= kMaxDim && s.N <= kMaxDim && s.K <= kMaxDim && s.batch <= 65535 &&
                           (s.N + kSimtTile - 1) / kSimtTile <= 65535,
                       "%s: (%lld x %lld x %lld, batch %lld) exceeds the TMA coordinates or the "
                       "grid",
                       op, static_cast<long long>(s.M), static_cast<long long>(s.N),
                       static_cast<long long>(s.K), static_cast<long long>(s.batch));
    mt_ = (s.M + kBM - 1) / kBM;
    nt_ = (s.N + C::BN - 1) / C::BN;
    PLX_DECLINE_UNLESS(mt_ * nt_ <= INT32_MAX, "%s: %lld x %lld tiles exceed the grid", op,
                       static_cast<long long>(mt_), static_cast<long long>(nt_));
    use_device(device_);
    const DeviceContext& ctx = backend.context(device_);
    decline_unless_sm90a(ctx, op);
    PLX_DECLINE_UNLESS(tma_encode_fn() != nullptr,
                       "%s: the driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12)", op);
    PLX_DECLINE_UNLESS(static_cast<size_t>(C::kSmemBytes) <= ctx.prop.sharedMemPerBlockOptin,
                       "%s: %s needs %d bytes of shared memory, the device allows %zu", op,
                       TL::kName, C::kSmemBytes,
                       static_cast<size_t>(ctx.prop.sharedMemPerBlockOptin));
    // The operands' tensor maps: (inner, outer, batch) with boxes of 64 x 128 (A K-major),
    // 64 x BN (B K-major) or 64 x 64 (MN-major, several per tile).
    a_.inner = static_cast<uint64_t>(a_row);
    a_.outer = static_cast<uint64_t>(s.a_kmajor ? s.M : s.K);
    a_.box_outer = s.a_kmajor ? kBM : 64;
    b_.inner = static_cast<uint64_t>(b_row);
    b_.outer = static_cast<uint64_t>(s.b_kmajor ? s.N : s.K);
    b_.box_outer = s.b_kmajor ? C::BN / C::CL : 64;  // in clusters, a block's share of B
    for (TmaOperand* o : {&a_, &b_}) o->ld = o->inner;
    set_batch(a_, s.sa);
    set_batch(b_, s.sb);
    // Every check the driver makes, once, with a stand-in (aligned) address; an empty output
    // launches nothing (and its zero dimensions are no tensor map).
    if (s.M > 0 && s.N > 0 && s.batch > 0) {
      PLX_DECLINE_UNLESS(tma_accepts<T>(a_) && tma_accepts<T>(b_),
                         "%s: cuTensorMapEncodeTiled refuses these operands (%lld x %lld x %lld)",
                         op, static_cast<long long>(s.M), static_cast<long long>(s.N),
                         static_cast<long long>(s.K));
    }
    sms_ = ctx.prop.multiProcessorCount;
    if constexpr (SPLIT) {
      const int64_t blocks = mt_ * nt_ * s.batch;
      const int64_t sms = sms_;
      const SplitK k = plan_split_k(s, blocks, (s.K + kBK - 1) / kBK, sms,
                                    blocks > 0 ? sms / blocks : 0,  // one block per SM
                                    kMinTilesPerSplit, kMaxSplits, op);
      split_tiles_ = static_cast<int32_t>(k.per);
      splits_ = k.splits;
      workspace_ = k.workspace;
      done_ = BlockCounter(blocks * split_sum_counters(static_cast<unsigned>(splits_)));
    }
    kernel_ = pick_kernel<T, TL, SPLIT>(s.a_kmajor, s.b_kmajor);
    // The attribute stays set for every later launch (common.hpp: it only grows).
    allow_dynamic_smem(kernel_, C::kSmemBytes);
    if constexpr (C::CL > 1) {
      // The clusters that fit at once: the persistent grid's size.
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = C::CL;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(C::CL);
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = C::kSmemBytes;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int n = 0;
      const cudaError_t e =
          cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(kernel_), &cfg);
      if (e != cudaSuccess) (void)cudaGetLastError();
      PLX_DECLINE_UNLESS(e == cudaSuccess && n > 0,
                         "%s: the device runs no cluster of %d blocks of %d bytes of shared "
                         "memory (%s)",
                         op, C::CL, C::kSmemBytes,
                         e == cudaSuccess ? "none fit" : cudaGetErrorString(e));
      sms_ = n;  // clusters, here
    }
  }

  // f32 partial sums of the splits (0 without split-K).
  uint64_t workspace_bytes() const { return workspace_; }

  // y (batch, M, N) from a, b (and bias, null if none), on `stream`; ws: workspace_bytes();
  // `pre`: where the epilogue also stores the pre-activation (null: nowhere).
  void run(const void* a, const void* b, void* y, const void* bias, void* ws, cudaStream_t stream,
           void* pre = nullptr) const {
    if (s_.M == 0 || s_.N == 0 || s_.batch == 0) return;
    WgArgs p{};
    p.y = y;
    p.pre = pre;
    p.bias = s_.bias ? bias : nullptr;
    p.M = s_.M, p.N = s_.N, p.K = s_.K;
    p.sy = s_.M * s_.N;
    p.mt = mt_, p.nt = nt_;
    p.za = a_.batch > 1 ? 1 : 0;
    p.zb = b_.batch > 1 ? 1 : 0;
    p.alpha = s_.alpha;
    p.act = static_cast<int32_t>(act_);
    // Two columns at once need y's (and pre's) row starts and batch entries aligned to two
    // elements.
    p.pair = s_.N % 2 == 0 && reinterpret_cast<uintptr_t>(y) % (2 * sizeof(T)) == 0 &&
             reinterpret_cast<uintptr_t>(pre) % (2 * sizeof(T)) == 0;
    p.partial = static_cast<float*>(ws);
    p.done = done_.p;
    p.batch = static_cast<int32_t>(s_.batch);
    p.splits = splits_;
    p.split_tiles = split_tiles_;
    const unsigned z = static_cast<unsigned>(s_.batch);
    CUtensorMap ma, mb;
    if (aligned16(a) && aligned16(b) && tma_encode<T>(ma, a_, a) && tma_encode<T>(mb, b_, b)) {
      // Creation checked batch x splits <= 65535. The persistent tiles: one block per SM (a
      // block fills an SM's shared memory), none without a tile; in clusters, as many clusters
      // as fit at once, none without a cluster tile (CL M tiles).
      const int64_t mtc = (mt_ + C::CL - 1) / C::CL;
      const dim3 grid =
          C::P ? dim3(static_cast<unsigned>(std::min(mtc * nt_ * s_.batch, sms_) * C::CL))
               : dim3(static_cast<unsigned>(mt_ * nt_), z * static_cast<unsigned>(splits_));
      launch_kernel(kernel_, ClusterGrid{grid, static_cast<unsigned>(C::CL)}, kThreads,
                    static_cast<size_t>(C::kSmemBytes), stream, ma, mb, p);
    } else {
      // Creation checked everything but the addresses: misaligned operands land here (one pass
      // over all of K: no partials).
      SimtArgs q{};
      q.a = a, q.b = b;
      const int64_t lda = static_cast<int64_t>(a_.ld), ldb = static_cast<int64_t>(b_.ld);
      q.sam = s_.a_kmajor ? lda : 1, q.sak = s_.a_kmajor ? 1 : lda;
      q.sbk = s_.b_kmajor ? 1 : ldb, q.sbn = s_.b_kmajor ? ldb : 1;
      q.sa = s_.sa, q.sb = s_.sb;
      const dim3 grid(static_cast<unsigned>((s_.M + kSimtTile - 1) / kSimtTile),
                      static_cast<unsigned>((s_.N + kSimtTile - 1) / kSimtTile), z);
      launch_kernel(wgmma_simt_fallback_kernel<T>, grid, kSimtTile * kSimtTile, 0, stream, p, q);
    }
  }

 private:
  // A batched operand (stride != 0) gets a batch dimension; a shared one a batch of 1, whose
  // stride the driver still checks (a multiple of 16 bytes: the whole matrix).
  void set_batch(TmaOperand& o, int64_t stride) const {
    if (stride != 0 && s_.batch > 1) {
      o.batch = static_cast<uint64_t>(s_.batch);
      o.bstride = static_cast<uint64_t>(stride);
    } else {
      o.batch = 1;
      o.bstride = o.ld * o.outer;
    }
  }

  WgShape s_;
  int32_t device_;
  MmaAct act_;
  int64_t mt_ = 0, nt_ = 0;
  int64_t sms_ = 1;  // the device's SMs (in clusters: the clusters that fit at once)
  TmaOperand a_, b_;
  WgFn kernel_ = nullptr;
  int32_t splits_ = 1, split_tiles_ = 0;
  uint64_t workspace_ = 0;
  BlockCounter done_{0};  // split-K: split_sum counters per batch entry and output tile
};

// y (..., M, N) = alpha op(a) op(b): one GEMM when the batch folds into rows or is 1, a strided
// batch (grid y) when each operand's batch dims are all full or all broadcast; declines batch
// dims that broadcast partially (cuBLASLt's kernel loops over those). The same shapes as the
// mma.sync candidates (ops/mma_gemm.cu).
template <class T, class TL, bool SPLIT>
class WgMatmul final : public Kernel {
 public:
  WgMatmul(const NodeInfo& node, CudaBackend& backend)
      : device_(node.device()), plan_(shape(node), device_, backend, "matmul", MmaAct::None) {}

  uint64_t workspace_bytes() const override { return plan_.workspace_bytes(); }

  void compute(const KernelCall& c) override {
    use_device(device_);
    plan_.run(c.in(0).data, c.in(1).data, c.out(0).data, nullptr, c.workspace, native(c.stream));
  }

 private:
  static WgShape shape(const NodeInfo& node) { return matmul_problem(node, dtype_v<T>); }

  int32_t device_;
  WgPlan<T, TL, SPLIT> plan_;
};

// y (..., out) = act(x (..., in) wᵀ + b): one GEMM over all rows of x, the bias and the
// activation in the epilogue. Registered with MmaAct::None; the others are for fused
// linear -> activation groups (make_wgmma_linear).
template <class T, class TL, bool SPLIT>
class WgLinear final : public Kernel {
 public:
  WgLinear(const NodeInfo& node, CudaBackend& backend, MmaAct act = MmaAct::None)
      : device_(node.device()), plan_(shape(node), device_, backend, "linear", act) {}

  uint64_t workspace_bytes() const override { return plan_.workspace_bytes(); }

  // A second output, where the fused linear -> gelu group keeps the pre-activation, takes it.
  void compute(const KernelCall& c) override {
    use_device(device_);
    const void* bias = c.has_in(2) ? c.in(2).data : nullptr;
    void* pre = c.num_outputs > 1 ? c.out(1).data : nullptr;
    plan_.run(c.in(0).data, c.in(1).data, c.out(0).data, bias, c.workspace, native(c.stream), pre);
  }

 private:
  static WgShape shape(const NodeInfo& node) { return linear_problem(node, dtype_v<T>); }

  int32_t device_;
  WgPlan<T, TL, SPLIT> plan_;
};

// The split-K candidate: the 128 x 128 tile with K spread over grid y, for outputs whose tiles
// leave SMs idle (a convnet's 1024 x 6272 -> 256 layer is 16 tiles on 132 SMs); it declines the
// shapes that need no split.
constexpr const char* kSplitName = "wgmma_128x128x64_splitk";

template <class T>
std::unique_ptr<Kernel> make_linear_tile(const NodeInfo& node, CudaBackend& backend,
                                         const std::string& tile, MmaAct act) {
  if (tile == TileN128::kName)
    return std::make_unique<WgLinear<T, TileN128, false>>(node, backend, act);
  if (tile == TileN256::kName)
    return std::make_unique<WgLinear<T, TileN256, false>>(node, backend, act);
  if (tile == kSplitName) return std::make_unique<WgLinear<T, TileN128, true>>(node, backend, act);
  if (tile == TileN128P::kName)
    return std::make_unique<WgLinear<T, TileN128P, false>>(node, backend, act);
  if (tile == TileN256P::kName)
    return std::make_unique<WgLinear<T, TileN256P, false>>(node, backend, act);
  if (tile == TileN256C2::kName)
    return std::make_unique<WgLinear<T, TileN256C2, false>>(node, backend, act);
  if (tile == TileN128PP::kName)
    return std::make_unique<WgLinear<T, TileN128PP, false>>(node, backend, act);
  if (tile == TileN128PPC2::kName)
    return std::make_unique<WgLinear<T, TileN128PPC2, false>>(node, backend, act);
  throw sdk::Unsupported(sdk::format("linear: no wgmma tile named '%s'", tile.c_str()));
}

template <class T, class TL, bool SPLIT>
void add_tile(KernelRegistry& r, const char* name, uint32_t flags) {
  constexpr plx_dtype d = dtype_v<T>;
  r.add<WgMatmul<T, TL, SPLIT>, CudaBackend>("matmul", d, name, flags);
  r.add<WgLinear<T, TL, SPLIT>, CudaBackend>("linear", d, name, flags);
}

template <class T>
void add_dtype(KernelRegistry& r, uint32_t flags) {
  add_tile<T, TileN128, false>(r, TileN128::kName, flags);
  add_tile<T, TileN256, false>(r, TileN256::kName, flags);
  add_tile<T, TileN128, true>(r, kSplitName, flags);
  add_tile<T, TileN128P, false>(r, TileN128P::kName, flags);
  add_tile<T, TileN256P, false>(r, TileN256P::kName, flags);
  add_tile<T, TileN256C2, false>(r, TileN256C2::kName, flags);
  add_tile<T, TileN128PP, false>(r, TileN128PP::kName, flags);
  add_tile<T, TileN128PPC2, false>(r, TileN128PPC2::kName, flags);
}

}  // namespace

std::unique_ptr<Kernel> make_wgmma_linear(const NodeInfo& node, CudaBackend& backend,
                                          const std::string& tile, MmaAct act) {
  switch (static_cast<plx_dtype>(node.input(0).dtype)) {
    case PLX_F16:
      return make_linear_tile<f16>(node, backend, tile, act);
    case PLX_BF16:
      return make_linear_tile<bf16>(node, backend, tile, act);
    default:
      break;
  }
  throw sdk::Unsupported(sdk::format("linear: the wgmma kernels take f16 or bf16, not %s",
                                     dtype_name(static_cast<plx_dtype>(node.input(0).dtype))));
}

void register_wgmma_gemm(KernelRegistry& r) {
  // No PLX_KERNEL_LIBRARY: these are the "native" side of backend.kernels. Split-K stays
  // deterministic: split_sum adds the partials in an order that depends on the splits alone.
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_dtype<bf16>(r, f);
  add_dtype<f16>(r, f);
}

}  // namespace plexus::cuda
