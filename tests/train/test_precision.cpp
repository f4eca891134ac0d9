// Mixed precision (train.precision, docs/training.md): bf16/f16 steps keep f32 master weights,
// cast the batch and the parameters once per step and the logits back to f32, and agree with the
// f32 step within the 16-bit tolerance; runs in 16 bits train like f32 runs and resume exactly.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "plexus/checkpoint.hpp"
#include "plexus/error.hpp"
#include "plexus/executor.hpp"
#include "plexus/model.hpp"
#include "plexus/run_output.hpp"
#include "plexus/trainer.hpp"
#include "support/harness.hpp"
#include "train/step_graph.hpp"
#include "train/step_pipeline.hpp"

using namespace plexus;
using namespace plexus::test;
namespace fs = std::filesystem;

namespace {

struct OneStep {
  double loss = 0;
  // Every stored tensor before and after the step, and their dtypes.
  std::map<std::string, std::vector<double>> before, after;
  std::map<std::string, plx_dtype> dtypes;
};

// One SGD step (no momentum: the update is lr times the gradient) of `model` computing in
// `compute`, on a fixed random batch of 8.
OneStep one_step(const std::string& model, plx_dtype compute) {
  const ModelSpec spec = builtin_model(model);
  const int64_t n = 8;
  OptimizerOptions opt;
  opt.kind = "sgd";
  opt.momentum = 0;
  auto sg = build_step(runtime().ops(), spec, n, spec.input_shape, true, opt, false, compute);
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 3;
  Executable exe(cpu(), sg->graph, store, eo);
  OneStep r;
  for (const auto& [name, t] : store.all()) {
    r.before[name] = t.to_doubles();
    r.dtypes[name] = t.dtype();
  }
  int64_t per = 1;
  for (int64_t d : spec.input_shape) per *= d;
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(n * per), 7, -2.0, 2.0));
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>((i * 7) % spec.classes));
  exe.tensor("labels").copy_from_host(labels.data());
  fill(exe.tensor("lr"), {0.1});
  exe.run();
  exe.sync();
  r.loss = exe.tensor("loss_value").to_doubles().at(0);
  for (const auto& [name, t] : store.all()) r.after[name] = t.to_doubles();
  return r;
}

// The step's change to a tensor: lr times its gradient for a parameter.
std::vector<double> change(const OneStep& s, const std::string& name) {
  std::vector<double> d = s.after.at(name);
  const std::vector<double>& b = s.before.at(name);
  for (size_t i = 0; i < d.size(); ++i) d[i] -= b[i];
  return d;
}

// The trainer tests' small run of `model` in `precision`.
Config small_config(const fs::path& out, const std::string& model, const std::string& precision) {
  Config c = small_train_config(out);
  c.set("model.name=\"" + model + "\"");
  c.set("train.precision=\"" + precision + "\"");
  return c;
}

// `full` stopped after `stop` steps into `dir` and resumed there: every step's loss in order, and
// the resumed part's result.
std::pair<std::vector<double>, TrainResult> stopped_and_resumed(const Config& full,
                                                                const fs::path& dir, int stop) {
  Config part = full;
  part.set("output.dir=\"" + dir.string() + "\"");
  part.set("train.max_steps=" + std::to_string(stop));
  std::vector<double> losses = run_training(part).losses;
  part.set("train.max_steps=0");
  TrainResult rest = run_training(part, dir.string());
  losses.insert(losses.end(), rest.losses.begin(), rest.losses.end());
  return {losses, rest};
}

JsonValue read_manifest(const fs::path& run) {
  std::ifstream f(run / "manifest.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_json(ss.str(), "manifest.json");
}

}  // namespace

TEST_CASE("a 16-bit step equals the f32 step on the same batch within its tolerance",
          "[cpu][train][precision]") {
  // simplecnn (convs, pools, linears) and the residual net (batch norms with f32 parameters and
  // statistics under 16-bit activations, skip additions, a global mean).
  for (const std::string model : {"simplecnn", "resnet"}) {
    const OneStep f32 = one_step(model, PLX_F32);
    for (plx_dtype d : {PLX_BF16, PLX_F16}) {
      DYNAMIC_SECTION(model << " in " << dtype_name(d)) {
        const OneStep low = one_step(model, d);
        // Same names, same f32 master tensors, same initial values.
        REQUIRE(low.before.size() == f32.before.size());
        for (const auto& [name, v] : f32.before) {
          INFO(name);
          CHECK(low.dtypes.at(name) == PLX_F32);
          CHECK(low.before.at(name) == v);
        }
        // The loss within the type's rounding (bf16 keeps 8 bits, f16 11).
        const double rel = d == PLX_BF16 ? 2e-2 : 3e-3;
        CHECK(std::abs(low.loss - f32.loss) <= rel * std::abs(f32.loss));
        // Every parameter's update (lr times its gradient) close to f32's, and running statistics
        // moved as in f32. The bounds are the 16-bit types' (8 and 11 bits), through the layers'
        // rounded activations and gradients and the batch sums that cancel (biases); a gradient
        // lost, scaled or left in the wrong type is off by order one.
        for (const auto& [name, v] : f32.before) {
          INFO(name);
          const std::vector<double> want = change(f32, name), got = change(low, name);
          double norm = 0;
          for (double w : want) norm += w * w;
          if (norm == 0) continue;  // e.g. a statistic the step does not move
          CHECK(nmse(got, want) < (d == PLX_BF16 ? 5e-2 : 5e-3));
        }
      }
    }
  }
}

