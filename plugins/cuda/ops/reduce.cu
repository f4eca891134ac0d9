// CUDA kernels: reductions (sum, mean, argmax; see docs/ops.md).
//
// One engine for all three. x's dimensions (size-1 ones dropped) are merged into groups of
// adjacent kept or reduced dimensions, as the CPU plugin does; an output is then a position in
// the kept groups and sums (or searches) the positions of the reduced groups. What the innermost
// group is decides the kernel:
//  - reduced innermost ("rows"): a team of threads per output walks the reduced positions, which
//    are contiguous along the innermost group: one thread for very short rows, a warp for short
//    ones, the whole block for long ones;
//  - kept innermost ("columns"): a 32 x 8 block takes 32 neighbouring outputs (coalesced loads
//    across threadIdx.x), its 8 rows of threads splitting the reduced positions.
// When there are too few outputs to fill the GPU the reduced range is split into chunks along
// gridDim.y; each chunk writes a partial to the workspace and a second kernel combines the
// chunks of each output in chunk order.
//
// Determinism: every thread combines its elements in index order, teams combine threads in a
// fixed tree (shuffle-down, then warps in order), chunks are combined in order. The launch
// geometry is fixed when the kernel is created, so results are bit-identical run to run.
// Precision: floats accumulate in f32 (the catalogue's minimum) rather than the CPU's f64: f64
// arithmetic is slow on all but the data-centre parts, and the summation is blocked (a thread
// sums at most about red/(threads) elements before the tree adds partials pairwise), so the
// error grows with the per-thread run plus log2(threads), not with the length. Integer sums
// accumulate in 64-bit unsigned arithmetic, which wraps exactly as two's complement i64 does.
#include "device.cuh"

