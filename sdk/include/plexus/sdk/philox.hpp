// Philox4x32-10, a counter-based random number generator (Salmon et al., SC'11).
// Every backend draws dropout masks and random initialisations from it, so the CPU and a GPU
// give the same bits for the same (seed, offset): an op compared across backends matches exactly.
#pragma once

#include <cstdint>

#include "plexus/sdk/dtype.hpp"  // PLX_HOST_DEVICE

namespace plexus {

struct Philox4 {
  uint32_t v[4];
};

// Four 32-bit random words for counter (c0..c3) under key (k0, k1).
PLX_HOST_DEVICE inline Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                         uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The i-th uniform float in [0, 1) of the stream (seed, offset): element i uses counter
// (i / 4, offset) and word i % 4. 24 random bits, so every value is exactly representable.
PLX_HOST_DEVICE inline float philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  const uint64_t block = i >> 2;
  const Philox4 r = philox4x32(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                               static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32),
                               static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return static_cast<float>(r.v[i & 3] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace plexus
