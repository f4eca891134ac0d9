// An example plugin that adds an op and runs it on another plugin's backend, written against
// the Plexus SDK alone (docs/sdk.md, "Writing an op", is the guide; this file is its reference).
//
// Plugin "example" has no backend of its own. It adds (a plugin's ops are named after it)
//   example.swish           y = x * sigmoid(beta * x)
//                           x (..., F); beta (1), one for all, or (F), one per feature
//   example.swish_backward  (dy, x, beta, y) -> (dx, dbeta), the gradient op swish names
// with their schemas and shape inference, and gives the CPU plugin's backend "cpu" kernels for
// both (f32 for training, f64 for gradient checks against finite differences) as kernel
// extensions (ABI 1.2): the kernels loop on the host, which is right for "cpu" only, whose
// tensors are host memory and whose streams are synchronous. beta is meant to be learned: a
// model file uses the op with an `op` layer that makes beta a parameter (swish_mlp.toml).
//
//   cmake -S sdk/examples/custom_op -B build-ops -DCMAKE_PREFIX_PATH=<prefix>
//   cmake --build build-ops
//   PLEXUS_PLUGIN_PATH=build-ops <prefix>/bin/plexus info      # example.swish on cpu
//   PLEXUS_PLUGIN_PATH=build-ops <prefix>/bin/plexus train sdk/examples/custom_op/train.toml
#include <cmath>
#include <cstring>

#include "plexus/sdk.hpp"

namespace {

using namespace plexus;

template <class T>
T sigmoid(T z) {
  return T(1) / (T(1) + std::exp(-z));
}

// beta holds one value for every element, or one per feature (x's last dimension): element i
// of x, row-major, uses beta[i % numel(beta)].
int64_t beta_count(const sdk::NodeInfo& node, int32_t beta_input) {
  return sdk::numel(node.input(beta_input));
}

// y = x * sigmoid(beta * x)
template <class T>
class Swish final : public sdk::Kernel {
 public:
  explicit Swish(const sdk::NodeInfo& node) : nb_(beta_count(node, 1)) {}
  void compute(const sdk::KernelCall& c) override {
    const T* x = sdk::data<T>(c.in(0));     // (..., F)
    const T* beta = sdk::data<T>(c.in(1));  // (1) or (F)
    T* y = sdk::data<T>(c.out(0));          // (..., F)
    for (int64_t i = 0, n = sdk::numel(c.in(0)); i < n; ++i)
      y[i] = x[i] * sigmoid(beta[i % nb_] * x[i]);
  }

 private:
  int64_t nb_;
};

// (dy, x, beta, y) -> (dx, dbeta), with s = sigmoid(beta * x):
//   dx    = dy * (s + beta * x * s * (1 - s))
//   dbeta = sum over the elements sharing a beta of dy * x * x * s * (1 - s)
// dbeta is summed in double, in a workspace the kernel asks for when it is created (a kernel
// never allocates in compute()); the sums run in element order, so results repeat bit for bit.
template <class T>
class SwishBackward final : public sdk::Kernel {
 public:
  explicit SwishBackward(const sdk::NodeInfo& node) : nb_(beta_count(node, 2)) {}
  uint64_t workspace_bytes() const override { return static_cast<uint64_t>(nb_) * sizeof(double); }
  void compute(const sdk::KernelCall& c) override {
    const T* x = sdk::data<T>(c.in(1));             // (..., F)
    const T* beta = sdk::data<T>(c.in(2));          // (1) or (F)
    T* dx = sdk::data<T>(c.out(0));                 // (..., F)
    T* dbeta = sdk::data<T>(c.out(1));              // (1) or (F)
    auto* sum = static_cast<double*>(c.workspace);  // (nb)
    const int64_t n = sdk::numel(c.in(1));
    std::memset(sum, 0, static_cast<size_t>(nb_) * sizeof(double));
    if (!c.has_in(0)) {  // no gradient reached y: none flows back
      for (int64_t i = 0; i < n; ++i) dx[i] = T(0);
    } else {
      const T* dy = sdk::data<T>(c.in(0));  // (..., F)
      for (int64_t i = 0; i < n; ++i) {
        const T b = beta[i % nb_];
        const T s = sigmoid(b * x[i]);
        const T ds = s * (T(1) - s);
        dx[i] = dy[i] * (s + b * x[i] * ds);
        sum[i % nb_] += static_cast<double>(dy[i]) * static_cast<double>(x[i] * x[i] * ds);
      }
    }
    for (int64_t j = 0; j < nb_; ++j) dbeta[j] = static_cast<T>(sum[j]);
  }

