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
#include "pool_plane.hpp"

namespace plexus::cpu {

namespace {

using namespace pooling;

// y, indices = max_pool2d(x).
template <class T>
class MaxPool2dKernel final : public Kernel {
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
    parallel_for(g.planes, g.grain(g.out_plane() * g.h.k * g.w.k), [&](int64_t b, int64_t e) {
      for (int64_t pl = b; pl < e; ++pl)
        max_pool_plane(g, pairs_, relu_mask_, x + pl * g.in_plane(), y + pl * g.out_plane(),
                       idx + pl * g.out_plane());
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
  parallel_for(g.planes, g.grain(g.in_plane() * 4), [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl)
      max_pool_backward_plane(g, disjoint, grad, pl * g.out_plane(), idx + pl * g.out_plane(),
                              dx + pl * g.in_plane());
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
        disjoint_(g_.disjoint()),
        u8_(pool.input(1).dtype == PLX_U8),
        dy_(s.dy),
        y_(s.y),
        idx_(s.indices),
        dx_(s.dx) {}

  void compute(const KernelCall& c) override {
    const T* dy = sdk::data<T>(c.in(dy_));
    const T* y = sdk::data<T>(c.in(y_));
    auto grad = [dy, y](int64_t o) { return load(y, o) > A(0) ? load(dy, o) : A(0); };
    // i32 positions, or the u8 window taps of a training step's pools (window_index).
    if (u8_)
      max_pool_backward(g_, disjoint_, grad, sdk::data<uint8_t>(c.in(idx_)),
                        sdk::data<T>(c.out(dx_)));
    else
      max_pool_backward(g_, disjoint_, grad, sdk::data<int32_t>(c.in(idx_)),
                        sdk::data<T>(c.out(dx_)));
  }

 private:
  PoolGeom g_;
  bool disjoint_;
  bool u8_;  // window_index: u8 taps
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
