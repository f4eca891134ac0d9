// CPU kernels: reductions (sum, mean, argmax; see docs/ops.md).
//
// sum and mean share one engine. The input's dimensions are split into groups of adjacent kept
// or reduced dimensions; what the innermost group is decides the loop:
//  - reduced innermost ("rows"): each output sums contiguous runs, with 16 independent lanes so
//    the loop vectorises;
//  - kept innermost ("columns"): a tile of up to kTile neighbouring outputs is summed together,
//    one contiguous slice of the input per reduced position, vectorised across the tile.
// Work is split over outputs; when there are too few outputs to occupy the threads (a full
// reduction, a bias gradient over a large batch), the reduced range is split into a fixed number
// of chunks whose partial sums go to the workspace and are added in chunk order, so results do
// not depend on scheduling. Floats accumulate in f64 (more than the f32 the catalogue asks for,
// at no cost on a memory-bound loop), integers in i64; long sums are blocked so rounding error
// grows with the block count, not the length.
#include <cmath>

#include "common.hpp"

namespace plexus::cpu {

namespace {

constexpr int64_t kTile = 256;    // outputs per column tile (two stack arrays of f64)
constexpr int64_t kBlock = 4096;  // elements summed before a partial is added to the total

// Walks a multi-dimensional index over (size, stride) pairs, outer first, keeping the offset.
struct Odometer {
  int n = 0;
  const int64_t* size = nullptr;
  const int64_t* stride = nullptr;
  int64_t idx[PLX_MAX_DIMS] = {};
  int64_t off = 0;

  Odometer(int n_, const int64_t* size_, const int64_t* stride_)
      : n(n_), size(size_), stride(stride_) {}
  void seek(int64_t flat) {
    off = 0;
    for (int d = n - 1; d >= 0; --d) {
      idx[d] = flat % size[d];
      flat /= size[d];
      off += idx[d] * stride[d];
    }
  }
  void next() {
    for (int d = n - 1; d >= 0; --d) {
      off += stride[d];
      if (++idx[d] < size[d]) return;
      off -= size[d] * stride[d];
      idx[d] = 0;
    }
  }
};

using sdk::plan_reduction;
using sdk::ReducePlan;

template <class T>
using sum_t = std::conditional_t<std::is_integral_v<T>, int64_t, double>;

template <class T>
inline sum_t<T> widen(T v) {
  return static_cast<sum_t<T>>(convert<acc_t<T>>(v));
}

// Blocked summation over 16 lanes: runs of any length are added into the lanes (the loop
// vectorises), and every kBlock elements the lanes are folded pairwise into the total, so rounding
// error grows with the number of blocks rather than the length.
template <class S>
struct LaneSum {
  static constexpr int L = 16;
  S lane[L] = {};
  S total = 0;
  int64_t pending = 0;  // elements in the lanes

  template <class T>
  void add(const T* p, int64_t n) {  // p: (n)
    for (int64_t b = 0; b < n;) {
      const int64_t e = std::min(n, b + kBlock - pending);
      int64_t i = b;
      for (; i + L <= e; i += L)
        for (int k = 0; k < L; ++k) lane[k] += widen(p[i + k]);
      for (int k = 0; i < e; ++i, ++k) lane[k] += widen(p[i]);
      pending += e - b;
      b = e;
      if (pending >= kBlock) flush();
    }
  }
  void flush() {
    for (int w = L / 2; w > 0; w /= 2)
      for (int k = 0; k < w; ++k) lane[k] += lane[k + w];
    total += lane[0];
    for (int k = 0; k < L; ++k) lane[k] = 0;
    pending = 0;
  }
  S result() {
    flush();
    return total;
  }
};

// What is written for each output given its sum over `count` elements.
struct SumOut {
  template <class S>
  static S finish(S s, int64_t) {
    return s;
  }
};
struct MeanOut {
  template <class S>
  static S finish(S s, int64_t count) {
    return s / static_cast<S>(count);  // 0 / 0 = nan for an empty reduction
  }
};

template <class T, class Out>
class ReduceKernel final : public Kernel {
  using S = sum_t<T>;

 public:
  explicit ReduceKernel(const NodeInfo& node) {
    const plx_tensor& x = node.input(0);
    bool reduced[PLX_MAX_DIMS] = {};
    const auto axes = node.attr_ints("axes");
    for (int32_t i = 0; i < x.ndim; ++i) reduced[i] = axes.empty();
    for (int64_t a : axes) {
      const int64_t i = a < 0 ? a + x.ndim : a;
      if (i >= 0 && i < x.ndim) reduced[i] = true;  // a 0-d x accepts axis 0 and has no dims
    }
    p_ = plan_reduction(x, reduced);
    const ReducePlan& p = p_;
    if (p.out_numel == 0 || p.nr == 0 || p.red_numel == 0) return;  // no summing to split
    if (p.columns) {
      const int64_t k = p.kept_size[p.nk - 1];
      tile_ = std::min(k, kTile);
      units_ = p.out_numel / k * ((k + kTile - 1) / kTile);
    } else {
      tile_ = 1;
      units_ = p.out_numel;
    }
    // Split the reduced range when there are fewer work units than threads and enough work.
    const int64_t work = p.red_numel * tile_;
    const int64_t chunks = std::min<int64_t>(threads(), work / kElementwiseGrain);
    if (units_ < threads() && chunks > 1) chunks_ = chunks;
  }

