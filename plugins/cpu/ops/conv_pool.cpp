// CPU kernels: a convolution fused with the max pooling after it, forward and backward
// (sdk/fusion_conv_pool.hpp finds the groups; plugins/cpu/fusion.cpp claims them).
//
//   conv2d+relu+max_pool2d              per image: y_n = conv(x_n, w) + b into scratch, the
//                                       ReLU there, then the pool into the pooled output and its
//                                       indices
//   max_pool2d_backward+conv2d_backward per image: the pooled gradient unpooled into scratch,
//                                       then conv2d_backward_data into dx_n, the image's term of
//                                       conv2d_backward_weight into the worker's sum, and the
//                                       bias gradient's sums
//
// Why: the pre-pool tensor and its gradient are the largest tensors of a CNN's step (ConvNet at
// batch 1024 in f32: 196 MiB each), and each is written only for one group to read it. Here they
// exist one image per worker at a time, in the workspace.
//
// The images are split over the threads as in the conv kernels (ops/im2col.hpp), and each image
// runs the very loops of the per-node kernels (forward_image, backward_data_image,
// backward_weight_image, max_pool_plane, max_pool_backward_plane) on the same values, rounded to
// the storage type where the unfused nodes store them. So y, the indices, dx and dw equal the
// unfused nodes' to the bit. The bias gradient sums the same values in f64 as the `sum` kernel
// does, in another order (image by image rather than in blocks of the whole batch), so it agrees
// to rounding (tests/train/test_fusion_conv_pool.cpp).
//
// The convolution runs the kernel the host chose for its node: im2col's GEMMs, or Winograd's
// F(2x2, 3x3) (ops/winograd.hpp) for the forward and either gradient when the tuner found it
// faster, through the same image function as that node's kernel. A group whose conv node the host
// gave another kernel (the tuner's choice of the direct kernels for a layer of few taps) is
// declined and runs node by node.
#include <optional>
#include <vector>

#include "common.hpp"
#include "im2col.hpp"
#include "plexus/sdk/fusion_chunked.hpp"
#include "pool_plane.hpp"
#include "winograd.hpp"

namespace plexus::cpu {

namespace {

using namespace im2col;
using pooling::PoolGeom;

// Whether the host chose Winograd's kernel for conv node n (true) or im2col's (false, also with
// no choice); declines the group for any other kernel.
bool runs_winograd(sdk::Backend& backend, const sdk::GraphView& g, int32_t n) {
  const int32_t hint = g.node(n).kernel_hint;
  if (hint <= 0) return false;
  const plx_kernel* k = backend.kernels().get(hint - 1);
  if (!k) return false;
  const std::string_view impl = k->impl;
  if (impl == "winograd_f2x3") return true;
  PLX_DECLINE_UNLESS(impl == "im2col_blas" || impl == "col2im_blas",
                     "%s runs the '%s' kernel; the fused kernel runs im2col or winograd_f2x3 only",
                     g.node(n).op, k->impl);
  return false;
}

// Node n's Winograd plan when the host chose that kernel for it (wino), else none.
std::optional<winograd::Plan> winograd_plan(bool wino, const ConvGeom& g, bool backward,
                                            plx_dtype dtype) {
  if (!wino) return std::nullopt;
  PLX_DECLINE_UNLESS(dtype != PLX_F64, "f64 runs im2col only");
  return winograd::Plan::make(g, backward);
}

std::vector<int64_t> dims(const plx_tensor& t) {
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}

// Both groups: the pool's indices are i32 or u8 (window_index), and the pool's input `in`
// (N, C, H, W) is the convolution's output.
void check_pool_input(const ConvGeom& g, const int64_t* in, plx_dtype index_dtype,
                      const char* what) {
  PLX_DECLINE_UNLESS(index_dtype == PLX_I32 || index_dtype == PLX_U8, "indices must be i32 or u8");
  PLX_REQUIRE(in[0] == g.N && in[1] == g.O && in[2] == g.OH && in[3] == g.OW,
              "%s: the pool's input is not the convolution's output", what);
}

// Calls run(indices) with the indices as their type: u8 window taps or i32 plane positions.
template <class F>
void with_indices(bool u8, void* data, F&& run) {
  if (u8)
    run(static_cast<uint8_t*>(data));
  else
    run(static_cast<int32_t*>(data));
}

// The sum of a plane in f64, over 8 independent lanes (a single running sum would be one long
// chain of dependent additions, the slowest loop of the fused backward), folded pairwise.
template <class T>
double plane_sum(const T* src, int64_t n) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] += static_cast<double>(load(src, i + k));
  for (; i < n; ++i) lane[i % 8] += static_cast<double>(load(src, i));
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// conv2d(x, w[, b]) -> [relu] -> max_pool2d, image by image.
template <class T>
class ConvMaxPoolKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  ConvMaxPoolKernel(const NodeInfo& conv, const NodeInfo& pool, const sdk::ConvMaxPoolSlots& s,
                    bool wino)
      : g_(dims(conv.input(0)), dims(conv.input(1)), conv, sizeof(A)),
        wino_(winograd_plan(wino, g_, false, s.dtype)),
        p_(PoolGeom::make(pool.input(0).shape, pool.output(0).shape, pool, true)),
        pairs_(p_.pairs()),
        relu_mask_(pool.attr_int_or("relu_mask", 0) != 0),
        u8_(s.index_dtype == PLX_U8),
        relu_(s.relu >= 0),
        x_(s.x),
        w_(s.w),
        b_(s.bias),
        y_(s.y),
        idx_(s.indices) {
    const plx_tensor& in = pool.input(0);
    PLX_REQUIRE(in.ndim == 4, "conv2d+max_pool2d: the pool's input must be 4-D");
    check_pool_input(g_, in.shape, s.index_dtype, "conv2d+max_pool2d");
  }

