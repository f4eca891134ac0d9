// CUDA kernels: softmax, log_softmax, softmax cross-entropy and their backward ops (see
// docs/ops.md).
//
// A tensor normalised along `axis` is seen as (outer, len, inner). With inner == 1 (the last
// axis, the common case) every lane is a contiguous row and a team of threads takes a row: a
// warp for rows up to 1024 elements, the whole block beyond. Otherwise a 32 x 8 block takes 32
// neighbouring lanes (coalesced across threadIdx.x), its 8 rows of threads splitting the axis.
// Each pass over a lane (max, sum of exp, write) re-reads it; a lane is small enough to stay
// in L1/L2 between passes.
//
// Everything is computed in f32 and rounded once on store. Reductions run in a fixed order
// (per-thread sequential, then fixed shuffle trees and warps or thread rows in order), so results
// are bit-identical run to run, and every thread of a team sees the same reduced value.
//
// The cross-entropy forward is one kernel per row (max, log-sum-exp, log_probs, the row loss)
// plus, for mean and sum, a one-block kernel that adds the row losses in a fixed order (in f64,
// as the CPU does) and counts the rows not ignored. The backward reads its scale from dloss on
// the device; for mean a one-block pre-pass counts the rows not ignored and leaves
// dloss / count in the workspace, so nothing waits on the host.
#include <cmath>
#include <string>

#include "device.cuh"
#include "ops/ce_reduce.cuh"

namespace plexus::cuda {

namespace {

constexpr int kColX = 32, kColY = 8;
constexpr int64_t kMaxGrid = int64_t{1} << 30;  // kernels loop past this many blocks

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads per row: a warp up to 1024 elements (at most 32 per lane), else the block.
int team_for(int64_t len) { return len <= 1024 ? 32 : kBlock; }
// Blocks for `rows` rows of teams of `team` threads.
unsigned row_blocks(int64_t rows, int team) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(rows, kBlock / team), 1, kMaxGrid));
}

struct AxisPlan {
  int64_t outer = 1, len = 1, inner = 1;
  int64_t tiles_per_row() const { return ceil_div(inner, kColX); }
  int64_t tiles() const { return outer * tiles_per_row(); }
  bool empty() const { return outer == 0 || len == 0 || inner == 0; }
};

AxisPlan plan_axis(const plx_tensor& x, int64_t axis) {
  AxisPlan p;
  if (x.ndim == 0) return p;  // a scalar is one lane of length 1
  const int64_t a = axis < 0 ? axis + x.ndim : axis;
  PLX_REQUIRE(a >= 0 && a < x.ndim, "axis %lld out of range for %d dimensions",
              static_cast<long long>(axis), x.ndim);
  for (int32_t i = 0; i < a; ++i) p.outer *= x.shape[i];
  p.len = x.shape[a];
  for (int32_t i = static_cast<int32_t>(a) + 1; i < x.ndim; ++i) p.inner *= x.shape[i];
  return p;
}

// ---- reductions every thread of a team gets the result of ----

