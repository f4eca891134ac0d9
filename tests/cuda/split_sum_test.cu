// split_sum (plugins/cuda/device.cuh), the in-launch finish of the plugin's split reductions
// (weight gradients, split-K GEMMs, bias sums), run on the CUDA emulator: S blocks each write a
// partial of `count` elements, and the block that finishes must produce, for every element, the
// slices' sum in split_sum's documented order (groups of ⌈√S⌉ slices in slice order, then the
// groups in group order), bit for bit, whichever block finishes when (ctest runs it with the
// blocks in forward, reverse and shuffled order), in exactly one block, with the counters left
// zero for the next launch. Built by tests/cuda/emu/emu.cmake, run by ctest.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "device.cuh"

using plexus::cuda::split_sum;
using plexus::cuda::split_sum_counters;
using plexus::cuda::split_sum_group;

namespace {

int g_failures = 0;
#define EXPECT(cond, ...)                                                    \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "split_sum_test.cu:%d: FAILED: %s: ", __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fprintf(stderr, "\n");                                            \
      ++g_failures;                                                          \
    }                                                                        \
  } while (0)

// A partial whose sum depends on the order of the additions: magnitudes from 2^-8 to 2^24, so
// that f32 rounds differently for every other association.
float partial(unsigned z, int i, unsigned salt) {
  const unsigned h = (z * 2654435761u) ^ (static_cast<unsigned>(i) * 40503u) ^ (salt * 97u);
  const float mag = std::ldexp(1.0f, static_cast<int>(h % 33u) - 8);
  const float frac = 1.0f + static_cast<float>((h >> 8) % 1000u) / 1000.0f;
  return ((h >> 20) & 1u ? -1.0f : 1.0f) * mag * frac;
}

// Element i of the launch lives at offset 3·i + 1 of a slice (a stride, as a tile's elements do
// inside the whole output); every fifth element is outside (off < 0) and must not be written.
__device__ int64_t element_offset(int i) { return i % 5 == 4 ? -1 : int64_t{3} * i + 1; }

__global__ void split_sum_kernel(const float* values, float* part, int64_t zstride, int count,
                                 unsigned* counters, float* out, int* finishers) {
  const unsigned z = blockIdx.x;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) {
    const int64_t o = element_offset(i);
    if (o >= 0) part[z * zstride + o] = values[static_cast<int64_t>(z) * count + i];
  }
  const bool last = split_sum(counters, part, zstride, gridDim.x, z, count, element_offset,
                              [&](int i, int64_t o, float s) {
                                if (o == element_offset(i)) out[i] = s;
                              });
  if (last && threadIdx.x == 0) atomicAdd(finishers, 1);
}

// The documented order, on the host.
float expected_sum(const std::vector<float>& v, unsigned S, int count, int i) {
  const unsigned G = split_sum_group(S), groups = (S + G - 1) / G;
  if (groups == 1) {
    float s = 0.f;
    for (unsigned z = 0; z < S; ++z) s += v[static_cast<size_t>(z) * count + i];
    return s;
  }
  float total = 0.f;
  for (unsigned g = 0; g < groups; ++g) {
    float s = 0.f;
    for (unsigned z = g * G; z < std::min(S, (g + 1) * G); ++z) s += v[static_cast<size_t>(z) * count + i];
    total += s;
  }
  return total;
}

float sequential_sum(const std::vector<float>& v, unsigned S, int count, int i) {
  float s = 0.f;
  for (unsigned z = 0; z < S; ++z) s += v[static_cast<size_t>(z) * count + i];
  return s;
}

