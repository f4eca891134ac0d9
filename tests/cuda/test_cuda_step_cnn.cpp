// A small CNN's whole training step fused on CUDA (plugins/cuda/ops/step_cnn.cu): two layers of
// conv -> relu -> max-pool, flattened into a linear classifier with softmax cross-entropy and
// the argmax, and all of the backward, as one "small_cnn_step" kernel object (a block per image,
// then a launch that sums the images' gradients), against the same graph on the CPU.
//
// The cases cover simplecnn's own shapes (the model the kernel exists for), padding, three input
// channels, 3x3 pool windows, pools that drop the conv's last row and column, the sum reduction
// with label smoothing, i64 labels with ignored rows, two passes of one executable (nothing of
// the first may leak into the second), an image too large for a block's shared memory (declined:
// the parts' own fused kernels run), the plugin's step_fusion off (the same), and a label out of
// range (an error naming it, as the cross-entropy node's). On the native side (backend.kernels):
// the library side declines the plugin's own code for nodes cuDNN and cuBLASLt take.
//
// The convolutions and the sums over the batch add in other orders than the CPU's, so values are
// held to the tolerances of the other fusion tests; the predictions must be equal (a near-tie
// among continuous random logits within rounding is improbable at these sizes).
#include <cmath>
#include <map>
#include <optional>
#include <string>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::cmp;

