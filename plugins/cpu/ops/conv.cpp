// CPU kernels: conv family (see docs/ops.md).
//
// All three ops are GEMMs on OpenBLAS over the unfolded image (im2col):
//   forward          y_b[g]    (Og, P) = w[g] (Og, K) · col_b[g] (K, P)
//   backward data    dcol_b[g] (K, P)  = w[g]ᵀ (K, Og) · dy_b[g] (Og, P), folded (col2im) into dx_b
//   backward weight  dw[g]     (Og, K) = Σ_b dy_b[g] (Og, P) · col_b[g]ᵀ (P, K)
// for image b and group g, with K = C/groups·KH·KW and P = OH·OW. col_b is image b unfolded:
// (C·KH·KW, P), one row per (channel, kernel tap), so group g owns rows [g·K, (g+1)·K). A 1x1,
// stride-1, unpadded conv needs no unfolding: the image (C, H·W) is its own column matrix.
//
// How the cores are shared: in phases, never split between libraries. The unfolding, folding and
// 16-bit conversion loops run on all threads with OpenMP (parallel_for); then each GEMM runs on
// OpenBLAS's own threads, called from this (the calling) thread only. Calling BLAS from inside an
// OpenMP region instead would oversubscribe: the distribution's OpenBLAS is the pthreads build,
// which starts its own team for every caller. To keep the phase switches few, images go in
// chunks: one parallel unfolding pass over a chunk, then the chunk's GEMMs, each of which still
// covers a whole image (N = P columns, large enough for OpenBLAS to use both cores). A chunk's
// column buffer is held to kColumnBudget so that it is still in the L3 cache when its GEMMs read
// it; the budget, not the batch, bounds the workspace.
//
// 16-bit storage: images are converted to f32 while they are unfolded, the weight once per call,
// dy once per chunk; GEMMs run in f32 into f32 buffers and every output element is rounded once.
// f64 runs the same code in f64 (the reference for gradient checks).
#include <vector>

#include "common.hpp"

namespace plexus::cpu {

namespace {

// Bytes of column buffer a chunk of images may use (see the top of the file).
constexpr int64_t kColumnBudget = int64_t{8} << 20;

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

// The geometry of one node, worked out when its kernel is created.
struct ConvGeom {
  int64_t N, C, H, W;  // x (N, C, H, W)
  int64_t O, KH, KW;   // w (O, C/groups, KH, KW)
  int64_t OH, OW;      // y (N, O, OH, OW)
  int64_t sh, sw, ph, pw, dh, dw, groups;
  int64_t Cg, Og;  // channels per group
  int64_t K;       // rows of a group's column matrix: Cg·KH·KW
  int64_t P;       // columns: OH·OW
  int64_t rows;    // rows of an image's column matrix: C·KH·KW
  bool pointwise;  // 1x1, stride 1, no padding: the image is its own column matrix
  // Per kernel tap kh (kw): the output rows (columns) [lo, hi) that read inside the image, so
  // the unfolding loops need no per-element bounds test.
  std::vector<int64_t> oh_lo, oh_hi, ow_lo, ow_hi;

