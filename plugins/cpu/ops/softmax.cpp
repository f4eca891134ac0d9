// CPU kernels: softmax, log_softmax, softmax cross-entropy and their backward ops (see
// docs/ops.md).
//
// A tensor normalised along `axis` is seen as (outer, len, inner): outer = product of the dims
// before the axis, len = the axis, inner = product of the dims after it. Each of the outer*inner
// lanes is independent. With inner == 1 a lane is a contiguous row; otherwise lanes are taken in
// tiles of up to kTile adjacent inner positions, so that every pass over the axis reads kTile
// contiguous elements per step instead of striding through memory one lane at a time.
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

}  // namespace

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
