// CUDA kernels: an implicit-GEMM convolution of our own on the Tensor Cores (mma.sync
// m16n8k16 for f16 and bf16, m16n8k8 TF32 for f32; f32 accumulation), as candidates beside
// cuDNN for
//
//   conv2d                   y  = conv(x, w) (+ b)
//   conv2d_backward_data     dx = convᵀ(dy, w)   (stride 1 only: see below)
//   conv2d_backward_weight   dw = Σ_n dy_n ⋆ x_n (split-K with a fixed-order sum; see its kernel)
//
// The GEMM view of the forward: M = N·OH·OW output pixels, N_gemm = O output channels,
// K = KH·KW·C taps times input channels, with k = (kh·KW + kw)·C + c. Row m of A is the receptive
// field of pixel m gathered from x in NHWC (channels innermost, so 8 consecutive k are 16
// contiguous bytes of one pixel of one tap); column o of B is the filter of output channel o in
// channels-last order (O, KH, KW, C), which is exactly a row-major (O, K) matrix. Both tiles are
// therefore K-contiguous, the "TN" case: each is copied to shared memory with 16-byte cp.async
// (zero-filled where the tap falls in the padding, past M, past O or past K), then read with
// ldmatrix (no transpose) straight into mma.sync's A and B fragments.
//
// conv2d_backward_data with stride 1 is the same kernel: dx = conv(dy, w'), with the filter
// flipped and transposed, w'[c, kh, kw, o] = w[o, c, KH-1-kh, KW-1-kw], and padding KH-1-ph,
// KW-1-pw (which needs ph <= KH-1, pw <= KW-1). B[k][n] = w'[n, tap, o] for k = tap·O + o is
// then contiguous along n = c in a channels-last filter (O, KH, KW, C), not along k: with such a
// filter the kernel reads it in place (the BT variant: B stored k-major in shared memory, as the
// weight gradient stores its operands, and read with ldmatrix.trans), so no flipped copy is
// made; an NCHW filter is still rearranged into w' in the workspace first. With a stride above 1 dx
// is a sum over a stride-dependent subset of taps per output pixel (a strided "dgrad" kernel); that
// is not done here and such nodes are declined.
//
// Layouts. The core has no layout planner yet (it hands every kernel contiguous NCHW outputs and,
// unless a producer made them otherwise, NCHW inputs), so these kernels take both layouts a
// cuDNN kernel takes rather than only NHWC:
// - x and dy (the activations a kernel reads): channels-last is read in place; NCHW contiguous
//   is transposed to NHWC in the workspace first (a tiled transpose, one extra read and write);
// - w: channels-last (O, KH, KW, C) is read in place (backward data: the BT variant, when C % 8
//   == 0); otherwise it is rearranged in the workspace (small);
// - y and dx: written in their own layout by the epilogue (NHWC through shared memory, 16 bytes
//   at a time; NCHW with scalar stores along the pixel dimension); dw through the slice sum, in
//   either layout.
// The channel counts the 16-byte copies run along (C for the forward, O for backward data, both
// for the weight gradient) must be multiples of 8, so that every 16-byte piece stays inside one
// pixel and is aligned; other nodes (the first layer of our models has C = 1) are declined.
// TF32 (f32, igemm_tf32_kernel and igemm_wgrad_tf32_kernel below) gathers its operands 4 bytes at
// a time through a table of k offsets made at creation, so it reads and writes every layout in
// place (no staging, no filter copy, no BT variant) and takes any channel count of 8 or more; the
// forward and backward data gather a channels-last activation whose channels are a multiple of
// 4 16 bytes (4 channels of one tap) at a time instead, through the same table.
//
// Pipeline: STAGES shared-memory buffers per operand, filled by cp.async groups; iteration kt
// waits for group kt (cp.async.wait_group STAGES-2), syncs the block, issues the copy of tile
// kt+STAGES-1 into the buffer computed at iteration kt-1 (free, since every thread has passed
// the barrier after computing it), then computes tile kt. Shared rows are padded by 16 bytes
// (BK + 8 elements), which makes ldmatrix's eight 16-byte row reads hit 32 distinct banks.
//
// Epilogue: the f32 accumulator, plus the bias (in f32), optionally through a ReLU (a kernel
// argument: a fused conv2d -> relu whose conv the host gave to this kernel, make_igemm_conv; the
// relu op's formula and NaN rule, x > 0 ? x : 0), is rounded once to the output dtype, and
// staged through shared memory where the output is channels-last or pooled ("the staged
// epilogues", below). No atomics and a fixed summation order: deterministic. Nothing is
// allocated and nothing synchronised: capturable.
//
// Files: this header holds the kernels and their host classes, as templates; igemm_conv_f16.cu,
// igemm_conv_bf16.cu and igemm_conv_f32.cu instantiate them for one dtype each (so nvcc compiles
// the three in parallel, and a change to one dtype's path rebuilds one file), igemm_wgmma.cu
// instantiates the Hopper tiles (igemm_wgmma_kernel, sm_90a only), and igemm_conv.cpp registers
// them and builds the fused forwards by the node's dtype.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "device.cuh"
#include "ops/conv_strides.hpp"
#include "ops/copy_lanes.cuh"
#include "ops/igemm_conv.hpp"
#include "ops/mma_ptx.cuh"
#include "ops/tma_map.hpp"
#include "ops/wgmma_desc.cuh"
#include "ops/wgmma_ptx.cuh"
#include "plexus/sdk/fusion_conv_pool.hpp"

// The sm_90a translation unit (igemm_wgmma.cu) defines PLX_IGEMM_TU as hopper before including
// this header: its instantiations of what the other units instantiate too (the staging kernels,
// the host classes) then get names of their own, so that no kernel symbol is defined by units
// built for different architectures (the linker keeps one of such a pair, and with it one
// unit's registration, which might be the sm_90a one on an sm_80 device).
#ifndef PLX_IGEMM_TU
#define PLX_IGEMM_TU mma
#endif

namespace plexus::cuda::igemm {
inline namespace PLX_IGEMM_TU {

// ---- tile configurations ----
//
// BM x BN output tile per block, BK deep per pipeline stage; each warp computes WM x WN of it as
// (WM/16) x (WN/8) mma tiles of 16 x 8.
template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr bool kWgmma = false, kIm2col = false, kPersistent = false, kWarpSpec = false;
  static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int MI = WM / 16, NI = WN / 8;  // mma tiles per warp
  static constexpr int LDS = BK + 8;               // shared row length in elements (16 B pad)
  static constexpr int CPR = BK / 8;               // 16-byte chunks per row of a stage
  static constexpr int A_ITERS = BM * CPR / THREADS, B_ITERS = BN * CPR / THREADS;
  static constexpr int SMEM = STAGES * (BM + BN) * LDS * 2;  // bytes (2-byte elements)
  // B stored k-major (backward data reading a channels-last filter in place): BK rows of BN
  // columns, 16 bytes of padding per row, BN / 8 chunks per row.
  static constexpr int LDB_T = BN + 8, CB_T = BN / 8;
  static constexpr int B_ITERS_T = BK * CB_T / THREADS;
  static constexpr int SMEM_T = STAGES * (BM * LDS + BK * LDB_T) * 2;

  static_assert(BM % WM == 0 && BN % WN == 0, "warp tiles must divide the block tile");
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile: 16-row A and pairs of 8-column B");
  static_assert(BK % 16 == 0, "BK is a multiple of the mma's K (16)");
  static_assert(THREADS % CPR == 0, "each thread keeps one chunk column");
  static_assert((BM * CPR) % THREADS == 0 && (BN * CPR) % THREADS == 0,
                "the copies of a stage spread evenly over the threads");
  static_assert(STAGES >= 2, "at least double buffering");
  static_assert(THREADS % CB_T == 0 && (BK * CB_T) % THREADS == 0,
                "the k-major B copies spread evenly over the threads");

  static std::string name() {
    return "igemm_mma_" + std::to_string(BM) + "x" + std::to_string(BN) + "x" + std::to_string(BK);
  }
};

// The candidates: O = 32, 64, 128 in our models (simplecnn, convnet), M = N·OH·OW in the
// thousands to hundreds of thousands, K = 144 to 576.
using Tile128x128 = Tile<128, 128, 32, 64, 32, 3>;  // 8 warps, 60 KiB shared (opt-in)
using Tile128x64 = Tile<128, 64, 32, 64, 32, 3>;    // 4 warps, 45 KiB
using Tile64x64 = Tile<64, 64, 32, 32, 32, 4>;      // 4 warps, 40 KiB
using Tile128x32 = Tile<128, 32, 32, 32, 32, 3>;    // 4 warps, 37.5 KiB
// Two shapes for the narrow sides of our models' backward passes (twenty-sixth session, after
// the H100's profile put convnet's conv2 backward at 24 TFLOP/s on 128x32 and 128x128 tiles):
// a weight gradient with O = 64 (M) fills only half of a 128-row tile, so 64 rows with 32x64
// warp tiles (as many mma per fragment load as 128x128's 64x32); backward data into C = 32
// channels (N) gets 32x32 warp tiles from 128x32, so 256 rows with 64x32 warp tiles. TF32 wants
// a row per thread (THREADS a multiple of BM), so 256x32 is for 16 bits only.
using Tile64x128 = Tile<64, 128, 32, 32, 64, 3>;    // 4 warps, 45 KiB
using Tile256x32 = Tile<256, 32, 32, 64, 32, 3>;    // 4 warps, 67.5 KiB (opt-in); f16/bf16

// The Hopper tiles (sm_90a: igemm_wgmma_kernel below): BM / 64 warp groups, each owning 64 rows
// and all BN columns of the block tile, one wgmma.m64nBNk16 per 16 of k; BK = 64 (a 128-byte row
// of 16-bit elements: one row of the 128-byte swizzle). To the epilogues a warp w is a warp tile
// of 16 rows (WM) and all BN columns (WN): the wgmma accumulator fragment of warp w of a warp
// group is mma.sync's C fragment of rows 16 w.., 8-column tile by 8-column tile.
// kIm2col_: the forward's and backward data's A through the TMA's im2col mode as well
// (igemm_wgmma_im2col_kernel), where the plain tiles gather it with cp.async. kWarpSpec_ (im2col
// only): a producer warp after the warp groups issues every copy, and the warp groups release
// each stage through an mbarrier of its own (the weight gradient's igemm_wgmma_wgrad_ws_kernel).
// kPersistent_ (the forward's and backward data's; warp-specialized too): the blocks walk the
// output tiles (igemm_wgmma_im2col_persistent_kernel).
// BK_, CW_ (im2col only): the K tile, and the channels of one im2col copy's row. 64 and 64: rows
// of 128 bytes with the 128-byte swizzle. The narrow tiles take 32 channels a copy, in rows of 64
// bytes with the 64-byte swizzle, for C = 32 (convnet's conv2), where 64-channel copies are half
// zeros: the forward's and backward data's with BK = CW = 32 (a K tile is one tap's 32 channels,
// both operands K-major in 64-byte rows), the weight gradient's with BK = 64 pixels and CW = 32
// (B, MN-major, in column blocks of 32; A, dy, as before).
template <int BM_, int BN_, int STAGES_, bool kIm2col_ = false, bool kPersistent_ = false,
          bool kWarpSpec_ = false, int BK_ = 64, int CW_ = BK_>
struct WgTile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_, CW = CW_;
  static constexpr bool kWgmma = true, kIm2col = kIm2col_, kPersistent = kPersistent_;
  static constexpr bool kWarpSpec = kWarpSpec_ || kPersistent_;
  static constexpr int WM = 16, WN = BN, WARPS_M = BM / 16, WARPS_N = 1;
  static constexpr int THREADS = 2 * BM;  // BM / 64 warp groups of 128 threads
  // The launch's: the warp groups, and the warp-specialized tiles' producer warp.
  static constexpr int BLOCK_THREADS = THREADS + (kWarpSpec ? 32 : 0);
  static constexpr int MI = 1, NI = BN / 8;
  static constexpr int CPR = BK / 8;  // 16-byte chunks per K-major row (the gathered tiles': 8)
  static constexpr int A_ITERS = BM * CPR / THREADS;  // the forward's gathered A (B: the TMA)
  // One stage of each operand: BM (BN) rows of BK, or BK rows of BM (BN).
  static constexpr int kABytes = BM * BK * 2, kBBytes = BN * BK * 2;
  // The rows' bytes, which the swizzle spans: K-major rows (the forward's, BK), and the im2col
  // copies' rows (CW channels: the forward's B as well, the weight gradient's B).
  static constexpr int kRowK = BK * 2, kRowC = CW * 2;
  static constexpr int kRing = STAGES * (kABytes + kBBytes);
  // An mbarrier per stage (the TMA operands'), and for the warp-specialized tiles a second (the
  // stage is free again).
  static constexpr int kBarBytes = STAGES * 8 * (kWarpSpec ? 2 : 1);
  // The persistent tiles' epilogue staging (the ring is not free there: the producer is already
  // filling it with the next tile's K tiles): the tile in 16 bits, rows padded by 8, and a row
  // table (EpiStage's one pass).
  static constexpr int kEpiBytes = kPersistent ? BM * (BN + 8) * 2 + BM * 8 : 0;
  // + the realignment to the 1024-byte swizzle atom
  static constexpr int SMEM = kRing + kEpiBytes + kBarBytes + 1024;
  static_assert(BM % 64 == 0 && BN % 32 == 0 && BN <= 128,
                "wgmma tiles: 64-row warp groups, n 32-128");
  static_assert(STAGES >= 3, "a stage in flight, one computing, one being refilled");
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "stages keep atoms 1024-aligned");
  static_assert(!kWarpSpec || kIm2col, "warp-specialized tiles: both operands on the TMA");
  static_assert((BK == 64 && CW == 64) || (kIm2col && CW == 32 && (BK == 32 || BK == 64)),
                "128-byte rows, or the im2col tiles' 64-byte ones");

  static std::string name() {
    std::string suffix;
    if (kPersistent)
      suffix = "_persistent";
    else if (kWarpSpec)
      suffix = "_ws";
    // A weight gradient's narrow copies (CW below BK) show in the name; the forward's in BK.
    const std::string cw = CW != BK ? "_c" + std::to_string(CW) : "";
    return std::string(kIm2col ? "igemm_wgmma_im2col_" : "igemm_wgmma_") + std::to_string(BM) +
           "x" + std::to_string(BN) + "x" + std::to_string(BK) + cw + suffix;
  }
};
using WgTile128x128 = WgTile<128, 128, 4>;  // 128 KiB of stages
using WgTile128x64 = WgTile<128, 64, 4>;    // 96 KiB
using WgTile128x32 = WgTile<128, 32, 4>;    // 80 KiB
// The weight gradient's (igemm_wgmma_wgrad_kernel) third tile: one warp group for 64 output
// channels (convnet's conv2), where a 128-row tile would compute half zeros.
using WgTile64x128 = WgTile<64, 128, 4>;  // 96 KiB
// The same tiles with A through the TMA's im2col mode (forward without a pool, backward data).
using WgI2cTile128x128 = WgTile<128, 128, 4, true>;
using WgI2cTile128x64 = WgTile<128, 64, 4, true>;
using WgI2cTile128x32 = WgTile<128, 32, 4, true>;
using WgI2cTile64x128 = WgTile<64, 128, 4, true>;  // the weight gradient's
// The im2col tiles, persistent (forward and backward data). Beside the ring, each keeps its
// epilogue staging: 128x128 with 4 stages is one block an SM (164 KiB), 128x64 and 128x32 with 3
// and 4 stages two (2 x 92 and 2 x 92 KiB of the SM's 228).
using WgPerTile128x128 = WgTile<128, 128, 4, true, true>;
using WgPerTile128x64 = WgTile<128, 64, 3, true, true>;
using WgPerTile128x32 = WgTile<128, 32, 4, true, true>;
// The weight gradient's im2col tiles, warp-specialized (not persistent: its slices of K already
// give each block tens of K tiles).
using WgWsTile128x128 = WgTile<128, 128, 4, true, false, true>;
using WgWsTile128x64 = WgTile<128, 64, 4, true, false, true>;
using WgWsTile64x128 = WgTile<64, 128, 4, true, false, true>;
// The narrow im2col tiles (C = 32: convnet's conv2, 32 -> 64 channels). The forward's K tiles
// are half as large, so twice the stages fit: 128x64x32 with 6 stages (73 KiB: three blocks an
// SM), persistent with 7 beside its staging (104 KiB: two).
using WgI2cTile128x64x32 = WgTile<128, 64, 6, true, false, false, 32>;
using WgPerTile128x64x32 = WgTile<128, 64, 7, true, true, false, 32>;
// The weight gradient's (warp-specialized): 64 output channels (conv2's) by 128 columns j of
// x's 32-channel taps, four im2col copies a stage; and by 96 (wgmma's n96), three copies, whose
// tiles cover conv2's J = 9·32 = 288 exactly where 128 computes a third tile three quarters
// zeros.
using WgWsTile64x128c32 = WgTile<64, 128, 4, true, false, true, 64, 32>;
using WgWsTile64x96c32 = WgTile<64, 96, 4, true, false, true, 64, 32>;

// ---- the GEMM problem ----
//
// TF32 (f32 inputs) gathers its operands 4 bytes at a time with element offsets: KTap is entry
// k of a table made at creation, k = tap·Ca + c (the forward's and weight gradient's order;
// backward data's is tap·O + o), holding the offset of (c, kh, kw) in the activation, that of the
// filter element it multiplies (flipped for backward data) and the tap's kh, kw for the bounds.
struct alignas(16) KTap {
  int32_t a, b;  // activation offset c·s1 + kh·s2 + kw·s3; filter offset (0 where unused)
  int32_t kh, kw;
};

template <class T>
struct IgemmArgs {
  const T* x;     // activation, NHWC (N, H, W, C), C % 8 == 0, 16-byte aligned
  const T* w;     // filter (O, KH, KW, C) contiguous = row-major (O, K), 16-byte aligned; for
                  // BT the forward filter (C_gemm, KH, KW, O_gemm) channels-last, read flipped
  const T* bias;  // (O), or null
  T* y;           // output element (n, o, p), p = oh·OW + ow, at n·y_n + o·y_c + p·y_p
  int H, W, C, O, KH, KW, OW, sh, sw, ph, pw;
  int K;        // KH·KW·C
  int64_t M;    // N·OH·OW
  int64_t OHW;  // OH·OW
  int64_t y_n, y_c, y_p;
  bool pair;  // y_c == 1, O even and y 4-byte aligned: store two channels at once
  bool vec;   // y_c == 1 and every pixel of y 16-byte aligned: the staged epilogue's 16-byte stores
  bool relu;  // the epilogue applies a ReLU (forward only)
  // The pool variant (a conv2d -> [relu ->] max_pool2d group, 2x2 windows of stride 2): row
  // m = 4·q + t of the GEMM is tap t = 2·dh + dw of pooled pixel q = (n, ph, pw), so M = 4·Q, y
  // and its element offsets describe the pooled output (p = ph·PW + pw), and the epilogue writes
  // one value and one index per window.
  void* idx;              // the pool's indices: u8 taps or i32 positions oh·OW + ow
  int PW;                 // pooled columns
  int64_t PHW;            // pooled pixels per image
  int64_t i_n, i_c, i_p;  // the indices' element (n, o, p) at n·i_n + o·i_c + p·i_p
  bool relu_before, relu_after, relu_mask;
  // TF32: the k table (K entries), the activation's element strides along n, h and w, and the
  // filter's along the GEMM's n (o for the forward, c for backward data).
  const KTap* tab;
  int64_t xs_n, xs_h, xs_w, ws_n;
  // k = tap·C + c and tap = kh·KW + kw, split in the K loop by these (device.cuh's FastDiv: a
  // multiply-high where `/` is about twenty instructions, twice per K tile and row copied).
  FastDiv fC, fKW;
  // Bit kh·KW for each kh < KH (16 bits, KH·KW <= 32): the first tap of each filter row.
  uint32_t rep;
};

// ---- PTX wrappers: ops/mma_ptx.cuh ----
using namespace ptx;

template <class T>
__device__ __forceinline__ void store_pair(T* p, float a, float b) {
  if constexpr (std::is_same_v<T, float>)
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
  else if constexpr (std::is_same_v<T, bf16>)
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  else
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

// ---- the main kernel ----
//
// Grid: x over M tiles, y over O tiles. Block: TL::THREADS threads; warp (wm, wn) =
// (warp % WARPS_M, warp / WARPS_M) owns rows wm·WM.. and columns wn·WN.. of the block tile.
// (v, t) beats (bv, bt) in a max pool's window: a NaN beats any number, a larger value a smaller
// one, and among equals (two NaNs included) the lower tap. A total order: scanning the window in
// tap order with it keeps what max_pool2d keeps, the first NaN, else the first maximum.
__device__ __forceinline__ bool pool_beats(float v, int t, float bv, int bt) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || t < bt);
  return v > bv || (v == bv && t < bt);
}
__device__ __forceinline__ int32_t pool_index(int32_t pos, int, bool none, int32_t*) {
  return none ? -1 : pos;
}
__device__ __forceinline__ uint8_t pool_index(int32_t, int tap, bool none, uint8_t*) {
  return none ? 255 : static_cast<uint8_t>(tap);
}

// The bias of this lane's accumulator columns (two channels per 8-column mma tile j), in f32; 0
// without a bias or past O.
template <class T, class TL>
__device__ __forceinline__ void load_bias(const IgemmArgs<T>& a, int n0, int wn, int lane,
                                          float (&bias)[TL::NI][2]) {
#pragma unroll
  for (int j = 0; j < TL::NI; ++j) {
    const int o = n0 + wn * TL::WN + j * 8 + (lane & 3) * 2;
#pragma unroll
    for (int e = 0; e < 2; ++e)
      bias[j][e] = a.bias && o + e < a.O ? to_accum<T>(a.bias[o + e]) : 0.f;
  }
}

// The offset in y of output pixel m = (n, p) at channel 0 (the plain epilogues' rows).
template <class T>
__device__ __forceinline__ int64_t out_pixel_offset(const IgemmArgs<T>& a, int64_t m) {
  const int64_t n = m / a.OHW;
  return n * a.y_n + (m - n * a.OHW) * a.y_p;
}

// The plain epilogue: the f32 accumulator plus the bias, through the ReLU when asked, rounded
// once to T at y's element offsets (two channels per store where `pair`). Accumulator fragment
// of mma tile (i, j): c0, c1 at row lane/4, columns 2(lane%4), +1; c2, c3 at row lane/4 + 8.
template <class T, class TL>
__device__ __forceinline__ void igemm_epilogue(const IgemmArgs<T>& a,
                                               const float (&acc)[TL::MI][TL::NI][4], int64_t m0,
                                               int n0, int wm, int wn, int lane) {
  float bias[TL::NI][2];
  load_bias<T, TL>(a, n0, wn, lane, bias);
#pragma unroll
  for (int i = 0; i < TL::MI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + wm * TL::WM + i * 16 + (lane >> 2) + h * 8;
      if (m >= a.M) continue;
      T* const row = a.y + out_pixel_offset(a, m);
#pragma unroll
      for (int j = 0; j < TL::NI; ++j) {
        const int o = n0 + wn * TL::WN + j * 8 + (lane & 3) * 2;
        if (o >= a.O) continue;
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          v[e] = acc[i][j][h * 2 + e] + bias[j][e];
          if (a.relu) v[e] = v[e] > 0.f ? v[e] : 0.f;  // NaN gives 0, as the relu op
        }
        if (a.pair) {
          store_pair<T>(row + o, v[0], v[1]);  // o even and O even: o + 1 < O
        } else {
          row[o * a.y_c] = from_accum<T>(v[0]);
          if (o + 1 < a.O) row[(o + 1) * a.y_c] = from_accum<T>(v[1]);
        }
      }
    }
  }
}

