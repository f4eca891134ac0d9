#include "plexus/optimizer.hpp"

#include <cmath>

#include "plexus/error.hpp"

namespace plexus {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw ConfigError(what);
}

}  // namespace

void add_optimizer(Graph& g, const std::vector<Var>& params, const std::vector<Var>& grads,
                   const OptimizerOptions& o, Var check, Var step_in) {
  if (params.size() != grads.size())
    throw Error("add_optimizer: " + std::to_string(params.size()) + " parameters but " +
                std::to_string(grads.size()) + " gradients");
  require(o.kind == "sgd" || o.kind == "adamw",
          "train.optimizer: unknown optimizer '" + o.kind + "' (expected sgd or adamw)");
  require(o.weight_decay >= 0, "train.weight_decay: must be >= 0, got " + std::to_string(o.weight_decay));
  const Phase old_phase = g.phase();
  const std::string old_scope = g.scope();
  g.set_phase(Phase::Update);
  const Var lr = g.input(kLearningRateInput, TensorDesc{PLX_F32, {}});
  if (o.kind == "sgd") {
    require(o.momentum >= 0, "train.momentum: must be >= 0, got " + std::to_string(o.momentum));
    require(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
            "train.nesterov: needs momentum > 0 and no dampening");
    Attrs a;
    a.set("momentum", o.momentum);
    a.set("dampening", o.dampening);
    a.set("weight_decay", o.weight_decay);
    a.set("nesterov", static_cast<int64_t>(o.nesterov));
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].valid()) continue;
      const std::string name = g.value(params[i]).name;  // copied: state() grows the graph
      Var buf;
      if (o.momentum > 0) buf = g.state(name + ".momentum_buffer", g.desc(params[i]), init::zeros());
      g.set_scope("sgd." + name);
      g.add("sgd_update", {params[i], grads[i], buf, lr, check}, a);
    }
  } else {
    require(o.beta1 >= 0 && o.beta1 < 1, "train.beta1: must be in [0, 1), got " + std::to_string(o.beta1));
    require(o.beta2 >= 0 && o.beta2 < 1, "train.beta2: must be in [0, 1), got " + std::to_string(o.beta2));
    require(o.eps >= 0, "train.eps: must be >= 0, got " + std::to_string(o.eps));
    const Var step = step_in.valid() ? step_in : g.input(kStepInput, TensorDesc{PLX_F32, {}});
    Attrs a;
    a.set("beta1", o.beta1);
    a.set("beta2", o.beta2);
    a.set("eps", o.eps);
    a.set("weight_decay", o.weight_decay);
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].valid()) continue;
      const GraphValue& p = g.value(params[i]);
      const std::string name = p.name;
      const TensorDesc desc = p.desc;
      const Var m = g.state(name + ".exp_avg", desc, init::zeros());
      const Var v = g.state(name + ".exp_avg_sq", desc, init::zeros());
      g.set_scope("adamw." + name);
      g.add("adamw_update", {params[i], grads[i], m, v, lr, step, check}, a);
    }
  }
  g.set_phase(old_phase);
  g.set_scope(old_scope);
}

double learning_rate(const ScheduleOptions& s, int64_t step) {
  require(s.lr > 0 && std::isfinite(s.lr), "train.lr: must be a positive number, got " + std::to_string(s.lr));
  require(s.warmup_steps >= 0, "train.warmup: must be >= 0");
  if (s.warmup_steps > 0 && step < s.warmup_steps)
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  if (s.kind == "constant") return s.lr;
  if (s.kind == "step") {
    require(s.step_size > 0, "train.step_epochs: the step schedule needs a period > 0");
    require(s.gamma > 0, "train.gamma: must be > 0, got " + std::to_string(s.gamma));
    return s.lr * std::pow(s.gamma, static_cast<double>((step - s.warmup_steps) / s.step_size));
  }
  if (s.kind == "cosine") {
    require(s.total_steps > s.warmup_steps,
            "train.schedule: cosine needs more steps (" + std::to_string(s.total_steps) +
                ") than warm-up steps (" + std::to_string(s.warmup_steps) + ")");
    require(s.min_lr >= 0 && s.min_lr <= s.lr, "train.min_lr: must be in [0, train.lr]");
    const double t = std::min(1.0, static_cast<double>(step - s.warmup_steps) /
                                       static_cast<double>(s.total_steps - s.warmup_steps));
    return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(3.141592653589793 * t));
  }
  throw ConfigError("train.schedule: unknown schedule '" + s.kind +
                    "' (expected constant, step or cosine)");
}

}  // namespace plexus
