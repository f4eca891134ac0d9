// CUDA kernels: copy, cast, dropout, embedding and their backward ops (see docs/ops.md; the CPU
// kernels in plugins/cpu/ops/misc.cpp are the reference).
#include <cub/device/device_radix_sort.cuh>

#include <cstring>
#include <limits>
#include <type_traits>

#include "device.cuh"
#include "ops/indexing.cuh"
#include "ops/multi_cast.hpp"
#include "ops/multi_unscale.hpp"
#include "ops/multi_tensor.cuh"
#include "plexus/sdk/philox.hpp"

namespace plexus::cuda {

namespace {

template <class T>
constexpr bool is_half_v = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

// Calls f(dtype_tag<T>{}) with T the device type of `dtype` (sdk::visit_dtype's host types
// half/bfloat16 become __half/__nv_bfloat16). Returns false for an invalid dtype.
template <class F>
bool visit_device_dtype(int32_t dtype, F&& f) {
  switch (dtype) {
    case PLX_F32: f(dtype_tag<float>{}); return true;
    case PLX_F16: f(dtype_tag<f16>{}); return true;
    case PLX_BF16: f(dtype_tag<bf16>{}); return true;
    case PLX_I32: f(dtype_tag<int32_t>{}); return true;
    case PLX_I64: f(dtype_tag<int64_t>{}); return true;
    case PLX_U8: f(dtype_tag<uint8_t>{}); return true;
    case PLX_F64: f(dtype_tag<double>{}); return true;
    default: return false;
  }
}

// ---- copy ----

// Any strides in (negative, zero, overlapping; `data` already points at the first element),
// row-major out. The plan (plan_strided) is made per call on the host, because strides are only
// known when the data is; a permuted or sliced view becomes the fewest dimensions, and a source
// already in order is one memcpy; otherwise gather_kernel (indexing.cuh) walks the plan.
template <class U>
class CopyKernel final : public Kernel {
 public:
  CopyKernel(const NodeInfo& node, CudaBackend&) : device_(node.device()) {
    PLX_REQUIRE(dtype_size(node.input(0).dtype) == sizeof(U),
                "copy: %s registered for %zu-byte elements", dtype_name(node.input(0).dtype),
                sizeof(U));
  }

  void compute(const KernelCall& call) override {
    use_device(device_);
    const plx_tensor& x = call.in(0);
    const U* src = static_cast<const U*>(x.data);  // (any shape, any strides)
    U* dst = static_cast<U*>(call.out(0).data);    // (same shape), row-major
    const int64_t n = numel(x);
    if (n == 0) return;
    const cudaStream_t s = native(call.stream);
    StridedPlan<1> p = plan_strided(x);
    if (p.ndim == 1 && p.stride[0][0] == 1) {  // already in order (or a single element)
      PLX_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(U), cudaMemcpyDefault, s));
      return;
    }
    const unsigned grid = grid_for(n);
    p.set_step(static_cast<int64_t>(grid) * kBlock);
    launch_kernel(gather_kernel<U>, grid, kBlock, 0, s, p, src, dst);
  }

 private:
  int32_t device_;
};

// ---- cast ----

// Float to integer: truncate toward zero, saturate at the type's range, NaN gives 0. The bounds
// as doubles are exact, except i64's max which rounds up to 2^63, so `>=` still catches every
// value that does not fit.
template <class To>
__device__ __forceinline__ To float_to_int(double v) {
  if (v != v) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
  if (v <= lo) return std::numeric_limits<To>::min();
  if (v >= hi) return std::numeric_limits<To>::max();
  return static_cast<To>(v);
}

template <class To, class From>
__device__ __forceinline__ To cast_value(From v) {
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
      return float_to_int<To>(static_cast<double>(to_accum<From>(v)));
    }
  } else if constexpr (is_half_v<To>) {
    // One rounding from any source: f32 (and the other 16-bit float, exact in f32) directly;
    // wider sources first to f32 with round-to-odd, which keeps enough bits that the final
    // round-to-nearest-even lands where a direct rounding would (sdk/dtype.hpp, shared with
    // the CPU, so both give the same bits).
    float f;
    if constexpr (std::is_same_v<From, float> || is_half_v<From>)
      f = to_accum<From>(v);
    else if constexpr (std::is_same_v<From, int64_t>)
      f = plexus::i64_to_f32_odd(v);
    else  // f64, or an integer exact in f64 (i32, u8)
      f = plexus::f64_to_f32_odd(static_cast<double>(v));
    return from_accum<To>(f);
  } else {  // f32 or f64: one rounding by the hardware (the 16-bit floats widen exactly)
    return static_cast<To>(to_accum<From>(v));
  }
}

