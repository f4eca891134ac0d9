#include "step_pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <spdlog/spdlog.h>

#include "plexus/error.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/optimizer.hpp"
#include "plexus/runtime.hpp"
#include "plexus/watchdog.hpp"

namespace plexus {

namespace {

plx_tensor desc_of(const Tensor& t) {
  plx_tensor v = t.view();
  v.data = nullptr;
  return v;
}

}  // namespace

std::unique_ptr<PreparedKernel> prepare_kernel(Backend& backend, const OpRegistry& ops, const char* op,
                                               const Attrs& given, const std::vector<Tensor>& in,
                                               const std::vector<Tensor>& out, int32_t device,
                                               const std::string& what) {
  const OpSchema* schema = ops.find(op);
  if (!schema) throw OpError(std::string("no op '") + op + "' registered");
  std::vector<plx_tensor> i, o;
  for (const Tensor& t : in) i.push_back(desc_of(t));
  for (const Tensor& t : out) o.push_back(desc_of(t));
  KernelResolution r = resolve_kernel(backend, *schema, i, o, schema->complete_attrs(given), device);
  if (!r.kernel) {
    std::string why;
    for (const auto& d : r.declines) why += "; " + d;
    throw OpError(what + " on " + backend.name() + ": no kernel for '" + op + "'" + why);
  }
  return std::move(r.kernel);
}

void place_step_inputs(ExecutableOptions& eo, bool resident, int64_t rows) {
  eo.input_block = {"labels", kLearningRateInput, kStepInput, kLossScaleInput};
  if (!resident) eo.input_block.insert(eo.input_block.begin(), "x");
  eo.input_block_head = resident ? static_cast<uint64_t>(rows) * sizeof(int32_t) : 0;
}

ResidentData make_resident(Backend& backend, int32_t device, const data::Loader& loader,
                           const data::Dataset& ds, int64_t n) {
  int64_t d = 1;  // values per sample
  for (int64_t x : ds.sample_shape) d *= x;
  std::vector<float> images(static_cast<size_t>((n + 1) * d), 0.0f);
  for (int64_t i = 0; i < n; ++i) loader.normalise(i, images.data() + i * d);
  ResidentData r;
  r.rows = n;
  r.images = Tensor::from_host(backend, images.data(), {n + 1, d}, PLX_F32, device);
  return r;
}

void write_loss_scaler(TensorStore& store, const LossScaler& s, int64_t steps_done) {
  const std::string p = kLossScalerPrefix;
  auto put = [&](const std::string& name, double v) {
    if (!store.contains(p + name)) return;
    const float f = static_cast<float>(v);
    Tensor t = store.get(p + name);  // a handle: the copy writes the stored tensor
    t.copy_from_host(&f);
  };
  put("scale", s.scale);
  put("unscale", 1.0 / s.scale);
  put("good", static_cast<double>(s.good));
  put("skipped", static_cast<double>(s.skipped));
  put("step", static_cast<double>(steps_done - s.skipped + 1));
}

void take_loss_scale_report(const float* r, StepOutcome& o, LossScaler& s) {
  o.loss_scale = r[0];
  o.skipped = r[1] != 0;
  s.scale = r[2];
  s.good = static_cast<int64_t>(r[3]);
  s.skipped = static_cast<int64_t>(r[4]);
}

StepPipeline::StepPipeline(Backend& backend, int32_t device, Executable& exe, const OpRegistry& ops,
                           const ResidentData* resident, LossScaler* scaler)
    : backend_(backend), device_(device), exe_(exe), resident_(resident), scaler_(scaler) {
  const Graph& g = exe.graph();
  x_ = exe.tensor("x");
  labels_ = exe.tensor("labels");
  if (g.find(kLearningRateInput).valid()) lr_ = exe.tensor(kLearningRateInput);
  if (g.find(kStepInput).valid()) step_ = exe.tensor(kStepInput);
  if (g.find(kLossScaleInput).valid()) scale_ = exe.tensor(kLossScaleInput);
  if (scaler_) {
    if (!g.find(kLossScaleReport).valid())
      throw Error("step pipeline: loss scaling, but the step has no output " +
                  std::string(kLossScaleReport));
    report_ = exe.tensor(kLossScaleReport);
    if (report_.dtype() != PLX_F32 || report_.numel() != kReport)
      throw Error("step pipeline: the loss scale's report is not 5 f32 values");
  }
  loss_ = exe.tensor("loss_value");
  pred_ = exe.tensor("predictions");
  if (x_.dtype() != PLX_F32 || labels_.dtype() != PLX_I32 || loss_.dtype() != PLX_F32 ||
      pred_.dtype() != PLX_I64 || (lr_.defined() && lr_.dtype() != PLX_F32) ||
      (step_.defined() && step_.dtype() != PLX_F32) || (scale_.defined() && scale_.dtype() != PLX_F32))
    throw Error("step pipeline: the step's inputs and outputs have unexpected dtypes");
  rows_ = labels_.numel();
  x_bytes_ = x_.nbytes();
  labels_bytes_ = labels_.nbytes();
  // Slot input layout: the sample indices (resident data) | the inputs the step reads as they
  // are: x (batches from the host), the labels and the scalars (lr, step, loss scale). The labels
  // come from the host either way (a few bytes a row): gathering them on the device would cost
  // two launches a step (a gather and a cast to i32). Where the executable holds those inputs in
  // one block (ExecutableOptions::input_block, place_step_inputs), the slot mirrors the block:
  // - with the data resident and the block's head holding the indices, the slot is uploaded
  //   straight into the block on the compute stream (a kilobyte; direct_);
  // - otherwise into a staging buffer on the copy stream, and one copy moves it into the block;
  // without a block each input is copied on its own.
  std::vector<Tensor*> fed = {&labels_};
  if (!resident_) fed.insert(fed.begin(), &x_);
  for (Tensor* t : {&lr_, &step_, &scale_})
    if (t->defined()) fed.push_back(t);
  const uint64_t head = resident_ ? static_cast<uint64_t>(rows_) * sizeof(int32_t) : 0;
  const Tensor& block = exe.input_block();
  auto block_offset = [&](const Tensor* t) -> int64_t {  // -1: not inside the block
    if (!block.defined()) return -1;
    const auto* b = static_cast<const unsigned char*>(block.data());
    const auto* p = static_cast<const unsigned char*>(t->data());
    return p >= b && p + t->nbytes() <= b + block.nbytes() ? p - b : -1;
  };
  bool one_block = true;
  uint64_t lowest = UINT64_MAX;
  for (const Tensor* t : fed) {
    const int64_t o = block_offset(t);
    one_block = one_block && o >= 0;
    if (o >= 0) lowest = std::min(lowest, static_cast<uint64_t>(o));
  }
  direct_ = resident_ && one_block && lowest >= head;
  std::vector<uint64_t> at(fed.size());
  if (one_block) {
    const uint64_t base = direct_ ? 0 : (head + 255) / 256 * 256;
    for (size_t k = 0; k < fed.size(); ++k) at[k] = base + static_cast<uint64_t>(block_offset(fed[k]));
    if (!direct_) copies_.push_back({block.data(), base, block.nbytes()});
    in_bytes_ = base + block.nbytes();
  } else {
    uint64_t end = head;
    for (size_t k = 0; k < fed.size(); ++k) {
      at[k] = (end + 7) / 8 * 8;
      end = at[k] + fed[k]->nbytes();
      copies_.push_back({fed[k]->data(), at[k], fed[k]->nbytes()});
    }
    in_bytes_ = end;
  }
  auto where = [&](const Tensor& t) -> uint64_t {  // 0 for an input the slot does not carry
    for (size_t k = 0; k < fed.size(); ++k)
      if (fed[k] == &t) return at[k];
    return 0;
  };
  x_at_ = where(x_);
  labels_at_ = where(labels_);
  lr_at_ = where(lr_);
  step_at_ = where(step_);
  scale_at_ = where(scale_);
  // Slot output layout: loss | (pad) | predictions | the loss scale's report.
  report_at_ = sizeof(float) * 2 + pred_.nbytes();
  out_bytes_ = report_at_ + (report_.defined() ? report_.nbytes() : 0);
  compute_ = backend.stream(device);
  // A copy stream only for batches from the host; resident data's few bytes go up on compute_.
  if (!resident_) copy_ = backend.create_stream(device);

  const bool pinned = backend.device(device).caps & PLX_CAP_PINNED;
  try {
    for (Slot& s : slots_) {
      if (pinned) {
        auto& pa = backend.allocator(device, PLX_MEM_PINNED);
        s.pinned_in = pa.allocate(in_bytes_, copy_ ? copy_ : compute_);
        s.pinned_out = pa.allocate(out_bytes_, compute_);
        s.in = static_cast<unsigned char*>(s.pinned_in->ptr);
        s.out = static_cast<unsigned char*>(s.pinned_out->ptr);
      } else {
        s.host_in.resize(in_bytes_);
        s.host_out.resize(out_bytes_);
        s.in = s.host_in.data();
        s.out = s.host_out.data();
      }
      if (!direct_) s.staging = Tensor::empty(backend, {static_cast<int64_t>(in_bytes_)}, PLX_U8, device);
      if (copy_) s.staged = backend.create_event(device);
      s.done = backend.create_event(device);
    }
    if (resident_) {
      auto prepare = [&](Backend& be, const OpRegistry& reg, const char* op, const Attrs& a,
                         const std::vector<Tensor>& in, const std::vector<Tensor>& out, int32_t dev) {
        return prepare_kernel(be, reg, op, a, in, out, dev,
                              "data resident (set data.resident = \"off\" to gather on the host)");
      };
      const int64_t d = x_.numel() / std::max<int64_t>(rows_, 1);
      const Tensor idx = indices(slots_[0]);
      gather_images_ = prepare(backend, ops, "embedding", {}, {resident_->images, idx},
                               {x_.reshape({rows_, d})}, device);
      const uint64_t ws = gather_images_->workspace_bytes();
      if (ws) workspace_ = Tensor::empty(backend, {static_cast<int64_t>(ws)}, PLX_U8, device);
    }
    // A slot's copies in and out (and the gather) are recorded with the captured step where all
    // of it is stream work a graph can hold: copies to and from pinned memory, a capturable gather.
    capture_io_ = pinned && (!gather_images_ || (gather_images_->kernel().flags & PLX_KERNEL_CAPTURABLE));
    spdlog::debug("step pipeline: {} bytes a slot {}, {} device cop{} a step; {}", in_bytes_,
                  direct_ ? "uploaded into the step's input block"
                          : resident_ ? "staged on the compute stream" : "staged on a copy stream",
                  copies_.size(), copies_.size() == 1 ? "y" : "ies",
                  capture_io_ ? "captured with the step where it is captured" : "not captured");
  } catch (...) {
    release();
    throw;
  }
}

StepPipeline::~StepPipeline() { release(); }

Tensor StepPipeline::indices(const Slot& s) const {
  return (direct_ ? exe_.input_block() : s.staging).alias(PLX_I32, {rows_}, 0);
}

uint64_t StepPipeline::device_bytes() const {
  uint64_t n = 0;
  if (workspace_.defined()) n += workspace_.nbytes();
  for (const Slot& s : slots_)
    if (s.staging.defined()) n += s.staging.nbytes();
  return n;
}

void StepPipeline::release() noexcept {
  try {
    if (copy_) backend_.sync_stream(copy_);
    backend_.sync_stream(compute_);
  } catch (...) {
    // The error already reached the step that caused it; what is left is freeing.
  }
  for (Slot& s : slots_) {
    backend_.destroy_event(s.staged);
    backend_.destroy_event(s.done);
    s.staged = s.done = nullptr;
    if (s.pinned_in || s.pinned_out) {
      auto& pa = backend_.allocator(device_, PLX_MEM_PINNED);
      if (s.pinned_in) pa.free(s.pinned_in);
      if (s.pinned_out) pa.free(s.pinned_out);
    }
    s.pinned_in = s.pinned_out = nullptr;
  }
  backend_.destroy_stream(copy_);
  copy_ = nullptr;
}

void StepPipeline::launch(const data::Batch& b, double lr, double step) {
  if (in_flight_ == kSlots) throw Error("step pipeline: launch with every slot in flight");
  if (b.rows != rows_) throw Error("step pipeline: batch of " + std::to_string(b.rows) +
                                   " rows for a step of " + std::to_string(rows_));
  Slot& s = slots_[next_];
  // The slot is free: launch() refuses a third step in flight, so the slot's last step was
  // collected (its event `done` waited for), and its copies and reads of the staging are over.
  // A run of steps is timed from the first launch's start: a backend that runs the step as it
  // is launched (the CPU) would otherwise have it done before the clock starts, and a run of
  // one step (train.max_steps = 1) reported tens of millions of images/s.
  if (!have_last_) {
    last_ = std::chrono::steady_clock::now();
    have_last_ = true;
  }

  if (resident_) {
    auto* idx = reinterpret_cast<int32_t*>(s.in);
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t smp = b.samples[static_cast<size_t>(r)];
      idx[r] = static_cast<int32_t>(smp < 0 ? resident_->rows : smp);  // padding: the zero row
    }
  } else {
    if (b.images.size() * sizeof(float) != x_bytes_)
      throw Error("step pipeline: the batch has no images (data.resident mismatch)");
    std::memcpy(s.in + x_at_, b.images.data(), x_bytes_);
  }
  if (b.labels.size() * sizeof(int32_t) != labels_bytes_)
    throw Error("step pipeline: the batch's labels do not fill the step's");
  std::memcpy(s.in + labels_at_, b.labels.data(), labels_bytes_);
  // Under loss scaling AdamW's step count is the step's own state (a skipped step is no
  // optimizer step), and the graph has no input "step".
  auto put = [&](const Tensor& t, uint64_t at, double v) {
    const float f = static_cast<float>(v);
    if (t.defined()) std::memcpy(s.in + at, &f, sizeof f);
  };
  put(lr_, lr_at_, lr);
  put(step_, step_at_, step);
  put(scale_, scale_at_, b.global_real > 0 ? 1.0 / static_cast<double>(b.global_real) : 0.0);
  s.labels.assign(b.labels.begin(), b.labels.end());
  s.real = b.real;
  s.index = b.index;
  s.lr = lr;

