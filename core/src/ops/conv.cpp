// Built-in op schemas: 2-D convolution and its two backward ops (see docs/ops.md).
//
// Every op of the family checks the same attributes (stride, padding, dilation, groups) and the
// same geometry, so one helper does it for all three; the backward ops are then checked against
// the forward they belong to (dy must have exactly the forward's output shape).
#include <array>

#include "plexus/op_schema.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

struct ConvAttrs {
  Pair stride, padding, dilation;
  int64_t groups;
};

ConvAttrs conv_attrs(const InferContext& c) {
  ConvAttrs a;
  a.stride = pair_attr(c, "stride", 1);
  a.padding = pair_attr(c, "padding", 0);
  a.dilation = pair_attr(c, "dilation", 1);
  a.groups = c.attrs().get_int("groups");
  c.require(a.groups >= 1, "groups must be >= 1, got " + std::to_string(a.groups));
  return a;
}

void require_4d(const InferContext& c, const Shape& s, const std::string& what) {
  c.require(s.size() == 4, what + " must be 4-D, got " + shape_string(s));
}

// A 4-value ints attribute holding a shape ((N, C, H, W) or (O, C/groups, KH, KW)).
Shape shape_attr(const InferContext& c, const std::string& name) {
  const Ints& v = c.attrs().get_ints(name);
  c.require(v.size() == 4, name + " must have 4 values, got " + attr_value_string(AttrValue(v)));
  for (int64_t d : v)
    c.require(d >= 0, name + " must not be negative, got " + attr_value_string(AttrValue(v)));
  return v;
}

// Checks x (N, C, H, W) against w (O, C/groups, KH, KW) and returns the output shape
// (N, O, OH, OW).
Shape conv_output_shape(const InferContext& c, const ConvAttrs& a, const Shape& x, const Shape& w) {
  const int64_t C = x[1], O = w[0], g = a.groups;
  c.require(C % g == 0, "groups " + std::to_string(g) + " does not divide the input channels " +
                            std::to_string(C));
  c.require(O % g == 0, "groups " + std::to_string(g) + " does not divide the output channels " +
                            std::to_string(O));
  c.require(w[1] * g == C, "channel mismatch: x has " + std::to_string(C) + " channels, w " +
                               shape_string(w) + " with groups " + std::to_string(g) + " expects " +
                               std::to_string(w[1] * g));
  Shape y = {x[0], O, 0, 0};
  for (int i = 0; i < 2; ++i) {
    c.require(w[2 + i] >= 1, "kernel " + shape_string(w) + " has an empty spatial dimension");
    const int64_t in = x[2 + i] + 2 * a.padding[i];
    const int64_t k = a.dilation[i] * (w[2 + i] - 1) + 1;  // dilated extent
    c.require(k <= in, "kernel " + std::to_string(w[2]) + "x" + std::to_string(w[3]) +
                           (k != w[2 + i] ? " (dilated extent " + std::to_string(k) + ")" : "") +
                           " is larger than the padded input " +
                           std::to_string(x[2] + 2 * a.padding[0]) + "x" +
                           std::to_string(x[3] + 2 * a.padding[1]));
    y[2 + i] = (in - k) / a.stride[i] + 1;
  }
  return y;
}

void conv2d_infer(InferContext& c) {
  const ConvAttrs a = conv_attrs(c);
  const Shape& x = c.in(0).shape;
  const Shape& w = c.in(1).shape;
  require_4d(c, x, "x (N, C, H, W)");
  require_4d(c, w, "w (O, C/groups, KH, KW)");
  const Shape y = conv_output_shape(c, a, x, w);
  if (c.has(2))
    c.require(c.in(2).shape == Shape{w[0]}, "b must have shape (" + std::to_string(w[0]) +
                                                ") (the output channels), got " +
                                                shape_string(c.in(2).shape));
  c.out(0, c.in(0).dtype, y);
}

// dy must be exactly what the forward of x (input_shape) and w produced.
void require_dy_matches(const InferContext& c, const ConvAttrs& a, const Shape& x, const Shape& w) {
  const Shape& dy = c.in(0).shape;
  require_4d(c, dy, "dy (N, O, OH, OW)");
  const Shape want = conv_output_shape(c, a, x, w);
  c.require(dy == want, "dy " + shape_string(dy) + " is not the output shape " +
                            shape_string(want) + " of input " + shape_string(x) + " and weight " +
                            shape_string(w));
}

void backward_data_infer(InferContext& c) {
  const ConvAttrs a = conv_attrs(c);
  const Shape x = shape_attr(c, "input_shape");
  const Shape& w = c.in(1).shape;
  require_4d(c, w, "w (O, C/groups, KH, KW)");
  require_dy_matches(c, a, x, w);
  c.out(0, c.in(0).dtype, x);
}

