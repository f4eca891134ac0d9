// CPU kernels: optim family (see docs/ops.md).
#include "common.hpp"

namespace plexus::cpu {

void register_optim(KernelRegistry& r) { (void)r; }

}  // namespace plexus::cpu
