// Fusion: the backend claims groups of nodes (abi/backend.h get_capability, sdk/fusion.hpp), the
// executor checks each claim, runs accepted groups as one kernel at the last node's place, and
// gives values read only inside a group no memory. A fused step must compute exactly what the
// nodes compute one by one.
#include <cstring>

#include "plexus/backend.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/optimizer.hpp"
#include "plexus/plugin.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

// conv -> batch norm -> relu, conv -> tanh, a skip connection, pool, linear -> relu, linear,
// cross-entropy: the CPU backend fuses bn+relu, conv2d+tanh and linear+relu, the classifier head
// (the last linear, the loss and its backward), and the optimizer's updates into one
// multi-tensor kernel.
Var model(Graph& g, int64_t n, plx_dtype d) {
  const Var x = g.input("x", {d, {n, 2, 6, 6}});
  const Var labels = g.input("labels", {PLX_I32, {n}});
  const Var w1 = g.parameter("c1.weight", {d, {3, 2, 3, 3}}, init::kaiming_uniform(18));
  const Var b1 = g.parameter("c1.bias", {d, {3}}, init::uniform(-0.2, 0.2));
  const Var gamma = g.parameter("bn.weight", {d, {3}}, init::uniform(0.5, 1.5));
  const Var beta = g.parameter("bn.bias", {d, {3}}, init::uniform(-0.2, 0.2));
  const Var rm = g.state("bn.running_mean", {d, {3}}, init::zeros());
  const Var rv = g.state("bn.running_var", {d, {3}}, init::ones());
  const Var w2 = g.parameter("c2.weight", {d, {3, 3, 3, 3}}, init::kaiming_normal(27));
  const Var fw = g.parameter("fc.weight", {d, {8, 27}}, init::xavier_uniform(27, 8));
  const Var fb = g.parameter("fc.bias", {d, {8}}, init::zeros());
  const Var ow = g.parameter("out.weight", {d, {4, 8}}, init::xavier_uniform(8, 4));
  Attrs pad1;
  pad1.set("padding", std::vector<int64_t>{1, 1});
  Attrs pool;
  pool.set("kernel", std::vector<int64_t>{2, 2});
  Var h = g.add1("conv2d", {x, w1, b1}, pad1, "c1");
  h = g.add1("batch_norm", {h, gamma, beta, rm, rv}, {}, "bn");
  h = g.add1("relu", {h}, {}, "relu1");
  Var r = g.add1("conv2d", {h, w2}, pad1, "c2");
  r = g.add1("tanh", {r}, {}, "tanh");
  h = g.add1("add", {h, r}, {}, "skip");
  h = g.add1("max_pool2d", {h}, pool, "pool");
  h = g.reshape(h, {n, -1});
  h = g.add1("relu", {g.add1("linear", {h, fw, fb}, {}, "fc")}, {}, "relu2");
  const Var logits = g.add1("linear", {h, ow}, {}, "out");
  return g.add1("softmax_cross_entropy", {logits, labels}, {}, "loss");
}

struct StepResult {
  std::vector<std::vector<uint8_t>> bytes;  // losses, then every parameter and state
  MemoryPlan plan;
  std::vector<std::string> kernels;
};

// Runs steps 1 to 3 (`before(step)` feeds what changes per step) and keeps each step's loss,
// then every parameter and state, as bytes.
template <class F>
void run_steps(Executable& exe, const TensorStore& store, StepResult& r, F&& before) {
  for (int step = 1; step <= 3; ++step) {
    before(step);
    exe.run();
    exe.sync();
    const Tensor l = exe.tensor("loss_out");
    r.bytes.emplace_back(l.nbytes());
    l.copy_to_host(r.bytes.back().data());
  }
  for (const auto& [name, t] : store.all()) {
    r.bytes.emplace_back(t.nbytes());
    t.copy_to_host(r.bytes.back().data());
  }
}

StepResult train(bool fuse, const std::string& optimizer, plx_dtype d) {
  const int64_t n = 4;
  Graph g(runtime().ops());
  const Var loss = model(g, n, d);
  const std::vector<Var> params = g.parameters();
  OptimizerOptions o;
  o.kind = optimizer;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  add_optimizer(g, params, backward(g, loss, params), o);
  g.mark_output(loss, "loss_out");
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 11;
  eo.fuse = fuse;
  Executable exe(cpu(), g, store, eo);
  StepResult r;
  r.plan = exe.plan();
  r.kernels = exe.kernel_names();
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 72), 7));
  exe.tensor("labels").copy_from_host(std::vector<int32_t>{0, 1, 2, 3}.data());
  fill(exe.tensor("lr"), {0.05});
  run_steps(exe, store, r, [&](int step) {
    if (optimizer == "adamw") fill(exe.tensor("step"), {static_cast<double>(step)});
  });
  return r;
}

