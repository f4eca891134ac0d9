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

namespace plexus::cpu {

namespace {

// Bytes of column matrix one worker unfolds at a time: about half the 1 MiB L2 of this
// machine's cores, so a block is still cached when its GEMMs read it.
constexpr int64_t kColumnBlockBytes = int64_t{512} << 10;

// ceil(a / b) for b > 0 and any sign of a.
constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

// Output positions [lo, hi) whose input position o·s + off lies inside [0, in).
void valid_range(int64_t off, int64_t s, int64_t in, int64_t out, int64_t& lo, int64_t& hi) {
  lo = std::clamp<int64_t>(ceil_div(-off, s), 0, out);
  hi = std::clamp<int64_t>(ceil_div(in - off, s), lo, out);
}

std::vector<int64_t> shape_of(const plx_tensor& t) {
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}

// The sizes of x or w, once both are known to be 4-D.
const int64_t* four(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                    const NodeInfo& node, const std::vector<int64_t>& which) {
  PLX_REQUIRE(x.size() == 4 && w.size() == 4, "%s: x and w must be 4-D", node.op());
  return which.data();
}

// The geometry of one node and how its work is split, worked out when its kernel is created:
// the shared geometry (sdk/op_params.hpp) and what im2col needs on top.
struct ConvGeom : sdk::Conv2dParams {
  int64_t Cg, Og;  // channels per group
  int64_t K;       // rows of a group's column matrix: Cg·KH·KW
  int64_t P;       // columns: OH·OW
  int64_t rows;    // rows of an image's column matrix: C·KH·KW
  bool pointwise;  // 1x1, stride 1, no padding: the image is its own column matrix
  // Per kernel tap kh (kw): the output rows (columns) [lo, hi) that read inside the image, so
  // the unfolding loops need no per-element bounds test.
  std::vector<int64_t> oh_lo, oh_hi, ow_lo, ow_hi;
  int64_t block;    // output rows unfolded at a time
  int64_t workers;  // OpenMP threads the batch is split over; 1: the calling thread only

  ConvGeom(const std::vector<int64_t>& x, const std::vector<int64_t>& w, const NodeInfo& node,
           size_t elem)
      : sdk::Conv2dParams(four(x, w, node, x), four(x, w, node, w), node) {
    Cg = C / groups, Og = O / groups;
    K = Cg * KH * KW, P = OH * OW, rows = C * KH * KW;
    pointwise = KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0;
    oh_lo.resize(static_cast<size_t>(KH)), oh_hi.resize(static_cast<size_t>(KH));
    ow_lo.resize(static_cast<size_t>(KW)), ow_hi.resize(static_cast<size_t>(KW));
    for (int64_t k = 0; k < KH; ++k)
      valid_range(k * dh - ph, sh, H, OH, oh_lo[static_cast<size_t>(k)],
                  oh_hi[static_cast<size_t>(k)]);
    for (int64_t k = 0; k < KW; ++k)
      valid_range(k * dw - pw, sw, W, OW, ow_lo[static_cast<size_t>(k)],
                  ow_hi[static_cast<size_t>(k)]);
    const int64_t row_bytes = std::max<int64_t>(1, rows * OW * static_cast<int64_t>(elem));
    block = std::clamp<int64_t>(kColumnBlockBytes / row_bytes, 1, OH);
    workers = threads() > 1 && N >= threads() ? threads() : 1;
  }

