// CUDA kernels: matrix products, matmul and linear (see docs/ops.md), on cuBLASLt.
//
// cuBLASLt is column-major and our tensors are row-major. A row-major (r, c) matrix is the
// column-major (c, r) matrix with the same memory, so y = op(a)·op(b) is computed as
//   yᵀ (N, M) = op(b)ᵀ (N, K) · op(a)ᵀ (K, M)
// with cuBLASLt's A = b, B = a and the transposes carried over unchanged. linear is the same with
// a = x (rows, in), b = w (out, in) transposed, and the bias (out) added by the BIAS epilogue
// (cuBLASLt's bias runs along the rows of its D, our features).
//
// Everything is decided at creation: the batch layout (one GEMM over the folded batch, a strided
// batch, or a loop of GEMMs for batch dims that broadcast partially), the compute type and the
// algorithm, from cuBLASLt's heuristic, whose workspace the kernel reports. compute() only
// enqueues the calls, so it is capturable.
//
// Alignment: cuBLASLt's fastest kernels need 16-byte aligned pointers, which the core's
// allocations have but a view into the middle of a tensor may not. Each GEMM therefore keeps two
// algorithms: one for pointers aligned to 16 bytes and one for any element-aligned pointer, and
// compute() picks by the pointers it gets. The second adds the bias as the CPU plugin does
// (preloaded into y, beta = 1), so it also covers a misaligned bias vector.
//
// Compute types: f32 in f32 (CUBLAS_COMPUTE_32F, or TF32 Tensor Cores when the plugin's tf32
// option was on when the kernel was created); f16 and bf16 on Tensor Cores with f32 accumulation
// and one rounding on store.
#include <algorithm>
#include <climits>
#include <memory>
#include <vector>

#include "common.hpp"
#include "ops/gemm_bias.hpp"
#include "ops/act_pair_slots.hpp"

namespace plexus::cuda {

namespace {

// Most workspace a GEMM may ask for; cuBLASLt's split-K algorithms need a few MiB at most.
constexpr uint64_t kGemmWorkspaceCap = uint64_t{32} << 20;
// Pointer alignment the fast algorithms are chosen for.
constexpr uintptr_t kFastAlign = 16;

cudaDataType_t lt_type(plx_dtype d) {
  switch (d) {
    case PLX_F32:
      return CUDA_R_32F;
    case PLX_F16:
      return CUDA_R_16F;
    case PLX_BF16:
      return CUDA_R_16BF;
    default:
      break;
  }
  throw sdk::Unsupported(
      sdk::format("cuBLASLt kernels take f32, f16 or bf16, not %s", plexus::dtype_name(d)));
}

bool aligned(const void* p, uintptr_t a) {
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}

// Owners of cuBLASLt descriptors. Destruction cannot fail usefully, so errors are dropped.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc() = default;
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  ~MatmulDesc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
  template <class V>
  void set(cublasLtMatmulDescAttributes_t attr, const V& v) {
    PLX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
  }
};
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  Layout() = default;
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  ~Layout() {
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
  // A column-major (rows, cols) matrix with leading dimension ld; `count` of them `stride`
  // elements apart when count > 1.
  void create(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int32_t count,
              int64_t stride) {
    PLX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, t, static_cast<uint64_t>(rows),
                                                static_cast<uint64_t>(cols), ld));
    if (count > 1) {
      PLX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                        &count, sizeof count));
      PLX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
};
struct Preference {
  cublasLtMatmulPreference_t d = nullptr;
  Preference() { PLX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d)); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  ~Preference() { cublasLtMatmulPreferenceDestroy(d); }
  template <class V>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
    PLX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d, attr, &v, sizeof v));
  }
};

// One GEMM as row-major tensors see it: y (batch, M, N) = alpha·op(a)·op(b) [+ bias (N)], with a
// (M, K) or (K, M) with ta, b (K, N) or (N, K) with tb, y contiguous.
struct GemmSpec {
  plx_dtype dtype = PLX_F32;
  bool tf32 = false;
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  int32_t batch = 1;                   // > 1: a strided batch
  int64_t stride_a = 0, stride_b = 0;  // elements between a batch's operands; 0: shared
  bool bias = false;
  bool relu = false;  // y = max(y, 0) after the bias, in the epilogue where the algorithm allows
  float alpha = 1.0f;
};

