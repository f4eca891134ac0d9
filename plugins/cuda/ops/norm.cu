// CUDA kernels: batch_norm (and batch_norm_apply), layer_norm and their backward ops (see
// docs/ops.md).
//
// Statistics accumulate in f32 (the CPU uses f64): batch_norm's mean and variance with Welford's
// update per thread and Chan's merge between threads, which does not cancel when the mean is
// large against the spread (the reason the CPU takes two passes); layer_norm's in two passes over
// a row, which a team of threads holds in cache. Every reduction runs in a fixed order: threads
// visit their elements in index order, then fixed shuffle trees, warps, thread rows and chunks
// are combined in order. Launch geometry is fixed at creation, so results are bit-identical run
// to run; there are no atomics.
//
// batch_norm's per-channel reductions run over N x S elements (S = product of the spatial
// dims), split into P chunks so that small C still fills the GPU. Two layouts:
//  - planes (S >= 32): one 256-thread block per (channel, chunk) walks the channel's elements in
//    (n, s) order, consecutive threads on consecutive s (coalesced);
//  - columns (S < 32, e.g. (N, C) activations): a 32 x 8 block takes 32 neighbouring channels
//    (adjacent in memory when S = 1), its 8 rows of threads splitting the chunk.
// Each (chunk, channel) writes a partial to the workspace; a per-channel kernel merges the chunks
// in order and leaves per-channel coefficients in the workspace for the elementwise pass.
//
// gamma, beta and the running statistics may be f32 while x is f16/bf16; save_mean/save_invstd
// and layer_norm's mean/invstd are f32.
#include <cmath>

#include "device.cuh"

namespace plexus::cuda {

namespace {

constexpr int kColX = 32, kColY = 8;
constexpr int64_t kMaxGrid = int64_t{1} << 30;   // kernels loop past this many blocks
constexpr int64_t kPlanesChunk = 4096;           // fewest elements a planes chunk gets
constexpr int64_t kColsChunk = 128;              // fewest elements per channel a columns chunk gets
constexpr int64_t kPlanesMinSpatial = 32;        // S from which the planes layout is used

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
uint64_t align_up(uint64_t b) { return (b + 255) & ~uint64_t{255}; }
unsigned clamp_grid(int64_t blocks) {
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxGrid));
}
// Chunks for `units` blocks over `len` elements each: about `target` blocks in all, each chunk
// at least `min_len` long (gridDim.y <= 65535).
int64_t pick_chunks(int64_t units, int64_t len, int64_t min_len, int64_t target) {
  if (units >= target || len < 2 * min_len) return 1;
  return std::clamp<int64_t>(std::min(ceil_div(target, units), len / min_len), 1, 65535);
}
int sm_count(CudaBackend& b, int32_t device) {
  return b.context(device).prop.multiProcessorCount;
}

// ---- parameters: T or f32, possibly absent ----

template <class T>
struct ParamIn {
  const void* p = nullptr;  // nullptr: absent
  bool f32 = true;
  __device__ __forceinline__ float get(int64_t i, float absent) const {
    if (!p) return absent;
    return f32 ? static_cast<const float*>(p)[i] : to_accum<T>(static_cast<const T*>(p)[i]);
  }
};
template <class T>
struct ParamOut {
  void* p = nullptr;
  bool f32 = true;
  __device__ __forceinline__ void set(int64_t i, float v) const {
    if (f32) static_cast<float*>(p)[i] = v;
    else store(static_cast<T*>(p), i, v);
  }
};
template <class T>
ParamIn<T> param_in(const KernelCall& c, int32_t i) {
  if (!c.has_in(i)) return {};
  return {c.in(i).data, c.in(i).dtype == PLX_F32};
}
template <class T>
ParamOut<T> param_out(const plx_tensor& t) {
  return {t.data, t.dtype == PLX_F32};
}
// ---- fixed-order reductions of a State with merge() and shfl_down() ----

template <class Acc>
__device__ __forceinline__ typename Acc::State warp_merge(typename Acc::State v) {
  for (int o = 16; o > 0; o >>= 1) v = Acc::merge(v, Acc::shfl_down(v, o));
  return v;
}
// The block's states merged into thread 0 (1-D block).
template <class Acc>
__device__ __forceinline__ typename Acc::State block_merge(typename Acc::State v,
                                                          typename Acc::State* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_merge<Acc>(v);
  __syncthreads();  // the previous call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : Acc::init();
    v = warp_merge<Acc>(v);
  }
  return v;
}

// Count, mean and sum of squared deviations of a set of values.
struct Moments {
  float n, mean, m2;
};

