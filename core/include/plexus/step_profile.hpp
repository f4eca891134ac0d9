// `plexus bench step`: where a training step's time goes. The config's training step is built
// as the trainer builds it (fusion, tuned kernels, recompute, precision) and run on random data;
// after warm-up, N runs go op by op with an event recorded after each kernel, and each kernel's
// median time is reported with its share of the step, by kernel and by op. The same step run
// the trainer's way (captured and replayed where the backend can) is timed beside it, so the
// cost of running op by op with events shows.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace plexus {

class Config;
class Runtime;

struct StepProfileOptions {
  std::string backend;  // "": the config's backend.name
  int32_t device = -1;  // -1: the config's backend.device
  int warmup = 5;       // untimed runs first
  int steps = 10;       // timed runs (medians kept)
  int top = 0;          // kernels listed (0: all)
};

struct StepProfileRow {
  std::string kernel;  // "conv2d_1 conv2d: cpu/im2col_blas", a fused group with its nodes
  std::string op;      // the op, or "fused <name>" for a fused kernel
  double ms = 0;       // median over the timed runs
  double share = 0;    // of the sum of the kernels' medians
};

struct StepProfile {
  std::string backend, device, model, precision;
  int64_t batch = 0;
  int steps = 0;
  double kernels_ms = 0;     // sum of the kernels' medians
  double op_by_op_ms = 0;    // median of the instrumented runs, first event to last
  double step_ms = 0;        // median of the trainer's way of running it (replayed if captured)
  bool captured = false;     // whether the trainer's way replays a captured graph
  // Wall-clock time a step with the trainer's pipeline around it (uploads, the resident data's
  // gather, results read back; two steps in flight), the host's work included.
  double pipeline_ms = 0;
  // The step's memory plan (summed over f16's two graphs): activations after reuse, the
  // kernels' scratch, and the parameters, optimizer states and inputs.
  uint64_t arena_bytes = 0, workspace_bytes = 0, persistent_bytes = 0;
  int32_t channels_last_values = 0;     // activations the layout planner stored NHWC
  std::vector<StepProfileRow> kernels;  // run order
};

// Throws ConfigError for bad options or config, and the backend's errors.
StepProfile profile_step(Runtime& rt, const Config& cfg, const StepProfileOptions& o);
// The report: the step, then the kernels by time (o.top of them), then the ops by time.
void print_step_profile(std::ostream& out, const StepProfile& p, int top);
std::string step_profile_json(const StepProfile& p);

}  // namespace plexus
