// CUDA kernels: small 3x3 convolutions image by image in shared memory, as candidates ("direct")
// beside cuDNN and the implicit-GEMM tiles for
//
//   conv2d                                where the first-layer kernel (direct_conv.cu) declines
//   conv2d+[relu+]max_pool2d              the conv, its ReLU and a 2x2 stride-2 max pool in one launch
//   conv2d_backward_data                  dx = convᵀ(dy, w)
//   max_pool2d_backward+conv2d_backward   the pool's backward, dx, dw and db in one launch
//
// Why: simplecnn's second layer (16 -> 32 channels, 13x13, batch 128) is tiny: its backward is
// 0.29 GFLOP over 3.5 MB of tensors, its forward half that, yet on the H100 its groups took
// 0.082 ms (the pool's backward, then cuDNN's data and weight gradients) and 0.025 ms (cuDNN's
// conv, then the pool) of the 0.186 ms step (the first GPU run, docs/benchmarks.md): several
// launches, each too small to fill the GPU, a weight gradient whose long reduction (15,488
// pixels) runs on few blocks, the pre-pool tensor and the unpooled gradient written and read back
// between them. Here one image's tensors fit in shared memory, so a block stages them once and
// computes everything the image contributes, on the CUDA cores in f32:
//
// Forward (small_conv_forward_kernel): a block per image, x as C zero-padded planes, the filter as
// [c][tap][o]; a thread computes a 2x2 tile of outputs for CB output channels (per input channel
// a 4x4 patch of x and 9 filter loads feed 36·CB FMAs), adds the bias, rounds once, and either
// stores the tile (through the ReLU when asked) or pools it as the 2x2 window it is.
//
// Data gradient (blocks [w_blocks, w_blocks + d_blocks)): image n's dy, unpooled through the
// pool's indices as it is staged when the pool's backward is fused, sits in shared memory as O
// planes of (H + 2) x (W + 2) f32, zero around the conv's output, so that dx[c, ih, iw] =
// Σ_o Σ_kh,kw dyp[o, ih + 2 - kh, iw + 2 - kw] · w[o, c, kh, kw] needs no bounds test (stride 1:
// oh = ih + ph - kh, stored at row oh + 2 - ph). The filter sits beside it as f32, [o][tap][c],
// so that the CB channels a thread computes for one pixel are one 16-byte load (the same for
// every lane of a warp: a broadcast). Thread i computes channels [g·CB, g·CB + CB) of two pixels
// p and p + ⌈H·W/2⌉ for item i = g·⌈H·W/2⌉ + p (each filter load feeds 2·CB FMAs), summing in
// the order o, kh, kw, and rounds each once into dx.
//
// Weight and bias gradients (blocks [0, w_blocks), each a run of images): dy as O planes of
// OH x OW and x as C planes of (H + 2ph) x (W + 2pw), zero in the padding. Thread u owns the 18
// sums of output channels 2·(u / C) and 2·(u / C) + 1 with input channel u % C over the 9 taps
// (and the two channels' bias sums), and walks the image's output pixels row by row with a 3x3
// window of x in registers: per pixel 3 new x values and 2 dy values feed 18 FMAs. Each block
// writes its f32 partials; split_sum (device.cuh) adds them in the launch and its last block
// rounds once into dw's layout and db.
//
// No atomics on the data, a fixed summation order, launch geometry fixed at creation:
// deterministic. Nothing allocated or synchronised: capturable. Layouts: every tensor NCHW
// contiguous or channels-last, addressed through canonical strides (no staging).
//
// What it takes: 3x3 filters, stride 1, dilation 1, groups 1, padding 0..2; one image's planes
// within the device's shared memory per block; ⌈O/2⌉·C <= 256 (a thread per weight-gradient
// unit). Windows of stride = kernel, without padding or dilation, for the fused pool's backward
// (each conv pixel in at most one window); 2x2 windows of stride 2 for the forward's. Anything
// else declines with the reason, and the other kernels (the chunked groups for the pool) run it.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "device.cuh"
#include "ops/conv_strides.hpp"
#include "ops/direct_conv.hpp"
#include "plexus/sdk/fusion_conv_pool.hpp"

