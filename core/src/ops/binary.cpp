// Built-in op schemas: binary family (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

void register_binary(OpRegistry& r) { (void)r; }

}  // namespace plexus::ops
