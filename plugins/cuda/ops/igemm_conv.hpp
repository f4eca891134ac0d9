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

}  // namespace plexus::cuda
