// CPU kernels: conv family (see docs/ops.md).
#include "common.hpp"

namespace plexus::cpu {

void register_conv(KernelRegistry& r) { (void)r; }

}  // namespace plexus::cpu