// ---- the K loop ----
//
// STAGES shared-memory buffers per operand, filled by cp.async groups. Prologue: tiles
// 0..STAGES-2 in flight, one commit group each (empty groups past nk keep the group count, and so
// the wait below, uniform). Iteration it waits for its tile's group (cp.async.wait_group
// STAGES-2: this thread's copies have landed), syncs the block (everyone's have, and the buffer
// computed at iteration it-1 is free), issues the copies of tile it+STAGES-1 into that buffer,
// then computes tile it. No copy may still target shared memory when the block goes on.
// load(stage, it) issues the copies of the block's tile `it` into `stage`; compute(stage) runs
// the mma steps of one stage.
template <int STAGES, class Load, class Compute>
__device__ __forceinline__ void pipelined_k_loop(int nk, Load&& load, Compute&& compute) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load(s, s);
    cp_async_commit();
  }
  for (int it = 0; it < nk; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int next = it + STAGES - 1;
    if (next < nk) load(next % STAGES, next);
    cp_async_commit();
    compute(it % STAGES);
  }
  cp_async_wait<0>();
}

template <class TL>
__device__ __forceinline__ void zero_acc(float (&acc)[TL::MI][TL::NI][4]) {
#pragma unroll
  for (int i = 0; i < TL::MI; ++i)
#pragma unroll
    for (int j = 0; j < TL::NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// The output pixel (n, oh, ow) of GEMM row m < M; the pool variant numbers its rows window by
// window (m = 4·q + tap, q the pooled pixel).
template <bool kPool, class T>
__device__ __forceinline__ void igemm_pixel(const IgemmArgs<T>& a, int64_t m, int64_t& n, int& oh,
                                            int& ow) {
  if constexpr (kPool) {
    const int64_t q = m >> 2;
    const int t = static_cast<int>(m & 3);
    n = q / a.PHW;
    const int r = static_cast<int>(q - n * a.PHW);
    const int ph = r / a.PW, pw = r - ph * a.PW;
    oh = 2 * ph + (t >> 1), ow = 2 * pw + (t & 1);
  } else {
    n = m / a.OHW;
    const int p = static_cast<int>(m - n * a.OHW);
    oh = p / a.OW, ow = p - oh * a.OW;
  }
}

// ---- the A gather (both 16-bit kernels) ----
//
// A thread copies one 16-byte chunk column of k into rows crow + i·step (i < N) of A's stage.
// The pixel of each row is fixed for the whole K loop, so it is decomposed once: org[i] is the
// address (an integer) of element ((n·H + ih0)·W + iw0)·C of x, where row i's receptive field
// starts (before x, or past the image, where the field starts in the padding: only in-bounds
// taps are read from it), so that a K tile adds one 32-bit tap offset (kh·W + kw)·C + c to it,
// the same for every row (an integer address, not a pointer: nvcc then keeps x's address out of
// the loop, and the sum is one 64-bit add where an element offset needed a scaling too); and
// taps[i] has bit kh·KW + kw set where that tap of the field is inside the image (none for a
// row past M), so that a K tile tests one bit per row (KH·KW <= 32: the host declines more).
template <int N>
struct ARows {
  int64_t org[N];  // an address
  uint32_t taps[N];
};

// The taps kh·KW + kw of a receptive field starting at input row ih, column iw that lie inside
// the image, one bit each: its rows kh in [kh0, kh1) and columns kw in [kw0, kw1) are inside, so
// bits kw0..kw1-1 (one row of taps), times the rows' first bits kh·KW (a.rep, the bits
// kh0·KW..kh1·KW-1 of it), put a copy of the row at each (no carries: a row's bits stay below KW).
template <class A>  // IgemmArgs or WgradArgs: H, W, KH, KW, rep
__device__ __forceinline__ uint32_t field_taps(const A& a, int ih, int iw) {
  const int kh0 = max(0, -ih), kh1 = max(kh0, min(a.KH, a.H - ih));
  const int kw0 = max(0, -iw), kw1 = max(kw0, min(a.KW, a.W - iw));
  const auto bits = [](int lo, int hi) {  // bits lo..hi-1, hi <= 32
    return static_cast<uint32_t>((uint64_t{1} << hi) - (uint64_t{1} << lo));
  };
  return bits(kw0, kw1) * (a.rep & bits(kh0 * a.KW, kh1 * a.KW));
}

template <bool kPool, int N, class T>
__device__ __forceinline__ void a_rows_init(const IgemmArgs<T>& a, int64_t m0, int crow, int step,
                                            ARows<N>& r) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int64_t m = m0 + crow + i * step;
    r.org[i] = reinterpret_cast<int64_t>(a.x), r.taps[i] = 0;  // past M: x, no taps
    if (m < a.M) {
      int64_t n;
      int oh, ow;
      igemm_pixel<kPool>(a, m, n, oh, ow);
      const int ih = oh * a.sh - a.ph, iw = ow * a.sw - a.pw;
      r.org[i] += ((n * a.H + ih) * a.W + iw) * a.C * static_cast<int64_t>(sizeof(T));
      r.taps[i] = field_taps(a, ih, iw);
    }
  }
}

// The chunk of 8 k at k = tap·C + c (tap = kh·KW + kw): the tap's bit (0 past K, so that no row
// copies it; K % 8 == 0: a chunk is wholly inside K or wholly past it) and its offset from a
// row's field origin.
struct alignas(8) KChunk {
  uint32_t bit;
  int off;  // (kh·W + kw)·C + c, 32 bits: one image's extent fits an int
};

// k = tap·C + c (< K) split into the tap, its filter row and column, and the channel.
struct KSplit {
  int tap, kh, kw, c;
};
template <class T>
__device__ __forceinline__ KSplit k_split(const IgemmArgs<T>& a, int k) {
  KSplit r;
  a.fC.divmod(k, r.tap, r.c);
  a.fKW.divmod(r.tap, r.kh, r.kw);
  return r;
}

template <class T>
__device__ __forceinline__ KChunk k_chunk(const IgemmArgs<T>& a, int k) {
  if (k >= a.K) return {0u, 0};
  const KSplit q = k_split(a, k);
  return {1u << q.tap, (q.kh * a.W + q.kw) * a.C + q.c};
}

// The K tables in shared memory after the kernel's stages, built once per block before its first
// copy, where each thread split its k by C and KW with two FastDivs every K tile (about 20
// instructions a tile):
// - the chunk table: entry e is k_chunk(8 e), for every 8 columns of every K tile (bit 0 past
//   K), KT·BK / 8 entries of 8 bytes; a tile's A copies read their chunk's entry;
// - BT only (backward data reading the forward's channels-last filter in place), after it: row
//   k = tap·C + kc of B starts at w[kc, KH-1-kh, KW-1-kw, 0], the same in every tile, so entry k
//   is that offset (-1 past K), KT·BK entries of 4 bytes; a B row's copy reads its entry.
template <int BK>
constexpr int k_table_bytes(int K, bool bt) {
  return (K + BK - 1) / BK * BK * (bt ? 5 : 1);  // KT·BK / 8 entries of 8 bytes, + KT·BK of 4
}

// Calls f(e) for e = tid, tid + THREADS, ... below n, in a loop whose trip count is the same in
// every thread: with `e = tid; e < n` nvcc kept the wgmma kernel's K-loop counter, and with it
// the descriptors, in per-thread registers.
template <int THREADS, class F>
__device__ __forceinline__ void for_block_strided(int n, int tid, F&& f) {
  for (int e0 = 0; e0 < n; e0 += THREADS)
    if (e0 + tid < n) f(e0 + tid);
}

// Builds the chunk table at ktab (and with BT the row table after it, which it returns), then a
// barrier.
template <class TL, bool BT, class T>
__device__ __forceinline__ const int32_t* k_tables_build(const IgemmArgs<T>& a, KChunk* ktab,
                                                         int tid) {
  const int kpad = (a.K + TL::BK - 1) / TL::BK * TL::BK;
  for_block_strided<TL::THREADS>(kpad / 8, tid, [&](int e) { ktab[e] = k_chunk(a, 8 * e); });
  int32_t* const btab = reinterpret_cast<int32_t*>(ktab + kpad / 8);
  if constexpr (BT) {
    for_block_strided<TL::THREADS>(kpad, tid, [&](int k) {
      int32_t off = -1;
      if (k < a.K) {
        const KSplit q = k_split(a, k);  // O·K fits an int
        off = ((q.c * a.KH + (a.KH - 1 - q.kh)) * a.KW + (a.KW - 1 - q.kw)) * a.O;
      }
      btab[k] = off;
    });
  }
  __syncthreads();
  return btab;
}

// Issues the copies of chunk kc into the rows of `r`, row i at shared address dst + i·dst_step
// (zero-filled where the tap falls in the padding, the row is past M or the chunk past K).
template <class T, int N>
__device__ __forceinline__ void gather_a(const ARows<N>& r, const KChunk kc, uint32_t dst,
                                         int dst_step) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const bool ok = (r.taps[i] & kc.bit) != 0;
    // Zero-filled copies too take the tap's address (ops/mma_ptx.cuh, cp_async16); through L1,
    // where the tile's other taps find the pixel again (cp_async16_ca).
    const T* src = reinterpret_cast<const T*>(r.org[i] + kc.off * sizeof(T));
    cp_async16_ca(dst + static_cast<uint32_t>(i * dst_step), src, ok);
  }
}

// The filter's copies (B, the row-major (O, K) matrix): chunk k of rows o0 + i·step (i < N) at
// shared address dst + i·dst_step, zero-filled past O or past K (kc's bit 0).
template <int N, class T>
__device__ __forceinline__ void gather_b(const IgemmArgs<T>& a, int o0, int step, int k,
                                         const KChunk kc, uint32_t dst, int dst_step) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int o = o0 + i * step;
    const bool ok = kc.bit != 0 && o < a.O;
    const T* src = a.w + static_cast<int64_t>(o) * a.K + k;  // also past O or K (mma_ptx.cuh)
    cp_async16(dst + static_cast<uint32_t>(i * dst_step), src, ok);
  }
}

// ---- the staged epilogues ----
//
// Both stores go through shared memory (the pipeline's stages, free once the K loop is done):
// each warp writes its accumulator fragments, finished as the output holds them (bias added in
// f32, the ReLU, one rounding to T), into a BM x CW tile, and then the block reads the tile back
// in the order the output wants. Before (twenty-fifth to thirty-second sessions) each thread
// stored its own fragments: the pool variant found a window's maximum with two xor shuffles of
// value and tap per element, so every lane ran every comparison and a quarter of them stored
// (4,423 of the 128x64 u8 kernel's 5,544 SASS instructions were that epilogue, against 229 per
// K tile), and the plain one divided each of its rows by OH·OW in 64 bits and stored 4 bytes at a
// time. A tile whose values do not fit beside the row table (TF32's 128x128) is staged in two
// passes of half its columns. The rows' (or windows') output offsets are computed once per block
// into a table after the tile.
template <class T, class TL, int kSmem>
struct EpiStage {
  static constexpr int kTableBytes = TL::BM * 8;  // an int64 per row; a window's 20 bytes < 4 rows'
  static constexpr int kPasses =
      TL::BM * (TL::BN + 8) * static_cast<int>(sizeof(T)) + kTableBytes <= kSmem ? 1 : 2;
  static constexpr int CW = TL::BN / kPasses;  // columns per pass
  // Rows padded by 8 elements: a fragment's pair stores (rows g, columns 2q: 4 bytes in 16 bits,
  // 8 in f32) and the read-back's 16-byte row pieces both land on distinct banks.
  static constexpr int LDP = CW + 8;
  static constexpr int kTileBytes = TL::BM * LDP * static_cast<int>(sizeof(T));
  static_assert(kTileBytes + kTableBytes <= kSmem, "the staged tile and its table fit the stages");
  static_assert(CW % TL::WN == 0 && kTileBytes % 16 == 0, "warps stage whole warp tiles");
  static_assert(TL::THREADS % CW == 0 && CW % 8 == 0,
                "a thread reads one column (pool) or one 16-byte piece (plain) of every pass");
};

// The staging's steps, shared by both epilogues: once every warp is done with the stages,
// table() fills the rows' (or windows') offsets after the tile; then, per pass, the warps whose
// columns fall in it write their fragments, each value finished by fin(i, j, h, e) (an f32 that T
// holds exactly, or that rounds once to T), as pairs of columns, and read(pass) reads the pass
// back.
// The warp groups of a warp-specialized tile (threads 0 .. N - 1; the producer warp after them
// takes no part in the epilogue) as split_sum's team, and the epilogues' barrier: named barrier
// 1 over them, or the block's where every thread computes.
template <int N>
struct FirstThreads {
  __device__ static int rank() { return static_cast<int>(threadIdx.x); }
  __device__ static int size() { return N; }
  __device__ static void sync() { named_barrier_sync<1, N>(); }
};
template <class TL>
using EpiTeam = std::conditional_t<TL::kWarpSpec, FirstThreads<TL::THREADS>, WholeBlock>;
template <class TL>
__device__ __forceinline__ void epi_sync() {
  EpiTeam<TL>::sync();
}

template <class T, class TL, class ES, class Table, class Fin, class Read>
__device__ __forceinline__ void run_staged(T* cs, int wm, int wn, int lane, Table&& table,
                                           Fin&& fin, Read&& read) {
  // Every warp is done with the stages (the persistent tiles: with the previous tile's reads of
  // the staging).
  epi_sync<TL>();
  table();
#pragma unroll
  for (int pass = 0; pass < ES::kPasses; ++pass) {
    if (pass > 0) epi_sync<TL>();  // the previous pass's reads are done
    const int col0 = wn * TL::WN - pass * ES::CW;
    if (col0 >= 0 && col0 < ES::CW) {
#pragma unroll
      for (int i = 0; i < TL::MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wm * TL::WM + i * 16 + (lane >> 2) + h * 8;
#pragma unroll
          for (int j = 0; j < TL::NI; ++j) {
            const int c = col0 + j * 8 + (lane & 3) * 2;
            store_pair<T>(cs + r * ES::LDP + c, fin(i, j, h, 0), fin(i, j, h, 1));
          }
        }
    }
    epi_sync<TL>();
    read(pass);
  }
}

// The pool variant. Rows 4q..4q+3 of the tile are the window of one pooled pixel (kCornerMajor:
// rows q, q + BM/4, q + BM/2, q + 3 BM/4, the im2col tiles' order); a thread takes
// (window, channel) items, channels fastest (conflict-free reads of the tile, and consecutive
// channels of one pooled pixel: coalesced stores into a channels-last y), and scans the window's
// four values in tap order for what max_pool2d keeps: the first NaN, else the first maximum
// (pool_beats). Each staged value is what the unfused conv stores (bias added in f32, rounded
// once to T), through the ReLU before the pool unless the pool has relu_mask; with relu_mask the
// ReLU runs on the maximum and the index is none where y is not > 0 (as the chunked group and the
// direct kernel run it). So y and the indices are the unfused kernels' bits. M is 4·Q and m0 a
// multiple of 4: a window's rows are all real or all past M.
template <class T, class TL, class Ix, int kSmem, bool kCornerMajor = false>
__device__ __forceinline__ void igemm_pool_epilogue(const IgemmArgs<T>& a,
                                                    const float (&acc)[TL::MI][TL::NI][4],
                                                    int64_t m0, int n0, int wm, int wn, int lane,
                                                    int tid, unsigned char* smem) {
  using ES = EpiStage<T, TL, kSmem>;
  constexpr int kWin = TL::BM / 4;
  T* const cs = reinterpret_cast<T*>(smem);
  int64_t* const y_row = reinterpret_cast<int64_t*>(smem + ES::kTileBytes);  // -1: past M
  int64_t* const i_row = y_row + kWin;
  int32_t* const pos0 = reinterpret_cast<int32_t*>(i_row + kWin);
  float bias[TL::NI][2];
  load_bias<T, TL>(a, n0, wn, lane, bias);
  T* const y = a.y;
  Ix* const idx = static_cast<Ix*>(a.idx);
  auto table = [&] {
    for (int w = tid; w < kWin; w += TL::THREADS) {
      const int64_t m = m0 + 4 * w;
      int64_t yr = -1, ir = 0;
      int32_t p0 = 0;
      if (m < a.M) {
        const int64_t q = m >> 2;
        const int64_t n = q / a.PHW, p = q - n * a.PHW;
        const int ph = static_cast<int>(p / a.PW), pw = static_cast<int>(p - ph * a.PW);
        yr = n * a.y_n + p * a.y_p;
        ir = n * a.i_n + p * a.i_p;
        p0 = 2 * ph * a.OW + 2 * pw;
      }
      y_row[w] = yr, i_row[w] = ir, pos0[w] = p0;
    }
  };
  auto fin = [&](int i, int j, int h, int e) {
    float v = to_accum<T>(from_accum<T>(acc[i][j][h * 2 + e] + bias[j][e]));
    if (a.relu_before) v = v > 0.f ? v : 0.f;  // NaN gives 0, as the relu op
    return v;
  };
  auto read = [&](int pass) {
    // A thread keeps its channel (THREADS is a multiple of CW) and steps through windows.
    const int c = tid % ES::CW, o = n0 + pass * ES::CW + c;
    if (o >= a.O) return;
    T* const yo = y + o * a.y_c;
    Ix* const io = idx + o * a.i_c;
    for (int w = tid / ES::CW; w < kWin; w += TL::THREADS / ES::CW) {
      const int64_t yr = y_row[w];
      if (yr < 0) break;  // this window and every later one are past M
      // Window w's pixel t: row 4 w + t, or corner-major (the im2col tiles) row t·BM/4 + w.
      constexpr int kTapRows = kCornerMajor ? kWin : 1;
      const T* const col = cs + (kCornerMajor ? w : 4 * w) * ES::LDP + c;
      float v = to_accum<T>(col[0]);
      int bt = 0;
#pragma unroll
      for (int t = 1; t < 4; ++t) {
        const float ov = to_accum<T>(col[t * kTapRows * ES::LDP]);
        if (pool_beats(ov, t, v, bt)) v = ov, bt = t;
      }
      const float out = to_accum<T>(from_accum<T>(a.relu_after && !(v > 0.f) ? 0.f : v));
      yo[yr] = from_accum<T>(out);
      const int32_t pos = pos0[w] + (bt >> 1) * a.OW + (bt & 1);
      io[i_row[w]] = pool_index(pos, bt, a.relu_mask && !(out > 0.f), static_cast<Ix*>(nullptr));
    }
  };
  run_staged<T, TL, ES>(cs, wm, wn, lane, table, fin, read);
}

struct alignas(16) Bytes16 {  // 16 bytes moved as one vector (LDS.128, STG.E.128)
  uint32_t v[4];
};

// The plain epilogue into a channels-last y (y_c == 1): rows of the tile are output pixels whose
// BN channels are contiguous in y, so the block stores them 16 bytes at a time where y's pixels
// are 16-byte aligned (a.vec), else element by element, threads on consecutive pieces.
template <class T, class TL, int kSmem>
__device__ __forceinline__ void igemm_staged_epilogue(const IgemmArgs<T>& a,
                                                      const float (&acc)[TL::MI][TL::NI][4],
                                                      int64_t m0, int n0, int wm, int wn,
                                                      int lane, int tid, unsigned char* smem) {
  using ES = EpiStage<T, TL, kSmem>;
  constexpr int VE = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte piece
  constexpr int kPieces = ES::CW / VE;                 // pieces per row and pass
  T* const cs = reinterpret_cast<T*>(smem);
  int64_t* const y_row = reinterpret_cast<int64_t*>(smem + ES::kTileBytes);  // -1: past M
  float bias[TL::NI][2];
  load_bias<T, TL>(a, n0, wn, lane, bias);
  auto table = [&] {
    for (int r = tid; r < TL::BM; r += TL::THREADS) {
      const int64_t m = m0 + r;
      y_row[r] = m < a.M ? out_pixel_offset(a, m) : -1;
    }
  };
  auto fin = [&](int i, int j, int h, int e) {
    const float v = acc[i][j][h * 2 + e] + bias[j][e];
    return a.relu ? (v > 0.f ? v : 0.f) : v;  // NaN gives 0, as the relu op
  };
  auto read = [&](int pass) {
    // A thread keeps its piece of the row (THREADS is a multiple of the pieces) and steps rows.
    const int pc = tid % kPieces, o = n0 + pass * ES::CW + pc * VE;
    if (o >= a.O) return;
    T* const yo = a.y + o;
    const bool whole = a.vec && o + VE <= a.O;
    for (int r = tid / kPieces; r < TL::BM; r += TL::THREADS / kPieces) {
      const int64_t yr = y_row[r];
      if (yr < 0) break;  // this row and every later one are past M
      const T* const src = cs + r * ES::LDP + pc * VE;
      if (whole) {
        *reinterpret_cast<Bytes16*>(yo + yr) = *reinterpret_cast<const Bytes16*>(src);
      } else {
#pragma unroll
        for (int e = 0; e < VE; ++e)
          if (o + e < a.O) yo[yr + e] = src[e];
      }
    }
  };
  run_staged<T, TL, ES>(cs, wm, wn, lane, table, fin, read);
}

// The forward's (and backward data's) epilogue: with Ix (u8 or i32) the pool variant's; else the
// staged one into a channels-last y, the direct one (igemm_epilogue) into any other layout.
template <class T, class TL, class Ix, int kSmem, bool kCornerMajor = false>
__device__ __forceinline__ void igemm_store(const IgemmArgs<T>& a,
                                            const float (&acc)[TL::MI][TL::NI][4], int64_t m0,
                                            int n0, int wm, int wn, int lane, int tid,
                                            unsigned char* smem) {
  if constexpr (std::is_void_v<Ix>) {
    if (a.y_c == 1)
      igemm_staged_epilogue<T, TL, kSmem>(a, acc, m0, n0, wm, wn, lane, tid, smem);
    else
      igemm_epilogue<T, TL>(a, acc, m0, n0, wm, wn, lane);
  } else {
    igemm_pool_epilogue<T, TL, Ix, kSmem, kCornerMajor>(a, acc, m0, n0, wm, wn, lane, tid, smem);
  }
}

