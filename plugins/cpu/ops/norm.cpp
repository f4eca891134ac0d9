// CPU kernels: batch_norm (and batch_norm_apply), layer_norm and their backward ops (see
// docs/ops.md).
//
// Statistics and parameter-gradient sums accumulate in f64 for every dtype: they run over whole
// batches, and the variance is taken two-pass (sum of squared deviations from the mean) so that a
// large mean does not cancel it away. The elementwise passes compute in acc_t<T>.
#include <cmath>

#include "common.hpp"

namespace plexus::cpu {

namespace {

// gamma, beta and the running statistics are T or f32 (mixed precision), saved statistics f32 or
// f64; these read and write such a (C)-vector element as double.
double load_any(const plx_tensor& t, int64_t i) {
  switch (t.dtype) {
    case PLX_F32:
      return static_cast<const float*>(t.data)[i];
    case PLX_F16:
      return static_cast<float>(static_cast<const half*>(t.data)[i]);
    case PLX_BF16:
      return static_cast<float>(static_cast<const bfloat16*>(t.data)[i]);
    case PLX_F64:
      return static_cast<const double*>(t.data)[i];
    default:
      return 0;  // unreachable: dtypes are checked at creation (no throw in OpenMP regions)
  }
}
void store_any(const plx_tensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case PLX_F32:
      static_cast<float*>(t.data)[i] = static_cast<float>(v);
      return;
    case PLX_F16:
      static_cast<half*>(t.data)[i] = half(static_cast<float>(v));
      return;
    case PLX_BF16:
      static_cast<bfloat16*>(t.data)[i] = bfloat16(static_cast<float>(v));
      return;
    case PLX_F64:
      static_cast<double*>(t.data)[i] = v;
      return;
    default:
      return;  // unreachable, as above
  }
}

bool known_param_dtype(const NodeInfo& node, int32_t i) {
  if (!node.has_input(i)) return true;
  const int32_t d = node.input(i).dtype;
  return d == PLX_F32 || d == PLX_F16 || d == PLX_BF16 || d == PLX_F64;
}

// x (N, C, S...) seen as (N, C, S) with S the product of the spatial dims.
struct NCS {
  int64_t n = 0, c = 0, s = 1;
  explicit NCS(const plx_tensor& x) : n(x.shape[0]), c(x.shape[1]) {
    for (int32_t i = 2; i < x.ndim; ++i) s *= x.shape[i];
  }
  int64_t per_channel() const { return n * s; }
};

// Grain for a parallel loop over items of `work` elements each.
int64_t grain_for(int64_t work) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(work, 1));
}

// y = (x - mean) * (invstd * gamma) + beta, one (n, c) plane at a time, from the saved (rounded)
// statistics: batch_norm and batch_norm_apply share it, so the recomputed output is the same bits.
// gamma and beta are the call's inputs 1 and 2.
template <class T>
void bn_affine(const KernelCall& call, const NCS& dims, const T* x, T* y, const plx_tensor& mean_t,
               const plx_tensor& invstd_t) {
  using A = acc_t<T>;
  const bool has_gamma = call.has_in(1), has_beta = call.has_in(2);
  const int64_t C = dims.c, S = dims.s;
  parallel_for(dims.n * C, grain_for(S), [&](int64_t b, int64_t e) {
    for (int64_t nc = b; nc < e; ++nc) {
      const int64_t c = nc % C;
      const A mean = static_cast<A>(load_any(mean_t, c));
      const A scale =
          static_cast<A>(load_any(invstd_t, c) * (has_gamma ? load_any(call.in(1), c) : 1.0));
      const A shift = static_cast<A>(has_beta ? load_any(call.in(2), c) : 0.0);
      const T* src = x + nc * S;
      T* dst = y + nc * S;
      for (int64_t s = 0; s < S; ++s) store(dst, s, (load(src, s) - mean) * scale + shift);
    }
  });
}

template <class T>
class BatchNormKernel final : public Kernel {
 public:
  explicit BatchNormKernel(const NodeInfo& node)
      : dims_(node.input(0)),
        training_(node.attr_int("training") != 0),
        momentum_(node.attr_float("momentum")),
        eps_(node.attr_float("eps")) {
    for (int32_t i = 1; i <= 4; ++i)
      PLX_REQUIRE(known_param_dtype(node, i), "batch_norm: input %d has dtype %s", i,
                  dtype_name(node.input(i).dtype));
  }

