// CPU kernels: misc family (see docs/ops.md).
#include "common.hpp"

namespace plexus::cpu {

void register_misc(KernelRegistry& r) { (void)r; }

}  // namespace plexus::cpu
