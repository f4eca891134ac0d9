// Device helpers shared by the elementwise, misc and optim families (included by their .cu files
// only): 16-byte vector access, walking a strided or broadcast tensor without a division per
// element, and reporting bad data once per block.
#pragma once

#include <climits>
#include <cstdint>

#include "device.cuh"

namespace plexus::cuda {

constexpr int kMaxDims = PLX_MAX_DIMS;

// ---- vector access ----

// Elements of T in one 16-byte access.
template <class T>
inline constexpr int kVec = static_cast<int>(16 / sizeof(T));

// V consecutive elements moved as one access; aligned to its size so that a 16-byte pack is
// one 128-bit load or store.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}
inline bool aligned16(const void* p) { return aligned_to(p, 16); }

__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// ---- bad data, reported once per block ----

// The first (lowest position) bad item a thread saw.
struct BadItem {
  long long pos = LLONG_MAX;
  long long value = 0;
  __device__ __forceinline__ void note(long long p, long long v) {
    if (p < pos) {
      pos = p;
      value = v;
    }
  }
};

// Reports the block's lowest bad position (a = position, b = its value, c = `c`). One report
// per block, not per element: the record lives in mapped host memory, and a tensor full of bad
// values must not send one atomic per element across PCIe. Every thread of the (1-D) block must
// call it, after its last loop.
__device__ __forceinline__ void report_block(const BadItem& bad, DeviceErrorRecord* err,
                                             int32_t code, long long c) {
  const bool mine = bad.pos != LLONG_MAX;
  if (!__syncthreads_or(mine)) return;  // the common case: one barrier, nothing to report
  __shared__ unsigned long long s_pos;
  __shared__ long long s_value;
  if (threadIdx.x == 0) s_pos = ULLONG_MAX;
  __syncthreads();
  if (mine) atomicMin(&s_pos, static_cast<unsigned long long>(bad.pos));  // positions are >= 0
  __syncthreads();
  // Threads that saw the same position saw the same value: the race writes one value.
  if (mine && static_cast<unsigned long long>(bad.pos) == s_pos) s_value = bad.value;
  __syncthreads();
  if (threadIdx.x == 0) report_error(err, code, static_cast<long long>(s_pos), s_value, c);
}

// ---- strided walks ----

// K operands walked in step over the row-major elements of an output. Dimensions are stored
// innermost first; size-1 dimensions are dropped and contiguous neighbours merged by the host
// planners, so most plans have one or two dimensions. `step` is the grid's stride (threads in
// the grid) written in the mixed radix of `size`, so a thread advances its position with
// additions and carries instead of dividing per element.
template <int K>
struct StridedPlan {
  int32_t ndim = 1;   // >= 1
  int64_t n = 0;      // elements of the output
  int64_t size[kMaxDims] = {};
  int64_t step[kMaxDims] = {};
  int64_t stride[K][kMaxDims] = {};  // in elements; 0 where the operand is broadcast

  // Sets `step` for a launch of `threads` threads in all.
  void set_step(int64_t threads) {
    for (int d = 0; d < ndim - 1; ++d) {
      step[d] = threads % size[d];
      threads /= size[d];
    }
    step[ndim - 1] = threads;  // not reduced: a carry out of the top means the walk is over
  }
};

template <int K>
struct Cursor {
  int64_t idx[kMaxDims];

  // The loops run over kMaxDims with a guard so that every array index is a constant and idx
  // stays in registers.
  __device__ __forceinline__ void start(const StridedPlan<K>& p, int64_t i) {
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      idx[d] = 0;
      if (d < p.ndim) {
        const int64_t q = i / p.size[d];
        idx[d] = i - q * p.size[d];
        i = q;
      }
    }
  }
  __device__ __forceinline__ int64_t offset(const StridedPlan<K>& p, int k) const {
    int64_t o = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d)
      if (d < p.ndim) o += idx[d] * p.stride[k][d];
    return o;
  }
  // Moves by p.step: idx[d] and step[d] are below size[d], so one subtraction undoes a wrap.
  // Past the last element the top digit may hold anything; the caller's bound ends the walk.
  __device__ __forceinline__ void advance(const StridedPlan<K>& p) {
    int64_t carry = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d < p.ndim) {
        const int64_t v = idx[d] + p.step[d] + carry;
        carry = v >= p.size[d] ? 1 : 0;
        idx[d] = carry ? v - p.size[d] : v;
      }
    }
  }
};

