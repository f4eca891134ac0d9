// Training a model end to end: what `plexus train` runs, as a library call.
//
// From a Config, the trainer loads the dataset (a background loader assembles batches), builds
// the training step (model forward, loss, backward, optimizer update) and the evaluation step as
// two graphs sharing one TensorStore, runs the epochs on the configured backend, evaluates each
// epoch, writes metrics (JSON lines), a manifest and an atomic checkpoint into the run directory,
// and stops at the first non-finite loss. docs/training.md describes the run directory and the
// C++ API.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "plexus/config.hpp"
#include "plexus/error.hpp"

namespace plexus {

class Runtime;

// The loss stopped being finite: the run stopped, the last good checkpoint is kept.
class DivergedError : public Error {
 public:
  using Error::Error;
};

struct TrainRequest {
  Config config;
  // Continue the run in `resume_dir` from its checkpoint (the config must agree with the one
  // the run was started with, except for train.epochs, train.max_steps, train.eval, data.prefetch,
  // output and logging keys). Empty: a new run.
  std::string resume_dir;
  std::ostream* out = nullptr;  // progress and summary; null: std::cout
  bool keep_losses = false;     // fill TrainResult::losses (tests)
};

struct EpochMetrics {
  int64_t epoch = 0;
  double train_loss = 0, train_accuracy = 0;
  std::optional<double> test_loss, test_accuracy;
  double seconds = 0, images_per_s = 0;
};

struct TrainResult {
  std::string run_dir;
  int64_t steps = 0;  // steps done in all, including before a resume
  std::vector<EpochMetrics> epochs;  // epochs finished by this call
  std::vector<double> losses;        // every step's loss in this call (keep_losses)
  double seconds = 0;                // wall time of this call's training and evaluation
  double images_per_s = 0;           // training images per second of step time, this call
  // Memory on the device: what the plans of the training and evaluation steps predict (arenas,
  // workspaces, inputs, and the parameters, states and optimizer moments they create) plus the
  // step pipelines' staging buffers and any data set resident on the device, and the caching
  // allocator's peak in use over the run (size classes round each block up).
  uint64_t planned_bytes = 0;
  uint64_t parameter_bytes = 0;  // of which the store: parameters, states, optimizer moments
  uint64_t peak_bytes = 0;
  // Data parallelism (1 rank: none): the gradient all-reduce's time on this rank's communication
  // thread, and the part of it the steps waited for (not hidden behind backward). On a backend
  // with asynchronous streams both are 0 (the streams are not timed).
  int32_t ranks = 1;
  double comm_seconds = 0, comm_wait_seconds = 0;
  // f16's dynamic loss scaling (0 otherwise): the scale at the end, and the steps skipped in all
  // (including before a resume) because a gradient was not finite.
  double loss_scale = 0;
  int64_t skipped_steps = 0;
  // train.target_accuracy (absent when 0): the first epoch whose test accuracy reached it, the
  // training time to its end without evaluation (each epoch's loop over the training set, as a
  // peer times it) and the wall time since the first epoch began. Both count this call only.
  struct Target {
    double accuracy = 0;  // the target
    bool reached = false;
    int64_t epoch = 0, step = 0;
    double test_accuracy = 0, train_seconds = 0, wall_seconds = 0;
  };
  std::optional<Target> target;
};

// Runs a training as the config says. Throws ConfigError for a bad config or model,
// DataError for a bad dataset, DivergedError at a non-finite loss, and other Errors from the
// backend.
TrainResult train(Runtime& runtime, const TrainRequest& request);

// The run directory output.dir names for `model` ({model} replaced); if it already holds a run,
// the first of dir-2, dir-3, ... that does not, so no run is ever overwritten.
std::string new_run_dir(const std::string& pattern, const std::string& model);

}  // namespace plexus
