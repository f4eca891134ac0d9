// Built-in op schemas: softmax family (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

void register_softmax(OpRegistry& r) { (void)r; }

}  // namespace plexus::ops