  ConvGeom(const std::vector<int64_t>& x, const std::vector<int64_t>& w, const NodeInfo& node) {
    PLX_REQUIRE(x.size() == 4 && w.size() == 4, "%s: x and w must be 4-D", node.op());
    const auto stride = node.attr_ints("stride"), pad = node.attr_ints("padding"),
               dil = node.attr_ints("dilation");
    PLX_REQUIRE(stride.size() == 2 && pad.size() == 2 && dil.size() == 2,
                "%s: stride, padding and dilation must have 2 values", node.op());
    N = x[0], C = x[1], H = x[2], W = x[3];
    O = w[0], KH = w[2], KW = w[3];
    sh = stride[0], sw = stride[1], ph = pad[0], pw = pad[1], dh = dil[0], dw = dil[1];
    groups = node.attr_int("groups");
    PLX_REQUIRE(groups >= 1 && C % groups == 0 && O % groups == 0 && w[1] * groups == C,
                "%s: channels do not match groups", node.op());
    PLX_REQUIRE(
        sh >= 1 && sw >= 1 && dh >= 1 && dw >= 1 && ph >= 0 && pw >= 0 && KH >= 1 && KW >= 1,
        "%s: bad stride, padding, dilation or kernel", node.op());
    OH = (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1;
    OW = (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
    PLX_REQUIRE(OH >= 1 && OW >= 1, "%s: kernel larger than the padded input", node.op());
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
  }

  // Images per chunk: as many as fit the column budget, at least one.
  int64_t chunk(size_t elem) const {
    const int64_t per_image = std::max<int64_t>(1, rows * P * static_cast<int64_t>(elem));
    return std::clamp<int64_t>(kColumnBudget / per_image, 1, std::max<int64_t>(N, 1));
  }
};

// Row r (channel c, tap kh, kw) of an image's column matrix: dst[oh·OW + ow] =
// src[c, oh·sh − ph + kh·dh, ow·sw − pw + kw·dw], zero where that falls in the padding.
template <class T, class A>
void unfold_row(const ConvGeom& g, const T* src /* (C, H, W) */, int64_t r, A* dst /* (P) */) {
  const int64_t c = r / (g.KH * g.KW), kh = (r / g.KW) % g.KH, kw = r % g.KW;
  const T* plane = src + c * g.H * g.W;  // (H, W)
  const int64_t off_h = kh * g.dh - g.ph, off_w = kw * g.dw - g.pw;
  const int64_t lo = g.ow_lo[static_cast<size_t>(kw)], hi = g.ow_hi[static_cast<size_t>(kw)];
  const int64_t row_lo = g.oh_lo[static_cast<size_t>(kh)],
                row_hi = g.oh_hi[static_cast<size_t>(kh)];
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    A* out = dst + oh * g.OW;  // (OW)
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

// The inverse of unfold_row summed over channel c's KH·KW rows: dst (H, W) = Σ over taps of the
// rows scattered back to the input positions they were read from.
template <class A>
void fold_plane(const ConvGeom& g, const A* src /* (KH·KW, P) */, A* dst /* (H, W) */) {
  std::fill(dst, dst + g.H * g.W, A(0));
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    const int64_t off_h = kh * g.dh - g.ph;
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const A* row = src + (kh * g.KW + kw) * g.P;
      const int64_t off_w = kw * g.dw - g.pw;
      const int64_t lo = g.ow_lo[static_cast<size_t>(kw)], hi = g.ow_hi[static_cast<size_t>(kw)];
      for (int64_t oh = g.oh_lo[static_cast<size_t>(kh)]; oh < g.oh_hi[static_cast<size_t>(kh)];
           ++oh) {
        A* out = dst + (oh * g.sh + off_h) * g.W;  // (W)
        const A* in = row + oh * g.OW;             // (OW)
        if (g.sw == 1) {
          for (int64_t ow = lo; ow < hi; ++ow) out[ow + off_w] += in[ow];
        } else {
          for (int64_t ow = lo; ow < hi; ++ow) out[ow * g.sw + off_w] += in[ow];
        }
      }
    }
  }
}

// Unfolds images [0, nb) of `src` into `col` (nb, rows, P), in parallel over rows.
template <class T, class A>
void unfold_images(const ConvGeom& g, const T* src /* (nb, C, H, W) */, int64_t nb,
                   A* col /* (nb, rows, P) */) {
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(g.P, 1));
  parallel_for(nb * g.rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t n = i / g.rows, r = i % g.rows;
      unfold_row(g, src + n * g.C * g.H * g.W, r, col + i * g.P);
    }
  });
}

template <class S, class D>
void convert_all(const S* src, D* dst, int64_t n) {
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = convert<D>(src[i]);
  });
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
    convert_all(src, buffer, n);
    return buffer;
  } else {
    (void)buffer, (void)n;
    return src;
  }
}

// The column matrices of images [0, nb) of `xs`: unfolded into `col` (nb, rows, P), or the
// images themselves when the conv is pointwise and needs no conversion.
template <class T>
const acc_t<T>* columns(const ConvGeom& g, const T* xs /* (nb, C, H, W) */, int64_t nb,
                        acc_t<T>* col) {
  if constexpr (!kWide<T>)
    if (g.pointwise) return xs;
  unfold_images(g, xs, nb, col);
  return col;
}

