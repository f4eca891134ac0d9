// Feeding training and evaluation steps without waiting on each one (private to the trainer).
//
// The host launches step n+1 before it reads step n's results, so the device never idles on the
// host between steps. Each of two slots holds:
// - a pinned host buffer the batch (or, with the data set resident on the device, just its sample
//   indices and labels) and the step's scalars (lr, step) are written into;
// - a device staging buffer the copy stream fills from it, so the copy of batch n+1 overlaps the
//   step on batch n (with the data set resident: the compute stream, the copy being a few bytes);
// - a pinned buffer the step's loss and predictions come back into, read when its event is done.
// Events order it all: the compute stream waits for the slot's copy, then moves the staged batch
// into the step's fixed input tensors (a gather from the resident data set and one
// device-to-device copy, so a captured step replays with the same addresses), runs the step,
// and copies its results out. Where the backend captures the step, that work is captured with it,
// one graph per slot: with the data set resident a step costs the host one graph launch and an
// event (batches from the host: a copy, an event and a wait besides).
//
// On a backend without streams (the CPU) every copy completes at once and the same code runs in
// order, which is how the tests exercise it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plexus/allocator.hpp"
#include "plexus/backend.hpp"
#include "plexus/data.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/executor.hpp"
#include "plexus/tensor.hpp"

namespace plexus {

// The training set's normalised images and labels on the device, one extra all-zero row labelled
// kIgnoreLabel at the end for padding rows. Batches are gathered from it by sample index.
struct ResidentData {
  Tensor images;  // (n + 1, C*H*W) f32; the labels come with each batch from the host
  int64_t rows = 0;  // n
  uint64_t bytes() const { return images.nbytes(); }
};

// Uploads `loader`'s samples [0, n) normalised as its batches are.
ResidentData make_resident(Backend& backend, int32_t device, const data::Loader& loader,
                           const data::Dataset& ds, int64_t n);

// f16's dynamic loss scaling, PyTorch's GradScaler: the loss is multiplied by `scale` before
// backward and the gradients by 1/scale after it; a step whose gradients hold Inf or NaN is
// skipped (no update) and halves the scale; `window` finite steps in a row double it. The step
// does all of it on the device (build_step, op loss_scale_update) in the states named
// kLossScalerPrefix + scale, unscale, good, skipped and (AdamW) step. This is the host's copy,
// for the metrics and the checkpoint: StepPipeline brings it up to date from each step's report.
struct LossScaler {
  double scale = 65536;
  int64_t window = 2000;
  int64_t good = 0;     // finite steps since the scale last changed
  int64_t skipped = 0;  // steps skipped in all
};

// The prefix of the loss scaler's states in the TensorStore. A checkpoint leaves them out: its
// meta entries hold the scaler (so that it resumes in any precision), and write_loss_scaler()
// puts them back.
inline constexpr const char* kLossScalerPrefix = "loss_scaler.";
// The training step's output that loss_scale_update writes: [the scale the step ran with, 1 if
// it was skipped else 0, and after it: the scale, the count of finite steps, the skipped steps].
inline constexpr const char* kLossScaleReport = "loss_scale_report";

// Writes `s` into the step's scaler states of `store` (those it has), with the optimizer's step
// count after `steps_done` steps of which s.skipped were skipped.
void write_loss_scaler(TensorStore& store, const LossScaler& s, int64_t steps_done);

struct StepOutcome {
  double loss = 0;
  int64_t hits = 0;      // correct predictions among the real rows
  int64_t real = 0;      // rows holding samples
  int64_t index = 0;     // the batch's index within its epoch
  double lr = 0;         // the learning rate it ran with
  double seconds = 0;    // since the previous step's results were in (or its launch)
  double loss_scale = 0;  // the loss scale it ran with (loss scaling only)
  bool skipped = false;   // its gradients were not finite: no update (loss scaling only)
};

// A step's kLossScaleReport (5 values) into its outcome (the scale it ran with, skipped) and the
// host's scaler (the scale, the finite steps in a row and the skipped steps after it).
void take_loss_scale_report(const float* r, StepOutcome& o, LossScaler& s);

// A training step's 0-d f32 input that scales its summed loss under data parallelism: one over
// the rows holding samples in the whole global batch (every rank's slice), written per step.
inline constexpr const char* kLossScaleInput = "loss_scale";

// What the trainer drives, a step at a time: StepPipeline feeds one executable; a pipeline
// stage (pipeline.hpp) runs its part of a micro-batched step.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Enqueues (or runs) a step on `b`. With every slot in flight, collect() first.
  virtual void launch(const data::Batch& b, double lr, double step) = 0;
  // Waits for the oldest step in flight and returns its results.
  virtual StepOutcome collect() = 0;
  virtual int in_flight() const = 0;
  virtual bool full() const = 0;
  // Device memory held beside the executables' plans.
  virtual uint64_t device_bytes() const = 0;
};

