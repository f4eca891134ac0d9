// Built-in op schemas: softmax, log_softmax, softmax cross-entropy and their backward ops
// (see docs/ops.md).
#include <algorithm>

#include "plexus/op_schema.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

void check_axis(const InferContext& c, const Shape& x) {
  normalize_axis(c, c.attrs().get_int("axis"), static_cast<int64_t>(x.size()));
}

void softmax_infer(InferContext& c) {
  const Shape& x = c.in(0).shape;
  check_axis(c, x);
  c.out(0, c.in(0).dtype, x);
}

// (dy, y) -> dx along `axis`.
void softmax_backward_infer(InferContext& c) {
  const Shape& dy = c.in(0).shape;
  c.require(dy == c.in(1).shape, "dy " + shape_string(dy) + " and y " +
                                     shape_string(c.in(1).shape) + " differ in shape");
  check_axis(c, dy);
  c.out(0, c.in(0).dtype, dy);
}

// y = f(x) along an axis whose gradient is f_backward(dy, y).
void add_softmax_like(OpRegistry& r, const std::string& name, const std::string& doc,
                      const std::string& backward_doc) {
  const std::vector<AttrDef> attrs = {
      attr("axis", PLX_ATTR_INT, int64_t{-1}, "the axis normalised over; negative from the end")};
  add_with_backward(r, name, doc, backward_doc, /*saves_output=*/true, attrs, softmax_infer,
                    softmax_backward_infer);
}

std::vector<AttrDef> cross_entropy_attrs() {
  return {attr("reduction", PLX_ATTR_STRING, std::string("mean"), "mean | sum | none"),
          attr("ignore_index", PLX_ATTR_INT, int64_t{-100},
               "rows with this label give no loss and no gradient"),
          attr("label_smoothing", PLX_ATTR_FLOAT, 0.0,
               "eps in [0, 1]: target = (1 - eps) one-hot + eps / C")};
}

// Checks the attributes; returns whether the loss is per row (reduction none).
bool check_cross_entropy_attrs(const InferContext& c) {
  const std::string& red = c.attrs().get_string("reduction");
  c.require(red == "mean" || red == "sum" || red == "none",
            "reduction must be \"mean\", \"sum\" or \"none\", got \"" + red + "\"");
  const double eps = c.attrs().get_float("label_smoothing");
  c.require(eps >= 0.0 && eps <= 1.0,
            "label_smoothing must be in [0, 1], got " + std::to_string(eps));
  return red == "none";
}

// logits (N, C) and labels (N); returns N.
int64_t check_logits_labels(const InferContext& c, const char* logits_name, int labels_input) {
  const Shape& x = c.in(labels_input - 1).shape;
  const Shape& labels = c.in(labels_input).shape;
  c.require(x.size() == 2, std::string(logits_name) + " must be (N, C), got " + shape_string(x));
  c.require(labels == Shape{x[0]}, "labels must be (N) = (" + std::to_string(x[0]) + ") to match " +
                                       logits_name + " " + shape_string(x) + ", got " +
                                       shape_string(labels));
  return x[0];
}

void cross_entropy_infer(InferContext& c) {
  const bool per_row = check_cross_entropy_attrs(c);
  const int64_t n = check_logits_labels(c, "logits", 1);
  c.out(0, c.in(0).dtype, per_row ? Shape{n} : Shape{});
  c.out(1, c.in(0).dtype, c.in(0).shape);
}

// (dloss, log_probs, labels) -> dlogits.
void cross_entropy_backward_infer(InferContext& c) {
  const bool per_row = check_cross_entropy_attrs(c);
  const int64_t n = check_logits_labels(c, "log_probs", 2);
  const Shape want = per_row ? Shape{n} : Shape{};
  const std::string& red = c.attrs().get_string("reduction");
  c.require(c.in(0).shape == want, "dloss must be " + shape_string(want) +
                                       " like the loss with reduction \"" + red + "\", got " +
                                       shape_string(c.in(0).shape));
  c.out(0, c.in(0).dtype, c.in(1).shape);
}

}  // namespace

void register_softmax(OpRegistry& r) {
  add_softmax_like(r, "softmax",
                   "exp(x) / sum(exp(x)) along axis, computed with the max subtracted",
                   "dx = y (dy - sum(dy y)) along axis, given the forward's output y");
  add_softmax_like(r, "log_softmax", "x - log(sum(exp(x))) along axis (log-sum-exp)",
                   "dx = dy - exp(y) sum(dy) along axis, given the forward's output y");
  r.add(OpSchema{
      .name = "softmax_cross_entropy",
      .doc = "cross-entropy of log_softmax(logits) against integer labels, with ignore_index and "
             "label smoothing; also returns log_probs for the backward",
      .inputs = {in("logits", kFloatTypes), in("labels", kIndexTypes, PLX_ARG_NO_GRAD)},
      .outputs = {out("loss"), out("log_probs", 0, PLX_ARG_NO_GRAD)},
      .attrs = cross_entropy_attrs(),
      .infer = cross_entropy_infer,
      .grad =
          [](GradContext& g) {
            // log_probs carries no gradient: only the loss's flows back.
            if (!g.grad_output(0).valid()) return;
            g.set_grad(0, g.call("softmax_cross_entropy_backward",
                                 {g.grad_output(0), g.output(1), g.input(1)}, g.attrs()));
          },
  });
  r.add(OpSchema{
      .name = "softmax_cross_entropy_backward",
      .doc = "dlogits = dloss-scale (exp(log_probs) - target) on rows not ignored, 0 on the others",
      .inputs = {in("dloss", kFloatTypes), in("log_probs"),
                 in("labels", kIndexTypes, PLX_ARG_NO_GRAD)},
      .outputs = {out("dlogits")},
      .attrs = cross_entropy_attrs(),
      .infer = cross_entropy_backward_infer,
  });
}

}  // namespace plexus::ops
