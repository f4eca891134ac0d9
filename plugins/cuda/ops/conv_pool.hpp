// A convolution with the max pooling after it, forward and backward, a chunk of images at a time
// (ops/conv_pool.cpp: the SDK's chunked kernels, sdk/fusion_chunked.hpp, on this plugin's own
// kernels; the groups are sdk::find_conv_max_pool and sdk::find_max_pool_conv_backward), so the
// full-size pre-pool tensor and its gradient never exist.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common.hpp"
#include "plexus/sdk/fusion_chunked.hpp"

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

// Adds one chunk's partial weight or bias gradient into the running total, as
// sdk::ChunkAccumulate says (sdk/fusion_chunked.hpp): sums in f32, one thread per element, no
// atomics, so the chunks' fixed order makes the total bit-identical run to run.
using ChunkAccum = sdk::ChunkAccum;
void launch_chunk_accumulate(plx_dtype dtype, const void* part, float* acc, void* out, int64_t n,
                             ChunkAccum mode, cudaStream_t stream);

}  // namespace plexus::cuda