// BT: backward data with B read from the forward's channels-last filter (see the top). Ix (u8
// or i32, not void): the forward with a 2x2 max pool in its epilogue (IgemmArgs' pool fields).
template <class T, class TL, bool BT = false, class Ix = void>
__global__ void __launch_bounds__(TL::THREADS) igemm_conv_kernel(const IgemmArgs<T> a) {
  constexpr bool kPool = !std::is_void_v<Ix>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const As = reinterpret_cast<T*>(smem_raw);      // [STAGES][BM][LDS]
  T* const Bs = As + TL::STAGES * TL::BM * TL::LDS;  // [STAGES][BN][LDS], BT: [STAGES][BK][LDB_T]
  constexpr int kBStage = BT ? TL::BK * TL::LDB_T : TL::BN * TL::LDS;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp % TL::WARPS_M, wn = warp / TL::WARPS_M;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * TL::BM;
  const int n0 = static_cast<int>(blockIdx.y) * TL::BN;

  // Copy assignment: thread tid copies chunk column `ccol` (8 elements of k) of rows
  // crow + i·(THREADS / CPR) of A and of B (copy_row, copy_chunk). The pixel of each A row is
  // fixed for the whole K loop: decompose it once.
  const int ccol = copy_chunk<TL::CPR>(tid);
  const int crow = copy_row<TL::CPR>(tid);
  constexpr int kRowStep = TL::THREADS / TL::CPR;
  ARows<TL::A_ITERS> ar;
  a_rows_init<kPool>(a, m0, crow, kRowStep, ar);

  const int KT = (a.K + TL::BK - 1) / TL::BK;

  // BT: thread tid copies chunk column b_ccol (8 output channels n) of k rows
  // b_crow + i·kBStepT of B; the column is fixed, so whether it is inside O is too.
  const int b_ccol = copy_chunk<TL::CB_T>(tid), b_crow = copy_row<TL::CB_T>(tid);
  constexpr int kBStepT = TL::THREADS / TL::CB_T;
  const int bn = n0 + b_ccol * 8;
  const bool bn_in = bn < a.O;  // O % 8 == 0: a chunk is wholly inside O or wholly past it

  // The K tiles' chunk table after the stages (and the staged epilogue's bytes).
  KChunk* const ktab = reinterpret_cast<KChunk*>(smem_raw + (BT ? TL::SMEM_T : TL::SMEM));
  const int32_t* const btab = k_tables_build<TL, BT>(a, ktab, tid);
  // All of the above reads only the parameters: it may overlap the kernel before this one.
  pdl_begin();

  // Issues the copies of K tile kt into stage `st` (no commit).
  auto load_tile = [&](int st, int kt) {
    const int k = kt * TL::BK + ccol * 8;
    const KChunk kch = ktab[kt * (TL::BK / 8) + ccol];
    gather_a<T>(ar, kch, smem_addr(As + st * TL::BM * TL::LDS + crow * TL::LDS + ccol * 8),
                kRowStep * TL::LDS * static_cast<int>(sizeof(T)));
    T* const bs = Bs + st * kBStage;
    if constexpr (BT) {
      // Row k = tap·C + kc of B is w'[n0.., tap, kc] = w[kc, KH-1-kh, KW-1-kw, n0..] of the
      // forward filter (channels-last, a.O = its input channels): 8 contiguous n per chunk.
      // The rows' offsets first (btab), then their copies: see wgrad_copy_b.
      int32_t off[TL::B_ITERS_T];
#pragma unroll
      for (int i = 0; i < TL::B_ITERS_T; ++i) off[i] = btab[kt * TL::BK + b_crow + i * kBStepT];
#pragma unroll
      for (int i = 0; i < TL::B_ITERS_T; ++i) {
        const int r = b_crow + i * kBStepT;
        const bool ok = bn_in && off[i] >= 0;
        const T* src = ok ? a.w + off[i] + bn : a.w;
        cp_async16(smem_addr(bs + r * TL::LDB_T + b_ccol * 8), src, ok);
      }
    } else {
      gather_b<TL::B_ITERS>(a, n0 + crow, kRowStep, k, kch,
                            smem_addr(bs + crow * TL::LDS + ccol * 8),
                            kRowStep * TL::LDS * static_cast<int>(sizeof(T)));
    }
  };

  float acc[TL::MI][TL::NI][4];
  zero_acc<TL>(acc);

  // ldmatrix row addresses within a stage, per lane (see ldmatrix_x4):
  // A (16 x 16 per mma): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
  //   (rows 8-15, k 8-15) are a0..a3 of the m16n8k16 A fragment; lane l points at row l % 16,
  //   k 8·(l / 16).
  // B (two 8-column n tiles x 16 k per x4): matrices (n 0-7, k 0-7), (n 0-7, k 8-15),
  //   (n 8-15, k 0-7), (n 8-15, k 8-15) are b0, b1 of tile j and b0, b1 of tile j+1; lane l
  //   points at n (l % 8) + 8·(l / 16), k 8·((l / 8) % 2).
  const int a_row = wm * TL::WM + (lane & 15);
  const int a_col = (lane >> 4) * 8;
  const int b_row = wn * TL::WN + (lane & 7) + ((lane >> 4) << 3);
  const int b_col = ((lane >> 3) & 1) * 8;
  // BT (ldmatrix.trans over k rows, as the weight gradient's B): lane l points at
  // k (l % 8) + 8·((l / 8) % 2), n 8·(l / 16).
  const int bt_k = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int bt_n = wn * TL::WN + ((lane >> 4) << 3);

  pipelined_k_loop<TL::STAGES>(KT, load_tile, [&](int st) {
    const T* const as = As + st * TL::BM * TL::LDS;
    const T* const bs = Bs + st * kBStage;
#pragma unroll
    for (int kk = 0; kk < TL::BK; kk += 16) {
      uint32_t af[TL::MI][4];
      uint32_t bf[TL::NI][2];
#pragma unroll
      for (int i = 0; i < TL::MI; ++i)
        ldmatrix_x4(af[i], smem_addr(as + (a_row + i * 16) * TL::LDS + kk + a_col));
#pragma unroll
      for (int j = 0; j < TL::NI; j += 2) {
        uint32_t r[4];
        if constexpr (BT)
          ldmatrix_x4_trans(r, smem_addr(bs + (kk + bt_k) * TL::LDB_T + bt_n + j * 8));
        else
          ldmatrix_x4(r, smem_addr(bs + (b_row + j * 8) * TL::LDS + kk + b_col));
        bf[j][0] = r[0], bf[j][1] = r[1];
        bf[j + 1][0] = r[2], bf[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < TL::MI; ++i)
#pragma unroll
        for (int j = 0; j < TL::NI; ++j) mma_16816<T>(acc[i][j], af[i], bf[j]);
    }
  });

  igemm_store<T, TL, Ix, BT ? TL::SMEM_T : TL::SMEM>(a, acc, m0, n0, wm, wn, lane, tid, smem_raw);
}

// The bytes from one 16-row k slice of an operand's stage to the next: K-major, 32 (16 k of a
// row); MN-major, 16 k rows: of 128 bytes for A (dy's 64 channels), of kRowC for B (the weight
// gradient's column blocks, 128 or 64 bytes).
template <class TL, bool kMN, bool kB>
constexpr uint32_t slice_bytes() {
  if constexpr (!kMN) return 32;
  return 16u * (kB ? TL::kRowC : 128);
}

// The forward's and backward data's stage-0 descriptors, both operands K-major in rows of
// TL::kRowK bytes (the LBO unused: 16) in atoms of 8 rows (SBO): warp group wg's 64 rows of A
// from sa, and B's BN rows from sb.
template <class TL>
__device__ __forceinline__ void kmajor_descs(uint32_t sa, uint32_t sb, int wg, uint64_t& da0,
                                             uint64_t& db0) {
  constexpr uint32_t kRow = TL::kRowK;
  da0 = make_desc<kRow>(sa + static_cast<uint32_t>(wg) * 64 * kRow, 16u, 8 * kRow);
  db0 = make_desc<kRow>(sb, 16u, 8 * kRow);
}

// ---- the wgmma kernels' K loop ----
//
// STAGES shared-memory stages, copies STAGES-2 tiles ahead and one wgmma group in flight (two
// tiles ahead, not three: the stage being refilled must be one whose wgmmas every warp group has
// retired, and wgmma.wait_group 1 leaves the last tile's in flight). Prologue: tiles 0..STAGES-3
// in flight, one commit group each. Iteration it waits for its tile's copies
// (cp.async.wait_group STAGES-3), makes them visible to the async proxy that wgmma reads through
// (fence.proxy.async), syncs the block, issues the copies of tile it+STAGES-2 into the stage of
// tile it-2 (every warp group retired that tile's wgmmas at the end of iteration it-1), then
// waits for the TMA operand's box of tile it (the mbarrier of its stage, at full0 + 8·stage,
// whose phase n completes with the stage's n-th tile), issues tile it's four wgmmas (from stage
// 0's descriptors da0, db0, advanced to stage it % STAGES) and waits until only they are in
// flight. kMN: both operands MN-major (the weight gradient: the 16 k rows of slice kk start
// 2048 kk bytes into each box), else K-major (the 16-column slice kk starts 32 kk bytes into
// each row). load(stage, it) issues the copies of the block's tile `it` into `stage`: the
// gathered operand's cp.async, and (thread 0) the other operand's TMA boxes with the stage's
// arrive.expect_tx. No wgmma or copy is in flight at the end. kCpAsync false: load issues TMA
// copies only (the im2col tiles), which write through the async proxy as wgmma reads: no
// cp.async groups to commit and wait for, no proxy fence (a MEMBAR and a FENCE.VIEW.ASYNC a
// tile) before the barrier, and the refill issued after the tile's wgmmas.
template <class T, class TL, bool kMN, class Load, bool kCpAsync = true>
__device__ __forceinline__ void wgmma_k_loop(int nk, Load&& load, float (&d)[TL::BN / 2],
                                             uint64_t da0, uint64_t db0, uint32_t full0) {
  constexpr int S = TL::STAGES;
  constexpr uint32_t kSliceA = slice_bytes<TL, kMN, false>(),
                     kSliceB = slice_bytes<TL, kMN, true>();
#pragma unroll
  for (int s = 0; s < S - 2; ++s) {
    if (s < nk) load(s, s);
    if constexpr (kCpAsync) cp_async_commit();
  }
  for (int it = 0; it < nk; ++it) {
    if constexpr (kCpAsync) {
      cp_async_wait<S - 3>();
      fence_proxy_async();  // this thread's landed copies, visible to wgmma's reads
    }
    __syncthreads();
    const int next = it + S - 2;
    if constexpr (kCpAsync) {
      if (next < nk) load(next % S, next);
      cp_async_commit();
    }
    const int st = it % S;
    mbar_wait(full0 + 8 * st, (static_cast<unsigned>(it) / S) & 1u);
    fence_acc(d);
    wgmma_fence();
    // The stage's descriptors once, then a constant step per slice (advancing by the sum
    // instead made nvcc add and shift each slice's offset again: 3 more uniform instructions per
    // operand and slice).
    const uint64_t da = desc_advance(da0, st * TL::kABytes),
                   db = desc_advance(db0, st * TL::kBBytes);
#pragma unroll
    for (int kk = 0; kk < TL::BK / 16; ++kk)
      wgmma_m64k16<T, TL::BN, kMN, kMN>(d, desc_advance(da, kSliceA * kk),
                                        desc_advance(db, kSliceB * kk));
    wgmma_commit();
    // TMA copies only: thread 0 refills the stage of tile it - 2 (retired by every warp before
    // the barrier above) once this tile's wgmmas are issued, so that its warp's wgmmas do not
    // wait behind the copies' issue.
    if constexpr (!kCpAsync)
      if (next < nk) load(next % S, next);
    fence_acc(d);
    wgmma_wait<1>();
    fence_acc(d);
  }
  wgmma_wait<0>();
  fence_acc(d);
  if constexpr (kCpAsync) cp_async_wait<0>();
}

// The block's dynamic shared memory realigned up to the 1024-byte swizzle atom, where the Hopper
// tiles lay out their rings (their launches ask for kAtomBytes more): its shared address, and in
// *smem (where given) its generic pointer.
__device__ __forceinline__ uint32_t atom_base(unsigned char* raw, unsigned char** smem = nullptr) {
  const uint32_t a = smem_addr(raw);
  const uint32_t base = (a + kAtomBytes - 1) & ~(kAtomBytes - 1);
  if (smem) *smem = raw + (base - a);
  return base;
}

// ---- The Hopper tiles' TMA operand ----
//
// Of a Hopper tile's two operands, the one that is a plain matrix in memory comes through the
// TMA: the forward's and backward data's filter ((O, K) row-major, K-major boxes of 64 k x BN
// rows) and the weight gradient's dy ((P, O): MN-major boxes of 64 channels x 64 pixels). The
// boxes land with the 128-byte swizzle, the layout the cp.async copies wrote and the
// descriptors read, and the TMA zero-fills what lies outside the tensor (rows past O or P, k past
// K) as the copies did. So a stage's copies of that operand are one thread's instruction or two
// instead of every thread's 16-byte copies with their addresses and bounds. The gathered operand
// (x through the receptive fields) stays on cp.async. Each stage has an mbarrier (count 1:
// thread 0's arrive.expect_tx, then the boxes' bytes), after the ring; thread 0 initialises
// them before its first copy, and every thread waits on its stage's before the stage's wgmmas
// (wgmma_k_loop), after the barrier that also orders the cp.async copies.
template <int S>
__device__ __forceinline__ void tma_stages_init(uint32_t full0, const CUtensorMap* map) {
#pragma unroll
  for (int s = 0; s < S; ++s) mbar_init(full0 + 8 * s, 1);
  fence_mbarrier_init();
  prefetch_tensormap(map);
}

// ---- Hopper: the forward and backward data on wgmma (sm_90a) ----
//
// The same GEMM and gather as igemm_conv_kernel, with the math on wgmma: per 16 of k, one
// wgmma.m64nBNk16 per warp group reads A (its 64 rows) and B from shared memory through matrix
// descriptors, where mma.sync needed a warp's MI·NI mma and its ldmatrix fragment loads (the
// twenty-fifth session's H100 profile and the thirty-third session's SASS counts put the mma.sync
// kernels' time in issuing instructions). Both operands are K-major with the 128-byte swizzle
// (ops/wgmma_desc.cuh): row r of a stage is its 128 bytes (64 k), and its 16-byte chunk c lands at
// chunk c ^ (r % 8), which cp.async writes directly for A (a thread's rows are 8 apart times an
// integer, so its chunk's swizzled place is the same in all of them) and the TMA for B (tmw: the
// box of 64 k x BN rows at (kt·64, n0)). B is always the row-major (O, K) filter: backward data
// stages the flipped filter (no BT variant).
//
// Pipeline: wgmma_k_loop (STAGES stages, copies STAGES-2 tiles ahead, one wgmma group in flight).
template <class T, class TL, class Ix = void>
__global__ void __launch_bounds__(TL::THREADS)
    igemm_wgmma_kernel(const __grid_constant__ CUtensorMap tmw, const IgemmArgs<T> a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_begin();
  __trap();  // wgmma needs sm_90a; the host declines every other device
#else
  constexpr bool kPool = !std::is_void_v<Ix>;
  constexpr int S = TL::STAGES;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem;
  const uint32_t base = atom_base(smem_raw, &smem);
  const uint32_t sa = base, sb = base + S * TL::kABytes;  // [S][BM][128 B], [S][BN][128 B]
  const uint32_t full0 = base + TL::kRing;                // B's mbarriers, one per stage

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  // The warp group, read from lane 0 so that the compiler knows it is the same in every lane: the
  // descriptors made from it then stay in uniform registers (as CUTLASS reads its warp group).
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * TL::BM;
  const int n0 = static_cast<int>(blockIdx.y) * TL::BN;

  // Thread tid copies chunk ccol (k 8·ccol..) of A's rows crow + i·kRowStep; kRowStep is a
  // multiple of 8, so the chunk's swizzled place in the row is the same for all of them.
  const int ccol = tid & 7, crow = tid >> 3;
  constexpr int kRowStep = TL::THREADS / 8;
  static_assert(kRowStep % 8 == 0, "a thread's rows share their swizzle phase");
  const uint32_t cp_off = static_cast<uint32_t>(crow * 128 + ((ccol ^ (crow & 7)) << 4));
  ARows<TL::A_ITERS> ar;
  a_rows_init<kPool>(a, m0, crow, kRowStep, ar);
  const int KT = (a.K + TL::BK - 1) / TL::BK;
  if (tid == 0) tma_stages_init<S>(full0, &tmw);
  // The K tiles' chunk table after B's mbarriers.
  KChunk* const ktab = reinterpret_cast<KChunk*>(smem + TL::kRing + TL::kBarBytes);
  k_tables_build<TL, false>(a, ktab, tid);
  // All of the above (the mbarriers, the tensor map's prefetch, the tables) reads only the
  // parameters: it may overlap the kernel before this one.
  pdl_begin();
  const KChunk* kp = ktab + ccol;  // this thread's entry of the next tile copied

  auto load_tile = [&](int st, int kt) {
    gather_a<T>(ar, *kp, sa + st * TL::kABytes + cp_off, kRowStep * 128);
    kp += TL::BK / 8;
    if (tid == 0) {
      const uint32_t bar = full0 + 8 * st;
      mbar_arrive_expect_tx(bar, TL::kBBytes);
      tma_load_3d(sb + st * TL::kBBytes, &tmw, kt * TL::BK, n0, 0, bar);
    }
  };

  float acc[1][TL::NI][4];
  zero_acc<TL>(acc);
  float(&d)[TL::BN / 2] = reinterpret_cast<float(&)[TL::BN / 2]>(acc);

  uint64_t da0, db0;  // stage 0's (K-major, 128-byte rows)
  kmajor_descs<TL>(sa, sb, wg, da0, db0);
  wgmma_k_loop<T, TL, false>(KT, load_tile, d, da0, db0, full0);
  fence_proxy_async();  // wgmma's reads of the stages before the epilogue's writes

  // Warp w of the block is the epilogues' warp tile (w, 0): rows 16 w.., all BN columns.
  igemm_store<T, TL, Ix, TL::kRing>(a, acc, m0, n0, warp, 0, lane, tid, smem);
#endif
}

// The im2col tiles' copies, issued by one thread (thread 0, or the persistent tiles' producer)
// K tile after K tile in K order. start() takes the output tile's first pixel (n, oh, ow) as its
// filter base (ow·sw - pw, oh·sh - ph) in image n, the coordinates of every A copy (with a pool,
// the first window's top-left pixel: (2 pw', 2 ph') of pooled pixel m0 / 4); issue() copies the
// next K tile (tap, cb) into a stage and steps (cb, kw, kh) one tile on.
template <class TL, bool kPool>
struct I2cCopies {
  static_assert(TL::BK == TL::CW, "a K tile is one copy's channels of a tap");
  int32_t cn = 0, ch = 0, cw = 0;
  int cb = 0, kw = 0, kh = 0, tap = 0;
  int cbs = 1;  // channel blocks per tap

  // Channel blocks per tap, and the K tiles of an output tile: tap by tap, BK channels a tile.
  template <class T>
  __device__ __forceinline__ static int channel_blocks(const IgemmArgs<T>& a) {
    return (a.C + TL::BK - 1) / TL::BK;
  }
  template <class T>
  __device__ __forceinline__ static int k_tiles(const IgemmArgs<T>& a) {
    return a.KH * a.KW * channel_blocks(a);
  }

  template <class T>
  __device__ __forceinline__ void start(const IgemmArgs<T>& a, int64_t m0) {
    int oh, ow;
    if constexpr (kPool) {
      const int64_t q = m0 >> 2, n = q / a.PHW;
      const int r = static_cast<int>(q - n * a.PHW);
      const int py = r / a.PW;
      cn = static_cast<int32_t>(n), oh = 2 * py, ow = 2 * (r - py * a.PW);
    } else {
      const int64_t n = m0 / a.OHW;
      const int r = static_cast<int>(m0 - n * a.OHW);
      cn = static_cast<int32_t>(n), oh = r / a.OW, ow = r - oh * a.OW;
    }
    ch = oh * a.sh - a.ph, cw = ow * a.sw - a.pw;
    cb = 0, kw = 0, kh = 0, tap = 0;
    cbs = channel_blocks(a);
  }

  // The K tile's A (one copy, or with a pool one per corner t = 2 dh + dw of BM / 4 rows at
  // offsets (kw + dw·sw, kh + dh·sh)) into dst_a and its B into dst_b, both completing on the
  // mbarrier bar with the stage's bytes.
  template <class T>
  __device__ __forceinline__ void issue(const IgemmArgs<T>& a, const CUtensorMap* tmx,
                                        const CUtensorMap* tmw, uint32_t dst_a, uint32_t dst_b,
                                        int n0, uint32_t bar) {
    mbar_arrive_expect_tx(bar, TL::kABytes + TL::kBBytes);
    if constexpr (kPool) {
#pragma unroll
      for (int t = 0; t < 4; ++t)
        tma_load_im2col_4d(dst_a + t * (TL::kABytes / 4), tmx, cb * TL::BK, cw, ch, cn,
                           static_cast<uint16_t>(kw + (t & 1) * a.sw),
                           static_cast<uint16_t>(kh + (t >> 1) * a.sh), bar);
    } else {
      tma_load_im2col_4d(dst_a, tmx, cb * TL::BK, cw, ch, cn, static_cast<uint16_t>(kw),
                         static_cast<uint16_t>(kh), bar);
    }
    tma_load_3d(dst_b, tmw, cb * TL::BK, tap, n0, bar);
    if (++cb == cbs) {
      cb = 0, ++tap;
      if (++kw == a.KW) kw = 0, ++kh;
    }
  }
};

// ---- Hopper: A through the TMA's im2col mode (sm_90a) ----
//
// igemm_wgmma_kernel with both operands on the TMA: A, the receptive fields of the block's BM
// output pixels, is one im2col copy per K tile (tmx: the channels-last activation with the
// convolution's bounding box, ops/tma_map.hpp's TmaIm2col), B one tiled copy of the filter as
// (C, taps, O) (tmw: 64 channels of one tap for BN output channels). K is walked tap by tap and,
// within a tap, in blocks of 64 channels: tile (tap, cb) copies channels 64 cb.. of every row's
// pixel at the tap's offset (kw, kh), and the same channels of the tap's filter slice. Channels
// past C are zero-filled in both, so any C % 8 == 0 runs (C % 64 == 0 without a wasted channel);
// rows past M are pixels past the last image, zero-filled too. The copies land in the 128-byte
// swizzle the plain tiles' cp.async wrote, so the descriptors and wgmma_k_loop are unchanged; what
// the K loop loses is the gather (per K tile and thread, A_ITERS 16-byte copies with their tap
// bits, addresses and zero-fill selects, and the k table's reads): thread 0 issues the copies,
// and every thread waits on the stage's mbarrier. The rows are output pixels in the order
// (n, oh, ow). With a pool (Ix not void) they are the BM / 4 windows' pixels corner by corner:
// tmx then walks the windows' top-left pixels (traversal strides 2 sw, 2 sh: im2col_pool_corners)
// and a stage's A is four copies of BM / 4 rows, corner t = 2 dh + dw at offsets
// (kw + dw·sw, kh + dh·sh), so row t·BM/4 + w is window w's pixel t, and the pool epilogue
// reads its windows corner-major.
template <class T, class TL, class Ix = void>
__global__ void __launch_bounds__(TL::THREADS)
    igemm_wgmma_im2col_kernel(const __grid_constant__ CUtensorMap tmx,
                              const __grid_constant__ CUtensorMap tmw, const IgemmArgs<T> a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_begin();
  __trap();  // wgmma needs sm_90a; the host declines every other device
#else
  constexpr int S = TL::STAGES;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem;
  const uint32_t base = atom_base(smem_raw, &smem);
  const uint32_t sa = base, sb = base + S * TL::kABytes;  // [S][BM][128 B], [S][BN][128 B]
  const uint32_t full0 = base + TL::kRing;                // a stage's mbarrier (both copies)

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);  // uniform: see igemm_wgmma_kernel
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * TL::BM;
  const int n0 = static_cast<int>(blockIdx.y) * TL::BN;
  // Thread 0 issues the copies, in K order.
  using Copies = I2cCopies<TL, !std::is_void_v<Ix>>;
  const int KT = Copies::k_tiles(a);
  Copies cp;
  if (tid == 0) {
    tma_stages_init<S>(full0, &tmx);
    prefetch_tensormap(&tmw);
    cp.start(a, m0);
  }
  // The above reads only the parameters: it may overlap the kernel before this one.
  pdl_begin();

  auto load_tile = [&](int st, int) {
    if (tid == 0)
      cp.issue(a, &tmx, &tmw, sa + st * TL::kABytes, sb + st * TL::kBBytes, n0, full0 + 8 * st);
  };

  float acc[1][TL::NI][4];
  zero_acc<TL>(acc);
  float(&d)[TL::BN / 2] = reinterpret_cast<float(&)[TL::BN / 2]>(acc);
  uint64_t da0, db0;
  kmajor_descs<TL>(sa, sb, wg, da0, db0);
  wgmma_k_loop<T, TL, false, decltype(load_tile)&, false>(KT, load_tile, d, da0, db0, full0);
  fence_proxy_async();  // wgmma's reads of the stages before the epilogue's writes

  igemm_store<T, TL, Ix, TL::kRing, true>(a, acc, m0, n0, warp, 0, lane, tid, smem);
#endif
}

// ---- Hopper: the warp-specialized im2col tiles (sm_90a) ----
//
// A consumer warp's K loop: nk K tiles from the ring's position (s: the stage, phase: the parity
// of its fill), which it steps along. Per K tile: wait for the stage's copies (its "full"
// mbarrier at full0 + 8·stage), issue its four wgmmas (from stage 0's descriptors da0, db0; kMN
// as in wgmma_k_loop), and once wgmma.wait_group 1 has retired the previous K tile's, release
// that one's stage (one arrival per warp on its "empty" mbarrier at empty0 + 8·stage). The last
// stage is released after wait_group 0: no wgmma is in flight at the end.
template <class T, class TL, bool kMN>
__device__ __forceinline__ void ws_k_loop(int nk, float (&d)[TL::BN / 2], uint64_t da0,
                                          uint64_t db0, uint32_t full0, uint32_t empty0, int lane,
                                          int& s, uint32_t& phase) {
  constexpr int S = TL::STAGES;
  constexpr uint32_t kSliceA = slice_bytes<TL, kMN, false>(),
                     kSliceB = slice_bytes<TL, kMN, true>();
  int prev = 0;  // the stage of the previous K tile
  for (int kt = 0; kt < nk; ++kt) {
    mbar_wait(full0 + 8 * s, phase);  // K tile kt has landed
    fence_acc(d);
    wgmma_fence();
    const uint64_t da = desc_advance(da0, s * TL::kABytes), db = desc_advance(db0, s * TL::kBBytes);
#pragma unroll
    for (int kk = 0; kk < TL::BK / 16; ++kk)
      wgmma_m64k16<T, TL::BN, kMN, kMN>(d, desc_advance(da, kSliceA * kk),
                                        desc_advance(db, kSliceB * kk));
    wgmma_commit();
    fence_acc(d);
    wgmma_wait<1>();  // only this K tile's wgmmas in flight: the previous stage is read
    fence_acc(d);
    if (kt > 0 && lane == 0) mbar_arrive(empty0 + 8 * prev);
    prev = s;
    if (++s == S) s = 0, phase ^= 1;
  }
  wgmma_wait<0>();
  fence_acc(d);
  if (nk > 0 && lane == 0) mbar_arrive(empty0 + 8 * prev);  // the producer may refill it at once
}

