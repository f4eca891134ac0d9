// CUDA kernels: pool family (see docs/ops.md). Average pooling takes NCHW contiguous tensors;
// max pooling and its backward (and their fused forms) take each 4-D tensor NCHW contiguous or
// channels-last (the layout planner's, abi/ops.h), and prefer channels-last in 16 bits, where
// the convolutions around them do.
//
// One thread per output element in the forward ops, one per input element in the backward ops,
// consecutive threads on consecutive elements of the tensor they write (columns in NCHW,
// channels in NHWC), so that stores coalesce, and loads too where the tensors read share that
// layout. Window bounds are
// worked out per element from the geometry (a few integer operations), so no tap is tested
// against the input bounds inside the loops.
//
// The backward ops gather rather than scatter, as the CPU plugin does: each dx element sums the
// dy of the windows that cover it (max: only those whose index names it) in a fixed order
// (window row, then column). Every dx element is written once by one thread, rounded once, with
// no atomics and no scratch, so the results are bit-identical run to run.
//
// Indices: element positions are decomposed in 32-bit arithmetic when every index fits (the
// common case; 64-bit division costs several times more), else in 64-bit. In 32 bits the
// divisions by the tensor's sizes are FastDiv's (device.cuh: a multiply-high, an add and a
// shift, where `/` costs about twenty instructions), and the 2x2 windows of stride 2 that our
// models pool with find their window and tap with shifts (PoolGeom::win2): these kernels are a
// few loads and a store per element, so the index math was most of their instructions.
#include <cmath>
#include <cstdint>
#include <vector>

#include "device.cuh"
#include "ops/gelu.cuh"
#include "ops/gelu_attr.hpp"

