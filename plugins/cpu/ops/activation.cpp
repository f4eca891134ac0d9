// CPU kernels: activations and their backward ops (see docs/ops.md).
#include <cmath>
#include <string>

#include "common.hpp"

namespace plexus::cpu {

namespace {

// y = f(x), elementwise. F is a functor on the accumulation type.
template <class T, class F>
class UnaryKernel final : public Kernel {
 public:
  explicit UnaryKernel(const NodeInfo& node) : f_(node) {}
  void compute(const KernelCall& c) override {
    const T* x = sdk::data<T>(c.in(0));  // (any shape)
    T* y = sdk::data<T>(c.out(0));       // (same shape)
    parallel_for(numel(c.in(0)), kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) store(y, i, f_(load(x, i)));
    });
  }

 private:
  F f_;
};

// dx = g(dy, saved), elementwise; saved is the forward's input or output.
template <class T, class G>
class BackwardKernel final : public Kernel {
 public:
  explicit BackwardKernel(const NodeInfo& node) : g_(node) {}
  void compute(const KernelCall& c) override {
    const T* dy = sdk::data<T>(c.in(0));
    const T* s = sdk::data<T>(c.in(1));
    T* dx = sdk::data<T>(c.out(0));
    parallel_for(numel(c.in(0)), kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) store(dx, i, g_(load(dy, i), load(s, i)));
    });
  }

 private:
  G g_;
};

template <class A>
struct Relu {
  explicit Relu(const NodeInfo&) {}
  A operator()(A x) const { return x > A(0) ? x : A(0); }
};
template <class A>
struct ReluBackward {  // saved: y
  explicit ReluBackward(const NodeInfo&) {}
  A operator()(A dy, A y) const { return y > A(0) ? dy : A(0); }
};

template <class A>
struct Sigmoid {
  explicit Sigmoid(const NodeInfo&) {}
  A operator()(A x) const { return A(1) / (A(1) + std::exp(-x)); }
};
template <class A>
struct SigmoidBackward {  // saved: y
  explicit SigmoidBackward(const NodeInfo&) {}
  A operator()(A dy, A y) const { return dy * y * (A(1) - y); }
};

template <class A>
struct Tanh {
  explicit Tanh(const NodeInfo&) {}
  A operator()(A x) const { return std::tanh(x); }
};
template <class A>
struct TanhBackward {  // saved: y
  explicit TanhBackward(const NodeInfo&) {}
  A operator()(A dy, A y) const { return dy * (A(1) - y * y); }
};

bool gelu_tanh(const NodeInfo& node) {
  const std::string a = node.attr_string("approximate");
  PLX_REQUIRE(a == "none" || a == "tanh", "gelu: approximate must be \"none\" or \"tanh\", got \"%s\"",
              a.c_str());
  return a == "tanh";
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;
constexpr double kGeluCubic = 0.044715;

template <class A>
struct Gelu {
  explicit Gelu(const NodeInfo& node) : tanh_(gelu_tanh(node)) {}
  A operator()(A x) const {
    if (tanh_) {
      const A u = A(kSqrt2OverPi) * (x + A(kGeluCubic) * x * x * x);
      return A(0.5) * x * (A(1) + std::tanh(u));
    }
    return A(0.5) * x * (A(1) + std::erf(x * A(kInvSqrt2)));
  }
  bool tanh_;
};
template <class A>
struct GeluBackward {  // saved: x
  explicit GeluBackward(const NodeInfo& node) : tanh_(gelu_tanh(node)) {}
  A operator()(A dy, A x) const {
    if (tanh_) {
      const A u = A(kSqrt2OverPi) * (x + A(kGeluCubic) * x * x * x);
      const A t = std::tanh(u);
      const A du = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluCubic) * x * x);
      return dy * (A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * du);
    }
    const A cdf = A(0.5) * (A(1) + std::erf(x * A(kInvSqrt2)));
    const A pdf = A(kInvSqrt2Pi) * std::exp(A(-0.5) * x * x);
    return dy * (cdf + x * pdf);
  }
  bool tanh_;
};

template <template <class> class F>
struct Unary {
  template <class T>
  using kernel = UnaryKernel<T, F<acc_t<T>>>;
};
template <template <class> class G>
struct Backward {
  template <class T>
  using kernel = BackwardKernel<T, G<acc_t<T>>>;
};

}  // namespace

void register_activation(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_INPLACE | PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<Unary<Relu>::kernel>(r, "relu", "omp", f);
  add_float_kernels<Backward<ReluBackward>::kernel>(r, "relu_backward", "omp", f);
  add_float_kernels<Unary<Gelu>::kernel>(r, "gelu", "omp", f);
  add_float_kernels<Backward<GeluBackward>::kernel>(r, "gelu_backward", "omp", f);
  add_float_kernels<Unary<Sigmoid>::kernel>(r, "sigmoid", "omp", f);
  add_float_kernels<Backward<SigmoidBackward>::kernel>(r, "sigmoid_backward", "omp", f);
  add_float_kernels<Unary<Tanh>::kernel>(r, "tanh", "omp", f);
  add_float_kernels<Backward<TanhBackward>::kernel>(r, "tanh_backward", "omp", f);
}

}  // namespace plexus::cpu