template <class From, class To>
__global__ void __launch_bounds__(kBlock) cast_kernel(const From* x, To* y, int64_t n) {
  pdl_begin();
  PLX_GRID_STRIDE(i, n) y[i] = cast_value<To>(x[i]);
}

template <class From, class To>
void launch_cast(const void* x, void* y, int64_t n, cudaStream_t s) {
  launch_kernel(cast_kernel<From, To>, grid_for(n), kBlock, 0, s, static_cast<const From*>(x),
                static_cast<To*>(y), n);
}

template <class From>
class CastKernel final : public Kernel {
 public:
  CastKernel(const NodeInfo& node, CudaBackend&) : device_(node.device()) {
    const bool known = visit_device_dtype(node.output(0).dtype, [&](auto to) {
      launch_ = launch_cast<From, typename decltype(to)::type>;
    });
    if (!known)
      throw sdk::InvalidArgument(
          sdk::format("cast: bad output dtype %s", dtype_name(node.output(0).dtype)));
  }
  void compute(const KernelCall& call) override {
    use_device(device_);
    const int64_t n = numel(call.in(0));
    if (n == 0) return;
    launch_(call.in(0).data, call.out(0).data, n, native(call.stream));  // (any shape) From -> To
  }

 private:
  int32_t device_;
  void (*launch_)(const void*, void*, int64_t, cudaStream_t) = nullptr;
};

// ---- many casts in one launch (ops/multi_cast.hpp) ----

constexpr int64_t kCastChunk = 4096;  // elements per block

struct MultiCastLaunch {
  const void* src[kMultiCastCapacity];
  void* dst[kMultiCastCapacity];
  int64_t numel[kMultiCastCapacity];
  int32_t first_block[kMultiCastCapacity];  // the tensor's first block; ascending
  // Channels-last output (a 16-bit copy of a conv filter for NHWC kernels): the source's C and
  // H·W, the destination its NHWC permutation; 0: the same order.
  int32_t cl_c[kMultiCastCapacity];
  int64_t cl_hw[kMultiCastCapacity];
  int32_t count;
};
static_assert(sizeof(MultiCastLaunch) <= 4000, "kernel parameters are limited to 4 KiB");

// Each block casts one chunk of one tensor (multi_tensor.cuh).
template <class From, class To>
__global__ void __launch_bounds__(kBlock) multi_cast_kernel(const MultiCastLaunch L) {
  pdl_begin();
  const int t = block_tensor(L);
  const int64_t begin = static_cast<int64_t>(static_cast<int32_t>(blockIdx.x) - L.first_block[t]) * kCastChunk;
  const int64_t end = min(L.numel[t], begin + kCastChunk);
  const From* x = static_cast<const From*>(L.src[t]);
  To* y = static_cast<To*>(L.dst[t]);
  const int64_t C = L.cl_c[t];
  if (C == 0) {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) y[i] = cast_value<To>(x[i]);
    return;
  }
  // y[i] is element (n, c, p) of an (N, C, H·W) source stored as (N, H·W, C): writes coalesce,
  // reads gather (filters are small).
  const int64_t hw = L.cl_hw[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const int64_t c = i % C, r = i / C;
    y[i] = cast_value<To>(x[(r / hw * C + c) * hw + r % hw]);
  }
}

template <class From, class To>
void launch_multi_cast_typed(int32_t count, const void* const* src, void* const* dst,
                             const int64_t* numel, const int32_t* cl_c, const int64_t* cl_hw,
                             cudaStream_t stream) {
  MultiCastLaunch L{};
  pack_launches<kCastChunk, kMultiCastCapacity>(
      L, count, numel, "multi-tensor cast",
      [&](int slot, int32_t i) {
        L.src[slot] = src[i];
        L.dst[slot] = dst[i];
        L.cl_c[slot] = cl_c ? cl_c[i] : 0;
        L.cl_hw[slot] = cl_hw ? cl_hw[i] : 0;
      },
      [&](unsigned blocks) {
        launch_kernel(multi_cast_kernel<From, To>, blocks, kBlock, 0, stream, L);
      });
}

}  // namespace

