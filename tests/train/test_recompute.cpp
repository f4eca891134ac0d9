// Memory: recomputing cheap activations in backward (train.recompute, BackwardOptions), the
// plan's live peak, max_pool2d's relu_mask as reverse mode sets it, and the ABI gate on
// attributes newer than a plugin (docs/training.md "Memory").
#include <algorithm>
#include <map>
#include <string>

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

// An MLP of `layers` linear -> GELU blocks of `width` and a classifier: GELU's backward reads
// its input, so each block keeps its linear's output h for backward, and the GELU's output g
// for the next linear's weight gradient. Recomputing GELU keeps h only.
struct GeluMlp {
  Graph g{runtime().ops()};
  std::vector<Var> grads;
  GeluMlp(const std::vector<std::string>& recompute, int layers = 4, int64_t n = 256,
          int64_t width = 32) {
    const Var x = g.input("x", {PLX_F32, {n, 16}});
    const Var labels = g.input("labels", {PLX_I32, {n}});
    Var h = x;
    int64_t in = 16;
    for (int i = 0; i < layers; ++i) {
      const std::string name = "l" + std::to_string(i);
      const Var w = g.parameter(name + ".weight", {PLX_F32, {width, in}}, init::kaiming_uniform(in));
      const Var b = g.parameter(name + ".bias", {PLX_F32, {width}}, init::uniform(-0.1, 0.1));
      h = g.add1("gelu", {g.add1("linear", {h, w, b}, {}, name)}, {}, name + ".gelu");
      in = width;
    }
    const Var fw = g.parameter("fc.weight", {PLX_F32, {10, width}}, init::xavier_uniform(width, 10));
    const Var loss =
        g.add1("softmax_cross_entropy", {g.add1("linear", {h, fw}, {}, "fc"), labels}, {}, "loss");
    BackwardOptions o;
    o.recompute = recompute;
    grads = backward(g, loss, g.parameters(), o);
    for (size_t i = 0; i < grads.size(); ++i) g.mark_output(grads[i], "grad" + std::to_string(i));
    g.mark_output(loss, "loss_out");
  }
  int count(const std::string& op, Phase phase) const {
    int k = 0;
    for (const GraphNode& node : g.nodes())
      if (node.schema && node.schema->name == op && node.phase == phase) ++k;
    return k;
  }
};

struct Ran {
  std::vector<std::vector<float>> outputs;
  MemoryPlan plan;
};

Ran run_once(const Graph& g, int64_t rows, int64_t features, size_t num_grads) {
  TensorStore store;
  ExecutableOptions opt;
  opt.seed = 11;
  Executable exe(cpu(), g, store, opt);
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(rows * features), 3, -2.0, 2.0));
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < rows; ++i) labels.push_back(static_cast<int32_t>((i * 3) % 10));
  exe.tensor("labels").copy_from_host(labels.data());
  exe.run();
  exe.sync();
  Ran r;
  r.plan = exe.plan();
  r.outputs.push_back(exe.tensor("loss_out").to_vector<float>());
  for (size_t i = 0; i < num_grads; ++i)
    r.outputs.push_back(exe.tensor("grad" + std::to_string(i)).to_vector<float>());
  return r;
}

// One built-in model's training step at batch 8 with a recompute list, run `steps` times on
// random data: every parameter, momentum and running statistic after, the arena, and the
// backward's recomputed copies ("<node>.recompute <op>", sorted).
struct ModelStep {
  std::map<std::string, std::vector<double>> after;
  uint64_t arena = 0;
  std::vector<std::string> recomputed;
  int backward_nodes_of(const std::string& op) const {
    return static_cast<int>(std::count_if(recomputed.begin(), recomputed.end(),
                                          [&](const std::string& r) { return r.ends_with(" " + op); }));
  }
};

