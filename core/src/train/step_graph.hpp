// What a training run is made of, shared by the trainer and `plexus compare` (private to the
// core): the model and data sets a config names, its optimizer settings, and the training and
// evaluation step graphs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

// train.optimizer and its hyper-parameters.
OptimizerOptions optimizer_options(const Config& cfg);

struct StepGraph {
  Graph graph;
  Var loss, pred;
  std::vector<Var> params, grads;  // the training step's
  explicit StepGraph(const OpRegistry& ops) : graph(ops) {}
};

// The training step: forward, loss (mean over rows not ignored), backward, update.
// The evaluation step: forward in eval mode, summed loss, predictions.
// Inputs "x" (batch, sample...) f32 and "labels" (batch) i32, plus the optimizer's; outputs
// "loss_value" and "predictions". Under data parallelism (`scaled`) the training loss is the sum
// over the rank's rows times the input loss_scale (one over the global batch's real rows), so
// the ranks' gradients add up to the gradient of the global batch's mean loss, however the
// padding rows fall among them.
std::unique_ptr<StepGraph> build_step(const OpRegistry& ops, const ModelSpec& spec, int64_t batch,
                                      const std::vector<int64_t>& sample, bool training,
                                      const OptimizerOptions& opt, bool scaled = false);

}  // namespace plexus