void backward_weight_infer(InferContext& c) {
  const ConvAttrs a = conv_attrs(c);
  const Shape w = shape_attr(c, "weight_shape");
  const Shape& x = c.in(1).shape;
  require_4d(c, x, "x (N, C, H, W)");
  require_dy_matches(c, a, x, w);
  c.out(0, c.in(0).dtype, w);
}

// The forward's attributes (stride, padding, dilation, groups) out of any op of the family.
Attrs forward_attrs(const Attrs& attrs) {
  Attrs a;
  for (const char* k : {"stride", "padding", "dilation", "groups"}) a.set(k, *attrs.find(k));
  return a;
}
// ...plus a shape attribute (input_shape or weight_shape) for a backward op.
Attrs with_shape(const Attrs& attrs, const char* name, const Shape& shape) {
  Attrs a = forward_attrs(attrs);
  a.set(name, shape);
  return a;
}

}  // namespace

void register_conv(OpRegistry& r) {
  const std::vector<AttrDef> attrs = {
      attr("stride", PLX_ATTR_INTS, Ints{1, 1}, "[h, w], >= 1"),
      attr("padding", PLX_ATTR_INTS, Ints{0, 0}, "[h, w] zeros on each side, >= 0"),
      attr("dilation", PLX_ATTR_INTS, Ints{1, 1}, "[h, w] spacing of kernel taps, >= 1"),
      attr("groups", PLX_ATTR_INT, int64_t{1}, "divides C and O")};
  auto plus = [&](AttrDef d) {
    std::vector<AttrDef> v = attrs;
    v.push_back(std::move(d));
    return v;
  };

  r.add(OpSchema{
      .name = "conv2d",
      .doc = "2-D cross-correlation of x (N, C, H, W) with w (O, C/groups, KH, KW), plus b (O)",
      .inputs = {in("x", kFloatTypes), in("w"), opt("b")},
      .outputs = {out("y")},
      .attrs = attrs,
      .infer = conv2d_infer,
      .grad =
          [](GradContext& g) {
            const Var dy = g.grad_output(0);
            if (!dy.valid()) return;
            // The bias first: nothing then comes between what made dy and the sum, so a backend
            // may sum dy as it writes it (the CUDA plugin's relu_backward + bias sum).
            if (g.input(2).valid() && g.needs_grad(2))
              g.set_grad(2, g.call("sum", {dy}, {{"axes", Ints{0, 2, 3}}}));
            if (g.needs_grad(0))
              g.set_grad(0, g.call("conv2d_backward_data", {dy, g.input(1)},
                                   with_shape(g.attrs(), "input_shape", g.desc(g.input(0)).shape)));
            if (g.needs_grad(1))
              g.set_grad(1,
                         g.call("conv2d_backward_weight", {dy, g.input(0)},
                                with_shape(g.attrs(), "weight_shape", g.desc(g.input(1)).shape)));
          },
  });
  // Both backward ops are linear in each input, so their own gradients are convolutions again
  // (double backward): <ddx, bwd_data(dy, w)> = <dy, conv2d(ddx, w)>, likewise for the weight.
  r.add(OpSchema{
      .name = "conv2d_backward_data",
      .doc = "gradient of conv2d with respect to x, given dy and w",
      .inputs = {in("dy", kFloatTypes), in("w")},
      .outputs = {out("dx")},
      .attrs = plus(attr("input_shape", PLX_ATTR_INTS, std::nullopt, "x's shape (N, C, H, W)")),
      .infer = backward_data_infer,
      .grad =
          [](GradContext& g) {
            const Var ddx = g.grad_output(0);
            if (!ddx.valid()) return;
            if (g.needs_grad(0))
              g.set_grad(0, g.call("conv2d", {ddx, g.input(1)}, forward_attrs(g.attrs())));
            if (g.needs_grad(1))
              g.set_grad(1,
                         g.call("conv2d_backward_weight", {g.input(0), ddx},
                                with_shape(g.attrs(), "weight_shape", g.desc(g.input(1)).shape)));
          },
  });
  r.add(OpSchema{
      .name = "conv2d_backward_weight",
      .doc = "gradient of conv2d with respect to w, given dy and x",
      .inputs = {in("dy", kFloatTypes), in("x")},
      .outputs = {out("dw")},
      .attrs = plus(
          attr("weight_shape", PLX_ATTR_INTS, std::nullopt, "w's shape (O, C/groups, KH, KW)")),
      .infer = backward_weight_infer,
      .grad =
          [](GradContext& g) {
            const Var ddw = g.grad_output(0);
            if (!ddw.valid()) return;
            if (g.needs_grad(0))
              g.set_grad(0, g.call("conv2d", {g.input(1), ddw}, forward_attrs(g.attrs())));
            if (g.needs_grad(1))
              g.set_grad(1, g.call("conv2d_backward_data", {g.input(0), ddw},
                                   with_shape(g.attrs(), "input_shape", g.desc(g.input(1)).shape)));
          },
  });
}

}  // namespace plexus::ops
