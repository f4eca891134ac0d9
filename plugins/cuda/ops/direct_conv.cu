// CUDA kernels: a direct convolution of our own for layers with few input taps, as candidates
// ("direct") beside cuDNN for
//
//   conv2d                   y  = conv(x, w) (+ b), optionally through a ReLU
//   conv2d_backward_weight   dw = Σ_n dy_n ⋆ x_n
//
// The first layer of an image network reads C = 1 (or 3) channels: K = C·KH·KW taps is 9 (or
// 27) for a 3x3 filter, too short a reduction for the Tensor Core GEMMs (the implicit-GEMM
// kernels, ops/igemm_conv.cuh, need C % 8 == 0 and decline it), and what the layer costs is
// writing O channels per pixel, not the arithmetic. So these kernels run on the CUDA cores in
// f32 and aim at one pass over y (forward) or dy (weight gradient):
//
// Forward. A block owns tiles of TP output pixels m = (n·OH + oh)·OW + ow. It keeps the whole
// filter and the bias in shared memory as f32 (O·K values, K <= kMaxTaps), gathers the tile's
// receptive fields into shared memory once (TP x K, zero in the padding), then writes the
// tile's TP·O outputs in y's memory order, one per thread and step: consecutive threads take
// consecutive channels of one pixel for a channels-last y, consecutive pixels of one channel for
// an NCHW y, so the stores are coalesced either way. Each output is the K-term dot product in
// tap order (k = (c·KH + kh)·KW + kw), plus the bias, through the ReLU when asked (the relu op's
// rule, x > 0 ? x : 0), rounded once to y's dtype.
//
// Weight gradient, image by image (direct_image_wgrad_kernel, below), where one image of x fits
// in shared memory: a block stages a run of images' x in turn, and each thread sums g · x over
// the taps for one output channel and its share of the image's pixels (or, with the max pool's
// backward fused, of the pooled windows, each adding only at the pixel its index names).
//
// Weight gradient, tiled, for larger images. dw[o, k] = Σ_m dy[m, o] · patch[m, k] over all
// N·OH·OW pixels: block b sums
// the pixels of its chunk of tiles, each tile's dy (TP x O) and receptive fields (TP x K) staged
// in shared memory as f32, each thread owning up to R of the O·K sums (consecutive threads on
// consecutive k); the per-chunk f32 partials are added in the launch by split_sum (device.cuh:
// in groups of about √chunks, then the groups, in a fixed order; counters the kernel owns) and
// rounded once into dw's dtype and layout. One launch. In the fused
// group relu_backward -> {sum, conv2d_backward_weight} (a first layer's backward, where nothing
// reads dx) the same launch masks dy by relu's y > 0 as it stages it and sums it per channel
// beside dw (the bias gradient, a tap whose value is 1), so the masked gradient is never
// written (image by image the same: dy masked as it is loaded). No atomics on the data (the
// counters only say which block is last), a fixed summation order, launch geometry fixed at
// creation: deterministic. Nothing allocated or synchronised: capturable.
//
// Layouts: x, w, y (dy, dw) each NCHW contiguous or channels-last (the layout planner's); each
// element is addressed through its tensor's canonical strides, so every mix runs as it is, with
// no staging. Declined: groups > 1, K > kMaxTaps, O > kMaxChannels, more sums than the weight
// gradient's threads hold, mixed dtypes, other strides.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "device.cuh"
#include "ops/conv_strides.hpp"
#include "ops/direct_conv.hpp"
#include "plexus/sdk/fusion_conv_pool.hpp"

namespace plexus::cuda {

namespace {

constexpr int kMaxTaps = 32;              // K = C·KH·KW
constexpr int kMaxChannels = 256;         // O
constexpr int kFwdTile = 64;              // TP: output pixels per forward tile
constexpr int kWgradTile = 32;            // TP: pixels per weight-gradient tile
constexpr int kWgradMaxSums = 16;         // R: dw sums per thread (O·K <= R·kBlock)
constexpr int64_t kWgradBlocksPerSm = 8;  // the weight gradient's chunks: blocks per SM
constexpr uint64_t kMaxSmem = 48 * 1024;  // no opt-in needed below this
constexpr int64_t kImageWgradBlocksPerSm = 2;  // the image-by-image weight gradient's runs of images
constexpr int kImageWgradBatch = 8;            // its items loaded before any is used

using direct::ceil_div;
using direct::fits_i32;
using direct::sm_count;

// The convolution, its tensors' element strides (n/o, c, h, w) and the tap table's inputs.
template <class T>
struct DirectArgs {
  const T* x;     // (N, C, H, W)
  const T* w;     // (O, C, KH, KW) (forward)
  const T* bias;  // (O) or null (forward)
  T* y;           // (N, O, OH, OW): y (forward) or dy (weight gradient, read)
  // Weight gradient only:
  const T* relu_y;  // relu_backward's y, laid out as dy: dy counts where relu_y > 0; or null
  T* dwt;           // dw (O, C, KH, KW)
  T* db;            // (O): the bias gradient, Σ of dy per channel, where Kb = K + 1
  float* part;      // (chunks, O·Kb) f32 partials
  unsigned* done;   // split_sum's counters
  // With the max pool's backward before it (unpooling): y is the pooled gradient (N, O, PH, PW)
  // and y_n/y_c/y_p its strides; pool_idx the pool's indices, laid out by i_n/i_c/i_p, i32
  // positions or u8 window taps (pool_u8); windows pkh x pkw, stride = kernel, no padding or
  // dilation, so each conv pixel is in at most one window. Null: dy is the conv's gradient.
  const void* pool_idx;
  bool pool_u8;
  int pkh, pkw, PH, PW;
  int64_t i_n, i_c, i_p;
  int C, H, W, O, KH, KW, OW, sh, sw, ph, pw, dh, dw;
  int K, Kb, Kp;   // taps; the weight gradient's sums per channel (K, or K + 1 with db); the
                   // padded row length of the shared tables (odd: no bank conflicts)
  int64_t M, OHW;  // N·OH·OW output pixels, OH·OW
  int64_t x_n, x_c, x_h, x_w;
  int64_t y_n, y_c, y_p;  // y element (n, o, oh·OW + ow) at n·y_n + o·y_c + p·y_p
  int64_t w_o, w_c, w_h, w_w;
  bool y_nhwc;  // y's channels are innermost: threads walk channels first
  bool relu;
  int64_t tiles, tiles_per_chunk;
  // The divisions of the per-tile index math by K, O, Kb, OH·OW and OW (device.cuh's FastDiv: a
  // tile's few FMAs per thread were outnumbered by its divisions' instructions); m32: every
  // pixel index m < 2^31, so fill_pixels may divide it in 32 bits.
  FastDiv fK, fO, fKb, fOHW, fOW;
  bool m32;
  // The weight gradient image by image (direct_image_wgrad_kernel): N images, `ipb` a block; x
  // staged as C planes of XH x XW (rows from -ph, columns from -pw, zero outside the image), tap
  // k at tap_off[k] from a pixel's corner there; S threads per output channel; the divisions of
  // a pooled position by PW and of a u8 tap by the window's width.
  int N, OH, ipb, XH, XW, S;
  int tap_off[kMaxTaps];
  FastDiv fPW, fPKW;
};

// Shared-memory tables common to both kernels: per tap (c, kh, kw) -> x offset c·x_c and the
// filter-row offsets kh·dh, kw·dw; per pixel of the tile, its image's x and y offsets and its
// window's top-left corner.
struct PixelTables {
  int64_t* x_base;  // [TP]
  int64_t* y_base;  // [TP]
  int64_t* i_base;  // [TP] unpooling: the pixel's window in the indices
  int* want;        // [TP] unpooling: the index that names the pixel in its window; -1: none
  int* ih0;         // [TP]
  int* iw0;         // [TP]
  int64_t* tap_x;   // [K]
  int* tap_h;       // [K]
  int* tap_w;       // [K]
};

template <class T>
__device__ __forceinline__ void fill_taps(const DirectArgs<T>& a, const PixelTables& t) {
  const int khw = a.KH * a.KW;
  for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
    const int c = k / khw, r = k - c * khw, kh = r / a.KW, kw = r - kh * a.KW;
    t.tap_x[k] = c * a.x_c;
    t.tap_h[k] = kh * a.dh;
    t.tap_w[k] = kw * a.dw;
  }
}

// The tile's pixels m0 .. m0 + TP - 1 (those below M).
template <class T>
__device__ __forceinline__ void fill_pixels(const DirectArgs<T>& a, const PixelTables& t,
                                            int64_t m0, int TP) {
  for (int p = threadIdx.x; p < TP; p += blockDim.x) {
    const int64_t m = m0 + p;
    if (m >= a.M) break;
    int64_t n, r;
    int oh, ow;
    if (a.m32) {
      int ni, ri;
      a.fOHW.divmod(static_cast<int>(m), ni, ri);
      n = ni, r = ri;
      a.fOW.divmod(ri, oh, ow);
    } else {
      n = m / a.OHW;
      r = m - n * a.OHW;
      oh = static_cast<int>(r / a.OW), ow = static_cast<int>(r - oh * static_cast<int64_t>(a.OW));
    }
    t.x_base[p] = n * a.x_n;
    t.ih0[p] = oh * a.sh - a.ph;
    t.iw0[p] = ow * a.sw - a.pw;
    if (!a.pool_idx) {
      t.y_base[p] = n * a.y_n + r * a.y_p;
      continue;
    }
    // Unpooling: the window (oh / pkh, ow / pkw), if there is one (floor mode drops the last
    // rows and columns), and what its index holds when it names this pixel.
    const int wh = oh / a.pkh, ww = ow / a.pkw;
    t.want[p] = -1;
    if (wh >= a.PH || ww >= a.PW) continue;
    const int64_t wr = static_cast<int64_t>(wh) * a.PW + ww;
    t.y_base[p] = n * a.y_n + wr * a.y_p;
    t.i_base[p] = n * a.i_n + wr * a.i_p;
    t.want[p] = a.pool_u8 ? (oh - wh * a.pkh) * a.pkw + (ow - ww * a.pkw) : oh * a.OW + ow;
  }
}

// dy at pixel p (of the tile's tables), channel o, before any ReLU mask: the conv's gradient,
// or (unpooling) the pooled gradient where the pixel's window index names it, else 0.
template <class T>
__device__ __forceinline__ float conv_grad_at(const DirectArgs<T>& a, const PixelTables& t, int p,
                                              int o) {
  if (!a.pool_idx) return load(a.y, t.y_base[p] + o * a.y_c);
  if (t.want[p] < 0) return 0.f;
  const int64_t at = t.i_base[p] + o * a.i_c;
  const int v = a.pool_u8 ? static_cast<const uint8_t*>(a.pool_idx)[at]
                          : static_cast<const int32_t*>(a.pool_idx)[at];
  return v == t.want[p] ? load(a.y, t.y_base[p] + o * a.y_c) : 0.f;
}

// patch[p·Kp + k] = x at pixel p's tap k, 0 in the padding (and past M, or where `pos`, when
// given, says pixel p is none: pos[p] < 0).
template <class T>
__device__ __forceinline__ void gather_patches(const DirectArgs<T>& a, const PixelTables& t,
                                               float* patch, int64_t m0, int TP,
                                               const int* pos = nullptr) {
  const int total = TP * a.K;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    int p, k;
    a.fK.divmod(e, p, k);
    float v = 0.f;
    if (pos ? pos[p] >= 0 : m0 + p < a.M) {
      const int ih = t.ih0[p] + t.tap_h[k], iw = t.iw0[p] + t.tap_w[k];
      if (ih >= 0 && ih < a.H && iw >= 0 && iw < a.W)
        v = load(a.x, t.x_base[p] + t.tap_x[k] + ih * a.x_h + iw * a.x_w);
    }
    patch[p * a.Kp + k] = v;
  }
}