// batch_norm: moments of x per channel.
template <class T>
struct MomentsAcc {
  using State = Moments;
  const T* x;
  static __device__ __forceinline__ State init() { return {0.f, 0.f, 0.f}; }
  __device__ __forceinline__ float channel(int64_t) const { return 0.f; }
  // Welford's update.
  __device__ __forceinline__ void push(State& s, int64_t i, float) const {
    const float v = load(x, i);
    s.n += 1.f;
    const float d = v - s.mean;
    s.mean += d / s.n;
    s.m2 += d * (v - s.mean);
  }
  // Chan's merge (b after a).
  static __device__ __forceinline__ State merge(State a, State b) {
    if (b.n == 0.f) return a;
    if (a.n == 0.f) return b;
    const float n = a.n + b.n, d = b.mean - a.mean, w = b.n / n;
    return {n, a.mean + d * w, a.m2 + b.m2 + d * d * a.n * w};
  }
  static __device__ __forceinline__ State shfl_down(State s, int o) {
    return {__shfl_down_sync(0xffffffffu, s.n, o), __shfl_down_sync(0xffffffffu, s.mean, o),
            __shfl_down_sync(0xffffffffu, s.m2, o)};
  }
};

// Two sums.
struct Sums2 {
  float a, b;
};

// batch_norm_backward: sum(dy) and sum(dy (x - mean)) per channel.
template <class T>
struct GradAcc {
  using State = Sums2;
  const T* dy;
  const T* x;
  const float* mean;  // (C)
  static __device__ __forceinline__ State init() { return {0.f, 0.f}; }
  __device__ __forceinline__ float channel(int64_t c) const { return mean[c]; }
  __device__ __forceinline__ void push(State& s, int64_t i, float m) const {
    const float g = load(dy, i);
    s.a += g;
    s.b += g * (load(x, i) - m);
  }
  static __device__ __forceinline__ State merge(State a, State b) { return {a.a + b.a, a.b + b.b}; }
  static __device__ __forceinline__ State shfl_down(State s, int o) {
    return {__shfl_down_sync(0xffffffffu, s.a, o), __shfl_down_sync(0xffffffffu, s.b, o)};
  }
};

// ---- per-channel partials over (N, C, S) ----
// Chunk blockIdx.y covers the channel's elements m in [m0, m1), m = n * S + s. A thread keeps its
// (n, s) and steps it by the thread count without dividing: step = (step_n, step_s).

template <class Acc>
__global__ void __launch_bounds__(kBlock)
    channel_planes(Acc acc, typename Acc::State* __restrict__ partial, int64_t N, int64_t C,
                   int64_t S, int64_t chunk_len) {
  pdl_begin();
  using St = typename Acc::State;
  __shared__ St shared[32];
  const int64_t M = N * S;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * chunk_len, m1 = min(M, m0 + chunk_len);
  const int64_t step_n = blockDim.x / S, step_s = blockDim.x % S;
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {  // uniform over the block
    const float k = acc.channel(c);
    St st = Acc::init();
    int64_t m = m0 + threadIdx.x;
    int64_t n = m / S, s = m - n * S;
    for (; m < m1; m += blockDim.x) {
      acc.push(st, (n * C + c) * S + s, k);
      n += step_n;
      s += step_s;
      if (s >= S) {
        s -= S;
        ++n;
      }
    }
    st = block_merge<Acc>(st, shared);
    if (threadIdx.x == 0) partial[static_cast<int64_t>(blockIdx.y) * C + c] = st;
  }
}

template <class Acc>
__global__ void __launch_bounds__(kColX* kColY)
    channel_cols(Acc acc, typename Acc::State* __restrict__ partial, int64_t N, int64_t C,
                 int64_t S, int64_t chunk_len) {
  pdl_begin();
  using St = typename Acc::State;
  __shared__ St shared[kColY][kColX];
  const int64_t M = N * S;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * chunk_len, m1 = min(M, m0 + chunk_len);
  const int64_t step_n = kColY / S, step_s = kColY % S;
  const int64_t tiles = (C + kColX - 1) / kColX;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform over the block
    const int64_t c = t * kColX + threadIdx.x;
    St st = Acc::init();
    if (c < C) {
      const float k = acc.channel(c);
      int64_t m = m0 + threadIdx.y;
      int64_t n = m / S, s = m - n * S;
      for (; m < m1; m += kColY) {
        acc.push(st, (n * C + c) * S + s, k);
        n += step_n;
        s += step_s;
        if (s >= S) {
          s -= S;
          ++n;
        }
      }
    }
    shared[threadIdx.y][threadIdx.x] = st;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
      for (int j = 1; j < kColY; ++j) st = Acc::merge(st, shared[j][threadIdx.x]);
      partial[static_cast<int64_t>(blockIdx.y) * C + c] = st;
    }
    __syncthreads();  // before the next tile overwrites `shared`
  }
}

