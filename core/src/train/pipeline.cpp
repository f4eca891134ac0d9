#include "pipeline.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <cmath>
#include <cstring>
#include <set>

#include "plexus/backend.hpp"
#include "plexus/communicator.hpp"
#include "plexus/data.hpp"
#include "plexus/error.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus {

namespace {

// Every layer's output shape for a batch of `rows` (a throwaway graph: shapes only).
std::vector<LayerSummary> layer_shapes(const OpRegistry& ops, const ModelSpec& spec,
                                       const std::vector<int64_t>& sample, int64_t rows) {
  Graph g(ops);
  Shape xs = {rows};
  xs.insert(xs.end(), sample.begin(), sample.end());
  std::vector<LayerSummary> summary;
  build_model(g, spec, g.input("x", TensorDesc{PLX_F32, xs}), true, &summary);
  return summary;
}

// The input of stage `s` for a batch of `rows`: the batch (f32), or layer cuts[s]-1's output in
// the compute dtype (a 16-bit stage sends its activations, and their gradients come back, in 16
// bits: the next stage would cast them to that first anyway).
TensorDesc stage_input(const PipelinePlace& p, const std::vector<LayerSummary>& shapes,
                       const std::vector<int64_t>& sample, int64_t rows, plx_dtype compute) {
  if (p.stage == 0) {
    Shape xs = {rows};
    xs.insert(xs.end(), sample.begin(), sample.end());
    return {PLX_F32, xs};
  }
  return {compute, shapes[static_cast<size_t>(p.cuts[static_cast<size_t>(p.stage)] - 1)].output};
}

// The summed cross-entropy of the logits (cast to f32 first under mixed precision), with
// `label_smoothing` (a training stage's), and the predictions.
Var add_loss(Graph& g, Var logits, int64_t rows, Var* pred, double label_smoothing = 0) {
  const Var labels = g.input("labels", TensorDesc{PLX_I32, {rows}});
  if (g.desc(logits).dtype != PLX_F32)
    logits = g.add1("cast", {logits}, {{"dtype", std::string("f32")}}, "logits.cast");
  Attrs la;
  la.set("reduction", std::string("sum"));
  la.set("ignore_index", static_cast<int64_t>(data::kIgnoreLabel));
  if (label_smoothing > 0) la.set("label_smoothing", label_smoothing);
  const Var loss = g.add("softmax_cross_entropy", {logits, labels}, la, "loss").at(0);
  Attrs aa;
  aa.set("axis", static_cast<int64_t>(1));
  *pred = g.add1("argmax", {logits}, aa, "pred");
  return loss;
}

void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
uint64_t get_u64(const std::string& s, size_t& at) {
  if (at + 8 > s.size()) throw Error("pipeline: truncated tensor message");
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  at += 8;
  return v;
}

}  // namespace

std::vector<int> pipeline_cuts(const ModelSpec& spec, int stages, const std::vector<std::string>& split,
                               const std::vector<LayerSummary>& summary) {
  const int n = static_cast<int>(spec.layers.size());
  if (stages > n)
    throw ConfigError("parallel.pipeline_stages = " + std::to_string(stages) + ": model '" +
                      spec.name + "' has only " + std::to_string(n) + " layers");
  std::map<std::string, int> index;
  for (int i = 0; i < n; ++i) index[spec.layers[static_cast<size_t>(i)].name] = i;
  // valid[c]: stage boundary before layer c is crossed by nothing but layer c-1's output.
  std::vector<bool> valid(static_cast<size_t>(n + 1), true);
  valid[0] = false;
  for (int i = 0; i < n; ++i)
    for (const std::string& in : spec.layers[static_cast<size_t>(i)].inputs) {
      const int src = in == "input" ? -1 : index.at(in);
      // Reading src from layer i crosses every boundary c with src < c - 1 and c <= i.
      for (int c = src + 2; c <= i; ++c) valid[static_cast<size_t>(c)] = false;
    }
  std::vector<int> cuts = {0};
  if (!split.empty()) {
    if (static_cast<int>(split.size()) != stages - 1)
      throw ConfigError("parallel.pipeline_split names " + std::to_string(split.size()) +
                        " layers; " + std::to_string(stages) + " stages need " +
                        std::to_string(stages - 1) + " (the first layer of each stage after the first)");
    for (const std::string& name : split) {
      auto it = index.find(name);
      if (it == index.end())
        throw ConfigError("parallel.pipeline_split: model '" + spec.name + "' has no layer '" + name + "'");
      if (it->second <= cuts.back())
        throw ConfigError("parallel.pipeline_split: layer '" + name +
                          "' does not come after the previous stage's first layer");
      if (!valid[static_cast<size_t>(it->second)])
        throw ConfigError("parallel.pipeline_split: a stage cannot start at layer '" + name +
                          "': a residual connection crosses that point");
      cuts.push_back(it->second);
    }
  } else {
    std::vector<int64_t> cum(static_cast<size_t>(n + 1), 0);  // parameters before layer c
    for (int i = 0; i < n; ++i)
      cum[static_cast<size_t>(i + 1)] = cum[static_cast<size_t>(i)] + summary[static_cast<size_t>(i)].parameters;
    const double total = static_cast<double>(cum.back());
    for (int k = 1; k < stages; ++k) {
      const double target = total * k / stages;
      int best = -1;
      // Leave at least one layer for each stage after this one.
      for (int c = cuts.back() + 1; c <= n - (stages - k); ++c) {
        if (!valid[static_cast<size_t>(c)]) continue;
        if (best < 0 || std::abs(static_cast<double>(cum[static_cast<size_t>(c)]) - target) <
                            std::abs(static_cast<double>(cum[static_cast<size_t>(best)]) - target))
          best = c;
      }
      if (best < 0)
        throw ConfigError("parallel.pipeline_stages = " + std::to_string(stages) + ": model '" +
                          spec.name + "' has no place for stage " + std::to_string(k) +
                          " to start that no residual connection crosses");
      cuts.push_back(best);
    }
  }
  cuts.push_back(n);
  return cuts;
}