namespace plexus::cuda {

namespace {

constexpr int kTaps = 9;                   // 3x3
constexpr int64_t kDataBlocksPerSm = 8;    // at most, images looping in a block beyond that
constexpr int64_t kWgradBlocksPerSm = 2;   // the weight gradient's runs of images
constexpr int kMaxUnits = kBlock;          // weight-gradient units: a thread each

using direct::ceil_div;
using direct::fits_i32;
using direct::sm_count;

// Declines (naming `op`) a block that needs more shared memory than the device gives one
// (its opt-in maximum); the caller has made `device` current.
void decline_over_optin(CudaBackend& backend, int32_t device, uint64_t smem, const char* op) {
  const DeviceContext& ctx = backend.context(device);
  PLX_DECLINE_UNLESS(smem <= ctx.prop.sharedMemPerBlockOptin,
                     "%s: direct image by image would need %llu bytes of shared memory per "
                     "block, over the device's %llu",
                     op, static_cast<unsigned long long>(smem),
                     static_cast<unsigned long long>(ctx.prop.sharedMemPerBlockOptin));
}
// Lets `kernel` launch with `smem` bytes of dynamic shared memory (the opt-in, above 48 KiB).
// The need depends on the image, so the function's limit only grows (allow_dynamic_smem): a
// smaller layer's kernel object created later must not lower an earlier, larger one's.
template <class K>
void allow_smem(K* kernel, uint64_t smem) {
  if (smem > 48 * 1024) allow_dynamic_smem(kernel, static_cast<int>(smem));
}

template <class T>
struct SmallBwdArgs {
  const T* dy;           // the conv's gradient (N, O, OH, OW), or the pooled one (N, O, PH, PW)
  const void* pool_idx;  // the pool's indices (N, O, PH, PW), or null: dy is the conv's gradient
  const T* w;            // (O, C, 3, 3): the data gradient's filter
  const T* x;            // (N, C, H, W): the weight gradient's input
  T* dx;                 // (N, C, H, W)
  T* dwt;                // (O, C, 3, 3)
  T* db;                 // (O) or null
  float* part;           // (w_blocks, sums) f32 partials
  unsigned* done;        // split_sum's counters
  int N, C, H, W, O, OH, OW, ph, pw;
  // Unpooling: u8 window taps or i32 positions oh·OW + ow; windows pkh x pkw of stride = kernel.
  bool pool_u8;
  int pkh, pkw, PH, PW;
  int64_t i_n, i_c, i_p;  // the indices' element (n, o, p) at n·i_n + o·i_c + p·i_p
  int64_t dy_n, dy_c, dy_p;  // dy's element (n, o, p), p the pixel in its own plane
  bool dy_nhwc;
  int64_t x_n, x_c, x_h, x_w;
  bool x_nhwc;
  int64_t w_o, w_c, w_h, w_w;     // w, read by the data gradient
  int64_t dw_o, dw_c, dw_h, dw_w;  // dw, written by the weight gradient
  int64_t dx_n, dx_c, dx_h, dx_w;
  int w_blocks, d_blocks;  // the grid: weight-gradient blocks first, then data-gradient blocks
  int w_images;            // images per weight-gradient block (the last may have fewer, or none)
  int units;               // ⌈O/2⌉·C weight-gradient units
  int sums;                // O·C·9, + O with db
  // Shared planes (f32): the data gradient's dy planes, (H + 2) x (W + 2), `dplane` apart; the
  // weight gradient's dy planes, OH x OW, `yplane` apart, and x planes, XH x XW, `xplane`
  // apart. Odd strides: lanes on different planes hit different banks.
  int WP, dplane, yplane, XH, XW, xplane;
  int64_t wsm_offset;  // floats from the data gradient's dy planes to its filter (16-byte aligned)
};

// dy of image n into O planes `stride` floats apart, rows `row` floats apart: element (o, oh, ow)
// at o·stride + (oh + r0)·row + ow + c0. The planes were zeroed (and a barrier passed): only
// pixels with a gradient are written. With the pool fused, each window's gradient goes to the
// pixel its index names (u8: the tap in the window; i32: the position in the plane); an index
// naming none (the ReLU's mask: 255 or -1) writes nothing.
template <class T>
__device__ __forceinline__ void stage_dy(const SmallBwdArgs<T>& a, int n, float* planes,
                                         int stride, int row, int r0, int c0) {
  if (!a.pool_idx) {
    const int plane = a.OH * a.OW, total = a.O * plane;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
      int o, p;  // in dy's memory order
      if (a.dy_nhwc) p = e / a.O, o = e - p * a.O;
      else o = e / plane, p = e - o * plane;
      const int oh = p / a.OW, ow = p - oh * a.OW;
      planes[o * stride + (oh + r0) * row + ow + c0] =
          load(a.dy, n * a.dy_n + o * a.dy_c + p * a.dy_p);
    }
    return;
  }
  const int plane = a.PH * a.PW, total = a.O * plane;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    int o, p;
    if (a.dy_nhwc) p = e / a.O, o = e - p * a.O;
    else o = e / plane, p = e - o * plane;
    const int64_t at = n * a.i_n + o * a.i_c + p * a.i_p;
    int oh, ow;
    if (a.pool_u8) {
      const int tap = static_cast<const uint8_t*>(a.pool_idx)[at];
      if (tap >= a.pkh * a.pkw) continue;  // none (255)
      const int wh = p / a.PW, ww = p - wh * a.PW, th = tap / a.pkw;
      oh = wh * a.pkh + th;
      ow = ww * a.pkw + (tap - th * a.pkw);
    } else {
      const int32_t pos = static_cast<const int32_t*>(a.pool_idx)[at];
      if (pos < 0) continue;  // none
      oh = pos / a.OW;
      ow = pos - oh * a.OW;
    }
    if (oh >= a.OH || ow >= a.OW) continue;
    planes[o * stride + (oh + r0) * row + ow + c0] = load(a.dy, n * a.dy_n + o * a.dy_c + p * a.dy_p);
  }
}

__device__ __forceinline__ void zero(float* p, int count) {
  for (int e = threadIdx.x; e < count; e += blockDim.x) p[e] = 0.f;
}

// Image n's x into C planes `xplane` floats apart, rows XW apart, at (ih + ph, iw + pw): the
// planes were zeroed (and a barrier passed), so the padding stays 0. (A: either kernel's args.)
template <class A>
__device__ __forceinline__ void stage_x(const A& a, int n, float* xs) {
  const int total = a.C * a.H * a.W, HW = a.H * a.W;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    int c, p;  // in x's memory order
    if (a.x_nhwc) p = e / a.C, c = e - p * a.C;
    else c = e / HW, p = e - c * HW;
    const int ih = p / a.W, iw = p - ih * a.W;
    xs[c * a.xplane + (ih + a.ph) * a.XW + iw + a.pw] =
        load(a.x, n * a.x_n + c * a.x_c + ih * a.x_h + iw * a.x_w);
  }
}

// The filter w (O, C, 3, 3) as f32 into wsm, [o][tap][c] (`c_inner`: the data gradient's) or
// [c][tap][o] (the forward's).
template <class A>
__device__ __forceinline__ void stage_filter(const A& a, float* wsm, bool c_inner) {
  const int inner = c_inner ? a.C : a.O, total = a.O * a.C * kTaps;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    const int rt = e / inner, i = e - rt * inner, r = rt / kTaps, t = rt - r * kTaps;
    const int o = c_inner ? r : i, c = c_inner ? i : r, kh = t / 3, kw = t - kh * 3;
    wsm[e] = load(a.w, o * a.w_o + c * a.w_c + kh * a.w_h + kw * a.w_w);
  }
}

// ---- data gradient: image n's dx, channels in groups of CB ----
template <class T, int CB>
__device__ __forceinline__ void data_gradient(const SmallBwdArgs<T>& a, float* dyp,
                                              const float* wsm) {
  // Item i: channels [g·CB, g·CB + CB) of pixels p and p + half (the second may be past the
  // plane: computed, not stored), so that each filter load feeds 2·CB FMAs.
  const int HW = a.H * a.W, half = (HW + 1) / 2, items = (a.C / CB) * half;
  for (int n = blockIdx.x - a.w_blocks; n < a.N; n += a.d_blocks) {  // uniform over the block
    __syncthreads();  // the previous image's readers are done
    zero(dyp, a.O * a.dplane);
    __syncthreads();
    stage_dy(a, n, dyp, a.dplane, a.WP, 2 - a.ph, 2 - a.pw);
    __syncthreads();
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
      const int g = it / half, p0 = it - g * half, p1 = p0 + half;
      const bool second = p1 < HW;
      const int ih0 = p0 / a.W, iw0 = p0 - ih0 * a.W;
      const int ih1 = second ? p1 / a.W : ih0, iw1 = second ? p1 - ih1 * a.W : iw0;
      float acc0[CB], acc1[CB];
#pragma unroll
      for (int j = 0; j < CB; ++j) acc0[j] = acc1[j] = 0.f;
      // d[(2 - kh)·WP + 2 - kw]: dy at (ih + ph - kh, iw + pw - kw), zero outside the plane.
      const float* d0 = dyp + ih0 * a.WP + iw0;
      const float* d1 = dyp + ih1 * a.WP + iw1;
      const float* wr = wsm + g * CB;  // wr[tap·C + j]: w[o, g·CB + j, tap]
      for (int o = 0; o < a.O; ++o, d0 += a.dplane, d1 += a.dplane, wr += kTaps * a.C) {
#pragma unroll
        for (int kh = 0; kh < 3; ++kh)
#pragma unroll
          for (int kw = 0; kw < 3; ++kw) {
            const float v0 = d0[(2 - kh) * a.WP + 2 - kw];
            const float v1 = d1[(2 - kh) * a.WP + 2 - kw];
            const float* wt = wr + (kh * 3 + kw) * a.C;
            if constexpr (CB % 4 == 0) {
#pragma unroll
              for (int j = 0; j < CB; j += 4) {
                const float4 q = *reinterpret_cast<const float4*>(wt + j);
                acc0[j] = fmaf(v0, q.x, acc0[j]);
                acc0[j + 1] = fmaf(v0, q.y, acc0[j + 1]);
                acc0[j + 2] = fmaf(v0, q.z, acc0[j + 2]);
                acc0[j + 3] = fmaf(v0, q.w, acc0[j + 3]);
                acc1[j] = fmaf(v1, q.x, acc1[j]);
                acc1[j + 1] = fmaf(v1, q.y, acc1[j + 1]);
                acc1[j + 2] = fmaf(v1, q.z, acc1[j + 2]);
                acc1[j + 3] = fmaf(v1, q.w, acc1[j + 3]);
              }
            } else {
#pragma unroll
              for (int j = 0; j < CB; ++j) {
                const float q = wt[j];
                acc0[j] = fmaf(v0, q, acc0[j]);
                acc1[j] = fmaf(v1, q, acc1[j]);
              }
            }
          }
      }
      const int64_t base0 = n * a.dx_n + ih0 * a.dx_h + iw0 * a.dx_w;
      const int64_t base1 = n * a.dx_n + ih1 * a.dx_h + iw1 * a.dx_w;
#pragma unroll
      for (int j = 0; j < CB; ++j) {
        store(a.dx, base0 + (g * CB + j) * a.dx_c, acc0[j]);
        if (second) store(a.dx, base1 + (g * CB + j) * a.dx_c, acc1[j]);
      }
    }
  }
}

