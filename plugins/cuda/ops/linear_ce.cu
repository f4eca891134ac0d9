// CUDA: the classifier head, linear -> [cast to f32] -> softmax_cross_entropy with the argmax of
// the logits, the loss's backward and the linear's own dx and db (after the cast back to the
// linear's dtype, under mixed precision), as one kernel over the rows, for fusion
// (sdk::linear_cross_entropy_slots, ops/fusion.cpp). The logits, log_probs and (when only the
// group reads them) dlogits stay on chip.
//
// A block stages the weight (C, K) and the bias in shared memory as f32 once (8 loads in flight
// per thread), then each of its 8 warps takes a row at a time: the C logits as dot products of
// the row of x with the weight's rows (each lane a strided slice of K, 4 of its values loaded
// before any is used, 16 classes at a time, then a shuffle tree), rounded to the linear's
// dtype as the linear node stores them (and widened exactly by the cast); then, from the logits
// in shared memory, log-sum-exp, the row loss, the argmax and dlogits, with the arithmetic of the
// unfused kernels (ops/softmax.cu, ops/reduce.cu); then the row's dx, dl (C) times the staged
// weight, and dl added into the warp's sums for db. The weight must fit in shared memory beside
// the logits (48 KiB, no opt-in): the constructor declines larger heads, which then run node by
// node. dw, a product summed over the rows, stays a GEMM of its own.
//
// The loss (mean or sum) and db need every row: the last block to finish adds them up (the
// blocks count themselves on a counter the kernel owns, after a fence), so the whole head is one
// launch. Deterministic: every sum has a fixed order (per lane, then a fixed shuffle tree; the
// row losses in f64 in row order, as ce_reduce; db per warp in row order, then warps, then
// blocks in order), and the counter only says which block is last. The mean's count of rows not
// ignored, which dlogits needs before any row is done, is counted by every block over all labels
// (a block reduction in a fixed order, so every block gets the same count): N label reads per
// block, cheap next to the block's share of x for any classifier batch. Capture-safe: no
// allocation, no host sync (the counter is allocated when the kernel is created). One launch of
// a kernel object at a time: two in flight on two streams would share its counter (the executor
// runs an executable's kernels on one stream).
#include <optional>
#include <cmath>

#include "device.cuh"
#include "ops/ce_reduce.cuh"
#include "ops/linear_ce.hpp"

