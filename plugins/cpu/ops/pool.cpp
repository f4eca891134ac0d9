// CPU kernels: pool family (see docs/ops.md).
#include "common.hpp"

namespace plexus::cpu {

void register_pool(KernelRegistry& r) { (void)r; }

}  // namespace plexus::cpu
