// Training end to end on the CPU: a model learns the synthetic set, a resumed run's losses equal
// an uninterrupted run's bit for bit, a non-finite loss stops the run and keeps the last good
// checkpoint, and bad configurations fail before any step.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plexus/checkpoint.hpp"
#include "plexus/data.hpp"
#include "plexus/json.hpp"
#include "plexus/run_output.hpp"
#include "plexus/trainer.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;
namespace fs = std::filesystem;

TEST_CASE("a model learns the synthetic set and the run directory has it all", "[cpu][train]") {
  TempDir tmp;
  const TrainResult r = run_training(small_train_config(tmp.path / "run"));
  REQUIRE(r.epochs.size() == 3);
  CHECK(r.steps == 12);
  CHECK(r.losses.size() == 12);
  CHECK(r.losses.back() < r.losses.front());
  REQUIRE(r.epochs.back().test_accuracy);
  CHECK(*r.epochs.back().test_accuracy > 0.9);
  CHECK(r.images_per_s > 0);
  CHECK(r.run_dir == (tmp.path / "run").string());
  // Memory: the allocator's peak is what the plans predict, plus size-class rounding.
  CHECK(r.peak_bytes >= r.planned_bytes);
  CHECK(r.peak_bytes <= r.planned_bytes + r.planned_bytes / 4 + 64 * 1024);

  const std::vector<JsonValue> lines = read_json_lines((tmp.path / "run/metrics.jsonl").string());
  int steps = 0, epochs = 0, summaries = 0;
  for (const JsonValue& v : lines) {
    const std::string type = v.at("type").string;
    steps += type == "step";
    epochs += type == "epoch";
    summaries += type == "summary";
    if (type == "epoch") CHECK(v.find("test_accuracy") != nullptr);
  }
  CHECK(steps == 12);
  CHECK(epochs == 3);
  CHECK(summaries == 1);
  std::ifstream mf(tmp.path / "run/manifest.json");
  std::stringstream ms;
  ms << mf.rdbuf();
  const JsonValue m = parse_json(ms.str(), "manifest.json");
  CHECK(m.at("model").string == "simplecnn");
  CHECK(m.at("seed").string == "5");
  CHECK(m.at("backend").string == "cpu");
  CHECK_FALSE(m.at("git_revision").string.empty());
  CHECK(m.at("config").string.find("synthetic_samples = 512") != std::string::npos);
  CHECK(m.at("plugins").kind == JsonValue::Kind::Array);
  // Every kernel of the training step, named with its node and op (a fused group with its
  // nodes) and implementation.
  const JsonValue& kernels = m.at("kernels");
  REQUIRE(kernels.kind == JsonValue::Kind::Array);
  bool conv = false;
  for (const JsonValue& k : kernels.items)
    conv = conv || (k.string.find("conv2d_1") != std::string::npos && k.string.find(": cpu/") != std::string::npos);
  CHECK(conv);
  const Checkpoint ck = read_checkpoint((tmp.path / "run/checkpoint.plxckpt").string());
  CHECK(ck.meta.at("epoch") == "3");
  CHECK(ck.meta.at("step") == "12");
  CHECK(ck.find("conv2d_1.weight") != nullptr);
  CHECK(ck.find("conv2d_1.weight.momentum_buffer") != nullptr);
}

TEST_CASE("the same seed gives the same run bit for bit", "[cpu][train]") {
  TempDir tmp;
  const TrainResult a = run_training(small_train_config(tmp.path / "a"));
  const TrainResult b = run_training(small_train_config(tmp.path / "b"));
  CHECK(a.losses == b.losses);
  Config other = small_train_config(tmp.path / "c");
  other.set("train.seed=6");
  CHECK(run_training(other).losses != a.losses);
}