bool has_kernel(const StepResult& r, const std::string& text) {
  for (const auto& k : r.kernels)
    if (k.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("a step fused on the CPU equals the step run node by node, bit for bit",
          "[cpu][fusion]") {
  for (const char* optimizer : {"sgd", "adamw"})
    for (plx_dtype d : {PLX_F32, PLX_F64}) {
      INFO(optimizer << " " << dtype_name(d));
      const StepResult fused = train(true, optimizer, d);
      const StepResult plain = train(false, optimizer, d);
      CHECK(fused.bytes == plain.bytes);
      CHECK(plain.plan.fused_kernels == 0);
      // The optimizer's 8 updates as one kernel; bn+relu, conv2d+tanh and linear+relu; the
      // head: linear, loss and the loss's backward (its logits and log_probs never stored).
      CHECK(fused.plan.fused_kernels == 5);
      CHECK(fused.plan.fused_nodes == 8 + 6 + 3);
      CHECK(fused.plan.internal_values == 3 + 2);
      CHECK(fused.plan.activation_buffers == plain.plan.activation_buffers - 3 - 2);
      CHECK(fused.plan.unplanned_bytes < plain.plan.unplanned_bytes);
      CHECK(fused.kernels.size() == plain.kernels.size() - 8 + 1 - 3 - 2);
      CHECK(has_kernel(fused, "fused kernel 'multi_tensor_" + std::string(optimizer) + "'"));
      CHECK(has_kernel(fused, "[bn, relu1]: cpu/batch_norm+relu"));
      CHECK(has_kernel(fused, "[c2, tanh]: cpu/conv2d+tanh"));
      CHECK(has_kernel(fused, "[fc, relu2]: cpu/linear+relu"));
      CHECK(has_kernel(fused, "[out, loss, loss.grad]: cpu/linear+softmax_cross_entropy"));
    }
}

TEST_CASE("an error inside a fused kernel names the fused kernel and its nodes", "[cpu][fusion]") {
  Graph g(runtime().ops());
  const Var a = g.parameter("a", {PLX_F32, {3}}, init::ones());
  const Var b = g.parameter("b", {PLX_F32, {5}}, init::ones());
  const Var loss = g.add1("add", {g.add1("sum", {a}), g.add1("sum", {b})}, {}, "loss");
  OptimizerOptions o;
  o.kind = "adamw";
  add_optimizer(g, {a, b}, backward(g, loss, {a, b}), o);
  TensorStore store;
  Executable exe(cpu(), g, store);
  REQUIRE(exe.plan().fused_kernels == 1);
  fill(exe.tensor("lr"), {0.1});
  fill(exe.tensor("step"), {0});  // AdamW's first step is 1
  CHECK_THROWS_WITH(exe.run(), PLX_CONTAINS("fused kernel 'multi_tensor_adamw' (adamw.a, adamw.b)") &&
                                   PLX_CONTAINS("step must be >= 1"));
}

TEST_CASE("the executor checks a backend's claims and runs what it declines node by node",
          "[cpu][fusion]") {
  // Claims, in order, and what the core must answer:
  //   0,2  node 1 between them reads what node 0 writes        refused
  //   1,2  add -> relu                                           accepted, fused
  //   2    node 2 is in the claim before                         refused
  //   0,1  node 1 likewise                                       refused
  //   99   no such node                                          refused
  //   3,5  node 4 between them reads s, which node 3 writes      refused
  //   4,6  node 5 between them writes s, which node 4 reads      refused
  //   4,5  relu(s), then s += x: nothing between them            accepted, then declined by
  //                                                              the backend (not a chain)
  //   7    a reshape view                                        refused
  // The decline frees nodes 4 and 5, and the core offers the graph again: every claim is then
  // refused (1,2 was created; 4,5 was declined), and that round, declining nothing, is the last.
  const std::string claims = "0,2;1,2;2;0,1;99;3,5;4,6;4,5;7";
  const std::string r = std::to_string(PLX_ERR_INVALID_ARGUMENT);
  std::string all_refused;
  for (int i = 0; i < 9; ++i) all_refused += " " + r;
  const std::string expected =
      r + " 0 " + r + " " + r + " " + r + " " + r + " " + r + " 0 " + r + " |" + all_refused;
  auto run = [&](bool fuse, MemoryPlan* plan) {
    RuntimeOptions o;
    o.plugins.paths = {fixture_dir() + "/good"};
    o.plugins.use_env = false;
    o.plugins.use_default_dir = false;
    o.plugins.options["testgood"]["claims"] = claims;
    Runtime rt(o);
    Backend& dev = rt.backend("testdev");
    Graph g(rt.ops());
    const Var x = g.input("x", {PLX_F32, {2, 3}});
    const Var s = g.state("s", {PLX_F32, {2, 3}}, init::constant(0.5));
    const Var a = g.add1("relu", {x}, {}, "n0");                  // node 0
    const Var b = g.add1("add", {a, x}, {}, "n1");                // node 1
    const Var c = g.add1("relu", {b}, {}, "n2");                  // node 2
    g.add("testgood.accumulate", {s, c}, {}, "n3");               // node 3
    const Var d = g.add1("relu", {s}, {}, "n4");                  // node 4
    g.add("testgood.accumulate", {s, x}, {}, "n5");               // node 5
    const Var e = g.add1("relu", {x}, {}, "n6");                  // node 6
    const Var f = g.add1("relu", {g.reshape(e, {3, 2})}, {}, "n8");  // node 7 views, node 8
    g.mark_output(c, "c");
    g.mark_output(d, "d");
    g.mark_output(f, "f");
    TensorStore store;
    ExecutableOptions eo;
    eo.fuse = fuse;
    Executable exe(dev, g, store, eo);
    *plan = exe.plan();
    if (fuse) {
      auto statuses = reinterpret_cast<const char* (*)()>(
          dev.table().get_proc_address(dev.table().ctx, "testgood.claim_statuses"));
      REQUIRE(statuses != nullptr);
      CHECK(std::string(statuses()) == expected);
    }
    exe.tensor("x").copy_from_host(std::vector<float>{1, -2, 3, -4, 5, -6}.data());
    std::vector<float> out;
    for (int step = 0; step < 2; ++step) {
      exe.run();
      exe.sync();
      for (const char* name : {"c", "d", "f", "s"})
        for (float v : exe.tensor(name).to_vector<float>()) out.push_back(v);
    }
    return out;
  };
  MemoryPlan fused, plain;
  const std::vector<float> with = run(true, &fused);
  const std::vector<float> without = run(false, &plain);
  CHECK(with == without);
  // c = relu(relu(x) + x); after step 1 s = 0.5 + c + x, d = relu(s) read before n5 adds x.
  const std::vector<float> c1{2, 0, 6, 0, 10, 0};
  CHECK(std::vector<float>(with.begin(), with.begin() + 6) == c1);
  const std::vector<float> d1{2.5f, 0.5f, 6.5f, 0.5f, 10.5f, 0.5f};
  CHECK(std::vector<float>(with.begin() + 6, with.begin() + 12) == d1);
  CHECK(fused.fused_kernels == 1);
  CHECK(fused.fused_nodes == 2);
  CHECK(fused.internal_values == 1);  // add's output lives only inside the fused kernel
  CHECK(plain.fused_kernels == 0);
}

namespace {

// The backward of a ReLU with the pool that reads it, written out as it was before reverse mode
// folded the ReLU's mask into the pool's indices (max_pool2d's relu_mask): relu_backward on the
// pooled gradient, then max_pool2d_backward. A graph built by hand may still have it, and the
// CPU runs it as one kernel. `pool_k`/`pool_s`: 2/2 scatters (disjoint windows), 3/2 gathers
// (overlapping ones).
// `window_index`: u8 window taps for indices, as a training step's pools have.
StepResult relu_pool_backward(bool fuse, plx_dtype d, int64_t pool_k, int64_t pool_s,
                              bool window_index) {
  const int64_t n = 3, side = (7 - pool_k) / pool_s + 1;
  Graph g(runtime().ops());
  const Var x = g.input("x", {d, {n, 4, 7, 7}});
  const Var dy = g.input("dy", {d, {n, 4, side, side}});
  Attrs pool;
  pool.set("kernel", std::vector<int64_t>{pool_k, pool_k});
  pool.set("stride", std::vector<int64_t>{pool_s, pool_s});
  if (window_index) pool.set("window_index", int64_t{1});
  const std::vector<Var> p = g.add("max_pool2d", {g.add1("relu", {x}, {}, "r")}, pool, "p");
  Attrs bwd = pool;
  bwd.set("input_shape", std::vector<int64_t>{n, 4, 7, 7});
  const Var masked = g.add1("relu_backward", {dy, p[0]}, {}, "p.grad");
  g.mark_output(g.add1("max_pool2d_backward", {masked, p[1]}, bwd, "p.grad"), "dx");
  TensorStore store;
  ExecutableOptions eo;
  eo.fuse = fuse;
  Executable exe(cpu(), g, store, eo);
  StepResult r;
  r.plan = exe.plan();
  r.kernels = exe.kernel_names();
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 4 * 49), 9));
  fill(exe.tensor("dy"), random_doubles(static_cast<size_t>(n * 4 * side * side), 10));
  exe.run();
  exe.sync();
  const Tensor dx = exe.tensor("dx");
  r.bytes.emplace_back(dx.nbytes());
  dx.copy_to_host(r.bytes.back().data());
  return r;
}

}  // namespace

