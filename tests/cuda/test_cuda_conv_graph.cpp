// The CUDA plugin's convolutions on cuDNN's graph API (plugins/cuda/ops/conv_graph.cpp): the
// "cudnn_graph" candidates of conv2d, conv2d_backward_data and conv2d_backward_weight, created
// explicitly (the ordinary dispatch takes the legacy "cudnn" kernels, registered first) and run
// against the CPU plugin in every layout mix of x, w and y, in f32 (TF32 off: the engines that
// would round to TF32 must be left out), f16 and bf16, with and without a bias; on pointers that
// are not 16-byte aligned (the second plan); and a conv2d -> relu pair given to cudnn_graph as
// one fused graph. Outputs and workspace start as NaN (0xFF bytes), so an element left unwritten
// fails.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/conv_geometry.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/layout_candidate.hpp"
#include "cuda/pinned_kernel.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/graph.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::layout_candidate;
using namespace plexus::test::conv_geo;

namespace {

constexpr const char* kImpl = "cudnn_graph";

// convnet's second layer at a small batch; stride 2 with a rectangular filter and mixed padding;
// dilation; two groups; a 1x1 with odd channels; an empty batch.
const std::vector<Geo>& geometries() {
  static const std::vector<Geo> g = {
      {{2, 32, 8, 8}, 64, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
      {{3, 8, 11, 9}, 16, 3, 2, {2, 1}, {1, 0}, {1, 1}, 1},
      {{2, 8, 10, 10}, 8, 3, 3, {1, 1}, {2, 2}, {2, 2}, 1},
      {{2, 8, 6, 6}, 12, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2},
      {{2, 5, 4, 4}, 7, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1},
      {{0, 8, 5, 5}, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
  };
  return g;
}

const plx_kernel* graph_kernel(Backend& gpu, const std::string& op, plx_dtype d) {
  return kernel_by_impl(gpu, op, d, kImpl);
}

// Runs the cudnn_graph kernel of `op` for one node into `out` and compares with `want`. Returns
// false where it declined: allowed only for a layout mix (`mixed`) on a real GPU, whose cuDNN
// may have no engine for NHWC activations beside an NCHW filter; on the emulator every engine
// the heuristic lists takes every layout.
bool check_graph(Backend& gpu, const std::string& op, plx_dtype d, const std::vector<Tensor>& in,
                 Tensor out, const Attrs& attrs, const Tensor& want, int64_t terms,
                 const std::string& what, bool mixed) {
  const OpSchema& s = runtime().ops().get(op);
  const plx_kernel* k = graph_kernel(gpu, op, d);
  INFO(op << " " << dtype_name(d) << ": " << what);
  REQUIRE(k != nullptr);
  // Twice with one kernel object where run_candidate can poison the output again (NCHW).
  const std::string why = run_candidate(gpu, s, k, in, {out}, attrs, out.is_contiguous() ? 2 : 1);
  if (!why.empty() && mixed && !cuda::emulated(gpu)) {
    WARN("declined: " << why);
    return false;
  }
  INFO("declined: " << why);
  REQUIRE(why.empty());
  const Tensor got = out.contiguous().to(cpu());
  const std::string diff = cmp::compare_tensors(got, want, cmp::tolerance_for(d, terms, false));
  INFO(diff);
  CHECK(diff.empty());
  return true;
}

}  // namespace

TEST_CASE("cuda cudnn_graph convolutions match the cpu reference in every layout mix", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  uint64_t seed = 20261128;
  int ran = 0, declined = 0;
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16}) {
    for (const Geo& g : geometries()) {
      const ConvCase c = make_case(g, d, seed);
      const int64_t taps = g.x[1] / g.groups * g.kh * g.kw;
      const int64_t pixels = std::max<int64_t>(1, c.y_shape[0] * c.y_shape[2] * c.y_shape[3]);
      for (int mix = 0; mix < 8; ++mix) {
        const Layouts l = layouts_of(mix);
        const bool mixed = mix != 0 && mix != 7;
        const std::string what = describe(g) + ", " + layout_name(l);
        const Tensor gx = on_gpu(gpu, c.x, l.x), gw = on_gpu(gpu, c.w, l.w);
        const Tensor gdy = on_gpu(gpu, c.dy, l.y);
        const bool runs[] = {
            check_graph(gpu, "conv2d", d, {gx, gw, Tensor()}, poisoned(gpu, c.y_shape, d, l.y),
                        c.geo, c.want_y, taps, what, mixed),
            check_graph(gpu, "conv2d", d, {gx, gw, c.b.to(gpu)}, poisoned(gpu, c.y_shape, d, l.y),
                        c.geo, c.want_yb, taps + 1, what + ", bias", mixed),
            // dx in x's layout from dy in y's; dw in w's layout.
            check_graph(gpu, "conv2d_backward_data", d, {gdy, gw}, poisoned(gpu, g.x, d, l.x),
                        c.bd_attrs, c.want_dx, g.o / g.groups * g.kh * g.kw, what, mixed),
            check_graph(gpu, "conv2d_backward_weight", d, {gdy, gx},
                        poisoned(gpu, c.w_shape, d, l.w), c.bw_attrs, c.want_dw, pixels, what,
                        mixed)};
        for (bool r : runs) (r ? ran : declined) += 1;
      }
    }
  }
  CHECK(ran + declined == 4 * 8 * 3 * static_cast<int>(geometries().size()));
  // Every all-NCHW and all-NHWC case ran (declines are only allowed for the mixes).
  CHECK(ran >= 4 * 2 * 3 * static_cast<int>(geometries().size()));
  if (cuda::emulated(gpu)) CHECK(declined == 0);
}

