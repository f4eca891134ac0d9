// Built-in op schemas: normalisation (batch_norm, layer_norm and their backward ops).
// See docs/ops.md for the catalogue.
#include <algorithm>

#include "plexus/op_schema.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

// Saved statistics are f32 for f32/f16/bf16 activations and f64 for f64 (the reference).
plx_dtype stat_dtype(plx_dtype t) {
  return t == PLX_F64 ? PLX_F64 : PLX_F32;
}

// Parameters (gamma, beta, running statistics) are T or f32: f32 master copies with 16-bit
// activations are the usual mixed-precision setup.
void check_param(const InferContext& c, int i, const Shape& want) {
  if (!c.has(i)) return;
  const std::string& name = c.schema().inputs[static_cast<size_t>(i)].name;
  const plx_dtype t = c.in(0).dtype, d = c.in(i).dtype;
  c.require(
      d == t || d == PLX_F32,
      name + " is " + dtype_name(d) + ", expected " +
          (t == PLX_F32 ? std::string("f32") : dtype_name(t) + std::string(" (like x) or f32")));
  c.require(c.in(i).shape == want, name + " " + shape_string(c.in(i).shape) + " does not match " +
                                       shape_string(want) + " of x " + shape_string(c.in(0).shape));
}

void check_stat(const InferContext& c, int i, const Shape& want) {
  const std::string& name = c.schema().inputs[static_cast<size_t>(i)].name;
  const plx_dtype s = stat_dtype(c.in(0).dtype);
  c.require(c.in(i).dtype == s, name + " is " + dtype_name(c.in(i).dtype) + ", expected " +
                                    dtype_name(s) + " for " + dtype_name(c.in(0).dtype) + " x");
  c.require(c.in(i).shape == want,
            name + " " + shape_string(c.in(i).shape) + ", expected " + shape_string(want));
}

// dgamma and dbeta take gamma's dtype (T when gamma is absent).
plx_dtype param_grad_dtype(const InferContext& c, int gamma) {
  return c.has(gamma) ? c.in(gamma).dtype : c.in(1).dtype;
}

// The gradient of a parameter in the parameter's dtype: dbeta comes out in gamma's dtype, which
// differs from beta's when only one of them is f32.
Var as_dtype_of(GradContext& g, Var grad, Var like) {
  const plx_dtype want = g.desc(like).dtype;
  if (g.desc(grad).dtype == want) return grad;
  return g.call("cast", {grad}, {{"dtype", std::string(dtype_name(want))}});
}

void eps_ok(const InferContext& c) {
  const double eps = c.attrs().get_float("eps");
  c.require(eps >= 0, "eps must be >= 0, got " + std::to_string(eps));
}

// ---- batch_norm ----

Shape channels(const InferContext& c) {
  const Shape& x = c.in(0).shape;
  c.require(x.size() >= 2, "x " + shape_string(x) + " needs at least 2 dimensions (N, C, ...)");
  return {x[1]};
}

void batch_norm_infer(InferContext& c) {
  const Shape ch = channels(c);
  for (int i = 1; i <= 4; ++i) check_param(c, i, ch);
  eps_ok(c);
  c.require(c.has(3) == c.has(4), "running_mean and running_var must be given together");
  const bool training = c.attrs().get_int("training") != 0;
  if (!training) c.require(c.has(3), "eval mode (training = 0) needs running_mean and running_var");
  if (training) {
    const int64_t per_channel = c.in(0).numel() / std::max<int64_t>(ch[0], 1);
    c.require(per_channel > 1, "expected more than 1 value per channel when training, got x " +
                                   shape_string(c.in(0).shape));
  }
  const plx_dtype s = stat_dtype(c.in(0).dtype);
  c.out(0, c.in(0).dtype, c.in(0).shape);
  c.out(1, s, ch);
  c.out(2, s, ch);
}

void batch_norm_backward_infer(InferContext& c) {
  c.require(c.in(0).shape == c.in(1).shape, "dy " + shape_string(c.in(0).shape) + " and x " +
                                                shape_string(c.in(1).shape) + " differ in shape");
  c.require(c.in(0).dtype == c.in(1).dtype, "dy and x differ in dtype");
  const Shape ch = channels(c);
  check_param(c, 2, ch);
  check_stat(c, 3, ch);
  check_stat(c, 4, ch);
  eps_ok(c);
  c.out(0, c.in(0).dtype, c.in(0).shape);
  c.out(1, param_grad_dtype(c, 2), ch);
  c.out(2, param_grad_dtype(c, 2), ch);
}

