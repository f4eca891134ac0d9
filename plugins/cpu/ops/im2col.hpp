// The im2col machinery of the CPU plugin's convolutions (ops/conv.cpp, and the conv + pool
// fusions of ops/conv_pool.cpp, which run the same loops image by image): the geometry of a
// node, unfolding an image a block of output rows at a time, folding a gradient back, splitting
// the batch over the threads, and carving the workspace. How and why: the head of ops/conv.cpp.
#pragma once

#include <vector>

#include "common.hpp"

namespace plexus::cpu::im2col {

// Bytes of column matrix one worker unfolds at a time: about half the 1 MiB L2 of this
// machine's cores, so a block is still cached when its GEMMs read it.
constexpr int64_t kColumnBlockBytes = int64_t{512} << 10;

// ceil(a / b) for b > 0 and any sign of a.
constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

// Output positions [lo, hi) whose input position o·s + off lies inside [0, in).
inline void valid_range(int64_t off, int64_t s, int64_t in, int64_t out, int64_t& lo, int64_t& hi) {
  lo = std::clamp<int64_t>(ceil_div(-off, s), 0, out);
  hi = std::clamp<int64_t>(ceil_div(in - off, s), lo, out);
}

inline std::vector<int64_t> shape_of(const plx_tensor& t) {
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}

// The sizes of x or w, once both are known to be 4-D.
inline const int64_t* four(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
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

// One image of each op, as the kernels of ops/conv.cpp run them (and the fused kernels of
// ops/conv_pool.cpp, which therefore agree with them to the bit). `buf` is the worker's column
// block (rows, block·OW); wa the weight (O, K) in the accumulation type.

// dst (O, P) = conv(img) (+ bias): the GEMMs add onto the bias (beta = 1) rather than a pass
// adding it afterwards.
template <class T, class A>
void forward_image(const ConvGeom& g, const A* wa, const T* bias, const T* img /* (C, H, W) */,
                   A* dst /* (O, P) */, A* buf) {
  if (bias)
    for (int64_t o = 0; o < g.O; ++o) std::fill(dst + o * g.P, dst + (o + 1) * g.P, load(bias, o));
  for (int64_t oh0 = 0; oh0 < g.OH; oh0 += g.block) {
    int64_t ld;
    const A* col = block_columns(g, img, oh0, buf, ld);  // (rows, cols), leading dim ld
    for (int64_t grp = 0; grp < g.groups; ++grp)
      gemm<A>(false, false, g.Og, g.block_cols(oh0), g.K, A(1), wa + grp * g.Og * g.K, g.K,
              col + grp * g.K * ld, ld, bias ? A(1) : A(0), dst + grp * g.Og * g.P + oh0 * g.OW,
              g.P, nullptr);
  }
}

// dst (C, H, W) = the unfolded gradient w[g]ᵀ·dy_n[g], folded back.
template <class A>
void backward_data_image(const ConvGeom& g, const A* wa, const A* dyn /* (O, P) */,
                         A* dst /* (C, H, W) */, A* buf) {
  if (g.pointwise) {
    // dx_n[g] (Cg, H·W) is the GEMM's output itself.
    for (int64_t grp = 0; grp < g.groups; ++grp)
      gemm<A>(true, false, g.Cg, g.P, g.Og, A(1), wa + grp * g.Og * g.K, g.K,
              dyn + grp * g.Og * g.P, g.P, A(0), dst + grp * g.Cg * g.P, g.P, nullptr);
    return;
  }
  std::fill(dst, dst + g.C * g.H * g.W, A(0));
  for (int64_t oh0 = 0; oh0 < g.OH; oh0 += g.block) {
    const int64_t cols = g.block_cols(oh0);
    for (int64_t grp = 0; grp < g.groups; ++grp)
      gemm<A>(true, false, g.K, cols, g.Og, A(1), wa + grp * g.Og * g.K, g.K,
              dyn + grp * g.Og * g.P + oh0 * g.OW, g.P, A(0), buf + grp * g.K * cols, cols,
              nullptr);
    fold_block(g, buf, oh0, std::min(oh0 + g.block, g.OH), dst);
  }
}

// sum (O, K) += dy_n[g]·col_n[g]ᵀ.
template <class T, class A>
void backward_weight_image(const ConvGeom& g, const T* img /* (C, H, W) */,
                           const A* dyn /* (O, P) */, A* sum /* (O, K) */, A* buf) {
  for (int64_t oh0 = 0; oh0 < g.OH; oh0 += g.block) {
    int64_t ld;
    const A* col = block_columns(g, img, oh0, buf, ld);  // (rows, cols), leading dim ld
    for (int64_t grp = 0; grp < g.groups; ++grp)
      gemm<A>(false, true, g.Og, g.K, g.block_cols(oh0), A(1), dyn + grp * g.Og * g.P + oh0 * g.OW,
              g.P, col + grp * g.K * ld, ld, A(1), sum + grp * g.Og * g.K, g.K, nullptr);
  }
}

}  // namespace plexus::cpu::im2col
