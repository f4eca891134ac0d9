#include "plexus/trainer.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "plexus/backend.hpp"
#include "plexus/checkpoint.hpp"
#include "plexus/communicator.hpp"
#include "plexus/data.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/json.hpp"
#include "plexus/model.hpp"
#include "plexus/optimizer.hpp"
#include "plexus/parallel.hpp"
#include "plexus/plugin.hpp"
#include "plexus/progress.hpp"
#include "plexus/run_output.hpp"
#include "plexus/runtime.hpp"
#include "plexus/version.hpp"
#include "pipeline.hpp"
#include "step_graph.hpp"
#include "step_pipeline.hpp"

namespace fs = std::filesystem;

namespace plexus {

namespace {

constexpr const char* kCheckpointFile = "checkpoint.plxckpt";
constexpr const char* kMetricsFile = "metrics.jsonl";
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kCheckpointFormat = "plexus-train/1";

using Clock = std::chrono::steady_clock;
// Seconds as "12.34 s": a time to accuracy is compared to the hundredth (format_duration rounds
// to whole seconds).
std::string format_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f s", s);
  return b;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A key's value as text, for comparing two configs.
std::string value_text(const Config& c, const ConfigKey& k) {
  std::ostringstream s;
  switch (k.type) {
    case ConfigType::Bool: return c.get_bool(k.path) ? "true" : "false";
    case ConfigType::Int: return std::to_string(c.get_int(k.path));
    case ConfigType::Float: s.precision(17); s << c.get_float(k.path); return s.str();
    case ConfigType::String: return "\"" + c.get_string(k.path) + "\"";
    case ConfigType::StringList: {
      for (const auto& v : c.get_strings(k.path)) s << "\"" << v << "\",";
      return "[" + s.str() + "]";
    }
    case ConfigType::Bytes: return std::to_string(c.get_bytes(k.path));
    case ConfigType::Options: return "";
  }
  return "";
}

// Keys a resumed run must share with the run it continues: everything that changes what the
// steps compute.
bool must_match_on_resume(const std::string& key) {
  // Keys that change how steps are run, not what they compute.
  static const std::set<std::string> free = {
      "train.epochs", "train.max_steps", "train.eval", "train.target_accuracy", "data.prefetch",
      "data.resident", "train.graph_capture", "train.fusion", "train.channels_last",
      // master weights are f32 whatever the precision
      "train.precision"};
  if (free.count(key)) return false;
  return key.rfind("model.", 0) == 0 || key.rfind("data.", 0) == 0 || key.rfind("train.", 0) == 0;
}

// data.resident: "on", "off", or "auto" (on for a backend with its own memory when both sets,
// normalised to f32, take at most a quarter of the device's free memory).
bool use_resident(const Config& cfg, Backend& backend, int32_t device, const data::Dataset& train,
                  const data::Dataset* test) {
  const std::string mode = cfg.get_string("data.resident");
  if (mode == "on") return true;
  if (mode == "off") return false;
  const DeviceInfo info = backend.device(device);
  if (info.caps & PLX_CAP_UNIFIED_HOST) return false;  // the host's memory already
  auto bytes = [](const data::Dataset& d) {
    int64_t s = 1;
    for (int64_t x : d.sample_shape) s *= x;
    return static_cast<uint64_t>(d.count + 1) * static_cast<uint64_t>(s + 1) * sizeof(float);
  };
  const uint64_t need = bytes(train) + (test ? bytes(*test) : 0);
  return need <= info.free_memory / 4;
}

ProgressMode progress_mode(const std::string& s) {
  if (s == "bar") return ProgressMode::Bar;
  if (s == "plain") return ProgressMode::Plain;
  if (s == "none") return ProgressMode::None;
  return ProgressMode::Auto;
}

bool holds_run(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / kMetricsFile, ec) || fs::exists(dir / kCheckpointFile, ec) ||
         fs::exists(dir / kManifestFile, ec);
}

// Host copies of the store, for a checkpoint.
Checkpoint snapshot(const TensorStore& store) {
  Checkpoint c;
  for (const auto& [name, t] : store.all()) {
    if (name.rfind(kRecomputePrefix, 0) == 0) continue;  // a stage's scratch statistics
    if (name.rfind(kLossScalerPrefix, 0) == 0) continue;  // in the meta entries (write_loss_scaler)
    CheckpointTensor ct;
    ct.name = name;
    ct.dtype = t.dtype();
    ct.shape = t.shape();
    ct.data.resize(t.nbytes());
    t.copy_to_host(ct.data.data());
    c.tensors.push_back(std::move(ct));
  }
  return c;
}

// A 64-bit FNV-1a digest of a checkpoint's tensors (names, dtypes, shapes and bytes): replicas
// holding the same bits have the same digest.
uint64_t digest(const Checkpoint& c) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const CheckpointTensor& t : c.tensors) {
    mix(t.name.data(), t.name.size());
    mix(&t.dtype, sizeof t.dtype);
    for (int64_t d : t.shape) mix(&d, sizeof d);
    mix(t.data.data(), t.data.size());
  }
  return h;
}

// `partial`: the store holds part of the model (a pipeline stage), so the checkpoint may hold
// tensors it does not.
void restore(TensorStore& store, const Checkpoint& c, const std::string& path, bool partial = false) {
  for (const auto& [name, t] : store.all()) {
    if (name.rfind(kRecomputePrefix, 0) == 0) continue;  // a stage's scratch statistics
    if (name.rfind(kLossScalerPrefix, 0) == 0) continue;  // from the meta entries
    const CheckpointTensor* ct = c.find(name);
    if (!ct) throw Error(path + ": has no tensor '" + name + "', which the model needs");
    if (ct->dtype != t.dtype() || ct->shape != t.shape())
      throw Error(path + ": tensor '" + name + "' is " +
                  desc_string(TensorDesc{ct->dtype, ct->shape}) + ", the model needs " +
                  desc_string(t.desc()));
    Tensor dst = t;
    dst.copy_from_host(ct->data.data());
  }
  if (!partial)
   for (const CheckpointTensor& ct : c.tensors)
    if (!store.contains(ct.name))
      throw Error(path + ": tensor '" + ct.name + "' belongs to no parameter or state of the model");
}

int64_t meta_int(const Checkpoint& c, const std::string& key, const std::string& path) {
  auto it = c.meta.find(key);
  if (it == c.meta.end()) throw Error(path + ": checkpoint has no '" + key + "' entry");
  try {
    size_t used = 0;
    const int64_t v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw Error(path + ": checkpoint entry '" + key + "' is '" + it->second + "', not an integer");
  }
}