// How a batch_norm call splits its per-channel reductions.
struct ChannelPlan {
  int64_t n = 0, c = 0, s = 1;  // x (N, C, S)
  bool planes = true;
  int64_t chunks = 1, chunk_len = 1;

  ChannelPlan(const plx_tensor& x, int sms) : n(x.shape[0]), c(x.shape[1]) {
    for (int32_t i = 2; i < x.ndim; ++i) s *= x.shape[i];
    if (s == 0) {  // no element either way; keeps the kernels' divisions by S defined
      n = 0;
      s = 1;
    }
    const int64_t m = n * s, target = 4 * static_cast<int64_t>(std::max(sms, 1));
    planes = s >= kPlanesMinSpatial;
    const int64_t units = planes ? c : ceil_div(c, kColX);
    chunks = pick_chunks(units, m, planes ? kPlanesChunk : kColsChunk, target);
    chunk_len = std::max<int64_t>(ceil_div(m, chunks), 1);
    chunks = std::max<int64_t>(ceil_div(m, chunk_len), 1);  // no empty chunk
  }
  int64_t per_channel() const { return n * s; }
  int64_t total() const { return n * c * s; }

  template <class Acc>
  void launch(const Acc& acc, typename Acc::State* partial, cudaStream_t st) const {
    if (planes) {
      launch_kernel(channel_planes<Acc>, dim3(clamp_grid(c), static_cast<unsigned>(chunks)), kBlock,
                    0, st, acc, partial, n, c, s, chunk_len);
    } else {
      launch_kernel(channel_cols<Acc>,
                    dim3(clamp_grid(ceil_div(c, kColX)), static_cast<unsigned>(chunks)),
                    dim3(kColX, kColY), 0, st, acc, partial, n, c, s, chunk_len);
    }
  }
};

// ---- batch_norm ----

// Per channel, training: merges the chunks' moments in order, updates the running statistics
// (unbiased variance, PyTorch's rule) and writes save_mean/save_invstd. Eval: the running
// statistics are the ones normalised with. Both leave coef = (mean, scale, shift) per channel
// for bn_apply, formed as the CPU forms them (f64 products of the saved f32 values).
template <class T>
__global__ void bn_finalize(const Moments* __restrict__ partial, int64_t chunks, int64_t C,
                            int64_t M, bool training, ParamIn<T> gamma, ParamIn<T> beta,
                            ParamIn<T> rm_in, ParamIn<T> rv_in, ParamOut<T> rm_out,
                            ParamOut<T> rv_out, bool has_running, double momentum, double eps,
                            float* __restrict__ save_mean, float* __restrict__ save_invstd,
                            float* __restrict__ coef) {
  pdl_begin();
  PLX_GRID_STRIDE(c, C) {
    double mean, var;
    if (training) {
      Moments m = partial[c];
      for (int64_t p = 1; p < chunks; ++p) m = MomentsAcc<T>::merge(m, partial[p * C + c]);
      mean = m.mean;
      const double m2 = fmax(static_cast<double>(m.m2), 0.0);
      var = m2 / static_cast<double>(M);  // biased: what the batch is normalised with
      if (has_running) {
        const double unbiased = m2 / static_cast<double>(M - 1);
        rm_out.set(c, static_cast<float>((1 - momentum) * rm_in.get(c, 0.f) + momentum * mean));
        rv_out.set(c, static_cast<float>((1 - momentum) * rv_in.get(c, 0.f) + momentum * unbiased));
      }
    } else {
      mean = rm_in.get(c, 0.f);
      var = rv_in.get(c, 0.f);
    }
    const float mean_f = static_cast<float>(mean);
    const float invstd_f = static_cast<float>(1.0 / sqrt(var + eps));
    save_mean[c] = mean_f;
    save_invstd[c] = invstd_f;
    coef[c] = mean_f;
    coef[C + c] = static_cast<float>(static_cast<double>(invstd_f) * gamma.get(c, 1.f));
    coef[2 * C + c] = beta.get(c, 0.f);
  }
}

// y = (x - mean) * scale + shift; I is the index type (32 bits when the tensor allows).
template <class T, class I>
__global__ void bn_apply(const T* __restrict__ x, T* __restrict__ y,
                         const float* __restrict__ coef, I total, I S, I C) {
  pdl_begin();
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    const I c = i / S % C;
    store(y, i, (load(x, i) - coef[c]) * coef[C + c] + coef[2 * C + c]);
  }
}

// Whether 32-bit indices cover a grid-stride loop over n elements (no wrap-around).
bool fits_u32(int64_t n) { return n < (int64_t{1} << 31); }

