// Built-in op schemas: gemm family (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

void register_gemm(OpRegistry& r) { (void)r; }

}  // namespace plexus::ops
