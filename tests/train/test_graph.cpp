// Static graphs: building, reverse mode against finite differences for a whole model, memory
// planning (reuse and in-place change nothing but memory), optimizers against hand-computed
// steps, schedules and initialisation.
#include <cmath>
#include <cstring>

#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/optimizer.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

double scalar_of(const Tensor& t) { return t.to_doubles().at(0); }

Attrs ints_attr(const std::string& k, std::vector<int64_t> v) {
  Attrs a;
  a.set(k, v);
  return a;
}

// A small residual CNN in f64 with everything a real model uses: conv, batch norm (training),
// relu, a skip connection, max-pool, a reshape, linear, cross-entropy. Returns the loss.
Var small_model(Graph& g, int64_t n) {
  const plx_dtype d = PLX_F64;
  const Var x = g.input("x", {d, {n, 2, 6, 6}});
  const Var labels = g.input("labels", {PLX_I32, {n}});
  const Var w1 = g.parameter("c1.weight", {d, {3, 2, 3, 3}}, init::kaiming_uniform(18));
  const Var b1 = g.parameter("c1.bias", {d, {3}}, init::uniform(-0.2, 0.2));
  const Var gamma = g.parameter("bn.weight", {d, {3}}, init::uniform(0.5, 1.5));
  const Var beta = g.parameter("bn.bias", {d, {3}}, init::uniform(-0.2, 0.2));
  const Var rm = g.state("bn.running_mean", {d, {3}}, init::zeros());
  const Var rv = g.state("bn.running_var", {d, {3}}, init::ones());
  const Var w2 = g.parameter("c2.weight", {d, {3, 3, 3, 3}}, init::kaiming_normal(27));
  const Var fw = g.parameter("fc.weight", {d, {4, 27}}, init::xavier_uniform(27, 4));
  const Var fb = g.parameter("fc.bias", {d, {4}}, init::zeros());

  Attrs pad1 = ints_attr("padding", {1, 1});
  Var h = g.add1("conv2d", {x, w1, b1}, pad1, "c1");
  h = g.add1("batch_norm", {h, gamma, beta, rm, rv}, {}, "bn");
  h = g.add1("relu", {h}, {}, "relu1");
  Var r = g.add1("conv2d", {h, w2}, pad1, "c2");
  r = g.add1("tanh", {r}, {}, "tanh");
  h = g.add1("add", {h, r}, {}, "skip");
  h = g.add1("max_pool2d", {h}, ints_attr("kernel", {2, 2}), "pool");
  h = g.reshape(h, {n, -1});
  const Var logits = g.add1("linear", {h, fw, fb}, {}, "fc");
  const Var loss = g.add1("softmax_cross_entropy", {logits, labels}, {}, "loss");
  return loss;
}

}  // namespace

TEST_CASE("graph building checks every node against its schema", "[cpu][graph]") {
  Graph g(runtime().ops());
  const Var x = g.input("x", {PLX_F32, {2, 3}});
  const Var w = g.parameter("w", {PLX_F32, {4, 5}}, init::zeros());
  CHECK_THROWS_WITH(g.add("linear", {x, w}, {}, "fc1"), PLX_CONTAINS("node 'fc1'"));
  CHECK_THROWS_WITH(g.add("no_such_op", {x}, {}, "mystery"), PLX_CONTAINS("node 'mystery'"));
  CHECK_THROWS_WITH(g.input("x", {PLX_F32, {1}}), PLX_CONTAINS("already used"));
  CHECK_THROWS_WITH(g.reshape(x, {4, 2}), PLX_CONTAINS("cannot reshape"));
  // Ops write in place only into persistent memory.
  const Var a = g.add1("relu", {x});
  const Var lr = g.input("lr", {PLX_F32, {}});
  CHECK_THROWS_WITH(g.add("sgd_update", {a, x, Var{}, lr}), PLX_CONTAINS("parameter or a state"));
  CHECK(g.reshape(x, {-1}).valid());
  CHECK(g.desc(g.reshape(x, {3, -1})).shape == Shape{3, 2});
  CHECK_FALSE(g.find("nothing").valid());
  CHECK_THROWS_WITH(g.get("nothing"), PLX_CONTAINS("no value 'nothing'"));
}