namespace plexus::cuda {

namespace {

// The geometry of one node, passed to the kernels by value. Spatial sizes fit in 32 bits in
// practice but are kept 64-bit so no product can overflow.
struct PoolGeom {
  int64_t planes;       // N·C
  int64_t H, W;         // input plane
  int64_t OH, OW;       // output plane
  int64_t kh, kw;       // window
  int64_t sh, sw;       // stride
  int64_t ph, pw;       // padding
  int64_t dh, dw;       // dilation (1 for average pooling)
  int64_t C;            // channels
  int32_t include_pad;  // average pooling: padding counts in the divisor
  // Max pooling: which tensors are channels-last (else NCHW contiguous). The input side is x
  // (forward) or dx (backward), the output side y (forward) or dy (backward); the indices, and
  // the fused ReLU's y (relu_backward + max_pool2d_backward), have the output side's shape.
  int32_t in_nhwc, out_nhwc, idx_nhwc, relu_nhwc;
  // 2x2 windows, stride 2, no padding, dilation 1 (max pooling): input (ih, iw) is tap
  // 2·(ih & 1) + (iw & 1) of window (ih >> 1, iw >> 1) alone, when that window exists.
  int32_t win2;
  // The sizes as divisors for the 32-bit kernels (I = int32_t); unused in 64 bits.
  FastDiv fC, fH, fW, fOH, fOW, fHW;
};

// x (N, C, H, W), y (N, C, OH, OW); mirrors the CPU plugin's checks.
PoolGeom make_geom(const int64_t* x, const int64_t* y, const NodeInfo& node, bool dilated) {
  const auto kernel = node.attr_ints("kernel"), pad = node.attr_ints("padding");
  auto stride = node.attr_ints("stride");
  if (stride.empty()) stride = kernel;
  const std::vector<int64_t> dil =
      dilated ? node.attr_ints("dilation") : std::vector<int64_t>{1, 1};
  PLX_REQUIRE(kernel.size() == 2 && stride.size() == 2 && pad.size() == 2 && dil.size() == 2,
              "%s: kernel, stride, padding and dilation must have 2 values", node.op());
  PLX_REQUIRE(kernel[0] >= 1 && kernel[1] >= 1 && stride[0] >= 1 && stride[1] >= 1 && dil[0] >= 1 &&
                  dil[1] >= 1,
              "%s: bad kernel, stride or dilation", node.op());
  PoolGeom g{};
  g.planes = x[0] * x[1];
  g.H = x[2], g.W = x[3], g.OH = y[2], g.OW = y[3];
  g.kh = kernel[0], g.kw = kernel[1];
  g.sh = stride[0], g.sw = stride[1];
  g.ph = pad[0], g.pw = pad[1];
  g.dh = dil[0], g.dw = dil[1];
  g.C = x[1];
  g.include_pad = 0;
  g.in_nhwc = g.out_nhwc = g.idx_nhwc = g.relu_nhwc = 0;
  g.win2 = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 &&
           g.dh == 1 && g.dw == 1;
  g.fC = FastDiv(g.C), g.fH = FastDiv(g.H), g.fW = FastDiv(g.W);
  g.fOH = FastDiv(g.OH), g.fOW = FastDiv(g.OW), g.fHW = FastDiv(g.H * g.W);
  return g;
}

using sdk::nhwc_or_decline;

}  // namespace

// ---- window geometry along one axis (host and device, so it can be checked on a CPU) ----
namespace pool_axis {

// ceil(a / b) and floor(a / b) for b > 0 and any sign of a.
template <class I>
__host__ __device__ __forceinline__ I ceil_div(I a, I b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}
template <class I>
__host__ __device__ __forceinline__ I floor_div(I a, I b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
template <class I>
__host__ __device__ __forceinline__ I clamp_to(I v, I lo, I hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// The taps [lo, hi) of output o's window (k taps, stride s, padding p, dilation d) that fall
// inside an input of size n.
template <class I>
__host__ __device__ __forceinline__ void taps(I o, I s, I p, I d, I k, I n, I& lo, I& hi) {
  const I start = o * s - p;  // input position of tap 0
  lo = clamp_to<I>(ceil_div<I>(-start, d), 0, k);
  hi = clamp_to<I>(ceil_div<I>(n - start, d), lo, k);
}

// The outputs [lo, hi) (of `out`) whose window extent (d·(k − 1) + 1 positions) covers input
// position i: those starting in [i + p − extent + 1, i + p].
template <class I>
__host__ __device__ __forceinline__ void windows(I i, I s, I p, I extent, I out, I& lo, I& hi) {
  lo = clamp_to<I>(ceil_div<I>(i + p - extent + 1, s), 0, out);
  hi = clamp_to<I>(floor_div<I>(i + p, s) + 1, lo, out);
}

// Average pooling, output o: its window clipped to the input [lo, hi), and its divisor along
// this axis: the window clipped to the padded input with count_include_pad, else hi − lo
// (PyTorch's divisor).
template <class I>
__host__ __device__ __forceinline__ I avg_extent(I o, I s, I p, I k, I n, bool include_pad, I& lo,
                                                 I& hi) {
  const I start = o * s - p;
  lo = start > 0 ? start : I(0);
  hi = start + k < n ? start + k : n;
  if (hi < lo) hi = lo;
  const I padded_end = start + k < n + p ? start + k : n + p;
  return include_pad ? padded_end - start : hi - lo;
}

}  // namespace pool_axis

namespace {

using pool_axis::avg_extent;

// The (h, w) plane of image n, channel c, of a 4-D tensor with C channels and H x W planes,
// NCHW contiguous or channels-last: element (h, w) is at base + h·hs + w·ws.
template <class I>
struct Plane {
  I base, hs, ws;
  __device__ __forceinline__ I at(I h, I w) const { return base + h * hs + w * ws; }
};
template <class I>
__device__ __forceinline__ Plane<I> plane_of(int32_t nhwc, I n, I c, I C, I H, I W) {
  return nhwc ? Plane<I>{n * H * W * C + c, W * C, C} : Plane<I>{(n * C + c) * H * W, W, I(1)};
}
// q = n / d, r = n % d for n >= 0: FastDiv f (whose divisor is d) in 32 bits, `/` in 64.
template <class I>
__device__ __forceinline__ void divmod(I n, I d, const FastDiv& f, I& q, I& r) {
  if constexpr (sizeof(I) == 4) {
    f.divmod(n, q, r);
  } else {
    q = n / d;
    r = n - q * d;
  }
}
// Element i of such a tensor, counted in its memory order, as (n, c, h, w); fC, fH, fW divide
// by C, H, W.
template <class I>
__device__ __forceinline__ void unflatten(int32_t nhwc, I i, I C, I H, I W, const FastDiv& fC,
                                          const FastDiv& fH, const FastDiv& fW, I& n, I& c, I& h,
                                          I& w) {
  I t;
  if (nhwc) {
    divmod<I>(i, C, fC, t, c);
    divmod<I>(t, W, fW, t, w);
    divmod<I>(t, H, fH, n, h);
  } else {
    divmod<I>(i, W, fW, t, w);
    divmod<I>(t, H, fH, t, h);
    divmod<I>(t, C, fC, n, c);
  }
}

using pool_axis::taps;
using pool_axis::windows;

// Grid-stride loop over [0, n) in index type I.
#define PLX_POOL_LOOP(I, i, n)                                                                    \
  for (I i =                                                                                      \
           static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); \
       i < (n); i += static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x))

// v beats the best so far: larger, or the first NaN (NaN counts as the maximum, as in argmax).
__device__ __forceinline__ bool beats(float v, float best) {
  return v > best || (v != v && best == best);
}

// The indices max_pool2d writes: i32 positions h·W + w in the plane (-1: none), or with
// window_index u8 taps kh·KW + kw in the window (255: none).
template <class Ix>
struct PoolIndex;
template <>
struct PoolIndex<int32_t> {
  template <class I>
  __device__ static int32_t encode(I at, I, bool none) { return none ? -1 : static_cast<int32_t>(at); }
  // Whether v names input element `here` of output (oh, ow)'s window.
  template <class I>
  __device__ static bool names(int32_t v, I here, I, I, const PoolGeom&) {
    return static_cast<I>(v) == here;
  }
  // The same for a win2 window, where `here` is tap `tap` of it.
  template <class I>
  __device__ static bool names_tap(int32_t v, I here, I) { return static_cast<I>(v) == here; }
};
template <>
struct PoolIndex<uint8_t> {
  template <class I>
  __device__ static uint8_t encode(I, I tap, bool none) { return none ? 255 : static_cast<uint8_t>(tap); }
  template <class I>
  __device__ static bool names(uint8_t v, I here, I oh, I ow, const PoolGeom& g) {
    if (v == 255) return false;
    const I kh = static_cast<I>(v) / static_cast<I>(g.kw), kw = static_cast<I>(v) % static_cast<I>(g.kw);
    const I ih = oh * static_cast<I>(g.sh) - static_cast<I>(g.ph) + kh * static_cast<I>(g.dh);
    const I iw = ow * static_cast<I>(g.sw) - static_cast<I>(g.pw) + kw * static_cast<I>(g.dw);
    return ih * static_cast<I>(g.W) + iw == here;
  }
  template <class I>
  __device__ static bool names_tap(uint8_t v, I, I tap) { return static_cast<I>(v) == tap; }
};

// y, indices = max_pool2d(x); one thread per output element, in y's memory order. `relu_out`
// (the conv + ReLU + pool fusion, where the ReLU runs after the pool): y = relu(y) as it is
// written, the same bits as the ReLU kernel on y (best is a loaded T, so exact; NaN gives 0).
template <class T, class I, class Ix>
__global__ void max_pool_kernel(const T* __restrict__ x, T* __restrict__ y, Ix* __restrict__ idx,
                                PoolGeom g, I total, bool relu_mask, bool relu_out,
                                const T* __restrict__ bias) {
  pdl_begin();
  const I OW = static_cast<I>(g.OW), OH = static_cast<I>(g.OH);
  const I H = static_cast<I>(g.H), W = static_cast<I>(g.W), C = static_cast<I>(g.C);
  const I kh = static_cast<I>(g.kh), kw = static_cast<I>(g.kw);
  const I dh = static_cast<I>(g.dh), dw = static_cast<I>(g.dw);
  PLX_POOL_LOOP(I, i, total) {
    I n, c, oh, ow;
    unflatten<I>(g.out_nhwc, i, C, OH, OW, g.fC, g.fOH, g.fOW, n, c, oh, ow);
    const Plane<I> src = plane_of<I>(g.in_nhwc, n, c, C, H, W);
    const I h0 = oh * static_cast<I>(g.sh) - static_cast<I>(g.ph);  // row of tap 0
    const I w0 = ow * static_cast<I>(g.sw) - static_cast<I>(g.pw);
    // The taps that fall inside the input (win2: what taps() gives, without its divisions).
    I kh_lo, kh_hi, kw_lo, kw_hi;
    if (g.win2) {
      kh_lo = kw_lo = 0;
      kh_hi = pool_axis::clamp_to<I>(H - h0, 0, 2);
      kw_hi = pool_axis::clamp_to<I>(W - w0, 0, 2);
    } else {
      taps<I>(oh, static_cast<I>(g.sh), static_cast<I>(g.ph), dh, kh, H, kh_lo, kh_hi);
      taps<I>(ow, static_cast<I>(g.sw), static_cast<I>(g.pw), dw, kw, W, kw_lo, kw_hi);
    }
    // A window of padding only (possible with dilation) gives -inf and index -1, which the
    // backward op never matches. The index is the position h·W + w in the plane whatever the
    // layout.
    float best = -INFINITY;
    I at = -1, tap = -1;
    for (I a = kh_lo; a < kh_hi; ++a) {
      const I ih = h0 + a * dh;
      for (I b = kw_lo; b < kw_hi; ++b) {
        const I iw = w0 + b * dw;
        const float v = to_accum<T>(x[src.at(ih, iw)]);
        if (at < 0 || beats(v, best)) best = v, at = ih * W + iw, tap = a * kw + b;
      }
    }
    // The fused conv + pool: the conv's bias (constant over the window) added to the maximum.
    if (bias) best += to_accum<T>(bias[c]);
    const T out = from_accum<T>(relu_out && !(best > 0.0f) ? 0.0f : best);
    y[i] = out;
    // relu_mask: no index where y is not > 0, the mask relu_backward(dy, y) would apply.
    const I io = g.idx_nhwc == g.out_nhwc ? i : plane_of<I>(g.idx_nhwc, n, c, C, OH, OW).at(oh, ow);
    idx[io] = PoolIndex<Ix>::encode(at, tap, at < 0 || (relu_mask && !(to_accum<T>(out) > 0.0f)));
  }
}

// dx element (n, c, ih, iw) of max_pool2d_backward: the sum of the dy of the windows that cover
// it and whose index names it, in window order. With `relu_y` (the backward of ReLU with
// pooling, fused): each dy is first masked by the ReLU as relu_backward does (y > 0 ? dy : 0, in
// f32), so the sum equals the two ops' to the bit.
template <class T, class I, class Ix>
__device__ __forceinline__ float max_pool_gather(const T* __restrict__ dy,
                                                 const Ix* __restrict__ idx, const PoolGeom& g, I n,
                                                 I c, I ih, I iw, const T* __restrict__ relu_y) {
  const I OW = static_cast<I>(g.OW), OH = static_cast<I>(g.OH), W = static_cast<I>(g.W);
  const I C = static_cast<I>(g.C);
  const I ext_h = static_cast<I>(g.dh * (g.kh - 1) + 1),
          ext_w = static_cast<I>(g.dw * (g.kw - 1) + 1);
  const Plane<I> dp = plane_of<I>(g.out_nhwc, n, c, C, OH, OW);
  const Plane<I> ip = g.idx_nhwc == g.out_nhwc ? dp : plane_of<I>(g.idx_nhwc, n, c, C, OH, OW);
  const Plane<I> rp = g.relu_nhwc == g.out_nhwc ? dp : plane_of<I>(g.relu_nhwc, n, c, C, OH, OW);
  const I here = ih * W + iw;
  if (g.win2) {  // one window at most, found with shifts (the same sum: 0 + its dy, or 0)
    const I oh = ih >> 1, ow = iw >> 1;
    float sum = 0.0f;
    if (oh < OH && ow < OW &&
        PoolIndex<Ix>::names_tap(idx[ip.at(oh, ow)], here, ((ih & 1) << 1) | (iw & 1))) {
      const float v = to_accum<T>(dy[dp.at(oh, ow)]);
      sum += relu_y && !(to_accum<T>(relu_y[rp.at(oh, ow)]) > 0.0f) ? 0.0f : v;
    }
    return sum;
  }
  // The windows whose extent covers (ih, iw).
  I oh_lo, oh_hi, ow_lo, ow_hi;
  windows<I>(ih, static_cast<I>(g.sh), static_cast<I>(g.ph), ext_h, OH, oh_lo, oh_hi);
  windows<I>(iw, static_cast<I>(g.sw), static_cast<I>(g.pw), ext_w, OW, ow_lo, ow_hi);
  float sum = 0.0f;
  for (I oh = oh_lo; oh < oh_hi; ++oh)
    for (I ow = ow_lo; ow < ow_hi; ++ow) {
      if (PoolIndex<Ix>::names(idx[ip.at(oh, ow)], here, oh, ow, g)) {
        const float v = to_accum<T>(dy[dp.at(oh, ow)]);
        sum += relu_y && !(to_accum<T>(relu_y[rp.at(oh, ow)]) > 0.0f) ? 0.0f : v;
      }
    }
  return sum;
}

// dx = max_pool2d_backward(dy, indices); one thread per input element, in dx's memory order
// (max_pool_gather).
template <class T, class I, class Ix>
__global__ void max_pool_backward_kernel(const T* __restrict__ dy, const Ix* __restrict__ idx,
                                         T* __restrict__ dx, PoolGeom g, I total,
                                         const T* __restrict__ relu_y) {
  pdl_begin();
  const I H = static_cast<I>(g.H), W = static_cast<I>(g.W), C = static_cast<I>(g.C);
  PLX_POOL_LOOP(I, i, total) {
    I n, c, ih, iw;
    unflatten<I>(g.in_nhwc, i, C, H, W, g.fC, g.fH, g.fW, n, c, ih, iw);
    dx[i] = from_accum<T>(max_pool_gather<T, I, Ix>(dy, idx, g, n, c, ih, iw, relu_y));
  }
}

// A gradient written with its sum per channel (the bias gradient of the convolution it flows
// into), in one launch: block (c, s) writes channel c's planes of images s, s + splits, ... (each
// element F::at(plane, e) rounded to T) and sums what it wrote (the rounded values, as a sum node
// reads them) in f32; each channel's `splits` partial sums are added by split_sum (device.cuh;
// counters the kernel object owns, split_sum_counters(splits) per channel). Deterministic. One
// launch per counter at a time (launches run in stream order).
template <class T, class I, class F>
__global__ void __launch_bounds__(kBlock)
    channel_sum_kernel(const F f, T* __restrict__ dx, I channels, I images, I HW, float* part,
                       T* __restrict__ db, unsigned* done) {
  pdl_begin();
  __shared__ float shared_sum[32];
  const I c = static_cast<I>(blockIdx.x), s = static_cast<I>(blockIdx.y);
  const I splits = static_cast<I>(gridDim.y);
  float acc = 0.0f;
  for (I n = s; n < images; n += splits) {
    const I plane = n * channels + c;
    for (I e = static_cast<I>(threadIdx.x); e < HW; e += static_cast<I>(blockDim.x)) {
      const T v = from_accum<T>(f.at(plane, e));
      dx[plane * HW + e] = v;
      acc += to_accum<T>(v);
    }
  }
  acc = block_sum(acc, shared_sum);
  if (threadIdx.x == 0) part[static_cast<int64_t>(c) * splits + s] = acc;
  // Channel c's split sums (split_sum, per channel), rounded once into db[c].
  split_sum(
      done + static_cast<int64_t>(c) * split_sum_counters(gridDim.y), part, 1, gridDim.y,
      blockIdx.y, 1, [&](int) { return static_cast<int64_t>(c) * splits; },
      [&](int, int64_t, float t) { db[c] = from_accum<T>(t); });
}

// channel_sum_kernel's elements: max_pool2d_backward's dx (max_pool_gather), dx NCHW.
template <class T, class I, class Ix>
struct PoolGrad {
  const T* dy;
  const Ix* idx;
  PoolGeom g;
  __device__ float at(I plane, I e) const {
    I n, c, h, w;
    divmod<I>(plane, static_cast<I>(g.C), g.fC, n, c);
    divmod<I>(e, static_cast<I>(g.W), g.fW, h, w);
    return max_pool_gather<T, I, Ix>(dy, idx, g, n, c, h, w, nullptr);
  }
};
// ... and relu_backward's: dy where y > 0, else 0 (in f32, as ReluBackward).
template <class T, class I>
struct ReluGrad {
  const T* dy;
  const T* y;
  I hw;
  __device__ float at(I plane, I e) const {
    const I i = plane * hw + e;
    return to_accum<T>(y[i]) > 0.0f ? to_accum<T>(dy[i]) : 0.0f;
  }
};

// A (rows, cols) gradient written with its column sums, in one launch: element (r, c) is
// F::at(r, c, r·cols + c), rounded to T. Used for relu_backward then the sum over rows (a linear
// layer's bias gradient, ReluCols) and for a channels-last gradient, whose channel sums are the
// column sums of (N·H·W, C) (ReluCols, PoolCols). Blocks of 32 columns x 8 row lanes (writes
// coalesced along the columns) over (column tiles, row splits); each writes its columns' partial
// sums (of the rounded values, as a sum node reads them), and split_sum adds each column tile's
// splits (device.cuh; split_sum_counters(splits) counters per column tile; deterministic).
constexpr int kColTile = 32, kRowLanes = kBlock / kColTile;
template <class T, class F>
__global__ void __launch_bounds__(kBlock)
    column_sum_kernel(const F f, T* __restrict__ dx, int64_t rows, int64_t cols, float* part,
                      T* __restrict__ db, unsigned* done) {
  pdl_begin();
  __shared__ float lanes[kRowLanes][kColTile + 1];
  const int tx = static_cast<int>(threadIdx.x) % kColTile, lane = static_cast<int>(threadIdx.x) / kColTile;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t splits = gridDim.y, sp = blockIdx.y;
  const int64_t r0 = rows * sp / splits, r1 = rows * (sp + 1) / splits;
  float acc = 0.0f;
  if (col < cols)
#pragma unroll (F::kRowsAhead)  // rows' loads in flight per thread (the sum keeps its order)
    for (int64_t r = r0 + lane; r < r1; r += kRowLanes) {
      const int64_t i = r * cols + col;
      const T v = from_accum<T>(f.at(r, col, i));
      dx[i] = v;
      acc += to_accum<T>(v);
    }
  lanes[lane][tx] = acc;
  __syncthreads();
  if (lane == 0 && col < cols) {
    float t = 0.0f;
    for (int k = 0; k < kRowLanes; ++k) t += lanes[k][tx];
    part[sp * cols + col] = t;
  }
  // The column tile's split sums (split_sum, per tile), rounded once into db.
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kColTile;
  split_sum(
      done + blockIdx.x * split_sum_counters(gridDim.y), part, cols, gridDim.y, blockIdx.y,
      kColTile, [&](int i) { return col0 + i < cols ? col0 + i : int64_t{-1}; },
      [&](int, int64_t c, float t) { db[c] = from_accum<T>(t); });
}

// column_sum_kernel's elements: relu_backward's, dy where y > 0 else 0 (in f32, as ReluBackward),
// dy, y and dx laid out alike.
template <class T>
struct ReluCols {
  static constexpr int kRowsAhead = 4;  // two loads an element: cheap to unroll
  const T* dy;
  const T* y;
  __device__ float at(int64_t, int64_t, int64_t i) const {
    return to_accum<T>(y[i]) > 0.0f ? to_accum<T>(dy[i]) : 0.0f;
  }
};
// ... and gelu_backward's, dy · gelu'(x) (in f32, the gelu_backward op's formula: ops/gelu.cuh),
// dy, x and dx laid out alike.
template <class T>
struct GeluCols {
  static constexpr int kRowsAhead = 4;
  const T* dy;
  const T* x;
  bool tanh_form;
  __device__ float at(int64_t, int64_t, int64_t i) const {
    return gelu::backward(to_accum<T>(dy[i]), to_accum<T>(x[i]), tanh_form);
  }
};
// ... and max_pool2d_backward's, dx channels-last: row n·H·W + e, column c (max_pool_gather),
// its indices in I (int32_t when every element's fits, as the other pool kernels choose).
template <class T, class Ix, class I>
struct PoolCols {
  static constexpr int kRowsAhead = 1;  // a window gather an element: unrolled, ptxas spills
  const T* dy;
  const Ix* idx;
  PoolGeom g;
  __device__ float at(int64_t r, int64_t c, int64_t) const {
    I n, e, h, w;
    divmod<I>(static_cast<I>(r), static_cast<I>(g.H * g.W), g.fHW, n, e);
    divmod<I>(e, static_cast<I>(g.W), g.fW, h, w);
    return max_pool_gather<T, I, Ix>(dy, idx, g, n, static_cast<I>(c), h, w, nullptr);
  }
};

// The column and channel sums stream their gradient once, so they want many loads in flight:
// about kSumBlocksPerSm blocks of kBlock threads per SM (a full SM), whose split sums split_sum
// adds in about √splits steps. (Two blocks per SM until the twenty-ninth session, when the last
// block still read every split's sum alone.)
constexpr int64_t kSumBlocksPerSm = 8;

// column_sum_kernel's row splits: about kSumBlocksPerSm blocks per SM over the column tiles,
// each split at least kRowLanes rows (and at most 65535 splits).
unsigned column_sum_splits(int sms, int64_t rows, int64_t cols) {
  const int64_t tiles = std::max<int64_t>((cols + kColTile - 1) / kColTile, 1);
  return static_cast<unsigned>(std::clamp<int64_t>((kSumBlocksPerSm * std::max(sms, 1) + tiles - 1) / tiles, 1,
                                                   std::clamp<int64_t>(rows / kRowLanes, 1, 65535)));
}

// The grid of channel_sum_kernel: about kSumBlocksPerSm blocks per SM over all channels, each
// with at least one image (and at most 65535 splits, the grid's y limit).
unsigned channel_sum_splits(int sms, int64_t channels, int64_t images) {
  return static_cast<unsigned>(std::clamp<int64_t>(
      (kSumBlocksPerSm * std::max(sms, 1) + channels - 1) / std::max<int64_t>(channels, 1), 1,
      std::clamp<int64_t>(images, 1, 65535)));
}

// split_sum's counters for column_sum_kernel (per column tile) or channel_sum_kernel (per
// channel) over `splits`.
BlockCounter sum_counters(bool columns, int64_t channels, unsigned splits) {
  const int64_t owners = columns ? (channels + kColTile - 1) / kColTile : channels;
  return BlockCounter(std::max<int64_t>(owners, 1) * split_sum_counters(splits));
}

// y = avg_pool2d(x); one thread per output element.
template <class T, class I>
__global__ void avg_pool_kernel(const T* __restrict__ x, T* __restrict__ y, PoolGeom g, I total) {
  pdl_begin();
  const I OW = static_cast<I>(g.OW), OH = static_cast<I>(g.OH);
  const I H = static_cast<I>(g.H), W = static_cast<I>(g.W);
  const bool include_pad = g.include_pad != 0;
  PLX_POOL_LOOP(I, i, total) {
    I ow, oh, t, plane;
    divmod<I>(i, OW, g.fOW, t, ow);
    divmod<I>(t, OH, g.fOH, plane, oh);
    const T* src = x + plane * (H * W);  // (H, W)
    I h_lo, h_hi, w_lo, w_hi;
    const I nh = avg_extent<I>(oh, static_cast<I>(g.sh), static_cast<I>(g.ph), static_cast<I>(g.kh),
                               H, include_pad, h_lo, h_hi);
    const I nw = avg_extent<I>(ow, static_cast<I>(g.sw), static_cast<I>(g.pw), static_cast<I>(g.kw),
                               W, include_pad, w_lo, w_hi);
    float sum = 0.0f;
    for (I ih = h_lo; ih < h_hi; ++ih)
      for (I iw = w_lo; iw < w_hi; ++iw) sum += to_accum<T>(src[ih * W + iw]);
    // The divisor as a float product of integers, as the CPU plugin forms it.
    y[i] = from_accum<T>(sum / static_cast<float>(static_cast<int64_t>(nh) * nw));
  }
}

// dx = avg_pool2d_backward(dy); one thread per input element, gathering dy / divisor of the
// windows that cover it.
template <class T, class I>
__global__ void avg_pool_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, PoolGeom g,
                                         I total) {
  pdl_begin();
  const I OW = static_cast<I>(g.OW), OH = static_cast<I>(g.OH);
  const I H = static_cast<I>(g.H), W = static_cast<I>(g.W);
  const I sh = static_cast<I>(g.sh), sw = static_cast<I>(g.sw);
  const I ph = static_cast<I>(g.ph), pw = static_cast<I>(g.pw);
  const I kh = static_cast<I>(g.kh), kw = static_cast<I>(g.kw);
  const bool include_pad = g.include_pad != 0;
  PLX_POOL_LOOP(I, i, total) {
    I iw, ih, t, plane;
    divmod<I>(i, W, g.fW, t, iw);
    divmod<I>(t, H, g.fH, plane, ih);
    const I out_base = plane * (OH * OW);
    I oh_lo, oh_hi, ow_lo, ow_hi;
    windows<I>(ih, sh, ph, kh, OH, oh_lo, oh_hi);
    windows<I>(iw, sw, pw, kw, OW, ow_lo, ow_hi);
    float sum = 0.0f;
    for (I oh = oh_lo; oh < oh_hi; ++oh) {
      I lo, hi;
      const I nh = avg_extent<I>(oh, sh, ph, kh, H, include_pad, lo, hi);
      for (I ow = ow_lo; ow < ow_hi; ++ow) {
        const I nw = avg_extent<I>(ow, sw, pw, kw, W, include_pad, lo, hi);
        // 1 / divisor first, then the product, as the CPU plugin does.
        const float inv = 1.0f / static_cast<float>(static_cast<int64_t>(nh) * nw);
        sum += to_accum<T>(dy[out_base + oh * OW + ow]) * inv;
      }
    }
    dx[i] = from_accum<T>(sum);
  }
}

// 32-bit indices when n plus one grid stride stays below 2^31.
bool fits_i32(int64_t n) {
  const int64_t step = int64_t{grid_for(n)} * kBlock;
  return n + step <= INT32_MAX;
}

template <class T>
class MaxPool2dKernel final : public Kernel {
 public:
  // relu_out: y = relu(max); bias: input 1 holds a per-channel bias added to the maximum first
  // (the fused conv + [ReLU +] pool, whose conv then runs without it).
  explicit MaxPool2dKernel(const NodeInfo& node, bool relu_out = false, bool bias = false)
      : device_(node.device()),
        g_(make_geom(node.input(0).shape, node.output(0).shape, node, true)),
        relu_mask_(node.attr_int_or("relu_mask", 0) != 0),
        relu_out_(relu_out),
        bias_(bias),
        u8_(node.output(1).dtype == PLX_U8) {
    // The schema limits planes to what i32 indices can name; the kernel relies on it.
    PLX_REQUIRE(g_.H * g_.W <= INT32_MAX, "max_pool2d: an input plane too large for i32 indices");
    g_.in_nhwc = nhwc_or_decline(node.input(0), "max_pool2d", "x");
    g_.out_nhwc = nhwc_or_decline(node.output(0), "max_pool2d", "y");
    g_.idx_nhwc = nhwc_or_decline(node.output(1), "max_pool2d", "the indices");
  }

