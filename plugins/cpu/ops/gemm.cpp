// CPU kernels: matrix products, matmul and linear (see docs/ops.md). Both are cpu::gemm calls on
// OpenBLAS; this file only lays out the batch and the bias.
#include <climits>
#include <vector>

#include "common.hpp"

namespace plexus::cpu {

namespace {

// OpenBLAS gives a GEMM about one thread per 65536 * GEMM_MULTITHREAD_THRESHOLD (4 by default)
// multiply-adds (interface/gemm.c), so below 64^3 it runs on one thread. A batch of such GEMMs
// is spread over the batch instead, one single-threaded GEMM per thread; larger GEMMs are left to
// OpenBLAS's own threads and the batch runs serially (nesting both would oversubscribe).
constexpr int64_t kBlasThreadedMnk = int64_t{64} * 64 * 64;

bool fits_int(int64_t v) {
  return v >= 0 && v <= INT_MAX;
}

// y (..., M, N) = alpha op(a) op(b), batch dims broadcast.
template <class T>
class MatmulKernel final : public Kernel {
 public:
  explicit MatmulKernel(const NodeInfo& node) {
    const plx_tensor& a = node.input(0);   // (..., M, K) or (..., K, M) with trans_a
    const plx_tensor& b = node.input(1);   // (..., K, N) or (..., N, K) with trans_b
    const plx_tensor& y = node.output(0);  // (batch..., M, N)
    ta_ = node.attr_int("trans_a") != 0;
    tb_ = node.attr_int("trans_b") != 0;
    alpha_ = static_cast<acc_t<T>>(node.attr_float("alpha"));
    PLX_REQUIRE(a.ndim >= 2 && b.ndim >= 2 && y.ndim >= 2, "matmul: operands need 2 dimensions");
    M_ = y.shape[y.ndim - 2];
    N_ = y.shape[y.ndim - 1];
    K_ = ta_ ? a.shape[a.ndim - 2] : a.shape[a.ndim - 1];
    PLX_DECLINE_UNLESS(fits_int(M_) && fits_int(N_) && fits_int(K_),
                       "matmul: a dimension exceeds the BLAS int range");

    // Batch strides of a and b (in elements) per batch dim of y; 0 where broadcast.
    const int32_t nb = y.ndim - 2;
    batch_shape_.assign(y.shape, y.shape + nb);
    a_stride_.assign(static_cast<size_t>(nb), 0);
    b_stride_.assign(static_cast<size_t>(nb), 0);
    int64_t sa = M_ * K_, sb = K_ * N_;
    for (int32_t i = nb - 1; i >= 0; --i) {
      const int32_t ia = i - (nb - (a.ndim - 2)), ib = i - (nb - (b.ndim - 2));
      if (ia >= 0) {
        if (a.shape[ia] != 1) a_stride_[static_cast<size_t>(i)] = sa;
        sa *= a.shape[ia];
      }
      if (ib >= 0) {
        if (b.shape[ib] != 1) b_stride_[static_cast<size_t>(i)] = sb;
        sb *= b.shape[ib];
      }
    }
    batch_ = 1;
    for (int64_t d : batch_shape_) batch_ *= d;
    const int64_t a_batch = sa / std::max<int64_t>(M_ * K_, 1);
    const int64_t b_batch = sb / std::max<int64_t>(K_ * N_, 1);

    // One b for the whole batch and a row-major, unbroadcast a: the batch is just more rows of
    // one GEMM, (batch*M, K) x (K, N), the best shape for OpenBLAS.
    fold_ = batch_ > 1 && !ta_ && b_batch == 1 && a_batch == batch_ && M_ * K_ > 0 &&
            fits_int(batch_ * M_);
    const int64_t rows = fold_ ? batch_ * M_ : M_;
    if (!fold_ && batch_ > 1 && M_ * N_ * K_ < kBlasThreadedMnk)
      chunks_ = static_cast<int>(std::min<int64_t>(threads(), batch_));
    scratch_floats_ = gemm_scratch_floats<T>(rows, N_, K_);
  }

  uint64_t workspace_bytes() const override {
    return static_cast<uint64_t>(chunks_) * scratch_floats_ * sizeof(float);
  }

