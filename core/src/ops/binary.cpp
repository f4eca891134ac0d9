// Built-in op schemas: elementwise arithmetic with NumPy broadcasting (add, sub, mul, div),
// scale and expand (see docs/ops.md).
#include "plexus/op_schema.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

constexpr uint32_t kArithTypes = kFloatTypes | kIndexTypes;

void broadcast_infer(InferContext& c) {
  const Shape& a = c.in(0).shape;
  const Shape& b = c.in(1).shape;
  const std::optional<Shape> y = broadcast_shapes(a, b);
  c.require(y.has_value(), "shapes a " + shape_string(a) + " and b " + shape_string(b) +
                               " do not broadcast (aligned at the right, each pair of "
                               "dimensions must be equal or one of them 1)");
  c.out(0, c.in(0).dtype, *y);
}

// Gradients are formed for float operands only: integer arithmetic is not differentiable.
bool float_grad(const GradContext& g) {
  return g.grad_output(0).valid() && dtype_is_float(g.desc(g.input(0)).dtype);
}

Var negate(GradContext& g, Var v) {
  return g.call("scale", {v}, {{"alpha", -1.0}});
}

void add_binary(OpRegistry& r, const std::string& name, const std::string& doc,
                std::function<void(GradContext&)> grad) {
  r.add(OpSchema{
      .name = name,
      .doc = doc,
      .inputs = {in("a", kArithTypes), in("b")},
      .outputs = {out("y")},
      .infer = broadcast_infer,
      .grad = std::move(grad),
  });
}

}  // namespace

void register_binary(OpRegistry& r) {
  add_binary(r, "add", "a + b, broadcast", [](GradContext& g) {
    if (!float_grad(g)) return;
    const Var dy = g.grad_output(0);
    if (g.needs_grad(0)) g.set_grad(0, g.sum_to(dy, g.desc(g.input(0)).shape));
    if (g.needs_grad(1)) g.set_grad(1, g.sum_to(dy, g.desc(g.input(1)).shape));
  });
  add_binary(r, "sub", "a - b, broadcast", [](GradContext& g) {
    if (!float_grad(g)) return;
    const Var dy = g.grad_output(0);
    if (g.needs_grad(0)) g.set_grad(0, g.sum_to(dy, g.desc(g.input(0)).shape));
    // Negated after the reduction: the smaller tensor.
    if (g.needs_grad(1)) g.set_grad(1, negate(g, g.sum_to(dy, g.desc(g.input(1)).shape)));
  });
  add_binary(r, "mul", "a * b, broadcast", [](GradContext& g) {
    if (!float_grad(g)) return;
    const Var dy = g.grad_output(0), a = g.input(0), b = g.input(1);
    if (g.needs_grad(0)) g.set_grad(0, g.sum_to(g.call("mul", {dy, b}), g.desc(a).shape));
    if (g.needs_grad(1)) g.set_grad(1, g.sum_to(g.call("mul", {dy, a}), g.desc(b).shape));
  });
  add_binary(r, "div",
             "a / b, broadcast; integers truncate toward zero and reject division by zero",
             [](GradContext& g) {
               if (!float_grad(g)) return;
               const Var dy = g.grad_output(0), a = g.input(0), b = g.input(1);
               if (g.needs_grad(0))
                 g.set_grad(0, g.sum_to(g.call("div", {dy, b}), g.desc(a).shape));
               if (g.needs_grad(1)) {
                 // db = -dy * y / b, with y the forward's output a / b.
                 const Var t = g.call("div", {g.call("mul", {dy, g.output(0)}), b});
                 g.set_grad(1, negate(g, g.sum_to(t, g.desc(b).shape)));
               }
             });

  r.add(OpSchema{
      .name = "scale",
      .doc = "alpha * x + beta",
      .inputs = {in("x", kArithTypes)},
      .outputs = {out("y")},
      .attrs = {attr("alpha", PLX_ATTR_FLOAT, 1.0, "factor"),
                attr("beta", PLX_ATTR_FLOAT, 0.0, "offset")},
      .infer = [](InferContext& c) { c.out(0, c.in(0).dtype, c.in(0).shape); },
      .grad =
          [](GradContext& g) {
            if (!float_grad(g)) return;
            g.set_grad(
                0, g.call("scale", {g.grad_output(0)}, {{"alpha", g.attrs().get_float("alpha")}}));
          },
  });

  r.add(OpSchema{
      .name = "expand",
      .doc = "x broadcast to `shape` (NumPy broadcast_to)",
      .inputs = {in("x", kAllTypes)},
      .outputs = {out("y")},
      .attrs = {attr("shape", PLX_ATTR_INTS, std::nullopt, "the shape to broadcast to")},
      .infer =
          [](InferContext& c) {
            const Shape& x = c.in(0).shape;
            const Shape& to = c.attrs().get_ints("shape");
            for (int64_t d : to)
              c.require(d >= 0, "shape " + shape_string(to) + " has a negative dimension");
            bool ok = x.size() <= to.size();
            for (size_t i = 0; ok && i < x.size(); ++i) {
              const int64_t want = to[to.size() - x.size() + i];
              ok = x[i] == want || x[i] == 1;
            }
            c.require(ok, "cannot expand " + shape_string(x) + " to " + shape_string(to) +
                              " (aligned at the right, each dimension must be equal or 1)");
            c.out(0, c.in(0).dtype, to);
          },
      .grad =
          [](GradContext& g) {
            if (!float_grad(g)) return;
            g.set_grad(0, g.sum_to(g.grad_output(0), g.desc(g.input(0)).shape));
          },
  });
}

}  // namespace plexus::ops