TEST_CASE("a 16-bit step graph casts the batch and the parameters and keeps f32 masters",
          "[cpu][train][precision]") {
  const ModelSpec spec = builtin_model("resnet");
  OptimizerOptions opt;
  opt.kind = "adamw";
  for (bool training : {true, false}) {
    DYNAMIC_SECTION((training ? "training" : "evaluation") << " step") {
      auto sg =
          build_step(runtime().ops(), spec, 4, spec.input_shape, training, opt, false, PLX_BF16);
      const Graph& g = sg->graph;
      // Readers in the forward of each value, and the casts by name.
      std::map<std::string, std::vector<const GraphNode*>> readers;
      std::map<std::string, const GraphNode*> casts;
      for (const GraphNode& node : g.nodes()) {
        if (node.op_name() == "cast") casts[node.name] = &node;
        if (node.phase != Phase::Forward) continue;
        for (Var v : node.inputs)
          if (v.valid() && !g.value(v).name.empty()) readers[g.value(v).name].push_back(&node);
      }
      REQUIRE(casts.count("x.cast"));
      CHECK(casts.at("x.cast")->attrs.get_string("dtype") == "bf16");
      REQUIRE(casts.count("logits.cast"));
      CHECK(casts.at("logits.cast")->attrs.get_string("dtype") == "f32");
      CHECK(g.desc(g.find("x")).dtype == PLX_F32);
      CHECK(g.desc(sg->loss).dtype == PLX_F32);
      int n_cast = 0, n_norm = 0;
      for (Var p : g.parameters()) {
        const std::string name = g.value(p).name;
        INFO(name);
        CHECK(g.value(p).desc.dtype == PLX_F32);
        REQUIRE(readers[name].size() == 1);  // read once per step
        const GraphNode& r = *readers[name].front();
        if (r.op_name() == "batch_norm") {
          ++n_norm;  // the norm takes its f32 weight and bias as they are
        } else {
          ++n_cast;
          CHECK(r.op_name() == "cast");
          CHECK(r.name == name + ".cast");
          CHECK(r.attrs.get_string("dtype") == "bf16");
        }
      }
      CHECK(n_cast == 8);   // 6 conv weights (no biases: batch norm follows), the linear's 2
      CHECK(n_norm == 12);  // 6 batch norms' weight and bias
      for (const GraphValue& v : g.values())
        if (v.kind == ValueKind::State || v.kind == ValueKind::Parameter) {
          INFO(v.name);
          CHECK(v.desc.dtype == PLX_F32);
        }
      if (training) {
        // The gradients reaching the master parameters, and the optimizer, are f32.
        for (Var gr : sg->grads) CHECK(g.desc(gr).dtype == PLX_F32);
      }
    }
  }
}

TEST_CASE("models train in bf16 and f16 to losses close to f32's", "[cpu][train][precision]") {
  for (const std::string model : {"simplecnn", "mlp"}) {
    TempDir tmp;
    const TrainResult f32 = run_training(small_config(tmp.path / "f32", model, "f32"));
    REQUIRE(f32.losses.size() == 12);
    for (const std::string p : {"bf16", "f16"}) {
      DYNAMIC_SECTION(model << " in " << p) {
        const TrainResult low = run_training(small_config(tmp.path / p, model, p));
        REQUIRE(low.losses.size() == 12);
        CHECK(low.losses.back() < 0.5 * low.losses.front());
        INFO("f32 " << f32.losses.back() << ", " << p << " " << low.losses.back());
        CHECK(std::abs(low.losses.back() - f32.losses.back()) <= 0.05 + 0.1 * f32.losses.back());
        REQUIRE(low.epochs.back().test_accuracy);
        CHECK(std::abs(*low.epochs.back().test_accuracy - *f32.epochs.back().test_accuracy) <=
              0.02);
        // The checkpoint holds f32 master weights, as an f32 run's does.
        const JsonValue m = read_manifest(tmp.path / p);
        CHECK(m.at("precision").at("name").string == p);
        CHECK(m.at("precision").at("compute").string == p);
        CHECK(m.at("precision").at("master_weights").string == "f32");
      }
    }
  }
}

