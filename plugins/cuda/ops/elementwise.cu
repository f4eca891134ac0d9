// CUDA kernels: activations and their backward ops, elementwise arithmetic with NumPy
// broadcasting (add, sub, mul, div), scale and expand (see docs/ops.md; the CPU kernels in
// plugins/cpu/ops/{activation,binary}.cpp are the reference).
//
// Contiguous same-shape work (activations, their backward ops, scale, binary ops whose operands
// have the output's shape or are a single value) moves 16 bytes per access when the pointers
// allow it, with a scalar tail. Everything else walks the broadcast plan with a Cursor
// (indexing.cuh): a row broadcast or any other collapsed stride pattern, up to 8 dimensions.
//
// Arithmetic that the CPU plugin does with plain + - * (built without FMA contraction) is written
// with the _rn intrinsics where nvcc could fuse a multiply and an add, so that the results are
// the CPU's bit for bit; the transcendental functions (exp, tanh, erf) are CUDA's and may differ
// from the CPU's libm in the last bits.
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "device.cuh"
#include "ops/gelu.cuh"
#include "ops/gelu_attr.hpp"
#include "ops/indexing.cuh"

namespace plexus::cuda {

namespace {

// ---- kernels: contiguous maps ----

// y = f(x) over n contiguous elements, V per access (x and y aligned to V elements when V > 1).
// Each element is read and written by the same thread, so y may alias x.
template <class T, int V, class F>
__global__ void __launch_bounds__(kBlock) map1_kernel(const T* x, T* y, int64_t n, F f) {
  pdl_begin();
  using P = Pack<T, V>;
  const int64_t packs = n / V;
  for (int64_t i = thread_index(); i < packs; i += thread_count()) {
    const P a = reinterpret_cast<const P*>(x)[i];
    P r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = from_accum<T>(f(to_accum<T>(a.v[k])));
    reinterpret_cast<P*>(y)[i] = r;
  }
  if constexpr (V > 1) {  // fewer than V elements past the last pack
    const int64_t t = packs * V + thread_index();
    if (t < n) y[t] = from_accum<T>(f(to_accum<T>(x[t])));
  }
}

template <class T, class F>
void launch_map1(const T* x, T* y, int64_t n, const F& f, cudaStream_t s) {
  if (n == 0) return;
  constexpr int V = kVec<T>;
  if (aligned16(x) && aligned16(y))
    launch_kernel(map1_kernel<T, V, F>, grid_for((n + V - 1) / V), kBlock, 0, s, x, y, n, f);
  else
    launch_kernel(map1_kernel<T, 1, F>, grid_for(n), kBlock, 0, s, x, y, n, f);
}

// Two-operand functors either compute f(a, b) or, when they can find bad data (integer division
// by zero), f(a, b, flat index of b, BadItem&).
template <class F, class A>
__device__ __forceinline__ A apply2(const F& f, A a, A b, int64_t ib, BadItem& bad) {
  if constexpr (F::kReports)
    return f(a, b, ib, bad);
  else
    return f(a, b);
}

// y = f(a, b) over n output elements, where an operand either has y's shape (SA/SB true) or is
// one value read once. Operands that advance, and y, are aligned to V elements when V > 1.
template <class T, int V, bool SA, bool SB, class F>
__global__ void __launch_bounds__(kBlock)
    flat2_kernel(const T* a, const T* b, T* y, int64_t n, F f, DeviceErrorRecord* err) {
  pdl_begin();
  using P = Pack<T, V>;
  using A = accum_t<T>;
  BadItem bad;
  A a0{}, b0{};
  if constexpr (!SA) a0 = to_accum<T>(a[0]);
  if constexpr (!SB) b0 = to_accum<T>(b[0]);
  const int64_t packs = n / V;
  for (int64_t i = thread_index(); i < packs; i += thread_count()) {
    P pa, pb, r;
    if constexpr (SA) pa = reinterpret_cast<const P*>(a)[i];
    if constexpr (SB) pb = reinterpret_cast<const P*>(b)[i];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A av = a0, bv = b0;
      if constexpr (SA) av = to_accum<T>(pa.v[k]);
      if constexpr (SB) bv = to_accum<T>(pb.v[k]);
      r.v[k] = from_accum<T>(apply2(f, av, bv, SB ? i * V + k : 0, bad));
    }
    reinterpret_cast<P*>(y)[i] = r;
  }
  if constexpr (V > 1) {
    const int64_t t = packs * V + thread_index();
    if (t < n) {
      A av = a0, bv = b0;
      if constexpr (SA) av = to_accum<T>(a[t]);
      if constexpr (SB) bv = to_accum<T>(b[t]);
      y[t] = from_accum<T>(apply2(f, av, bv, SB ? t : 0, bad));
    }
  }
  if constexpr (F::kReports) report_block(bad, err, kErrIntegerDivByZero, 0);
}

// y = f(a, b) with any broadcast: the operands' offsets come from the plan's cursor.
template <class T, class F>
__global__ void __launch_bounds__(kBlock)
    strided2_kernel(StridedPlan<2> p, const T* a, const T* b, T* y, F f, DeviceErrorRecord* err) {
  pdl_begin();
  BadItem bad;
  int64_t i = thread_index();
  Cursor<2> c;
  c.start(p, i);
  for (; i < p.n; i += thread_count()) {
    const int64_t ia = c.offset(p, 0), ib = c.offset(p, 1);
    y[i] = from_accum<T>(apply2(f, to_accum<T>(a[ia]), to_accum<T>(b[ib]), ib, bad));
    c.advance(p);
  }
  if constexpr (F::kReports) report_block(bad, err, kErrIntegerDivByZero, 0);
}

// Same-shape contiguous operands: 16-byte accesses when a, b and y allow them.
template <class T, class F>
void launch_same_shape2(const T* a, const T* b, T* y, int64_t n, const F& f,
                        DeviceErrorRecord* err, cudaStream_t s) {
  if (n == 0) return;
  constexpr int V = kVec<T>;
  if (aligned16(a) && aligned16(b) && aligned16(y))
    launch_kernel(flat2_kernel<T, V, true, true, F>, grid_for((n + V - 1) / V), kBlock, 0, s, a, b,
                  y, n, f, err);
  else
    launch_kernel(flat2_kernel<T, 1, true, true, F>, grid_for(n), kBlock, 0, s, a, b, y, n, f, err);
}

// ---- activations ----

// Functors on f32, the type every activation dtype (f32, f16, bf16) computes in.
struct Relu {
  explicit Relu(const NodeInfo&) {}
  __device__ float operator()(float x) const { return x > 0.f ? x : 0.f; }  // NaN gives 0, as on the CPU
};
struct ReluBackward {  // saved: y
  static constexpr bool kReports = false;
  explicit ReluBackward(const NodeInfo&) {}
  __device__ float operator()(float dy, float y) const { return y > 0.f ? dy : 0.f; }
};

struct Sigmoid {
  explicit Sigmoid(const NodeInfo&) {}
  __device__ float operator()(float x) const { return 1.f / (1.f + expf(-x)); }
};
struct SigmoidBackward {  // saved: y
  static constexpr bool kReports = false;
  explicit SigmoidBackward(const NodeInfo&) {}
  __device__ float operator()(float dy, float y) const {
    return __fmul_rn(__fmul_rn(dy, y), __fsub_rn(1.f, y));
  }
};

struct Tanh {
  explicit Tanh(const NodeInfo&) {}
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct TanhBackward {  // saved: y
  static constexpr bool kReports = false;
  explicit TanhBackward(const NodeInfo&) {}
  __device__ float operator()(float dy, float y) const {
    return __fmul_rn(dy, __fsub_rn(1.f, __fmul_rn(y, y)));  // no FMA: the CPU rounds y*y
  }
};

// ops/gelu.cuh: one formula for these and the fused kernels.
struct Gelu {
  explicit Gelu(const NodeInfo& node) : tanh_(gelu_tanh(node)) {}
  __device__ float operator()(float x) const { return gelu::forward(x, tanh_); }
  bool tanh_;
};
struct GeluBackward {  // saved: x
  static constexpr bool kReports = false;
  explicit GeluBackward(const NodeInfo& node) : tanh_(gelu_tanh(node)) {}
  __device__ float operator()(float dy, float x) const { return gelu::backward(dy, x, tanh_); }
  bool tanh_;
};

// y = f(x), elementwise.
template <class T, class F>
class UnaryKernel final : public Kernel {
 public:
  UnaryKernel(const NodeInfo& node, CudaBackend&) : device_(node.device()), f_(node) {
    PLX_DECLINE_UNLESS(sdk::dense_alike(*node.raw()),
                       "%s: x and y must be dense and laid out alike (memory order)", node.op());
  }
  void compute(const KernelCall& c) override {
    use_device(device_);
    const T* x = ptr<T>(c.in(0));  // (any shape)
    T* y = ptr<T>(c.out(0));       // (same shape), may be x
    launch_map1(x, y, numel(c.in(0)), f_, native(c.stream));
  }