template <class T>
class BatchNormKernel final : public Kernel {
 public:
  BatchNormKernel(const NodeInfo& node, CudaBackend& b)
      : device_(node.device()),
        plan_(node.input(0), sm_count(b, node.device())),
        training_(node.attr_int("training") != 0),
        momentum_(node.attr_float("momentum")),
        eps_(node.attr_float("eps")) {
    for (int32_t i = 1; i <= 4; ++i) {
      if (!node.has_input(i)) continue;
      PLX_REQUIRE(node.input(i).dtype == PLX_F32 || node.input(i).dtype == dtype_v<T>,
                  "batch_norm: input %d has dtype %s", i, dtype_name(node.input(i).dtype));
    }
  }

  // The chunks' moments (training), then coef (3, C).
  uint64_t workspace_bytes() const override { return coef_offset() + 3 * plan_.c * sizeof(float); }

  void compute(const KernelCall& call) override {
    const ChannelPlan& p = plan_;
    if (p.c == 0) return;
    use_device(device_);
    const cudaStream_t s = native(call.stream);
    const T* x = ptr<const T>(call.in(0));  // (N, C, S)
    T* y = ptr<T>(call.out(0));             // (N, C, S)
    auto* ws = static_cast<unsigned char*>(call.workspace);
    auto* partial = reinterpret_cast<Moments*>(ws);
    auto* coef = reinterpret_cast<float*>(ws + coef_offset());
    if (training_) p.launch(MomentsAcc<T>{x}, partial, s);
    const bool has_running = call.has_in(3);
    const plx_tensor none{};
    launch_kernel(bn_finalize<T>, grid_for(p.c), kBlock, 0, s, partial, p.chunks, p.c,
                  p.per_channel(), training_, param_in<T>(call, 1), param_in<T>(call, 2),
                  param_in<T>(call, 3), param_in<T>(call, 4),
                  param_out<T>(has_running ? call.in(3) : none),
                  param_out<T>(has_running ? call.in(4) : none), has_running, momentum_, eps_,
                  ptr<float>(call.out(1)), ptr<float>(call.out(2)), coef);
    const int64_t total = p.total();
    if (total == 0) return;
    if (fits_u32(total))
      launch_kernel(bn_apply<T, uint32_t>, grid_for(total), kBlock, 0, s, x, y, coef,
                    static_cast<uint32_t>(total), static_cast<uint32_t>(p.s),
                    static_cast<uint32_t>(p.c));
    else
      launch_kernel(bn_apply<T, uint64_t>, grid_for(total), kBlock, 0, s, x, y, coef,
                    static_cast<uint64_t>(total), static_cast<uint64_t>(p.s),
                    static_cast<uint64_t>(p.c));
  }

 private:
  uint64_t coef_offset() const {
    return training_ ? align_up(static_cast<uint64_t>(plan_.chunks * plan_.c) * sizeof(Moments))
                     : 0;
  }

  int32_t device_;
  ChannelPlan plan_;
  bool training_;
  double momentum_, eps_;
};

// ---- batch_norm_apply ----

// coef = (mean, scale, shift) per channel from given statistics, formed as bn_finalize forms it,
// so that batch_norm_apply on batch_norm's save_mean/save_invstd gives its output to the bit.
template <class T>
__global__ void bn_apply_coef(const float* __restrict__ mean, const float* __restrict__ invstd,
                              ParamIn<T> gamma, ParamIn<T> beta, int64_t C,
                              float* __restrict__ coef) {
  pdl_begin();
  PLX_GRID_STRIDE(c, C) {
    coef[c] = mean[c];
    coef[C + c] = static_cast<float>(static_cast<double>(invstd[c]) * gamma.get(c, 1.f));
    coef[2 * C + c] = beta.get(c, 0.f);
  }
}

template <class T>
class BatchNormApplyKernel final : public Kernel {
 public:
  BatchNormApplyKernel(const NodeInfo& node, CudaBackend&)
      : device_(node.device()), c_(node.input(0).shape[1]) {
    const plx_tensor& x = node.input(0);
    for (int32_t i = 2; i < x.ndim; ++i) s_ *= x.shape[i];
    total_ = x.shape[0] * c_ * s_;
    for (int32_t i = 1; i <= 2; ++i) {
      if (!node.has_input(i)) continue;
      PLX_REQUIRE(node.input(i).dtype == PLX_F32 || node.input(i).dtype == dtype_v<T>,
                  "batch_norm_apply: input %d has dtype %s", i, dtype_name(node.input(i).dtype));
    }
    for (int32_t i = 3; i <= 4; ++i)
      PLX_REQUIRE(node.input(i).dtype == PLX_F32, "batch_norm_apply: input %d has dtype %s", i,
                  dtype_name(node.input(i).dtype));
  }

