// CUDA kernels: optimizer updates (see docs/ops.md; the CPU kernels in plugins/cpu/ops/optim.cpp
// are the reference), in place, f32 params, and the multi-tensor launchers of optim_fused.hpp.
//
// One kernel serves both: a launch updates up to kMultiTensorCapacity tensors, each block one
// chunk of one tensor; the per-node kernels launch it for their single tensor, so a fused step
// and a step of separate nodes give the same bits.
//
// lr and step are read on the device, by the first thread of each block, which also forms the
// scalar coefficients in f64 as the CPU plugin (and PyTorch, in Python floats) does and rounds
// them to f32. The elementwise update is written with the _rn intrinsics so that nvcc cannot
// contract a multiply and an add into an FMA: the operations and their order are the CPU
// kernel's (built without contraction), and the results its bits, up to the last bit of the
// device's pow().
#include <algorithm>
#include <cmath>

#include "device.cuh"
#include "ops/multi_tensor.cuh"
#include "ops/optim_fused.hpp"

namespace plexus::cuda {

namespace {

constexpr int kOptimBlock = 256;
// Elements per block: a multiple of 4, so every chunk of an aligned tensor starts aligned for
// 16-byte accesses.
constexpr int64_t kChunk = 8192;
constexpr int kCap = kMultiTensorCapacity;

struct alignas(16) F4 {
  float v[4];
};

// Four gradients as f32 from 4 * sizeof(G) bytes at g (aligned for it): an f16/bf16 gradient
// widened exactly, as a cast to f32 would (the fusion of the gradients' casts into the update).
template <class G>
__device__ __forceinline__ F4 load4(const G* g) {
  if constexpr (std::is_same_v<G, float>) {
    return *reinterpret_cast<const F4*>(g);
  } else {
    struct alignas(4 * sizeof(G)) G4 {
      G v[4];
    };
    const G4 h = *reinterpret_cast<const G4*>(g);
    F4 f;
#pragma unroll
    for (int q = 0; q < 4; ++q) f.v[q] = to_accum<G>(h.v[q]);
    return f;
  }
}

__device__ __forceinline__ double read_scalar(const void* p, int32_t dtype) {
  return dtype == PLX_F64 ? *static_cast<const double*>(p)
                          : static_cast<double>(*static_cast<const float*>(p));
}

// ---- f16's loss scale ----

// PyTorch's _amp_update_scale_ (docs/ops.md, loss_scale_update), by one thread, with the scale's
// inverse (a correctly rounded division, as the host's f64 1/S rounded to f32), the skipped
// steps and the optimizer's step count beside it.
__device__ __forceinline__ void loss_scale_step(const LossScaleArgs& a) {
  const float ran = *a.scale;
  float scale = ran, good = *a.good, skipped = *a.skipped;
  const bool finite = finite_f32(*a.check);
  if (!finite) {
    scale = __fmul_rn(scale, a.backoff);
    good = 0.f;
    skipped = __fadd_rn(skipped, 1.f);
  } else {
    good = __fadd_rn(good, 1.f);
    if (a.step) *a.step = __fadd_rn(*a.step, 1.f);
    if (good >= a.interval) {
      const float grown = __fmul_rn(scale, a.growth);
      if (finite_f32(grown)) scale = grown;
      good = 0.f;
    }
  }
  *a.scale = scale;
  *a.unscale = __fdiv_rn(1.f, scale);
  *a.good = good;
  *a.skipped = skipped;
  a.report[0] = ran;
  a.report[1] = finite ? 0.f : 1.f;
  a.report[2] = scale;
  a.report[3] = good;
  a.report[4] = skipped;
}

__global__ void loss_scale_kernel(const LossScaleArgs a) {
  pdl_begin();
  loss_scale_step(a);
}

// A multi-tensor update's end: with a loss scale, the last block of the launch sequence to
// finish (every other block has read the step count and the check) moves it.
template <class Launch>
__device__ __forceinline__ void scale_after_update(const Launch& L) {
  if (!L.done || !last_block_arrives(L.done, static_cast<unsigned>(L.total_blocks))) return;
  if (threadIdx.x == 0) {
    loss_scale_step(L.scaler);
    *L.done = 0;
  }
}

// ---- SGD ----

struct SgdHyper {
  double momentum, dampening, weight_decay;
  const void* lr;
  const float* check;  // null, or the update runs only when it is finite
  int32_t lr_dtype;
  int32_t nesterov;
};

// The update runs: no check, or a finite one (read by the first thread of each block).
__device__ __forceinline__ bool check_passes(const float* check) {
  return check == nullptr || finite_f32(*check);
}

template <class G>
struct SgdLaunch {
  float* param[kCap];
  const G* grad[kCap];
  float* buf[kCap];
  int64_t numel[kCap];
  int32_t first_block[kCap];
  int32_t count;
  SgdHyper h;
  LossScaleArgs scaler;  // with `done`: the loss scale's update, by the last block of all
  unsigned* done;        // null: no loss scale here
  int32_t total_blocks;  // blocks of every launch of the sequence
};
static_assert(sizeof(SgdLaunch<float>) <= 4000, "kernel parameters are limited to 4 KiB");

struct SgdCoef {
  float lr, mom, keep, wd;
  bool run;
};

__device__ __forceinline__ SgdCoef sgd_coef(const SgdHyper& h) {
  SgdCoef k;
  k.lr = static_cast<float>(read_scalar(h.lr, h.lr_dtype));
  k.mom = static_cast<float>(h.momentum);
  k.keep = static_cast<float>(__dsub_rn(1.0, h.dampening));  // share of the gradient entering buf
  k.wd = static_cast<float>(h.weight_decay);
  k.run = check_passes(h.check);
  return k;
}

// g ← grad + wd·param; with momentum buf ← mom·buf + (1 − dampening)·g and g ← g + mom·buf
// (nesterov) or buf; param ← param − lr·g.
__device__ __forceinline__ void sgd_element(const SgdCoef& k, bool has_buf, bool nesterov,
                                            float& p, float grad, float& buf) {
  float g = grad;
  if (k.wd != 0.f) g = __fadd_rn(g, __fmul_rn(k.wd, p));
  if (has_buf) {
    const float m = __fadd_rn(__fmul_rn(k.mom, buf), __fmul_rn(k.keep, g));
    buf = m;
    g = nesterov ? __fadd_rn(g, __fmul_rn(k.mom, m)) : m;
  }
  p = __fsub_rn(p, __fmul_rn(k.lr, g));
}

// The block's chunk of its tensor.
template <class G>
__device__ __forceinline__ void sgd_chunk(const SgdLaunch<G>& L, const SgdCoef& k) {
  const int t = block_tensor(L);
  const int64_t begin = static_cast<int64_t>(static_cast<int32_t>(blockIdx.x) - L.first_block[t]) * kChunk;
  const int64_t end = L.numel[t] < begin + kChunk ? L.numel[t] : begin + kChunk;
  float* p = L.param[t];
  const G* g = L.grad[t];
  const bool has_buf = L.h.momentum != 0;  // with momentum 0 a given buffer is left untouched
  float* buf = has_buf ? L.buf[t] : nullptr;
  const bool nesterov = L.h.nesterov != 0;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
                         reinterpret_cast<uintptr_t>(buf);
  int64_t e = begin + threadIdx.x;  // first element left to the scalar loop
  if (bits % 16 == 0) {
    const int64_t packs = (end - begin) / 4;
    for (int64_t j = threadIdx.x; j < packs; j += blockDim.x) {
      const int64_t o = begin + 4 * j;
      F4 pp = *reinterpret_cast<const F4*>(p + o);
      const F4 gg = load4(g + o);
      F4 bb{};
      if (has_buf) bb = *reinterpret_cast<const F4*>(buf + o);
#pragma unroll
      for (int q = 0; q < 4; ++q) sgd_element(k, has_buf, nesterov, pp.v[q], gg.v[q], bb.v[q]);
      *reinterpret_cast<F4*>(p + o) = pp;
      if (has_buf) *reinterpret_cast<F4*>(buf + o) = bb;
    }
    e = begin + packs * 4 + threadIdx.x;  // fewer than 4 elements remain, one per thread
  }
  for (; e < end; e += blockDim.x) {
    float pe = p[e], be = has_buf ? buf[e] : 0.f;
    sgd_element(k, has_buf, nesterov, pe, to_accum<G>(g[e]), be);
    p[e] = pe;
    if (has_buf) buf[e] = be;
  }
}

template <class G>
__global__ void __launch_bounds__(kOptimBlock) multi_sgd_kernel(const SgdLaunch<G> L) {
  pdl_begin();
  __shared__ SgdCoef s_coef;
  if (threadIdx.x == 0) s_coef = sgd_coef(L.h);
  __syncthreads();
  const SgdCoef k = s_coef;
  if (k.run) sgd_chunk(L, k);  // the same for the whole block
  scale_after_update(L);
}

// ---- AdamW ----

struct AdamwHyper {
  double beta1, beta2, eps, weight_decay;
  const void* lr;
  const void* step;
  const float* check;  // as SgdHyper::check
  int32_t lr_dtype, step_dtype;
};

template <class G>
struct AdamwLaunch {
  float* param[kCap];
  const G* grad[kCap];
  float* m[kCap];
  float* v[kCap];
  int64_t numel[kCap];
  int32_t first_block[kCap];
  int32_t count;
  AdamwHyper h;
  DeviceErrorRecord* error;
  LossScaleArgs scaler;  // as SgdLaunch's
  unsigned* done;
  int32_t total_blocks;
};
static_assert(sizeof(AdamwLaunch<float>) <= 4000, "kernel parameters are limited to 4 KiB");

struct AdamwCoef {
  float decay, b1, b2, omb1, omb2, step_size, bc2_sqrt, eps;
  double step;
  bool ok, run;
};

__device__ __forceinline__ AdamwCoef adamw_coef(const AdamwHyper& h) {
  AdamwCoef k;
  const double lr = read_scalar(h.lr, h.lr_dtype);
  k.step = read_scalar(h.step, h.step_dtype);
  k.ok = k.step >= 1;  // bias correction divides by 1 − β^step, 0 at step 0 (NaN fails too)
  k.decay = static_cast<float>(__dsub_rn(1.0, __dmul_rn(lr, h.weight_decay)));
  k.b1 = static_cast<float>(h.beta1);
  k.b2 = static_cast<float>(h.beta2);
  k.omb1 = static_cast<float>(__dsub_rn(1.0, h.beta1));
  k.omb2 = static_cast<float>(__dsub_rn(1.0, h.beta2));
  k.step_size = static_cast<float>(__ddiv_rn(lr, __dsub_rn(1.0, pow(h.beta1, k.step))));
  k.bc2_sqrt = static_cast<float>(__dsqrt_rn(__dsub_rn(1.0, pow(h.beta2, k.step))));
  k.eps = static_cast<float>(h.eps);
  k.run = check_passes(h.check);
  return k;
}

// m ← β₁m + (1 − β₁)g; v ← β₂v + (1 − β₂)g²;
// param ← param·(1 − lr·wd) − step_size·(m / (√v / √(1 − β₂ᵗ) + eps)).
__device__ __forceinline__ void adamw_element(const AdamwCoef& k, float& p, float g, float& m,
                                              float& v) {
  const float mi = __fadd_rn(__fmul_rn(k.b1, m), __fmul_rn(k.omb1, g));
  const float vi = __fadd_rn(__fmul_rn(k.b2, v), __fmul_rn(__fmul_rn(k.omb2, g), g));
  m = mi;
  v = vi;
  const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
  p = __fsub_rn(__fmul_rn(p, k.decay), __fmul_rn(k.step_size, __fdiv_rn(mi, den)));
}

// The block's chunk of its tensor.
template <class G>
__device__ __forceinline__ void adamw_chunk(const AdamwLaunch<G>& L, const AdamwCoef& k) {
  const int t = block_tensor(L);
  const int64_t begin = static_cast<int64_t>(static_cast<int32_t>(blockIdx.x) - L.first_block[t]) * kChunk;
  const int64_t end = L.numel[t] < begin + kChunk ? L.numel[t] : begin + kChunk;
  float* p = L.param[t];
  const G* g = L.grad[t];
  float* m = L.m[t];
  float* v = L.v[t];
  const uintptr_t bits = reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
                         reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v);
  int64_t e = begin + threadIdx.x;
  if (bits % 16 == 0) {
    const int64_t packs = (end - begin) / 4;
    for (int64_t j = threadIdx.x; j < packs; j += blockDim.x) {
      const int64_t o = begin + 4 * j;
      F4 pp = *reinterpret_cast<const F4*>(p + o);
      const F4 gg = load4(g + o);
      F4 mm = *reinterpret_cast<const F4*>(m + o);
      F4 vv = *reinterpret_cast<const F4*>(v + o);
#pragma unroll
      for (int q = 0; q < 4; ++q) adamw_element(k, pp.v[q], gg.v[q], mm.v[q], vv.v[q]);
      *reinterpret_cast<F4*>(p + o) = pp;
      *reinterpret_cast<F4*>(m + o) = mm;
      *reinterpret_cast<F4*>(v + o) = vv;
    }
    e = begin + packs * 4 + threadIdx.x;
  }
  for (; e < end; e += blockDim.x) adamw_element(k, p[e], to_accum<G>(g[e]), m[e], v[e]);
}

template <class G>
__global__ void __launch_bounds__(kOptimBlock) multi_adamw_kernel(const AdamwLaunch<G> L) {
  pdl_begin();
  __shared__ AdamwCoef s_coef;
  if (threadIdx.x == 0) {
    s_coef = adamw_coef(L.h);
    // Reported by one block of the launch; every block then leaves its chunk untouched. A
    // skipped step (check not finite) is no error, whatever its step.
    if (s_coef.run && !s_coef.ok && blockIdx.x == 0 && L.error)
      report_error(L.error, kErrAdamStep, __double2ll_rn(s_coef.step * 1e6), 0, 0);
  }
  __syncthreads();
  const AdamwCoef k = s_coef;
  if (k.run && k.ok) adamw_chunk(L, k);  // the same for the whole block
  scale_after_update(L);
}

// ---- launchers ----

void check_scalar_dtype(int32_t dtype, const char* what) {
  PLX_REQUIRE(dtype == PLX_F32 || dtype == PLX_F64, "%s must be f32 or f64, got %s", what,
              dtype_name(dtype));
}

}  // namespace