// Carves the dynamic shared memory: the 8-byte tables first, then the 4-byte ones, then the
// kernel's float arrays.
struct SmemCarve {
  unsigned char* p;
  template <class U>
  __device__ __forceinline__ U* take(int64_t n) {
    U* r = reinterpret_cast<U*>(p);
    p += n * static_cast<int64_t>(sizeof(U));
    return r;
  }
};

__device__ __forceinline__ PixelTables carve_tables(SmemCarve& c, int TP, int K) {
  PixelTables t{};
  t.x_base = c.take<int64_t>(TP);
  t.y_base = c.take<int64_t>(TP);
  t.tap_x = c.take<int64_t>(K);
  t.ih0 = c.take<int>(TP);
  t.iw0 = c.take<int>(TP);
  t.tap_h = c.take<int>(K);
  t.tap_w = c.take<int>(K);
  return t;
}

// A tile's pixel tables and receptive fields, after the previous tile's readers are done.
template <class T>
__device__ __forceinline__ void stage_tile(const DirectArgs<T>& a, const PixelTables& t,
                                           float* patch, int64_t m0, int TP) {
  __syncthreads();  // the tap tables are filled, and the previous tile's readers are done
  fill_pixels(a, t, m0, TP);
  __syncthreads();
  gather_patches(a, t, patch, m0, TP);
}

// Element e of a tile's TP x O block of y (or dy) in y's memory order: consecutive e on
// consecutive channels of one pixel for a channels-last y, on consecutive pixels of one channel
// for an NCHW one.
template <class T>
__device__ __forceinline__ void y_element(const DirectArgs<T>& a, int e, int TP, int& p, int& o) {
  if (a.y_nhwc) {
    a.fO.divmod(e, p, o);
  } else {
    o = e / TP;
    p = e - o * TP;
  }
}

uint64_t table_bytes(int TP, int K) {
  return static_cast<uint64_t>(TP) * (2 * sizeof(int64_t) + 2 * sizeof(int)) +
         static_cast<uint64_t>(K) * (sizeof(int64_t) + 2 * sizeof(int));
}
uint64_t fwd_smem_bytes(int TP, int O, int K, int Kp) {
  return table_bytes(TP, K) +
         (static_cast<uint64_t>(O) * Kp + O + static_cast<uint64_t>(TP) * Kp) * sizeof(float);
}
uint64_t wgrad_smem_bytes(int TP, int O, int K, int Kp) {
  return table_bytes(TP, K) + static_cast<uint64_t>(TP) * (sizeof(int64_t) + sizeof(int)) +
         (static_cast<uint64_t>(TP) * O + static_cast<uint64_t>(TP) * Kp) * sizeof(float);
}

// The filter (O x K, rows Kp apart) and the bias (0 without one) into shared memory, as f32.
template <class T>
__device__ __forceinline__ void load_filter(const DirectArgs<T>& a, float* wsm, float* bsm) {
  const int khw = a.KH * a.KW;
  for (int e = threadIdx.x; e < a.O * a.K; e += blockDim.x) {
    const int o = e / a.K, k = e - o * a.K;
    const int c = k / khw, r = k - c * khw, kh = r / a.KW, kw = r - kh * a.KW;
    wsm[o * a.Kp + k] = load(a.w, o * a.w_o + c * a.w_c + kh * a.w_h + kw * a.w_w);
  }
  for (int o = threadIdx.x; o < a.O; o += blockDim.x) bsm[o] = a.bias ? load(a.bias, o) : 0.f;
}

// Output channel o at the pixel whose receptive field is patch row p: the K-term dot product in
// tap order, then the bias, in f32.
template <class T>
__device__ __forceinline__ float conv_at(const DirectArgs<T>& a, const float* wsm, const float* bsm,
                                         const float* patch, int o, int p) {
  const float* wr = wsm + o * a.Kp;
  const float* xr = patch + p * a.Kp;
  float acc = 0.f;
  for (int k = 0; k < a.K; ++k) acc += wr[k] * xr[k];
  return acc + bsm[o];
}

// ---- forward ----

template <class T>
__global__ void __launch_bounds__(kBlock) direct_conv_kernel(const DirectArgs<T> a) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char direct_smem[];
  constexpr int TP = kFwdTile;
  SmemCarve carve{direct_smem};
  const PixelTables t = carve_tables(carve, TP, a.K);
  float* wsm = carve.take<float>(static_cast<int64_t>(a.O) * a.Kp);
  float* bsm = carve.take<float>(a.O);
  float* patch = carve.take<float>(static_cast<int64_t>(TP) * a.Kp);

  fill_taps(a, t);
  load_filter(a, wsm, bsm);

  for (int64_t tile = blockIdx.x; tile < a.tiles; tile += gridDim.x) {  // uniform over the block
    const int64_t m0 = tile * TP;
    stage_tile(a, t, patch, m0, TP);
    __syncthreads();
    const int total = TP * a.O;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
      int p, o;
      y_element(a, e, TP, p, o);
      if (m0 + p >= a.M) continue;
      float acc = conv_at(a, wsm, bsm, patch, o, p);
      if (a.relu) acc = acc > 0.f ? acc : 0.f;
      store(a.y, t.y_base[p] + o * a.y_c, acc);
    }
  }
}

