// CPU kernels: elementwise arithmetic with NumPy broadcasting (add, sub, mul, div), scale and
// expand (see docs/ops.md).
//
// One broadcast iteration serves the four binary ops and expand: the output's dimensions are
// collapsed (size-1 dimensions dropped, neighbours merged where every operand is contiguous
// across them), so same-shape operands become one flat loop, a scalar or a row/column broadcast
// one loop of rows, and only genuinely strided broadcasts keep more dimensions. The innermost
// dimension then has stride 0 or 1 in each operand, and its loop is instantiated for each case.
#include <cmath>
#include <limits>

#include "common.hpp"

namespace plexus::cpu {

namespace {

// Output dimensions with the element strides of up to two operands (0 where broadcast).
struct BroadcastPlan {
  int ndim = 0;
  int64_t size[PLX_MAX_DIMS] = {};
  int64_t stride[2][PLX_MAX_DIMS] = {};
  int64_t numel = 1;
  int64_t inner() const { return size[ndim - 1]; }
  // Inner strides as a case number: bit 0 operand 0 advances, bit 1 operand 1 advances.
  int inner_case() const {
    return (stride[0][ndim - 1] != 0 ? 1 : 0) | (stride[1][ndim - 1] != 0 ? 2 : 0);
  }
};

// `ops` are the contiguous operands (one or two, the second may be null); `y` the output whose
// shape they broadcast to.
BroadcastPlan plan_broadcast(const plx_tensor& y, const plx_tensor* a, const plx_tensor* b) {
  const plx_tensor* ops[2] = {a, b};
  int64_t full[2][PLX_MAX_DIMS] = {};  // per output dim, 0 where broadcast
  for (int k = 0; k < 2; ++k) {
    if (!ops[k]) continue;
    const plx_tensor& t = *ops[k];
    const int32_t lead = y.ndim - t.ndim;
    int64_t s = 1;
    for (int32_t j = t.ndim - 1; j >= 0; --j) {
      full[k][j + lead] = t.shape[j] == 1 ? 0 : s;
      s *= t.shape[j];
    }
  }
  BroadcastPlan p;
  for (int32_t i = 0; i < y.ndim; ++i) {
    const int64_t n = y.shape[i];
    p.numel *= n;
    if (n == 1) continue;
    if (p.ndim > 0) {
      const int l = p.ndim - 1;
      // Merge with the previous dimension when each operand steps through both as one.
      if (full[0][i] * n == p.stride[0][l] && full[1][i] * n == p.stride[1][l]) {
        p.size[l] *= n;
        p.stride[0][l] = full[0][i];
        p.stride[1][l] = full[1][i];
        continue;
      }
    }
    p.size[p.ndim] = n;
    p.stride[0][p.ndim] = full[0][i];
    p.stride[1][p.ndim] = full[1][i];
    ++p.ndim;
  }
  if (p.ndim == 0) {  // a single element: one dimension of 1, every operand at offset 0
    p.ndim = 1;
    p.size[0] = 1;
  }
  return p;
}

// Calls seg(y_offset, a_offset, b_offset, len) over output elements [begin, end) in pieces that
// lie along the innermost dimension.
template <class Seg>
void for_each_segment(const BroadcastPlan& p, int64_t begin, int64_t end, Seg&& seg) {
  const int last = p.ndim - 1;
  const int64_t n = p.inner();
  int64_t idx[PLX_MAX_DIMS] = {};
  int64_t off[2] = {0, 0};
  int64_t row = begin / n, col = begin % n;
  for (int d = last - 1; d >= 0; --d) {
    idx[d] = row % p.size[d];
    row /= p.size[d];
    off[0] += idx[d] * p.stride[0][d];
    off[1] += idx[d] * p.stride[1][d];
  }
  for (int64_t pos = begin; pos < end;) {
    const int64_t len = std::min(n - col, end - pos);
    seg(pos, off[0] + col * p.stride[0][last], off[1] + col * p.stride[1][last], len);
    pos += len;
    col = 0;
    for (int d = last - 1; d >= 0; --d) {  // odometer over the outer dimensions
      off[0] += p.stride[0][d];
      off[1] += p.stride[1][d];
      if (++idx[d] < p.size[d]) break;
      off[0] -= p.size[d] * p.stride[0][d];
      off[1] -= p.size[d] * p.stride[1][d];
      idx[d] = 0;
    }
  }
}

// Integer arithmetic wraps (two's complement) as NumPy's does, computed unsigned so that
// overflow is defined behaviour.
template <class T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <class T>
T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
}
template <class T>
T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
}

