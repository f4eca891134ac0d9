// Built-in op schemas: optimizer updates and f16's loss scale (see docs/ops.md). They write
// param and optimizer state in place; lr, step and the gradients' check are tensors, not
// attributes, so that a captured training step replays with new values.
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

// An update's optional `check` (ABI 1.4): the update is skipped unless it is finite.
ArgDef check_input() {
  return since_abi(in("check", dtype_bit(PLX_F32), PLX_ARG_OPTIONAL | PLX_ARG_NO_GRAD), 4);
}

void sgd_infer(InferContext& c) {
  require_same_shape(c, 1);
  if (c.has(2)) require_same_shape(c, 2);
  require_scalar(c, 3);
  if (c.has(4)) require_scalar(c, 4);
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
  if (c.has(6)) require_scalar(c, 6);
  for (const char* beta : {"beta1", "beta2"}) {
    const double b = c.attrs().get_float(beta);
    c.require(b >= 0 && b < 1, std::string(beta) + " must be in [0, 1), got " + num(b));
  }
  const double eps = c.attrs().get_float("eps");
  const double wd = c.attrs().get_float("weight_decay");
  c.require(eps >= 0, "eps must be >= 0, got " + num(eps));
  c.require(wd >= 0, "weight_decay must be >= 0, got " + num(wd));
}

void loss_scale_infer(InferContext& c) {
  for (int i = 0; i < 6; ++i)
    if (c.has(i)) require_scalar(c, i);
  const int64_t interval = c.attrs().get_int("growth_interval");
  const double growth = c.attrs().get_float("growth_factor");
  const double backoff = c.attrs().get_float("backoff_factor");
  // The count of finite steps is an f32 state: exact up to 2^24.
  c.require(interval >= 1 && interval <= (int64_t{1} << 24),
            "growth_interval must be in [1, 2^24], got " + std::to_string(interval));
  c.require(growth > 1, "growth_factor must be > 1, got " + num(growth));
  c.require(backoff > 0 && backoff < 1, "backoff_factor must be in (0, 1), got " + num(backoff));
  c.out(0, c.in(0).dtype, {5});
}

}  // namespace

void register_optim(OpRegistry& r) {
  r.add(OpSchema{
      .name = "sgd_update",
      .doc = "SGD step in place (PyTorch's rule): momentum, dampening, weight decay, nesterov; "
             "skipped unless `check` (optional) is finite",
      .inputs = {in("param", kParamTypes, PLX_ARG_MUTATED | PLX_ARG_NO_GRAD),
                 in("grad", 0, PLX_ARG_NO_GRAD), state("momentum_buf", PLX_ARG_OPTIONAL),
                 in("lr", kScalarTypes, PLX_ARG_NO_GRAD), check_input()},
      .outputs = {},
      .attrs = {attr("momentum", PLX_ATTR_FLOAT, 0.0, "0: plain SGD, no buffer"),
                attr("dampening", PLX_ATTR_FLOAT, 0.0, "scales the gradient entering the buffer"),
                attr("weight_decay", PLX_ATTR_FLOAT, 0.0, "L2 penalty added to the gradient"),
                attr("nesterov", PLX_ATTR_INT, int64_t{0}, "Nesterov momentum")},
      .infer = sgd_infer,
  });
  r.add(OpSchema{
      .name = "adamw_update",
      .doc = "AdamW step in place (decoupled weight decay, bias correction at `step`); skipped "
             "unless `check` (optional) is finite",
      .inputs = {in("param", kParamTypes, PLX_ARG_MUTATED | PLX_ARG_NO_GRAD),
                 in("grad", 0, PLX_ARG_NO_GRAD), state("exp_avg"), state("exp_avg_sq"),
                 in("lr", kScalarTypes, PLX_ARG_NO_GRAD),
                 in("step", kScalarTypes, PLX_ARG_NO_GRAD), check_input()},
      .outputs = {},
      .attrs = {attr("beta1", PLX_ATTR_FLOAT, 0.9, "decay of the first moment"),
                attr("beta2", PLX_ATTR_FLOAT, 0.999, "decay of the second moment"),
                attr("eps", PLX_ATTR_FLOAT, 1e-8, "added to the denominator"),
                attr("weight_decay", PLX_ATTR_FLOAT, 0.01, "decoupled: param *= 1 - lr * wd")},
      .infer = adamw_infer,
  });
  // PyTorch's GradScaler update (_amp_update_scale_) on the device, after the step's updates
  // (which read `check` and `step` as they were).
  const uint32_t scalar_state = PLX_ARG_MUTATED | PLX_ARG_NO_GRAD;
  r.add(OpSchema{
      .name = "loss_scale_update",
      .doc = "dynamic loss scaling's update after a step whose gradients' sum is `check`: not "
             "finite: scale *= backoff_factor, good = 0, skipped += 1; else good += 1, step += 1 "
             "and after growth_interval finite steps in a row scale *= growth_factor (when that "
             "is finite), good = 0; unscale = 1 / scale. report = [the scale the step ran with, "
             "1 if it was skipped else 0, scale, good, skipped] after the update",
      .inputs = {in("check", kScalarTypes, PLX_ARG_NO_GRAD), in("scale", 0, scalar_state),
                 in("unscale", 0, scalar_state), in("good", 0, scalar_state),
                 in("skipped", 0, scalar_state), in("step", 0, scalar_state | PLX_ARG_OPTIONAL)},
      .outputs = {out("report", 0)},
      .attrs = {attr("growth_interval", PLX_ATTR_INT, int64_t{2000},
                     "finite steps in a row before the scale grows"),
                attr("growth_factor", PLX_ATTR_FLOAT, 2.0, "the scale's growth"),
                attr("backoff_factor", PLX_ATTR_FLOAT, 0.5, "the scale's cut on a skipped step")},
      .infer = loss_scale_infer,
  });
}

}  // namespace plexus::ops