TEST_CASE("a bf16 run resumed mid-epoch equals the uninterrupted bf16 run",
          "[cpu][train][precision]") {
  TempDir tmp;
  Config full = small_config(tmp.path / "full", "simplecnn", "bf16");
  full.set("train.optimizer=\"adamw\"");
  full.set("train.lr=0.002");
  const TrainResult whole = run_training(full);
  REQUIRE(whole.losses.size() == 12);
  CHECK(stopped_and_resumed(full, tmp.path / "part", 5).first == whole.losses);
  // The checkpoint is an f32 run's: it resumes in f32 too.
  Config as_f32 = full;
  as_f32.set("train.precision=\"f32\"");
  as_f32.set("train.epochs=4");
  const TrainResult more = run_training(as_f32, (tmp.path / "part").string());
  CHECK(more.steps == 16);
  CHECK(std::isfinite(more.losses.back()));
}

TEST_CASE("tf32 on the CPU computes f32 and the manifest says so", "[cpu][train][precision]") {
  TempDir tmp;
  const TrainResult f32 = run_training(small_config(tmp.path / "f32", "simplecnn", "f32"));
  const TrainResult tf32 = run_training(small_config(tmp.path / "tf32", "simplecnn", "tf32"));
  CHECK(tf32.losses == f32.losses);
  const JsonValue m = read_manifest(tmp.path / "tf32");
  CHECK(m.at("precision").at("name").string == "tf32");
  CHECK(m.at("precision").at("compute").string == "f32");
  CHECK(m.at("precision").at("tf32").kind == JsonValue::Kind::Bool);
  CHECK_FALSE(m.at("precision").at("tf32").boolean);  // the CPU has no TF32 extra
}

TEST_CASE("train.precision takes f32 or tf32 or bf16 or f16", "[cpu][train][precision]") {
  TempDir tmp;
  Config c = small_config(tmp.path / "run", "mlp", "f32");
  CHECK_THROWS_WITH(c.set("train.precision=\"fp8\""), PLX_CONTAINS("train.precision") &&
                                                          PLX_CONTAINS("fp8") &&
                                                          PLX_CONTAINS("f32, tf32, bf16, f16"));
  CHECK_THROWS_AS(Config::parse("[train]\nprecision = \"half\"\n", "run.toml"), ConfigError);
}

namespace {

struct StepLine {
  double loss, scale;
  bool skipped;
};

std::vector<StepLine> step_lines(const fs::path& run) {
  std::vector<StepLine> out;
  for (const JsonValue& v : read_json_lines((run / "metrics.jsonl").string()))
    if (v.at("type").string == "step")
      out.push_back({v.at("loss").number, v.at("loss_scale").number, v.at("skipped").boolean});
  return out;
}

}  // namespace

TEST_CASE("in f16 the loss scale doubles after each window of finite steps",
          "[cpu][train][precision]") {
  TempDir tmp;
  Config c = small_config(tmp.path / "run", "simplecnn", "f16");
  c.set("train.loss_scale_init=1024");
  c.set("train.loss_scale_window=3");
  const TrainResult r = run_training(c);
  const std::vector<StepLine> lines = step_lines(tmp.path / "run");
  REQUIRE(lines.size() == 12);
  for (size_t i = 0; i < lines.size(); ++i) {
    INFO("step " << i + 1);
    CHECK_FALSE(lines[i].skipped);
    CHECK(lines[i].scale == 1024.0 * std::pow(2.0, static_cast<double>(i / 3)));
  }
  CHECK(r.loss_scale == 16384);
  CHECK(r.skipped_steps == 0);
  CHECK(r.losses.back() < 0.5 * r.losses.front());
  // The epoch lines and the summary carry the scale too.
  int epochs = 0;
  for (const JsonValue& v : read_json_lines((tmp.path / "run/metrics.jsonl").string())) {
    if (v.at("type").string == "epoch") {
      ++epochs;
      CHECK(v.at("skipped_steps").integer == 0);
      CHECK(v.at("loss_scale").number == 1024.0 * std::pow(2.0, (4 * epochs) / 3));
    }
    if (v.at("type").string == "summary") CHECK(v.at("loss_scale").number == 16384);
  }
  CHECK(epochs == 3);
}