TEST_CASE("the backward of relu with max-pool runs as one kernel and equals the two ops",
          "[cpu][fusion]") {
  // (16-bit training keeps f32 parameters and casts, which the optimizer's dtypes require; the
  // fused kernel's 16-bit instances are the same template.)
  for (plx_dtype d : {PLX_F32, PLX_F64})
    for (const auto& [k, s] : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {3, 2}})
      for (bool u8 : {false, true}) {
        INFO(dtype_name(d) << " pool " << k << " stride " << s << (u8 ? ", u8 window taps" : ""));
        const StepResult fused = relu_pool_backward(true, d, k, s, u8);
        const StepResult plain = relu_pool_backward(false, d, k, s, u8);
        CHECK(fused.bytes == plain.bytes);
        CHECK(has_kernel(fused, "fused kernel 'relu_backward+max_pool2d_backward'"));
        CHECK(has_kernel(fused, "cpu/relu_backward+max_pool2d_backward"));
        CHECK_FALSE(has_kernel(plain, "relu_backward+max_pool2d_backward"));
        CHECK(has_kernel(plain, "relu_backward: cpu/omp"));
        // The masked pooled gradient is never allocated.
        CHECK(fused.plan.internal_values >= 1);
        CHECK(fused.plan.internal_values > plain.plan.internal_values);
      }
}