PipelineStage::PipelineStage(Backend& backend, int32_t device, const OpRegistry& ops,
                             const ModelSpec& spec, const std::vector<int64_t>& sample, int64_t rows,
                             const PipelinePlace& place, const OptimizerOptions* opt,
                             CommGroup& pipe, CommGroup* data, TensorStore& store,
                             const ExecutableOptions& eo, plx_dtype compute,
                             const LossScaling* scaling, LossScaler* scaler,
                             double label_smoothing)
    : backend_(backend), device_(device), place_(place), pipe_(pipe), data_(data),
      training_(opt != nullptr), rows_(rows), scaler_(opt ? scaler : nullptr) {
  if (!training_) scaling = nullptr;
  if (scaling && !scaler_) throw Error("pipeline stage: loss scaling needs the host's scaler");
  sample_ = 1;
  for (int64_t d : sample) sample_ *= d;
  const int m = training_ ? place.micro_batches : 1;
  if (m < 1 || rows % m != 0)
    throw ConfigError("parallel.micro_batches = " + std::to_string(m) + " does not divide the " +
                      std::to_string(rows) + " rows each pipeline gets per step (train.batch_size " +
                      "over the data-parallel ranks)");
  micro_rows_ = rows / m;
  const std::vector<LayerSummary> shapes = layer_shapes(ops, spec, sample, micro_rows_);
  const TensorDesc in_desc = stage_input(place, shapes, sample, micro_rows_, compute);
  const char* in_name = place.first() ? "x" : "act_in";
  // The model's input: the batch cast to the compute dtype on the first stage (build_step's
  // "x.cast"); the layers then run in it with f32 masters (build_model).
  auto model_input = [&](Graph& g) {
    const Var in = g.input(in_name, in_desc);
    if (!place.first() || compute == PLX_F32) return in;
    return g.add1("cast", {in}, {{"dtype", std::string(dtype_name(compute))}}, "x.cast");
  };
  BuildRange range;
  range.first = place.cuts[static_cast<size_t>(place.stage)];
  range.last = place.cuts[static_cast<size_t>(place.stage + 1)];

  if (!training_) {
    fwd_g_ = std::make_unique<Graph>(ops);
    Graph& g = *fwd_g_;
    const Var y = build_model(g, spec, model_input(g), false, nullptr, range);
    if (place.last()) {
      Var pred;
      g.mark_output(add_loss(g, y, micro_rows_, &pred), "loss_value");
      g.mark_output(pred, "predictions");
    } else {
      g.mark_output(y, "act_out");
    }
    fwd_ = std::make_unique<Executable>(backend, g, store, eo);
    if (!place.first()) stash_.push_back(Tensor::empty(backend, in_desc.shape, in_desc.dtype, device));
    return;
  }

  // Forward (not the last stage).
  if (!place.last()) {
    fwd_g_ = std::make_unique<Graph>(ops);
    Graph& g = *fwd_g_;
    g.mark_output(build_model(g, spec, model_input(g), true, nullptr, range), "act_out");
  }
  // Backward: the forward again, then reverse mode.
  bwd_g_ = std::make_unique<Graph>(ops);
  Graph& g = *bwd_g_;
  BuildRange rr = range;
  rr.state_prefix = kRecomputePrefix;
  const Var x = model_input(g);
  const Var y = build_model(g, spec, x, true, nullptr, rr);
  std::vector<Var> params = g.parameters();
  std::vector<Var> wrt = params;
  if (!place.first()) wrt.push_back(x);
  std::vector<Var> grads;
  if (place.last()) {
    // The summed loss times one over the global batch's real rows (the input loss_scale), and
    // in f16 times the loss scale S: backward starts from their product (as build_step's), and
    // the reported loss's mul comes after it.
    Var pred;
    const Var loss = add_loss(g, y, micro_rows_, &pred, label_smoothing);
    const Var rows_scale = g.input(kLossScaleInput, TensorDesc{PLX_F32, {}});
    const Var seed = scaling ? g.add1("mul", {rows_scale, loss_scaler_state(g, "scale", *scaling)},
                                      {}, "loss.seed")
                             : rows_scale;
    grads = plexus::backward(g, loss, wrt, seed);
    g.mark_output(g.add1("mul", {loss, rows_scale}, {}, "loss.scale"), "loss_value");
    g.mark_output(pred, "predictions");
  } else {
    grads = plexus::backward(g, y, wrt, g.input("seed", g.desc(y)));
  }
  if (!place.first()) {
    if (!grads.back().valid())
      throw ConfigError("pipeline stage " + std::to_string(place.stage) +
                        ": the loss does not depend on the stage's input");
    g.mark_output(grads.back(), "grad_in");
    grads.pop_back();
  }
  // Update: the optimizer over the summed gradients, given as inputs.
  upd_g_ = std::make_unique<Graph>(ops);
  Graph& u = *upd_g_;
  std::vector<Var> up, ug;
  std::vector<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    const GraphValue& pv = g.value(params[i]);
    parameters_ += pv.desc.numel();
    if (!grads[i].valid()) continue;  // not on the loss's path: SGD would leave it anyway
    g.mark_output(grads[i], "grad." + pv.name);
    up.push_back(u.parameter(pv.name, pv.desc, pv.init));
    ug.push_back(u.input("grad." + pv.name, pv.desc));
    names.push_back(pv.name);
  }
  // f16: the summed gradients (times S) are unscaled and checked as in build_step; every stage's
  // check is summed over the pipeline before its updates read it (a hook after the check's
  // kernel), so the stages skip the same steps and keep one scale.
  Var check;
  if (scaling)
    check = add_scaled_update(u, up, ug, *opt, *scaling, spec.name);
  else
    add_optimizer(u, up, ug, *opt);

  if (fwd_g_) fwd_ = std::make_unique<Executable>(backend, *fwd_g_, store, eo);
  bwd_ = std::make_unique<Executable>(backend, g, store, eo);
  ExecutableOptions ueo = eo;
  if (check.valid()) ueo.exchanged.push_back(check);
  upd_ = std::make_unique<Executable>(backend, u, store, ueo);
  if (check.valid()) {
    report_ = upd_->tensor(kLossScaleReport);
    const Tensor total = upd_->tensor(check);
    CommGroup* over = &pipe_;
    upd_->add_hook(upd_->producer_kernel(check), Executable::HookPoint::After,
                   [over, total] { over->all_reduce(total, PLX_REDUCE_SUM); });
  }
  uint64_t ws = 0;
  for (const std::string& name : names) {
    const Tensor mine = bwd_->tensor("grad." + name), sum = upd_->tensor("grad." + name);
    adds_.push_back(prepare_kernel(backend, ops, "add", {}, {sum, mine}, {sum}, device,
                                   "pipeline gradient accumulation"));
    ws = std::max(ws, adds_.back()->workspace_bytes());
    grads_.emplace_back(mine, sum);
  }
  if (ws) add_ws_ = Tensor::empty(backend, {static_cast<int64_t>(ws)}, PLX_U8, device);
  if (!place.first())
    for (int k = 0; k < m; ++k) stash_.push_back(Tensor::empty(backend, in_desc.shape, in_desc.dtype, device));
}