// The descriptors and algorithms of one GemmSpec, chosen once.
class GemmPlan {
 public:
  GemmPlan(cublasLtHandle_t lt, const GemmSpec& s, const char* op) : lt_(lt), s_(s) {
    const cudaDataType_t t = lt_type(s.dtype);
    const int32_t count = s.batch;
    // cuBLASLt's A = b: stored (N, K) column-major without tb, (K, N) with it.
    if (s.tb)
      a_.create(t, s.K, s.N, s.K, count, s.stride_b);
    else
      a_.create(t, s.N, s.K, s.N, count, s.stride_b);
    // cuBLASLt's B = a: stored (K, M) column-major without ta, (M, K) with it.
    if (s.ta)
      b_.create(t, s.M, s.K, s.M, count, s.stride_a);
    else
      b_.create(t, s.K, s.M, s.K, count, s.stride_a);
    // C = D = yᵀ (N, M).
    y_.create(t, s.N, s.M, s.N, count, s.M * s.N);

    const size_t elem = plexus::dtype_size(s.dtype);
    fast_ok_ = choose(fast_, true, static_cast<uint32_t>(kFastAlign));
    safe_ok_ = choose(safe_, false, static_cast<uint32_t>(elem));
    PLX_DECLINE_UNLESS(fast_ok_ || safe_ok_,
                       "%s: cuBLASLt has no algorithm for %s (M %lld, N %lld, K %lld, batch %d)",
                       op, plexus::dtype_name(s.dtype), static_cast<long long>(s.M),
                       static_cast<long long>(s.N), static_cast<long long>(s.K), s.batch);
  }

  uint64_t workspace_bytes() const {
    return std::max(fast_ok_ ? fast_.workspace : 0, safe_ok_ ? safe_.workspace : 0);
  }

  // Enqueues the GEMM(s) of one call. bias is null when the spec has none. Returns whether the
  // spec's ReLU was applied (only the fast algorithm has it in its epilogue; otherwise the caller
  // applies it).
  bool run(const void* a, const void* b, void* y, const void* bias, void* ws, uint64_t ws_bytes,
           cudaStream_t stream) {
    const bool fast = fast_ok_ && aligned(a, kFastAlign) && aligned(b, kFastAlign) &&
                      aligned(y, kFastAlign) && (!bias || aligned(bias, kFastAlign));
    if (!fast && !safe_ok_)
      throw sdk::BackendError(
          "cuBLASLt offered no algorithm for operands that are not 16-byte aligned");
    Algo& g = fast ? fast_ : safe_;
    float beta = 0.0f;
    if (bias && fast) {
      // The descriptor holds the bias pointer; cublasLtMatmul reads it when it is called, so
      // setting it per call is safe under capture.
      g.desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    } else if (bias) {
      fill_bias(s_.dtype, y, bias, s_.M, s_.N, 1, stream);
      beta = 1.0f;
    }
    const float alpha = s_.alpha;
    PLX_CUBLAS_CHECK(cublasLtMatmul(lt_, g.desc.d, &alpha, b, a_.d, a, b_.d, &beta, y, y_.d, y,
                                    y_.d, &g.algo, g.workspace ? ws : nullptr,
                                    g.workspace ? ws_bytes : 0, stream));
    return fast && s_.relu;
  }

 private:
  struct Algo {
    MatmulDesc desc;
    cublasLtMatmulAlgo_t algo{};
    uint64_t workspace = 0;
  };