// linear -> gelu on the CPU: in an inference graph the linear writes into the GELU's output and
// the GELU runs there in place (an epilogue chain), so the pre-activation is never allocated, and
// the result is the nodes' bit for bit; in a training graph, where gelu_backward reads the
// pre-activation, the pair is not claimed (the CPU has no kernel that writes both).
TEST_CASE(
    "a linear -> gelu pair runs as one chain on the cpu only where nothing else reads its "
    "pre-activation",
    "[cpu][fusion]") {
  const int64_t n = 5, in = 12, out = 7;
  for (const char* approximate : {"none", "tanh"})
    for (bool training : {false, true}) {
      INFO(approximate << (training ? ", training" : ", inference"));
      auto run = [&](bool fuse) {
        Graph g(runtime().ops());
        const Var x = g.input("x", {PLX_F32, {n, in}});
        const Var w = g.parameter("fc.weight", {PLX_F32, {out, in}}, init::uniform(-0.5, 0.5));
        const Var b = g.parameter("fc.bias", {PLX_F32, {out}}, init::uniform(-0.5, 0.5));
        const Var y = g.add1("gelu", {g.add1("linear", {x, w, b}, {}, "fc")},
                             {{"approximate", std::string(approximate)}}, "gelu");
        g.mark_output(y, "y");
        if (training) {
          const Var loss = g.add1("sum", {y}, {}, "loss");
          const std::vector<Var> params = g.parameters();
          const std::vector<Var> grads = backward(g, loss, params);
          for (size_t i = 0; i < params.size(); ++i)
            g.mark_output(grads[i], "grad:" + g.value(params[i]).name);
        }
        TensorStore store;
        ExecutableOptions eo;
        eo.seed = 3;
        eo.fuse = fuse;
        Executable exe(cpu(), g, store, eo);
        fill(exe.tensor("x"), random_doubles(static_cast<size_t>(n * in), 9, -3, 3));
        exe.run();
        exe.sync();
        StepResult r;
        r.plan = exe.plan();
        r.kernels = exe.kernel_names();
        std::vector<std::string> names = {"y"};
        if (training) names.insert(names.end(), {"grad:fc.weight", "grad:fc.bias"});
        for (const std::string& name : names) {
          const Tensor t = exe.tensor(name);
          r.bytes.emplace_back(t.nbytes());
          t.copy_to_host(r.bytes.back().data());
        }
        return r;
      };
      const StepResult fused = run(true), plain = run(false);
      CHECK(fused.bytes == plain.bytes);
      CHECK(has_kernel(fused, "[fc, gelu]: cpu/linear+gelu") == !training);
      if (!training) CHECK(fused.plan.internal_values == 1);  // the pre-activation
    }
}