PipelineStage::~PipelineStage() = default;

uint64_t PipelineStage::planned_bytes() const {
  uint64_t n = 0;
  for (const Executable* e : {fwd_.get(), bwd_.get(), upd_.get()})
    if (e) n += e->plan().total_bytes();
  return n;
}

uint64_t PipelineStage::device_bytes() const {
  uint64_t n = add_ws_.defined() ? add_ws_.nbytes() : 0;
  for (const Tensor& t : stash_) n += t.nbytes();
  return n;
}

void PipelineStage::sync() { backend_.sync(device_); }

// Micro-batch k's input into `exe`: its rows of the batch (the first stage) or the activation
// received for it.
void PipelineStage::load_input(Executable& exe, int k, const data::Batch& b) {
  if (place_.first()) {
    Tensor x = exe.tensor("x");
    const int64_t per_row = x.numel() / x.shape()[0], first_row = k * micro_rows_;
    if (b.images.size() < static_cast<size_t>((first_row + x.shape()[0]) * per_row))
      throw Error("pipeline: the batch has no images for the first stage");
    x.copy_from_host(b.images.data() + first_row * per_row);
    return;
  }
  const Tensor in = exe.tensor("act_in");
  const Tensor& from = stash_[static_cast<size_t>(training_ ? k : 0)];
  backend_.copy(device_, in.data(), from.data(), in.nbytes(), PLX_COPY_D2D, exe.stream());
}