namespace {

// The blocks of a launch sequence over these tensors (pack_launches: one per kChunk elements).
int64_t update_blocks(int32_t count, const int64_t* numel) {
  int64_t blocks = 0;
  for (int32_t i = 0; i < count; ++i)
    if (numel[i] > 0) blocks += (numel[i] + kChunk - 1) / kChunk;
  return blocks;
}

// A loss scale's update joining the launch sequence (null: none).
template <class Launch>
void with_scaler(Launch& L, const LossScaleArgs* scaler, unsigned* done, int32_t count,
                 const int64_t* numel) {
  if (!scaler) return;
  PLX_REQUIRE(done, "multi-tensor update: a loss scale needs a block counter");
  const int64_t total = update_blocks(count, numel);
  PLX_REQUIRE(total > 0 && total < INT32_MAX, "multi-tensor update: %lld blocks",
              static_cast<long long>(total));
  L.scaler = *scaler;
  L.done = done;
  L.total_blocks = static_cast<int32_t>(total);
}

template <class G>
void launch_sgd_typed(const MultiSgdArgs& a, cudaStream_t stream) {
  SgdLaunch<G> L{};
  L.h = SgdHyper{a.momentum, a.dampening, a.weight_decay, a.lr, a.check, a.lr_dtype,
                 a.nesterov ? 1 : 0};
  with_scaler(L, a.scaler, a.done, a.count, a.numel);
  pack_launches<kChunk, kCap>(
      L, a.count, a.numel, "multi-tensor update",
      [&](int slot, int32_t i) {
        L.param[slot] = a.param[i];
        L.grad[slot] = static_cast<const G*>(a.grad[i]);
        L.buf[slot] = a.momentum_buf ? a.momentum_buf[i] : nullptr;
      },
      [&](unsigned blocks) {
        launch_kernel(multi_sgd_kernel<G>, blocks, kOptimBlock, 0, stream, L);
      });
}

template <class G>
void launch_adamw_typed(const MultiAdamwArgs& a, cudaStream_t stream) {
  AdamwLaunch<G> L{};
  L.h = AdamwHyper{a.beta1, a.beta2, a.eps, a.weight_decay, a.lr, a.step, a.check, a.lr_dtype,
                   a.step_dtype};
  L.error = a.error;
  with_scaler(L, a.scaler, a.done, a.count, a.numel);
  pack_launches<kChunk, kCap>(
      L, a.count, a.numel, "multi-tensor update",
      [&](int slot, int32_t i) {
        L.param[slot] = a.param[i];
        L.grad[slot] = static_cast<const G*>(a.grad[i]);
        L.m[slot] = a.exp_avg[i];
        L.v[slot] = a.exp_avg_sq[i];
      },
      [&](unsigned blocks) {
        launch_kernel(multi_adamw_kernel<G>, blocks, kOptimBlock, 0, stream, L);
      });
}

[[noreturn]] void bad_grad_dtype(int32_t dtype) {
  throw sdk::Error(PLX_ERR_INTERNAL, sdk::format("multi-tensor update: no %s gradient kernel",
                                                 dtype_name(dtype)));
}

}  // namespace

