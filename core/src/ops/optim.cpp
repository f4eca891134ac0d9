// Built-in op schemas: optim family (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

void register_optim(OpRegistry& r) { (void)r; }

}  // namespace plexus::ops