  // Columns of a block of output rows starting at oh0.
  int64_t block_cols(int64_t oh0) const { return (std::min(oh0 + block, OH) - oh0) * OW; }
};

// Output rows [oh0, oh1) of row r (channel c, tap kh, kw) of an image's column matrix:
// dst[(oh − oh0)·OW + ow] = src[c, oh·sh − ph + kh·dh, ow·sw − pw + kw·dw], zero in the padding.
template <class T, class A>
void unfold_row(const ConvGeom& g, const T* src /* (C, H, W) */, int64_t r, int64_t oh0,
                int64_t oh1, A* dst /* ((oh1 − oh0)·OW) */) {
  const int64_t c = r / (g.KH * g.KW), kh = (r / g.KW) % g.KH, kw = r % g.KW;
  const T* plane = src + c * g.H * g.W;  // (H, W)
  const int64_t off_h = kh * g.dh - g.ph, off_w = kw * g.dw - g.pw;
  const int64_t lo = g.ow_lo[static_cast<size_t>(kw)], hi = g.ow_hi[static_cast<size_t>(kw)];
  const int64_t row_lo = g.oh_lo[static_cast<size_t>(kh)],
                row_hi = g.oh_hi[static_cast<size_t>(kh)];
  for (int64_t oh = oh0; oh < oh1; ++oh) {
    A* out = dst + (oh - oh0) * g.OW;  // (OW)
    if (oh < row_lo || oh >= row_hi) {
      std::fill(out, out + g.OW, A(0));
      continue;
    }
    const T* in = plane + (oh * g.sh + off_h) * g.W;  // (W)
    std::fill(out, out + lo, A(0));
    if (g.sw == 1) {
      for (int64_t ow = lo; ow < hi; ++ow) out[ow] = convert<A>(in[ow + off_w]);
    } else {
      for (int64_t ow = lo; ow < hi; ++ow) out[ow] = convert<A>(in[ow * g.sw + off_w]);
    }
    std::fill(out + hi, out + g.OW, A(0));
  }
}

// The inverse of unfold_row: adds a block of an image's unfolded gradient (rows, (oh1 − oh0)·OW)
// back onto the input positions it was read from.
template <class A>
void fold_block(const ConvGeom& g, const A* src /* (rows, cols) */, int64_t oh0, int64_t oh1,
                A* dst /* (C, H, W) */) {
  const int64_t cols = (oh1 - oh0) * g.OW;
  for (int64_t c = 0; c < g.C; ++c) {
    A* plane = dst + c * g.H * g.W;  // (H, W)
    for (int64_t kh = 0; kh < g.KH; ++kh) {
      const int64_t off_h = kh * g.dh - g.ph;
      const int64_t row_lo = std::max(oh0, g.oh_lo[static_cast<size_t>(kh)]);
      const int64_t row_hi = std::min(oh1, g.oh_hi[static_cast<size_t>(kh)]);
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const A* row = src + ((c * g.KH + kh) * g.KW + kw) * cols;  // (cols)
        const int64_t off_w = kw * g.dw - g.pw;
        const int64_t lo = g.ow_lo[static_cast<size_t>(kw)], hi = g.ow_hi[static_cast<size_t>(kw)];
        for (int64_t oh = row_lo; oh < row_hi; ++oh) {
          A* out = plane + (oh * g.sh + off_h) * g.W;  // (W)
          const A* in = row + (oh - oh0) * g.OW;       // (OW)
          if (g.sw == 1) {
            for (int64_t ow = lo; ow < hi; ++ow) out[ow + off_w] += in[ow];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) out[ow * g.sw + off_w] += in[ow];
          }
        }
      }
    }
  }
}

// Calls f(worker, n) for every image n: worker w of g.workers takes a contiguous share.
template <class F>
void for_each_image(const ConvGeom& g, F&& f) {
  if (g.workers == 1) {
    for (int64_t n = 0; n < g.N; ++n) f(int64_t{0}, n);
    return;
  }
  const ScopedSingleThreadedBlas blas;
  parallel_for(g.workers, 1, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w)
      for (int64_t n = g.N * w / g.workers; n < g.N * (w + 1) / g.workers; ++n) f(w, n);
  });
}

template <class S, class D>
void convert_n(const S* src, D* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = convert<D>(src[i]);
}

// Carves 64-byte aligned buffers out of the workspace. Walked once without a base to size the
// workspace at creation and once with it in compute(), so the two always agree.
class Carver {
 public:
  explicit Carver(void* base = nullptr) : base_(static_cast<char*>(base)) {}
  template <class U>
  U* take(int64_t n) {
    const uint64_t off = used_;
    used_ += (static_cast<uint64_t>(std::max<int64_t>(n, 0)) * sizeof(U) + 63) / 64 * 64;
    return base_ ? reinterpret_cast<U*>(base_ + off) : nullptr;
  }
  uint64_t bytes() const { return used_; }

 private:
  char* base_;
  uint64_t used_ = 0;
};

// 16-bit storage types are computed in f32 buffers; f32 and f64 use the tensors themselves.
template <class T>
constexpr bool kWide = !std::is_same_v<T, acc_t<T>>;

// The tensor itself when T is its own accumulation type, else the given buffer.
template <class T>
acc_t<T>* acc_view(T* p, acc_t<T>* buffer) {
  if constexpr (kWide<T>) {
    (void)p;
    return buffer;
  } else {
    (void)buffer;
    return p;
  }
}

// `src` as the accumulation type: itself for f32/f64, converted into `buffer` for 16-bit types.
template <class T>
const acc_t<T>* as_acc(const T* src, acc_t<T>* buffer, int64_t n) {
  if constexpr (kWide<T>) {
    convert_n(src, buffer, n);
    return buffer;
  } else {
    (void)buffer, (void)n;
    return src;
  }
}