// ---- forward with the max pool after it ----
//
// The group conv2d -> [relu ->] max_pool2d as one launch: the pre-pool tensor never exists. A
// tile is TQ pooled pixels; its TQ·KP window taps (KP = the pool's kh·kw) are the "pixels" whose
// receptive fields are gathered (a tap in the pool's padding, pos < 0, has none). Each output
// (pooled pixel, channel) computes its window's conv values as the forward kernel does, rounds
// each to T (what the pre-pool tensor would hold), applies the ReLU before the pool where the
// pool has no relu_mask, and takes the maximum in window order as max_pool2d does (the first
// maximum, NaN wins); with relu_mask the ReLU runs on the maximum and the index is none where
// y is not > 0. So y and the indices are those of the conv, ReLU and pool kernels run one by
// one, to the bit.
struct PoolArgs {
  int OH;                              // the conv's output rows (its OW is DirectArgs::OW)
  int PW;                              // pooled columns
  int kh, kw, sh, sw, ph, pw, dh, dw;  // the pool's window
  int KP, TQ;                          // taps per window; pooled pixels per tile (TQ·KP <= 64)
  int64_t Q, PHW;                      // N·PH·PW pooled pixels, PH·PW
  int64_t i_n, i_c, i_p;               // the indices' element (n, o, p) at n·i_n + o·i_c + p·i_p
  bool relu_before, relu_after, relu_mask;
};

__device__ __forceinline__ bool beats(float v, float best) {
  return v > best || (v != v && best == best);  // larger, or the first NaN
}
__device__ __forceinline__ int32_t encode_index(int32_t pos, int, bool none, int32_t*) {
  return none ? -1 : pos;  // the position ih·W + iw in the pre-pool plane
}
__device__ __forceinline__ uint8_t encode_index(int32_t, int tap, bool none, uint8_t*) {
  return none ? 255 : static_cast<uint8_t>(tap);  // window_index: the tap kh·KW + kw
}

template <class T, class Ix>
__global__ void __launch_bounds__(kBlock)
    direct_conv_pool_kernel(const DirectArgs<T> a, const PoolArgs q, Ix* __restrict__ idx) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char direct_smem[];
  constexpr int TP = kFwdTile;
  SmemCarve carve{direct_smem};
  int64_t* i_base = carve.take<int64_t>(TP);
  const PixelTables t = carve_tables(carve, TP, a.K);
  int* pos = carve.take<int>(TP);
  float* wsm = carve.take<float>(static_cast<int64_t>(a.O) * a.Kp);
  float* bsm = carve.take<float>(a.O);
  float* patch = carve.take<float>(static_cast<int64_t>(TP) * a.Kp);

  fill_taps(a, t);
  load_filter(a, wsm, bsm);
  const int64_t tiles = (q.Q + q.TQ - 1) / q.TQ;
  const int taps = q.TQ * q.KP;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // uniform over the block
    const int64_t q0 = tile * q.TQ;
    __syncthreads();  // the tap tables are filled, and the previous tile's readers are done
    for (int e = threadIdx.x; e < taps; e += blockDim.x) {
      const int u = e / q.KP, j = e - u * q.KP;
      const int64_t g = q0 + u;
      pos[e] = -1;
      if (g >= q.Q) continue;
      const int64_t n = g / q.PHW, r = g - n * q.PHW;
      const int oh = static_cast<int>(r / q.PW),
                ow = static_cast<int>(r - oh * static_cast<int64_t>(q.PW));
      if (j == 0) {
        t.y_base[u] = n * a.y_n + r * a.y_p;
        i_base[u] = n * q.i_n + r * q.i_p;
      }
      const int wa = j / q.kw, wb = j - wa * q.kw;
      const int ch = oh * q.sh - q.ph + wa * q.dh, cw = ow * q.sw - q.pw + wb * q.dw;
      if (ch < 0 || ch >= q.OH || cw < 0 || cw >= a.OW) continue;  // the pool's padding
      pos[e] = ch * a.OW + cw;
      t.x_base[e] = n * a.x_n;
      t.ih0[e] = ch * a.sh - a.ph;
      t.iw0[e] = cw * a.sw - a.pw;
    }
    __syncthreads();
    gather_patches(a, t, patch, 0, taps, pos);
    __syncthreads();
    const int total = q.TQ * a.O;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
      int u, o;
      y_element(a, e, q.TQ, u, o);
      if (q0 + u >= q.Q) continue;
      float best = -INFINITY;
      int32_t at = -1;
      int tap = -1;
      for (int j = 0; j < q.KP; ++j) {
        const int v_at = u * q.KP + j;
        if (pos[v_at] < 0) continue;
        float v = to_accum<T>(from_accum<T>(conv_at(a, wsm, bsm, patch, o, v_at)));
        if (q.relu_before) v = v > 0.f ? v : 0.f;
        if (at < 0 || beats(v, best)) best = v, at = pos[v_at], tap = j;
      }
      const float out = to_accum<T>(from_accum<T>(q.relu_after && !(best > 0.f) ? 0.f : best));
      store(a.y, t.y_base[u] + o * a.y_c, out);
      idx[i_base[u] + o * q.i_c] =
          encode_index(at, tap, at < 0 || (q.relu_mask && !(out > 0.f)), static_cast<Ix*>(nullptr));
    }
  }
}

// ---- weight gradient ----

// The finished sum e = o·Kb + k of the weight gradient's partials, rounded once into dw (k < K,
// tap k = (c·KH + kh)·KW + kw) or db (k = K).
template <class T>
__device__ __forceinline__ void store_wgrad_sum(const DirectArgs<T>& a, int e, float v) {
  const int o = e / a.Kb, k = e - o * a.Kb;
  if (k == a.K) {
    store(a.db, o, v);
  } else {
    const int khw = a.KH * a.KW;
    const int c = k / khw, r = k - c * khw, kh = r / a.KW, kw = r - kh * a.KW;
    store(a.dwt, o * a.w_o + c * a.w_c + kh * a.w_h + kw * a.w_w, v);
  }
}

// Block b: the tiles [b·tiles_per_chunk, (b+1)·tiles_per_chunk) into part[b, :], thread i
// owning sums i, i + blockDim, ... (R of them at most): (o, k) = dw[o, k] for k < K, and with a
// bias gradient (o, K) = db[o], as a tap whose value is 1. dy is masked by relu_y > 0 where the
// block runs relu_backward too. split_sum adds the partials and its last block writes dw and db,
// rounded once.
template <class T, int R>
__global__ void __launch_bounds__(kBlock) direct_wgrad_kernel(const DirectArgs<T> a) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char direct_smem[];
  constexpr int TP = kWgradTile;
  SmemCarve carve{direct_smem};
  int64_t* i_base = carve.take<int64_t>(TP);
  PixelTables t = carve_tables(carve, TP, a.K);
  t.i_base = i_base;
  t.want = carve.take<int>(TP);
  float* dys = carve.take<float>(static_cast<int64_t>(TP) * a.O);
  float* patch = carve.take<float>(static_cast<int64_t>(TP) * a.Kp);

  fill_taps(a, t);
  if (a.Kb > a.K)  // the bias gradient's column: every pixel counts once (dy is 0 past M)
    for (int p = threadIdx.x; p < TP; p += blockDim.x) patch[p * a.Kp + a.K] = 1.f;
  const int sums = a.O * a.Kb;
  float acc[R];
#pragma unroll
  for (int j = 0; j < R; ++j) acc[j] = 0.f;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * a.tiles_per_chunk;
  const int64_t last = min(a.tiles, first + a.tiles_per_chunk);
  for (int64_t tile = first; tile < last; ++tile) {
    const int64_t m0 = tile * TP;
    stage_tile(a, t, patch, m0, TP);
    const int total = TP * a.O;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
      int p, o;
      y_element(a, e, TP, p, o);
      float v = 0.f;
      if (m0 + p < a.M) {
        v = conv_grad_at(a, t, p, o);
        if (a.relu_y)  // relu_backward's rule; relu_y is laid out as dy (no unpooling then)
          v = load(a.relu_y, t.y_base[p] + o * a.y_c) > 0.f ? v : 0.f;
      }
      dys[p * a.O + o] = v;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int e = static_cast<int>(threadIdx.x) + j * static_cast<int>(blockDim.x);
      if (e < sums) {
        int o, k;
        a.fKb.divmod(e, o, k);
        float s = acc[j];
        for (int p = 0; p < TP; ++p) s += dys[p * a.O + o] * patch[p * a.Kp + k];
        acc[j] = s;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int e = static_cast<int>(threadIdx.x) + j * static_cast<int>(blockDim.x);
    if (e < sums) a.part[static_cast<int64_t>(blockIdx.x) * sums + e] = acc[j];
  }
  split_sum(
      a.done, a.part, sums, gridDim.x, blockIdx.x, sums, [](int e) { return int64_t{e}; },
      [&](int e, int64_t, float s) { store_wgrad_sum(a, e, s); });
}

