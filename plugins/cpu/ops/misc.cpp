// CPU kernels: copy, cast, dropout, embedding and their backward ops (see docs/ops.md).
#include <cmath>
#include <limits>

#include "common.hpp"
#include "plexus/sdk/philox.hpp"

namespace plexus::cpu {

namespace {

// Grain for a parallel loop over items of `work` elements each.
int64_t grain_for(int64_t work) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(work, 1));
}

template <class T>
constexpr bool is_half_v = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// ---- copy ----

// Any strides in, row-major out. Dimensions of size 1 are dropped and dimensions that are
// contiguous with each other merged, so a permuted or sliced view becomes the fewest loops; the
// innermost one is a memcpy when its stride is 1. The plan is made per call, on the stack,
// because strides are only known when the data is.
template <class T>
class CopyKernel final : public Kernel {
 public:
  explicit CopyKernel(const NodeInfo&) {}
  void compute(const KernelCall& call) override {
    const plx_tensor& x = call.in(0);
    const T* src = sdk::data<T>(x);      // (any shape, any strides)
    T* dst = sdk::data<T>(call.out(0));  // (same shape), row-major
    const int64_t n = numel(x);
    if (n == 0) return;
    int64_t size[PLX_MAX_DIMS], stride[PLX_MAX_DIMS];
    int nd = 0;
    for (int32_t i = 0; i < x.ndim; ++i) {
      if (x.shape[i] == 1) continue;
      if (nd > 0 && stride[nd - 1] == x.strides[i] * x.shape[i]) {
        size[nd - 1] *= x.shape[i];
        stride[nd - 1] = x.strides[i];
      } else {
        size[nd] = x.shape[i];
        stride[nd] = x.strides[i];
        ++nd;
      }
    }
    if (nd == 0) {  // a single element
      dst[0] = src[0];
      return;
    }
    const int64_t inner = size[nd - 1], inner_stride = stride[nd - 1];
    const int outer_nd = nd - 1;
    parallel_for(n / inner, grain_for(inner), [&](int64_t b, int64_t e) {
      int64_t idx[PLX_MAX_DIMS];  // position of row b over the outer dimensions
      int64_t off = 0, rem = b;
      for (int k = outer_nd - 1; k >= 0; --k) {
        idx[k] = rem % size[k];
        rem /= size[k];
        off += idx[k] * stride[k];
      }
      for (int64_t row = b; row < e; ++row) {
        const T* s = src + off;
        T* d = dst + row * inner;
        if (inner_stride == 1) {
          std::memcpy(d, s, static_cast<size_t>(inner) * sizeof(T));
        } else {
          for (int64_t j = 0; j < inner; ++j) d[j] = s[j * inner_stride];
        }
        for (int k = outer_nd - 1; k >= 0; --k) {  // odometer
          off += stride[k];
          if (++idx[k] < size[k]) break;
          off -= stride[k] * size[k];
          idx[k] = 0;
        }
      }
    });
  }
};

// ---- cast ----

// Float to integer: truncate toward zero, saturate at the type's range, NaN gives 0.
template <class To>
To float_to_int(double v) {
  if (std::isnan(v)) return 0;
  // The bounds as doubles: exact, except i64's max which rounds up to 2^63, so `>=` still
  // catches every value that does not fit.
  constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
  if (v <= lo) return std::numeric_limits<To>::min();
  if (v >= hi) return std::numeric_limits<To>::max();
  return static_cast<To>(v);
}

template <class To, class From>
To cast_value(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_integral_v<To>) {
    if constexpr (std::is_integral_v<From>) {  // saturate, like floats do
      const int64_t w = static_cast<int64_t>(v);
      if (w < static_cast<int64_t>(std::numeric_limits<To>::min()))
        return std::numeric_limits<To>::min();
      if (w > static_cast<int64_t>(std::numeric_limits<To>::max()))
        return std::numeric_limits<To>::max();
      return static_cast<To>(w);
    } else {
      return float_to_int<To>(static_cast<double>(convert<acc_t<From>>(v)));
    }
  } else if constexpr (is_half_v<To>) {
    return convert<To>(v);  // one rounding from any source (sdk/dtype.hpp)
  } else {  // f32 or f64: one rounding by the hardware (the 16-bit floats widen exactly)
    return static_cast<To>(convert<acc_t<From>>(v));
  }
}

template <class From, class To>
void cast_range(const void* src, void* dst, int64_t b, int64_t e) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
  for (int64_t i = b; i < e; ++i) d[i] = cast_value<To>(s[i]);
}

