// linear -> gelu on CUDA (plugins/cuda/ops/fusion.cpp, make_act_pair): where the host gave the
// linear to one of our own GEMMs (mma_sync_*, wgmma_*), the pair is that kernel with the GELU
// (erf or tanh, as the node says) in its epilogue, one launch; where the pre-activation is
// needed outside the pair (in training gelu_backward reads it; here it is a graph output), the
// epilogue stores it beside the activation. On cuBLASLt the pair is declined: in inference the
// linear then writes into the GELU's output and the GELU runs there in place (an epilogue
// chain); with the pre-activation needed outside, they run as two kernels. Each against the
// same graph on the CPU, with the linear's kernel pinned through the tuning cache and the
// group not timed around the linear's other candidates.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/pinned_kernel.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/model.hpp"
#include "plexus/optimizer.hpp"
#include "plexus/runtime.hpp"
#include "support/harness.hpp"
#include "train/step_graph.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::cmp;

namespace {

int count(const std::vector<std::string>& kernels, const std::string& text) {
  int n = 0;
  for (const auto& k : kernels) n += k.find(text) != std::string::npos;
  return n;
}

std::string listing(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// Whether the linear op has candidates of `prefix` in bf16 (no wgmma_* without sm_90).
bool has_candidates(Backend& b, const std::string& prefix) {
  const OpSchema& s = b.runtime().ops().get("linear");
  for (const plx_kernel* k : b.kernels(s.id, PLX_BF16))
    if (k->impl && std::string(k->impl).rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("a linear -> gelu pair on cuda runs as one of our gemms with the gelu in its epilogue",
          "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  if (probe.device(0).arch_major < 8)
    PLX_SKIP("mma.sync with bf16 needs compute capability 8.0 or later");
  const bool hopper = cuda::runs_sm90a(probe);
  struct Layer {
    int64_t rows, in, out;
    std::vector<std::string> tiles;
  };
  // Ragged: 70 rows (a partial M tile) of 64 features -> 40 (a partial N tile). And 16 K tiles
  // (of 64) for the split-K candidates, whose finishing block applies the GELU and stores the
  // pre-activation: 24 x 40 is 2 tiles of 32 x 32 in 4 splits (2 blocks an SM, on 4 SMs or
  // more), one Hopper tile in 4.
  std::vector<Layer> layers = {
      {70, 64, 40, {"mma_sync_128x128x32", "mma_sync_64x64x32", "mma_sync_32x32x64"}},
      {24, 1024, 40, {"mma_sync_32x32x64_splitk"}}};
  if (hopper && has_candidates(probe, "wgmma_")) {
    layers[0].tiles.push_back("wgmma_128x128x64");
    layers[0].tiles.push_back("wgmma_128x256x64");
    layers[1].tiles.push_back("wgmma_128x128x64_splitk");
    // The persistent tiles over 9 (6) output tiles of 4 K tiles: on the emulator's 4 SMs a
    // block stores several, the next tile's loads under way, and its ring wraps; in clusters of
    // two, the last cluster's second M tile lies past the 300 rows; in ping-pong the two warp
    // groups of a block take turns on its tiles.
    layers.push_back(
        {300,
         256,
         264,
         {"wgmma_128x128x64_persistent", "wgmma_128x256x64_persistent", "wgmma_128x256x64_cluster2",
          "wgmma_128x128x64_pingpong", "wgmma_128x128x64_pingpong_cluster2"}});
  }
  for (const Layer& layer : layers) {
    for (const char* approximate : {"none", "tanh"})
      for (bool keep_pre : {false, true}) {
        const int64_t rows = layer.rows, in = layer.in, out = layer.out;
        const std::vector<double> x = random_doubles(static_cast<size_t>(rows * in), 31, -2, 2);
        INFO(rows << " x " << in << " -> " << out << ", approximate " << approximate
                  << (keep_pre ? ", the pre-activation kept" : ""));
        auto build = [&](Graph& g) {
          const Var xv = g.input("x", {PLX_BF16, {rows, in}});
          const Var w = g.parameter("fc.weight", {PLX_BF16, {out, in}}, init::uniform(-0.4, 0.4));
          const Var b = g.parameter("fc.bias", {PLX_BF16, {out}}, init::uniform(-0.5, 0.5));
          const Var pre = g.add1("linear", {xv, w, b}, {}, "fc");
          const Attrs a = {{"approximate", std::string(approximate)}};
          g.mark_output(g.add1("gelu", {pre}, a, "fc.gelu"), "y");
          if (keep_pre) g.mark_output(pre, "pre");
        };
        const std::string tag =
            "gelu-" + std::to_string(in) + "-" + approximate + (keep_pre ? "-pre" : "");
        PinnedKernelRun pinned(
            tag, build, "fc", x, 9,
            keep_pre ? std::vector<std::string>{"pre"} : std::vector<std::string>{});
        REQUIRE_FALSE(pinned.key().empty());
        for (const std::string& tile : layer.tiles) {
          INFO(tile);
          const PinnedKernelRun::Result r = pinned.run(tile, /*time_groups=*/false);
          CHECK(r.report.impl == tile);
          INFO("kernels:\n" << listing(r.kernels));
          CHECK(count(r.kernels, "linear+gelu:" + tile + "-epilogue") == 1);
          CHECK(r.kernels.size() == 1);
          // One rounding of the f32 sum to bf16 on each side (the GELU applied to the f32 sum in
          // the epilogue, to the rounded pre-activation on the CPU): a few bf16 ulps.
          CHECK_ALLCLOSE(r.got, r.want, (Tol{2e-2, 2e-2}));
          REQUIRE(r.also_got.size() == (keep_pre ? 1u : 0u));
          if (keep_pre) CHECK_ALLCLOSE(r.also_got[0], r.also_want[0], (Tol{2e-2, 2e-2}));
        }
        // cuBLASLt's linear: no fused epilogue; the GELU in place after it where nothing else
        // reads the pre-activation (one chain), else two kernels.
        const PinnedKernelRun::Result r = pinned.run("cublaslt", /*time_groups=*/false);
        INFO("cublaslt; kernels:\n" << listing(r.kernels));
        CHECK(r.report.impl == "cublaslt");
        CHECK(count(r.kernels, "-epilogue") == 0);
        CHECK(count(r.kernels, "linear+gelu") == (keep_pre ? 0 : 1));
        CHECK(r.kernels.size() == (keep_pre ? 2u : 1u));
        CHECK_ALLCLOSE(r.got, r.want, (Tol{2e-2, 2e-2}));
        if (keep_pre) CHECK_ALLCLOSE(r.also_got.at(0), r.also_want.at(0), (Tol{2e-2, 2e-2}));
      }
  }
}

// A training step of an MLP with GELUs (both forms) on the plugin's own kernels
// (backend.kernels = "native", so each linear's hint is an mma_sync tile): each hidden linear ->
// gelu runs as one kernel that also stores the pre-activation gelu_backward reads, each
// gelu_backward with its layer's bias gradient as one kernel (ops/pool.cu), and the step's
// loss and updated parameters are the CPU step's (same parameters before it), in f32 (TF32 on
// the Tensor Cores) and bf16.
TEST_CASE("a cuda training step of an mlp with gelus runs each linear -> gelu as one kernel",
          "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  if (probe.device(0).arch_major < 8)
    PLX_SKIP("mma.sync with bf16 needs compute capability 8.0 or later");
  const ModelSpec spec = parse_model(R"(
name = "gelu_mlp"
input = [1, 8, 8]
classes = 10
[[layers]]
type = "flatten"
[[layers]]
type = "linear"
out = 48
[[layers]]
type = "gelu"
[[layers]]
type = "linear"
out = 32
[[layers]]
type = "gelu"
approximate = "tanh"
[[layers]]
type = "linear"
out = "classes"
)",
                                     "test_cuda_linear_gelu.cpp");
  const int64_t n = 24;
  const std::vector<double> x = random_doubles(static_cast<size_t>(n * 64), 41, -1, 1);
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>((i * 7) % 10));
  OptimizerOptions opt;
  opt.kind = "sgd";
  opt.momentum = 0;
  for (plx_dtype d : {PLX_F32, PLX_BF16}) {
    INFO(dtype_name(d));
    struct Out {
      double loss = 0;
      std::map<std::string, std::vector<double>> params;
      std::vector<std::string> kernels;
    };
    // The step on `backend_name`; its parameters from `start` where given.
    auto step = [&](Runtime& rt, const char* backend_name,
                    const std::map<std::string, std::vector<double>>* start) {
      Backend& b = rt.backend(backend_name);
      auto sg = build_step(rt.ops(), spec, n, spec.input_shape, true, opt, false, d);
      TensorStore store;
      ExecutableOptions eo;
      eo.seed = 3;
      Executable exe(b, sg->graph, store, eo);
      if (start)
        for (const auto& [name, v] : *start) fill(store.get(name), v);
      fill(exe.tensor("x"), x);
      exe.tensor("labels").copy_from_host(labels.data());
      fill(exe.tensor("lr"), {0.1});
      Out o;
      std::map<std::string, std::vector<double>> before;
      for (const auto& [name, t] : store.all()) before[name] = t.to_doubles();
      exe.run();
      exe.sync();
      o.loss = exe.tensor("loss_value").to_doubles().at(0);
      for (const auto& [name, t] : store.all()) o.params[name] = t.to_doubles();
      o.kernels = exe.kernel_names();
      return std::make_pair(before, o);
    };
    Runtime cpu_rt(plugin_dir_options());
    const auto [start, want] = step(cpu_rt, "cpu", nullptr);
    RuntimeOptions o = plugin_dir_options();
    o.kernels = KernelSide::Native;
    Runtime rt(o);
    REQUIRE(cuda::set_tf32(rt.backend("cuda"), true));
    const Out got = step(rt, "cuda", &start).second;
    INFO("cuda kernels:\n" << listing(got.kernels));
    CHECK(count(got.kernels, "linear+gelu:mma_sync_") == 2);
    CHECK(count(got.kernels, "-epilogue") == 2);
    // And each gelu_backward with its linear layer's bias gradient (the sum over rows).
    CHECK(count(got.kernels, "fused kernel 'gelu_backward+sum'") == 2);
    REQUIRE(std::isfinite(got.loss));
    CHECK(std::abs(got.loss - want.loss) <= 2e-2 * std::max(1.0, std::abs(want.loss)));
    REQUIRE(got.params.size() == want.params.size());
    for (const auto& [name, w] : want.params) {
      INFO(name);
      REQUIRE(got.params.count(name) == 1);
      // The update moved each parameter by lr times its gradient: compare the moves, which
      // is where a wrong pre-activation (gelu_backward's input) would show.
      std::vector<double> dw, dg;
      const std::vector<double>& s0 = start.at(name);
      for (size_t i = 0; i < w.size(); ++i) {
        dw.push_back(w[i] - s0[i]);
        dg.push_back(got.params.at(name)[i] - s0[i]);
      }
      const double e = nmse(dg, dw);
      INFO("nmse " << e);
      CHECK(e <= (d == PLX_BF16 ? 1e-3 : 1e-5));
    }
  }
}