// ---- weight gradient, image by image ----
//
// dw[o, k] = Σ_n Σ_(oh, ow) g[n, o, oh, ow] · x[n, tap k of (oh, ow)] and db[o] = Σ g, where g is
// dy (masked by relu_y > 0 in the fused relu_backward group) at every conv pixel; or, with the
// max pool's backward fused, the pooled gradient of each window (o, wh, ww) at the one pixel its
// index names (none: nothing). So with a pool the kernel walks the windows, not the pixels: with
// the 2x2 pool of a first layer a quarter of them, and none where the ReLU's mask says so.
//
// A block takes a run of `ipb` images, stages each image's x in shared memory as f32 (zero-padded
// planes: no bounds tests), and thread t owns one output channel o and every S-th item (pixel or
// window) of it (t = o·S + s for an NCHW dy, whose items of one channel are contiguous; t = s·O +
// o for a channels-last one, whose channels are: either way a warp's loads are coalesced),
// summing in registers across the block's images; KB items' loads are issued before any is used.
// At the end the block adds its threads' sums per channel in slice order (shared memory, reused
// from x) into its partial, and split_sum adds the blocks' partials in the launch as in the tiled
// kernel. Per item: one or two loads, K shared-memory reads and K + 1 FMAs, where the tiled
// kernel staged 32-pixel tiles' receptive fields and gradients in dependent rounds of loads
// between barriers. Deterministic, capturable, as the tiled kernel. Every pixel counts, masked or
// not, as in the dense sum (0 · x); with the pool, a pixel no index names contributes nothing, so
// a non-finite x there does not reach dw as the unpooled sum's 0 · inf would (the forward that
// read the same x has then failed anyway).
template <class T, int KT, int KB>
__global__ void __launch_bounds__(kBlock) direct_image_wgrad_kernel(const DirectArgs<T> a) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char direct_smem[];
  float* xs = reinterpret_cast<float*>(direct_smem);  // C planes XH x XW, then the block's sums
  const int t = static_cast<int>(threadIdx.x), S = a.S;
  int o, s;
  if (a.y_nhwc) o = t % a.O, s = t / a.O;
  else o = t / S, s = t % S;
  const bool active = o < a.O && s < S;  // the block has O·S <= blockDim threads at work
  const bool pooled = a.pool_idx != nullptr;
  const int plane = a.XH * a.XW, total = a.C * plane;
  const int items = pooled ? a.PH * a.PW : a.OH * a.OW;
  const int windows = a.pkh * a.pkw;
  float acc[KT + 1];