  void compute(const KernelCall& call) override {
    const T* x = sdk::data<T>(call.in(0));        // (N, C, S)
    T* y = sdk::data<T>(call.out(0));             // (N, C, S)
    const plx_tensor& save_mean = call.out(1);    // (C) f32|f64
    const plx_tensor& save_invstd = call.out(2);  // (C) f32|f64
    const bool has_running = call.has_in(3);
    const int64_t N = dims_.n, C = dims_.c, S = dims_.s, M = dims_.per_channel();

    // Per channel: the statistics to normalise with, and the running-stat update.
    parallel_for(C, grain_for(M), [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        double mean, var;
        if (training_) {
          double sum = 0;
          for (int64_t n = 0; n < N; ++n) {
            const T* p = x + (n * C + c) * S;
            for (int64_t s = 0; s < S; ++s) sum += static_cast<double>(load(p, s));
          }
          mean = sum / static_cast<double>(M);
          double sq = 0;
          for (int64_t n = 0; n < N; ++n) {
            const T* p = x + (n * C + c) * S;
            for (int64_t s = 0; s < S; ++s) {
              const double d = static_cast<double>(load(p, s)) - mean;
              sq += d * d;
            }
          }
          var = sq / static_cast<double>(M);  // biased: what the batch is normalised with
          if (has_running) {
            // PyTorch's rule: the running variance is the unbiased one.
            const double unbiased = sq / static_cast<double>(M - 1);
            const plx_tensor &rm = call.in(3), &rv = call.in(4);
            store_any(rm, c, (1 - momentum_) * load_any(rm, c) + momentum_ * mean);
            store_any(rv, c, (1 - momentum_) * load_any(rv, c) + momentum_ * unbiased);
          }
        } else {
          mean = load_any(call.in(3), c);
          var = load_any(call.in(4), c);
        }
        store_any(save_mean, c, mean);
        store_any(save_invstd, c, 1 / std::sqrt(var + eps_));
      }
    });

    bn_affine<T>(call, dims_, x, y, save_mean, save_invstd);
  }

 private:
  NCS dims_;
  bool training_;
  double momentum_, eps_;
};

// batch_norm_apply: batch_norm's affine pass with the statistics given.
template <class T>
class BatchNormApplyKernel final : public Kernel {
 public:
  explicit BatchNormApplyKernel(const NodeInfo& node) : dims_(node.input(0)) {
    for (int32_t i = 1; i <= 2; ++i)
      PLX_REQUIRE(known_param_dtype(node, i), "batch_norm_apply: input %d has dtype %s", i,
                  dtype_name(node.input(i).dtype));
  }

  void compute(const KernelCall& call) override {
    bn_affine<T>(call, dims_, sdk::data<T>(call.in(0)), sdk::data<T>(call.out(0)), call.in(3),
                 call.in(4));
  }

 private:
  NCS dims_;
};

template <class T>
class BatchNormBackwardKernel final : public Kernel {
 public:
  explicit BatchNormBackwardKernel(const NodeInfo& node)
      : dims_(node.input(1)), training_(node.attr_int("training") != 0) {
    PLX_REQUIRE(known_param_dtype(node, 2), "batch_norm_backward: gamma has dtype %s",
                dtype_name(node.input(2).dtype));
  }

  // Per channel: sum(dy) and sum(dy * xhat), in f64.
  uint64_t workspace_bytes() const override {
    return static_cast<uint64_t>(2 * dims_.c) * sizeof(double);
  }

  void compute(const KernelCall& call) override {
    const T* dy = sdk::data<T>(call.in(0));   // (N, C, S)
    const T* x = sdk::data<T>(call.in(1));    // (N, C, S)
    const plx_tensor& mean_t = call.in(3);    // (C) f32|f64
    const plx_tensor& invstd_t = call.in(4);  // (C) f32|f64
    T* dx = sdk::data<T>(call.out(0));        // (N, C, S)
    const plx_tensor& dgamma = call.out(1);   // (C)
    const plx_tensor& dbeta = call.out(2);    // (C)
    const bool has_gamma = call.has_in(2);
    const int64_t N = dims_.n, C = dims_.c, S = dims_.s, M = dims_.per_channel();
    double* sum_dy = static_cast<double*>(call.workspace);  // (C)
    double* sum_dy_xhat = sum_dy + C;                       // (C)

    parallel_for(C, grain_for(M), [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const double mean = load_any(mean_t, c), invstd = load_any(invstd_t, c);
        double a = 0, bsum = 0;
        for (int64_t n = 0; n < N; ++n) {
          const int64_t off = (n * C + c) * S;
          for (int64_t s = 0; s < S; ++s) {
            const double g = static_cast<double>(load(dy, off + s));
            a += g;
            bsum += g * (static_cast<double>(load(x, off + s)) - mean) * invstd;
          }
        }
        sum_dy[c] = a;
        sum_dy_xhat[c] = bsum;
        store_any(dbeta, c, a);
        store_any(dgamma, c, bsum);
      }
    });

