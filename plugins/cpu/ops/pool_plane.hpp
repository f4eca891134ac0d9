// The geometry of the CPU plugin's pooling kernels and one plane of max pooling, forward and
// backward, shared by the pool kernels (ops/pool.cpp) and the conv + pool fusions
// (ops/conv_pool.cpp), which run the same loops plane by plane and so agree with them to the bit.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common.hpp"

namespace plexus::cpu::pooling {

constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}
constexpr int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// The geometry along one spatial axis.
struct Axis {
  int64_t in, out, k, s, p, d;
  // Per output o: the taps [tap_lo, tap_hi) of its window that fall inside the input.
  std::vector<int64_t> tap_lo, tap_hi;
  // Per output o: its window clipped to the input [clip_lo, clip_hi), and the size it counts
  // with count_include_pad (clipped to the padded input only).
  std::vector<int64_t> clip_lo, clip_hi, padded_size;
  // Per input i: the windows [win_lo, win_hi) whose extent covers i.
  std::vector<int64_t> win_lo, win_hi;

  Axis(int64_t in_, int64_t out_, int64_t k_, int64_t s_, int64_t p_, int64_t d_)
      : in(in_), out(out_), k(k_), s(s_), p(p_), d(d_) {
    const size_t n = static_cast<size_t>(out), m = static_cast<size_t>(in);
    tap_lo.resize(n), tap_hi.resize(n), clip_lo.resize(n), clip_hi.resize(n), padded_size.resize(n);
    for (int64_t o = 0; o < out; ++o) {
      const size_t u = static_cast<size_t>(o);
      const int64_t start = o * s - p;  // input position of tap 0
      tap_lo[u] = std::clamp<int64_t>(ceil_div(-start, d), 0, k);
      tap_hi[u] = std::clamp<int64_t>(ceil_div(in - start, d), tap_lo[u], k);
      clip_lo[u] = std::max<int64_t>(start, 0);
      clip_hi[u] = std::max(std::min(start + k, in), clip_lo[u]);
      padded_size[u] = std::min(start + k, in + p) - start;
    }
    const int64_t extent = d * (k - 1) + 1;
    win_lo.resize(m), win_hi.resize(m);
    for (int64_t i = 0; i < in; ++i) {
      const size_t u = static_cast<size_t>(i);
      win_lo[u] = std::clamp<int64_t>(ceil_div(i + p - extent + 1, s), 0, out);
      win_hi[u] = std::clamp<int64_t>(floor_div(i + p, s) + 1, win_lo[u], out);
    }
  }
};

struct PoolGeom {
  int64_t planes;  // N·C
  Axis h, w;

  // x (N, C, H, W), y (N, C, OH, OW); dilation is 1 for average pooling.
  static PoolGeom make(const int64_t* x, const int64_t* y, const NodeInfo& node, bool dilated) {
    const auto kernel = node.attr_ints("kernel"), pad = node.attr_ints("padding");
    auto stride = node.attr_ints("stride");
    if (stride.empty()) stride = kernel;
    const std::vector<int64_t> dil =
        dilated ? node.attr_ints("dilation") : std::vector<int64_t>{1, 1};
    PLX_REQUIRE(kernel.size() == 2 && stride.size() == 2 && pad.size() == 2 && dil.size() == 2,
                "%s: kernel, stride, padding and dilation must have 2 values", node.op());
    PLX_REQUIRE(kernel[0] >= 1 && kernel[1] >= 1 && stride[0] >= 1 && stride[1] >= 1 &&
                    dil[0] >= 1 && dil[1] >= 1,
                "%s: bad kernel, stride or dilation", node.op());
    return PoolGeom{x[0] * x[1], Axis(x[2], y[2], kernel[0], stride[0], pad[0], dil[0]),
                    Axis(x[3], y[3], kernel[1], stride[1], pad[1], dil[1])};
  }
  // 2x2 windows at stride 2 without padding or dilation, all inside the input: the usual
  // downsampling, which needs no tap ranges.
  bool pairs() const {
    return h.k == 2 && w.k == 2 && h.s == 2 && w.s == 2 && h.p == 0 && w.p == 0 && h.d == 1 &&
           w.d == 1 && 2 * h.out <= h.in && 2 * w.out <= w.in;
  }
  // No two windows share an input element, so each dx element has at most one source and the
  // backward ops can scatter instead of gather.
  bool disjoint() const { return h.s >= h.d * (h.k - 1) + 1 && w.s >= w.d * (w.k - 1) + 1; }
  int64_t in_plane() const { return h.in * w.in; }
  int64_t out_plane() const { return h.out * w.out; }
  // Planes per thread below which a loop stays serial.
  int64_t grain(int64_t work_per_plane) const {
    return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(work_per_plane, 1));
  }
};

