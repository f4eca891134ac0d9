// The CUDA emulator's own checks (tests/cuda/emu/README.md): that its threads, barriers, warp
// shuffles, launch checks, stream capture and the Tensor Core kernels' PTX (cp.async, ldmatrix,
// mma.sync, checked here against the PTX ISA's own formulas, "element i of lane l is at row ...,
// column ...") behave as CUDA specifies, so that a kernel passing on the emulator has passed
// something. Built by tests/cuda/emu/emu.cmake, run by ctest.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <cstdio>
#include <cstring>
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

// ---- PTX ----

// Four 8x8 matrices of 16-bit values m·64 + r·8 + c in shared memory (rows of 16 elements, so
// each row starts 32 bytes apart); lane l addresses row l % 8 of matrix l / 8. Each lane writes
// its four registers, without and with .trans.
__global__ void ldmatrix_kernel(uint32_t* plain, uint32_t* trans) {
  extern __shared__ uint16_t mats[];
  const int lane = threadIdx.x;
  for (int i = lane; i < 4 * 8 * 16; i += 32) {
    const int m = i / 128, r = (i / 16) % 8, c = i % 16;
    mats[i] = static_cast<uint16_t>(c < 8 ? m * 64 + r * 8 + c : 0xDEAD);
  }
  __syncthreads();
  const uint32_t addr = ::plx_emu::shared_address(mats + (lane / 8) * 128 + (lane % 8) * 16);
  uint32_t r[4];
  ::plx_emu::ldmatrix(r, 4, addr, false);
  for (int i = 0; i < 4; ++i) plain[lane * 4 + i] = r[i];
  ::plx_emu::ldmatrix(r, 4, addr, true);
  for (int i = 0; i < 4; ++i) trans[lane * 4 + i] = r[i];
}

// One mma: each lane packs its fragments of A (16 x K) and B (K x 8), row-major 16-bit bit
// patterns or f32 (tf32) in global memory, by the PTX ISA's formulas, and writes D by C's.
__global__ void mma_kernel(const uint32_t* a, const uint32_t* b, float* d, int kind) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  uint32_t af[4], bf[2];
  if (kind == 2) {  // m16n8k8 .tf32: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
    for (int i = 0; i < 4; ++i) af[i] = a[(g + 8 * (i & 1)) * 8 + t + 4 * (i >> 1)];
    for (int i = 0; i < 2; ++i) bf[i] = b[(t + 4 * i) * 8 + g];  // b0 (t, g), b1 (t + 4, g)
  } else {  // m16n8k16: a_i at row g (+8 for i in 2,3,6,7), column 2t + (i & 1) (+8 for i >= 4)
    uint16_t ae[8], be[4];
    for (int i = 0; i < 8; ++i) {
      const int row = g + ((i >= 2 && i < 4) || i >= 6 ? 8 : 0);
      const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
      ae[i] = static_cast<uint16_t>(a[row * 16 + col]);
    }
    for (int i = 0; i < 4; ++i)  // b_i at row 2t + (i & 1) (+8 for i >= 2), column g
      be[i] = static_cast<uint16_t>(b[(2 * t + (i & 1) + (i >= 2 ? 8 : 0)) * 8 + g]);
    for (int j = 0; j < 4; ++j) af[j] = ae[2 * j] | static_cast<uint32_t>(ae[2 * j + 1]) << 16;
    for (int j = 0; j < 2; ++j) bf[j] = be[2 * j] | static_cast<uint32_t>(be[2 * j + 1]) << 16;
  }
  float c[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  ::plx_emu::mma(c, af, bf, static_cast<::plx_emu::MmaKind>(kind));
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = c[i];  // c_i
}

// Thread 0 copies 16 bytes into shared memory with cp.async and reads them before and after
// the wait; `zero` copies with src-size 0 (zero fill) instead.
__global__ void cp_async_kernel(const uint32_t* src, uint32_t* seen, bool zero) {
  extern __shared__ uint32_t buf[];
  if (threadIdx.x != 0) return;
  for (int i = 0; i < 4; ++i) buf[i] = 7;
  ::plx_emu::cp_async(::plx_emu::shared_address(buf), src, 16, zero ? 0 : 16);
  ::plx_emu::cp_async_commit();
  ::plx_emu::cp_async_commit();  // an empty group
  seen[0] = buf[0];
  ::plx_emu::cp_async_wait(1);  // the empty group may still be pending: the copy has landed
  for (int i = 0; i < 4; ++i) seen[1 + i] = buf[i];
}