// kTeam is 32 (one warp per row) or kBlock (the block). `shared` holds 32 floats.
template <int kTeam>
__device__ __forceinline__ float team_sum(float v, float* shared) {
  if constexpr (kTeam == 32) return warp_sum(v);
  else return block_sum(v, shared);
}
template <int kTeam>
__device__ __forceinline__ float team_max(float v, float* shared) {
  if constexpr (kTeam == 32) return warp_max(v);
  else return block_max(v, shared);
}
// Columns: combines the kColY values of column threadIdx.x in threadIdx.y order; every thread
// of the column gets the same result. Uniform over the block (two barriers).
template <bool kMax>
__device__ __forceinline__ float column_combine(float v, float (*shared)[kColX]) {
  shared[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  float r = shared[0][threadIdx.x];
  for (int j = 1; j < kColY; ++j) {
    const float w = shared[j][threadIdx.x];
    r = kMax ? fmaxf(r, w) : r + w;
  }
  __syncthreads();  // before `shared` is written again
  return r;
}

// ---- softmax and log_softmax ----
// The maximum is subtracted before exp so that exp never overflows; a lane that is all -inf
// has max -inf and gives nan (x - max is nan), as on the CPU and in PyTorch. NaNs are skipped
// by the max (fmaxf), as std::max skips them on the CPU, and poison the sum. y may alias x:
// each element is written by the thread that read it, after the team's last reduction.

template <class T, bool kLog, int kTeam>
__global__ void __launch_bounds__(kBlock)
    softmax_rows(const T* x, T* y, int64_t rows, int64_t len) {
  pdl_begin();
  __shared__ float shared[32];
  constexpr int kTeams = kBlock / kTeam;
  const int lane = static_cast<int>(threadIdx.x) % kTeam;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kTeams) {  // uniform over the team
    const T* src = x + row * len;
    T* dst = y + row * len;
    float mx = -INFINITY;
    for (int64_t k = lane; k < len; k += kTeam) mx = fmaxf(mx, load(src, k));
    mx = team_max<kTeam>(mx, shared);
    float sum = 0.f;
    for (int64_t k = lane; k < len; k += kTeam) sum += expf(load(src, k) - mx);
    sum = team_sum<kTeam>(sum, shared);
    if constexpr (kLog) {
      const float lse = mx + logf(sum);
      for (int64_t k = lane; k < len; k += kTeam) store(dst, k, load(src, k) - lse);
    } else {
      // exp is computed again rather than kept in dst: for 16-bit dst that would round twice.
      const float inv = 1.f / sum;
      for (int64_t k = lane; k < len; k += kTeam) store(dst, k, expf(load(src, k) - mx) * inv);
    }
  }
}

template <class T, bool kLog>
__global__ void __launch_bounds__(kColX* kColY)
    softmax_cols(const T* x, T* y, int64_t len, int64_t inner, int64_t tiles_per_row,
                 int64_t tiles) {
  pdl_begin();
  __shared__ float shared[kColY][kColX];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform over the block
    const int64_t j = t % tiles_per_row * kColX + threadIdx.x;
    const bool active = j < inner;
    const int64_t base = t / tiles_per_row * len * inner + j;  // element k at base + k * inner
    float mx = -INFINITY;
    if (active)
      for (int64_t k = threadIdx.y; k < len; k += kColY) mx = fmaxf(mx, load(x, base + k * inner));
    mx = column_combine<true>(mx, shared);
    float sum = 0.f;
    if (active)
      for (int64_t k = threadIdx.y; k < len; k += kColY) sum += expf(load(x, base + k * inner) - mx);
    sum = column_combine<false>(sum, shared);
    if (!active) continue;
    if constexpr (kLog) {
      const float lse = mx + logf(sum);
      for (int64_t k = threadIdx.y; k < len; k += kColY) {
        const int64_t i = base + k * inner;
        store(y, i, load(x, i) - lse);
      }
    } else {
      const float inv = 1.f / sum;
      for (int64_t k = threadIdx.y; k < len; k += kColY) {
        const int64_t i = base + k * inner;
        store(y, i, expf(load(x, i) - mx) * inv);
      }
    }
  }
}

// softmax_backward: dx = y (dy - sum(dy y)); log_softmax_backward: dx = dy - exp(y) sum(dy).
// dx may alias dy, as y may alias x above.
template <class T, bool kLog, int kTeam>
__global__ void __launch_bounds__(kBlock)
    softmax_backward_rows(const T* dy, const T* y, T* dx, int64_t rows, int64_t len) {
  pdl_begin();
  __shared__ float shared[32];
  constexpr int kTeams = kBlock / kTeam;
  const int lane = static_cast<int>(threadIdx.x) % kTeam;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kTeams) {
    const int64_t off = row * len;
    float dot = 0.f;
    for (int64_t k = lane; k < len; k += kTeam)
      dot += kLog ? load(dy, off + k) : load(dy, off + k) * load(y, off + k);
    dot = team_sum<kTeam>(dot, shared);
    for (int64_t k = lane; k < len; k += kTeam) {
      const float g = load(dy, off + k), v = load(y, off + k);
      store(dx, off + k, kLog ? g - expf(v) * dot : v * (g - dot));
    }
  }
}

