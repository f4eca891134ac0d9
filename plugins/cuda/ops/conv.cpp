// CUDA kernels: conv family (see docs/ops.md) on cuDNN 9's convolution API.
//
//   conv2d                  cudnnConvolutionForward         y  = conv(x, w) (+ b)
//   conv2d_backward_data    cudnnConvolutionBackwardData    dx = convᵀ(dy, w)
//   conv2d_backward_weight  cudnnConvolutionBackwardFilter  dw = Σ_n dy_n ⋆ x_n
//
// Layouts: each 4-D tensor is NCHW contiguous or channels-last (NHWC in memory, the same logical
// (N, C, H, W) shape); the kernels take strided inputs (PLX_KERNEL_STRIDED) and describe each
// tensor to cuDNN in the layout its strides have. Any other strides are declined. The filter is
// (O, C/groups, KH, KW) or channels-last (O, KH, KW, C/groups).
//
// Algorithms are chosen once per node, at creation: measured (cudnnFind*AlgorithmEx on scratch
// buffers allocated for the purpose and freed again) when the plugin's `benchmark` option is on,
// else cuDNN's heuristic. Measured choices are kept for the process and in the file named by
// `algo_cache` (conv_algo_cache.hpp), so a shape is measured once per machine. Only algorithms
// whose workspace fits `conv_workspace` are considered; the kernel reports the chosen one's.
//
// Determinism: every cuDNN forward algorithm is deterministic, and the forward only takes those
// cuDNN reports as such, so conv2d carries PLX_KERNEL_DETERMINISTIC. Some backward algorithms
// accumulate with atomics (BWD_DATA_ALGO_0, BWD_FILTER_ALGO_0 and _3); a deterministic one is
// preferred when it measures within 5% of the fastest, but which one wins depends on the shape
// and the GPU, so the backward kernels do not claim determinism.
//
// Math: f16 and bf16 run on Tensor Cores (f32 accumulation, CUDNN_TENSOR_OP_MATH); f32 runs in
// full f32 (CUDNN_FMA_MATH) unless the plugin's tf32 option was on when the kernel was created
// (CUDNN_DEFAULT_MATH, which lets Ampere and later use TF32). The compute type is always f32.
//
// The bias: where the chosen forward algorithm is IMPLICIT_PRECOMP_GEMM, the one cuDNN documents
// for cudnnConvolutionBiasActivationForward with the identity activation, one fused call adds it
// (y = conv(x, w) + b in f32, rounded once); otherwise the bias is written into y first and the
// convolution adds onto it (beta = 1): one rounding per element either way, as on the CPU.
// conv2d -> relu with a bias (make_cudnn_conv_relu, for fusion) is one fused call with the RELU
// activation, whatever the algorithm. cuDNN may refuse the fused call for a data type or layout
// (its table lists no bfloat16), so each kernel tries it once on scratch buffers when it is
// created, and keeps the unfused way (or declines the pair) when cuDNN says no.
#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "ops/conv_algo_cache.hpp"
#include "ops/cudnn_conv_common.hpp"
#include "ops/direct_conv.hpp"
#include "ops/gemm_bias.hpp"
#include "ops/igemm_conv.hpp"

