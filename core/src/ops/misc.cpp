// Built-in op schemas: misc family (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

void register_misc(OpRegistry& r) { (void)r; }

}  // namespace plexus::ops
