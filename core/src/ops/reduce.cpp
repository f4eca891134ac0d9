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
  c.require(std::adjacent_find(axes.begin(), axes.end()) == axes.end(), "axes must be distinct");
  return axes;
}

void reduce_infer(InferContext& c, plx_dtype out_dtype) {
  const Shape& s = c.in(0).shape;
  const auto axes = reduction_axes(c, static_cast<int64_t>(s.size()));
  const bool keep = c.attrs().get_int("keepdims") != 0;
  Shape out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i));
    if (!reduced) out.push_back(s[i]);
    else if (keep) out.push_back(1);
  }
  c.out(0, out_dtype, out);
}

}  // namespace

void register_reduce(OpRegistry& r) {
  const std::vector<AttrDef> attrs = {
      attr("axes", PLX_ATTR_INTS, Ints{}, "axes to reduce; empty: all"),
      attr("keepdims", PLX_ATTR_INT, int64_t{0}, "keep reduced axes with size 1")};
  r.add(OpSchema{
      .name = "sum",
      .doc = "sum over axes",
      .inputs = {in("x", kFloatTypes | kIndexTypes)},
      .outputs = {out("y")},
      .attrs = attrs,
      .infer = [](InferContext& c) { reduce_infer(c, c.in(0).dtype); },
      .grad =
          [](GradContext& g) {
            if (!g.grad_output(0).valid()) return;
            // dy seen with the reduced axes kept as 1, then broadcast back to x's shape.
            const TensorDesc x = g.desc(g.input(0));
            const Ints& given = g.attrs().get_ints("axes");
            Shape kept = x.shape;
            for (size_t i = 0; i < kept.size(); ++i) {
              bool reduced = given.empty();
              for (int64_t a : given)
                reduced = reduced || (a < 0 ? a + x.ndim() : a) == static_cast<int64_t>(i);
              if (reduced) kept[i] = 1;
            }
            const Var dy = g.emitter().reshape(g.grad_output(0), kept);
            g.set_grad(0, g.call("expand", {dy}, {{"shape", x.shape}}));
          },
  });
}

}  // namespace plexus::ops