void launch_multi_cast(plx_dtype from, plx_dtype to, int32_t count, const void* const* src,
                       void* const* dst, const int64_t* numel, const int32_t* cl_c,
                       const int64_t* cl_hw, cudaStream_t stream) {
  auto pick_to = [&](auto f) {
    using F = typename decltype(f)::type;
    switch (to) {
      case PLX_F32:
        return launch_multi_cast_typed<F, float>(count, src, dst, numel, cl_c, cl_hw, stream);
      case PLX_F16:
        return launch_multi_cast_typed<F, f16>(count, src, dst, numel, cl_c, cl_hw, stream);
      case PLX_BF16:
        return launch_multi_cast_typed<F, bf16>(count, src, dst, numel, cl_c, cl_hw, stream);
      default:
        throw sdk::Unsupported(sdk::format("multi-tensor cast: to %s", dtype_name(to)));
    }
  };
  switch (from) {
    case PLX_F32: return pick_to(std::type_identity<float>{});
    case PLX_F16: return pick_to(std::type_identity<f16>{});
    case PLX_BF16: return pick_to(std::type_identity<bf16>{});
    default:
      throw sdk::Unsupported(sdk::format("multi-tensor cast: from %s", dtype_name(from)));
  }
}

// ---- f16 loss scaling's unscale and check (ops/multi_unscale.hpp) ----

namespace {

constexpr int64_t kUnscaleChunk = 4096;  // elements per block

struct MultiUnscaleLaunch {
  const void* src[kMultiUnscaleCapacity];
  float* dst[kMultiUnscaleCapacity];
  int64_t numel[kMultiUnscaleCapacity];
  int32_t first_block[kMultiUnscaleCapacity];
  int32_t count;
  int32_t block_base;    // this launch's first block among all the launches'
  int32_t total_blocks;  // all the launches' blocks
  const float* unscale;
  float* check;
  float* partial;
  unsigned* done;
};
static_assert(sizeof(MultiUnscaleLaunch) <= 4000, "kernel parameters are limited to 4 KiB");

template <class G>
__global__ void __launch_bounds__(kBlock) multi_unscale_kernel(const MultiUnscaleLaunch L) {
  pdl_begin();
  __shared__ float shared_sum[32];
  const int t = block_tensor(L);
  const int64_t begin = static_cast<int64_t>(static_cast<int32_t>(blockIdx.x) - L.first_block[t]) * kUnscaleChunk;
  const int64_t end = min(L.numel[t], begin + kUnscaleChunk);
  const G* x = static_cast<const G*>(L.src[t]);
  float* y = L.dst[t];
  const float s = *L.unscale;
  float acc = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = __fmul_rn(to_accum<G>(x[i]), s);
    y[i] = v;
    acc += v;
  }
  acc = block_sum(acc, shared_sum);
  if (threadIdx.x == 0) L.partial[L.block_base + static_cast<int32_t>(blockIdx.x)] = acc;
  if (!last_block_arrives(L.done, static_cast<unsigned>(L.total_blocks))) return;
  // Each thread's share of the partial sums in order, then the block's fixed tree.
  const volatile float* part = L.partial;
  float total = 0.f;
  for (int32_t b = static_cast<int32_t>(threadIdx.x); b < L.total_blocks; b += blockDim.x)
    total += part[b];
  total = block_sum(total, shared_sum);
  if (threadIdx.x == 0) {
    *L.check = total;
    *L.done = 0;
  }
}

template <class G>
void launch_multi_unscale_typed(const MultiUnscaleArgs& a, int64_t total, cudaStream_t stream) {
  MultiUnscaleLaunch L{};
  L.unscale = a.unscale;
  L.check = a.check;
  L.partial = a.partial;
  L.done = a.done;
  L.total_blocks = static_cast<int32_t>(total);
  int32_t base = 0;
  pack_launches<kUnscaleChunk, kMultiUnscaleCapacity>(
      L, a.count, a.numel, "multi-tensor unscale",
      [&](int slot, int32_t i) {
        L.src[slot] = a.in[i];
        L.dst[slot] = a.out[i];
      },
      [&](unsigned blocks) {
        L.block_base = base;
        launch_kernel(multi_unscale_kernel<G>, blocks, kBlock, 0, stream, L);
        base += static_cast<int32_t>(blocks);
      });
}

}  // namespace