#pragma unroll
  for (int k = 0; k <= KT; ++k) acc[k] = 0.f;
  const int n0 = static_cast<int>(blockIdx.x) * a.ipb, n1 = min(a.N, n0 + a.ipb);
  for (int n = n0; n < n1; ++n) {  // uniform over the block
    __syncthreads();  // the previous image's readers are done
    // x in its memory order (channels innermost for a channels-last x): coalesced.
    for (int e = t; e < total; e += blockDim.x) {
      int c, r;
      if (a.x_c == 1) r = e / a.C, c = e - r * a.C;
      else c = e / plane, r = e - c * plane;
      const int row = r / a.XW, col = r - row * a.XW;
      const int ih = row - a.ph, iw = col - a.pw;
      xs[c * plane + r] = ih >= 0 && ih < a.H && iw >= 0 && iw < a.W
                              ? load(a.x, n * a.x_n + c * a.x_c + ih * a.x_h + iw * a.x_w)
                              : 0.f;
    }
    __syncthreads();
    if (!active) continue;
    const int64_t ib = n * a.i_n + o * a.i_c, yb = n * a.y_n + o * a.y_c;
    for (int p0 = s; p0 < items; p0 += KB * S) {
      int idx[KB];    // pooled: the window's index; dense: 0
      float g[KB];    // the gradient
      float rel[KB];  // dense with relu_y: relu's y, which masks g
#pragma unroll
      for (int j = 0; j < KB; ++j) {
        const int p = p0 + j * S;
        idx[j] = -1;
        g[j] = 0.f;
        rel[j] = 1.f;
        if (p < items) {
          g[j] = load(a.y, yb + p * a.y_p);
          if (pooled) {
            const int64_t at = ib + p * a.i_p;
            idx[j] = a.pool_u8 ? static_cast<int>(static_cast<const uint8_t*>(a.pool_idx)[at])
                               : static_cast<const int32_t*>(a.pool_idx)[at];
          } else {
            idx[j] = 0;
            if (a.relu_y) rel[j] = load(a.relu_y, yb + p * a.y_p);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < KB; ++j) {
        if (idx[j] < 0) continue;  // past the items, or a window whose index names no pixel
        // The conv pixel (oh, ow): the item itself, or the one the window's index names (none:
        // 255 (u8), negative (i32), or, for indices that did not come from the pool, outside
        // the window or the conv's plane).
        int oh, ow;
        float gj = g[j];
        if (!pooled) {
          a.fOW.divmod(p0 + j * S, oh, ow);
          gj = rel[j] > 0.f ? gj : 0.f;  // relu_backward's rule (1 without relu_y)
        } else if (a.pool_u8) {
          if (idx[j] >= windows) continue;
          int wh, ww, th, tw;
          a.fPW.divmod(p0 + j * S, wh, ww);
          a.fPKW.divmod(idx[j], th, tw);
          oh = wh * a.pkh + th;
          ow = ww * a.pkw + tw;
          if (oh >= a.OH || ow >= a.OW) continue;  // a partial last window (ceil mode)
        } else {
          if (idx[j] >= a.OH * a.OW) continue;
          a.fOW.divmod(idx[j], oh, ow);
        }
        const float* xp = xs + oh * a.sh * a.XW + ow * a.sw;
#pragma unroll
        for (int k = 0; k < KT; ++k)
          if (k < a.K) acc[k] = fmaf(gj, xp[a.tap_off[k]], acc[k]);
        acc[KT] += gj;
      }
    }
  }
  // The block's sums per channel, its threads' in slice order, into its partial (e = o·Kb + k).
  __syncthreads();  // x is no longer read: its space takes the threads' sums, (o·S + s)·Kb + k
  if (active) {
#pragma unroll
    for (int k = 0; k < KT; ++k)
      if (k < a.K) xs[(o * S + s) * a.Kb + k] = acc[k];
    if (a.Kb > a.K) xs[(o * S + s) * a.Kb + a.K] = acc[KT];
  }
  __syncthreads();
  const int sums = a.O * a.Kb;
  for (int e = t; e < sums; e += blockDim.x) {
    int eo, k;
    a.fKb.divmod(e, eo, k);
    float v = 0.f;
    for (int j = 0; j < S; ++j) v += xs[(eo * S + j) * a.Kb + k];
    a.part[static_cast<int64_t>(blockIdx.x) * sums + e] = v;
  }
  split_sum(
      a.done, a.part, sums, gridDim.x, blockIdx.x, sums, [](int e) { return int64_t{e}; },
      [&](int e, int64_t, float v) { store_wgrad_sum(a, e, v); });
}

// ---- kernels ----

// What both kernels check and fill: the geometry from x (N, C, H, W), w (O, C, KH, KW) and
// y (N, O, OH, OW) in whatever roles the op gives them, their layouts, and the tap count.
template <class T>
DirectArgs<T> direct_args(const NodeInfo& node, const plx_tensor& x, const plx_tensor& w,
                          const plx_tensor& y, const int64_t (&xs)[4], const int64_t (&ws)[4],
                          const char* op, const char* w_name, const char* y_name) {
  const sdk::Conv2dParams g(xs, ws, node);
  const int64_t want_y[4] = {g.N, g.O, g.OH, g.OW};
  for (int i = 0; i < 4; ++i)
    PLX_REQUIRE(y.shape[i] == want_y[i] && x.shape[i] == xs[i] && w.shape[i] == ws[i],
                "%s: tensor shapes do not match the convolution", op);
  for (const plx_tensor* t : {&x, &w, &y})
    PLX_DECLINE_UNLESS(t->dtype == dtype_v<T>, "%s: direct kernels take one dtype, %s", op,
                       plexus::dtype_name(dtype_v<T>));
  PLX_DECLINE_UNLESS(g.groups == 1, "%s: direct handles groups = 1 only, not %lld", op,
                     static_cast<long long>(g.groups));
  const int64_t K = g.C * g.KH * g.KW;
  PLX_DECLINE_UNLESS(K <= kMaxTaps,
                     "%s: direct is for few taps (C·KH·KW <= %d, a first layer), got %lld", op,
                     kMaxTaps, static_cast<long long>(K));
  PLX_DECLINE_UNLESS(g.O <= kMaxChannels, "%s: direct handles at most %d output channels, got %lld",
                     op, kMaxChannels, static_cast<long long>(g.O));
  using sdk::nhwc_or_decline;
  const bool x_nhwc = nhwc_or_decline(x, op, "x"), w_nhwc = nhwc_or_decline(w, op, w_name);
  const bool y_nhwc = nhwc_or_decline(y, op, y_name);
  // 32-bit index math for everything inside one image and one filter.
  PLX_DECLINE_UNLESS(fits_i32(g.C * g.H * g.W) && fits_i32(g.O * K) &&
                         fits_i32(g.H + 2 * g.ph + g.dh * g.KH) &&
                         fits_i32(g.W + 2 * g.pw + g.dw * g.KW) && fits_i32(g.OH * g.sh + g.ph) &&
                         fits_i32(g.OW * g.sw + g.pw),
                     "%s: sizes beyond direct's 32-bit index math", op);

  DirectArgs<T> a{};
  a.C = static_cast<int>(g.C), a.H = static_cast<int>(g.H), a.W = static_cast<int>(g.W);
  a.O = static_cast<int>(g.O), a.KH = static_cast<int>(g.KH), a.KW = static_cast<int>(g.KW);
  a.OW = static_cast<int>(g.OW);
  a.OH = static_cast<int>(g.OH);
  a.sh = static_cast<int>(g.sh), a.sw = static_cast<int>(g.sw);
  a.ph = static_cast<int>(g.ph), a.pw = static_cast<int>(g.pw);
  a.dh = static_cast<int>(g.dh), a.dw = static_cast<int>(g.dw);
  a.K = static_cast<int>(K);
  a.Kb = a.K;
  a.Kp = static_cast<int>(K | 1);
  a.M = g.N * g.OH * g.OW;
  a.OHW = g.OH * g.OW;
  a.fK = FastDiv(a.K), a.fO = FastDiv(a.O), a.fKb = FastDiv(a.Kb);
  a.fOHW = FastDiv(a.OHW), a.fOW = FastDiv(a.OW);
  a.m32 = a.M < (int64_t{1} << 31);
  int64_t s[4];
  canonical_strides(xs, x_nhwc, s);
  a.x_n = s[0], a.x_c = s[1], a.x_h = s[2], a.x_w = s[3];
  canonical_strides(ws, w_nhwc, s);
  a.w_o = s[0], a.w_c = s[1], a.w_h = s[2], a.w_w = s[3];
  canonical_strides(want_y, y_nhwc, s);
  a.y_n = s[0], a.y_c = s[1], a.y_p = s[3];  // p = oh·OW + ow: offset oh·s2 + ow·s3 = p·s3
  a.y_nhwc = y_nhwc;
  return a;
}

template <class T>
class DirectConvKernel final : public Kernel {
 public:
  DirectConvKernel(const NodeInfo& node, CudaBackend& backend, bool relu = false)
      : device_(node.device()), has_bias_(node.has_input(2)) {
    const plx_tensor &x = node.input(0), &w = node.input(1), &y = node.output(0);
    PLX_REQUIRE(x.ndim == 4 && w.ndim == 4 && y.ndim == 4, "conv2d: x, w and y must be 4-D");
    const int64_t xs[4] = {x.shape[0], x.shape[1], x.shape[2], x.shape[3]};
    const int64_t ws[4] = {w.shape[0], w.shape[1], w.shape[2], w.shape[3]};
    a_ = direct_args<T>(node, x, w, y, xs, ws, "conv2d", "w", "y");
    a_.relu = relu;
    if (has_bias_) {
      const plx_tensor& b = node.input(2);
      PLX_DECLINE_UNLESS(
          b.ndim == 1 && b.dtype == dtype_v<T> && (b.shape[0] <= 1 || b.strides[0] == 1),
          "conv2d: the bias must be contiguous and of the input's dtype");
    }
    smem_ = fwd_smem_bytes(kFwdTile, a_.O, a_.K, a_.Kp);
    PLX_DECLINE_UNLESS(smem_ <= kMaxSmem, "conv2d: direct would need %llu bytes of shared memory",
                       static_cast<unsigned long long>(smem_));
    a_.tiles = ceil_div(a_.M, kFwdTile);
    grid_ = static_cast<unsigned>(std::clamp<int64_t>(
        std::min<int64_t>(a_.tiles, 16 * static_cast<int64_t>(sm_count(backend, device_))), 1,
        INT_MAX));
  }

  void compute(const KernelCall& c) override {
    if (a_.M == 0 || a_.O == 0) return;  // y is empty
    use_device(device_);
    DirectArgs<T> a = a_;
    a.x = static_cast<const T*>(c.in(0).data);
    a.w = static_cast<const T*>(c.in(1).data);
    a.bias = has_bias_ ? static_cast<const T*>(c.in(2).data) : nullptr;
    a.y = static_cast<T*>(c.out(0).data);
    launch_kernel(direct_conv_kernel<T>, grid_, kBlock, smem_, native(c.stream), a);
  }

 private:
  int32_t device_;
  bool has_bias_;
  DirectArgs<T> a_{};
  uint64_t smem_ = 0;
  unsigned grid_ = 1;
};

// A {conv2d, [relu,] max_pool2d} group (sdk::ConvMaxPoolSlots) as one direct launch.
template <class T>
class DirectConvPoolKernel final : public Kernel {
 public:
  DirectConvPoolKernel(const sdk::GraphView& g, const sdk::ConvMaxPoolSlots& s,
                       CudaBackend& backend)
      : device_(g.device()), slots_(s), u8_(s.index_dtype == PLX_U8) {
    const sdk::OwnedNodeInfo conv_info(g, s.conv), pool_info(g, s.pool);
    const NodeInfo conv(&conv_info.get()), pool(&pool_info.get());
    const plx_tensor &x = conv.input(0), &w = conv.input(1), &pre = conv.output(0);
    const plx_tensor &y = pool.output(0), &ix = pool.output(1);
    PLX_REQUIRE(x.ndim == 4 && w.ndim == 4 && pre.ndim == 4 && y.ndim == 4 && ix.ndim == 4,
                "conv2d+max_pool2d: 4-D tensors expected");
    const int64_t xs[4] = {x.shape[0], x.shape[1], x.shape[2], x.shape[3]};
    const int64_t ws[4] = {w.shape[0], w.shape[1], w.shape[2], w.shape[3]};
    // The pre-pool tensor is never written: its descriptor only gives the conv's output shape.
    a_ = direct_args<T>(conv, x, w, pre, xs, ws, "conv2d", "w", "the pre-pool tensor");
    if (slots_.bias >= 0) {
      const plx_tensor& b = conv.input(2);
      PLX_DECLINE_UNLESS(b.ndim == 1 && (b.shape[0] <= 1 || b.strides[0] == 1),
                         "conv2d: the bias must be contiguous");
    }
    PLX_DECLINE_UNLESS(ix.dtype == PLX_I32 || ix.dtype == PLX_U8,
                       "max_pool2d: indices must be i32 or u8");
    using sdk::nhwc_or_decline;
    const bool y_nhwc = nhwc_or_decline(y, "max_pool2d", "y");
    const bool i_nhwc = nhwc_or_decline(ix, "max_pool2d", "the indices");
    const direct::PoolWindow win = direct::pool_window(pool, "max_pool2d");
    const auto &kernel = win.kernel, &stride = win.stride, &pad = win.pad, &dil = win.dil;
    const int64_t KP = kernel[0] * kernel[1];
    PLX_DECLINE_UNLESS(KP >= 1 && KP <= kFwdTile,
                       "conv2d+max_pool2d: direct takes windows of at most %d taps", kFwdTile);
    for (int64_t v : {stride[0], stride[1], pad[0], pad[1], dil[0], dil[1], kernel[0], kernel[1]})
      PLX_DECLINE_UNLESS(fits_i32(v), "max_pool2d: window sizes beyond 32 bits");
    q_.OH = static_cast<int>(pre.shape[2]);
    q_.PW = static_cast<int>(y.shape[3]);
    q_.kh = static_cast<int>(kernel[0]), q_.kw = static_cast<int>(kernel[1]);
    q_.sh = static_cast<int>(stride[0]), q_.sw = static_cast<int>(stride[1]);
    q_.ph = static_cast<int>(pad[0]), q_.pw = static_cast<int>(pad[1]);
    q_.dh = static_cast<int>(dil[0]), q_.dw = static_cast<int>(dil[1]);
    q_.KP = static_cast<int>(KP);
    q_.TQ = static_cast<int>(kFwdTile / KP);
    q_.PHW = y.shape[2] * y.shape[3];
    q_.Q = y.shape[0] * q_.PHW;
    const bool relu = slots_.relu >= 0, mask = pool.attr_int_or("relu_mask", 0) != 0;
    q_.relu_mask = mask;
    q_.relu_after = relu && mask;  // as the chunked group runs it: the ReLU on the maximum
    q_.relu_before = relu && !mask;
    const int64_t yd[4] = {y.shape[0], y.shape[1], y.shape[2], y.shape[3]};
    int64_t st[4];
    canonical_strides(yd, y_nhwc, st);
    a_.y_n = st[0], a_.y_c = st[1], a_.y_p = st[3];
    a_.y_nhwc = y_nhwc;
    canonical_strides(yd, i_nhwc, st);
    q_.i_n = st[0], q_.i_c = st[1], q_.i_p = st[3];
    smem_ = fwd_smem_bytes(kFwdTile, a_.O, a_.K, a_.Kp) +
            static_cast<uint64_t>(kFwdTile) * (sizeof(int64_t) + sizeof(int));
    PLX_DECLINE_UNLESS(smem_ <= kMaxSmem,
                       "conv2d+max_pool2d: direct would need %llu bytes of shared memory",
                       static_cast<unsigned long long>(smem_));
    const int64_t tiles = ceil_div(q_.Q, q_.TQ);
    grid_ = static_cast<unsigned>(std::clamp<int64_t>(
        std::min<int64_t>(tiles, 16 * static_cast<int64_t>(sm_count(backend, device_))), 1,
        INT_MAX));
  }

  void compute(const KernelCall& c) override {
    if (q_.Q == 0 || a_.O == 0) return;  // y is empty
    use_device(device_);
    DirectArgs<T> a = a_;
    a.x = static_cast<const T*>(c.in(slots_.x).data);
    a.w = static_cast<const T*>(c.in(slots_.w).data);
    a.bias = slots_.bias >= 0 ? static_cast<const T*>(c.in(slots_.bias).data) : nullptr;
    a.y = static_cast<T*>(c.out(slots_.y).data);
    void* idx = c.out(slots_.indices).data;
    const cudaStream_t s = native(c.stream);
    if (u8_)
      launch_kernel(direct_conv_pool_kernel<T, uint8_t>, grid_, kBlock, smem_, s, a, q_,
                    static_cast<uint8_t*>(idx));
    else
      launch_kernel(direct_conv_pool_kernel<T, int32_t>, grid_, kBlock, smem_, s, a, q_,
                    static_cast<int32_t*>(idx));
  }

 private:
  int32_t device_;
  sdk::ConvMaxPoolSlots slots_;
  bool u8_;
  DirectArgs<T> a_{};
  PoolArgs q_{};
  uint64_t smem_ = 0;
  unsigned grid_ = 1;
};

// conv2d_backward_weight: dy (N, O, OH, OW), x (N, C, H, W) -> dw (O, C, KH, KW); in a fused
// group also with relu_backward before it (dy masked by relu_backward's y) and the bias
// gradient's sum of the masked dy (db). One launch either way.
//
// Where the call's tensors are: input slots of dy, x and relu_backward's y (-1: no ReLU), output
// slots of dw and db (-1: no bias gradient).
struct WgradSlots {
  int32_t dy = 0, x = 1, relu_y = -1, dw = 0, db = -1;
  int32_t indices = -1;  // input slot of the max pool's indices, when the kernel unpools dy
};

// The max_pool2d_backward before a weight gradient that unpools its dy (the pooled gradient
// and the indices, as the group's boundary gives them, and the pool node).
struct Unpool {
  const plx_tensor* dy = nullptr;       // (N, O, PH, PW)
  const plx_tensor* indices = nullptr;  // (N, O, PH, PW), i32 or u8
  const NodeInfo* pool = nullptr;
};

template <class T>
class DirectWgradKernel final : public Kernel {
 public:
  using Slots = WgradSlots;

  DirectWgradKernel(const NodeInfo& node, CudaBackend& backend)
      : DirectWgradKernel(node, backend, Slots{}, nullptr, nullptr, nullptr) {}

  // `relu_y`, `db`: the descriptors of those tensors where `slots` has them; `dy`: what the
  // kernel reads as dy where that is not the node's input 0 (relu_backward's input, in a group);
  // `unpool`: the max pool's backward before it, in a group.
  DirectWgradKernel(const NodeInfo& node, CudaBackend& backend, Slots slots,
                    const plx_tensor* relu_y, const plx_tensor* db, const plx_tensor* dy_read,
                    const Unpool& unpool = {})
      : device_(node.device()), slots_(slots) {
    const char* op = "conv2d_backward_weight";
    const plx_tensor &dy = dy_read ? *dy_read : node.input(0), &x = node.input(1),
                     &dw = node.output(0);
    PLX_REQUIRE(dy.ndim == 4 && x.ndim == 4 && dw.ndim == 4, "%s: dy, x and dw must be 4-D", op);
    const std::vector<int64_t> v = node.attr_ints("weight_shape");
    PLX_REQUIRE(v.size() == 4, "%s: weight_shape must have 4 values", op);
    const int64_t xs[4] = {x.shape[0], x.shape[1], x.shape[2], x.shape[3]};
    const int64_t ws[4] = {v[0], v[1], v[2], v[3]};
    a_ = direct_args<T>(node, x, dw, dy, xs, ws, op, "dw", "dy");
    if (relu_y) {
      PLX_DECLINE_UNLESS(relu_y->dtype == dtype_v<T> && sdk::same_layout(*relu_y, dy),
                         "relu_backward+%s: relu's y must be laid out as dy, in its dtype", op);
    }
    if (db) {
      PLX_DECLINE_UNLESS(db->ndim == 1 && db->dtype == dtype_v<T> && db->shape[0] == a_.O &&
                             (db->shape[0] <= 1 || db->strides[0] == 1),
                         "%s: the bias gradient must be (O) contiguous, in dy's dtype", op);
    }
    if (unpool.pool) set_unpool(unpool, op);
    a_.Kb = a_.K + (db ? 1 : 0);
    a_.fKb = FastDiv(a_.Kb);
    a_.Kp = a_.Kb | 1;
    const int64_t sums = static_cast<int64_t>(a_.O) * a_.Kb;
    sums_ = sums;
    if (by_image(backend, xs[0])) {
      done_ = BlockCounter(split_sum_counters(static_cast<unsigned>(chunks_)));
      return;
    }
    PLX_DECLINE_UNLESS(sums <= kWgradMaxSums * kBlock,
                       "%s: direct holds at most %d sums (O·C·KH·KW, + O with the bias), got %lld",
                       op, kWgradMaxSums * kBlock, static_cast<long long>(sums));
    sums_per_thread_ = static_cast<int>(ceil_div(sums, kBlock));
    smem_ = wgrad_smem_bytes(kWgradTile, a_.O, a_.K, a_.Kp);
    PLX_DECLINE_UNLESS(smem_ <= kMaxSmem, "%s: direct would need %llu bytes of shared memory", op,
                       static_cast<unsigned long long>(smem_));
    // Chunks: about kWgradBlocksPerSm blocks per SM, each at least 4 tiles, none empty; one
    // with no pixel (N = 0), whose zero partials make dw and db zero. A tile's staging is two
    // dependent rounds of global loads between barriers, so a block is latency-bound: many
    // resident blocks (about 7 KiB of shared memory each) hide it, and split_sum's finish grows
    // with √chunks only. (Two per SM until the twenty-ninth session, when the last block added
    // every chunk's partials alone.)
    a_.tiles = ceil_div(a_.M, kWgradTile);
    const int64_t target = kWgradBlocksPerSm * static_cast<int64_t>(sm_count(backend, device_));
    chunks_ = std::clamp<int64_t>(std::min(target, ceil_div(a_.tiles, 4)), 1, INT_MAX);
    a_.tiles_per_chunk = std::max<int64_t>(ceil_div(a_.tiles, chunks_), 1);
    chunks_ = std::max<int64_t>(ceil_div(a_.tiles, a_.tiles_per_chunk), 1);
    done_ = BlockCounter(split_sum_counters(static_cast<unsigned>(chunks_)));
  }

  // The per-chunk f32 partials.
  uint64_t workspace_bytes() const override {
    return static_cast<uint64_t>(chunks_ * sums_) * sizeof(float);
  }

  void compute(const KernelCall& c) override {
    if (sums_ == 0) return;  // dw and db are empty
    use_device(device_);
    DirectArgs<T> a = a_;
    a.y = static_cast<T*>(const_cast<void*>(c.in(slots_.dy).data));
    a.x = static_cast<const T*>(c.in(slots_.x).data);
    a.relu_y = slots_.relu_y >= 0 ? static_cast<const T*>(c.in(slots_.relu_y).data) : nullptr;
    a.dwt = static_cast<T*>(c.out(slots_.dw).data);
    a.db = slots_.db >= 0 ? static_cast<T*>(c.out(slots_.db).data) : nullptr;
    a.part = static_cast<float*>(c.workspace);
    a.done = done_.p;
    if (slots_.indices >= 0) a.pool_idx = c.in(slots_.indices).data;
    const unsigned grid = static_cast<unsigned>(chunks_);
    const cudaStream_t s = native(c.stream);
    if (by_image_) {
      if (a.K <= 9)
        launch_kernel(direct_image_wgrad_kernel<T, 9, kImageWgradBatch>, grid, kBlock, smem_, s, a);
      else
        launch_kernel(direct_image_wgrad_kernel<T, kMaxTaps, kImageWgradBatch>, grid, kBlock, smem_,
                      s, a);
      return;
    }
    switch (sums_per_thread_) {
      case 1:
        launch_kernel(direct_wgrad_kernel<T, 1>, grid, kBlock, smem_, s, a);
        break;
      case 2:
        launch_kernel(direct_wgrad_kernel<T, 2>, grid, kBlock, smem_, s, a);
        break;
      case 3:
      case 4:
        launch_kernel(direct_wgrad_kernel<T, 4>, grid, kBlock, smem_, s, a);
        break;
      case 5:
      case 6:
      case 7:
      case 8:
        launch_kernel(direct_wgrad_kernel<T, 8>, grid, kBlock, smem_, s, a);
        break;
      default:
        launch_kernel(direct_wgrad_kernel<T, kWgradMaxSums>, grid, kBlock, smem_, s, a);
        break;
    }
  }

 private:
  // Unpooling (direct::unpool_geometry): a conv pixel is in at most one window, and its index
  // alone says whether the pooled gradient comes back to it.
  void set_unpool(const Unpool& u, const char* op) {
    const direct::Unpool2d p =
        direct::unpool_geometry(*u.pool, *u.dy, *u.indices, u.dy->shape[0], a_.O, dtype_v<T>,
                                sdk::format("max_pool2d_backward+%s", op).c_str());
    a_.pool_u8 = p.u8;
    a_.pkh = p.pkh, a_.pkw = p.pkw, a_.PH = p.PH, a_.PW = p.PW;
    a_.y_n = p.dy_n, a_.y_c = p.dy_c, a_.y_p = p.dy_p;
    a_.y_nhwc = p.dy_nhwc;
    a_.i_n = p.i_n, a_.i_c = p.i_c, a_.i_p = p.i_p;
  }

  // The weight gradient image by image (direct_image_wgrad_kernel) where an image of x
  // fits in shared memory (the threads' sums reuse that space) and there is an output pixel;
  // false: the tiled kernel takes it. Blocks: about kImageWgradBlocksPerSm per SM, each a run
  // of images.
  bool by_image(CudaBackend& backend, int64_t N) {
    if (a_.OH < 1 || a_.OW < 1 || a_.O < 1 || !fits_i32(N)) return false;
    const int64_t XH = int64_t{a_.OH - 1} * a_.sh + int64_t{a_.KH - 1} * a_.dh + 1;
    const int64_t XW = int64_t{a_.OW - 1} * a_.sw + int64_t{a_.KW - 1} * a_.dw + 1;
    const int64_t S = kBlock / a_.O;
    const int64_t floats = std::max(a_.C * XH * XW, a_.O * S * a_.Kb);
    if (!fits_i32(floats) || floats * int64_t{sizeof(float)} > static_cast<int64_t>(kMaxSmem))
      return false;
    a_.N = static_cast<int>(N);
    a_.XH = static_cast<int>(XH), a_.XW = static_cast<int>(XW), a_.S = static_cast<int>(S);
    const int khw = a_.KH * a_.KW;
    for (int k = 0; k < a_.K; ++k) {
      const int c = k / khw, r = k - c * khw, kh = r / a_.KW, kw = r - kh * a_.KW;
      a_.tap_off[k] = c * a_.XH * a_.XW + kh * a_.dh * a_.XW + kw * a_.dw;
    }
    a_.fPW = FastDiv(a_.PW);
    a_.fPKW = FastDiv(a_.pkw);
    const int64_t target = kImageWgradBlocksPerSm * static_cast<int64_t>(sm_count(backend, device_));
    a_.ipb = static_cast<int>(std::max<int64_t>(ceil_div(N, target), 1));
    chunks_ = std::max<int64_t>(ceil_div(N, a_.ipb), 1);
    smem_ = static_cast<uint64_t>(floats) * sizeof(float);
    by_image_ = true;
    return true;
  }

  int32_t device_;
  Slots slots_;
  DirectArgs<T> a_{};
  bool by_image_ = false;
  uint64_t smem_ = 0;
  int sums_per_thread_ = 1;
  int64_t chunks_ = 1, sums_ = 0;
  BlockCounter done_;
};

// The first-layer kernel `first()` where it takes the node, else the small convolutions'
// image-by-image one `small()` (ops/direct_small.cu); declines with both reasons.
template <class First, class Small>
std::unique_ptr<Kernel> first_layer_or_small(First first, Small small) {
  try {
    return first();
  } catch (const sdk::Unsupported& a) {
    try {
      return small();
    } catch (const sdk::Unsupported& b) {
      throw sdk::Unsupported(sdk::format("%s; image by image: %s", a.what(), b.what()));
    }
  }
}

// The "direct" conv2d kernel of a node, with the ReLU in its epilogue when `relu`.
template <class T>
std::unique_ptr<Kernel> direct_conv(const NodeInfo& node, CudaBackend& backend, bool relu) {
  return first_layer_or_small(
      [&]() -> std::unique_ptr<Kernel> {
        return std::make_unique<DirectConvKernel<T>>(node, backend, relu);
      },
      [&] { return make_small_conv(node, backend, relu); });
}

template <class T>
class DirectConv2d final : public Kernel {
 public:
  DirectConv2d(const NodeInfo& node, CudaBackend& backend)
      : k_(direct_conv<T>(node, backend, false)) {}
  uint64_t workspace_bytes() const override { return k_->workspace_bytes(); }
  void compute(const KernelCall& c) override { k_->compute(c); }

 private:
  std::unique_ptr<Kernel> k_;
};

template <class T>
void add_dtype(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_CAPTURABLE | PLX_KERNEL_STRIDED | PLX_KERNEL_DETERMINISTIC;
  // Either layout for each tensor, every mix; in 16 bits channels-last preferred, as the other
  // convolutions there, so that the planner keeps the first layer's output NHWC for the next.
  constexpr plx_dtype d = dtype_v<T>;
  const plx_layout l = d == PLX_F32 ? PLX_LAYOUT_NCHW : PLX_LAYOUT_NHWC;
  r.add<DirectConv2d<T>, CudaBackend>("conv2d", d, "direct", f, l);
  r.add<DirectWgradKernel<T>, CudaBackend>("conv2d_backward_weight", d, "direct", f, l);
}

}  // namespace