  uint64_t workspace_bytes() const override {
    return 3 * static_cast<uint64_t>(c_) * sizeof(float);
  }

  void compute(const KernelCall& call) override {
    if (c_ == 0 || total_ == 0) return;
    use_device(device_);
    const cudaStream_t s = native(call.stream);
    auto* coef = static_cast<float*>(call.workspace);
    launch_kernel(bn_apply_coef<T>, grid_for(c_), kBlock, 0, s, ptr<const float>(call.in(3)),
                  ptr<const float>(call.in(4)), param_in<T>(call, 1), param_in<T>(call, 2), c_,
                  coef);
    const T* x = ptr<const T>(call.in(0));
    T* y = ptr<T>(call.out(0));
    if (fits_u32(total_))
      launch_kernel(bn_apply<T, uint32_t>, grid_for(total_), kBlock, 0, s, x, y, coef,
                    static_cast<uint32_t>(total_), static_cast<uint32_t>(s_),
                    static_cast<uint32_t>(c_));
    else
      launch_kernel(bn_apply<T, uint64_t>, grid_for(total_), kBlock, 0, s, x, y, coef,
                    static_cast<uint64_t>(total_), static_cast<uint64_t>(s_),
                    static_cast<uint64_t>(c_));
  }

 private:
  int32_t device_;
  int64_t c_, s_ = 1, total_ = 0;
};

// ---- batch_norm_backward ----

// Per channel: merges the chunks' sums in order, writes dbeta = sum(dy) and dgamma =
// sum(dy xhat), and leaves coef = (k, mean, invstd, mean(dy), mean(dy xhat)) for bn_dx, where
// k = gamma invstd; the means are 0 in eval mode, where the statistics are constants.
template <class T>
__global__ void bn_backward_finalize(const Sums2* __restrict__ partial, int64_t chunks, int64_t C,
                                     int64_t M, bool training, ParamIn<T> gamma,
                                     const float* __restrict__ mean,
                                     const float* __restrict__ invstd, ParamOut<T> dgamma,
                                     ParamOut<T> dbeta, float* __restrict__ coef) {
  pdl_begin();
  PLX_GRID_STRIDE(c, C) {
    Sums2 t = partial[c];
    for (int64_t p = 1; p < chunks; ++p) t = GradAcc<T>::merge(t, partial[p * C + c]);
    const float is = invstd[c];
    const float sum_dy = t.a, sum_dy_xhat = t.b * is;
    dbeta.set(c, sum_dy);
    dgamma.set(c, sum_dy_xhat);
    coef[c] = static_cast<float>(static_cast<double>(is) * gamma.get(c, 1.f));
    coef[C + c] = mean[c];
    coef[2 * C + c] = is;
    coef[3 * C + c] = training ? static_cast<float>(sum_dy / static_cast<double>(M)) : 0.f;
    coef[4 * C + c] = training ? static_cast<float>(sum_dy_xhat / static_cast<double>(M)) : 0.f;
  }
}

// dx = k (dy - mean(dy) - xhat mean(dy xhat)), xhat = (x - mean) invstd.
template <class T, class I>
__global__ void bn_dx(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                      const float* __restrict__ coef, I total, I S, I C) {
  pdl_begin();
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    const I c = i / S % C;
    const float xhat = (load(x, i) - coef[C + c]) * coef[2 * C + c];
    store(dx, i, coef[c] * (load(dy, i) - coef[3 * C + c] - xhat * coef[4 * C + c]));
  }
}

template <class T>
class BatchNormBackwardKernel final : public Kernel {
 public:
  BatchNormBackwardKernel(const NodeInfo& node, CudaBackend& b)
      : device_(node.device()),
        plan_(node.input(1), sm_count(b, node.device())),
        training_(node.attr_int("training") != 0) {
    if (node.has_input(2))
      PLX_REQUIRE(node.input(2).dtype == PLX_F32 || node.input(2).dtype == dtype_v<T>,
                  "batch_norm_backward: gamma has dtype %s", dtype_name(node.input(2).dtype));
  }

  // The chunks' sums, then coef (5, C).
  uint64_t workspace_bytes() const override { return coef_offset() + 5 * plan_.c * sizeof(float); }

