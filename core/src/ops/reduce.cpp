// Built-in op schemas: reductions (see docs/ops.md).
#include <algorithm>

#include "plexus/op_schema.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

// Normalised, sorted, distinct reduction axes; empty `axes` means every axis.
std::vector<int64_t> reduction_axes(const InferContext& c, int64_t ndim) {
  const Ints& given = c.attrs().get_ints("axes");
  std::vector<int64_t> axes;
  if (given.empty()) {
    for (int64_t i = 0; i < ndim; ++i) axes.push_back(i);
    return axes;
  }
  for (int64_t a : given) axes.push_back(normalize_axis(c, a, ndim));
  std::sort(axes.begin(), axes.end());
  c.require(std::adjacent_find(axes.begin(), axes.end()) == axes.end(),
            "axes " + shape_string(given) + " must be distinct");
  return axes;
}

void reduce_infer(InferContext& c, plx_dtype out_dtype) {
  const Shape& s = c.in(0).shape;
  const auto axes = reduction_axes(c, static_cast<int64_t>(s.size()));
  const bool keep = c.attrs().get_int("keepdims") != 0;
  Shape out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i));
    if (!reduced)
      out.push_back(s[i]);
    else if (keep)
      out.push_back(1);
  }
  c.out(0, out_dtype, out);
}

// x's shape with the reduced axes set to 1 (inference has validated the axes), and the number of
// elements each output sums.
struct Kept {
  Shape shape;
  int64_t count = 1;
};
Kept kept_shape(const Shape& x, const Ints& axes) {
  Kept k{x, 1};
  const auto ndim = static_cast<int64_t>(x.size());
  for (int64_t i = 0; i < ndim; ++i) {
    bool reduced = axes.empty();
    for (int64_t a : axes) reduced = reduced || (a < 0 ? a + ndim : a) == i;
    if (reduced) {
      k.count *= x[static_cast<size_t>(i)];
      k.shape[static_cast<size_t>(i)] = 1;
    }
  }
  return k;
}

// dy seen with the reduced axes kept as 1 and broadcast back to x's shape; for mean scaled by 1/n
// first, while it is the smaller tensor.
void reduce_grad(GradContext& g, bool mean) {
  if (!g.grad_output(0).valid()) return;
  const TensorDesc x = g.desc(g.input(0));
  const Kept k = kept_shape(x.shape, g.attrs().get_ints("axes"));
  Var dy = g.grad_output(0);
  // An empty reduction (n = 0) has an empty x: nothing to scale.
  if (mean && k.count > 0)
    dy = g.call("scale", {dy}, {{"alpha", 1.0 / static_cast<double>(k.count)}});
  g.set_grad(0, g.call("expand", {g.emitter().reshape(dy, k.shape)}, {{"shape", x.shape}}));
}

std::vector<AttrDef> reduce_attrs() {
  return {attr("axes", PLX_ATTR_INTS, Ints{}, "axes to reduce (may be negative); empty: all"),
          attr("keepdims", PLX_ATTR_INT, int64_t{0}, "keep reduced axes with size 1")};
}

}  // namespace

void register_reduce(OpRegistry& r) {
  r.add(OpSchema{
      .name = "sum",
      .doc = "sum over axes",
      .inputs = {in("x", kFloatTypes | kIndexTypes)},
      .outputs = {out("y")},
      .attrs = reduce_attrs(),
      .infer = [](InferContext& c) { reduce_infer(c, c.in(0).dtype); },
      .grad = [](GradContext& g) { reduce_grad(g, /*mean=*/false); },
  });
  r.add(OpSchema{
      .name = "mean",
      .doc = "mean over axes (nan over an empty axis)",
      .inputs = {in("x", kFloatTypes)},
      .outputs = {out("y")},
      .attrs = reduce_attrs(),
      .infer = [](InferContext& c) { reduce_infer(c, c.in(0).dtype); },
      .grad = [](GradContext& g) { reduce_grad(g, /*mean=*/true); },
  });
  r.add(OpSchema{
      .name = "argmax",
      .doc = "index of the first maximum along an axis (nan counts as the maximum)",
      .inputs = {in("x", kFloatTypes | kIndexTypes)},
      .outputs = {out("y", dtype_bit(PLX_I64), PLX_ARG_NO_GRAD)},
      .attrs = {attr("axis", PLX_ATTR_INT, int64_t{-1}, "axis to search (may be negative)"),
                attr("keepdims", PLX_ATTR_INT, int64_t{0}, "keep the axis with size 1")},
      .infer =
          [](InferContext& c) {
            const Shape& s = c.in(0).shape;
            const auto ndim = static_cast<int64_t>(s.size());
            const int64_t axis = normalize_axis(c, c.attrs().get_int("axis"), ndim);
            if (ndim == 0) {  // a scalar is its own maximum, at index 0
              c.out(0, PLX_I64, {});
              return;
            }
            c.require(s[static_cast<size_t>(axis)] > 0, "cannot take the argmax of an empty axis " +
                                                            std::to_string(axis) + " of " +
                                                            shape_string(s));
            Shape out = s;
            if (c.attrs().get_int("keepdims") != 0)
              out[static_cast<size_t>(axis)] = 1;
            else
              out.erase(out.begin() + axis);
            c.out(0, PLX_I64, out);
          },
      // Not differentiable: no grad formula.
  });
}

}  // namespace plexus::ops
