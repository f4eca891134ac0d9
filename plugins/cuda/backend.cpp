// The CUDA plugin: devices, raw memory, streams, events and graph capture on the CUDA runtime,
// and the plugin object that reads [plugins.options.cuda]. Kernels live in ops/.
//
// A machine without a GPU or driver loads the plugin: device_count() is then 0 and the reason
// (the runtime's own message) is available to the host as "plexus.unavailable_reason", which
// `plexus info` prints and a config asking for `cuda` fails with.
#include <cxxabi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#ifdef PLEXUS_CUDA_WGMMA
#include "ops/wgmma_gemm.hpp"
#endif


namespace plexus::cuda {

// ---- errors ----

namespace {
std::string where(const char* expr, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return sdk::format("%s (%s:%d)", expr, base ? base + 1 : file, line);
}

// After these errors (a kernel's fault) CUDA's context is unusable: every later call returns the
// error, so nothing more can run in this process. The host's backend.check_kernels waits for each
// kernel of a step and names the one that fails.
const char* after_fault(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
      return "; a kernel failed on the device, which is unusable for the rest of this process "
             "(backend.check_kernels = true names the kernel)";
    default:
      return "";
  }
}
}  // namespace

void allow_dynamic_smem(const void* fn, int bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> limit;  // (device, function) -> bytes
  int device = 0;
  PLX_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  int& have = limit[{device, fn}];
  if (bytes <= have) return;
  PLX_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  have = bytes;
}

namespace {
std::atomic<bool> g_programmatic_launch{true};
}  // namespace

void set_programmatic_launch(bool on) {
  g_programmatic_launch.store(on, std::memory_order_relaxed);
}

bool programmatic_launch(const void* fn) {
  if (!g_programmatic_launch.load(std::memory_order_relaxed)) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  thread_local std::map<std::pair<int, const void*>, bool> known;
  const auto [it, fresh] = known.try_emplace({device, fn}, false);
  if (fresh) {
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, fn) == cudaSuccess)
      it->second = a.ptxVersion >= 90;
    else
      (void)cudaGetLastError();  // launched the ordinary way; the launch itself will say more
  }
  return it->second;
}

void throw_launch(cudaError_t e, const void* fn) {
  (void)cudaGetLastError();
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, fn) != cudaSuccess || !mangled) {
    (void)cudaGetLastError();
    mangled = "(unnamed)";
  }
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  const std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  const std::string msg = sdk::format("CUDA error %s: %s launching kernel %s%s", cudaGetErrorName(e),
                                      cudaGetErrorString(e), name.c_str(), after_fault(e));
  if (e == cudaErrorMemoryAllocation) throw sdk::OutOfMemory(msg);
  throw sdk::BackendError(msg);
}

void throw_cuda(cudaError_t e, const char* expr, const char* file, int line) {
  // A failed launch or allocation leaves the error to be read once; clear it so the next call
  // does not report it again. Sticky errors (a kernel fault) stay: the context is unusable.
  (void)cudaGetLastError();
  const std::string msg = sdk::format("CUDA error %s: %s in %s%s", cudaGetErrorName(e),
                                      cudaGetErrorString(e), where(expr, file, line).c_str(),
                                      after_fault(e));
  if (e == cudaErrorMemoryAllocation) throw sdk::OutOfMemory(msg);
  throw sdk::BackendError(msg);
}

void throw_cublas(cublasStatus_t s, const char* expr, const char* file, int line) {
  const std::string msg = sdk::format("cuBLAS error %s: %s in %s", cublasGetStatusName(s),
                                      cublasGetStatusString(s), where(expr, file, line).c_str());
  if (s == CUBLAS_STATUS_ALLOC_FAILED) throw sdk::OutOfMemory(msg);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) throw sdk::Unsupported(msg);
  throw sdk::BackendError(msg);
}

void throw_cudnn(cudnnStatus_t s, const char* expr, const char* file, int line) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  const std::string msg =
      sdk::format("cuDNN error %s in %s%s%s", cudnnGetErrorString(s),
                  where(expr, file, line).c_str(), detail[0] ? ": " : "", detail);
  if (s == CUDNN_STATUS_ALLOC_FAILED) throw sdk::OutOfMemory(msg);
  // cuDNN 9 groups its codes by the thousand: every 3xxx is a kind of "not supported".
  if (static_cast<int>(s) / 1000 == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED) / 1000)
    throw sdk::Unsupported(msg);
  throw sdk::BackendError(msg);
}

