// The CUDA emulator's own checks (tests/cuda/emu/README.md): that its threads, barriers, warp
// shuffles, launch checks and stream capture behave as CUDA specifies, so that a kernel passing
// on the emulator has passed something. Built by tests/cuda/emu/emu.cmake, run by ctest.
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include <cstdio>
#include <vector>

namespace {

int g_failures = 0;
#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "selftest.cu:%d: FAILED: %s\n", __LINE__, #cond);  \
      ++g_failures;                                                           \
    }                                                                         \
  } while (0)

template <class T>
T* device_array(size_t n) {
  T* p = nullptr;
  EXPECT(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return p;
}

// A block sums its thread indices through shared memory and two barriers per step.
__global__ void block_sum_kernel(int* out) {
  __shared__ int s[256];
  s[threadIdx.x] = static_cast<int>(threadIdx.x + blockIdx.x * 1000);
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// Butterfly and tree sums, a broadcast within 16-lane groups, and an upward shift.
__global__ void shuffle_kernel(int* xor_sum, int* down_sum, int* bcast, int* up) {
  const int lane = threadIdx.x & 31;
  int v = lane + 1;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  xor_sum[threadIdx.x] = v;
  int d = lane + 1;
  for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
  down_sum[threadIdx.x] = d;
  bcast[threadIdx.x] = __shfl_sync(0xffffffffu, lane * 10, 3, 16);
  up[threadIdx.x] = __shfl_up_sync(0xffffffffu, lane, 1);
}

__global__ void vote_kernel(int* any, int* count) {
  const int a = __syncthreads_or(threadIdx.x == 77);
  const int c = __syncthreads_count(threadIdx.x % 3 == 0);
  if (threadIdx.x == 5) {
    *any = a;
    *count = c;
  }
}

// Threads past 100 exit; the rest still meet at the barrier.
__global__ void early_exit_kernel(int* out) {
  __shared__ int s[128];
  if (threadIdx.x >= 100) return;
  s[threadIdx.x] = 1;
  __syncthreads();
  if (threadIdx.x == 0) {
    int t = 0;
    for (int i = 0; i < 100; ++i) t += s[i];
    *out = t;
  }
}

// Half the warp waits for the whole warp at __syncwarp, the other half for the block at
// __syncthreads: neither barrier can complete.
__global__ void deadlock_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncwarp();
  } else {
    __syncthreads();
  }
  *out = 1;
}

// Lanes past 16 exit, then the others shuffle with a full mask.
__global__ void exited_lane_kernel(int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

__global__ void smem_kernel(float* out, int n) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = static_cast<float>(i);
  __syncthreads();
  if (threadIdx.x == 0) *out = buf[n - 1];
}

__global__ void add_one_kernel(int* p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *p += 1;
}

}  // namespace

