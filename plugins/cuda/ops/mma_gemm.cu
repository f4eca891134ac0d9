// CUDA kernels: our own Tensor Core GEMM for matmul and linear (see docs/ops.md), registered as
// "native" candidates after the cuBLASLt ones (ops/gemm.cpp). One candidate per tile
// configuration, the tile in the impl name ("mma_sync_128x128x32"), so that the autotuner picks
// the tile per shape; without the tuner cuBLASLt, registered first, keeps winning.
//
// The kernel (mma_gemm_kernel) computes, for each batch entry z,
//   y[z] (M, N) = act(alpha · A[z] (M, K) · B[z] (K, N) + bias (N))
// with A stored K-contiguous ("K-major", a row-major (M, K): matmul's a, linear's x) or
// M-contiguous (matmul's a with trans_a), and B stored K-contiguous (matmul's b with trans_b,
// linear's w (out, in)) or N-contiguous (matmul's b). y is row-major with row stride N.
//
// - Tensor Cores: mma.sync.aligned.m16n8k16 for f16 and bf16 (f32 accumulation), m16n8k8 TF32
//   for f32 inputs, which rounds the inputs to TF32 (10-bit mantissa): the f32 candidates decline
//   unless the plugin's tf32 option was on when they were created, as cuBLASLt's TF32 does.
// - Shared memory: a STAGES-deep ring of (A, B) tiles filled with cp.async (16-byte copies,
//   L2 only), so the copy of tile k + STAGES - 1 overlaps the math of tile k. Rows are padded by
//   16 bytes (K-major) or so that 8 consecutive rows start in distinct bank groups, which makes
//   ldmatrix (16-bit) and the scalar TF32 fragment loads free of bank conflicts (worked out at
//   kPadK / kPadMN below).
// - Edges: a 16-byte chunk is copied only if it lies inside the matrix, else cp.async fills it
//   with zeros (src-size 0); zeros add nothing to the sums, so ragged M, N, K need no other
//   care in the main loop. This needs every chunk to be all inside or all outside, i.e. the
//   contiguous dimension of each operand a multiple of 16 bytes (8 halves, 4 floats), which also
//   makes every row start 16-byte aligned as cp.async requires: creation declines otherwise.
//   Stores are predicated per element.
// - Epilogue, in registers: alpha, then the bias (along N: linear's output features), then the
//   activation (template option: none, ReLU, GELU erf or tanh), then one rounding to the output
//   dtype. Pairs of columns are stored together when y's rows allow.
// - Pointers are only known in compute(). Operands that are not 16-byte aligned (a view into the
//   middle of a tensor) go to a plain SIMT kernel with the same epilogue (simt_gemm_kernel), so a
//   misaligned call is slow, never wrong. That kernel is also a candidate of its own
//   ("simt_16x16", registered last) for the shapes every tile declines, so that the native side
//   has a kernel for every GEMM.
// - Split-K (the "mma_sync_32x32x64_splitk" candidate, for outputs too small to fill the
//   device): grid z also spans K splits, each writing raw f32 sums to the workspace, and
//   split_sum (device.cuh) adds each output tile's splits in a fixed order in the launch; the
//   block that finishes applies the epilogue.
//   No atomics on the data.
// - Deterministic (each output is summed in a fixed order that depends only on the shape) and
//   capturable (compute() only launches). Shared memory beyond 48 KiB is opted into once, at
//   creation.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "device.cuh"
#include "ops/copy_lanes.cuh"
#include "ops/gelu.cuh"
#include "ops/mma_gemm.hpp"
#include "ops/gemm_problem.hpp"
#include "ops/mma_ptx.cuh"
#include "ops/pair_store.cuh"
#include "ops/simt_gemm.cuh"