 private:
  int32_t device_;
  F f_;
};

// dx = g(dy, saved), elementwise; saved is the forward's input or output.
template <class T, class G>
class BackwardKernel final : public Kernel {
 public:
  BackwardKernel(const NodeInfo& node, CudaBackend&) : device_(node.device()), g_(node) {
    PLX_DECLINE_UNLESS(sdk::dense_alike(*node.raw()),
                       "%s: dy, the saved tensor and dx must be dense and laid out alike (memory "
                       "order)",
                       node.op());
  }
  void compute(const KernelCall& c) override {
    use_device(device_);
    const T* dy = ptr<T>(c.in(0));  // (any shape)
    const T* s = ptr<T>(c.in(1));   // (same shape)
    T* dx = ptr<T>(c.out(0));       // (same shape), may be dy
    launch_same_shape2(dy, s, dx, numel(c.in(0)), g_, nullptr, native(c.stream));
  }

 private:
  int32_t device_;
  G g_;
};

template <class F>
struct Unary {
  template <class T>
  using kernel = UnaryKernel<T, F>;
};
template <class G>
struct Backward {
  template <class T>
  using kernel = BackwardKernel<T, G>;
};

// ---- binary arithmetic ----

// Integer arithmetic wraps (two's complement) as NumPy's does, computed unsigned so that
// overflow is defined.
template <class A>
__device__ __forceinline__ A wrap_add(A a, A b) {
  using U = std::make_unsigned_t<A>;
  return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
}
template <class A>
__device__ __forceinline__ A wrap_sub(A a, A b) {
  using U = std::make_unsigned_t<A>;
  return static_cast<A>(static_cast<U>(a) - static_cast<U>(b));
}
template <class A>
__device__ __forceinline__ A wrap_mul(A a, A b) {
  using U = std::make_unsigned_t<A>;
  return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
}

// The ops on the accumulation type A of T (f32 for the 16-bit floats).
template <class T>
struct AddOp {
  static constexpr bool kReports = false;
  template <class A>
  __device__ A operator()(A a, A b) const {
    if constexpr (std::is_integral_v<A>)
      return wrap_add(a, b);
    else
      return a + b;
  }
};
template <class T>
struct SubOp {
  static constexpr bool kReports = false;
  template <class A>
  __device__ A operator()(A a, A b) const {
    if constexpr (std::is_integral_v<A>)
      return wrap_sub(a, b);
    else
      return a - b;
  }
};
template <class T>
struct MulOp {
  static constexpr bool kReports = false;
  template <class A>
  __device__ A operator()(A a, A b) const {
    if constexpr (std::is_integral_v<A>)
      return wrap_mul(a, b);
    else
      return a * b;
  }
};
// Floats divide as IEEE says (x/0 is inf or nan). Integers truncate toward zero; MIN / -1 wraps
// to MIN; a zero divisor is reported (with b's flat index, as the CPU names it) and gives 0.
template <class T>
struct DivOp {
  static constexpr bool kReports = std::is_integral_v<T>;
  template <class A>
  __device__ A operator()(A a, A b) const {
    return a / b;
  }
  template <class A>
  __device__ A operator()(A a, A b, int64_t ib, BadItem& bad) const {
    if (b == A(0)) {
      bad.note(ib, 0);
      return A(0);
    }
    return b == A(-1) ? wrap_sub(A(0), a) : a / b;
  }
};

template <class T, class Op>
class BinaryKernel final : public Kernel {
 public:
  BinaryKernel(const NodeInfo& node, CudaBackend& backend)
      : device_(node.device()), plan_(plan(node)) {
    if constexpr (Op::kReports) err_ = backend.context(device_).error_dev;
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    const T* a = ptr<T>(c.in(0));  // (broadcasts to y)
    const T* b = ptr<T>(c.in(1));  // (broadcasts to y)
    T* y = ptr<T>(c.out(0));       // (broadcast shape), may be a when a has y's shape
    const int64_t n = plan_.n;
    if (n == 0) return;
    const cudaStream_t s = native(c.stream);
    const Op op;
    constexpr int V = kVec<T>;
    const unsigned vgrid = grid_for((n + V - 1) / V);
    if (plan_.ndim == 1) {
      // One flat run: each operand advances with y or is a single value (a scalar operand, or
      // a one-element output where both are).
      const bool sa = plan_.stride[0][0] != 0, sb = plan_.stride[1][0] != 0;
      if (sa && sb && aligned16(a) && aligned16(b) && aligned16(y)) {
        launch_kernel(flat2_kernel<T, V, true, true, Op>, vgrid, kBlock, 0, s, a, b, y, n, op,
                      err_);
        return;
      }
      if (sa && !sb && aligned16(a) && aligned16(y)) {
        launch_kernel(flat2_kernel<T, V, true, false, Op>, vgrid, kBlock, 0, s, a, b, y, n, op,
                      err_);
        return;
      }
      if (!sa && sb && aligned16(b) && aligned16(y)) {
        launch_kernel(flat2_kernel<T, V, false, true, Op>, vgrid, kBlock, 0, s, a, b, y, n, op,
                      err_);
        return;
      }
    }
    const unsigned grid = grid_for(n);
    StridedPlan<2> p = plan_;
    p.set_step(static_cast<int64_t>(grid) * kBlock);
    launch_kernel(strided2_kernel<T, Op>, grid, kBlock, 0, s, p, a, b, y, op, err_);
  }