namespace plexus::cuda {

namespace {

constexpr int kColX = 32, kColY = 8;  // columns kernel: outputs x reduced-position slices
constexpr int64_t kRowsChunk = 4096;  // fewest reduced positions a block-team chunk gets
constexpr int64_t kColsChunk = 256;   // fewest reduced positions a columns chunk gets
constexpr int64_t kMaxGridX = int64_t{1} << 30;  // kernels loop past this many blocks

// x's dimensions in groups: kept ones (outer first) and reduced ones (outer first), each group
// merged into one row-major dimension with the stride of its innermost member.
using Groups = sdk::ReducePlan;

// Offset in x of the first element output o reduces.
__device__ __forceinline__ int64_t kept_offset(const Groups& g, int64_t o) {
  int64_t off = 0;
  for (int d = g.nk - 1; d >= 0; --d) {
    const int64_t q = o / g.kept_size[d];
    off += (o - q * g.kept_size[d]) * g.kept_stride[d];
    o = q;
  }
  return off;
}
// Offset of reduced position r from an output's first element.
__device__ __forceinline__ int64_t red_offset(const Groups& g, int64_t r) {
  int64_t off = 0;
  for (int d = g.nr - 1; d >= 0; --d) {
    const int64_t q = r / g.red_size[d];
    off += (r - q * g.red_size[d]) * g.red_stride[d];
    r = q;
  }
  return off;
}

// ---- what is reduced: a value type V, its identity, how an element becomes a V, how two V
// combine (associative; argmax's is also exact in any order), and what an output gets ----

template <class T, bool kMean>
struct SumPolicy {
  static constexpr bool kInt = std::is_integral_v<T>;
  using V = std::conditional_t<kInt, unsigned long long, float>;
  using Out = T;
  static __device__ __forceinline__ V identity() { return V(0); }
  static __device__ __forceinline__ V make(T x, int64_t) {
    if constexpr (kInt) return static_cast<V>(static_cast<long long>(x));  // sign-extended
    else return to_accum<T>(x);
  }
  static __device__ __forceinline__ V combine(V a, V b) { return a + b; }
  static __device__ __forceinline__ V shfl_down(V v, int o) {
    return __shfl_down_sync(0xffffffffu, v, o);
  }
  static __device__ __forceinline__ Out finish(V v, int64_t count) {
    if constexpr (kInt) {
      return static_cast<T>(static_cast<long long>(v));  // wraps to T's width
    } else {
      // 0 / 0 = nan: the mean of an empty reduction.
      if constexpr (kMean) return from_accum<T>(v / static_cast<float>(count));
      else return from_accum<T>(v);
    }
  }
};

// The first index of the maximum; nan is the maximum and the first nan wins. An index of -1
// marks the identity (no element yet).
template <class T>
struct ArgmaxPolicy {
  static constexpr bool kInt = std::is_integral_v<T>;
  using A = std::conditional_t<kInt, T, float>;
  struct V {
    A v;
    long long i;
  };
  using Out = int64_t;
  static __device__ __forceinline__ V identity() { return V{A(0), -1}; }
  static __device__ __forceinline__ V make(T x, int64_t r) { return V{to_accum<T>(x), r}; }
  // The larger of (value, -index) with nan above every number: a total order, so the result
  // does not depend on how the elements are grouped.
  static __device__ __forceinline__ V combine(V a, V b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if constexpr (!kInt) {
      const bool an = a.v != a.v, bn = b.v != b.v;
      if (an || bn) {
        if (an && bn) return a.i < b.i ? a : b;
        return an ? a : b;
      }
    }
    if (a.v > b.v) return a;
    if (b.v > a.v) return b;
    return a.i < b.i ? a : b;
  }
  static __device__ __forceinline__ V shfl_down(V v, int o) {
    return V{__shfl_down_sync(0xffffffffu, v.v, o), __shfl_down_sync(0xffffffffu, v.i, o)};
  }
  static __device__ __forceinline__ Out finish(V v, int64_t) { return v.i; }
};

// Combines the warp's values into lane 0 (a fixed shuffle-down tree).
template <class P>
__device__ __forceinline__ typename P::V warp_reduce(typename P::V v) {
  for (int o = 16; o > 0; o >>= 1) v = P::combine(v, P::shfl_down(v, o));
  return v;
}
// Combines the block's values into thread 0: each warp, then the warps in order.
template <class P>
__device__ __forceinline__ typename P::V block_reduce(typename P::V v, typename P::V* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce<P>(v);
  __syncthreads();  // the previous call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : P::identity();
    v = warp_reduce<P>(v);
  }
  return v;
}

// Rows: a team of kTeam threads per output (kTeam is 1, 32 or kBlock). Chunk blockIdx.y of the
// reduced range; with `partial` the team writes its chunk's value there (chunk-major), else the
// output. kSimple: one reduced group, whose stride is 1.
template <class P, class T, int kTeam, bool kSimple>
__global__ void __launch_bounds__(kBlock)
    reduce_rows(const T* __restrict__ x, typename P::Out* __restrict__ y,
                typename P::V* __restrict__ partial, Groups g, int64_t outs, int64_t red,
                int64_t chunk_len) {
  pdl_begin();
  using V = typename P::V;
  constexpr int kTeams = kBlock / kTeam;
  const int lane = static_cast<int>(threadIdx.x) % kTeam;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_len;
  const int64_t r1 = min(red, r0 + chunk_len);
  // The loop bound is uniform over each team: a team's threads leave together.
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam; o < outs;
       o += static_cast<int64_t>(gridDim.x) * kTeams) {
    const T* src = x + kept_offset(g, o);
    V acc = P::identity();
#pragma unroll 4
    for (int64_t r = r0 + lane; r < r1; r += kTeam)
      acc = P::combine(acc, P::make(src[kSimple ? r : red_offset(g, r)], r));
    if constexpr (kTeam == 32) {
      acc = warp_reduce<P>(acc);
    } else if constexpr (kTeam == kBlock) {
      __shared__ V shared[32];
      acc = block_reduce<P>(acc, shared);
    }
    if (lane == 0) {
      if (partial) partial[static_cast<int64_t>(blockIdx.y) * outs + o] = acc;
      else y[o] = P::finish(acc, red);
    }
  }
}

