// Pipeline parallelism (private to the trainer; docs/parallel.md).
//
// The model's layers are cut into stages, one per rank of a pipeline group. A training step's
// local batch is split into micro-batches; each stage runs them on the 1F1B schedule
// (non-interleaved, as Megatron-LM's): warm-up forwards, then one forward and one backward in
// turn, then the remaining backwards. Activations go to the next stage and their gradients back
// with send/recv, a send paired with the receive that follows it (group_begin/group_end) so no two
// stages wait on each other. Each stage holds three executables over one TensorStore:
// - forward: the stage's layers from the received activation (or the batch) to the activation it
//   sends (the last stage has none: its forward is part of its backward);
// - backward: the same layers again from the stashed input (the activations are recomputed, so a
//   micro-batch in flight costs only its input), then reverse mode from the gradient the next
//   stage sent back (the last stage: from its loss), giving the parameters' gradients and the
//   input's gradient to send back. Batch-norm statistics of the recomputation are kept apart
//   (kRecomputePrefix) so the model's are updated once per micro-batch;
// - update: the optimizer over the gradients summed over the micro-batches (and all-reduced over
//   the stage's data-parallel group, if any).
// The last stage's loss is the cross-entropy summed over its rows times one over the global
// batch's real rows, so the sum over micro-batches and ranks is the global batch's mean loss.
// Under mixed precision (train.precision bf16 or f16) each stage computes in the 16-bit type with
// f32 masters, as build_step does, and sends its activations and their gradients in it; in f16
// the last stage's backward starts from the loss scale S, the update unscales and checks the
// summed gradients, and each stage's check is summed over the pipeline (a hook in the update) so
// that every stage skips the same steps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plexus/checkpoint.hpp"
#include "plexus/executor.hpp"
#include "plexus/model.hpp"
#include "plexus/optimizer.hpp"
#include "step_graph.hpp"
#include "step_pipeline.hpp"

namespace plexus {

class CommGroup;

inline constexpr const char* kRecomputePrefix = "pipeline.recompute.";

// Where the model is cut: cuts[s] is stage s's first layer (cuts[0] = 0, cuts[P] = the number of
// layers). `split` names the first layers of stages 1..P-1; empty: cuts that balance the
// parameters. A cut must not be crossed by a residual connection (a layer after it reading one
// before its previous layer). ConfigError naming parallel.pipeline_split and the layer otherwise,
// or when there are fewer layers than stages.
std::vector<int> pipeline_cuts(const ModelSpec& spec, int stages, const std::vector<std::string>& split,
                               const std::vector<LayerSummary>& summary);

struct PipelinePlace {
  int stages = 1, stage = 0;
  int micro_batches = 1;
  std::vector<int> cuts;
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
};

class PipelineStage : public StepRunner {
 public:
  // Training when `opt` is set (micro-batches of rows / place.micro_batches rows), evaluation
  // otherwise (one forward over all `rows`). `data` is the stage's data-parallel group (null:
  // none). The store is shared with the other runner of the same stage.
  // `compute`: train.precision's dtype (the stage's layers run in it with f32 masters, and its
  // activations and their gradients cross stages in it); `scaling` and `scaler` (training in
  // f16): the loss scale, moved on each stage's device alike, and the host's copy of it.
  // `label_smoothing`: train.label_smoothing, the last training stage's loss's.
  PipelineStage(Backend& backend, int32_t device, const OpRegistry& ops, const ModelSpec& spec,
                const std::vector<int64_t>& sample, int64_t rows, const PipelinePlace& place,
                const OptimizerOptions* opt, CommGroup& pipe, CommGroup* data, TensorStore& store,
                const ExecutableOptions& eo, plx_dtype compute = PLX_F32,
                const LossScaling* scaling = nullptr, LossScaler* scaler = nullptr,
                double label_smoothing = 0);
  ~PipelineStage() override;

  // Runs the whole step before it returns (the stages wait on one another anyway).
  void launch(const data::Batch& b, double lr, double step) override;
  StepOutcome collect() override;
  int in_flight() const override { return have_ ? 1 : 0; }
  bool full() const override { return have_; }
  uint64_t device_bytes() const override;
  // What the executables' plans add to the device.
  uint64_t planned_bytes() const;
  // This stage's trained elements.
  int64_t parameters() const { return parameters_; }
  // The graph whose forward reads the stage's batch-norm statistics (training: the recomputing
  // backward's, whose state names carry kRecomputePrefix).
  const Graph& model_graph() const { return bwd_g_ ? *bwd_g_ : *fwd_g_; }
  void sync();

 private:
  void load_input(Executable& exe, int k, const data::Batch& b);
  void forward(int k, const data::Batch& b);
  void backward(int k, const data::Batch& b);
  void accumulate(int k);
  void run_eval(const data::Batch& b);

  Backend& backend_;
  int32_t device_;
  PipelinePlace place_;
  CommGroup& pipe_;
  CommGroup* data_;
  bool training_;
  int64_t rows_ = 0, micro_rows_ = 0, sample_ = 0;
  std::unique_ptr<Graph> fwd_g_, bwd_g_, upd_g_;
  std::unique_ptr<Executable> fwd_, bwd_, upd_;
  std::vector<std::pair<Tensor, Tensor>> grads_;  // (this micro-batch's, the sum) per parameter
  std::vector<std::unique_ptr<PreparedKernel>> adds_;
  Tensor add_ws_;
  std::vector<Tensor> stash_;  // per micro-batch: the received activation (stages after the first)
  int64_t parameters_ = 0;
  LossScaler* scaler_ = nullptr;
  Tensor report_;  // f16: loss_scale_update's
  StepOutcome outcome_;
  bool have_ = false;
};

// Tensors on the wire (a checkpoint gathered from the stages): name, dtype, shape and bytes.
std::string pack_tensors(const std::vector<CheckpointTensor>& tensors);
std::vector<CheckpointTensor> unpack_tensors(const std::string& bytes);

}  // namespace plexus