int64_t multi_unscale_blocks(int32_t count, const int64_t* numel) {
  int64_t blocks = 0;
  for (int32_t i = 0; i < count; ++i)
    if (numel[i] > 0) blocks += (numel[i] + kUnscaleChunk - 1) / kUnscaleChunk;
  return blocks;
}

void launch_multi_unscale(const MultiUnscaleArgs& a, cudaStream_t stream) {
  const int64_t total = multi_unscale_blocks(a.count, a.numel);
  PLX_REQUIRE(total < INT32_MAX, "multi-tensor unscale: too many blocks");
  if (total == 0) {  // no element: the check is the empty sum
    PLX_CUDA_CHECK(cudaMemsetAsync(a.check, 0, sizeof(float), stream));
    return;
  }
  switch (a.in_dtype) {
    case PLX_F32: return launch_multi_unscale_typed<float>(a, total, stream);
    case PLX_F16: return launch_multi_unscale_typed<f16>(a, total, stream);
    case PLX_BF16: return launch_multi_unscale_typed<bf16>(a, total, stream);
    default: break;
  }
  throw sdk::Unsupported(sdk::format("multi-tensor unscale: %s gradients", dtype_name(a.in_dtype)));
}

namespace {

// ---- dropout ----

double dropout_p(const NodeInfo& node) {
  const double p = node.attr_float("p");
  PLX_REQUIRE(p >= 0 && p < 1, "%s: p must be in [0, 1), got %g", node.op(), p);
  return p;
}

// Element i is kept when philox_uniform(seed, offset, i) >= p (p as f32, the uniform's type),
// the CPU's rule with the same Philox code, so the masks are equal. One Philox call gives the
// uniforms of four consecutive elements, so each thread takes a group of four; groups move as
// one 4-element access when x, y and mask are aligned to it. A multiply (not a select) lets NaN
// and inf in x propagate, as in PyTorch.
template <class T, bool Vec>
__global__ void __launch_bounds__(kBlock)
    dropout_kernel(const T* x, T* y, uint8_t* mask, int64_t n, float p, float scale, uint32_t k0,
                   uint32_t k1, uint32_t c2, uint32_t c3) {
  pdl_begin();
  using P = Pack<T, 4>;
  const int64_t groups = (n + 3) / 4;
  PLX_GRID_STRIDE(g, groups) {
    const uint64_t ug = static_cast<uint64_t>(g);
    const Philox4 r =
        philox4x32(static_cast<uint32_t>(ug), static_cast<uint32_t>(ug >> 32), c2, c3, k0, k1);
    const int64_t base = g * 4;
    if (Vec && base + 4 <= n) {
      const P a = reinterpret_cast<const P*>(x)[g];
      P out;
      uint32_t m = 0;  // the four mask bytes, element k in byte k (little-endian)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float u = static_cast<float>(r.v[k] >> 8) * (1.0f / 16777216.0f);
        const bool keep = u >= p;
        m |= (keep ? 1u : 0u) << (8 * k);
        out.v[k] = from_accum<T>(to_accum<T>(a.v[k]) * (keep ? scale : 0.f));
      }
      reinterpret_cast<P*>(y)[g] = out;
      reinterpret_cast<uint32_t*>(mask)[g] = m;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t i = base + k;
        if (i < n) {
          const float u = static_cast<float>(r.v[k] >> 8) * (1.0f / 16777216.0f);
          const bool keep = u >= p;
          mask[i] = keep ? 1 : 0;
          y[i] = from_accum<T>(to_accum<T>(x[i]) * (keep ? scale : 0.f));
        }
      }
    }
  }
}

template <class T>
class DropoutKernel final : public Kernel {
 public:
  DropoutKernel(const NodeInfo& node, CudaBackend&)
      : device_(node.device()),
        p_(static_cast<float>(dropout_p(node))),
        scale_(static_cast<float>(1.0 / (1.0 - dropout_p(node)))),
        seed_(static_cast<uint64_t>(node.attr_int("seed"))),
        offset_(static_cast<uint64_t>(node.attr_int("offset"))),
        training_(node.attr_int("training") != 0) {}