// A block's column matrix (rows, cols) and its leading dimension: the image itself when the
// conv is pointwise and needs no conversion, else unfolded into `buf`.
template <class T>
const acc_t<T>* block_columns(const ConvGeom& g, const T* img /* (C, H, W) */, int64_t oh0,
                              acc_t<T>* buf, int64_t& ld) {
  if constexpr (!kWide<T>) {
    if (g.pointwise) {
      ld = g.P;
      return img + oh0 * g.OW;
    }
  }
  const int64_t oh1 = std::min(oh0 + g.block, g.OH);
  ld = (oh1 - oh0) * g.OW;
  for (int64_t r = 0; r < g.rows; ++r) unfold_row(g, img, r, oh0, oh1, buf + r * ld);
  return buf;
}

// Worker wk's part of a per-worker buffer of `size` elements each; null if the buffer is absent.
template <class A>
A* part(A* base, int64_t wk, int64_t size) {
  return base ? base + wk * size : nullptr;
}

// Per-worker buffers; absent ones are null and take no space.
template <class A>
struct Scratch {
  A* w = nullptr;    // (O, K) the weight in f32 (16-bit only), shared
  A* col = nullptr;  // (workers, rows, block·OW) column blocks
  A* dy = nullptr;   // (workers, O, P) an image's dy in f32 (16-bit only)
  A* out = nullptr;  // (workers, image) f32 output image (16-bit only): y (O, P) or dx (C, H, W)
  A* dw = nullptr;   // (workers, O, K) per-worker weight gradients
};

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
      const T* img = x + n * g.C * g.H * g.W;                            // (C, H, W)
      A* dst = acc_view(y + n * g.O * g.P, part(s.out, wk, g.O * g.P));  // (O, P)
      // The GEMMs add onto the bias (beta = 1) rather than a pass adding it afterwards.
      if (bias)
        for (int64_t o = 0; o < g.O; ++o)
          std::fill(dst + o * g.P, dst + (o + 1) * g.P, load(bias, o));
      A* buf = part(s.col, wk, g.rows * g.block * g.OW);  // (rows, block·OW)
      for (int64_t oh0 = 0; oh0 < g.OH; oh0 += g.block) {
        int64_t ld;
        const A* col = block_columns(g, img, oh0, buf, ld);  // (rows, cols), leading dim ld
        for (int64_t grp = 0; grp < g.groups; ++grp)
          gemm<A>(false, false, g.Og, g.block_cols(oh0), g.K, A(1), wa + grp * g.Og * g.K, g.K,
                  col + grp * g.K * ld, ld, bias ? A(1) : A(0), dst + grp * g.Og * g.P + oh0 * g.OW,
                  g.P, nullptr);
      }
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
      if (g.pointwise) {
        // dx_n[g] (Cg, H·W) is the GEMM's output itself.
        for (int64_t grp = 0; grp < g.groups; ++grp)
          gemm<A>(true, false, g.Cg, g.P, g.Og, A(1), wa + grp * g.Og * g.K, g.K,
                  dyn + grp * g.Og * g.P, g.P, A(0), dst + grp * g.Cg * g.P, g.P, nullptr);
      } else {
        std::fill(dst, dst + image, A(0));
        A* buf = part(s.col, wk, g.rows * g.block * g.OW);  // (rows, cols)
        for (int64_t oh0 = 0; oh0 < g.OH; oh0 += g.block) {
          const int64_t cols = g.block_cols(oh0);
          for (int64_t grp = 0; grp < g.groups; ++grp)
            gemm<A>(true, false, g.K, cols, g.Og, A(1), wa + grp * g.Og * g.K, g.K,
                    dyn + grp * g.Og * g.P + oh0 * g.OW, g.P, A(0), buf + grp * g.K * cols, cols,
                    nullptr);
          fold_block(g, buf, oh0, std::min(oh0 + g.block, g.OH), dst);
        }
      }
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
      const T* img = x + n * g.C * g.H * g.W;                                           // (C, H, W)
      const A* dyn = as_acc(dy + n * g.O * g.P, part(s.dy, wk, g.O * g.P), g.O * g.P);  // (O, P)
      A* sum = sums + wk * wsize;                                                       // (O, K)
      A* buf = part(s.col, wk, g.rows * g.block * g.OW);
      for (int64_t oh0 = 0; oh0 < g.OH; oh0 += g.block) {
        int64_t ld;
        const A* col = block_columns(g, img, oh0, buf, ld);  // (rows, cols), leading dim ld
        for (int64_t grp = 0; grp < g.groups; ++grp)
          gemm<A>(false, true, g.Og, g.K, g.block_cols(oh0), A(1),
                  dyn + grp * g.Og * g.P + oh0 * g.OW, g.P, col + grp * g.K * ld, ld, A(1),
                  sum + grp * g.Og * g.K, g.K, nullptr);
      }
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