// batch_norm_apply(x, gamma, beta, mean, invstd): batch_norm's affine pass with given stats.
void batch_norm_apply_infer(InferContext& c) {
  const Shape ch = channels(c);
  check_param(c, 1, ch);
  check_param(c, 2, ch);
  check_stat(c, 3, ch);
  check_stat(c, 4, ch);
  c.out(0, c.in(0).dtype, c.in(0).shape);
}

// ---- layer_norm ----

// The trailing normalized_ndim dimensions of x.
Shape normalized_shape(const InferContext& c, int x) {
  const Shape& s = c.in(x).shape;
  const int64_t k = c.attrs().get_int("normalized_ndim");
  c.require(k >= 1 && k <= static_cast<int64_t>(s.size()),
            "normalized_ndim " + std::to_string(k) + " is out of range for x " + shape_string(s) +
                " (1 to " + std::to_string(s.size()) + ")");
  return Shape(s.end() - k, s.end());
}
Shape row_shape(const InferContext& c, int x) {
  const Shape& s = c.in(x).shape;
  return Shape(s.begin(), s.end() - c.attrs().get_int("normalized_ndim"));
}

void layer_norm_infer(InferContext& c) {
  const Shape norm = normalized_shape(c, 0);
  check_param(c, 1, norm);
  check_param(c, 2, norm);
  eps_ok(c);
  const plx_dtype s = stat_dtype(c.in(0).dtype);
  c.out(0, c.in(0).dtype, c.in(0).shape);
  c.out(1, s, row_shape(c, 0));
  c.out(2, s, row_shape(c, 0));
}

void layer_norm_backward_infer(InferContext& c) {
  c.require(c.in(0).shape == c.in(1).shape, "dy " + shape_string(c.in(0).shape) + " and x " +
                                                shape_string(c.in(1).shape) + " differ in shape");
  c.require(c.in(0).dtype == c.in(1).dtype, "dy and x differ in dtype");
  const Shape norm = normalized_shape(c, 1);
  check_param(c, 2, norm);
  check_stat(c, 3, row_shape(c, 1));
  check_stat(c, 4, row_shape(c, 1));
  eps_ok(c);
  c.out(0, c.in(0).dtype, c.in(0).shape);
  c.out(1, param_grad_dtype(c, 2), norm);
  c.out(2, param_grad_dtype(c, 2), norm);
}

// Shared gradient formula: (dx, dgamma, dbeta) = <op>_backward(dy, x, gamma, saved stats).
void norm_grad(GradContext& g, const std::string& bwd, const Attrs& attrs) {
  if (!g.grad_output(0).valid()) return;
  if (!g.needs_grad(0) && !g.needs_grad(1) && !g.needs_grad(2)) return;
  const auto r =
      g.call_all(bwd, {g.grad_output(0), g.input(0), g.input(1), g.output(1), g.output(2)}, attrs);
  g.set_grad(0, r.at(0));
  if (g.needs_grad(1)) g.set_grad(1, as_dtype_of(g, r.at(1), g.input(1)));
  if (g.needs_grad(2)) g.set_grad(2, as_dtype_of(g, r.at(2), g.input(2)));
}

}  // namespace

