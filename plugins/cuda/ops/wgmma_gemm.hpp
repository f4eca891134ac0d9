// Our Hopper GEMM (ops/wgmma_gemm.cu, built for sm_90a only): the pieces other host code may use
// beside the registered matmul and linear candidates. Only compiled when the plugin is built
// for sm_90 (PLEXUS_CUDA_WGMMA is then defined for the whole plugin).
#pragma once

#include <memory>
#include <string>

#include "common.hpp"
#include "ops/mma_gemm.hpp"

namespace plexus::cuda {

// Registers the "wgmma_*" candidates of matmul and linear (bf16, f16); backend.cpp calls it
// after register_mma_gemm.
void register_wgmma_gemm(KernelRegistry& r);

// A linear node's kernel on the Hopper GEMM with tile `tile` (a candidate's impl name,
// "wgmma_128x128x64", ..., the split-K one's included) and `act` applied in the epilogue after
// the bias, for a fused linear -> activation group. Throws Unsupported (a decline) where the
// registered linear candidate of that tile would.
std::unique_ptr<Kernel> make_wgmma_linear(const NodeInfo& node, CudaBackend& backend,
                                          const std::string& tile, MmaAct act);

}  // namespace plexus::cuda