  void compute(const KernelCall& call) override {
    use_device(device_);
    const T* x = ptr<T>(call.in(0));              // (any shape)
    T* y = ptr<T>(call.out(0));                   // (same shape)
    uint8_t* mask = ptr<uint8_t>(call.out(1));    // (same shape) 0 or 1
    const int64_t n = numel(call.in(0));
    if (n == 0) return;
    const cudaStream_t s = native(call.stream);
    if (!training_) {
      PLX_CUDA_CHECK(
          cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDefault, s));
      PLX_CUDA_CHECK(cudaMemsetAsync(mask, 1, static_cast<size_t>(n), s));
      return;
    }
    const uint32_t k0 = static_cast<uint32_t>(seed_), k1 = static_cast<uint32_t>(seed_ >> 32);
    const uint32_t c2 = static_cast<uint32_t>(offset_), c3 = static_cast<uint32_t>(offset_ >> 32);
    const unsigned grid = grid_for((n + 3) / 4);
    if (aligned_to(x, 4 * sizeof(T)) && aligned_to(y, 4 * sizeof(T)) && aligned_to(mask, 4))
      launch_kernel(dropout_kernel<T, true>, grid, kBlock, 0, s, x, y, mask, n, p_, scale_, k0, k1,
                    c2, c3);
    else
      launch_kernel(dropout_kernel<T, false>, grid, kBlock, 0, s, x, y, mask, n, p_, scale_, k0, k1,
                    c2, c3);
  }

 private:
  int32_t device_;
  float p_;      // compared as f32, the uniforms' type, so every backend draws the same mask
  float scale_;  // 1 / (1 - p) from the exact p
  uint64_t seed_, offset_;
  bool training_;
};

// dx = dy·mask/(1 − p); dx may be dy (each element read and written by one thread).
template <class T>
__global__ void __launch_bounds__(kBlock)
    dropout_backward_kernel(const T* dy, const uint8_t* mask, T* dx, int64_t n, float scale) {
  pdl_begin();
  PLX_GRID_STRIDE(i, n) dx[i] = from_accum<T>(to_accum<T>(dy[i]) * (mask[i] ? scale : 0.f));
}

template <class T>
class DropoutBackwardKernel final : public Kernel {
 public:
  DropoutBackwardKernel(const NodeInfo& node, CudaBackend&)
      : device_(node.device()), scale_(static_cast<float>(1.0 / (1.0 - dropout_p(node)))) {}
  void compute(const KernelCall& call) override {
    use_device(device_);
    const T* dy = ptr<T>(call.in(0));                // (any shape)
    const uint8_t* mask = ptr<uint8_t>(call.in(1));  // (same shape)
    T* dx = ptr<T>(call.out(0));                     // (same shape)
    const int64_t n = numel(call.in(0));
    if (n == 0) return;
    launch_kernel(dropout_backward_kernel<T>, grid_for(n), kBlock, 0, native(call.stream), dy, mask,
                  dx, n, scale_);
  }

 private:
  int32_t device_;
  float scale_;
};

// ---- embedding ----

// y[i, :] = w[idx[i], :], in packs of V elements (V > 1 when D is a multiple of V and w and y
// are 16-byte aligned, so every row starts aligned). A thread's (row, column) advances by the
// grid's stride without dividing. An index outside [0, rows) is reported and its row of y
// zeroed.
template <class T, class I, int V>
__global__ void __launch_bounds__(kBlock)
    embedding_kernel(const T* w, const I* idx, T* y, int64_t n, int64_t rows, int64_t dv,
                     DeviceErrorRecord* err) {
  pdl_begin();
  using P = Pack<T, V>;
  BadItem bad;
  const int64_t total = n * dv;
  int64_t i = thread_index();
  const int64_t stride = thread_count();
  int64_t row = i / dv, col = i - row * dv;
  const int64_t srow = stride / dv, scol = stride - srow * dv;
  for (; i < total; i += stride) {
    const int64_t v = static_cast<int64_t>(idx[row]);
    P val;
    if (v >= 0 && v < rows) {
      val = reinterpret_cast<const P*>(w)[v * dv + col];
    } else {
      bad.note(row, v);
#pragma unroll
      for (int k = 0; k < V; ++k) val.v[k] = from_accum<T>(accum_t<T>(0));
    }
    reinterpret_cast<P*>(y)[i] = val;
    col += scol;
    row += srow;
    if (col >= dv) {
      col -= dv;
      ++row;
    }
  }
  report_block(bad, err, kErrEmbeddingIndex, rows);
}