  uint64_t workspace_bytes() const override {
    Carver c;
    carve(c);
    return c.bytes();
  }

  void compute(const KernelCall& c) override {
    with_indices(u8_, c.out(idx_).data, [&](auto* idx) { run(c, idx); });
  }

 private:
  struct Buffers {
    Scratch<A> s;
    T* act = nullptr;     // (workers, O, P) an image's activation in T (16-bit only)
    A* U = nullptr;       // Winograd: the transformed weight
    A* wino = nullptr;    // Winograd: (workers, scratch_floats) per-worker scratch
  };
  Buffers carve(Carver& c) const {
    Buffers b;
    if (wino_) {
      b.U = c.take<A>(wino_->weight_floats());
      b.wino = c.take<A>(g_.workers * wino_->scratch_floats());
    } else {
      if (kWide<T>) b.s.w = c.take<A>(g_.O * g_.K);
      if (kWide<T> || !g_.pointwise) b.s.col = c.take<A>(g_.workers * g_.rows * g_.block * g_.OW);
    }
    b.s.out = c.take<A>(g_.workers * g_.O * g_.P);
    if (kWide<T>) b.act = c.take<T>(g_.workers * g_.O * g_.P);
    return b;
  }

  template <class I>
  void run(const KernelCall& c, I* idx /* (N, O, PH, PW) */) {
    const ConvGeom& g = g_;
    const T* x = sdk::data<T>(c.in(x_));                         // (N, C, H, W)
    const T* w = sdk::data<T>(c.in(w_));                         // (O, K)
    const T* bias = b_ >= 0 ? sdk::data<T>(c.in(b_)) : nullptr;  // (O)
    T* y = sdk::data<T>(c.out(y_));                              // (N, O, PH, PW)
    Carver carver(c.workspace);
    const Buffers bufs = carve(carver);
    const Scratch<A>& s = bufs.s;
    const A* wa = wino_ ? nullptr : as_acc(w, s.w, g.O * g.K);  // (O, K)
    if constexpr (std::is_same_v<A, float>)
      if (wino_) winograd::transform_weight(*wino_, w, bufs.U);
    const int64_t pooled = p_.out_plane();

    for_each_image(g, [&](int64_t wk, int64_t n) {
      A* conv = part(s.out, wk, g.O * g.P);  // (O, P)
      const T* img = x + n * g.C * g.H * g.W;
      if constexpr (std::is_same_v<A, float>) {
        if (wino_)
          winograd::image(*wino_, bufs.U, img, bias, conv,
                          part(bufs.wino, wk, wino_->scratch_floats()));
        else
          forward_image(g, wa, bias, img, conv, part(s.col, wk, g.rows * g.block * g.OW));
      } else {
        forward_image(g, wa, bias, img, conv, part(s.col, wk, g.rows * g.block * g.OW));
      }
      // The activation in T, rounded where conv2d stores its output.
      T* act;
      if constexpr (kWide<T>) {
        act = bufs.act + wk * g.O * g.P;
        convert_n(conv, act, g.O * g.P);
      } else {
        act = conv;
      }
      if (relu_)
        for (int64_t i = 0; i < g.O * g.P; ++i) {
          const A v = load(act, i);
          store(act, i, v > A(0) ? v : A(0));
        }
      for (int64_t o = 0; o < g.O; ++o)
        pooling::max_pool_plane(p_, pairs_, relu_mask_, act + o * g.P, y + (n * g.O + o) * pooled,
                                idx + (n * g.O + o) * pooled);
    });
  }