// Buffers every conv kernel may use; absent ones are null (and take no space).
template <class A>
struct ConvScratch {
  A* col = nullptr;  // (chunk, rows, P) unfolded images or their gradient
  A* w = nullptr;    // (O, K) the weight in f32 (16-bit only)
  A* dy = nullptr;   // (chunk, O, P) dy in f32 (16-bit only)
  A* y = nullptr;    // forward: (chunk, O, P); backward data: (chunk, C, H, W); 16-bit only
  A* dw = nullptr;   // (O, K) accumulated weight gradient (16-bit only)
};

// y = conv2d(x, w) + b.
template <class T>
class Conv2dKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit Conv2dKernel(const NodeInfo& node)
      : g_(shape_of(node.input(0)), shape_of(node.input(1)), node),
        has_bias_(node.has_input(2)),
        chunk_(g_.chunk(sizeof(A))) {}

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
    const ConvScratch<A> s = carve(carver);
    const A* wa = as_acc(w, s.w, g.O * g.K);  // (O, K)

    for (int64_t n0 = 0; n0 < g.N; n0 += chunk_) {
      const int64_t nb = std::min(chunk_, g.N - n0);
      const T* xs = x + n0 * g.C * g.H * g.W;      // (nb, C, H, W)
      const A* col = columns(g, xs, nb, s.col);    // (nb, rows, P)
      A* dst = acc_view(y + n0 * g.O * g.P, s.y);  // (nb, O, P)
      if (bias) {
        // The GEMMs add onto the bias (beta = 1) rather than a pass adding it afterwards.
        const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(g.P, 1));
        parallel_for(nb * g.O, grain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            std::fill(dst + i * g.P, dst + (i + 1) * g.P, load(bias, i % g.O));
        });
      }
      for (int64_t n = 0; n < nb; ++n)
        for (int64_t grp = 0; grp < g.groups; ++grp)
          gemm<A>(false, false, g.Og, g.P, g.K, A(1), wa + grp * g.Og * g.K, g.K,
                  col + (n * g.rows + grp * g.K) * g.P, g.P, bias ? A(1) : A(0),
                  dst + (n * g.O + grp * g.Og) * g.P, g.P, nullptr);
      if constexpr (kWide<T>) convert_all(dst, y + n0 * g.O * g.P, nb * g.O * g.P);
    }
  }

 private:
  ConvScratch<A> carve(Carver& c) const {
    ConvScratch<A> s;
    if (kWide<T> || !g_.pointwise) s.col = c.take<A>(chunk_ * g_.rows * g_.P);
    if (kWide<T>) {
      s.w = c.take<A>(g_.O * g_.K);
      s.y = c.take<A>(chunk_ * g_.O * g_.P);
    }
    return s;
  }

  ConvGeom g_;
  bool has_bias_;
  int64_t chunk_;
};

