// The CUDA emulator's runtime API (tests/cuda/emu/README.md): the subset of cuda_runtime.h the
// CUDA plugin uses, on host memory. Streams run their work at once, in order, except while a
// stream is captured: then launches, copies and sets are recorded into the graph and run by
// cudaGraphLaunch. The rules CUDA enforces during a capture (no allocation, no synchronisation)
// and at a launch (block size, grid size, dynamic shared memory above 48 KiB only after
// cudaFuncSetAttribute) are enforced here too.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "plx_emu.hpp"

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  // A kernel's fault (700, 702, 710, 714-719) is sticky in CUDA: the context is unusable and
  // every later call returns it. The emulator's are too (runtime.cpp, "Faults").
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchTimeout = 702,
  cudaErrorAssert = 710,
  cudaErrorHardwareStackError = 714,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorInvalidAddressSpace = 717,
  cudaErrorInvalidPc = 718,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
} cudaError_t;

struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
typedef CUgraph_st* cudaGraph_t;
typedef CUgraphExec_st* cudaGraphExec_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
// What cudaFuncGetAttributes says of a kernel (the fields the plugin reads): the emulated device
// runs code "compiled for" compute capability 9.0 (PLEXUS_EMU_PTX_VERSION overrides the PTX
// version, to run a plugin as an sm_80 build would).
struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  size_t constSizeBytes;
  size_t localSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int ptxVersion;
  int binaryVersion;
  int cacheModeCA;
  int maxDynamicSharedSizeBytes;
  int preferredShmemCarveout;
};
// cudaLaunchKernelEx's configuration and the launch attributes the emulator knows: thread-block
// clusters (the blocks of a cluster run together) and programmatic stream serialization
// (programmatic dependent launch). Any other is refused.
enum cudaLaunchAttributeID {
  cudaLaunchAttributeIgnore = 0,
  cudaLaunchAttributeClusterDimension = 4,
  cudaLaunchAttributeProgrammaticStreamSerialization = 6,
};
union cudaLaunchAttributeValue {
  char pad[64];
  struct {
    unsigned x, y, z;
  } clusterDim;
  int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaMemAttachGlobal 0x01
// cudaGetDriverEntryPointByVersion: the flags and what the lookup found.
#define cudaEnableDefault 0x0ull
enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2,
};

// The vector types the kernels store through.
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  size_t sharedMemPerMultiprocessor;
  size_t reservedSharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
  int l2CacheSize;
  int maxThreadsPerMultiProcessor;
};

const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device);
cudaError_t cudaRuntimeGetVersion(int* version);
// The emulated driver's entry points: cuTensorMapEncodeTiled (cuda.h), from version 12000.
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaMallocManaged(void** p, size_t bytes, unsigned flags = cudaMemAttachGlobal);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned flags);
cudaError_t cudaFree(void* p);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaFuncSetAttribute(const void* fn, cudaFuncAttribute attr, int value);
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* fn);
// The kernel's name as its launches gave it (translate.py), or an error for a kernel never
// launched.
cudaError_t cudaFuncGetName(const char** name, const void* fn);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode);

template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
template <class T>
cudaError_t cudaMallocManaged(T** p, size_t bytes, unsigned flags = cudaMemAttachGlobal) {
  return cudaMallocManaged(reinterpret_cast<void**>(p), bytes, flags);
}
template <class T>
cudaError_t cudaHostAlloc(T** p, size_t bytes, unsigned flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(p), bytes, flags);
}
template <class T>
cudaError_t cudaHostGetDevicePointer(T** dev, void* host, unsigned flags) {
  return cudaHostGetDevicePointer(reinterpret_cast<void**>(dev), host, flags);
}
template <class R, class... P>
cudaError_t cudaFuncSetAttribute(R (*fn)(P...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), attr, value);
}

struct cudaLaunchConfig_t {
  dim3 gridDim;
  dim3 blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned numAttrs;
};

namespace plx_emu {

// A launch's configuration, as between <<< and >>>, whether it may overlap the kernel before it
// on the stream (cudaLaunchKernelEx's programmatic stream serialization), and its clusters'
// dimensions in blocks (1 x 1 x 1: none).
struct Config {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  bool programmatic = false;
  dim3 cluster{1, 1, 1};
  Config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr)
      : grid(g), block(b), smem(s), stream(st) {}
};

// Checks the configuration (the error is kept for cudaGetLastError, as CUDA does, and returned),
// then runs the grid now or records it into the stream's capture. `thread` runs one CUDA thread.
cudaError_t submit_launch(const char* name, const void* fn, const Config& c,
                          std::function<void()> thread);

// `kernel<<<config>>>(args...)`, as tests/cuda/emu/translate.py rewrites it: the arguments are
// converted to the kernel's parameter types once, at the launch, and every thread gets a copy.
template <class... P, class... A>
cudaError_t launch(const char* name, void (*kernel)(P...), const Config& c, A&&... a) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(static_cast<std::decay_t<P>>(a)...);
  return submit_launch(name, reinterpret_cast<const void*>(kernel), c,
                       [kernel, args] { std::apply(kernel, *args); });
}

// A launch through a variable that holds the kernel (`kernel_<<<...>>>(args)`): translate.py
// takes its address as for a kernel's name.
template <class... P, class... A>
cudaError_t launch(const char* name, void (*const* kernel)(P...), const Config& c, A&&... a) {
  return launch(name, *kernel, c, std::forward<A>(a)...);
}

// The name the next cudaLaunchKernelEx on this thread traces its kernel by: translate.py puts
// `(::plx_emu::name_next_launch("kernel<targs>"), launch_kernel(kernel<targs>, ...))` around
// each of the plugin's launch_kernel calls (device.cuh), which call cudaLaunchKernelEx.
void name_next_launch(const char* name);
// The name given, once ("cudaLaunchKernelEx" when none was).
const char* take_launch_name();
// The configuration of a cudaLaunchKernelEx, or an error (unknown attributes, a bad value).
cudaError_t launch_config(const cudaLaunchConfig_t* cfg, Config* out);

// Runs `work` on stream `s` now, or records it when the stream is being captured (library
// calls such as cub's sort go through here).
cudaError_t submit_work(cudaStream_t s, std::function<void()> work, const char* what);
// A library call (the emulated cuBLASLt and cuDNN) on stream `s`: traced as a launch, run now or
// recorded; an exception it throws when it runs fails it as a kernel fault would.
void submit_library_call(cudaStream_t s, std::function<void()> work, const char* name);

}  // namespace plx_emu

// How many clusters of the configuration's size (its cluster attribute) can run at once: one
// block per emulated SM when the block asks for more than half of an SM's shared memory, so
// SMs / cluster size; an error without the attribute or with more than 8 blocks a cluster.
cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, const void* fn,
                                           const cudaLaunchConfig_t* config);

template <class... P, class... A>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(P...),
                               A&&... args) {
  const char* name = ::plx_emu::take_launch_name();
  ::plx_emu::Config c(dim3{}, dim3{});
  if (const cudaError_t e = ::plx_emu::launch_config(config, &c); e != cudaSuccess) return e;
  return ::plx_emu::launch(name, kernel, c, std::forward<A>(args)...);
}
