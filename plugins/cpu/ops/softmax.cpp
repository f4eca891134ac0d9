// CPU kernels: softmax, log_softmax, softmax cross-entropy and their backward ops (see
// docs/ops.md).
//
// A tensor normalised along `axis` is seen as (outer, len, inner): outer = product of the dims
// before the axis, len = the axis, inner = product of the dims after it. Each of the outer*inner
// lanes is independent. With inner == 1 a lane is a contiguous row; otherwise lanes are taken in
// tiles of up to kTile adjacent inner positions, so that every pass over the axis reads kTile
// contiguous elements per step instead of striding through memory one lane at a time.
#include <climits>
#include <cmath>
#include <limits>
#include <string>

#include "common.hpp"

namespace plexus::cpu {

namespace {

constexpr int64_t kTile = 32;

struct AxisPlan {
  int64_t outer = 1, len = 1, inner = 1;
  int64_t tiles() const { return (inner + kTile - 1) / kTile; }
  // Work items: rows when inner == 1, else (outer, tile) pairs.
  int64_t items() const { return inner == 1 ? outer : outer * tiles(); }
  // Items per thread worth the overhead: about kElementwiseGrain elements each.
  int64_t grain() const {
    const int64_t per_item = len * (inner == 1 ? 1 : std::min(inner, kTile));
    return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(per_item, 1));
  }
};

AxisPlan plan_axis(const plx_tensor& x, int64_t axis) {
  AxisPlan p;
  if (x.ndim == 0) return p;  // a scalar is one lane of length 1
  const int64_t a = axis < 0 ? axis + x.ndim : axis;
  PLX_REQUIRE(a >= 0 && a < x.ndim, "axis %lld out of range for %d dimensions",
              static_cast<long long>(axis), x.ndim);
  for (int32_t i = 0; i < a; ++i) p.outer *= x.shape[i];
  p.len = x.shape[a];
  for (int32_t i = static_cast<int32_t>(a) + 1; i < x.ndim; ++i) p.inner *= x.shape[i];
  return p;
}

// Calls f(offset, stride, width) for each work item in [b, e): the lanes' first element, the
// distance between consecutive elements along the axis, and the number of adjacent lanes.
template <class F>
void for_lanes(const AxisPlan& p, int64_t b, int64_t e, F&& f) {
  for (int64_t it = b; it < e; ++it) {
    if (p.inner == 1) {
      f(it * p.len, int64_t{1}, int64_t{1});
    } else {
      const int64_t o = it / p.tiles(), j0 = (it % p.tiles()) * kTile;
      f(o * p.len * p.inner + j0, p.inner, std::min(kTile, p.inner - j0));
    }
  }
}

// ---- softmax and log_softmax ----

// y = softmax(x) or log_softmax(x) along the axis. The maximum is subtracted before exp so that
// exp never overflows; log_softmax is x - max - log(sum exp(x - max)).
template <class T, bool kLog>
class SoftmaxKernel final : public Kernel {
 public:
  explicit SoftmaxKernel(const NodeInfo& node)
      : plan_(plan_axis(node.input(0), node.attr_int("axis"))) {}

  void compute(const KernelCall& c) override {
    const T* x = sdk::data<T>(c.in(0));  // (outer, len, inner)
    T* y = sdk::data<T>(c.out(0));       // (outer, len, inner)
    const AxisPlan& p = plan_;
    parallel_for(p.items(), p.grain(), [&](int64_t b, int64_t e) {
      for_lanes(p, b, e, [&](int64_t off, int64_t stride, int64_t width) {
        if (stride == 1)
          lanes<true>(x + off, y + off, p.len, 1, 1);  // a contiguous row: constant strides
        else
          lanes<false>(x + off, y + off, p.len, stride, width);
      });
    });
  }

 private:
  using A = acc_t<T>;