// ---- weight and bias gradients: this block's run of images, then the launch's sum ----
template <class T>
__device__ __forceinline__ void weight_gradient(const SmallBwdArgs<T>& a, float* dys, float* xs) {
  const int wb = blockIdx.x;
  const int u = threadIdx.x;
  const bool mine = u < a.units;
  const int og = mine ? u / a.C : 0, c = mine ? u - og * a.C : 0;
  const int o0 = 2 * og;
  const bool two = o0 + 1 < a.O;
  float acc0[kTaps], acc1[kTaps], db0 = 0.f, db1 = 0.f;
#pragma unroll
  for (int t = 0; t < kTaps; ++t) acc0[t] = acc1[t] = 0.f;
  const int first = min(a.N, wb * a.w_images), last = min(a.N, first + a.w_images);
  for (int n = first; n < last; ++n) {
    __syncthreads();  // the previous image's readers are done
    zero(xs, a.C * a.xplane);
    if (a.pool_idx) zero(dys, a.O * a.yplane);  // unpooling writes only the windows' winners
    __syncthreads();
    stage_dy(a, n, dys, a.yplane, a.OW, 0, 0);
    stage_x(a, n, xs);
    __syncthreads();
    if (mine) {
      const float* y0 = dys + o0 * a.yplane;
      const float* y1 = two ? y0 + a.yplane : y0;
      const float* xc = xs + c * a.xplane;
      for (int oh = 0; oh < a.OH; ++oh) {
        const float* xr = xc + oh * a.XW;
        float win[3][3];
#pragma unroll
        for (int kh = 0; kh < 3; ++kh) {
          win[kh][0] = xr[kh * a.XW];
          win[kh][1] = xr[kh * a.XW + 1];
        }
        const float* d0 = y0 + oh * a.OW;
        const float* d1 = y1 + oh * a.OW;
        for (int ow = 0; ow < a.OW; ++ow) {
#pragma unroll
          for (int kh = 0; kh < 3; ++kh) win[kh][2] = xr[kh * a.XW + ow + 2];
          const float v0 = d0[ow], v1 = two ? d1[ow] : 0.f;
#pragma unroll
          for (int kh = 0; kh < 3; ++kh)
#pragma unroll
            for (int kw = 0; kw < 3; ++kw) {
              acc0[kh * 3 + kw] = fmaf(v0, win[kh][kw], acc0[kh * 3 + kw]);
              acc1[kh * 3 + kw] = fmaf(v1, win[kh][kw], acc1[kh * 3 + kw]);
            }
          db0 += v0;
          db1 += v1;
#pragma unroll
          for (int kh = 0; kh < 3; ++kh) {
            win[kh][0] = win[kh][1];
            win[kh][1] = win[kh][2];
          }
        }
      }
    }
  }
  // Partials: element (o, c, tap) at (o·C + c)·9 + tap, db[o] at O·C·9 + o.
  float* part = a.part + static_cast<int64_t>(wb) * a.sums;
  if (mine) {
#pragma unroll
    for (int t = 0; t < kTaps; ++t) part[(o0 * a.C + c) * kTaps + t] = acc0[t];
    if (two)
#pragma unroll
      for (int t = 0; t < kTaps; ++t) part[((o0 + 1) * a.C + c) * kTaps + t] = acc1[t];
    if (a.db && c == 0) {
      part[a.O * a.C * kTaps + o0] = db0;
      if (two) part[a.O * a.C * kTaps + o0 + 1] = db1;
    }
  }
  const int wsums = a.O * a.C * kTaps;
  split_sum(
      a.done, a.part, a.sums, static_cast<unsigned>(a.w_blocks), static_cast<unsigned>(wb), a.sums,
      [](int e) { return int64_t{e}; },
      [&](int e, int64_t, float s) {
        if (e >= wsums) {
          store(a.db, e - wsums, s);
          return;
        }
        const int oc = e / kTaps, t = e - oc * kTaps, o = oc / a.C, ci = oc - o * a.C;
        const int kh = t / 3, kw = t - kh * 3;
        store(a.dwt, o * a.dw_o + ci * a.dw_c + kh * a.dw_h + kw * a.dw_w, s);
      });
}

template <class T, int CB>
__global__ void __launch_bounds__(kBlock) small_conv_backward_kernel(const SmallBwdArgs<T> a) {
  pdl_begin();
  extern __shared__ __align__(16) float small_bwd_smem[];
  if (static_cast<int>(blockIdx.x) < a.w_blocks) {  // uniform over the block
    weight_gradient(a, small_bwd_smem, small_bwd_smem + static_cast<int64_t>(a.O) * a.yplane);
    return;
  }
  float* dyp = small_bwd_smem;
  float* wsm = small_bwd_smem + a.wsm_offset;
  stage_filter(a, wsm, /*c_inner=*/true);  // once per block
  data_gradient<T, CB>(a, dyp, wsm);
}