// A call whose tensors are not 16-byte aligned (an element into a buffer) runs the plan built
// for element alignment, with the same results; a later aligned call still runs the first plan.
TEST_CASE("cuda cudnn_graph convolutions run tensors that are not 16-byte aligned",
          "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  const Geo g = {{2, 16, 6, 6}, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1};
  const Shape w_shape = {g.o, g.x[1], g.kh, g.kw};
  const Shape y_shape = out_shape(g);
  for (plx_dtype d : {PLX_F32, PLX_BF16}) {
    for (bool nhwc : {false, true}) {
      INFO(dtype_name(d) << (nhwc ? " nhwc" : " nchw"));
      const Tensor x = random_tensor(g.x, d, 31), w = random_tensor(w_shape, d, 32);
      const Tensor want = call(cpu(), "conv2d", {x, w, Tensor()}, geo_attrs(g))[0];
      // x one element into a buffer of its own, in the layout.
      const Tensor mem_x = nhwc ? x.permute({0, 2, 3, 1}).contiguous() : x;
      Tensor buf = Tensor::empty(gpu, {mem_x.numel() + 1}, d);
      Tensor shifted = buf.alias(d, mem_x.shape(), dtype_size(d));
      std::vector<uint8_t> bytes(mem_x.nbytes());
      mem_x.copy_to_host(bytes.data());
      shifted.copy_from_host(bytes.data());
      const Tensor gx = nhwc ? shifted.permute({0, 3, 1, 2}) : shifted;
      REQUIRE(reinterpret_cast<uintptr_t>(gx.data()) % 16 != 0);
      const OpSchema& s = runtime().ops().get("conv2d");
      const plx_kernel* k = graph_kernel(gpu, "conv2d", d);
      REQUIRE(k != nullptr);
      const Tensor gw = on_gpu(gpu, w, nhwc);
      for (const Tensor& in_x : {gx, on_gpu(gpu, x, nhwc)}) {
        Tensor out = poisoned(gpu, y_shape, d, nhwc);
        const std::string why =
            run_candidate(gpu, s, k, {in_x, gw, Tensor()}, {out}, geo_attrs(g), nhwc ? 1 : 2);
        INFO("declined: " << why);
        REQUIRE(why.empty());
        const std::string diff =
            cmp::compare_tensors(out.contiguous().to(cpu()), want,
                                 cmp::tolerance_for(d, g.x[1] * g.kh * g.kw, false));
        INFO(diff);
        CHECK(diff.empty());
      }
    }
  }
}