namespace plexus::cuda {

namespace {

using Reduction = sdk::LossReduction;

constexpr int kWarps = 8;  // rows in flight per block, one per warp
constexpr int kThreads = kWarps * 32;
constexpr int kClassTile = 16;  // logits a lane accumulates at once: a 10-class head in one pass
constexpr int kRowBatch = 4;    // a row's x values a lane loads before using any
constexpr int kStageBatch = 8;  // the weight's values a thread loads before storing any
// Dynamic shared memory: a block may have 48 KiB in all without cudaFuncSetAttribute; 1 KiB is
// left for the kernels' static arrays.
constexpr uint64_t kMaxShared = 47 * 1024;

struct HeadArgs {
  const void* x;       // (N, K), TL
  const void* w;       // (C, K), TL
  const void* bias;    // (C), TL, or null
  const void* labels;  // (N), L
  const void* dloss;   // () or (N), TC, or null without the backward
  void* logits;        // (N, C), TL, or null when only the group reads them
  void* cast_logits;   // (N, C), TC, or null
  void* loss;          // (N) with reduction none, TC, or null
  void* log_probs;     // (N, C), TC, or null
  int64_t* pred;       // (N), or null
  void* dlogits;       // (N, C), TC, or null
  void* dlogits_cast;  // (N, C), TL, or null: dlogits cast back to the linear's dtype
  void* dx;            // (N, K), TL, or null: the linear's dx = dl w
  void* db;            // (C), TL, or null: the linear's db = dl summed over the rows
  float* row_loss;     // (N) for mean and sum (the workspace), else null
  float* db_part;      // (grid, C): each block's sum of its rows' dl (the workspace), or null
  void* loss_out;      // (), TC: the reduced loss, written by the last block, or null
  unsigned* done;      // blocks finished (zero between launches), when the last block reduces
  bool backward;       // dlogits are computed (the loss's backward is in the group)
  int64_t n, k, c;
  long long ignore;
  float on, off;  // the target: on at the label, plus off everywhere
  bool smoothing;
  Reduction reduction;
  DeviceErrorRecord* err;
};

// What the linear's backward reads of dl: dlogits rounded to TC as the backward node stores
// them, then (after a mixed-precision cast back) to TL.
template <class TL, class TC>
__device__ __forceinline__ float as_dl(float v) {
  const float c = to_accum<TC>(from_accum<TC>(v));
  return to_accum<TL>(from_accum<TL>(c));
}

template <class TL, class TC, class L>
__global__ void __launch_bounds__(kThreads) linear_ce_rows(HeadArgs a) {
  pdl_begin();
  // The weight (C, K) and the bias (C, zero without one) in f32, then kWarps rows of C logits,
  // then (with db) kWarps rows of C per-warp sums of dl.
  extern __shared__ float smem[];
  __shared__ long long shared_count[32];
  const int64_t C = a.c, K = a.k;
  const TL* x = static_cast<const TL*>(a.x);
  const TL* w = static_cast<const TL*>(a.w);
  const TL* bias = static_cast<const TL*>(a.bias);
  const L* labels = static_cast<const L*>(a.labels);
  const TC* dloss = static_cast<const TC*>(a.dloss);
  TL* logits = static_cast<TL*>(a.logits);
  TC* cast_logits = static_cast<TC*>(a.cast_logits);
  TC* loss = static_cast<TC*>(a.loss);
  TC* lp = static_cast<TC*>(a.log_probs);
  TC* dlogits = static_cast<TC*>(a.dlogits);
  TL* dl_cast = static_cast<TL*>(a.dlogits_cast);
  TL* dxo = static_cast<TL*>(a.dx);
  TL* dbo = static_cast<TL*>(a.db);
  float* ws = smem;
  float* bs = smem + C * K;
  // kStageBatch loads in flight per thread: one element at a time (a load, then its store) was
  // a round trip to L2 per element, 32 in a row for simplecnn's 8,000 weights.
  const int64_t CK = C * K;
  for (int64_t base = threadIdx.x; base < CK; base += int64_t{kStageBatch} * blockDim.x) {
    float v[kStageBatch];
#pragma unroll
    for (int j = 0; j < kStageBatch; ++j) {
      const int64_t i = base + int64_t{j} * blockDim.x;
      v[j] = i < CK ? load(w, i) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kStageBatch; ++j) {
      const int64_t i = base + int64_t{j} * blockDim.x;
      if (i < CK) ws[i] = v[j];
    }
  }
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) bs[i] = bias ? load(bias, i) : 0.f;
  float* dbw = bs + C + kWarps * C;  // (kWarps, C) with db
  if (dbo)
    for (int64_t i = threadIdx.x; i < kWarps * C; i += blockDim.x) dbw[i] = 0.f;
  // The backward's scale of every row, unless reduction none: dloss, or dloss / (rows not
  // ignored) for mean (0 if there are none), as ce_mean_scale computes it. The condition is a
  // kernel argument: uniform, so block_sum's barriers are reached by every thread.
  float scale = 0.f;
  if (a.backward && a.reduction == Reduction::kMean) {
    long long count = 0;
    for (int64_t i = threadIdx.x; i < a.n; i += blockDim.x)
      count += static_cast<long long>(labels[i]) != a.ignore ? 1 : 0;
    count = block_sum(count, shared_count);
    scale = count > 0 ? load(dloss, 0) / static_cast<float>(count) : 0.f;
  } else if (a.backward && a.reduction == Reduction::kSum) {
    scale = load(dloss, 0);
  }
  __syncthreads();  // the weight is staged

  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  float* z = bs + C + warp * C;  // this warp's row of logits
  // Rows are uniform over the warp: every shuffle below runs with all 32 lanes.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < a.n;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const TL* xr = x + row * K;  // (K)
    // The linear: kClassTile dot products at a time, each lane over k = lane, lane + 32, ...,
    // kRowBatch values of x loaded before any is used (one at a time, each was a round trip).
    for (int64_t c0 = 0; c0 < C; c0 += kClassTile) {
      float acc[kClassTile];
#pragma unroll
      for (int j = 0; j < kClassTile; ++j) acc[j] = 0.f;
      for (int64_t k0 = lane; k0 < K; k0 += 32 * kRowBatch) {
        float xv[kRowBatch];
#pragma unroll
        for (int r = 0; r < kRowBatch; ++r) {
          const int64_t k = k0 + 32 * r;
          xv[r] = k < K ? load(xr, k) : 0.f;
        }
#pragma unroll
        for (int r = 0; r < kRowBatch; ++r) {
          const int64_t k = k0 + 32 * r;
          if (k < K) {
#pragma unroll
            for (int j = 0; j < kClassTile; ++j)
              if (c0 + j < C) acc[j] = fmaf(xv[r], ws[(c0 + j) * K + k], acc[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kClassTile; ++j) {
        const float dot = warp_sum(acc[j]);
        const int64_t col = c0 + j;
        if (lane == 0 && col < C) {
          // Rounded to the linear's dtype as its node stores it; the cast widens exactly.
          const TL v = from_accum<TL>(bias ? dot + bs[col] : dot);
          if (logits) logits[row * C + col] = v;
          z[col] = to_accum<TL>(v);
          if (cast_logits) store(cast_logits, row * C + col, z[col]);
        }
      }
    }
    __syncwarp();  // z is complete

    // softmax_cross_entropy (ce_forward).
    const float lse = warp_log_sum_exp(z, C, lane);
    float lp_sum = 0.f;  // sum_c lp[i, c], from the unrounded values
    for (int64_t k = lane; k < C; k += 32) {
      const float v = z[k] - lse;
      lp_sum += v;
      if (lp) store(lp, row * C + k, v);
    }
    if (a.smoothing) lp_sum = warp_sum(lp_sum);  // a kernel argument: uniform
    const long long l = static_cast<long long>(labels[row]);
    const bool ignored = l == a.ignore;
    const bool bad = !ignored && (l < 0 || l >= C);
    if (lane == 0) {
      float li = 0.f;
      if (bad) {
        report_error(a.err, kErrCrossEntropyLabel, row, l, C);
      } else if (!ignored) {
        li = -(a.on * (z[l] - lse));
        if (a.smoothing) li -= a.off * lp_sum;
      }
      if (a.row_loss) a.row_loss[row] = li;
      else if (loss) store(loss, row, li);
    }

    // argmax over the row (first NaN, else first maximum).
    if (a.pred) {
      const long long bi = warp_argmax(z, C, lane);
      if (lane == 0) a.pred[row] = bi;
    }

    // softmax_cross_entropy_backward (ce_backward), from log_probs rounded to TC as it would
    // read them; 0 on ignored rows and rows whose label is out of range (reported above).
    if (a.backward) {
      const bool linear_bwd = dxo || dbo;
      // Every lane has read z above (lane 0 at the label) before dl replaces the logits there.
      __syncwarp();
      const float g = a.reduction == Reduction::kNone ? load(dloss, row) : scale;
      for (int64_t k = lane; k < C; k += 32) {
        float v = 0.f;
        if (!ignored && !bad) {
          const float lpk = to_accum<TC>(from_accum<TC>(z[k] - lse));
          v = g * (expf(lpk) - a.off - (k == l ? a.on : 0.f));
        }
        if (dlogits) store(dlogits, row * C + k, v);
        if (linear_bwd) {
          const float d = as_dl<TL, TC>(v);
          if (dl_cast) store(dl_cast, row * C + k, d);
          z[k] = d;
          if (dbo) dbw[warp * C + k] += d;
        }
      }
      // The linear's dx for this row: dl (C) times the weight (C, K), each lane over
      // k = lane, lane + 32, ..., the classes in order.
      if (dxo) {
        __syncwarp();  // dl is in z
        TL* dr = dxo + row * K;
        for (int64_t k = lane; k < K; k += 32) {
          float acc = 0.f;
          for (int64_t c = 0; c < C; ++c) acc = fmaf(z[c], ws[c * K + k], acc);
          store(dr, k, acc);
        }
      }
    }
    __syncwarp();  // every lane is done with z before the next row overwrites it
  }

  // The block that finishes reduces what all wrote: db (the blocks' sums added by split_sum,
  // device.cuh, each block's its warps' in warp order) and the loss (as ce_reduce).
  // Deterministic for a given grid. The counters are left zero for the next launch.
  if (!a.done) return;  // a kernel argument: uniform
  bool last;
  if (dbo) {
    __syncthreads();  // every warp's sums are in dbw
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float t = 0.f;
      for (int w8 = 0; w8 < kWarps; ++w8) t += dbw[w8 * C + c];
      a.db_part[static_cast<int64_t>(blockIdx.x) * C + c] = t;
    }
    last = split_sum(
        a.done, a.db_part, C, gridDim.x, blockIdx.x, static_cast<int>(C),
        [](int c) { return int64_t{c}; }, [&](int, int64_t c, float t) { store(dbo, c, t); });
  } else {  // the loss alone: only the finishing block to find (split_sum with no element
            // spills registers here, read with -Xptxas -v)
    last = last_block_arrives(a.done, gridDim.x);
    if (last && threadIdx.x == 0) *a.done = 0;
  }
  if (last && a.loss_out)
    ce_reduce_block<TC, L>(a.row_loss, labels, static_cast<TC*>(a.loss_out), a.n, a.ignore,
                           a.reduction == Reduction::kMean);
}


// TL: the linear's dtype; TC: the cross-entropy's (f32 after a mixed-precision cast, else TL).
template <class TL, class TC>
class LinearCrossEntropyKernel final : public Kernel {
 public:
  LinearCrossEntropyKernel(const NodeInfo& ce, const sdk::LinearCrossEntropySlots& s,
                           CudaBackend& backend, int32_t device)
      : s_(s), p_(ce, ce.input(0)), device_(device) {
    PLX_DECLINE_UNLESS(s.c > 0, "no classes (argmax over an empty axis is the node's error)");
    PLX_DECLINE_UNLESS(s.c <= int64_t{1} << 20 && s.k <= int64_t{1} << 20,
                       "more than 2^20 classes or inputs");
    const uint64_t floats =
        static_cast<uint64_t>(s.c * s.k + s.c + kWarps * s.c * (s.db >= 0 ? 2 : 1));
    smem_ = floats * sizeof(float);
    PLX_DECLINE_UNLESS(smem_ <= kMaxShared,
                       "the weight (%lld x %lld) and the logits need %llu bytes of shared memory, "
                       "more than %llu",
                       static_cast<long long>(s.c), static_cast<long long>(s.k),
                       static_cast<unsigned long long>(smem_),
                       static_cast<unsigned long long>(kMaxShared));
    DeviceContext& ctx = backend.context(device);
    err_ = ctx.error_dev;
    // Enough blocks to fill the GPU (4 resident per SM at 48 KiB each), each looping over rows
    // beyond that, so the weight is staged once per block rather than once per 8 rows.
    const int64_t most = std::max<int64_t>(1, int64_t{4} * ctx.prop.multiProcessorCount);
    grid_ = static_cast<unsigned>(std::clamp<int64_t>((s.n + kWarps - 1) / kWarps, 1, most));
    // The last block reduces the loss (mean, sum) and db: it needs the count of finished blocks,
    // zero between launches (each launch's last block resets it), so it lives as long as the
    // kernel, not in the workspace.
    last_reduces_ = (p_.reduction != Reduction::kNone && s.loss >= 0) || s.db >= 0;
    if (last_reduces_) done_.emplace(s.db >= 0 ? split_sum_counters(grid_) : 1);
    row_loss_bytes_ = p_.reduction == Reduction::kNone
                          ? 0
                          : (static_cast<uint64_t>(s.n) * sizeof(float) + 255) / 256 * 256;
    db_part_bytes_ = s.db >= 0 ? uint64_t{grid_} * static_cast<uint64_t>(s.c) * sizeof(float) : 0;
  }
  // The row losses, for mean and sum, then the blocks' sums of dl for db.
  uint64_t workspace_bytes() const override { return row_loss_bytes_ + db_part_bytes_; }

  void compute(const KernelCall& c) override {
    if (s_.label_dtype == PLX_I32) run<int32_t>(c);
    else run<int64_t>(c);
  }

 private:
  static void* out(const KernelCall& c, int32_t slot) { return slot >= 0 ? c.out(slot).data : nullptr; }

  template <class L>
  void run(const KernelCall& c) {
    const sdk::LinearCrossEntropySlots& s = s_;
    const bool none = p_.reduction == Reduction::kNone;
    if (none && s.n == 0) return;
    use_device(device_);
    const cudaStream_t stream = native(c.stream);
    HeadArgs a{};
    a.x = c.in(s.x).data;
    a.w = c.in(s.w).data;
    a.bias = s.bias >= 0 ? c.in(s.bias).data : nullptr;
    a.labels = c.in(s.labels).data;
    a.dloss = s.dloss >= 0 ? c.in(s.dloss).data : nullptr;
    a.logits = out(c, s.logits);
    a.cast_logits = out(c, s.cast_logits);
    a.loss = none ? out(c, s.loss) : nullptr;
    a.log_probs = out(c, s.log_probs);
    a.pred = static_cast<int64_t*>(out(c, s.pred));
    a.dlogits = out(c, s.dlogits);
    a.dlogits_cast = out(c, s.dlogits_cast);
    a.dx = out(c, s.dx);
    a.db = out(c, s.db);
    a.backward = s.backward >= 0;
    a.row_loss = none ? nullptr : static_cast<float*>(c.workspace);
    a.db_part = s.db >= 0 ? reinterpret_cast<float*>(static_cast<unsigned char*>(c.workspace) +
                                                     row_loss_bytes_)
                          : nullptr;
    a.loss_out = none ? nullptr : out(c, s.loss);
    a.done = done_ ? done_->p : nullptr;
    a.n = s.n;
    a.k = s.k;
    a.c = s.c;
    a.ignore = static_cast<long long>(p_.ignore_index);
    // The target (1 - eps) one-hot + eps / C, formed in f64 and used in f32 (as ops/softmax.cu).
    a.on = static_cast<float>(1 - p_.smoothing);
    a.off = static_cast<float>(p_.smoothing / static_cast<double>(p_.c));
    a.smoothing = p_.smoothing != 0;
    a.reduction = p_.reduction;
    a.err = err_;
    if (s.n > 0 || last_reduces_) {
      // One launch: with no rows, the last (only) block still writes the loss and db.
      launch_kernel(linear_ce_rows<TL, TC, L>, grid_, kThreads, smem_, stream, a);
    }
  }

  sdk::LinearCrossEntropySlots s_;
  sdk::CrossEntropyParams p_;
  int32_t device_;
  DeviceErrorRecord* err_ = nullptr;
  uint64_t smem_ = 0;
  unsigned grid_ = 1;
  bool last_reduces_ = false;
  std::optional<BlockCounter> done_;
  uint64_t row_loss_bytes_ = 0, db_part_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> make_linear_cross_entropy(CudaBackend& backend, const sdk::GraphView& g,
                                                  const sdk::Boundary& b, plx_dtype& dtype) {
  const sdk::LinearCrossEntropySlots s = sdk::linear_cross_entropy_slots(g, b);
  dtype = s.dtype;
  const sdk::OwnedNodeInfo info(g, s.ce);
  const NodeInfo ce(&info.get());
  const int32_t dev = g.device();
  const bool cast = s.cast >= 0;
  switch (s.dtype) {
    case PLX_F32: return std::make_unique<LinearCrossEntropyKernel<float, float>>(ce, s, backend, dev);
    case PLX_F16:
      if (cast) return std::make_unique<LinearCrossEntropyKernel<f16, float>>(ce, s, backend, dev);
      return std::make_unique<LinearCrossEntropyKernel<f16, f16>>(ce, s, backend, dev);
    case PLX_BF16:
      if (cast) return std::make_unique<LinearCrossEntropyKernel<bf16, float>>(ce, s, backend, dev);
      return std::make_unique<LinearCrossEntropyKernel<bf16, bf16>>(ce, s, backend, dev);
    default: break;
  }
  throw sdk::Unsupported(sdk::format("linear+softmax_cross_entropy: no %s kernel on CUDA",
                                     plexus::dtype_name(dtype)));
}

}  // namespace plexus::cuda