  void compute(const KernelCall& call) override {
    const ChannelPlan& p = plan_;
    if (p.c == 0) return;
    use_device(device_);
    const cudaStream_t s = native(call.stream);
    const T* dy = ptr<const T>(call.in(0));         // (N, C, S)
    const T* x = ptr<const T>(call.in(1));          // (N, C, S)
    const float* mean = ptr<const float>(call.in(3));    // (C)
    const float* invstd = ptr<const float>(call.in(4));  // (C)
    T* dx = ptr<T>(call.out(0));                    // (N, C, S)
    auto* ws = static_cast<unsigned char*>(call.workspace);
    auto* partial = reinterpret_cast<Sums2*>(ws);
    auto* coef = reinterpret_cast<float*>(ws + coef_offset());
    p.launch(GradAcc<T>{dy, x, mean}, partial, s);
    launch_kernel(bn_backward_finalize<T>, grid_for(p.c), kBlock, 0, s, partial, p.chunks, p.c,
                  p.per_channel(), training_, param_in<T>(call, 2), mean, invstd,
                  param_out<T>(call.out(1)), param_out<T>(call.out(2)), coef);
    const int64_t total = p.total();
    if (total == 0) return;
    if (fits_u32(total))
      launch_kernel(bn_dx<T, uint32_t>, grid_for(total), kBlock, 0, s, dy, x, dx, coef,
                    static_cast<uint32_t>(total), static_cast<uint32_t>(p.s),
                    static_cast<uint32_t>(p.c));
    else
      launch_kernel(bn_dx<T, uint64_t>, grid_for(total), kBlock, 0, s, dy, x, dx, coef,
                    static_cast<uint64_t>(total), static_cast<uint64_t>(p.s),
                    static_cast<uint64_t>(p.c));
  }

 private:
  uint64_t coef_offset() const {
    return align_up(static_cast<uint64_t>(plan_.chunks * plan_.c) * sizeof(Sums2));
  }

  int32_t device_;
  ChannelPlan plan_;
  bool training_;
};

// ---- layer_norm ----

// x (..., D) seen as (R, D).
struct RowsCols {
  int64_t rows = 1, cols = 1;
  RowsCols(const plx_tensor& x, int64_t normalized_ndim) {
    for (int32_t i = 0; i < x.ndim; ++i) (i < x.ndim - normalized_ndim ? rows : cols) *= x.shape[i];
  }
};

// Threads per row: a warp up to 1024 elements, else the block.
int team_for(int64_t len) { return len <= 1024 ? 32 : kBlock; }
unsigned row_blocks(int64_t rows, int team) {
  return clamp_grid(ceil_div(rows, kBlock / team));
}

template <int kTeam>
__device__ __forceinline__ float team_sum(float v, float* shared) {
  if constexpr (kTeam == 32) return warp_sum(v);
  else return block_sum(v, shared);
}

// Row r: mean, invstd = 1/sqrt(var + eps) (two passes), y = (x - mean) invstd gamma + beta.
// An empty row (D = 0) has mean and invstd nan, as on the CPU.
template <class T, int kTeam>
__global__ void __launch_bounds__(kBlock)
    ln_forward(const T* __restrict__ x, T* __restrict__ y, float* __restrict__ mean_out,
               float* __restrict__ invstd_out, ParamIn<T> gamma, ParamIn<T> beta, int64_t R,
               int64_t D, double eps) {
  pdl_begin();
  __shared__ float shared[32];
  constexpr int kTeams = kBlock / kTeam;
  const int lane = static_cast<int>(threadIdx.x) % kTeam;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam; r < R;
       r += static_cast<int64_t>(gridDim.x) * kTeams) {  // uniform over the team
    const T* src = x + r * D;
    T* dst = y + r * D;
    float sum = 0.f;
    for (int64_t j = lane; j < D; j += kTeam) sum += load(src, j);
    const float m = team_sum<kTeam>(sum, shared) / static_cast<float>(D);
    float sq = 0.f;
    for (int64_t j = lane; j < D; j += kTeam) {
      const float d = load(src, j) - m;
      sq += d * d;
    }
    const float var = team_sum<kTeam>(sq, shared) / static_cast<float>(D);
    const float is = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + eps));
    if (lane == 0) {
      mean_out[r] = m;
      invstd_out[r] = is;
    }
    for (int64_t j = lane; j < D; j += kTeam)
      store(dst, j, (load(src, j) - m) * is * gamma.get(j, 1.f) + beta.get(j, 0.f));
  }
}

template <class T>
class LayerNormKernel final : public Kernel {
 public:
  LayerNormKernel(const NodeInfo& node, CudaBackend&)
      : device_(node.device()),
        dims_(node.input(0), node.attr_int("normalized_ndim")),
        eps_(node.attr_float("eps")) {
    for (int32_t i = 1; i <= 2; ++i) {
      if (!node.has_input(i)) continue;
      PLX_REQUIRE(node.input(i).dtype == PLX_F32 || node.input(i).dtype == dtype_v<T>,
                  "layer_norm: input %d has dtype %s", i, dtype_name(node.input(i).dtype));
    }
  }