template <class T, bool kLog>
__global__ void __launch_bounds__(kColX* kColY)
    softmax_backward_cols(const T* dy, const T* y, T* dx, int64_t len, int64_t inner,
                          int64_t tiles_per_row, int64_t tiles) {
  pdl_begin();
  __shared__ float shared[kColY][kColX];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t j = t % tiles_per_row * kColX + threadIdx.x;
    const bool active = j < inner;
    const int64_t base = t / tiles_per_row * len * inner + j;
    float dot = 0.f;
    if (active) {
      for (int64_t k = threadIdx.y; k < len; k += kColY) {
        const int64_t i = base + k * inner;
        dot += kLog ? load(dy, i) : load(dy, i) * load(y, i);
      }
    }
    dot = column_combine<false>(dot, shared);
    if (!active) continue;
    for (int64_t k = threadIdx.y; k < len; k += kColY) {
      const int64_t i = base + k * inner;
      const float g = load(dy, i), v = load(y, i);
      store(dx, i, kLog ? g - expf(v) * dot : v * (g - dot));
    }
  }
}

template <class T, bool kLog>
class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(const NodeInfo& node, CudaBackend&)
      : device_(node.device()), plan_(plan_axis(node.input(0), node.attr_int("axis"))) {}

  void compute(const KernelCall& c) override {
    const AxisPlan& p = plan_;
    if (p.empty()) return;
    use_device(device_);
    const cudaStream_t s = native(c.stream);
    const T* x = ptr<const T>(c.in(0));  // (outer, len, inner)
    T* y = ptr<T>(c.out(0));             // (outer, len, inner); may be x
    if (p.inner == 1) {
      if (team_for(p.len) == 32)
        launch_kernel(softmax_rows<T, kLog, 32>, row_blocks(p.outer, 32), kBlock, 0, s, x, y,
                      p.outer, p.len);
      else
        launch_kernel(softmax_rows<T, kLog, kBlock>, row_blocks(p.outer, kBlock), kBlock, 0, s, x,
                      y, p.outer, p.len);
    } else {
      const unsigned grid = static_cast<unsigned>(std::min(p.tiles(), kMaxGrid));
      launch_kernel(softmax_cols<T, kLog>, grid, dim3(kColX, kColY), 0, s, x, y, p.len, p.inner,
                    p.tiles_per_row(), p.tiles());
    }
  }

 private:
  int32_t device_;
  AxisPlan plan_;
};

template <class T, bool kLog>
class SoftmaxBackwardKernel final : public Kernel {
 public:
  SoftmaxBackwardKernel(const NodeInfo& node, CudaBackend&)
      : device_(node.device()), plan_(plan_axis(node.input(0), node.attr_int("axis"))) {}

  void compute(const KernelCall& c) override {
    const AxisPlan& p = plan_;
    if (p.empty()) return;
    use_device(device_);
    const cudaStream_t s = native(c.stream);
    const T* dy = ptr<const T>(c.in(0));  // (outer, len, inner)
    const T* y = ptr<const T>(c.in(1));   // (outer, len, inner)
    T* dx = ptr<T>(c.out(0));             // (outer, len, inner); may be dy
    if (p.inner == 1) {
      if (team_for(p.len) == 32)
        launch_kernel(softmax_backward_rows<T, kLog, 32>, row_blocks(p.outer, 32), kBlock, 0, s, dy,
                      y, dx, p.outer, p.len);
      else
        launch_kernel(softmax_backward_rows<T, kLog, kBlock>, row_blocks(p.outer, kBlock), kBlock,
                      0, s, dy, y, dx, p.outer, p.len);
    } else {
      const unsigned grid = static_cast<unsigned>(std::min(p.tiles(), kMaxGrid));
      launch_kernel(softmax_backward_cols<T, kLog>, grid, dim3(kColX, kColY), 0, s, dy, y, dx,
                    p.len, p.inner, p.tiles_per_row(), p.tiles());
    }
  }

