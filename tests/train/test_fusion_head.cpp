// The classifier head as one kernel: linear -> [cast to f32] -> softmax_cross_entropy, with the
// argmax of the logits and the loss's backward when the graph allows (sdk::find_linear_cross_
// entropy). On the CPU the fused kernel runs the linear's own GEMM call and the ops' row loops
// in the same order, so the fused step must equal the unfused one to the bit: the loss, the
// predictions and every parameter gradient.
#include <cmath>
#include <map>

#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

constexpr int64_t kRows = 7, kIn = 6, kHidden = 9, kClasses = 5;

struct Head {
  plx_dtype d = PLX_F32;
  std::string reduction = "mean";
  int64_t ignore_index = -100;
  double smoothing = 0;
  bool bias = true;
  bool mixed = false;             // the linear in d, its output cast to f32 for the loss
  bool scaled = false;            // a loss_scale mul reads the loss before its backward
  bool logits_elsewhere = false;  // a softmax of the logits is a graph output too
  bool argmax = true;
  std::vector<int32_t> labels = {0, 3, -100, 4, 1, -100, 2};
};

struct HeadRun {
  std::map<std::string, std::vector<uint8_t>> bytes;  // every graph output
  MemoryPlan plan;
  std::vector<std::string> kernels;
};

// tanh(linear(x)) -> linear -> [cast] -> cross-entropy [-> mul] -> argmax, then the backward to
// every parameter (from a random dloss with reduction none), as the trainer builds it.
Graph head_graph(const Head& h, std::vector<std::string>* outputs) {
  Graph g(runtime().ops());
  const plx_dtype ld = h.mixed ? PLX_F32 : h.d;  // the loss's dtype
  const Var x = g.input("x", {h.d, {kRows, kIn}});
  const Var labels = g.input("labels", {PLX_I32, {kRows}});
  const Var w1 = g.parameter("h.weight", {h.d, {kHidden, kIn}}, init::xavier_uniform(kIn, kHidden));
  const Var b1 = g.parameter("h.bias", {h.d, {kHidden}}, init::uniform(-0.2, 0.2));
  const Var w2 =
      g.parameter("out.weight", {h.d, {kClasses, kHidden}}, init::xavier_uniform(kHidden, kClasses));
  const Var hid = g.add1("tanh", {g.add1("linear", {x, w1, b1}, {}, "h")}, {}, "tanh");
  std::vector<Var> lin_in = {hid, w2};
  if (h.bias) lin_in.push_back(g.parameter("out.bias", {h.d, {kClasses}}, init::uniform(-0.5, 0.5)));
  Var logits = g.add1("linear", lin_in, {}, "out");
  if (h.mixed) logits = g.add1("cast", {logits}, {{"dtype", std::string("f32")}}, "logits.cast");
  Attrs la;
  la.set("reduction", h.reduction);
  la.set("ignore_index", h.ignore_index);
  la.set("label_smoothing", h.smoothing);
  Var loss = g.add("softmax_cross_entropy", {logits, labels}, la, "loss").at(0);
  if (h.scaled)
    loss = g.add1("mul", {loss, g.input("loss_scale", {ld, {}})}, {}, "loss.scale");
  if (h.argmax) {
    Attrs aa;
    aa.set("axis", int64_t{1});
    g.mark_output(g.add1("argmax", {logits}, aa, "pred"), "pred_out");
    outputs->push_back("pred_out");
  }
  if (h.logits_elsewhere) {
    g.mark_output(g.add1("softmax", {logits}, {}, "probs"), "probs");
    outputs->push_back("probs");
  }
  const std::vector<Var> params = g.parameters();
  const std::vector<Var> grads =
      h.reduction == "none" ? backward(g, loss, params, g.input("dloss", {ld, {kRows}}))
                            : backward(g, loss, params);
  g.mark_output(loss, "loss_out");
  outputs->push_back("loss_out");
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string name = g.value(params[i]).name + ".grad";
    g.mark_output(grads[i], name);
    outputs->push_back(name);
  }
  return g;
}