ModelStep run_model_step(const std::string& model, plx_dtype compute, double momentum,
                         const std::vector<std::string>& recompute, int steps) {
  const ModelSpec spec = builtin_model(model);
  OptimizerOptions opt;
  opt.kind = "sgd";
  opt.momentum = momentum;
  auto sg = build_step(runtime().ops(), spec, 8, spec.input_shape, true, opt, false, compute,
                       nullptr, recompute);
  ModelStep r;
  for (const GraphNode& node : sg->graph.nodes()) {
    if (node.phase != Phase::Backward || !node.schema) continue;
    CHECK(node.schema->name != "batch_norm");  // a norm never reduces or updates its stats twice
    if (node.name.ends_with(".recompute")) r.recomputed.push_back(node.name + " " + node.schema->name);
  }
  std::sort(r.recomputed.begin(), r.recomputed.end());
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 3;
  Executable exe(cpu(), sg->graph, store, eo);
  fill(exe.tensor("x"), random_doubles(8 * 28 * 28, 7, -2.0, 2.0));
  std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  exe.tensor("labels").copy_from_host(labels.data());
  fill(exe.tensor("lr"), {0.1});
  for (int step = 0; step < steps; ++step) exe.run();
  exe.sync();
  r.arena = exe.plan().arena_bytes;
  for (const auto& [name, t] : store.all()) r.after[name] = t.to_doubles();
  return r;
}

}  // namespace

TEST_CASE("recomputed GELU outputs give the same gradients in less memory", "[cpu][graph][recompute]") {
  GeluMlp kept({}), again({"gelu"});
  CHECK(kept.count("gelu", Phase::Backward) == 0);
  // Every block's GELU but the last runs again in backward, as the copy's name says. The last
  // one's output is read by the classifier's weight gradient right after the loss: nothing
  // runs between its forward and its backward use, so recomputing it frees nothing.
  CHECK(again.count("gelu", Phase::Backward) == 3);
  CHECK(again.count("gelu", Phase::Forward) == 4);
  bool named = false;
  for (const GraphNode& node : again.g.nodes())
    named = named || (node.phase == Phase::Backward && node.name == "l2.gelu.recompute");
  CHECK(named);

  const Ran a = run_once(kept.g, 256, 16, kept.grads.size());
  const Ran b = run_once(again.g, 256, 16, again.grads.size());
  REQUIRE(a.outputs.size() == b.outputs.size());
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    INFO("output " << i);
    CHECK(a.outputs[i] == b.outputs[i]);  // the same op on the same input: the same floats
  }
  // The GELUs' outputs no longer live from the forward into backward.
  INFO("peak at " << a.plan.peak_node << " -> " << b.plan.peak_node);
  INFO("arena " << a.plan.arena_bytes << " -> " << b.plan.arena_bytes << ", live peak "
                << a.plan.live_peak_bytes << " -> " << b.plan.live_peak_bytes);
  CHECK(b.plan.live_peak_bytes < a.plan.live_peak_bytes);
  CHECK(b.plan.arena_bytes < a.plan.arena_bytes);
}

TEST_CASE("a value is not recomputed when that would keep its input longer", "[cpu][graph][recompute]") {
  // conv -> ReLU -> conv: ReLU's backward reads its output, so the ReLU's input is not kept for
  // backward, and recomputing the ReLU would keep it instead: nothing changes.
  for (bool recompute : {false, true}) {
    Graph g(runtime().ops());
    const Var x = g.input("x", {PLX_F32, {2, 1, 6, 6}});
    const Var w1 = g.parameter("w1", {PLX_F32, {3, 1, 3, 3}}, init::kaiming_uniform(9));
    const Var w2 = g.parameter("w2", {PLX_F32, {2, 3, 3, 3}}, init::kaiming_uniform(27));
    const Var r = g.add1("relu", {g.add1("conv2d", {x, w1}, {}, "c1")}, {}, "r");
    const Var loss = g.add1("sum", {g.add1("conv2d", {r, w2}, {}, "c2")}, {}, "loss");
    BackwardOptions o;
    if (recompute) o.recompute = {"relu", "max_pool2d", "add"};
    backward(g, loss, g.parameters(), o);
    int backward_relus = 0;
    for (const GraphNode& node : g.nodes())
      if (node.schema && node.schema->name == "relu" && node.phase == Phase::Backward) ++backward_relus;
    CHECK(backward_relus == 0);
  }
}