 private:
  int32_t device_;
  AxisPlan plan_;
};

template <class T>
using Softmax = SoftmaxKernel<T, false>;
template <class T>
using LogSoftmax = SoftmaxKernel<T, true>;
template <class T>
using SoftmaxBackward = SoftmaxBackwardKernel<T, false>;
template <class T>
using LogSoftmaxBackward = SoftmaxBackwardKernel<T, true>;

// ---- softmax cross-entropy ----

using Reduction = sdk::LossReduction;

// The shared attributes and shapes (sdk/op_params.hpp) plus the labels' dtype.
struct CrossEntropyParams : sdk::CrossEntropyParams {
  plx_dtype labels = PLX_I64;

  CrossEntropyParams(const NodeInfo& node, const plx_tensor& logits, const plx_tensor& lab)
      : sdk::CrossEntropyParams(node, logits) {
    PLX_REQUIRE(lab.dtype == PLX_I32 || lab.dtype == PLX_I64, "%s: labels must be i32 or i64, got %s",
                node.op(), dtype_name(lab.dtype));
    labels = static_cast<plx_dtype>(lab.dtype);
  }
  // The target is (1 - eps) one-hot + eps / C, formed in f64 and used in f32 (as the CPU does).
  float on() const { return static_cast<float>(1 - smoothing); }
  float off() const { return static_cast<float>(smoothing / static_cast<double>(c)); }
};

// Row i: log_probs = x - lse, loss_i = -((1 - eps) lp[i, y_i] + eps/C sum_c lp[i, c]), 0 when the
// label is ignore_index. A label outside [0, C) is reported and its row's loss is 0. The loss
// goes to `loss` (reduction none) or to `row_loss` (the workspace, for ce_reduce).
template <class T, class L, int kTeam>
__global__ void __launch_bounds__(kBlock)
    ce_forward(const T* __restrict__ x, const L* __restrict__ labels, T* __restrict__ loss,
               float* __restrict__ row_loss, T* __restrict__ lp, int64_t n, int64_t C,
               long long ignore, float on, float off, bool smoothing, DeviceErrorRecord* err) {
  pdl_begin();
  __shared__ float shared[32];
  constexpr int kTeams = kBlock / kTeam;
  const int lane = static_cast<int>(threadIdx.x) % kTeam;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam; row < n;
       row += static_cast<int64_t>(gridDim.x) * kTeams) {
    const T* xr = x + row * C;  // (C)
    T* lr = lp + row * C;       // (C)
    float mx = -INFINITY;
    for (int64_t k = lane; k < C; k += kTeam) mx = fmaxf(mx, load(xr, k));
    mx = team_max<kTeam>(mx, shared);
    float sum = 0.f;
    for (int64_t k = lane; k < C; k += kTeam) sum += expf(load(xr, k) - mx);
    sum = team_sum<kTeam>(sum, shared);
    const float lse = mx + logf(sum);
    float lp_sum = 0.f;  // sum_c lp[i, c], from the unrounded values
    for (int64_t k = lane; k < C; k += kTeam) {
      const float v = load(xr, k) - lse;
      lp_sum += v;
      store(lr, k, v);
    }
    if (smoothing) lp_sum = team_sum<kTeam>(lp_sum, shared);  // kernel argument: uniform
    if (lane == 0) {
      const long long l = static_cast<long long>(labels[row]);
      float li = 0.f;
      if (l != ignore) {
        if (l < 0 || l >= C) {
          report_error(err, kErrCrossEntropyLabel, row, l, C);
        } else {
          li = -(on * (load(xr, l) - lse));
          if (smoothing) li -= off * lp_sum;
        }
      }
      if (row_loss) row_loss[row] = li;
      else store(loss, row, li);
    }
  }
}

