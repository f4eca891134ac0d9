// The training step's loss: train.label_smoothing reaches the training graph's cross-entropy
// (and only the training graph's), with the weight PyTorch's CrossEntropyLoss gives it.
#include <cmath>
#include <string>
#include <vector>

#include "plexus/config.hpp"
#include "plexus/error.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/model.hpp"
#include "support/harness.hpp"
#include "train/step_graph.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

struct LossRun {
  double loss = 0;
  std::vector<const GraphNode*> ce;  // the graph's softmax_cross_entropy nodes
  double smoothing_attr = -1;        // the loss node's label_smoothing
};

// One step of simplecnn with a learning rate of 0 (nothing moves) on a fixed batch of 8, the
// same parameters every time (the executable's seed): its loss_value.
LossRun run_loss(bool training, double smoothing) {
  const ModelSpec spec = builtin_model("simplecnn");
  const int64_t n = 8;
  OptimizerOptions opt;
  opt.kind = "sgd";
  opt.momentum = 0;
  auto sg = build_step(runtime().ops(), spec, n, spec.input_shape, training, opt, false, PLX_F32,
                       nullptr, {}, smoothing);
  LossRun r;
  for (const GraphNode& node : sg->graph.nodes())
    if (node.schema && node.schema->name == "softmax_cross_entropy") {
      r.ce.push_back(&node);
      if (node.attrs.has("label_smoothing")) r.smoothing_attr = node.attrs.get_float("label_smoothing");
    }
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 3;
  Executable exe(cpu(), sg->graph, store, eo);
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 28 * 28), 7, -2.0, 2.0));
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>((i * 3) % spec.classes));
  exe.tensor("labels").copy_from_host(labels.data());
  if (training) fill(exe.tensor("lr"), {0.0});
  exe.run();
  exe.sync();
  r.loss = exe.tensor("loss_value").to_doubles().at(0);
  return r;
}

}  // namespace

TEST_CASE("train.label_smoothing weighs the training loss as PyTorch does, and not the test loss",
          "[cpu][train]") {
  const LossRun plain = run_loss(true, 0), uniform = run_loss(true, 1), smooth = run_loss(true, 0.1);
  REQUIRE(plain.ce.size() == 1);
  REQUIRE(smooth.ce.size() == 1);
  CHECK(plain.smoothing_attr == 0);
  CHECK(smooth.smoothing_attr == Approx(0.1));
  // (1 - e) times the cross-entropy with the label plus e times the mean over the classes of
  // -log p: linear in e, from the label's term at 0 to the uniform target's at 1.
  CHECK(std::isfinite(plain.loss));
  CHECK(uniform.loss != Approx(plain.loss));
  CHECK(smooth.loss == Approx(0.9 * plain.loss + 0.1 * uniform.loss).epsilon(1e-5));
  // The uniform target's loss is at least log(classes) (the cross-entropy of a uniform target is
  // the entropy of it plus a divergence) and the smoothed loss lies between the two ends.
  CHECK(uniform.loss >= std::log(10.0) - 1e-6);
  CHECK(smooth.loss > std::min(plain.loss, uniform.loss));
  CHECK(smooth.loss < std::max(plain.loss, uniform.loss));
  // The evaluation step's loss is the plain cross-entropy (summed over the rows) whatever the
  // training loss's smoothing.
  const LossRun eval = run_loss(false, 0.1);
  CHECK(eval.smoothing_attr == 0);
  CHECK(eval.loss / 8 == Approx(plain.loss).epsilon(1e-6));
}

TEST_CASE("train.label_smoothing above 1 or below 0 is an error naming the file, key and value",
          "[cpu][train][config]") {
  REQUIRE_THROWS_WITH(Config::parse("[train]\nlabel_smoothing = 1.5\n", "run.toml"),
                      PLX_CONTAINS("run.toml:2:19: train.label_smoothing") &&
                          PLX_CONTAINS("got 1.5"));
  REQUIRE_THROWS_WITH(Config::parse("[train]\nlabel_smoothing = -0.1\n", "run.toml"),
                      PLX_CONTAINS("train.label_smoothing"));
  CHECK(Config::parse("[train]\nlabel_smoothing = 0.1\n", "run.toml").get_float(
            "train.label_smoothing") == Approx(0.1));
}
