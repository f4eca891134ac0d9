#include "step_graph.hpp"

#include <algorithm>
#include <filesystem>

#include "plexus/error.hpp"
#include "plexus/sdk/dtype.hpp"
#include "step_pipeline.hpp"

namespace fs = std::filesystem;

namespace plexus {

std::string config_relative(const Config& cfg, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute() || cfg.source().empty()) return p;
  return (fs::path(cfg.source()).parent_path() / p).lexically_normal().string();
}

ModelSpec model_of(const Config& cfg) {
  const std::string model_file = cfg.get_string("model.file");
  return model_file.empty() ? builtin_model(cfg.get_string("model.name"))
                            : load_model(config_relative(cfg, model_file));
}

DataSets load_data(const Config& cfg, const ModelSpec& spec, bool with_test) {
  const std::string kind = cfg.get_string("data.dataset");
  std::string dir = cfg.get_string("data.path");
  dir = dir.empty() ? data::default_dir(kind) : config_relative(cfg, dir);
  data::SyntheticOptions synth;
  synth.train_count = cfg.get_int("data.synthetic_samples");
  synth.test_count = std::max<int64_t>(1, synth.train_count / 4);
  synth.seed = static_cast<uint64_t>(cfg.get_int("train.seed"));
  if (!spec.input_shape.empty()) synth.shape = spec.input_shape;
  if (spec.classes > 0) synth.classes = static_cast<int32_t>(spec.classes);
  DataSets d;
  d.train = data::load_dataset(kind, dir, "train", synth);
  if (with_test) {
    d.test = data::load_dataset(kind, dir, "test", synth);
    d.has_test = true;
  }
  if (!spec.input_shape.empty() && spec.input_shape != d.train.sample_shape)
    throw ConfigError("model '" + spec.name + "' expects samples of shape " +
                      shape_string(spec.input_shape) + ", dataset " + d.train.name + " has " +
                      shape_string(d.train.sample_shape));
  if (spec.classes > 0 && spec.classes != d.train.num_classes)
    throw ConfigError("model '" + spec.name + "' has " + std::to_string(spec.classes) +
                      " classes, dataset " + d.train.name + " has " +
                      std::to_string(d.train.num_classes));
  return d;
}

plx_dtype compute_dtype(const Config& cfg) {
  const std::string p = cfg.get_string("train.precision");
  if (p == "bf16") return PLX_BF16;
  if (p == "f16") return PLX_F16;
  return PLX_F32;
}

std::vector<std::string> recompute_ops(const Config& cfg) {
  std::vector<std::string> ops = cfg.get_strings("train.recompute");
  const auto& allowed = recomputable_ops();
  for (const std::string& op : ops)
    if (std::find(allowed.begin(), allowed.end(), op) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw ConfigError(cfg.origin("train.recompute") + ": train.recompute: '" + op +
                        "' is not an op backward can recompute; expected any of: " + list);
    }
  return ops;
}

bool enable_tf32(Backend& backend) {
  const plx_backend& t = backend.table();
  if (!t.get_proc_address) return false;
  const std::string extra = backend.name() + ".set_tf32";
  auto fn = reinterpret_cast<void (*)(void*, int32_t)>(t.get_proc_address(t.ctx, extra.c_str()));
  if (!fn) return false;
  fn(t.ctx, 1);
  return true;
}

OptimizerOptions optimizer_options(const Config& cfg) {
  OptimizerOptions opt;
  opt.kind = cfg.get_string("train.optimizer");
  opt.momentum = opt.kind == "sgd" ? cfg.get_float("train.momentum") : 0;
  opt.nesterov = cfg.get_bool("train.nesterov");
  opt.weight_decay = cfg.get_float("train.weight_decay");
  opt.beta1 = cfg.get_float("train.beta1");
  opt.beta2 = cfg.get_float("train.beta2");
  opt.eps = cfg.get_float("train.eps");
  return opt;
}

Var loss_scaler_state(Graph& g, const std::string& name, const LossScaling& s) {
  const std::string full = kLossScalerPrefix + name;
  if (const Var v = g.find(full); v.valid()) return v;
  double v = 0;
  if (name == "scale") v = s.init;
  if (name == "unscale") v = 1.0 / s.init;
  if (name == "step") v = 1;
  return g.state(full, TensorDesc{PLX_F32, {}}, init::constant(v));
}

