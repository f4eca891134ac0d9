// Built-in op schemas: optimizer updates (see docs/ops.md). They write param and optimizer state
// in place and have no outputs; lr and step are tensors, not attributes, so that a captured
// training step replays with new values.
#include <sstream>

#include "plexus/op_schema.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

constexpr uint32_t kParamTypes = dtype_bit(PLX_F32) | dtype_bit(PLX_F64);
constexpr uint32_t kScalarTypes = dtype_bit(PLX_F32) | dtype_bit(PLX_F64);

// "0.9", not std::to_string's "0.900000".
std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// An input of the param's dtype written in place (optimizer state).
ArgDef state(std::string name, uint32_t flags = 0) {
  return in(std::move(name), 0, PLX_ARG_MUTATED | PLX_ARG_NO_GRAD | flags);
}

void require_same_shape(const InferContext& c, int i) {
  const std::string& name = c.schema().inputs[static_cast<size_t>(i)].name;
  c.require(c.in(i).shape == c.in(0).shape, name + " " + shape_string(c.in(i).shape) +
                                                " and param " + shape_string(c.in(0).shape) +
                                                " differ in shape");
}

// lr and step hold one value: shape () or (1).
void require_scalar(const InferContext& c, int i) {
  const Shape& s = c.in(i).shape;
  c.require(s.empty() || (s.size() == 1 && s[0] == 1),
            c.schema().inputs[static_cast<size_t>(i)].name +
                " must be a scalar tensor of shape () or (1), got " + shape_string(s));
}

void sgd_infer(InferContext& c) {
  require_same_shape(c, 1);
  if (c.has(2)) require_same_shape(c, 2);
  require_scalar(c, 3);
  const double momentum = c.attrs().get_float("momentum");
  const double dampening = c.attrs().get_float("dampening");
  const double wd = c.attrs().get_float("weight_decay");
  c.require(momentum >= 0, "momentum must be >= 0, got " + num(momentum));
  c.require(wd >= 0, "weight_decay must be >= 0, got " + num(wd));
  // PyTorch's SGD refuses the same combination.
  c.require(c.attrs().get_int("nesterov") == 0 || (momentum > 0 && dampening == 0),
            "nesterov needs momentum > 0 and dampening 0");
  c.require(momentum == 0 || c.has(2),
            "momentum " + num(momentum) +
                " needs the momentum_buf input (a zero-initialised tensor shaped like param)");
}

void adamw_infer(InferContext& c) {
  for (int i = 1; i <= 3; ++i) require_same_shape(c, i);
  require_scalar(c, 4);
  require_scalar(c, 5);
  for (const char* beta : {"beta1", "beta2"}) {
    const double b = c.attrs().get_float(beta);
    c.require(b >= 0 && b < 1, std::string(beta) + " must be in [0, 1), got " + num(b));
  }
  const double eps = c.attrs().get_float("eps");
  const double wd = c.attrs().get_float("weight_decay");
  c.require(eps >= 0, "eps must be >= 0, got " + num(eps));
  c.require(wd >= 0, "weight_decay must be >= 0, got " + num(wd));
}

}  // namespace

void register_optim(OpRegistry& r) {
  r.add(OpSchema{
      .name = "sgd_update",
      .doc = "SGD step in place (PyTorch's rule): momentum, dampening, weight decay, nesterov",
      .inputs = {in("param", kParamTypes, PLX_ARG_MUTATED | PLX_ARG_NO_GRAD),
                 in("grad", 0, PLX_ARG_NO_GRAD), state("momentum_buf", PLX_ARG_OPTIONAL),
                 in("lr", kScalarTypes, PLX_ARG_NO_GRAD)},
      .outputs = {},
      .attrs = {attr("momentum", PLX_ATTR_FLOAT, 0.0, "0: plain SGD, no buffer"),
                attr("dampening", PLX_ATTR_FLOAT, 0.0, "scales the gradient entering the buffer"),
                attr("weight_decay", PLX_ATTR_FLOAT, 0.0, "L2 penalty added to the gradient"),
                attr("nesterov", PLX_ATTR_INT, int64_t{0}, "Nesterov momentum")},
      .infer = sgd_infer,
  });
  r.add(OpSchema{
      .name = "adamw_update",
      .doc = "AdamW step in place (decoupled weight decay, bias correction at `step`)",
      .inputs = {in("param", kParamTypes, PLX_ARG_MUTATED | PLX_ARG_NO_GRAD),
                 in("grad", 0, PLX_ARG_NO_GRAD), state("exp_avg"), state("exp_avg_sq"),
                 in("lr", kScalarTypes, PLX_ARG_NO_GRAD),
                 in("step", kScalarTypes, PLX_ARG_NO_GRAD)},
      .outputs = {},
      .attrs = {attr("beta1", PLX_ATTR_FLOAT, 0.9, "decay of the first moment"),
                attr("beta2", PLX_ATTR_FLOAT, 0.999, "decay of the second moment"),
                attr("eps", PLX_ATTR_FLOAT, 1e-8, "added to the denominator"),
                attr("weight_decay", PLX_ATTR_FLOAT, 0.01, "decoupled: param *= 1 - lr * wd")},
      .infer = adamw_infer,
  });
}

}  // namespace plexus::ops