void use_device(int32_t device) {
  thread_local int32_t current = -1;
  if (current == device) return;
  PLX_CUDA_CHECK(cudaSetDevice(device));
  current = device;
}

// ---- the backend ----

CudaBackend::CudaBackend(CudaOptions options) : sdk::Backend("cuda"), options_(std::move(options)) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    unavailable_ = sdk::format("no CUDA device: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    n = 0;
  } else if (n == 0) {
    unavailable_ = "no CUDA device: the driver reports none";
  }
  device_count_ = n;
  contexts_.resize(static_cast<size_t>(n));
  set_programmatic_launch(options_.programmatic_launch);
  register_elementwise(kernels());
  register_misc(kernels());
  register_optim(kernels());
  register_reduce(kernels());
  register_softmax(kernels());
  register_norm(kernels());
  register_pool(kernels());
  register_gemm(kernels());
  // After cuBLASLt: without the autotuner the first accepting kernel wins, so ours only run
  // when the tuner or backend.kernels = "native" picks them.
  register_mma_gemm(kernels());
#ifdef PLEXUS_CUDA_WGMMA
  // The Hopper GEMM (sm_90a only; it declines other devices), after the mma.sync candidates.
  register_wgmma_gemm(kernels());
#endif
  // Last of the native GEMMs: the SIMT kernel, for the shapes every Tensor Core tile declines.
  register_simt_gemm(kernels());
  register_conv(kernels());
  if (options_.f32_channels_last) prefer_nhwc_in_f32();
}

// f32_channels_last: each f32 convolution and max pool whose 16-bit namesake (the same op and
// impl, the same class template) prefers channels-last prefers it too. Those classes take either
// layout for each tensor in every dtype (abi/ops.h's promise for PLX_LAYOUT_NHWC), which the op
// tests check in f32 as in 16 bits; only the preference was 16-bit.
void CudaBackend::prefer_nhwc_in_f32() {
  static const std::set<std::string, std::less<>> ops = {
      "conv2d", "conv2d_backward_data", "conv2d_backward_weight", "max_pool2d",
      "max_pool2d_backward"};
  std::vector<std::pair<std::string, std::string>> nhwc;  // (op, impl)
  for (int32_t i = 0; i < kernels().size(); ++i) {
    const plx_kernel* k = kernels().get(i);
    if (k->dtype == PLX_F16 && k->layout == PLX_LAYOUT_NHWC && ops.count(k->op) != 0)
      nhwc.emplace_back(k->op, k->impl);
  }
  for (const auto& [op, impl] : nhwc) kernels().set_layout(op, PLX_F32, impl, PLX_LAYOUT_NHWC);
}

CudaBackend::~CudaBackend() {
  for (auto& c : contexts_) {
    if (!c) continue;
    // Errors here have nowhere to go; the process may be exiting with the driver gone.
    if (cudaSetDevice(c->device) != cudaSuccess) continue;
    if (c->dnn) cudnnDestroy(c->dnn);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->error_host) cudaFreeHost(c->error_host);
  }
}

void CudaBackend::check_device(int32_t device) const {
  if (device_count_ == 0) throw sdk::Error(PLX_ERR_NOT_FOUND, unavailable_);
  PLX_REQUIRE(device >= 0 && device < device_count_, "CUDA device %d does not exist (%d present)",
              device, device_count_);
}

DeviceContext& CudaBackend::context(int32_t device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = contexts_[static_cast<size_t>(device)];
  if (slot) return *slot;
  auto c = std::make_unique<DeviceContext>();
  c->device = device;
  use_device(device);
  PLX_CUDA_CHECK(cudaGetDeviceProperties(&c->prop, device));
  PLX_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&c->error_host), sizeof(DeviceErrorRecord),
                               cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(c->error_host, 0, sizeof(DeviceErrorRecord));
  PLX_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&c->error_dev), c->error_host, 0));
  PLX_CUBLAS_CHECK(cublasLtCreate(&c->lt));
  PLX_CUDNN_CHECK(cudnnCreate(&c->dnn));
  slot = std::move(c);
  return *slot;
}