  ConvGeom g_;
  std::optional<winograd::Plan> wino_;
  PoolGeom p_;
  bool pairs_, relu_mask_, u8_, relu_;
  int32_t x_, w_, b_, y_, idx_;
};

// max_pool2d_backward(dy, indices) -> conv2d_backward_data / conv2d_backward_weight / the bias
// sum, image by image.
template <class T>
class MaxPoolConvBackwardKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  MaxPoolConvBackwardKernel(const ConvGeom& g, const NodeInfo& pool,
                            const sdk::MaxPoolConvBackwardSlots& s, bool wino_data,
                            bool wino_weight)
      : g_(g),
        wino_(winograd_plan(wino_data && s.data >= 0, g_, true, s.dtype)),
        wino_w_(winograd_plan(wino_weight && s.weight >= 0, g_, false, s.dtype)),
        p_(PoolGeom::make(pool.attr_ints("input_shape").data(), pool.input(0).shape, pool, true)),
        disjoint_(p_.disjoint()),
        u8_(s.index_dtype == PLX_U8),
        sl_(s) {
    const std::vector<int64_t> in = pool.attr_ints("input_shape");
    PLX_REQUIRE(in.size() == 4,
                "max_pool2d_backward+conv2d_backward: input_shape must have 4 values");
    check_pool_input(g_, in.data(), s.index_dtype, "max_pool2d_backward+conv2d_backward");
  }

  uint64_t workspace_bytes() const override {
    Carver c;
    carve(c);
    return c.bytes();
  }

  void compute(const KernelCall& c) override {
    with_indices(u8_, c.in(sl_.indices).data, [&](auto* idx) { run(c, idx); });
  }

 private:
  struct Buffers {
    Scratch<A> s;
    T* grad = nullptr;       // (workers, O, P) an image's unpooled gradient
    double* bias = nullptr;  // (workers, O) the bias gradient's sums
    A* U = nullptr;          // Winograd (the data gradient): the transformed weight
    A* wino = nullptr;       // Winograd: (workers, scratch) per-worker scratch
    A* wsums = nullptr;      // Winograd (the weight gradient): (workers, 16, O, C) sums
  };
  bool data() const { return sl_.data >= 0; }
  bool weight() const { return sl_.weight >= 0; }
  bool im2col_weight() const { return weight() && !wino_w_; }
  // One worker in f32/f64 accumulates im2col's weight gradient straight into dw.
  bool direct() const { return !kWide<T> && g_.workers == 1; }
  // Floats of one worker's Winograd scratch, for whichever of the gradients runs it.
  int64_t wino_scratch() const {
    return std::max(wino_ ? wino_->scratch_floats() : 0, wino_w_ ? wino_w_->scratch_floats() : 0);
  }
  Buffers carve(Carver& c) const {
    Buffers b;
    const bool im2col_data = data() && !wino_;
    if (kWide<T> && im2col_data) b.s.w = c.take<A>(g_.O * g_.K);
    if ((im2col_data && !g_.pointwise) || (im2col_weight() && (kWide<T> || !g_.pointwise)))
      b.s.col = c.take<A>(g_.workers * g_.rows * g_.block * g_.OW);
    if (wino_) b.U = c.take<A>(wino_->weight_floats());
    if (wino_ || wino_w_) b.wino = c.take<A>(g_.workers * wino_scratch());
    if (wino_w_) b.wsums = c.take<A>(g_.workers * winograd::weight_grad_floats(*wino_w_));
    b.grad = c.take<T>(g_.workers * g_.O * g_.P);
    if (kWide<T>) {
      b.s.dy = c.take<A>(g_.workers * g_.O * g_.P);
      if (data()) b.s.out = c.take<A>(g_.workers * g_.C * g_.H * g_.W);
    }
    if (im2col_weight() && !direct()) b.s.dw = c.take<A>(g_.workers * g_.O * g_.K);
    if (sl_.bias >= 0) b.bias = c.take<double>(g_.workers * g_.O);
    return b;
  }

  template <class I>
  void run(const KernelCall& c, const I* idx /* (N, O, PH, PW) */) {
    const ConvGeom& g = g_;
    const T* dy = sdk::data<T>(c.in(sl_.dy));  // (N, O, PH, PW)
    Carver carver(c.workspace);
    const Buffers bufs = carve(carver);
    const Scratch<A>& s = bufs.s;
    const A* wa = data() && !wino_ ? as_acc(sdk::data<T>(c.in(sl_.w)), s.w, g.O * g.K)
                                   : nullptr;  // (O, K)
    if constexpr (std::is_same_v<A, float>)
      if (wino_) winograd::transform_weight(*wino_, sdk::data<T>(c.in(sl_.w)), bufs.U);
    const T* x = weight() ? sdk::data<T>(c.in(sl_.x)) : nullptr;  // (N, C, H, W)
    T* dx = data() ? sdk::data<T>(c.out(sl_.dx)) : nullptr;       // (N, C, H, W)
    const int64_t wsize = g.O * g.K, image = g.C * g.H * g.W, pooled = p_.out_plane();
    A* sums = nullptr;  // (workers, O, K)
    if (im2col_weight()) {
      sums = direct() ? acc_view(sdk::data<T>(c.out(sl_.dw)), s.dw) : s.dw;
      std::fill(sums, sums + (direct() ? 1 : g.workers) * wsize, A(0));
    }
    const int64_t wino_sums = wino_w_ ? winograd::weight_grad_floats(*wino_w_) : 0;
    if (wino_w_) std::fill(bufs.wsums, bufs.wsums + g.workers * wino_sums, A(0));
    if (bufs.bias) std::fill(bufs.bias, bufs.bias + g.workers * g.O, 0.0);
    auto grad = [dy](int64_t o) { return load(dy, o); };

    for_each_image(g, [&](int64_t wk, int64_t n) {
      T* un = bufs.grad + wk * g.O * g.P;  // (O, P): the pool's backward for image n
      for (int64_t o = 0; o < g.O; ++o)
        pooling::max_pool_backward_plane(p_, disjoint_, grad, (n * g.O + o) * pooled,
                                         idx + (n * g.O + o) * pooled, un + o * g.P);
      if (bufs.bias) {
        double* b = bufs.bias + wk * g.O;
        for (int64_t o = 0; o < g.O; ++o) b[o] += plane_sum(un + o * g.P, g.P);
      }
      const A* dyn = as_acc(un, part(s.dy, wk, g.O * g.P), g.O * g.P);  // (O, P)
      A* buf = part(s.col, wk, g.rows * g.block * g.OW);
      if (data()) {
        A* dst = acc_view(dx + n * image, part(s.out, wk, image));  // (C, H, W)
        if constexpr (std::is_same_v<A, float>) {
          if (wino_)
            winograd::image(*wino_, bufs.U, dyn, static_cast<const float*>(nullptr), dst,
                            part(bufs.wino, wk, wino_scratch()));
          else
            backward_data_image(g, wa, dyn, dst, buf);
        } else {
          backward_data_image(g, wa, dyn, dst, buf);
        }
        if constexpr (kWide<T>) convert_n(dst, dx + n * image, image);
      }
      if constexpr (std::is_same_v<A, float>) {
        if (wino_w_)
          winograd::weight_grad_image(*wino_w_, x + n * image, dyn,
                                      part(bufs.wsums, wk, wino_sums),
                                      part(bufs.wino, wk, wino_scratch()));
      }
      if (im2col_weight()) backward_weight_image(g, x + n * image, dyn, sums + wk * wsize, buf);
    });
    if constexpr (std::is_same_v<A, float>) {
      if (wino_w_)
        winograd::finish_weight_grad(*wino_w_, bufs.wsums, g.workers, sdk::data<T>(c.out(sl_.dw)));
    }
    if (im2col_weight() && !direct()) {
      T* dw = sdk::data<T>(c.out(sl_.dw));  // (O, K)
      for (int64_t wk = 1; wk < g.workers; ++wk)
        for (int64_t i = 0; i < wsize; ++i) sums[i] += sums[wk * wsize + i];
      for (int64_t i = 0; i < wsize; ++i) dw[i] = convert<T>(sums[i]);
    }
    if (bufs.bias) {
      T* db = sdk::data<T>(c.out(sl_.db));  // (O)
      for (int64_t o = 0; o < g.O; ++o) {
        double t = 0;
        for (int64_t wk = 0; wk < g.workers; ++wk) t += bufs.bias[wk * g.O + o];
        db[o] = convert<T>(t);
      }
    }
  }

  ConvGeom g_;
  std::optional<winograd::Plan> wino_;    // the data gradient's, when the host chose Winograd
  std::optional<winograd::Plan> wino_w_;  // the weight gradient's (the forward's plan)
  PoolGeom p_;
  bool disjoint_, u8_;
  sdk::MaxPoolConvBackwardSlots sl_;
};