TEST_CASE("backward through a whole model matches finite differences", "[cpu][graph]") {
  const int64_t n = 3;
  Graph g(runtime().ops());
  const Var loss = small_model(g, n);
  const std::vector<Var> params = g.parameters();
  std::vector<Var> wrt = params;
  wrt.push_back(g.get("x"));
  const std::vector<Var> grads = backward(g, loss, wrt);
  g.mark_output(loss, "loss_out");
  for (size_t i = 0; i < wrt.size(); ++i) {
    REQUIRE(grads[i].valid());
    g.mark_output(grads[i], "grad." + g.value(wrt[i]).name);
  }
  TensorStore store;
  ExecutableOptions opt;
  opt.seed = 7;
  Executable exe(cpu(), g, store, opt);
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 2 * 6 * 6), 11));
  exe.tensor("labels").copy_from_host(std::vector<int32_t>{1, 3, 0}.data());
  // Batch norm updates its running statistics each run; they do not feed the training-mode
  // output, so repeated runs see the same function.
  auto loss_now = [&] {
    exe.run();
    exe.sync();
    return scalar_of(exe.tensor("loss_out"));
  };
  loss_now();
  std::vector<std::vector<double>> analytic;
  for (Var w : wrt) analytic.push_back(exe.tensor("grad." + g.value(w).name).to_doubles());

  const double eps = 1e-6;
  for (size_t i = 0; i < wrt.size(); ++i) {
    const std::string name = g.value(wrt[i]).name;
    Tensor t = exe.tensor(name);
    std::vector<double> v = t.to_doubles();
    // Every element of small tensors, a spread of them in larger ones.
    const size_t step = v.size() > 40 ? v.size() / 40 : 1;
    for (size_t k = 0; k < v.size(); k += step) {
      const double orig = v[k];
      v[k] = orig + eps;
      fill(t, v);
      const double up = loss_now();
      v[k] = orig - eps;
      fill(t, v);
      const double down = loss_now();
      v[k] = orig;
      fill(t, v);
      const double numeric = (up - down) / (2 * eps);
      INFO(name << "[" << k << "]: analytic " << analytic[i][k] << " numeric " << numeric);
      CHECK(std::abs(analytic[i][k] - numeric) <= 1e-6 + 1e-5 * std::abs(numeric));
    }
  }
}

namespace {

// conv, ReLU, max-pool with overlapping windows (kernel 3, stride 2), ReLU, max-pool, linear:
// with `keep_relus`, the ReLUs' outputs are also graph outputs, which turns the backward
// rewrite for a ReLU read only by pools off.
struct PoolNet {
  Graph g{runtime().ops()};
  std::vector<Var> grads;
  explicit PoolNet(bool keep_relus, int64_t n = 4) {
    const plx_dtype d = PLX_F32;
    const Var x = g.input("x", {d, {n, 3, 11, 11}});
    const Var labels = g.input("labels", {PLX_I32, {n}});
    const Var w1 = g.parameter("c1.weight", {d, {8, 3, 3, 3}}, init::kaiming_uniform(27));
    const Var w2 = g.parameter("c2.weight", {d, {8, 8, 3, 3}}, init::kaiming_uniform(72));
    const Var fw = g.parameter("fc.weight", {d, {5, 8 * 3 * 3}}, init::xavier_uniform(72, 5));
    Attrs pool = ints_attr("kernel", {3, 3});
    pool.set("stride", Ints{2, 2});
    pool.set("padding", Ints{1, 1});
    Var h = g.add1("conv2d", {x, w1}, ints_attr("padding", {1, 1}), "c1");
    const Var r1 = g.add1("relu", {h}, {}, "relu1");
    h = g.add1("max_pool2d", {r1}, pool, "pool1");
    h = g.add1("conv2d", {h, w2}, ints_attr("padding", {1, 1}), "c2");
    const Var r2 = g.add1("relu", {h}, {}, "relu2");
    h = g.add1("max_pool2d", {r2}, pool, "pool2");
    h = g.reshape(h, {n, -1});
    const Var loss = g.add1("softmax_cross_entropy", {g.add1("linear", {h, fw}, {}, "fc"), labels}, {}, "loss");
    if (keep_relus) {
      g.mark_output(r1, "relu1_out");
      g.mark_output(r2, "relu2_out");
    }
    grads = backward(g, loss, g.parameters());
    for (size_t i = 0; i < grads.size(); ++i) g.mark_output(grads[i], "grad" + std::to_string(i));
  }
  // relu_backward nodes reading a ReLU's output (not a pool's).
  int relu_backward_on_relu_outputs() const {
    int k = 0;
    for (const GraphNode& node : g.nodes())
      if (node.schema && node.schema->name == "relu_backward" &&
          g.nodes()[static_cast<size_t>(g.value(node.inputs[1]).producer)].schema->name == "relu")
        ++k;
    return k;
  }
};

}  // namespace

