// CPU kernels: 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) (ops/winograd.hpp), forward,
// data gradient and weight gradient, candidates beside im2col's (ops/conv.cpp) that the core's tuner times
// against them (backend.kernels, docs/training.md). Registered after im2col, so without the tuner
// the GEMMs on the unfolded image stay the default, and eager calls keep them.
//
// The batch is split over the threads as im2col splits it (ops/im2col.hpp): each worker
// transforms, multiplies and transforms back its own images with single-threaded GEMMs, in a
// fixed order, so results do not depend on timing. The conv + pool fusions (ops/conv_pool.cpp)
// run the same image function when the tuner chose these kernels for their conv nodes, and so
// agree with them to the bit.
#include "common.hpp"
#include "im2col.hpp"
#include "winograd.hpp"

namespace plexus::cpu {

namespace {

using im2col::Carver;
using im2col::ConvGeom;
using im2col::for_each_image;
using im2col::part;
using im2col::shape_of;

// Declines f64: it stays on im2col, the reference for gradient checks.
template <class T>
void require_not_f64() {
  PLX_DECLINE_UNLESS(!(std::is_same_v<T, double>), "f64 stays on im2col's GEMMs");
}

// Per-call buffers: U shared, each worker's scratch, and (16-bit) each worker's f32 output.
struct Buffers {
  float* U = nullptr;
  float* scratch = nullptr;
  float* out = nullptr;
};

template <class T>
Buffers carve(Carver& c, const ConvGeom& g, const winograd::Plan& p) {
  Buffers b;
  b.U = c.take<float>(p.weight_floats());
  b.scratch = c.take<float>(g.workers * p.scratch_floats());
  if (!std::is_same_v<T, float>) b.out = c.take<float>(g.workers * p.out * p.OH * p.OW);
  return b;
}

// Both kernels: U from w, then every image of src (N, p.in, IH, IW) to dst (N, p.out, OH, OW),
// 16-bit outputs through the worker's f32 buffer.
template <class T>
void run_images(const KernelCall& call, const ConvGeom& g, const winograd::Plan& p, const T* w,
                const T* src, const T* bias, T* dst) {
  Carver carver(call.workspace);
  const Buffers b = carve<T>(carver, g, p);
  winograd::transform_weight(p, w, b.U);
  const int64_t in = p.in * p.IH * p.IW, out = p.out * p.OH * p.OW;
  for_each_image(g, [&](int64_t wk, int64_t n) {
    float* f;
    if constexpr (std::is_same_v<T, float>) f = dst + n * out;
    else f = part(b.out, wk, out);
    winograd::image(p, b.U, src + n * in, bias, f, part(b.scratch, wk, p.scratch_floats()));
    if constexpr (!std::is_same_v<T, float>) im2col::convert_n(f, dst + n * out, out);
  });
}

// y = conv2d(x, w) + b.
template <class T>
class WinogradConv2dKernel final : public Kernel {
 public:
  explicit WinogradConv2dKernel(const NodeInfo& node)
      : g_((require_not_f64<T>(), shape_of(node.input(0))), shape_of(node.input(1)), node,
           sizeof(float)),
        p_(winograd::Plan::make(g_, false)),
        has_bias_(node.has_input(2)) {}

  uint64_t workspace_bytes() const override {
    Carver c;
    carve<T>(c, g_, p_);
    return c.bytes();
  }

  void compute(const KernelCall& call) override {
    const T* x = sdk::data<T>(call.in(0));                           // (N, C, H, W)
    const T* w = sdk::data<T>(call.in(1));                           // (O, C, 3, 3)
    const T* bias = has_bias_ ? sdk::data<T>(call.in(2)) : nullptr;  // (O)
    T* y = sdk::data<T>(call.out(0));                                // (N, O, OH, OW)
    run_images(call, g_, p_, w, x, bias, y);
  }

 private:
  ConvGeom g_;
  winograd::Plan p_;
  bool has_bias_;
};

// dx = conv2d_backward_data(dy, w): the convolution of dy with w transposed and turned.
template <class T>
class WinogradConv2dBackwardDataKernel final : public Kernel {
 public:
  explicit WinogradConv2dBackwardDataKernel(const NodeInfo& node)
      : g_((require_not_f64<T>(), node.attr_ints("input_shape")), shape_of(node.input(1)), node,
           sizeof(float)),
        p_(winograd::Plan::make(g_, true)) {}

  uint64_t workspace_bytes() const override {
    Carver c;
    carve<T>(c, g_, p_);
    return c.bytes();
  }

  void compute(const KernelCall& call) override {
    const T* dy = sdk::data<T>(call.in(0));  // (N, O, OH, OW)
    const T* w = sdk::data<T>(call.in(1));   // (O, C, 3, 3)
    T* dx = sdk::data<T>(call.out(0));       // (N, C, H, W)
    run_images(call, g_, p_, w, dy, static_cast<const T*>(nullptr), dx);
  }

 private:
  ConvGeom g_;
  winograd::Plan p_;
};

// dw = conv2d_backward_weight(dy, x): each worker adds its images' 16 GEMMs into its own sums
// (winograd::weight_grad_image), the workers' sums are added in a fixed order, and dw = Gᵀ S G.
template <class T>
class WinogradConv2dBackwardWeightKernel final : public Kernel {
 public:
  explicit WinogradConv2dBackwardWeightKernel(const NodeInfo& node)
      : g_((require_not_f64<T>(), shape_of(node.input(1))), node.attr_ints("weight_shape"), node,
           sizeof(float)),
        p_(winograd::Plan::make(g_, false)) {}

  uint64_t workspace_bytes() const override {
    Carver c;
    float *sums, *scratch;
    carve(c, sums, scratch);
    return c.bytes();
  }

  void compute(const KernelCall& call) override {
    const T* dy = sdk::data<T>(call.in(0));  // (N, O, OH, OW)
    const T* x = sdk::data<T>(call.in(1));   // (N, C, H, W)
    T* dw = sdk::data<T>(call.out(0));       // (O, C, 3, 3)
    Carver carver(call.workspace);
    float *sums, *scratch;
    carve(carver, sums, scratch);
    const int64_t S = winograd::weight_grad_floats(p_);
    std::fill(sums, sums + g_.workers * S, 0.0f);
    const int64_t in = p_.in * p_.IH * p_.IW, out = p_.out * p_.OH * p_.OW;
    for_each_image(g_, [&](int64_t wk, int64_t n) {
      winograd::weight_grad_image(p_, x + n * in, dy + n * out, part(sums, wk, S),
                                  part(scratch, wk, p_.scratch_floats()));
    });
    winograd::finish_weight_grad(p_, sums, g_.workers, dw);
  }

 private:
  // The workers' sums (workers, 16, O, C) and scratch.
  void carve(Carver& c, float*& sums, float*& scratch) const {
    sums = c.take<float>(g_.workers * winograd::weight_grad_floats(p_));
    scratch = c.take<float>(g_.workers * p_.scratch_floats());
  }

  ConvGeom g_;
  winograd::Plan p_;
};

}  // namespace

void register_conv_winograd(KernelRegistry& r) {
  // After im2col's: without the tuner the GEMMs stay the default.
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<WinogradConv2dKernel>(r, "conv2d", "winograd_f2x3", f);
  add_float_kernels<WinogradConv2dBackwardDataKernel>(r, "conv2d_backward_data", "winograd_f2x3", f);
  add_float_kernels<WinogradConv2dBackwardWeightKernel>(r, "conv2d_backward_weight", "winograd_f2x3",
                                                        f);
}

}  // namespace plexus::cpu