void PipelineStage::forward(int k, const data::Batch& b) {
  load_input(*fwd_, k, b);
  fwd_->run();
}

void PipelineStage::backward(int k, const data::Batch& b) {
  Executable& g = *bwd_;
  load_input(g, k, b);
  if (place_.last()) {
    g.tensor("labels").copy_from_host(b.labels.data() + k * micro_rows_);
    const float scale = b.global_real > 0 ? 1.0f / static_cast<float>(b.global_real) : 0.0f;
    g.tensor(kLossScaleInput).copy_from_host(&scale);
  }
  g.run();
  accumulate(k);
  if (place_.last()) {
    g.sync();
    float loss = 0;
    g.tensor("loss_value").copy_to_host(&loss);
    std::vector<int64_t> pred(static_cast<size_t>(micro_rows_));
    g.tensor("predictions").copy_to_host(pred.data());
    outcome_.loss += loss;
    for (int64_t r = 0; r < micro_rows_; ++r) {
      const int32_t label = b.labels[static_cast<size_t>(k * micro_rows_ + r)];
      if (label != data::kIgnoreLabel && pred[static_cast<size_t>(r)] == label) ++outcome_.hits;
    }
  }
}

void PipelineStage::accumulate(int k) {
  void* ws = add_ws_.defined() ? add_ws_.data() : nullptr;
  plx_stream s = bwd_->stream();
  for (size_t i = 0; i < grads_.size(); ++i) {
    const auto& [mine, sum] = grads_[i];
    if (k == 0) {
      backend_.copy(device_, sum.data(), mine.data(), sum.nbytes(), PLX_COPY_D2D, s);
    } else {
      const plx_tensor in[2] = {sum.view(), mine.view()};
      const plx_tensor out = sum.view();
      adds_[i]->run(in, 2, &out, 1, ws, s);
    }
  }
}

void PipelineStage::run_eval(const data::Batch& b) {
  Executable& f = *fwd_;
  const int prev = place_.stage - 1, next = place_.stage + 1;
  if (!place_.first()) pipe_.recv(stash_[0], prev);
  load_input(f, 0, b);
  if (place_.last()) f.tensor("labels").copy_from_host(b.labels.data());
  f.run();
  if (!place_.last()) {
    pipe_.send(f.tensor("act_out"), next);
    f.sync();
    return;
  }
  f.sync();
  float loss = 0;
  f.tensor("loss_value").copy_to_host(&loss);
  std::vector<int64_t> pred(static_cast<size_t>(rows_));
  f.tensor("predictions").copy_to_host(pred.data());
  outcome_.loss = loss;
  for (int64_t r = 0; r < rows_; ++r) {
    const int32_t label = b.labels[static_cast<size_t>(r)];
    if (label != data::kIgnoreLabel && pred[static_cast<size_t>(r)] == label) ++outcome_.hits;
  }
}

