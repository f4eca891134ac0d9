// A whole training step of the built-in `convnet` (forward, softmax cross-entropy, backward, SGD
// with momentum: what the trainer runs) on the CPU and on CUDA, and a captured CUDA step against
// an uncaptured one.
//
// Comparing two whole steps has one trap: the forward makes discrete decisions (which inputs a
// ReLU passes, which element a max-pool window picks), and two correct backends whose sums differ
// in their last bits decide differently where a pre-activation is within rounding of zero or two
// pooled values are within rounding of each other. Each such flip moves a whole term of a weight
// gradient, far more than rounding (with ~10^5 decisions per sample it happens in a fair share of
// batches). So the step is checked two ways:
// - end to end: loss always; gradients, updated weights and momentum buffers when every ReLU mask
//   and max-pool index agrees. Disagreements are inspected: one where the CPU's values are not a
//   near-tie is a bug and fails; near-ties only make that batch inconclusive, and another batch is
//   drawn (a few at most);
// - node by node: every node of the CUDA step (forward, backward and update) is run again on the
//   CPU with the CUDA node's own inputs, and its outputs compared. No decision can differ there,
//   so every gradient and update is checked with f32 tolerances whatever the batch.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/model.hpp"
#include "plexus/optimizer.hpp"
#include "plexus/runtime.hpp"
#include "train/step_graph.hpp"
#include "train/step_pipeline.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::cmp;