  void compute(const KernelCall& call) override {
    const int64_t R = dims_.rows, D = dims_.cols;
    if (R == 0) return;
    use_device(device_);
    const cudaStream_t s = native(call.stream);
    const T* x = ptr<const T>(call.in(0));        // (R, D)
    T* y = ptr<T>(call.out(0));                   // (R, D)
    float* mean = ptr<float>(call.out(1));        // (R)
    float* invstd = ptr<float>(call.out(2));      // (R)
    const ParamIn<T> gamma = param_in<T>(call, 1), beta = param_in<T>(call, 2);
    if (team_for(D) == 32)
      launch_kernel(ln_forward<T, 32>, row_blocks(R, 32), kBlock, 0, s, x, y, mean, invstd, gamma,
                    beta, R, D, eps_);
    else
      launch_kernel(ln_forward<T, kBlock>, row_blocks(R, kBlock), kBlock, 0, s, x, y, mean, invstd,
                    gamma, beta, R, D, eps_);
  }

 private:
  int32_t device_;
  RowsCols dims_;
  double eps_;
};

// ---- layer_norm_backward ----

// dx row by row: dx = invstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma.
template <class T, int kTeam>
__global__ void __launch_bounds__(kBlock)
    ln_backward_dx(const T* __restrict__ dy, const T* __restrict__ x,
                   const float* __restrict__ mean, const float* __restrict__ invstd,
                   ParamIn<T> gamma, T* __restrict__ dx, int64_t R, int64_t D) {
  pdl_begin();
  __shared__ float shared[32];
  constexpr int kTeams = kBlock / kTeam;
  const int lane = static_cast<int>(threadIdx.x) % kTeam;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam; r < R;
       r += static_cast<int64_t>(gridDim.x) * kTeams) {
    const int64_t off = r * D;
    const float m = mean[r], is = invstd[r];
    float sg = 0.f, sgx = 0.f;  // sum(g), sum(g (x - mean))
    for (int64_t j = lane; j < D; j += kTeam) {
      const float g = load(dy, off + j) * gamma.get(j, 1.f);
      sg += g;
      sgx += g * (load(x, off + j) - m);
    }
    const float m_g = team_sum<kTeam>(sg, shared) / static_cast<float>(D);
    const float m_gx = team_sum<kTeam>(sgx, shared) * is / static_cast<float>(D);
    // Rounded term by term, as the CPU reference does (no fused multiply-add): g - m_g is exactly
    // 0 for a one-element row, and an unrounded product would leave noise times invstd there.
    for (int64_t j = lane; j < D; j += kTeam) {
      const float xhat = __fmul_rn(__fsub_rn(load(x, off + j), m), is);
      const float g = __fmul_rn(load(dy, off + j), gamma.get(j, 1.f));
      store(dx, off + j, __fmul_rn(is, __fsub_rn(__fsub_rn(g, m_g), __fmul_rn(xhat, m_gx))));
    }
  }
}

// dgamma = sum over rows of dy xhat, dbeta = sum of dy: column sums. A 32 x 8 block takes 32
// neighbouring columns (tile blockIdx.x, looping) and the rows of chunk blockIdx.y, threadIdx.y
// splitting them; the 8 partials are added in threadIdx.y order. With one chunk the block
// writes the outputs, else its partials (chunk-major) for ln_params_finalize.
template <class T>
__global__ void __launch_bounds__(kColX* kColY)
    ln_params(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
              const float* __restrict__ invstd, Sums2* __restrict__ partial, ParamOut<T> dgamma,
              ParamOut<T> dbeta, int64_t R, int64_t D, int64_t chunk_len) {
  pdl_begin();
  __shared__ Sums2 shared[kColY][kColX];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_len, r1 = min(R, r0 + chunk_len);
  const int64_t tiles = (D + kColX - 1) / kColX;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform over the block
    const int64_t j = t * kColX + threadIdx.x;
    Sums2 st{0.f, 0.f};  // sum(dy), sum(dy xhat)
    if (j < D) {
      for (int64_t r = r0 + threadIdx.y; r < r1; r += kColY) {
        const float g = load(dy, r * D + j);
        st.a += g;
        st.b += g * ((load(x, r * D + j) - mean[r]) * invstd[r]);
      }
    }
    shared[threadIdx.y][threadIdx.x] = st;
    __syncthreads();
    if (threadIdx.y == 0 && j < D) {
      for (int k = 1; k < kColY; ++k) st = GradAcc<T>::merge(st, shared[k][threadIdx.x]);
      if (partial) {
        partial[static_cast<int64_t>(blockIdx.y) * D + j] = st;
      } else {
        dgamma.set(j, st.b);
        dbeta.set(j, st.a);
      }
    }
    __syncthreads();  // before the next tile overwrites `shared`
  }
}