namespace {

// No element to update: the loss scale (if any) still moves, alone.
bool scaler_alone(const LossScaleArgs* scaler, int32_t count, const int64_t* numel,
                  cudaStream_t stream) {
  if (update_blocks(std::max(count, 0), numel) > 0) return false;
  if (scaler) launch_loss_scale_update(*scaler, stream);
  return true;
}

}  // namespace

void launch_multi_sgd(const MultiSgdArgs& a, cudaStream_t stream) {
  if (scaler_alone(a.scaler, a.count, a.numel, stream)) return;
  check_scalar_dtype(a.lr_dtype, "sgd_update: lr");
  PLX_REQUIRE(a.momentum == 0 || a.momentum_buf != nullptr, "sgd_update: momentum needs momentum_buf");
  switch (a.grad_dtype) {
    case PLX_F32: return launch_sgd_typed<float>(a, stream);
    case PLX_F16: return launch_sgd_typed<f16>(a, stream);
    case PLX_BF16: return launch_sgd_typed<bf16>(a, stream);
    default: bad_grad_dtype(a.grad_dtype);
  }
}

void launch_multi_adamw(const MultiAdamwArgs& a, cudaStream_t stream) {
  if (scaler_alone(a.scaler, a.count, a.numel, stream)) return;
  check_scalar_dtype(a.lr_dtype, "adamw_update: lr");
  check_scalar_dtype(a.step_dtype, "adamw_update: step");
  switch (a.grad_dtype) {
    case PLX_F32: return launch_adamw_typed<float>(a, stream);
    case PLX_F16: return launch_adamw_typed<f16>(a, stream);
    case PLX_BF16: return launch_adamw_typed<bf16>(a, stream);
    default: bad_grad_dtype(a.grad_dtype);
  }
}

