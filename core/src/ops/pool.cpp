// Built-in op schemas: pool family (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

void register_pool(OpRegistry& r) { (void)r; }

}  // namespace plexus::ops
