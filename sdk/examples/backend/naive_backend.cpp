// An example backend plugin written against the Plexus SDK alone (sdk/README.md).
//
// Backend "naive" runs on the host (sdk::HostBackend gives it memory, streams and events) and
// implements four ops its own way: plain loops, one thread, f32 only. Every other op is left to
// another backend: `plexus info` lists what it has, and `backend.fallback = "cpu"` lets a
// program use it for these ops and the CPU plugin for the rest.
//   relu    y = max(x, 0)                      (may write over x: PLX_KERNEL_INPLACE)
//   add     y = a + b, same shapes only        (declines broadcasting, saying why)
//   mul     y = a * b, same shapes only
//   linear  y = x W^T (+ b), x (N, K), W (M, K), b (M)
#include <cstring>

#include "plexus/sdk.hpp"

namespace {

using namespace plexus;

class Relu final : public sdk::Kernel {
 public:
  explicit Relu(const sdk::NodeInfo&) {}
  void compute(const sdk::KernelCall& c) override {
    const float* x = sdk::data<float>(c.in(0));
    float* y = sdk::data<float>(c.out(0));
    for (int64_t i = 0, n = sdk::numel(c.out(0)); i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
};

// a op b elementwise, for tensors of one shape.
template <bool Multiply>
class Elementwise final : public sdk::Kernel {
 public:
  explicit Elementwise(const sdk::NodeInfo& node) {
    PLX_DECLINE_UNLESS(sdk::shape_string(node.input(0)) == sdk::shape_string(node.input(1)),
                       "naive %s needs equal shapes, got %s and %s", Multiply ? "mul" : "add",
                       sdk::shape_string(node.input(0)).c_str(), sdk::shape_string(node.input(1)).c_str());
  }
  void compute(const sdk::KernelCall& c) override {
    const float* a = sdk::data<float>(c.in(0));
    const float* b = sdk::data<float>(c.in(1));
    float* y = sdk::data<float>(c.out(0));
    for (int64_t i = 0, n = sdk::numel(c.out(0)); i < n; ++i) y[i] = Multiply ? a[i] * b[i] : a[i] + b[i];
  }
};

class Linear final : public sdk::Kernel {
 public:
  explicit Linear(const sdk::NodeInfo& node) {
    PLX_DECLINE_UNLESS(node.input(0).ndim == 2, "naive linear takes x of 2 dimensions, got %s",
                       sdk::shape_string(node.input(0)).c_str());
  }
  void compute(const sdk::KernelCall& c) override {
    const plx_tensor& x = c.in(0);
    const int64_t n = x.shape[0], k = x.shape[1], m = c.in(1).shape[0];
    const float* xs = sdk::data<float>(x);
    const float* w = sdk::data<float>(c.in(1));
    const float* b = c.has_in(2) ? sdk::data<float>(c.in(2)) : nullptr;
    float* y = sdk::data<float>(c.out(0));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = b ? b[j] : 0.0;  // sums in double: slower, and as exact as it gets
        for (int64_t t = 0; t < k; ++t) s += static_cast<double>(xs[i * k + t]) * w[j * k + t];
        y[i * m + j] = static_cast<float>(s);
      }
  }
};

class NaiveBackend final : public sdk::HostBackend {
 public:
  NaiveBackend() : sdk::HostBackend("naive", "host, one thread (example backend)") {
    kernels().add<Relu>("relu", PLX_F32, "naive/relu", PLX_KERNEL_INPLACE);
    kernels().add<Elementwise<false>>("add", PLX_F32, "naive/add");
    kernels().add<Elementwise<true>>("mul", PLX_F32, "naive/mul");
    kernels().add<Linear>("linear", PLX_F32, "naive/linear");
  }
};

class NaivePlugin final : public sdk::Plugin {
 public:
  explicit NaivePlugin(const sdk::HostContext& host) {
    host.check_options({});
    add_backend(std::make_unique<NaiveBackend>());
  }
};

}  // namespace

PLEXUS_PLUGIN(NaivePlugin, "naive", "0.1.0", "example backend: four f32 ops in plain loops")