template <template <class> class K, class... Args>
std::unique_ptr<Kernel> make_typed(plx_dtype dtype, const char* name, Args&&... args) {
  switch (dtype) {
    case PLX_F32:
      return std::make_unique<K<float>>(std::forward<Args>(args)...);
    case PLX_F64:
      return std::make_unique<K<double>>(std::forward<Args>(args)...);
    case PLX_F16:
      return std::make_unique<K<half>>(std::forward<Args>(args)...);
    case PLX_BF16:
      return std::make_unique<K<bfloat16>>(std::forward<Args>(args)...);
    default:
      break;
  }
  throw sdk::Unsupported(sdk::format("%s: no %s kernel", name, dtype_name(dtype)));
}

// The SDK's chunked kernels' accumulate function, on the host: the chunk's partial weight or bias
// gradient into the f32 running total (sdk/fusion_chunked.hpp).
template <class T>
void accumulate_typed(const void* part, float* acc, void* out, int64_t n, sdk::ChunkAccum mode) {
  const T* p = static_cast<const T*>(part);
  for (int64_t i = 0; i < n; ++i) {
    const float v = convert<float>(p[i]);
    if (mode == sdk::ChunkAccum::Set)
      acc[i] = v;
    else if (mode == sdk::ChunkAccum::Add)
      acc[i] += v;
    else
      static_cast<T*>(out)[i] = convert<T>(acc[i] + v);
  }
}
void host_accumulate(plx_dtype dtype, const void* part, float* acc, void* out, int64_t n,
                     sdk::ChunkAccum mode, plx_stream) {
  switch (dtype) {
    case PLX_F32:
      return accumulate_typed<float>(part, acc, out, n, mode);
    case PLX_F16:
      return accumulate_typed<half>(part, acc, out, n, mode);
    case PLX_BF16:
      return accumulate_typed<bfloat16>(part, acc, out, n, mode);
    default:
      break;
  }
  throw sdk::Error(PLX_ERR_INTERNAL, sdk::format("chunk accumulate: no %s", dtype_name(dtype)));
}