template <class T>
class CrossEntropyKernel final : public Kernel {
 public:
  CrossEntropyKernel(const NodeInfo& node, CudaBackend& b)
      : device_(node.device()),
        err_(b.context(node.device()).error_dev),
        p_(node, node.input(0), node.input(1)) {}

  // The row losses, for mean and sum.
  uint64_t workspace_bytes() const override {
    return p_.reduction == Reduction::kNone ? 0 : static_cast<uint64_t>(p_.n) * sizeof(float);
  }

  void compute(const KernelCall& c) override {
    if (p_.labels == PLX_I32) run<int32_t>(c);
    else run<int64_t>(c);
  }

 private:
  template <class L>
  void run(const KernelCall& c) {
    const CrossEntropyParams& p = p_;
    const bool none = p.reduction == Reduction::kNone;
    if (none && p.n == 0) return;
    use_device(device_);
    const cudaStream_t s = native(c.stream);
    const T* x = ptr<const T>(c.in(0));                   // (N, C)
    const L* labels = ptr<const L>(c.in(1));              // (N)
    T* loss = ptr<T>(c.out(0));                           // () or (N)
    T* lp = ptr<T>(c.out(1));                             // (N, C)
    float* row_loss = none ? nullptr : static_cast<float*>(c.workspace);  // (N)
    if (p.n > 0) {
      if (team_for(p.c) == 32)
        launch_kernel(ce_forward<T, L, 32>, row_blocks(p.n, 32), kBlock, 0, s, x, labels, loss,
                      row_loss, lp, p.n, p.c, p.ignore_index, p.on(), p.off(), p.smoothing != 0,
                      err_);
      else
        launch_kernel(ce_forward<T, L, kBlock>, row_blocks(p.n, kBlock), kBlock, 0, s, x, labels,
                      loss, row_loss, lp, p.n, p.c, p.ignore_index, p.on(), p.off(),
                      p.smoothing != 0, err_);
    }
    if (none) return;
    launch_kernel(ce_reduce<T, L>, 1, kBlock, 0, s, row_loss, labels, loss, p.n, p.ignore_index,
                  p.reduction == Reduction::kMean);
  }

  int32_t device_;
  DeviceErrorRecord* err_;
  CrossEntropyParams p_;
};

// One block: the scale of every row for mean, dloss / (rows not ignored), 0 if there are none.
template <class T, class L>
__global__ void __launch_bounds__(kBlock)
    ce_mean_scale(const T* __restrict__ dloss, const L* __restrict__ labels,
                  float* __restrict__ scale, int64_t n, long long ignore) {
  pdl_begin();
  __shared__ long long shared_count[32];
  long long count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    count += static_cast<long long>(labels[i]) != ignore ? 1 : 0;
  count = block_sum(count, shared_count);
  if (threadIdx.x == 0) *scale = count > 0 ? load(dloss, 0) / static_cast<float>(count) : 0.f;
}

// dlogits[i, c] = g_i (exp(lp[i, c]) - target[i, c]); 0 on ignored rows and on rows whose
// label is out of range (reported). g_i: dloss[i] (none), dloss (sum) or *mean_scale (mean).
template <class T, class L, int kTeam>
__global__ void __launch_bounds__(kBlock)
    ce_backward(const T* __restrict__ dloss, const T* __restrict__ lp,
                const L* __restrict__ labels, T* __restrict__ dx,
                const float* __restrict__ mean_scale, int64_t n, int64_t C, long long ignore,
                float on, float off, Reduction reduction, DeviceErrorRecord* err) {
  pdl_begin();
  constexpr int kTeams = kBlock / kTeam;
  const int lane = static_cast<int>(threadIdx.x) % kTeam;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam; row < n;
       row += static_cast<int64_t>(gridDim.x) * kTeams) {
    const T* lr = lp + row * C;  // (C)
    T* dr = dx + row * C;        // (C)
    const long long l = static_cast<long long>(labels[row]);
    bool zero = l == ignore;
    if (!zero && (l < 0 || l >= C)) {
      if (lane == 0) report_error(err, kErrCrossEntropyBackwardLabel, row, l, C);
      zero = true;
    }
    if (zero) {
      for (int64_t k = lane; k < C; k += kTeam) store(dr, k, 0.f);
      continue;
    }
    const float g = reduction == Reduction::kNone  ? load(dloss, row)
                    : reduction == Reduction::kSum ? load(dloss, 0)
                                                   : *mean_scale;
    for (int64_t k = lane; k < C; k += kTeam)
      store(dr, k, g * (expf(load(lr, k)) - off - (k == l ? on : 0.f)));
  }
}