// The ops on the accumulation type A (f32 for 16-bit floats).
struct AddOp {
  static constexpr const char* name = "add";
  template <class A>
  A operator()(A a, A b) const {
    if constexpr (std::is_integral_v<A>)
      return wrap_add(a, b);
    else
      return a + b;
  }
};
struct SubOp {
  static constexpr const char* name = "sub";
  template <class A>
  A operator()(A a, A b) const {
    if constexpr (std::is_integral_v<A>)
      return wrap_sub(a, b);
    else
      return a - b;
  }
};
struct MulOp {
  static constexpr const char* name = "mul";
  template <class A>
  A operator()(A a, A b) const {
    if constexpr (std::is_integral_v<A>)
      return wrap_mul(a, b);
    else
      return a * b;
  }
};
struct DivOp {
  static constexpr const char* name = "div";
  template <class A>
  A operator()(A a, A b) const {
    if constexpr (std::is_integral_v<A>) {
      // C++ division truncates toward zero; MIN / -1 overflows, so it wraps like the others.
      // Zero divisors were rejected before the loop.
      return b == A(-1) ? wrap_sub(A(0), a) : a / b;
    } else {
      return a / b;
    }
  }
};

// y[i] = f(a[i * SA], b[i * SB]) for i < n, SA and SB in {0, 1}. A broadcast operand is read
// once, outside the loop, so the loop vectorises despite y possibly aliasing a (in place).
template <int SA, int SB, class T, class F>
void binary_row(const T* a, const T* b, T* y, int64_t n, F f) {
  if constexpr (SA == 0 && SB == 0) {
    const auto v = f(load(a, 0), load(b, 0));
    for (int64_t i = 0; i < n; ++i) store(y, i, v);
  } else if constexpr (SA == 0) {
    const auto av = load(a, 0);
    for (int64_t i = 0; i < n; ++i) store(y, i, f(av, load(b, i)));
  } else if constexpr (SB == 0) {
    const auto bv = load(b, 0);
    for (int64_t i = 0; i < n; ++i) store(y, i, f(load(a, i), bv));
  } else {
    for (int64_t i = 0; i < n; ++i) store(y, i, f(load(a, i), load(b, i)));
  }
}

template <class T, class Op>
class BinaryKernel final : public Kernel {
 public:
  explicit BinaryKernel(const NodeInfo& node)
      : plan_(plan_broadcast(node.output(0), &node.input(0), &node.input(1))) {}

  void compute(const KernelCall& c) override {
    const T* a = sdk::data<T>(c.in(0));  // (broadcasts to y)
    const T* b = sdk::data<T>(c.in(1));  // (broadcasts to y)
    T* y = sdk::data<T>(c.out(0));       // (broadcast shape)
    if (plan_.numel == 0) return;
    if constexpr (std::is_integral_v<T> && std::is_same_v<Op, DivOp>) {
      // Checked before any output is written, and outside the parallel region, which must not
      // throw.
      const int64_t nb = numel(c.in(1));
      for (int64_t i = 0; i < nb; ++i)
        PLX_REQUIRE(b[i] != 0, "div: integer division by zero (b%s has 0 at flat index %lld)",
                    sdk::shape_string(c.in(1)).c_str(), static_cast<long long>(i));
    }
    const Op op;
    const BroadcastPlan& p = plan_;
    const int kase = p.inner_case();
    parallel_for(p.numel, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for_each_segment(p, begin, end, [&](int64_t o, int64_t ia, int64_t ib, int64_t n) {
        switch (kase) {
          case 0:
            binary_row<0, 0>(a + ia, b + ib, y + o, n, op);
            break;
          case 1:
            binary_row<1, 0>(a + ia, b + ib, y + o, n, op);
            break;
          case 2:
            binary_row<0, 1>(a + ia, b + ib, y + o, n, op);
            break;
          default:
            binary_row<1, 1>(a + ia, b + ib, y + o, n, op);
            break;
        }
      });
    });
  }

 private:
  BroadcastPlan plan_;
};

template <class Op>
struct Binary {
  template <class T>
  using kernel = BinaryKernel<T, Op>;
};

