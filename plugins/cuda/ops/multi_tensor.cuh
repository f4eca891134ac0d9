// The launch bookkeeping the multi-tensor kernels share (ops/optim.cu's updates, ops/misc.cu's
// casts): tensors travel by value in a launch struct with `count`, `numel[]` and
// `first_block[]`; each block works on one chunk of one tensor.
#pragma once

#include <cstdint>

#include "device.cuh"

namespace plexus::cuda {

// The block's tensor: the last one whose first block is at or before this block (tensors with
// no elements were left out by the host, so every tensor owns at least one block).
template <class L>
__device__ __forceinline__ int block_tensor(const L& launch) {
  int t = 0;
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  while (t + 1 < launch.count && b >= launch.first_block[t + 1]) ++t;
  return t;
}

// Packs the tensors with elements into launches of at most kCap tensors of kChunk elements per
// block; add(slot, i) copies tensor i's pointers into the launch, go(blocks) enqueues it, after
// which it is emptied. `what` names the kernel in the error for a tensor too large.
template <int64_t kChunk, int kCap, class Launch, class Add, class Go>
void pack_launches(Launch& L, int32_t count, const int64_t* numel, const char* what, Add&& add,
                   Go&& go) {
  int64_t blocks = 0;
  L.count = 0;
  auto flush = [&] {
    if (L.count == 0) return;
    go(static_cast<unsigned>(blocks));
    L.count = 0;
    blocks = 0;
  };
  for (int32_t i = 0; i < count; ++i) {
    const int64_t n = numel[i];
    if (n <= 0) continue;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    PLX_REQUIRE(chunks < INT32_MAX, "%s: tensor of %lld elements is too large", what,
                static_cast<long long>(n));
    if (L.count == kCap || blocks + chunks > INT32_MAX) flush();
    L.numel[L.count] = n;
    L.first_block[L.count] = static_cast<int32_t>(blocks);
    add(L.count, i);
    ++L.count;
    blocks += chunks;
  }
  flush();
}

}  // namespace plexus::cuda