namespace plexus::cuda {

namespace {

constexpr const char* kLog = "cuda.conv";
// A deterministic algorithm is taken over a faster non-deterministic one within this factor.
constexpr float kDeterministicSlack = 1.05f;

using dnn::Dir;
using dnn::HandleOnStream;
using dnn::layout_name;
using dnn::ScratchBuffer;
using dnn::ScratchStream;
using dnn::dnn_type;
using dnn::op_name;

// ---- cuDNN descriptor owners (destruction cannot fail usefully, so errors are dropped) ----

template <class H, cudnnStatus_t (*Create)(H*), cudnnStatus_t (*Destroy)(H)>
struct DnnDesc {
  H d = nullptr;
  DnnDesc() { PLX_CUDNN_CHECK(Create(&d)); }
  DnnDesc(const DnnDesc&) = delete;
  DnnDesc& operator=(const DnnDesc&) = delete;
  ~DnnDesc() { Destroy(d); }
};
using TensorDesc =
    DnnDesc<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc =
    DnnDesc<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ActivationDesc = DnnDesc<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor,
                               cudnnDestroyActivationDescriptor>;
using ConvDesc = DnnDesc<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                         cudnnDestroyConvolutionDescriptor>;

// ---- per-direction cuDNN entry points ----

struct Descs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
};
// The fused call's extra descriptors: the bias as (1, O, 1, 1) in y's data type, the activation.
struct FusedDescs {
  TensorDesc bias;
  ActivationDesc act;
};
// Device pointers for the three tensors of a call, by role.
struct Ptrs {
  void* x;
  void* w;
  void* y;
};

template <Dir D>
struct Api;

template <>
struct Api<Dir::Fwd> {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algo = cudnnConvolutionFwdAlgo_t;
  static constexpr const char* key = "fwd";
  static constexpr int kAlgoCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static bool deterministic(int) { return true; }
  static const char* name(int a) {
    static const char* n[] = {
        "implicit_gemm", "implicit_precomp_gemm", "gemm", "direct", "fft", "fft_tiling",
        "winograd",      "winograd_nonfused"};
    return a >= 0 && a < kAlgoCount ? n[a] : "?";
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Descs& d, int a, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.d, d.w.d, d.conv.d, d.y.d,
                                                   static_cast<Algo>(a), bytes);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const Descs& d, const Ptrs& p, int n, int* got,
                            Perf* perf, void* ws, size_t ws_bytes) {
    return cudnnFindConvolutionForwardAlgorithmEx(h, d.x.d, p.x, d.w.d, p.w, d.conv.d, d.y.d, p.y,
                                                  n, got, perf, ws, ws_bytes);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const Descs& d, int n, int* got, Perf* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.d, d.w.d, d.conv.d, d.y.d, n, got, perf);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const Descs& d, const Ptrs& p, int a, void* ws,
                           size_t ws_bytes, const float* alpha, const float* beta) {
    return cudnnConvolutionForward(h, alpha, d.x.d, p.x, d.w.d, p.w, d.conv.d, static_cast<Algo>(a),
                                   ws, ws_bytes, beta, d.y.d, p.y);
  }
};

template <>
struct Api<Dir::BwdData> {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  static constexpr const char* key = "bwd_data";
  static constexpr int kAlgoCount = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static bool deterministic(int a) { return a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_0; }
  static const char* name(int a) {
    static const char* n[] = {"algo_0",     "algo_1",   "fft",
                              "fft_tiling", "winograd", "winograd_nonfused"};
    return a >= 0 && a < kAlgoCount ? n[a] : "?";
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Descs& d, int a, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w.d, d.y.d, d.conv.d, d.x.d,
                                                        static_cast<Algo>(a), bytes);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const Descs& d, const Ptrs& p, int n, int* got,
                            Perf* perf, void* ws, size_t ws_bytes) {
    return cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w.d, p.w, d.y.d, p.y, d.conv.d, d.x.d,
                                                       p.x, n, got, perf, ws, ws_bytes);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const Descs& d, int n, int* got, Perf* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.d, d.y.d, d.conv.d, d.x.d, n, got,
                                                       perf);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const Descs& d, const Ptrs& p, int a, void* ws,
                           size_t ws_bytes, const float* alpha, const float* beta) {
    return cudnnConvolutionBackwardData(h, alpha, d.w.d, p.w, d.y.d, p.y, d.conv.d,
                                        static_cast<Algo>(a), ws, ws_bytes, beta, d.x.d, p.x);
  }
};

template <>
struct Api<Dir::BwdFilter> {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr const char* key = "bwd_filter";
  static constexpr int kAlgoCount = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static bool deterministic(int a) {
    return a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 && a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
  }
  static const char* name(int a) {
    static const char* n[] = {
        "algo_0", "algo_1", "fft", "algo_3", "winograd", "winograd_nonfused", "fft_tiling"};
    return a >= 0 && a < kAlgoCount ? n[a] : "?";
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Descs& d, int a, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.d, d.y.d, d.conv.d, d.w.d,
                                                          static_cast<Algo>(a), bytes);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const Descs& d, const Ptrs& p, int n, int* got,
                            Perf* perf, void* ws, size_t ws_bytes) {
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x.d, p.x, d.y.d, p.y, d.conv.d, d.w.d,
                                                         p.w, n, got, perf, ws, ws_bytes);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const Descs& d, int n, int* got, Perf* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.d, d.y.d, d.conv.d, d.w.d, n, got,
                                                         perf);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const Descs& d, const Ptrs& p, int a, void* ws,
                           size_t ws_bytes, const float* alpha, const float* beta) {
    return cudnnConvolutionBackwardFilter(h, alpha, d.x.d, p.x, d.y.d, p.y, d.conv.d,
                                          static_cast<Algo>(a), ws, ws_bytes, beta, d.w.d, p.w);
  }
};

