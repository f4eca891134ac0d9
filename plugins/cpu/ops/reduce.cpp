// CPU kernels: reductions (see docs/ops.md).
#include <vector>

#include "common.hpp"

namespace plexus::cpu {

namespace {

// The input's dimensions split into kept and reduced groups, adjacent dimensions of the same
// kind merged, so that any reduction is a loop over kept positions of a loop over reduced ones.
struct ReducePlan {
  std::vector<int64_t> kept_size, kept_stride;  // outer loop, row-major over the output
  std::vector<int64_t> red_size, red_stride;    // inner loop
  int64_t out_numel = 1, red_numel = 1;
};

ReducePlan plan_reduction(const plx_tensor& x, const std::vector<bool>& reduced) {
  ReducePlan p;
  int64_t stride = 1;
  std::vector<int64_t> strides(static_cast<size_t>(x.ndim));
  for (int32_t i = x.ndim - 1; i >= 0; --i) {
    strides[static_cast<size_t>(i)] = stride;
    stride *= x.shape[i];
  }
  int last = -1;  // 0 kept, 1 reduced
  for (int32_t i = 0; i < x.ndim; ++i) {
    const int64_t n = x.shape[i];
    if (n == 1) continue;  // contributes nothing to either loop
    const int kind = reduced[static_cast<size_t>(i)] ? 1 : 0;
    auto& sizes = kind ? p.red_size : p.kept_size;
    auto& strs = kind ? p.red_stride : p.kept_stride;
    if (kind == last && !sizes.empty()) {
      // Merge with the previous dimension of the same kind: contiguous row-major.
      sizes.back() *= n;
      strs.back() = strides[static_cast<size_t>(i)];
    } else {
      sizes.push_back(n);
      strs.push_back(strides[static_cast<size_t>(i)]);
    }
    last = kind;
  }
  for (int64_t n : p.kept_size) p.out_numel *= n;
  for (int64_t n : p.red_size) p.red_numel *= n;
  return p;
}

// Sum over the reduced dimensions, accumulated in f64 for floats (the reference's accuracy) and
// in i64 for integers.
template <class T>
class SumKernel final : public Kernel {
 public:
  explicit SumKernel(const NodeInfo& node) {
    const plx_tensor& x = node.input(0);
    std::vector<bool> reduced(static_cast<size_t>(x.ndim), false);
    const auto axes = node.attr_ints("axes");
    if (axes.empty()) reduced.assign(reduced.size(), true);
    for (int64_t a : axes) reduced[static_cast<size_t>(a < 0 ? a + x.ndim : a)] = true;
    plan_ = plan_reduction(x, reduced);
  }
  void compute(const KernelCall& c) override {
    const T* x = sdk::data<T>(c.in(0));
    T* y = sdk::data<T>(c.out(0));  // (kept dims)
    using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
    const ReducePlan& p = plan_;
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(p.red_numel, 1));
    parallel_for(numel(c.out(0)), grain, [&](int64_t b, int64_t e) {
      std::vector<int64_t> ridx(p.red_size.size());
      for (int64_t o = b; o < e; ++o) {
        int64_t base = 0;
        for (int64_t k = static_cast<int64_t>(p.kept_size.size()) - 1, r = o; k >= 0; --k) {
          base += (r % p.kept_size[static_cast<size_t>(k)]) * p.kept_stride[static_cast<size_t>(k)];
          r /= p.kept_size[static_cast<size_t>(k)];
        }
        Acc acc = 0;
        if (p.red_size.empty()) {
          acc = static_cast<Acc>(convert<acc_t<T>>(x[base]));
        } else {
          const size_t inner = p.red_size.size() - 1;
          const int64_t n_inner = p.red_size[inner], s_inner = p.red_stride[inner];
          std::fill(ridx.begin(), ridx.end(), 0);
          for (int64_t done = 0; done < p.red_numel; done += n_inner) {
            int64_t off = base;
            for (size_t k = 0; k < inner; ++k) off += ridx[k] * p.red_stride[k];
            for (int64_t j = 0; j < n_inner; ++j)
              acc += static_cast<Acc>(convert<acc_t<T>>(x[off + j * s_inner]));
            for (size_t k = inner; k-- > 0;) {  // odometer over the outer reduced dims
              if (++ridx[k] < p.red_size[k]) break;
              ridx[k] = 0;
            }
          }
        }
        y[o] = convert<T>(static_cast<acc_t<T>>(acc));
      }
    });
  }

 private:
  ReducePlan plan_;
};

}  // namespace

void register_reduce(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<SumKernel>(r, "sum", "omp", f);
  add_int_kernels<SumKernel>(r, "sum", "omp", f);
}

}  // namespace plexus::cpu