  // `width` adjacent lanes, element k of lane j at src[k * stride + j].
  template <bool kRow>
  static void lanes(const T* src, T* dst, int64_t len, int64_t stride_, int64_t width_) {
    const int64_t stride = kRow ? 1 : stride_, width = kRow ? 1 : width_;
    A mx[kTile], sum[kTile];  // per lane
    for (int64_t j = 0; j < width; ++j) {
      mx[j] = -std::numeric_limits<A>::infinity();
      sum[j] = A(0);
    }
    for (int64_t k = 0; k < len; ++k)
      for (int64_t j = 0; j < width; ++j) mx[j] = std::max(mx[j], load(src, k * stride + j));
    // All -inf: the max is -inf and x - max is nan, the same nan PyTorch gives.
    for (int64_t k = 0; k < len; ++k)
      for (int64_t j = 0; j < width; ++j) sum[j] += std::exp(load(src, k * stride + j) - mx[j]);
    if constexpr (kLog) {
      for (int64_t j = 0; j < width; ++j) sum[j] = mx[j] + std::log(sum[j]);  // log-sum-exp
      for (int64_t k = 0; k < len; ++k)
        for (int64_t j = 0; j < width; ++j)
          store(dst, k * stride + j, load(src, k * stride + j) - sum[j]);
    } else {
      for (int64_t j = 0; j < width; ++j) sum[j] = A(1) / sum[j];
      // exp is computed again rather than kept in dst: for 16-bit dst that would round twice.
      for (int64_t k = 0; k < len; ++k)
        for (int64_t j = 0; j < width; ++j)
          store(dst, k * stride + j, std::exp(load(src, k * stride + j) - mx[j]) * sum[j]);
    }
  }

  AxisPlan plan_;
};

// softmax_backward: dx = y (dy - sum(dy y)); log_softmax_backward: dx = dy - exp(y) sum(dy).
template <class T, bool kLog>
class SoftmaxBackwardKernel final : public Kernel {
 public:
  explicit SoftmaxBackwardKernel(const NodeInfo& node)
      : plan_(plan_axis(node.input(0), node.attr_int("axis"))) {}

  void compute(const KernelCall& c) override {
    const T* dy = sdk::data<T>(c.in(0));  // (outer, len, inner)
    const T* y = sdk::data<T>(c.in(1));   // (outer, len, inner)
    T* dx = sdk::data<T>(c.out(0));       // (outer, len, inner)
    const AxisPlan& p = plan_;
    parallel_for(p.items(), p.grain(), [&](int64_t b, int64_t e) {
      for_lanes(p, b, e, [&](int64_t off, int64_t stride, int64_t width) {
        if (stride == 1)
          lanes<true>(dy + off, y + off, dx + off, p.len, 1, 1);
        else
          lanes<false>(dy + off, y + off, dx + off, p.len, stride, width);
      });
    });
  }

 private:
  using A = acc_t<T>;

  template <bool kRow>
  static void lanes(const T* dy, const T* y, T* dx, int64_t len, int64_t stride_, int64_t width_) {
    const int64_t stride = kRow ? 1 : stride_, width = kRow ? 1 : width_;
    A dot[kTile];  // per lane: sum(dy y), or sum(dy) for log_softmax
    for (int64_t j = 0; j < width; ++j) dot[j] = A(0);
    for (int64_t k = 0; k < len; ++k) {
      for (int64_t j = 0; j < width; ++j) {
        const int64_t i = k * stride + j;
        dot[j] += kLog ? load(dy, i) : load(dy, i) * load(y, i);
      }
    }
    for (int64_t k = 0; k < len; ++k) {
      for (int64_t j = 0; j < width; ++j) {
        const int64_t i = k * stride + j;
        const A g = load(dy, i), v = load(y, i);
        store(dx, i, kLog ? g - std::exp(v) * dot[j] : v * (g - dot[j]));
      }
    }
  }