 private:
  static StridedPlan<2> plan(const NodeInfo& node) {
    const plx_tensor* ops[2] = {&node.input(0), &node.input(1)};
    return plan_broadcast<2>(node.output(0), ops);
  }
  int32_t device_;
  StridedPlan<2> plan_;
  DeviceErrorRecord* err_ = nullptr;
};

template <template <class> class Op>
struct Binary {
  template <class T>
  using kernel = BinaryKernel<T, Op<T>>;
};

// ---- scale ----

// Floats: alpha·x + beta in the accumulation type, rounded once (no FMA, as on the CPU).
struct ScaleFloat {
  float alpha, beta;
  __device__ float operator()(float x) const { return __fadd_rn(__fmul_rn(alpha, x), beta); }
};
// Integers with whole alpha and beta: exact, wrapping.
template <class T>
struct ScaleIntExact {
  T alpha, beta;
  __device__ T operator()(T x) const { return wrap_add(wrap_mul(x, alpha), beta); }
};
// Integers otherwise: in f64, then truncated and saturated as `cast` converts floats.
template <class T>
struct ScaleIntF64 {
  double alpha, beta;
  __device__ T operator()(T x) const {
    const double v = __dadd_rn(__dmul_rn(alpha, static_cast<double>(x)), beta);
    if (v != v) return 0;
    // max() + 1 is a power of two, exact as a double.
    constexpr double hi = -2.0 * static_cast<double>(std::numeric_limits<T>::min());
    if (v >= hi) return std::numeric_limits<T>::max();
    if (v <= static_cast<double>(std::numeric_limits<T>::min()))
      return std::numeric_limits<T>::min();
    return static_cast<T>(v);
  }
};

template <class T>
class ScaleKernel final : public Kernel {
 public:
  ScaleKernel(const NodeInfo& node, CudaBackend&)
      : device_(node.device()), alpha_(node.attr_float("alpha")), beta_(node.attr_float("beta")) {
    PLX_DECLINE_UNLESS(sdk::dense_alike(*node.raw()),
                       "scale: x and y must be dense and laid out alike (memory order)");
    if constexpr (std::is_integral_v<T>) {
      auto whole = [](double v) { return std::trunc(v) == v && std::fabs(v) < 0x1p63; };
      exact_ = whole(alpha_) && whole(beta_);
    }
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    const T* x = ptr<T>(c.in(0));  // (any shape)
    T* y = ptr<T>(c.out(0));       // (same shape), may be x
    const int64_t n = numel(c.in(0));
    const cudaStream_t s = native(c.stream);
    if constexpr (std::is_integral_v<T>) {
      if (exact_) {
        const ScaleIntExact<T> f{static_cast<T>(static_cast<int64_t>(alpha_)),
                                 static_cast<T>(static_cast<int64_t>(beta_))};
        launch_map1(x, y, n, f, s);
      } else {
        launch_map1(x, y, n, ScaleIntF64<T>{alpha_, beta_}, s);
      }
    } else {
      launch_map1(x, y, n, ScaleFloat{static_cast<float>(alpha_), static_cast<float>(beta_)}, s);
    }
  }

