// Built-in op schemas: activations (relu, gelu, sigmoid, tanh) and their backward ops.
// See docs/ops.md for the catalogue.
#include "plexus/op_schema.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

void same_as_input(InferContext& c) { c.out(0, c.in(0).dtype, c.in(0).shape); }

// (dy, saved) -> dx, where saved is the forward's input or output of the same shape.
void backward_infer(InferContext& c) {
  c.require(c.in(0).shape == c.in(1).shape, "dy " + shape_string(c.in(0).shape) + " and " +
                                                c.schema().inputs[1].name + " " +
                                                shape_string(c.in(1).shape) + " differ in shape");
  c.out(0, c.in(0).dtype, c.in(0).shape);
}

// Unary op whose gradient is op_backward(dy, <saved>), saved being the output or the input.
void add_unary(OpRegistry& r, const std::string& name, const std::string& doc, bool saves_output,
               std::vector<AttrDef> attrs = {}) {
  add_with_backward(r, name, doc,
                    "gradient of " + name + " given dy and the forward's " +
                        (saves_output ? "output y" : "input x"),
                    saves_output, attrs, same_as_input, backward_infer);
}

}  // namespace

void register_activation(OpRegistry& r) {
  add_unary(r, "relu", "max(x, 0)", /*saves_output=*/true);
  add_unary(r, "gelu", "x * Phi(x); approximate=\"tanh\" uses the tanh approximation",
            /*saves_output=*/false,
            {attr("approximate", PLX_ATTR_STRING, std::string("none"), "none | tanh")});
  add_unary(r, "sigmoid", "1 / (1 + exp(-x))", /*saves_output=*/true);
  add_unary(r, "tanh", "tanh(x)", /*saves_output=*/true);
}

}  // namespace plexus::ops
