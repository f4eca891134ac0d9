// A convolution with the max pooling after it, forward and backward, a chunk of images at a time
// (ops/conv_pool.cpp; the groups are sdk::find_conv_max_pool and sdk::find_max_pool_conv_backward,
// sdk/fusion_conv_pool.hpp), so the full-size pre-pool tensor and its gradient never exist.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common.hpp"

namespace plexus::cuda {

// The fused kernel of a {conv2d, [relu,] max_pool2d} group; sets its dtype, flags and name
// ("conv2d+relu+max_pool2d" or "conv2d+max_pool2d"). Declines (Unsupported) what it cannot run.
std::unique_ptr<Kernel> make_conv_max_pool(CudaBackend& backend, const sdk::GraphView& g,
                                           const sdk::Boundary& b, plx_dtype& dtype,
                                           uint32_t& flags, std::string& name);

// The fused kernel of a {max_pool2d_backward, [conv2d_backward_data], [conv2d_backward_weight],
// [bias gradient sum]} group ("max_pool2d_backward+conv2d_backward").
std::unique_ptr<Kernel> make_max_pool_conv_backward(CudaBackend& backend, const sdk::GraphView& g,
                                                    const sdk::Boundary& b, plx_dtype& dtype,
                                                    uint32_t& flags, std::string& name);

// How launch_chunk_accumulate() folds one chunk's partial sum `part` into the running total:
//  - Set:   acc = part
//  - Add:   acc += part
//  - Final: out = round(acc + part), in out's dtype (acc is left as it was)
// acc is f32; part and out have the dtype given. Sums in f32, one thread per element, no
// atomics: the chunks' fixed order makes the total bit-identical run to run.
enum class ChunkAccum : int32_t { Set = 0, Add = 1, Final = 2 };
void launch_chunk_accumulate(plx_dtype dtype, const void* part, float* acc, void* out, int64_t n,
                             ChunkAccum mode, cudaStream_t stream);

}  // namespace plexus::cuda