namespace plexus::cuda {

namespace {

// ---- tile configurations ----
// BM x BN outputs per block, BK of K per pipeline stage, WARPS_M x WARPS_N warps each owning a
// (BM / WARPS_M) x (BN / WARPS_N) piece. Stages differ by element size to keep shared memory
// within what one block may have (f32 tiles are twice the bytes).
struct TileLarge {  // square shapes 1024..8192
  static constexpr int BM = 128, BN = 128, BK = 32, WARPS_M = 2, WARPS_N = 4;
  static constexpr int kStages16 = 4, kStages32 = 3;
  static constexpr const char* kName = "mma_sync_128x128x32";
};
struct TileMid {
  static constexpr int BM = 64, BN = 64, BK = 32, WARPS_M = 2, WARPS_N = 2;
  static constexpr int kStages16 = 4, kStages32 = 4;
  static constexpr const char* kName = "mma_sync_64x64x32";
};
struct TileSmall {  // skinny GEMMs: a few hundred rows or features, long K
  static constexpr int BM = 32, BN = 32, BK = 64, WARPS_M = 2, WARPS_N = 2;
  static constexpr int kStages16 = 4, kStages32 = 3;
  static constexpr const char* kName = "mma_sync_32x32x64";
};

// Everything derived from (element type, tile).
template <class T, class TL>
struct Cfg {
  static constexpr int BM = TL::BM, BN = TL::BN, BK = TL::BK;
  static constexpr int WARPS_M = TL::WARPS_M, WARPS_N = TL::WARPS_N;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // a warp's outputs
  static constexpr int MI = WM / 16, NI = WN / 8;             // its m16n8 MMA tiles
  static constexpr bool kF32 = sizeof(T) == 4;
  static constexpr int kStages = kF32 ? TL::kStages32 : TL::kStages16;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per cp.async
  static constexpr int kStepK = kF32 ? 8 : 16;                   // K of one MMA
  // Row padding (elements) of a K-major tile (rows of BK) and of an M- or N-major tile (rows
  // of BM or BN):
  // - 16-bit, both: 16 bytes, so the row stride is an odd number of 16-byte chunks (BK = 32:
  //   5, BK = 64: 9, BM = 32/64/128: 5/9/17) and ldmatrix's 8 row addresses hit 8 distinct
  //   chunks of a 128-byte bank line.
  // - f32 K-major: 4 floats, stride = 4 (mod 32) words: the fragment load of lane (g, t) at
  //   row g, column t reads bank 4g + t, 32 distinct banks.
  // - f32 M/N-major: 8 floats, stride = 8 (mod 32) words (BM, BN multiples of 32): lane (g, t)
  //   reads row t, column g, bank 8t + g, distinct.
  static constexpr int kPadK = kF32 ? 4 : 8;
  static constexpr int kPadMN = 8;
  static constexpr int kLdK = BK + kPadK;  // row stride of a K-major tile
  static constexpr int kLdM = BM + kPadMN, kLdN = BN + kPadMN;
  template <bool KMajor, int Rows>
  static constexpr int tile_elems() {
    return KMajor ? Rows * kLdK : BK * (Rows + kPadMN);
  }
  template <bool AK, bool BKM>
  static constexpr int smem_bytes() {
    return kStages * (tile_elems<AK, BM>() + tile_elems<BKM, BN>()) * static_cast<int>(sizeof(T));
  }
  static_assert(BM % (16 * WARPS_M) == 0 && BN % (16 * WARPS_N) == 0, "warp tile");
  static_assert(NI % 2 == 0, "B fragments are loaded 16 columns at a time");
  static_assert(BK % 16 == 0 && BM % 32 == 0 && BN % 32 == 0, "tile sizes");
  static_assert(kStages >= 3, "a pipeline of at least 3 stages");
};

// Arguments of one launch (pointers as void: one struct for every dtype).
struct MmaArgs {
  const void* a;
  const void* b;
  void* y;
  void* pre;         // the pre-activation, laid out as y (GELU epilogues only); null: none
  const void* bias;  // null: none
  int64_t M, N, K;
  int64_t lda, ldb, ldy;  // row strides (elements) of A, B as stored, and of y
  int64_t sa, sb, sy;     // batch strides (elements); 0 for an operand the batch shares
  float alpha;
  int32_t pair;  // y's rows allow storing two adjacent columns as one aligned access
  // Split-K: grid z is batch x splits, split s sums K in [s·k_split, (s + 1)·k_split) into
  // partial[(s·batch + z) M N ...] (f32, no epilogue), and split_sum adds each output tile's
  // splits (done: split_sum_counters(splits) per batch entry and tile, zero between launches);
  // its last block applies the epilogue. Without it: splits = 1, k_split >= K, partial and done
  // unused.
  int64_t batch;
  int64_t k_split;  // a multiple of BK
  int32_t splits;
  float* partial;
  unsigned* done;
};

// ---- PTX wrappers: ops/mma_ptx.cuh ----
using namespace ptx;

// ---- epilogue ----
template <MmaAct ACT>
__device__ __forceinline__ float activate(float x) {
  if constexpr (ACT == MmaAct::Relu) {
    return x > 0.f ? x : 0.f;  // NaN gives 0, as the relu op does
  } else if constexpr (ACT == MmaAct::Gelu || ACT == MmaAct::GeluTanh) {
    return gelu::forward(x, ACT == MmaAct::GeluTanh);  // the gelu op's formula (ops/gelu.cuh)
  } else {
    return x;
  }
}

// Whether the epilogue can also store the pre-activation (MmaArgs::pre): a fused linear -> gelu
// in training, whose gelu_backward reads it. ReLU's backward reads the ReLU's output instead.
template <MmaAct ACT>
constexpr bool kStoresPre = ACT == MmaAct::Gelu || ACT == MmaAct::GeluTanh;

// Stores outputs (row, col) and (row, col + 1) of one batch entry's y (and of its pre-activation
// `pre`, if not null), the second only if col + 1 < N; v0, v1 are the raw sums.
template <class T, MmaAct ACT>
__device__ __forceinline__ void store_pair(const MmaArgs& p, T* y, T* pre, const T* bias,
                                           int64_t row, int64_t col, float v0, float v1) {
  const bool two = col + 1 < p.N;
  v0 *= p.alpha;
  v1 *= p.alpha;
  if (bias) {
    v0 += to_accum<T>(bias[col]);
    if (two) v1 += to_accum<T>(bias[col + 1]);
  }
  const int64_t at = row * p.ldy + col;
  if constexpr (kStoresPre<ACT>)
    if (pre) put_pair<T>(pre + at, v0, v1, two, p.pair);
  // y's store written out rather than through put_pair, which moved nvcc's scheduling of the
  // plain and ReLU kernels' epilogues (8 to 56 more instructions in their SASS).
  v0 = activate<ACT>(v0);
  v1 = activate<ACT>(v1);
  T* out = y + at;
  if (two && p.pair) {
    if constexpr (std::is_same_v<T, float>) {
      *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
    } else if constexpr (std::is_same_v<T, f16>) {
      *reinterpret_cast<__half2*>(out) = __floats2half2_rn(v0, v1);
    } else {
      *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(v0, v1);
    }
  } else {
    out[0] = from_accum<T>(v0);
    if (two) out[1] = from_accum<T>(v1);
  }
}

// Batch entry z's pre-activation output (null where there is none or ACT never stores one).
template <class T, MmaAct ACT>
__device__ __forceinline__ T* pre_of(const MmaArgs& p, int64_t z) {
  if constexpr (kStoresPre<ACT>)
    return p.pre ? static_cast<T*>(p.pre) + z * p.sy : nullptr;
  return nullptr;
}

// ---- the Tensor Core kernel ----

// Copies a Rows x Cols tile (Cols contiguous in memory) of a matrix with `rows` x `cols`
// elements and row stride ld, starting at (row0, col0), into shared memory with row stride Lds.
// cols is a multiple of kVec (checked at creation), so a chunk is all inside or all outside.
template <class T, int Rows, int Cols, int Lds, int Threads>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t ld, int64_t row0, int64_t rows,
                                          int64_t col0, int64_t cols, int tid) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kPerRow = Cols / kVec;
  constexpr int kTotal = Rows * kPerRow;
  constexpr int kIters = (kTotal + Threads - 1) / Threads;
  // With 4 or fewer chunks a row and an odd pitch in chunks (the 16-byte pad), copy c goes to
  // the row and chunk copy_row and copy_chunk give (ops/copy_lanes.cuh): a warp's 32 copies rows
  // first, one wavefront a request. Whole warps of copies (kTotal % 32 == 0), so the same copies
  // as without, by other lanes.
  constexpr bool kRowsFirst = kPerRow <= 4 && (Lds * static_cast<int>(sizeof(T))) % 32 == 16 &&
                              kTotal % 32 == 0;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    int c = tid + it * Threads;
    if constexpr (kRowsFirst) c = copy_row<kPerRow>(c) * kPerRow + copy_chunk<kPerRow>(c);
    if (kTotal % Threads == 0 || c < kTotal) {
      const int r = c / kPerRow, cc = (c % kPerRow) * kVec;
      const int64_t gr = row0 + r, gc = col0 + cc;
      const bool valid = gr < rows && gc < cols;
      cp_async16(smem_addr(s + r * Lds + cc), valid ? g + gr * ld + gc : g, valid);
    }
  }
}