void CudaBackend::raise_device_errors() {
  for (auto& c : contexts_) {
    if (!c) continue;
    volatile DeviceErrorRecord* r = c->error_host;
    if (r->flag == 0) continue;
    const int32_t code = r->code;
    const long long a = r->a, b = r->b, n = r->c;
    r->code = 0;
    r->flag = 0;
    switch (code) {
      case kErrCrossEntropyLabel:
      case kErrCrossEntropyBackwardLabel:
        throw sdk::InvalidArgument(sdk::format(
            "%s: label %lld of row %lld is outside [0, %lld) and is not ignore_index",
            code == kErrCrossEntropyLabel ? "softmax_cross_entropy"
                                          : "softmax_cross_entropy_backward",
            b, a, n));
      case kErrEmbeddingIndex:
      case kErrEmbeddingBackwardIndex:
        throw sdk::InvalidArgument(sdk::format(
            "%s: index %lld at position %lld is outside [0, %lld)",
            code == kErrEmbeddingIndex ? "embedding" : "embedding_backward", b, a, n));
      case kErrIntegerDivByZero:
        throw sdk::InvalidArgument(
            sdk::format("div: integer division by zero at element %lld", a));
      case kErrAdamStep:
        throw sdk::InvalidArgument(sdk::format(
            "adamw_update: step must be >= 1, got %g", static_cast<double>(a) * 1e-6));
      default:
        throw sdk::Error(PLX_ERR_INTERNAL,
                         sdk::format("a CUDA kernel reported unknown error code %d", code));
    }
  }
}

void CudaBackend::device_props(int32_t device, plx_device_props& p) {
  DeviceContext& c = context(device);
  std::snprintf(p.name, sizeof p.name, "%.127s", c.prop.name);
  size_t free_b = 0, total_b = 0;
  use_device(device);
  PLX_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  p.total_memory = total_b;
  p.free_memory = free_b;
  p.compute_units = c.prop.multiProcessorCount;
  p.arch_major = c.prop.major;
  p.arch_minor = c.prop.minor;
  p.caps = PLX_CAP_F16 | PLX_CAP_PINNED | PLX_CAP_MANAGED | PLX_CAP_ASYNC | PLX_CAP_GRAPH_CAPTURE;
  if (c.prop.major >= 8) p.caps |= PLX_CAP_BF16;
  if (c.prop.major >= 7) p.caps |= PLX_CAP_TENSOR_CORES;
  p.alignment = 256;
}

void* CudaBackend::mem_alloc(int32_t device, plx_mem_kind kind, uint64_t bytes, plx_stream) {
  check_device(device);
  use_device(device);
  void* p = nullptr;
  cudaError_t e = cudaSuccess;
  switch (kind) {
    case PLX_MEM_DEVICE: e = cudaMalloc(&p, bytes); break;
    case PLX_MEM_PINNED: e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable); break;
    case PLX_MEM_MANAGED: e = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal); break;
  }
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    static const char* names[] = {"device", "pinned host", "managed"};
    throw sdk::OutOfMemory(sdk::format(
        "CUDA device %d: allocating %llu bytes of %s memory failed (%llu of %llu bytes free)",
        device, static_cast<unsigned long long>(bytes), names[kind],
        static_cast<unsigned long long>(free_b), static_cast<unsigned long long>(total_b)));
  }
  PLX_CUDA_CHECK(e);
  return p;
}

void CudaBackend::mem_free(int32_t device, plx_mem_kind kind, void* ptr, plx_stream) {
  if (!ptr) return;
  check_device(device);
  use_device(device);
  // cudaFree waits for the device, so work still using the memory finishes first.
  if (kind == PLX_MEM_PINNED) PLX_CUDA_CHECK(cudaFreeHost(ptr));
  else PLX_CUDA_CHECK(cudaFree(ptr));
}

void CudaBackend::mem_copy(int32_t device, void* dst, const void* src, uint64_t bytes,
                           plx_copy_dir, plx_stream s) {
  if (bytes == 0) return;
  check_device(device);
  use_device(device);
  // Unified addressing: the runtime tells host from device pointers itself.
  PLX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native(s)));
}

