// The classifier head fused on CUDA (plugins/cuda/ops/linear_ce.cu): linear -> [cast to f32] ->
// softmax_cross_entropy with the argmax and the loss's backward as one kernel, against the same
// graph on the CPU (whose fused head equals its unfused nodes to the bit,
// tests/train/test_fusion_head.cpp). The GEMM sums in another order, so float results are held
// to tolerances, and a prediction may differ only where the CPU's two logits are within rounding
// of each other (a near-tie: the 16-bit logits round to ties often). The logits are marked as a
// graph output, so the fused kernels also write them (the group is claimed all the same).
#include <cmath>
#include <map>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::cmp;

namespace {

struct HeadCase {
  plx_dtype d = PLX_F32;
  bool mixed = false;  // the linear in d, cast to f32 for the loss
  std::string reduction = "mean";
  double smoothing = 0;
  int64_t n = 7, k = 9, c = 5;
  bool fused_on_cuda = true;  // false: the weight does not fit in shared memory, declined
  // x needs a gradient (it comes from a parameter through a ReLU, as after a hidden layer), so
  // the linear's dx, and with it db, joins the cuda group (and dlogits' cast back, mixed).
  bool dx = false;
};

// Two passes of one executable, with other inputs (x, labels, dloss) in the second: a kernel
// whose state after a launch is wrong (a block counter not back at zero) sums the first pass's
// partials into the second's results.
constexpr int kPasses = 2;

struct Run {
  std::vector<std::map<std::string, Tensor>> out;  // by pass
  std::vector<std::string> kernels;
};

Run run_head(Backend& b, const HeadCase& h, const TensorStore* params_from, TensorStore& store) {
  Graph g(runtime().ops());
  const plx_dtype ld = h.mixed ? PLX_F32 : h.d;
  const Var x = h.dx ? g.add1("relu", {g.parameter("x", {h.d, {h.n, h.k}}, init::uniform(-2, 2))},
                              {}, "x.relu")
                     : g.input("x", {h.d, {h.n, h.k}});
  const Var labels = g.input("labels", {PLX_I32, {h.n}});
  const Var w = g.parameter("out.weight", {h.d, {h.c, h.k}}, init::xavier_uniform(h.k, h.c));
  const Var bias = g.parameter("out.bias", {h.d, {h.c}}, init::uniform(-0.5, 0.5));
  Var logits = g.add1("linear", {x, w, bias}, {}, "out");
  g.mark_output(logits, "logits_out");
  if (h.mixed) logits = g.add1("cast", {logits}, {{"dtype", std::string("f32")}}, "logits.cast");
  Attrs la;
  la.set("reduction", h.reduction);
  la.set("label_smoothing", h.smoothing);
  const Var loss = g.add("softmax_cross_entropy", {logits, labels}, la, "loss").at(0);
  Attrs aa;
  aa.set("axis", int64_t{1});
  g.mark_output(g.add1("argmax", {logits}, aa, "pred"), "pred_out");
  const std::vector<Var> params = g.parameters();
  const std::vector<Var> grads = h.reduction == "none"
                                     ? backward(g, loss, params, g.input("dloss", {ld, {h.n}}))
                                     : backward(g, loss, params);
  g.mark_output(loss, "loss_out");
  const size_t p0 = h.dx ? 1 : 0;  // the parameter x first, then the linear's
  g.mark_output(grads[p0], "dw");
  g.mark_output(grads[p0 + 1], "db");
  if (h.dx) g.mark_output(grads[0], "dx");
  ExecutableOptions eo;
  eo.seed = 23;
  Executable exe(b, g, store, eo);
  if (params_from)
    for (const auto& [name, t] : params_from->all()) fill(store.get(name), t.to_doubles());
  Run r;
  for (int pass = 0; pass < kPasses; ++pass) {
    const auto seed = static_cast<uint64_t>(41 + 10 * pass);
    if (!h.dx) fill(exe.tensor("x"), random_doubles(static_cast<size_t>(h.n * h.k), seed, -2, 2));
    std::vector<int32_t> lab(static_cast<size_t>(h.n));
    for (size_t i = 0; i < lab.size(); ++i)
      lab[i] = (i + static_cast<size_t>(pass)) % 4 == 2
                   ? -100
                   : static_cast<int32_t>((i * 7 + static_cast<size_t>(3 * pass)) %
                                          static_cast<size_t>(h.c));
    exe.tensor("labels").copy_from_host(lab.data());
    if (h.reduction == "none")
      fill(exe.tensor("dloss"), random_doubles(static_cast<size_t>(h.n), seed + 2, 0.5, 1.5));
    exe.run();
    exe.sync();
    // Copies (on the CPU, to(cpu()) would alias the outputs the next pass overwrites).
    std::map<std::string, Tensor>& out = r.out.emplace_back();
    auto keep = [&](const char* name) {
      const Tensor t = exe.tensor(name);
      out[name] = from_doubles(t.to_doubles(), t.shape(), t.dtype());
    };
    for (const char* name : {"logits_out", "pred_out", "loss_out", "dw", "db"}) keep(name);
    if (h.dx) keep("dx");
  }
  r.kernels = exe.kernel_names();
  return r;
}

bool has_kernel(const Run& r, const std::string& text) { return cuda::has_kernel(r.kernels, text); }

}  // namespace