 private:
  int64_t nb_;
};

// ---- schemas ----

constexpr uint32_t kFloats = (1u << PLX_F32) | (1u << PLX_F64);

// beta must have one element, or x's last dimension's.
void check_beta(const sdk::NodeInfo& node, int32_t x_input, int32_t beta_input) {
  const plx_tensor& x = node.input(x_input);
  const plx_tensor& beta = node.input(beta_input);
  PLX_REQUIRE(x.ndim >= 1, "%s: x must have at least one dimension, got %s", node.op(),
              sdk::shape_string(x).c_str());
  const int64_t nb = sdk::numel(beta), features = x.shape[x.ndim - 1];
  PLX_REQUIRE(nb == 1 || nb == features,
              "%s: beta %s must have 1 element or one per feature (x's last dimension, %lld); "
              "x is %s",
              node.op(), sdk::shape_string(beta).c_str(), static_cast<long long>(features),
              sdk::shape_string(x).c_str());
}

void infer_swish(const sdk::NodeInfo& node, plx_tensor* outputs) {
  check_beta(node, 0, 1);
  sdk::set_output(outputs[0], node.input(0));  // y: x's shape
}

void infer_swish_backward(const sdk::NodeInfo& node, plx_tensor* outputs) {
  check_beta(node, 1, 2);
  sdk::set_output(outputs[0], node.input(1));  // dx: x's shape
  sdk::set_output(outputs[1], node.input(2));  // dbeta: beta's shape
}

// beta's dtype bits are 0: the same as the type input's (x).
const plx_arg_def kSwishIn[] = {{"x", 0, kFloats}, {"beta", 0, 0}};
const plx_arg_def kSwishOut[] = {{"y", 0, 0}};
// The gradient op's inputs: the gradient of each output (absent where none flows), then the
// op's inputs, then its outputs. Its outputs: the gradient of each input.
const plx_arg_def kSwishBwdIn[] = {
    {"dy", PLX_ARG_OPTIONAL, 0}, {"x", 0, kFloats}, {"beta", 0, 0}, {"y", 0, 0}};
const plx_arg_def kSwishBwdOut[] = {{"dx", 0, 0}, {"dbeta", 0, 0}};

class ExamplePlugin final : public sdk::Plugin {
 public:
  explicit ExamplePlugin(const sdk::HostContext& host) {
    host.check_options({});
    add_op_schema(sdk::op_schema("example.swish",
                                 "y = x * sigmoid(beta * x); beta (1) or one per feature", kSwishIn,
                                 kSwishOut, sdk::infer<infer_swish>, "example.swish_backward"));
    plx_op_schema bwd =
        sdk::op_schema("example.swish_backward", "gradient of example.swish: dx, dbeta",
                       kSwishBwdIn, kSwishBwdOut, sdk::infer<infer_swish_backward>);
    bwd.type_input = 1;  // x selects the kernel: dy may be absent
    add_op_schema(bwd);

    // Kernels for the CPU plugin's backend. It tries its own kernels for an op first (it has
    // none for these), then the extensions.
    add_kernel_for<Swish<float>>("cpu", "example.swish", PLX_F32, "example-swish-loop",
                                 PLX_KERNEL_DETERMINISTIC);
    add_kernel_for<Swish<double>>("cpu", "example.swish", PLX_F64, "example-swish-loop",
                                  PLX_KERNEL_DETERMINISTIC);
    add_kernel_for<SwishBackward<float>>("cpu", "example.swish_backward", PLX_F32,
                                         "example-swish-backward-loop", PLX_KERNEL_DETERMINISTIC);
    add_kernel_for<SwishBackward<double>>("cpu", "example.swish_backward", PLX_F64,
                                          "example-swish-backward-loop", PLX_KERNEL_DETERMINISTIC);
  }
};

}  // namespace

PLEXUS_PLUGIN(ExamplePlugin, "example", "0.1.0",
              "example.swish (x * sigmoid(beta * x), beta learned) with kernels for the cpu")