  void compute(const KernelCall& c) override {
    if (u8_)
      launch(c, ptr<uint8_t>(c.out(1)));
    else
      launch(c, ptr<int32_t>(c.out(1)));
  }

 private:
  template <class Ix>
  void launch(const KernelCall& c, Ix* idx) const {  // idx (N, C, OH, OW)
    const int64_t total = g_.planes * g_.OH * g_.OW;
    if (total == 0) return;
    use_device(device_);
    const T* x = ptr<T>(c.in(0));                       // (N, C, H, W)
    T* y = ptr<T>(c.out(0));                            // (N, C, OH, OW)
    const T* bias = bias_ ? ptr<T>(c.in(1)) : nullptr;  // (C)
    const cudaStream_t s = native(c.stream);
    if (fits_i32(std::max(total, g_.planes * g_.H * g_.W)))
      launch_kernel(max_pool_kernel<T, int32_t, Ix>, grid_for(total), kBlock, 0, s, x, y, idx, g_,
                    static_cast<int32_t>(total), relu_mask_, relu_out_, bias);
    else
      launch_kernel(max_pool_kernel<T, int64_t, Ix>, grid_for(total), kBlock, 0, s, x, y, idx, g_,
                    total, relu_mask_, relu_out_, bias);
  }

  int32_t device_;
  PoolGeom g_;
  bool relu_mask_;
  bool relu_out_;      // y = relu(max): the fused conv + ReLU + pool
  bool bias_;          // y = max + bias[channel] (before the ReLU): the fused conv + pool
  bool u8_;            // window_index: u8 taps
};

template <class T>
class MaxPool2dBackwardKernel final : public Kernel {
 public:
  explicit MaxPool2dBackwardKernel(const NodeInfo& node)
      : device_(node.device()),
        g_(make_geom(node.attr_ints("input_shape").data(), node.input(0).shape, node, true)),
        u8_(node.input(1).dtype == PLX_U8) {
    PLX_REQUIRE(g_.H * g_.W <= INT32_MAX,
                "max_pool2d_backward: an input plane too large for i32 indices");
    g_.out_nhwc = nhwc_or_decline(node.input(0), "max_pool2d_backward", "dy");
    g_.idx_nhwc = nhwc_or_decline(node.input(1), "max_pool2d_backward", "the indices");
    g_.in_nhwc = nhwc_or_decline(node.output(0), "max_pool2d_backward", "dx");
  }