// The engine a kernel takes follows its op and the plugin's options. Without `benchmark` it is
// the heuristic's first usable one (not a runtime-compiled one, for a plain convolution), and
// with TF32 off an f32 convolution must not be a Tensor Core (TF32) engine: its results then
// hold to f32's tolerance, which TF32's rounding of the inputs does not meet. With conv_workspace =
// 0 every kernel takes an engine without workspace. With `benchmark` on, the measured choice of
// each op goes into the algorithm cache file under keys of its own. With graph_api = false the
// candidates decline.
TEST_CASE("cuda cudnn_graph convolutions keep to the engines their op and options allow",
          "[cuda]") {
  PLX_REQUIRE_CUDA(probe);
  const bool emulated = cuda::emulated(probe);
  const Geo g = {{2, 16, 7, 7}, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1};
  const Shape w_shape = {g.o, g.x[1], g.kh, g.kw};
  const Shape y_shape = out_shape(g);
  const Attrs geo = geo_attrs(g);
  Attrs bd_attrs = geo, bw_attrs = geo;
  bd_attrs.set("input_shape", Ints(g.x));
  bw_attrs.set("weight_shape", Ints(w_shape));
  TempDir dir("graph-engines");
  struct Setting {
    const char* what;
    std::map<std::string, std::string> options;
    bool no_workspace;
  };
  const Setting settings[] = {
      {"the heuristic's first", {{"benchmark", "false"}, {"algo_cache", ""}}, false},
      {"no workspace", {{"benchmark", "false"}, {"conv_workspace", "0"}, {"algo_cache", ""}},
       true},
      {"measured and cached", {{"algo_cache", dir / "algos.tsv"}}, false},
  };
  for (const Setting& st : settings) {
    RuntimeOptions o = plugin_dir_options();
    o.plugins.options["cuda"] = st.options;
    Runtime rt(o);
    Backend& gpu = rt.backend("cuda");
    for (plx_dtype d : {PLX_F32, PLX_BF16}) {
      const Tensor x = random_tensor(g.x, d, 41), w = random_tensor(w_shape, d, 42);
      const Tensor dy = random_tensor(y_shape, d, 43);
      struct Case {
        const char* op;
        std::vector<Tensor> in;
        Shape out;
        Attrs attrs;
        int64_t terms;
      };
      const Case cases[] = {
          {"conv2d", {x, w, Tensor()}, y_shape, geo, g.x[1] * g.kh * g.kw},
          {"conv2d_backward_data", {dy, w}, g.x, bd_attrs, g.o * g.kh * g.kw},
          {"conv2d_backward_weight", {dy, x}, w_shape, bw_attrs, g.x[0] * y_shape[2] * y_shape[3]},
      };
      for (const Case& c : cases) {
        INFO(st.what << ": " << c.op << " " << dtype_name(d));
        const Tensor want = call(cpu(), c.op, c.in, c.attrs)[0];
        std::vector<Tensor> in;
        for (const Tensor& t : c.in) in.push_back(t.defined() ? t.to(gpu) : t);
        const OpSchema& s = rt.ops().get(c.op);
        const plx_kernel* k = graph_kernel(gpu, c.op, d);
        REQUIRE(k != nullptr);
        Tensor out = poisoned(gpu, c.out, d, false);
        uint64_t ws = 0;
        const std::string why = run_candidate(gpu, s, k, in, {out}, c.attrs, 1, &ws);
        if (!why.empty() && st.no_workspace && !emulated) {
          WARN("no engine without workspace on this GPU: " << why);
          continue;
        }
        INFO("declined: " << why);
        REQUIRE(why.empty());
        const std::string diff = cmp::compare_tensors(out.to(cpu()), want,
                                                      cmp::tolerance_for(d, c.terms, false));
        INFO(diff);
        CHECK(diff.empty());
        if (st.no_workspace) CHECK(ws == 0);
        // On the emulator the heuristic ranks first a runtime-compiled engine without workspace
        // (left out: plain convolutions do not compile engines), then one with workspace that
        // rounds f32 to TF32 (left out for f32, whose TF32 is off, for one without workspace).
        if (emulated && std::string(st.what) == "the heuristic's first")
          CHECK((ws == 0) == (d == PLX_F32));
      }
    }
  }
  // graph_api = false: the candidates decline, naming the option.
  {
    RuntimeOptions o = plugin_dir_options();
    o.plugins.options["cuda"]["graph_api"] = "false";
    Runtime rt(o);
    Backend& gpu = rt.backend("cuda");
    const Tensor x = random_tensor(g.x, PLX_BF16, 51), w = random_tensor(w_shape, PLX_BF16, 52);
    const plx_kernel* k = graph_kernel(gpu, "conv2d", PLX_BF16);
    REQUIRE(k != nullptr);
    Tensor out = poisoned(gpu, y_shape, PLX_BF16, false);
    const std::string why = run_candidate(gpu, rt.ops().get("conv2d"), k,
                                          {x.to(gpu), w.to(gpu), Tensor()}, {out}, geo);
    CHECK_THAT(why, PLX_CONTAINS("the plugin's graph_api option"));
  }
  std::ifstream f(dir / "algos.tsv");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  INFO(text);
  for (const char* key : {"graph_fwd f32", "graph_bwd_data f32", "graph_bwd_filter f32",
                          "graph_fwd bf16", "graph_bwd_data bf16", "graph_bwd_filter bf16"})
    CHECK(text.find(std::string("\n") + key) != std::string::npos);
}