// A warp-specialized tile's start: the producer warp's lane 0 (thread THREADS) sets up the
// ring's mbarriers, per stage a "full" (count 1: the producer's arrive.expect_tx, then the
// copies' bytes) and an "empty" (count: the consumer warps, each arriving once it is done with
// the stage), and prefetches the two tensor maps; the block's barrier orders that before any
// wait. All of it reads only the parameters: it may overlap the kernel before this one.
template <class TL>
__device__ __forceinline__ void ws_begin(uint32_t full0, uint32_t empty0, const CUtensorMap* m0,
                                         const CUtensorMap* m1) {
  if (threadIdx.x == TL::THREADS) {
#pragma unroll
    for (int s = 0; s < TL::STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, TL::THREADS / 32);
    }
    fence_mbarrier_init();
    prefetch_tensormap(m0);
    prefetch_tensormap(m1);
  }
  __syncthreads();
  pdl_begin();
}

// The producer's next fill of the ring at (s, phase): once the consumers are done with the
// stage's previous fill (in the first round the wait on parity 1 returns at once), issue(s)
// copies into it; then (s, phase) steps on.
template <class TL, class Issue>
__device__ __forceinline__ void ws_fill(int& s, uint32_t& phase, uint32_t empty0, Issue&& issue) {
  mbar_wait(empty0 + 8 * s, phase ^ 1);
  issue(s);
  if (++s == TL::STAGES) s = 0, phase ^= 1;
}

// ---- Hopper: the im2col tiles, persistent and warp-specialized (sm_90a) ----
//
// igemm_wgmma_im2col_kernel's copies and wgmmas, with the block's threads split by role, as the
// GEMM's warp-specialized tiles (ops/wgmma_gemm.cu) and CUTLASS's Hopper convolutions run them. A
// convolution's output tile has few K tiles (convnet: 9 to 18), so a block per output tile spends
// much of its time filling its pipeline and emptying it (the first copies' latency, the
// epilogue's, with the Tensor Cores idle), and the copies' issue sits in a consumer warp. Here:
// - a grid of as many blocks as fit at once (TL::BLOCK_THREADS threads, the ring and a staging
//   area each), whose blocks walk the output tiles t = blockIdx.x, + gridDim.x, ...: tile t is
//   (t / nt, t % nt) of the (M tiles, nt N tiles), so neighbouring blocks share their A rows;
// - the producer, one warp after the warp groups (warp THREADS / 32, lane 0), issues every K
//   tile's copies of every output tile of the block through the ring, waiting only for the stage
//   to be free: it loads the next output tile's first K tiles while the warp groups still store
//   this one's;
// - the warp groups (the consumers) run ws_k_loop: no block-wide barrier in the K loop;
// - the epilogue (the same staged or pool epilogue) runs through a staging area of its own beside
//   the ring, the consumers meeting at named barrier 1 (epi_sync), without the producer.
// Both loops step (stage, phase) along the same sequence: the block's j-th K tile, counted over
// all its output tiles, sits in stage j % S, filled for the (j / S)-th time.
template <class T, class TL, class Ix = void>
__global__ void __launch_bounds__(TL::BLOCK_THREADS)
    igemm_wgmma_im2col_persistent_kernel(const __grid_constant__ CUtensorMap tmx,
                                         const __grid_constant__ CUtensorMap tmw,
                                         const IgemmArgs<T> a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_begin();
  __trap();  // wgmma needs sm_90a; the host declines every other device
#else
  static_assert(TL::kPersistent, "the persistent tiles");
  constexpr int S = TL::STAGES;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem;
  const uint32_t base = atom_base(smem_raw, &smem);
  // [S][BM][128 B] of A, [S][BN][128 B] of B, the staging, S "full" then S "empty" mbarriers.
  const uint32_t sa = base, sb = base + S * TL::kABytes;
  unsigned char* const staging = smem + TL::kRing;
  const uint32_t full0 = base + TL::kRing + TL::kEpiBytes, empty0 = full0 + 8 * S;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  using Copies = I2cCopies<TL, !std::is_void_v<Ix>>;
  const int KT = Copies::k_tiles(a);
  // The output tiles: (M tiles) x (nt N tiles).
  const int nt = (a.O + TL::BN - 1) / TL::BN;
  const int64_t tiles = (a.M + TL::BM - 1) / TL::BM * nt;

  ws_begin<TL>(full0, empty0, &tmx, &tmw);

  if (warp == TL::THREADS / 32) {  // the producer
    if (lane == 0) {
      Copies cp;
      int s = 0;
      uint32_t phase = 0;
      for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int64_t mt = t / nt;
        const int n0 = static_cast<int>(t - mt * nt) * TL::BN;
        cp.start(a, mt * TL::BM);
        for (int kt = 0; kt < KT; ++kt)
          ws_fill<TL>(s, phase, empty0, [&](int st) {
            cp.issue(a, &tmx, &tmw, sa + st * TL::kABytes, sb + st * TL::kBBytes, n0,
                     full0 + 8 * st);
          });
      }
    }
    return;  // the consumers wait for every copy issued: none is left in flight
  }

  // A consumer warp group: rows 64 wg.. of every output tile of the block, all BN columns.
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);  // uniform: see igemm_wgmma_kernel
  uint64_t da0, db0;
  kmajor_descs<TL>(sa, sb, wg, da0, db0);
  float acc[1][TL::NI][4];
  float(&d)[TL::BN / 2] = reinterpret_cast<float(&)[TL::BN / 2]>(acc);
  int s = 0;
  uint32_t phase = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t mt = t / nt;
    const int64_t m0 = mt * TL::BM;
    const int n0 = static_cast<int>(t - mt * nt) * TL::BN;
    zero_acc<TL>(acc);
    ws_k_loop<T, TL, false>(KT, d, da0, db0, full0, empty0, lane, s, phase);
    igemm_store<T, TL, Ix, TL::kEpiBytes, true>(a, acc, m0, n0, warp, 0, lane, tid, staging);
  }
#endif
}

// ---- TF32: the forward and backward data for f32 inputs ----
//
// The same GEMM, tiles and pipeline with mma.sync m16n8k8 on TF32 (inputs rounded to nearest by
// to_tf32: cvt.rn on sm_90, cvt.rna on sm_80; f32 accumulation). A stage keeps the tile's bytes:
// BK = 16 f32 of k per row, two mma steps of 8. Each operand is gathered 4 bytes at a time
// (cp.async.ca, zero-filled outside), with the element offsets of the k table (KTap), so any
// layout of x, w and y is read and written in place: no staging, no filter copy, and NCHW (f32's
// layout in our graphs) as well as channels-last. Thread tid fills row tid % BM of A's stage (one
// output pixel for the whole K loop: consecutive threads take consecutive pixels, consecutive in
// memory in NCHW) at k columns tid / BM + j·A_STEP, and row tid % BN of B's (one output channel)
// at columns tid / BN + j·B_STEP; a warp's threads share their columns, so each table read is
// one broadcast. The table is copied into shared memory after the stages once per block
// (KTapBits: the KTap's offsets and its tap's bit), and each row keeps the bits of its
// receptive field's taps inside the image (field_taps, as the 16-bit gather's rows): a copy
// tests one bit where it read a 16-byte KTap from global memory in a branch of its own and
// compared two coordinates (fortieth session: the 128x64 tile's K loop from 732 to 368
// instructions, docs/kernels.md). Rows are padded by 4 f32 (16 bytes), so ldmatrix reads the fragments as in 16
// bits: an 8x8 b16 matrix is 8 rows of 4 f32, and the x4 matrices (rows 0-7 and 8-15, k 0-3 and
// 4-7) are a0..a3 of the m16n8k8 A fragment (a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4))
// and b0, b1 of two n tiles.
// The TF32 forward's and backward data's k tables in shared memory, from KTap: entry k of A's
// holds the bit of its tap kh·KW + kw (0 past K, so that no row copies it) and its activation
// offset in bytes, one 8-byte load; entry k of B's its filter offset in bytes (kPastK past K).
// Offsets from a receptive field's origin or a filter row's start are never negative: unsigned,
// they add to a 64-bit address without a sign extension.
struct alignas(8) KTapA {
  uint32_t bit;
  uint32_t off;
};
// B's entry past K: the top bit set (a copy tests it as a sign, one compare) and aligned for
// the zero-filled copy, which reads nothing.
constexpr uint32_t kPastK = 0x80000000u;

// N copies of one operand, each from a table entry in shared memory (tab[col(j)] for copy j):
// four entries read, then their four copies issued (copy(j, entry)). With each copy right after
// its own entry's shared load, ptxas put three never-issued shared loads before every copy; all
// N entries first removes them too but costs up to 24 more registers. Fewer than four: all first.
template <int N, class E, class Col, class Copy>
__device__ __forceinline__ void copies_in_fours(const E* tab, Col&& col, Copy&& copy) {
  constexpr int kG = N < 4 ? N : 4;
  static_assert(N % kG == 0, "copies in fours");
#pragma unroll
  for (int j0 = 0; j0 < N; j0 += kG) {
    E e[kG];
#pragma unroll
    for (int j = 0; j < kG; ++j) e[j] = tab[col(j0 + j)];
#pragma unroll
    for (int j = 0; j < kG; ++j) copy(j0 + j, e[j]);
  }
}

template <class TL>
struct Tf32Tile {
  static constexpr int BK = TL::BK / 2;  // f32 per row and stage: the 16-bit tile's bytes
  static constexpr int LDS = BK + 4;
  static constexpr int SMEM = TL::STAGES * (TL::BM + TL::BN) * LDS * 4;
  // The stages, then the k tables (KT·BK entries each: A's, then B's).
  static constexpr int smem_with_table(int K) {
    return SMEM + (K + BK - 1) / BK * BK * static_cast<int>(sizeof(KTapA) + sizeof(int32_t));
  }
  static constexpr int A_STEP = TL::THREADS / TL::BM, A_ITERS = BK / A_STEP;
  static constexpr int B_STEP = TL::THREADS / TL::BN, B_ITERS = BK / B_STEP;
  // B's 4-byte copies: B_STEP threads a filter row, on consecutive k, so a warp's copy writes
  // 32 / B_STEP rows, B_STEP columns each (a row per thread was 32 rows of one column: four
  // lanes a bank). A row's first bank is LDS·row mod 32, a multiple of 4 that repeats every 8
  // rows (LDS = BK + 4: 20 or 36), so run g = row / 8 (mod B_ROT) of eight rows takes its
  // thread's columns XORed with g·B_STEP (the same columns, in another order): the warp's 32
  // stores then fall on 32 banks where B_STEP <= 4 (the emulator's PLEXUS_EMU_ACCESS counts
  // them), and the filter's consecutive k share lines.
  static constexpr int B_ROT = B_STEP >= 4 ? 1 : 4 / B_STEP;
  // A gathered 16 bytes (4 channels of one tap) at a time from a channels-last activation
  // (igemm_tf32_kernel's kVec): CPR_V chunks per row, thread tid copying chunk vcol of rows
  // vrow + i·AV_STEP, AV_ITERS of them (copy_chunk, copy_row).
  static constexpr int CPR_V = BK / 4, AV_STEP = TL::THREADS / CPR_V;
  static constexpr int AV_ITERS = TL::BM * CPR_V / TL::THREADS;
  // The weight gradient's k-major stages (see igemm_wgrad_tf32_kernel).
  static constexpr int LDA_K = TL::BM + 8, LDB_K = TL::BN + 8;
  static constexpr int W_STEP = TL::THREADS / BK;
  static constexpr int WA_ITERS = TL::BM / W_STEP, WB_ITERS = TL::BN / W_STEP;
  // Its 16-byte copies (kVec): chunks of 4 columns, the same W_STEP apart.
  static constexpr int WA_ITERS_V = TL::BM / 4 / W_STEP, WB_ITERS_V = TL::BN / 4 / W_STEP;
  static constexpr int W_SMEM = TL::STAGES * BK * (LDA_K + LDB_K) * 4;
  static_assert(BK % 8 == 0, "BK is a multiple of the TF32 mma's K (8)");
  static_assert(TL::THREADS % TL::BM == 0 && TL::THREADS % TL::BN == 0 && BK % A_STEP == 0 &&
                    BK % B_STEP == 0,
                "a fixed row per thread and the stage's columns spread evenly");
  static_assert(TL::THREADS % BK == 0 && TL::BM % W_STEP == 0 && TL::BN % W_STEP == 0,
                "the weight gradient's copies spread evenly over the threads");
  static_assert(TL::BM % (4 * W_STEP) == 0 && TL::BN % (4 * W_STEP) == 0,
                "the weight gradient's 16-byte copies spread evenly over the threads");
  static_assert(TL::THREADS % CPR_V == 0 && (TL::BM * CPR_V) % TL::THREADS == 0 &&
                    (LDS * 4) % 16 == 0,
                "the 16-byte A copies spread evenly over the threads, rows 16-byte aligned");
  static_assert(LDA_K % 32 == 8 && LDB_K % 32 == 8, "scalar fragment reads on distinct banks");
};

__device__ __forceinline__ uint32_t tf32_of(uint32_t bits) {
  return to_tf32(__uint_as_float(bits));
}

// kVec: the activation is channels-last (dense NHWC strides) with C % 4 == 0 and 16-byte
// aligned, so that 4 consecutive k (= tap·C + c, c % 4 == 0) are 16 contiguous bytes of one tap:
// A's copies take 16 bytes each through the 16-bit kernels' ARows (a quarter of the copies and
// of their table reads; the stage's bytes are the same), where a copy of NCHW (or C % 4 != 0)
// takes one f32.
template <class TL, class Ix = void, bool kVec = false>
__global__ void __launch_bounds__(TL::THREADS) igemm_tf32_kernel(const IgemmArgs<float> a) {
  pdl_begin();
  using G = Tf32Tile<TL>;
  constexpr bool kPool = !std::is_void_v<Ix>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const As = reinterpret_cast<float*>(smem_raw);  // [STAGES][BM][LDS]
  float* const Bs = As + TL::STAGES * TL::BM * G::LDS;   // [STAGES][BN][LDS]

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp % TL::WARPS_M, wn = warp / TL::WARPS_M;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * TL::BM;
  const int n0 = static_cast<int>(blockIdx.y) * TL::BN;

  const int ar = tid % TL::BM, ac = tid / TL::BM;
  const int br = tid / G::B_STEP, bc = tid % G::B_STEP;
  // Run g of eight rows XORs its copies' columns with g·B_STEP (Tf32Tile's B_ROT): what that
  // adds to column c depends on c's two low bits alone, which for copy j are (j·B_STEP) % 4,
  // known at compile time; so each copy's shared address and table entry stay a base plus an
  // immediate, with up to four bases a tile.
  int b_xor[4];
#pragma unroll
  for (int l = 0; l < 4; ++l) b_xor[l] = (l ^ ((br >> 3) % G::B_ROT * G::B_STEP)) - l;
  // Addresses as integers (as the 16-bit gather's ARows: nvcc then keeps x's and w's addresses
  // out of the loop, and each copy adds one 32-bit byte offset), zero-filled copies' too
  // (ops/mma_ptx.cuh, cp_async16; past K the filter's offset is kPastK).
  const int64_t x_addr = reinterpret_cast<int64_t>(a.x), w_addr = reinterpret_cast<int64_t>(a.w);
  int64_t a_org = x_addr;  // the pixel's receptive field origin (ih0, iw0) in x
  uint32_t a_taps = 0;     // the field's taps inside the image (none past M)
  // kVec: chunk column vcol of rows vrow + i·AV_STEP, their origins and taps in av.
  const int vcol = copy_chunk<G::CPR_V>(tid), vrow = copy_row<G::CPR_V>(tid);
  ARows<kVec ? G::AV_ITERS : 1> av;
  if constexpr (kVec) {
    a_rows_init<kPool>(a, m0, vrow, G::AV_STEP, av);
  } else if (m0 + ar < a.M) {
    int64_t n;
    int oh, ow;
    igemm_pixel<kPool>(a, m0 + ar, n, oh, ow);
    const int ih0 = oh * a.sh - a.ph, iw0 = ow * a.sw - a.pw;
    a_org += (n * a.xs_n + ih0 * a.xs_h + iw0 * a.xs_w) * static_cast<int64_t>(sizeof(float));
    a_taps = field_taps(a, ih0, iw0);
  }
  // The output channel's filter row; a row past O copies row 0's (its column of the tile is
  // never stored, and nothing else reads it), so only k past K is zero-filled.
  const int64_t b_org =
      w_addr + (n0 + br < a.O ? (n0 + br) * a.ws_n : 0) * static_cast<int64_t>(sizeof(float));
  const int KT = (a.K + G::BK - 1) / G::BK;

  // The k tables after the stages.
  KTapA* const atab = reinterpret_cast<KTapA*>(smem_raw + G::SMEM);
  uint32_t* const btab = reinterpret_cast<uint32_t*>(atab + KT * G::BK);
  for_block_strided<TL::THREADS>(KT * G::BK, tid, [&](int k) {
    KTapA e{0u, 0u};
    uint32_t b = kPastK;
    if (k < a.K) {
      const KTap t = a.tab[k];
      e = {1u << (t.kh * a.KW + t.kw), static_cast<uint32_t>(t.a) * 4u};
      b = static_cast<uint32_t>(t.b) * 4u;
    }
    atab[k] = e;
    btab[k] = b;
  });
  __syncthreads();

  auto load_tile = [&](int st, int kt) {
    float* const as = As + st * TL::BM * G::LDS;
    float* const bs = Bs + st * TL::BN * G::LDS;
    const KTapA* const ap = atab + kt * G::BK;
    const uint32_t* const bp = btab + kt * G::BK;
    const auto a_col = [&](int j) { return ac + j * G::A_STEP; };
    const auto b_col = [&](int j) { return bc + j * G::B_STEP + b_xor[(j * G::B_STEP) & 3]; };
    if constexpr (kVec) {
      // Entry 4·vcol of the tile: its tap's bit and the byte offset (kh·W + kw)·C + c of its 4
      // channels from a row's field origin (a_rows_init's), the same for every row.
      const KTapA e = ap[vcol * 4];
      const uint32_t dst = smem_addr(as + vrow * G::LDS + vcol * 4);
#pragma unroll
      for (int i = 0; i < G::AV_ITERS; ++i) {
        const bool ok = (av.taps[i] & e.bit) != 0;
        cp_async16_ca(dst + static_cast<uint32_t>(i * G::AV_STEP * G::LDS * 4),
                      reinterpret_cast<const void*>(av.org[i] + e.off), ok);
      }
    } else {
      copies_in_fours<G::A_ITERS>(ap, a_col, [&](int j, const KTapA& e) {
        const bool ok = (a_taps & e.bit) != 0;
        cp_async4(smem_addr(as + ar * G::LDS + a_col(j)),
                  reinterpret_cast<const void*>(a_org + e.off), ok);
      });
    }
    copies_in_fours<G::B_ITERS>(bp, b_col, [&](int j, uint32_t off) {
      const bool ok = static_cast<int32_t>(off) >= 0;  // not kPastK
      cp_async4(smem_addr(bs + br * G::LDS + b_col(j)), reinterpret_cast<const void*>(b_org + off),
                ok);
    });
  };

  float acc[TL::MI][TL::NI][4];
  zero_acc<TL>(acc);

  // ldmatrix row addresses (as igemm_conv_kernel's, with 4 f32 where it has 8 halves).
  const int a_row = wm * TL::WM + (lane & 15), a_col = (lane >> 4) * 4;
  const int b_row = wn * TL::WN + (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 4;

  pipelined_k_loop<TL::STAGES>(KT, load_tile, [&](int st) {
    const float* const as = As + st * TL::BM * G::LDS;
    const float* const bs = Bs + st * TL::BN * G::LDS;
#pragma unroll
    for (int kk = 0; kk < G::BK; kk += 8) {
      uint32_t af[TL::MI][4];
      uint32_t bf[TL::NI][2];
#pragma unroll
      for (int i = 0; i < TL::MI; ++i) {
        ldmatrix_x4(af[i], smem_addr(as + (a_row + i * 16) * G::LDS + kk + a_col));
#pragma unroll
        for (int r = 0; r < 4; ++r) af[i][r] = tf32_of(af[i][r]);
      }
#pragma unroll
      for (int j = 0; j < TL::NI; j += 2) {
        uint32_t r[4];
        ldmatrix_x4(r, smem_addr(bs + (b_row + j * 8) * G::LDS + kk + b_col));
        bf[j][0] = tf32_of(r[0]), bf[j][1] = tf32_of(r[1]);
        bf[j + 1][0] = tf32_of(r[2]), bf[j + 1][1] = tf32_of(r[3]);
      }
#pragma unroll
      for (int i = 0; i < TL::MI; ++i)
#pragma unroll
        for (int j = 0; j < TL::NI; ++j) mma_1688_tf32(acc[i][j], af[i], bf[j]);
    }
  });

  igemm_store<float, TL, Ix, G::SMEM>(a, acc, m0, n0, wm, wn, lane, tid, smem_raw);
}

// ---- pixels along the weight gradient's K ----
//
// The weight gradient's K runs over output pixels p = (n·OH + oh)·OW + ow. A thread copies the
// same rows of every K tile, so its pixels move BK on per tile: the step is pixel_pos(BK), and
// advance() adds it with at most one carry per digit (q + BK mod OHW < 2·OHW), in place of two
// divisions per row and tile. p past the last pixel gives n >= N, which the copies
// test through p < P.
struct PixelPos {
  int n, oh, ow;
};
__device__ __forceinline__ PixelPos pixel_pos(int p, int OHW, int OW) {
  const int n = p / OHW, q = p - n * OHW;
  const int oh = q / OW;
  return {n, oh, q - oh * OW};
}
__device__ __forceinline__ PixelPos advance(PixelPos p, const PixelPos& s, int OH, int OW) {
  p.ow += s.ow;
  p.oh += s.oh;
  p.n += s.n;
  if (p.ow >= OW) p.ow -= OW, ++p.oh;
  if (p.oh >= OH) p.oh -= OH, ++p.n;
  return p;
}

// ---- the weight-gradient kernel ----
//
// dw[o, kh, kw, c] = Σ over pixels p = (n, oh, ow) of dy[n, oh, ow, o]·x[n, oh·sh-ph+kh,
// ow·sw-pw+kw, c]: a GEMM with M = O, N_gemm = J = KH·KW·C (j = (kh·KW + kw)·C + c) and
// K = P = N·OH·OW. Both operands are contiguous along M and N rather than K (dy in NHWC holds the
// O channels of a pixel together, x the C channels of a tap), so a stage is stored k-major,
// As[k][m] and Bs[k][n], and ldmatrix.trans turns 8x8 blocks of it into the row-major A and
// column-major B fragments. K is long (10^5 pixels and more) and the output small, so the K range
// is split over gridDim.z slices; each slice writes its f32 partial tile to the workspace, and
// the slices' sum is finished in the launch by split_sum (device.cuh: groups of about √slices
// summed by the last slice of each group to finish, then the groups by the last group), rounded
// once into dw: one launch, deterministic (the counters only say which block is last), no
// atomics on the data.
template <class T>
struct WgradArgs {
  const T* dy;     // NHWC (N, OH, OW, O), O % 8 == 0, 16-byte aligned
  const T* x;      // NHWC (N, H, W, C), C % 8 == 0, 16-byte aligned
  float* part;     // [slices][O][J]
  T* dw;           // (O, KH, KW, C) when w_nhwc, else (O, C, KH, KW)
  unsigned* done;  // [tiles of O][tiles of J][split_sum_counters(slices)], zero between launches
  int64_t KHW;     // KH·KW
  bool w_nhwc;
  int H, W, C, O, KW, OW, sh, sw, ph, pw;
  int J;       // KH·KW·C
  int P;       // N·OH·OW
  int OHW;     // OH·OW
  int OH;
  int kt_per;  // K tiles per slice
  // TF32: the k table over j (KTap.a, kh, kw), the element strides of dy along n, c, h, w and
  // of x along n, h, w; KH and the first tap of each filter row (IgemmArgs::rep) for the tap
  // bits of a pixel's receptive field (field_taps).
  const KTap* tab;
  int64_t ds_n, ds_c, ds_h, ds_w, xs_n, xs_h, xs_w;
  int KH;
  uint32_t rep;
  // The im2col weight gradient's pixel p = (n, oh, ow): n and the rest by OH·OW, then oh and ow
  // by OW (device.cuh's FastDiv: a multiply-high where `/` is about twenty instructions).
  FastDiv fOHW, fOW;
};

template <class TL>
struct WgradSmem {
  static constexpr int LDA = TL::BM + 8, LDB = TL::BN + 8;  // 16 bytes of padding per k row
  // The stages, then the pixel tables (PixTables: 16 bytes per k row).
  static constexpr int BYTES = TL::STAGES * TL::BK * ((LDA + LDB) * 2 + 16);
  static constexpr int CA = TL::BM / 8, CB = TL::BN / 8;  // 16-byte chunks per k row
  static constexpr int A_ITERS = TL::BK * CA / TL::THREADS, B_ITERS = TL::BK * CB / TL::THREADS;
  static_assert(TL::THREADS % CA == 0 && TL::THREADS % CB == 0, "fixed chunk column per thread");
  static_assert((TL::BK * CA) % TL::THREADS == 0 && (TL::BK * CB) % TL::THREADS == 0,
                "the copies of a stage spread evenly over the threads");
};

// The end of a weight-gradient block: its slice's partial tile to the workspace, f32, two
// columns per store where J is even (j is: then j + 1 < J, and the pair is 8-byte aligned); then,
// in the block that finishes the tile's split_sum, dw = the slices' sum rounded once into w's
// layout (channels-last (O, KH, KW, C) is the partials' own order, else (O, C, KH, KW)).
template <class T, class TL, class Team = WholeBlock>
__device__ __forceinline__ void wgrad_finish(const WgradArgs<T>& a,
                                             const float (&acc)[TL::MI][TL::NI][4], int m0, int n0,
                                             int wm, int wn, int lane) {
  float* const part = a.part + static_cast<int64_t>(blockIdx.z) * a.O * a.J;
#pragma unroll
  for (int i = 0; i < TL::MI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int o = m0 + wm * TL::WM + i * 16 + (lane >> 2) + h * 8;
      if (o >= a.O) continue;
#pragma unroll
      for (int j = 0; j < TL::NI; ++j) {
        const int jj = n0 + wn * TL::WN + j * 8 + (lane & 3) * 2;
        if (jj >= a.J) continue;
        float* const dst = part + static_cast<int64_t>(o) * a.J + jj;
        if (!std::is_same_v<T, float> || a.J % 2 == 0) {  // 16 bits: C % 8 == 0, J even
          *reinterpret_cast<float2*>(dst) = make_float2(acc[i][j][h * 2], acc[i][j][h * 2 + 1]);
        } else {  // TF32 with an odd C: rows of odd length, one column at a time
          dst[0] = acc[i][j][h * 2];
          if (jj + 1 < a.J) dst[1] = acc[i][j][h * 2 + 1];
        }
      }
    }
  }

  // The slices' sum (split_sum: two levels, in a fixed order), rounded once into dw.
  unsigned* const counters =
      a.done + (blockIdx.y * gridDim.x + blockIdx.x) * split_sum_counters(gridDim.z);
  split_sum<Team>(
      counters, a.part, static_cast<int64_t>(a.O) * a.J, gridDim.z, blockIdx.z, TL::BM * TL::BN,
      [&](int e) -> int64_t {
        const int o = m0 + e / TL::BN, j = n0 + e % TL::BN;
        return o < a.O && j < a.J ? static_cast<int64_t>(o) * a.J + j : -1;
      },
      [&](int, int64_t i, float sum) {
        int64_t dst = i;
        if (!a.w_nhwc) {
          const int64_t o = i / a.J, j = i - o * a.J;
          const int64_t tap = j / a.C, c = j - tap * a.C;
          dst = o * a.J + c * a.KHW + tap;
        }
        a.dw[dst] = from_accum<T>(sum);
      });
}