// v beats the best so far: larger, or the first NaN (NaN counts as the maximum, as in argmax).
template <class A>
inline bool beats(A v, A best) {
  return v > best || (v != v && best == best);
}

// An index as max_pool2d writes it: i32, the position h·W + w in the plane (-1: none), or u8
// with window_index, the tap kh·KW + kw in the window (255: none).
constexpr uint8_t kNoTap = 255;
inline int32_t encode_index(int32_t, int64_t flat, int64_t, bool none) {
  return none ? -1 : static_cast<int32_t>(flat);
}
inline uint8_t encode_index(uint8_t, int64_t, int64_t tap, bool none) {
  return none ? kNoTap : static_cast<uint8_t>(tap);
}
// The tap (kh·2 + kw) of a 2x2 stride-2 window whose first element is at `first`, in a plane
// W wide; -1 when the index names none of its four.
inline int64_t window_tap(uint8_t v, int64_t, int64_t) { return v < 4 ? int64_t{v} : -1; }
inline int64_t window_tap(int32_t v, int64_t first, int64_t W) {
  const int64_t d = v - first;
  return d == 0 ? 0 : d == 1 ? 1 : d == W ? 2 : d == W + 1 ? 3 : -1;
}
// Back to the position in the plane (-1: none), for output (oh, ow).
inline int64_t flat_index(const PoolGeom&, int32_t v, int64_t, int64_t) { return v; }
inline int64_t flat_index(const PoolGeom& g, uint8_t v, int64_t oh, int64_t ow) {
  if (v == kNoTap) return -1;
  const int64_t kh = v / g.w.k, kw = v % g.w.k;
  return (oh * g.h.s - g.h.p + kh * g.h.d) * g.w.in + (ow * g.w.s - g.w.p + kw * g.w.d);
}