namespace {

constexpr double kLr = 0.05;
// f32 without TF32: sums in another order differ by rounding, ~1e-7 relative; 1e-8 leaves room
// for cuDNN algorithms (Winograd, FFT) with a few more bits of error.
constexpr double kNmse = 1e-8;

struct Step {
  std::unique_ptr<Graph> graph;
  std::vector<std::string> params;  // parameter names, in graph order
  // ReLU outputs and max-pool indices of the forward, with the name of each pool's input.
  std::vector<std::string> relus;
  struct Pool {
    std::string indices, input;
  };
  std::vector<Pool> pools;
};

std::string grad_name(const std::string& param) { return "grad:" + param; }

// The trainer's step (trainer.cpp build_step): convnet, mean softmax cross-entropy ignoring label
// -100, backward, SGD with momentum 0.9. Marks the loss; optionally every parameter gradient, the
// forward's decisions, or every activation as outputs.
Step convnet_step(int64_t batch, bool grads, bool decisions, bool everything) {
  Step s;
  s.graph = std::make_unique<Graph>(runtime().ops());
  Graph& g = *s.graph;
  const ModelSpec spec = builtin_model("convnet");
  Shape xs = {batch};
  xs.insert(xs.end(), spec.input_shape.begin(), spec.input_shape.end());
  const Var x = g.input("x", {PLX_F32, xs});
  const Var labels = g.input("labels", {PLX_I32, {batch}});
  const Var logits = build_model(g, spec, x, true);
  const Var loss = g.add("softmax_cross_entropy", {logits, labels},
                         {{"reduction", std::string("mean")}, {"ignore_index", int64_t{-100}}}, "loss")
                       .at(0);
  const std::vector<Var> params = g.parameters();
  const std::vector<Var> gs = backward(g, loss, params);
  OptimizerOptions opt;
  opt.kind = "sgd";
  opt.momentum = 0.9;
  add_optimizer(g, params, gs, opt);
  g.mark_output(loss, "loss_value");
  std::map<int32_t, std::string> marked;  // value id -> output name
  auto mark = [&](Var v, const std::string& name) -> std::string {
    auto it = marked.find(v.id);
    if (it != marked.end()) return it->second;
    g.mark_output(v, name);
    marked[v.id] = name;
    return name;
  };
  marked[loss.id] = "loss_value";
  for (size_t i = 0; i < params.size(); ++i) {
    s.params.push_back(g.value(params[i]).name);
    if (grads) {
      REQUIRE(gs[i].valid());
      mark(gs[i], grad_name(s.params.back()));
    }
  }
  if (decisions) {
    const auto& nodes = g.nodes();
    for (size_t n = 0; n < nodes.size(); ++n) {
      const GraphNode& node = nodes[n];
      if (node.phase != Phase::Forward || !node.schema) continue;
      if (node.schema->name == "relu") s.relus.push_back(mark(node.outputs[0], "relu:" + std::to_string(n)));
      if (node.schema->name == "max_pool2d")
        s.pools.push_back({mark(node.outputs[1], "pool_indices:" + std::to_string(n)),
                           mark(node.inputs[0], "pool_input:" + std::to_string(n))});
    }
    REQUIRE(s.relus.size() == 4);
    REQUIRE(s.pools.size() == 2);
  }
  if (everything) {
    // Every activation stored in its own memory stays readable after the run.
    for (int32_t i = 0; i < g.num_values(); ++i) {
      const Var v{i};
      if (g.value(v).kind != ValueKind::Activation) continue;
      if (g.value(g.storage_root(v)).kind != ValueKind::Activation) continue;
      mark(v, "v" + std::to_string(i));
    }
  }
  return s;
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> labels;
};

// Images in [-1, 1), labels in [0, 10) with one row ignored (label -100) when batch > 1.
Batch make_batch(int64_t batch, uint64_t seed) {
  Gen g(PLX_F32, seed);
  Batch b;
  b.x = g.uniform({batch, 1, 28, 28}).to_vector<float>();
  b.labels = g.ints({batch}, PLX_I32, 0, 10).to_vector<int32_t>();
  if (batch > 1) b.labels[1] = -100;
  return b;
}

void feed(Executable& e, const Batch& b, double lr) {
  e.tensor("x").copy_from_host(b.x.data());
  e.tensor("labels").copy_from_host(b.labels.data());
  const float f = static_cast<float>(lr);
  e.tensor(kLearningRateInput).copy_from_host(&f);
}

double loss_of(const Executable& e) { return e.tensor("loss_value").to_doubles().at(0); }

// One step of each executable on the same batch; their losses.
std::pair<double, double> step_both(Executable& a, Executable& b, const Batch& data) {
  for (Executable* e : {&a, &b}) {
    feed(*e, data, kLr);
    e->run();
    e->sync();
  }
  return {loss_of(a), loss_of(b)};
}

// A CPU copy of a tensor of any backend (Tensor::to returns the tensor itself on the CPU).
Tensor host_copy(const Tensor& t) {
  std::vector<uint8_t> b(static_cast<size_t>(t.nbytes()) + 1);
  if (t.nbytes()) t.copy_to_host(b.data());
  return Tensor::from_host(cpu(), b.data(), t.shape(), t.dtype());
}

Tolerance nmse_only(double limit) { return Tolerance{INFINITY, 0, limit, false}; }

// Discrete decisions of the forward that differ between the CPU (c) and CUDA (g) runs. Returns
// the disagreements that are not near-ties (bugs); counts the near-ties in *ties.
std::string decision_mismatches(const Step& s, const Executable& c, const Executable& g, int64_t* ties) {
  std::string bugs;
  auto rms = [](const std::vector<double>& v) {
    double a = 0;
    for (double x : v) a += x * x;
    return v.empty() ? 0.0 : std::sqrt(a / static_cast<double>(v.size()));
  };
  for (const std::string& name : s.relus) {
    const std::vector<double> yc = c.tensor(name).to_doubles(), yg = g.tensor(name).to_doubles();
    const double tau = 1e-4 * std::max(rms(yc), 1e-30);
    for (size_t i = 0; i < yc.size(); ++i) {
      if (std::isfinite(yg[i]) && (yc[i] > 0) == (yg[i] > 0)) continue;
      if (std::isfinite(yg[i]) && std::max(std::fabs(yc[i]), std::fabs(yg[i])) <= tau)
        ++*ties;
      else if (bugs.size() < 2000)
        bugs += "\n  " + name + " element " + std::to_string(i) + ": cpu " + std::to_string(yc[i]) +
                ", cuda " + std::to_string(yg[i]);
    }
  }
  for (const Step::Pool& p : s.pools) {
    const Tensor in = c.tensor(p.input);
    const std::vector<double> xc = in.to_doubles();
    const std::vector<int32_t> idc = c.tensor(p.indices).to_vector<int32_t>();
    const std::vector<int32_t> idg = g.tensor(p.indices).to_vector<int32_t>();
    const Shape os = c.tensor(p.indices).shape();  // (N, C, OH, OW)
    const int64_t plane_in = in.dim(2) * in.dim(3), plane_out = os[2] * os[3];
    const double tau = 1e-4 * std::max(rms(xc), 1e-30);
    for (size_t j = 0; j < idc.size(); ++j) {
      if (idc[j] == idg[j]) continue;
      const int64_t base = static_cast<int64_t>(j) / plane_out * plane_in;
      const bool in_plane = idg[j] >= 0 && idg[j] < plane_in && idc[j] >= 0;
      if (in_plane && std::fabs(xc[static_cast<size_t>(base + idc[j])] - xc[static_cast<size_t>(base + idg[j])]) <= tau)
        ++*ties;
      else if (bugs.size() < 2000)
        bugs += "\n  " + p.indices + " element " + std::to_string(j) + ": cpu picks " +
                std::to_string(idc[j]) + ", cuda " + std::to_string(idg[j]);
    }
  }
  return bugs;
}

// The step on `gpu` (the backend under test) against the step on the CPU.
void check_step_matches_cpu(Backend& gpu) {
  const int64_t batch = 2;
  const Step s = convnet_step(batch, true, true, false);
  int conclusive = 0, attempts = 0;
  int64_t ties_seen = 0;
  for (; attempts < 6 && conclusive == 0; ++attempts) {
    const uint64_t seed = 100 + static_cast<uint64_t>(attempts);
    TensorStore cs, gs;
    ExecutableOptions eo;
    eo.seed = seed;  // the same initial parameters on both: initialize() is backend-independent
    Executable ce(cpu(), *s.graph, cs, eo);
    Executable ge(gpu, *s.graph, gs, eo);
    for (const auto& [name, t] : cs.all()) REQUIRE(host_copy(gs.get(name)).to_doubles() == t.to_doubles());
    const Batch b = make_batch(batch, seed);
    feed(ce, b, kLr);
    feed(ge, b, kLr);
    ce.run();
    ce.sync();
    ge.run();
    ge.sync();

    INFO("attempt " << attempts << ", seed " << seed);
    const double lc = loss_of(ce), lg = loss_of(ge);
    CHECK(std::isfinite(lg));
    CHECK(std::fabs(lc - lg) <= 1e-5 * std::fabs(lc) + 1e-6);

    int64_t ties = 0;
    const std::string bugs = decision_mismatches(s, ce, ge, &ties);
    INFO("ReLU or max-pool decisions that differ where the CPU's values are no near-tie:" << bugs);
    CHECK(bugs.empty());
    if (!bugs.empty()) return;
    ties_seen += ties;
    if (ties > 0) continue;  // near-ties decided the other way: gradients differ by whole terms
    ++conclusive;

    for (const std::string& p : s.params) {
      INFO("gradient of " << p);
      CHECK(compare_tensors(ge.tensor(grad_name(p)), ce.tensor(grad_name(p)), nmse_only(kNmse)) == "");
    }
    for (const auto& [name, t] : cs.all()) {
      INFO("after the update: " << name);
      CHECK(compare_tensors(gs.get(name), t, nmse_only(kNmse)) == "");
    }
  }
  if (conclusive == 0)
    WARN("every batch tried had ReLU/max-pool near-ties decided differently (" << ties_seen
         << " in all): gradients were compared node by node only");
}

// Every node of the step on `gpu` against the CPU op run on that node's inputs. Every activation
// is a graph output here, so no layer is fused with its activation; the optimizer's updates are
// (one multi-tensor kernel), and each parameter's new value is still checked against the CPU's
// sgd_update on that node's inputs. The classifier head is fused too, and writes every value
// its nodes would (the logits, log_probs, the loss, dlogits), so each of its nodes is checked
// on the values the fused kernel wrote.
void check_nodes_match_cpu(Backend& gpu) {
  const Step s = convnet_step(3, false, false, true);
  const Graph& g = *s.graph;
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 5;
  Executable ge(gpu, g, store, eo);
  // Parameters and states before the step (the update overwrites them).
  std::map<int32_t, Tensor> before;
  for (int32_t i = 0; i < g.num_values(); ++i) {
    const ValueKind k = g.value(Var{i}).kind;
    if (k == ValueKind::Parameter || k == ValueKind::State) before[i] = host_copy(ge.tensor(Var{i}));
  }
  feed(ge, make_batch(3, 5), kLr);
  ge.run();
  ge.sync();

  // The value a node read: persistent values as they were before the step, others as left.
  auto input_value = [&](Var v) -> Tensor {
    const Var root = g.storage_root(v);
    const ValueKind k = g.value(root).kind;
    // Fresh copies: the CPU op may write its inputs in place.
    if (k == ValueKind::Parameter || k == ValueKind::State)
      return host_copy(before.at(root.id)).reshape(g.value(v).desc.shape);
    return host_copy(ge.tensor(v));
  };
  int checked = 0;
  const auto& nodes = g.nodes();
  for (size_t n = 0; n < nodes.size(); ++n) {
    const GraphNode& node = nodes[n];
    if (!node.schema) continue;  // a reshape: no kernel
    std::vector<Tensor> ins;
    for (Var v : node.inputs) ins.push_back(v.valid() ? input_value(v) : Tensor());
    const std::vector<Tensor> want = call(cpu(), node.schema->name, ins, node.attrs);
    INFO("node " << n << " '" << node.name << "' (" << node.schema->name << ", "
                 << phase_name(node.phase) << ")");
    for (size_t k = 0; k < want.size(); ++k) {
      INFO("output " << k);
      const Tolerance tol = dtype_is_float(want[k].dtype()) ? nmse_only(kNmse) : tolerance_for(want[k].dtype(), 1, false);
      CHECK(compare_tensors(ge.tensor(node.outputs[k]), want[k], tol) == "");
    }
    // In-place inputs (the optimizer's param and momentum buffer) against their new values.
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!(node.schema->inputs[i].flags & PLX_ARG_MUTATED) || !node.inputs[i].valid()) continue;
      INFO("input " << i << " written in place");
      CHECK(compare_tensors(ge.tensor(node.inputs[i]), ins[i], nmse_only(kNmse)) == "");
    }
    ++checked;
  }
  CHECK(checked > 30);
}