void PipelineStage::launch(const data::Batch& b, double lr, double step) {
  if (have_) throw Error("pipeline stage: launch with a step in flight");
  if (b.rows != rows_)
    throw Error("pipeline stage: batch of " + std::to_string(b.rows) + " rows for a step of " +
                std::to_string(rows_));
  const auto t0 = std::chrono::steady_clock::now();
  outcome_ = StepOutcome{};
  outcome_.index = b.index;
  outcome_.lr = lr;
  if (place_.last()) outcome_.real = b.real;
  if (!training_) {
    run_eval(b);
  } else {
    const auto write_scalar = [&](const char* name, double v) {
      if (!upd_->graph().find(name).valid()) return;
      const float f = static_cast<float>(v);
      upd_->tensor(name).copy_from_host(&f);
    };
    write_scalar(kLearningRateInput, lr);
    write_scalar(kStepInput, step);
    const int P = place_.stages, s = place_.stage, M = place_.micro_batches;
    const int prev = s - 1, next = s + 1;
    // p2p helpers; a send paired with the receive after it goes in one group.
    auto recv_fwd = [&](int k) {
      if (!place_.first()) pipe_.recv(stash_[static_cast<size_t>(k)], prev);
    };
    auto send_fwd = [&] {
      if (!place_.last()) pipe_.send(fwd_->tensor("act_out"), next);
    };
    auto recv_bwd = [&] {
      if (!place_.last()) pipe_.recv(bwd_->tensor("seed"), next);
    };
    auto send_bwd = [&] {
      if (!place_.first()) pipe_.send(bwd_->tensor("grad_in"), prev);
    };
    auto fwd = [&](int k) {
      if (!place_.last()) forward(k, b);
    };
    auto paired = [&](const std::function<void()>& a, const std::function<void()>& c) {
      pipe_.group_begin();
      a();
      c();
      pipe_.group_end();
    };
    const int warmup = std::min(P - s - 1, M), remaining = M - warmup;
    for (int i = 0; i < warmup; ++i) {
      recv_fwd(i);
      fwd(i);
      send_fwd();
    }
    if (remaining > 0) recv_fwd(warmup);
    for (int i = 0; i < remaining; ++i) {
      const int kf = warmup + i, kb = i;
      fwd(kf);
      paired(send_fwd, recv_bwd);
      backward(kb, b);
      if (i == remaining - 1)
        send_bwd();
      else
        paired(send_bwd, [&] { recv_fwd(kf + 1); });
    }
    for (int i = 0; i < warmup; ++i) {
      recv_bwd();
      backward(remaining + i, b);
      send_bwd();
    }
    if (data_)
      for (const auto& [mine, sum] : grads_) data_->all_reduce(sum, PLX_REDUCE_SUM);
    upd_->run();
    upd_->sync();
    if (report_.defined()) {
      // The loss scale it ran with and whether it skipped; the host's scaler from the rest.
      float r[5];
      report_.copy_to_host(r);
      take_loss_scale_report(r, outcome_, *scaler_);
    }
  }
  outcome_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  have_ = true;
}

StepOutcome PipelineStage::collect() {
  if (!have_) throw Error("pipeline stage: collect with no step in flight");
  have_ = false;
  return outcome_;
}

std::string pack_tensors(const std::vector<CheckpointTensor>& tensors) {
  std::string s;
  put_u64(s, tensors.size());
  for (const CheckpointTensor& t : tensors) {
    put_u64(s, t.name.size());
    s += t.name;
    put_u64(s, static_cast<uint64_t>(t.dtype));
    put_u64(s, t.shape.size());
    for (int64_t d : t.shape) put_u64(s, static_cast<uint64_t>(d));
    put_u64(s, t.data.size());
    s.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  return s;
}

std::vector<CheckpointTensor> unpack_tensors(const std::string& s) {
  size_t at = 0;
  const uint64_t n = get_u64(s, at);
  std::vector<CheckpointTensor> out;
  for (uint64_t i = 0; i < n; ++i) {
    CheckpointTensor t;
    const uint64_t len = get_u64(s, at);
    if (at + len > s.size()) throw Error("pipeline: truncated tensor message");
    t.name = s.substr(at, len);
    at += len;
    t.dtype = static_cast<plx_dtype>(get_u64(s, at));
    const uint64_t nd = get_u64(s, at);
    for (uint64_t d = 0; d < nd; ++d) t.shape.push_back(static_cast<int64_t>(get_u64(s, at)));
    const uint64_t nb = get_u64(s, at);
    if (at + nb > s.size()) throw Error("pipeline: truncated tensor message");
    t.data.assign(s.begin() + static_cast<std::ptrdiff_t>(at), s.begin() + static_cast<std::ptrdiff_t>(at + nb));
    at += nb;
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace plexus