void register_direct_conv(KernelRegistry& r) {
  add_dtype<float>(r);
  add_dtype<f16>(r);
  add_dtype<bf16>(r);
}

std::unique_ptr<Kernel> make_direct_conv(const NodeInfo& node, CudaBackend& backend, bool relu) {
  switch (node.input(0).dtype) {
    case PLX_F32:
      return direct_conv<float>(node, backend, relu);
    case PLX_F16:
      return direct_conv<f16>(node, backend, relu);
    case PLX_BF16:
      return direct_conv<bf16>(node, backend, relu);
    default:
      break;
  }
  throw sdk::Unsupported(
      sdk::format("conv2d: no direct kernel for %s", plexus::dtype_name(node.input(0).dtype)));
}

std::unique_ptr<Kernel> make_direct_conv_max_pool(CudaBackend& backend, const sdk::GraphView& g,
                                                  const sdk::Boundary& b, const std::string& impl,
                                                  plx_dtype& dtype) {
  const sdk::ConvMaxPoolSlots s = sdk::conv_max_pool_slots(g, b);
  PLX_DECLINE_UNLESS(impl == "direct", "the host gave conv2d to %s, not direct",
                     impl.empty() ? "the default kernel" : impl.c_str());
  dtype = s.dtype;
  return first_layer_or_small(
      [&]() -> std::unique_ptr<Kernel> {
        switch (dtype) {
          case PLX_F32:
            return std::make_unique<DirectConvPoolKernel<float>>(g, s, backend);
          case PLX_F16:
            return std::make_unique<DirectConvPoolKernel<f16>>(g, s, backend);
          case PLX_BF16:
            return std::make_unique<DirectConvPoolKernel<bf16>>(g, s, backend);
          default:
            break;
        }
        throw sdk::Unsupported(
            sdk::format("conv2d+max_pool2d: no direct %s kernel", plexus::dtype_name(dtype)));
      },
      // Not a first layer: the small convolutions' kernel (ops/direct_small.cu).
      [&] { return make_small_conv_max_pool(backend, g, b, dtype); });
}