TEST_CASE("mixed precision: the casts of the batch and the weights can be recomputed", "[cpu][graph][recompute]") {
  const ModelStep kept = run_model_step("simplecnn", PLX_BF16, 0, {}, 1);
  const ModelStep again = run_model_step("simplecnn", PLX_BF16, 0, {"cast"}, 1);
  CHECK(kept.backward_nodes_of("cast") == 0);
  // The batch's cast, read by the first convolution's weight gradient at the end of backward,
  // runs again there. The weights' casts, read by the data gradients, are kept: at batch 8 the
  // step's peak is the same without recomputing them (the whole-step check).
  CHECK(again.backward_nodes_of("cast") >= 1);
  CHECK(kept.after == again.after);
}

TEST_CASE("resnet: batch norms recomputed from their saved statistics give the same step in less memory", "[cpu][graph][recompute]") {
  // conv -> BN -> ReLU keeps the conv's output for the BN's backward and the ReLU's output for
  // the ReLU's backward and the next conv's weight gradient. Recomputing BN (as batch_norm_apply
  // from the saved statistics) and the ReLU from the conv's output keeps one tensor instead of
  // two. A block's output, which needs the block's input again, is not recomputed (the rules),
  // nor the last block's (the whole-step check). The running statistics are updated once.
  const ModelStep kept = run_model_step("resnet", PLX_F32, 0.9, {}, 2);
  const ModelStep again = run_model_step("resnet", PLX_F32, 0.9, {"batch_norm", "relu", "add"}, 2);
  CHECK(kept.recomputed.empty());
  const std::vector<std::string> want = {
      "b1_bn1.recompute batch_norm_apply", "b1_relu1.recompute relu",
      "b2_bn1.recompute batch_norm_apply", "b2_relu1.recompute relu",
      "stem_bn.recompute batch_norm_apply", "stem_relu.recompute relu"};
  CHECK(again.recomputed == want);
  // Parameters, momenta and running statistics after two steps: the same bits.
  REQUIRE(kept.after.size() == again.after.size());
  for (const auto& [name, v] : kept.after) {
    INFO(name);
    REQUIRE(again.after.count(name));
    CHECK(again.after.at(name) == v);
  }
  INFO("arena " << kept.arena << " -> " << again.arena);
  CHECK(again.arena < kept.arena);
}

TEST_CASE("train.recompute and BackwardOptions reject ops that cannot be recomputed", "[cpu][graph][recompute]") {
  Graph g(runtime().ops());
  const Var p = g.parameter("p", {PLX_F32, {3}}, init::ones());
  const Var loss = g.add1("sum", {g.add1("mul", {p, p})});
  BackwardOptions o;
  o.recompute = {"conv2d"};
  CHECK_THROWS_WITH(backward(g, loss, {p}, o),
                    PLX_CONTAINS("op 'conv2d' cannot be recomputed (it can be one of: relu"));

  const Config cfg = Config::parse("[train]\nrecompute = [\"relu\", \"dropout\"]\n", "run.toml");
  CHECK_THROWS_AS(recompute_ops(cfg), ConfigError);
  CHECK_THROWS_WITH(recompute_ops(cfg), PLX_CONTAINS("run.toml"));
  CHECK_THROWS_WITH(recompute_ops(cfg),
                    PLX_CONTAINS("train.recompute: 'dropout' is not an op backward can recompute"));
  const Config ok = Config::parse("[train]\nrecompute = [\"relu\", \"max_pool2d\"]\n", "run.toml");
  CHECK(recompute_ops(ok) == std::vector<std::string>{"relu", "max_pool2d"});
}

TEST_CASE("the plan names its live peak and what is live there", "[cpu][graph]") {
  GeluMlp net({});
  const Ran r = run_once(net.g, 256, 16, net.grads.size());
  const MemoryPlan& p = r.plan;
  CHECK(p.live_peak_bytes > 0);
  CHECK(p.live_peak_bytes <= p.arena_bytes);  // no packing goes under it
  CHECK_FALSE(p.peak_node.empty());
  REQUIRE_FALSE(p.peak_live.empty());
  uint64_t sum = 0;
  for (size_t i = 0; i < p.peak_live.size(); ++i) {
    sum += p.peak_live[i].bytes;
    if (i) CHECK(p.peak_live[i - 1].bytes >= p.peak_live[i].bytes);  // largest first
  }
  CHECK(sum == p.live_peak_bytes);
  // Each entry names the node that wrote it, its op and its tensor.
  CHECK_THAT(p.peak_live.front().value, PLX_CONTAINS("f32("));
}