template <class From>
class CastKernel final : public Kernel {
 public:
  explicit CastKernel(const NodeInfo& node) {
    const bool known = visit_dtype(node.output(0).dtype, [&](auto to) {
      fn_ = cast_range<From, typename decltype(to)::type>;
    });
    if (!known)
      throw sdk::InvalidArgument(
          sdk::format("cast: bad output dtype %s", dtype_name(node.output(0).dtype)));
  }
  void compute(const KernelCall& call) override {
    const void* src = call.in(0).data;  // (any shape) From
    void* dst = call.out(0).data;       // (same shape) To
    parallel_for(numel(call.in(0)), kElementwiseGrain,
                 [&](int64_t b, int64_t e) { fn_(src, dst, b, e); });
  }

 private:
  void (*fn_)(const void*, void*, int64_t, int64_t) = nullptr;
};

// ---- dropout ----

double dropout_p(const NodeInfo& node) {
  const double p = node.attr_float("p");
  PLX_REQUIRE(p >= 0 && p < 1, "%s: p must be in [0, 1), got %g", node.op(), p);
  return p;
}

// Element i is kept when philox_uniform(seed, offset, i) >= p (p as f32, the type the uniform
// has). One Philox call gives the uniforms of four consecutive elements.
template <class T>
class DropoutKernel final : public Kernel {
 public:
  using A = acc_t<T>;
  explicit DropoutKernel(const NodeInfo& node)
      : p_(static_cast<float>(dropout_p(node))),
        scale_(static_cast<A>(1.0 / (1.0 - dropout_p(node)))),
        seed_(static_cast<uint64_t>(node.attr_int("seed"))),
        offset_(static_cast<uint64_t>(node.attr_int("offset"))),
        training_(node.attr_int("training") != 0) {}

  void compute(const KernelCall& call) override {
    const T* x = sdk::data<T>(call.in(0));            // (any shape)
    T* y = sdk::data<T>(call.out(0));                 // (same shape)
    uint8_t* mask = sdk::data<uint8_t>(call.out(1));  // (same shape) 0 or 1
    const int64_t n = numel(call.in(0));
    if (n == 0) return;  // empty tensors may have null data, which memcpy must not see
    if (!training_) {
      std::memcpy(y, x, static_cast<size_t>(n) * sizeof(T));
      std::memset(mask, 1, static_cast<size_t>(n));
      return;
    }
    const uint32_t k0 = static_cast<uint32_t>(seed_), k1 = static_cast<uint32_t>(seed_ >> 32);
    const uint32_t c2 = static_cast<uint32_t>(offset_), c3 = static_cast<uint32_t>(offset_ >> 32);
    const int64_t blocks = (n + 3) / 4;
    parallel_for(blocks, kElementwiseGrain / 4, [&](int64_t b, int64_t e) {
      for (int64_t blk = b; blk < e; ++blk) {
        const uint64_t ub = static_cast<uint64_t>(blk);
        const Philox4 r =
            philox4x32(static_cast<uint32_t>(ub), static_cast<uint32_t>(ub >> 32), c2, c3, k0, k1);
        const int64_t base = blk * 4;
        for (int64_t k = 0; k < 4 && base + k < n; ++k) {
          const float u = static_cast<float>(r.v[k] >> 8) * (1.0f / 16777216.0f);
          const bool keep = u >= p_;
          mask[base + k] = keep ? 1 : 0;
          // A multiply (not a select) lets NaN and inf in x propagate, as in PyTorch.
          store(y, base + k, load(x, base + k) * (keep ? scale_ : A(0)));
        }
      }
    });
  }

 private:
  float p_;  // compared as f32, the uniforms' type, so every backend draws the same mask
  A scale_;  // 1 / (1 - p) from the exact p
  uint64_t seed_, offset_;
  bool training_;
};

template <class T>
class DropoutBackwardKernel final : public Kernel {
 public:
  using A = acc_t<T>;
  explicit DropoutBackwardKernel(const NodeInfo& node)
      : scale_(static_cast<A>(1.0 / (1.0 - dropout_p(node)))) {}
  void compute(const KernelCall& call) override {
    const T* dy = sdk::data<T>(call.in(0));                // (any shape)
    const uint8_t* mask = sdk::data<uint8_t>(call.in(1));  // (same shape)
    T* dx = sdk::data<T>(call.out(0));                     // (same shape)
    parallel_for(numel(call.in(0)), kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) store(dx, i, load(dy, i) * (mask[i] ? scale_ : A(0)));
    });
  }

 private:
  A scale_;
};

// ---- embedding ----

// Checks every index before any parallel work (an exception must not leave an OpenMP region).
template <class I>
void check_indices(const char* op, const I* idx, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    PLX_REQUIRE(
        idx[i] >= 0 && idx[i] < rows, "%s: index %lld at position %lld is outside [0, %lld)", op,
        static_cast<long long>(idx[i]), static_cast<long long>(i), static_cast<long long>(rows));
}

