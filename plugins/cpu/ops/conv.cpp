// CPU kernels: conv family (see docs/ops.md).
//
// All three ops are GEMMs on OpenBLAS over the unfolded image (im2col):
//   forward          y_n[g]    (Og, P) = w[g] (Og, K) · col_n[g] (K, P)
//   backward data    dcol_n[g] (K, P)  = w[g]ᵀ (K, Og) · dy_n[g] (Og, P), folded (col2im) into dx_n
//   backward weight  dw[g]     (Og, K) = Σ_n dy_n[g] (Og, P) · col_n[g]ᵀ (P, K)
// for image n and group g, with K = C/groups·KH·KW and P = OH·OW. col_n is image n unfolded:
// (C·KH·KW, P), one row per (channel, kernel tap), so group g owns rows [g·K, (g+1)·K). A 1x1,
// stride-1, unpadded conv needs no unfolding: the image (C, H·W) is its own column matrix.
// Images are unfolded a block of output rows at a time (kColumnBlockBytes), so the column
// buffer stays small and in cache however large the image, while each GEMM still spans whole
// output rows.
//
// How the 2 cores are shared: a batch of at least threads() images is split over the OpenMP
// threads (parallel_for); each thread unfolds its own images and multiplies them with
// single-threaded GEMMs, so the threads never wait for each other until the end. The obvious
// alternative, OpenMP loops for the unfolding alternating with multi-threaded GEMMs, measured 2x
// (quiet machine) to 10x (loaded machine) slower with the pthreads build of OpenBLAS, whose
// threads compete for the cores with libgomp's idle workers, which spin for milliseconds after
// every parallel region unless OMP_WAIT_POLICY=passive, and a GEMM stalls whenever one of its
// threads is descheduled. (The build now links OpenBLAS's OpenMP build where it exists, which
// shares libgomp's pool; splitting the batch still keeps each thread's work local.) A batch smaller than the thread count (inference
// on a few images) runs on the calling thread instead, with OpenBLAS's threads splitting each
// GEMM.
//
// 16-bit storage: images are converted to f32 while they are unfolded, the weight once per call,
// dy once per image; GEMMs run in f32 into f32 buffers and every output element is rounded once.
// f64 runs the same code in f64 (the reference for gradient checks).
#include <vector>

#include "common.hpp"
#include "im2col.hpp"

namespace plexus::cpu {

namespace {

using namespace im2col;

// y = conv2d(x, w) + b.
template <class T>
class Conv2dKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit Conv2dKernel(const NodeInfo& node)
      : g_(shape_of(node.input(0)), shape_of(node.input(1)), node, sizeof(A)),
        has_bias_(node.has_input(2)) {}

  uint64_t workspace_bytes() const override {
    Carver c;
    carve(c);
    return c.bytes();
  }

  void compute(const KernelCall& call) override {
    const ConvGeom& g = g_;
    const T* x = sdk::data<T>(call.in(0));                           // (N, C, H, W)
    const T* w = sdk::data<T>(call.in(1));                           // (O, K)
    const T* bias = has_bias_ ? sdk::data<T>(call.in(2)) : nullptr;  // (O)
    T* y = sdk::data<T>(call.out(0));                                // (N, O, OH, OW)
    Carver carver(call.workspace);
    const Scratch<A> s = carve(carver);
    const A* wa = as_acc(w, s.w, g.O * g.K);  // (O, K)

    for_each_image(g, [&](int64_t wk, int64_t n) {
      A* dst = acc_view(y + n * g.O * g.P, part(s.out, wk, g.O * g.P));  // (O, P)
      forward_image(g, wa, bias, x + n * g.C * g.H * g.W, dst,
                    part(s.col, wk, g.rows * g.block * g.OW));
      if constexpr (kWide<T>) convert_n(dst, y + n * g.O * g.P, g.O * g.P);
    });
  }

 private:
  Scratch<A> carve(Carver& c) const {
    Scratch<A> s;
    if (kWide<T>) s.w = c.take<A>(g_.O * g_.K);
    if (kWide<T> || !g_.pointwise) s.col = c.take<A>(g_.workers * g_.rows * g_.block * g_.OW);
    if (kWide<T>) s.out = c.take<A>(g_.workers * g_.O * g_.P);
    return s;
  }

  ConvGeom g_;
  bool has_bias_;
};

// dx = conv2d_backward_data(dy, w): the unfolded gradient w[g]ᵀ·dy_n[g], folded back.
template <class T>
class Conv2dBackwardDataKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit Conv2dBackwardDataKernel(const NodeInfo& node)
      : g_(node.attr_ints("input_shape"), shape_of(node.input(1)), node, sizeof(A)) {}