// The ranks of a launch and their groups; inactive (size 1) in a single process.
struct Parallel {
  LaunchInfo launch;
  Backend* cpu = nullptr;
  std::unique_ptr<CommGroup> host;  // control values (metrics, positions): cpu buffers, over mpi
  std::unique_ptr<CommGroup> data;  // parameters and gradients, on the training backend (null
                                    // when no other rank holds the same parameters)
  std::unique_ptr<CommGroup> pipe;  // the stages of this rank's pipeline (pipeline parallelism)
  std::string comm;                 // the data and pipeline groups' communicator
  int32_t stages = 1;               // pipeline stages; ranks = stages x data-parallel width
  int32_t width() const { return launch.size / stages; }  // data-parallel ranks per stage
  int32_t stage() const { return launch.rank / width(); }
  int32_t replica() const { return launch.rank % width(); }  // index among the stage's ranks
  bool active() const { return launch.size > 1; }
  int32_t rank() const { return launch.rank; }
  int32_t size() const { return launch.size; }
  bool lead() const { return launch.rank == 0; }
  // Sums `v` over the ranks (exact for integers below 2^53).
  void sum(std::vector<double>& v) const {
    if (!active() || v.empty()) return;
    Tensor t = Tensor::from_host(*cpu, v.data(), {static_cast<int64_t>(v.size())}, PLX_F64, 0);
    host->all_reduce(t, PLX_REDUCE_SUM);
    t.copy_to_host(v.data());
  }
  // Bytes between two ranks of the control group (a pipeline stage's tensors for a checkpoint).
  void send_bytes(const std::string& b, int32_t peer) const {
    double n = static_cast<double>(b.size());
    host->send(Tensor::from_host(*cpu, &n, {1}, PLX_F64, 0), peer);
    if (!b.empty()) host->send(Tensor::from_host(*cpu, b.data(), {static_cast<int64_t>(b.size())}, PLX_U8, 0), peer);
  }
  std::string recv_bytes(int32_t peer) const {
    Tensor n = Tensor::empty(*cpu, {1}, PLX_F64, 0);
    host->recv(n, peer);
    double len = 0;
    n.copy_to_host(&len);
    std::string b(static_cast<size_t>(len), '\0');
    if (!b.empty()) {
      Tensor t = Tensor::empty(*cpu, {static_cast<int64_t>(b.size())}, PLX_U8, 0);
      host->recv(t, peer);
      t.copy_to_host(b.data());
    }
    return b;
  }
  // Rank 0's bytes on every rank.
  void share_bytes(std::string& b) const {
    std::vector<double> n = {static_cast<double>(b.size())};
    share(n);
    b.resize(static_cast<size_t>(n[0]));
    if (b.empty()) return;
    Tensor t = Tensor::from_host(*cpu, b.data(), {static_cast<int64_t>(b.size())}, PLX_U8, 0);
    host->broadcast(t, t, 0);
    t.copy_to_host(b.data());
  }
  // Rank 0's `v` on every rank.
  void share(std::vector<double>& v) const {
    if (!active() || v.empty()) return;
    Tensor t = Tensor::from_host(*cpu, v.data(), {static_cast<int64_t>(v.size())}, PLX_F64, 0);
    host->broadcast(t, t, 0);
    t.copy_to_host(v.data());
  }
};

// Joins the launch's groups: a control group over MPI, and the data group over parallel.comm
// (NCCL's unique id travels over the control group).
void join_groups(Parallel& par, Runtime& rt, const Config& cfg, Backend& backend, int32_t device) {
  const std::string where = "launched as rank " + std::to_string(par.rank()) + " of " +
                            std::to_string(par.size()) + " (" + par.launch.source + ")";
  const auto timeout_ms =
      static_cast<int32_t>(std::clamp(cfg.get_float("parallel.timeout_s") * 1000.0, 1.0, 2.0e9));
  auto find = [&](const std::string& name) -> Communicator& {
    try {
      return rt.communicator(name);
    } catch (const std::exception& e) {
      throw PluginError(where + ": parallel training needs the '" + name +
                        "' communicator plugin: " + e.what());
    }
  };
  par.comm = cfg.get_string("parallel.comm");
  if (par.comm == "auto") par.comm = backend.name() == "cuda" ? "nccl" : "mpi";
  Communicator& mpi = find("mpi");
  Communicator& comm = find(par.comm);
  par.cpu = &rt.backend("cpu");
  par.host = mpi.join(*par.cpu, 0, -1, -1, plx_comm_id{}, timeout_ms);
  if (par.host->rank() != par.rank() || par.host->size() != par.size())
    throw Error(where + ", but MPI says rank " + std::to_string(par.host->rank()) + " of " +
                std::to_string(par.host->size()));
  if (par.stages == 1 && par.comm == "mpi") {
    par.data = mpi.join(backend, device, -1, -1, plx_comm_id{}, timeout_ms);
    return;
  }
  // Rank 0 makes an id per group: one pipeline per data-parallel index, one data group per stage
  // (a single group of the whole launch without pipelines); every rank joins its groups in the
  // same order (MPI sub-groups are made collectively).
  const int32_t W = par.width(), P = par.stages;
  const int32_t n_ids = P > 1 ? W + P : 1;
  std::vector<plx_comm_id> ids(static_cast<size_t>(n_ids));
  if (par.lead())
    for (auto& id : ids) id = comm.unique_id();
  Tensor t = Tensor::from_host(*par.cpu, ids.data(),
                               {static_cast<int64_t>(ids.size() * sizeof(plx_comm_id))}, PLX_U8, 0);
  par.host->broadcast(t, t, 0);
  t.copy_to_host(ids.data());
  if (P == 1) {
    par.data = comm.join(backend, device, par.rank(), par.size(), ids[0], timeout_ms);
    return;
  }
  par.pipe = comm.join(backend, device, par.stage(), P, ids[static_cast<size_t>(par.replica())], timeout_ms);
  if (W > 1)
    par.data = comm.join(backend, device, par.replica(), W,
                         ids[static_cast<size_t>(W + par.stage())], timeout_ms);
}

// A loss scale as people read it: 65536, 0.5.
std::string format_scale(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", s);
  return text;
}

// The states a forward reads (batch-norm statistics), as opposed to the optimizer's moments.
std::vector<std::string> forward_states(const Graph& g) {
  std::set<std::string> names;
  for (const GraphNode& n : g.nodes()) {
    if (n.phase != Phase::Forward) continue;
    for (Var v : n.inputs)
      if (v.valid() && g.value(v).kind == ValueKind::State) names.insert(g.value(v).name);
  }
  return {names.begin(), names.end()};
}

}  // namespace

std::string new_run_dir(const std::string& pattern, const std::string& model) {
  std::string dir = pattern;
  for (size_t p; (p = dir.find("{model}")) != std::string::npos;) dir.replace(p, 7, model);
  if (dir.empty()) throw ConfigError("output.dir: must not be empty");
  if (!holds_run(dir)) return dir;
  for (int i = 2;; ++i) {
    const std::string d = dir + "-" + std::to_string(i);
    if (!holds_run(d)) return d;
  }
}

