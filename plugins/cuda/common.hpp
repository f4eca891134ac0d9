// Shared host-side pieces of the CUDA plugin: error checks that carry the library's own message,
// the backend class the kernels reach their handles through, and the registration functions of
// each op family (ops/*).
//
// Conventions for kernels:
// - A plx_stream is a cudaStream_t, a plx_event a cudaEvent_t (cast, no wrapper).
// - Kernels run on the device of their node: compute() calls use_device(device_) first (cheap when
//   it is already current on the calling thread).
// - Kernels never allocate in compute() and never synchronise the host: every kernel is
//   capturable. Scratch memory comes from the workspace the core hands in.
// - Data errors found on the device (a label out of range, a bad index) are written to the
//   device's error record (device.cuh) and raised by the next stream_sync/event_sync as an
//   InvalidArgument naming the op, the position and the value.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "plexus/sdk.hpp"

namespace plexus::cuda {

using sdk::Kernel;
using sdk::KernelCall;
using sdk::KernelRegistry;
using sdk::NodeInfo;
using sdk::numel;

// ---- errors ----
[[noreturn]] void throw_cuda(cudaError_t e, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t s, const char* expr, const char* file, int line);
[[noreturn]] void throw_cudnn(cudnnStatus_t s, const char* expr, const char* file, int line);

#define PLX_CUDA_CHECK(expr)                                                        \
  do {                                                                              \
    const cudaError_t plx_e_ = (expr);                                              \
    if (plx_e_ != cudaSuccess) ::plexus::cuda::throw_cuda(plx_e_, #expr, __FILE__, __LINE__); \
  } while (0)
#define PLX_CUBLAS_CHECK(expr)                                                      \
  do {                                                                              \
    const cublasStatus_t plx_s_ = (expr);                                           \
    if (plx_s_ != CUBLAS_STATUS_SUCCESS)                                            \
      ::plexus::cuda::throw_cublas(plx_s_, #expr, __FILE__, __LINE__);              \
  } while (0)
#define PLX_CUDNN_CHECK(expr)                                                       \
  do {                                                                              \
    const cudnnStatus_t plx_s_ = (expr);                                            \
    if (plx_s_ != CUDNN_STATUS_SUCCESS)                                             \
      ::plexus::cuda::throw_cudnn(plx_s_, #expr, __FILE__, __LINE__);               \
  } while (0)

// Makes `device` current on the calling thread (remembered per thread, so repeated calls are free).
void use_device(int32_t device);

inline cudaStream_t native(plx_stream s) { return reinterpret_cast<cudaStream_t>(s); }
inline cudaEvent_t native(plx_event e) { return reinterpret_cast<cudaEvent_t>(e); }

// ---- errors found on the device ----
// One record per device in mapped pinned memory. The first kernel that finds bad data writes
// it; the host raises it at the next synchronisation (stream_sync/event_sync) and clears it.
enum DeviceErrorCode : int32_t {
  kErrNone = 0,
  kErrCrossEntropyLabel = 1,          // a = row, b = label, c = classes
  kErrCrossEntropyBackwardLabel = 2,  // a = row, b = label, c = classes
  kErrEmbeddingIndex = 3,             // a = position, b = index, c = rows
  kErrEmbeddingBackwardIndex = 4,     // a = position, b = index, c = rows
  kErrIntegerDivByZero = 5,           // a = element
  kErrAdamStep = 6,                   // a = step value * 1e6 (rounded), as the step is a float
};
struct DeviceErrorRecord {
  int32_t flag;  // 0: clear; set once by the first reporter
  int32_t code;
  long long a, b, c;
};
// Kernels write it with report_error() (device.cuh).

// What the plugin's options say (from [plugins.options.cuda]).
struct CudaOptions {
  bool tf32 = false;            // TF32 Tensor Cores for f32 GEMM and convolution
  bool benchmark = true;        // measure convolution algorithms (false: cuDNN's heuristics)
  std::string algo_cache;       // file of measured algorithms; "" keeps them in memory only
  uint64_t conv_workspace = uint64_t{1} << 30;  // most workspace a convolution algorithm may use
  // Most bytes of the pre-pool tensor (or its gradient) one chunk of a fused conv + max-pool
  // group holds in scratch (ops/conv_pool.cpp); at least one image is always taken.
  uint64_t fuse_chunk_bytes = uint64_t{32} << 20;
  // An f32 conv + [ReLU +] max-pool group adds the conv's bias in the pool kernel, so the conv
  // runs without it (false: the conv adds it, for timing the two against each other).
  bool pool_bias = true;
  // A conv2d's bias (and a ReLU after it) in cudnnConvolutionBiasActivationForward where cuDNN
  // takes it (false: the bias written first and the ReLU's own kernel, to time the two).
  bool conv_bias_activation = true;
  // A small CNN's whole f32 training step as two launches where the graph is one
  // (ops/step_cnn.cu), unless f32_channels_last; false: its parts' own fused kernels, to time the
  // two against each other.
  bool step_fusion = true;
  // The convolutions' cudnn_graph candidates (ops/conv_graph.cpp); false: they decline, and the
  // legacy cuDNN calls and the plugin's own kernels take the nodes.
  bool graph_api = true;
  // Kernels launched to overlap the kernel before them on the stream where the device and their
  // code allow (launch_kernel, device.cuh); false: every launch the ordinary way, to time the
  // two against each other.
  bool programmatic_launch = true;
  // f32's convolutions, max pools and their fused groups prefer channels-last activations, as
  // the 16-bit ones always do (the layout planner then keeps an f32 graph's activations NHWC:
  // cuDNN's descriptors follow the strides, and the TF32 implicit GEMMs gather 16 bytes, 4
  // channels, at a time). false: f32 graphs stay NCHW.
  bool f32_channels_last = false;
};

// n elements of T in device memory owned by one kernel object: zeroed, or copied from the host,
// when the object is created (never during a capture); n = 0 holds none (p null).
template <class T>
struct DeviceArray {
  T* p = nullptr;
  DeviceArray() = default;
  explicit DeviceArray(int64_t n) {
    if (n <= 0) return;
    const size_t bytes = static_cast<size_t>(n) * sizeof(T);
    PLX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), bytes));
    PLX_CUDA_CHECK(cudaMemset(p, 0, bytes));
  }
  explicit DeviceArray(const std::vector<T>& host) {
    if (host.empty()) return;
    const size_t bytes = host.size() * sizeof(T);
    PLX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), bytes));
    PLX_CUDA_CHECK(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceArray() {
    if (p) cudaFree(p);
  }
  DeviceArray(DeviceArray&& o) noexcept : p(o.p) { o.p = nullptr; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p, o.p);
    return *this;
  }
};