TEST_CASE("a ReLU read only by max-pools gets its mask through the pool, bit for bit", "[cpu][graph]") {
  PoolNet fused(false), plain(true);
  CHECK(fused.relu_backward_on_relu_outputs() == 0);
  CHECK(plain.relu_backward_on_relu_outputs() == 2);
  std::vector<std::vector<float>> got, want;
  uint64_t arena_fused = 0, arena_plain = 0;
  for (PoolNet* net : {&fused, &plain}) {
    TensorStore store;
    ExecutableOptions opt;
    opt.seed = 5;
    Executable exe(cpu(), net->g, store, opt);
    fill(exe.tensor("x"), random_doubles(4 * 3 * 11 * 11, 21));
    exe.tensor("labels").copy_from_host(std::vector<int32_t>{0, 4, 2, 1}.data());
    exe.run();
    exe.sync();
    auto& into = net == &fused ? got : want;
    for (size_t i = 0; i < net->grads.size(); ++i)
      into.push_back(exe.tensor("grad" + std::to_string(i)).to_vector<float>());
    (net == &fused ? arena_fused : arena_plain) = exe.plan().arena_bytes;
  }
  REQUIRE(got.size() == 3);
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("gradient " << i);
    CHECK(got[i] == want[i]);  // the same floats: only where the mask is applied moved
  }
  // The ReLUs' outputs die at their pools instead of living until backward (the plain graph
  // also keeps them as outputs; the difference is at least the two of them).
  CHECK(arena_fused < arena_plain);
}

TEST_CASE("gradients reaching a value along several paths are added", "[cpu][graph]") {
  Graph g(runtime().ops());
  const Var p = g.parameter("p", {PLX_F64, {3}}, init::constant(2.0));
  // loss = sum(p*p + p) -> d/dp = 2p + 1
  const Var sq = g.add1("mul", {p, p});
  const Var s = g.add1("add", {sq, p});
  const Var loss = g.add1("sum", {s});
  const Var gp = backward(g, loss, {p}).at(0);
  g.mark_output(gp, "gp");
  TensorStore store;
  Executable exe(cpu(), g, store);
  exe.run();
  exe.sync();
  CHECK(exe.tensor("gp").to_doubles() == std::vector<double>{5, 5, 5});
}

TEST_CASE("backward names the node whose op has no gradient formula", "[cpu][graph]") {
  Graph g(runtime().ops());
  const Var x = g.input("x", {PLX_F32, {1, 1, 4, 4}});
  const Var y = g.add("max_pool2d", {x}, ints_attr("kernel", {2, 2}), "pool").at(1);  // indices
  const Var dy = g.parameter("dy", {PLX_F32, {1, 1, 2, 2}}, init::ones());
  Attrs a = ints_attr("kernel", {2, 2});
  a.set("input_shape", Shape{1, 1, 4, 4});
  const Var dx = g.add1("max_pool2d_backward", {dy, y}, a, "unpool");
  const Var loss = g.add1("sum", {dx});
  CHECK_THROWS_WITH(backward(g, loss, {dy}), PLX_CONTAINS("node 'unpool'"));
  // A loss that does not depend on a value gives it no gradient.
  Graph h(runtime().ops());
  const Var p = h.parameter("p", {PLX_F32, {2}}, init::ones());
  const Var q = h.parameter("q", {PLX_F32, {2}}, init::ones());
  const Var l = h.add1("sum", {p});
  const std::vector<Var> gr = backward(h, l, {p, q});
  CHECK(gr[0].valid());
  CHECK_FALSE(gr[1].valid());
}