HeadRun run_head(const Head& h, bool fuse) {
  std::vector<std::string> outputs;
  const Graph g = head_graph(h, &outputs);
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 17;
  eo.fuse = fuse;
  Executable exe(cpu(), g, store, eo);
  HeadRun r;
  r.plan = exe.plan();
  r.kernels = exe.kernel_names();
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(kRows * kIn), 3, -2, 2));
  exe.tensor("labels").copy_from_host(h.labels.data());
  if (h.scaled) fill(exe.tensor("loss_scale"), {4.0});
  if (h.reduction == "none") fill(exe.tensor("dloss"), random_doubles(kRows, 5, 0.5, 1.5));
  exe.run();
  exe.sync();
  for (const std::string& name : outputs) {
    const Tensor t = exe.tensor(name);
    auto& b = r.bytes[name];
    b.resize(t.nbytes());
    t.copy_to_host(b.data());
  }
  return r;
}

bool has_kernel(const HeadRun& r, const std::string& text) {
  for (const auto& k : r.kernels)
    if (k.find(text) != std::string::npos) return true;
  return false;
}

std::string kernels_of(const HeadRun& r) {
  std::string s;
  for (const auto& k : r.kernels) s += k + "\n";
  return s;
}

// Fused and unfused outputs agree to the bit; returns the fused run.
HeadRun check_same(const Head& h) {
  const HeadRun fused = run_head(h, true);
  const HeadRun plain = run_head(h, false);
  INFO("fused kernels:\n" << kernels_of(fused));
  for (const auto& [name, b] : plain.bytes) {
    INFO(name);
    CHECK(fused.bytes.at(name) == b);
  }
  CHECK(plain.plan.fused_kernels == 0);
  return fused;
}

}  // namespace

TEST_CASE("the classifier head fused on the CPU equals its nodes run one by one, bit for bit",
          "[cpu][fusion]") {
  for (plx_dtype d : {PLX_F32, PLX_BF16, PLX_F64})
    for (const char* red : {"mean", "sum", "none"})
      for (double eps : {0.0, 0.1}) {
        Head h;
        h.d = d;
        h.reduction = red;
        h.smoothing = eps;
        INFO(dtype_name(d) << " reduction " << red << " label_smoothing " << eps);
        const HeadRun fused = check_same(h);
        // linear, loss, argmax and the backward as one kernel; the hidden linear+tanh as another.
        CHECK(has_kernel(fused, "fused kernel 'linear+softmax_cross_entropy' [out, loss, pred, "));
        CHECK(has_kernel(fused, ": cpu/linear+softmax_cross_entropy"));
        CHECK_FALSE(has_kernel(fused, "softmax_cross_entropy_backward: cpu/omp"));
        CHECK_FALSE(has_kernel(fused, "argmax: cpu/omp"));
        CHECK(fused.plan.fused_kernels == 2);
        CHECK(fused.plan.fused_nodes == 2 + 4);
        // The hidden pre-activation, the logits and log_probs are never allocated.
        CHECK(fused.plan.internal_values == 3);
      }
}

TEST_CASE("the fused classifier head: ignored rows, an ignored valid class, no bias, every row ignored",
          "[cpu][fusion]") {
  for (plx_dtype d : {PLX_F32, PLX_BF16})
    for (const char* red : {"mean", "sum", "none"}) {
      INFO(dtype_name(d) << " reduction " << red);
      Head h;
      h.d = d;
      h.reduction = red;
      h.smoothing = 0.2;
      {
        INFO("ignore_index 4, a valid class");
        Head a = h;
        a.ignore_index = 4;
        a.labels = {0, 3, 4, 4, 1, 2, 2};
        check_same(a);
      }
      {
        INFO("no bias");
        Head a = h;
        a.bias = false;
        check_same(a);
      }
      {
        INFO("every row ignored: the mean is 0 and every gradient 0");
        Head a = h;
        a.labels.assign(kRows, -100);
        const HeadRun fused = check_same(a);
        std::vector<uint8_t> zero(fused.bytes.at("loss_out").size(), 0);
        CHECK(fused.bytes.at("loss_out") == zero);
      }
      {
        INFO("no argmax");
        Head a = h;
        a.argmax = false;
        const HeadRun fused = check_same(a);
        CHECK(has_kernel(fused, "fused kernel 'linear+softmax_cross_entropy' [out, loss, loss.grad]"));
      }
    }
}