// Only checks the indices (the forward with D = 0 writes nothing but still rejects bad ones).
template <class I>
__global__ void __launch_bounds__(kBlock)
    check_indices_kernel(const I* idx, int64_t n, int64_t rows, int32_t code, DeviceErrorRecord* err) {
  pdl_begin();
  BadItem bad;
  PLX_GRID_STRIDE(i, n) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    if (v < 0 || v >= rows) bad.note(i, v);
  }
  report_block(bad, err, code, rows);
}

template <class T>
class EmbeddingKernel final : public Kernel {
 public:
  EmbeddingKernel(const NodeInfo& node, CudaBackend& backend)
      : device_(node.device()),
        err_(backend.context(device_).error_dev),
        wide_(node.input(1).dtype == PLX_I64),
        rows_(node.input(0).shape[0]),
        dim_(node.input(0).shape[1]) {}

  void compute(const KernelCall& call) override {
    use_device(device_);
    if (wide_)
      run(call, ptr<int64_t>(call.in(1)));
    else
      run(call, ptr<int32_t>(call.in(1)));
  }

 private:
  template <class I>
  void run(const KernelCall& call, const I* idx) {  // idx (...)
    const T* w = ptr<T>(call.in(0));                // (V, D)
    T* y = ptr<T>(call.out(0));                     // (..., D)
    const int64_t n = numel(call.in(1)), D = dim_;
    if (n == 0) return;
    const cudaStream_t s = native(call.stream);
    if (D == 0) {
      launch_kernel(check_indices_kernel<I>, grid_for(n), kBlock, 0, s, idx, n, rows_,
                    kErrEmbeddingIndex, err_);
      return;
    }
    constexpr int V = kVec<T>;
    if (D % V == 0 && aligned16(w) && aligned16(y)) {
      const int64_t dv = D / V;
      launch_kernel(embedding_kernel<T, I, V>, grid_for(n * dv), kBlock, 0, s, w, idx, y, n, rows_,
                    dv, err_);
    } else {
      launch_kernel(embedding_kernel<T, I, 1>, grid_for(n * D), kBlock, 0, s, w, idx, y, n, rows_,
                    D, err_);
    }
  }

  int32_t device_;
  DeviceErrorRecord* err_;
  bool wide_;
  int64_t rows_, dim_;
};

// dweight[v] = sum of dy[i] over the positions i with indices[i] == v, padding_idx's row zero.
// Deterministic without atomics, in three steps:
//   1. keys[i] = indices[i] (rows, a sentinel past the last row, for padding_idx and for bad
//      indices, which are reported), values[i] = i;
//   2. a stable radix sort of the (key, position) pairs (cub, in the workspace), so each row's
//      positions form one segment in increasing order;
//   3. each row's segment start by binary search (all rows in parallel), then one block per
//      row sums dy over its segment in position order, in f32, rounding once: the same
//      additions in the same order as the CPU kernel.
// Workspace: keys and positions twice (sort input and output), cub's scratch, sized at creation
// for this node's number of indices, and the rows + 1 segment starts.
constexpr uint64_t kAlign = 256;
inline uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

template <class I>
__global__ void __launch_bounds__(kBlock)
    embedding_keys_kernel(const I* idx, int64_t n, int64_t rows, int64_t padding, uint32_t* keys,
                          int32_t* positions, DeviceErrorRecord* err) {
  pdl_begin();
  BadItem bad;
  PLX_GRID_STRIDE(i, n) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    int64_t key = v;
    if (v < 0 || v >= rows) {
      bad.note(i, v);
      key = rows;
    } else if (v == padding) {
      key = rows;
    }
    keys[i] = static_cast<uint32_t>(key);
    positions[i] = static_cast<int32_t>(i);
  }
  report_block(bad, err, kErrEmbeddingBackwardIndex, rows);
}