 private:
  int32_t device_;
  double alpha_, beta_;
  bool exact_ = false;
};

// ---- expand ----

// y = x broadcast to y's shape: gather_kernel (indexing.cuh) through the broadcast plan, per
// element size, so every dtype (u8 and f64 included) shares four kernels.
template <class U>
class ExpandKernel final : public Kernel {
 public:
  ExpandKernel(const NodeInfo& node, CudaBackend&) : device_(node.device()) {
    PLX_REQUIRE(dtype_size(node.input(0).dtype) == sizeof(U),
                "expand: %s registered for %zu-byte elements", dtype_name(node.input(0).dtype),
                sizeof(U));
    const plx_tensor* ops[1] = {&node.input(0)};
    plan_ = plan_broadcast<1>(node.output(0), ops);
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    const U* x = static_cast<const U*>(c.in(0).data);  // (broadcasts to y)
    U* y = static_cast<U*>(c.out(0).data);             // (shape attribute)
    const int64_t n = plan_.n;
    if (n == 0) return;
    const cudaStream_t s = native(c.stream);
    if (plan_.ndim == 1 && plan_.stride[0][0] == 1) {  // x already has y's elements in order
      PLX_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(U), cudaMemcpyDefault, s));
      return;
    }
    const unsigned grid = grid_for(n);
    StridedPlan<1> p = plan_;
    p.set_step(static_cast<int64_t>(grid) * kBlock);
    launch_kernel(gather_kernel<U>, grid, kBlock, 0, s, p, x, y);
  }

