#include "plexus/step_profile.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <ostream>
#include <random>

#include "../train/step_graph.hpp"
#include "../train/step_pipeline.hpp"
#include "plexus/backend.hpp"
#include "plexus/comm_bench.hpp"  // median()
#include "plexus/error.hpp"
#include "plexus/executor.hpp"
#include "plexus/json.hpp"
#include "plexus/runtime.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus {

namespace {

// The step's inputs on random data: the batch uniform in [-1, 1], labels spread over the
// classes, and each scalar (the learning rate; AdamW's step, whose first is 1) as a run sets it.
void feed(Executable& exe, const Graph& g, int64_t classes, double lr, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t k = std::max<int64_t>(classes, 1);
  for (const GraphValue& v : g.values()) {
    if (v.kind != ValueKind::Input) continue;
    Tensor t = exe.tensor(v.name);
    const int64_t n = v.desc.numel();
    const bool scalar = v.desc.shape.empty();
    const double one = v.name == "lr" ? lr : 1.0;
    switch (v.desc.dtype) {
      case PLX_I32:
      case PLX_I64: {
        std::vector<int64_t> h(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i)] = scalar ? 1 : i % k;
        if (v.desc.dtype == PLX_I64) {
          t.copy_from_host(h.data());
        } else {
          std::vector<int32_t> h32(h.begin(), h.end());
          t.copy_from_host(h32.data());
        }
        break;
      }
      case PLX_F32: {
        std::vector<float> h(static_cast<size_t>(n));
        for (float& x : h) x = scalar ? static_cast<float>(one) : u(rng);
        t.copy_from_host(h.data());
        break;
      }
      default:
        throw Error("plexus bench step: input '" + v.name + "' is " + dtype_name(v.desc.dtype) +
                    ", which the profiler does not know how to fill");
    }
  }
}

// "conv2d_1 conv2d: cpu/im2col_blas (cached)" -> "conv2d"; "fused kernel 'conv2d+relu' [...]"
// -> "fused conv2d+relu".
std::string op_of(const std::string& kernel) {
  const std::string fused = "fused kernel '";
  if (kernel.rfind(fused, 0) == 0) {
    const size_t end = kernel.find('\'', fused.size());
    return "fused " + kernel.substr(fused.size(), end - fused.size());
  }
  const size_t sp = kernel.find(' '), colon = kernel.find(':');
  if (sp == std::string::npos || colon == std::string::npos || colon < sp) return kernel;
  return kernel.substr(sp + 1, colon - sp - 1);
}

std::string ms_text(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", ms);
  return b;
}

}  // namespace