TEST_CASE("memory planning reuses dead buffers and changes no result", "[cpu][graph]") {
  const int64_t n = 4;
  auto run_with = [&](bool reuse, bool inplace, MemoryPlan* plan) {
    Graph g(runtime().ops());
    const Var loss = small_model(g, n);
    const std::vector<Var> params = g.parameters();
    const std::vector<Var> grads = backward(g, loss, params);
    OptimizerOptions o;
    o.kind = "sgd";
    o.momentum = 0.9;
    add_optimizer(g, params, grads, o);
    g.mark_output(loss, "loss_out");
    TensorStore store;
    ExecutableOptions opt;
    opt.seed = 3;
    opt.reuse = reuse;
    opt.inplace = inplace;
    Executable exe(cpu(), g, store, opt);
    *plan = exe.plan();
    fill(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 72), 5));
    exe.tensor("labels").copy_from_host(std::vector<int32_t>{0, 1, 2, 3}.data());
    fill(exe.tensor("lr"), {0.1});
    std::vector<double> out;
    for (int step = 0; step < 3; ++step) {
      exe.run();
      exe.sync();
      out.push_back(scalar_of(exe.tensor("loss_out")));
    }
    for (const auto& [name, t] : store.all())
      for (double v : t.to_doubles()) out.push_back(v);
    return out;
  };
  MemoryPlan planned, unplanned, no_inplace;
  const std::vector<double> a = run_with(true, true, &planned);
  const std::vector<double> b = run_with(false, false, &unplanned);
  const std::vector<double> c = run_with(true, false, &no_inplace);
  CHECK(a == b);  // bit for bit
  CHECK(a == c);
  CHECK(planned.inplace_nodes > 0);
  CHECK(no_inplace.inplace_nodes == 0);
  CHECK(planned.arena_bytes < unplanned.arena_bytes);
  CHECK(unplanned.arena_bytes == unplanned.unplanned_bytes);
  CHECK(planned.arena_bytes <= no_inplace.arena_bytes);
  CHECK(planned.activation_buffers > 10);
}

TEST_CASE("a training step's peak memory is what the plan predicts", "[cpu][graph]") {
  Graph g(runtime().ops());
  const Var loss = small_model(g, 8);
  const std::vector<Var> params = g.parameters();
  add_optimizer(g, params, backward(g, loss, params), OptimizerOptions{});
  g.mark_output(loss, "loss_out");
  CachingAllocator& alloc = cpu().allocator(0);
  cpu().sync(0);
  alloc.release_cached();
  const uint64_t before = alloc.stats().in_use;
  alloc.reset_peaks();
  {
    TensorStore store;
    Executable exe(cpu(), g, store);
    exe.run();
    exe.run();
    exe.sync();
    const uint64_t peak = alloc.stats().peak_in_use - before;
    // The planned memory plus size-class rounding of each allocation (at most 25% or 512 B).
    const uint64_t predicted = exe.plan().total_bytes();
    INFO("peak " << peak << " predicted " << predicted);
    CHECK(peak >= predicted);
    CHECK(peak <= predicted + predicted / 4 + 512 * 64);
  }
}

TEST_CASE("a graph names the node a backend has no kernel for", "[cpu][graph]") {
  RuntimeOptions o;
  o.plugins.paths = {fixture_dir() + "/good"};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  Runtime other(o);
  Graph g(other.ops());
  const Var x = g.input("x", {PLX_F32, {2, 2}});
  // testdev has relu and add kernels, not tanh.
  g.mark_output(g.add1("tanh", {g.add1("relu", {x}, {}, "act")}, {}, "squash"), "y");
  TensorStore store;
  CHECK_THROWS_WITH(Executable(other.backend("testdev"), g, store),
                    PLX_CONTAINS("node 'squash'") && PLX_CONTAINS("tanh"));
}