template <class T>
class CrossEntropyBackwardKernel final : public Kernel {
 public:
  CrossEntropyBackwardKernel(const NodeInfo& node, CudaBackend& b)
      : device_(node.device()),
        err_(b.context(node.device()).error_dev),
        p_(node, node.input(1), node.input(2)) {}

  // The mean's scale (one float).
  uint64_t workspace_bytes() const override {
    return p_.reduction == Reduction::kMean ? sizeof(float) : 0;
  }

  void compute(const KernelCall& c) override {
    if (p_.labels == PLX_I32) run<int32_t>(c);
    else run<int64_t>(c);
  }

 private:
  template <class L>
  void run(const KernelCall& c) {
    const CrossEntropyParams& p = p_;
    if (p.n == 0) return;
    use_device(device_);
    const cudaStream_t s = native(c.stream);
    const T* dloss = ptr<const T>(c.in(0));   // () or (N)
    const T* lp = ptr<const T>(c.in(1));      // (N, C)
    const L* labels = ptr<const L>(c.in(2));  // (N)
    T* dx = ptr<T>(c.out(0));                 // (N, C)
    float* scale = nullptr;
    if (p.reduction == Reduction::kMean) {
      scale = static_cast<float*>(c.workspace);
      launch_kernel(ce_mean_scale<T, L>, 1, kBlock, 0, s, dloss, labels, scale, p.n,
                    p.ignore_index);
    }
    if (team_for(p.c) == 32)
      launch_kernel(ce_backward<T, L, 32>, row_blocks(p.n, 32), kBlock, 0, s, dloss, lp, labels, dx,
                    scale, p.n, p.c, p.ignore_index, p.on(), p.off(), p.reduction, err_);
    else
      launch_kernel(ce_backward<T, L, kBlock>, row_blocks(p.n, kBlock), kBlock, 0, s, dloss, lp,
                    labels, dx, scale, p.n, p.c, p.ignore_index, p.on(), p.off(), p.reduction,
                    err_);
  }

  int32_t device_;
  DeviceErrorRecord* err_;
  CrossEntropyParams p_;
};

template <template <class> class K>
void add_float(KernelRegistry& r, const char* op, const char* impl, uint32_t flags) {
  r.add<K<float>, CudaBackend>(op, PLX_F32, impl, flags);
  r.add<K<f16>, CudaBackend>(op, PLX_F16, impl, flags);
  r.add<K<bf16>, CudaBackend>(op, PLX_BF16, impl, flags);
}

}  // namespace

void register_softmax(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float<Softmax>(r, "softmax", "cuda", f | PLX_KERNEL_INPLACE);
  add_float<LogSoftmax>(r, "log_softmax", "cuda", f | PLX_KERNEL_INPLACE);
  add_float<SoftmaxBackward>(r, "softmax_backward", "cuda", f | PLX_KERNEL_INPLACE);
  add_float<LogSoftmaxBackward>(r, "log_softmax_backward", "cuda", f | PLX_KERNEL_INPLACE);
  add_float<CrossEntropyKernel>(r, "softmax_cross_entropy", "cuda", f);
  add_float<CrossEntropyBackwardKernel>(r, "softmax_cross_entropy_backward", "cuda", f);
}

}  // namespace plexus::cuda