template <class T>
__global__ void ln_params_finalize(const Sums2* __restrict__ partial, int64_t chunks, int64_t D,
                                   ParamOut<T> dgamma, ParamOut<T> dbeta) {
  pdl_begin();
  PLX_GRID_STRIDE(j, D) {
    Sums2 t = partial[j];
    for (int64_t p = 1; p < chunks; ++p) t = GradAcc<T>::merge(t, partial[p * D + j]);
    dgamma.set(j, t.b);
    dbeta.set(j, t.a);
  }
}

template <class T>
class LayerNormBackwardKernel final : public Kernel {
 public:
  LayerNormBackwardKernel(const NodeInfo& node, CudaBackend& b)
      : device_(node.device()), dims_(node.input(1), node.attr_int("normalized_ndim")) {
    if (node.has_input(2))
      PLX_REQUIRE(node.input(2).dtype == PLX_F32 || node.input(2).dtype == dtype_v<T>,
                  "layer_norm_backward: gamma has dtype %s", dtype_name(node.input(2).dtype));
    const int64_t R = dims_.rows, D = dims_.cols;
    const int64_t target = 4 * static_cast<int64_t>(std::max(sm_count(b, node.device()), 1));
    chunks_ = pick_chunks(ceil_div(D, kColX), R, kColsChunk, target);
    chunk_len_ = std::max<int64_t>(ceil_div(R, chunks_), 1);
    chunks_ = std::max<int64_t>(ceil_div(R, chunk_len_), 1);  // no empty chunk
  }

  // The chunks' column sums, when the rows are split.
  uint64_t workspace_bytes() const override {
    return chunks_ > 1 ? static_cast<uint64_t>(chunks_ * dims_.cols) * sizeof(Sums2) : 0;
  }

  void compute(const KernelCall& call) override {
    const int64_t R = dims_.rows, D = dims_.cols;
    if (D == 0) return;  // no element in dx, dgamma or dbeta
    use_device(device_);
    const cudaStream_t s = native(call.stream);
    const T* dy = ptr<const T>(call.in(0));             // (R, D)
    const T* x = ptr<const T>(call.in(1));              // (R, D)
    const float* mean = ptr<const float>(call.in(3));    // (R)
    const float* invstd = ptr<const float>(call.in(4));  // (R)
    T* dx = ptr<T>(call.out(0));                        // (R, D)
    const ParamOut<T> dgamma = param_out<T>(call.out(1)), dbeta = param_out<T>(call.out(2));
    if (R > 0) {
      const ParamIn<T> gamma = param_in<T>(call, 2);
      if (team_for(D) == 32)
        launch_kernel(ln_backward_dx<T, 32>, row_blocks(R, 32), kBlock, 0, s, dy, x, mean, invstd,
                      gamma, dx, R, D);
      else
        launch_kernel(ln_backward_dx<T, kBlock>, row_blocks(R, kBlock), kBlock, 0, s, dy, x, mean,
                      invstd, gamma, dx, R, D);
    }
    Sums2* partial = chunks_ > 1 ? static_cast<Sums2*>(call.workspace) : nullptr;
    launch_kernel(
        ln_params<T>, dim3(clamp_grid(ceil_div(D, kColX)), static_cast<unsigned>(chunks_)),
        dim3(kColX, kColY), 0, s, dy, x, mean, invstd, partial, dgamma, dbeta, R, D, chunk_len_);
    if (partial) {
      launch_kernel(ln_params_finalize<T>, grid_for(D), kBlock, 0, s, partial, chunks_, D, dgamma,
                    dbeta);
    }
  }

 private:
  int32_t device_;
  RowsCols dims_;
  int64_t chunks_ = 1, chunk_len_ = 1;
};

template <template <class> class K>
void add_float(KernelRegistry& r, const char* op, const char* impl, uint32_t flags) {
  r.add<K<float>, CudaBackend>(op, PLX_F32, impl, flags);
  r.add<K<f16>, CudaBackend>(op, PLX_F16, impl, flags);
  r.add<K<bf16>, CudaBackend>(op, PLX_BF16, impl, flags);
}

}  // namespace

void register_norm(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float<BatchNormKernel>(r, "batch_norm", "cuda", f);
  add_float<BatchNormApplyKernel>(r, "batch_norm_apply", "cuda", f);
  add_float<BatchNormBackwardKernel>(r, "batch_norm_backward", "cuda", f);
  add_float<LayerNormKernel>(r, "layer_norm", "cuda", f);
  add_float<LayerNormBackwardKernel>(r, "layer_norm_backward", "cuda", f);
}

}  // namespace plexus::cuda