// The counts of blocks a cross-block reduction's kernel keeps (last_block_arrives, device.cuh):
// n counters (one per reduction: a tile's slices, say), zero between launches; n = 0 holds none
// until one is moved in. One launch of it at a time (the executor runs an executable's kernels
// on one stream).
struct BlockCounter : DeviceArray<unsigned> {
  explicit BlockCounter(int64_t n = 1) : DeviceArray<unsigned>(n) {}
};

// The per-device objects kernels share. Created on first use; handles are bound to a stream
// before every call, under `mu` (the executor drives a device from one thread, so the lock is
// uncontended).
struct DeviceContext {
  int32_t device = 0;
  cudaDeviceProp prop{};
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t dnn = nullptr;
  DeviceErrorRecord* error_host = nullptr;  // mapped pinned memory
  DeviceErrorRecord* error_dev = nullptr;   // the same memory, as the device sees it
  std::mutex mu;
};

// sm_90a code (wgmma, setmaxnreg, TMA) runs on compute capability 9.0 only: its candidates
// decline every other device at creation. `op` names the node in the reason.
inline void decline_unless_sm90a(const DeviceContext& ctx, const char* op) {
  PLX_DECLINE_UNLESS(ctx.prop.major == 9 && ctx.prop.minor == 0,
                     "%s: wgmma kernels are sm_90a code, which runs on compute capability 9.0 "
                     "only (this device is %d.%d)",
                     op, ctx.prop.major, ctx.prop.minor);
}

// Lets kernel `fn` launch with `bytes` of dynamic shared memory on the current device (the
// opt-in above 48 KiB). The attribute belongs to the function, not to a kernel object, and
// kernel objects of one function whose need depends on the shape (an igemm tile's K table, a
// direct kernel's image) share it: setting each object's own need would let a later, smaller
// one fail the launches of an earlier, larger one. So the limit only ever grows, per device and
// function (a process-wide table under a lock).
void allow_dynamic_smem(const void* fn, int bytes);
template <class... A>
void allow_dynamic_smem(void (*fn)(A...), int bytes) {
  allow_dynamic_smem(reinterpret_cast<const void*>(fn), bytes);
}