std::unique_ptr<Kernel> make_direct_pool_wgrad(CudaBackend& backend, const sdk::GraphView& g,
                                               const sdk::Boundary& b, const std::string& impl,
                                               plx_dtype& dtype) {
  const sdk::MaxPoolConvBackwardSlots s = sdk::max_pool_conv_backward_slots(g, b);
  PLX_DECLINE_UNLESS(
      s.weight >= 0 && s.data < 0,
      "max_pool2d_backward+conv2d_backward: direct runs a weight gradient without dx");
  PLX_DECLINE_UNLESS(impl == "direct", "the host gave conv2d_backward_weight to %s, not direct",
                     impl.empty() ? "the default kernel" : impl.c_str());
  WgradSlots sl;
  sl.dy = s.dy;
  sl.x = s.x;
  sl.dw = s.dw;
  sl.db = s.db;
  sl.indices = s.indices;
  const plx_graph_node& pool = g.node(s.pool);
  const sdk::OwnedNodeInfo wgrad_info(g, s.weight), pool_info(g, s.pool);
  const NodeInfo node(&wgrad_info.get()), pool_node(&pool_info.get());
  const Unpool unpool{&g.value(pool.inputs[0]), &g.value(pool.inputs[1]), &pool_node};
  const plx_tensor* db = s.bias >= 0 ? &g.value(g.node(s.bias).outputs[0]) : nullptr;
  dtype = s.dtype;
  switch (dtype) {
    case PLX_F32:
      return std::make_unique<DirectWgradKernel<float>>(node, backend, sl, nullptr, db, nullptr,
                                                        unpool);
    case PLX_F16:
      return std::make_unique<DirectWgradKernel<f16>>(node, backend, sl, nullptr, db, nullptr,
                                                      unpool);
    case PLX_BF16:
      return std::make_unique<DirectWgradKernel<bf16>>(node, backend, sl, nullptr, db, nullptr,
                                                       unpool);
    default:
      break;
  }
  throw sdk::Unsupported(
      sdk::format("max_pool2d_backward+conv2d_backward_weight: no direct %s kernel",
                  plexus::dtype_name(dtype)));
}