Var add_scaled_update(Graph& g, const std::vector<Var>& params, const std::vector<Var>& grads,
                      const OptimizerOptions& opt, const LossScaling& s, const std::string& model) {
  // The gradients times 1/S; their sums, added, are finite exactly when every element is (a sum
  // of finite values overflowing f32 is as good a reason to skip). S, 1/S, the count of finite
  // steps, the skipped steps and AdamW's step count (the steps that updated) are states the step
  // moves itself (loss_scale_update), so nothing waits for the host between backward and the
  // update. Backward's nodes, as backward() marks its own (no forward node reads a scaler state,
  // so none is taken for a running statistic), then the update's.
  const Phase before = g.phase();
  g.set_phase(Phase::Backward);
  const Var unscale = loss_scaler_state(g, "unscale", s);
  std::vector<Var> unscaled;
  Var check;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].valid()) {
      unscaled.push_back(Var{});
      continue;
    }
    const std::string name = g.value(params[i]).name;  // copied: add() grows the graph
    const Var gr = g.add1("mul", {grads[i], unscale}, {}, name + ".grad_unscale");
    unscaled.push_back(gr);
    const Var sum = g.add1("sum", {gr}, {}, name + ".grad_check");
    check = check.valid() ? g.add1("add", {check, sum}, {}, "grad_check." + name) : sum;
  }
  if (!check.valid()) throw ConfigError("model '" + model + "': no parameter gets a gradient");
  const Var opt_step = opt.kind == "adamw" ? loss_scaler_state(g, "step", s) : Var{};
  add_optimizer(g, params, unscaled, opt, check, opt_step);
  Attrs sa;
  sa.set("growth_interval", s.window);
  g.set_phase(Phase::Update);
  const Var report = g.add1("loss_scale_update",
                            {check, loss_scaler_state(g, "scale", s), unscale,
                             loss_scaler_state(g, "good", s), loss_scaler_state(g, "skipped", s),
                             opt_step},
                            sa, "loss_scale");
  g.set_phase(before);
  g.mark_output(report, kLossScaleReport);
  return check;
}

std::unique_ptr<StepGraph> build_step(const OpRegistry& ops, const ModelSpec& spec, int64_t batch,
                                      const std::vector<int64_t>& sample, bool training,
                                      const OptimizerOptions& opt, bool scaled, plx_dtype compute,
                                      const LossScaling* loss_scaling,
                                      const std::vector<std::string>& recompute,
                                      double label_smoothing) {
  BackwardOptions bo;
  bo.recompute = recompute;
  auto m = std::make_unique<StepGraph>(ops);
  Graph& g = m->graph;
  Shape xs = {batch};
  xs.insert(xs.end(), sample.begin(), sample.end());
  const Var x = g.input("x", TensorDesc{PLX_F32, xs});
  const Var labels = g.input("labels", TensorDesc{PLX_I32, {batch}});
  auto cast = [&](Var v, plx_dtype to, const std::string& name) {
    return g.add1("cast", {v}, {{"dtype", std::string(dtype_name(to))}}, name);
  };
  const bool mixed = compute != PLX_F32;
  Var logits = build_model(g, spec, mixed ? cast(x, compute, "x.cast") : x, training);
  if (mixed) logits = cast(logits, PLX_F32, "logits.cast");
  Attrs la;
  la.set("reduction", std::string(training && !scaled ? "mean" : "sum"));
  la.set("ignore_index", static_cast<int64_t>(data::kIgnoreLabel));
  if (training && label_smoothing > 0) la.set("label_smoothing", label_smoothing);
  const Var ce_loss = g.add("softmax_cross_entropy", {logits, labels}, la, "loss").at(0);
  m->loss = ce_loss;
  const TensorDesc scalar{PLX_F32, {}};
  // Data parallelism's loss scale (one over the global batch's rows) and f16's gradient scale
  // S multiply the loss. Backward starts from their product as the loss's gradient instead of
  // from a mul after the loss (the same bits: d(S·loss)/d(loss) = 1·S), so no node sits between
  // the cross-entropy and its backward and a backend may fuse the two
  // (sdk::find_linear_cross_entropy); the reported loss's mul comes after backward.
  const Var loss_scale = training && scaled ? g.input(kLossScaleInput, scalar) : Var{};
  Attrs aa;
  aa.set("axis", static_cast<int64_t>(1));
  m->pred = g.add1("argmax", {logits}, aa, "pred");
  if (training && loss_scaling) {
    // backward(S * loss), then the gradients times 1/S, checked, and the update (add_scaled_update).
    const Phase before = g.phase();
    g.set_phase(Phase::Backward);
    const Var scale = loss_scaler_state(g, "scale", *loss_scaling);
    bo.seed_grad = loss_scale.valid() ? g.add1("mul", {loss_scale, scale}, {}, "loss.seed") : scale;
    m->params = g.parameters();
    m->grads = backward(g, ce_loss, m->params, bo);
    add_scaled_update(g, m->params, m->grads, opt, *loss_scaling, spec.name);
    g.set_phase(before);
  } else if (training) {
    m->params = g.parameters();
    if (loss_scale.valid()) bo.seed_grad = loss_scale;
    m->grads = backward(g, ce_loss, m->params, bo);
    add_optimizer(g, m->params, m->grads, opt);
  }
  if (loss_scale.valid()) m->loss = g.add1("mul", {ce_loss, loss_scale}, {}, "loss.scale");
  g.mark_output(m->loss, "loss_value");
  g.mark_output(m->pred, "predictions");
  return m;
}

}  // namespace plexus
