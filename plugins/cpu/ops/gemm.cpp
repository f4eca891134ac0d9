// CPU kernels: gemm family (see docs/ops.md).
#include "common.hpp"

namespace plexus::cpu {

void register_gemm(KernelRegistry& r) { (void)r; }

}  // namespace plexus::cpu