// ---- the geometry ----

bool fits_int(int64_t v) {
  return v >= 0 && v <= INT_MAX;
}

// A choice usable with these descriptors: the math type set and the workspace asked for. False
// (math type restored) when cuDNN refuses the algorithm for them.
template <Dir D>
bool apply_choice(cudnnHandle_t h, Descs& d, const conv_cache::Choice& c, cudnnMathType_t asked,
                  uint64_t& workspace) {
  if (c.algo < 0 || c.algo >= Api<D>::kAlgoCount) return false;
  PLX_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, static_cast<cudnnMathType_t>(c.math)));
  size_t bytes = 0;
  if (Api<D>::workspace(h, d, c.algo, &bytes) != CUDNN_STATUS_SUCCESS) {
    PLX_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, asked));
    return false;
  }
  workspace = bytes;
  return true;
}

// The best of cuDNN's results: measured (the fastest, or a deterministic one within
// kDeterministicSlack of it) or from the heuristic (its first usable one, in its own order).
// Results with an error status or a workspace over the limit are skipped; `only_deterministic`
// skips the non-deterministic ones too.
template <class Perf>
std::optional<conv_cache::Choice> pick(const Perf* perf, int n, uint64_t limit, bool measured,
                                       bool only_deterministic) {
  int best = -1, best_det = -1;
  for (int i = 0; i < n; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > limit) continue;
    const bool det = p.determinism == CUDNN_DETERMINISTIC;
    if (only_deterministic && !det) continue;
    if (measured && p.time < 0) continue;  // not timed
    if (best < 0 || (measured && p.time < perf[best].time)) best = i;
    if (det && (best_det < 0 || (measured && p.time < perf[best_det].time))) best_det = i;
  }
  if (best < 0) return std::nullopt;
  int chosen = best;
  if (measured && best_det >= 0 && perf[best_det].time <= kDeterministicSlack * perf[best].time)
    chosen = best_det;
  conv_cache::Choice c;
  c.algo = static_cast<int32_t>(perf[chosen].algo);
  c.workspace = perf[chosen].memory;
  c.math = static_cast<int32_t>(perf[chosen].mathType);
  return c;
}

// conv2d (D = Fwd), conv2d_backward_data, conv2d_backward_weight.
template <Dir D>
class ConvKernel final : public Kernel {
  using A = Api<D>;