std::unique_ptr<Kernel> make_direct_relu_wgrad(CudaBackend& backend, const sdk::GraphView& g,
                                               const sdk::Boundary& b, const std::string& impl,
                                               plx_dtype& dtype) {
  PLX_DECLINE_UNLESS(g.num_nodes() == 3 && g.is(0, "relu_backward"),
                     "not relu_backward with its readers");
  const int32_t w = g.is(1, "conv2d_backward_weight") ? 1 : 2, s = 3 - w;
  PLX_DECLINE_UNLESS(g.is(w, "conv2d_backward_weight") && g.is(s, "sum"),
                     "not relu_backward, sum and conv2d_backward_weight");
  PLX_DECLINE_UNLESS(impl == "direct", "the host gave conv2d_backward_weight to %s, not direct",
                     impl.empty() ? "the default kernel" : impl.c_str());
  const plx_graph_node &r = g.node(0), &wn = g.node(w), &sn = g.node(s);
  const int32_t masked = r.outputs[0];
  PLX_DECLINE_UNLESS(wn.inputs[0] == masked && sn.inputs[0] == masked && b.output(masked) < 0,
                     "relu_backward's output is needed outside the group");
  WgradSlots sl;
  sl.dy = b.input(r.inputs[0]);
  sl.relu_y = b.input(r.inputs[1]);
  sl.x = b.input(wn.inputs[1]);
  sl.dw = b.output(wn.outputs[0]);
  sl.db = b.output(sn.outputs[0]);
  PLX_DECLINE_UNLESS(sl.dy >= 0 && sl.relu_y >= 0 && sl.x >= 0 && sl.dw >= 0 && sl.db >= 0,
                     "relu_backward+sum+conv2d_backward_weight: a tensor is not on the boundary");
  const plx_tensor& dy = g.value(r.inputs[0]);
  const plx_tensor& relu_y = g.value(r.inputs[1]);
  const plx_tensor& db = g.value(sn.outputs[0]);
  const sdk::OwnedNodeInfo info(g, w);
  const NodeInfo node(&info.get());
  dtype = static_cast<plx_dtype>(dy.dtype);
  switch (dtype) {
    case PLX_F32:
      return std::make_unique<DirectWgradKernel<float>>(node, backend, sl, &relu_y, &db, &dy);
    case PLX_F16:
      return std::make_unique<DirectWgradKernel<f16>>(node, backend, sl, &relu_y, &db, &dy);
    case PLX_BF16:
      return std::make_unique<DirectWgradKernel<bf16>>(node, backend, sl, &relu_y, &db, &dy);
    default:
      break;
  }
  throw sdk::Unsupported(sdk::format(
      "relu_backward+sum+conv2d_backward_weight: no direct %s kernel", plexus::dtype_name(dtype)));
}

namespace direct {

int sm_count(CudaBackend& b, int32_t device) {
  return std::max(b.context(device).prop.multiProcessorCount, 1);
}

PoolWindow pool_window(const NodeInfo& pool, const char* op) {
  PoolWindow w;
  w.kernel = pool.attr_ints("kernel");
  w.pad = pool.attr_ints("padding");
  w.dil = pool.attr_ints("dilation");
  w.stride = pool.attr_ints("stride");
  if (w.stride.empty()) w.stride = w.kernel;
  PLX_REQUIRE(w.kernel.size() == 2 && w.stride.size() == 2 && w.pad.size() == 2 &&
                  w.dil.size() == 2,
              "%s: kernel, stride, padding and dilation must have 2 values", op);
  return w;
}

Unpool2d unpool_geometry(const NodeInfo& pool, const plx_tensor& dy, const plx_tensor& ix,
                         int64_t N, int64_t O, plx_dtype dtype, const char* op) {
  const PoolWindow win = pool_window(pool, "max_pool2d_backward");
  const auto &kernel = win.kernel, &stride = win.stride, &pad = win.pad, &dil = win.dil;
  PLX_DECLINE_UNLESS(stride == kernel && pad[0] == 0 && pad[1] == 0 && dil[0] == 1 &&
                         dil[1] == 1 && kernel[0] >= 1 && kernel[1] >= 1 &&
                         fits_i32(kernel[0]) && fits_i32(kernel[1]),
                     "%s: direct unpools windows of stride = kernel, no padding or dilation", op);
  PLX_REQUIRE(dy.ndim == 4 && ix.ndim == 4 && dy.shape[0] == N && ix.shape[0] == N &&
                  dy.shape[1] == O && ix.shape[1] == O && dy.shape[2] == ix.shape[2] &&
                  dy.shape[3] == ix.shape[3],
              "max_pool2d_backward: dy and the indices must be (N, O, PH, PW)");
  PLX_DECLINE_UNLESS(dy.dtype == dtype && (ix.dtype == PLX_I32 || ix.dtype == PLX_U8),
                     "%s: the pooled dy of the conv's dtype, i32 or u8 indices", op);
  PLX_DECLINE_UNLESS(fits_i32(dy.shape[2] * dy.shape[3]), "%s: pooled planes beyond 32 bits", op);
  Unpool2d u;
  u.dy_nhwc = sdk::nhwc_or_decline(dy, op, "the pooled dy");
  const bool ix_nhwc = sdk::nhwc_or_decline(ix, op, "the indices");
  u.u8 = ix.dtype == PLX_U8;
  u.pkh = static_cast<int>(kernel[0]), u.pkw = static_cast<int>(kernel[1]);
  u.PH = static_cast<int>(dy.shape[2]), u.PW = static_cast<int>(dy.shape[3]);
  const int64_t pd[4] = {dy.shape[0], dy.shape[1], dy.shape[2], dy.shape[3]};
  int64_t st[4];
  canonical_strides(pd, u.dy_nhwc, st);
  u.dy_n = st[0], u.dy_c = st[1], u.dy_p = st[3];
  canonical_strides(pd, ix_nhwc, st);
  u.i_n = st[0], u.i_c = st[1], u.i_p = st[3];
  return u;
}

}  // namespace direct

}  // namespace plexus::cuda