// ---- forward: image n's conv outputs in 2x2 tiles, optionally through the 2x2 max pool ----
//
// Item i: output channels [g·CB, g·CB + CB) of the 2x2 tile (tr, tc) of conv outputs
// (2·tr + dy, 2·tc + dx). Per input channel the tile's 4x4 patch of x feeds the 9 taps of its 4
// outputs: 16 shared loads and 9 filter loads (CB channels each, one address across a warp) for
// 36·CB FMAs. Each output is Σ_c Σ_kh,kw in that order, then the bias, rounded once to T (what y,
// or the pre-pool tensor, holds). Pooling (windows 2x2 of stride 2, no padding: tile = window)
// runs as direct_conv_pool_kernel does: the ReLU before the pool unless the pool has relu_mask,
// the first maximum in window order (NaN wins), with relu_mask the ReLU on the maximum and no
// index where y is not > 0; taps past the conv's output (ceil mode) are no candidates.
struct NoIndex {};

template <class T>
struct SmallFwdArgs {
  const T* x;     // (N, C, H, W)
  const T* w;     // (O, C, 3, 3)
  const T* bias;  // (O) or null
  T* y;           // (N, O, OH, OW), or pooled (N, O, PH, PW)
  void* idx;      // the pool's indices (N, O, PH, PW), u8 taps or i32 positions
  int N, C, H, W, O, OH, OW, ph, pw;
  int64_t x_n, x_c, x_h, x_w;
  bool x_nhwc;
  int64_t w_o, w_c, w_h, w_w;
  int64_t y_n, y_c, y_h, y_w;  // y's (or the pooled y's) element strides
  int64_t i_n, i_c, i_h, i_w;  // the indices'
  int TH, TW;                  // tiles per image (the pooled extents when pooling)
  int XH, XW, xplane;          // x planes in shared memory, zero outside the image
  int64_t wsm_offset;          // floats from the x planes to the filter ([c][tap][o]) and bias
  bool relu;                   // plain: y = relu(conv + b); pooling: the ReLU before the pool
  bool relu_after, relu_mask;  // pooling: the ReLU on the maximum; indices none where y <= 0
};

__device__ __forceinline__ bool beats_small(float v, float best) {
  return v > best || (v != v && best == best);  // larger, or the first NaN
}
__device__ __forceinline__ void put_index(void* idx, int64_t at, int32_t pos, int tap, bool none,
                                          uint8_t*) {
  static_cast<uint8_t*>(idx)[at] = none ? uint8_t{255} : static_cast<uint8_t>(tap);
}
__device__ __forceinline__ void put_index(void* idx, int64_t at, int32_t pos, int, bool none,
                                          int32_t*) {
  static_cast<int32_t*>(idx)[at] = none ? -1 : pos;
}

template <class T, int CB, class Ix>
__global__ void __launch_bounds__(kBlock) small_conv_forward_kernel(const SmallFwdArgs<T> a) {
  pdl_begin();
  extern __shared__ __align__(16) float small_fwd_smem[];
  constexpr bool kPool = !std::is_same_v<Ix, NoIndex>;
  float* xs = small_fwd_smem;
  float* wsm = small_fwd_smem + a.wsm_offset;
  float* bsm = wsm + static_cast<int64_t>(a.C) * kTaps * a.O;
  stage_filter(a, wsm, /*c_inner=*/false);
  for (int o = threadIdx.x; o < a.O; o += blockDim.x) bsm[o] = a.bias ? load(a.bias, o) : 0.f;
  const int tiles = a.TH * a.TW, items = (a.O / CB) * tiles;
  for (int n = blockIdx.x; n < a.N; n += gridDim.x) {  // uniform over the block
    __syncthreads();  // the filter is in, and the previous image's readers are done
    zero(xs, a.C * a.xplane);
    __syncthreads();
    stage_x(a, n, xs);
    __syncthreads();
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
      const int g = it / tiles, t = it - g * tiles, tr = t / a.TW, tc = t - tr * a.TW;
      const int oh0 = 2 * tr, ow0 = 2 * tc;
      float acc[4][CB];
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int j = 0; j < CB; ++j) acc[q][j] = 0.f;
      const float* xp = xs + oh0 * a.XW + ow0;
      const float* wc = wsm + g * CB;
      for (int c = 0; c < a.C; ++c, xp += a.xplane, wc += kTaps * a.O) {
        float p[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int s = 0; s < 4; ++s) p[r][s] = xp[r * a.XW + s];
#pragma unroll
        for (int kh = 0; kh < 3; ++kh)
#pragma unroll
          for (int kw = 0; kw < 3; ++kw) {
            float wv[CB];
            const float* wt = wc + (kh * 3 + kw) * a.O;
            if constexpr (CB == 4) {
              const float4 q = *reinterpret_cast<const float4*>(wt);
              wv[0] = q.x, wv[1] = q.y, wv[2] = q.z, wv[3] = q.w;
            } else {
#pragma unroll
              for (int j = 0; j < CB; ++j) wv[j] = wt[j];
            }
#pragma unroll
            for (int dy = 0; dy < 2; ++dy)
#pragma unroll
              for (int dx = 0; dx < 2; ++dx)
#pragma unroll
                for (int j = 0; j < CB; ++j)
                  acc[dy * 2 + dx][j] = fmaf(p[dy + kh][dx + kw], wv[j], acc[dy * 2 + dx][j]);
          }
      }
#pragma unroll
      for (int j = 0; j < CB; ++j) {
        const int o = g * CB + j;
        float v[4];
        bool in[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int oh = oh0 + q / 2, ow = ow0 + q % 2;
          in[q] = oh < a.OH && ow < a.OW;
          v[q] = to_accum<T>(from_accum<T>(acc[q][j] + bsm[o]));  // what y holds
        }
        if constexpr (!kPool) {
#pragma unroll
          for (int q = 0; q < 4; ++q)
            if (in[q]) {
              const float out = a.relu ? (v[q] > 0.f ? v[q] : 0.f) : v[q];
              store(a.y, n * a.y_n + o * a.y_c + (oh0 + q / 2) * a.y_h + (ow0 + q % 2) * a.y_w,
                    out);
            }
        } else {
          float best = -INFINITY;
          int tap = -1;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (!in[q]) continue;
            const float u = a.relu ? (v[q] > 0.f ? v[q] : 0.f) : v[q];
            if (tap < 0 || beats_small(u, best)) best = u, tap = q;
          }
          const float out =
              to_accum<T>(from_accum<T>(a.relu_after && !(best > 0.f) ? 0.f : best));
          store(a.y, n * a.y_n + o * a.y_c + tr * a.y_h + tc * a.y_w, out);
          const int32_t pos = (oh0 + tap / 2) * a.OW + ow0 + tap % 2;
          put_index(a.idx, n * a.i_n + o * a.i_c + tr * a.i_h + tc * a.i_w, pos, tap,
                    tap < 0 || (a.relu_mask && !(out > 0.f)), static_cast<Ix*>(nullptr));
        }
      }
    }
  }
}