// Whether launches of kernel `fn` on the current device may overlap the kernel before them on
// the stream (launch_kernel, device.cuh): programmatic launches are on (the
// `programmatic_launch` option) and the code the device runs for `fn` was compiled for compute
// capability 9.0 or up. The test is the function's PTX version, not the device's: sm_80 code that
// a newer GPU compiled from PTX has no pdl_wait in it and must launch the ordinary way. Cached
// per thread, device and function.
bool programmatic_launch(const void* fn);
// Switches programmatic launches on or off for the whole process (every CUDA backend in it: the
// launches that need the switch have no backend at hand). The last backend created sets it.
void set_programmatic_launch(bool on);
// A launch CUDA refused: raised as a BackendError (OutOfMemory for cudaErrorMemoryAllocation)
// naming the kernel and CUDA's error.
[[noreturn]] void throw_launch(cudaError_t e, const void* fn);

class CudaBackend final : public sdk::Backend {
 public:
  CudaBackend(CudaOptions options);
  ~CudaBackend() override;

  const CudaOptions& options() const { return options_; }
  // Whether this dtype's 4-D kernels prefer channels-last (16 bits always; f32 with the
  // f32_channels_last option).
  bool prefers_nhwc(int32_t dtype) const {
    return dtype != PLX_F32 || options_.f32_channels_last;
  }
  // Allows or forbids TF32 for kernels created from now on ("cuda.set_tf32").
  void set_tf32(bool on) { options_.tf32 = on; }
  // Sets fuse_chunk_bytes for fused kernels created from now on ("cuda.set_fuse_chunk_bytes").
  void set_fuse_chunk_bytes(uint64_t bytes) { options_.fuse_chunk_bytes = bytes; }
  // Sets step_fusion for graphs prepared from now on ("cuda.set_step_fusion").
  void set_step_fusion(bool on) { options_.step_fusion = on; }
  // Why there is no device ("" when there is one): shown by `plexus info`.
  const std::string& unavailable_reason() const { return unavailable_; }

  // The device's shared objects, created on first use. Throws BackendError for a bad index.
  DeviceContext& context(int32_t device);

  // ---- sdk::Backend ----
  int32_t device_count() override { return device_count_; }
  void device_props(int32_t device, plx_device_props& p) override;
  void* mem_alloc(int32_t device, plx_mem_kind kind, uint64_t bytes, plx_stream s) override;
  void mem_free(int32_t device, plx_mem_kind kind, void* ptr, plx_stream s) override;
  void mem_copy(int32_t device, void* dst, const void* src, uint64_t bytes, plx_copy_dir dir,
                plx_stream s) override;
  void mem_set(int32_t device, void* dst, int32_t value, uint64_t bytes, plx_stream s) override;
  void mem_info(int32_t device, uint64_t& free_bytes, uint64_t& total_bytes) override;
  plx_stream stream_create(int32_t device) override;
  void stream_destroy(plx_stream s) override;
  void stream_sync(plx_stream s) override;
  void stream_wait_event(plx_stream s, plx_event e) override;
  plx_event event_create(int32_t device) override;
  void event_destroy(plx_event e) override;
  void event_record(plx_event e, plx_stream s) override;
  void event_sync(plx_event e) override;
  bool event_query(plx_event e) override;
  float event_elapsed_ms(plx_event start, plx_event end) override;
  bool has_capture() const override { return true; }
  void capture_begin(plx_stream s) override;
  void* capture_end(plx_stream s) override;
  void graph_launch(void* graph, plx_stream s) override;
  void graph_destroy(void* graph) override;
  void* stream_native(plx_stream s) override { return native(s); }
  void* get_proc_address(const char* name) override;
  // Fusion (ops/fusion.cpp): the multi-tensor optimizer update, linear+relu on cuBLASLt's
  // epilogue, other layer+activation chains, the classifier head and conv + max-pool groups.
  bool has_fusion() const override { return true; }
  void get_capability(const plx_graph_view& graph, plx_claim_fn claim, void* user) override;
  void create_fused(const plx_graph_view& graph, const int32_t* inputs, int32_t num_inputs,
                    const int32_t* outputs, int32_t num_outputs, const plx_kernel** kernel,
                    void** state, uint64_t* workspace_bytes) override;

 private:
  void check_device(int32_t device) const;
  void prefer_nhwc_in_f32();  // the f32_channels_last option (backend.cpp)
  // Raises (and clears) a data error a kernel recorded on any device.
  void raise_device_errors();