namespace {

struct StepCase {
  std::string what;
  int64_t n = 9, c0 = 1, h = 28, w = 28;
  int64_t o1 = 16, k1 = 3, pad1 = 0, q1 = 2;
  int64_t o2 = 32, k2 = 3, pad2 = 0, q2 = 2;
  int64_t classes = 10;
  std::string reduction = "mean";
  double smoothing = 0;
  plx_dtype labels = PLX_I32;
  bool ignore = false;     // every fourth row's label is ignore_index
  bool fused = true;       // expected to run as the step kernel on CUDA
  bool step_fusion = true; // the CUDA plugin's option
};

constexpr int kPasses = 2;

// Turns the CUDA plugin's step_fusion on or off for graphs prepared while it lives, then back on.
struct StepFusion {
  Backend& b;
  StepFusion(Backend& backend, bool on) : b(backend) {
    REQUIRE(cuda::set_switch(b, "cuda.set_step_fusion", on));
  }
  ~StepFusion() { cuda::set_switch(b, "cuda.set_step_fusion", true); }
  StepFusion(const StepFusion&) = delete;
  StepFusion& operator=(const StepFusion&) = delete;
};

const char* const kGrads[] = {"grad:c1.weight", "grad:c1.bias", "grad:c2.weight",
                              "grad:c2.bias",   "grad:fc.weight", "grad:fc.bias"};

struct Graphed {
  std::unique_ptr<Graph> g;
  int64_t features = 0;
};

Graphed build(const StepCase& c, const OpRegistry& ops = runtime().ops()) {
  Graphed r;
  r.g = std::make_unique<Graph>(ops);
  Graph& g = *r.g;
  const Var x = g.input("x", {PLX_F32, {c.n, c.c0, c.h, c.w}});
  const Var labels = g.input("labels", {c.labels, {c.n}});
  auto conv_attrs = [](int64_t pad) {
    return Attrs{{"stride", Ints{1, 1}}, {"padding", Ints{pad, pad}}, {"dilation", Ints{1, 1}},
                 {"groups", int64_t{1}}};
  };
  auto pool_attrs = [](int64_t q) {
    return Attrs{{"kernel", Ints{q, q}}, {"stride", Ints{q, q}}, {"padding", Ints{0, 0}},
                 {"dilation", Ints{1, 1}}, {"ceil_mode", int64_t{0}}};
  };
  const int64_t t1 = c.c0 * c.k1 * c.k1, t2 = c.o1 * c.k2 * c.k2;
  const Var w1 = g.parameter("c1.weight", {PLX_F32, {c.o1, c.c0, c.k1, c.k1}}, init::kaiming_uniform(t1));
  const Var b1 = g.parameter("c1.bias", {PLX_F32, {c.o1}}, init::uniform(-0.3, 0.3));
  const Var w2 = g.parameter("c2.weight", {PLX_F32, {c.o2, c.o1, c.k2, c.k2}}, init::kaiming_uniform(t2));
  const Var b2 = g.parameter("c2.bias", {PLX_F32, {c.o2}}, init::uniform(-0.3, 0.3));
  const int64_t h1 = (c.h + 2 * c.pad1 - c.k1 + 1) / c.q1, w1s = (c.w + 2 * c.pad1 - c.k1 + 1) / c.q1;
  const int64_t h2 = (h1 + 2 * c.pad2 - c.k2 + 1) / c.q2, w2s = (w1s + 2 * c.pad2 - c.k2 + 1) / c.q2;
  r.features = c.o2 * h2 * w2s;
  const Var w3 = g.parameter("fc.weight", {PLX_F32, {c.classes, r.features}},
                             init::xavier_uniform(r.features, c.classes));
  const Var b3 = g.parameter("fc.bias", {PLX_F32, {c.classes}}, init::uniform(-0.3, 0.3));
  Var v = g.add1("conv2d", {x, w1, b1}, conv_attrs(c.pad1), "c1");
  v = g.add1("relu", {v}, {}, "r1");
  v = g.add("max_pool2d", {v}, pool_attrs(c.q1), "p1").at(0);
  v = g.add1("conv2d", {v, w2, b2}, conv_attrs(c.pad2), "c2");
  v = g.add1("relu", {v}, {}, "r2");
  v = g.add("max_pool2d", {v}, pool_attrs(c.q2), "p2").at(0);
  v = g.reshape(v, {c.n, r.features});
  const Var logits = g.add1("linear", {v, w3, b3}, {}, "fc");
  Attrs la;
  la.set("reduction", c.reduction);
  la.set("label_smoothing", c.smoothing);
  const Var loss = g.add("softmax_cross_entropy", {logits, labels}, la, "loss").at(0);
  Attrs aa;
  aa.set("axis", int64_t{1});
  g.mark_output(g.add1("argmax", {logits}, aa, "pred"), "pred_out");
  const std::vector<Var> params = g.parameters();
  const std::vector<Var> grads = backward(g, loss, params);
  g.mark_output(loss, "loss_out");
  for (size_t i = 0; i < params.size(); ++i) g.mark_output(grads[i], "grad:" + g.value(params[i]).name);
  return r;
}

std::vector<double> labels_for(const StepCase& c, int pass, std::optional<int64_t> bad_row = {}) {
  std::vector<double> lab(static_cast<size_t>(c.n));
  for (size_t i = 0; i < lab.size(); ++i) {
    lab[i] = static_cast<double>((i * 7 + static_cast<size_t>(3 * pass)) % static_cast<size_t>(c.classes));
    if (c.ignore && (i + static_cast<size_t>(pass)) % 4 == 1) lab[i] = -100;
  }
  if (bad_row) lab[static_cast<size_t>(*bad_row)] = static_cast<double>(c.classes);
  return lab;
}

struct Run {
  std::vector<std::map<std::string, Tensor>> out;  // by pass
  std::vector<std::string> kernels;
};

Run run_step(Backend& b, const StepCase& c, const TensorStore* params_from, TensorStore& store) {
  const Graphed gr = build(c, b.runtime().ops());
  ExecutableOptions eo;
  eo.seed = 37;
  Executable exe(b, *gr.g, store, eo);
  if (params_from)
    for (const auto& [name, t] : params_from->all()) fill(store.get(name), t.to_doubles());
  Run r;
  r.kernels = exe.kernel_names();
  for (int pass = 0; pass < kPasses; ++pass) {
    const auto seed = static_cast<uint64_t>(71 + 10 * pass);
    fill(exe.tensor("x"), random_doubles(static_cast<size_t>(c.n * c.c0 * c.h * c.w), seed, -1, 1));
    fill(exe.tensor("labels"), labels_for(c, pass));
    exe.run();
    exe.sync();
    std::map<std::string, Tensor>& out = r.out.emplace_back();
    auto keep = [&](const std::string& name) {
      const Tensor t = exe.tensor(name);
      out[name] = from_doubles(t.to_doubles(), t.shape(), t.dtype());
    };
    keep("loss_out");
    keep("pred_out");
    for (const char* name : kGrads) keep(name);
  }
  return r;
}

bool has_kernel(const Run& r, const std::string& text) { return cuda::has_kernel(r.kernels, text); }

// The whole-step kernel is the plugin's own code, which the suite's library side declines for
// nodes a library kernel takes (docs/sdk.md, "Fusion"): these tests run on the native side, in a
// runtime of their own.
RuntimeOptions native_side() {
  RuntimeOptions o = plugin_dir_options();
  o.kernels = KernelSide::Native;
  return o;
}

}  // namespace