// A conv2d -> relu pair whose conv the host gave to cudnn_graph (pinned through the tuning
// cache) runs as one graph of the convolution, the bias ADD and RELU_FWD where cuDNN has an
// engine for it: in 16 bits with channels-last activations, so the pair sits between two more
// convolutions, which keep them so (the layout planner). Against the same graph on the CPU; one
// input is NaN, which the ReLU turns into 0 as the relu op does (a NaN would reach the output).
TEST_CASE("a conv2d -> relu pair given to cudnn_graph runs as one fused graph", "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  (void)probe;
  const Shape xs = {4, 16, 9, 9}, ws = {16, 16, 3, 3};
  std::vector<double> x = random_doubles(static_cast<size_t>(shape_numel(xs)), 23, -1, 1);
  x[5] = std::nan("");
  auto build = [&](Graph& g) {
    const Attrs attrs{{"stride", Ints{1, 1}},
                      {"padding", Ints{1, 1}},
                      {"dilation", Ints{1, 1}},
                      {"groups", int64_t{1}}};
    auto conv = [&](const Var& in, const std::string& name) {
      const Var w = g.parameter(name + ".weight", {PLX_BF16, ws}, init::uniform(-0.3, 0.3));
      const Var b = g.parameter(name + ".bias", {PLX_BF16, {ws[0]}}, init::uniform(-0.5, 0.5));
      return g.add1("conv2d", {in, w, b}, attrs, name);
    };
    const Var h = conv(g.input("x", {PLX_BF16, xs}), "l0");
    const Var r = g.add1("relu", {conv(h, "l")}, {}, "l.relu");
    g.mark_output(conv(r, "l2"), "y");
  };
  PinnedKernelRun pinned("graph-relu", build, "l", x, 7);
  REQUIRE_FALSE(pinned.key().empty());
  const PinnedKernelRun::Result r = pinned.run(kImpl);
  CHECK(r.report.impl == kImpl);
  std::string names;
  for (const std::string& n : r.kernels) names += n + "; ";
  INFO("kernels: " << names);
  const auto fused = std::count_if(r.kernels.begin(), r.kernels.end(), [](const std::string& n) {
    return n.find("conv2d+relu:cudnn_graph-fused") != std::string::npos;
  });
  CHECK(fused == 1);
  CHECK(std::none_of(r.got.begin(), r.got.end(), [](double v) { return std::isnan(v); }));
  // Roundings to bf16 between the layers on each side, in different orders.
  CHECK_ALLCLOSE(r.got, r.want, (Tol{5e-2, 5e-2}));
}

// Registration, checked on any machine where the plugin was built (no device needed): after the
// legacy cudnn kernels (which stay the default until the tuner chooses), library kernels,
// channels-last preferred in 16 bits, the forward deterministic.
TEST_CASE("the cuda plugin registers its graph api convolutions after the legacy ones", "[cpu]") {
  if (!cuda::plugin_built())
    PLX_SKIP("the CUDA plugin was not built (no nvcc or cuDNN at configure time)");
  Backend* b = cuda::backend();
  INFO("loader: " << cuda::skip_reason());
  REQUIRE(b != nullptr);
  for (const char* op : {"conv2d", "conv2d_backward_data", "conv2d_backward_weight"}) {
    const OpSchema& s = runtime().ops().get(op);
    for (plx_dtype d : {PLX_F16, PLX_BF16, PLX_F32}) {
      INFO(op << " " << dtype_name(d));
      std::vector<std::string> impls;
      const plx_kernel* graph = nullptr;
      for (const plx_kernel* k : b->kernels(s.id, d)) {
        impls.push_back(k->impl ? k->impl : "?");
        if (impls.back() == kImpl) graph = k;
      }
      REQUIRE(impls.size() >= 2);
      CHECK(impls[0] == "cudnn");
      CHECK(impls[1] == kImpl);
      REQUIRE(graph != nullptr);
      CHECK((graph->flags & PLX_KERNEL_LIBRARY) != 0);
      CHECK((graph->flags & PLX_KERNEL_STRIDED) != 0);
      CHECK((graph->flags & PLX_KERNEL_CAPTURABLE) != 0);
      CHECK(((graph->flags & PLX_KERNEL_DETERMINISTIC) != 0) == (std::string(op) == "conv2d"));
      CHECK(graph->layout == (d == PLX_F32 ? PLX_LAYOUT_ANY : PLX_LAYOUT_NHWC));
    }
  }
}