 private:
  int32_t device_;
  StridedPlan<1> plan_;
};

// ---- registration ----

template <template <class> class K>
void add_float_kernels(KernelRegistry& r, const char* op, const char* impl, uint32_t flags) {
  r.add<K<float>, CudaBackend>(op, PLX_F32, impl, flags);
  r.add<K<f16>, CudaBackend>(op, PLX_F16, impl, flags);
  r.add<K<bf16>, CudaBackend>(op, PLX_BF16, impl, flags);
}
template <template <class> class K>
void add_int_kernels(KernelRegistry& r, const char* op, const char* impl, uint32_t flags) {
  r.add<K<int32_t>, CudaBackend>(op, PLX_I32, impl, flags);
  r.add<K<int64_t>, CudaBackend>(op, PLX_I64, impl, flags);
}

}  // namespace

void register_elementwise(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  // In place is safe everywhere below: each output element is computed by the thread that
  // reads input 0 at the same flat index (a broadcast input 0 is smaller than y and cannot
  // share its buffer).
  const uint32_t fi = f | PLX_KERNEL_INPLACE;
  // Maps over same-shape operands work in memory order: any layout they share (the layout
  // planner's channels-last activations) is theirs too.
  const uint32_t fd = fi | PLX_KERNEL_DENSE;
  add_float_kernels<Unary<Relu>::kernel>(r, "relu", "cuda", fd);
  add_float_kernels<Backward<ReluBackward>::kernel>(r, "relu_backward", "cuda", fd);
  add_float_kernels<Unary<Gelu>::kernel>(r, "gelu", "cuda", fd);
  add_float_kernels<Backward<GeluBackward>::kernel>(r, "gelu_backward", "cuda", fd);
  add_float_kernels<Unary<Sigmoid>::kernel>(r, "sigmoid", "cuda", fd);
  add_float_kernels<Backward<SigmoidBackward>::kernel>(r, "sigmoid_backward", "cuda", fd);
  add_float_kernels<Unary<Tanh>::kernel>(r, "tanh", "cuda", fd);
  add_float_kernels<Backward<TanhBackward>::kernel>(r, "tanh_backward", "cuda", fd);

  add_float_kernels<Binary<AddOp>::kernel>(r, "add", "cuda", fi);
  add_int_kernels<Binary<AddOp>::kernel>(r, "add", "cuda", fi);
  add_float_kernels<Binary<SubOp>::kernel>(r, "sub", "cuda", fi);
  add_int_kernels<Binary<SubOp>::kernel>(r, "sub", "cuda", fi);
  add_float_kernels<Binary<MulOp>::kernel>(r, "mul", "cuda", fi);
  add_int_kernels<Binary<MulOp>::kernel>(r, "mul", "cuda", fi);
  add_float_kernels<Binary<DivOp>::kernel>(r, "div", "cuda", fi);
  add_int_kernels<Binary<DivOp>::kernel>(r, "div", "cuda", fi);
  add_float_kernels<ScaleKernel>(r, "scale", "cuda", fd);
  add_int_kernels<ScaleKernel>(r, "scale", "cuda", fd);

  r.add<ExpandKernel<uint32_t>, CudaBackend>("expand", PLX_F32, "cuda", f);
  r.add<ExpandKernel<uint16_t>, CudaBackend>("expand", PLX_F16, "cuda", f);
  r.add<ExpandKernel<uint16_t>, CudaBackend>("expand", PLX_BF16, "cuda", f);
  r.add<ExpandKernel<uint64_t>, CudaBackend>("expand", PLX_F64, "cuda", f);
  r.add<ExpandKernel<uint32_t>, CudaBackend>("expand", PLX_I32, "cuda", f);
  r.add<ExpandKernel<uint64_t>, CudaBackend>("expand", PLX_I64, "cuda", f);
  r.add<ExpandKernel<uint8_t>, CudaBackend>("expand", PLX_U8, "cuda", f);
}

}  // namespace plexus::cuda
