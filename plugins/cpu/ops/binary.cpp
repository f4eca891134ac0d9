// CPU kernels: binary family (see docs/ops.md).
#include "common.hpp"

namespace plexus::cpu {

void register_binary(KernelRegistry& r) { (void)r; }

}  // namespace plexus::cpu