// An ldmatrix in a block of 16 threads (the warp is not whole), and a cp.async past the end of
// the shared memory.
__global__ void half_warp_ldmatrix_kernel(uint32_t* out) {
  extern __shared__ uint16_t m[];
  uint32_t r[4];
  ::plx_emu::ldmatrix(r, 4, ::plx_emu::shared_address(m), false);
  out[threadIdx.x] = r[0];
}
__global__ void cp_async_out_of_range_kernel(const uint32_t* src) {
  extern __shared__ uint32_t buf[];
  ::plx_emu::cp_async(::plx_emu::shared_address(buf) + 64, src, 16, 16);
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
  {
    // ldmatrix: lane l holds row l / 4, elements 2 (l % 4) and + 1 of each matrix (low half
    // first); with .trans, element l / 4 of rows 2 (l % 4) and + 1.
    uint32_t* plain = device_array<uint32_t>(128);
    uint32_t* trans = device_array<uint32_t>(128);
    ldmatrix_kernel<<<1, 32, 4 * 8 * 16 * sizeof(uint16_t)>>>(plain, trans);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m) {
        const uint32_t r = l / 4, c = 2 * (l % 4), base = m * 64;
        EXPECT(plain[l * 4 + m] == ((base + r * 8 + c) | (base + r * 8 + c + 1) << 16));
        EXPECT(trans[l * 4 + m] == ((base + c * 8 + r) | (base + (c + 1) * 8 + r) << 16));
      }
    cudaFree(plain), cudaFree(trans);
  }
  {
    // mma: D = A B + C with small integers (exact in every type), each kind against a direct
    // product.
    for (int kind = 0; kind < 3; ++kind) {
      const int K = kind == 2 ? 8 : 16;
      uint32_t* a = device_array<uint32_t>(16 * 16);
      uint32_t* b = device_array<uint32_t>(16 * 8);
      float* d = device_array<float>(16 * 8);
      std::vector<float> av(16 * K), bv(K * 8);
      auto bits = [&](float v) -> uint32_t {
        if (kind == 0) return __half_as_ushort(__half(v));
        if (kind == 1) return __bfloat16_as_ushort(__nv_bfloat16(v));
        uint32_t u;
        std::memcpy(&u, &v, sizeof u);
        return u;
      };
      for (int i = 0; i < 16 * K; ++i) av[i] = static_cast<float>((i * 7) % 11 - 5), a[i] = bits(av[i]);
      for (int i = 0; i < K * 8; ++i) bv[i] = static_cast<float>((i * 5) % 9 - 4), b[i] = bits(bv[i]);
      mma_kernel<<<1, 32>>>(a, b, d, kind);
      EXPECT(cudaGetLastError() == cudaSuccess);
      int bad = 0;
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c) {
          float want = 0.5f;
          for (int k = 0; k < K; ++k) want += av[r * K + k] * bv[k * 8 + c];
          bad += d[r * 8 + c] != want;
        }
      EXPECT(bad == 0);
      cudaFree(a), cudaFree(b), cudaFree(d);
    }
  }
  {
    // cp.async lands at the wait that retires its group (PLEXUS_EMU_CP_ASYNC unset: late); a
    // src-size of 0 fills zeros.
    uint32_t* src = device_array<uint32_t>(4);
    uint32_t* seen = device_array<uint32_t>(5);
    for (int i = 0; i < 4; ++i) src[i] = 100 + i;
    cp_async_kernel<<<1, 32, 16>>>(src, seen, false);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(seen[0] == 7);
    for (int i = 0; i < 4; ++i) EXPECT(seen[1 + i] == 100u + i);
    cp_async_kernel<<<1, 32, 16>>>(src, seen, true);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (int i = 0; i < 4; ++i) EXPECT(seen[1 + i] == 0);
    std::fprintf(stderr, "selftest: the next two launches must fail (a half warp's ldmatrix, a "
                         "cp.async past the shared memory):\n");
    half_warp_ldmatrix_kernel<<<1, 16, 256>>>(seen);
    EXPECT(cudaGetLastError() == cudaErrorLaunchFailure);
    cp_async_out_of_range_kernel<<<1, 32, 64>>>(src);
    EXPECT(cudaGetLastError() == cudaErrorLaunchFailure);
    cudaFree(src), cudaFree(seen);
  }
  if (g_failures) {
    std::fprintf(stderr, "cuda emulator selftest: %d checks failed\n", g_failures);
    return 1;
  }
  std::printf("cuda emulator selftest: all checks passed\n");
  return 0;
}