int main() {
  {
    int* out = device_array<int>(3);
    block_sum_kernel<<<3, 256>>>(out);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int b = 0; b < 3; ++b) EXPECT(out[b] == 255 * 256 / 2 + b * 1000 * 256);
    cudaFree(out);
  }
  {
    int *x = device_array<int>(64), *d = device_array<int>(64), *bc = device_array<int>(64),
        *up = device_array<int>(64);
    shuffle_kernel<<<1, 64>>>(x, d, bc, up);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int t = 0; t < 64; ++t) {
      const int lane = t & 31;
      EXPECT(x[t] == 32 * 33 / 2);
      if (lane == 0) EXPECT(d[t] == 32 * 33 / 2);
      EXPECT(bc[t] == (lane < 16 ? 3 : 19) * 10);
      EXPECT(up[t] == (lane == 0 ? 0 : lane - 1));
    }
    cudaFree(x), cudaFree(d), cudaFree(bc), cudaFree(up);
  }
  {
    int *any = device_array<int>(1), *count = device_array<int>(1);
    vote_kernel<<<1, 200>>>(any, count);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(*any == 1);
    EXPECT(*count == 67);
    cudaFree(any), cudaFree(count);
  }
  {
    int* out = device_array<int>(1);
    EXPECT(static_cast<unsigned>(*out) == 0xFFFFFFFFu);  // fresh device memory is garbage
    early_exit_kernel<<<1, 128>>>(out);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(*out == 100);
    std::fprintf(stderr, "selftest: the next two launches must fail (a deadlock, an exited lane):\n");
    deadlock_kernel<<<1, 32>>>(out);
    EXPECT(cudaGetLastError() == cudaErrorLaunchFailure);
    exited_lane_kernel<<<1, 32>>>(out);
    EXPECT(cudaGetLastError() == cudaErrorLaunchFailure);
    cudaFree(out);
  }
  {
    float* out = device_array<float>(1);
    const int n = 20000;  // 80,000 bytes: above the 48 KiB a launch gets without opting in
    std::fprintf(stderr, "selftest: the next launch must be refused (shared memory):\n");
    smem_kernel<<<1, 128, n * sizeof(float)>>>(out, n);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
    EXPECT(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                n * sizeof(float)) == cudaSuccess);
    smem_kernel<<<1, 128, n * sizeof(float)>>>(out, n);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(*out == static_cast<float>(n - 1));
    std::fprintf(stderr, "selftest: the next launch must be refused (block size):\n");
    smem_kernel<<<1, 2048>>>(out, 1);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration);
    cudaFree(out);
  }
  {
    int* p = device_array<int>(1);
    *p = 0;
    cudaStream_t s;
    EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    add_one_kernel<<<2, 32, 0, s>>>(p);
    int v = 5;
    EXPECT(cudaMemcpyAsync(p, &v, sizeof v, cudaMemcpyDefault, s) == cudaSuccess);
    add_one_kernel<<<1, 32, 0, s>>>(p);
    EXPECT(*p == 0);  // recorded, not run
    cudaGraph_t graph;
    EXPECT(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    cudaGraphExec_t exec;
    EXPECT(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    EXPECT(cudaGraphLaunch(exec, s) == cudaSuccess);
    EXPECT(*p == 6);
    v = 10;  // a graph copies from the address it captured, read when it runs
    EXPECT(cudaGraphLaunch(exec, s) == cudaSuccess);
    EXPECT(*p == 11);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    // An allocation or a synchronisation invalidates the capture.
    std::fprintf(stderr, "selftest: the next capture must be invalidated:\n");
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    void* q = nullptr;
    EXPECT(cudaMalloc(&q, 16) == cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    cudaStreamDestroy(s);
    cudaFree(p);
  }
  {
    // Stable by the key bits [0, 4): equal keys keep their order.
    const int n = 6;
    unsigned* k_in = device_array<unsigned>(n);
    unsigned* k_out = device_array<unsigned>(n);
    int* v_in = device_array<int>(n);
    int* v_out = device_array<int>(n);
    const unsigned keys[n] = {3, 1, 0x13, 2, 1, 0};
    for (int i = 0; i < n; ++i) k_in[i] = keys[i], v_in[i] = i;
    size_t bytes = 0;
    EXPECT(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k_in, k_out, v_in, v_out, n, 0, 4) == cudaSuccess);
    void* tmp = nullptr;
    EXPECT(cudaMalloc(&tmp, bytes) == cudaSuccess);
    EXPECT(cub::DeviceRadixSort::SortPairs(tmp, bytes, k_in, k_out, v_in, v_out, n, 0, 4) == cudaSuccess);
    const int order[n] = {5, 1, 4, 3, 0, 2};  // keys 0, 1, 1, 2, 3, 0x13 (3 in the low bits)
    for (int i = 0; i < n; ++i) EXPECT(v_out[i] == order[i]);
    cudaFree(tmp), cudaFree(k_in), cudaFree(k_out), cudaFree(v_in), cudaFree(v_out);
  }
  if (g_failures) {
    std::fprintf(stderr, "cuda emulator selftest: %d checks failed\n", g_failures);
    return 1;
  }
  std::printf("cuda emulator selftest: all checks passed\n");
  return 0;
}