TEST_CASE("a small cnn's whole step fused on cuda matches the cpu", "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(shared);
  (void)shared;
  Runtime rt(native_side());
  Backend& gpu = rt.backend("cuda");
  cuda::Tf32Off tf32_off(gpu);
  std::vector<StepCase> cases;
  StepCase simple;
  simple.what = "simplecnn's shapes";
  cases.push_back(simple);
  StepCase padded;  // 10x10 -> 10x10 -> 5x5 -> 5x5 -> 2x2 (the last row and column dropped)
  padded.what = "padding 1, three channels, sum with smoothing, i64 labels, ignored rows";
  padded.n = 13, padded.c0 = 3, padded.h = 10, padded.w = 10;
  padded.o1 = 4, padded.pad1 = 1, padded.o2 = 6, padded.pad2 = 1, padded.classes = 5;
  padded.reduction = "sum";
  padded.smoothing = 0.1;
  padded.labels = PLX_I64;
  padded.ignore = true;
  cases.push_back(padded);
  StepCase windows;  // 17x13 -> 15x11 -> 5x3 (3x3 windows) -> 4x2 (2x2 kernel) -> 2x1
  windows.what = "3x3 pool windows, 2x2 second kernel, 37 classes";
  windows.n = 5, windows.h = 17, windows.w = 13, windows.o1 = 5, windows.q1 = 3;
  windows.o2 = 7, windows.k2 = 2, windows.classes = 37;
  windows.ignore = true;
  cases.push_back(windows);
  StepCase large;  // 64 channels of 62x62 pooled to 31x31: 246 KB for the first pool alone
  large.what = "an image too large for shared memory";
  large.n = 2, large.h = 64, large.w = 64, large.o1 = 64, large.o2 = 4, large.classes = 3;
  large.fused = false;
  cases.push_back(large);
  StepCase off = simple;
  off.what = "step_fusion off";
  off.n = 4;
  off.step_fusion = false;
  off.fused = false;
  cases.push_back(off);
  for (const StepCase& c : cases) {
    INFO(c.what);
    TensorStore cpu_store, gpu_store;
    const Run want = run_step(cpu(), c, nullptr, cpu_store);
    Run got;
    {
      StepFusion sf(gpu, c.step_fusion);
      got = run_step(gpu, c, &cpu_store, gpu_store);
    }
    INFO("cuda kernels:\n" << [&] {
      std::string k;
      for (const auto& n : got.kernels) k += n + "\n";
      return k;
    }());
    CHECK(has_kernel(got, "cuda/small_cnn_step") == c.fused);
    // Declined or turned off, the parts' own groups take the nodes.
    if (!c.fused) CHECK(has_kernel(got, "cuda/max_pool2d_backward+conv2d_backward"));
    const Graphed gr = build(c);
    const int64_t taps2 = c.o1 * c.k2 * c.k2;
    for (int pass = 0; pass < kPasses; ++pass) {
      INFO("pass " << pass + 1 << " of " << kPasses);
      const auto& go = got.out.at(static_cast<size_t>(pass));
      const auto& wo = want.out.at(static_cast<size_t>(pass));
      CHECK(compare_tensors(go.at("loss_out"), wo.at("loss_out"),
                            tolerance_for(PLX_F32, c.classes * c.n, false)) == "");
      CHECK(go.at("pred_out").to_doubles() == wo.at("pred_out").to_doubles());
      // The first layer's gradients sum over every image and pooled position; the second's
      // too, of terms that are themselves sums over the second conv's taps.
      const int64_t plane = c.h * c.w;
      CHECK(compare_tensors(go.at("grad:c1.weight"), wo.at("grad:c1.weight"),
                            tolerance_for(PLX_F32, c.n * plane * taps2, false)) == "");
      CHECK(compare_tensors(go.at("grad:c1.bias"), wo.at("grad:c1.bias"),
                            tolerance_for(PLX_F32, c.n * plane * taps2, false)) == "");
      CHECK(compare_tensors(go.at("grad:c2.weight"), wo.at("grad:c2.weight"),
                            tolerance_for(PLX_F32, c.n * gr.features * c.classes, false)) == "");
      CHECK(compare_tensors(go.at("grad:c2.bias"), wo.at("grad:c2.bias"),
                            tolerance_for(PLX_F32, c.n * gr.features * c.classes, false)) == "");
      CHECK(compare_tensors(go.at("grad:fc.weight"), wo.at("grad:fc.weight"),
                            tolerance_for(PLX_F32, c.n * c.classes, false)) == "");
      CHECK(compare_tensors(go.at("grad:fc.bias"), wo.at("grad:fc.bias"),
                            tolerance_for(PLX_F32, c.n * c.classes, false)) == "");
      // Not vacuous: the gradients the step writes are not all zero.
      bool nonzero = false;
      for (double v : go.at("grad:c1.weight").to_doubles()) nonzero = nonzero || v != 0;
      CHECK(nonzero);
    }
  }
}

TEST_CASE("a small cnn's fused step reports a label out of range", "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(shared);
  (void)shared;
  Runtime rt(native_side());
  Backend& gpu = rt.backend("cuda");
  StepCase c;
  c.n = 4;
  const Graphed gr = build(c, rt.ops());
  TensorStore store;
  ExecutableOptions eo;
  Executable exe(gpu, *gr.g, store, eo);
  REQUIRE(cuda::has_kernel(exe.kernel_names(), "cuda/small_cnn_step"));
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(c.n * c.h * c.w), 5, -1, 1));
  fill(exe.tensor("labels"), labels_for(c, 0, int64_t{2}));
  exe.run();
  CHECK_THROWS_WITH(exe.sync(), PLX_CONTAINS("label 10 of row 2 is outside [0, 10)"));
  // The error is reported once: the next step with good labels runs.
  fill(exe.tensor("labels"), labels_for(c, 0));
  exe.run();
  CHECK_NOTHROW(exe.sync());
  CHECK(std::isfinite(exe.tensor("loss_out").to_doubles().at(0)));
}
