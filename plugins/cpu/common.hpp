// Shared pieces of the CPU plugin's kernels: threading, element access in the accumulation type,
// per-dtype registration and GEMM on OpenBLAS.
//
// Conventions: kernels receive row-major contiguous tensors (the core makes them so unless a
// kernel registers PLX_KERNEL_STRIDED); 16-bit floats are loaded into f32 and stored back with
// round-to-nearest-even; f64 is computed in f64 (it is the reference for gradient checks).
// Scratch memory comes from the workspace the core hands in, never from malloc in compute().
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "plexus/sdk.hpp"

namespace plexus::cpu {

using sdk::Kernel;
using sdk::KernelCall;
using sdk::KernelRegistry;
using sdk::NodeInfo;
using sdk::numel;

// Threads kernels use; set once at plugin init from the "threads" option (0: all cores).
int threads();
void set_threads(int n);

// Calls f(begin, end) on disjoint ranges covering [0, n), in parallel when n exceeds `grain`
// (the smallest range worth a thread). Nested calls run serially. An exception thrown by f on
// any thread is rethrown on the caller's thread once the team has finished.
void parallel_for_impl(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx);
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  parallel_for_impl(
      n, grain,
      [](void* c, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(c))(b, e); },
      &f);
}
// Makes OpenBLAS single-threaded for its lifetime, for GEMMs issued from several OpenMP threads
// at once. Needed only with the pthreads build of OpenBLAS (the OpenMP build already runs
// single-threaded inside a parallel region); a no-op otherwise.
class ScopedSingleThreadedBlas {
 public:
  ScopedSingleThreadedBlas();
  ~ScopedSingleThreadedBlas();
  ScopedSingleThreadedBlas(const ScopedSingleThreadedBlas&) = delete;
  ScopedSingleThreadedBlas& operator=(const ScopedSingleThreadedBlas&) = delete;

 private:
  bool active_;
};
// "OpenBLAS 0.3.21 ... (OpenMP)": what the plugin computes GEMMs with, for logs.
std::string blas_description();

// Elements per thread below which elementwise loops stay serial.
constexpr int64_t kElementwiseGrain = 1 << 15;

template <class T>
inline acc_t<T> load(const T* p, int64_t i) {
  return convert<acc_t<T>>(p[i]);
}
template <class T>
inline void store(T* p, int64_t i, acc_t<T> v) {
  p[i] = convert<T>(v);
}

// Registers K<T> for f32, f16, bf16 and f64.
template <template <class> class K>
void add_float_kernels(KernelRegistry& r, const char* op, const char* impl, uint32_t flags = 0) {
  r.add<K<float>>(op, PLX_F32, impl, flags);
  r.add<K<half>>(op, PLX_F16, impl, flags);
  r.add<K<bfloat16>>(op, PLX_BF16, impl, flags);
  r.add<K<double>>(op, PLX_F64, impl, flags);
}
// Registers K<T> for i32 and i64.
template <template <class> class K>
void add_int_kernels(KernelRegistry& r, const char* op, const char* impl, uint32_t flags = 0) {
  r.add<K<int32_t>>(op, PLX_I32, impl, flags);
  r.add<K<int64_t>>(op, PLX_I64, impl, flags);
}

// Bulk conversion between 16-bit storage and f32.
template <class T>
void to_f32(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
template <class T>
void from_f32(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = T(src[i]);
}

// Row-major C (M, N) = alpha * op(A) * op(B) + beta * C, with op(A) (M, K) and op(B) (K, N).
// A is (M, K) with leading dimension lda, or (K, M) if trans_a; likewise B. f32 and f64 call
// OpenBLAS directly; f16/bf16 convert into `scratch` (gemm_scratch_floats(M, N, K) floats),
// multiply in f32 and round once on store.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, acc_t<T> alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, acc_t<T> beta, T* C, int64_t ldc, float* scratch);

template <class T>
constexpr uint64_t gemm_scratch_floats(int64_t M, int64_t N, int64_t K) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return static_cast<uint64_t>(M * K + K * N + M * N);
  return 0;
}

// Registration of each op family (ops/*.cpp).
void register_activation(KernelRegistry& r);
void register_binary(KernelRegistry& r);
void register_reduce(KernelRegistry& r);
void register_conv(KernelRegistry& r);
void register_conv_direct(KernelRegistry& r);  // ops/conv_direct.cpp
void register_conv_winograd(KernelRegistry& r);  // ops/conv_winograd.cpp
void register_pool(KernelRegistry& r);
void register_gemm(KernelRegistry& r);
void register_softmax(KernelRegistry& r);
void register_norm(KernelRegistry& r);
void register_misc(KernelRegistry& r);
void register_optim(KernelRegistry& r);

// Fusion (fusion.cpp): what the CPU backend claims in a graph, and its fused kernels.
void claim_fusions(const plx_graph_view& graph, plx_claim_fn claim, void* host_user);
// chunk_bytes: the fuse_chunk_bytes option (0: the conv + pool groups run image by image).
std::unique_ptr<Kernel> make_fused(sdk::Backend& backend, const plx_graph_view& graph,
                                   const sdk::Boundary& boundary, uint64_t chunk_bytes,
                                   plx_dtype& dtype, uint32_t& flags, std::string& name);
// relu_backward feeding max_pool2d_backward as one kernel (ops/pool.cpp).
std::unique_ptr<Kernel> make_relu_max_pool_backward(const sdk::GraphView& g, const sdk::Boundary& b,
                                                    plx_dtype& dtype);
// conv2d [-> relu] -> max_pool2d, and max_pool2d_backward -> the conv's backward ops, each as
// one kernel that runs image by image (ops/conv_pool.cpp).
std::unique_ptr<Kernel> make_conv_max_pool(sdk::Backend& backend, const sdk::GraphView& g,
                                           const sdk::Boundary& b, plx_dtype& dtype);
std::unique_ptr<Kernel> make_max_pool_conv_backward(sdk::Backend& backend,
                                                    const sdk::GraphView& g,
                                                    const sdk::Boundary& b, plx_dtype& dtype);
// Either group run instead by the SDK's chunked kernels (sdk/fusion_chunked.hpp) on this plugin's
// per-node kernels, chunk_bytes of pre-pool tensor at a time: the generic path other backends
// take, here so the tests run it (the fuse_chunk_bytes option).
std::unique_ptr<Kernel> make_chunked_conv_pool(sdk::Backend& backend, const sdk::GraphView& g,
                                               const sdk::Boundary& b, uint64_t chunk_bytes,
                                               plx_dtype& dtype, uint32_t& flags,
                                               std::string& name);
// linear -> [cast] -> softmax_cross_entropy [-> argmax] [-> its backward] as one kernel
// (ops/softmax.cpp).
std::unique_ptr<Kernel> make_linear_cross_entropy(const sdk::GraphView& g, const sdk::Boundary& b,
                                                  plx_dtype& dtype);
// The multi-tensor sgd_update / adamw_update kernel for a group of update nodes (ops/optim.cpp).
std::unique_ptr<Kernel> make_multi_update(const sdk::GraphView& g, const sdk::Boundary& b,
                                          plx_dtype& dtype);

// The "threads" communicator (comm_threads.cpp): ranks are threads of this process.
std::unique_ptr<sdk::Communicator> make_threads_communicator();

}  // namespace plexus::cpu