  void compute(const KernelCall& c) override {
    if (u8_)
      launch(ptr<T>(c.in(0)), ptr<uint8_t>(c.in(1)), ptr<T>(c.out(0)), nullptr, c.stream);
    else
      launch(ptr<T>(c.in(0)), ptr<int32_t>(c.in(1)), ptr<T>(c.out(0)), nullptr, c.stream);
  }
  // The fused relu_backward + max_pool2d_backward: the layouts of the ReLU's dy, which the
  // kernel reads in place of the node's dy, and of its y.
  void set_relu_layouts(const plx_tensor& dy, const plx_tensor& y) {
    g_.out_nhwc = nhwc_or_decline(dy, "relu_backward+max_pool2d_backward", "dy");
    g_.relu_nhwc = nhwc_or_decline(y, "relu_backward+max_pool2d_backward", "y");
  }
  bool window_indices() const { return u8_; }

  // dy, idx (N, C, OH, OW) -> dx (N, C, H, W); relu_y: the fused ReLU's output, or null.
  template <class Ix>
  void launch(const T* dy, const Ix* idx, T* dx, const T* relu_y, plx_stream stream) const {
    const int64_t total = g_.planes * g_.H * g_.W;
    if (total == 0) return;
    use_device(device_);
    const cudaStream_t s = native(stream);
    if (fits_i32(std::max(total, g_.planes * g_.OH * g_.OW)))
      launch_kernel(max_pool_backward_kernel<T, int32_t, Ix>, grid_for(total), kBlock, 0, s, dy,
                    idx, dx, g_, static_cast<int32_t>(total), relu_y);
    else
      launch_kernel(max_pool_backward_kernel<T, int64_t, Ix>, grid_for(total), kBlock, 0, s, dy,
                    idx, dx, g_, total, relu_y);
  }

