// What the emulated CUDA plugin has instead of the parts built on cuBLASLt and cuDNN (ops/gemm.cpp,
// ops/conv.cpp), which it does not build: plain emulated kernels for matmul, linear and the three
// convolutions (one thread per output, sums in f32), registered as the library kernels. They let whole training steps, the fusions
// that contain these ops and graph capture run on the emulator; they are not what the GPU runs,
// and the op suite does not count them (tests/cuda/test_cuda_ops.cpp skips their ops there).
#include <vector>

#include "common.hpp"
#include "device.cuh"
#include "ops/gemm_problem.hpp"
#include "ops/igemm_conv.hpp"
#include "plexus/sdk/fusion.hpp"
#include "plexus/sdk/op_params.hpp"

namespace plexus::cuda {

namespace {

// ---- matmul and linear ----

// Row-major strides of `t`'s leading (batch) dims against y's batch dims, right-aligned, 0 where t
// broadcasts: the offset of each of y's batch entries in t.
std::vector<int64_t> batch_offsets(const plx_tensor& t, const plx_tensor& y, int64_t matrix) {
  const int32_t yb = y.ndim - 2, tb = t.ndim - 2;
  int64_t batch = 1;
  for (int32_t i = 0; i < yb; ++i) batch *= y.shape[i];
  std::vector<int64_t> off(static_cast<size_t>(batch), 0);
  for (int64_t e = 0; e < batch; ++e) {
    int64_t rest = e, o = 0, stride = matrix;
    for (int32_t i = yb - 1; i >= 0; --i) {
      const int64_t idx = rest % y.shape[i];
      rest /= y.shape[i];
      const int32_t ti = i - (yb - tb);
      if (ti >= 0) {
        if (t.shape[ti] != 1) o += idx * stride;
        stride *= t.shape[ti];
      }
    }
    off[static_cast<size_t>(e)] = o;
  }
  return off;
}

template <class T>
__global__ void gemm_standin_kernel(const T* a, const T* b, const T* bias, T* y,
                                    const int64_t* a_off, const int64_t* b_off, int64_t batch,
                                    int64_t M, int64_t N, int64_t K, bool ta, bool tb, float alpha) {
  PLX_GRID_STRIDE(i, batch * M * N) {
    const int64_t e = i / (M * N), m = (i / N) % M, n = i % N;
    const T* A = a + a_off[e];
    const T* B = b + b_off[e];
    float s = 0;
    for (int64_t k = 0; k < K; ++k)
      s += to_accum(A[ta ? k * M + m : m * K + k]) * to_accum(B[tb ? n * K + k : k * N + n]);
    s *= alpha;
    if (bias) s += to_accum(bias[n]);
    y[i] = from_accum<T>(s);
  }
}

template <class T>
class MatmulStandin final : public Kernel {
 public:
  explicit MatmulStandin(const NodeInfo& node) : device_(node.device()) {
    const plx_tensor &a = node.input(0), &b = node.input(1), &y = node.output(0);
    PLX_REQUIRE(a.ndim >= 2 && b.ndim >= 2 && y.ndim >= 2, "matmul: operands need 2 dimensions");
    ta_ = node.attr_int("trans_a") != 0;
    tb_ = node.attr_int("trans_b") != 0;
    M_ = y.shape[y.ndim - 2];
    N_ = y.shape[y.ndim - 1];
    K_ = ta_ ? a.shape[a.ndim - 2] : a.shape[a.ndim - 1];
    alpha_ = static_cast<float>(node.attr_float("alpha"));
    a_off_ = batch_offsets(a, y, M_ * K_);
    b_off_ = batch_offsets(b, y, K_ * N_);
  }
  void compute(const KernelCall& c) override {
    const int64_t total = static_cast<int64_t>(a_off_.size()) * M_ * N_;
    if (total == 0) return;
    use_device(device_);
    gemm_standin_kernel<T><<<grid_for(total), kBlock, 0, native(c.stream)>>>(
        ptr<T>(c.in(0)), ptr<T>(c.in(1)), nullptr, ptr<T>(c.out(0)), a_off_.data(), b_off_.data(),
        static_cast<int64_t>(a_off_.size()), M_, N_, K_, ta_, tb_, alpha_);
    PLX_CUDA_LAUNCH_CHECK();
  }

