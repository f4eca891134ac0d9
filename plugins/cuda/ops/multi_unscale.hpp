// f16 loss scaling's unscale and check of many gradients in one launch: the fusion of the
// per-gradient mul by 1/S, sum and add chain (core/src/train/step_graph.cpp), which node by node
// are three small launches a parameter (ops/misc.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common.hpp"

namespace plexus::cuda {

// out[i] = in[i] * unscale for i < count (in f32, the mul node's rounding: the same bits), in[i]
// f32 or f16/bf16 widened as it is read (a cast to f32 fused, exact); and *check = the sum of
// every out element, in f32: each block's sum, then the last block to finish (a counter at
// `done`, zero between launches, which that block resets) adds the blocks' sums in a fixed
// order. The check's value differs from the nodes' sum of sums by rounding; what it is for,
// being finite exactly when every element is (or when the sum overflows), is the same.
// Up to kMultiUnscaleCapacity tensors a launch, longer lists in several (the last launch's last
// block adds every block's sum). Allocates nothing and never waits (capturable). One launch per
// `done` counter at a time (the fused kernel owns its counter and runs on one stream).
constexpr int kMultiUnscaleCapacity = 64;

struct MultiUnscaleArgs {
  int32_t count = 0;
  const void* const* in = nullptr;  // [count], of in_dtype
  int32_t in_dtype = PLX_F32;       // PLX_F32, PLX_F16 or PLX_BF16
  float* const* out = nullptr;      // [count]
  const int64_t* numel = nullptr;   // [count]
  const float* unscale = nullptr;   // device: one f32
  float* check = nullptr;           // device: one f32
  float* partial = nullptr;         // device: multi_unscale_blocks() floats (the workspace)
  unsigned* done = nullptr;         // device: zero before the first launch
};

// The blocks (and partial sums) the tensors take.
int64_t multi_unscale_blocks(int32_t count, const int64_t* numel);
void launch_multi_unscale(const MultiUnscaleArgs& args, cudaStream_t stream);

}  // namespace plexus::cuda