// starts[v] = the first sorted position whose key is >= v, for v in [0, rows]: row v's segment
// is [starts[v], starts[v + 1]). One binary search per row, all rows in parallel.
__global__ void __launch_bounds__(kBlock)
    segment_starts_kernel(const uint32_t* keys, int64_t n, int64_t rows, int32_t* starts) {
  pdl_begin();
  PLX_GRID_STRIDE(v, rows + 1) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (static_cast<int64_t>(keys[mid]) < v)
        lo = mid + 1;
      else
        hi = mid;
    }
    starts[v] = static_cast<int32_t>(lo);
  }
}

// One block per row (grid-stride over rows); its threads split the columns and each sums its
// column over the row's segment in position order.
template <class T>
__global__ void __launch_bounds__(kBlock)
    embedding_rows_kernel(const T* dy, const int32_t* starts, const int32_t* positions,
                          int64_t rows, int64_t D, T* dw) {
  pdl_begin();
  for (int64_t v = blockIdx.x; v < rows; v += gridDim.x) {
    const int64_t begin = starts[v], end = starts[v + 1];
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      float acc = 0.f;
      for (int64_t q = begin; q < end; ++q)
        acc = __fadd_rn(acc, to_accum<T>(dy[static_cast<int64_t>(positions[q]) * D + j]));
      dw[v * D + j] = from_accum<T>(acc);
    }
  }
}

template <class T>
class EmbeddingBackwardKernel final : public Kernel {
 public:
  EmbeddingBackwardKernel(const NodeInfo& node, CudaBackend& backend)
      : device_(node.device()),
        err_(backend.context(device_).error_dev),
        wide_(node.input(1).dtype == PLX_I64),
        n_(numel(node.input(1))),
        rows_(node.attr_int("num_weights")),
        dim_(node.input(0).ndim > 0 ? node.input(0).shape[node.input(0).ndim - 1] : 0),
        padding_(node.attr_int("padding_idx")) {
    PLX_REQUIRE(rows_ >= 0, "embedding_backward: num_weights must be >= 0, got %lld",
                static_cast<long long>(rows_));
    // 32-bit keys (rows plus the sentinel) and positions keep the sort to the bits it needs.
    PLX_DECLINE_UNLESS(rows_ < (int64_t{1} << 31) - 1,
                       "embedding_backward: %lld rows, the CUDA kernel sorts 32-bit row indices",
                       static_cast<long long>(rows_));
    PLX_DECLINE_UNLESS(n_ < (int64_t{1} << 31),
                       "embedding_backward: %lld indices, the CUDA kernel sorts 32-bit positions",
                       static_cast<long long>(n_));
    end_bit_ = 1;
    while ((int64_t{1} << end_bit_) <= rows_) ++end_bit_;  // the sentinel `rows_` fits
    if (n_ > 0) {
      use_device(device_);
      size_t bytes = 0;
      PLX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
          nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
          static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
          static_cast<int>(n_), 0, end_bit_));
      sort_bytes_ = bytes;
    }
  }

  uint64_t workspace_bytes() const override {
    const uint64_t n = static_cast<uint64_t>(n_);
    return 2 * align_up(n * sizeof(uint32_t)) + 2 * align_up(n * sizeof(int32_t)) +
           align_up(sort_bytes_) + align_up(static_cast<uint64_t>(rows_ + 1) * sizeof(int32_t));
  }

  void compute(const KernelCall& call) override {
    use_device(device_);
    if (wide_)
      run(call, ptr<int64_t>(call.in(1)));
    else
      run(call, ptr<int32_t>(call.in(1)));
  }

 private:
  template <class I>
  void run(const KernelCall& call, const I* idx) {  // idx (...)
    const T* dy = ptr<T>(call.in(0));               // (..., D)
    T* dw = ptr<T>(call.out(0));                    // (V, D)
    const int64_t n = n_, V = rows_, D = dim_;
    const cudaStream_t s = native(call.stream);
    char* ws = static_cast<char*>(call.workspace);
    const uint64_t nk = align_up(static_cast<uint64_t>(n) * sizeof(uint32_t));
    const uint64_t np = align_up(static_cast<uint64_t>(n) * sizeof(int32_t));
    uint32_t* keys_in = reinterpret_cast<uint32_t*>(ws);
    uint32_t* keys = reinterpret_cast<uint32_t*>(ws + nk);
    int32_t* pos_in = reinterpret_cast<int32_t*>(ws + 2 * nk);
    int32_t* positions = reinterpret_cast<int32_t*>(ws + 2 * nk + np);
    void* scratch = ws + 2 * nk + 2 * np;
    int32_t* starts = reinterpret_cast<int32_t*>(ws + 2 * nk + 2 * np + align_up(sort_bytes_));
    if (n > 0) {
      launch_kernel(embedding_keys_kernel<I>, grid_for(n), kBlock, 0, s, idx, n, V, padding_,
                    keys_in, pos_in, err_);
    }
    if (V * D == 0) return;  // nothing to write; the indices were still checked
    if (n > 0) {
      size_t bytes = sort_bytes_;
      PLX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch, bytes, keys_in, keys, pos_in,
                                                     positions, static_cast<int>(n), 0, end_bit_,
                                                     s));
    }
    // With no indices every start is 0 and every row sums nothing: dweight is zeroed.
    launch_kernel(segment_starts_kernel, grid_for(V + 1), kBlock, 0, s, keys, n, V, starts);
    // Threads per block: D rounded up to whole warps, at most kBlock.
    const int threads = static_cast<int>(std::min<int64_t>(kBlock, (D + 31) / 32 * 32));
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(V, int64_t{1} << 16));
    launch_kernel(embedding_rows_kernel<T>, grid, threads, 0, s, dy, starts, positions, V, D, dw);
  }

  int32_t device_;
  DeviceErrorRecord* err_;
  bool wide_;
  int64_t n_, rows_, dim_, padding_;
  int end_bit_ = 1;
  uint64_t sort_bytes_ = 0;
};