size_t acc_size(plx_dtype dtype) {
  return dtype == PLX_F64 ? sizeof(double) : sizeof(float);
}

}  // namespace

std::unique_ptr<Kernel> make_chunked_conv_pool(sdk::Backend& backend, const sdk::GraphView& g,
                                               const sdk::Boundary& b, uint64_t chunk_bytes,
                                               plx_dtype& dtype, uint32_t& flags,
                                               std::string& name) {
  if (g.is(0, "conv2d"))
    return sdk::make_chunked_conv_max_pool(backend, g, b, chunk_bytes, dtype, flags, name);
  return sdk::make_chunked_max_pool_conv_backward(backend, g, b, chunk_bytes, host_accumulate,
                                                  dtype, flags, name);
}

std::unique_ptr<Kernel> make_conv_max_pool(sdk::Backend& backend, const sdk::GraphView& g,
                                           const sdk::Boundary& b, plx_dtype& dtype) {
  const sdk::ConvMaxPoolSlots s = sdk::conv_max_pool_slots(g, b);
  const bool wino = runs_winograd(backend, g, s.conv);
  dtype = s.dtype;
  const sdk::OwnedNodeInfo conv_info(g, s.conv), pool_info(g, s.pool);
  const NodeInfo conv(&conv_info.get()), pool(&pool_info.get());
  return make_typed<ConvMaxPoolKernel>(dtype, "conv2d+max_pool2d", conv, pool, s, wino);
}