 private:
  int32_t device_;
  bool ta_, tb_;
  int64_t M_, N_, K_;
  float alpha_;
  std::vector<int64_t> a_off_, b_off_;  // host memory is the emulator's device memory
};

template <class T>
class LinearStandin final : public Kernel {
 public:
  explicit LinearStandin(const NodeInfo& node)
      : device_(node.device()), p_(linear_problem(node, dtype_v<T>)) {}
  void compute(const KernelCall& c) override {
    if (p_.M * p_.N == 0) return;
    use_device(device_);
    // y (M, N) = x (M, K) w (N, K)^T: w read as B with trans_b.
    gemm_standin_kernel<T><<<grid_for(p_.M * p_.N), kBlock, 0, native(c.stream)>>>(
        ptr<T>(c.in(0)), ptr<T>(c.in(1)), p_.bias ? ptr<T>(c.in(2)) : nullptr, ptr<T>(c.out(0)),
        zero_, zero_, int64_t{1}, p_.M, p_.N, p_.K, false, true, 1.0f);
    PLX_CUDA_LAUNCH_CHECK();
  }

 private:
  int32_t device_;
  GemmProblem p_;
  int64_t zero_[1] = {0};
};

// ---- convolutions (NCHW) ----

struct ConvGeom {
  int64_t N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups;
};
ConvGeom geom(const sdk::Conv2dParams& p) {
  return {p.N, p.C, p.H, p.W, p.O, p.KH, p.KW, p.OH, p.OW, p.sh, p.sw, p.ph, p.pw, p.dh, p.dw, p.groups};
}

template <class T>
__global__ void conv_fwd_standin(const T* x, const T* w, const T* bias, T* y, ConvGeom g) {
  const int64_t Cg = g.C / g.groups, Og = g.O / g.groups;
  PLX_GRID_STRIDE(i, g.N * g.O * g.OH * g.OW) {
    const int64_t ow = i % g.OW, oh = (i / g.OW) % g.OH, o = (i / (g.OW * g.OH)) % g.O,
                  n = i / (g.OW * g.OH * g.O), c0 = (o / Og) * Cg;
    float s = 0;
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t iw = ow * g.sw - g.pw + kw * g.dw;
          if (iw < 0 || iw >= g.W) continue;
          s += to_accum(x[((n * g.C + c0 + c) * g.H + ih) * g.W + iw]) *
               to_accum(w[((o * Cg + c) * g.KH + kh) * g.KW + kw]);
        }
      }
    if (bias) s += to_accum(bias[o]);
    y[i] = from_accum<T>(s);
  }
}

template <class T>
__global__ void conv_bwd_data_standin(const T* dy, const T* w, T* dx, ConvGeom g) {
  const int64_t Cg = g.C / g.groups, Og = g.O / g.groups;
  PLX_GRID_STRIDE(i, g.N * g.C * g.H * g.W) {
    const int64_t iw = i % g.W, ih = (i / g.W) % g.H, ci = (i / (g.W * g.H)) % g.C,
                  n = i / (g.W * g.H * g.C), grp = ci / Cg, c = ci % Cg;
    float s = 0;
    for (int64_t o = grp * Og; o < (grp + 1) * Og; ++o)
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t th = ih + g.ph - kh * g.dh;
        if (th < 0 || th % g.sh != 0 || th / g.sh >= g.OH) continue;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t tw = iw + g.pw - kw * g.dw;
          if (tw < 0 || tw % g.sw != 0 || tw / g.sw >= g.OW) continue;
          s += to_accum(dy[((n * g.O + o) * g.OH + th / g.sh) * g.OW + tw / g.sw]) *
               to_accum(w[((o * Cg + c) * g.KH + kh) * g.KW + kw]);
        }
      }
    dx[i] = from_accum<T>(s);
  }
}

template <class T>
__global__ void conv_bwd_weight_standin(const T* dy, const T* x, T* dw, ConvGeom g) {
  const int64_t Cg = g.C / g.groups, Og = g.O / g.groups;
  PLX_GRID_STRIDE(i, g.O * Cg * g.KH * g.KW) {
    const int64_t kw = i % g.KW, kh = (i / g.KW) % g.KH, c = (i / (g.KW * g.KH)) % Cg,
                  o = i / (g.KW * g.KH * Cg), ci = (o / Og) * Cg + c;
    float s = 0;
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t iw = ow * g.sw - g.pw + kw * g.dw;
          if (iw < 0 || iw >= g.W) continue;
          s += to_accum(dy[((n * g.O + o) * g.OH + oh) * g.OW + ow]) *
               to_accum(x[((n * g.C + ci) * g.H + ih) * g.W + iw]);
        }
      }
    dw[i] = from_accum<T>(s);
  }
}