// A step captured on `gpu` against the same step run op by op. `capturable`: the backend must
// capture (the CPU backend never does, and then both run op by op).
void check_capture(Backend& gpu, bool capturable) {
  const int64_t batch = 8;
  const Step s = convnet_step(batch, false, false, false);
  TensorStore store_a, store_b;
  ExecutableOptions ea, eb;
  ea.seed = eb.seed = 21;
  ea.capture = true;
  eb.capture = false;
  Executable a(gpu, *s.graph, store_a, ea);
  Executable b(gpu, *s.graph, store_b, eb);

  auto step = [&](const Batch& data, double lr) {
    for (Executable* e : {&a, &b}) {
      feed(*e, data, lr);
      e->run();
      e->sync();
    }
    return std::pair{loss_of(a), loss_of(b)};
  };
  for (int i = 0; i < 3; ++i) {
    const auto [la, lb] = step(make_batch(batch, 300 + static_cast<uint64_t>(i)), kLr);
    INFO("step " << i << ": captured " << la << ", uncaptured " << lb);
    CHECK(std::isfinite(la));
    CHECK(std::fabs(la - lb) <= 1e-5 * std::fabs(lb) + 1e-6);
  }
  INFO("kernels:\n" << [&] {
    std::string k;
    for (const auto& n : a.kernel_names()) k += n + "\n";
    return k;
  }());
  // The second run recorded the step, the third replayed it.
  if (capturable) REQUIRE(a.replaying());
  CHECK_FALSE(b.replaying());

  // lr is a graph input read by the replay, not a value frozen into it: lr 0 leaves every
  // parameter as it was, and a new lr moves it by exactly lr times the new momentum buffer.
  std::map<std::string, std::vector<double>> p0;
  for (const std::string& p : s.params) p0[p] = store_a.get(p).to_doubles();
  step(make_batch(batch, 310), 0.0);
  for (const std::string& p : s.params) {
    INFO("lr 0: " << p);
    CHECK(store_a.get(p).to_doubles() == p0[p]);
  }
  const double lr = 0.2;
  const auto [la, lb] = step(make_batch(batch, 311), lr);
  CHECK(std::fabs(la - lb) <= 1e-5 * std::fabs(lb) + 1e-6);
  for (const std::string& p : s.params) {
    INFO("lr " << lr << ": " << p);
    const std::vector<double> now = store_a.get(p).to_doubles();
    const std::vector<double> buf = store_a.get(p + ".momentum_buffer").to_doubles();
    const float lr32 = static_cast<float>(lr);
    size_t bad = 0;
    bool moved = false;
    for (size_t i = 0; i < now.size(); ++i) {
      const double want = p0[p][i] - static_cast<double>(lr32) * buf[i];
      if (std::fabs(now[i] - want) > 1e-6 * std::fabs(p0[p][i]) + 1e-7) ++bad;
      moved = moved || now[i] != p0[p][i];
    }
    CHECK(bad == 0);
    CHECK(moved);
  }
}