// ---- the kernel objects ----

// The pool's backward fused before the convolution's: its node and the pooled gradient and
// indices (as the group's boundary gives them).
struct SmallUnpool {
  const NodeInfo* pool = nullptr;
  const plx_tensor* dy = nullptr;       // (N, O, PH, PW)
  const plx_tensor* indices = nullptr;  // (N, O, PH, PW), u8 or i32
};

// Where the call's tensors are (-1: absent).
struct SmallBwdSlots {
  int32_t dy = 0, indices = -1, w = 1, x = -1;
  int32_t dx = 0, dw = -1, db = -1;
};

template <class T>
class SmallConvBackwardKernel final : public Kernel {
 public:
  // `conv`: a node of the convolution (conv2d_backward_data, or the weight gradient) for its
  // attributes; `xs`: x's shape (N, C, H, W); `ws`: w's; `dx`, `w`, `x`, `dw`, `db`: descriptors
  // of the tensors the launch reads and writes (null: absent; dx and w together, x and dw
  // together); `dy`: the conv's gradient, or the pooled one with `unpool`.
  SmallConvBackwardKernel(const NodeInfo& conv, CudaBackend& backend, const int64_t (&xs)[4],
                          const int64_t (&ws)[4], const plx_tensor* dy, const plx_tensor* dx,
                          const plx_tensor* w, const plx_tensor* x, const plx_tensor* dw,
                          const plx_tensor* db, const SmallUnpool& unpool, SmallBwdSlots slots,
                          const char* op)
      : device_(conv.device()), slots_(slots) {
    const sdk::Conv2dParams g(xs, ws, conv);
    PLX_DECLINE_UNLESS(g.groups == 1, "%s: direct handles groups = 1 only", op);
    PLX_DECLINE_UNLESS(g.KH == 3 && g.KW == 3, "%s: direct's backward takes 3x3 filters, not %lldx%lld",
                       op, static_cast<long long>(g.KH), static_cast<long long>(g.KW));
    PLX_DECLINE_UNLESS(g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1,
                       "%s: direct's backward takes stride 1 and dilation 1", op);
    PLX_DECLINE_UNLESS(g.ph <= 2 && g.pw <= 2, "%s: direct's backward takes padding 0 to 2", op);
    for (const plx_tensor* t : {dy, dx, w, x, dw, db})
      if (t) PLX_DECLINE_UNLESS(t->dtype == dtype_v<T>, "%s: direct takes one dtype, %s", op,
                                plexus::dtype_name(dtype_v<T>));
    PLX_DECLINE_UNLESS(fits_i32(g.N) && fits_i32(g.O * g.C * kTaps + g.O) &&
                           fits_i32(g.C * (g.H + 4) * (g.W + 4)) &&
                           fits_i32(g.O * (g.H + 4) * (g.W + 4)),
                       "%s: sizes beyond direct's 32-bit index math", op);
    SmallBwdArgs<T> a{};
    a.N = static_cast<int>(g.N), a.C = static_cast<int>(g.C), a.H = static_cast<int>(g.H);
    a.W = static_cast<int>(g.W), a.O = static_cast<int>(g.O);
    a.OH = static_cast<int>(g.OH), a.OW = static_cast<int>(g.OW);
    a.ph = static_cast<int>(g.ph), a.pw = static_cast<int>(g.pw);
    const int64_t ys[4] = {g.N, g.O, g.OH, g.OW};
    using sdk::nhwc_or_decline;
    int64_t s[4];
    if (unpool.pool) {
      set_unpool(a, unpool, op);
    } else {
      PLX_REQUIRE(dy->ndim == 4, "%s: dy must be 4-D", op);
      for (int i = 0; i < 4; ++i)
        PLX_REQUIRE(dy->shape[i] == ys[i], "%s: dy's shape does not match the convolution", op);
      a.dy_nhwc = nhwc_or_decline(*dy, op, "dy");
      canonical_strides(ys, a.dy_nhwc, s);
      a.dy_n = s[0], a.dy_c = s[1], a.dy_p = s[3];
    }
    with_dx_ = dx != nullptr;
    with_dw_ = dw != nullptr;
    PLX_REQUIRE(with_dx_ || with_dw_, "%s: nothing to compute", op);
    PLX_DECLINE_UNLESS(with_dw_ || !db, "%s: direct sums the bias beside the weight gradient", op);
    if (with_dx_) {
      for (int i = 0; i < 4; ++i)
        PLX_REQUIRE(dx->shape[i] == xs[i] && w->shape[i] == ws[i],
                    "%s: dx's or w's shape does not match the convolution", op);
      canonical_strides(xs, nhwc_or_decline(*dx, op, "dx"), s);
      a.dx_n = s[0], a.dx_c = s[1], a.dx_h = s[2], a.dx_w = s[3];
      canonical_strides(ws, nhwc_or_decline(*w, op, "w"), s);
      a.w_o = s[0], a.w_c = s[1], a.w_h = s[2], a.w_w = s[3];
    }
    if (with_dw_) {
      for (int i = 0; i < 4; ++i)
        PLX_REQUIRE(x->shape[i] == xs[i] && dw->shape[i] == ws[i],
                    "%s: x's or dw's shape does not match the convolution", op);
      a.x_nhwc = nhwc_or_decline(*x, op, "x");
      canonical_strides(xs, a.x_nhwc, s);
      a.x_n = s[0], a.x_c = s[1], a.x_h = s[2], a.x_w = s[3];
      canonical_strides(ws, nhwc_or_decline(*dw, op, "dw"), s);
      a.dw_o = s[0], a.dw_c = s[1], a.dw_h = s[2], a.dw_w = s[3];
      if (db)
        PLX_DECLINE_UNLESS(db->ndim == 1 && db->shape[0] == g.O &&
                               (db->shape[0] <= 1 || db->strides[0] == 1),
                           "%s: the bias gradient must be (O) contiguous", op);
      a.units = static_cast<int>(ceil_div(g.O, 2) * g.C);
      PLX_DECLINE_UNLESS(a.units <= kMaxUnits,
                         "%s: direct's weight gradient holds at most %d units (⌈O/2⌉·C), got %d",
                         op, kMaxUnits, a.units);
      a.sums = a.O * a.C * kTaps + (db ? a.O : 0);
    }
    // Shared memory: the larger of the two roles' planes.
    a.WP = a.W + 2;
    a.dplane = ((a.H + 2) * a.WP) | 1;
    a.yplane = (a.OH * a.OW) | 1;
    a.XH = a.H + 2 * a.ph, a.XW = a.W + 2 * a.pw;
    a.xplane = (a.XH * a.XW) | 1;
    a.wsm_offset = (static_cast<int64_t>(a.O) * a.dplane + 3) / 4 * 4;
    uint64_t smem = 0;
    if (with_dx_)
      smem = static_cast<uint64_t>(a.wsm_offset + static_cast<int64_t>(a.O) * a.C * kTaps) *
             sizeof(float);
    if (with_dw_)
      smem = std::max<uint64_t>(
          smem, static_cast<uint64_t>(static_cast<int64_t>(a.O) * a.yplane +
                                      static_cast<int64_t>(a.C) * a.xplane) *
                    sizeof(float));
    smem_ = smem;
    use_device(device_);
    decline_over_optin(backend, device_, smem_, op);
    cb_ = a.C % 8 == 0 ? 8 : a.C % 4 == 0 ? 4 : a.C % 2 == 0 ? 2 : 1;
    for_kernel([&]<int CB>() { allow_smem(small_conv_backward_kernel<T, CB>, smem_); });
    const int64_t sms = sm_count(backend, device_);
    a.d_blocks = with_dx_ ? static_cast<int>(std::min<int64_t>(g.N, kDataBlocksPerSm * sms)) : 0;
    a.w_blocks = with_dw_ ? static_cast<int>(std::clamp<int64_t>(
                                std::min<int64_t>(g.N, kWgradBlocksPerSm * sms), 1, INT_MAX))
                          : 0;
    a.w_images = with_dw_ ? static_cast<int>(ceil_div(g.N, a.w_blocks)) : 0;
    if (with_dw_) done_ = BlockCounter(split_sum_counters(static_cast<unsigned>(a.w_blocks)));
    a_ = a;
  }