// Columns: the innermost kept group (`inner` outputs, stride 1) is cut into tiles of kColX;
// block t takes tile t % tiles_per_row of kept row t / tiles_per_row, threadIdx.y the reduced
// positions r0 + threadIdx.y, r0 + threadIdx.y + kColY, ... of chunk blockIdx.y. The kColY
// partial values of an output are combined in threadIdx.y order.
template <class P, class T, bool kSimple>
__global__ void __launch_bounds__(kColX* kColY)
    reduce_cols(const T* __restrict__ x, typename P::Out* __restrict__ y,
                typename P::V* __restrict__ partial, Groups g, int64_t outs, int64_t red,
                int64_t chunk_len, int64_t inner, int64_t tiles_per_row, int64_t tiles) {
  pdl_begin();
  using V = typename P::V;
  __shared__ V shared[kColY][kColX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_len;
  const int64_t r1 = min(red, r0 + chunk_len);
  const int64_t rstride = g.red_stride[0];  // kSimple: the one reduced group
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform over the block
    const int64_t k = t % tiles_per_row * kColX + tx;
    const int64_t o = t / tiles_per_row * inner + k;
    const bool active = k < inner;
    V acc = P::identity();
    if (active) {
      const T* src = x + kept_offset(g, o);
#pragma unroll 4
      for (int64_t r = r0 + ty; r < r1; r += kColY)
        acc = P::combine(acc, P::make(src[kSimple ? r * rstride : red_offset(g, r)], r));
    }
    shared[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && active) {
      for (int j = 1; j < kColY; ++j) acc = P::combine(acc, shared[j][tx]);
      if (partial) partial[static_cast<int64_t>(blockIdx.y) * outs + o] = acc;
      else y[o] = P::finish(acc, red);
    }
    __syncthreads();  // before the next tile overwrites `shared`
  }
}

// Combines each output's chunk partials in chunk order.
template <class P>
__global__ void reduce_chunks(const typename P::V* __restrict__ partial,
                              typename P::Out* __restrict__ y, int64_t outs, int64_t chunks,
                              int64_t red) {
  pdl_begin();
  PLX_GRID_STRIDE(o, outs) {
    typename P::V acc = partial[o];
    for (int64_t ch = 1; ch < chunks; ++ch) acc = P::combine(acc, partial[ch * outs + o]);
    y[o] = P::finish(acc, red);
  }
}

// Nothing reduced (x and y hold the same elements in the same order: each output "reduces" its
// one element at position 0), or an empty reduction (the identity over 0 elements).
template <class P, class T>
__global__ void reduce_trivial(const T* __restrict__ x, typename P::Out* __restrict__ y,
                               int64_t outs, bool copy) {
  pdl_begin();
  PLX_GRID_STRIDE(o, outs) {
    y[o] = copy ? P::finish(P::make(x[o], 0), 1) : P::finish(P::identity(), 0);
  }
}

// ---- the kernel class ----

enum class Mode { kNothing, kCopy, kEmpty, kRows, kCols };

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Chunks for `blocks` blocks of work over `red` positions: enough to put about `target` blocks
// on the GPU, each chunk at least `min_len` long.
int64_t pick_chunks(int64_t blocks, int64_t red, int64_t min_len, int64_t target) {
  if (blocks >= target || red < 2 * min_len) return 1;
  return std::clamp<int64_t>(std::min(ceil_div(target, blocks), red / min_len), 1, 65535);
}

// The engine behind the sum, mean and argmax kernels: the plan is made once, at creation.
template <class P, class T>
class ReduceEngine {
  using V = typename P::V;
  using Out = typename P::Out;

