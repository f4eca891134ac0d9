// CPU kernels: optimizer updates (see docs/ops.md), in place, f32 and f64 params.
//
// Scalar coefficients (lr, bias corrections) are formed in f64, as PyTorch forms them in Python
// floats; the elementwise update runs in the param's dtype.
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

// Inputs: param (mutated), grad, momentum_buf (optional, mutated), lr.
template <class T>
class SgdUpdate final : public Kernel {
 public:
  explicit SgdUpdate(const NodeInfo& node)
      : momentum_(node.attr_float("momentum")),
        dampening_(node.attr_float("dampening")),
        weight_decay_(node.attr_float("weight_decay")),
        nesterov_(node.attr_int("nesterov") != 0) {
    // The schema checked this; a kernel built from a hand-made node must not read a null buffer.
    PLX_REQUIRE(momentum_ == 0 || node.has_input(2), "sgd_update: momentum needs momentum_buf");
  }

  void compute(const KernelCall& c) override {
    T* param = sdk::data<T>(c.in(0));                           // (any shape)
    const T* grad = sdk::data<T>(c.in(1));                      // (same)
    T* buf = momentum_ != 0 ? sdk::data<T>(c.in(2)) : nullptr;  // (same) or unused
    const T lr = static_cast<T>(scalar_value(c.in(3), "sgd_update", "lr"));
    const T mom = static_cast<T>(momentum_);
    const T keep = static_cast<T>(1 - dampening_);  // share of the gradient entering buf
    const T wd = static_cast<T>(weight_decay_);
    const bool nesterov = nesterov_;
    parallel_for(numel(c.in(0)), kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        T g = grad[i];
        if (wd != T(0)) g += wd * param[i];
        if (buf) {
          const T m = mom * buf[i] + keep * g;
          buf[i] = m;
          g = nesterov ? g + mom * m : m;
        }
        param[i] -= lr * g;
      }
    });
  }

 private:
  double momentum_, dampening_, weight_decay_;
  bool nesterov_;
};

// Inputs: param (mutated), grad, exp_avg (mutated), exp_avg_sq (mutated), lr, step.
template <class T>
class AdamwUpdate final : public Kernel {
 public:
  explicit AdamwUpdate(const NodeInfo& node)
      : beta1_(node.attr_float("beta1")),
        beta2_(node.attr_float("beta2")),
        eps_(node.attr_float("eps")),
        weight_decay_(node.attr_float("weight_decay")) {}

  void compute(const KernelCall& c) override {
    T* param = sdk::data<T>(c.in(0));       // (any shape)
    const T* grad = sdk::data<T>(c.in(1));  // (same)
    T* m = sdk::data<T>(c.in(2));           // (same) first moment
    T* v = sdk::data<T>(c.in(3));           // (same) second moment
    const double lr = scalar_value(c.in(4), "adamw_update", "lr");
    const double step = scalar_value(c.in(5), "adamw_update", "step");
    // Bias correction divides by 1 - beta^step, which is 0 at step 0.
    PLX_REQUIRE(step >= 1, "adamw_update: step must be >= 1 (the first update is step 1), got %g",
                step);
    const T decay = static_cast<T>(1 - lr * weight_decay_);
    const T b1 = static_cast<T>(beta1_), b2 = static_cast<T>(beta2_);
    const T one_minus_b1 = static_cast<T>(1 - beta1_), one_minus_b2 = static_cast<T>(1 - beta2_);
    const T step_size = static_cast<T>(lr / (1 - std::pow(beta1_, step)));
    const T bc2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(beta2_, step)));
    const T eps = static_cast<T>(eps_);
    parallel_for(numel(c.in(0)), kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T g = grad[i];
        const T mi = b1 * m[i] + one_minus_b1 * g;
        const T vi = b2 * v[i] + one_minus_b2 * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = param[i] * decay - step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
      }
    });
  }

 private:
  double beta1_, beta2_, eps_, weight_decay_;
};

}  // namespace

void register_optim(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  r.add<SgdUpdate<float>>("sgd_update", PLX_F32, "omp", f);
  r.add<SgdUpdate<double>>("sgd_update", PLX_F64, "omp", f);
  r.add<AdamwUpdate<float>>("adamw_update", PLX_F32, "omp", f);
  r.add<AdamwUpdate<double>>("adamw_update", PLX_F64, "omp", f);
}

}  // namespace plexus::cpu