void CudaBackend::mem_set(int32_t device, void* dst, int32_t value, uint64_t bytes, plx_stream s) {
  if (bytes == 0) return;
  check_device(device);
  use_device(device);
  PLX_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, native(s)));
}

void CudaBackend::mem_info(int32_t device, uint64_t& free_bytes, uint64_t& total_bytes) {
  check_device(device);
  use_device(device);
  size_t f = 0, t = 0;
  PLX_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  free_bytes = f;
  total_bytes = t;
}

plx_stream CudaBackend::stream_create(int32_t device) {
  context(device);
  use_device(device);
  cudaStream_t s = nullptr;
  PLX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return reinterpret_cast<plx_stream>(s);
}

void CudaBackend::stream_destroy(plx_stream s) {
  if (s) PLX_CUDA_CHECK(cudaStreamDestroy(native(s)));
}

void CudaBackend::stream_sync(plx_stream s) {
  PLX_CUDA_CHECK(cudaStreamSynchronize(native(s)));
  raise_device_errors();
}

void CudaBackend::stream_wait_event(plx_stream s, plx_event e) {
  PLX_CUDA_CHECK(cudaStreamWaitEvent(native(s), native(e), 0));
}

plx_event CudaBackend::event_create(int32_t device) {
  check_device(device);
  use_device(device);
  cudaEvent_t e = nullptr;
  PLX_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return reinterpret_cast<plx_event>(e);
}

void CudaBackend::event_destroy(plx_event e) {
  if (e) PLX_CUDA_CHECK(cudaEventDestroy(native(e)));
}

void CudaBackend::event_record(plx_event e, plx_stream s) {
  PLX_CUDA_CHECK(cudaEventRecord(native(e), native(s)));
}

void CudaBackend::event_sync(plx_event e) {
  PLX_CUDA_CHECK(cudaEventSynchronize(native(e)));
  raise_device_errors();
}

bool CudaBackend::event_query(plx_event e) {
  const cudaError_t r = cudaEventQuery(native(e));
  if (r == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  PLX_CUDA_CHECK(r);
  return true;
}

float CudaBackend::event_elapsed_ms(plx_event start, plx_event end) {
  float ms = 0;
  PLX_CUDA_CHECK(cudaEventElapsedTime(&ms, native(start), native(end)));
  return ms;
}

// ---- graph capture ----

void CudaBackend::capture_begin(plx_stream s) {
  PLX_REQUIRE(s != nullptr, "capture_begin: the default stream cannot be captured");
  // Thread-local mode: only this thread's unsafe calls (a cudaMalloc, a sync) break the capture.
  PLX_CUDA_CHECK(cudaStreamBeginCapture(native(s), cudaStreamCaptureModeThreadLocal));
}

void* CudaBackend::capture_end(plx_stream s) {
  cudaGraph_t graph = nullptr;
  PLX_CUDA_CHECK(cudaStreamEndCapture(native(s), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  // Name the call (and the way round a refusal of programmatic edges, which no GPU has been seen
  // to make), not the variable that holds its error.
  if (e != cudaSuccess)
    throw_cuda(e,
               g_programmatic_launch.load(std::memory_order_relaxed)
                   ? "cudaGraphInstantiate, the step's kernels launched programmatically "
                     "(plugins.options.cuda.programmatic_launch = false launches them without)"
                   : "cudaGraphInstantiate",
               __FILE__, __LINE__);
  return exec;
}

void CudaBackend::graph_launch(void* graph, plx_stream s) {
  PLX_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), native(s)));
}