extern __shared__ __align__(16) unsigned char mma_smem[];

// AK: A is K-major (else M-major). BKM: B is K-major (else N-major). SPLIT: write the raw sums
// of this block's K range to p.partial (split-K) instead of the epilogue. Grid: x over M tiles,
// y over N tiles, z over batch x splits (split = z % splits).
template <class T, class TL, bool AK, bool BKM, MmaAct ACT, bool SPLIT>
__global__ void __launch_bounds__(Cfg<T, TL>::kThreads) mma_gemm_kernel(const MmaArgs p) {
  pdl_begin();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async, ldmatrix and these MMAs need sm_80; the host declines older devices
#else
  using C = Cfg<T, TL>;
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, S = C::kStages;
  constexpr int kAElems = C::template tile_elems<AK, BM>();
  constexpr int kBElems = C::template tile_elems<BKM, BN>();
  T* sA = reinterpret_cast<T*>(mma_smem);
  T* sB = sA + S * kAElems;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % C::WARPS_M, warp_n = warp / C::WARPS_M;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int64_t split = static_cast<int64_t>(blockIdx.z) % p.splits;
  const int64_t z = static_cast<int64_t>(blockIdx.z) / p.splits;
  const T* A = static_cast<const T*>(p.a) + z * p.sa;
  const T* B = static_cast<const T*>(p.b) + z * p.sb;
  T* Y = static_cast<T*>(p.y) + z * p.sy;
  const int64_t M = p.M, N = p.N, K = p.K;
  // This block's K range. k_split is a multiple of BK, so no tile straddles two splits and the
  // only bound a chunk needs is K itself.
  const int64_t k_begin = split * p.k_split;
  const int64_t k_end = k_begin + p.k_split < K ? k_begin + p.k_split : K;

  auto load_stage = [&](int stage, int64_t kt) {
    const int64_t k0 = k_begin + kt * BK;
    T* a = sA + stage * kAElems;
    T* b = sB + stage * kBElems;
    if constexpr (AK)
      load_tile<T, BM, BK, C::kLdK, C::kThreads>(a, A, p.lda, m0, M, k0, K, tid);
    else
      load_tile<T, BK, BM, C::kLdM, C::kThreads>(a, A, p.lda, k0, K, m0, M, tid);
    if constexpr (BKM)
      load_tile<T, BN, BK, C::kLdK, C::kThreads>(b, B, p.ldb, n0, N, k0, K, tid);
    else
      load_tile<T, BK, BN, C::kLdN, C::kThreads>(b, B, p.ldb, k0, K, n0, N, tid);
  };

  float acc[C::MI][C::NI][4];
#pragma unroll
  for (int i = 0; i < C::MI; ++i)
#pragma unroll
    for (int j = 0; j < C::NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  const int64_t ktiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
  // Prologue: tiles 0 .. S-2 in flight, one commit group each (empty past the end, so that the
  // count of groups, and with it wait_group's meaning, is the same in every thread and step).
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }

  for (int64_t kt = 0; kt < ktiles; ++kt) {
    // S - 1 + kt groups committed so far; at most S - 2 pending means tile kt has landed (this
    // thread's part), and the barrier makes every thread's part visible. The barrier also
    // tells that every warp is done with tile kt - 1, whose stage the next load overwrites.
    cp_async_wait<S - 2>();
    __syncthreads();
    const int64_t next = kt + S - 1;
    if (next < ktiles) load_stage(static_cast<int>(next % S), next);
    cp_async_commit();

    const int stage = static_cast<int>(kt % S);
    const T* a_s = sA + stage * kAElems;
    const T* b_s = sB + stage * kBElems;
#pragma unroll
    for (int kk = 0; kk < BK; kk += C::kStepK) {
      uint32_t af[C::MI][4];
      uint32_t bf[C::NI][2];
      if constexpr (!C::kF32) {
        // A fragment of m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"): register j of
        // lane (g = lane / 4, t = lane % 4) holds A[g + 8 (j & 1)][2t + 8 (j >> 1) + {0, 1}],
        // i.e. the four 8x8 quarters (rows 0-7 | 8-15) x (k 0-7 | 8-15) in the order
        // (0,0), (1,0), (0,1), (1,1); ldmatrix.x4 gives register j the 8x8 matrix whose rows
        // lanes 8j .. 8j+7 address, lane holding row lane / 4, columns 2 (lane % 4) + {0, 1}.
#pragma unroll
        for (int mi = 0; mi < C::MI; ++mi) {
          const int r0 = warp_m * C::WM + mi * 16;
          uint32_t addr;
          if constexpr (AK) {
            // Stored [m][k]: lane addresses row m = lane % 16, k offset 8 (lane / 16).
            addr = smem_addr(a_s + (r0 + (lane & 15)) * C::kLdK + kk + (lane >> 4) * 8);
            ldmatrix_x4(af[mi], addr);
          } else {
            // Stored [k][m]: each quarter is read as 8 rows of k and transposed by .trans;
            // quarter j = lane / 8 has m offset 8 (j & 1) and k offset 8 (j >> 1).
            addr = smem_addr(a_s + (kk + (lane & 7) + (lane >> 4) * 8) * C::kLdM + r0 +
                             ((lane >> 3) & 1) * 8);
            ldmatrix_x4_trans(af[mi], addr);
          }
        }
        // B fragment: register j of lane (g, t) holds B[k = 2t + 8j + {0, 1}][n = g], i.e.
        // row g of Bᵀ (n-major), k 0-7 then 8-15. One ldmatrix.x4 loads two n8 tiles:
        // quarters (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
#pragma unroll
        for (int nj = 0; nj < C::NI / 2; ++nj) {
          const int c0 = warp_n * C::WN + nj * 16;
          uint32_t r[4];
          if constexpr (BKM) {
            // Stored [n][k]: quarter j = lane / 8 has n offset 8 (j >> 1), k offset 8 (j & 1).
            const uint32_t addr = smem_addr(b_s + (c0 + (lane & 7) + (lane >> 4) * 8) * C::kLdK +
                                            kk + ((lane >> 3) & 1) * 8);
            ldmatrix_x4(r, addr);
          } else {
            // Stored [k][n]: rows of k, transposed; same quarter order.
            const uint32_t addr = smem_addr(
                b_s + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * C::kLdN + c0 + (lane >> 4) * 8);
            ldmatrix_x4_trans(r, addr);
          }
          bf[2 * nj][0] = r[0];
          bf[2 * nj][1] = r[1];
          bf[2 * nj + 1][0] = r[2];
          bf[2 * nj + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < C::MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < C::NI; ++ni) mma_16816<T>(acc[mi][ni], af[mi], bf[ni]);
      } else {
        // TF32 m16n8k8 ("Matrix Fragments for mma.m16n8k8", .tf32): lane (g, t) holds
        // a0 = A[g][t], a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4] and
        // b0 = B[t][g], b1 = B[t + 4][g]. 32-bit elements have no ldmatrix transpose, so each
        // is a scalar shared load (conflict-free, see kPadK / kPadMN).
        const int g = lane >> 2, t = lane & 3;
        auto a_at = [&](int m, int k) -> float {
          if constexpr (AK)
            return a_s[m * C::kLdK + k];
          else
            return a_s[k * C::kLdM + m];
        };
        auto b_at = [&](int n, int k) -> float {
          if constexpr (BKM)
            return b_s[n * C::kLdK + k];
          else
            return b_s[k * C::kLdN + n];
        };
#pragma unroll
        for (int mi = 0; mi < C::MI; ++mi) {
          const int r = warp_m * C::WM + mi * 16 + g;
          af[mi][0] = to_tf32(a_at(r, kk + t));
          af[mi][1] = to_tf32(a_at(r + 8, kk + t));
          af[mi][2] = to_tf32(a_at(r, kk + t + 4));
          af[mi][3] = to_tf32(a_at(r + 8, kk + t + 4));
        }
#pragma unroll
        for (int ni = 0; ni < C::NI; ++ni) {
          const int c = warp_n * C::WN + ni * 8 + g;
          bf[ni][0] = to_tf32(b_at(c, kk + t));
          bf[ni][1] = to_tf32(b_at(c, kk + t + 4));
        }
#pragma unroll
        for (int mi = 0; mi < C::MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < C::NI; ++ni) mma_1688_tf32(acc[mi][ni], af[mi], bf[ni]);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be left; drain them before the block exits

  // Accumulator fragment (both shapes): c0, c1 at row g, columns 2t, 2t + 1; c2, c3 at row g + 8.
  const int g = lane >> 2, t = lane & 3;
  if constexpr (SPLIT) {
    // Raw f32 sums into this split's slice; pairs as one 8-byte store where aligned (always,
    // for an aligned workspace and even N: col is even).
    float* part = p.partial + (split * p.batch + z) * M * N;
#pragma unroll
    for (int mi = 0; mi < C::MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + warp_m * C::WM + mi * 16 + g + 8 * h;
        if (row >= M) continue;
#pragma unroll
        for (int ni = 0; ni < C::NI; ++ni) {
          const int64_t col = n0 + warp_n * C::WN + ni * 8 + 2 * t;
          if (col >= N) continue;
          float* out = part + row * N + col;
          if (col + 1 < N && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
            *reinterpret_cast<float2*>(out) =
                make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
          } else {
            out[0] = acc[mi][ni][2 * h];
            if (col + 1 < N) out[1] = acc[mi][ni][2 * h + 1];
          }
        }
      }
    }
    // The tile's split sums (split_sum, device.cuh: two levels in a fixed order), then
    // y = act(alpha · sum + bias), one rounding, as the unsplit epilogue computes it from its one
    // sum.
    unsigned* const counters = p.done + ((z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) *
                                            split_sum_counters(static_cast<unsigned>(p.splits));
    const T* bias = static_cast<const T*>(p.bias);
    T* const pre = pre_of<T, ACT>(p, z);
    split_sum(
        counters, p.partial, p.batch * M * N, static_cast<unsigned>(p.splits),
        static_cast<unsigned>(split), BM * BN,
        [&](int e) -> int64_t {
          const int64_t row = m0 + e / BN, col = n0 + e % BN;
          return row < M && col < N ? z * M * N + row * N + col : -1;
        },
        [&](int e, int64_t, float v) {
          const int64_t row = m0 + e / BN, col = n0 + e % BN;
          v *= p.alpha;
          if (bias) v += to_accum<T>(bias[col]);
          if constexpr (kStoresPre<ACT>)
            if (pre) pre[row * p.ldy + col] = from_accum<T>(v);
          Y[row * p.ldy + col] = from_accum<T>(activate<ACT>(v));
        });
  } else {
    const T* bias = static_cast<const T*>(p.bias);
    T* const pre = pre_of<T, ACT>(p, z);
#pragma unroll
    for (int mi = 0; mi < C::MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + warp_m * C::WM + mi * 16 + g + 8 * h;
        if (row >= M) continue;
#pragma unroll
        for (int ni = 0; ni < C::NI; ++ni) {
          const int64_t col = n0 + warp_n * C::WN + ni * 8 + 2 * t;
          if (col >= N) continue;
          store_pair<T, ACT>(p, Y, pre, bias, row, col, acc[mi][ni][2 * h],
                             acc[mi][ni][2 * h + 1]);
        }
      }
    }
  }
#endif
}

// ---- the fallback for operands that are not 16-byte aligned ----
// A plain SIMT GEMM over element strides (ops/simt_gemm.cuh: a 16 x 16 tile, f32 accumulation
// in the same k order for every output); the same epilogue. f32 inputs are multiplied in full
// f32 here (more exact than the TF32 path, never less).
template <class T, MmaAct ACT>
__global__ void __launch_bounds__(kSimtTile* kSimtTile)
    simt_gemm_kernel(const MmaArgs p, int64_t sam, int64_t sak, int64_t sbk, int64_t sbn) {
  pdl_begin();
  const int tx = static_cast<int>(threadIdx.x) % kSimtTile;
  const int ty = static_cast<int>(threadIdx.x) / kSimtTile;
  const int64_t z = blockIdx.z;
  const T* A = static_cast<const T*>(p.a) + z * p.sa;
  const T* B = static_cast<const T*>(p.b) + z * p.sb;
  T* Y = static_cast<T*>(p.y) + z * p.sy;
  const int64_t mb = static_cast<int64_t>(blockIdx.x) * kSimtTile;
  const int64_t nb = static_cast<int64_t>(blockIdx.y) * kSimtTile;
  const float acc = simt_tile_dot(A, B, p.M, p.N, p.K, sam, sak, sbk, sbn, mb, nb);
  const int64_t row = mb + ty, col = nb + tx;
  if (row >= p.M || col >= p.N) return;
  float v = acc * p.alpha;
  if (p.bias) v += to_accum<T>(static_cast<const T*>(p.bias)[col]);
  if constexpr (kStoresPre<ACT>)
    if (T* pre = pre_of<T, ACT>(p, z)) pre[row * p.ldy + col] = from_accum<T>(v);
  Y[row * p.ldy + col] = from_accum<T>(activate<ACT>(v));
}

// ---- host side ----

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// One GEMM (or a strided batch of them) as the kernels see it, fixed at creation.
using MmaShape = GemmProblem;

// A launch's arguments for shape s (no split: splits 1, k_split K).
template <class T>
MmaArgs gemm_args(const MmaShape& s, const void* a, const void* b, void* y, const void* bias,
                  void* pre = nullptr) {
  MmaArgs p{};
  p.a = a, p.b = b, p.y = y, p.bias = s.bias ? bias : nullptr;
  p.pre = pre;
  p.M = s.M, p.N = s.N, p.K = s.K;
  p.lda = s.a_kmajor ? s.K : s.M;
  p.ldb = s.b_kmajor ? s.K : s.N;
  p.ldy = s.N;
  p.sa = s.sa, p.sb = s.sb, p.sy = s.M * s.N;
  p.alpha = s.alpha;
  p.batch = s.batch;
  p.splits = 1;
  p.k_split = s.K;
  // Two columns at once need y's (and pre's) row starts and batch entries aligned to two
  // elements.
  p.pair = s.N % 2 == 0 && reinterpret_cast<uintptr_t>(y) % (2 * sizeof(T)) == 0 &&
           reinterpret_cast<uintptr_t>(pre) % (2 * sizeof(T)) == 0;
  return p;
}

// The SIMT kernel over shape s, any alignment.
template <class T, MmaAct ACT>
void launch_simt(const MmaArgs& p, const MmaShape& s, cudaStream_t stream) {
  const int64_t sam = s.a_kmajor ? p.lda : 1, sak = s.a_kmajor ? 1 : p.lda;
  const int64_t sbk = s.b_kmajor ? 1 : p.ldb, sbn = s.b_kmajor ? p.ldb : 1;
  const dim3 grid(static_cast<unsigned>((s.M + kSimtTile - 1) / kSimtTile),
                  static_cast<unsigned>((s.N + kSimtTile - 1) / kSimtTile),
                  static_cast<unsigned>(s.batch));
  launch_kernel(simt_gemm_kernel<T, ACT>, grid, kSimtTile * kSimtTile, 0, stream, p, sam, sak, sbk,
                sbn);
}

// Whether the grids of both kernels can hold shape s: x over M tiles (2^31 - 1 blocks), y over
// N tiles and z over the batch (65535 each).
void check_grid(const MmaShape& s, const char* op) {
  const int64_t mt = (s.M + kSimtTile - 1) / kSimtTile, nt = (s.N + kSimtTile - 1) / kSimtTile;
  PLX_DECLINE_UNLESS(mt <= INT32_MAX && nt <= 65535 && s.batch <= 65535,
                     "%s: (%lld x %lld, batch %lld) needs more blocks than a grid has", op,
                     static_cast<long long>(s.M), static_cast<long long>(s.N),
                     static_cast<long long>(s.batch));
}

using MmaFn = void (*)(MmaArgs);
using SimtFn = void (*)(MmaArgs, int64_t, int64_t, int64_t, int64_t);

// The activations are only for linear (both operands K-major): the other layouts are built
// for MmaAct::None alone.
template <class T, class TL, MmaAct ACT, bool SPLIT>
MmaFn pick_kernel(bool ak, bool bk) {
  if (ak && bk) return mma_gemm_kernel<T, TL, true, true, ACT, SPLIT>;
  if constexpr (ACT != MmaAct::None) {
    throw sdk::Unsupported("an epilogue activation needs both operands K-major (linear)");
  } else {
    if (ak) return mma_gemm_kernel<T, TL, true, false, ACT, SPLIT>;
    if (bk) return mma_gemm_kernel<T, TL, false, true, ACT, SPLIT>;
    return mma_gemm_kernel<T, TL, false, false, ACT, SPLIT>;
  }
}
template <class T, class TL>
int smem_for(bool ak, bool bk) {
  using C = Cfg<T, TL>;
  if (ak && bk) return C::template smem_bytes<true, true>();
  if (ak) return C::template smem_bytes<true, false>();
  if (bk) return C::template smem_bytes<false, true>();
  return C::template smem_bytes<false, false>();
}

// Split-K (the "_splitk" candidate): only when the output tiles alone leave the device idle.
// Enough splits for about two blocks per SM, at least kMinTilesPerSplit K tiles each, at most
// kMaxSplits (plan_split_k, ops/gemm_problem.hpp).
constexpr int64_t kMinTilesPerSplit = 2;
constexpr int64_t kMaxSplits = 16;

// The launch of one MmaShape with tile TL and activation ACT (and split K with SPLIT): checks
// at creation whether the kernel can take it (declining otherwise), then launches with no
// further checks.
template <class T, class TL, MmaAct ACT, bool SPLIT>
class MmaPlan {
 public:
  using C = Cfg<T, TL>;

  MmaPlan(const MmaShape& s, int32_t device, CudaBackend& backend, const char* op)
      : s_(s), device_(device) {
    constexpr plx_dtype kDtype = dtype_v<T>;
    PLX_DECLINE_UNLESS(!C::kF32 || backend.options().tf32,
                       "%s: f32 on Tensor Cores is TF32, and the cuda tf32 option is off", op);
    // cp.async copies 16-byte chunks that must be all inside or all outside a row, from rows
    // that start 16-byte aligned: the contiguous dimension of each operand must be a multiple
    // of 16 bytes (the cuBLASLt kernel takes the other shapes).
    const int64_t a_row = s.a_kmajor ? s.K : s.M;
    const int64_t b_row = s.b_kmajor ? s.K : s.N;
    PLX_DECLINE_UNLESS(a_row % C::kVec == 0,
                       "%s: the contiguous dimension of the first operand (%lld %s) is not a "
                       "multiple of 16 bytes, as the cp.async copies need",
                       op, static_cast<long long>(a_row), dtype_name(kDtype));
    PLX_DECLINE_UNLESS(b_row % C::kVec == 0,
                       "%s: the contiguous dimension of the second operand (%lld %s) is not a "
                       "multiple of 16 bytes, as the cp.async copies need",
                       op, static_cast<long long>(b_row), dtype_name(kDtype));
    check_grid(s, op);  // for this kernel and for the 16x16 fallback
    use_device(device_);
    const DeviceContext& ctx = backend.context(device_);
    PLX_DECLINE_UNLESS(ctx.prop.major >= 8, "%s: mma.sync with cp.async needs sm_80 or newer", op);
    smem_ = smem_for<T, TL>(s.a_kmajor, s.b_kmajor);
    PLX_DECLINE_UNLESS(static_cast<size_t>(smem_) <= ctx.prop.sharedMemPerBlockOptin,
                       "%s: %s needs %d bytes of shared memory, the device allows %zu", op,
                       TL::kName, smem_, static_cast<size_t>(ctx.prop.sharedMemPerBlockOptin));
    if constexpr (SPLIT) {
      const int64_t blocks = ((s.M + C::BM - 1) / C::BM) * ((s.N + C::BN - 1) / C::BN) * s.batch;
      const int64_t sms = ctx.prop.multiProcessorCount;
      const SplitK k = plan_split_k(s, blocks, (s.K + C::BK - 1) / C::BK, sms,
                                    blocks > 0 ? (2 * sms + blocks - 1) / blocks : 0,  // 2/SM
                                    kMinTilesPerSplit, kMaxSplits, op);
      k_split_ = k.per * C::BK;
      splits_ = k.splits;
      workspace_ = k.workspace;
      done_ = BlockCounter(blocks * split_sum_counters(static_cast<unsigned>(splits_)));
    }
    kernel_ = pick_kernel<T, TL, ACT, SPLIT>(s.a_kmajor, s.b_kmajor);
    // The attribute stays set for every later launch (common.hpp: it only grows).
    if (smem_ > 48 * 1024) allow_dynamic_smem(kernel_, smem_);
  }

  // f32 partial sums of the splits (0 without split-K).
  uint64_t workspace_bytes() const { return workspace_; }

  // y (batch, M, N) from a, b (and bias, null if none), on `stream`; ws: workspace_bytes().
  // `pre`: where a GELU epilogue also stores the pre-activation (null: nowhere).
  void run(const void* a, const void* b, void* y, const void* bias, void* ws, cudaStream_t stream,
           void* pre = nullptr) const {
    if (s_.M == 0 || s_.N == 0 || s_.batch == 0) return;
    MmaArgs p = gemm_args<T>(s_, a, b, y, bias, pre);
    p.splits = splits_;
    p.k_split = SPLIT ? k_split_ : s_.K;
    p.partial = static_cast<float*>(ws);
    p.done = done_.p;
    const unsigned z = static_cast<unsigned>(s_.batch);
    if (aligned16(a) && aligned16(b)) {
      const dim3 grid(static_cast<unsigned>((s_.M + C::BM - 1) / C::BM),
                      static_cast<unsigned>((s_.N + C::BN - 1) / C::BN), z * splits_);
      launch_kernel(kernel_, grid, C::kThreads, static_cast<size_t>(smem_), stream, p);
    } else {
      launch_simt<T, ACT>(p, s_, stream);  // one pass, no partials: it sums all of K itself
    }
  }

 private:
  MmaShape s_;
  int32_t device_;
  int smem_ = 0;
  MmaFn kernel_ = nullptr;
  int32_t splits_ = 1;
  int64_t k_split_ = 0;
  uint64_t workspace_ = 0;
  BlockCounter done_{0};  // split-K: split_sum counters per batch entry and output tile
};

// The SIMT kernel as a candidate of its own (kSimtName): every shape the GEMM problem
// describes, at any alignment, and f32 in full f32 whatever the tf32 option. It takes what every
// Tensor Core tile declines (rows that are not 16-byte multiples, such as the weight gradient of
// a 10-class classifier, whose dlogits rows are 10 elements; f32 with TF32 off), so the native
// side of backend.kernels has a kernel of its own for every GEMM. Slow on large shapes, which
// the tuner measures; registered last, so the native side's first choice stays a tile.
template <class T, MmaAct ACT>
class SimtPlan {
 public:
  SimtPlan(const MmaShape& s, int32_t, CudaBackend&, const char* op) : s_(s) { check_grid(s, op); }

  uint64_t workspace_bytes() const { return 0; }

  void run(const void* a, const void* b, void* y, const void* bias, void*, cudaStream_t stream,
           void* pre = nullptr) const {
    if (s_.M == 0 || s_.N == 0 || s_.batch == 0) return;
    launch_simt<T, ACT>(gemm_args<T>(s_, a, b, y, bias, pre), s_, stream);
  }

 private:
  MmaShape s_;
};

constexpr const char* kSimtName = "simt_16x16";

// y (..., M, N) = alpha op(a) op(b): one GEMM when the batch folds into rows or is 1, a strided
// batch (grid z) when each operand's batch dims are all full or all broadcast; declines batch
// dims that broadcast partially (cuBLASLt's kernel loops over those). Plan: an MmaPlan (a tile)
// or the SimtPlan.
template <class T, class Plan>
class GemmMatmul final : public Kernel {
 public:
  GemmMatmul(const NodeInfo& node, CudaBackend& backend)
      : device_(node.device()), plan_(shape(node), device_, backend, "matmul") {}

  uint64_t workspace_bytes() const override { return plan_.workspace_bytes(); }

  void compute(const KernelCall& c) override {
    use_device(device_);
    plan_.run(c.in(0).data, c.in(1).data, c.out(0).data, nullptr, c.workspace, native(c.stream));
  }

 private:
  static MmaShape shape(const NodeInfo& node) { return matmul_problem(node, dtype_v<T>); }

  int32_t device_;
  Plan plan_;
};

// y (..., out) = act(x (..., in) wᵀ + b): one GEMM over all rows of x, the bias and the
// activation in the epilogue. Registered with MmaAct::None; the other activations are for fused
// linear -> activation groups (make_mma_linear).
template <class T, class Plan>
class GemmLinear final : public Kernel {
 public:
  GemmLinear(const NodeInfo& node, CudaBackend& backend)
      : device_(node.device()), plan_(shape(node), device_, backend, "linear") {}

  uint64_t workspace_bytes() const override { return plan_.workspace_bytes(); }

  // A second output, where the fused linear -> gelu group keeps the pre-activation, takes it
  // (GELU epilogues only: make_mma_linear).
  void compute(const KernelCall& c) override {
    use_device(device_);
    const void* bias = c.has_in(2) ? c.in(2).data : nullptr;
    void* pre = c.num_outputs > 1 ? c.out(1).data : nullptr;
    plan_.run(c.in(0).data, c.in(1).data, c.out(0).data, bias, c.workspace, native(c.stream), pre);
  }

 private:
  static MmaShape shape(const NodeInfo& node) { return linear_problem(node, dtype_v<T>); }

  int32_t device_;
  Plan plan_;
};

template <class T, class TL, MmaAct ACT, bool SPLIT = false>
using MmaLinear = GemmLinear<T, MmaPlan<T, TL, ACT, SPLIT>>;

template <class T, class TL, bool SPLIT = false>
std::unique_ptr<Kernel> make_linear_for(const NodeInfo& node, CudaBackend& backend, MmaAct act) {
  switch (act) {
    case MmaAct::None:
      return std::make_unique<MmaLinear<T, TL, MmaAct::None, SPLIT>>(node, backend);
    case MmaAct::Relu:
      return std::make_unique<MmaLinear<T, TL, MmaAct::Relu, SPLIT>>(node, backend);
    case MmaAct::Gelu:
      return std::make_unique<MmaLinear<T, TL, MmaAct::Gelu, SPLIT>>(node, backend);
    case MmaAct::GeluTanh:
      return std::make_unique<MmaLinear<T, TL, MmaAct::GeluTanh, SPLIT>>(node, backend);
  }
  throw sdk::Unsupported("linear: unknown epilogue activation");
}

// The split-K candidate: the small tile with K spread over grid z, for outputs too small to
// fill the device (128 x 128 is 16 blocks of 32 x 32); it declines the shapes that need no split.
constexpr const char* kSplitName = "mma_sync_32x32x64_splitk";

// A fused linear -> activation group's linear on `tile`, the split-K candidate's name included
// (its finishing block applies the activation).
template <class T>
std::unique_ptr<Kernel> make_linear_tile(const NodeInfo& node, CudaBackend& backend,
                                         const std::string& tile, MmaAct act) {
  if (tile == TileLarge::kName) return make_linear_for<T, TileLarge>(node, backend, act);
  if (tile == TileMid::kName) return make_linear_for<T, TileMid>(node, backend, act);
  if (tile == TileSmall::kName) return make_linear_for<T, TileSmall>(node, backend, act);
  if (tile == kSplitName) return make_linear_for<T, TileSmall, true>(node, backend, act);
  throw sdk::Unsupported(sdk::format("linear: no Tensor Core tile named '%s'", tile.c_str()));
}

template <class T, class TL, bool SPLIT>
void add_tile(KernelRegistry& r, const char* name, uint32_t flags) {
  constexpr plx_dtype d = dtype_v<T>;
  r.add<GemmMatmul<T, MmaPlan<T, TL, MmaAct::None, SPLIT>>, CudaBackend>("matmul", d, name, flags);
  r.add<MmaLinear<T, TL, MmaAct::None, SPLIT>, CudaBackend>("linear", d, name, flags);
}

template <class T>
void add_dtype(KernelRegistry& r, uint32_t flags) {
  add_tile<T, TileLarge, false>(r, TileLarge::kName, flags);
  add_tile<T, TileMid, false>(r, TileMid::kName, flags);
  add_tile<T, TileSmall, false>(r, TileSmall::kName, flags);
  add_tile<T, TileSmall, true>(r, kSplitName, flags);
}

template <class T>
void add_simt(KernelRegistry& r, uint32_t flags) {
  using Plan = SimtPlan<T, MmaAct::None>;
  r.add<GemmMatmul<T, Plan>, CudaBackend>("matmul", dtype_v<T>, kSimtName, flags);
  r.add<GemmLinear<T, Plan>, CudaBackend>("linear", dtype_v<T>, kSimtName, flags);
}

}  // namespace

std::unique_ptr<Kernel> make_mma_linear(const NodeInfo& node, CudaBackend& backend,
                                        const std::string& tile, MmaAct act) {
  switch (static_cast<plx_dtype>(node.input(0).dtype)) {
    case PLX_F32:
      return make_linear_tile<float>(node, backend, tile, act);
    case PLX_F16:
      return make_linear_tile<f16>(node, backend, tile, act);
    case PLX_BF16:
      return make_linear_tile<bf16>(node, backend, tile, act);
    default:
      break;
  }
  throw sdk::Unsupported(sdk::format("linear: Tensor Core kernels take f32, f16 or bf16, not %s",
                                     dtype_name(static_cast<plx_dtype>(node.input(0).dtype))));
}

void register_mma_gemm(KernelRegistry& r) {
  // No PLX_KERNEL_LIBRARY: these are the "native" side of backend.kernels. Split-K stays
  // deterministic: the partials are summed in split order by one thread per output.
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_dtype<bf16>(r, f);
  add_dtype<f16>(r, f);
  add_dtype<float>(r, f);
}

void register_simt_gemm(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_simt<bf16>(r, f);
  add_simt<f16>(r, f);
  add_simt<float>(r, f);
}

}  // namespace plexus::cuda