 private:
  int32_t device_;
  PoolGeom g_;
  bool u8_;  // window_index: u8 taps
};

// max_pool2d_backward with the bias gradient's sum of its output, for the chunked conv + pool
// backward (sdk::PoolBiasMaker): channel_sum_kernel (PoolGrad) for an NCHW dx, column_sum_kernel
// (PoolCols) for a channels-last one. Outputs: dx, db (C).
template <class T>
class MaxPool2dBackwardSumKernel final : public Kernel {
 public:
  MaxPool2dBackwardSumKernel(const NodeInfo& node, int sms)
      : device_(node.device()),
        g_(make_geom(node.attr_ints("input_shape").data(), node.input(0).shape, node, true)),
        u8_(node.input(1).dtype == PLX_U8) {
    const char* op = "max_pool2d_backward+sum";
    const plx_tensor& dy = node.input(0);
    PLX_REQUIRE(dy.ndim == 4, "max_pool2d_backward: 4-D dy expected");
    images_ = dy.shape[0];
    channels_ = dy.shape[1];
    PLX_REQUIRE(g_.H * g_.W <= INT32_MAX,
                "max_pool2d_backward: an input plane too large for i32 indices");
    PLX_REQUIRE(channels_ <= INT32_MAX, "max_pool2d_backward: too many channels");
    g_.out_nhwc = nhwc_or_decline(dy, op, "dy");
    g_.idx_nhwc = nhwc_or_decline(node.input(1), op, "the indices");
    g_.in_nhwc = nhwc_or_decline(node.output(0), op, "dx");
    splits_ = g_.in_nhwc ? column_sum_splits(sms, images_ * g_.H * g_.W, channels_)
                         : channel_sum_splits(sms, channels_, images_);
    done_ = sum_counters(g_.in_nhwc, channels_, splits_);
  }