// A step run with work around it (Executable::Around), as StepPipeline runs it: each of two
// slots' device staging copied into the step's inputs (held in one block, ExecutableOptions::
// input_block: one copy), the loss copied out to the slot's host buffer. Where the backend
// captures and the host buffers are pinned, the copies are recorded with the step, one graph per
// slot, and later runs replay them: the staging is rewritten before every run, so a replay that
// left its copies out (or used the other slot's addresses) would give the step before's loss.
void check_capture_around(Backend& gpu, bool capturable) {
  const int64_t batch = 8;
  const Step s = convnet_step(batch, false, false, false);
  TensorStore store_a, store_b;
  ExecutableOptions ea, eb;
  ea.seed = eb.seed = 23;
  ea.input_block = {"x", "labels", kLearningRateInput, "no such input"};
  ea.input_block_head = 100;  // room for the caller's own bytes first (256 with the alignment)
  eb.capture = false;
  Executable a(gpu, *s.graph, store_a, ea);
  Executable b(gpu, *s.graph, store_b, eb);

  // The block: the head, then each input at a multiple of 256 bytes, in the order named.
  const Tensor& block = a.input_block();
  REQUIRE(block.defined());
  const uint64_t xb = static_cast<uint64_t>(batch) * 28 * 28 * sizeof(float);
  const uint64_t lb = (static_cast<uint64_t>(batch) * sizeof(int32_t) + 255) / 256 * 256;
  const uint64_t x_at = 256;
  CHECK(block.nbytes() == x_at + xb + lb + 256);
  auto offset = [&](const char* name) {
    return static_cast<const unsigned char*>(a.tensor(name).data()) -
           static_cast<const unsigned char*>(block.data());
  };
  CHECK(offset("x") == static_cast<std::ptrdiff_t>(x_at));
  CHECK(offset("labels") == static_cast<std::ptrdiff_t>(x_at + xb));
  CHECK(offset(kLearningRateInput) == static_cast<std::ptrdiff_t>(x_at + xb + lb));
  CHECK_FALSE(b.input_block().defined());

  const bool pinned = gpu.device(0).caps & PLX_CAP_PINNED;
  MemoryBlock* host[2] = {nullptr, nullptr};
  std::vector<float> pageable[2] = {std::vector<float>(1), std::vector<float>(1)};
  Tensor staging[2];
  for (int v = 0; v < 2; ++v) {
    staging[v] = Tensor::zeros(gpu, {static_cast<int64_t>(block.nbytes())}, PLX_U8, 0);
    if (pinned) host[v] = gpu.allocator(0, PLX_MEM_PINNED).allocate(sizeof(float), a.stream());
  }
  auto out = [&](int v) { return pinned ? static_cast<float*>(host[v]->ptr) : pageable[v].data(); };
  int around_calls = 0;
  for (int i = 0; i < 6; ++i) {
    const int v = i % 2;
    const Batch data = make_batch(batch, 500 + static_cast<uint64_t>(i));
    const double lr = 0.05 * (1 + i);
    // The slot's staging holds this step's inputs where the block has them.
    std::vector<unsigned char> bytes(static_cast<size_t>(block.nbytes()), 0);
    std::memcpy(bytes.data() + x_at, data.x.data(), xb);
    std::memcpy(bytes.data() + x_at + xb, data.labels.data(), data.labels.size() * sizeof(int32_t));
    const float lr32 = static_cast<float>(lr);
    std::memcpy(bytes.data() + x_at + xb + lb, &lr32, sizeof lr32);
    staging[v].copy_from_host(bytes.data());
    *out(v) = -1.0f;

    Executable::Around around;
    around.variant = v;
    around.capturable = pinned;
    around.before = [&, v] {
      ++around_calls;
      gpu.copy(0, block.data(), staging[v].data(), block.nbytes(), PLX_COPY_D2D, a.stream());
    };
    around.after = [&, v] {
      gpu.copy(0, out(v), a.tensor("loss_value").data(), sizeof(float), PLX_COPY_D2H, a.stream());
    };
    CHECK(a.captures(around) == capturable);
    a.run(around);
    a.sync();
    feed(b, data, lr);
    b.run();
    b.sync();
    const double want = loss_of(b);
    INFO("step " << i << " (slot " << v << "): around " << *out(v) << ", fed " << want);
    CHECK(std::isfinite(want));
    CHECK(std::fabs(*out(v) - want) <= 1e-5 * std::fabs(want) + 1e-6);
    CHECK(std::fabs(loss_of(a) - want) <= 1e-5 * std::fabs(want) + 1e-6);
  }
  // Captured: the work ran in the first (op by op) run and in each slot's recording; the other
  // three runs replayed it.
  CHECK(around_calls == (capturable ? 3 : 6));
  CHECK(a.replaying() == capturable);
  for (const std::string& p : s.params) {
    INFO(p);
    CHECK(compare_tensors(store_a.get(p), store_b.get(p), nmse_only(1e-10)) == "");
  }
  for (MemoryBlock* h : host)
    if (h) gpu.allocator(0, PLX_MEM_PINNED).free(h);

  // A name that is no input is refused, naming it.
  ExecutableOptions bad;
  bad.input_block = {"labels", s.params.front()};
  TensorStore store_c;
  CHECK_THROWS_WITH(Executable(gpu, *s.graph, store_c, bad),
                    PLX_CONTAINS("'" + s.params.front() + "'") && PLX_CONTAINS("not an input"));
}