 public:
  // `relu` (forward only): the kernel of a fused conv2d -> relu, writing relu(conv(x, w) + b) in
  // one cuDNN call; declines where cuDNN does not take that call (or there is no bias).
  ConvKernel(const NodeInfo& node, CudaBackend& backend, bool relu = false)
      : device_(node.device()), relu_(relu) {
    const char* op = op_name(D);
    PLX_REQUIRE(D == Dir::Fwd || !relu, "%s: only the forward convolution takes a ReLU", op);
    const dnn::ConvProblem p(node, D);
    const sdk::Conv2dParams& g = p.g;
    const plx_tensor* all[3] = {p.x, p.w, p.y};
    dtype_ = p.dtype;
    elem_ = p.elem;
    const cudnnDataType_t dt = dnn_type(dtype_);
    out_elems_ = p.out_elems;
    N_ = p.N, O_ = p.O, OHW_ = p.OHW;
    x_nhwc_ = p.x_nhwc, w_nhwc_ = p.w_nhwc, y_nhwc_ = p.y_nhwc;
    has_bias_ = p.has_bias;

    PLX_DECLINE_UNLESS(!relu_ || has_bias_,
                       "conv2d+relu: cuDNN's fused call needs a bias; the pair runs as a chain");
    // Nothing to compute: an empty output, or an empty sum (y = bias or 0).
    if (out_elems_ == 0) return;
    x_elems_ = p.x_elems, w_elems_ = p.w_elems, y_elems_ = p.y_elems;
    trivial_ = p.trivial;
    PLX_DECLINE_UNLESS(!(relu_ && trivial_), "conv2d+relu: an empty sum; the pair runs as a chain");
    if (trivial_) return;

    // cuDNN's legacy API takes int sizes and indexes tensors with 32-bit offsets.
    for (const plx_tensor* t : all) {
      PLX_DECLINE_UNLESS(numel(*t) <= INT_MAX,
                         "%s: a tensor of %lld elements is beyond cuDNN's 32-bit indexing", op,
                         static_cast<long long>(numel(*t)));
    }
    PLX_DECLINE_UNLESS(fits_int(g.sh) && fits_int(g.sw) && fits_int(g.ph) && fits_int(g.pw) &&
                           fits_int(g.dh) && fits_int(g.dw) && fits_int(g.groups),
                       "%s: stride, padding, dilation or groups beyond cuDNN's int range", op);

    use_device(device_);
    ctx_ = &backend.context(device_);
    const CudaOptions& opt = backend.options();
    auto i32 = [](int64_t v) { return static_cast<int>(v); };
    d_ = std::make_unique<Descs>();
    PLX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_->x.d,
                                               x_nhwc_ ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, dt,
                                               i32(g.N), i32(g.C), i32(g.H), i32(g.W)));
    PLX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_->y.d,
                                               y_nhwc_ ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, dt,
                                               i32(g.N), i32(g.O), i32(g.OH), i32(g.OW)));
    PLX_CUDNN_CHECK(
        cudnnSetFilter4dDescriptor(d_->w.d, dt, w_nhwc_ ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                   i32(g.O), i32(g.C / g.groups), i32(g.KH), i32(g.KW)));
    PLX_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d_->conv.d, i32(g.ph), i32(g.pw), i32(g.sh),
                                                    i32(g.sw), i32(g.dh), i32(g.dw),
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    PLX_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d_->conv.d, i32(g.groups)));
    const cudnnMathType_t asked = dtype_ != PLX_F32 ? CUDNN_TENSOR_OP_MATH
                                  : opt.tf32        ? CUDNN_DEFAULT_MATH
                                                    : CUDNN_FMA_MATH;
    PLX_CUDNN_CHECK(cudnnSetConvolutionMathType(d_->conv.d, asked));
    {
      // cuDNN must agree on the output shape, or the descriptors above are wrong.
      int n = 0, c = 0, h = 0, wd = 0;
      PLX_CUDNN_CHECK(
          cudnnGetConvolution2dForwardOutputDim(d_->conv.d, d_->x.d, d_->w.d, &n, &c, &h, &wd));
      if (n != g.N || c != g.O || h != g.OH || wd != g.OW)
        throw sdk::Error(
            PLX_ERR_INTERNAL,
            sdk::format("%s: cuDNN computes output (%d, %d, %d, %d), expected (%lld, "
                        "%lld, %lld, %lld)",
                        op, n, c, h, wd, static_cast<long long>(g.N), static_cast<long long>(g.O),
                        static_cast<long long>(g.OH), static_cast<long long>(g.OW)));
    }

    const uint64_t limit = opt.conv_workspace;
    const bool only_det = D == Dir::Fwd;  // keeps PLX_KERNEL_DETERMINISTIC true for conv2d
    const char* how = "heuristic";
    bool chosen = false;
    // A choice holds when cuDNN takes it for these descriptors within the workspace limit.
    auto take = [&](const conv_cache::Choice& c) {
      if (c.workspace > limit || (only_det && !A::deterministic(c.algo))) return false;
      if (apply_choice<D>(ctx_->dnn, *d_, c, asked, workspace_) && workspace_ <= limit) {
        algo_ = c.algo;
        return true;
      }
      PLX_CUDNN_CHECK(cudnnSetConvolutionMathType(d_->conv.d, asked));
      return false;
    };
    if (opt.benchmark) {
      const std::string key =
          conv_cache::make_key(dnn::cache_key(p, A::key, static_cast<int32_t>(asked)));
      conv_cache::AlgoCache& cache =
          conv_cache::shared_cache(opt.algo_cache, dnn::cache_header(*ctx_));
      std::lock_guard<std::mutex> lock(ctx_->mu);
      if (const auto c = cache.find(key); c && take(*c)) {
        chosen = true, how = "cached";
      } else if (const auto m = measure(limit, only_det); m && take(*m)) {
        chosen = true, how = "measured";
        conv_cache::Choice stored = *m;
        stored.workspace = workspace_;
        cache.store(key, stored);
      }
    }
    if (!chosen) {
      std::lock_guard<std::mutex> lock(ctx_->mu);
      int count = 0;
      typename A::Perf perf[2 * A::kAlgoCount];
      PLX_CUDNN_CHECK(A::heuristic(ctx_->dnn, *d_, 2 * A::kAlgoCount, &count, perf));
      const auto h = pick(perf, count, limit, false, only_det);
      PLX_DECLINE_UNLESS(h && take(*h),
                         "%s: cuDNN has no algorithm for these shapes within conv_workspace = "
                         "%llu bytes",
                         op, static_cast<unsigned long long>(limit));
    }
    // The bias (and the ReLU) in the convolution's own call, where cuDNN documents that for the
    // algorithm and takes it for these descriptors.
    std::string why = "the algorithm is not implicit_precomp_gemm";
    if constexpr (D == Dir::Fwd) {
      if (!opt.conv_bias_activation)
        why = "the plugin's conv_bias_activation option is off";
      else if (has_bias_ && (relu_ || algo_ == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM))
        fused_ = try_fused(dt, why);
      PLX_DECLINE_UNLESS(!relu_ || fused_,
                         "conv2d+relu: cuDNN's fused convolution, bias and ReLU refused (%s); the "
                         "pair runs as a chain",
                         why.c_str());
    }
    PLX_LOG(PLX_LOG_DEBUG, kLog,
            "%s %s (x %s, w %s, y %s): %s algorithm %s (%d, %sdeterministic), workspace %llu "
            "bytes%s%s",
            op, plexus::dtype_name(dtype_), layout_name(x_nhwc_), layout_name(w_nhwc_),
            layout_name(y_nhwc_), how, A::name(algo_), algo_, A::deterministic(algo_) ? "" : "non-",
            static_cast<unsigned long long>(workspace_),
            !has_bias_ ? ""
            : fused_   ? (relu_ ? "; bias and relu fused" : "; bias fused")
                       : "; bias written first: ",
            has_bias_ && !fused_ ? why.c_str() : "");
  }

  uint64_t workspace_bytes() const override { return workspace_; }

  void compute(const KernelCall& c) override {
    if (out_elems_ == 0) return;
    use_device(device_);
    const cudaStream_t stream = native(c.stream);
    Ptrs p{};
    if constexpr (D == Dir::Fwd)
      p = {c.in(0).data, c.in(1).data, c.out(0).data};
    else if constexpr (D == Dir::BwdData)
      p = {c.out(0).data, c.in(1).data, c.in(0).data};
    else
      p = {c.in(1).data, c.out(0).data, c.in(0).data};
    void* out = D == Dir::Fwd ? p.y : (D == Dir::BwdData ? p.x : p.w);
    if (fused_) {
      const float one = 1.0f, zero = 0.0f;
      std::lock_guard<std::mutex> lock(ctx_->mu);
      PLX_CUDNN_CHECK(cudnnSetStream(ctx_->dnn, stream));
      PLX_CUDNN_CHECK(run_fused(ctx_->dnn, p, c.in(2).data, workspace_ ? c.workspace : nullptr,
                                workspace_ ? c.workspace_bytes : 0, &one, &zero));
      return;
    }
    const bool bias = D == Dir::Fwd && has_bias_;
    if (bias) {
      // y = b, then the convolution adds onto it (beta = 1): one rounding per element.
      const void* b = c.in(2).data;
      if (y_nhwc_)
        fill_bias(dtype_, p.y, b, N_ * OHW_, O_, 1, stream);
      else
        fill_bias(dtype_, p.y, b, N_, O_, OHW_, stream);
    }
    if (trivial_) {
      // An empty sum: y = b (filled above) or 0. Both layouts are dense, so the output is one
      // block of memory.
      if (!bias)
        PLX_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(out_elems_) * elem_, stream));
      return;
    }
    const float one = 1.0f, zero = 0.0f;
    std::lock_guard<std::mutex> lock(ctx_->mu);
    PLX_CUDNN_CHECK(cudnnSetStream(ctx_->dnn, stream));
    PLX_CUDNN_CHECK(A::run(ctx_->dnn, *d_, p, algo_, workspace_ ? c.workspace : nullptr,
                           workspace_ ? c.workspace_bytes : 0, &one, bias ? &one : &zero));
  }

 private:
  // y = act(alpha1 * conv(x, w) + alpha2 * z + bias) with z = y (alpha2 = 0: cuDNN's callers'
  // common use; y is not read then).
  cudnnStatus_t run_fused(cudnnHandle_t h, const Ptrs& p, const void* bias, void* ws,
                          size_t ws_bytes, const float* alpha1, const float* alpha2) {
    return cudnnConvolutionBiasActivationForward(h, alpha1, d_->x.d, p.x, d_->w.d, p.w, d_->conv.d,
                                                 static_cast<cudnnConvolutionFwdAlgo_t>(algo_), ws,
                                                 ws_bytes, alpha2, d_->y.d, p.y, f_->bias.d, bias,
                                                 f_->act.d, d_->y.d, p.y);
  }

  // Sets up the fused call (f_) and tries it once on scratch buffers: true where cuDNN runs it,
  // else false with cuDNN's reason (or the missing memory) in `why`.
  bool try_fused(cudnnDataType_t dt, std::string& why) {
    f_ = std::make_unique<FusedDescs>();
    PLX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(f_->bias.d, CUDNN_TENSOR_NCHW, dt, 1,
                                               static_cast<int>(O_), 1, 1));
    PLX_CUDNN_CHECK(cudnnSetActivationDescriptor(
        f_->act.d, relu_ ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
        CUDNN_NOT_PROPAGATE_NAN, 0.0));
    const size_t bytes[4] = {
        static_cast<size_t>(x_elems_) * elem_, static_cast<size_t>(w_elems_) * elem_,
        static_cast<size_t>(y_elems_) * elem_, static_cast<size_t>(O_) * elem_};
    ScratchBuffer buf[4], bws;  // x, w, y, bias
    bool ok = bws.allocate(workspace_);
    for (int i = 0; i < 4; ++i) ok = ok && buf[i].allocate(bytes[i]);
    if (!ok) {
      why = "no device memory to try it";
      f_.reset();
      return false;
    }
    ScratchStream stream;
    std::lock_guard<std::mutex> lock(ctx_->mu);
    const HandleOnStream bound(ctx_->dnn, stream.s);
    // Defined inputs (y is only written).
    for (int i : {0, 1, 3}) PLX_CUDA_CHECK(cudaMemsetAsync(buf[i].p, 0, bytes[i], stream.s));
    const float one = 1.0f, zero = 0.0f;
    const cudnnStatus_t st = run_fused(ctx_->dnn, Ptrs{buf[0].p, buf[1].p, buf[2].p}, buf[3].p,
                                       workspace_ ? bws.p : nullptr, workspace_, &one, &zero);
    PLX_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    if (st == CUDNN_STATUS_SUCCESS) return true;
    why = cudnnGetErrorString(st);
    f_.reset();
    return false;
  }

  // Times every algorithm whose workspace fits `limit` on scratch buffers of this node's shapes
  // and returns the best (nullopt when the memory for the measurement is not there: the caller
  // then asks the heuristic). Called with ctx_->mu held.
  std::optional<conv_cache::Choice> measure(uint64_t limit, bool only_det) {
    const cudnnHandle_t h = ctx_->dnn;
    // The largest workspace any algorithm wants, within the limit: no algorithm is left out for
    // want of scratch space it would be allowed at run time.
    size_t ws_bytes = 0;
    for (int a = 0; a < A::kAlgoCount; ++a) {
      size_t need = 0;
      if (A::workspace(h, *d_, a, &need) == CUDNN_STATUS_SUCCESS && need <= limit)
        ws_bytes = std::max(ws_bytes, need);
    }
    const size_t bytes[3] = {static_cast<size_t>(x_elems_) * elem_,
                             static_cast<size_t>(w_elems_) * elem_,
                             static_cast<size_t>(y_elems_) * elem_};
    ScratchBuffer bx, bw, by, bws;
    if (!bx.allocate(bytes[0]) || !bw.allocate(bytes[1]) || !by.allocate(bytes[2])) {
      PLX_LOG(PLX_LOG_INFO, kLog,
              "%s: no device memory to measure algorithms; using cuDNN's "
              "heuristic",
              op_name(D));
      return std::nullopt;
    }
    // Less workspace than asked for only leaves out the algorithms that need more.
    while (ws_bytes > 0 && !bws.allocate(ws_bytes)) ws_bytes /= 2;
    ScratchStream stream;
    const HandleOnStream bound(h, stream.s);
    // Defined inputs: garbage could hold NaNs or denormals and time differently.
    PLX_CUDA_CHECK(cudaMemsetAsync(bx.p, 0, bytes[0], stream.s));
    PLX_CUDA_CHECK(cudaMemsetAsync(bw.p, 0, bytes[1], stream.s));
    PLX_CUDA_CHECK(cudaMemsetAsync(by.p, 0, bytes[2], stream.s));
    typename A::Perf perf[2 * A::kAlgoCount];
    int count = 0;
    const cudnnStatus_t st =
        A::find(h, *d_, Ptrs{bx.p, bw.p, by.p}, static_cast<int>(sizeof perf / sizeof perf[0]),
                &count, perf, bws.p, ws_bytes);
    PLX_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    PLX_CUDNN_CHECK(st);
    return pick(perf, count, std::min<uint64_t>(limit, ws_bytes), true, only_det);
  }

  int32_t device_;
  DeviceContext* ctx_ = nullptr;
  plx_dtype dtype_ = PLX_F32;
  size_t elem_ = 4;
  bool has_bias_ = false;
  bool relu_ = false;   // a fused conv2d -> relu
  bool fused_ = false;  // the bias (and relu_) in cudnnConvolutionBiasActivationForward
  bool trivial_ = false;
  bool x_nhwc_ = false, w_nhwc_ = false, y_nhwc_ = false;
  int64_t out_elems_ = 0, N_ = 0, O_ = 0, OHW_ = 0;
  int64_t x_elems_ = 0, w_elems_ = 0, y_elems_ = 0;
  std::unique_ptr<Descs> d_;  // only for a node with something to compute
  std::unique_ptr<FusedDescs> f_;  // only where fused_
  int algo_ = 0;
  uint64_t workspace_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> make_cudnn_conv_relu(const NodeInfo& node, CudaBackend& backend) {
  return std::make_unique<ConvKernel<Dir::Fwd>>(node, backend, /*relu=*/true);
}

