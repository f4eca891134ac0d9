// Built-in op schemas: reduce family (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

void register_reduce(OpRegistry& r) { (void)r; }

}  // namespace plexus::ops