TEST_CASE("sgd matches hand-computed steps", "[cpu][graph][optim]") {
  // loss = sum(c * p): the gradient is c whatever p is, so each step is easy to follow by hand.
  auto run = [](OptimizerOptions o, double lr, int steps) {
    Graph g(runtime().ops());
    const Var p = g.parameter("p", {PLX_F32, {2}}, init::constant(1.0));
    const Var c = g.constant("c", {PLX_F32, {2}}, [] {
      std::vector<uint8_t> b(8);
      const float v[2] = {0.5f, -2.0f};
      std::memcpy(b.data(), v, 8);
      return b;
    }());
    const Var loss = g.add1("sum", {g.add1("mul", {c, p})});
    add_optimizer(g, {p}, backward(g, loss, {p}), o);
    TensorStore store;
    Executable exe(cpu(), g, store);
    fill(exe.tensor("lr"), {lr});
    for (int i = 0; i < steps; ++i) {
      if (o.kind == "adamw") fill(exe.tensor("step"), {static_cast<double>(i + 1)});
      exe.run();
    }
    exe.sync();
    return store.get("p").to_doubles();
  };
  OptimizerOptions plain;
  plain.momentum = 0;
  std::vector<double> p = run(plain, 0.1, 2);
  CHECK(p[0] == Approx(1.0 - 2 * 0.1 * 0.5).epsilon(1e-6));
  CHECK(p[1] == Approx(1.0 + 2 * 0.1 * 2.0).epsilon(1e-6));

  // Momentum 0.9, weight decay 0.1, two steps, element 0 (c = 0.5):
  // g1 = 0.5 + 0.1*1 = 0.6, buf1 = 0.6, p1 = 1 - 0.1*0.6 = 0.94
  // g2 = 0.5 + 0.094 = 0.594, buf2 = 0.9*0.6 + 0.594 = 1.134, p2 = 0.94 - 0.1134 = 0.8266
  OptimizerOptions mom;
  mom.momentum = 0.9;
  mom.weight_decay = 0.1;
  p = run(mom, 0.1, 2);
  CHECK(p[0] == Approx(0.8266).epsilon(1e-6));
  // Nesterov: the step uses g + m*buf. p1 = 1 - 0.1*(0.6 + 0.54) = 0.886;
  // g2 = 0.5 + 0.0886 = 0.5886, buf2 = 0.54 + 0.5886 = 1.1286, p2 = 0.886 - 0.1*(0.5886 + 1.01574)
  OptimizerOptions nes = mom;
  nes.nesterov = true;
  p = run(nes, 0.1, 2);
  CHECK(p[0] == Approx(0.886 - 0.1 * (0.5886 + 0.9 * 1.1286)).epsilon(1e-6));

  OptimizerOptions bad = mom;
  bad.kind = "lion";
  CHECK_THROWS_WITH(run(bad, 0.1, 1), PLX_CONTAINS("unknown optimizer 'lion'"));
}

TEST_CASE("adamw matches a hand-computed step", "[cpu][graph][optim]") {
  Graph g(runtime().ops());
  const Var p = g.parameter("p", {PLX_F64, {1}}, init::constant(1.0));
  const Var c = g.scalar(0.5, PLX_F64);
  const Var loss = g.add1("sum", {g.add1("mul", {p, c})});
  OptimizerOptions o;
  o.kind = "adamw";
  o.weight_decay = 0.01;
  add_optimizer(g, {p}, backward(g, loss, {p}), o);
  TensorStore store;
  Executable exe(cpu(), g, store);
  const double lr = 0.01;
  fill(exe.tensor("lr"), {lr});
  double want = 1.0, m = 0, v = 0;
  for (int t = 1; t <= 3; ++t) {
    fill(exe.tensor("step"), {static_cast<double>(t)});
    exe.run();
    want *= 1 - static_cast<double>(static_cast<float>(lr)) * 0.01;
    m = 0.9 * m + 0.1 * 0.5;
    v = 0.999 * v + 0.001 * 0.25;
    const double mhat = m / (1 - std::pow(0.9, t)), vhat = v / (1 - std::pow(0.999, t));
    want -= static_cast<double>(static_cast<float>(lr)) * mhat / (std::sqrt(vhat) + 1e-8);
  }
  exe.sync();
  CHECK(store.get("p").to_doubles()[0] == Approx(want).epsilon(1e-12));
  CHECK(store.contains("p.exp_avg"));
  CHECK(store.get("p.exp_avg").to_doubles()[0] == Approx(m).epsilon(1e-12));
}