void launch_loss_scale_update(const LossScaleArgs& a, cudaStream_t stream) {
  launch_kernel(loss_scale_kernel, 1, 1, 0, stream, a);
}

namespace {

// The value of a scalar input (shape () or (1), f32 or f64) stays on the device; only its
// description is checked here.
void check_scalar_input(const NodeInfo& node, int32_t i, const char* name) {
  const plx_tensor& t = node.input(i);
  PLX_REQUIRE(numel(t) == 1, "%s: %s must hold one value, has %lld", node.op(), name,
              static_cast<long long>(numel(t)));
  PLX_REQUIRE(t.dtype == PLX_F32 || t.dtype == PLX_F64, "%s: %s must be f32 or f64, got %s",
              node.op(), name, dtype_name(t.dtype));
}

// An update's optional check: one f32 value when given (the schema's rule, for hand-made nodes).
void check_check_input(const NodeInfo& node, int32_t i) {
  if (!node.has_input(i)) return;
  PLX_REQUIRE(node.input(i).dtype == PLX_F32 && numel(node.input(i)) == 1,
              "%s: check must be one f32 value", node.op());
}

// Inputs: param (mutated), grad, momentum_buf (optional, mutated), lr, check (optional).
class SgdUpdate final : public Kernel {
 public:
  SgdUpdate(const NodeInfo& node, CudaBackend&)
      : device_(node.device()),
        momentum_(node.attr_float("momentum")),
        dampening_(node.attr_float("dampening")),
        weight_decay_(node.attr_float("weight_decay")),
        nesterov_(node.attr_int("nesterov") != 0) {
    // The schema checked this; a kernel built from a hand-made node must not read a null buffer.
    PLX_REQUIRE(momentum_ == 0 || node.has_input(2), "sgd_update: momentum needs momentum_buf");
    check_scalar_input(node, 3, "lr");
    check_check_input(node, 4);
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    float* param = ptr<float>(c.in(0));                          // (any shape)
    const void* grad = c.in(1).data;                             // (same) f32
    float* buf = momentum_ != 0 ? ptr<float>(c.in(2)) : nullptr;  // (same) or unused
    const int64_t n = numel(c.in(0));
    MultiSgdArgs a;
    a.count = 1;
    a.param = &param;
    a.grad = &grad;
    a.momentum_buf = &buf;
    a.numel = &n;
    a.momentum = momentum_;
    a.dampening = dampening_;
    a.weight_decay = weight_decay_;
    a.nesterov = nesterov_;
    a.lr = c.in(3).data;
    a.lr_dtype = c.in(3).dtype;
    a.check = static_cast<const float*>(c.in(4).data);  // null when absent
    launch_multi_sgd(a, native(c.stream));
  }