  uint64_t workspace_bytes() const override {
    return chunks_ > 1 ? static_cast<uint64_t>(chunks_ * tile_) * sizeof(S) : 0;
  }

  void compute(const KernelCall& c) override {
    const T* x = sdk::data<T>(c.in(0));  // (any shape)
    T* y = sdk::data<T>(c.out(0));       // (kept dims, row-major)
    const ReducePlan& p = p_;
    if (p.out_numel == 0) return;
    if (p.nr == 0 || p.red_numel == 0) {
      // Nothing reduced (x and y hold the same elements in the same order), or an empty
      // reduction.
      const bool copy = p.nr == 0;
      parallel_for(p.out_numel, kElementwiseGrain, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) y[o] = result(copy ? widen(x[o]) : S(0), copy ? 1 : 0);
      });
      return;
    }
    if (chunks_ > 1) {
      S* partial = static_cast<S*>(c.workspace);  // (chunks, tile)
      for (int64_t u = 0; u < units_; ++u) {
        const int64_t t = unit_len(u);
        parallel_for(chunks_, 1, [&](int64_t cb, int64_t ce) {
          for (int64_t ch = cb; ch < ce; ++ch)
            accumulate(x, u, p.red_numel * ch / chunks_, p.red_numel * (ch + 1) / chunks_,
                       partial + ch * tile_);
        });
        S acc[kTile];
        for (int64_t j = 0; j < t; ++j) {
          acc[j] = 0;
          for (int64_t ch = 0; ch < chunks_; ++ch) acc[j] += partial[ch * tile_ + j];
        }
        write(y, u, acc, t);
      }
      return;
    }
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (p.red_numel * tile_));
    parallel_for(units_, grain, [&](int64_t b, int64_t e) {
      S acc[kTile];
      for (int64_t u = b; u < e; ++u) {
        accumulate(x, u, 0, p.red_numel, acc);
        write(y, u, acc, unit_len(u));
      }
    });
  }

 private:
  T result(S sum, int64_t count) const {
    return convert<T>(static_cast<acc_t<T>>(Out::finish(sum, count)));
  }

  // Work unit u: one output (rows) or a tile of neighbouring outputs (columns).
  int64_t unit_first(int64_t u) const {
    if (!p_.columns) return u;
    const int64_t k = p_.kept_size[p_.nk - 1], per_row = (k + kTile - 1) / kTile;
    return u / per_row * k + u % per_row * kTile;
  }
  int64_t unit_len(int64_t u) const {
    if (!p_.columns) return 1;
    const int64_t k = p_.kept_size[p_.nk - 1], per_row = (k + kTile - 1) / kTile;
    return std::min(kTile, k - u % per_row * kTile);
  }
  // Offset in x of output o's first summed element.
  int64_t kept_offset(int64_t o) const {
    Odometer od(p_.nk, p_.kept_size, p_.kept_stride);
    od.seek(o);
    return od.off;
  }

  void write(T* y, int64_t u, const S* acc, int64_t t) const {
    const int64_t o = unit_first(u);
    for (int64_t j = 0; j < t; ++j) y[o + j] = result(acc[j], p_.red_numel);
  }

  // acc[0..unit_len(u)) = sums over the reduced positions [r0, r1) for work unit u.
  void accumulate(const T* x, int64_t u, int64_t r0, int64_t r1, S* acc) const {
    const ReducePlan& p = p_;
    const int64_t base = kept_offset(unit_first(u));
    if (!p.columns) {
      // Runs along the innermost (stride-1) reduced group, stepping the outer reduced groups.
      const int64_t n = p.red_size[p.nr - 1];
      Odometer q(p.nr - 1, p.red_size, p.red_stride);
      q.seek(r0 / n);
      LaneSum<S> s;
      for (int64_t r = r0, j = r0 % n; r < r1; j = 0, q.next()) {
        const int64_t len = std::min(n - j, r1 - r);
        s.add(x + base + q.off + j, len);
        r += len;
      }
      acc[0] = s.result();
      return;
    }
    // A tile of t neighbouring outputs: one contiguous slice of x per reduced position. Sums go
    // to `block` and are flushed to acc every kBlock positions.
    const int64_t t = unit_len(u);
    S block[kTile];
    for (int64_t j = 0; j < t; ++j) acc[j] = block[j] = 0;
    Odometer q(p.nr, p.red_size, p.red_stride);
    q.seek(r0);
    for (int64_t r = r0; r < r1; ++r, q.next()) {
      const T* src = x + base + q.off;  // (t)
      for (int64_t j = 0; j < t; ++j) block[j] += widen(src[j]);
      if ((r - r0 + 1) % kBlock == 0) {
        for (int64_t j = 0; j < t; ++j) {
          acc[j] += block[j];
          block[j] = 0;
        }
      }
    }
    for (int64_t j = 0; j < t; ++j) acc[j] += block[j];
  }

  ReducePlan p_;
  int64_t tile_ = 1, units_ = 0, chunks_ = 1;
};