// Float to integer as `cast` does: truncation toward zero, saturating; nan gives 0.
template <class T>
T saturate_cast(double v) {
  if (std::isnan(v)) return 0;
  // Bounds as doubles: max() + 1 is a power of two, exactly representable.
  constexpr double hi = -2.0 * static_cast<double>(std::numeric_limits<T>::min());
  if (v >= hi) return std::numeric_limits<T>::max();
  if (v <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  return static_cast<T>(v);
}

// y = alpha * x + beta. Floats compute in the accumulation type. Integers compute exactly (and
// wrap) when alpha and beta are whole numbers, otherwise in f64, truncated and saturated.
template <class T>
class ScaleKernel final : public Kernel {
 public:
  explicit ScaleKernel(const NodeInfo& node)
      : alpha_(node.attr_float("alpha")), beta_(node.attr_float("beta")) {
    if constexpr (std::is_integral_v<T>) {
      auto whole = [](double v) { return std::trunc(v) == v && std::fabs(v) < 0x1p63; };
      exact_ = whole(alpha_) && whole(beta_);
    }
  }

  void compute(const KernelCall& c) override {
    const T* x = sdk::data<T>(c.in(0));  // (any shape)
    T* y = sdk::data<T>(c.out(0));       // (same shape)
    parallel_for(numel(c.in(0)), kElementwiseGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_integral_v<T>) {
        if (exact_) {
          const T ia = static_cast<T>(static_cast<int64_t>(alpha_));
          const T ib = static_cast<T>(static_cast<int64_t>(beta_));
          for (int64_t i = b; i < e; ++i) y[i] = wrap_add(wrap_mul(x[i], ia), ib);
        } else {
          for (int64_t i = b; i < e; ++i)
            y[i] = saturate_cast<T>(alpha_ * static_cast<double>(x[i]) + beta_);
        }
      } else {
        using A = acc_t<T>;
        const A alpha = static_cast<A>(alpha_), beta = static_cast<A>(beta_);
        for (int64_t i = b; i < e; ++i) store(y, i, alpha * load(x, i) + beta);
      }
    });
  }

 private:
  double alpha_, beta_;
  bool exact_ = false;
};

// y = x broadcast to y's shape. Pure data movement: instantiated per element size, so every
// dtype (u8 included) shares four kernels.
template <class U>
class ExpandKernel final : public Kernel {
 public:
  explicit ExpandKernel(const NodeInfo& node)
      : plan_(plan_broadcast(node.output(0), &node.input(0), nullptr)) {
    PLX_REQUIRE(dtype_size(node.input(0).dtype) == sizeof(U),
                "expand: %s registered for %zu-byte elements", dtype_name(node.input(0).dtype),
                sizeof(U));
  }

  void compute(const KernelCall& c) override {
    const U* x = static_cast<const U*>(c.in(0).data);  // (broadcasts to y)
    U* y = static_cast<U*>(c.out(0).data);             // (shape attribute)
    const BroadcastPlan& p = plan_;
    const bool run = p.stride[0][p.ndim - 1] != 0;  // inner dimension copied, else repeated
    parallel_for(p.numel, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for_each_segment(p, begin, end, [&](int64_t o, int64_t ix, int64_t, int64_t n) {
        if (run)
          std::memcpy(y + o, x + ix, static_cast<size_t>(n) * sizeof(U));
        else
          std::fill(y + o, y + o + n, x[ix]);
      });
    });
  }

 private:
  BroadcastPlan plan_;
};

}  // namespace

void register_binary(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  // In place is safe: y[i] reads only a at the same flat index when a has y's shape (a smaller,
  // broadcast a cannot share y's buffer).
  const uint32_t fi = f | PLX_KERNEL_INPLACE;
  add_float_kernels<Binary<AddOp>::kernel>(r, "add", "omp", fi);
  add_int_kernels<Binary<AddOp>::kernel>(r, "add", "omp", fi);
  add_float_kernels<Binary<SubOp>::kernel>(r, "sub", "omp", fi);
  add_int_kernels<Binary<SubOp>::kernel>(r, "sub", "omp", fi);
  add_float_kernels<Binary<MulOp>::kernel>(r, "mul", "omp", fi);
  add_int_kernels<Binary<MulOp>::kernel>(r, "mul", "omp", fi);
  add_float_kernels<Binary<DivOp>::kernel>(r, "div", "omp", fi);
  add_int_kernels<Binary<DivOp>::kernel>(r, "div", "omp", fi);
  add_float_kernels<ScaleKernel>(r, "scale", "omp", fi);
  add_int_kernels<ScaleKernel>(r, "scale", "omp", fi);

  r.add<ExpandKernel<uint32_t>>("expand", PLX_F32, "omp", f);
  r.add<ExpandKernel<uint16_t>>("expand", PLX_F16, "omp", f);
  r.add<ExpandKernel<uint16_t>>("expand", PLX_BF16, "omp", f);
  r.add<ExpandKernel<uint64_t>>("expand", PLX_F64, "omp", f);
  r.add<ExpandKernel<uint32_t>>("expand", PLX_I32, "omp", f);
  r.add<ExpandKernel<uint64_t>>("expand", PLX_I64, "omp", f);
  r.add<ExpandKernel<uint8_t>>("expand", PLX_U8, "omp", f);
}

}  // namespace plexus::cpu