  AxisPlan plan_;
};

template <class T>
using Softmax = SoftmaxKernel<T, false>;
template <class T>
using LogSoftmax = SoftmaxKernel<T, true>;
template <class T>
using SoftmaxBackward = SoftmaxBackwardKernel<T, false>;
template <class T>
using LogSoftmaxBackward = SoftmaxBackwardKernel<T, true>;

// ---- softmax cross-entropy ----

using Reduction = sdk::LossReduction;
using sdk::CrossEntropyParams;

template <class L>
int64_t label_at(const void* labels, int64_t i) {
  return static_cast<int64_t>(static_cast<const L*>(labels)[i]);
}

// Checks every label before any parallel work (an exception must not leave an OpenMP region);
// returns the number of rows not ignored.
template <class L>
int64_t check_labels(const char* op, const CrossEntropyParams& p, const void* labels) {
  int64_t counted = 0;
  for (int64_t i = 0; i < p.n; ++i) {
    const int64_t l = label_at<L>(labels, i);
    if (l == p.ignore_index) continue;
    if (l < 0 || l >= p.c)
      throw sdk::InvalidArgument(
          sdk::format("%s: row %lld has label %lld, outside [0, %lld) and not ignore_index (%lld)",
                      op, static_cast<long long>(i), static_cast<long long>(l),
                      static_cast<long long>(p.c), static_cast<long long>(p.ignore_index)));
    ++counted;
  }
  return counted;
}

// loss_i = -((1 - eps) lp[i, y_i] + eps/C sum_c lp[i, c]) on rows whose label is not ignored,
// lp = log_softmax(logits); the mean divides by the number of such rows (0 if there are none).
template <class T>
class CrossEntropyKernel final : public Kernel {
 public:
  explicit CrossEntropyKernel(const NodeInfo& node) : op_(node.op()), p_(node, node.input(0)) {}

  // Per-row losses in f64, summed serially in row order so that the total is deterministic.
  uint64_t workspace_bytes() const override {
    return p_.reduction == Reduction::kNone ? 0 : static_cast<uint64_t>(p_.n) * sizeof(double);
  }

  void compute(const KernelCall& c) override {
    if (c.in(1).dtype == PLX_I32)
      run<int32_t>(c);
    else
      run<int64_t>(c);
  }

 private:
  using A = acc_t<T>;

  template <class L>
  void run(const KernelCall& c) {
    const T* x = sdk::data<T>(c.in(0));                    // (N, C)
    const L* labels = sdk::data<L>(c.in(1));               // (N)
    T* loss = sdk::data<T>(c.out(0));                      // () or (N)
    T* lp = sdk::data<T>(c.out(1));                        // (N, C)
    double* row_loss = static_cast<double*>(c.workspace);  // (N), unless reduction none
    const CrossEntropyParams& p = p_;
    const int64_t counted = check_labels<L>(op_.c_str(), p, labels);
    const A on = A(1 - p.smoothing), off = A(p.smoothing / static_cast<double>(p.c));
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(p.c, 1));
    parallel_for(p.n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T* xr = x + i * p.c;  // (C)
        T* lr = lp + i * p.c;       // (C)
        A mx = -std::numeric_limits<A>::infinity();
        for (int64_t k = 0; k < p.c; ++k) mx = std::max(mx, load(xr, k));
        A s = 0;
        for (int64_t k = 0; k < p.c; ++k) s += std::exp(load(xr, k) - mx);
        const A lse = mx + std::log(s);
        A lp_sum = 0;  // sum_c lp[i, c], from the unrounded values
        for (int64_t k = 0; k < p.c; ++k) {
          const A v = load(xr, k) - lse;
          lp_sum += v;
          store(lr, k, v);
        }
        const int64_t l = static_cast<int64_t>(labels[i]);
        A li = 0;
        if (l != p.ignore_index) {
          li = -(on * (load(xr, l) - lse));
          if (p.smoothing != 0) li -= off * lp_sum;
        }
        if (p.reduction == Reduction::kNone)
          store(loss, i, li);
        else
          row_loss[i] = static_cast<double>(li);
      }
    });
    if (p.reduction == Reduction::kNone) return;
    double total = 0;
    for (int64_t i = 0; i < p.n; ++i) total += row_loss[i];
    if (p.reduction == Reduction::kMean) total = counted > 0 ? total / counted : 0.0;
    store(loss, 0, static_cast<A>(total));
  }

  std::string op_;
  CrossEntropyParams p_;
};