template <class Out>
struct Reduce {
  template <class T>
  using kernel = ReduceKernel<T, Out>;
};

// Index of the first maximum of src[0..n), n >= 1, nan counting as the maximum. Two passes over
// a row that stays in cache: the maximum over 16 lanes (vectorised: `v > m ? v : m` is exactly
// what MAXPS computes, nan included) with a nan flag, then the first index holding it.
template <class T>
int64_t argmax_row(const T* src, int64_t n) {
  using A = acc_t<T>;
  constexpr int L = 16;
  A lane[L];
  for (int k = 0; k < L; ++k) lane[k] = load(src, 0);
  bool nan = false;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    for (int k = 0; k < L; ++k) {
      const A v = load(src, i + k);
      lane[k] = v > lane[k] ? v : lane[k];
      if constexpr (std::is_floating_point_v<A>) nan |= v != v;
    }
  }
  for (; i < n; ++i) {
    const A v = load(src, i);
    lane[0] = v > lane[0] ? v : lane[0];
    if constexpr (std::is_floating_point_v<A>) nan |= v != v;
  }
  if constexpr (std::is_floating_point_v<A>) {
    if (nan)
      for (int64_t j = 0;; ++j)
        if (load(src, j) != load(src, j)) return j;
  }
  A m = lane[0];
  for (int k = 1; k < L; ++k) m = lane[k] > m ? lane[k] : m;
  for (int64_t j = 0;; ++j)
    if (load(src, j) == m) return j;
}

// Index of the first maximum along one axis; nan counts as the maximum (the first nan wins).
// x is seen as (outer, n, inner); y as (outer, inner).
template <class T>
class ArgmaxKernel final : public Kernel {
 public:
  explicit ArgmaxKernel(const NodeInfo& node) {
    const plx_tensor& x = node.input(0);
    if (x.ndim == 0) return;  // a scalar: index 0
    const int64_t a = node.attr_int("axis");
    const int64_t axis = a < 0 ? a + x.ndim : a;
    PLX_REQUIRE(axis >= 0 && axis < x.ndim, "argmax: axis %lld out of range for %d dimensions",
                static_cast<long long>(a), x.ndim);
    for (int32_t i = 0; i < axis; ++i) outer_ *= x.shape[i];
    n_ = x.shape[axis];
    for (int32_t i = static_cast<int32_t>(axis) + 1; i < x.ndim; ++i) inner_ *= x.shape[i];
  }

  void compute(const KernelCall& c) override {
    const T* x = sdk::data<T>(c.in(0));         // (outer, n, inner)
    int64_t* y = sdk::data<int64_t>(c.out(0));  // (outer, inner)
    const int64_t n = n_, inner = inner_;
    if (inner == 1) {  // contiguous rows: the common (N, C) over C
      parallel_for(outer_, std::max<int64_t>(1, kElementwiseGrain / n), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) y[o] = argmax_row(x + o * n, n);
      });
      return;
    }
    // Columns: a tile of neighbouring outputs scans the axis together, one contiguous slice per
    // position, branch-free so that the tile loop vectorises.
    using A = acc_t<T>;
    const int64_t per_row = (inner + kTile - 1) / kTile;
    const int64_t grain =
        std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, n * std::min(inner, kTile)));
    parallel_for(outer_ * per_row, grain, [&](int64_t b, int64_t e) {
      A best[kTile];
      int64_t arg[kTile];
      for (int64_t u = b; u < e; ++u) {
        const int64_t o = u / per_row, j0 = u % per_row * kTile;
        const int64_t t = std::min(kTile, inner - j0);
        const T* src = x + o * n * inner + j0;  // (n, inner) from column j0
        for (int64_t j = 0; j < t; ++j) {
          best[j] = load(src, j);
          arg[j] = 0;
        }
        for (int64_t r = 1; r < n; ++r) {
          const T* row = src + r * inner;  // (t)
          for (int64_t j = 0; j < t; ++j) {
            const A v = load(row, j);
            // Strictly larger (ties keep the first), or the first nan.
            bool take = v > best[j];
            if constexpr (std::is_floating_point_v<A>)
              take = take || (v != v && best[j] == best[j]);
            best[j] = take ? v : best[j];
            arg[j] = take ? r : arg[j];
          }
        }
        for (int64_t j = 0; j < t; ++j) y[o * inner + j0 + j] = arg[j];
      }
    });
  }

 private:
  int64_t outer_ = 1, n_ = 1, inner_ = 1;
};

}  // namespace

void register_reduce(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<Reduce<SumOut>::kernel>(r, "sum", "omp", f);
  add_int_kernels<Reduce<SumOut>::kernel>(r, "sum", "omp", f);
  add_float_kernels<Reduce<MeanOut>::kernel>(r, "mean", "omp", f);
  add_float_kernels<ArgmaxKernel>(r, "argmax", "omp", f);
  add_int_kernels<ArgmaxKernel>(r, "argmax", "omp", f);
}

}  // namespace plexus::cpu
