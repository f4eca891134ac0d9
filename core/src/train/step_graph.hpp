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

struct StepGraph {
  Graph graph;
  Var loss, pred;
  std::vector<Var> params, grads;  // the training step's
  // Loss scaling splits the training step in two: `graph` ends with the unscaled gradients
  // (outputs named "<parameter>.grad") and their check, and `update` reads them as inputs of
  // the same names and runs the optimizer, only when the check is finite.
  std::unique_ptr<Graph> update;
  explicit StepGraph(const OpRegistry& ops) : graph(ops) {}
};

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
// parameters and the optimizer are f32. `loss_scaling` (a training step): the step is split as
// StepGraph::update describes, with the inputs kGradScaleInput and kGradUnscaleInput and the
// output kGradCheckOutput (step_pipeline.hpp).
// `recompute`: train.recompute, the ops whose outputs backward computes again
// (BackwardOptions::recompute).
std::unique_ptr<StepGraph> build_step(const OpRegistry& ops, const ModelSpec& spec, int64_t batch,
                                      const std::vector<int64_t>& sample, bool training,
                                      const OptimizerOptions& opt, bool scaled = false,
                                      plx_dtype compute = PLX_F32, bool loss_scaling = false,
                                      const std::vector<std::string>& recompute = {});

}  // namespace plexus