// Work around the step that claims to be capturable but is not (its copy out goes to pageable
// memory, which the emulator refuses inside a capture, as a graph's copy nodes take pinned
// memory): the capture fails, the run goes on with that work outside the graph (a warning), and
// every step still gives the loss of a step fed directly.
void check_around_refused(Backend& gpu) {
  const int64_t batch = 8;
  const Step s = convnet_step(batch, false, false, false);
  TensorStore store_a, store_b;
  ExecutableOptions ea, eb;
  ea.seed = eb.seed = 29;
  eb.capture = false;
  Executable a(gpu, *s.graph, store_a, ea);
  Executable b(gpu, *s.graph, store_b, eb);
  float loss = -1;  // pageable
  int calls = 0;
  Executable::Around around;
  around.capturable = true;
  around.after = [&] {
    ++calls;
    gpu.copy(0, &loss, a.tensor("loss_value").data(), sizeof loss, PLX_COPY_D2H, a.stream());
  };
  for (int i = 0; i < 4; ++i) {
    const Batch data = make_batch(batch, 600 + static_cast<uint64_t>(i));
    feed(a, data, kLr);
    loss = -1;
    a.run(around);
    a.sync();
    feed(b, data, kLr);
    b.run();
    b.sync();
    const double want = loss_of(b);
    INFO("step " << i << ": around " << loss << ", fed " << want);
    CHECK(std::fabs(loss - want) <= 1e-5 * std::fabs(want) + 1e-6);
  }
  if (cuda::emulated(gpu)) {
    CHECK_FALSE(a.captures(around));  // refused once, outside from then on
    CHECK(calls == 5);                // 4 runs, and the capture that failed
  }
  CHECK(a.replaying());  // the step itself is captured either way
}

// The step with fusion (the backend's multi-tensor SGD update; conv2d+relu, linear+relu and the
// classifier head as one kernel each) against the same step node by node on the same backend.
// `bitwise`: the fused kernels run the very same arithmetic (the CPU's do, but for the bias
// gradient of a conv with its pool, which sums the same values in f64 in another order: equal
// here, and in general to rounding; cuBLASLt's ReLU
// epilogue may pick another GEMM algorithm, and the CUDA head sums its logits in its own order,
// so CUDA is held to f32 tolerances).
void check_fusion(Backend& gpu, bool bitwise) {
  const int64_t batch = 8;
  const Step s = convnet_step(batch, true, false, false);
  TensorStore store_a, store_b;
  ExecutableOptions ea, eb;
  ea.seed = eb.seed = 31;
  ea.fuse = true;
  eb.fuse = false;
  Executable a(gpu, *s.graph, store_a, ea);
  Executable b(gpu, *s.graph, store_b, eb);
  INFO("fused kernels:\n" << [&] {
    std::string k;
    for (const auto& n : a.kernel_names())
      if (n.find("fused kernel") != std::string::npos) k += n + "\n";
    return k;
  }());
  // One conv2d+relu, two conv2d+relu+max_pool2d, one linear+relu, the head (the last linear,
  // the loss and its backward; on CUDA also the linear's dx and db, which the CPU leaves to
  // BLAS and its sum), on CUDA the first conv's and the first linear's relu_backward with its
  // bias sum, two max_pool2d_backward+conv2d_backward (the pool's backward,
  // the conv's data and weight gradients and its bias sum), one update for all ten parameters.
  // (The ReLUs' masks before the pools travel in the pools' indices, relu_mask: no
  // relu_backward to fuse.)
  const bool cuda = gpu.name() == "cuda";
  CHECK(a.plan().fused_kernels == (cuda ? 10 : 8));
  const int64_t head = cuda ? 5 : 3, relu_sum = cuda ? 2 * 2 : 0;
  CHECK(a.plan().fused_nodes == 2 + 2 * 3 + 2 + head + relu_sum + 2 * 4 + 10);
  // The first conv's and the first linear's pre-activations, the pooled layers' conv and ReLU
  // outputs, the logits and log_probs, the two unpooled gradients.
  CHECK(a.plan().internal_values == 2 + 2 * 2 + 2 + 2);
  CHECK(a.plan().unplanned_bytes < b.plan().unplanned_bytes);
  CHECK(b.plan().fused_kernels == 0);
  for (int i = 0; i < 3; ++i) {
    const auto [la, lb] = step_both(a, b, make_batch(batch, 400 + static_cast<uint64_t>(i)));
    INFO("step " << i << ": fused " << la << ", node by node " << lb);
    CHECK(std::isfinite(la));
    if (bitwise) CHECK(la == lb);
    else CHECK(std::fabs(la - lb) <= 1e-5 * std::fabs(lb) + 1e-6);
  }
  for (const auto& [name, t] : store_b.all()) {
    INFO("after three steps: " << name);
    if (bitwise) CHECK(store_a.get(name).to_doubles() == t.to_doubles());
    else CHECK(compare_tensors(store_a.get(name), t, nmse_only(kNmse)) == "");
  }
  for (const std::string& p : s.params) {
    INFO("gradient of " << p << " in the last step");
    if (bitwise) CHECK(a.tensor(grad_name(p)).to_doubles() == b.tensor(grad_name(p)).to_doubles());
    else CHECK(compare_tensors(a.tensor(grad_name(p)), b.tensor(grad_name(p)), nmse_only(kNmse)) == "");
  }
}