// A kernel for `op` on these tensors, resolved once (the step's helpers: gathers, casts, adds).
// OpError naming `what` and the backend's reasons when it has none.
std::unique_ptr<PreparedKernel> prepare_kernel(Backend& backend, const OpRegistry& ops, const char* op,
                                               const Attrs& attrs, const std::vector<Tensor>& in,
                                               const std::vector<Tensor>& out, int32_t device,
                                               const std::string& what);

// Sets eo.input_block to the step's inputs StepPipeline fills from each slot, so that one copy
// fills them all: the labels and scalars, x when batches come from the host (`resident` false),
// and with the data set resident a head for the sample indices of `rows` rows.
void place_step_inputs(ExecutableOptions& eo, bool resident, int64_t rows);

class StepPipeline : public StepRunner {
 public:
  // `resident` may be null (batches come from the host). The executable's graph has inputs "x"
  // and "labels", optionally "lr", "step" and "loss_scale", and outputs "loss_value" and
  // "predictions".
  //
  // Loss scaling (`scaler` given): the graph also has the output kLossScaleReport, which comes
  // back with the loss; collect() brings `scaler` up to date from it. Nothing waits between the
  // launches.
  StepPipeline(Backend& backend, int32_t device, Executable& exe, const OpRegistry& ops,
               const ResidentData* resident, LossScaler* scaler = nullptr);
  ~StepPipeline();
  StepPipeline(const StepPipeline&) = delete;
  StepPipeline& operator=(const StepPipeline&) = delete;

  // Enqueues a step on `b`. Both slots in flight: collect() first (launch throws otherwise).
  void launch(const data::Batch& b, double lr, double step) override;
  int in_flight() const override { return in_flight_; }
  // Device memory the pipeline holds (staging buffers, gathered labels, workspace): what the
  // memory report adds to the executables' plans.
  uint64_t device_bytes() const override;
  bool full() const override { return in_flight_ == kSlots; }
  // Waits for the oldest step in flight and returns its results. Raises the backend's errors
  // (a kernel's data error surfaces here).
  StepOutcome collect() override;

 private:
  static constexpr int kSlots = 2;
  static constexpr int kReport = 5;   // loss_scale_update's report
  struct Slot {
    MemoryBlock* pinned_in = nullptr;   // or host_in when the backend has no pinned memory
    MemoryBlock* pinned_out = nullptr;
    std::vector<unsigned char> host_in, host_out;
    unsigned char* in = nullptr;
    unsigned char* out = nullptr;
    Tensor staging;  // device copy of `in` (none when it goes straight into the input block)
    plx_event staged = nullptr, done = nullptr;
    std::vector<int32_t> labels;
    int64_t real = 0, index = 0;
    double lr = 0;
  };
  void release() noexcept;

  Backend& backend_;
  int32_t device_;
  Executable& exe_;
  const ResidentData* resident_;
  plx_stream compute_ = nullptr, copy_ = nullptr;
  Tensor x_, labels_, lr_, step_, scale_, loss_, pred_;
  // Loss scaling: the host's copy of the scaler and the step's report.
  LossScaler* scaler_ = nullptr;
  Tensor report_;
  uint64_t x_bytes_ = 0, labels_bytes_ = 0, in_bytes_ = 0, out_bytes_ = 0;
  uint64_t report_at_ = 0;  // where the report lands in a slot's output
  // Where each input lies in a slot's input (the sample indices at 0), and the device copies
  // that move them from the staging into the step's inputs (one where they share a block).
  uint64_t x_at_ = 0, labels_at_ = 0, lr_at_ = 0, step_at_ = 0, scale_at_ = 0;
  struct Copy {
    void* dst;
    uint64_t at, bytes;
  };
  std::vector<Copy> copies_;
  // The slot's copies and gather are recorded with the captured step (Executable::Around).
  bool capture_io_ = false;
  // Resident data and one input block with the indices' head: a slot is uploaded into the block
  // itself, where the gather reads the indices.
  bool direct_ = false;
  Tensor indices(const Slot& s) const;  // the sample indices the gather reads
  int64_t rows_ = 0;
  // Resident data: gather kernels (embedding) and the label cast.
  std::unique_ptr<PreparedKernel> gather_images_;
  Tensor workspace_;
  Slot slots_[kSlots];
  int next_ = 0, in_flight_ = 0;
  std::chrono::steady_clock::time_point last_;
  bool have_last_ = false;
};

}  // namespace plexus