  // Builds the matmul descriptor and asks the heuristic for its best algorithm for pointers
  // aligned to `align` bytes. The fast variant adds the bias (and applies the ReLU) in the
  // epilogue; the other is a plain GEMM (the bias, if any, is preloaded into y and added with
  // beta = 1, and the caller applies the ReLU).
  bool choose(Algo& g, bool fast, uint32_t align) {
    const bool f32 = s_.dtype == PLX_F32;
    const cublasComputeType_t compute =
        f32 && s_.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    PLX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&g.desc.d, compute, CUDA_R_32F));
    const int32_t op_a = s_.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is b
    const int32_t op_b = s_.ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is a
    g.desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    g.desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_b);
    if (fast && s_.relu && !s_.bias) {
      const uint32_t epilogue = CUBLASLT_EPILOGUE_RELU;
      g.desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    }
    if (s_.bias && fast) {
      const uint32_t epilogue = s_.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
      g.desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
      const int32_t bias_type = lt_type(s_.dtype);
      g.desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
      // The heuristic reads the bias pointer's alignment from its value without dereferencing
      // it: stand in an address aligned to exactly kFastAlign, the least compute() accepts.
      const void* stand_in = reinterpret_cast<const void*>(kFastAlign);
      g.desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, stand_in);
    }
    Preference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kGemmWorkspaceCap);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align);
    cublasLtMatmulHeuristicResult_t results[8];
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, g.desc.d, a_.d, b_.d, y_.d, y_.d,
                                                             pref.d, 8, results, &found);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
    PLX_CUBLAS_CHECK(st);
    // Ordered by estimated time: take the first that is usable.
    for (int i = 0; i < found; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      if (results[i].workspaceSize > kGemmWorkspaceCap) continue;
      g.algo = results[i].algo;
      g.workspace = results[i].workspaceSize;
      return true;
    }
    return false;
  }

  cublasLtHandle_t lt_;
  GemmSpec s_;
  Layout a_, b_, y_;
  Algo fast_, safe_;
  bool fast_ok_ = false, safe_ok_ = false;
};

// y (..., M, N) = alpha op(a) op(b), batch dims broadcast.
class MatmulKernel final : public Kernel {
 public:
  MatmulKernel(const NodeInfo& node, CudaBackend& backend) : device_(node.device()) {
    const plx_tensor& a = node.input(0);   // (..., M, K) or (..., K, M) with trans_a
    const plx_tensor& b = node.input(1);   // (..., K, N) or (..., N, K) with trans_b
    const plx_tensor& y = node.output(0);  // (batch..., M, N)
    dtype_ = static_cast<plx_dtype>(a.dtype);
    elem_ = plexus::dtype_size(dtype_);
    const bool ta = node.attr_int("trans_a") != 0;
    const bool tb = node.attr_int("trans_b") != 0;
    PLX_REQUIRE(a.ndim >= 2 && b.ndim >= 2 && y.ndim >= 2, "matmul: operands need 2 dimensions");
    M_ = y.shape[y.ndim - 2];
    N_ = y.shape[y.ndim - 1];
    K_ = ta ? a.shape[a.ndim - 2] : a.shape[a.ndim - 1];

    // Batch strides of a and b (in elements) per batch dim of y; 0 where broadcast.
    const int32_t nb = y.ndim - 2;
    batch_shape_.assign(y.shape, y.shape + nb);
    a_stride_.assign(static_cast<size_t>(nb), 0);
    b_stride_.assign(static_cast<size_t>(nb), 0);
    int64_t a_batch = 1, b_batch = 1;
    for (int32_t i = nb - 1; i >= 0; --i) {
      const int32_t ia = i - (nb - (a.ndim - 2)), ib = i - (nb - (b.ndim - 2));
      if (ia >= 0) {
        if (a.shape[ia] != 1) a_stride_[static_cast<size_t>(i)] = a_batch * M_ * K_;
        a_batch *= a.shape[ia];
      }
      if (ib >= 0) {
        if (b.shape[ib] != 1) b_stride_[static_cast<size_t>(i)] = b_batch * K_ * N_;
        b_batch *= b.shape[ib];
      }
    }
    batch_ = 1;
    for (int64_t d : batch_shape_) batch_ *= d;

    if (batch_ == 0 || M_ == 0 || N_ == 0) {
      mode_ = Mode::Empty;
      return;
    }
    if (K_ == 0) {
      mode_ = Mode::Zero;  // an empty sum: y = 0
      return;
    }
    GemmSpec s;
    s.dtype = dtype_;
    s.tf32 = backend.options().tf32;
    s.ta = ta, s.tb = tb;
    s.M = M_, s.N = N_, s.K = K_;
    s.alpha = static_cast<float>(node.attr_float("alpha"));
    // a's batch equals y's only when no dim of a broadcasts, and then its matrices follow each
    // other at M·K; likewise b. (Each of a's batch dims is y's or 1, and y's are >= 1.)
    const bool a_full = a_batch == batch_, b_full = b_batch == batch_;
    if (batch_ > 1 && !ta && b_batch == 1 && a_full) {
      // One b for the whole batch and a row-major a: the batch is just more rows of one GEMM,
      // (batch·M, K) x (K, N).
      mode_ = Mode::Single;
      s.M = batch_ * M_;
    } else if (batch_ == 1) {
      mode_ = Mode::Single;
    } else if ((a_full || a_batch == 1) && (b_full || b_batch == 1) && batch_ <= INT32_MAX) {
      // Every batch dim collapses to one stride per operand (0 for a shared operand).
      mode_ = Mode::Strided;
      s.batch = static_cast<int32_t>(batch_);
      s.stride_a = a_full ? M_ * K_ : 0;
      s.stride_b = b_full ? K_ * N_ : 0;
    } else {
      mode_ = Mode::Loop;  // batch dims that broadcast partially: one GEMM per batch entry
    }
    use_device(device_);
    plan_ = std::make_unique<GemmPlan>(backend.context(device_).lt, s, "matmul");
  }