// dlogits[i, c] = g_i (exp(lp[i, c]) - target[i, c]), target = (1 - eps) one-hot + eps/C, where
// g_i is dloss[i] (none), dloss (sum) or dloss / rows counted (mean); 0 on ignored rows.
template <class T>
class CrossEntropyBackwardKernel final : public Kernel {
 public:
  explicit CrossEntropyBackwardKernel(const NodeInfo& node)
      : op_(node.op()), p_(node, node.input(1)) {}

  void compute(const KernelCall& c) override {
    if (c.in(2).dtype == PLX_I32)
      run<int32_t>(c);
    else
      run<int64_t>(c);
  }

 private:
  using A = acc_t<T>;

  template <class L>
  void run(const KernelCall& c) {
    const T* dloss = sdk::data<T>(c.in(0));   // () or (N)
    const T* lp = sdk::data<T>(c.in(1));      // (N, C)
    const L* labels = sdk::data<L>(c.in(2));  // (N)
    T* dx = sdk::data<T>(c.out(0));           // (N, C)
    const CrossEntropyParams& p = p_;
    const int64_t counted = check_labels<L>(op_.c_str(), p, labels);
    const A on = A(1 - p.smoothing), off = A(p.smoothing / static_cast<double>(p.c));
    A scale = 0;  // of every row, unless reduction none
    if (p.reduction == Reduction::kSum) scale = load(dloss, 0);
    if (p.reduction == Reduction::kMean && counted > 0) scale = load(dloss, 0) / A(counted);
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(p.c, 1));
    parallel_for(p.n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T* lr = lp + i * p.c;  // (C)
        T* dr = dx + i * p.c;        // (C)
        const int64_t l = static_cast<int64_t>(labels[i]);
        if (l == p.ignore_index) {
          for (int64_t k = 0; k < p.c; ++k) store(dr, k, A(0));
          continue;
        }
        const A g = p.reduction == Reduction::kNone ? load(dloss, i) : scale;
        for (int64_t k = 0; k < p.c; ++k)
          store(dr, k, g * (std::exp(load(lr, k)) - off - (k == l ? on : A(0))));
      }
    });
  }

  std::string op_;
  CrossEntropyParams p_;
};

// ---- the classifier head, fused ----

// linear -> [cast to f32] -> softmax_cross_entropy [-> argmax] [-> softmax_cross_entropy_backward]
// as one kernel (the group sdk::linear_cross_entropy_slots parses). The logits come from the
// very GEMM call LinearKernel makes (ops/gemm.cpp: the bias preloaded, beta = 1), into the
// workspace unless they are needed outside; then one pass per row computes log-softmax, the
// loss, the argmax and dlogits with the same arithmetic, in the same order, as the kernels
// above and the argmax kernel, so fused and unfused agree to the bit. log_probs are rounded to
// the loss's dtype before the backward's exp, as the unfused backward reads them from memory.
// TL: the linear's dtype; TC: the cross-entropy's (f32 after a mixed-precision cast, else TL).
template <class TL, class TC>
class LinearCrossEntropyKernel final : public Kernel {
 public:
  LinearCrossEntropyKernel(const NodeInfo& ce, const sdk::LinearCrossEntropySlots& s)
      : s_(s), p_(ce, ce.input(0)) {
    PLX_DECLINE_UNLESS(s.n <= INT_MAX && s.c <= INT_MAX && s.k <= INT_MAX,
                       "linear: a dimension exceeds the BLAS int range");
    PLX_DECLINE_UNLESS(s.c > 0, "no classes (argmax over an empty axis is the node's error)");
    uint64_t off = 0;
    if (p_.reduction != Reduction::kNone) off += static_cast<uint64_t>(s.n) * sizeof(double);
    if (s.logits < 0) {
      logits_at_ = off;
      off += static_cast<uint64_t>(s.n * s.c) * sizeof(TL);
    }
    off = (off + 63) / 64 * 64;
    scratch_at_ = off;
    workspace_ = off + gemm_scratch_floats<TL>(s.n, s.c, s.k) * sizeof(float);
  }

  uint64_t workspace_bytes() const override { return workspace_; }