TEST_CASE("a resumed run's losses equal an uninterrupted run's", "[cpu][train]") {
  // Mid-epoch stops included: the loader resumes at the batch after the checkpoint. Both
  // optimizers, since AdamW's moments and step count are part of the state.
  for (const std::string opt : {"sgd", "adamw"}) {
    for (int stop : {2, 4, 7}) {
      DYNAMIC_SECTION(opt << " stopped after step " << stop) {
        TempDir tmp;
        Config full = small_train_config(tmp.path / "full");
        full.set("train.optimizer=" + opt);
        full.set("train.schedule=cosine");
        full.set("train.weight_decay=0.01");
        if (opt == "adamw") full.set("train.lr=0.002");
        const TrainResult whole = run_training(full);
        REQUIRE(whole.losses.size() == 12);

        Config part = full;
        part.set("output.dir=\"" + (tmp.path / "part").string() + "\"");
        part.set("train.max_steps=" + std::to_string(stop));
        const TrainResult first = run_training(part);
        REQUIRE(first.losses.size() == static_cast<size_t>(stop));
        Config rest = part;
        rest.set("train.max_steps=0");
        const TrainResult second = run_training(rest, (tmp.path / "part").string());
        std::vector<double> joined = first.losses;
        joined.insert(joined.end(), second.losses.begin(), second.losses.end());
        CHECK(joined == whole.losses);
        CHECK(second.steps == 12);
        REQUIRE(second.epochs.back().test_accuracy);
        CHECK(*second.epochs.back().test_accuracy == *whole.epochs.back().test_accuracy);
      }
    }
  }
}

TEST_CASE("resuming with a config that changes the steps is refused", "[cpu][train]") {
  TempDir tmp;
  Config c = small_train_config(tmp.path / "run");
  c.set("train.max_steps=2");
  run_training(c);
  Config changed = c;
  changed.set("train.lr=0.5");
  CHECK_THROWS_WITH(run_training(changed, (tmp.path / "run").string()),
                    PLX_CONTAINS("train.lr") && PLX_CONTAINS("differs"));
  CHECK_THROWS_WITH(run_training(c, (tmp.path / "nothing").string()),
                    PLX_CONTAINS("no checkpoint there"));
  // More epochs are allowed: that is how a finished run is extended.
  Config longer = c;
  longer.set("train.epochs=4");
  longer.set("train.max_steps=0");
  CHECK(run_training(longer, (tmp.path / "run").string()).steps == 16);
}

TEST_CASE("a non-finite loss stops the run naming the step and keeps the last checkpoint",
          "[cpu][train]") {
  TempDir tmp;
  Config c = small_train_config(tmp.path / "run");
  c.set("output.checkpoint_steps=2");
  c.set("train.epochs=1");
  c.set("train.momentum=0");
  // A rate this large overflows the weights to inf within a few steps.
  c.set("train.lr=1e30");
  std::string message;
  try {
    run_training(c);
  } catch (const DivergedError& e) {
    message = e.what();
  }
  INFO(message);
  REQUIRE_FALSE(message.empty());
  CHECK_THAT(message, PLX_CONTAINS("step ") && PLX_CONTAINS("the loss is"));
  const std::string ckpt = (tmp.path / "run/checkpoint.plxckpt").string();
  const std::vector<JsonValue> lines = read_json_lines((tmp.path / "run/metrics.jsonl").string());
  REQUIRE_FALSE(lines.empty());
  CHECK(lines.back().at("type").string == "stop");
  const int64_t bad_step = std::stoll(lines.back().at("step").string);
  if (bad_step > 2) {
    CHECK_THAT(message, PLX_CONTAINS("last good checkpoint is kept"));
    const Checkpoint ck = read_checkpoint(ckpt);
    CHECK(std::stoll(ck.meta.at("step")) < bad_step);
    for (const CheckpointTensor& t : ck.tensors) {
      const float* f = reinterpret_cast<const float*>(t.data.data());
      for (size_t i = 0; i < t.data.size() / 4; ++i) REQUIRE(std::isfinite(f[i]));
    }
  } else {
    CHECK_THAT(message, PLX_CONTAINS("No checkpoint had been written yet"));
  }
}