    // Training: dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), since the batch
    // statistics depend on x. Eval: the statistics are constants, dx = gamma * invstd * dy.
    using A = acc_t<T>;
    parallel_for(N * C, grain_for(S), [&](int64_t b, int64_t e) {
      for (int64_t nc = b; nc < e; ++nc) {
        const int64_t c = nc % C;
        const double invstd = load_any(invstd_t, c);
        const A k = static_cast<A>(invstd * (has_gamma ? load_any(call.in(2), c) : 1.0));
        const A mean = static_cast<A>(load_any(mean_t, c));
        const A m_dy = training_ ? static_cast<A>(sum_dy[c] / static_cast<double>(M)) : A(0);
        const A m_dyx = training_ ? static_cast<A>(sum_dy_xhat[c] / static_cast<double>(M)) : A(0);
        const A is = static_cast<A>(invstd);
        const int64_t off = nc * S;
        for (int64_t s = 0; s < S; ++s) {
          const A xhat = (load(x, off + s) - mean) * is;
          store(dx, off + s, k * (load(dy, off + s) - m_dy - xhat * m_dyx));
        }
      }
    });
  }

 private:
  NCS dims_;
  bool training_;
};

// x (..., D) seen as (R, D): R rows of the D normalised elements.
struct RowsCols {
  int64_t rows = 1, cols = 1;
  RowsCols(const plx_tensor& x, int64_t normalized_ndim) {
    for (int32_t i = 0; i < x.ndim; ++i) (i < x.ndim - normalized_ndim ? rows : cols) *= x.shape[i];
  }
};

// gamma and beta (D) as acc_t<T> in the workspace, ones and zeros when absent.
template <class T>
void load_affine(const KernelCall& call, int32_t gamma, int32_t beta, int64_t D, acc_t<T>* g,
                 acc_t<T>* bt) {
  for (int64_t j = 0; j < D; ++j) {
    g[j] = call.has_in(gamma) ? static_cast<acc_t<T>>(load_any(call.in(gamma), j)) : 1;
    if (bt) bt[j] = call.has_in(beta) ? static_cast<acc_t<T>>(load_any(call.in(beta), j)) : 0;
  }
}

template <class T>
class LayerNormKernel final : public Kernel {
 public:
  using A = acc_t<T>;
  explicit LayerNormKernel(const NodeInfo& node)
      : dims_(node.input(0), node.attr_int("normalized_ndim")), eps_(node.attr_float("eps")) {
    for (int32_t i = 1; i <= 2; ++i)
      PLX_REQUIRE(known_param_dtype(node, i), "layer_norm: input %d has dtype %s", i,
                  dtype_name(node.input(i).dtype));
  }

  // gamma and beta converted once per call.
  uint64_t workspace_bytes() const override {
    return static_cast<uint64_t>(2 * dims_.cols) * sizeof(A);
  }

  void compute(const KernelCall& call) override {
    const T* x = sdk::data<T>(call.in(0));     // (R, D)
    T* y = sdk::data<T>(call.out(0));          // (R, D)
    const plx_tensor& mean_t = call.out(1);    // (R) f32|f64
    const plx_tensor& invstd_t = call.out(2);  // (R) f32|f64
    const int64_t R = dims_.rows, D = dims_.cols;
    A* gamma = static_cast<A*>(call.workspace);  // (D)
    A* beta = gamma + D;                         // (D)
    load_affine<T>(call, 1, 2, D, gamma, beta);

    parallel_for(R, grain_for(D), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* src = x + r * D;
        T* dst = y + r * D;
        double sum = 0;
        for (int64_t j = 0; j < D; ++j) sum += static_cast<double>(load(src, j));
        const double mean = sum / static_cast<double>(D);
        double sq = 0;
        for (int64_t j = 0; j < D; ++j) {
          const double d = static_cast<double>(load(src, j)) - mean;
          sq += d * d;
        }
        const double invstd = 1 / std::sqrt(sq / static_cast<double>(D) + eps_);
        store_any(mean_t, r, mean);
        store_any(invstd_t, r, invstd);
        const A m = static_cast<A>(mean), is = static_cast<A>(invstd);
        for (int64_t j = 0; j < D; ++j) store(dst, j, (load(src, j) - m) * is * gamma[j] + beta[j]);
      }
    });
  }

 private:
  RowsCols dims_;
  double eps_;
};

