// Our own Tensor Core GEMM (ops/mma_gemm.cu): the pieces other host code may use beside the
// registered matmul and linear candidates.
#pragma once

#include <memory>
#include <string>

#include "common.hpp"

namespace plexus::cuda {

// The activation the kernel's epilogue applies after the bias, before the one rounding to the
// output dtype (the formulas and NaN behaviour of the relu and gelu ops).
enum class MmaAct { None, Relu, Gelu, GeluTanh };

// A linear node's kernel on the Tensor Core GEMM with tile `tile` (a candidate's impl name,
// "mma_sync_128x128x32", ..., the split-K one's included) and `act` applied in the epilogue,
// for a fused linear -> activation group. Throws Unsupported (a decline) where the registered
// linear candidate of that tile would.
std::unique_ptr<Kernel> make_mma_linear(const NodeInfo& node, CudaBackend& backend,
                                        const std::string& tile, MmaAct act);

}  // namespace plexus::cuda