TEST_CASE("reverse mode sets relu_mask on a pool of a ReLU read by nothing else", "[cpu][graph]") {
  Graph g(runtime().ops());
  const Var x = g.input("x", {PLX_F32, {2, 1, 6, 6}});
  const Var w = g.parameter("w", {PLX_F32, {2, 1, 3, 3}}, init::kaiming_uniform(9));
  Attrs pool;
  pool.set("kernel", Ints{2, 2});
  const Var r = g.add1("relu", {g.add1("conv2d", {x, w}, {}, "c")}, {}, "r");
  const Var y = g.add1("max_pool2d", {r}, pool, "p");
  const Var loss = g.add1("sum", {y});
  const Var y2 = g.add1("max_pool2d", {g.add1("relu", {x}, {}, "r2")}, pool, "p2");
  g.mark_output(y2, "y2");  // no gradient flows through it
  const auto grads = backward(g, loss, {w});
  auto attr_of = [&](const std::string& name, const char* key) {
    for (const GraphNode& node : g.nodes())
      if (node.name == name) return node.attrs.get_int(key);
    return int64_t{-1};
  };
  CHECK(attr_of("p", "relu_mask") == 1);
  CHECK(attr_of("p2", "relu_mask") == 1);  // harmless: only the pool's backward reads the indices
  // The indices of a pool whose input gets a gradient are u8 taps in the window; p2's input
  // (x) gets none, so its indices stay as they were.
  CHECK(attr_of("p", "window_index") == 1);
  CHECK(attr_of("p2", "window_index") == 0);
  for (const GraphNode& node : g.nodes())
    if (node.name == "p") CHECK(g.value(node.outputs[1]).desc.dtype == PLX_U8);
  // And no relu_backward: the pool's gradient goes straight to the convolution.
  for (const GraphNode& node : g.nodes()) CHECK(node.op_name() != "relu_backward");
  (void)grads;

  // set_attr checks the attribute as add() does, and keeps the outputs' descriptors.
  const int32_t p = [&] {
    for (size_t n = 0; n < g.nodes().size(); ++n)
      if (g.nodes()[n].name == "p") return static_cast<int32_t>(n);
    return -1;
  }();
  REQUIRE(p >= 0);
  CHECK_THROWS_WITH(g.set_attr(p, "relu_mask", int64_t{3}), PLX_CONTAINS("relu_mask must be 0 or 1"));
  CHECK_THROWS_WITH(g.set_attr(p, "kernel", Ints{3, 3}), PLX_CONTAINS("would change output 0"));
  CHECK_THROWS_WITH(g.set_attr(p, "window_index", int64_t{0}),
                    PLX_CONTAINS("would change output 1 from u8(2, 2, 2, 2) to i32(2, 2, 2, 2), which is read"));
  CHECK_THROWS_WITH(g.set_attr(p, "no_such", int64_t{1}), PLX_CONTAINS("node 'p'"));
}

TEST_CASE("an attribute newer than a plugin's ABI names the minor that brought it", "[cpu][abi]") {
  const OpSchema& pool = runtime().ops().get("max_pool2d");
  Attrs a;
  a.set("kernel", Ints{2, 2});
  std::string why;
  CHECK(schema::abi_minor_needed(pool, pool.complete_attrs(a), &why) == 0);
  a.set("relu_mask", int64_t{1});
  CHECK(schema::abi_minor_needed(pool, pool.complete_attrs(a), &why) == 3);
  CHECK(why == "attribute 'relu_mask' = 1 (ABI 1.3)");
  // Every plugin of this build is 1.3: its kernels take the node.
  const auto out = call(cpu(), "max_pool2d", {random_tensor({1, 1, 4, 4}, PLX_F32, 2)}, a);
  CHECK(out.at(1).shape() == Shape{1, 1, 2, 2});
}
