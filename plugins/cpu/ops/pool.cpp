// CPU kernels: pool family (see docs/ops.md).
//
// Every kernel runs in parallel over the N·C planes. The window bounds that depend only on the
// geometry (which taps of a window fall inside the input, which windows cover an input row) are
// worked out once at creation, so the inner loops test no bounds.
//
// The backward ops gather rather than scatter: each dx element sums the dy of the windows that
// cover it (max: only those whose index names it), in a fixed order. Every dx element is thus
// written once, rounded once for 16-bit types, without scratch, and identically run to run.
#include <cmath>
#include <limits>
#include <vector>

#include "common.hpp"

namespace plexus::cpu {

namespace {

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
// Back to the position in the plane (-1: none), for output (oh, ow).
inline int64_t flat_index(const PoolGeom&, int32_t v, int64_t, int64_t) { return v; }
inline int64_t flat_index(const PoolGeom& g, uint8_t v, int64_t oh, int64_t ow) {
  if (v == kNoTap) return -1;
  const int64_t kh = v / g.w.k, kw = v % g.w.k;
  return (oh * g.h.s - g.h.p + kh * g.h.d) * g.w.in + (ow * g.w.s - g.w.p + kw * g.w.d);
}

// y, indices = max_pool2d(x).
template <class T>
class MaxPool2dKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit MaxPool2dKernel(const NodeInfo& node)
      : g_(PoolGeom::make(node.input(0).shape, node.output(0).shape, node, true)),
        pairs_(g_.pairs()), relu_mask_(node.attr_int_or("relu_mask", 0) != 0),
        u8_(node.output(1).dtype == PLX_U8) {}

  void compute(const KernelCall& c) override {
    if (u8_)
      run(c, sdk::data<uint8_t>(c.out(1)));
    else
      run(c, sdk::data<int32_t>(c.out(1)));
  }