  // The weight gradient's per-block f32 partials.
  uint64_t workspace_bytes() const override {
    return with_dw_ ? static_cast<uint64_t>(a_.w_blocks) * static_cast<uint64_t>(a_.sums) *
                          sizeof(float)
                    : 0;
  }

  void compute(const KernelCall& c) override {
    const unsigned grid = static_cast<unsigned>(a_.w_blocks + a_.d_blocks);
    if (grid == 0) return;  // dx alone, of an empty batch
    use_device(device_);
    SmallBwdArgs<T> a = a_;
    a.dy = static_cast<const T*>(c.in(slots_.dy).data);
    if (slots_.indices >= 0) a.pool_idx = c.in(slots_.indices).data;
    if (with_dx_) {
      a.w = static_cast<const T*>(c.in(slots_.w).data);
      a.dx = static_cast<T*>(c.out(slots_.dx).data);
    }
    if (with_dw_) {
      a.x = static_cast<const T*>(c.in(slots_.x).data);
      a.dwt = static_cast<T*>(c.out(slots_.dw).data);
      a.db = slots_.db >= 0 ? static_cast<T*>(c.out(slots_.db).data) : nullptr;
      a.part = static_cast<float*>(c.workspace);
      a.done = done_.p;
    }
    const cudaStream_t s = native(c.stream);
    for_kernel([&]<int CB>() {
      launch_kernel(small_conv_backward_kernel<T, CB>, grid, kBlock, smem_, s, a);
    });
  }

 private:
  // Unpooling (direct::unpool_geometry); u8 taps decode below 255, which names none.
  void set_unpool(SmallBwdArgs<T>& a, const SmallUnpool& u, const char* op) {
    const direct::Unpool2d p =
        direct::unpool_geometry(*u.pool, *u.dy, *u.indices, a.N, a.O, dtype_v<T>, op);
    PLX_DECLINE_UNLESS(p.pkh * p.pkw < 255, "%s: direct unpools windows of fewer than 255 taps",
                       op);
    a.pool_u8 = p.u8;
    a.pkh = p.pkh, a.pkw = p.pkw, a.PH = p.PH, a.PW = p.PW;
    a.dy_nhwc = p.dy_nhwc;
    a.dy_n = p.dy_n, a.dy_c = p.dy_c, a.dy_p = p.dy_p;
    a.i_n = p.i_n, a.i_c = p.i_c, a.i_p = p.i_p;
  }

  // f.template operator()<CB>(): the kernel this object launches, by its channels a thread.
  template <class F>
  void for_kernel(F&& f) const {
    switch (cb_) {
      case 8: f.template operator()<8>(); break;
      case 4: f.template operator()<4>(); break;
      case 2: f.template operator()<2>(); break;
      default: f.template operator()<1>(); break;
    }
  }

  int32_t device_;
  SmallBwdSlots slots_;
  SmallBwdArgs<T> a_{};
  bool with_dx_ = false, with_dw_ = false;
  uint64_t smem_ = 0;
  int cb_ = 1;
  BlockCounter done_;
};

// Where the call's tensors are (-1: absent).
struct SmallFwdSlots {
  int32_t x = 0, w = 1, b = 2, y = 0, idx = -1;
};

