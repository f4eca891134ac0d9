// Built-in op schemas: conv family (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

void register_conv(OpRegistry& r) { (void)r; }

}  // namespace plexus::ops