TrainResult train(Runtime& rt, const TrainRequest& req) {
  const Config& cfg = req.config;
  std::ostream& out = req.out ? *req.out : std::cout;
  const auto t_begin = Clock::now();

  // ---- the model and the data ----
  ModelSpec spec = model_of(cfg);
  const uint64_t seed = static_cast<uint64_t>(cfg.get_int("train.seed"));
  const bool do_eval = cfg.get_bool("train.eval");
  const double target_accuracy = cfg.get_float("train.target_accuracy");
  if (target_accuracy > 0 && !do_eval)
    throw ConfigError(cfg.origin("train.target_accuracy") + ": train.target_accuracy = " +
                      json_number(target_accuracy) + " needs train.eval = true (" +
                      cfg.origin("train.eval") +
                      " turns evaluation off): the target is held to the test accuracy");
  DataSets sets = load_data(cfg, spec, do_eval);
  const data::Dataset& train_set = sets.train;
  const data::Dataset& test_set = sets.test;

  const int64_t batch = cfg.get_int("train.batch_size");  // the global batch
  Backend& backend = rt.select_backend(cfg.get_string("backend.name"));
  // Under a launcher every rank trains on its slice of each batch (data parallelism) and, unless
  // backend.device says otherwise, on the device of its local rank.
  Parallel par;
  par.launch = launch_info();
  int32_t device = static_cast<int32_t>(cfg.get_int("backend.device"));
  if (par.active() && cfg.origin("backend.device") == "default" && backend.device_count() > 0)
    device = par.launch.local_rank % backend.device_count();
  par.stages = static_cast<int32_t>(cfg.get_int("parallel.pipeline_stages"));
  const bool pipelined = par.stages > 1;
  // Mixed precision: the model computes in `compute`, master weights stay f32 (build_step).
  const std::string precision = cfg.get_string("train.precision");
  const plx_dtype compute = compute_dtype(cfg);
  // f16 scales the loss (dynamic loss scaling, on the device: build_step); `scaler` is the
  // host's copy for the metrics and the checkpoint. Under data parallelism every rank checks the
  // same all-reduced gradients, so the ranks skip the same steps and keep the same scale.
  const bool loss_scaling = compute == PLX_F16;
  std::unique_ptr<LossScaler> scaler;
  LossScaling scaling;
  if (loss_scaling) {
    scaler = std::make_unique<LossScaler>();
    scaler->scale = scaling.init = cfg.get_float("train.loss_scale_init");
    scaler->window = scaling.window = cfg.get_int("train.loss_scale_window");
  }
  // TF32 is a property of the kernels prepared after it is set: before the steps are built.
  const bool tf32 = precision == "tf32" && enable_tf32(backend);
  if (pipelined && par.size() % par.stages != 0)
    throw ConfigError("parallel.pipeline_stages = " + std::to_string(par.stages) + " needs a " +
                      "multiple of " + std::to_string(par.stages) + " ranks (one per stage and " +
                      "pipeline); this launch has " + std::to_string(par.size()) +
                      (par.active() ? " (" + par.launch.source + ")"
                                    : ": start it with mpirun -np " + std::to_string(par.stages)));
  if (batch % par.width() != 0)
    throw ConfigError("train.batch_size = " + std::to_string(batch) + " does not divide among the " +
                      std::to_string(par.width()) + " data-parallel ranks of this launch (" +
                      par.launch.source + "=" + std::to_string(par.size()) +
                      (pipelined ? ", " + std::to_string(par.stages) + " pipeline stages" : "") + ")");
  const int64_t local_batch = batch / par.width();
  if (par.active() && cfg.get_bytes("parallel.bucket_size") == 0)
    throw ConfigError("parallel.bucket_size: expected a size in bytes (\"25MiB\"), got a fraction");
  // A pipeline's first stage reads the batch's images from the host; the others only labels.
  const bool resident = !pipelined &&
                        use_resident(cfg, backend, device, train_set, do_eval ? &test_set : nullptr);
  data::LoaderOptions lo;
  lo.images = !resident && (!pipelined || par.stage() == 0);
  lo.batch_size = batch;
  lo.shuffle = cfg.get_bool("data.shuffle");
  lo.seed = seed;
  lo.partial = cfg.get_string("data.partial_batch") == "pad" ? data::PartialBatch::Pad
                                                              : data::PartialBatch::Drop;
  // The readers computed the training set's statistics; the test set is normalised with them too.
  lo.mean = train_set.mean;
  lo.std = train_set.std;
  lo.prefetch = static_cast<int>(cfg.get_int("data.prefetch"));
  lo.limit = cfg.get_int("data.limit");
  lo.shards = par.width();
  lo.shard = par.replica();
  data::Loader train_loader(train_set, lo);
  std::unique_ptr<data::Loader> test_loader;
  if (do_eval) {
    data::LoaderOptions to = lo;
    to.shuffle = false;
    to.partial = data::PartialBatch::Pad;
    to.limit = 0;
    test_loader = std::make_unique<data::Loader>(test_set, to);
  }

  // ---- the steps ----
  const OptimizerOptions opt = optimizer_options(cfg);
  if (par.active()) join_groups(par, rt, cfg, backend, device);
  TensorStore store;
  ExecutableOptions eo;
  eo.device = device;
  eo.seed = seed;
  eo.capture = cfg.get_bool("train.graph_capture");
  eo.fuse = cfg.get_bool("train.fusion");
  eo.channels_last = cfg.get_bool("train.channels_last");
  place_step_inputs(eo, resident, local_batch);  // what StepPipeline fills from one copy
  // The steps' memory is measured from here: the peak in use above what was in use before.
  backend.sync(device);
  backend.allocator(device).reset_peaks();
  const uint64_t mem0 = backend.allocator(device).stats().in_use;

  // One process or data parallelism: one executable per step, fed by a StepPipeline.
  std::unique_ptr<StepGraph> train_model, eval_model;
  std::unique_ptr<Executable> train_exe, eval_exe;
  std::unique_ptr<GradientSync> grad_sync;
  // Pipeline parallelism: this rank's stage runs its part of each step.
  PipelinePlace place;
  std::unique_ptr<PipelineStage> train_stage, eval_stage;
  // Running statistics are rank 0's (per stage): broadcast before each evaluation and checkpoint,
  // as DDP's broadcast_buffers.
  std::vector<std::string> running_states;
  int64_t n_params = 0;
  uint64_t train_plan_bytes = 0;
  std::string stages_text;
  if (pipelined && !recompute_ops(cfg).empty())
    spdlog::warn("train.recompute ({}) is not used with parallel.pipeline_stages > 1: a stage "
                 "already computes its forward again in backward",
                 cfg.origin("train.recompute"));
  if (!pipelined) {
    train_model = build_step(rt.ops(), spec, local_batch, train_set.sample_shape, true, opt,
                             par.active(), compute, loss_scaling ? &scaling : nullptr,
                             recompute_ops(cfg), cfg.get_float("train.label_smoothing"));
    // Data parallelism all-reduces the gradients between their kernels and their readers: no
    // fused kernel may keep one inside (a 16-bit gradient's cast fused into the update that
    // reads it, say).
    ExecutableOptions train_eo = eo;
    if (par.active())
      for (Var v : train_model->grads)
        if (v.valid()) train_eo.exchanged.push_back(v);
    train_exe = std::make_unique<Executable>(backend, train_model->graph, store, train_eo);
    if (do_eval) {
      eval_model = build_step(rt.ops(), spec, local_batch, train_set.sample_shape, false, opt,
                              false, compute);
      eval_exe = std::make_unique<Executable>(backend, eval_model->graph, store, eo);
    }
    // Data parallelism: gradients all-reduced in buckets during backward.
    if (par.active()) {
      GradSyncOptions gso;
      gso.bucket_bytes = cfg.get_bytes("parallel.bucket_size");
      gso.overlap = cfg.get_bool("parallel.overlap");
      std::vector<std::string> names;
      for (Var p : train_model->params) names.push_back(train_model->graph.value(p).name);
      grad_sync = std::make_unique<GradientSync>(*par.data, *train_exe, train_model->grads, names, gso);
      running_states = forward_states(train_model->graph);
    }
    n_params = count_parameters(train_model->graph);
    train_plan_bytes = train_exe->plan().total_bytes();
  } else {
    std::vector<LayerSummary> summary;
    {
      Graph probe(rt.ops());
      Shape xs = {local_batch};
      xs.insert(xs.end(), train_set.sample_shape.begin(), train_set.sample_shape.end());
      build_model(probe, spec, probe.input("x", TensorDesc{PLX_F32, xs}), true, &summary);
      n_params = count_parameters(probe);
    }
    place.stages = par.stages;
    place.stage = par.stage();
    const int64_t mb = cfg.get_int("parallel.micro_batches");
    // Auto: a divisor of the rows from 2P to 4P (the schedule's bubble is (P-1)/(M+P-1)), else
    // the largest below 2P.
    int auto_mb = 1;
    for (int k = 2 * par.stages; k >= 1 && auto_mb == 1; --k)
      if (local_batch % k == 0) auto_mb = k;
    for (int k = 2 * par.stages; k <= 4 * par.stages; ++k)
      if (local_batch % k == 0) {
        auto_mb = k;
        break;
      }
    place.micro_batches = static_cast<int>(mb > 0 ? mb : auto_mb);
    place.cuts = pipeline_cuts(spec, par.stages, cfg.get_strings("parallel.pipeline_split"), summary);
    for (int st = 0; st < par.stages; ++st) {
      const auto& a = spec.layers[static_cast<size_t>(place.cuts[static_cast<size_t>(st)])];
      const auto& z = spec.layers[static_cast<size_t>(place.cuts[static_cast<size_t>(st + 1)] - 1)];
      stages_text += (st ? ", " : "") + ("[" + a.name + (a.name == z.name ? "" : " .. " + z.name) + "]");
    }
    train_stage = std::make_unique<PipelineStage>(
        backend, device, rt.ops(), spec, train_set.sample_shape, local_batch, place, &opt, *par.pipe,
        par.data.get(), store, eo, compute, loss_scaling ? &scaling : nullptr, scaler.get(),
        cfg.get_float("train.label_smoothing"));
    if (do_eval)
      eval_stage = std::make_unique<PipelineStage>(backend, device, rt.ops(), spec, train_set.sample_shape,
                                                   local_batch, place, nullptr, *par.pipe, nullptr,
                                                   store, eo, compute);
    if (par.data)
      for (const std::string& n : forward_states(train_stage->model_graph()))
        running_states.push_back(n.rfind(kRecomputePrefix, 0) == 0 ? n.substr(std::string(kRecomputePrefix).size()) : n);
    train_plan_bytes = train_stage->planned_bytes();
  }

  // Inputs flow through pinned staging on a copy stream, or are gathered from the data set
  // resident on the device; results come back a step late (step_pipeline.hpp).
  std::unique_ptr<ResidentData> train_resident, test_resident;
  if (resident) {
    train_resident = std::make_unique<ResidentData>(
        make_resident(backend, device, train_loader, train_set, train_loader.samples()));
    if (test_loader)
      test_resident = std::make_unique<ResidentData>(
          make_resident(backend, device, *test_loader, test_set, test_loader->samples()));
  }
  std::unique_ptr<StepPipeline> train_feed, eval_feed;
  StepRunner* train_pipe_p = train_stage.get();
  StepRunner* eval_pipe = eval_stage.get();
  if (train_exe) {
    train_feed = std::make_unique<StepPipeline>(backend, device, *train_exe, rt.ops(),
                                                train_resident.get(), scaler.get());
    train_pipe_p = train_feed.get();
  }
  if (eval_exe) {
    eval_feed = std::make_unique<StepPipeline>(backend, device, *eval_exe, rt.ops(), test_resident.get());
    eval_pipe = eval_feed.get();
  }
  StepRunner& train_pipe = *train_pipe_p;
  auto sync_steps = [&] {
    if (train_exe) train_exe->sync();
    if (train_stage) train_stage->sync();
  };

  const int64_t epochs = cfg.get_int("train.epochs");
  const int64_t per_epoch = train_loader.batches_per_epoch();
  ScheduleOptions sched;
  sched.kind = cfg.get_string("train.schedule");
  sched.lr = cfg.get_float("train.lr");
  sched.warmup_steps = static_cast<int64_t>(std::llround(cfg.get_float("train.warmup_epochs") *
                                                         static_cast<double>(per_epoch)));
  sched.total_steps = epochs * per_epoch;
  sched.step_size = cfg.get_int("train.step_epochs") * per_epoch;
  sched.gamma = cfg.get_float("train.gamma");
  sched.min_lr = cfg.get_float("train.min_lr");
  learning_rate(sched, 0);  // a bad schedule fails now, not at the first step

  // ---- the run directory ----
  TrainResult result;
  int64_t epoch = 0, first_batch = 0, step = 0;
  std::string run_dir;
  std::string last_good;  // the checkpoint a failure leaves behind, "" if none yet
  // Rank 0 reads the checkpoint and makes the run directory; the others get the position from it
  // and the tensors by broadcast below.
  std::string resume_tensors;  // pipelines: the checkpoint's tensors, for the other stages
  auto open_run = [&] {
    if (!req.resume_dir.empty()) {
      run_dir = req.resume_dir;
      const std::string path = (fs::path(run_dir) / kCheckpointFile).string();
      if (!fs::exists(path))
        throw Error("--resume " + run_dir + ": no checkpoint there (expected " + path + ")");
      const Checkpoint ck = read_checkpoint(path);
      if (ck.meta.count("format") == 0 || ck.meta.at("format") != kCheckpointFormat)
        throw Error(path + ": not a training checkpoint of this version (format '" +
                    (ck.meta.count("format") ? ck.meta.at("format") : "") + "', expected '" +
                    kCheckpointFormat + "')");
      const Config before = Config::parse(ck.meta.count("config") ? ck.meta.at("config") : "",
                                          path + " (its config)");
      std::string diffs;
      for (const ConfigKey& k : Config::keys()) {
        if (!must_match_on_resume(k.path)) continue;
        const std::string a = value_text(before, k), b = value_text(cfg, k);
        if (a != b) diffs += "\n  " + k.path + ": the run has " + a + ", now " + b;
      }
      if (!diffs.empty())
        throw ConfigError("--resume " + run_dir +
                          ": the config differs from the run's in keys that change what a step "
                          "computes:" + diffs);
      restore(store, ck, path, pipelined);
      if (pipelined) resume_tensors = pack_tensors(ck.tensors);
      epoch = meta_int(ck, "epoch", path);
      first_batch = meta_int(ck, "batch", path);
      step = meta_int(ck, "step", path);
      // The loss scale goes on where it was (a checkpoint of another precision has none).
      if (scaler && ck.meta.count("loss_scale")) {
        scaler->scale = std::stod(ck.meta.at("loss_scale"));
        scaler->good = meta_int(ck, "loss_scale_good", path);
        scaler->skipped = meta_int(ck, "skipped_steps", path);
      }
      if (first_batch < 0 || first_batch > per_epoch || epoch < 0)
        throw Error(path + ": loader position epoch " + std::to_string(epoch) + " batch " +
                    std::to_string(first_batch) + " does not fit " + std::to_string(per_epoch) +
                    " batches per epoch");
      last_good = path;
    } else {
      run_dir = new_run_dir(cfg.get_string("output.dir"), spec.name);
      std::error_code ec;
      fs::create_directories(run_dir, ec);
      if (ec) throw Error("output.dir: cannot create " + run_dir + ": " + ec.message());
    }
  };
  if (par.lead()) {
    // ok, epoch, first batch, step, and the loss scaler's scale, good steps and skipped steps
    std::vector<double> pos(7, 0);
    try {
      open_run();
      pos = {1, static_cast<double>(epoch), static_cast<double>(first_batch), static_cast<double>(step),
             scaler ? scaler->scale : 0, scaler ? static_cast<double>(scaler->good) : 0,
             scaler ? static_cast<double>(scaler->skipped) : 0};
    } catch (...) {
      par.share(pos);  // tells the others to stop
      throw;
    }
    par.share(pos);
  } else {
    std::vector<double> pos(7, 0);
    par.share(pos);
    if (pos[0] != 1)
      throw Error("rank 0 could not " + std::string(req.resume_dir.empty() ? "start" : "resume") +
                  " the run; its error says why");
    epoch = static_cast<int64_t>(pos[1]);
    first_batch = static_cast<int64_t>(pos[2]);
    step = static_cast<int64_t>(pos[3]);
    if (scaler) {
      scaler->scale = pos[4];
      scaler->good = static_cast<int64_t>(pos[5]);
      scaler->skipped = static_cast<int64_t>(pos[6]);
    }
    if (!req.resume_dir.empty()) last_good = (fs::path(req.resume_dir) / kCheckpointFile).string();
  }
  if (pipelined && !req.resume_dir.empty()) {  // each stage takes its tensors from rank 0's read
    par.share_bytes(resume_tensors);
    if (!par.lead()) {
      Checkpoint ck;
      ck.tensors = unpack_tensors(resume_tensors);
      restore(store, ck, "rank 0's checkpoint " + last_good, true);
    }
    resume_tensors.clear();
  }
  if (par.data) broadcast_store(*par.data, store, 0);
  // The step's scaler states start where the run is (the config's scale, or the checkpoint's).
  if (scaler) write_loss_scaler(store, *scaler, step);
  result.run_dir = run_dir;
  const std::string ckpt_path = (fs::path(run_dir) / kCheckpointFile).string();
  // Only rank 0 writes the run's files.
  std::unique_ptr<MetricsWriter> metrics;
  if (par.lead()) metrics = std::make_unique<MetricsWriter>((fs::path(run_dir) / kMetricsFile).string());
  auto emit = [&](const JsonObject& line) {
    if (metrics) metrics->write(line);
  };

  // ---- the manifest ----
  if (par.lead()) {
    JsonObject m;
    m.add("plexus", PLEXUS_VERSION_STRING);
    m.add("git_revision", git_revision());
    m.add("model", spec.name);
    m.add("parameters", n_params);
    m.add("seed", static_cast<int64_t>(seed));
    m.add("backend", backend.name());
    m.add("device", backend.device(device).name);
    JsonArray plugins;
    for (const auto& p : rt.plugins())
      plugins.push(JsonObject().add("name", p->name()).add("version", p->version()).add("path", p->path()));
    m.add("plugins", plugins);
    m.add("dataset", train_set.name);
    m.add("train_samples", train_loader.samples());
    m.add("batches_per_epoch", per_epoch);
    m.add("memory_plan_bytes", static_cast<int64_t>(train_plan_bytes));
    // The training step's plan in parts, and where its arena is fullest (docs/training.md,
    // "Memory"): what to look at before turning train.recompute on.
    if (train_exe) {
      const MemoryPlan& pl = train_exe->plan();
      JsonArray peak, nhwc;
      for (const std::string& v : pl.channels_last) nhwc.push(v);
      for (size_t i = 0; i < pl.peak_live.size() && i < 12; ++i)
        peak.push(JsonObject()
                      .add("value", pl.peak_live[i].value)
                      .add("bytes", static_cast<int64_t>(pl.peak_live[i].bytes)));
      m.add("memory_plan", JsonObject()
                               .add("arena_bytes", static_cast<int64_t>(pl.arena_bytes))
                               .add("unplanned_bytes", static_cast<int64_t>(pl.unplanned_bytes))
                               .add("workspace_bytes", static_cast<int64_t>(pl.workspace_bytes))
                               .add("persistent_bytes", static_cast<int64_t>(pl.persistent_bytes))
                               .add("live_peak_bytes", static_cast<int64_t>(pl.live_peak_bytes))
                               .add("peak_node", pl.peak_node)
                               .add("peak_live", peak)
                               .add("channels_last", nhwc));
    }
    // What the steps compute in: train.precision, whether TF32 was turned on, the dtypes.
    m.add("precision", JsonObject()
                           .add("name", precision)
                           .add("compute", std::string(dtype_name(compute)))
                           .add("master_weights", std::string("f32"))
                           .add("tf32", tf32));
    // Which kernel runs each node of the training step ("<node> <op>: backend/impl", fused
    // groups by their label), in run order: what a run was measured with.
    if (train_exe) {
      JsonArray kernels;
      for (const std::string& k : train_exe->kernel_names()) kernels.push(k);
      m.add("kernels", kernels);
      // backend.kernels, where tuned choices are kept, and how the candidates compared.
      KernelTuner& tuner = backend.runtime().tuner();
      JsonArray choices;
      int64_t tuned = 0, cached = 0;
      for (const Executable* e : {train_exe.get()}) {
        for (const Executable::KernelReport& r : e->kernel_choices()) {
          tuned += r.choice.how == KernelChoice::How::Tuned;
          cached += r.choice.how == KernelChoice::How::Cached;
          JsonObject c;
          c.add("node", r.node).add("op", r.op).add("kernel", r.impl)
              .add("side", std::string(r.library ? "library" : "native"))
              .add("how", std::string(choice_how_name(r.choice.how)));
          auto add_ms = [&](const char* key, const std::vector<CandidateTime>& ts) {
            if (ts.empty()) return;
            JsonObject times;
            for (const CandidateTime& t : ts)
              if (t.ms >= 0) times.add(t.impl, t.ms);
            c.add(key, times);
          };
          add_ms("ms", r.choice.times);
          add_ms("group_ms", r.group_times);
          choices.push(c);
        }
      }
      JsonArray excluded;
      for (const std::string& p : tuner.excluded()) excluded.push(p);
      m.add("kernel_choice", JsonObject()
                                 .add("side", std::string(kernel_side_name(tuner.side())))
                                 .add("cache", tuner.cache_path())
                                 .add("excluded", excluded)
                                 .add("tuned", tuned)
                                 .add("cached", cached)
                                 .add("nodes", choices));
    }
    if (!req.resume_dir.empty()) m.add("resumed_at_step", step);
    if (par.active()) {
      JsonObject pj;
      pj.add("ranks", static_cast<int64_t>(par.size()))
          .add("data_parallel", static_cast<int64_t>(par.width()))
          .add("pipeline_stages", static_cast<int64_t>(par.stages))
          .add("communicator", par.comm)
          .add("launcher", par.launch.source)
          .add("batch_per_replica", local_batch);
      if (grad_sync) pj.add("gradient_buckets", static_cast<int64_t>(grad_sync->buckets().size()));
      if (pipelined)
        pj.add("micro_batches", static_cast<int64_t>(place.micro_batches)).add("stages", stages_text);
      m.add("parallel", pj);
    }
    m.add("config", cfg.dump());
    write_manifest((fs::path(run_dir) / kManifestFile).string(), m);
  }

  // Rank 0's running statistics on every rank (a collective: every rank calls it).
  auto share_running = [&] {
    if (par.data && !running_states.empty()) {
      sync_steps();
      broadcast_store(*par.data, store, 0, running_states);
    }
  };
  // Data parallelism: every rank's replica must hold the same bits (the all-reduced gradients,
  // the same updates and, in f16, the same skipped steps keep them so). Checked before each
  // checkpoint: a mismatch (a nondeterministic kernel, ranks deciding apart) fails the run on
  // every rank, naming the step, before a diverged checkpoint is written.
  int64_t replica_checks = 0;
  auto verify_replicas = [&](const Checkpoint& ck) {
    const uint64_t h = digest(ck);
    std::vector<double> lead = {static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu)};
    par.share(lead);
    std::vector<double> differ = {
        (static_cast<uint64_t>(lead[0]) << 32 | static_cast<uint64_t>(lead[1])) == h ? 0.0 : 1.0};
    par.sum(differ);
    if (differ[0] > 0)
      throw Error("data parallelism: at step " + std::to_string(step) + " the parameters and states of " +
                  std::to_string(static_cast<int64_t>(differ[0])) + " of " + std::to_string(par.size()) +
                  " ranks differ from rank 0's: the replicas diverged, so no checkpoint is written" +
                  (last_good.empty() ? std::string() : " (the last good one is kept: " + last_good + ")"));
    ++replica_checks;
  };
  auto save = [&](int64_t next_epoch, int64_t next_batch) {
    share_running();
    sync_steps();
    // A pipeline's stages send their tensors to rank 0, which writes one checkpoint of the whole
    // model (the same as one process's).
    if (pipelined && par.replica() == 0 && par.stage() > 0) par.send_bytes(pack_tensors(snapshot(store).tensors), 0);
    std::optional<Checkpoint> mine;
    if (!pipelined && par.data) {
      mine = snapshot(store);
      verify_replicas(*mine);
    }
    if (!par.lead()) return;
    Checkpoint ck = mine ? std::move(*mine) : snapshot(store);
    if (pipelined) {
      for (int32_t st = 1; st < par.stages; ++st)
        for (CheckpointTensor& t : unpack_tensors(par.recv_bytes(st * par.width())))
          ck.tensors.push_back(std::move(t));
      std::sort(ck.tensors.begin(), ck.tensors.end(),
                [](const CheckpointTensor& a, const CheckpointTensor& b) { return a.name < b.name; });
    }
    ck.meta["format"] = kCheckpointFormat;
    ck.meta["epoch"] = std::to_string(next_epoch);
    ck.meta["batch"] = std::to_string(next_batch);
    ck.meta["step"] = std::to_string(step);
    ck.meta["seed"] = std::to_string(seed);
    ck.meta["rng"] = "none beyond the seed: shuffling is keyed by (seed, epoch), init by (seed, name)";
    ck.meta["model"] = spec.name;
    ck.meta["config"] = cfg.dump();
    ck.meta["plexus"] = PLEXUS_VERSION_STRING;
    ck.meta["git_revision"] = git_revision();
    if (scaler) {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", scaler->scale);
      ck.meta["loss_scale"] = text;
      ck.meta["loss_scale_good"] = std::to_string(scaler->good);
      ck.meta["skipped_steps"] = std::to_string(scaler->skipped);
    }
    write_checkpoint(ckpt_path, ck);
    last_good = ckpt_path;
  };

  Progress progress(out, par.lead() ? progress_mode(cfg.get_string("logging.progress"))
                                    : ProgressMode::None);
  if (!req.resume_dir.empty())
    progress.note("resuming " + run_dir + " at epoch " + std::to_string(epoch + 1) + ", batch " +
                  std::to_string(first_batch) + " (step " + std::to_string(step) + ")");
  else
    progress.note("training " + spec.name + " (" + std::to_string(n_params) + " parameters) on " +
                  backend.name() + ":" + std::to_string(device) + ", " + train_set.name + " " +
                  std::to_string(train_loader.samples()) + " samples, batch " +
                  std::to_string(batch) + (precision == "f32" ? "" : ", precision " + precision) +
                  "; writing " + run_dir);
  if (grad_sync)
    progress.note("data parallel over " + std::to_string(par.size()) + " ranks (" + par.comm +
                  ", launched by " + par.launch.source + "): " + std::to_string(local_batch) +
                  " samples per rank per step, " + std::to_string(grad_sync->buckets().size()) +
                  " gradient buckets of up to " + format_bytes(cfg.get_bytes("parallel.bucket_size")));
  if (pipelined)
    progress.note("pipeline of " + std::to_string(par.stages) + " stages " + stages_text + " x " +
                  std::to_string(par.width()) + " data-parallel (" + par.comm + ", launched by " +
                  par.launch.source + "): " + std::to_string(local_batch) + " samples per pipeline per " +
                  "step in " + std::to_string(place.micro_batches) + " micro-batches (1F1B)");

  const int64_t max_steps = cfg.get_int("train.max_steps");
  const int64_t ckpt_every = cfg.get_int("output.checkpoint_steps");
  data::Batch b;
  int64_t launched = step;
  double step_seconds = 0;
  int64_t step_images = 0;
  bool stop = false;
  if (target_accuracy > 0) result.target = TrainResult::Target{.accuracy = target_accuracy};
  const auto t_train = Clock::now();
  double train_loop_seconds = 0;  // the epochs' loops over the training set, evaluation not
  for (; epoch < epochs && !stop; ++epoch, first_batch = 0) {
    train_loader.start(epoch, first_batch);
    progress.start_epoch(static_cast<int>(epoch + 1), static_cast<int>(epochs), per_epoch);
    const auto t_epoch = Clock::now();
    double loss_sum = 0;
    int64_t rows = 0, hits = 0, epoch_images = 0, epoch_skipped = 0;
    double epoch_step_seconds = 0;
    // Steps are launched one ahead of their results: `launched` counts launches, `step` the
    // steps whose results were read. A checkpoint drains the pipeline first, so it never holds a
    // step whose loss was not seen.
    auto handle = [&](StepOutcome o) {
      if (par.active()) {  // the global batch's loss and counts
        // With them, f16's loss scale and skip, which every rank must share (its gradients'
        // check was summed over the ranks that hold them, data-parallel or pipeline stages).
        std::vector<double> v = {o.loss, static_cast<double>(o.hits), static_cast<double>(o.real),
                                 o.loss_scale, o.skipped ? 1.0 : 0.0};
        par.sum(v);
        o.loss = v[0];
        o.hits = static_cast<int64_t>(v[1]);
        o.real = static_cast<int64_t>(v[2]);
        const double n = static_cast<double>(par.size());
        if (scaler && (v[3] != n * o.loss_scale || v[4] != (o.skipped ? n : 0.0)))
          throw Error("step " + std::to_string(step + 1) + ": the ranks' loss scales diverged (this rank " +
                      "ran with " + format_scale(o.loss_scale) + (o.skipped ? " and skipped" : "") +
                      "; over the " + std::to_string(par.size()) + " ranks the scales sum to " +
                      format_scale(v[3]) + " and " + std::to_string(static_cast<int64_t>(v[4])) +
                      " skipped)");
      }
      ++step;
      if (!std::isfinite(o.loss)) {
        emit(JsonObject().add("type", "stop").add("reason", "non-finite loss")
                          .add("step", step).add("epoch", epoch + 1).add("batch", o.index));
        throw DivergedError(
            "step " + std::to_string(step) + " (epoch " + std::to_string(epoch + 1) + ", batch " +
            std::to_string(o.index) + "): the loss is " + (std::isnan(o.loss) ? "nan" : "inf") +
            "; training stopped. " +
            (last_good.empty() ? std::string("No checkpoint had been written yet.")
                               : "The last good checkpoint is kept: " + last_good) +
            " (try a lower train.lr)");
      }
      loss_sum += o.loss * static_cast<double>(o.real);
      rows += o.real;
      hits += o.hits;
      epoch_images += o.real;
      epoch_step_seconds += o.seconds;
      if (req.keep_losses) result.losses.push_back(o.loss);
      epoch_skipped += o.skipped;
      JsonObject line;
      line.add("type", "step")
          .add("step", step)
          .add("epoch", epoch + 1)
          .add("batch", o.index)
          .add("loss", o.loss)
          .add("accuracy", static_cast<double>(o.hits) / static_cast<double>(o.real))
          .add("lr", o.lr)
          .add("images_per_s", o.seconds > 0 ? static_cast<double>(o.real) / o.seconds : 0.0);
      if (scaler) line.add("loss_scale", o.loss_scale).add("skipped", o.skipped);
      emit(line);
      progress.update(o.index + 1, epoch_images, loss_sum / static_cast<double>(rows),
                      static_cast<double>(hits) / static_cast<double>(rows));
    };
    auto drain = [&] {
      while (train_pipe.in_flight() > 0) handle(train_pipe.collect());
    };
    for (int64_t bi = first_batch; train_loader.next(b); ++bi) {
      if (train_pipe.full()) handle(train_pipe.collect());
      const double lr = learning_rate(sched, launched);
      train_pipe.launch(b, lr, static_cast<double>(launched + 1));
      ++launched;
      if (max_steps > 0 && launched >= max_steps) {
        drain();
        save(epoch, bi + 1);
        stop = true;
        break;
      }
      if (ckpt_every > 0 && launched % ckpt_every == 0) {
        drain();
        save(epoch, bi + 1);
      }
    }
    drain();
    train_loop_seconds += seconds_since(t_epoch);
    step_seconds += epoch_step_seconds;
    step_images += epoch_images;
    if (stop && rows == 0) break;
    EpochMetrics em;
    em.epoch = epoch + 1;
    em.train_loss = rows ? loss_sum / static_cast<double>(rows) : 0;
    em.train_accuracy = rows ? static_cast<double>(hits) / static_cast<double>(rows) : 0;
    em.images_per_s = epoch_step_seconds > 0 ? static_cast<double>(epoch_images) / epoch_step_seconds : 0;
    if (do_eval && !stop) {
      share_running();
      test_loader->start(0, 0);
      double tl = 0;
      int64_t tn = 0, th = 0;
      auto take = [&](const StepOutcome& o) {
        tl += o.loss;
        th += o.hits;
        tn += o.real;
      };
      while (test_loader->next(b)) {
        if (eval_pipe->full()) take(eval_pipe->collect());
        eval_pipe->launch(b, 0, 0);
      }
      while (eval_pipe->in_flight() > 0) take(eval_pipe->collect());
      if (par.active()) {
        std::vector<double> v = {tl, static_cast<double>(th), static_cast<double>(tn)};
        par.sum(v);
        tl = v[0];
        th = static_cast<int64_t>(v[1]);
        tn = static_cast<int64_t>(v[2]);
      }
      em.test_loss = tl / static_cast<double>(tn);
      em.test_accuracy = static_cast<double>(th) / static_cast<double>(tn);
    }
    em.seconds = seconds_since(t_epoch);
    JsonObject line;
    line.add("type", "epoch").add("epoch", em.epoch).add("step", step)
        .add("train_loss", em.train_loss).add("train_accuracy", em.train_accuracy)
        .add("seconds", em.seconds).add("images_per_s", em.images_per_s);
    if (em.test_loss) line.add("test_loss", *em.test_loss).add("test_accuracy", *em.test_accuracy);
    if (scaler) line.add("loss_scale", scaler->scale).add("skipped_steps", epoch_skipped);
    emit(line);
    EpochResult er;
    er.train_loss = em.train_loss;
    er.train_accuracy = em.train_accuracy;
    er.test_loss = em.test_loss;
    er.test_accuracy = em.test_accuracy;
    er.seconds = em.seconds;
    er.images_per_s = em.images_per_s;
    progress.end_epoch(er);
    if (scaler)
      progress.note("loss scale " + format_scale(scaler->scale) + "; " +
                    std::to_string(epoch_skipped) +
                    " step(s) of the epoch skipped (gradients not finite)");
    result.epochs.push_back(em);
    if (!stop) save(epoch + 1, 0);
    if (result.target && !result.target->reached && em.test_accuracy &&
        *em.test_accuracy >= target_accuracy) {
      TrainResult::Target& t = *result.target;
      t.reached = true;
      t.epoch = em.epoch;
      t.step = step;
      t.test_accuracy = *em.test_accuracy;
      t.train_seconds = train_loop_seconds;
      t.wall_seconds = seconds_since(t_train);
      emit(JsonObject().add("type", "target").add("target_accuracy", target_accuracy)
               .add("epoch", t.epoch).add("step", t.step).add("test_accuracy", t.test_accuracy)
               .add("train_seconds", t.train_seconds).add("wall_seconds", t.wall_seconds));
      progress.note("reached the target test accuracy " + format_accuracy(target_accuracy) +
                    " after epoch " + std::to_string(t.epoch) + " (step " + std::to_string(t.step) +
                    ", " + format_accuracy(t.test_accuracy) + "): " + format_seconds(t.train_seconds) +
                    " of training without evaluation, " + format_seconds(t.wall_seconds) +
                    " since the first epoch began; training stops here");
      stop = true;
    }
  }
  if (result.target && !result.target->reached)
    progress.note("the target test accuracy " + format_accuracy(target_accuracy) +
                  " was not reached in " + std::to_string(result.epochs.size()) + " epoch(s)");
  sync_steps();
  result.steps = step;
  result.seconds = seconds_since(t_begin);
  result.images_per_s = step_seconds > 0 ? static_cast<double>(step_images) / step_seconds : 0;
  // The steps' plans, and what the pipelines and the resident data sets hold on the device.
  result.planned_bytes = train_plan_bytes + (eval_exe ? eval_exe->plan().total_bytes() : 0) +
                         (eval_stage ? eval_stage->planned_bytes() : 0) +
                         train_pipe.device_bytes() + (eval_pipe ? eval_pipe->device_bytes() : 0) +
                         (train_resident ? train_resident->bytes() : 0) +
                         (test_resident ? test_resident->bytes() : 0) +
                         (grad_sync ? grad_sync->bytes() : 0);
  for (const auto& [name, t] : store.all()) result.parameter_bytes += t.nbytes();
  result.peak_bytes = backend.allocator(device).stats().peak_in_use - mem0;

  RunSummary sum;
  sum.epochs = static_cast<int>(result.epochs.size());
  sum.seconds = result.seconds;
  sum.images_per_s = result.images_per_s;
  if (!result.epochs.empty()) {
    const EpochMetrics& last = result.epochs.back();
    sum.train_loss = last.train_loss;
    sum.train_accuracy = last.train_accuracy;
    sum.test_loss = last.test_loss;
    sum.test_accuracy = last.test_accuracy;
  }
  progress.finish(sum);
  const data::LoaderStats ls = train_loader.stats();
  progress.note("memory on " + backend.name() + ": peak " + format_bytes(result.peak_bytes) +
                " in use, the plans predict " + format_bytes(result.planned_bytes) +
                "; the loader kept the step waiting " + std::to_string(ls.waits) + " times (" +
                std::to_string(static_cast<int64_t>(ls.wait_seconds * 1000)) + " ms)");
  JsonObject summary;
  summary.add("type", "summary").add("steps", step)
      .add("loader_waits", ls.waits).add("loader_wait_seconds", ls.wait_seconds)
      .add("seconds", result.seconds).add("images_per_s", result.images_per_s)
      .add("planned_bytes", static_cast<int64_t>(result.planned_bytes))
      .add("peak_bytes", static_cast<int64_t>(result.peak_bytes));
  if (result.target) {
    summary.add("target_accuracy", target_accuracy).add("target_reached", result.target->reached);
    if (result.target->reached)
      summary.add("target_epoch", result.target->epoch)
          .add("target_train_seconds", result.target->train_seconds)
          .add("target_wall_seconds", result.target->wall_seconds);
  }
  if (scaler) {
    result.loss_scale = scaler->scale;
    result.skipped_steps = scaler->skipped;
    summary.add("loss_scale", scaler->scale).add("skipped_steps", scaler->skipped);
  }
  result.ranks = par.size();
  if (grad_sync) {
    // Rank 0's view; the ranks wait for one another, so theirs are alike.
    const GradSyncStats gs = grad_sync->stats();
    result.comm_seconds = gs.comm_seconds;
    result.comm_wait_seconds = gs.wait_seconds;
    summary.add("ranks", static_cast<int64_t>(par.size()))
        .add("comm_seconds", gs.comm_seconds)
        .add("comm_wait_seconds", gs.wait_seconds);
    if (replica_checks > 0)
      progress.note("replicas: the " + std::to_string(par.size()) + " ranks' parameters and states " +
                    "were identical at each of " + std::to_string(replica_checks) + " checkpoint(s)");
    summary.add("replica_checks", replica_checks);
    if (gs.comm_seconds > 0)
      progress.note("gradient all-reduce: " + std::to_string(static_cast<int64_t>(gs.comm_seconds * 1000)) +
                    " ms over " + std::to_string(gs.steps) + " steps, of which the steps waited " +
                    std::to_string(static_cast<int64_t>(gs.wait_seconds * 1000)) + " ms (" +
                    std::to_string(static_cast<int>(std::lround(
                        100.0 * std::max(0.0, 1.0 - gs.wait_seconds / gs.comm_seconds)))) +
                    "% hidden behind backward)");
  }
  emit(summary);
  return result;
}

}  // namespace plexus
