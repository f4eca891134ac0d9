// CPU kernels: reduce family (see docs/ops.md).
#include "common.hpp"

namespace plexus::cpu {

void register_reduce(KernelRegistry& r) { (void)r; }

}  // namespace plexus::cpu
