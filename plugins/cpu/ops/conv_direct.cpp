// CPU kernels: direct convolution for layers with few taps (C·KH·KW small), candidates beside
// the im2col+OpenBLAS kernels (conv.cpp) that the core's tuner times against them
// (backend.kernels, docs/training.md).
//
// Why: the first layer of an image model has one or three input channels, so its GEMMs have a
// reduction of 9 to 27 (C·KH·KW) against hundreds of output pixels. OpenBLAS packs both operands
// for such a GEMM and its micro-kernel runs a few iterations per tile, while the direct loops
// below stream each input row once per tap with the output row kept in registers and L1:
//   forward          y[n, o, oh, :] = b[o] + Σ_{c, kh, kw} w[o, c, kh, kw] · x[n, c, ih, iw(:)]
//   backward weight  dw[o, c, kh, kw] = Σ_{n, oh} dy[n, o, oh, :] · x[n, c, ih, iw(:)]
// with ih = oh·sh - ph + kh·dh and iw(ow) = ow·sw - pw + kw·dw. With stride 1 the inner loops
// run over contiguous memory and vectorise.
//
// Both decline groups > 1 and more than kMaxTaps taps, where im2col's GEMMs are the better
// algorithm and timing a hopeless candidate would only slow graph preparation. The forward
// splits (image, output channel) pairs over the threads; backward weight splits output channels,
// each thread summing its channels' taps over the whole batch in a fixed order, so both are
// deterministic. Sums are in the accumulation type (f32 for 16-bit storage) and each output is
// rounded once. The order of the sums differs from the GEMMs', so results agree with im2col's to
// rounding, not to the bit.
#include <vector>

#include "common.hpp"

namespace plexus::cpu {

namespace {

// Most taps (C·KH·KW) the direct kernels take.
constexpr int64_t kMaxTaps = 64;
// Output columns summed at a time: a row chunk of accumulators that stays in L1.
constexpr int64_t kChunk = 256;

constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

struct DirectGeom : sdk::Conv2dParams {
  // Per kw: the output columns [lo, hi) whose input column lies inside the image.
  std::vector<int64_t> ow_lo, ow_hi;

  DirectGeom(const plx_tensor& x, const plx_tensor& w, const NodeInfo& node)
      : sdk::Conv2dParams(x.shape, w.shape, node) {
    PLX_DECLINE_UNLESS(groups == 1, "groups = %lld: grouped convolutions run on im2col's GEMMs",
                       static_cast<long long>(groups));
    const int64_t taps = C * KH * KW;
    PLX_DECLINE_UNLESS(taps <= kMaxTaps,
                       "%lld taps (C·KH·KW); the direct kernel takes at most %lld, beyond which "
                       "a GEMM is faster",
                       static_cast<long long>(taps), static_cast<long long>(kMaxTaps));
    for (int64_t kw = 0; kw < KW; ++kw) {
      const int64_t off = kw * dw - pw;
      const int64_t lo = std::clamp<int64_t>(ceil_div(-off, sw), 0, OW);
      const int64_t hi = std::clamp<int64_t>(ceil_div(W - off, sw), lo, OW);
      ow_lo.push_back(lo);
      ow_hi.push_back(hi);
    }
  }
};

void require_4d(const NodeInfo& node) {
  PLX_REQUIRE(node.input(0).ndim == 4 && node.input(1).ndim == 4, "%s: x and w must be 4-D",
              node.op());
}

template <class T>
class DirectConv2dKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit DirectConv2dKernel(const NodeInfo& node)
      : g_((require_4d(node), node.input(0)), node.input(1), node), has_bias_(node.has_input(2)) {
    wide_ = g_.sh == 1 && g_.sw == 1;
    Hp_ = g_.H + 2 * g_.ph;
    Wp_ = g_.W + 2 * g_.pw;
    workers_ = std::max<int64_t>(1, std::min<int64_t>(threads(), g_.N));
  }

  // Stride 1: per worker, the image zero-padded (C planes of Hp·Wp, plus the slack the last
  // taps read past the end) and one output plane of accumulators OH·Wp wide.
  uint64_t workspace_bytes() const override {
    return wide_ ? static_cast<uint64_t>(workers_ * per_worker()) * sizeof(A) : 0;
  }

  void compute(const KernelCall& call) override {
    const T* x = sdk::data<T>(call.in(0));
    const T* w = sdk::data<T>(call.in(1));
    const T* bias = has_bias_ ? sdk::data<T>(call.in(2)) : nullptr;
    T* y = sdk::data<T>(call.out(0));
    if (g_.N == 0) return;
    if (wide_) wide(x, w, bias, y, static_cast<A*>(call.workspace));
    else rows(x, w, bias, y);
  }