template <class T>
class LayerNormBackwardKernel final : public Kernel {
 public:
  using A = acc_t<T>;
  explicit LayerNormBackwardKernel(const NodeInfo& node)
      : dims_(node.input(1), node.attr_int("normalized_ndim")) {
    PLX_REQUIRE(known_param_dtype(node, 2), "layer_norm_backward: gamma has dtype %s",
                dtype_name(node.input(2).dtype));
  }

  // gamma (D) as A, then the column sums of dy * xhat and dy (D each) in f64.
  uint64_t workspace_bytes() const override {
    return static_cast<uint64_t>(dims_.cols) * (sizeof(A) + 2 * sizeof(double));
  }

  void compute(const KernelCall& call) override {
    const T* dy = sdk::data<T>(call.in(0));   // (R, D)
    const T* x = sdk::data<T>(call.in(1));    // (R, D)
    const plx_tensor& mean_t = call.in(3);    // (R) f32|f64
    const plx_tensor& invstd_t = call.in(4);  // (R) f32|f64
    T* dx = sdk::data<T>(call.out(0));        // (R, D)
    const int64_t R = dims_.rows, D = dims_.cols;
    double* col_dyx = static_cast<double*>(call.workspace);  // (D)
    double* col_dy = col_dyx + D;                            // (D)
    A* gamma = reinterpret_cast<A*>(col_dy + D);             // (D); after the doubles: aligned
    load_affine<T>(call, 2, -1, D, gamma, nullptr);

    // dx row by row: dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
    parallel_for(R, grain_for(D), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const double mean = load_any(mean_t, r), invstd = load_any(invstd_t, r);
        const int64_t off = r * D;
        double sg = 0, sgx = 0;
        for (int64_t j = 0; j < D; ++j) {
          const double g = static_cast<double>(load(dy, off + j)) * static_cast<double>(gamma[j]);
          sg += g;
          sgx += g * (static_cast<double>(load(x, off + j)) - mean) * invstd;
        }
        const A m_g = static_cast<A>(sg / static_cast<double>(D));
        const A m_gx = static_cast<A>(sgx / static_cast<double>(D));
        const A m = static_cast<A>(mean), is = static_cast<A>(invstd);
        for (int64_t j = 0; j < D; ++j) {
          const A xhat = (load(x, off + j) - m) * is;
          store(dx, off + j, is * (load(dy, off + j) * gamma[j] - m_g - xhat * m_gx));
        }
      }
    });

    // dgamma = sum over rows of dy * xhat, dbeta = sum of dy: split by columns, so each column
    // is summed by one thread in row order (deterministic, no atomics).
    parallel_for(D, grain_for(R), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) col_dyx[j] = col_dy[j] = 0;
      for (int64_t r = 0; r < R; ++r) {
        const double mean = load_any(mean_t, r), invstd = load_any(invstd_t, r);
        const int64_t off = r * D;
        for (int64_t j = b; j < e; ++j) {
          const double g = static_cast<double>(load(dy, off + j));
          col_dy[j] += g;
          col_dyx[j] += g * (static_cast<double>(load(x, off + j)) - mean) * invstd;
        }
      }
      for (int64_t j = b; j < e; ++j) {
        store_any(call.out(1), j, col_dyx[j]);
        store_any(call.out(2), j, col_dy[j]);
      }
    });
  }

 private:
  RowsCols dims_;
};

}  // namespace

void register_norm(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<BatchNormKernel>(r, "batch_norm", "omp", f);
  add_float_kernels<BatchNormApplyKernel>(r, "batch_norm_apply", "omp", f);
  add_float_kernels<BatchNormBackwardKernel>(r, "batch_norm_backward", "omp", f);
  add_float_kernels<LayerNormKernel>(r, "layer_norm", "omp", f);
  add_float_kernels<LayerNormBackwardKernel>(r, "layer_norm_backward", "omp", f);
}

}  // namespace plexus::cpu
