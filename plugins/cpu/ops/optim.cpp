// CPU kernels: optimizer updates (see docs/ops.md), in place, f32 and f64 params; and their
// multi-tensor forms, which update every parameter of a training step in one parallel loop (the
// backend's fusion of the step's sgd_update / adamw_update nodes, fusion.cpp).
//
// Scalar coefficients (lr, bias corrections) are formed in f64, as PyTorch forms them in Python
// floats; the elementwise update runs in the param's dtype. The single and multi-tensor kernels
// share the element loops below, so fusing changes no bit of the result.
#include <algorithm>
#include <cmath>

#include "common.hpp"

namespace plexus::cpu {

namespace {

// The value of a scalar tensor (shape () or (1), f32 or f64) on the host.
double scalar_value(const plx_tensor& t, const char* op, const char* name) {
  PLX_REQUIRE(numel(t) == 1, "%s: %s must hold one value, has %lld", op, name,
              static_cast<long long>(numel(t)));
  switch (t.dtype) {
    case PLX_F32:
      return *static_cast<const float*>(t.data);
    case PLX_F64:
      return *static_cast<const double*>(t.data);
    default:
      throw sdk::InvalidArgument(
          sdk::format("%s: %s must be f32 or f64, got %s", op, name, dtype_name(t.dtype)));
  }
}

// An update's optional `check` (input `k`): false when it is given and not finite, and the
// update is to be skipped (f16's gradient check, docs/training.md).
bool check_passes(const plx_tensor& check, const char* op) {
  return !sdk::present(check) || std::isfinite(scalar_value(check, op, "check"));
}

// ---- the element loops ----

struct SgdAttrs {
  double momentum, dampening, weight_decay;
  bool nesterov;
  explicit SgdAttrs(const NodeInfo& node)
      : momentum(node.attr_float("momentum")),
        dampening(node.attr_float("dampening")),
        weight_decay(node.attr_float("weight_decay")),
        nesterov(node.attr_int("nesterov") != 0) {
    // The schema checked this; a kernel built from a hand-made node must not read a null buffer.
    PLX_REQUIRE(momentum == 0 || node.has_input(2), "sgd_update: momentum needs momentum_buf");
  }
};

template <class T>
struct SgdTensor {
  T* param;
  const T* grad;
  T* buf;  // null when momentum is 0
};

// Elements [b, e) of one tensor.
template <class T>
void sgd_range(const SgdTensor<T>& t, const SgdAttrs& a, T lr, int64_t b, int64_t e) {
  const T mom = static_cast<T>(a.momentum);
  const T keep = static_cast<T>(1 - a.dampening);  // share of the gradient entering buf
  const T wd = static_cast<T>(a.weight_decay);
  for (int64_t i = b; i < e; ++i) {
    T g = t.grad[i];
    if (wd != T(0)) g += wd * t.param[i];
    if (t.buf) {
      const T m = mom * t.buf[i] + keep * g;
      t.buf[i] = m;
      g = a.nesterov ? g + mom * m : m;
    }
    t.param[i] -= lr * g;
  }
}

struct AdamwAttrs {
  double beta1, beta2, eps, weight_decay;
  explicit AdamwAttrs(const NodeInfo& node)
      : beta1(node.attr_float("beta1")),
        beta2(node.attr_float("beta2")),
        eps(node.attr_float("eps")),
        weight_decay(node.attr_float("weight_decay")) {}
};

// The step's coefficients, from lr and step (read on the host at compute time).
template <class T>
struct AdamwCoeffs {
  T decay, b1, b2, one_minus_b1, one_minus_b2, step_size, bc2_sqrt, eps;
  AdamwCoeffs(const AdamwAttrs& a, double lr, double step) {
    // Bias correction divides by 1 - beta^step, which is 0 at step 0.
    PLX_REQUIRE(step >= 1, "adamw_update: step must be >= 1 (the first update is step 1), got %g",
                step);
    decay = static_cast<T>(1 - lr * a.weight_decay);
    b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2);
    one_minus_b1 = static_cast<T>(1 - a.beta1), one_minus_b2 = static_cast<T>(1 - a.beta2);
    step_size = static_cast<T>(lr / (1 - std::pow(a.beta1, step)));
    bc2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(a.beta2, step)));
    eps = static_cast<T>(a.eps);
  }
};

template <class T>
struct AdamwTensor {
  T* param;
  const T* grad;
  T* m;  // first moment
  T* v;  // second moment
};