void register_norm(OpRegistry& r) {
  const uint32_t kStatIn = PLX_ARG_OPTIONAL | PLX_ARG_MUTATED | PLX_ARG_NO_GRAD;
  const uint32_t kStatTypes = dtype_bit(PLX_F32) | dtype_bit(PLX_F64);
  const AttrDef training = attr("training", PLX_ATTR_INT, int64_t{1},
                                "1: batch statistics (and update the running ones); 0: running");
  const AttrDef eps = attr("eps", PLX_ATTR_FLOAT, 1e-5, "added to the variance");
  const AttrDef normalized_ndim =
      attr("normalized_ndim", PLX_ATTR_INT, int64_t{1}, "trailing dimensions normalised over");

  r.add(OpSchema{
      .name = "batch_norm",
      .doc = "normalise x (N, C, ...) per channel over N and the spatial dims; y = (x - mean) * "
             "invstd * gamma + beta",
      .inputs = {in("x", kFloatTypes), opt("gamma", kFloatTypes), opt("beta", kFloatTypes),
                 in("running_mean", kFloatTypes, kStatIn), in("running_var", kFloatTypes, kStatIn)},
      .outputs = {out("y"), out("save_mean", kStatTypes, PLX_ARG_NO_GRAD),
                  out("save_invstd", kStatTypes, PLX_ARG_NO_GRAD)},
      .attrs = {training,
                attr("momentum", PLX_ATTR_FLOAT, 0.1, "weight of the batch in the running stats"),
                eps},
      .infer = batch_norm_infer,
      .grad =
          [](GradContext& g) {
            norm_grad(
                g, "batch_norm_backward",
                {{"training", g.attrs().get_int("training")}, {"eps", g.attrs().get_float("eps")}});
          },
  });
  r.add(OpSchema{
      .name = "batch_norm_backward",
      .doc = "gradients (dx, dgamma, dbeta) of batch_norm given dy, x, gamma and the saved stats",
      .inputs = {in("dy", kFloatTypes), in("x", kFloatTypes), opt("gamma", kFloatTypes),
                 in("save_mean", kStatTypes), in("save_invstd", kStatTypes)},
      .outputs = {out("dx"), out("dgamma", kFloatTypes), out("dbeta", kFloatTypes)},
      .attrs = {training, eps},
      .infer = batch_norm_backward_infer,
  });
  // What backward runs to recompute batch_norm's output (train.recompute), and an inference-style
  // normalisation with statistics from elsewhere. The statistics are constants: the gradient is
  // batch_norm_backward's eval form.
  r.add(OpSchema{
      .name = "batch_norm_apply",
      .doc = "y = (x - mean) * invstd * gamma + beta per channel of x (N, C, ...), with the "
             "statistics given (batch_norm's save_mean and save_invstd): batch_norm's output "
             "again, to the bit, without its reductions or the running-stat update",
      .inputs = {in("x", kFloatTypes), opt("gamma", kFloatTypes), opt("beta", kFloatTypes),
                 in("mean", kStatTypes, PLX_ARG_NO_GRAD),
                 in("invstd", kStatTypes, PLX_ARG_NO_GRAD)},
      .outputs = {out("y")},
      .infer = batch_norm_apply_infer,
      .grad =
          [](GradContext& g) {
            if (!g.grad_output(0).valid()) return;
            if (!g.needs_grad(0) && !g.needs_grad(1) && !g.needs_grad(2)) return;
            const auto r =
                g.call_all("batch_norm_backward",
                           {g.grad_output(0), g.input(0), g.input(1), g.input(3), g.input(4)},
                           {{"training", int64_t{0}}});
            g.set_grad(0, r.at(0));
            if (g.needs_grad(1)) g.set_grad(1, as_dtype_of(g, r.at(1), g.input(1)));
            if (g.needs_grad(2)) g.set_grad(2, as_dtype_of(g, r.at(2), g.input(2)));
          },
  });
  r.add(OpSchema{
      .name = "layer_norm",
      .doc = "normalise x over its trailing normalized_ndim dims; y = (x - mean) * invstd * gamma "
             "+ beta",
      .inputs = {in("x", kFloatTypes), opt("gamma", kFloatTypes), opt("beta", kFloatTypes)},
      .outputs = {out("y"), out("mean", kStatTypes, PLX_ARG_NO_GRAD),
                  out("invstd", kStatTypes, PLX_ARG_NO_GRAD)},
      .attrs = {normalized_ndim, eps},
      .infer = layer_norm_infer,
      .grad = [](GradContext& g) { norm_grad(g, "layer_norm_backward", g.attrs()); },
  });
  r.add(OpSchema{
      .name = "layer_norm_backward",
      .doc = "gradients (dx, dgamma, dbeta) of layer_norm given dy, x, gamma and the saved stats",
      .inputs = {in("dy", kFloatTypes), in("x", kFloatTypes), opt("gamma", kFloatTypes),
                 in("mean", kStatTypes), in("invstd", kStatTypes)},
      .outputs = {out("dx"), out("dgamma", kFloatTypes), out("dbeta", kFloatTypes)},
      .attrs = {normalized_ndim, eps},
      .infer = layer_norm_backward_infer,
  });
}

}  // namespace plexus::ops