// One output row of a 2x2 stride-2 f32 max pool, four outputs at a time in vectors (GCC's vector
// extensions: SSE or wider, whatever the target has), the same comparisons in the same order as
// the scalar loop of max_pool_plane, so the same results. The last group overlaps the one before
// it when OW is not a multiple of 4 (its outputs are written twice, with the same values). Why
// not the compiler's own vectorisation: our planes' rows are 7 and 14 outputs wide, so most of
// a row fell to the scalar tail, whose comparisons are branches; on fresh activations (a ReLU's
// output, half zeros) those go either way at random, and a row cost 11 ns an output. Needs
// OW >= 4.
template <class I>
void max_pool_pairs_row_f32(const float* r0, const float* r1, float* out, I* out_idx, int64_t OW,
                            int32_t row, int32_t W, bool rm) {
  using v4 = float __attribute__((vector_size(16)));
  using i4 = int32_t __attribute__((vector_size(16)));
  auto load4 = [](const float* p) {
    v4 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  for (int64_t o = 0; o < OW; o += 4) {
    const int64_t ow = std::min(o, OW - 4);
    const v4 x0 = load4(r0 + 2 * ow), x1 = load4(r0 + 2 * ow + 4);
    const v4 y0 = load4(r1 + 2 * ow), y1 = load4(r1 + 2 * ow + 4);
    const v4 a = __builtin_shufflevector(x0, x1, 0, 2, 4, 6);
    const v4 b = __builtin_shufflevector(x0, x1, 1, 3, 5, 7);
    const v4 c = __builtin_shufflevector(y0, y1, 0, 2, 4, 6);
    const v4 d = __builtin_shufflevector(y0, y1, 1, 3, 5, 7);
    v4 best = a;
    i4 tap = {0, 0, 0, 0};
    auto step = [&](v4 v, int32_t t) {  // beats(v, best), lane by lane
      const i4 m = (v > best) | ((v != v) & (best == best));
      best = m ? v : best;
      tap = m ? i4{t, t, t, t} : tap;
    };
    step(b, 1);
    step(c, 2);
    step(d, 3);
    std::memcpy(out + ow, &best, sizeof best);
    const i4 none = rm ? ~(best > v4{0, 0, 0, 0}) : i4{0, 0, 0, 0};
    const int32_t w0 = static_cast<int32_t>(2 * ow);
    const i4 at = row + (tap >> 1) * W + i4{w0, w0 + 2, w0 + 4, w0 + 6} + (tap & 1);
    for (int l = 0; l < 4; ++l) out_idx[ow + l] = encode_index(I{}, at[l], tap[l], none[l] != 0);
  }
}

// The backward of one such row (max_pool_backward_plane's 2x2 path), four windows at a time in
// the same way: window ow's gradient grad(base + ow) goes to the element of its 2x2 block (rows
// d0, d1) that its index names, as 0 + g, and zeros to the other three. Needs OW >= 4.
template <class Grad, class I>
void max_pool_backward_pairs_row_f32(const Grad& grad, int64_t base, const I* idx, int64_t at,
                                     int64_t W, int64_t OW, float* d0, float* d1) {
  using v4 = float __attribute__((vector_size(16)));
  using v8 = float __attribute__((vector_size(32)));
  using i4 = int32_t __attribute__((vector_size(16)));
  for (int64_t o = 0; o < OW; o += 4) {
    const int64_t ow = std::min(o, OW - 4);
    v4 gv;
    i4 t;
    for (int l = 0; l < 4; ++l) {
      gv[l] = 0.0f + grad(base + ow + l);
      t[l] = static_cast<int32_t>(window_tap(idx[ow + l], at + 2 * (ow + l), W));
    }
    const v4 z = {0, 0, 0, 0};
    const v4 e0 = t == 0 ? gv : z, e1 = t == 1 ? gv : z;
    const v4 e2 = t == 2 ? gv : z, e3 = t == 3 ? gv : z;
    const v8 top = __builtin_shufflevector(e0, e1, 0, 4, 1, 5, 2, 6, 3, 7);
    const v8 bottom = __builtin_shufflevector(e2, e3, 0, 4, 1, 5, 2, 6, 3, 7);
    std::memcpy(d0 + 2 * ow, &top, sizeof top);
    std::memcpy(d1 + 2 * ow, &bottom, sizeof bottom);
  }
}

// One plane of y, indices = max_pool2d(x): src (H, W) -> dst, dst_idx (OH, OW). relu_mask
// (`rm`): index "none" where y is not > 0, the mask relu_backward(dy, y) would apply (best is a
// loaded T, so it is y exactly).
template <class T, class I>
void max_pool_plane(const PoolGeom& g, bool pairs, bool rm, const T* src, T* dst, I* dst_idx) {
  using A = acc_t<T>;
  const int64_t W = g.w.in;
  if (pairs) {
    // The bounds in locals: a u8 index store may alias anything, so with g's fields as bounds
    // GCC reloaded them after every store and could not count (nor vectorise) the loop.
    const int64_t OH = g.h.out, OW = g.w.out;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const T* r0 = src + 2 * oh * W;  // (W)
      const T* r1 = r0 + W;
      T* out = dst + oh * OW;          // (OW)
      I* out_idx = dst_idx + oh * OW;  // (OW)
      const int32_t row = static_cast<int32_t>(2 * oh * W), w32 = static_cast<int32_t>(W);
      if constexpr (std::is_same_v<T, float>) {
        if (OW >= 4) {
          max_pool_pairs_row_f32(r0, r1, out, out_idx, OW, row, w32, rm);
          continue;
        }
      }
#pragma GCC ivdep  // out and out_idx never alias the rows read
      for (int64_t ow = 0; ow < OW; ++ow) {
        // Taps in index order, so a strict comparison keeps the first maximum (16-bit and f64
        // types, and rows under 4 windows; f32 rows take max_pool_pairs_row_f32).
        const A a = load(r0, 2 * ow), b = load(r0, 2 * ow + 1), c = load(r1, 2 * ow),
                d = load(r1, 2 * ow + 1);
        A best = a;
        int32_t tap = 0;  // kh·2 + kw
        bool m = beats(b, best);
        best = m ? b : best, tap = m ? 1 : tap;
        m = beats(c, best);
        best = m ? c : best, tap = m ? 2 : tap;
        m = beats(d, best);
        best = m ? d : best, tap = m ? 3 : tap;
        store(out, ow, best);
        const int32_t at = row + (tap >> 1) * w32 + 2 * static_cast<int32_t>(ow) + (tap & 1);
        out_idx[ow] = encode_index(I{}, at, tap, rm && !(best > A(0)));
      }
    }
    return;
  }
  for (int64_t oh = 0; oh < g.h.out; ++oh) {
    const size_t uh = static_cast<size_t>(oh);
    for (int64_t ow = 0; ow < g.w.out; ++ow) {
      const size_t uw = static_cast<size_t>(ow);
      // A window of padding only (possible with dilation) gives -inf and index -1, which the
      // backward op never matches.
      A best = -std::numeric_limits<A>::infinity();
      int64_t at = -1, tap = -1;
      for (int64_t kh = g.h.tap_lo[uh]; kh < g.h.tap_hi[uh]; ++kh) {
        const int64_t ih = oh * g.h.s - g.h.p + kh * g.h.d;
        for (int64_t kw = g.w.tap_lo[uw]; kw < g.w.tap_hi[uw]; ++kw) {
          const int64_t i = ih * W + ow * g.w.s - g.w.p + kw * g.w.d;
          const A v = load(src, i);
          if (at < 0 || beats(v, best)) best = v, at = i, tap = kh * g.w.k + kw;
        }
      }
      store(dst, oh * g.w.out + ow, best);
      dst_idx[oh * g.w.out + ow] = encode_index(I{}, at, tap, at < 0 || (rm && !(best > A(0))));
    }
  }
}