  // The partial sums, channels x splits.
  uint64_t workspace_bytes() const override {
    return static_cast<uint64_t>(channels_) * splits_ * sizeof(float);
  }

  void compute(const KernelCall& c) override {
    if (u8_) launch(c, ptr<uint8_t>(c.in(1)));
    else launch(c, ptr<int32_t>(c.in(1)));
  }

 private:
  template <class Ix>
  void launch(const KernelCall& c, const Ix* idx) const {
    use_device(device_);
    if (channels_ == 0) return;
    const cudaStream_t s = native(c.stream);
    const T* dy = ptr<T>(c.in(0));
    T* dx = ptr<T>(c.out(0));
    T* db = ptr<T>(c.out(1));
    float* part = static_cast<float*>(c.workspace);
    const int64_t hw = g_.H * g_.W;
    if (g_.in_nhwc) {  // dx (N·H·W, C): its channel sums are column sums
      const int64_t rows = images_ * hw;
      if (rows == 0) {
        PLX_CUDA_CHECK(cudaMemsetAsync(db, 0, static_cast<size_t>(channels_) * sizeof(T), s));
        return;
      }
      const dim3 grid(static_cast<unsigned>((channels_ + kColTile - 1) / kColTile), splits_);
      if (fits_i32(std::max(rows * channels_, g_.planes * g_.OH * g_.OW)))
        launch_kernel(column_sum_kernel<T, PoolCols<T, Ix, int32_t>>, grid, kBlock, 0, s,
                      PoolCols<T, Ix, int32_t>{dy, idx, g_}, dx, rows, channels_, part, db,
                      done_.p);
      else
        launch_kernel(column_sum_kernel<T, PoolCols<T, Ix, int64_t>>, grid, kBlock, 0, s,
                      PoolCols<T, Ix, int64_t>{dy, idx, g_}, dx, rows, channels_, part, db,
                      done_.p);
      return;
    }
    const dim3 grid(static_cast<unsigned>(channels_), splits_);
    if (fits_i32(std::max(g_.planes * hw, g_.planes * g_.OH * g_.OW)))
      launch_kernel(channel_sum_kernel<T, int32_t, PoolGrad<T, int32_t, Ix>>, grid, kBlock, 0, s,
                    PoolGrad<T, int32_t, Ix>{dy, idx, g_}, dx, static_cast<int32_t>(channels_),
                    static_cast<int32_t>(images_), static_cast<int32_t>(hw), part, db, done_.p);
    else
      launch_kernel(channel_sum_kernel<T, int64_t, PoolGrad<T, int64_t, Ix>>, grid, kBlock, 0, s,
                    PoolGrad<T, int64_t, Ix>{dy, idx, g_}, dx, channels_, images_, hw, part, db,
                    done_.p);
  }

  int32_t device_;
  PoolGeom g_;
  bool u8_;
  int64_t images_ = 0, channels_ = 0;
  unsigned splits_ = 1;
  BlockCounter done_;
};

// relu_backward(dy, y) whose output a bias gradient's sum (over axes 0, 2, 3) also reads, as one
// kernel writing both (a conv layer without a pool: its ReLU's backward and its bias gradient);
// and relu_backward or gelu_backward(dy, x) with the sum over the rows of a 2-d gradient (a
// linear layer's). Inputs and outputs at the fused group's boundary slots.
template <class T>
class ActBackwardSumKernel final : public Kernel {
 public:
  ActBackwardSumKernel(const sdk::GraphView& g, const sdk::Boundary& b, int sms)
      : device_(g.device()), gelu_(g.is(0, "gelu_backward")) {
    const plx_graph_node& relu = g.node(0);
    const plx_graph_node& sum = g.node(1);
    const char* op = relu.op;
    if (gelu_) {
      const sdk::OwnedNodeInfo info(g, 0);
      tanh_ = gelu_tanh(NodeInfo(&info.get()));
    }
    dy_ = b.input(relu.inputs[0]);
    y_ = b.input(relu.inputs[1]);
    dx_ = b.output(relu.outputs[0]);
    db_ = b.output(sum.outputs[0]);
    PLX_DECLINE_UNLESS(dy_ >= 0 && y_ >= 0 && dx_ >= 0 && db_ >= 0,
                       "%s+sum: an input or output is not at the boundary", op);
    const plx_tensor& x = g.value(relu.outputs[0]);
    const plx_tensor* all[3] = {&x, &g.value(relu.inputs[0]), &g.value(relu.inputs[1])};
    bool nchw = x.ndim == 4 || x.ndim == 2, nhwc = x.ndim == 4;
    for (const plx_tensor* t : all) {
      nchw = nchw && sdk::is_contiguous(*t);
      nhwc = nhwc && sdk::is_channels_last(*t);
    }
    PLX_DECLINE_UNLESS(nchw || nhwc,
                       "%s+sum: dy, its saved input and dx all NCHW or all channels-last, or "
                       "(rows, cols) contiguous",
                       op);
    images_ = x.shape[0];
    channels_ = x.shape[1];
    rows_ = x.ndim == 2;  // a linear layer's: the sum over rows
    hw_ = rows_ ? 1 : x.shape[2] * x.shape[3];
    if (!nchw) {  // channels-last: (N·H·W, C) rows, the bias gradient their column sums
      images_ *= hw_;
      hw_ = 1;
      rows_ = true;
    }
    PLX_DECLINE_UNLESS(channels_ <= INT32_MAX, "%s+sum: too many channels", op);
    PLX_DECLINE_UNLESS(!gelu_ || rows_,
                       "gelu_backward+sum: only as column sums (a 2-d or channels-last gradient)");
    splits_ = rows_ ? column_sum_splits(sms, images_, channels_) : channel_sum_splits(sms, channels_, images_);
    done_ = sum_counters(rows_, channels_, splits_);
  }