template <class T>
class SmallConvForwardKernel final : public Kernel {
 public:
  // `conv`: the conv2d node (x, w, [b] -> y), for its tensors' shapes and attributes; `relu`: a
  // ReLU after the conv (before the pool, or on its maximum with relu_mask); `pool`: the max
  // pool after it (null: y is the conv's output), with its output `py` and indices `pidx`.
  SmallConvForwardKernel(const NodeInfo& conv, CudaBackend& backend, bool relu,
                         const NodeInfo* pool, const plx_tensor* py, const plx_tensor* pidx,
                         SmallFwdSlots slots, bool has_bias)
      : device_(conv.device()), slots_(slots) {
    const char* op = pool ? "conv2d+max_pool2d" : "conv2d";
    const plx_tensor &x = conv.input(0), &w = conv.input(1), &y = conv.output(0);
    PLX_REQUIRE(x.ndim == 4 && w.ndim == 4 && y.ndim == 4, "%s: x, w and y must be 4-D", op);
    const int64_t xs[4] = {x.shape[0], x.shape[1], x.shape[2], x.shape[3]};
    const int64_t ws[4] = {w.shape[0], w.shape[1], w.shape[2], w.shape[3]};
    const sdk::Conv2dParams g(xs, ws, conv);
    for (const plx_tensor* t : {&x, &w, &y})
      PLX_DECLINE_UNLESS(t->dtype == dtype_v<T>, "%s: direct takes one dtype, %s", op,
                         plexus::dtype_name(dtype_v<T>));
    PLX_DECLINE_UNLESS(g.groups == 1, "%s: direct handles groups = 1 only", op);
    PLX_DECLINE_UNLESS(g.KH == 3 && g.KW == 3,
                       "%s: direct image by image takes 3x3 filters, not %lldx%lld", op,
                       static_cast<long long>(g.KH), static_cast<long long>(g.KW));
    PLX_DECLINE_UNLESS(g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1,
                       "%s: direct image by image takes stride 1 and dilation 1", op);
    PLX_DECLINE_UNLESS(g.ph <= 2 && g.pw <= 2, "%s: direct image by image takes padding 0 to 2",
                       op);
    if (has_bias) {
      const plx_tensor& b = conv.input(2);
      PLX_DECLINE_UNLESS(b.ndim == 1 && b.dtype == dtype_v<T> && (b.shape[0] <= 1 || b.strides[0] == 1),
                         "%s: the bias must be contiguous and of the input's dtype", op);
    }
    PLX_DECLINE_UNLESS(fits_i32(g.N) && fits_i32(g.O * g.C * kTaps + g.O) &&
                           fits_i32(g.C * (g.H + 8) * (g.W + 8)) && fits_i32(g.OH * g.OW),
                       "%s: sizes beyond direct's 32-bit index math", op);
    SmallFwdArgs<T> a{};
    a.N = static_cast<int>(g.N), a.C = static_cast<int>(g.C), a.H = static_cast<int>(g.H);
    a.W = static_cast<int>(g.W), a.O = static_cast<int>(g.O);
    a.OH = static_cast<int>(g.OH), a.OW = static_cast<int>(g.OW);
    a.ph = static_cast<int>(g.ph), a.pw = static_cast<int>(g.pw);
    using sdk::nhwc_or_decline;
    int64_t s[4];
    a.x_nhwc = nhwc_or_decline(x, op, "x");
    canonical_strides(xs, a.x_nhwc, s);
    a.x_n = s[0], a.x_c = s[1], a.x_h = s[2], a.x_w = s[3];
    canonical_strides(ws, nhwc_or_decline(w, op, "w"), s);
    a.w_o = s[0], a.w_c = s[1], a.w_h = s[2], a.w_w = s[3];
    if (!pool) {
      const int64_t ys[4] = {g.N, g.O, g.OH, g.OW};
      canonical_strides(ys, nhwc_or_decline(y, op, "y"), s);
      a.y_n = s[0], a.y_c = s[1], a.y_h = s[2], a.y_w = s[3];
      a.TH = (a.OH + 1) / 2, a.TW = (a.OW + 1) / 2;
      a.relu = relu;
    } else {
      const direct::PoolWindow win = direct::pool_window(*pool, "max_pool2d");
      const auto &kernel = win.kernel, &stride = win.stride, &pad = win.pad, &dil = win.dil;
      PLX_DECLINE_UNLESS(kernel[0] == 2 && kernel[1] == 2 && stride == kernel &&
                             pad[0] == 0 && pad[1] == 0 && dil[0] == 1 && dil[1] == 1,
                         "%s: direct image by image pools 2x2 windows of stride 2, no padding",
                         op);
      PLX_REQUIRE(py && pidx && py->ndim == 4 && pidx->ndim == 4, "%s: 4-D y and indices", op);
      PLX_DECLINE_UNLESS(pidx->dtype == PLX_U8 || pidx->dtype == PLX_I32,
                         "max_pool2d: indices must be i32 or u8");
      const int64_t ps[4] = {py->shape[0], py->shape[1], py->shape[2], py->shape[3]};
      PLX_REQUIRE(ps[0] == g.N && ps[1] == g.O && 2 * ps[2] - 1 <= g.OH && 2 * ps[3] - 1 <= g.OW,
                  "%s: the pooled y does not match the convolution", op);
      canonical_strides(ps, nhwc_or_decline(*py, op, "y"), s);
      a.y_n = s[0], a.y_c = s[1], a.y_h = s[2], a.y_w = s[3];
      canonical_strides(ps, nhwc_or_decline(*pidx, op, "the indices"), s);
      a.i_n = s[0], a.i_c = s[1], a.i_h = s[2], a.i_w = s[3];
      a.TH = static_cast<int>(ps[2]), a.TW = static_cast<int>(ps[3]);
      const bool mask = pool->attr_int_or("relu_mask", 0) != 0;
      a.relu = relu && !mask;
      a.relu_after = relu && mask;
      a.relu_mask = mask;
      u8_ = pidx->dtype == PLX_U8;
    }
    pool_ = pool != nullptr;
    a.XH = std::max(a.H + 2 * a.ph, 2 * a.TH + 2);
    a.XW = std::max(a.W + 2 * a.pw, 2 * a.TW + 2);
    a.xplane = (a.XH * a.XW) | 1;
    a.wsm_offset = (static_cast<int64_t>(a.C) * a.xplane + 3) / 4 * 4;
    smem_ = static_cast<uint64_t>(a.wsm_offset + static_cast<int64_t>(a.C) * kTaps * a.O + a.O) *
            sizeof(float);
    use_device(device_);
    decline_over_optin(backend, device_, smem_, op);
    cb_ = a.O % 4 == 0 ? 4 : 1;
    for_kernel(
        [&]<int CB, class Ix>() { allow_smem(small_conv_forward_kernel<T, CB, Ix>, smem_); });
    grid_ = static_cast<unsigned>(std::min<int64_t>(g.N, kDataBlocksPerSm * sm_count(backend, device_)));
    has_bias_ = has_bias;
    a_ = a;
  }

  void compute(const KernelCall& c) override {
    if (grid_ == 0 || a_.O == 0) return;  // y is empty
    use_device(device_);
    SmallFwdArgs<T> a = a_;
    a.x = static_cast<const T*>(c.in(slots_.x).data);
    a.w = static_cast<const T*>(c.in(slots_.w).data);
    a.bias = has_bias_ ? static_cast<const T*>(c.in(slots_.b).data) : nullptr;
    a.y = static_cast<T*>(c.out(slots_.y).data);
    if (pool_) a.idx = c.out(slots_.idx).data;
    const cudaStream_t s = native(c.stream);
    for_kernel([&]<int CB, class Ix>() {
      launch_kernel(small_conv_forward_kernel<T, CB, Ix>, grid_, kBlock, smem_, s, a);
    });
  }

 private:
  // f.template operator()<CB, Ix>(): the kernel this object launches, by its template arguments.
  template <class F>
  void for_kernel(F&& f) const {
    if (!pool_) {
      if (cb_ == 4) f.template operator()<4, NoIndex>();
      else f.template operator()<1, NoIndex>();
    } else if (u8_) {
      if (cb_ == 4) f.template operator()<4, uint8_t>();
      else f.template operator()<1, uint8_t>();
    } else {
      if (cb_ == 4) f.template operator()<4, int32_t>();
      else f.template operator()<1, int32_t>();
    }
  }

  int32_t device_;
  SmallFwdSlots slots_;
  SmallFwdArgs<T> a_{};
  bool pool_ = false, u8_ = false, has_bias_ = false;
  int cb_ = 1;
  uint64_t smem_ = 0;
  unsigned grid_ = 0;
};