// ---- the weight gradient's copies (both kernel families) ----
//
// A thread copies one 16-byte chunk column of each operand, in k rows (pixels) row + i·step of
// every K tile: of A, dy's output channels oa.. (O % 8 == 0: a chunk is wholly inside O or wholly
// past it); of B, x's channels at column j = jb.. of the GEMM (J % 8 == 0 likewise; a chunk is
// one tap's channels, since C % 8 == 0), whose tap is decomposed once. `dst` is the shared address
// of the thread's first row's chunk, its later rows `bytes` apart.
struct WgradCol {
  bool oin, jin;  // the chunks lie inside O, inside J
  int bkh, bkw;   // B: the tap
  int tap_bytes;  // B: ((kh·W + kw)·C + c) elements, the chunk's offset from its pixel's origin
};

template <class T>
__device__ __forceinline__ WgradCol wgrad_col(const WgradArgs<T>& a, int oa, int jb) {
  WgradCol c{oa < a.O, jb < a.J, 0, 0, 0};
  if (c.jin) {
    const int tap = jb / a.C;
    c.bkh = tap / a.KW;
    c.bkw = tap - c.bkh * a.KW;
    c.tap_bytes = ((c.bkh * a.W + c.bkw) * a.C + (jb - tap * a.C)) * static_cast<int>(sizeof(T));
  }
  return c;
}

// A's rows: dy[p, oa..oa+7] for the pixels p = pix + i·step of the next K tile, from `src` (row
// 0's chunk); each call steps both one tile (BK pixels) on.
struct WgradRowsA {
  const char* src;
  int pix;
};

template <int N, int BK, class T>
__device__ __forceinline__ void wgrad_copy_a(const WgradArgs<T>& a, const WgradCol& c,
                                             WgradRowsA& r, int step, uint32_t dst,
                                             uint32_t bytes) {
  const int64_t row_bytes = static_cast<int64_t>(step) * a.O * static_cast<int>(sizeof(T));
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const bool ok = c.oin && r.pix + i * step < a.P;
    const T* src = reinterpret_cast<const T*>(r.src + i * row_bytes);  // zero-filled too: mma_ptx
    cp_async16(dst + i * bytes, src, ok);
  }
  r.src += static_cast<int64_t>(BK) * a.O * static_cast<int>(sizeof(T));
  r.pix += BK;
}

template <class T>
__device__ __forceinline__ WgradRowsA wgrad_rows_a(const WgradArgs<T>& a, int pix, int oa) {
  return {reinterpret_cast<const char*>(a.dy + (static_cast<int64_t>(pix) * a.O + oa)), pix};
}

// The pixel table of a K tile: for each of its BK k rows (pixels p = (n, oh, ow)), where the
// receptive field starts in x, ih = oh·sh - ph and iw = ow·sw - pw, and the address of
// x[n, ih, iw, channel 0] (outside the image where padded: only taps inside it are read). A row
// past the last pixel gets ih = -2^30, so that every tap fails the bounds test. B's copies of a
// row are then a table read, two adds and two compares, where each thread stepped its rows'
// pixels itself before (about 20 instructions a row). Thread tid < BK builds row tid of every
// tile, stepping its pixel q one tile on (tiles in order, each once: advance() divides nothing).
struct alignas(16) PixRow {
  int ih, iw;
  uint64_t addr;  // as an integer: where padded, it points before the image
};

template <int BK, class T>
__device__ __forceinline__ void wgrad_table_row(const WgradArgs<T>& a, int kt, int tid, PixelPos& q,
                                                const PixelPos& pstep, PixRow* slot) {
  if (tid >= BK) return;
  const int64_t x_img = static_cast<int64_t>(a.H) * a.W * a.C;  // one image of x (C·H·W < 2^31)
  PixRow e;
  e.ih = q.oh * a.sh - a.ph;
  e.iw = q.ow * a.sw - a.pw;
  const int64_t off = q.n * x_img + (e.ih * a.W + e.iw) * a.C;
  e.addr = reinterpret_cast<uint64_t>(a.x) + static_cast<uint64_t>(off) * sizeof(T);
  if (kt * BK + tid >= a.P) e.ih = -(1 << 30);
  slot[tid] = e;
  q = advance(q, pstep, a.OH, a.OW);
}

// B's rows of a K tile from its pixel table `slot`: x at the chunk's tap of each row's pixel.
// The table entries are read G rows at a time before those rows' copies: a cp.async is asm with
// a memory clobber, so a read after it stays after it, and on sm_90 ptxas puts three
// never-executed shared loads (`@!PT LDS RZ, [RZ]`, four issue slots a copy) before each LDGSTS
// that follows a shared load. G = 4 (reading all 8 rows of the 64x128 tile at once costs more
// registers than it saves: nvcc then recomputes the thread's offsets in the loop).
template <int N, class T>
__device__ __forceinline__ void wgrad_copy_b(const WgradArgs<T>& a, const WgradCol& c,
                                             const PixRow* slot, int row, int step, uint32_t dst,
                                             uint32_t bytes) {
  constexpr int G = N < 4 ? N : 4;
  static_assert(N % G == 0, "whole groups of rows");
#pragma unroll
  for (int i0 = 0; i0 < N; i0 += G) {
    int4 rows[G];
#pragma unroll
    for (int g = 0; g < G; ++g)
      rows[g] = *reinterpret_cast<const int4*>(slot + row + (i0 + g) * step);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int4 v = rows[g];
      const int ih = v.x + c.bkh, iw = v.y + c.bkw;
      const bool ok = c.jin && static_cast<unsigned>(ih) < static_cast<unsigned>(a.H) &&
                      static_cast<unsigned>(iw) < static_cast<unsigned>(a.W);
      const uint64_t addr =
          (static_cast<uint64_t>(static_cast<uint32_t>(v.w)) << 32 | static_cast<uint32_t>(v.z)) +
          static_cast<uint64_t>(static_cast<int64_t>(c.tap_bytes));
      // Also zero-filled copies take the row's address (mma_ptx.cuh, cp_async16); x through
      // L1, as the forward's gather (the block's other taps read the same pixels).
      cp_async16_ca(dst + (i0 + g) * bytes, reinterpret_cast<const T*>(addr), ok);
    }
  }
}

// The pixel tables of a pipeline that copies kAhead tiles ahead (tile t + kAhead while computing
// tile t), in STAGES slots, tile t's in slot t % STAGES: before the K loop, the tables of tiles
// 0..kAhead and a barrier; then the copies of tile t (t >= kAhead) build tile t + 1's table, into
// the slot of tile t + 1 - STAGES, whose copies were issued before the barrier that precedes
// them (STAGES > kAhead), and which no thread reads until after the next barrier.
template <int BK, int STAGES, int kAhead, class T>
struct PixTables {
  static_assert(kAhead < STAGES, "a table slot per tile in flight");
  PixRow* tab;  // [STAGES][BK] in shared memory
  PixelPos q, pstep;
  int kt0, nk;

  __device__ __forceinline__ PixTables(const WgradArgs<T>& a, PixRow* t, int kt0_, int nk_, int tid)
      : tab(t),
        q(pixel_pos(kt0_ * BK + tid, a.OHW, a.OW)),
        pstep(pixel_pos(BK, a.OHW, a.OW)),
        kt0(kt0_),
        nk(nk_) {}

  __device__ __forceinline__ void prologue(const WgradArgs<T>& a, int tid) {
#pragma unroll
    for (int t = 0; t <= kAhead; ++t)
      if (t < nk) wgrad_table_row<BK>(a, kt0 + t, tid, q, pstep, tab + t * BK);
    __syncthreads();
  }
  // After the copies of the slice's tile `it` from slot st: tile it + 1's table.
  __device__ __forceinline__ void after_copy(const WgradArgs<T>& a, int it, int st, int tid) {
    if (it >= kAhead && it + 1 < nk)
      wgrad_table_row<BK>(a, kt0 + it + 1, tid, q, pstep, tab + ((st + 1) % STAGES) * BK);
  }
  __device__ __forceinline__ const PixRow* slot(int st) const {
    return tab + st * BK;
  }
};

// Grid: x over O tiles, y over J tiles, z over K slices.
template <class T, class TL>
__global__ void __launch_bounds__(TL::THREADS) igemm_wgrad_kernel(const WgradArgs<T> a) {
  using S = WgradSmem<TL>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const As = reinterpret_cast<T*>(smem_raw);     // [STAGES][BK][LDA]
  T* const Bs = As + TL::STAGES * TL::BK * S::LDA;  // [STAGES][BK][LDB]

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp % TL::WARPS_M, wn = warp / TL::WARPS_M;
  const int m0 = static_cast<int>(blockIdx.x) * TL::BM;
  const int n0 = static_cast<int>(blockIdx.y) * TL::BN;
  const int KT = (a.P + TL::BK - 1) / TL::BK;
  const int kt0 = static_cast<int>(blockIdx.z) * a.kt_per;
  const int kt1 = min(KT, kt0 + a.kt_per);  // the host makes every slice non-empty

  // Copy assignment: chunk column fixed per thread, k rows (pixels) row + i·step.
  const int a_ccol = copy_chunk<S::CA>(tid), a_crow = copy_row<S::CA>(tid);
  const int b_ccol = copy_chunk<S::CB>(tid), b_crow = copy_row<S::CB>(tid);
  constexpr int kAStep = TL::THREADS / S::CA, kBStep = TL::THREADS / S::CB;
  const WgradCol col = wgrad_col(a, m0 + a_ccol * 8, n0 + b_ccol * 8);
  // pipelined_k_loop copies STAGES - 1 tiles ahead.
  PixTables<TL::BK, TL::STAGES, TL::STAGES - 1, T> px(
      a, reinterpret_cast<PixRow*>(Bs + TL::STAGES * TL::BK * S::LDB), kt0, kt1 - kt0, tid);
  px.prologue(a, tid);
  // All of the above (the column's tap, the first tiles' pixel tables) reads only the
  // parameters: it may overlap the kernel before this one.
  pdl_begin();

  WgradRowsA ra = wgrad_rows_a(a, kt0 * TL::BK + a_crow, m0 + a_ccol * 8);

  auto load_tile = [&](int st, int it) {
    wgrad_copy_a<S::A_ITERS, TL::BK>(a, col, ra, kAStep,
                                     smem_addr(As + (st * TL::BK + a_crow) * S::LDA + a_ccol * 8),
                                     kAStep * S::LDA * sizeof(T));
    wgrad_copy_b<S::B_ITERS>(a, col, px.slot(st), b_crow, kBStep,
                             smem_addr(Bs + (st * TL::BK + b_crow) * S::LDB + b_ccol * 8),
                             kBStep * S::LDB * sizeof(T));
    px.after_copy(a, it, st, tid);
  };

  float acc[TL::MI][TL::NI][4];
  zero_acc<TL>(acc);

  // ldmatrix.trans row addresses per lane (matrix q = lane / 8, its row lane % 8):
  // A: a0..a3 = (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15), stored as
  //   k rows: lane l points at k (l % 8) + 8·(l / 16), m 8·((l / 8) % 2).
  // B: b0, b1 of n tile j, then of j+1 = (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
  //   (k 8-15, n 8-15): lane l points at k (l % 8) + 8·((l / 8) % 2), n 8·(l / 16).
  const int a_k = (lane & 7) + ((lane >> 4) << 3);
  const int a_m = wm * TL::WM + ((lane >> 3) & 1) * 8;
  const int b_k = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int b_n = wn * TL::WN + ((lane >> 4) << 3);

  pipelined_k_loop<TL::STAGES>(
      kt1 - kt0, [&](int st, int it) { load_tile(st, it); },
      [&](int st) {
        const T* const as = As + st * TL::BK * S::LDA;
        const T* const bs = Bs + st * TL::BK * S::LDB;
#pragma unroll
        for (int kk = 0; kk < TL::BK; kk += 16) {
          uint32_t af[TL::MI][4];
          uint32_t bf[TL::NI][2];
#pragma unroll
          for (int i = 0; i < TL::MI; ++i)
            ldmatrix_x4_trans(af[i], smem_addr(as + (kk + a_k) * S::LDA + a_m + i * 16));
#pragma unroll
          for (int j = 0; j < TL::NI; j += 2) {
            uint32_t r[4];
            ldmatrix_x4_trans(r, smem_addr(bs + (kk + b_k) * S::LDB + b_n + j * 8));
            bf[j][0] = r[0], bf[j][1] = r[1];
            bf[j + 1][0] = r[2], bf[j + 1][1] = r[3];
          }
#pragma unroll
          for (int i = 0; i < TL::MI; ++i)
#pragma unroll
            for (int j = 0; j < TL::NI; ++j) mma_16816<T>(acc[i][j], af[i], bf[j]);
        }
      });
  wgrad_finish<T, TL>(a, acc, m0, n0, wm, wn, lane);
}

// ---- Hopper: the weight gradient on wgmma (sm_90a) ----

// The Hopper weight gradients' K tiles (64 pixels each): slice blockIdx.z starts at tile kt0 and
// takes nk of them (the host makes every slice non-empty).
template <class T>
__device__ __forceinline__ int wgrad_kt0(const WgradArgs<T>& a) {
  return static_cast<int>(blockIdx.z) * a.kt_per;
}
template <class T>
__device__ __forceinline__ int wgrad_tiles(const WgradArgs<T>& a, int kt0) {
  return min((a.P + 63) / 64, kt0 + a.kt_per) - kt0;
}

// Its shared memory: the ring (realigned to 1024 bytes), the pixel tables, then A's mbarriers.
template <class TL>
constexpr int wgmma_wgrad_tables() {
  return TL::STAGES * TL::BK * static_cast<int>(sizeof(PixRow));
}
template <class TL>
constexpr int wgmma_wgrad_smem() {
  return TL::SMEM + wgmma_wgrad_tables<TL>();
}

// The same GEMM, copies, slices and last-slice sum as igemm_wgrad_kernel, with the math on wgmma
// as in igemm_wgmma_kernel: BM / 64 warp groups, each owning 64 rows (output channels o) and all
// BN columns (j) of the tile, one wgmma.m64nBNk16 per 16 of k (pixels). Both operands are
// contiguous along M and N, not K, so both are read MN-major (wgmma's imm-trans-a and -b, which
// 16-bit types allow): a stage holds, per 64 of M (of N), a box of BK = 64 k rows of 128 bytes,
// 8 KiB, with the 128-byte swizzle (chunk c of k row r at chunk c ^ (r % 8)); the descriptors
// step 1024 bytes per 8 k rows (SBO) and 8192 per 64 of M or N (LBO), and k slice kk starts
// 2048 kk bytes in, as the Hopper GEMM's MN-major operands do (ops/wgmma_gemm.cu, checked on the
// H100). A (dy, a plain (P, O) matrix) comes through the TMA (tmy): per stage BM / 64 boxes of 64
// channels x 64 pixels at (o, p) = (m0 + 64 j, kt·64), each one 8 KiB box of the stage. B is
// gathered by cp.async: each thread's rows are a multiple of 8 apart, so its chunk's swizzled
// place is the same in all of them, and the rows come from the pixel tables (PixTables, kept
// after the ring). Pipeline as igemm_wgmma_kernel's: STAGES stages, copies STAGES-2 tiles ahead,
// one wgmma group in flight.
template <class T, class TL>
__global__ void __launch_bounds__(TL::THREADS)
    igemm_wgmma_wgrad_kernel(const __grid_constant__ CUtensorMap tmy, const WgradArgs<T> a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_begin();
  __trap();  // wgmma needs sm_90a; the host declines every other device
#else
  constexpr int S = TL::STAGES, BK = TL::BK;
  constexpr uint32_t kBox = 64 * 128;  // 64 k rows of 64 elements
  constexpr int CB = TL::BN / 8;       // B's 16-byte chunks per k row
  constexpr int kBStep = TL::THREADS / CB;
  constexpr int B_ITERS = BK / kBStep;
  static_assert(BK == 64 && TL::BN % 64 == 0, "MN-major operands: boxes of 64 k x 64 elements");
  static_assert(TL::THREADS % CB == 0 && kBStep % 8 == 0 && BK % kBStep == 0,
                "a thread's rows share their swizzle phase, and the rows spread evenly");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem;
  const uint32_t base = atom_base(smem_raw, &smem);
  const uint32_t sa = base, sb = base + S * TL::kABytes;  // [S][BM/64][64][128 B], [S][BN/64]...

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);  // uniform: see igemm_wgmma_kernel
  const int m0 = static_cast<int>(blockIdx.x) * TL::BM;
  const int n0 = static_cast<int>(blockIdx.y) * TL::BN;
  const int kt0 = wgrad_kt0(a), nk = wgrad_tiles(a, kt0);

  // Thread tid copies B's chunk column ccol (of box ccol / 8) of k rows crow + i·step.
  const int b_ccol = tid % CB, b_crow = tid / CB;
  const uint32_t b_off = static_cast<uint32_t>((b_ccol >> 3) * kBox + b_crow * 128 +
                                               (((b_ccol & 7) ^ (b_crow & 7)) << 4));
  const WgradCol col = wgrad_col(a, 0, n0 + b_ccol * 8);  // (A's column: unused, dy is the TMA's)
  // The pixel tables after the ring, then A's mbarriers; the pipeline copies S - 2 tiles ahead.
  const uint32_t full0 = base + TL::kRing + wgmma_wgrad_tables<TL>();
  if (tid == 0) tma_stages_init<S>(full0, &tmy);
  PixTables<BK, S, S - 2, T> px(a, reinterpret_cast<PixRow*>(smem + TL::kRing), kt0, nk, tid);
  px.prologue(a, tid);
  // All of the above (the mbarriers, the tensor map's prefetch, the first tiles' pixel tables)
  // reads only the parameters: it may overlap the kernel before this one.
  pdl_begin();

  auto load_tile = [&](int st, int it) {
    if (tid == 0) {
      const uint32_t bar = full0 + 8 * st, dst = sa + st * TL::kABytes;
      mbar_arrive_expect_tx(bar, TL::kABytes);
#pragma unroll
      for (int j = 0; j < TL::BM / 64; ++j)
        tma_load_3d(dst + j * kBox, &tmy, m0 + 64 * j, (kt0 + it) * BK, 0, bar);
    }
    wgrad_copy_b<B_ITERS>(a, col, px.slot(st), b_crow, kBStep, sb + st * TL::kBBytes + b_off,
                          kBStep * 128);
    px.after_copy(a, it, st, tid);
  };

  float acc[1][TL::NI][4];
  zero_acc<TL>(acc);
  float(&d)[TL::BN / 2] = reinterpret_cast<float(&)[TL::BN / 2]>(acc);

  // Stage 0's descriptors, MN-major: this warp group's box of A (its 64 output channels) and
  // B's BN / 64 boxes, kBox apart (LBO), 8 k rows kAtomBytes apart (SBO).
  const uint64_t da0 = make_desc(sa + static_cast<uint32_t>(wg) * kBox, kBox, kAtomBytes);
  const uint64_t db0 = make_desc(sb, kBox, kAtomBytes);
  wgmma_k_loop<T, TL, true>(nk, load_tile, d, da0, db0, full0);

  // Warp w of the block is wgrad_finish's warp tile (w, 0): rows 16 w.., all BN columns.
  wgrad_finish<T, TL>(a, acc, m0, n0, warp, 0, lane);
#endif
}