StepProfile profile_step(Runtime& rt, const Config& cfg, const StepProfileOptions& o) {
  if (o.steps < 1) throw ConfigError("--steps must be >= 1, got " + std::to_string(o.steps));
  if (o.warmup < 0) throw ConfigError("--warmup must be >= 0, got " + std::to_string(o.warmup));
  Backend& backend = rt.select_backend(o.backend.empty() ? cfg.get_string("backend.name") : o.backend);
  const int32_t dev = o.device >= 0 ? o.device : static_cast<int32_t>(cfg.get_int("backend.device"));
  StepProfile p;
  p.backend = backend.name();
  p.device = backend.device(dev).name;
  p.precision = cfg.get_string("train.precision");
  p.batch = cfg.get_int("train.batch_size");
  p.steps = o.steps;
  const plx_dtype compute = compute_dtype(cfg);
  if (p.precision == "tf32") enable_tf32(backend);
  const ModelSpec spec = model_of(cfg);
  p.model = spec.name;
  std::vector<int64_t> sample = spec.input_shape;
  if (sample.empty()) sample = load_data(cfg, spec, false).train.sample_shape;
  // f16 scales its loss on the device as a run does (build_step), from the config's scale: a
  // step whose gradients overflow skips its update, and is timed as it runs.
  LossScaling scaling;
  scaling.init = cfg.get_float("train.loss_scale_init");
  scaling.window = cfg.get_int("train.loss_scale_window");
  auto sg = build_step(rt.ops(), spec, p.batch, sample, true, optimizer_options(cfg), false,
                       compute, compute == PLX_F16 ? &scaling : nullptr, recompute_ops(cfg),
                       cfg.get_float("train.label_smoothing"));
  const Graph& graph = sg->graph;
  ExecutableOptions eo;
  eo.device = dev;
  eo.seed = static_cast<uint64_t>(cfg.get_int("train.seed"));
  eo.fuse = cfg.get_bool("train.fusion");
  eo.channels_last = cfg.get_bool("train.channels_last");
  const double lr = cfg.get_float("train.lr");
  TensorStore store;

  // Op by op with an event after each kernel: hooks that are not capturable keep it so.
  {
    ExecutableOptions probe = eo;
    probe.capture = false;
    Executable exe(backend, graph, store, probe);
    const int32_t nk = exe.num_kernels();
    Events ev(backend, dev, static_cast<size_t>(nk) + 1);
    const plx_stream st = exe.stream();
    if (nk > 0) exe.add_hook(0, Executable::HookPoint::Before, [&] { backend.record(ev[0], st); });
    for (int32_t k = 0; k < nk; ++k)
      exe.add_hook(k, Executable::HookPoint::After,
                   [&, k] { backend.record(ev[static_cast<size_t>(k) + 1], st); });
    feed(exe, graph, spec.classes, lr, eo.seed);
    std::vector<std::vector<double>> samples(static_cast<size_t>(nk));
    std::vector<double> whole;
    for (int r = 0; r < o.warmup + o.steps; ++r) {
      exe.run();
      exe.sync();
      if (r < o.warmup || nk == 0) continue;
      for (size_t k = 0; k < static_cast<size_t>(nk); ++k)
        samples[k].push_back(backend.elapsed_ms(ev[k], ev[k + 1]));
      whole.push_back(backend.elapsed_ms(ev[0], ev[static_cast<size_t>(nk)]));
    }
    const std::vector<std::string> names = exe.kernel_names();
    for (size_t k = 0; k < names.size(); ++k) {
      StepProfileRow row;
      row.kernel = names[k];
      row.op = op_of(row.kernel);
      row.ms = median(samples[k]);
      p.kernels_ms += row.ms;
      p.kernels.push_back(std::move(row));
    }
    for (StepProfileRow& row : p.kernels) row.share = p.kernels_ms > 0 ? row.ms / p.kernels_ms : 0;
    p.op_by_op_ms = median(whole);
    p.arena_bytes = exe.plan().arena_bytes;
    p.workspace_bytes = exe.plan().workspace_bytes;
    p.persistent_bytes = exe.plan().persistent_bytes;
    p.channels_last_values = exe.plan().channels_last_values;
  }

  // The trainer's way, timed from outside the step (captured and replayed where the backend can).
  {
    eo.capture = cfg.get_bool("train.graph_capture");
    Executable exe(backend, graph, store, eo);
    feed(exe, graph, spec.classes, lr, eo.seed);
    Events ev(backend, dev, 2);
    const plx_stream st = exe.stream();
    std::vector<double> t;
    for (int r = 0; r < o.warmup + o.steps + 2; ++r) {  // 2 more: the first runs set up capture
      backend.record(ev[0], st);
      exe.run();
      backend.record(ev[1], st);
      exe.sync();
      backend.sync_event(ev[1]);
      if (r >= o.warmup + 2) t.push_back(backend.elapsed_ms(ev[0], ev[1]));
    }
    p.step_ms = median(t);
    p.captured = exe.replaying();
  }

  // The trainer's pipeline around the step (step_pipeline.hpp): random images resident on the
  // device, each batch's sample indices and labels uploaded, two steps in flight, the loss and
  // predictions read back; wall-clock time a step over the timed runs, the host's work included.
  {
    ExecutableOptions peo = eo;
    peo.capture = cfg.get_bool("train.graph_capture");
    place_step_inputs(peo, true, p.batch);
    Executable exe(backend, graph, store, peo);  // the pipeline writes every input itself
    const int64_t d = shape_numel(sample);
    const int64_t n = 4 * p.batch;
    std::mt19937_64 rng(eo.seed + 7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> images(static_cast<size_t>((n + 1) * d), 0.0f);
    for (int64_t i = 0; i < n * d; ++i) images[static_cast<size_t>(i)] = u(rng);
    ResidentData resident;
    resident.rows = n;
    resident.images = Tensor::from_host(backend, images.data(), {n + 1, d}, PLX_F32, dev);
    LossScaler scaler;
    scaler.scale = scaling.init;
    const bool scaled = graph.find(kLossScaleReport).valid();
    StepPipeline pipe(backend, dev, exe, rt.ops(), &resident, scaled ? &scaler : nullptr);
    data::Batch b;
    b.rows = b.real = b.global_real = p.batch;
    for (int64_t r = 0; r < p.batch; ++r) {
      b.samples.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(n)));
      b.labels.push_back(static_cast<int32_t>(r % std::max<int64_t>(spec.classes, 1)));
    }
    auto run = [&](int steps) {
      for (int i = 0; i < steps; ++i) {
        if (pipe.full()) pipe.collect();
        b.index = i;
        pipe.launch(b, lr, i + 1);
      }
      while (pipe.in_flight() > 0) pipe.collect();
    };
    run(o.warmup + 2);  // the first runs set up capture
    const auto t0 = std::chrono::steady_clock::now();
    run(o.steps);
    p.pipeline_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
                    o.steps;
  }
  return p;
}