  void compute(const KernelCall& c) override {
    if (s_.label_dtype == PLX_I32)
      run<int32_t>(c);
    else
      run<int64_t>(c);
  }

 private:
  using A = acc_t<TC>;

  template <class T>
  static T* out(const KernelCall& c, int32_t slot) {
    return slot >= 0 ? sdk::data<T>(c.out(slot)) : nullptr;
  }

  template <class L>
  void run(const KernelCall& c) {
    const sdk::LinearCrossEntropySlots& s = s_;
    const CrossEntropyParams& p = p_;
    char* ws = static_cast<char*>(c.workspace);
    const TL* x = sdk::data<TL>(c.in(s.x));  // (N, K)
    const TL* w = sdk::data<TL>(c.in(s.w));  // (C, K)
    const L* labels = sdk::data<L>(c.in(s.labels));                              // (N)
    TL* z = s.logits >= 0 ? out<TL>(c, s.logits) : reinterpret_cast<TL*>(ws + logits_at_);  // (N, C)
    TC* zc = out<TC>(c, s.cast_logits);            // (N, C), the cast's output, if needed
    TC* loss = out<TC>(c, s.loss);                 // () or (N)
    TC* lp = out<TC>(c, s.log_probs);              // (N, C), if needed
    int64_t* pred = out<int64_t>(c, s.pred);       // (N)
    TC* dx = out<TC>(c, s.dlogits);                // (N, C)
    double* row_loss = p.reduction == Reduction::kNone ? nullptr : reinterpret_cast<double*>(ws);
    float* scratch = reinterpret_cast<float*>(ws + scratch_at_);

    // The linear, exactly as LinearKernel computes it.
    if (s.bias >= 0) {
      const TL* bias = sdk::data<TL>(c.in(s.bias));  // (C)
      const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / s.c);
      parallel_for(s.n, grain, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) std::memcpy(z + r * s.c, bias, sizeof(TL) * s.c);
      });
    }
    gemm<TL>(false, true, s.n, s.c, s.k, acc_t<TL>(1), x, s.k, w, s.k,
             s.bias >= 0 ? acc_t<TL>(1) : acc_t<TL>(0), z, s.c, scratch);

    const int64_t counted = check_labels<L>("softmax_cross_entropy", p, labels);
    const A on = A(1 - p.smoothing), off = A(p.smoothing / static_cast<double>(p.c));
    A scale = 0;  // the backward's, of every row, unless reduction none
    const TC* dloss = s.dloss >= 0 ? sdk::data<TC>(c.in(s.dloss)) : nullptr;  // () or (N)
    if (dx && p.reduction == Reduction::kSum) scale = load(dloss, 0);
    if (dx && p.reduction == Reduction::kMean && counted > 0) scale = load(dloss, 0) / A(counted);
    const int64_t C = p.c;
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / C);
    parallel_for(p.n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const TL* zr = z + i * C;  // (C)
        // The logits as the cross-entropy reads them: the linear's rounded output, widened
        // exactly by the cast (misc.cpp) when there is one.
        auto logit = [zr](int64_t k) { return static_cast<A>(load(zr, k)); };
        if (zc)
          for (int64_t k = 0; k < C; ++k) store(zc + i * C, k, logit(k));
        // softmax_cross_entropy (CrossEntropyKernel).
        A mx = -std::numeric_limits<A>::infinity();
        for (int64_t k = 0; k < C; ++k) mx = std::max(mx, logit(k));
        A sum = 0;
        for (int64_t k = 0; k < C; ++k) sum += std::exp(logit(k) - mx);
        const A lse = mx + std::log(sum);
        A lp_sum = 0;
        for (int64_t k = 0; k < C; ++k) {
          const A v = logit(k) - lse;
          lp_sum += v;
          if (lp) store(lp + i * C, k, v);
        }
        const int64_t l = static_cast<int64_t>(labels[i]);
        A li = 0;
        if (l != p.ignore_index) {
          li = -(on * (logit(l) - lse));
          if (p.smoothing != 0) li -= off * lp_sum;
        }
        if (p.reduction == Reduction::kNone) {
          if (loss) store(loss, i, li);
        } else {
          row_loss[i] = static_cast<double>(li);
        }
        // argmax: the first maximum, the first NaN if there is one (ops/reduce.cpp).
        if (pred) {
          int64_t best = 0;
          A bv = logit(0);
          for (int64_t k = 1; k < C && bv == bv; ++k) {
            const A v = logit(k);
            if (v > bv || v != v) {
              bv = v;
              best = k;
            }
          }
          pred[i] = best;
        }
        // softmax_cross_entropy_backward (CrossEntropyBackwardKernel), from log_probs rounded
        // to TC as it would read them.
        if (!dx) continue;
        TC* dr = dx + i * C;  // (C)
        if (l == p.ignore_index) {
          for (int64_t k = 0; k < C; ++k) store(dr, k, A(0));
          continue;
        }
        const A g = p.reduction == Reduction::kNone ? load(dloss, i) : scale;
        for (int64_t k = 0; k < C; ++k) {
          const A lpk = convert<A>(convert<TC>(logit(k) - lse));
          store(dr, k, g * (std::exp(lpk) - off - (k == l ? on : A(0))));
        }
      }
    });
    if (p.reduction == Reduction::kNone || !loss) return;
    double total = 0;
    for (int64_t i = 0; i < p.n; ++i) total += row_loss[i];
    if (p.reduction == Reduction::kMean) total = counted > 0 ? total / counted : 0.0;
    store(loss, 0, static_cast<A>(total));
  }

  sdk::LinearCrossEntropySlots s_;
  CrossEntropyParams p_;
  uint64_t logits_at_ = 0, scratch_at_ = 0, workspace_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> make_linear_cross_entropy(const sdk::GraphView& g, const sdk::Boundary& b,
                                                  plx_dtype& dtype) {
  const sdk::LinearCrossEntropySlots s = sdk::linear_cross_entropy_slots(g, b);
  dtype = s.dtype;
  // The linear's dx and db are BLAS's and the sum's (the CPU asks for no such group).
  PLX_DECLINE_UNLESS(s.dx_matmul < 0 && s.db_sum < 0 && s.dcast < 0,
                     "linear+softmax_cross_entropy: the linear's backward runs on its own");
  const sdk::OwnedNodeInfo info(g, s.ce);
  const NodeInfo ce(&info.get());
  const bool cast = s.cast >= 0;
  switch (s.dtype) {
    case PLX_F32: return std::make_unique<LinearCrossEntropyKernel<float, float>>(ce, s);
    case PLX_F64: return std::make_unique<LinearCrossEntropyKernel<double, double>>(ce, s);
    case PLX_F16:
      if (cast) return std::make_unique<LinearCrossEntropyKernel<half, float>>(ce, s);
      return std::make_unique<LinearCrossEntropyKernel<half, half>>(ce, s);
    case PLX_BF16:
      if (cast) return std::make_unique<LinearCrossEntropyKernel<bfloat16, float>>(ce, s);
      return std::make_unique<LinearCrossEntropyKernel<bfloat16, bfloat16>>(ce, s);
    default: break;
  }
  throw sdk::Unsupported(sdk::format("linear+softmax_cross_entropy: no %s kernel", dtype_name(dtype)));
}

void register_softmax(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<Softmax>(r, "softmax", "omp", f | PLX_KERNEL_INPLACE);
  add_float_kernels<LogSoftmax>(r, "log_softmax", "omp", f | PLX_KERNEL_INPLACE);
  add_float_kernels<SoftmaxBackward>(r, "softmax_backward", "omp", f | PLX_KERNEL_INPLACE);
  add_float_kernels<LogSoftmaxBackward>(r, "log_softmax_backward", "omp", f | PLX_KERNEL_INPLACE);
  add_float_kernels<CrossEntropyKernel>(r, "softmax_cross_entropy", "omp", f);
  add_float_kernels<CrossEntropyBackwardKernel>(r, "softmax_cross_entropy_backward", "omp", f);
}

}  // namespace plexus::cpu