TEST_CASE("bad training configurations fail before the first step", "[cpu][train]") {
  TempDir tmp;
  Config c = small_train_config(tmp.path / "run");
  c.set("model.name=nosuchmodel");
  CHECK_THROWS_WITH(run_training(c), PLX_CONTAINS("nosuchmodel"));
  Config d = small_train_config(tmp.path / "run");
  d.set("data.dataset=fashion-mnist");
  d.set("data.path=\"" + (tmp.path / "missing").string() + "\"");
  CHECK_THROWS_AS(run_training(d), DataError);
  CHECK_THROWS_WITH(run_training(d), PLX_CONTAINS("dataset-fashion-mnist"));
  Config e = small_train_config(tmp.path / "run");
  e.set("train.schedule=step");
  e.set("train.gamma=0");
  CHECK_THROWS_WITH(run_training(e), PLX_CONTAINS("train.gamma"));
  Config f = small_train_config(tmp.path / "run");
  f.set("model.file=\"" + (tmp.path / "nomodel.toml").string() + "\"");
  CHECK_THROWS_WITH(run_training(f), PLX_CONTAINS("nomodel.toml"));
  CHECK_FALSE(fs::exists(tmp.path / "run" / "checkpoint.plxckpt"));
}

TEST_CASE("train.target_accuracy stops after the first epoch that reaches it and times it",
          "[cpu][train]") {
  TempDir tmp;
  const TrainResult full = run_training(small_train_config(tmp.path / "full"));
  REQUIRE(full.epochs.size() == 3);
  CHECK_FALSE(full.target);
  // The second epoch's accuracy as the target: the first epoch at or above it ends the run.
  const double target = *full.epochs[1].test_accuracy;
  size_t first = 0;
  while (*full.epochs[first].test_accuracy < target) ++first;
  Config c = small_train_config(tmp.path / "run");
  c.set("train.target_accuracy=" + json_number(target));
  const TrainResult r = run_training(c);
  REQUIRE(r.target);
  CHECK(r.target->reached);
  CHECK(r.target->accuracy == target);
  CHECK(r.target->epoch == static_cast<int64_t>(first + 1));
  CHECK(r.epochs.size() == first + 1);
  CHECK(r.steps == 4 * static_cast<int64_t>(first + 1));  // 512 samples, batch 128
  CHECK(r.target->step == r.steps);
  CHECK(r.target->test_accuracy == *full.epochs[first].test_accuracy);
  CHECK(r.target->train_seconds > 0);
  CHECK(r.target->train_seconds <= r.target->wall_seconds);  // evaluation is not counted
  // The same steps as the full run's first epochs, to the bit; the checkpoint is that epoch's.
  REQUIRE(r.losses.size() <= full.losses.size());
  CHECK(std::equal(r.losses.begin(), r.losses.end(), full.losses.begin()));
  CHECK(read_checkpoint((tmp.path / "run/checkpoint.plxckpt").string()).meta.at("epoch") ==
        std::to_string(first + 1));
  int target_lines = 0;
  for (const JsonValue& v : read_json_lines((tmp.path / "run/metrics.jsonl").string())) {
    const std::string type = v.at("type").string;
    if (type == "target") {
      ++target_lines;
      CHECK(v.at("epoch").number == static_cast<double>(first + 1));
      CHECK(v.at("train_seconds").number == r.target->train_seconds);
    }
    if (type == "summary") {
      CHECK(v.at("target_reached").boolean);
      CHECK(v.at("target_epoch").number == static_cast<double>(first + 1));
    }
  }
  CHECK(target_lines == 1);

  // A target above every epoch's accuracy: all epochs run, and the summary says so.
  double best = 0;
  for (const EpochMetrics& e : full.epochs) best = std::max(best, *e.test_accuracy);
  if (best < 1) {
    Config u = small_train_config(tmp.path / "unreached");
    u.set("train.target_accuracy=1");
    const TrainResult ur = run_training(u);
    REQUIRE(ur.target);
    CHECK_FALSE(ur.target->reached);
    CHECK(ur.epochs.size() == 3);
    CHECK(ur.losses == full.losses);
  }

  // A target needs the test accuracy, and is a fraction.
  Config e = small_train_config(tmp.path / "noeval");
  e.set("train.target_accuracy=0.9");
  e.set("train.eval=false");
  CHECK_THROWS_AS(run_training(e), ConfigError);
  CHECK_THROWS_WITH(run_training(e), PLX_CONTAINS("train.target_accuracy = 0.9 needs train.eval = true"));
  Config f = small_train_config(tmp.path / "range");
  CHECK_THROWS_WITH(f.set("train.target_accuracy=91"),
                    PLX_CONTAINS("train.target_accuracy: expected a number in 0..1, got 91"));
  CHECK_FALSE(fs::exists(tmp.path / "noeval" / "checkpoint.plxckpt"));
}