  uint64_t workspace_bytes() const override {
    return static_cast<uint64_t>(channels_) * splits_ * sizeof(float);
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    if (channels_ == 0) return;
    const cudaStream_t s = native(c.stream);
    if (rows_) {
      if (images_ == 0) {  // no row: the sums are 0
        PLX_CUDA_CHECK(cudaMemsetAsync(c.out(db_).data, 0, static_cast<size_t>(channels_) * sizeof(T), s));
        return;
      }
      const dim3 grid(static_cast<unsigned>((channels_ + kColTile - 1) / kColTile), splits_);
      if (gelu_)
        launch_kernel(column_sum_kernel<T, GeluCols<T>>, grid, kBlock, 0, s,
                      GeluCols<T>{ptr<T>(c.in(dy_)), ptr<T>(c.in(y_)), tanh_}, ptr<T>(c.out(dx_)),
                      images_, channels_, static_cast<float*>(c.workspace), ptr<T>(c.out(db_)),
                      done_.p);
      else
        launch_kernel(column_sum_kernel<T, ReluCols<T>>, grid, kBlock, 0, s,
                      ReluCols<T>{ptr<T>(c.in(dy_)), ptr<T>(c.in(y_))}, ptr<T>(c.out(dx_)),
                      images_, channels_, static_cast<float*>(c.workspace), ptr<T>(c.out(db_)),
                      done_.p);
      return;
    }
    const dim3 grid(static_cast<unsigned>(channels_), splits_);
    const T* dy = ptr<T>(c.in(dy_));
    const T* y = ptr<T>(c.in(y_));
    T* dx = ptr<T>(c.out(dx_));
    T* db = ptr<T>(c.out(db_));
    float* part = static_cast<float*>(c.workspace);
    if (fits_i32(images_ * channels_ * hw_))
      launch_kernel(channel_sum_kernel<T, int32_t, ReluGrad<T, int32_t>>, grid, kBlock, 0, s,
                    ReluGrad<T, int32_t>{dy, y, static_cast<int32_t>(hw_)}, dx,
                    static_cast<int32_t>(channels_), static_cast<int32_t>(images_),
                    static_cast<int32_t>(hw_), part, db, done_.p);
    else
      launch_kernel(channel_sum_kernel<T, int64_t, ReluGrad<T, int64_t>>, grid, kBlock, 0, s,
                    ReluGrad<T, int64_t>{dy, y, hw_}, dx, channels_, images_, hw_, part, db,
                    done_.p);
  }

 private:
  int32_t device_;
  bool gelu_ = false, tanh_ = false;  // gelu_backward (its tanh form), else relu_backward
  int32_t dy_ = -1, y_ = -1, dx_ = -1, db_ = -1;  // y_: relu's y, gelu's x
  int64_t images_ = 0, channels_ = 0, hw_ = 0;  // (rows, cols, 1) for a 2-d gradient
  bool rows_ = false;
  unsigned splits_ = 1;
  BlockCounter done_;
};

// relu_backward(dy, y) -> max_pool2d_backward(., indices) as one kernel (the backward of ReLU
// with pooling): the masked gradient is never written. Inputs and output at the fused group's
// boundary slots.
template <class T>
class ReluMaxPool2dBackwardKernel final : public Kernel {
 public:
  ReluMaxPool2dBackwardKernel(const NodeInfo& pool, const sdk::ReluMaxPoolBackwardSlots& s,
                              const plx_tensor& relu_dy, const plx_tensor& relu_y)
      : pool_(pool), dy_(s.dy), y_(s.y), idx_(s.indices), dx_(s.dx) {
    // The pool's dy is the ReLU's output, which is never written: the kernel reads the ReLU's
    // dy and y, in their own layouts.
    pool_.set_relu_layouts(relu_dy, relu_y);
  }

  void compute(const KernelCall& c) override {
    // i32 positions, or the u8 window taps of a training step's pools (window_index).
    if (pool_.window_indices())
      pool_.launch(ptr<T>(c.in(dy_)), ptr<uint8_t>(c.in(idx_)), ptr<T>(c.out(dx_)),
                   ptr<T>(c.in(y_)), c.stream);
    else
      pool_.launch(ptr<T>(c.in(dy_)), ptr<int32_t>(c.in(idx_)), ptr<T>(c.out(dx_)),
                   ptr<T>(c.in(y_)), c.stream);
  }

 private:
  MaxPool2dBackwardKernel<T> pool_;
  int32_t dy_, y_, idx_, dx_;
};

template <class T>
class AvgPool2dKernel final : public Kernel {
 public:
  explicit AvgPool2dKernel(const NodeInfo& node)
      : device_(node.device()),
        g_(make_geom(node.input(0).shape, node.output(0).shape, node, false)) {
    g_.include_pad = node.attr_int("count_include_pad") != 0 ? 1 : 0;
  }

  void compute(const KernelCall& c) override {
    const int64_t total = g_.planes * g_.OH * g_.OW;
    if (total == 0) return;
    use_device(device_);
    const T* x = ptr<T>(c.in(0));  // (N·C, H, W)
    T* y = ptr<T>(c.out(0));       // (N·C, OH, OW)
    const cudaStream_t s = native(c.stream);
    if (fits_i32(std::max(total, g_.planes * g_.H * g_.W)))
      launch_kernel(avg_pool_kernel<T, int32_t>, grid_for(total), kBlock, 0, s, x, y, g_,
                    static_cast<int32_t>(total));
    else
      launch_kernel(avg_pool_kernel<T, int64_t>, grid_for(total), kBlock, 0, s, x, y, g_, total);
  }