 public:
  // `reduced[i]`: whether x's dimension i is reduced.
  ReduceEngine(const plx_tensor& x, const bool* reduced, int32_t device, int sms)
      : device_(device) {
    g_ = sdk::plan_reduction(x, reduced);
    const Groups& g = g_;
    outs_ = g.out_numel;
    red_ = g.red_numel;

    const int64_t target = 4 * static_cast<int64_t>(std::max(sms, 1));
    if (outs_ == 0) {
      mode_ = Mode::kNothing;
    } else if (g.nr == 0) {
      mode_ = Mode::kCopy;
    } else if (red_ == 0) {
      mode_ = Mode::kEmpty;
    } else if (!g.columns) {
      mode_ = Mode::kRows;
      team_ = red_ <= 16 ? 1 : red_ < 2048 ? 32 : kBlock;
      blocks_ = ceil_div(outs_, kBlock / team_);
      if (team_ == kBlock) chunks_ = pick_chunks(blocks_, red_, kRowsChunk, target);
    } else {
      mode_ = Mode::kCols;
      inner_ = g.kept_size[g.nk - 1];
      tiles_per_row_ = ceil_div(inner_, kColX);
      blocks_ = outs_ / inner_ * tiles_per_row_;
      chunks_ = pick_chunks(blocks_, red_, kColsChunk, target);
    }
    chunk_len_ = ceil_div(std::max<int64_t>(red_, 1), chunks_);
    chunks_ = ceil_div(std::max<int64_t>(red_, 1), chunk_len_);  // no empty chunk
  }

  uint64_t workspace_bytes() const {
    return chunks_ > 1 ? static_cast<uint64_t>(chunks_ * outs_) * sizeof(V) : 0;
  }

  void compute(const KernelCall& c) const {
    if (mode_ == Mode::kNothing) return;
    use_device(device_);
    const cudaStream_t s = native(c.stream);
    const T* x = ptr<const T>(c.in(0));
    Out* y = ptr<Out>(c.out(0));
    if (mode_ == Mode::kCopy || mode_ == Mode::kEmpty) {
      launch_kernel(reduce_trivial<P, T>, grid_for(outs_), kBlock, 0, s, x, y, outs_,
                    mode_ == Mode::kCopy);
      return;
    }
    V* partial = chunks_ > 1 ? static_cast<V*>(c.workspace) : nullptr;
    const bool simple = g_.nr == 1;
    const dim3 grid(static_cast<unsigned>(std::min(blocks_, kMaxGridX)),
                    static_cast<unsigned>(chunks_));
    if (mode_ == Mode::kRows) {
      launch_rows(grid, s, x, y, partial, simple);
    } else {
      const dim3 block(kColX, kColY);
      const int64_t tiles = blocks_;
      if (simple)
        launch_kernel(reduce_cols<P, T, true>, grid, block, 0, s, x, y, partial, g_, outs_, red_,
                      chunk_len_, inner_, tiles_per_row_, tiles);
      else
        launch_kernel(reduce_cols<P, T, false>, grid, block, 0, s, x, y, partial, g_, outs_, red_,
                      chunk_len_, inner_, tiles_per_row_, tiles);
    }
    if (partial) {
      launch_kernel(reduce_chunks<P>, grid_for(outs_), kBlock, 0, s, partial, y, outs_, chunks_,
                    red_);
    }
  }

 private:
  template <int kTeam>
  void rows(dim3 grid, cudaStream_t s, const T* x, Out* y, V* partial, bool simple) const {
    if (simple)
      launch_kernel(reduce_rows<P, T, kTeam, true>, grid, kBlock, 0, s, x, y, partial, g_, outs_,
                    red_, chunk_len_);
    else
      launch_kernel(reduce_rows<P, T, kTeam, false>, grid, kBlock, 0, s, x, y, partial, g_, outs_,
                    red_, chunk_len_);
  }
  void launch_rows(dim3 grid, cudaStream_t s, const T* x, Out* y, V* partial, bool simple) const {
    if (team_ == 1) rows<1>(grid, s, x, y, partial, simple);
    else if (team_ == 32) rows<32>(grid, s, x, y, partial, simple);
    else rows<kBlock>(grid, s, x, y, partial, simple);
  }

