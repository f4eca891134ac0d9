// FastDiv (plugins/cuda/device.cuh), the 32-bit division by a divisor fixed at kernel creation
// that the pool kernels' index math uses: for divisors from 1 to 2^31 − 1 (every small one, the
// sizes our models divide by, powers of two and their neighbours, primes, random ones) and
// numerators at the edges (small ones, around each multiple of the divisor, just below 2^31,
// random ones), a kernel's quotient and remainder must equal `/` and `%`. Built by
// tests/cuda/emu/emu.cmake, run by ctest on the CUDA emulator.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "device.cuh"

using plexus::cuda::FastDiv;

namespace {

__global__ void divmod_kernel(FastDiv f, const uint32_t* n, uint32_t* q, uint32_t* r, int count) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < count) f.divmod(n[i], q[i], r[i]);
}

// The numerators for divisor d: 0..300, the neighbours of multiples of d (small ones, and the
// last ones below 2^31), the top of the range, and random ones.
std::vector<uint32_t> numerators(uint32_t d, std::mt19937& rng) {
  constexpr uint32_t kTop = 0x7fffffffu;  // 2^31 − 1, the largest numerator FastDiv takes
  std::vector<uint32_t> v;
  for (uint32_t n = 0; n <= 300; ++n) v.push_back(n);
  for (uint64_t k = 1; k <= 20; ++k)
    for (int64_t delta = -2; delta <= 2; ++delta) {
      const int64_t lo = static_cast<int64_t>(k * d) + delta;
      const int64_t hi = static_cast<int64_t>((kTop / d - (k - 1)) * d) + delta;
      for (int64_t n : {lo, hi})
        if (n >= 0 && n <= kTop) v.push_back(static_cast<uint32_t>(n));
    }
  for (uint32_t n = kTop - 300; n != kTop; ++n) v.push_back(n);
  v.push_back(kTop);
  std::uniform_int_distribution<uint32_t> any(0, kTop);
  for (int i = 0; i < 2000; ++i) v.push_back(any(rng));
  return v;
}

}  // namespace

int main() {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 1100; ++d) divisors.push_back(d);
  // Sizes our models' pools and convolutions divide by (C, H, W, H·W, OH·OW, ...).
  for (uint32_t d : {1568u, 3136u, 6272u, 12544u, 25088u, 50176u, 100352u, 200704u, 802816u})
    divisors.push_back(d);
  for (int k = 11; k <= 31; ++k) {
    const uint64_t p = uint64_t{1} << k;
    for (int64_t delta = -3; delta <= 3; ++delta) {
      const int64_t d = static_cast<int64_t>(p) + delta;
      if (d >= 1 && d < (int64_t{1} << 31)) divisors.push_back(static_cast<uint32_t>(d));
    }
  }
  for (uint32_t d : {65521u, 1000003u, 16777259u, 2147483647u, 1431655765u, 715827883u})
    divisors.push_back(d);
  std::mt19937 rng(20261128u);
  std::uniform_int_distribution<uint32_t> any_d(1, 0x7fffffffu);
  for (int i = 0; i < 200; ++i) divisors.push_back(any_d(rng));

  // Out-of-range divisors keep the divisor 1 (the 64-bit paths, which never use it).
  int failures = 0;
  for (int64_t bad : {int64_t{0}, int64_t{-5}, int64_t{1} << 31, int64_t{1} << 40}) {
    const FastDiv f(bad);
    if (f.d != 1 || f.m != 1 || f.s != 0) {
      std::fprintf(stderr, "fast_div_test: FastDiv(%lld) is not the divisor 1\n",
                   static_cast<long long>(bad));
      ++failures;
    }
  }

  uint32_t *n_d = nullptr, *q_d = nullptr, *r_d = nullptr;
  long long checks = 0;
  for (uint32_t d : divisors) {
    const std::vector<uint32_t> n = numerators(d, rng);
    const int count = static_cast<int>(n.size());
    const size_t bytes = n.size() * sizeof(uint32_t);
    cudaMalloc(&n_d, bytes), cudaMalloc(&q_d, bytes), cudaMalloc(&r_d, bytes);
    cudaMemcpy(n_d, n.data(), bytes, cudaMemcpyHostToDevice);
    divmod_kernel<<<(count + 255) / 256, 256>>>(FastDiv(d), n_d, q_d, r_d, count);
    std::vector<uint32_t> q(n.size()), r(n.size());
    cudaMemcpy(q.data(), q_d, bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(r.data(), r_d, bytes, cudaMemcpyDeviceToHost);
    cudaFree(n_d), cudaFree(q_d), cudaFree(r_d);
    for (size_t i = 0; i < n.size(); ++i, ++checks)
      if (q[i] != n[i] / d || r[i] != n[i] % d) {
        if (++failures <= 20)
          std::fprintf(stderr, "fast_div_test: %u / %u gave %u rem %u, want %u rem %u\n", n[i], d,
                       q[i], r[i], n[i] / d, n[i] % d);
      }
  }
  if (cudaGetLastError() != cudaSuccess) {
    std::fprintf(stderr, "fast_div_test: a CUDA call failed\n");
    return 1;
  }
  if (failures) {
    std::fprintf(stderr, "fast_div_test: %d of %lld checks failed\n", failures, checks);
    return 1;
  }
  std::printf("fast_div_test: %zu divisors, %lld quotients and remainders equal / and %%\n",
              divisors.size(), checks);
  return 0;
}