void register_conv(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_CAPTURABLE | PLX_KERNEL_STRIDED;
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16}) {
    // Either layout for each tensor (the descriptors follow the strides); in 16 bits cuDNN's
    // Tensor Core kernels work channels-last and transpose NCHW tensors around themselves, so
    // those prefer NHWC and the layout planner keeps their activations so.
    const plx_layout l = d == PLX_F32 ? PLX_LAYOUT_ANY : PLX_LAYOUT_NHWC;
    r.add<ConvKernel<Dir::Fwd>, CudaBackend>("conv2d", d, "cudnn",
                                             f | PLX_KERNEL_LIBRARY | PLX_KERNEL_DETERMINISTIC, l);
    r.add<ConvKernel<Dir::BwdData>, CudaBackend>("conv2d_backward_data", d, "cudnn",
                                                 f | PLX_KERNEL_LIBRARY, l);
    r.add<ConvKernel<Dir::BwdFilter>, CudaBackend>("conv2d_backward_weight", d, "cudnn",
                                                   f | PLX_KERNEL_LIBRARY, l);
  }
  // cuDNN's graph API next (ops/conv_graph.cpp): the legacy calls stay the default, the tuner
  // times both. Then the plugin's own Tensor Core kernels: the first accepting kernel stays
  // cuDNN's until the autotuner (or backend.kernels = "native") chooses otherwise.
  register_conv_graph(r);
  register_igemm_conv(r);
  // Then the direct kernels for few input taps (the first layer), which the igemm ones decline.
  register_direct_conv(r);
  // And the backward of small 3x3 convolutions image by image (ops/direct_small.cu).
  register_direct_backward(r);
}

}  // namespace plexus::cuda
