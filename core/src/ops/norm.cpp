// Built-in op schemas: norm family (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

void register_norm(OpRegistry& r) { (void)r; }

}  // namespace plexus::ops