 private:
  int64_t plane() const { return Hp_ * Wp_; }
  int64_t slack() const { return (g_.KW - 1) * g_.dw; }
  int64_t per_worker() const { return g_.C * plane() + slack() + g_.OH * Wp_; }

  // Stride 1: output row oh, column ow reads padded input (oh + kh·dh, ow + kw·dw), so over the
  // padded width Wp the whole plane is one contiguous run per tap:
  //   acc[oh·Wp + ow] += w · xp[kh·dh·Wp + kw·dw + oh·Wp + ow],
  // a loop of OH·Wp that vectorises. Columns ow >= OW read across a row's end: they are
  // computed and never stored.
  void wide(const T* x, const T* w, const T* bias, T* y, A* ws) const {
    const DirectGeom& g = g_;
    const int64_t taps = g.C * g.KH * g.KW, span = g.OH * Wp_;
    parallel_for(workers_, 1, [&](int64_t b, int64_t e) {
      for (int64_t wk = b; wk < e; ++wk) {
        A* xp = ws + wk * per_worker();
        A* acc = xp + g.C * plane() + slack();
        std::fill(xp, xp + g.C * plane() + slack(), A(0));
        for (int64_t n = g.N * wk / workers_; n < g.N * (wk + 1) / workers_; ++n) {
          for (int64_t c = 0; c < g.C; ++c)
            for (int64_t h = 0; h < g.H; ++h) {
              const T* src = x + ((n * g.C + c) * g.H + h) * g.W;
              A* dst = xp + c * plane() + (h + g.ph) * Wp_ + g.pw;
              for (int64_t i = 0; i < g.W; ++i) dst[i] = load(src, i);
            }
          for (int64_t o = 0; o < g.O; ++o) {
            // Blocks of kBlock outputs summed over every tap in registers, then stored once.
            A wv[kMaxTaps];
            int64_t toff[kMaxTaps];
            for (int64_t t = 0; t < taps; ++t) {
              const int64_t c = t / (g.KH * g.KW), kh = t / g.KW % g.KH, kw = t % g.KW;
              wv[t] = load(w, o * taps + t);
              toff[t] = c * plane() + kh * g.dh * Wp_ + kw * g.dw;
            }
            const A b0 = bias ? load(bias, o) : A(0);
            constexpr int64_t kBlock = 64;
            for (int64_t i0 = 0; i0 < span; i0 += kBlock) {
              const int64_t len = std::min(kBlock, span - i0);
              A blk[kBlock];
              for (int64_t i = 0; i < kBlock; ++i) blk[i] = b0;
              for (int64_t t = 0; t < taps; ++t) {
                const A* src = xp + toff[t] + i0;
                const A wt = wv[t];
                if (len == kBlock)
                  for (int64_t i = 0; i < kBlock; ++i) blk[i] += wt * src[i];
                else
                  for (int64_t i = 0; i < len; ++i) blk[i] += wt * src[i];
              }
              std::copy(blk, blk + len, acc + i0);
            }
            T* out = y + (n * g.O + o) * g.OH * g.OW;
            for (int64_t oh = 0; oh < g.OH; ++oh)
              for (int64_t ow = 0; ow < g.OW; ++ow) store(out, oh * g.OW + ow, acc[oh * Wp_ + ow]);
          }
        }
      }
    });
  }

  // Any stride: a chunk of an output row at a time, each tap adding its input row into it.
  void rows(const T* x, const T* w, const T* bias, T* y) const {
    const DirectGeom& g = g_;
    const int64_t taps = g.C * g.KH * g.KW;
    const int64_t work = g.OH * g.OW * taps;  // multiply-adds per (image, channel)
    parallel_for(g.N * g.O, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(work, 1)),
                 [&](int64_t begin, int64_t end) {
      A acc[kChunk];
      A wv[kMaxTaps];
      for (int64_t no = begin; no < end; ++no) {
        const int64_t n = no / g.O, o = no % g.O;
        for (int64_t t = 0; t < taps; ++t) wv[t] = load(w, o * taps + t);
        const A b0 = bias ? load(bias, o) : A(0);
        T* yrow0 = y + (n * g.O + o) * g.OH * g.OW;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          for (int64_t c0 = 0; c0 < g.OW; c0 += kChunk) {
            const int64_t c1 = std::min(g.OW, c0 + kChunk);
            for (int64_t ow = c0; ow < c1; ++ow) acc[ow - c0] = b0;
            for (int64_t c = 0; c < g.C; ++c) {
              for (int64_t kh = 0; kh < g.KH; ++kh) {
                const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
                if (ih < 0 || ih >= g.H) continue;
                const T* xrow = x + ((n * g.C + c) * g.H + ih) * g.W;
                for (int64_t kw = 0; kw < g.KW; ++kw) {
                  const A wt = wv[(c * g.KH + kh) * g.KW + kw];
                  const int64_t lo = std::max(c0, g.ow_lo[static_cast<size_t>(kw)]);
                  const int64_t hi = std::min(c1, g.ow_hi[static_cast<size_t>(kw)]);
                  const int64_t off = kw * g.dw - g.pw;
                  for (int64_t ow = lo; ow < hi; ++ow)
                    acc[ow - c0] += wt * load(xrow, ow * g.sw + off);
                }
              }
            }
            T* yrow = yrow0 + oh * g.OW;
            for (int64_t ow = c0; ow < c1; ++ow) store(yrow, ow, acc[ow - c0]);
          }
        }
      }
    });
  }

  DirectGeom g_;
  bool has_bias_;
  bool wide_ = false;
  int64_t Hp_ = 0, Wp_ = 0, workers_ = 1;
};