TEST_CASE("the fused classifier head: NaN logits and a label out of range behave as the nodes do",
          "[cpu][fusion]") {
  SECTION("a NaN input row") {
    // x's first row NaN: its logits, loss and gradient are NaN and its prediction is class 0
    // (the first NaN), in both runs; the mean is NaN.
    for (bool fuse : {true, false}) {
      std::vector<std::string> outputs;
      Head h;
      const Graph g = head_graph(h, &outputs);
      TensorStore store;
      ExecutableOptions eo;
      eo.seed = 17;
      eo.fuse = fuse;
      Executable exe(cpu(), g, store, eo);
      std::vector<double> x = random_doubles(static_cast<size_t>(kRows * kIn), 3, -2, 2);
      for (int64_t k = 0; k < kIn; ++k) x[static_cast<size_t>(k)] = std::nan("");
      fill(exe.tensor("x"), x);
      exe.tensor("labels").copy_from_host(h.labels.data());
      exe.run();
      exe.sync();
      INFO("fuse " << fuse);
      CHECK(std::isnan(exe.tensor("loss_out").to_doubles().at(0)));
      CHECK(exe.tensor("pred_out").to_doubles().at(0) == 0);
      CHECK(std::isnan(exe.tensor("out.bias.grad").to_doubles().at(0)));
    }
  }
  SECTION("a label out of range is the same error") {
    for (bool fuse : {true, false}) {
      INFO("fuse " << fuse);
      std::vector<std::string> outputs;
      Head h;
      const Graph g = head_graph(h, &outputs);
      TensorStore store;
      ExecutableOptions eo;
      eo.fuse = fuse;
      Executable exe(cpu(), g, store, eo);
      fill(exe.tensor("x"), random_doubles(static_cast<size_t>(kRows * kIn), 3));
      std::vector<int32_t> labels = h.labels;
      labels[3] = 9;
      exe.tensor("labels").copy_from_host(labels.data());
      CHECK_THROWS_WITH(exe.run(), PLX_CONTAINS("row 3 has label 9, outside [0, 5)"));
    }
  }
}

TEST_CASE("what the CPU claims of the classifier head", "[cpu][fusion]") {
  SECTION("mixed precision: the cast to f32 joins the group") {
    for (plx_dtype d : {PLX_BF16, PLX_F16}) {
      INFO(dtype_name(d));
      Head h;
      h.d = d;
      h.mixed = true;
      const HeadRun fused = check_same(h);
      CHECK(has_kernel(fused, "'linear+softmax_cross_entropy' [out, logits.cast, loss, pred, "));
      CHECK(fused.plan.internal_values == 4);  // the pre-activation, both logits, log_probs
    }
  }
  SECTION("a loss_scale mul reads the loss before its backward: linear and loss only") {
    Head h;
    h.scaled = true;
    const HeadRun fused = check_same(h);
    // The mul reads the loss right after the cross-entropy: the argmax and the backward, after
    // it, stay out; the group writes the logits and log_probs for them.
    CHECK(has_kernel(fused, "fused kernel 'linear+softmax_cross_entropy' [out, loss]:"));
    CHECK(has_kernel(fused, "pred argmax: cpu/omp"));
    CHECK(has_kernel(fused, "softmax_cross_entropy_backward: cpu/omp"));
    CHECK(fused.plan.internal_values == 1);  // only the hidden pre-activation
  }
  SECTION("logits read by another node: no claim") {
    Head h;
    h.logits_elsewhere = true;
    const HeadRun fused = check_same(h);
    CHECK_FALSE(has_kernel(fused, "linear+softmax_cross_entropy"));
    CHECK(fused.plan.fused_kernels == 1);  // the hidden linear+tanh only
  }
}
