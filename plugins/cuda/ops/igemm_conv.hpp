// The plugin's own implicit-GEMM convolution on the Tensor Cores (ops/igemm_conv.cu): candidate
// kernels for conv2d, conv2d_backward_data and conv2d_backward_weight in f16 and bf16, one per
// tile configuration, registered after the cuDNN kernels (so the first-accepting rule keeps
// cuDNN; the autotuner or backend.kernels = "native" picks these).
#pragma once

#include <memory>
#include <string>

#include "common.hpp"

namespace plexus::cuda {

// Adds the igemm_mma_* candidates to `r`; called by register_conv after the cuDNN kernels.
void register_igemm_conv(KernelRegistry& r);

// A conv2d node's forward kernel with tile `tile` (an igemm_mma_* impl name), with the ReLU in
// its epilogue when `relu` (a fused conv2d -> relu whose conv the host gave to that candidate).
// Throws Unsupported (a decline) where the registered candidate of that tile would.
std::unique_ptr<Kernel> make_igemm_conv(const NodeInfo& node, CudaBackend& backend,
                                        const std::string& tile, bool relu);

// A fused {conv2d, [relu,] max_pool2d} group (sdk::conv_max_pool_slots) whose conv the host gave
// to the igemm tile `tile`, as one launch that pools 2x2 windows of stride 2 in its epilogue: the
// pre-pool tensor never exists, and y and the indices are those of the igemm conv (its ReLU) and
// the pool kernel run one by one. Declines other windows and tiles. Sets `dtype`.
std::unique_ptr<Kernel> make_igemm_conv_max_pool(CudaBackend& backend, const sdk::GraphView& g,
                                                 const sdk::Boundary& b, const std::string& tile,
                                                 plx_dtype& dtype);

}  // namespace plexus::cuda