  CudaOptions options_;
  int32_t device_count_ = 0;
  std::string unavailable_;
  std::mutex mu_;
  std::vector<std::unique_ptr<DeviceContext>> contexts_;
  sdk::FusedTables fused_;
};

// ---- registration of each op family (ops/*) ----
void register_elementwise(KernelRegistry& r);  // activations, binary, scale, expand
void register_misc(KernelRegistry& r);         // copy, cast, dropout, embedding
void register_optim(KernelRegistry& r);        // sgd_update, adamw_update
void register_reduce(KernelRegistry& r);       // sum, mean, argmax
void register_softmax(KernelRegistry& r);      // softmax, log_softmax, cross-entropy
void register_norm(KernelRegistry& r);         // batch_norm, layer_norm
void register_pool(KernelRegistry& r);         // max/avg pooling
// relu_backward feeding max_pool2d_backward as one kernel (ops/pool.cu), for fusion.
std::unique_ptr<Kernel> make_relu_max_pool_backward(const sdk::GraphView& g, const sdk::Boundary& b,
                                                    plx_dtype& dtype);
// max_pool2d with a ReLU on y as it is written (ops/pool.cu): sdk::PoolReluMaker for the
// chunked conv + ReLU + pool (ops/conv_pool.cpp). Null for a dtype it has no kernel for.
std::unique_ptr<Kernel> make_max_pool_relu(const plx_node_info& pool, uint32_t& flags);
// max_pool2d adding the conv's per-channel bias (its input 1) to each window's maximum, then the
// ReLU where `relu`, as y is written (ops/pool.cu): sdk::PoolBiasReluMaker for the chunked conv
// + [ReLU +] pool, whose conv then runs without its bias (no fill of y with the bias first).
// f32 only (null otherwise: the 16-bit groups keep the bias in the conv).
std::unique_ptr<Kernel> make_max_pool_bias_relu(const plx_node_info& pool, bool relu,
                                                uint32_t& flags);
// max_pool2d_backward whose second output is its dx summed per channel (the conv's bias
// gradient), in one launch (ops/pool.cu): sdk::PoolBiasMaker for the chunked conv + pool
// backward. `sms`: the device's multiprocessors, which size the grid.
std::unique_ptr<Kernel> make_max_pool_backward_sum(const plx_node_info& pool, int sms,
                                                   uint32_t& flags);
// relu_backward and the bias gradient's sum of its output (axes 0, 2, 3, or 0 of a 2-d
// gradient), or gelu_backward and the sum over the rows of its 2-d output, as one kernel writing
// both (ops/pool.cu), for fusion; sets the dtype.
std::unique_ptr<Kernel> make_act_backward_sum(const sdk::GraphView& g, const sdk::Boundary& b,
                                              int sms, plx_dtype& dtype);
void register_gemm(KernelRegistry& r);         // matmul, linear (cuBLASLt)
void register_mma_gemm(KernelRegistry& r);     // matmul, linear (our mma.sync kernels)
void register_simt_gemm(KernelRegistry& r);    // matmul, linear: the SIMT kernel, any shape
void register_conv(KernelRegistry& r);         // conv2d and its backward ops (cuDNN)
void register_conv_graph(KernelRegistry& r);   // the same on cuDNN's graph API (ops/conv_graph.cpp)

// The fused linear -> relu (ops/gemm.cpp); sets the kernel's flags.
std::unique_ptr<Kernel> make_linear_relu(CudaBackend& backend, const sdk::GraphView& g,
                                         const sdk::Boundary& b, uint32_t& flags);
// A conv2d node's kernel that applies a ReLU after the bias in the same cuDNN call
// (cudnnConvolutionBiasActivationForward, ops/conv.cpp), for a fused conv2d -> relu; declines
// (sdk::Unsupported) where there is no bias or cuDNN does not take the call.
std::unique_ptr<Kernel> make_cudnn_conv_relu(const NodeInfo& node, CudaBackend& backend);
// The same pair as one graph of cuDNN's graph API (convolution, bias ADD, RELU_FWD;
// ops/conv_graph.cpp), for a conv the host gave to "cudnn_graph"; declines where cuDNN has no
// engine for that graph.
std::unique_ptr<Kernel> make_cudnn_graph_conv_relu(const NodeInfo& node, CudaBackend& backend);

// The registering backend, for kernels whose constructor takes (const NodeInfo&, CudaBackend&).
// Registration functions add such kernels with r.add<K, CudaBackend>(...).

}  // namespace plexus::cuda