// The trainer's convnet step (build_step, batch 8, SGD with momentum) in `compute`, twice on one
// backend from one seed: `a` with the backend's fusion, `b` node by node.
//
// Both steps must compute the same forward bits up to the classifier: a 16-bit step routes its
// gradients by comparisons (the max-pools' argmax, the ReLUs' masks) that values one rounding
// apart flip, and a flipped route moves a whole gradient, far more than a rounding. So both run
// the same library kernels on the same layouts: NCHW throughout (the fused step would plan other
// layouts than the node-by-node one, whose lone casts cannot write a filter channels-last, and
// cuDNN's NHWC kernels are not its NCHW ones), and no cuDNN fused convolution + bias + ReLU call
// (another kernel than the convolution with its ReLU after it). The layout planner and the fused
// call are tested on their own (test_cuda_layout.cpp; "conv2d -> relu fused on cuda is one cudnn call where cudnn takes it"). The backend is one
// of its own runtime, with that plugin option.
struct FusedAndPlain {
  static constexpr int64_t kBatch = 8;
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<StepGraph> sg;
  TensorStore store_a, store_b;
  Executable a, b;
  FusedAndPlain(plx_dtype compute, const LossScaling* loss_scaling, uint64_t seed,
                const std::string& optimizer = "sgd")
      : rt(same_kernels_runtime()),
        sg(step(*rt, compute, loss_scaling, optimizer)),
        a(rt->backend("cuda"), sg->graph, store_a, options(true, seed)),
        b(rt->backend("cuda"), sg->graph, store_b, options(false, seed)) {}
  // The fused step's kernels, one a line (for INFO).
  std::string kernels() const {
    std::string names;
    for (const auto& k : a.kernel_names()) names += k + "\n";
    return names;
  }

 private:
  static std::unique_ptr<Runtime> same_kernels_runtime() {
    RuntimeOptions o = plugin_dir_options();
    o.kernels = runtime().options().kernels;  // the suite's side, untimed (support/harness.cpp)
    o.plugins.options["cuda"]["conv_bias_activation"] = "false";
    return std::make_unique<Runtime>(o);
  }
  static std::unique_ptr<StepGraph> step(Runtime& rt, plx_dtype compute,
                                         const LossScaling* loss_scaling,
                                         const std::string& optimizer) {
    const ModelSpec spec = builtin_model("convnet");
    OptimizerOptions opt;
    opt.kind = optimizer;
    opt.momentum = 0.9;
    return build_step(rt.ops(), spec, kBatch, spec.input_shape, true, opt, false, compute,
                      loss_scaling);
  }
  static ExecutableOptions options(bool fuse, uint64_t seed) {
    ExecutableOptions o;
    o.seed = seed;
    o.fuse = fuse;
    o.channels_last = false;
    return o;
  }
};

// The nodes a fused kernel's name lists ("fused kernel 'x' [n1, n2, ...]: ..."; what follows the
// list, the members' kernels and their timings, has commas of its own).
int listed_nodes(const std::string& kernel) {
  const size_t open = kernel.find(" ["), close = kernel.find("]: ");
  if (open == std::string::npos || close == std::string::npos || close < open) return 0;
  return static_cast<int>(std::count(kernel.begin() + static_cast<std::ptrdiff_t>(open),
                                     kernel.begin() + static_cast<std::ptrdiff_t>(close), ',')) +
         1;
}