template <class T>
void adamw_range(const AdamwTensor<T>& t, const AdamwCoeffs<T>& c, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) {
    const T g = t.grad[i];
    const T mi = c.b1 * t.m[i] + c.one_minus_b1 * g;
    const T vi = c.b2 * t.v[i] + c.one_minus_b2 * g * g;
    t.m[i] = mi;
    t.v[i] = vi;
    t.param[i] = t.param[i] * c.decay - c.step_size * (mi / (std::sqrt(vi) / c.bc2_sqrt + c.eps));
  }
}

// Runs fn(tensor, begin, end) over the elements of several tensors in one parallel loop, each
// thread's share split at tensor boundaries. offsets: the prefix sums of their sizes.
template <class F>
void parallel_over(const std::vector<int64_t>& offsets, F&& fn) {
  parallel_for(offsets.back(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    size_t t = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), b) - offsets.begin()) - 1;
    while (b < e) {
      const int64_t stop = std::min(e, offsets[t + 1]);
      if (stop > b) fn(t, b - offsets[t], stop - offsets[t]);
      b = stop;
      ++t;
    }
  });
}

// ---- one tensor ----

// Inputs: param (mutated), grad, momentum_buf (optional, mutated), lr, check (optional).
template <class T>
class SgdUpdate final : public Kernel {
 public:
  explicit SgdUpdate(const NodeInfo& node) : a_(node) {}

  void compute(const KernelCall& c) override {
    if (!check_passes(c.in(4), "sgd_update")) return;
    const SgdTensor<T> t{sdk::data<T>(c.in(0)), sdk::data<T>(c.in(1)),
                         a_.momentum != 0 ? sdk::data<T>(c.in(2)) : nullptr};
    const T lr = static_cast<T>(scalar_value(c.in(3), "sgd_update", "lr"));
    parallel_for(numel(c.in(0)), kElementwiseGrain,
                 [&](int64_t b, int64_t e) { sgd_range(t, a_, lr, b, e); });
  }

 private:
  SgdAttrs a_;
};

// Inputs: param (mutated), grad, exp_avg (mutated), exp_avg_sq (mutated), lr, step, check
// (optional).
template <class T>
class AdamwUpdate final : public Kernel {
 public:
  explicit AdamwUpdate(const NodeInfo& node) : a_(node) {}

  void compute(const KernelCall& c) override {
    if (!check_passes(c.in(6), "adamw_update")) return;
    const AdamwTensor<T> t{sdk::data<T>(c.in(0)), sdk::data<T>(c.in(1)), sdk::data<T>(c.in(2)),
                           sdk::data<T>(c.in(3))};
    const AdamwCoeffs<T> k(a_, scalar_value(c.in(4), "adamw_update", "lr"),
                           scalar_value(c.in(5), "adamw_update", "step"));
    parallel_for(numel(c.in(0)), kElementwiseGrain,
                 [&](int64_t b, int64_t e) { adamw_range(t, k, b, e); });
  }

 private:
  AdamwAttrs a_;
};

// ---- every tensor of a step ----

// The prefix sums of the group's parameter sizes.
std::vector<int64_t> offsets_of(const sdk::GroupInputs& in) {
  std::vector<int64_t> off{0};
  for (int32_t n = 0; n < in.nodes(); ++n) off.push_back(off.back() + in.numel(n));
  return off;
}

template <class T>
class MultiSgd final : public Kernel {
 public:
  MultiSgd(const sdk::GraphView& g, const sdk::Boundary& b)
      : a_(NodeInfo(&sdk::OwnedNodeInfo(g, 0).get())), in_(g, b), offsets_(offsets_of(in_)) {
    for (int32_t n = 0; n < in_.nodes(); ++n)
      PLX_REQUIRE(a_.momentum == 0 || in_.has(n, 2), "sgd_update: momentum needs momentum_buf");
  }

  void compute(const KernelCall& c) override {
    if (!check_passes(in_.get(c, 0, 4), "sgd_update")) return;
    t_.clear();
    for (int32_t n = 0; n < in_.nodes(); ++n)
      t_.push_back({sdk::data<T>(in_.get(c, n, 0)), sdk::data<T>(in_.get(c, n, 1)),
                    a_.momentum != 0 ? sdk::data<T>(in_.get(c, n, 2)) : nullptr});
    const T lr = static_cast<T>(scalar_value(in_.get(c, 0, 3), "sgd_update", "lr"));
    parallel_over(offsets_, [&](size_t t, int64_t b, int64_t e) { sgd_range(t_[t], a_, lr, b, e); });
  }

 private:
  SgdAttrs a_;
  sdk::GroupInputs in_;
  std::vector<int64_t> offsets_;
  std::vector<SgdTensor<T>> t_;
};