void CudaBackend::graph_destroy(void* graph) {
  if (graph) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

// ---- extras ----

namespace {
const char* unavailable_reason_fn(void* ctx) {
  return static_cast<CudaBackend*>(ctx)->unavailable_reason().c_str();
}
void set_tf32_fn(void* ctx, int32_t on) { static_cast<CudaBackend*>(ctx)->set_tf32(on != 0); }
void set_fuse_chunk_bytes_fn(void* ctx, int64_t bytes) {
  static_cast<CudaBackend*>(ctx)->set_fuse_chunk_bytes(bytes > 0 ? static_cast<uint64_t>(bytes) : 0);
}
void set_step_fusion_fn(void* ctx, int32_t on) {
  static_cast<CudaBackend*>(ctx)->set_step_fusion(on != 0);
}
}  // namespace

void* CudaBackend::get_proc_address(const char* name) {
  const std::string n = name ? name : "";
  // const char* (*)(void* backend_ctx): why the backend has no device, "" if it has one.
  if (n == "plexus.unavailable_reason") return reinterpret_cast<void*>(&unavailable_reason_fn);
  // void (*)(void* backend_ctx, int32_t on): TF32 for f32 GEMMs/convolutions created from now on.
  if (n == "cuda.set_tf32") return reinterpret_cast<void*>(&set_tf32_fn);
  // void (*)(void* backend_ctx, int64_t bytes): fuse_chunk_bytes for fused kernels created from
  // now on (tests make a small batch take several chunks with it).
  if (n == "cuda.set_fuse_chunk_bytes") return reinterpret_cast<void*>(&set_fuse_chunk_bytes_fn);
  // void (*)(void* backend_ctx, int32_t on): step_fusion for graphs prepared from now on (tests of
  // the step's parts turn it off).
  if (n == "cuda.set_step_fusion") return reinterpret_cast<void*>(&set_step_fusion_fn);
  return nullptr;
}

// ---- the plugin ----

namespace {

bool option_bool(const sdk::HostContext& host, const char* key, bool fallback) {
  const auto v = host.option(key);
  if (!v) return fallback;
  if (*v == "true") return true;
  if (*v == "false") return false;
  throw sdk::InvalidArgument(sdk::format("option '%s': expected true or false, got '%s'", key, v->c_str()));
}

std::string default_algo_cache() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string dir = xdg && *xdg ? xdg : (home && *home ? std::string(home) + "/.cache" : "");
  return dir.empty() ? "" : dir + "/plexus/cuda-conv-algorithms.tsv";
}

class CudaPlugin final : public sdk::Plugin {
 public:
  explicit CudaPlugin(const sdk::HostContext& host) {
    host.check_options({"tf32", "benchmark", "algo_cache", "conv_workspace", "fuse_chunk_bytes",
                        "pool_bias", "conv_bias_activation", "graph_api", "programmatic_launch",
                        "f32_channels_last", "step_fusion"});
    CudaOptions o;
    o.tf32 = option_bool(host, "tf32", false);
    o.benchmark = option_bool(host, "benchmark", true);
    o.algo_cache = host.option("algo_cache").value_or(default_algo_cache());
    const int64_t ws = host.option_int("conv_workspace", static_cast<int64_t>(o.conv_workspace));
    PLX_REQUIRE(ws >= 0, "option 'conv_workspace': expected bytes >= 0, got %lld",
                static_cast<long long>(ws));
    o.conv_workspace = static_cast<uint64_t>(ws);
    const int64_t chunk =
        host.option_int("fuse_chunk_bytes", static_cast<int64_t>(o.fuse_chunk_bytes));
    PLX_REQUIRE(chunk >= 0, "option 'fuse_chunk_bytes': expected bytes >= 0, got %lld",
                static_cast<long long>(chunk));
    o.fuse_chunk_bytes = static_cast<uint64_t>(chunk);
    o.pool_bias = option_bool(host, "pool_bias", true);
    o.conv_bias_activation = option_bool(host, "conv_bias_activation", true);
    o.graph_api = option_bool(host, "graph_api", true);
    o.programmatic_launch = option_bool(host, "programmatic_launch", true);
    o.f32_channels_last = option_bool(host, "f32_channels_last", false);
    o.step_fusion = option_bool(host, "step_fusion", true);
    auto& b = add_backend(std::make_unique<CudaBackend>(std::move(o)));
    if (b.device_count() == 0)
      PLX_LOG(PLX_LOG_DEBUG, "cuda", "%s", b.unavailable_reason().c_str());
  }
};

}  // namespace
}  // namespace plexus::cuda

PLEXUS_PLUGIN(plexus::cuda::CudaPlugin, "cuda", "0.1.0",
              "CUDA backend: cuBLASLt GEMMs, cuDNN convolutions, own kernels for the rest; "
              "f32 (TF32 optional), f16, bf16")