// The trainer's mixed-precision step (build_step, bf16): its casts (each parameter to bf16,
// all before the first layer; each gradient back to f32 for the update) run inside a few
// kernels: the parameters' as one multi-tensor cast, the gradients' inside the multi-tensor
// update, which reads them in bf16 and widens them as the cast does, the logits' and dlogits'
// inside the fused head. So the fused step follows the step node by node (to the tolerance the
// other fused kernels, such as the head, need).
void check_cast_fusion() {
  FusedAndPlain p(PLX_BF16, nullptr, 17);
  const int64_t batch = FusedAndPlain::kBatch;
  Executable& a = p.a;
  Executable& b = p.b;
  int casts = 0, cast_kernels = 0, cast_nodes = 0, update_nodes = -1;
  bool head_casts = false;
  for (const GraphNode& n : p.sg->graph.nodes())
    if (n.schema && n.schema->name == "cast") ++casts;
  const std::string names = p.kernels();
  for (const auto& k : a.kernel_names()) {
    if (k.find("fused kernel 'multi_tensor_sgd'") != std::string::npos) update_nodes = listed_nodes(k);
    if (k.find("fused kernel 'linear+softmax_cross_entropy'") != std::string::npos)
      head_casts = k.find("logits.cast,") != std::string::npos &&
                   k.find("logits.cast.grad") != std::string::npos;
    if (k.find("fused kernel 'multi_tensor_cast'") == std::string::npos) continue;
    ++cast_kernels;
    cast_nodes += listed_nodes(k);
  }
  INFO("kernels of the fused step:\n" << names);
  // The images and 10 parameters to bf16 in one run; 10 gradients to f32 with their 10
  // updates; the logits' cast and its gradient's in the head.
  CHECK(casts == 23);
  CHECK(cast_kernels == 1);
  CHECK(cast_nodes == 11);
  CHECK(update_nodes == 20);
  CHECK(head_casts);
  for (int i = 0; i < 3; ++i) {
    const auto [la, lb] = step_both(a, b, make_batch(batch, 500 + static_cast<uint64_t>(i)));
    INFO("step " << i << ": fused " << la << ", node by node " << lb);
    CHECK(std::isfinite(la));
    CHECK(std::fabs(la - lb) <= 1e-3 * std::fabs(lb) + 1e-5);
  }
  for (const auto& [name, t] : p.store_b.all()) {
    INFO("after three steps: " << name);
    CHECK(compare_tensors(p.store_a.get(name), t, nmse_only(1e-4)) == "");
  }
}

// What each tensor of `store` moved since `before` (its values then, by name).
std::map<std::string, std::vector<double>> moves(
    const TensorStore& store, const std::map<std::string, std::vector<double>>& before) {
  std::map<std::string, std::vector<double>> d;
  for (const auto& [name, t] : store.all()) {
    std::vector<double> v = t.to_doubles();
    const std::vector<double>& b = before.at(name);
    for (size_t i = 0; i < v.size(); ++i) v[i] -= b[i];
    d[name] = std::move(v);
  }
  return d;
}

// The fused step's parameters moved as the plain step's did: the moves, not the values, held to
// the tolerance (a step moves a parameter by a small fraction of itself, so the values alone
// would hide one chunk of one tensor updated wrongly).
void check_same_moves(const FusedAndPlain& p,
                      const std::map<std::string, std::vector<double>>& before_a,
                      const std::map<std::string, std::vector<double>>& before_b) {
  const auto da = moves(p.store_a, before_a), db = moves(p.store_b, before_b);
  for (const auto& [name, t] : p.store_b.all()) {
    if (name.rfind(kLossScalerPrefix, 0) == 0) continue;
    INFO("the move of " << name);
    const Tensor want = from_doubles(db.at(name), t.shape(), PLX_F64);
    const Tensor got = from_doubles(da.at(name), t.shape(), PLX_F64);
    CHECK(compare_tensors(got, want, nmse_only(1e-4)) == "");
  }
}

std::map<std::string, std::vector<double>> values(const TensorStore& store) {
  std::map<std::string, std::vector<double>> v;
  for (const auto& [name, t] : store.all()) v[name] = t.to_doubles();
  return v;
}

