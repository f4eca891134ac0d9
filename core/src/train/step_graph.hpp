// What a training run is made of, shared by the trainer and `plexus compare` (private to the
// core): the model and data sets a config names, its optimizer settings, and the training and
// evaluation step graphs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plexus/backend.hpp"
#include "plexus/config.hpp"
#include "plexus/data.hpp"
#include "plexus/graph.hpp"
#include "plexus/model.hpp"
#include "plexus/optimizer.hpp"

namespace plexus {

// A path from the config, taken relative to the config file's directory.
std::string config_relative(const Config& cfg, const std::string& p);

// The model the config names (model.file, else the built-in model.name).
ModelSpec model_of(const Config& cfg);

// The training and (when train.eval is on) test sets of the config's data.* keys, checked
// against the model's input shape and classes (ConfigError naming both when they disagree).
struct DataSets {
  data::Dataset train, test;
  bool has_test = false;
};
DataSets load_data(const Config& cfg, const ModelSpec& spec, bool with_test);

// train.precision: the dtype the model computes in (f32 for "f32" and "tf32").
plx_dtype compute_dtype(const Config& cfg);

// train.recompute, checked: ConfigError naming where it was set and the op that cannot be
// recomputed.
std::vector<std::string> recompute_ops(const Config& cfg);

// train.precision = "tf32": TF32 matrix math for the kernels prepared from now on, through the
// backend's "<backend>.set_tf32" extra (docs/cuda.md). False where the backend has none (the CPU,
// which computes f32).
bool enable_tf32(Backend& backend);

// train.optimizer and its hyper-parameters.
OptimizerOptions optimizer_options(const Config& cfg);

// f16's dynamic loss scaling (docs/training.md): where the scale starts and how many finite
// steps in a row double it.
struct LossScaling {
  double init = 65536;
  int64_t window = 2000;
};

struct StepGraph {
  Graph graph;
  Var loss, pred;
  // The training step's parameters and the gradients backward makes for them: what data
  // parallelism all-reduces (under loss scaling, still multiplied by the scale S; the updates
  // read them times 1/S).
  std::vector<Var> params, grads;
  explicit StepGraph(const OpRegistry& ops) : graph(ops) {}
};

// f16's loss scaler state `name` (scale, unscale, good, skipped or step: kLossScalerPrefix +
// name, a 0-d f32 state starting where `s` says) in `g`, made on first use.
Var loss_scaler_state(Graph& g, const std::string& name, const LossScaling& s);

// f16's update after backward(S * loss) gave `grads` (build_step's, and a pipeline stage's):
// each gradient times 1/S, their sums added into the check, the updates reading it (skipped
// unless it is finite) and loss_scale_update, whose report is the output kLossScaleReport.
// Returns the check. ConfigError naming `model` when no parameter gets a gradient.
Var add_scaled_update(Graph& g, const std::vector<Var>& params, const std::vector<Var>& grads,
                      const OptimizerOptions& opt, const LossScaling& s, const std::string& model);

// The training step: forward, loss (mean over rows not ignored), backward, update.
// The evaluation step: forward in eval mode, summed loss, predictions.
// Inputs "x" (batch, sample...) f32 and "labels" (batch) i32, plus the optimizer's; outputs
// "loss_value" and "predictions". Under data parallelism (`scaled`) the training loss is the sum
// over the rank's rows times the input loss_scale (one over the global batch's real rows), so
// the ranks' gradients add up to the gradient of the global batch's mean loss, however the
// padding rows fall among them.
// `compute` f16 or bf16 (mixed precision): "x" is cast to it (node "x.cast"), the model runs in
// it with f32 master parameters (build_model), and its logits are cast back to f32
// ("logits.cast") before the loss, so the loss, the softmax, the gradients reaching the
// parameters and the optimizer are f32.
// `loss_scaling` (a training step): backward starts from the scale S (the state
// kLossScalerPrefix + "scale"), the gradients are multiplied by 1/S and summed into a check, the
// updates run only when it is finite (their input `check`), and loss_scale_update then moves S on
// the device and writes its report (output kLossScaleReport, step_pipeline.hpp). No host reads
// anything between backward and the update: the step is one graph.
// `recompute`: train.recompute, the ops whose outputs backward computes again
// (BackwardOptions::recompute).
// `label_smoothing`: train.label_smoothing, the training loss's (softmax_cross_entropy's
// attribute); an evaluation step ignores it (its loss is the plain cross-entropy).
std::unique_ptr<StepGraph> build_step(const OpRegistry& ops, const ModelSpec& spec, int64_t batch,
                                      const std::vector<int64_t>& sample, bool training,
                                      const OptimizerOptions& opt, bool scaled = false,
                                      plx_dtype compute = PLX_F32,
                                      const LossScaling* loss_scaling = nullptr,
                                      const std::vector<std::string>& recompute = {},
                                      double label_smoothing = 0);

}  // namespace plexus
