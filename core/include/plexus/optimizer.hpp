// Optimizers as graph nodes, and learning-rate schedules.
//
// add_optimizer() appends one update op per parameter (sgd_update or adamw_update, see
// docs/ops.md) after the backward graph, so a training step is one graph: forward, backward and
// update, run (and capturable) as a whole. The learning rate and AdamW's step count are scalar
// graph inputs the host writes before each run; the optimizer's moments are states named after
// their parameter, so they live in the TensorStore and are saved with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plexus/graph.hpp"

namespace plexus {

struct OptimizerOptions {
  std::string kind = "sgd";  // sgd | adamw
  double momentum = 0.9;     // sgd
  double dampening = 0;      // sgd
  bool nesterov = false;     // sgd
  double weight_decay = 0;   // both (AdamW's is decoupled)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
};

// Input names the optimizer reads: a 0-d f32 each.
inline constexpr const char* kLearningRateInput = "lr";
inline constexpr const char* kStepInput = "step";  // adamw: the 1-based step count

// Appends the update of each parameter with a valid gradient (Phase::Update). Adds the input
// "lr" (and "step" for adamw) and the states "<param>.momentum_buffer" (sgd with momentum) or
// "<param>.exp_avg" and "<param>.exp_avg_sq" (adamw), zero-initialised. Throws ConfigError for
// an unknown kind or an option out of range (naming it).
// `check` (valid: f16's loss scaling): each update's input `check`, so that it runs only when
// the value is finite; `step` (valid): the 0-d f32 value AdamW reads as its step count instead
// of the input "step".
void add_optimizer(Graph& g, const std::vector<Var>& params, const std::vector<Var>& grads,
                   const OptimizerOptions& options, Var check = {}, Var step = {});

struct ScheduleOptions {
  std::string kind = "constant";  // constant | step | cosine
  double lr = 0.1;                // the base (peak) learning rate
  int64_t warmup_steps = 0;       // linear warm-up from lr/warmup_steps to lr
  int64_t total_steps = 0;        // cosine: the step where it reaches min_lr
  int64_t step_size = 0;          // step: multiply by gamma every step_size steps
  double gamma = 0.1;             // step
  double min_lr = 0;              // cosine
};

// The learning rate of 0-based step `step`. Throws ConfigError for a bad schedule.
double learning_rate(const ScheduleOptions& s, int64_t step);

}  // namespace plexus