// f16 loss scaling (build_step, f16, loss_scaling) with `optimizer` ("sgd" or "adamw"): the
// unscale and check of every gradient (its cast to f32, a mul by 1/S, a sum, the sums added up)
// run as one multi-tensor kernel, the updates read its check (skipped unless it is finite) and
// loss_scale_update moves the scale on the device, in the updates' launch (their last block). The
// fused step follows the step node by node (to the tolerance the fused head needs; the unscale
// itself is the mul's bits); a scale that overflows f16 makes the check non-finite in both, so
// both skip the update (every tensor as it was) and halve the scale. AdamW reads the step count
// the loss scale's update moves, so a last block that came too early (a counter left wrong by
// the launch before) shows in AdamW's moves.
void check_unscale_fusion(const std::string& optimizer) {
  LossScaling scaling;
  scaling.window = 2;
  FusedAndPlain p(PLX_F16, &scaling, 19, optimizer);
  Executable& a = p.a;
  Executable& b = p.b;
  int listed = -1, updates = -1, scalers = 0;
  bool scaler_joins = false;
  for (const auto& k : a.kernel_names()) {
    if (k.find("fused kernel 'multi_tensor_unscale_check'") != std::string::npos) listed = listed_nodes(k);
    if (k.find("fused kernel 'multi_tensor_" + optimizer + "'") != std::string::npos) {
      updates = listed_nodes(k);
      scaler_joins = k.find(", loss_scale]") != std::string::npos;
    }
    scalers += k.find("loss_scale_update") != std::string::npos;
  }
  INFO("kernels of the fused step:\n" << p.kernels());
  // 10 gradients: 10 casts, 10 muls, 10 sums and the 9 adds of the check; 10 updates reading
  // it and the loss scale's update, with no kernel of its own.
  CHECK(listed == 39);
  CHECK(updates == 11);
  CHECK(scaler_joins);
  CHECK(scalers == 0);
  // Node by node, the loss scale's update is its own kernel.
  int plain_scalers = 0;
  for (const auto& k : b.kernel_names()) plain_scalers += k.find("loss_scale_update") != std::string::npos;
  CHECK(plain_scalers == 1);
  const Batch data = make_batch(FusedAndPlain::kBatch, 600);
  int64_t steps = 0;
  for (const double scale : {1024.0, 0x1p40}) {
    INFO("loss scale " << scale);
    LossScaler s;
    s.scale = scale;
    const auto before_a = values(p.store_a), before_b = values(p.store_b);
    for (Executable* e : {&a, &b}) {
      write_loss_scaler(e == &a ? p.store_a : p.store_b, s, steps);
      e->tensor("x").copy_from_host(data.x.data());
      e->tensor("labels").copy_from_host(data.labels.data());
      const float lr = 0.01f;
      e->tensor(kLearningRateInput).copy_from_host(&lr);
      e->run();
      e->sync();
    }
    ++steps;
    const std::vector<double> ra = a.tensor(kLossScaleReport).to_doubles();
    const std::vector<double> rb = b.tensor(kLossScaleReport).to_doubles();
    const bool skip = scale > 1e6;
    // The scale it ran with, skipped, the scale after, the finite steps in a row, skipped in all.
    const std::vector<double> want = skip ? std::vector<double>{scale, 1, scale / 2, 0, 1}
                                          : std::vector<double>{scale, 0, scale, 1, 0};
    CHECK(ra == want);
    CHECK(rb == want);
    for (const auto& [name, t] : p.store_b.all()) {
      INFO("tensor " << name);
      if (name.rfind(kLossScalerPrefix, 0) == 0) {
        CHECK(p.store_a.get(name).to_doubles() == t.to_doubles());
      } else if (skip) {
        CHECK(t.to_doubles() == before_b.at(name));
        CHECK(p.store_a.get(name).to_doubles() == before_a.at(name));
      } else {
        CHECK(t.to_doubles() != before_b.at(name));
        CHECK(compare_tensors(p.store_a.get(name), t, nmse_only(1e-4)) == "");
      }
    }
    if (!skip) check_same_moves(p, before_a, before_b);
  }
  // Then the scale moves by itself, the fused step captured and replayed (`a` captures from its
  // second run): back to 1024 (one skipped step so far), it doubles after every 2 finite steps.
  LossScaler s;
  s.scale = 1024;
  s.skipped = 1;
  write_loss_scaler(p.store_a, s, steps);
  write_loss_scaler(p.store_b, s, steps);
  const auto before_a = values(p.store_a), before_b = values(p.store_b);
  const std::vector<std::vector<double>> want = {
      {1024, 0, 1024, 1, 1}, {1024, 0, 2048, 0, 1}, {2048, 0, 2048, 1, 1}, {2048, 0, 4096, 0, 1}};
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("replayed step " << i);
    const Batch d = make_batch(FusedAndPlain::kBatch, 610 + i);
    for (Executable* e : {&a, &b}) {
      e->tensor("x").copy_from_host(d.x.data());
      e->tensor("labels").copy_from_host(d.labels.data());
      e->run();
      e->sync();
    }
    CHECK(a.tensor(kLossScaleReport).to_doubles() == want[i]);
    CHECK(b.tensor(kLossScaleReport).to_doubles() == want[i]);
  }
  CHECK(a.replaying());
  for (const auto& [name, t] : p.store_b.all()) {
    INFO("after the replayed steps: " << name);
    CHECK(compare_tensors(p.store_a.get(name), t, nmse_only(1e-4)) == "");
  }
  check_same_moves(p, before_a, before_b);
}

}  // namespace

TEST_CASE("a fused cuda f16 step unscales and checks its gradients in one kernel", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  (void)gpu;  // a runtime of its own (FusedAndPlain)
  check_unscale_fusion("sgd");
}

TEST_CASE(
    "a fused cuda f16 adamw step moves its loss scale and step count after every block has read "
    "them",
    "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  (void)gpu;
  check_unscale_fusion("adamw");
}

TEST_CASE("a fused cuda bf16 step runs its casts as multi-tensor kernels", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  (void)gpu;
  check_cast_fusion();
}

TEST_CASE("a fused cuda training step matches the step node by node", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_off(gpu);
  check_fusion(gpu, false);
}

TEST_CASE("a cuda convnet training step matches the cpu step", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_off(gpu);
  check_step_matches_cpu(gpu);
}

TEST_CASE("every node of a cuda convnet training step matches the cpu op on its inputs", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_off(gpu);
  check_nodes_match_cpu(gpu);
}

TEST_CASE("a captured cuda training step replays like the uncaptured one", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_off(gpu);
  check_capture(gpu, true);
}

TEST_CASE("a cuda step captures each slot's copies around it in a graph of its own", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_off(gpu);
  check_capture_around(gpu, true);
  check_around_refused(gpu);
}

// The same three checks with the CPU as the backend under test: they run here, so the graph
// building, the decision inspection and the node-by-node replay are known to work before a GPU
// machine sees them.
TEST_CASE("the convnet step comparisons pass with the cpu backend under test", "[cpu][compare]") {
  SECTION("end to end") { check_step_matches_cpu(cpu()); }
  SECTION("node by node") { check_nodes_match_cpu(cpu()); }
  SECTION("captured against uncaptured") { check_capture(cpu(), false); }
  SECTION("work around the step, not captured") { check_capture_around(cpu(), false); }
  SECTION("fused against node by node") { check_fusion(cpu(), true); }
}