 private:
  int32_t device_;
  double momentum_, dampening_, weight_decay_;
  bool nesterov_;
};

// Inputs: param (mutated), grad, exp_avg (mutated), exp_avg_sq (mutated), lr, step, check
// (optional).
class AdamwUpdate final : public Kernel {
 public:
  AdamwUpdate(const NodeInfo& node, CudaBackend& backend)
      : device_(node.device()),
        err_(backend.context(device_).error_dev),
        beta1_(node.attr_float("beta1")),
        beta2_(node.attr_float("beta2")),
        eps_(node.attr_float("eps")),
        weight_decay_(node.attr_float("weight_decay")) {
    check_scalar_input(node, 4, "lr");
    check_scalar_input(node, 5, "step");
    check_check_input(node, 6);
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    float* param = ptr<float>(c.in(0));       // (any shape)
    const void* grad = c.in(1).data;          // (same) f32
    float* m = ptr<float>(c.in(2));           // (same) first moment
    float* v = ptr<float>(c.in(3));           // (same) second moment
    const int64_t n = numel(c.in(0));
    MultiAdamwArgs a;
    a.count = 1;
    a.param = &param;
    a.grad = &grad;
    a.exp_avg = &m;
    a.exp_avg_sq = &v;
    a.numel = &n;
    a.beta1 = beta1_;
    a.beta2 = beta2_;
    a.eps = eps_;
    a.weight_decay = weight_decay_;
    a.lr = c.in(4).data;
    a.lr_dtype = c.in(4).dtype;
    a.step = c.in(5).data;
    a.step_dtype = c.in(5).dtype;
    a.check = static_cast<const float*>(c.in(6).data);  // null when absent
    a.error = err_;
    launch_multi_adamw(a, native(c.stream));
  }