template <class T>
class EmbeddingKernel final : public Kernel {
 public:
  explicit EmbeddingKernel(const NodeInfo& node)
      : wide_(node.input(1).dtype == PLX_I64),
        rows_(node.input(0).shape[0]),
        dim_(node.input(0).shape[1]) {}
  void compute(const KernelCall& call) override {
    if (wide_)
      run(call, sdk::data<int64_t>(call.in(1)));
    else
      run(call, sdk::data<int32_t>(call.in(1)));
  }

 private:
  template <class I>
  void run(const KernelCall& call, const I* idx) {  // idx (...)
    const T* w = sdk::data<T>(call.in(0));          // (V, D)
    T* y = sdk::data<T>(call.out(0));               // (..., D)
    const int64_t n = numel(call.in(1)), D = dim_;
    check_indices("embedding", idx, n, rows_);
    if (D == 0) return;  // y is empty and may have null data
    parallel_for(n, grain_for(D), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        std::memcpy(y + i * D, w + static_cast<int64_t>(idx[i]) * D,
                    static_cast<size_t>(D) * sizeof(T));
    });
  }
  bool wide_;
  int64_t rows_, dim_;
};

// dweight[v] = sum of dy[i] over the positions i with indices[i] == v, padding_idx's row zero.
// Deterministic without atomics: the columns are split among threads, and each thread adds the
// rows of dy in index order into its own columns. 16-bit results accumulate in f32 in the
// workspace and are rounded once at the end.
template <class T>
class EmbeddingBackwardKernel final : public Kernel {
 public:
  explicit EmbeddingBackwardKernel(const NodeInfo& node)
      : wide_(node.input(1).dtype == PLX_I64),
        rows_(node.attr_int("num_weights")),
        dim_(node.input(0).ndim > 0 ? node.input(0).shape[node.input(0).ndim - 1] : 0),
        padding_(node.attr_int("padding_idx")) {}

  uint64_t workspace_bytes() const override {
    return is_half_v<T> ? static_cast<uint64_t>(rows_ * dim_) * sizeof(float) : 0;
  }

  void compute(const KernelCall& call) override {
    if (wide_)
      run(call, sdk::data<int64_t>(call.in(1)));
    else
      run(call, sdk::data<int32_t>(call.in(1)));
  }

 private:
  template <class I>
  void run(const KernelCall& call, const I* idx) {  // idx (...)
    using A = acc_t<T>;
    const T* dy = sdk::data<T>(call.in(0));                                              // (..., D)
    T* dw = sdk::data<T>(call.out(0));                                                   // (V, D)
    A* acc = is_half_v<T> ? static_cast<A*>(call.workspace) : reinterpret_cast<A*>(dw);  // (V, D)
    const int64_t n = numel(call.in(1)), V = rows_, D = dim_;
    check_indices("embedding_backward", idx, n, V);
    parallel_for(D, grain_for(n + V), [&](int64_t b, int64_t e) {
      for (int64_t v = 0; v < V; ++v)
        for (int64_t j = b; j < e; ++j) acc[v * D + j] = A(0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = static_cast<int64_t>(idx[i]);
        if (v == padding_) continue;
        for (int64_t j = b; j < e; ++j) acc[v * D + j] += load(dy, i * D + j);
      }
      if constexpr (is_half_v<T>) {
        for (int64_t v = 0; v < V; ++v)
          for (int64_t j = b; j < e; ++j) store(dw, v * D + j, acc[v * D + j]);
      }
    });
  }
  bool wide_;
  int64_t rows_, dim_, padding_;
};

// Registers K<T> for every dtype.
template <template <class> class K>
void add_all_kernels(KernelRegistry& r, const char* op, const char* impl, uint32_t flags) {
  add_float_kernels<K>(r, op, impl, flags);
  add_int_kernels<K>(r, op, impl, flags);
  r.add<K<uint8_t>>(op, PLX_U8, impl, flags);
}

}  // namespace

void register_misc(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  // copy is what Tensor::contiguous() runs: it must take any strides.
  add_all_kernels<CopyKernel>(r, "copy", "omp", f | PLX_KERNEL_STRIDED);
  add_all_kernels<CastKernel>(r, "cast", "omp", f);
  add_float_kernels<DropoutKernel>(r, "dropout", "philox+omp", f);
  add_float_kernels<DropoutBackwardKernel>(r, "dropout_backward", "omp", f | PLX_KERNEL_INPLACE);
  add_float_kernels<EmbeddingKernel>(r, "embedding", "omp", f);
  add_float_kernels<EmbeddingBackwardKernel>(r, "embedding_backward", "omp-by-column", f);
}

}  // namespace plexus::cpu