  void compute(const KernelCall& c) override {
    const T* a = sdk::data<T>(c.in(0));                 // (..., M, K) or (..., K, M)
    const T* b = sdk::data<T>(c.in(1));                 // (..., K, N) or (..., N, K)
    T* y = sdk::data<T>(c.out(0));                      // (batch..., M, N)
    float* scratch = static_cast<float*>(c.workspace);  // chunks_ * scratch_floats_
    const int64_t lda = ta_ ? M_ : K_, ldb = tb_ ? K_ : N_;
    if (batch_ == 0 || M_ == 0 || N_ == 0) return;
    if (fold_) {
      gemm<T>(false, tb_, batch_ * M_, N_, K_, alpha_, a, lda, b, ldb, acc_t<T>(0), y, N_, scratch);
      return;
    }
    auto run = [&](int64_t begin, int64_t end, float* s) {
      for (int64_t i = begin; i < end; ++i) {
        int64_t oa = 0, ob = 0;
        for (int64_t d = static_cast<int64_t>(batch_shape_.size()) - 1, r = i; d >= 0; --d) {
          const int64_t k = r % batch_shape_[static_cast<size_t>(d)];
          r /= batch_shape_[static_cast<size_t>(d)];
          oa += k * a_stride_[static_cast<size_t>(d)];
          ob += k * b_stride_[static_cast<size_t>(d)];
        }
        gemm<T>(ta_, tb_, M_, N_, K_, alpha_, a + oa, lda, b + ob, ldb, acc_t<T>(0),
                y + i * M_ * N_, N_, s);
      }
    };
    if (chunks_ <= 1) {
      run(0, batch_, scratch);
      return;
    }
    // One chunk per thread, each with its own slice of scratch.
    parallel_for(chunks_, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch)
        run(batch_ * ch / chunks_, batch_ * (ch + 1) / chunks_, scratch + ch * scratch_floats_);
    });
  }

 private:
  bool ta_ = false, tb_ = false, fold_ = false;
  acc_t<T> alpha_{};
  int64_t M_ = 0, N_ = 0, K_ = 0, batch_ = 1;
  std::vector<int64_t> batch_shape_, a_stride_, b_stride_;  // per batch dim of y
  int chunks_ = 1;
  uint64_t scratch_floats_ = 0;  // per chunk
};

// y (..., out) = x (..., in) w^T + b: one GEMM over all rows of x.
template <class T>
class LinearKernel final : public Kernel {
 public:
  explicit LinearKernel(const NodeInfo& node) {
    const plx_tensor& x = node.input(0);  // (..., in)
    const plx_tensor& w = node.input(1);  // (out, in)
    PLX_REQUIRE(x.ndim >= 1 && w.ndim == 2, "linear: x (..., in) and w (out, in) expected");
    out_ = w.shape[0];
    in_ = w.shape[1];
    rows_ = 1;
    for (int32_t i = 0; i + 1 < x.ndim; ++i) rows_ *= x.shape[i];
    PLX_DECLINE_UNLESS(fits_int(rows_) && fits_int(out_) && fits_int(in_),
                       "linear: a dimension exceeds the BLAS int range");
    scratch_floats_ = gemm_scratch_floats<T>(rows_, out_, in_);
  }

  uint64_t workspace_bytes() const override { return scratch_floats_ * sizeof(float); }

  void compute(const KernelCall& c) override {
    const T* x = sdk::data<T>(c.in(0));  // (rows, in)
    const T* w = sdk::data<T>(c.in(1));  // (out, in)
    T* y = sdk::data<T>(c.out(0));       // (rows, out)
    float* scratch = static_cast<float*>(c.workspace);
    const bool has_bias = c.has_in(2);
    if (has_bias) {
      // The bias goes in C and the GEMM adds to it (beta = 1): one pass over y, not two.
      const T* bias = sdk::data<T>(c.in(2));  // (out)
      const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(out_, 1));
      parallel_for(rows_, grain, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) std::memcpy(y + r * out_, bias, sizeof(T) * out_);
      });
    }
    gemm<T>(false, true, rows_, out_, in_, acc_t<T>(1), x, in_, w, in_,
            has_bias ? acc_t<T>(1) : acc_t<T>(0), y, out_, scratch);
  }

 private:
  int64_t rows_ = 0, out_ = 0, in_ = 0;
  uint64_t scratch_floats_ = 0;
};

}  // namespace

void register_gemm(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
  add_float_kernels<MatmulKernel>(r, "matmul", "openblas", f | PLX_KERNEL_LIBRARY);
  add_float_kernels<LinearKernel>(r, "linear", "openblas", f | PLX_KERNEL_LIBRARY);
}

}  // namespace plexus::cpu