  // Host slot -> device staging: a batch's images on the copy stream, so that they go up while
  // the step before runs; with the data resident, the slot's few bytes on the compute stream
  // (an event wait between the streams would cost more than the copy). Then on the compute
  // stream: staging -> the step's inputs, the step, its results -> the host slot; all of it
  // captured as one graph per slot where capture_io_ holds.
  unsigned char* stage = static_cast<unsigned char*>(direct_ ? exe_.input_block().data() : s.staging.data());
  if (!resident_) {
    backend_.copy(device_, stage, s.in, in_bytes_, PLX_COPY_H2D, copy_);
    backend_.record(s.staged, copy_);
    backend_.wait(compute_, s.staged);
  }
  Executable::Around around;
  around.variant = next_;
  around.capturable = capture_io_;
  around.before = [&] {
    if (resident_) {
      backend_.copy(device_, stage, s.in, in_bytes_, PLX_COPY_H2D, compute_);
      const plx_tensor idx = indices(s).view();
      const int64_t d = x_.numel() / std::max<int64_t>(rows_, 1);
      void* ws = workspace_.defined() ? workspace_.data() : nullptr;
      const plx_tensor gi[2] = {resident_->images.view(), idx};
      const plx_tensor go = x_.reshape({rows_, d}).view();
      gather_images_->run(gi, 2, &go, 1, ws, compute_);
    }
    for (const Copy& c : copies_) backend_.copy(device_, c.dst, stage + c.at, c.bytes, PLX_COPY_D2D, compute_);
  };
  around.after = [&] {
    backend_.copy(device_, s.out, loss_.data(), sizeof(float), PLX_COPY_D2H, compute_);
    backend_.copy(device_, s.out + 2 * sizeof(float), pred_.data(), pred_.nbytes(), PLX_COPY_D2H, compute_);
    if (report_.defined())
      backend_.copy(device_, s.out + report_at_, report_.data(), report_.nbytes(), PLX_COPY_D2H, compute_);
  };
  exe_.run(around);
  backend_.record(s.done, compute_);
  next_ = (next_ + 1) % kSlots;
  ++in_flight_;
}