// dx = conv2d_backward_data(dy, w): the unfolded gradient w[g]ᵀ·dy_b[g], folded back.
template <class T>
class Conv2dBackwardDataKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit Conv2dBackwardDataKernel(const NodeInfo& node)
      : g_(node.attr_ints("input_shape"), shape_of(node.input(1)), node),
        chunk_(g_.chunk(sizeof(A))) {}

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
    const ConvScratch<A> s = carve(carver);
    const A* wa = as_acc(w, s.w, g.O * g.K);  // (O, K)
    const int64_t plane = g.H * g.W;

    for (int64_t n0 = 0; n0 < g.N; n0 += chunk_) {
      const int64_t nb = std::min(chunk_, g.N - n0);
      const A* dys = as_acc(dy + n0 * g.O * g.P, s.dy, nb * g.O * g.P);  // (nb, O, P)
      A* dst = acc_view(dx + n0 * g.C * plane, s.y);                     // (nb, C, H, W)
      // Pointwise: the GEMM writes dx directly; otherwise the unfolded gradient, then folded.
      A* dcol = g.pointwise ? dst : s.col;  // (nb, rows, P)
      for (int64_t n = 0; n < nb; ++n)
        for (int64_t grp = 0; grp < g.groups; ++grp)
          gemm<A>(true, false, g.K, g.P, g.Og, A(1), wa + grp * g.Og * g.K, g.K,
                  dys + (n * g.O + grp * g.Og) * g.P, g.P, A(0),
                  dcol + (n * g.rows + grp * g.K) * g.P, g.P, nullptr);
      if (!g.pointwise) {
        const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(plane, 1));
        parallel_for(nb * g.C, grain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            fold_plane(g, dcol + i * g.KH * g.KW * g.P, dst + i * plane);
            // Rounded while the plane is still in cache.
            if constexpr (kWide<T>)
              for (int64_t j = 0; j < plane; ++j)
                dx[(n0 * g.C + i) * plane + j] = convert<T>(dst[i * plane + j]);
          }
        });
      } else if constexpr (kWide<T>) {
        convert_all(dst, dx + n0 * g.C * plane, nb * g.C * plane);
      }
    }
  }

 private:
  ConvScratch<A> carve(Carver& c) const {
    ConvScratch<A> s;
    if (!g_.pointwise) s.col = c.take<A>(chunk_ * g_.rows * g_.P);
    if (kWide<T>) {
      s.w = c.take<A>(g_.O * g_.K);
      s.dy = c.take<A>(chunk_ * g_.O * g_.P);
      s.y = c.take<A>(chunk_ * g_.C * g_.H * g_.W);
    }
    return s;
  }

  ConvGeom g_;
  int64_t chunk_;
};

// dw = conv2d_backward_weight(dy, x): Σ_b dy_b[g]·col_b[g]ᵀ, accumulated by the GEMMs (beta = 1).
template <class T>
class Conv2dBackwardWeightKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit Conv2dBackwardWeightKernel(const NodeInfo& node)
      : g_(shape_of(node.input(1)), node.attr_ints("weight_shape"), node),
        chunk_(g_.chunk(sizeof(A))) {}

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
    const ConvScratch<A> s = carve(carver);
    A* dwa = acc_view(dw, s.dw);  // (O, K)
    if (g.N == 0) std::fill(dwa, dwa + g.O * g.K, A(0));

    for (int64_t n0 = 0; n0 < g.N; n0 += chunk_) {
      const int64_t nb = std::min(chunk_, g.N - n0);
      const T* xs = x + n0 * g.C * g.H * g.W;                            // (nb, C, H, W)
      const A* col = columns(g, xs, nb, s.col);                          // (nb, rows, P)
      const A* dys = as_acc(dy + n0 * g.O * g.P, s.dy, nb * g.O * g.P);  // (nb, O, P)
      for (int64_t n = 0; n < nb; ++n)
        for (int64_t grp = 0; grp < g.groups; ++grp)
          gemm<A>(false, true, g.Og, g.K, g.P, A(1), dys + (n * g.O + grp * g.Og) * g.P, g.P,
                  col + (n * g.rows + grp * g.K) * g.P, g.P, n0 + n == 0 ? A(0) : A(1),
                  dwa + grp * g.Og * g.K, g.K, nullptr);
    }
    if constexpr (kWide<T>) convert_all(dwa, dw, g.O * g.K);
  }

 private:
  ConvScratch<A> carve(Carver& c) const {
    ConvScratch<A> s;
    if (kWide<T> || !g_.pointwise) s.col = c.take<A>(chunk_ * g_.rows * g_.P);
    if (kWide<T>) {
      s.dy = c.take<A>(chunk_ * g_.O * g_.P);
      s.dw = c.take<A>(g_.O * g_.K);
    }
    return s;
  }

  ConvGeom g_;
  int64_t chunk_;
};

}  // namespace

void register_conv(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<Conv2dKernel>(r, "conv2d", "im2col_blas", f);
  add_float_kernels<Conv2dBackwardDataKernel>(r, "conv2d_backward_data", "col2im_blas", f);
  add_float_kernels<Conv2dBackwardWeightKernel>(r, "conv2d_backward_weight", "im2col_blas", f);
}

}  // namespace plexus::cpu