// inputs (dy, x) -> dw; attrs as conv2d; dw has w's shape.
template <class T>
class DirectConv2dBackwardWeightKernel final : public Kernel {
  using A = acc_t<T>;

 public:
  explicit DirectConv2dBackwardWeightKernel(const NodeInfo& node)
      : g_(checked_x(node), node.output(0), node) {
    PLX_REQUIRE(node.input(0).ndim == 4 && node.input(0).shape[0] == g_.N &&
                    node.input(0).shape[1] == g_.O && node.input(0).shape[2] == g_.OH &&
                    node.input(0).shape[3] == g_.OW,
                "%s: dy must be (N, O, OH, OW)", node.op());
    wide_ = g_.sh == 1 && g_.sw == 1;
    Hp_ = g_.H + 2 * g_.ph;
    Wp_ = g_.W + 2 * g_.pw;
    workers_ = std::max<int64_t>(1, std::min<int64_t>(threads(), g_.O));
  }

  uint64_t workspace_bytes() const override {
    if (wide_) return static_cast<uint64_t>(workers_ * per_worker()) * sizeof(A);
    return static_cast<uint64_t>(g_.O * g_.C * g_.KH * g_.KW * chunk()) * sizeof(A);
  }

  void compute(const KernelCall& call) override {
    if (wide_) wide(call);
    else rows(call);
  }

 private:
  static constexpr int64_t kLanes = 16;  // partial sums per tap, so the dot products vectorise

  int64_t plane() const { return Hp_ * Wp_; }
  int64_t slack() const { return (g_.KW - 1) * g_.dw; }
  int64_t per_worker() const { return g_.C * plane() + slack() + g_.OH * Wp_ + kLanes; }

  // Stride 1, as the forward's wide path: dy's row is widened to Wp with zeros past OW, so each
  // tap's sum over a whole image is one dot product of two contiguous runs of OH·Wp,
  //   dw[o, c, kh, kw] += Σ_i dyw[i] · xp[c][kh·dh·Wp + kw·dw + i],
  // summed in kLanes partial sums (elementwise, so it vectorises) reduced in a fixed order.
  // Workers split the output channels; each pads every image once for its channels.
  void wide(const KernelCall& call) const {
    const DirectGeom& g = g_;
    const T* dy = sdk::data<T>(call.in(0));
    const T* x = sdk::data<T>(call.in(1));
    T* dw = sdk::data<T>(call.out(0));
    A* ws = static_cast<A*>(call.workspace);
    const int64_t taps = g.C * g.KH * g.KW, span = g.OH * Wp_;
    parallel_for(workers_, 1, [&](int64_t b, int64_t e) {
      for (int64_t wk = b; wk < e; ++wk) {
        const int64_t o0 = g.O * wk / workers_, o1 = g.O * (wk + 1) / workers_;
        A* xp = ws + wk * per_worker();
        A* dyw = xp + g.C * plane() + slack();
        std::fill(xp, xp + g.C * plane() + slack() + span, A(0));
        A sums[kMaxTaps][kLanes];
        // One output channel at a time, its taps' partial sums over every image (the images are
        // padded again per channel: cheap next to the dot products at these few taps).
        for (int64_t o = o0; o < o1; ++o) {
          for (int64_t t = 0; t < taps; ++t)
            for (int64_t l = 0; l < kLanes; ++l) sums[t][l] = A(0);
          for (int64_t n = 0; n < g.N; ++n) {
            for (int64_t c = 0; c < g.C; ++c)
              for (int64_t h = 0; h < g.H; ++h) {
                const T* src = x + ((n * g.C + c) * g.H + h) * g.W;
                A* dst = xp + c * plane() + (h + g.ph) * Wp_ + g.pw;
                for (int64_t i = 0; i < g.W; ++i) dst[i] = load(src, i);
              }
            const T* dyo = dy + (n * g.O + o) * g.OH * g.OW;
            for (int64_t oh = 0; oh < g.OH; ++oh)
              for (int64_t ow = 0; ow < g.OW; ++ow) dyw[oh * Wp_ + ow] = load(dyo, oh * g.OW + ow);
            for (int64_t t = 0; t < taps; ++t) {
              const int64_t c = t / (g.KH * g.KW), kh = t / g.KW % g.KH, kw = t % g.KW;
              const A* src = xp + c * plane() + kh * g.dh * Wp_ + kw * g.dw;
              A* part = sums[t];
              int64_t i = 0;
              for (; i + kLanes <= span; i += kLanes)
                for (int64_t l = 0; l < kLanes; ++l) part[l] += dyw[i + l] * src[i + l];
              for (; i < span; ++i) part[i % kLanes] += dyw[i] * src[i];
            }
          }
          for (int64_t t = 0; t < taps; ++t) {
            A s = A(0);
            for (int64_t l = 0; l < kLanes; ++l) s += sums[t][l];
            store(dw, o * taps + t, s);
          }
        }
      }
    });
  }