// The Hopper weight gradient's im2col copies, issued by one thread (thread 0, or the _ws tiles'
// producer) K tile after K tile. start() finds the block's column blocks: block jb is channel c0..
// of tap (kw, kh), or channel C (zeros) past J. issue() copies the K tile of pixels p0.. into a
// stage: dy's BM / 64 tiled boxes into dst_a and B's column blocks into dst_b (one im2col copy
// each, from the base of pixel p0 = (n, oh, ow): (ow·sw - pw, oh·sh - ph) in image n), all
// completing on the mbarrier bar with the stage's bytes.
template <class TL>
struct WgradI2cCopies {
  static constexpr int NB = TL::BN / TL::CW;         // B's column blocks (one im2col copy each)
  static constexpr uint32_t kBox = 64 * 128;         // dy's: 64 k rows of 64 elements
  static constexpr uint32_t kBoxB = 64 * TL::kRowC;  // B's: 64 k rows of CW elements
  static_assert(TL::BK == 64 && TL::BN % TL::CW == 0, "MN-major operands: boxes of 64 k x CW");
  int bc[NB] = {}, bkw[NB] = {}, bkh[NB] = {};

  template <class T>
  __device__ __forceinline__ void start(const WgradArgs<T>& a, int n0) {
#pragma unroll
    for (int jb = 0; jb < NB; ++jb) {
      const int j = n0 + TL::CW * jb;
      const int tap = j / a.C;
      bc[jb] = j < a.J ? j - tap * a.C : a.C;
      bkh[jb] = j < a.J ? tap / a.KW : 0;
      bkw[jb] = j < a.J ? tap - bkh[jb] * a.KW : 0;
    }
  }

  template <class T>
  __device__ __forceinline__ void issue(const WgradArgs<T>& a, const CUtensorMap* tmy,
                                        const CUtensorMap* tmx, uint32_t dst_a, uint32_t dst_b,
                                        int m0, int p0, uint32_t bar) const {
    mbar_arrive_expect_tx(bar, TL::kABytes + TL::kBBytes);
#pragma unroll
    for (int j = 0; j < TL::BM / 64; ++j)
      tma_load_3d(dst_a + j * kBox, tmy, m0 + 64 * j, p0, 0, bar);
    int n, r, oh, ow;
    a.fOHW.divmod(p0, n, r);
    a.fOW.divmod(r, oh, ow);
    const int bw = ow * a.sw - a.pw, bh = oh * a.sh - a.ph;
#pragma unroll
    for (int jb = 0; jb < NB; ++jb)
      tma_load_im2col_4d(dst_b + jb * kBoxB, tmx, bc[jb], bw, bh, n, static_cast<uint16_t>(bkw[jb]),
                         static_cast<uint16_t>(bkh[jb]), bar);
  }
};

// The im2col weight gradients' stage-0 descriptors, both MN-major: warp group wg's box of A (its
// 64 output channels: 64 k rows of 128 bytes, 8 rows kAtomBytes apart), and B's BN / CW column
// blocks, kBoxB apart (LBO), each 64 k rows of kRowC bytes (the 128- or 64-byte swizzle) in
// atoms of 8 rows (SBO).
template <class TL>
__device__ __forceinline__ void wgrad_i2c_descs(uint32_t sa, uint32_t sb, int wg, uint64_t& da0,
                                                uint64_t& db0) {
  using Cp = WgradI2cCopies<TL>;
  constexpr uint32_t kRow = TL::kRowC;
  da0 = make_desc(sa + static_cast<uint32_t>(wg) * Cp::kBox, Cp::kBox, kAtomBytes);
  db0 = make_desc<kRow>(sb, Cp::kBoxB, 8 * kRow);
}

// The Hopper weight gradient with B (x through the receptive fields) on the TMA's im2col mode as
// well: per stage, B's column block jb (CW columns j = tap·C + c of one tap, as C % CW == 0) is
// one im2col copy of the stage's 64 pixels (k rows) at that tap's offsets (kw, kh) and channels
// c.. c + CW - 1: the copy lands as 64 rows (pixels) of 2·CW bytes (channels) in the swizzle of
// that width (CW = 64: the MN-major box the gather wrote; the _c32 tiles' 32: the 64-byte
// swizzle, wgrad_i2c_descs). tmx is x's map with the convolution's bounding box
// and 64 pixels per column (im2col_conv), so a copy walks the pixels p0.. in the order n, oh, ow
// from the base of p0, crossing rows and images as the GEMM's K does, and zero-fills taps in the
// padding and pixels past P (the last slice's last tile). Column blocks past J copy channel C..
// (all zeros). No pixel tables and no cp.async: thread 0 issues BM / 64 + BN / CW copies a tile
// and computes the tile's base (p0 divided by OH·OW and OW, by multiply-high).
template <class T, class TL>
__global__ void __launch_bounds__(TL::THREADS)
    igemm_wgmma_wgrad_im2col_kernel(const __grid_constant__ CUtensorMap tmy,
                                    const __grid_constant__ CUtensorMap tmx, const WgradArgs<T> a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_begin();
  __trap();  // wgmma needs sm_90a; the host declines every other device
#else
  constexpr int S = TL::STAGES, BK = TL::BK;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = atom_base(smem_raw);
  const uint32_t sa = base, sb = base + S * TL::kABytes;
  const uint32_t full0 = base + TL::kRing;  // a stage's mbarrier (all its copies)

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);  // uniform: see igemm_wgmma_kernel
  const int m0 = static_cast<int>(blockIdx.x) * TL::BM;
  const int n0 = static_cast<int>(blockIdx.y) * TL::BN;
  const int kt0 = wgrad_kt0(a), nk = wgrad_tiles(a, kt0);

  // Thread 0 issues the copies.
  WgradI2cCopies<TL> cp;
  if (tid == 0) {
    tma_stages_init<S>(full0, &tmy);
    prefetch_tensormap(&tmx);
    cp.start(a, n0);
  }
  pdl_begin();

  auto load_tile = [&](int st, int it) {
    if (tid == 0)
      cp.issue(a, &tmy, &tmx, sa + st * TL::kABytes, sb + st * TL::kBBytes, m0, (kt0 + it) * BK,
               full0 + 8 * st);
  };

  float acc[1][TL::NI][4];
  zero_acc<TL>(acc);
  float(&d)[TL::BN / 2] = reinterpret_cast<float(&)[TL::BN / 2]>(acc);
  uint64_t da0, db0;
  wgrad_i2c_descs<TL>(sa, sb, wg, da0, db0);
  wgmma_k_loop<T, TL, true, decltype(load_tile)&, false>(nk, load_tile, d, da0, db0, full0);

  wgrad_finish<T, TL>(a, acc, m0, n0, warp, 0, lane);
#endif
}

// The same, warp-specialized (the _ws tiles): a producer warp after the warp groups (its lane 0)
// issues every K tile's copies into the ring, waiting only for the stage to be free, and the warp
// groups run ws_k_loop: no block-wide barrier a K tile, and the copies' issue (with the tile
// base's divisions: about 60 instructions a K tile) off the consumers' warps. The producer then
// exits, and split_sum finishes over the warp groups alone (FirstThreads).
template <class T, class TL>
__global__ void __launch_bounds__(TL::BLOCK_THREADS)
    igemm_wgmma_wgrad_ws_kernel(const __grid_constant__ CUtensorMap tmy,
                                const __grid_constant__ CUtensorMap tmx, const WgradArgs<T> a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_begin();
  __trap();  // wgmma needs sm_90a; the host declines every other device
#else
  static_assert(TL::kWarpSpec && !TL::kPersistent, "the weight gradient's _ws tiles");
  constexpr int S = TL::STAGES, BK = TL::BK;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = atom_base(smem_raw);
  const uint32_t sa = base, sb = base + S * TL::kABytes;
  const uint32_t full0 = base + TL::kRing, empty0 = full0 + 8 * S;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int m0 = static_cast<int>(blockIdx.x) * TL::BM;
  const int n0 = static_cast<int>(blockIdx.y) * TL::BN;
  const int kt0 = wgrad_kt0(a), nk = wgrad_tiles(a, kt0);

  ws_begin<TL>(full0, empty0, &tmy, &tmx);

  if (warp == TL::THREADS / 32) {  // the producer
    if (lane == 0) {
      WgradI2cCopies<TL> cp;
      cp.start(a, n0);
      int s = 0;
      uint32_t phase = 0;
      for (int it = 0; it < nk; ++it)
        ws_fill<TL>(s, phase, empty0, [&](int st) {
          cp.issue(a, &tmy, &tmx, sa + st * TL::kABytes, sb + st * TL::kBBytes, m0, (kt0 + it) * BK,
                   full0 + 8 * st);
        });
    }
    return;  // the consumers wait for every copy issued: none is left in flight
  }

  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);  // uniform: see igemm_wgmma_kernel
  float acc[1][TL::NI][4];
  zero_acc<TL>(acc);
  float(&d)[TL::BN / 2] = reinterpret_cast<float(&)[TL::BN / 2]>(acc);
  uint64_t da0, db0;
  wgrad_i2c_descs<TL>(sa, sb, wg, da0, db0);
  int s = 0;
  uint32_t phase = 0;
  ws_k_loop<T, TL, true>(nk, d, da0, db0, full0, empty0, lane, s, phase);

  wgrad_finish<T, TL, FirstThreads<TL::THREADS>>(a, acc, m0, n0, warp, 0, lane);
#endif
}

// TF32 weight gradient: the same GEMM, slices and last-slice sum, gathering 4 bytes at a time
// (any layout of dy and x, read in place). Thread tid fills k row (pixel) tid % BK of each stage
// (consecutive threads take consecutive pixels, consecutive in memory in NCHW) at columns
// tid / BK + i·W_STEP of A (output channels) and of B (taps and channels, through the k table).
// The stages are k-major, as in 16 bits; ldmatrix.trans has no 32-bit form, so the fragments are
// read element by element: a0 (m g, k t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4) and b0 (k t,
// n g), b1 (t+4, g), from rows of BM + 8 and BN + 8 f32, which puts a warp's 32 reads (8·t + g)
// on 32 banks.
// kVec: dy and x channels-last (dense NHWC strides), O and C multiples of 4, both 16-byte
// aligned: a stage row (one pixel) holds BM consecutive channels of dy and BN consecutive
// columns j = tap·C + c of x, 4 of which (c % 4 == 0, one tap) are 16 contiguous bytes, so each
// copy takes 16 bytes (a quarter of the copies and of their table reads) where the scalar form
// takes one f32. There thread tid fills row tid / W_STEP at chunks tid % W_STEP + i·W_STEP:
// a request of 8 lanes is 8 consecutive chunks of one row, on distinct banks, and 128 contiguous
// bytes of one pixel. (Rows first, it was 8 rows' same chunk, (BM + 8) / 4 chunks apart, an even
// pitch: 2 wavefronts a request. The scalar form keeps rows first, whose reads are one NCHW run.)
template <class TL, bool kVec = false>
__global__ void __launch_bounds__(TL::THREADS) igemm_wgrad_tf32_kernel(const WgradArgs<float> a) {
  pdl_begin();
  using G = Tf32Tile<TL>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const As = reinterpret_cast<float*>(smem_raw);  // [STAGES][BK][LDA_K]
  float* const Bs = As + TL::STAGES * G::BK * G::LDA_K;  // [STAGES][BK][LDB_K]

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp % TL::WARPS_M, wn = warp / TL::WARPS_M;
  const int m0 = static_cast<int>(blockIdx.x) * TL::BM;
  const int n0 = static_cast<int>(blockIdx.y) * TL::BN;
  const int KT = (a.P + G::BK - 1) / G::BK;
  const int kt0 = static_cast<int>(blockIdx.z) * a.kt_per;
  const int kt1 = min(KT, kt0 + a.kt_per);  // the host makes every slice non-empty

  const int kr = kVec ? tid / G::W_STEP : tid % G::BK, cc = kVec ? tid % G::W_STEP : tid / G::BK;
  // The block's columns in shared memory after the stages, once (as the forward's k tables):
  // B's (x: the tap's bit, 0 past J, and its offset in bytes) and A's (dy: output channel o's
  // offset in bytes; channel 0's past O: those rows of the tile are never stored, and nothing
  // else reads them). Each pixel's receptive field then gives its in-image taps once per tile
  // (field_taps), and each copy of x tests one bit; a copy of dy only whether its pixel is in.
  KTapA* const btab = reinterpret_cast<KTapA*>(smem_raw + G::W_SMEM);
  uint32_t* const atab = reinterpret_cast<uint32_t*>(btab + TL::BN);
  for_block_strided<TL::THREADS>(TL::BN, tid, [&](int col) {
    KTapA e{0u, 0u};
    if (n0 + col < a.J) {
      const KTap t = a.tab[n0 + col];
      e = {1u << (t.kh * a.KW + t.kw), static_cast<uint32_t>(t.a) * 4u};
    }
    btab[col] = e;
  });
  for_block_strided<TL::THREADS>(TL::BM, tid, [&](int col) {
    atab[col] = m0 + col < a.O ? static_cast<uint32_t>((m0 + col) * a.ds_c) * 4u : 0u;
  });
  __syncthreads();
  // Addresses as integers (see igemm_tf32_kernel), zero-filled copies' too (mma_ptx.cuh).
  const int64_t dy_addr = reinterpret_cast<int64_t>(a.dy), x_addr = reinterpret_cast<int64_t>(a.x);
  // This thread's pixel, stepped one K tile on per load (as in the 16-bit kernel).
  const PixelPos step = pixel_pos(G::BK, a.OHW, a.OW);
  PixelPos pix = pixel_pos(kt0 * G::BK + kr, a.OHW, a.OW);
  auto load_tile = [&](int st, int kt) {
    const int p = kt * G::BK + kr;
    const bool pin = p < a.P;
    int64_t dy_org = dy_addr, x_org = x_addr;
    uint32_t taps = 0;  // none past P
    if (pin) {
      dy_org += (pix.n * a.ds_n + pix.oh * a.ds_h + pix.ow * a.ds_w) *
                static_cast<int64_t>(sizeof(float));
      const int ih0 = pix.oh * a.sh - a.ph, iw0 = pix.ow * a.sw - a.pw;
      x_org += (pix.n * a.xs_n + ih0 * a.xs_h + iw0 * a.xs_w) * static_cast<int64_t>(sizeof(float));
      taps = field_taps(a, ih0, iw0);
    }
    pix = advance(pix, step, a.OH, a.OW);
    float* const as = As + st * G::BK * G::LDA_K;
    float* const bs = Bs + st * G::BK * G::LDB_K;
    if constexpr (kVec) {
      // Chunk q (4 columns from 4·q) of the row: its first column's table entry.
      const auto col = [&](int i) { return 4 * (cc + i * G::W_STEP); };
      copies_in_fours<G::WA_ITERS_V>(atab, col, [&](int i, uint32_t off) {
        const bool ok = pin;
        cp_async16(smem_addr(as + kr * G::LDA_K + col(i)),
                   reinterpret_cast<const void*>(dy_org + off), ok);
      });
      copies_in_fours<G::WB_ITERS_V>(btab, col, [&](int i, const KTapA& e) {
        const bool ok = (taps & e.bit) != 0;
        cp_async16_ca(smem_addr(bs + kr * G::LDB_K + col(i)),
                      reinterpret_cast<const void*>(x_org + e.off), ok);
      });
    } else {
      // (all the entries first would take the 64x128 tile past 128 registers)
      const auto col = [&](int i) { return cc + i * G::W_STEP; };
      copies_in_fours<G::WA_ITERS>(atab, col, [&](int i, uint32_t off) {
        const bool ok = pin;
        cp_async4(smem_addr(as + kr * G::LDA_K + col(i)),
                  reinterpret_cast<const void*>(dy_org + off), ok);
      });
      copies_in_fours<G::WB_ITERS>(btab, col, [&](int i, const KTapA& e) {
        const bool ok = (taps & e.bit) != 0;
        cp_async4(smem_addr(bs + kr * G::LDB_K + col(i)),
                  reinterpret_cast<const void*>(x_org + e.off), ok);
      });
    }
  };

  float acc[TL::MI][TL::NI][4];
  zero_acc<TL>(acc);

  const int g = lane >> 2, t = lane & 3;
  pipelined_k_loop<TL::STAGES>(
      kt1 - kt0, [&](int st, int it) { load_tile(st, kt0 + it); },
      [&](int st) {
        const float* const as = As + st * G::BK * G::LDA_K;
        const float* const bs = Bs + st * G::BK * G::LDB_K;
#pragma unroll
        for (int kk = 0; kk < G::BK; kk += 8) {
          const float* const a0 = as + (kk + t) * G::LDA_K + wm * TL::WM + g;
          const float* const a4 = a0 + 4 * G::LDA_K;
          const float* const b0 = bs + (kk + t) * G::LDB_K + wn * TL::WN + g;
          const float* const b4 = b0 + 4 * G::LDB_K;
          uint32_t af[TL::MI][4];
          uint32_t bf[TL::NI][2];
#pragma unroll
          for (int i = 0; i < TL::MI; ++i) {
            af[i][0] = to_tf32(a0[i * 16]), af[i][1] = to_tf32(a0[i * 16 + 8]);
            af[i][2] = to_tf32(a4[i * 16]), af[i][3] = to_tf32(a4[i * 16 + 8]);
          }
#pragma unroll
          for (int j = 0; j < TL::NI; ++j)
            bf[j][0] = to_tf32(b0[j * 8]), bf[j][1] = to_tf32(b4[j * 8]);
#pragma unroll
          for (int i = 0; i < TL::MI; ++i)
#pragma unroll
            for (int j = 0; j < TL::NI; ++j) mma_1688_tf32(acc[i][j], af[i], bf[j]);
        }
      });
  wgrad_finish<float, TL>(a, acc, m0, n0, wm, wn, lane);
}

// ---- staging kernels (layout conversion into the workspace) ----

// x (N, C, HW) -> y (N, HW, C) through a 32 x 32 shared tile, so both the reads (along HW) and
// the writes (along C) are coalesced. Block 32 x 8; grid (HW tiles, C tiles, min(N, 65535)).
template <class T>
__global__ void nchw_to_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t N,
                                    int64_t C, int64_t HW) {
  pdl_begin();
  __shared__ T tile[32][33];
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * 32;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * 32;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (int64_t n = blockIdx.z; n < N; n += gridDim.z) {
    for (int j = ty; j < 32; j += 8) {
      const int64_t c = c0 + j, p = p0 + tx;
      if (c < C && p < HW) tile[j][tx] = x[(n * C + c) * HW + p];
    }
    __syncthreads();
    for (int j = ty; j < 32; j += 8) {
      const int64_t p = p0 + j, c = c0 + tx;
      if (p < HW && c < C) y[(n * HW + p) * C + c] = tile[tx][j];
    }
    __syncthreads();  // the tile is rewritten for the next n
  }
}

// The GEMM's B: out (Co, KH, KW, Ca) contiguous from a filter w (O, C, KH, KW) with element
// strides s0..s3. Forward (flip false): out[o, kh, kw, c] = w[o, c, kh, kw]. Backward data
// (flip true, Co = C, Ca = O): out[c, kh, kw, o] = w[o, c, KH-1-kh, KW-1-kw].
template <class T>
__global__ void stage_filter_kernel(const T* __restrict__ w, T* __restrict__ out, int64_t Co,
                                    int64_t KH, int64_t KW, int64_t Ca, int64_t s0, int64_t s1,
                                    int64_t s2, int64_t s3, bool flip) {
  pdl_begin();
  const int64_t total = Co * KH * KW * Ca;
  PLX_GRID_STRIDE(i, total) {
    int64_t r = i;
    const int64_t ca = r % Ca;
    r /= Ca;
    const int64_t kw = r % KW;
    r /= KW;
    const int64_t kh = r % KH;
    const int64_t co = r / KH;
    const int64_t src = flip ? ca * s0 + co * s1 + (KH - 1 - kh) * s2 + (KW - 1 - kw) * s3
                             : co * s0 + ca * s1 + kh * s2 + kw * s3;
    out[i] = w[src];
  }
}

// ---- host side ----

enum class Dir { Fwd, BwdData };

constexpr uint64_t kWsAlign = 256;
inline uint64_t align_up(uint64_t v) {
  return (v + kWsAlign - 1) / kWsAlign * kWsAlign;
}

inline bool fits_i32(int64_t v) {
  return v >= 0 && v <= INT_MAX;
}

template <class T>
void launch_nchw_to_nhwc(const T* src, T* dst, const int64_t (&d)[3], cudaStream_t s) {
  const int64_t N = d[0], C = d[1], HW = d[2];
  const dim3 grid(static_cast<unsigned>((HW + 31) / 32), static_cast<unsigned>((C + 31) / 32),
                  static_cast<unsigned>(std::min<int64_t>(N, 65535)));
  launch_kernel(nchw_to_nhwc_kernel<T>, grid, dim3(32, 8), 0, s, src, dst, N, C, HW);
}

// The TF32 kernels' k table in device memory, made once when the kernel object is created.
using KTable = DeviceArray<KTap>;

// The TF32 kernels need the cuda tf32 option (f32 on Tensor Cores is TF32), as cuBLASLt's do.
inline void decline_unless_tf32(const CudaBackend& backend, const char* op) {
  PLX_DECLINE_UNLESS(backend.options().tf32,
                     "%s: f32 on Tensor Cores is TF32, and the cuda tf32 option is off", op);
}

template <class T, class TL, Dir D>
class IgemmConvKernel final : public Kernel {
  static constexpr bool kTf32 = std::is_same_v<T, float>;