 private:
  int32_t device_;
  DeviceErrorRecord* err_;
  double beta1_, beta2_, eps_, weight_decay_;
};

// Inputs: check, scale, unscale, good, skipped (mutated but check), step (optional, mutated);
// output report (5): f32 values, one each, on the device.
class LossScaleUpdate final : public Kernel {
 public:
  LossScaleUpdate(const NodeInfo& node, CudaBackend&) : device_(node.device()) {
    for (int32_t i = 0; i < 6; ++i)
      if (i < 5 || node.has_input(i))
        PLX_REQUIRE(node.input(i).dtype == PLX_F32 && numel(node.input(i)) == 1,
                    "loss_scale_update: input %d must be one f32 value", i);
    a_.interval = static_cast<float>(node.attr_int("growth_interval"));
    a_.growth = static_cast<float>(node.attr_float("growth_factor"));
    a_.backoff = static_cast<float>(node.attr_float("backoff_factor"));
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    LossScaleArgs a = a_;
    a.check = static_cast<const float*>(c.in(0).data);
    a.scale = ptr<float>(c.in(1));
    a.unscale = ptr<float>(c.in(2));
    a.good = ptr<float>(c.in(3));
    a.skipped = ptr<float>(c.in(4));
    a.step = static_cast<float*>(c.in(5).data);  // null when absent
    a.report = ptr<float>(c.out(0));
    launch_loss_scale_update(a, native(c.stream));
  }

 private:
  int32_t device_;
  LossScaleArgs a_;
};

}  // namespace

void register_optim(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  r.add<SgdUpdate, CudaBackend>("sgd_update", PLX_F32, "multi-tensor", f);
  r.add<AdamwUpdate, CudaBackend>("adamw_update", PLX_F32, "multi-tensor", f);
  r.add<LossScaleUpdate, CudaBackend>("loss_scale_update", PLX_F32, "scalar", f);
}

}  // namespace plexus::cuda