TEST_CASE("an f16 overflow skips steps and halves the scale until finite and training proceeds",
          "[cpu][train][precision]") {
  TempDir tmp;
  Config c = small_config(tmp.path / "run", "simplecnn", "f16");
  c.set("train.loss_scale_init=1099511627776");  // 2^40: the f16 gradients overflow
  c.set("train.batch_size=32");                  // 16 steps an epoch
  const TrainResult r = run_training(c);
  const std::vector<StepLine> lines = step_lines(tmp.path / "run");
  REQUIRE(lines.size() == 48);
  CHECK(lines.front().skipped);
  CHECK(lines.front().scale == std::pow(2.0, 40));
  int64_t skipped = 0;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    INFO("step " << i + 1);
    skipped += lines[i].skipped;
    // A skipped step halves the scale; a window of 2000 never doubles it here.
    CHECK(lines[i + 1].scale == (lines[i].skipped ? lines[i].scale / 2 : lines[i].scale));
    CHECK(std::isfinite(lines[i].loss));
  }
  skipped += lines.back().skipped;
  CHECK(skipped == r.skipped_steps);
  CHECK(skipped >= 1);
  CHECK(skipped < 40);
  CHECK_FALSE(lines.back().skipped);
  CHECK(r.loss_scale < std::pow(2.0, 40));
  // Once the scale fits, it trains.
  CHECK(r.losses.back() < 0.5 * r.losses.front());
  REQUIRE(r.epochs.back().test_accuracy);
  CHECK(*r.epochs.back().test_accuracy > 0.8);
}

TEST_CASE("a skipped f16 step leaves the weights and the optimizer untouched",
          "[cpu][train][precision]") {
  TempDir tmp;
  // The initial tensors, as the trainer creates them (seed 5).
  const ModelSpec spec = builtin_model("simplecnn");
  OptimizerOptions opt;
  opt.kind = "sgd";
  opt.momentum = 0.9;
  LossScaling scaling;
  auto sg = build_step(runtime().ops(), spec, 128, spec.input_shape, true, opt, false, PLX_F16,
                       &scaling);
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 5;
  Executable a(cpu(), sg->graph, store, eo);
  // The checkpoint holds every tensor but the loss scaler's states (its meta entries hold it).
  size_t scaler_states = 0;
  for (const auto& [name, t] : store.all()) scaler_states += name.rfind(kLossScalerPrefix, 0) == 0;
  CHECK(scaler_states == 4);  // scale, unscale, good, skipped (SGD: no step count)
  for (const std::string init : {"1099511627776", "1024"}) {
    DYNAMIC_SECTION("initial scale " << init) {
      Config c = small_config(tmp.path / init, "simplecnn", "f16");
      c.set("train.loss_scale_init=" + init);
      c.set("train.max_steps=1");
      const TrainResult r = run_training(c);
      const bool skip = init != "1024";
      CHECK(r.skipped_steps == (skip ? 1 : 0));
      const Checkpoint ck = read_checkpoint((tmp.path / init / "checkpoint.plxckpt").string());
      REQUIRE(ck.tensors.size() == store.all().size() - scaler_states);
      int same = 0;
      for (const CheckpointTensor& t : ck.tensors) {
        INFO(t.name);
        const Tensor& want = store.get(t.name);
        std::vector<uint8_t> bytes(want.nbytes());
        want.copy_to_host(bytes.data());
        same += t.data == bytes;
      }
      // Skipped: every parameter and momentum buffer as initialised. Run: all but the running
      // statistics (simplecnn has none) moved.
      CHECK(same == (skip ? static_cast<int>(ck.tensors.size()) : 0));
      CHECK(ck.meta.at("skipped_steps") == (skip ? "1" : "0"));
      CHECK(std::stod(ck.meta.at("loss_scale")) == (skip ? std::pow(2.0, 39) : 1024));
    }
  }
}

TEST_CASE("an f16 run resumed mid-epoch equals the uninterrupted run, loss scale included",
          "[cpu][train][precision]") {
  TempDir tmp;
  Config full = small_config(tmp.path / "full", "simplecnn", "f16");
  full.set("train.optimizer=\"adamw\"");
  full.set("train.lr=0.002");
  full.set("train.loss_scale_init=4194304");  // 2^22: a few skipped steps first
  full.set("train.loss_scale_window=2");
  const TrainResult whole = run_training(full);
  REQUIRE(whole.losses.size() == 12);
  const auto [losses, second] = stopped_and_resumed(full, tmp.path / "part", 5);
  CHECK(losses == whole.losses);
  CHECK(second.loss_scale == whole.loss_scale);
  CHECK(second.skipped_steps == whole.skipped_steps);
}