 public:
  // `relu` (forward only): the kernel of a fused conv2d -> relu, writing relu(conv(x, w) + b).
  // `pool` (forward only): the kernel of a fused conv2d -> [relu ->] max_pool2d group with 2x2
  // windows of stride 2 (node: its conv), writing the pooled y and the indices; the pre-pool
  // tensor is never written.
  IgemmConvKernel(const NodeInfo& node, CudaBackend& backend, bool relu = false,
                  const Pool* pool = nullptr)
      : device_(node.device()) {
    const char* op = D == Dir::Fwd ? "conv2d" : "conv2d_backward_data";
    PLX_REQUIRE(D == Dir::Fwd || !relu, "%s: only the forward convolution takes a ReLU", op);
    PLX_REQUIRE(D == Dir::Fwd || !pool, "%s: only the forward convolution takes a pool", op);
    // Tensors by their forward roles: x (N, C, H, W), w (O, C, KH, KW), y (N, O, OH, OW).
    const plx_tensor* x;
    const plx_tensor* y;
    const plx_tensor* w = &node.input(1);
    if constexpr (D == Dir::Fwd) {
      x = &node.input(0), y = &node.output(0);
      has_bias_ = node.has_input(2);
    } else {
      y = &node.input(0), x = &node.output(0);
    }
    PLX_REQUIRE(x->ndim == 4 && w->ndim == 4 && y->ndim == 4, "%s: x, w and y must be 4-D", op);
    int64_t xs[4] = {x->shape[0], x->shape[1], x->shape[2], x->shape[3]};
    const int64_t ws[4] = {w->shape[0], w->shape[1], w->shape[2], w->shape[3]};
    if constexpr (D == Dir::BwdData) {
      const std::vector<int64_t> v = node.attr_ints("input_shape");
      PLX_REQUIRE(v.size() == 4, "%s: input_shape must have 4 values", op);
      for (int i = 0; i < 4; ++i) xs[i] = v[static_cast<size_t>(i)];
    }
    const sdk::Conv2dParams g(xs, ws, node);
    const int64_t want_y[4] = {g.N, g.O, g.OH, g.OW};
    for (int i = 0; i < 4; ++i)
      PLX_REQUIRE(y->shape[i] == want_y[i] && x->shape[i] == xs[i],
                  "%s: tensor shapes do not match the convolution", op);

    const plx_tensor* all[3] = {x, w, y};
    for (const plx_tensor* t : all)
      PLX_DECLINE_UNLESS(t->dtype == dtype_v<T>, "%s: igemm kernels take one dtype, %s", op,
                         plexus::dtype_name(dtype_v<T>));
    if constexpr (kTf32) decline_unless_tf32(backend, op);
    PLX_DECLINE_UNLESS(g.groups == 1, "%s: igemm handles groups = 1 only, not %lld", op,
                       static_cast<long long>(g.groups));
    PLX_DECLINE_UNLESS(g.dh == 1 && g.dw == 1,
                       "%s: igemm handles dilation 1 only, not [%lld, %lld]", op,
                       static_cast<long long>(g.dh), static_cast<long long>(g.dw));
    bool nhwc[3];
    for (int i = 0; i < 3; ++i) {
      const bool nchw_ok = sdk::is_contiguous(*all[i]);
      nhwc[i] = sdk::is_channels_last(*all[i]);
      PLX_DECLINE_UNLESS(nchw_ok || nhwc[i],
                         "%s: a tensor's strides are neither NCHW contiguous nor channels-last",
                         op);
    }
    if (has_bias_) {
      const plx_tensor& b = node.input(2);
      PLX_DECLINE_UNLESS(
          b.ndim == 1 && b.dtype == dtype_v<T> && (b.shape[0] <= 1 || b.strides[0] == 1),
          "%s: the bias must be contiguous and of the input's dtype", op);
    }

    // The GEMM problem: an activation (N, Ca, Hi, Wi) convolved into an output `out`
    // (N, Co, Ho, Wo).
    const plx_tensor* out;
    int64_t Ca, Co, Hi, Wi, Ho, Wo, sh, sw, ph, pw;
    if constexpr (D == Dir::Fwd) {
      out = y;
      Ca = g.C, Co = g.O, Hi = g.H, Wi = g.W, Ho = g.OH, Wo = g.OW;
      sh = g.sh, sw = g.sw, ph = g.ph, pw = g.pw;
    } else {
      PLX_DECLINE_UNLESS(g.sh == 1 && g.sw == 1,
                         "%s: igemm handles stride 1 only (dx as a convolution of dy), not "
                         "[%lld, %lld]",
                         op, static_cast<long long>(g.sh), static_cast<long long>(g.sw));
      PLX_DECLINE_UNLESS(g.ph <= g.KH - 1 && g.pw <= g.KW - 1,
                         "%s: igemm needs padding below the kernel size (it pads dy by "
                         "KH-1-ph, KW-1-pw)",
                         op);
      out = x;
      Ca = g.O, Co = g.C, Hi = g.OH, Wi = g.OW, Ho = g.H, Wo = g.W;
      sh = 1, sw = 1, ph = g.KH - 1 - g.ph, pw = g.KW - 1 - g.pw;
    }
    const bool act_nhwc = D == Dir::Fwd ? nhwc[0] : nhwc[2];
    const bool out_nhwc = D == Dir::Fwd ? nhwc[2] : nhwc[0];
    // 16 bits: 16-byte copies along the reduced channels. TF32 gathers 4 bytes at a time, but
    // leaves a layer with few taps per pixel (a first layer) to the direct kernel as 16 bits do.
    PLX_DECLINE_UNLESS(kTf32 || (Ca > 0 && Ca % 8 == 0),
                       "%s: igemm needs the reduced channel count to be a positive multiple of 8 "
                       "(16-byte cp.async rows), got %lld",
                       op, static_cast<long long>(Ca));
    // The gather keeps a bit per tap of each row's receptive field (ARows, field_taps).
    PLX_DECLINE_UNLESS(g.KH * g.KW <= 32, "%s: igemm handles at most 32 taps (KH·KW), not %lld",
                       op, static_cast<long long>(g.KH * g.KW));
    // TF32's k table keeps byte offsets into the activation's image and the filter in 32 bits.
    const int64_t bytes = static_cast<int64_t>(sizeof(T));
    PLX_DECLINE_UNLESS(!kTf32 || (fits_i32(bytes * Ca * Hi * Wi) &&
                                  fits_i32(bytes * g.O * g.C * g.KH * g.KW)),
                       "%s: an image or the filter beyond TF32 igemm's 32-bit byte offsets", op);
    PLX_DECLINE_UNLESS(!kTf32 || Ca >= 8,
                       "%s: TF32 igemm leaves fewer than 8 reduced channels (%lld) to the direct "
                       "kernel",
                       op, static_cast<long long>(Ca));

    out_elems_ = numel(*out);
    if (out_elems_ == 0) return;  // nothing to write (N, Co, Ho or Wo is 0)

    // 32-bit index math inside the kernel: every size, and each padded extent, fits an int.
    const int64_t K = g.KH * g.KW * Ca;
    PLX_DECLINE_UNLESS(fits_i32(Hi + 2 * ph) && fits_i32(Wi + 2 * pw) && fits_i32(Co) &&
                           fits_i32(K) && fits_i32(Ho * sh + ph) && fits_i32(Wo * sw + pw) &&
                           fits_i32(Ho * Wo) && fits_i32(Co * K) && fits_i32(Ca * Hi * Wi),
                       "%s: sizes beyond igemm's 32-bit index math", op);
    const int64_t M = g.N * Ho * Wo;
    PLX_DECLINE_UNLESS((M + TL::BM - 1) / TL::BM <= INT_MAX && (Co + TL::BN - 1) / TL::BN <= 65535,
                       "%s: too many tiles for the grid", op);
    PLX_DECLINE_UNLESS(Ca / 32 < 65535, "%s: too many channels for the staging transpose", op);

    use_device(device_);
    const DeviceContext& ctx = backend.context(device_);
    PLX_DECLINE_UNLESS(ctx.prop.major >= 8, "%s: mma.sync and cp.async need sm_80 or later", op);
    if constexpr (TL::kIm2col) {
      decline_unless_sm90a(ctx, op);
      // The narrow tiles (32 channels a K tile) take what 64-channel K tiles would fill with
      // zeros for more than half of their last channel block (Ca % 64 in 1..32: C = 32, 96..);
      // the others waste nothing more on 64.
      if constexpr (TL::CW == 32)
        PLX_DECLINE_UNLESS(Ca % 64 != 0 && Ca % 64 <= 32,
                           "%s: the 32-channel tiles leave %lld channels (not 1 to 32 past a "
                           "multiple of 64) to the 64-channel ones",
                           op, static_cast<long long>(Ca));
      // The filter as (Ca, taps, Co) in boxes of CW channels of a tap; the activation (dy for
      // backward data) as the im2col map of the convolution's receptive fields.
      PLX_DECLINE_UNLESS(tma_accepts<T>(tma_filter_by_tap(Ca, g.KH * g.KW, Co, TL::BN, TL::CW)),
                         "%s: the TMA (cuTensorMapEncodeTiled) refuses the filter as (%lld, %lld, "
                         "%lld)",
                         op, static_cast<long long>(Ca), static_cast<long long>(g.KH * g.KW),
                         static_cast<long long>(Co));
      // The activation's map is checked once the pool is known (below).
    } else if constexpr (TL::kWgmma) {
      decline_unless_sm90a(ctx, op);
      // The filter through the TMA: (Co, K) row-major, boxes of 64 k x BN rows.
      PLX_DECLINE_UNLESS(tma_accepts<T>(tma_matrix(K, Co, TL::BN)),
                         "%s: the TMA (cuTensorMapEncodeTiled) refuses the (%lld, %lld) filter", op,
                         static_cast<long long>(Co), static_cast<long long>(K));
    }
    // Backward data reads a channels-last filter in place (BT); Co is then the filter's inner
    // extent, whose 16-byte chunks the copies take. The wgmma tiles stage the flipped filter.
    bt_ = !kTf32 && !TL::kWgmma && D == Dir::BwdData && nhwc[1] && Co % 8 == 0;
    // (if constexpr: Tf32Tile is only instantiated for f32; the 256x32 tile has no TF32 form.)
    // 16 bits: the stages, then the K tiles' chunk table.
    if constexpr (kTf32)
      smem_ = Tf32Tile<TL>::smem_with_table(static_cast<int>(K));
    else if constexpr (TL::kIm2col)
      smem_ = TL::SMEM;  // no k table: the TMA walks the taps
    else if constexpr (TL::kWgmma)
      smem_ = TL::SMEM + k_table_bytes<TL::BK>(static_cast<int>(K), false);
    else
      smem_ = (bt_ ? TL::SMEM_T : TL::SMEM) + k_table_bytes<TL::BK>(static_cast<int>(K), bt_);
    PLX_DECLINE_UNLESS(static_cast<size_t>(smem_) <= ctx.prop.sharedMemPerBlockOptin,
                       "%s: %d bytes of shared memory per block are more than the device allows",
                       op, smem_);
    // TF32 gathers a channels-last activation 16 bytes at a time where 4 channels are (kVec).
    vec_ = kTf32 && act_nhwc && Ca % 4 == 0;
    // Above the default 48 KiB a kernel must opt in, per device: done here, once per node.
    if constexpr (kTf32) {
      opt_in(igemm_tf32_kernel<TL>);
      if (vec_) opt_in(igemm_tf32_kernel<TL, void, true>);
    } else if constexpr (TL::kIm2col)
      opt_in(im2col_kernel());
    else if constexpr (TL::kWgmma)
      opt_in(igemm_wgmma_kernel<T, TL>);
    else if (bt_)
      opt_in(igemm_conv_kernel<T, TL, true>);
    else
      opt_in(igemm_conv_kernel<T, TL>);

    a_ = IgemmArgs<T>{};
    a_.H = static_cast<int>(Hi), a_.W = static_cast<int>(Wi), a_.C = static_cast<int>(Ca);
    a_.O = static_cast<int>(Co), a_.KH = static_cast<int>(g.KH), a_.KW = static_cast<int>(g.KW);
    a_.OW = static_cast<int>(Wo);
    a_.sh = static_cast<int>(sh), a_.sw = static_cast<int>(sw);
    a_.ph = static_cast<int>(ph), a_.pw = static_cast<int>(pw);
    a_.K = static_cast<int>(K);
    a_.fC = FastDiv(Ca), a_.fKW = FastDiv(g.KW);
    a_.rep = 0;
    if (g.KH * g.KW <= 32)
      for (int64_t kh = 0; kh < g.KH; ++kh) a_.rep |= 1u << (kh * g.KW);
    a_.M = M;
    a_.OHW = Ho * Wo;
    a_.relu = relu;
    const int64_t od[4] = {g.N, Co, Ho, Wo};
    int64_t os[4];
    canonical_strides(od, out_nhwc, os);
    a_.y_n = os[0], a_.y_c = os[1], a_.y_p = os[3];  // p = oh·Wo + ow: offset oh·s2 + ow·s3 = p·s3
    if (pool) set_pool(*pool, g.N, Ho, Wo, relu);
    if constexpr (TL::kIm2col) {
      if (out_elems_ == 0) return;  // no window (the pool's output is empty): nothing to map
      // A's rows: every output pixel, or (a pool) the windows' pixels corner by corner, whose
      // traversal strides are twice the convolution's.
      i2c_ = pool ? im2col_pool_corners(g.N, Hi, Wi, Ca, sh, sw, ph, pw, a_.PHW / a_.PW, a_.PW,
                                        static_cast<uint32_t>(TL::BM / 4))
                  : im2col_conv(g.N, Hi, Wi, Ca, g.KH, g.KW, sh, sw, ph, pw,
                                static_cast<uint32_t>(TL::BM));
      i2c_.channels = TL::CW;
      PLX_DECLINE_UNLESS(tma_im2col_accepts<T>(i2c_),
                         "%s: the TMA (cuTensorMapEncodeIm2col) refuses the activation: traversal "
                         "strides up to 8 (the convolution's, twice them with a pool), and the "
                         "bounding box's corners within [-128, 127] (strides [%lld, %lld], "
                         "padding [%lld, %lld], filter %lld x %lld%s)",
                         op, static_cast<long long>(sh), static_cast<long long>(sw),
                         static_cast<long long>(ph), static_cast<long long>(pw),
                         static_cast<long long>(g.KH), static_cast<long long>(g.KW),
                         pool ? ", pooled" : "");
      if constexpr (TL::kPersistent) {
        // The grid: as many blocks as fit on the device at once (by shared memory, each
        // block's own and the 1 KiB the SM reserves per block, and by threads), at most one
        // per output tile.
        const int64_t tiles = (a_.M + TL::BM - 1) / TL::BM * ((Co + TL::BN - 1) / TL::BN);
        const int64_t by_smem = static_cast<int64_t>(ctx.prop.sharedMemPerMultiprocessor) /
                                (smem_ + static_cast<int64_t>(ctx.prop.reservedSharedMemPerBlock));
        const int64_t by_threads = ctx.prop.maxThreadsPerMultiProcessor / TL::BLOCK_THREADS;
        const int64_t per_sm = std::max<int64_t>(1, std::min(by_smem, by_threads));
        blocks_ =
            static_cast<unsigned>(std::min<int64_t>(tiles, per_sm * ctx.prop.multiProcessorCount));
      }
    }

    // Staging in the workspace (16 bits): the activation when it is NCHW, the filter when it is
    // NCHW (or, for backward data, channels-last with a channel count the BT copies cannot
    // take). TF32 reads both in place through its k table.
    stage_act_ = !kTf32 && !act_nhwc;
    act_dims_[0] = g.N, act_dims_[1] = Ca, act_dims_[2] = Hi * Wi;
    act_bytes_ = stage_act_ ? align_up(static_cast<uint64_t>(g.N * Hi * Wi * Ca) * sizeof(T)) : 0;
    stage_w_ = !kTf32 && (!nhwc[1] || (D == Dir::BwdData && !bt_));
    const int64_t wd[4] = {g.O, g.C, g.KH, g.KW};
    canonical_strides(wd, nhwc[1], w_strides_);
    w_bytes_ = stage_w_ ? align_up(static_cast<uint64_t>(Co * K) * sizeof(T)) : 0;
    if constexpr (kTf32) {
      // k = tap·Ca + c over the activation (N, Ca, Hi, Wi) in its layout; the filter element it
      // multiplies: w[n, c, kh, kw] for the forward (the GEMM's n = o), w[c, n, KH-1-kh,
      // KW-1-kw] for backward data (n = the forward's input channel, c = its output channel).
      const int64_t ad[4] = {g.N, Ca, Hi, Wi};
      int64_t as[4];
      canonical_strides(ad, act_nhwc, as);
      a_.xs_n = as[0], a_.xs_h = as[2], a_.xs_w = as[3];
      const int64_t* ws = w_strides_;
      a_.ws_n = D == Dir::Fwd ? ws[0] : ws[1];
      std::vector<KTap> tab(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) {
        const int64_t tap = k / Ca, c = k % Ca, kh = tap / g.KW, kw = tap % g.KW;
        KTap& e = tab[static_cast<size_t>(k)];
        e.a = static_cast<int32_t>(c * as[1] + kh * as[2] + kw * as[3]);
        e.b = static_cast<int32_t>(D == Dir::Fwd ? c * ws[1] + kh * ws[2] + kw * ws[3]
                                                 : c * ws[0] + (g.KH - 1 - kh) * ws[2] +
                                                       (g.KW - 1 - kw) * ws[3]);
        e.kh = static_cast<int32_t>(kh), e.kw = static_cast<int32_t>(kw);
      }
      tab_ = KTable(tab);
    }
  }

  uint64_t workspace_bytes() const override { return act_bytes_ + w_bytes_; }

  void compute(const KernelCall& c) override {
    if (out_elems_ == 0) return;
    use_device(device_);
    const cudaStream_t s = native(c.stream);
    IgemmArgs<T> a = a_;
    a.x = static_cast<const T*>(c.in(in_x_).data);
    a.w = static_cast<const T*>(c.in(in_w_).data);
    a.bias = has_bias_ ? static_cast<const T*>(c.in(in_b_).data) : nullptr;
    a.y = static_cast<T*>(c.out(out_y_).data);
    if (pool_ != PoolIx::None) a.idx = c.out(out_i_).data;
    unsigned char* ws = static_cast<unsigned char*>(c.workspace);
    if (stage_act_) {
      T* dst = reinterpret_cast<T*>(ws);
      launch_nchw_to_nhwc(a.x, dst, act_dims_, s);
      a.x = dst;
    }
    if (stage_w_) {
      T* dst = reinterpret_cast<T*>(ws + act_bytes_);
      const int64_t total = static_cast<int64_t>(a.O) * a.K;
      launch_kernel(stage_filter_kernel<T>, grid_for(total), kBlock, 0, s, a.w, dst, a.O, a.KH,
                    a.KW, a.C, w_strides_[0], w_strides_[1], w_strides_[2], w_strides_[3],
                    D == Dir::BwdData);
      a.w = dst;
    }
    // cp.async moves 16 aligned bytes; the allocator's buffers and the workspace are aligned far
    // more, so only an offset view could break this.
    const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    if ((addr(a.x) | addr(a.w)) & (kTf32 ? 3u : 15u))
      throw sdk::Error(PLX_ERR_INVALID_ARGUMENT,
                       sdk::format("igemm convolution: the activation and filter must be %d-byte "
                                   "aligned",
                                   kTf32 ? 4 : 16));
    a.pair = a.y_c == 1 && a.O % 2 == 0 && addr(a.y) % (2 * sizeof(T)) == 0;
    constexpr int64_t kVe = 16 / static_cast<int64_t>(sizeof(T));
    a.vec = a.y_c == 1 && a.y_n % kVe == 0 && a.y_p % kVe == 0 && addr(a.y) % 16 == 0;
    const dim3 grid(static_cast<unsigned>((a.M + TL::BM - 1) / TL::BM),
                    static_cast<unsigned>((a.O + TL::BN - 1) / TL::BN));
    if constexpr (kTf32) {
      a.tab = tab_.p;
      // An activation view off the 16-byte grain gathers 4 bytes at a time.
      const bool vec = vec_ && addr(a.x) % 16 == 0;
      const auto go = [&]<class Ix>(Ix*) {
        if (vec)
          launch_kernel(igemm_tf32_kernel<TL, Ix, true>, grid, TL::THREADS, smem_, s, a);
        else
          launch_kernel(igemm_tf32_kernel<TL, Ix>, grid, TL::THREADS, smem_, s, a);
      };
      if (pool_ == PoolIx::U8)
        go(static_cast<uint8_t*>(nullptr));
      else if (pool_ == PoolIx::I32)
        go(static_cast<int32_t*>(nullptr));
      else
        go(static_cast<void*>(nullptr));
    } else if constexpr (TL::kIm2col) {
      CUtensorMap tmx, tmw;
      if (!tma_encode_im2col<T>(tmx, i2c_, a.x) ||
          !tma_encode<T>(tmw, tma_filter_by_tap(a.C, a.KH * a.KW, a.O, TL::BN, TL::CW), a.w))
        throw sdk::Error(PLX_ERR_INTERNAL,
                         "igemm convolution: the TMA refused the tensor maps it accepted at "
                         "creation");
      // The persistent tiles: blocks_ blocks walk the output tiles.
      const dim3 g = TL::kPersistent ? dim3(blocks_) : grid;
      if (pool_ == PoolIx::U8)
        launch_kernel(im2col_kernel<uint8_t>(), g, TL::BLOCK_THREADS, smem_, s, tmx, tmw, a);
      else if (pool_ == PoolIx::I32)
        launch_kernel(im2col_kernel<int32_t>(), g, TL::BLOCK_THREADS, smem_, s, tmx, tmw, a);
      else
        launch_kernel(im2col_kernel(), g, TL::BLOCK_THREADS, smem_, s, tmx, tmw, a);
    } else if constexpr (TL::kWgmma) {
      CUtensorMap tmw;
      if (!tma_encode<T>(tmw, tma_matrix(a.K, a.O, TL::BN), a.w))
        throw sdk::Error(PLX_ERR_INTERNAL,
                         "igemm convolution: cuTensorMapEncodeTiled refused the filter it "
                         "accepted at creation");
      if (pool_ == PoolIx::U8)
        launch_kernel(igemm_wgmma_kernel<T, TL, uint8_t>, grid, TL::THREADS, smem_, s, tmw, a);
      else if (pool_ == PoolIx::I32)
        launch_kernel(igemm_wgmma_kernel<T, TL, int32_t>, grid, TL::THREADS, smem_, s, tmw, a);
      else
        launch_kernel(igemm_wgmma_kernel<T, TL>, grid, TL::THREADS, smem_, s, tmw, a);
    } else if (pool_ == PoolIx::U8)
      launch_kernel(igemm_conv_kernel<T, TL, false, uint8_t>, grid, TL::THREADS, smem_, s, a);
    else if (pool_ == PoolIx::I32)
      launch_kernel(igemm_conv_kernel<T, TL, false, int32_t>, grid, TL::THREADS, smem_, s, a);
    else if (bt_)
      launch_kernel(igemm_conv_kernel<T, TL, true>, grid, TL::THREADS, smem_, s, a);
    else
      launch_kernel(igemm_conv_kernel<T, TL>, grid, TL::THREADS, smem_, s, a);
  }

 private:
  enum class PoolIx { None, U8, I32 };

  // The pool variant's arguments (see IgemmArgs): the conv's output (N, O, Ho, Wo) pooled by
  // 2x2 windows of stride 2, whole windows only.
  void set_pool(const Pool& p, int64_t N, int64_t Ho, int64_t Wo, bool relu) {
    const NodeInfo& pool = *p.pool;
    const char* op = "conv2d+max_pool2d";
    auto stride = pool.attr_ints("stride");
    const auto kernel = pool.attr_ints("kernel"), pad = pool.attr_ints("padding"),
               dil = pool.attr_ints("dilation");
    if (stride.empty()) stride = kernel;
    const std::vector<int64_t> two{2, 2}, zero{0, 0}, one{1, 1};
    PLX_DECLINE_UNLESS(kernel == two && stride == two && pad == zero && (dil.empty() || dil == one),
                       "%s: igemm pools 2x2 windows of stride 2 without padding or dilation", op);
    const plx_tensor &y = pool.output(0), &ix = pool.output(1);
    PLX_REQUIRE(y.ndim == 4 && ix.ndim == 4 && y.shape[0] == N && y.shape[1] == a_.O,
                "%s: the pooled tensors do not match the convolution", op);
    const int64_t PH = y.shape[2], PW = y.shape[3];
    PLX_DECLINE_UNLESS(2 * PH <= Ho && 2 * PW <= Wo,
                       "%s: igemm pools whole windows only (ceil_mode made a partial one)", op);
    PLX_DECLINE_UNLESS(ix.dtype == PLX_U8 || ix.dtype == PLX_I32,
                       "%s: the indices must be u8 or i32", op);
    PLX_DECLINE_UNLESS(y.dtype == dtype_v<T>, "%s: the pooled y must be of the conv's dtype", op);
    using sdk::nhwc_or_decline;
    const bool y_nhwc = nhwc_or_decline(y, "max_pool2d", "y");
    const bool i_nhwc = nhwc_or_decline(ix, "max_pool2d", "the indices");
    pool_ = ix.dtype == PLX_U8 ? PoolIx::U8 : PoolIx::I32;
    const int64_t yd[4] = {N, a_.O, PH, PW};
    int64_t st[4];
    canonical_strides(yd, y_nhwc, st);
    a_.y_n = st[0], a_.y_c = st[1], a_.y_p = st[3];
    canonical_strides(yd, i_nhwc, st);
    a_.i_n = st[0], a_.i_c = st[1], a_.i_p = st[3];
    a_.PW = static_cast<int>(PW);
    a_.PHW = PH * PW;
    a_.M = 4 * N * PH * PW;
    const bool mask = pool.attr_int_or("relu_mask", 0) != 0;
    a_.relu = false;  // the pool epilogue applies it
    a_.relu_mask = mask;
    a_.relu_after = relu && mask;  // the ReLU on the maximum, as the chunked group runs it
    a_.relu_before = relu && !mask;
    out_elems_ = N * a_.O * PH * PW;
    in_x_ = p.slots.x, in_w_ = p.slots.w, in_b_ = p.slots.bias;
    out_y_ = p.slots.y, out_i_ = p.slots.indices;
    const bool u8 = pool_ == PoolIx::U8;
    if constexpr (kTf32) {
      u8 ? opt_in(igemm_tf32_kernel<TL, uint8_t>) : opt_in(igemm_tf32_kernel<TL, int32_t>);
      if (vec_)
        u8 ? opt_in(igemm_tf32_kernel<TL, uint8_t, true>)
           : opt_in(igemm_tf32_kernel<TL, int32_t, true>);
    } else if constexpr (TL::kIm2col) {
      u8 ? opt_in(im2col_kernel<uint8_t>()) : opt_in(im2col_kernel<int32_t>());
    } else if constexpr (TL::kWgmma)
      u8 ? opt_in(igemm_wgmma_kernel<T, TL, uint8_t>) : opt_in(igemm_wgmma_kernel<T, TL, int32_t>);
    else
      u8 ? opt_in(igemm_conv_kernel<T, TL, false, uint8_t>)
         : opt_in(igemm_conv_kernel<T, TL, false, int32_t>);
  }