// One plane of dx = max_pool2d_backward(g(o), indices): src_idx (OH, OW) -> dst (H, W), where
// grad(base + o) is the output gradient at the plane's output o. Gathers: each dx element sums
// the gradients of the windows whose index names it, in a fixed order; with disjoint windows
// (at most one source each) it scatters onto zeros instead, where the one addition is exact.
template <class T, class Grad, class I>
void max_pool_backward_plane(const PoolGeom& g, bool disjoint, const Grad& grad, int64_t base,
                             const I* src_idx, T* dst) {
  using A = acc_t<T>;
  const int64_t OW = g.w.out;
  if (g.pairs()) {
    // 2x2 windows at stride 2 (PoolGeom::pairs): each window writes its four elements, the
    // gradient where its index points and zero elsewhere, as 0 + g (what the scatter below
    // adds onto zeros, so -0 becomes +0 the same way); a row or column no window covers (an
    // odd edge) is zero. No scatter, no division: GCC vectorises the loop.
    const int64_t OH = g.h.out, W = g.w.in;
    const T zero = convert<T>(A(0));
    for (int64_t oh = 0; oh < OH; ++oh) {
      T* d0 = dst + 2 * oh * W;  // (W)
      T* d1 = d0 + W;
      const I* idx = src_idx + oh * OW;  // (OW)
      const int64_t at = 2 * oh * W;     // the window's first element, for i32 positions
      int64_t done = 0;                  // windows written by the vector path
      if constexpr (std::is_same_v<T, float>) {
        if (OW >= 4) {
          max_pool_backward_pairs_row_f32(grad, base + oh * OW, idx, at, W, OW, d0, d1);
          done = OW;
        }
      }
#pragma GCC ivdep  // dst never aliases the indices or the gradient
      for (int64_t ow = done; ow < OW; ++ow) {
        const A gv = A(0) + static_cast<A>(grad(base + oh * OW + ow));
        const int64_t t = window_tap(idx[ow], at + 2 * ow, W);  // 0..3, or -1: none
        store(d0, 2 * ow, t == 0 ? gv : A(0));
        store(d0, 2 * ow + 1, t == 1 ? gv : A(0));
        store(d1, 2 * ow, t == 2 ? gv : A(0));
        store(d1, 2 * ow + 1, t == 3 ? gv : A(0));
      }
      std::fill(d0 + 2 * OW, d0 + W, zero);
      std::fill(d1 + 2 * OW, d1 + W, zero);
    }
    std::fill(dst + 2 * OH * W, dst + g.in_plane(), zero);
    return;
  }
  if (disjoint) {
    // Indices outside the plane (-1: a window of padding only) are skipped.
    std::fill(dst, dst + g.in_plane(), convert<T>(A(0)));
    for (int64_t o = 0; o < g.out_plane(); ++o) {
      const int64_t i = flat_index(g, src_idx[o], o / OW, o % OW);
      if (i >= 0 && i < g.in_plane()) store(dst, i, load(dst, i) + grad(base + o));
    }
    return;
  }
  for (int64_t ih = 0; ih < g.h.in; ++ih) {
    const size_t uh = static_cast<size_t>(ih);
    for (int64_t iw = 0; iw < g.w.in; ++iw) {
      const size_t uw = static_cast<size_t>(iw);
      const int64_t here = ih * g.w.in + iw;
      A sum = 0;
      for (int64_t oh = g.h.win_lo[uh]; oh < g.h.win_hi[uh]; ++oh)
        for (int64_t ow = g.w.win_lo[uw]; ow < g.w.win_hi[uw]; ++ow)
          if (flat_index(g, src_idx[oh * OW + ow], oh, ow) == here)
            sum += grad(base + oh * OW + ow);
      store(dst, here, sum);
    }
  }
}

}  // namespace plexus::cpu::pooling