  uint64_t workspace_bytes() const override { return plan_ ? plan_->workspace_bytes() : 0; }

  void compute(const KernelCall& c) override {
    use_device(device_);
    const cudaStream_t stream = native(c.stream);
    const char* a = static_cast<const char*>(c.in(0).data);
    const char* b = static_cast<const char*>(c.in(1).data);
    char* y = static_cast<char*>(c.out(0).data);
    switch (mode_) {
      case Mode::Empty:
        return;
      case Mode::Zero:
        PLX_CUDA_CHECK(
            cudaMemsetAsync(y, 0, static_cast<size_t>(batch_ * M_ * N_) * elem_, stream));
        return;
      case Mode::Single:
      case Mode::Strided:
        plan_->run(a, b, y, nullptr, c.workspace, c.workspace_bytes, stream);
        return;
      case Mode::Loop:
        for (int64_t i = 0; i < batch_; ++i) {
          int64_t oa = 0, ob = 0;
          for (int64_t d = static_cast<int64_t>(batch_shape_.size()) - 1, r = i; d >= 0; --d) {
            const size_t u = static_cast<size_t>(d);
            const int64_t k = r % batch_shape_[u];
            r /= batch_shape_[u];
            oa += k * a_stride_[u];
            ob += k * b_stride_[u];
          }
          plan_->run(a + oa * static_cast<int64_t>(elem_), b + ob * static_cast<int64_t>(elem_),
                     y + i * M_ * N_ * static_cast<int64_t>(elem_), nullptr, c.workspace,
                     c.workspace_bytes, stream);
        }
        return;
    }
  }

 private:
  enum class Mode { Empty, Zero, Single, Strided, Loop };
  int32_t device_;
  plx_dtype dtype_ = PLX_F32;
  size_t elem_ = 4;
  Mode mode_ = Mode::Empty;
  int64_t M_ = 0, N_ = 0, K_ = 0, batch_ = 1;
  std::vector<int64_t> batch_shape_, a_stride_, b_stride_;  // per batch dim of y
  std::unique_ptr<GemmPlan> plan_;
};

// y (..., out) = x (..., in) wᵀ + b: one GEMM over all rows of x. With `relu` (the fused
// linear+relu), the fast algorithm applies max(y, 0) in its epilogue and run() says whether it
// did.
class LinearKernel final : public Kernel {
 public:
  LinearKernel(const NodeInfo& node, CudaBackend& backend, bool relu = false)
      : device_(node.device()), has_bias_(node.has_input(2)) {
    const plx_tensor& x = node.input(0);  // (..., in)
    const plx_tensor& w = node.input(1);  // (out, in)
    PLX_REQUIRE(x.ndim >= 1 && w.ndim == 2, "linear: x (..., in) and w (out, in) expected");
    dtype_ = static_cast<plx_dtype>(x.dtype);
    elem_ = plexus::dtype_size(dtype_);
    out_ = w.shape[0];
    in_ = w.shape[1];
    rows_ = 1;
    for (int32_t i = 0; i + 1 < x.ndim; ++i) rows_ *= x.shape[i];
    if (rows_ == 0 || out_ == 0 || in_ == 0) return;  // nothing to multiply (compute fills y)
    GemmSpec s;
    s.dtype = dtype_;
    s.tf32 = backend.options().tf32;
    s.ta = false, s.tb = true;
    s.M = rows_, s.N = out_, s.K = in_;
    s.bias = has_bias_;
    s.relu = relu;
    use_device(device_);
    plan_ = std::make_unique<GemmPlan>(backend.context(device_).lt, s, "linear");
  }