// ---- registration ----

template <template <class> class K>
void add_float_kernels(KernelRegistry& r, const char* op, const char* impl, uint32_t flags) {
  r.add<K<float>, CudaBackend>(op, PLX_F32, impl, flags);
  r.add<K<f16>, CudaBackend>(op, PLX_F16, impl, flags);
  r.add<K<bf16>, CudaBackend>(op, PLX_BF16, impl, flags);
}

}  // namespace

void register_misc(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  // copy is what Tensor::contiguous() runs: it must take any strides. Pure data movement, one
  // kernel per element size.
  const uint32_t fs = f | PLX_KERNEL_STRIDED;
  r.add<CopyKernel<uint32_t>, CudaBackend>("copy", PLX_F32, "cuda", fs);
  r.add<CopyKernel<uint16_t>, CudaBackend>("copy", PLX_F16, "cuda", fs);
  r.add<CopyKernel<uint16_t>, CudaBackend>("copy", PLX_BF16, "cuda", fs);
  r.add<CopyKernel<uint64_t>, CudaBackend>("copy", PLX_F64, "cuda", fs);
  r.add<CopyKernel<uint32_t>, CudaBackend>("copy", PLX_I32, "cuda", fs);
  r.add<CopyKernel<uint64_t>, CudaBackend>("copy", PLX_I64, "cuda", fs);
  r.add<CopyKernel<uint8_t>, CudaBackend>("copy", PLX_U8, "cuda", fs);

  r.add<CastKernel<float>, CudaBackend>("cast", PLX_F32, "cuda", f);
  r.add<CastKernel<f16>, CudaBackend>("cast", PLX_F16, "cuda", f);
  r.add<CastKernel<bf16>, CudaBackend>("cast", PLX_BF16, "cuda", f);
  r.add<CastKernel<double>, CudaBackend>("cast", PLX_F64, "cuda", f);
  r.add<CastKernel<int32_t>, CudaBackend>("cast", PLX_I32, "cuda", f);
  r.add<CastKernel<int64_t>, CudaBackend>("cast", PLX_I64, "cuda", f);
  r.add<CastKernel<uint8_t>, CudaBackend>("cast", PLX_U8, "cuda", f);

  add_float_kernels<DropoutKernel>(r, "dropout", "philox", f);
  add_float_kernels<DropoutBackwardKernel>(r, "dropout_backward", "cuda", f | PLX_KERNEL_INPLACE);
  add_float_kernels<EmbeddingKernel>(r, "embedding", "cuda", f);
  add_float_kernels<EmbeddingBackwardKernel>(r, "embedding_backward", "radix-sort+segments", f);
}

}  // namespace plexus::cuda
