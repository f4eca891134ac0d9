// CPU kernels: norm family (see docs/ops.md).
#include "common.hpp"

namespace plexus::cpu {

void register_norm(KernelRegistry& r) { (void)r; }

}  // namespace plexus::cpu