template <class T>
class MultiAdamw final : public Kernel {
 public:
  MultiAdamw(const sdk::GraphView& g, const sdk::Boundary& b)
      : a_(NodeInfo(&sdk::OwnedNodeInfo(g, 0).get())), in_(g, b), offsets_(offsets_of(in_)) {}

  void compute(const KernelCall& c) override {
    if (!check_passes(in_.get(c, 0, 6), "adamw_update")) return;
    t_.clear();
    for (int32_t n = 0; n < in_.nodes(); ++n)
      t_.push_back({sdk::data<T>(in_.get(c, n, 0)), sdk::data<T>(in_.get(c, n, 1)),
                    sdk::data<T>(in_.get(c, n, 2)), sdk::data<T>(in_.get(c, n, 3))});
    const AdamwCoeffs<T> k(a_, scalar_value(in_.get(c, 0, 4), "adamw_update", "lr"),
                           scalar_value(in_.get(c, 0, 5), "adamw_update", "step"));
    parallel_over(offsets_, [&](size_t t, int64_t b, int64_t e) { adamw_range(t_[t], k, b, e); });
  }

 private:
  AdamwAttrs a_;
  sdk::GroupInputs in_;
  std::vector<int64_t> offsets_;
  std::vector<AdamwTensor<T>> t_;
};

// ---- f16's loss scale ----

// Inputs: check, scale, unscale, good, skipped (all mutated but check), step (optional,
// mutated), each one value of T; output report (5) of T. PyTorch's _amp_update_scale_, with the
// scale's inverse, the skipped steps and the optimizer's step count kept beside it.
template <class T>
class LossScaleUpdate final : public Kernel {
 public:
  explicit LossScaleUpdate(const NodeInfo& node)
      : interval_(static_cast<T>(node.attr_int("growth_interval"))),
        growth_(static_cast<T>(node.attr_float("growth_factor"))),
        backoff_(static_cast<T>(node.attr_float("backoff_factor"))) {}

  void compute(const KernelCall& c) override {
    const T check = *sdk::data<T>(c.in(0));
    T& scale = *sdk::data<T>(c.in(1));
    T& unscale = *sdk::data<T>(c.in(2));
    T& good = *sdk::data<T>(c.in(3));
    T& skipped = *sdk::data<T>(c.in(4));
    T* step = sdk::present(c.in(5)) ? sdk::data<T>(c.in(5)) : nullptr;
    T* report = sdk::data<T>(c.out(0));
    const T ran = scale;
    const bool finite = std::isfinite(check);
    if (!finite) {
      scale *= backoff_;
      good = 0;
      skipped += 1;
    } else {
      good += 1;
      if (step) *step += 1;
      if (good >= interval_) {
        const T grown = scale * growth_;
        if (std::isfinite(grown)) scale = grown;
        good = 0;
      }
    }
    unscale = T(1) / scale;
    const T r[5] = {ran, T(finite ? 0 : 1), scale, good, skipped};
    std::copy(r, r + 5, report);
  }

 private:
  T interval_, growth_, backoff_;
};

}  // namespace

std::unique_ptr<Kernel> make_multi_update(const sdk::GraphView& g, const sdk::Boundary& b,
                                          plx_dtype& dtype) {
  const bool sgd = g.is(0, "sgd_update");
  PLX_DECLINE_UNLESS(sgd || g.is(0, "adamw_update"), "not an optimizer update: %s", g.node(0).op);
  dtype = static_cast<plx_dtype>(g.value(g.node(0).inputs[0]).dtype);
  switch (dtype) {
    case PLX_F32:
      if (sgd) return std::make_unique<MultiSgd<float>>(g, b);
      return std::make_unique<MultiAdamw<float>>(g, b);
    case PLX_F64:
      if (sgd) return std::make_unique<MultiSgd<double>>(g, b);
      return std::make_unique<MultiAdamw<double>>(g, b);
    default:
      throw sdk::Unsupported(sdk::format("multi-tensor %s: no %s kernel", g.node(0).op,
                                         dtype_name(dtype)));
  }
}

void register_optim(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  r.add<SgdUpdate<float>>("sgd_update", PLX_F32, "omp", f);
  r.add<SgdUpdate<double>>("sgd_update", PLX_F64, "omp", f);
  r.add<AdamwUpdate<float>>("adamw_update", PLX_F32, "omp", f);
  r.add<AdamwUpdate<double>>("adamw_update", PLX_F64, "omp", f);
  r.add<LossScaleUpdate<float>>("loss_scale_update", PLX_F32, "scalar", f);
  r.add<LossScaleUpdate<double>>("loss_scale_update", PLX_F64, "scalar", f);
}

}  // namespace plexus::cpu