 private:
  template <class I>
  void run(const KernelCall& c, I* idx) {  // idx (N·C, OH, OW)
    const PoolGeom& g = g_;
    const T* x = sdk::data<T>(c.in(0));  // (N·C, H, W)
    T* y = sdk::data<T>(c.out(0));       // (N·C, OH, OW)
    const int64_t W = g.w.in;
    // relu_mask: index -1 where y is not > 0, the mask relu_backward(dy, y) would apply (best is
    // a loaded T, so it is y exactly).
    const bool rm = relu_mask_;
    parallel_for(g.planes, g.grain(g.out_plane() * g.h.k * g.w.k), [&](int64_t b, int64_t e) {
      for (int64_t pl = b; pl < e; ++pl) {
        const T* src = x + pl * g.in_plane();  // (H, W)
        T* dst = y + pl * g.out_plane();       // (OH, OW)
        I* dst_idx = idx + pl * g.out_plane();
        if (pairs_) {
          for (int64_t oh = 0; oh < g.h.out; ++oh) {
            const T* r0 = src + 2 * oh * W;  // (W)
            const T* r1 = r0 + W;
            T* out = dst + oh * g.w.out;          // (OW)
            I* out_idx = dst_idx + oh * g.w.out;  // (OW)
            const int32_t row = static_cast<int32_t>(2 * oh * W), w32 = static_cast<int32_t>(W);
            for (int64_t ow = 0; ow < g.w.out; ++ow) {
              // Taps in index order, so a strict comparison keeps the first maximum; selects on
              // 32-bit lanes rather than branches, which the compiler vectorises.
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
          continue;
        }
        for (int64_t oh = 0; oh < g.h.out; ++oh) {
          const size_t uh = static_cast<size_t>(oh);
          for (int64_t ow = 0; ow < g.w.out; ++ow) {
            const size_t uw = static_cast<size_t>(ow);
            // A window of padding only (possible with dilation) gives -inf and index -1, which
            // the backward op never matches.
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
    });
  }

  PoolGeom g_;
  bool pairs_;
  bool relu_mask_;
  bool u8_;  // window_index: u8 taps
};

// dx = max_pool2d_backward(dy, indices): each input element gathers the dy of the windows whose
// index names it.
// dx = max_pool2d_backward(g(o), indices), where g(o) is the output gradient at output o: dy
// itself, or relu_backward(dy, y) = (y > 0 ? dy : 0) applied as it is read when the ReLU's
// backward is fused in (make_relu_max_pool_backward), with the same value, so the two agree to
// the bit.
template <class T, class Grad, class I>
void max_pool_backward(const PoolGeom& g, bool disjoint, const Grad& grad, const I* idx, T* dx) {
  using A = acc_t<T>;
  const int64_t OW = g.w.out;
  parallel_for(g.planes, g.grain(g.in_plane() * 4), [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      const int64_t base = pl * g.out_plane();            // of the plane's outputs
      const I* src_idx = idx + pl * g.out_plane();  // (OH, OW)
      T* dst = dx + pl * g.in_plane();                    // (H, W)
      if (disjoint) {
        // At most one window covers each element: scatter onto zeros, where the one addition
        // is exact. Indices outside the plane (-1: a window of padding only) are skipped.
        std::fill(dst, dst + g.in_plane(), convert<T>(A(0)));
        for (int64_t o = 0; o < g.out_plane(); ++o) {
          const int64_t i = flat_index(g, src_idx[o], o / OW, o % OW);
          if (i >= 0 && i < g.in_plane()) store(dst, i, load(dst, i) + grad(base + o));
        }
        continue;
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
  });
}

template <class T>
class MaxPool2dBackwardKernel final : public Kernel {
 public:
  explicit MaxPool2dBackwardKernel(const NodeInfo& node)
      : g_(PoolGeom::make(node.attr_ints("input_shape").data(), node.input(0).shape, node, true)),
        disjoint_(g_.disjoint()), u8_(node.input(1).dtype == PLX_U8) {}

  void compute(const KernelCall& c) override {
    const T* dy = sdk::data<T>(c.in(0));  // (N·C, OH, OW)
    auto grad = [dy](int64_t o) { return load(dy, o); };
    if (u8_)
      max_pool_backward(g_, disjoint_, grad, sdk::data<uint8_t>(c.in(1)), sdk::data<T>(c.out(0)));
    else
      max_pool_backward(g_, disjoint_, grad, sdk::data<int32_t>(c.in(1)), sdk::data<T>(c.out(0)));
  }

 private:
  PoolGeom g_;
  bool disjoint_;
  bool u8_;  // window_index: u8 taps
};

// relu_backward(dy, y) -> max_pool2d_backward(., indices) as one kernel: the ReLU's gradient is
// never written (the backward of ReLU with pooling, fused). Its inputs are wherever the fused
// group's boundary puts dy, y and the indices.
template <class T>
class ReluMaxPool2dBackwardKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  ReluMaxPool2dBackwardKernel(const NodeInfo& pool, const sdk::ReluMaxPoolBackwardSlots& s)
      : g_(PoolGeom::make(pool.attr_ints("input_shape").data(), pool.input(0).shape, pool, true)),
        disjoint_(g_.disjoint()), dy_(s.dy), y_(s.y), idx_(s.indices), dx_(s.dx) {
    PLX_DECLINE_UNLESS(pool.input(1).dtype == PLX_I32,
                       "relu_backward+max_pool2d_backward: u8 window indices run node by node");
  }

  void compute(const KernelCall& c) override {
    const T* dy = sdk::data<T>(c.in(dy_));
    const T* y = sdk::data<T>(c.in(y_));
    max_pool_backward(g_, disjoint_,
                      [dy, y](int64_t o) { return load(y, o) > A(0) ? load(dy, o) : A(0); },
                      sdk::data<int32_t>(c.in(idx_)), sdk::data<T>(c.out(dx_)));
  }

 private:
  PoolGeom g_;
  bool disjoint_;
  int32_t dy_, y_, idx_, dx_;
};

bool flag(const NodeInfo& node, const char* name) {
  return node.attr_int(name) != 0;
}

// y = avg_pool2d(x): window sums over the divisor PyTorch uses (the window clipped to the padded
// input with count_include_pad, else to the input).
template <class T>
class AvgPool2dKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit AvgPool2dKernel(const NodeInfo& node)
      : g_(PoolGeom::make(node.input(0).shape, node.output(0).shape, node, false)),
        include_pad_(flag(node, "count_include_pad")),
        pairs_(g_.pairs()) {}

  void compute(const KernelCall& c) override {
    const PoolGeom& g = g_;
    const T* x = sdk::data<T>(c.in(0));  // (N·C, H, W)
    T* y = sdk::data<T>(c.out(0));       // (N·C, OH, OW)
    const int64_t W = g.w.in;
    parallel_for(g.planes, g.grain(g.out_plane() * g.h.k * g.w.k), [&](int64_t b, int64_t e) {
      for (int64_t pl = b; pl < e; ++pl) {
        const T* src = x + pl * g.in_plane();  // (H, W)
        T* dst = y + pl * g.out_plane();       // (OH, OW)
        if (pairs_) {
          for (int64_t oh = 0; oh < g.h.out; ++oh) {
            const T* r0 = src + 2 * oh * W;  // (W)
            const T* r1 = r0 + W;
            for (int64_t ow = 0; ow < g.w.out; ++ow)
              store(dst, oh * g.w.out + ow,
                    (load(r0, 2 * ow) + load(r0, 2 * ow + 1) + load(r1, 2 * ow) +
                     load(r1, 2 * ow + 1)) /
                        A(4));
          }
          continue;
        }
        for (int64_t oh = 0; oh < g.h.out; ++oh) {
          const size_t uh = static_cast<size_t>(oh);
          for (int64_t ow = 0; ow < g.w.out; ++ow) {
            const size_t uw = static_cast<size_t>(ow);
            A sum = 0;
            for (int64_t ih = g.h.clip_lo[uh]; ih < g.h.clip_hi[uh]; ++ih)
              for (int64_t iw = g.w.clip_lo[uw]; iw < g.w.clip_hi[uw]; ++iw)
                sum += load(src, ih * W + iw);
            store(dst, oh * g.w.out + ow, sum / divisor(oh, ow));
          }
        }
      }
    });
  }

 private:
  A divisor(int64_t oh, int64_t ow) const {
    const size_t uh = static_cast<size_t>(oh), uw = static_cast<size_t>(ow);
    if (include_pad_) return static_cast<A>(g_.h.padded_size[uh] * g_.w.padded_size[uw]);
    return static_cast<A>((g_.h.clip_hi[uh] - g_.h.clip_lo[uh]) *
                          (g_.w.clip_hi[uw] - g_.w.clip_lo[uw]));
  }

  PoolGeom g_;
  bool include_pad_;
  bool pairs_;  // every window inside, divisor 4 either way
};

// dx = avg_pool2d_backward(dy): each input element gathers dy / divisor of the windows that
// cover it.
template <class T>
class AvgPool2dBackwardKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit AvgPool2dBackwardKernel(const NodeInfo& node)
      : g_(PoolGeom::make(node.attr_ints("input_shape").data(), node.input(0).shape, node, false)) {
    // 1 / divisor per window, worked out once.
    const bool include_pad = flag(node, "count_include_pad");
    inv_.resize(static_cast<size_t>(g_.out_plane()));
    for (int64_t oh = 0; oh < g_.h.out; ++oh)
      for (int64_t ow = 0; ow < g_.w.out; ++ow) {
        const size_t uh = static_cast<size_t>(oh), uw = static_cast<size_t>(ow);
        const int64_t n = include_pad ? g_.h.padded_size[uh] * g_.w.padded_size[uw]
                                      : (g_.h.clip_hi[uh] - g_.h.clip_lo[uh]) *
                                            (g_.w.clip_hi[uw] - g_.w.clip_lo[uw]);
        inv_[static_cast<size_t>(oh * g_.w.out + ow)] = A(1) / static_cast<A>(n);
      }
    disjoint_ = g_.disjoint();
    pairs_ = g_.pairs();
  }

  void compute(const KernelCall& c) override {
    const PoolGeom& g = g_;
    const T* dy = sdk::data<T>(c.in(0));  // (N·C, OH, OW)
    T* dx = sdk::data<T>(c.out(0));       // (N·C, H, W)
    const int64_t OW = g.w.out;
    parallel_for(g.planes, g.grain(g.in_plane() * 4), [&](int64_t b, int64_t e) {
      for (int64_t pl = b; pl < e; ++pl) {
        const T* src = dy + pl * g.out_plane();  // (OH, OW)
        T* dst = dx + pl * g.in_plane();         // (H, W)
        if (pairs_) {
          // Each 2x2 window gets a quarter of its dy; a last odd row or column gets none.
          for (int64_t oh = 0; oh < g.h.out; ++oh) {
            T* d0 = dst + 2 * oh * g.w.in;  // (W)
            T* d1 = d0 + g.w.in;
            for (int64_t ow = 0; ow < OW; ++ow) {
              const T v = convert<T>(load(src, oh * OW + ow) * A(0.25));
              d0[2 * ow] = v, d0[2 * ow + 1] = v, d1[2 * ow] = v, d1[2 * ow + 1] = v;
            }
            std::fill(d0 + 2 * OW, d0 + g.w.in, convert<T>(A(0)));
            std::fill(d1 + 2 * OW, d1 + g.w.in, convert<T>(A(0)));
          }
          std::fill(dst + 2 * g.h.out * g.w.in, dst + g.in_plane(), convert<T>(A(0)));
          continue;
        }
        if (disjoint_) {
          // Each element lies in at most one window: write the windows' shares onto zeros.
          std::fill(dst, dst + g.in_plane(), convert<T>(A(0)));
          for (int64_t oh = 0; oh < g.h.out; ++oh) {
            const size_t uh = static_cast<size_t>(oh);
            for (int64_t ow = 0; ow < OW; ++ow) {
              const size_t uw = static_cast<size_t>(ow);
              const size_t o = static_cast<size_t>(oh * OW + ow);
              const T v = convert<T>(load(src, oh * OW + ow) * inv_[o]);
              for (int64_t ih = g.h.clip_lo[uh]; ih < g.h.clip_hi[uh]; ++ih)
                std::fill(dst + ih * g.w.in + g.w.clip_lo[uw], dst + ih * g.w.in + g.w.clip_hi[uw],
                          v);
            }
          }
          continue;
        }
        for (int64_t ih = 0; ih < g.h.in; ++ih) {
          const size_t uh = static_cast<size_t>(ih);
          for (int64_t iw = 0; iw < g.w.in; ++iw) {
            const size_t uw = static_cast<size_t>(iw);
            A sum = 0;
            for (int64_t oh = g.h.win_lo[uh]; oh < g.h.win_hi[uh]; ++oh)
              for (int64_t ow = g.w.win_lo[uw]; ow < g.w.win_hi[uw]; ++ow)
                sum += load(src, oh * OW + ow) * inv_[static_cast<size_t>(oh * OW + ow)];
            store(dst, ih * g.w.in + iw, sum);
          }
        }
      }
    });
  }

 private:
  PoolGeom g_;
  std::vector<A> inv_;  // (OH, OW)
  bool disjoint_, pairs_;
};

}  // namespace

std::unique_ptr<Kernel> make_relu_max_pool_backward(const sdk::GraphView& g,
                                                    const sdk::Boundary& b, plx_dtype& dtype) {
  const sdk::ReluMaxPoolBackwardSlots sl = sdk::relu_max_pool_backward_slots(g, b);
  dtype = sl.dtype;
  const sdk::OwnedNodeInfo info(g, 1);
  const NodeInfo node(&info.get());
  switch (dtype) {
    case PLX_F32: return std::make_unique<ReluMaxPool2dBackwardKernel<float>>(node, sl);
    case PLX_F64: return std::make_unique<ReluMaxPool2dBackwardKernel<double>>(node, sl);
    case PLX_F16: return std::make_unique<ReluMaxPool2dBackwardKernel<half>>(node, sl);
    case PLX_BF16: return std::make_unique<ReluMaxPool2dBackwardKernel<bfloat16>>(node, sl);
    default: break;
  }
  throw sdk::Unsupported(sdk::format("relu_backward+max_pool2d_backward: no %s kernel", dtype_name(dtype)));
}

void register_pool(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<MaxPool2dKernel>(r, "max_pool2d", "omp", f);
  add_float_kernels<MaxPool2dBackwardKernel>(r, "max_pool2d_backward", "omp", f);
  add_float_kernels<AvgPool2dKernel>(r, "avg_pool2d", "omp", f);
  add_float_kernels<AvgPool2dBackwardKernel>(r, "avg_pool2d_backward", "omp", f);
}

}  // namespace plexus::cpu