void print_step_profile(std::ostream& out, const StepProfile& p, int top) {
  out << "Training step of model '" << p.model << "', batch " << p.batch << ", " << p.precision
      << ", on " << p.backend << " (" << p.device << "): medians of " << p.steps << " runs\n";
  out << "  the step run as the trainer runs it" << (p.captured ? " (captured, replayed)" : "")
      << ": " << ms_text(p.step_ms) << " ms\n";
  out << "  the step fed by the trainer's pipeline (resident data, two steps in flight, wall clock): "
      << ms_text(p.pipeline_ms) << " ms\n";
  out << "  op by op with an event after each kernel: " << ms_text(p.op_by_op_ms)
      << " ms; the kernels' medians add up to " << ms_text(p.kernels_ms) << " ms over "
      << p.kernels.size() << " kernels\n";
  auto mib = [](uint64_t b) {
    char t[32];
    std::snprintf(t, sizeof t, "%.1f MiB", static_cast<double>(b) / (1 << 20));
    return std::string(t);
  };
  out << "  memory plan: activations " << mib(p.arena_bytes) << ", kernels' scratch "
      << mib(p.workspace_bytes) << ", parameters, optimizer states and inputs "
      << mib(p.persistent_bytes) << "; " << p.channels_last_values
      << " activation(s) channels-last\n\n";

  std::vector<size_t> order(p.kernels.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return p.kernels[a].ms > p.kernels[b].ms; });
  const size_t shown = top > 0 ? std::min(order.size(), static_cast<size_t>(top)) : order.size();
  out << "  by kernel (slowest first" << (shown < order.size() ? ", top " + std::to_string(shown) : "")
      << "):\n      ms   share   cum.  #   kernel\n";
  double cum = 0;
  char line[96];
  for (size_t i = 0; i < shown; ++i) {
    const StepProfileRow& r = p.kernels[order[i]];
    cum += r.share;
    std::snprintf(line, sizeof line, "  %8.3f  %5.1f%%  %5.1f%%  %-3zu ", r.ms, 100 * r.share, 100 * cum,
                  order[i]);
    out << line << r.kernel << "\n";
  }

  std::map<std::string, std::pair<double, int>> by_op;
  for (const StepProfileRow& r : p.kernels) {
    auto& e = by_op[r.op];
    e.first += r.ms;
    ++e.second;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> ops(by_op.begin(), by_op.end());
  std::stable_sort(ops.begin(), ops.end(),
                   [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  out << "\n  by op:\n      ms   share  kernels  op\n";
  for (const auto& [op, e] : ops) {
    std::snprintf(line, sizeof line, "  %8.3f  %5.1f%%  %7d  ", e.first,
                  p.kernels_ms > 0 ? 100 * e.first / p.kernels_ms : 0.0, e.second);
    out << line << op << "\n";
  }
}

std::string step_profile_json(const StepProfile& p) {
  JsonArray ks;
  for (const StepProfileRow& r : p.kernels)
    ks.push(JsonObject().add("kernel", r.kernel).add("op", r.op).add("ms", r.ms).add("share", r.share));
  return JsonObject()
      .add("backend", p.backend)
      .add("device", p.device)
      .add("model", p.model)
      .add("precision", p.precision)
      .add("batch", p.batch)
      .add("steps", static_cast<int64_t>(p.steps))
      .add("step_ms", p.step_ms)
      .add("captured", p.captured)
      .add("pipeline_ms", p.pipeline_ms)
      .add("op_by_op_ms", p.op_by_op_ms)
      .add("kernels_ms", p.kernels_ms)
      .add("arena_bytes", static_cast<int64_t>(p.arena_bytes))
      .add("workspace_bytes", static_cast<int64_t>(p.workspace_bytes))
      .add("persistent_bytes", static_cast<int64_t>(p.persistent_bytes))
      .add("channels_last_values", static_cast<int64_t>(p.channels_last_values))
      .add("kernels", ks)
      .str();
}

}  // namespace plexus