  // The im2col tiles' kernel: a block per output tile, or the persistent one.
  template <class Ix = void>
  static constexpr auto im2col_kernel() {
    if constexpr (TL::kPersistent)
      return igemm_wgmma_im2col_persistent_kernel<T, TL, Ix>;
    else
      return igemm_wgmma_im2col_kernel<T, TL, Ix>;
  }

  // Opts kernel f into smem_ bytes of dynamic shared memory (above the default 48 KiB a kernel
  // must, per device).
  template <class... A>
  void opt_in(void (*f)(A...)) const {
    allow_dynamic_smem(f, smem_);  // smem_ depends on K (the tables): the limit only grows
  }

  int32_t device_;
  bool has_bias_ = false;
  int64_t out_elems_ = 0;
  IgemmArgs<T> a_{};
  bool stage_act_ = false, stage_w_ = false;
  bool bt_ = false;  // backward data reading the channels-last filter in place
  bool vec_ = false;  // TF32: the channels-last activation's 16-byte gather (igemm_tf32_kernel)
  int smem_ = 0;
  PoolIx pool_ = PoolIx::None;
  int32_t in_x_ = 0, in_w_ = 1, in_b_ = 2, out_y_ = 0, out_i_ = -1;  // the call's slots
  int64_t act_dims_[3] = {0, 0, 0};  // N, C, H·W of the NCHW activation to transpose
  int64_t w_strides_[4] = {0, 0, 0, 0};
  uint64_t act_bytes_ = 0, w_bytes_ = 0;
  KTable tab_;  // TF32
  TmaIm2col i2c_{};  // the im2col tiles' activation map, but for its address
  unsigned blocks_ = 0;  // the persistent tiles' grid
};

// conv2d_backward_weight: dy (N, O, OH, OW), x (N, C, H, W) -> dw (O, C, KH, KW).
template <class T, class TL>
class IgemmWgradKernel final : public Kernel {
  using S = WgradSmem<TL>;
  static constexpr bool kTf32 = std::is_same_v<T, float>;
  static constexpr int smem_bytes() {
    if constexpr (kTf32) return Tf32Tile<TL>::W_SMEM + TL::BN * 8 + TL::BM * 4;  // + the tables
    else if constexpr (TL::kIm2col)
      return TL::SMEM;  // no pixel tables
    else if constexpr (TL::kWgmma)
      return wgmma_wgrad_smem<TL>();
    else return S::BYTES;
  }
  static constexpr int kSmem = smem_bytes();

 public:
  IgemmWgradKernel(const NodeInfo& node, CudaBackend& backend) : device_(node.device()) {
    const char* op = "conv2d_backward_weight";
    const plx_tensor& y = node.input(0);
    const plx_tensor& x = node.input(1);
    const plx_tensor& w = node.output(0);
    PLX_REQUIRE(x.ndim == 4 && w.ndim == 4 && y.ndim == 4, "%s: x, w and y must be 4-D", op);
    const int64_t xs[4] = {x.shape[0], x.shape[1], x.shape[2], x.shape[3]};
    int64_t ws[4];
    {
      const std::vector<int64_t> v = node.attr_ints("weight_shape");
      PLX_REQUIRE(v.size() == 4, "%s: weight_shape must have 4 values", op);
      for (int i = 0; i < 4; ++i) ws[i] = v[static_cast<size_t>(i)];
    }
    const sdk::Conv2dParams g(xs, ws, node);
    const int64_t want_y[4] = {g.N, g.O, g.OH, g.OW};
    for (int i = 0; i < 4; ++i)
      PLX_REQUIRE(y.shape[i] == want_y[i] && w.shape[i] == ws[i],
                  "%s: tensor shapes do not match the convolution", op);
    const plx_tensor* all[3] = {&x, &w, &y};
    bool nhwc[3];
    for (int i = 0; i < 3; ++i) {
      PLX_DECLINE_UNLESS(all[i]->dtype == dtype_v<T>, "%s: igemm kernels take one dtype, %s", op,
                         plexus::dtype_name(dtype_v<T>));
      const bool nchw_ok = sdk::is_contiguous(*all[i]);
      nhwc[i] = sdk::is_channels_last(*all[i]);
      PLX_DECLINE_UNLESS(nchw_ok || nhwc[i],
                         "%s: a tensor's strides are neither NCHW contiguous nor channels-last",
                         op);
    }
    PLX_DECLINE_UNLESS(g.groups == 1, "%s: igemm handles groups = 1 only, not %lld", op,
                       static_cast<long long>(g.groups));
    PLX_DECLINE_UNLESS(g.dh == 1 && g.dw == 1,
                       "%s: igemm handles dilation 1 only, not [%lld, %lld]", op,
                       static_cast<long long>(g.dh), static_cast<long long>(g.dw));
    if constexpr (kTf32) decline_unless_tf32(backend, op);
    // 16 bits: 16-byte copies along both channel counts (TF32 gathers 4 bytes at a time, and
    // leaves a first layer's few input channels to the direct kernel).
    PLX_DECLINE_UNLESS(!kTf32 || g.C >= 8,
                       "%s: TF32 igemm leaves fewer than 8 input channels (%lld) to the direct "
                       "kernel",
                       op, static_cast<long long>(g.C));
    PLX_DECLINE_UNLESS(kTf32 || (g.C > 0 && g.C % 8 == 0 && g.O > 0 && g.O % 8 == 0),
                       "%s: igemm needs C and O to be positive multiples of 8 (16-byte cp.async "
                       "rows), got C = %lld, O = %lld",
                       op, static_cast<long long>(g.C), static_cast<long long>(g.O));
    out_elems_ = numel(w);
    out_bytes_ = static_cast<uint64_t>(out_elems_) * sizeof(T);
    const int64_t P = g.N * g.OH * g.OW;
    trivial_ = P == 0;  // an empty batch: dw = 0
    if (trivial_) return;

    const int64_t J = g.KH * g.KW * g.C;
    PLX_DECLINE_UNLESS(fits_i32(P) && fits_i32(J) && fits_i32(g.O * J) &&
                           fits_i32(g.C * g.H * g.W) && fits_i32(g.H + 2 * g.ph) &&
                           fits_i32(g.W + 2 * g.pw) && fits_i32(g.OH * g.sh + g.ph) &&
                           fits_i32(g.OW * g.sw + g.pw),
                       "%s: sizes beyond igemm's 32-bit index math", op);
    const int64_t tiles_m = (g.O + TL::BM - 1) / TL::BM, tiles_n = (J + TL::BN - 1) / TL::BN;
    PLX_DECLINE_UNLESS(tiles_m <= INT_MAX && tiles_n <= 65535, "%s: too many tiles for the grid",
                       op);
    PLX_DECLINE_UNLESS(std::max(g.C, g.O) / 32 < 65535,
                       "%s: too many channels for the staging transpose", op);
    // TF32: a bit per tap of each pixel's receptive field (field_taps), and byte offsets into an
    // image of x and along dy's channels in 32 bits.
    PLX_DECLINE_UNLESS(!kTf32 || g.KH * g.KW <= 32,
                       "%s: igemm handles at most 32 taps (KH·KW), not %lld", op,
                       static_cast<long long>(g.KH * g.KW));
    PLX_DECLINE_UNLESS(!kTf32 || (fits_i32(static_cast<int64_t>(sizeof(T)) * g.C * g.H * g.W) &&
                                  fits_i32(static_cast<int64_t>(sizeof(T)) * g.O * g.OH * g.OW)),
                       "%s: an image beyond TF32 igemm's 32-bit byte offsets", op);

    use_device(device_);
    const DeviceContext& ctx = backend.context(device_);
    PLX_DECLINE_UNLESS(ctx.prop.major >= 8, "%s: mma.sync and cp.async need sm_80 or later", op);
    if constexpr (TL::kWgmma) {
      decline_unless_sm90a(ctx, op);
      // dy through the TMA: (P, O), boxes of 64 channels x 64 pixels.
      PLX_DECLINE_UNLESS(tma_accepts<T>(tma_matrix(g.O, P, 64)),
                         "%s: the TMA (cuTensorMapEncodeTiled) refuses dy as a (%lld, %lld) "
                         "matrix",
                         op, static_cast<long long>(P), static_cast<long long>(g.O));
    }
    if constexpr (TL::kIm2col) {
      // x through the TMA's im2col mode: 64 pixels a copy, in boxes of CW channels of one tap
      // (the narrow tiles: 32, for C an odd multiple of 32; C a multiple of 64 goes to the
      // others, whose boxes are twice as wide).
      PLX_DECLINE_UNLESS(g.C % TL::CW == 0 && (TL::CW == 64 || g.C % 64 != 0),
                         "%s: the im2col tiles read x in boxes of %d channels of one tap, so C "
                         "must be %s, not %lld",
                         op, TL::CW, TL::CW == 64 ? "a multiple of 64" : "an odd multiple of 32",
                         static_cast<long long>(g.C));
      i2c_ = im2col_conv(g.N, g.H, g.W, g.C, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, 64);
      i2c_.channels = TL::CW;
      PLX_DECLINE_UNLESS(tma_im2col_accepts<T>(i2c_),
                         "%s: the TMA (cuTensorMapEncodeIm2col) refuses x: strides up to 8, and "
                         "the bounding box's corners within [-128, 127] (strides [%lld, %lld], "
                         "padding [%lld, %lld], filter %lld x %lld)",
                         op, static_cast<long long>(g.sh), static_cast<long long>(g.sw),
                         static_cast<long long>(g.ph), static_cast<long long>(g.pw),
                         static_cast<long long>(g.KH), static_cast<long long>(g.KW));
    }
    PLX_DECLINE_UNLESS(static_cast<size_t>(kSmem) <= ctx.prop.sharedMemPerBlockOptin,
                       "%s: %d bytes of shared memory per block are more than the device allows",
                       op, kSmem);
    // TF32 copies 16 bytes at a time where dy and x are channels-last with 4-channel chunks.
    vec_ = kTf32 && nhwc[2] && nhwc[0] && g.O % 4 == 0 && g.C % 4 == 0;
    if constexpr (kTf32) {
      allow_dynamic_smem(igemm_wgrad_tf32_kernel<TL>, kSmem);
      if (vec_) allow_dynamic_smem(igemm_wgrad_tf32_kernel<TL, true>, kSmem);
    } else if constexpr (TL::kIm2col)
      allow_dynamic_smem(wgrad_im2col_kernel(), kSmem);
    else if constexpr (TL::kWgmma)
      allow_dynamic_smem(igemm_wgmma_wgrad_kernel<T, TL>, kSmem);
    else
      allow_dynamic_smem(igemm_wgrad_kernel<T, TL>, kSmem);

    // Split K so that about two blocks per SM are in flight, each slice at least 4 K tiles.
    int64_t bk = TL::BK;
    if constexpr (kTf32) bk = Tf32Tile<TL>::BK;
    const int64_t KT = (P + bk - 1) / bk;
    const int64_t want = 2 * std::max(1, ctx.prop.multiProcessorCount);
    int64_t slices = std::clamp<int64_t>((want + tiles_m * tiles_n - 1) / (tiles_m * tiles_n), 1,
                                         std::max<int64_t>(1, KT / 4));
    slices = std::min<int64_t>(slices, 1024);
    const int64_t kt_per = (KT + slices - 1) / slices;
    slices = (KT + kt_per - 1) / kt_per;  // no empty slice

    a_ = WgradArgs<T>{};
    a_.H = static_cast<int>(g.H), a_.W = static_cast<int>(g.W), a_.C = static_cast<int>(g.C);
    a_.O = static_cast<int>(g.O), a_.KW = static_cast<int>(g.KW), a_.OW = static_cast<int>(g.OW);
    a_.sh = static_cast<int>(g.sh), a_.sw = static_cast<int>(g.sw);
    a_.ph = static_cast<int>(g.ph), a_.pw = static_cast<int>(g.pw);
    a_.J = static_cast<int>(J);
    a_.P = static_cast<int>(P);
    a_.OHW = static_cast<int>(g.OH * g.OW);
    a_.OH = static_cast<int>(g.OH);
    a_.fOHW = FastDiv(g.OH * g.OW), a_.fOW = FastDiv(g.OW);
    a_.kt_per = static_cast<int>(kt_per);
    a_.KHW = g.KH * g.KW;
    a_.w_nhwc = nhwc[1];
    a_.KH = static_cast<int>(g.KH);
    a_.rep = 0;
    if (g.KH * g.KW <= 32)
      for (int64_t kh = 0; kh < g.KH; ++kh) a_.rep |= 1u << (kh * g.KW);
    grid_ = dim3(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n),
                 static_cast<unsigned>(slices));
    // split_sum's counters, per output tile.
    done_ = BlockCounter(tiles_m * tiles_n * split_sum_counters(static_cast<unsigned>(slices)));

    if constexpr (kTf32) {
      // dy and x read in place in their layouts; j = tap·C + c through the k table.
      const int64_t yd[4] = {g.N, g.O, g.OH, g.OW}, xd[4] = {g.N, g.C, g.H, g.W};
      int64_t ys[4], xs[4];
      canonical_strides(yd, nhwc[2], ys);
      canonical_strides(xd, nhwc[0], xs);
      a_.ds_n = ys[0], a_.ds_c = ys[1], a_.ds_h = ys[2], a_.ds_w = ys[3];
      a_.xs_n = xs[0], a_.xs_h = xs[2], a_.xs_w = xs[3];
      std::vector<KTap> tab(static_cast<size_t>(J));
      for (int64_t j = 0; j < J; ++j) {
        const int64_t tap = j / g.C, c = j % g.C, kh = tap / g.KW, kw = tap % g.KW;
        KTap& e = tab[static_cast<size_t>(j)];
        e.a = static_cast<int32_t>(c * xs[1] + kh * xs[2] + kw * xs[3]);
        e.b = 0;
        e.kh = static_cast<int32_t>(kh), e.kw = static_cast<int32_t>(kw);
      }
      tab_ = KTable(tab);
    }

    // Workspace (16 bits): dy and x in NHWC where they are NCHW; then the f32 partials.
    stage_y_ = !kTf32 && !nhwc[2];
    stage_x_ = !kTf32 && !nhwc[0];
    y_dims_[0] = g.N, y_dims_[1] = g.O, y_dims_[2] = g.OH * g.OW;
    x_dims_[0] = g.N, x_dims_[1] = g.C, x_dims_[2] = g.H * g.W;
    y_bytes_ = stage_y_ ? align_up(static_cast<uint64_t>(P * g.O) * sizeof(T)) : 0;
    x_bytes_ = stage_x_ ? align_up(static_cast<uint64_t>(g.N * g.H * g.W * g.C) * sizeof(T)) : 0;
    part_bytes_ = align_up(static_cast<uint64_t>(slices * g.O * J) * sizeof(float));
  }

  uint64_t workspace_bytes() const override {
    return trivial_ ? 0 : y_bytes_ + x_bytes_ + part_bytes_;
  }

  void compute(const KernelCall& c) override {
    if (out_elems_ == 0) return;
    use_device(device_);
    const cudaStream_t s = native(c.stream);
    if (trivial_) {
      // Both layouts of dw are dense: one block of memory.
      PLX_CUDA_CHECK(cudaMemsetAsync(c.out(0).data, 0, out_bytes_, s));
      return;
    }
    WgradArgs<T> a = a_;
    a.dy = static_cast<const T*>(c.in(0).data);
    a.x = static_cast<const T*>(c.in(1).data);
    unsigned char* ws = static_cast<unsigned char*>(c.workspace);
    if (stage_y_) {
      T* dst = reinterpret_cast<T*>(ws);
      launch_nchw_to_nhwc(a.dy, dst, y_dims_, s);
      a.dy = dst;
    }
    if (stage_x_) {
      T* dst = reinterpret_cast<T*>(ws + y_bytes_);
      launch_nchw_to_nhwc(a.x, dst, x_dims_, s);
      a.x = dst;
    }
    a.part = reinterpret_cast<float*>(ws + y_bytes_ + x_bytes_);
    const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    if (((addr(a.dy) | addr(a.x)) & (kTf32 ? 3u : 15u)) || (addr(a.part) & 15u))
      throw sdk::Error(PLX_ERR_INVALID_ARGUMENT,
                       sdk::format("igemm convolution: dy, x and the workspace must be %d-byte "
                                   "aligned",
                                   kTf32 ? 4 : 16));
    a.dw = static_cast<T*>(c.out(0).data);
    a.done = done_.p;
    if constexpr (kTf32) {
      a.tab = tab_.p;
      // Views off the 16-byte grain copy 4 bytes at a time.
      if (vec_ && ((addr(a.dy) | addr(a.x)) & 15u) == 0)
        launch_kernel(igemm_wgrad_tf32_kernel<TL, true>, grid_, TL::THREADS, kSmem, s, a);
      else
        launch_kernel(igemm_wgrad_tf32_kernel<TL>, grid_, TL::THREADS, kSmem, s, a);
    } else if constexpr (TL::kIm2col) {
      CUtensorMap tmy, tmx;
      if (!tma_encode<T>(tmy, tma_matrix(a.O, a.P, 64), a.dy) ||
          !tma_encode_im2col<T>(tmx, i2c_, a.x))
        throw sdk::Error(PLX_ERR_INTERNAL,
                         "igemm convolution: the TMA refused the tensor maps it accepted at "
                         "creation");
      launch_kernel(wgrad_im2col_kernel(), grid_, TL::BLOCK_THREADS, kSmem, s, tmy, tmx, a);
    } else if constexpr (TL::kWgmma) {
      CUtensorMap tmy;
      if (!tma_encode<T>(tmy, tma_matrix(a.O, a.P, 64), a.dy))
        throw sdk::Error(PLX_ERR_INTERNAL,
                         "igemm convolution: cuTensorMapEncodeTiled refused the dy it accepted "
                         "at creation");
      launch_kernel(igemm_wgmma_wgrad_kernel<T, TL>, grid_, TL::THREADS, kSmem, s, tmy, a);
    } else {
      launch_kernel(igemm_wgrad_kernel<T, TL>, grid_, TL::THREADS, kSmem, s, a);
    }
  }

 private:
  // The im2col tiles' kernel: thread 0 issuing the copies, or a producer warp (_ws).
  static constexpr auto wgrad_im2col_kernel() {
    if constexpr (TL::kWarpSpec)
      return igemm_wgmma_wgrad_ws_kernel<T, TL>;
    else
      return igemm_wgmma_wgrad_im2col_kernel<T, TL>;
  }

  int32_t device_;
  int64_t out_elems_ = 0;
  uint64_t out_bytes_ = 0;
  bool trivial_ = false;
  WgradArgs<T> a_{};
  dim3 grid_;
  BlockCounter done_{0};
  bool stage_y_ = false, stage_x_ = false;
  int64_t y_dims_[3] = {0, 0, 0}, x_dims_[3] = {0, 0, 0};
  uint64_t y_bytes_ = 0, x_bytes_ = 0, part_bytes_ = 0;
  bool vec_ = false;  // TF32: dy's and x's 16-byte copies (igemm_wgrad_tf32_kernel's kVec)
  KTable tab_;  // TF32
  TmaIm2col i2c_{};  // the im2col tiles' map of x, but for its address
};

template <class T, class TL>
void add_tile(KernelRegistry& r, plx_dtype d) {
  const uint32_t f = PLX_KERNEL_CAPTURABLE | PLX_KERNEL_STRIDED | PLX_KERNEL_DETERMINISTIC;
  const std::string name = TL::name();
  // Either layout for each tensor. 16 bits prefer channels-last (read in place; NCHW is staged),
  // as cuDNN's Tensor Core kernels do; TF32 reads both in place and keeps f32's NCHW graphs.
  const plx_layout l = d == PLX_F32 ? PLX_LAYOUT_ANY : PLX_LAYOUT_NHWC;
  r.add<IgemmConvKernel<T, TL, Dir::Fwd>, CudaBackend>("conv2d", d, name.c_str(), f, l);
  r.add<IgemmConvKernel<T, TL, Dir::BwdData>, CudaBackend>("conv2d_backward_data", d, name.c_str(),
                                                           f, l);
  // The wgmma tiles' weight gradient has tiles of its own (for_each_wgrad_tile).
  if constexpr (!TL::kWgmma)
    r.add<IgemmWgradKernel<T, TL>, CudaBackend>("conv2d_backward_weight", d, name.c_str(), f, l);
}

template <class T, class TL>
void add_wgrad_tile(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_CAPTURABLE | PLX_KERNEL_STRIDED | PLX_KERNEL_DETERMINISTIC;
  r.add<IgemmWgradKernel<T, TL>, CudaBackend>("conv2d_backward_weight", dtype_v<T>,
                                              TL::name().c_str(), f, PLX_LAYOUT_NHWC);
}

// The tile families, each instantiated by a translation unit of its own (nvcc builds them in
// parallel): the mma.sync tiles (igemm_conv_{f16,bf16,f32}.cu, one per dtype), the wgmma tiles
// (igemm_wgmma.cu) and the warp-specialized wgmma tiles (igemm_wgmma_ws.cu), both sm_90a.
enum class Family { Mma, Hopper, WarpSpec };

// Calls f(TL{}) for each forward and backward-data tile of dtype T and family F, in registration
// order: the mma.sync tiles (256x32 has no TF32 form), the wgmma tiles or the persistent ones
// (16 bits).
template <class T, Family kFamily = Family::Mma, class F>
void for_each_tile(F&& f) {
  if constexpr (kFamily != Family::Mma)
    static_assert(!std::is_same_v<T, float>, "wgmma tiles: f16 and bf16");
  if constexpr (kFamily == Family::Hopper) {
    f(WgTile128x128{}), f(WgTile128x64{}), f(WgTile128x32{});
    f(WgI2cTile128x128{}), f(WgI2cTile128x64{}), f(WgI2cTile128x32{});
    f(WgI2cTile128x64x32{});
  } else if constexpr (kFamily == Family::WarpSpec) {
    f(WgPerTile128x128{}), f(WgPerTile128x64{}), f(WgPerTile128x32{});
    f(WgPerTile128x64x32{});
  } else {
    f(Tile128x128{}), f(Tile128x64{}), f(Tile64x64{}), f(Tile128x32{}), f(Tile64x128{});
    if constexpr (!std::is_same_v<T, float>) f(Tile256x32{});
  }
}

// The Hopper weight gradient's tiles (M = O, N = J = KH·KW·C: 64 or 128 output channels a tile,
// read MN-major in boxes of 64): the gathering and im2col ones, or the warp-specialized family's.
template <Family kFamily, class F>
void for_each_wgrad_tile(F&& f) {
  if constexpr (kFamily == Family::Hopper) {
    f(WgTile128x128{}), f(WgTile128x64{}), f(WgTile64x128{});
    f(WgI2cTile128x128{}), f(WgI2cTile128x64{}), f(WgI2cTile64x128{});
  } else if constexpr (kFamily == Family::WarpSpec) {
    f(WgWsTile128x128{}), f(WgWsTile128x64{}), f(WgWsTile64x128{});
    f(WgWsTile64x128c32{}), f(WgWsTile64x96c32{});
  }
}

template <class T, Family kFamily = Family::Mma>
void add_tiles(KernelRegistry& r) {
  for_each_tile<T, kFamily>([&]<class TL>(TL) { add_tile<T, TL>(r, dtype_v<T>); });
  for_each_wgrad_tile<kFamily>([&]<class TL>(TL) { add_wgrad_tile<T, TL>(r); });
}

// The forward kernel of tile `tile` in dtype T, with the ReLU and (pool non-null) the 2x2 pool in
// its epilogue; `op` names the node or group in a decline.
template <class T, Family kFamily = Family::Mma>
std::unique_ptr<Kernel> make_fwd_tiles(const NodeInfo& conv, CudaBackend& backend,
                                       const std::string& tile, bool relu, const Pool* pool,
                                       const char* op) {
  std::unique_ptr<Kernel> k;
  auto try_tile = [&]<class TL>(TL) {
    if (!k && tile == TL::name())
      k = std::make_unique<IgemmConvKernel<T, TL, Dir::Fwd>>(conv, backend, relu, pool);
  };
  for_each_tile<T, kFamily>(try_tile);
  if (!k) throw sdk::Unsupported(sdk::format("%s: no igemm tile named '%s'", op, tile.c_str()));
  return k;
}

}  // namespace PLX_IGEMM_TU
}  // namespace plexus::cuda::igemm