std::unique_ptr<Kernel> make_max_pool_conv_backward(sdk::Backend& backend, const sdk::GraphView& g,
                                                    const sdk::Boundary& b, plx_dtype& dtype) {
  const sdk::MaxPoolConvBackwardSlots s = sdk::max_pool_conv_backward_slots(g, b);
  dtype = s.dtype;
  const size_t elem = acc_size(dtype);
  // The convolution's geometry, from either backward op (both when present, which must agree).
  std::unique_ptr<ConvGeom> geom;
  bool wino_data = false, wino_weight = false;
  for (int32_t n : {s.data, s.weight}) {
    if (n < 0) continue;
    (n == s.data ? wino_data : wino_weight) = runs_winograd(backend, g, n);
    const sdk::OwnedNodeInfo info(g, n);
    const NodeInfo node(&info.get());
    const bool is_data = n == s.data;
    auto gn = is_data ? std::make_unique<ConvGeom>(node.attr_ints("input_shape"),
                                                   dims(node.input(1)), node, elem)
                      : std::make_unique<ConvGeom>(dims(node.input(1)),
                                                   node.attr_ints("weight_shape"), node, elem);
    const plx_tensor& dyv = node.input(0);
    PLX_REQUIRE(dyv.ndim == 4 && dyv.shape[0] == gn->N && dyv.shape[1] == gn->O &&
                    dyv.shape[2] == gn->OH && dyv.shape[3] == gn->OW,
                "%s: dy is not the convolution's output shape", node.op());
    if (geom)
      PLX_DECLINE_UNLESS(geom->N == gn->N && geom->C == gn->C && geom->H == gn->H &&
                             geom->W == gn->W && geom->O == gn->O && geom->KH == gn->KH &&
                             geom->KW == gn->KW,
                         "the two conv backward ops are of different convolutions");
    else
      geom = std::move(gn);
  }
  const sdk::OwnedNodeInfo pool_info(g, s.pool);
  const NodeInfo pool(&pool_info.get());
  return make_typed<MaxPoolConvBackwardKernel>(dtype, "max_pool2d_backward+conv2d_backward", *geom,
                                               pool, s, wino_data, wino_weight);
}

}  // namespace plexus::cpu