// ---- host planners ----

// The output y with K row-major contiguous operands that broadcast to it (NumPy rules, aligned
// at the right). Same merging as the CPU plugin's plan_broadcast: size-1 dimensions dropped,
// a dimension merged into its outer neighbour when every operand steps through both as one.
template <int K>
StridedPlan<K> plan_broadcast(const plx_tensor& y, const plx_tensor* const (&ops)[K]) {
  int64_t full[K][kMaxDims] = {};  // per output dimension (outermost first), 0 where broadcast
  for (int k = 0; k < K; ++k) {
    const plx_tensor& t = *ops[k];
    const int32_t lead = y.ndim - t.ndim;
    int64_t s = 1;
    for (int32_t j = t.ndim - 1; j >= 0; --j) {
      full[k][j + lead] = t.shape[j] == 1 ? 0 : s;
      s *= t.shape[j];
    }
  }
  int nd = 0;
  int64_t size[kMaxDims] = {}, stride[K][kMaxDims] = {};
  int64_t n = 1;
  for (int32_t i = 0; i < y.ndim; ++i) {
    const int64_t len = y.shape[i];
    n *= len;
    if (len == 1) continue;
    if (nd > 0) {
      bool merge = true;
      for (int k = 0; k < K; ++k) merge = merge && full[k][i] * len == stride[k][nd - 1];
      if (merge) {
        size[nd - 1] *= len;
        for (int k = 0; k < K; ++k) stride[k][nd - 1] = full[k][i];
        continue;
      }
    }
    size[nd] = len;
    for (int k = 0; k < K; ++k) stride[k][nd] = full[k][i];
    ++nd;
  }
  StridedPlan<K> p;
  p.n = n;
  if (nd == 0) {  // a single element (or none): one dimension of 1, every operand at offset 0
    p.ndim = 1;
    p.size[0] = 1;
    return p;
  }
  p.ndim = nd;
  for (int d = 0; d < nd; ++d) {  // innermost first
    p.size[d] = size[nd - 1 - d];
    for (int k = 0; k < K; ++k) p.stride[k][d] = stride[k][nd - 1 - d];
  }
  return p;
}

// A tensor with any strides (negative, zero, overlapping) read in row-major order, as the CPU
// plugin's copy plans it: size-1 dimensions dropped, a dimension merged into its outer neighbour
// when the two are contiguous with each other. ndim is 1 with stride 1 when the elements are
// already in order.
inline StridedPlan<1> plan_strided(const plx_tensor& x) {
  int64_t size[kMaxDims], stride[kMaxDims];  // outermost first
  int nd = 0;
  int64_t n = 1;
  for (int32_t i = 0; i < x.ndim; ++i) {
    n *= x.shape[i];
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
  StridedPlan<1> p;
  p.n = n;
  if (nd == 0) {  // a single element (or none)
    p.ndim = 1;
    p.size[0] = 1;
    p.stride[0][0] = 1;
    return p;
  }
  p.ndim = nd;
  for (int d = 0; d < nd; ++d) {  // innermost first
    p.size[d] = size[nd - 1 - d];
    p.stride[0][d] = stride[nd - 1 - d];
  }
  return p;
}

// y[i] = x[offset of i]: a row-major output gathered through a one-operand plan (a broadcast
// for expand, any strides for copy). U is an unsigned type of the element's size.
template <class U>
__global__ void __launch_bounds__(kBlock) gather_kernel(StridedPlan<1> p, const U* x, U* y) {
  pdl_begin();
  int64_t i = thread_index();
  Cursor<1> c;
  c.start(p, i);
  for (; i < p.n; i += thread_count()) {
    y[i] = x[c.offset(p, 0)];
    c.advance(p);
  }
}

}  // namespace plexus::cuda