 private:
  int32_t device_;
  PoolGeom g_;
};

template <class T>
class AvgPool2dBackwardKernel final : public Kernel {
 public:
  explicit AvgPool2dBackwardKernel(const NodeInfo& node)
      : device_(node.device()),
        g_(make_geom(node.attr_ints("input_shape").data(), node.input(0).shape, node, false)) {
    g_.include_pad = node.attr_int("count_include_pad") != 0 ? 1 : 0;
  }

  void compute(const KernelCall& c) override {
    const int64_t total = g_.planes * g_.H * g_.W;
    if (total == 0) return;
    use_device(device_);
    const T* dy = ptr<T>(c.in(0));  // (N·C, OH, OW)
    T* dx = ptr<T>(c.out(0));       // (N·C, H, W)
    const cudaStream_t s = native(c.stream);
    if (fits_i32(std::max(total, g_.planes * g_.OH * g_.OW)))
      launch_kernel(avg_pool_backward_kernel<T, int32_t>, grid_for(total), kBlock, 0, s, dy, dx, g_,
                    static_cast<int32_t>(total));
    else
      launch_kernel(avg_pool_backward_kernel<T, int64_t>, grid_for(total), kBlock, 0, s, dy, dx, g_,
                    total);
  }

 private:
  int32_t device_;
  PoolGeom g_;
};

// `half_layout`: the layout the f16 and bf16 kernels prefer (f32 ones prefer NCHW).
template <template <class> class K>
void add_float(KernelRegistry& r, const char* op, uint32_t flags,
               plx_layout half_layout = PLX_LAYOUT_NCHW) {
  r.add<K<float>>(op, PLX_F32, "cuda", flags, PLX_LAYOUT_NCHW);
  r.add<K<f16>>(op, PLX_F16, "cuda", flags, half_layout);
  r.add<K<bf16>>(op, PLX_BF16, "cuda", flags, half_layout);
}

}  // namespace

std::unique_ptr<Kernel> make_relu_max_pool_backward(const sdk::GraphView& g, const sdk::Boundary& b,
                                                    plx_dtype& dtype) {
  const sdk::ReluMaxPoolBackwardSlots sl = sdk::relu_max_pool_backward_slots(g, b);
  dtype = sl.dtype;
  const sdk::OwnedNodeInfo info(g, 1);
  const NodeInfo node(&info.get());
  const plx_tensor& dy = g.value(g.node(0).inputs[0]);
  const plx_tensor& y = g.value(g.node(0).inputs[1]);
  switch (dtype) {
    case PLX_F32:
      return std::make_unique<ReluMaxPool2dBackwardKernel<float>>(node, sl, dy, y);
    case PLX_F16:
      return std::make_unique<ReluMaxPool2dBackwardKernel<f16>>(node, sl, dy, y);
    case PLX_BF16:
      return std::make_unique<ReluMaxPool2dBackwardKernel<bf16>>(node, sl, dy, y);
    default: break;
  }
  throw sdk::Unsupported(
      sdk::format("relu_backward+max_pool2d_backward: no %s kernel", plexus::dtype_name(dtype)));
}

// The max-pool kernel of a fused conv + pool group (ReLU and bias as MaxPool2dKernel says); null
// where the node is not a 4-D pool with its indices, or for another dtype.
std::unique_ptr<Kernel> make_fused_max_pool(const plx_node_info& pool, bool relu, bool bias,
                                            uint32_t& flags) {
  const NodeInfo node(&pool);
  flags = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  if (node.num_inputs() < 1 || node.num_outputs() < 2 || node.input(0).ndim != 4) return nullptr;
  switch (node.input(0).dtype) {
    case PLX_F32: return std::make_unique<MaxPool2dKernel<float>>(node, relu, bias);
    case PLX_F16: return std::make_unique<MaxPool2dKernel<f16>>(node, relu, bias);
    case PLX_BF16: return std::make_unique<MaxPool2dKernel<bf16>>(node, relu, bias);
    default: return nullptr;
  }
}

std::unique_ptr<Kernel> make_max_pool_relu(const plx_node_info& pool, uint32_t& flags) {
  return make_fused_max_pool(pool, true, false, flags);
}

std::unique_ptr<Kernel> make_max_pool_bias_relu(const plx_node_info& pool, bool relu,
                                                uint32_t& flags) {
  // f32 only: there the convolution's f32 sum plus the bias rounds once either way, so the
  // result is the unfused one's. In f16 and bf16 the pre-pool values would be rounded before the
  // bias is added instead of after, which moves the maximum among values that round alike
  // (frequent in bf16) away from where the unfused nodes, and the CPU reference, find it.
  if (pool.num_inputs < 1 || pool.inputs[0].dtype != PLX_F32) return nullptr;
  return make_fused_max_pool(pool, relu, true, flags);
}

std::unique_ptr<Kernel> make_max_pool_backward_sum(const plx_node_info& pool, int sms,
                                                   uint32_t& flags) {
  const NodeInfo node(&pool);
  flags = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  if (node.num_inputs() < 2 || node.num_outputs() < 1 || node.input(0).ndim != 4) return nullptr;
  switch (node.input(0).dtype) {
    case PLX_F32: return std::make_unique<MaxPool2dBackwardSumKernel<float>>(node, sms);
    case PLX_F16: return std::make_unique<MaxPool2dBackwardSumKernel<f16>>(node, sms);
    case PLX_BF16: return std::make_unique<MaxPool2dBackwardSumKernel<bf16>>(node, sms);
    default: return nullptr;
  }
}

std::unique_ptr<Kernel> make_act_backward_sum(const sdk::GraphView& g, const sdk::Boundary& b,
                                              int sms, plx_dtype& dtype) {
  PLX_DECLINE_UNLESS(g.num_nodes() == 2 && (g.is(0, "relu_backward") || g.is(0, "gelu_backward")) &&
                         g.is(1, "sum"),
                     "not relu_backward or gelu_backward then its sum");
  dtype = static_cast<plx_dtype>(g.value(g.node(0).inputs[0]).dtype);
  switch (dtype) {
    case PLX_F32: return std::make_unique<ActBackwardSumKernel<float>>(g, b, sms);
    case PLX_F16: return std::make_unique<ActBackwardSumKernel<f16>>(g, b, sms);
    case PLX_BF16: return std::make_unique<ActBackwardSumKernel<bf16>>(g, b, sms);
    default: break;
  }
  throw sdk::Unsupported(
      sdk::format("%s+sum: no %s kernel", g.node(0).op, plexus::dtype_name(dtype)));
}

void register_pool(KernelRegistry& r) {
  // Gathers without atomics: bit-identical run to run.
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  // Max pooling takes either layout; in 16 bits it prefers channels-last, as the convolutions
  // before and after it do there, so the layout planner can carry NHWC through it.
  add_float<MaxPool2dKernel>(r, "max_pool2d", f, PLX_LAYOUT_NHWC);
  add_float<MaxPool2dBackwardKernel>(r, "max_pool2d_backward", f, PLX_LAYOUT_NHWC);
  add_float<AvgPool2dKernel>(r, "avg_pool2d", f);
  add_float<AvgPool2dBackwardKernel>(r, "avg_pool2d_backward", f);
}

}  // namespace plexus::cuda