  // Any stride: per output channel, a row of accumulators per tap, summed elementwise along the
  // output row and reduced once at the end.
  void rows(const KernelCall& call) const {
    const DirectGeom& g = g_;
    const T* dy = sdk::data<T>(call.in(0));
    const T* x = sdk::data<T>(call.in(1));
    T* dw = sdk::data<T>(call.out(0));
    A* rows = static_cast<A*>(call.workspace);
    const int64_t taps = g.C * g.KH * g.KW;
    const int64_t cw = chunk();
    parallel_for(g.O, 1, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        A* acc = rows + o * taps * cw;  // (taps, cw)
        std::fill(acc, acc + taps * cw, A(0));
        for (int64_t c0 = 0; c0 < g.OW; c0 += cw) {
          const int64_t c1 = std::min(g.OW, c0 + cw);
          for (int64_t n = 0; n < g.N; ++n) {
            for (int64_t oh = 0; oh < g.OH; ++oh) {
              const T* dyrow = dy + ((n * g.O + o) * g.OH + oh) * g.OW;
              for (int64_t c = 0; c < g.C; ++c) {
                for (int64_t kh = 0; kh < g.KH; ++kh) {
                  const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
                  if (ih < 0 || ih >= g.H) continue;
                  const T* xrow = x + ((n * g.C + c) * g.H + ih) * g.W;
                  for (int64_t kw = 0; kw < g.KW; ++kw) {
                    A* r = acc + ((c * g.KH + kh) * g.KW + kw) * cw - c0;
                    const int64_t lo = std::max(c0, g.ow_lo[static_cast<size_t>(kw)]);
                    const int64_t hi = std::min(c1, g.ow_hi[static_cast<size_t>(kw)]);
                    const int64_t off = kw * g.dw - g.pw;
                    if (g.sw == 1) {
                      const T* xs = xrow + off;
                      for (int64_t ow = lo; ow < hi; ++ow) r[ow] += load(dyrow, ow) * load(xs, ow);
                    } else {
                      for (int64_t ow = lo; ow < hi; ++ow)
                        r[ow] += load(dyrow, ow) * load(xrow, ow * g.sw + off);
                    }
                  }
                }
              }
            }
          }
        }
        for (int64_t t = 0; t < taps; ++t) {
          A s = A(0);
          for (int64_t i = 0; i < cw; ++i) s += acc[t * cw + i];
          store(dw, o * taps + t, s);
        }
      }
    });
  }

  static const plx_tensor& checked_x(const NodeInfo& node) {
    PLX_REQUIRE(node.input(1).ndim == 4 && node.output(0).ndim == 4,
                "%s: x and dw must be 4-D", node.op());
    return node.input(1);
  }

  int64_t chunk() const { return std::min(g_.OW, kChunk); }

  DirectGeom g_;
  bool wide_ = false;
  int64_t Hp_ = 0, Wp_ = 0, workers_ = 1;
};

}  // namespace

void register_conv_direct(KernelRegistry& r) {
  // After im2col's: without the tuner the GEMMs stay the default.
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<DirectConv2dKernel>(r, "conv2d", "direct", f);
  add_float_kernels<DirectConv2dBackwardWeightKernel>(r, "conv2d_backward_weight", "direct", f);
}

}  // namespace plexus::cpu