  int32_t device_;
  Groups g_;
  Mode mode_ = Mode::kNothing;
  int64_t outs_ = 1, red_ = 1;
  int team_ = 1;
  int64_t blocks_ = 1, chunks_ = 1, chunk_len_ = 1;
  int64_t inner_ = 1, tiles_per_row_ = 1;  // columns
};

int sm_count(CudaBackend& b, int32_t device) {
  return b.context(device).prop.multiProcessorCount;
}

// sum and mean: `axes` (empty: all) as the core validated them; a 0-d x has no dimension.
template <class T, bool kMean>
class SumKernel final : public Kernel {
 public:
  SumKernel(const NodeInfo& node, CudaBackend& b) : impl_(make(node, b)) {}
  uint64_t workspace_bytes() const override { return impl_.workspace_bytes(); }
  void compute(const KernelCall& c) override { impl_.compute(c); }

 private:
  using Impl = ReduceEngine<SumPolicy<T, kMean>, T>;
  static Impl make(const NodeInfo& node, CudaBackend& b) {
    const plx_tensor& x = node.input(0);
    bool reduced[PLX_MAX_DIMS] = {};
    const auto axes = node.attr_ints("axes");
    for (int32_t i = 0; i < x.ndim; ++i) reduced[i] = axes.empty();
    for (int64_t a : axes) {
      const int64_t i = a < 0 ? a + x.ndim : a;
      if (i >= 0 && i < x.ndim) reduced[i] = true;  // a 0-d x accepts axis 0 and has no dims
    }
    return Impl(x, reduced, node.device(), sm_count(b, node.device()));
  }
  Impl impl_;
};

// argmax along `axis`: a reduction over that one dimension whose positions are the indices.
template <class T>
class ArgmaxKernel final : public Kernel {
 public:
  ArgmaxKernel(const NodeInfo& node, CudaBackend& b) : impl_(make(node, b)) {}
  uint64_t workspace_bytes() const override { return impl_.workspace_bytes(); }
  void compute(const KernelCall& c) override { impl_.compute(c); }

 private:
  using Impl = ReduceEngine<ArgmaxPolicy<T>, T>;
  static Impl make(const NodeInfo& node, CudaBackend& b) {
    const plx_tensor& x = node.input(0);
    bool reduced[PLX_MAX_DIMS] = {};
    if (x.ndim > 0) {  // a scalar: index 0
      const int64_t a = node.attr_int("axis");
      const int64_t axis = a < 0 ? a + x.ndim : a;
      PLX_REQUIRE(axis >= 0 && axis < x.ndim, "argmax: axis %lld out of range for %d dimensions",
                  static_cast<long long>(a), x.ndim);
      reduced[axis] = true;
    }
    return Impl(x, reduced, node.device(), sm_count(b, node.device()));
  }
  Impl impl_;
};

template <class T>
using Sum = SumKernel<T, false>;
template <class T>
using Mean = SumKernel<T, true>;

template <template <class> class K>
void add_float(KernelRegistry& r, const char* op, const char* impl, uint32_t flags) {
  r.add<K<float>, CudaBackend>(op, PLX_F32, impl, flags);
  r.add<K<f16>, CudaBackend>(op, PLX_F16, impl, flags);
  r.add<K<bf16>, CudaBackend>(op, PLX_BF16, impl, flags);
}
template <template <class> class K>
void add_int(KernelRegistry& r, const char* op, const char* impl, uint32_t flags) {
  r.add<K<int32_t>, CudaBackend>(op, PLX_I32, impl, flags);
  r.add<K<int64_t>, CudaBackend>(op, PLX_I64, impl, flags);
}

}  // namespace

void register_reduce(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float<Sum>(r, "sum", "cuda", f);
  add_int<Sum>(r, "sum", "cuda", f);
  add_float<Mean>(r, "mean", "cuda", f);
  add_float<ArgmaxKernel>(r, "argmax", "cuda", f);
  add_int<ArgmaxKernel>(r, "argmax", "cuda", f);
}

}  // namespace plexus::cuda
