// Built-in op schemas: copy, cast, dropout and embedding (see docs/ops.md).
#include <string>

#include "plexus/op_schema.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

void p_ok(const InferContext& c) {
  const double p = c.attrs().get_float("p");
  c.require(p >= 0 && p < 1, "p must be in [0, 1), got " + std::to_string(p));
}

// padding_idx is -1 (none) or a row of the weight.
void padding_ok(const InferContext& c, int64_t rows) {
  const int64_t pad = c.attrs().get_int("padding_idx");
  c.require(pad == -1 || (pad >= 0 && pad < rows), "padding_idx " + std::to_string(pad) +
                                                       " is neither -1 nor in [0, " +
                                                       std::to_string(rows) + ")");
}

}  // namespace

void register_misc(OpRegistry& r) {
  r.add(OpSchema{
      .name = "copy",
      .doc = "a row-major contiguous copy of x, which may have any strides",
      .inputs = {in("x", kAllTypes)},
      .outputs = {out("y")},
      .infer = [](InferContext& c) { c.out(0, c.in(0).dtype, c.in(0).shape); },
      .grad =
          [](GradContext& g) {
            // The identity: dy already is a contiguous tensor of x's shape and dtype.
            if (g.grad_output(0).valid()) g.set_grad(0, g.grad_output(0));
          },
  });

  r.add(OpSchema{
      .name = "cast",
      .doc = "x converted to `dtype`; float to integer truncates toward zero and saturates, NaN "
             "gives 0",
      .inputs = {in("x", kAllTypes)},
      .outputs = {out("y", kAllTypes)},
      .attrs = {attr("dtype", PLX_ATTR_STRING, std::nullopt,
                     "f32 | f16 | bf16 | i32 | i64 | u8 | f64")},
      .infer =
          [](InferContext& c) {
            const std::string& name = c.attrs().get_string("dtype");
            const plx_dtype d = dtype_from_name(name);
            c.require(d != PLX_DTYPE_NONE, "unknown dtype '" + name +
                                               "' (expected f32, f16, bf16, i32, i64, u8 or f64)");
            c.out(0, d, c.in(0).shape);
          },
      .grad =
          [](GradContext& g) {
            // Only between floats: an integer result carries no gradient.
            const plx_dtype from = g.desc(g.input(0)).dtype;
            const plx_dtype to = g.desc(g.output(0)).dtype;
            if (!g.grad_output(0).valid() || !dtype_is_float(from) || !dtype_is_float(to)) return;
            g.set_grad(
                0, g.call("cast", {g.grad_output(0)}, {{"dtype", std::string(dtype_name(from))}}));
          },
  });

  const AttrDef p = attr("p", PLX_ATTR_FLOAT, 0.5, "probability of dropping an element, [0, 1)");
  r.add(OpSchema{
      .name = "dropout",
      .doc = "zeroes element i when philox_uniform(seed, offset, i) < p and scales the rest by "
             "1/(1-p); the identity in eval mode",
      .inputs = {in("x", kFloatTypes)},
      .outputs = {out("y"), out("mask", dtype_bit(PLX_U8), PLX_ARG_NO_GRAD)},
      .attrs = {p, attr("seed", PLX_ATTR_INT, int64_t{0}, "Philox key"),
                attr("offset", PLX_ATTR_INT, int64_t{0}, "Philox stream within the key"),
                attr("training", PLX_ATTR_INT, int64_t{1}, "0: y = x, mask of ones")},
      .infer =
          [](InferContext& c) {
            p_ok(c);
            c.out(0, c.in(0).dtype, c.in(0).shape);
            c.out(1, PLX_U8, c.in(0).shape);
          },
      .grad =
          [](GradContext& g) {
            if (!g.grad_output(0).valid()) return;
            // Eval mode is the identity; dropout_backward would scale by 1/(1-p).
            if (g.attrs().get_int("training") == 0) {
              g.set_grad(0, g.grad_output(0));
              return;
            }
            g.set_grad(0, g.call("dropout_backward", {g.grad_output(0), g.output(1)},
                                 {{"p", g.attrs().get_float("p")}}));
          },
  });
  r.add(OpSchema{
      .name = "dropout_backward",
      .doc = "dx = dy * mask / (1 - p)",
      .inputs = {in("dy", kFloatTypes), in("mask", dtype_bit(PLX_U8))},
      .outputs = {out("dx")},
      .attrs = {p},
      .infer =
          [](InferContext& c) {
            p_ok(c);
            c.require(c.in(0).shape == c.in(1).shape,
                      "dy " + shape_string(c.in(0).shape) + " and mask " +
                          shape_string(c.in(1).shape) + " differ in shape");
            c.out(0, c.in(0).dtype, c.in(0).shape);
          },
  });

  const AttrDef padding_idx =
      attr("padding_idx", PLX_ATTR_INT, int64_t{-1}, "row that gets no gradient; -1: none");
  r.add(OpSchema{
      .name = "embedding",
      .doc = "rows of weight (V, D) picked by integer indices (...): y (..., D)",
      .inputs = {in("weight", kFloatTypes), in("indices", kIndexTypes, PLX_ARG_NO_GRAD)},
      .outputs = {out("y")},
      .attrs = {padding_idx},
      .infer =
          [](InferContext& c) {
            const Shape& w = c.in(0).shape;
            c.require(w.size() == 2, "weight " + shape_string(w) + " must be 2-D (V, D)");
            padding_ok(c, w[0]);
            Shape y = c.in(1).shape;
            c.require(y.size() < PLX_MAX_DIMS,
                      "indices " + shape_string(y) + " leave no room for the embedding dimension");
            y.push_back(w[1]);
            c.out(0, c.in(0).dtype, y);
          },
      .grad =
          [](GradContext& g) {
            if (!g.grad_output(0).valid()) return;
            const TensorDesc w = g.desc(g.input(0));
            g.set_grad(0, g.call("embedding_backward", {g.grad_output(0), g.input(1)},
                                 {{"num_weights", w.shape[0]},
                                  {"padding_idx", g.attrs().get_int("padding_idx")}}));
          },
  });
  r.add(OpSchema{
      .name = "embedding_backward",
      .doc =
          "dweight (num_weights, D): the rows of dy (..., D) summed by index; padding_idx gets 0",
      .inputs = {in("dy", kFloatTypes), in("indices", kIndexTypes)},
      .outputs = {out("dweight")},
      .attrs = {attr("num_weights", PLX_ATTR_INT, std::nullopt, "V, rows of the weight"),
                padding_idx},
      .infer =
          [](InferContext& c) {
            const Shape& dy = c.in(0).shape;
            const Shape& idx = c.in(1).shape;
            c.require(dy.size() == idx.size() + 1 && Shape(dy.begin(), dy.end() - 1) == idx,
                      "dy " + shape_string(dy) + " must be indices " + shape_string(idx) +
                          " plus the embedding dimension");
            const int64_t v = c.attrs().get_int("num_weights");
            c.require(v >= 0, "num_weights must be >= 0, got " + std::to_string(v));
            padding_ok(c, v);
            c.out(0, c.in(0).dtype, {v, dy.back()});
          },
  });
}

}  // namespace plexus::ops
