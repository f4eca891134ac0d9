// CPU kernels: softmax family (see docs/ops.md).
#include "common.hpp"

namespace plexus::cpu {

void register_softmax(KernelRegistry& r) { (void)r; }

}  // namespace plexus::cpu