enum class Dir { Fwd, BwdData, BwdWeight };

template <class T, Dir D>
class ConvStandin final : public Kernel {
 public:
  explicit ConvStandin(const NodeInfo& node) : device_(node.device()), g_(make(node)) {}
  void compute(const KernelCall& c) override {
    use_device(device_);
    const cudaStream_t s = native(c.stream);
    if constexpr (D == Dir::Fwd) {
      const int64_t n = g_.N * g_.O * g_.OH * g_.OW;
      if (n == 0) return;
      conv_fwd_standin<T><<<grid_for(n), kBlock, 0, s>>>(
          ptr<T>(c.in(0)), ptr<T>(c.in(1)), c.has_in(2) ? ptr<T>(c.in(2)) : nullptr,
          ptr<T>(c.out(0)), g_);
    } else if constexpr (D == Dir::BwdData) {
      const int64_t n = g_.N * g_.C * g_.H * g_.W;
      if (n == 0) return;
      conv_bwd_data_standin<T><<<grid_for(n), kBlock, 0, s>>>(ptr<T>(c.in(0)), ptr<T>(c.in(1)),
                                                             ptr<T>(c.out(0)), g_);
    } else {
      const int64_t n = g_.O * (g_.C / g_.groups) * g_.KH * g_.KW;
      if (n == 0) return;
      conv_bwd_weight_standin<T><<<grid_for(n), kBlock, 0, s>>>(ptr<T>(c.in(0)), ptr<T>(c.in(1)),
                                                               ptr<T>(c.out(0)), g_);
    }
    PLX_CUDA_LAUNCH_CHECK();
  }

 private:
  static ConvGeom make(const NodeInfo& node) {
    if constexpr (D == Dir::Fwd) {
      return geom(sdk::Conv2dParams(node.input(0).shape, node.input(1).shape, node));
    } else if constexpr (D == Dir::BwdData) {
      const auto xs = node.attr_ints("input_shape");
      PLX_REQUIRE(xs.size() == 4, "conv2d_backward_data: input_shape needs 4 sizes");
      return geom(sdk::Conv2dParams(xs.data(), node.input(1).shape, node));
    } else {
      const auto ws = node.attr_ints("weight_shape");
      PLX_REQUIRE(ws.size() == 4, "conv2d_backward_weight: weight_shape needs 4 sizes");
      return geom(sdk::Conv2dParams(node.input(1).shape, ws.data(), node));
    }
  }
  int32_t device_;
  ConvGeom g_;
};

template <class T>
void add_dtype(KernelRegistry& r) {
  const plx_dtype d = dtype_v<T>;
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE | PLX_KERNEL_LIBRARY;
  r.add<MatmulStandin<T>>("matmul", d, "emulator", f);
  r.add<LinearStandin<T>>("linear", d, "emulator", f);
  r.add<ConvStandin<T, Dir::Fwd>>("conv2d", d, "emulator", f, PLX_LAYOUT_NCHW);
  r.add<ConvStandin<T, Dir::BwdData>>("conv2d_backward_data", d, "emulator", f, PLX_LAYOUT_NCHW);
  r.add<ConvStandin<T, Dir::BwdWeight>>("conv2d_backward_weight", d, "emulator", f, PLX_LAYOUT_NCHW);
}

}  // namespace

void register_gemm(KernelRegistry& r) {
  add_dtype<float>(r);
  add_dtype<f16>(r);
  add_dtype<bf16>(r);
}
// The plugin's own implicit-GEMM convolutions (ops/igemm_conv.cu, emulated) after the
// stand-ins, as the plugin registers them after cuDNN's.
void register_conv(KernelRegistry& r) { register_igemm_conv(r); }

// cuBLASLt's RELU_BIAS epilogue: here the linear stand-in and the plugin's ReLU in place, as
// the chain the plugin builds for other layer + activation pairs.
std::unique_ptr<Kernel> make_linear_relu(CudaBackend& backend, const sdk::GraphView& g,
                                         const sdk::Boundary& b, uint32_t& flags) {
  auto chain = std::make_unique<sdk::EpilogueChain>(backend, g, b);
  flags = chain->flags();
  return chain;
}

}  // namespace plexus::cuda