  uint64_t workspace_bytes() const override { return plan_ ? plan_->workspace_bytes() : 0; }

  void compute(const KernelCall& c) override { run(c); }

  // Enqueues the node; true if the ReLU asked for at creation was applied.
  bool run(const KernelCall& c) {
    use_device(device_);
    const cudaStream_t stream = native(c.stream);
    void* y = c.out(0).data;
    const void* bias = has_bias_ ? c.in(2).data : nullptr;
    if (rows_ == 0 || out_ == 0) return true;  // nothing to apply it to
    if (in_ == 0) {
      // An empty sum: y is the bias, or 0.
      if (bias)
        fill_bias(dtype_, y, bias, rows_, out_, 1, stream);
      else
        PLX_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(rows_ * out_) * elem_, stream));
      return false;
    }
    return plan_->run(c.in(0).data, c.in(1).data, y, bias, c.workspace, c.workspace_bytes, stream);
  }

 private:
  int32_t device_;
  bool has_bias_;
  plx_dtype dtype_ = PLX_F32;
  size_t elem_ = 4;
  int64_t rows_ = 0, out_ = 0, in_ = 0;
  std::unique_ptr<GemmPlan> plan_;
};

// The fused linear -> relu: one cuBLASLt call with the RELU_BIAS (or RELU) epilogue, writing
// the activation straight into relu's output; the pre-activation is never stored. Where only
// the unaligned algorithm applies, relu's own kernel runs over the output in place.
class LinearRelu final : public Kernel {
 public:
  LinearRelu(CudaBackend& backend, const sdk::GraphView& g, const sdk::Boundary& b)
      : slots_(g, b, "linear", "relu") {
    const sdk::OwnedNodeInfo li(g, 0), ri(g, 1);
    linear_ = std::make_unique<LinearKernel>(NodeInfo(&li.get()), backend, /*relu=*/true);
    relu_ = std::make_unique<sdk::NodeKernel>(backend, ri.get());
    PLX_DECLINE_UNLESS(relu_->table().flags & PLX_KERNEL_INPLACE, "relu's kernel is not in place");
    flags_ = relu_->table().flags & (PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE);
  }

  uint32_t flags() const { return flags_; }
  uint64_t workspace_bytes() const override {
    return std::max(linear_->workspace_bytes(), relu_->workspace_bytes());
  }

  void compute(const KernelCall& c) override {
    if (!linear_->run(slots_.layer_call(c)))
      relu_->compute(slots_.output(), slots_.output(), c.workspace, c.workspace_bytes, c.stream);
  }

 private:
  ActPairSlots slots_;
  std::unique_ptr<LinearKernel> linear_;
  std::unique_ptr<sdk::NodeKernel> relu_;
  uint32_t flags_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> make_linear_relu(CudaBackend& backend, const sdk::GraphView& g,
                                         const sdk::Boundary& b, uint32_t& flags) {
  auto k = std::make_unique<LinearRelu>(backend, g, b);
  flags = k->flags();
  return k;
}

void register_gemm(KernelRegistry& r) {
  // cuBLASLt gives bit-identical results run to run for a fixed algorithm, which is chosen once
  // per node (by the heuristic, not by timing).
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16}) {
    r.add<MatmulKernel, CudaBackend>("matmul", d, "cublaslt", f | PLX_KERNEL_LIBRARY);
    r.add<LinearKernel, CudaBackend>("linear", d, "cublaslt", f | PLX_KERNEL_LIBRARY);
  }
}

}  // namespace plexus::cuda