TEST_CASE("a new run never overwrites an old one", "[cpu][train]") {
  TempDir tmp;
  const std::string base = (tmp.path / "runs/{model}").string();
  CHECK(new_run_dir(base, "m") == (tmp.path / "runs/m").string());
  fs::create_directories(tmp.path / "runs/m");
  CHECK(new_run_dir(base, "m") == (tmp.path / "runs/m").string());  // empty: reused
  std::ofstream(tmp.path / "runs/m/metrics.jsonl") << "{}\n";
  CHECK(new_run_dir(base, "m") == (tmp.path / "runs/m-2").string());
  fs::create_directories(tmp.path / "runs/m-2");
  std::ofstream(tmp.path / "runs/m-2/checkpoint.plxckpt") << "x";
  CHECK(new_run_dir(base, "m") == (tmp.path / "runs/m-3").string());
  CHECK_THROWS_WITH(new_run_dir("", "m"), PLX_CONTAINS("output.dir"));
}

TEST_CASE("batches gathered from the resident data set train exactly as staged ones",
          "[cpu][train]") {
  // The same normalisation and the same rows, once copied from pinned staging buffers and once
  // gathered on the device by sample index (embedding + cast): the runs must agree bit for bit,
  // padded last batches included.
  TempDir tmp;
  Config staged = small_train_config(tmp.path / "staged");
  staged.set("data.resident=\"off\"");
  staged.set("data.partial_batch=\"pad\"");
  staged.set("data.synthetic_samples=500");
  Config resident = small_train_config(tmp.path / "resident");
  resident.set("data.resident=\"on\"");
  resident.set("data.partial_batch=\"pad\"");
  resident.set("data.synthetic_samples=500");
  const TrainResult a = run_training(staged);
  const TrainResult b = run_training(resident);
  REQUIRE(a.losses.size() == 12);
  CHECK(a.losses == b.losses);
  REQUIRE(a.epochs.size() == b.epochs.size());
  for (size_t e = 0; e < a.epochs.size(); ++e) {
    CHECK(a.epochs[e].test_loss == b.epochs[e].test_loss);
    CHECK(a.epochs[e].test_accuracy == b.epochs[e].test_accuracy);
  }
}

TEST_CASE("graph capture switched off gives the same run", "[cpu][train]") {
  // The CPU backend cannot capture, so both runs go op by op; the key must still be accepted and
  // reach the executor without changing a step (on CUDA the comparison is tests/cuda's).
  TempDir tmp;
  Config on = small_train_config(tmp.path / "on");
  Config off = small_train_config(tmp.path / "off");
  off.set("train.graph_capture=false");
  CHECK(run_training(on).losses == run_training(off).losses);
}
