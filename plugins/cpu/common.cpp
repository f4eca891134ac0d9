#include "common.hpp"

#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <exception>

namespace plexus::cpu {

namespace {
int g_threads = 1;
}

int threads() { return g_threads; }

void set_threads(int n) {
  g_threads = n > 0 ? n : std::max(1, omp_get_num_procs());
  openblas_set_num_threads(g_threads);
}

namespace {
// openblas_get_parallel(): 0 sequential, 1 pthreads, 2 OpenMP.
bool blas_uses_pthreads() { return openblas_get_parallel() == 1; }
}  // namespace

ScopedSingleThreadedBlas::ScopedSingleThreadedBlas() : active_(blas_uses_pthreads()) {
  if (active_) openblas_set_num_threads(1);
}
ScopedSingleThreadedBlas::~ScopedSingleThreadedBlas() {
  if (active_) openblas_set_num_threads(g_threads);
}

std::string blas_description() {
  static const char* kinds[] = {"sequential", "pthreads", "OpenMP"};
  const int p = openblas_get_parallel();
  std::string s = openblas_get_config();
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s + " (" + (p >= 0 && p <= 2 ? kinds[p] : "unknown threading") + ")";
}

void parallel_for_impl(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx) {
  const int64_t max_chunks = grain > 0 ? (n + grain - 1) / grain : n;
  const int chunks = static_cast<int>(std::min<int64_t>(g_threads, max_chunks));
  if (chunks <= 1 || omp_in_parallel()) {
    fn(ctx, 0, n);
    return;
  }
  // An exception must not leave an OpenMP region (the runtime would terminate the process):
  // the first one is kept and rethrown on the calling thread, where the SDK's trampoline turns
  // it into a status.
  std::exception_ptr error;
  std::atomic<bool> failed{false};
#pragma omp parallel for num_threads(chunks) schedule(static)
  for (int c = 0; c < chunks; ++c) {
    if (failed.load(std::memory_order_relaxed)) continue;
    try {
      fn(ctx, n * c / chunks, n * (c + 1) / chunks);
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

namespace {

// (rows, cols) with leading dimension ld -> packed f32 (rows, cols).
template <class T>
void pack_f32(const T* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r) to_f32(src + r * ld, dst + r * cols, cols);
}

}  // namespace

template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, acc_t<T> alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, acc_t<T> beta, T* C, int64_t ldc, float* scratch) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS rejects zero leading dimensions; the product is empty
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < N; ++c)
        C[r * ldc + c] = convert<T>(beta == acc_t<T>(0) ? acc_t<T>(0) : beta * load(C, r * ldc + c));
    return;
  }
  const CBLAS_TRANSPOSE op_a = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE op_b = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, op_a, op_b, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
                C, static_cast<int>(ldc));
  } else if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, op_a, op_b, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
                C, static_cast<int>(ldc));
  } else {
    // 16-bit: pack into f32, multiply, round once.
    float* a = scratch;                // op(A) stored as given: (M, K) or (K, M)
    float* b = a + M * K;              // (K, N) or (N, K)
    float* c = b + K * N;              // (M, N)
    const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
    const int64_t b_rows = tb ? N : K, b_cols = tb ? K : N;
    pack_f32(A, a_rows, a_cols, lda, a);
    pack_f32(B, b_rows, b_cols, ldb, b);
    if (beta != 0.0f)
      pack_f32(C, M, N, ldc, c);
    cblas_sgemm(CblasRowMajor, op_a, op_b, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, a, static_cast<int>(a_cols), b,
                static_cast<int>(b_cols), beta, c, static_cast<int>(N));
    for (int64_t r = 0; r < M; ++r) from_f32(c + r * N, C + r * ldc, N);
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t, float*);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t, float*);
template void gemm<half>(bool, bool, int64_t, int64_t, int64_t, float, const half*, int64_t,
                         const half*, int64_t, float, half*, int64_t, float*);
template void gemm<bfloat16>(bool, bool, int64_t, int64_t, int64_t, float, const bfloat16*,
                             int64_t, const bfloat16*, int64_t, float, bfloat16*, int64_t, float*);

}  // namespace plexus::cpu