void run(unsigned S, int count, int threads, int* order_differs) {
  const int64_t zstride = int64_t{3} * count + 2;
  const unsigned ncounters = split_sum_counters(S);
  float *values = nullptr, *part = nullptr, *out = nullptr;
  unsigned* counters = nullptr;
  int* finishers = nullptr;
  cudaMalloc(&values, sizeof(float) * S * count);
  cudaMalloc(&part, sizeof(float) * S * zstride);
  cudaMalloc(&out, sizeof(float) * count);
  cudaMalloc(&counters, sizeof(unsigned) * ncounters);
  cudaMalloc(&finishers, sizeof(int));
  cudaMemset(counters, 0, sizeof(unsigned) * ncounters);
  // Two launches on the same counters, with other values: the first must leave them zero.
  for (unsigned salt = 1; salt <= 2; ++salt) {
    std::vector<float> v(static_cast<size_t>(S) * count);
    for (unsigned z = 0; z < S; ++z)
      for (int i = 0; i < count; ++i) v[static_cast<size_t>(z) * count + i] = partial(z, i, salt);
    cudaMemcpy(values, v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice);
    std::vector<float> sentinel(count, -7.0f);
    cudaMemcpy(out, sentinel.data(), sizeof(float) * count, cudaMemcpyHostToDevice);
    cudaMemset(finishers, 0, sizeof(int));
    split_sum_kernel<<<S, threads>>>(values, part, zstride, count, counters, out, finishers);
    EXPECT(cudaGetLastError() == cudaSuccess, "S %u count %d", S, count);
    std::vector<float> got(count);
    int fin = 0;
    std::vector<unsigned> left(ncounters);
    cudaMemcpy(got.data(), out, sizeof(float) * count, cudaMemcpyDeviceToHost);
    cudaMemcpy(&fin, finishers, sizeof(int), cudaMemcpyDeviceToHost);
    cudaMemcpy(left.data(), counters, sizeof(unsigned) * ncounters, cudaMemcpyDeviceToHost);
    EXPECT(fin == 1, "S %u count %d threads %d: %d blocks finished", S, count, threads, fin);
    for (unsigned c = 0; c < ncounters; ++c)
      EXPECT(left[c] == 0, "S %u: counter %u left at %u", S, c, left[c]);
    for (int i = 0; i < count; ++i) {
      if (i % 5 == 4) {
        EXPECT(got[i] == -7.0f, "S %u: element %d has no offset but was written", S, i);
        continue;
      }
      const float want = expected_sum(v, S, count, i);
      EXPECT(got[i] == want, "S %u count %d threads %d element %d: %.9g, want %.9g", S, count,
             threads, i, got[i], want);
      if (want != sequential_sum(v, S, count, i)) ++*order_differs;
      if (S <= 3)
        EXPECT(got[i] == sequential_sum(v, S, count, i), "S %u: not the slice order", S);
    }
  }
  cudaFree(values), cudaFree(part), cudaFree(out), cudaFree(counters), cudaFree(finishers);
}

}  // namespace

int main() {
  // The group size and counter count for the sizes the plugin uses.
  EXPECT(split_sum_group(1) == 1 && split_sum_group(2) == 2 && split_sum_group(4) == 2 &&
             split_sum_group(5) == 3 && split_sum_group(264) == 17 && split_sum_group(1024) == 32,
         "group sizes");
  EXPECT(split_sum_counters(1) == 1 && split_sum_counters(2) == 1 && split_sum_counters(3) == 3 &&
             split_sum_counters(264) == 17,
         "counter counts");
  int order_differs = 0;
  const unsigned sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 10, 16, 17, 26, 37, 64, 100, 264};
  for (unsigned S : sizes) {
    // A thread per element or fewer (one element at a time, four slices ahead), and more
    // elements than threads (two at a time): one pair partly past the end, then several.
    run(S, 1, 32, &order_differs);
    run(S, 200, 256, &order_differs);
    run(S, 45, 32, &order_differs);
    run(S, 300, 32, &order_differs);
  }
  // The values must tell the two orders apart, or the bit-for-bit checks above prove nothing.
  EXPECT(order_differs > 1000, "only %d sums differ between the two orders", order_differs);
  if (g_failures) {
    std::fprintf(stderr, "split_sum_test: %d checks failed\n", g_failures);
    return 1;
  }
  std::printf("split_sum_test: every check passed (%d sums whose order shows)\n", order_differs);
  return 0;
}