TEST_CASE("the classifier head fused on cuda matches the cpu", "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_off(gpu);
  std::vector<HeadCase> cases;
  for (plx_dtype d : {PLX_F32, PLX_BF16, PLX_F16})
    for (const char* red : {"mean", "sum", "none"}) {
      HeadCase h;
      h.d = d;
      h.reduction = red;
      h.smoothing = 0.1;
      cases.push_back(h);
    }
  HeadCase mixed;
  mixed.d = PLX_BF16;
  mixed.mixed = true;
  cases.push_back(mixed);
  HeadCase big;  // many blocks each looping over rows; classes past one warp and one tile
  big.n = 3000;
  big.k = 100;
  big.c = 100;
  cases.push_back(big);
  // The linear's dx and db in the group: f32, 16-bit, mixed (dlogits cast back), reduction sum,
  // many blocks adding up db, and an empty batch (the loss and db still written).
  for (plx_dtype d : {PLX_F32, PLX_BF16, PLX_F16}) {
    HeadCase h;
    h.d = d;
    h.dx = true;
    cases.push_back(h);
  }
  HeadCase mixed_dx = mixed;
  mixed_dx.dx = true;
  cases.push_back(mixed_dx);
  HeadCase sum_dx;
  sum_dx.dx = true;
  sum_dx.reduction = "sum";
  cases.push_back(sum_dx);
  HeadCase big_dx = big;
  big_dx.dx = true;
  big_dx.c = 37;
  cases.push_back(big_dx);
  HeadCase declined = big;  // 100 x 400 f32 weights: 160 KB, more than shared memory holds
  declined.n = 64;
  declined.k = 400;
  declined.fused_on_cuda = false;
  cases.push_back(declined);
  for (const HeadCase& h : cases) {
    INFO(dtype_name(h.d) << (h.mixed ? " cast to f32" : "") << " reduction " << h.reduction
                         << " n " << h.n << " k " << h.k << " c " << h.c);
    TensorStore cpu_store, gpu_store;
    const Run want = run_head(cpu(), h, nullptr, cpu_store);
    const Run got = run_head(gpu, h, &cpu_store, gpu_store);
    CHECK(has_kernel(want, "cpu/linear+softmax_cross_entropy"));
    CHECK(has_kernel(got, "cuda/linear+softmax_cross_entropy") == h.fused_on_cuda);
    // With dx, the cuda group also computes the linear's dx and db (its name lists the nodes);
    // only dw's matmul runs on its own.
    if (h.dx) {
      std::string group;
      for (const auto& k : got.kernels)
        if (k.find("cuda/linear+softmax_cross_entropy") != std::string::npos) group = k;
      INFO("the fused kernel: " << group);
      CHECK(group.find("out.grad") != std::string::npos);
      if (h.mixed) CHECK(group.find("logits.cast.grad") != std::string::npos);
    }
    for (int pass = 0; pass < kPasses; ++pass) {
      INFO("pass " << pass + 1 << " of " << kPasses);
      const std::map<std::string, Tensor>& go = got.out.at(static_cast<size_t>(pass));
      const std::map<std::string, Tensor>& wo = want.out.at(static_cast<size_t>(pass));
      if (h.dx)
        CHECK(compare_tensors(go.at("dx"), wo.at("dx"), tolerance_for(h.d, h.c, false)) == "");
      CHECK(compare_tensors(go.at("logits_out"), wo.at("logits_out"),
                            tolerance_for(h.d, h.k, false)) == "");
      // Predictions: equal, or a near-tie in the CPU's logits.
      const std::vector<double> gp = go.at("pred_out").to_doubles();
      const std::vector<double> wp = wo.at("pred_out").to_doubles();
      const std::vector<double> z = wo.at("logits_out").to_doubles();
      const Tolerance tz = tolerance_for(h.d, h.k, false);
      REQUIRE(gp.size() == wp.size());
      for (size_t i = 0; i < gp.size(); ++i) {
        if (gp[i] == wp[i]) continue;
        INFO("row " << i << ": cuda predicts " << gp[i] << ", the cpu " << wp[i]);
        REQUIRE((gp[i] >= 0 && gp[i] < static_cast<double>(h.c)));
        const double a = z[i * static_cast<size_t>(h.c) + static_cast<size_t>(gp[i])];
        const double b = z[i * static_cast<size_t>(h.c) + static_cast<size_t>(wp[i])];
        CHECK(std::fabs(a - b) <= 2 * (tz.atol + tz.rtol * std::fabs(b)));
      }
      const plx_dtype ld = h.mixed ? PLX_F32 : h.d;
      CHECK(compare_tensors(go.at("loss_out"), wo.at("loss_out"), tolerance_for(ld, h.k, false)) ==
            "");
      CHECK(compare_tensors(go.at("db"), wo.at("db"), tolerance_for(h.d, h.n, false)) == "");
      CHECK(compare_tensors(go.at("dw"), wo.at("dw"), tolerance_for(h.d, h.n, false)) == "");
    }
  }
}