// conv2d_backward_data (dy, w) -> dx, registered as "direct".
template <class T>
class DirectDgradKernel final : public Kernel {
 public:
  DirectDgradKernel(const NodeInfo& node, CudaBackend& backend) {
    const char* op = "conv2d_backward_data";
    const plx_tensor &dy = node.input(0), &w = node.input(1), &dx = node.output(0);
    PLX_REQUIRE(dy.ndim == 4 && w.ndim == 4 && dx.ndim == 4, "%s: dy, w and dx must be 4-D", op);
    const std::vector<int64_t> v = node.attr_ints("input_shape");
    PLX_REQUIRE(v.size() == 4, "%s: input_shape must have 4 values", op);
    const int64_t xs[4] = {v[0], v[1], v[2], v[3]};
    const int64_t ws[4] = {w.shape[0], w.shape[1], w.shape[2], w.shape[3]};
    SmallBwdSlots sl;
    sl.dy = 0, sl.w = 1, sl.dx = 0;
    k_ = std::make_unique<SmallConvBackwardKernel<T>>(node, backend, xs, ws, &dy, &dx, &w, nullptr,
                                                      nullptr, nullptr, SmallUnpool{}, sl, op);
  }
  uint64_t workspace_bytes() const override { return 0; }
  void compute(const KernelCall& c) override { k_->compute(c); }

 private:
  std::unique_ptr<SmallConvBackwardKernel<T>> k_;
};

template <class T>
void add_dtype(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_CAPTURABLE | PLX_KERNEL_STRIDED | PLX_KERNEL_DETERMINISTIC;
  constexpr plx_dtype d = dtype_v<T>;
  const plx_layout l = d == PLX_F32 ? PLX_LAYOUT_NCHW : PLX_LAYOUT_NHWC;
  r.add<DirectDgradKernel<T>, CudaBackend>("conv2d_backward_data", d, "direct", f, l);
}

template <class T>
std::unique_ptr<Kernel> make_pool_backward(CudaBackend& backend, const sdk::GraphView& g,
                                           const sdk::MaxPoolConvBackwardSlots& s) {
  const char* op = "max_pool2d_backward+conv2d_backward";
  const plx_graph_node& pool = g.node(s.pool);
  const sdk::OwnedNodeInfo pool_info(g, s.pool), data_info(g, s.data);
  const NodeInfo pool_node(&pool_info.get()), data(&data_info.get());
  const plx_tensor& w = g.value(g.node(s.data).inputs[1]);
  const plx_tensor& dx = g.value(g.node(s.data).outputs[0]);
  const std::vector<int64_t> v = data.attr_ints("input_shape");
  PLX_REQUIRE(v.size() == 4, "conv2d_backward_data: input_shape must have 4 values");
  const int64_t xs[4] = {v[0], v[1], v[2], v[3]};
  const int64_t ws[4] = {w.shape[0], w.shape[1], w.shape[2], w.shape[3]};
  const plx_tensor *x = nullptr, *dw = nullptr, *db = nullptr;
  if (s.weight >= 0) {
    x = &g.value(g.node(s.weight).inputs[1]);
    dw = &g.value(g.node(s.weight).outputs[0]);
  }
  if (s.bias >= 0) db = &g.value(g.node(s.bias).outputs[0]);
  const SmallUnpool unpool{&pool_node, &g.value(pool.inputs[0]), &g.value(pool.inputs[1])};
  SmallBwdSlots sl;
  sl.dy = s.dy, sl.indices = s.indices, sl.w = s.w, sl.x = s.x;
  sl.dx = s.dx, sl.dw = s.dw, sl.db = s.db;
  return std::make_unique<SmallConvBackwardKernel<T>>(data, backend, xs, ws, nullptr, &dx, &w, x,
                                                      dw, db, unpool, sl, op);
}

}  // namespace

std::unique_ptr<Kernel> make_small_conv(const NodeInfo& node, CudaBackend& backend, bool relu) {
  const bool bias = node.has_input(2);
  const SmallFwdSlots sl{0, 1, bias ? 2 : -1, 0, -1};
  switch (node.input(0).dtype) {
    case PLX_F32:
      return std::make_unique<SmallConvForwardKernel<float>>(node, backend, relu, nullptr, nullptr,
                                                             nullptr, sl, bias);
    case PLX_F16:
      return std::make_unique<SmallConvForwardKernel<f16>>(node, backend, relu, nullptr, nullptr,
                                                           nullptr, sl, bias);
    case PLX_BF16:
      return std::make_unique<SmallConvForwardKernel<bf16>>(node, backend, relu, nullptr, nullptr,
                                                            nullptr, sl, bias);
    default:
      break;
  }
  throw sdk::Unsupported(
      sdk::format("conv2d: no direct %s kernel", plexus::dtype_name(node.input(0).dtype)));
}

std::unique_ptr<Kernel> make_small_conv_max_pool(CudaBackend& backend, const sdk::GraphView& g,
                                                 const sdk::Boundary& b, plx_dtype& dtype) {
  const sdk::ConvMaxPoolSlots s = sdk::conv_max_pool_slots(g, b);
  const sdk::OwnedNodeInfo conv_info(g, s.conv), pool_info(g, s.pool);
  const NodeInfo conv(&conv_info.get()), pool(&pool_info.get());
  const SmallFwdSlots sl{s.x, s.w, s.bias, s.y, s.indices};
  const plx_tensor &y = pool.output(0), &ix = pool.output(1);
  const bool relu = s.relu >= 0, bias = s.bias >= 0;
  dtype = s.dtype;
  switch (dtype) {
    case PLX_F32:
      return std::make_unique<SmallConvForwardKernel<float>>(conv, backend, relu, &pool, &y, &ix,
                                                             sl, bias);
    case PLX_F16:
      return std::make_unique<SmallConvForwardKernel<f16>>(conv, backend, relu, &pool, &y, &ix, sl,
                                                           bias);
    case PLX_BF16:
      return std::make_unique<SmallConvForwardKernel<bf16>>(conv, backend, relu, &pool, &y, &ix, sl,
                                                            bias);
    default:
      break;
  }
  throw sdk::Unsupported(
      sdk::format("conv2d+max_pool2d: no direct %s kernel", plexus::dtype_name(dtype)));
}

void register_direct_backward(KernelRegistry& r) {
  add_dtype<float>(r);
  add_dtype<f16>(r);
  add_dtype<bf16>(r);
}

std::unique_ptr<Kernel> make_direct_pool_backward(CudaBackend& backend, const sdk::GraphView& g,
                                                  const sdk::Boundary& b, plx_dtype& dtype) {
  const sdk::MaxPoolConvBackwardSlots s = sdk::max_pool_conv_backward_slots(g, b);
  PLX_DECLINE_UNLESS(s.data >= 0,
                     "max_pool2d_backward+conv2d_backward: direct's fused backward computes dx");
  dtype = s.dtype;
  switch (dtype) {
    case PLX_F32:
      return make_pool_backward<float>(backend, g, s);
    case PLX_F16:
      return make_pool_backward<f16>(backend, g, s);
    case PLX_BF16:
      return make_pool_backward<bf16>(backend, g, s);
    default:
      break;
  }
  throw sdk::Unsupported(sdk::format("max_pool2d_backward+conv2d_backward: no direct %s kernel",
                                     plexus::dtype_name(dtype)));
}

}  // namespace plexus::cuda