  uint64_t workspace_bytes() const override {
    Carver c;
    carve(c);
    return c.bytes();
  }

  void compute(const KernelCall& call) override {
    const ConvGeom& g = g_;
    const T* dy = sdk::data<T>(call.in(0));  // (N, O, OH, OW)
    const T* w = sdk::data<T>(call.in(1));   // (O, K)
    T* dx = sdk::data<T>(call.out(0));       // (N, C, H, W)
    Carver carver(call.workspace);
    const Scratch<A> s = carve(carver);
    const A* wa = as_acc(w, s.w, g.O * g.K);  // (O, K)
    const int64_t image = g.C * g.H * g.W;

    for_each_image(g, [&](int64_t wk, int64_t n) {
      const A* dyn = as_acc(dy + n * g.O * g.P, part(s.dy, wk, g.O * g.P), g.O * g.P);  // (O, P)
      A* dst = acc_view(dx + n * image, part(s.out, wk, image));                        // (C, H, W)
      backward_data_image(g, wa, dyn, dst, part(s.col, wk, g.rows * g.block * g.OW));
      if constexpr (kWide<T>) convert_n(dst, dx + n * image, image);
    });
  }

 private:
  Scratch<A> carve(Carver& c) const {
    Scratch<A> s;
    if (kWide<T>) s.w = c.take<A>(g_.O * g_.K);
    if (!g_.pointwise) s.col = c.take<A>(g_.workers * g_.rows * g_.block * g_.OW);
    if (kWide<T>) {
      s.dy = c.take<A>(g_.workers * g_.O * g_.P);
      s.out = c.take<A>(g_.workers * g_.C * g_.H * g_.W);
    }
    return s;
  }

  ConvGeom g_;
};

// dw = conv2d_backward_weight(dy, x) = Σ_n dy_n[g]·col_n[g]ᵀ: each worker accumulates its images
// (beta = 1), then the workers' sums are added in a fixed order.
template <class T>
class Conv2dBackwardWeightKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit Conv2dBackwardWeightKernel(const NodeInfo& node)
      : g_(shape_of(node.input(1)), node.attr_ints("weight_shape"), node, sizeof(A)) {}

  uint64_t workspace_bytes() const override {
    Carver c;
    carve(c);
    return c.bytes();
  }

  void compute(const KernelCall& call) override {
    const ConvGeom& g = g_;
    const T* dy = sdk::data<T>(call.in(0));  // (N, O, OH, OW)
    const T* x = sdk::data<T>(call.in(1));   // (N, C, H, W)
    T* dw = sdk::data<T>(call.out(0));       // (O, K)
    Carver carver(call.workspace);
    const Scratch<A> s = carve(carver);
    const int64_t wsize = g.O * g.K;
    // One worker in f32/f64 accumulates straight into dw.
    A* sums = direct() ? acc_view(dw, s.dw) : s.dw;  // (workers, O, K)
    std::fill(sums, sums + g.workers * wsize, A(0));

    for_each_image(g, [&](int64_t wk, int64_t n) {
      const A* dyn = as_acc(dy + n * g.O * g.P, part(s.dy, wk, g.O * g.P), g.O * g.P);  // (O, P)
      backward_weight_image(g, x + n * g.C * g.H * g.W, dyn, sums + wk * wsize,
                            part(s.col, wk, g.rows * g.block * g.OW));
    });
    if (direct()) return;
    for (int64_t wk = 1; wk < g.workers; ++wk)
      for (int64_t i = 0; i < wsize; ++i) sums[i] += sums[wk * wsize + i];
    for (int64_t i = 0; i < wsize; ++i) dw[i] = convert<T>(sums[i]);
  }

 private:
  bool direct() const { return !kWide<T> && g_.workers == 1; }
  Scratch<A> carve(Carver& c) const {
    Scratch<A> s;
    if (kWide<T> || !g_.pointwise) s.col = c.take<A>(g_.workers * g_.rows * g_.block * g_.OW);
    if (kWide<T>) s.dy = c.take<A>(g_.workers * g_.O * g_.P);
    if (!direct()) s.dw = c.take<A>(g_.workers * g_.O * g_.K);
    return s;
  }

  ConvGeom g_;
};

}  // namespace

void register_conv(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<Conv2dKernel>(r, "conv2d", "im2col_blas", f | PLX_KERNEL_LIBRARY);
  add_float_kernels<Conv2dBackwardDataKernel>(r, "conv2d_backward_data", "col2im_blas", f | PLX_KERNEL_LIBRARY);
  add_float_kernels<Conv2dBackwardWeightKernel>(r, "conv2d_backward_weight", "im2col_blas", f | PLX_KERNEL_LIBRARY);
}

}  // namespace plexus::cpu