StepOutcome StepPipeline::collect() {
  if (in_flight_ == 0) throw Error("step pipeline: collect with no step in flight");
  Slot& s = slots_[(next_ - in_flight_ + kSlots) % kSlots];
  {
    // A kernel that hangs would leave the trainer here with nothing said.
    const double limit = backend_.runtime().options().step_timeout_s;
    const WaitWatch watch(limit, [&] {
      return fmt::format(
          "a training step on '{}' has not completed in {:g} s (backend.step_timeout_s), so the "
          "device is taken for stuck and the process exits; a kernel may hang on the device "
          "(backend.check_kernels = true names the kernel)",
          backend_.name(), limit);
    });
    backend_.sync_event(s.done);
  }
  --in_flight_;
  StepOutcome o;
  float loss = 0;
  std::memcpy(&loss, s.out, sizeof loss);
  o.loss = loss;
  o.real = s.real;
  o.index = s.index;
  o.lr = s.lr;
  if (scaler_) {
    // Steps are collected in launch order, so the host's copy follows the device's states.
    float r[kReport];
    std::memcpy(r, s.out + report_at_, sizeof r);
    take_loss_scale_report(r, o, *scaler_);
  }
  const auto* pred = reinterpret_cast<const int64_t*>(s.out + 2 * sizeof(float));
  for (size_t i = 0; i < s.labels.size(); ++i)
    if (s.labels[i] != data::kIgnoreLabel && pred[i] == s.labels[i]) ++o.hits;
  const auto now = std::chrono::steady_clock::now();
  o.seconds = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  if (in_flight_ == 0) have_last_ = false;  // the next launch starts a new run of steps
  return o;
}

}  // namespace plexus