TEST_CASE("learning-rate schedules", "[cpu][optim]") {
  ScheduleOptions s;
  s.lr = 0.1;
  CHECK(learning_rate(s, 0) == 0.1);
  CHECK(learning_rate(s, 1000) == 0.1);
  s.warmup_steps = 4;
  CHECK(learning_rate(s, 0) == Approx(0.025));
  CHECK(learning_rate(s, 3) == Approx(0.1));
  s.kind = "step";
  s.step_size = 10;
  s.gamma = 0.5;
  CHECK(learning_rate(s, 4) == Approx(0.1));
  CHECK(learning_rate(s, 13) == Approx(0.1));
  CHECK(learning_rate(s, 14) == Approx(0.05));
  CHECK(learning_rate(s, 34) == Approx(0.0125));
  s.kind = "cosine";
  s.total_steps = 104;
  s.min_lr = 0.001;
  CHECK(learning_rate(s, 4) == Approx(0.1));
  CHECK(learning_rate(s, 54) == Approx(0.001 + 0.5 * 0.099));
  CHECK(learning_rate(s, 104) == Approx(0.001));
  CHECK(learning_rate(s, 500) == Approx(0.001));
  s.kind = "linear";
  CHECK_THROWS_WITH(learning_rate(s, 50), PLX_CONTAINS("unknown schedule 'linear'"));
  s.kind = "cosine";
  s.total_steps = 2;
  CHECK_THROWS_WITH(learning_rate(s, 50), PLX_CONTAINS("cosine needs more steps"));
}

TEST_CASE("initialisation is reproducible and follows its rule", "[cpu][graph]") {
  Tensor a = Tensor::empty(cpu(), {64, 64}, PLX_F32);
  Tensor b = Tensor::empty(cpu(), {64, 64}, PLX_F32);
  const InitSpec k = init::kaiming_uniform(64);
  initialize(a, k, 1, "w");
  initialize(b, k, 1, "w");
  CHECK(a.to_doubles() == b.to_doubles());
  initialize(b, k, 2, "w");
  CHECK(a.to_doubles() != b.to_doubles());
  initialize(b, k, 1, "other");
  CHECK(a.to_doubles() != b.to_doubles());
  // Uniform(-bound, bound) with bound = sqrt(3)*sqrt(2)/sqrt(64): inside it, variance 2/64.
  const double bound = std::sqrt(6.0 / 64);
  double sum = 0, sq = 0;
  for (double v : a.to_doubles()) {
    CHECK(std::abs(v) <= bound);
    sum += v;
    sq += v * v;
  }
  const double nn = 64 * 64;
  CHECK(std::abs(sum / nn) < 0.01);
  CHECK(sq / nn == Approx(2.0 / 64).epsilon(0.05));
  initialize(a, init::kaiming_normal(64), 1, "w");
  sq = 0;
  for (double v : a.to_doubles()) sq += v * v;
  CHECK(sq / nn == Approx(2.0 / 64).epsilon(0.05));
  initialize(a, init::xavier_normal(64, 32), 1, "w");
  sq = 0;
  for (double v : a.to_doubles()) sq += v * v;
  CHECK(sq / nn == Approx(2.0 / 96).epsilon(0.05));
  CHECK_THROWS_WITH(init::kaiming_uniform(0), PLX_CONTAINS("fan must be positive"));
}

TEST_CASE("the CPU backend runs a graph op by op, never captured", "[cpu][graph]") {
  Graph g(runtime().ops());
  const Var x = g.input("x", {PLX_F32, {4}});
  g.mark_output(g.add1("relu", {x}), "y");
  TensorStore store;
  Executable exe(cpu(), g, store);
  fill(exe.tensor("x"), {-1, 2, -3, 4});
  for (int i = 0; i < 3; ++i) exe.run();
  exe.sync();
  CHECK_FALSE(exe.replaying());
  CHECK(exe.tensor("y").to_doubles() == std::vector<double>{0, 2, 0, 4});
  CHECK(exe.kernel_names().size() == 1);
}
