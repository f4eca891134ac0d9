// Small 3x3 convolutions image by image (plugins/cuda/ops/direct_small.cu): the "direct"
// candidates of conv2d (where the first-layer kernel declines) and conv2d_backward_data against
// the CPU in every layout mix, their declines, the conv + [ReLU +] max pool forward as one launch
// and the fused max_pool2d_backward + conv2d_backward group as one launch (dx, dw and db), each
// against the same graph run node by node and against the CPU. Outputs and workspace start as NaN (0xFF
// bytes), so an element left unwritten, or scratch read before it is written, fails.
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/conv_geometry.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/fused_pair.hpp"
#include "cuda/layout_candidate.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::layout_candidate;
using namespace plexus::test::conv_geo;

namespace {

constexpr const char* kImpl = "direct";

// simplecnn's second layer (no padding, 16 -> 32: 8 channels a thread), convnet-like padding 1,
// padding 2 on one side with 12 channels (4 a thread) and an odd O, 6 channels (2 a thread), 3
// (1 a thread) on a wide row, one output pixel, an empty batch, and one whose planes take more
// than 48 KiB of shared memory (the kernels opt into more).
const std::vector<Geo>& geometries() {
  static const std::vector<Geo> g = {
      {{3, 16, 13, 13}, 32, 3, 3, {1, 1}, {0, 0}},  // simplecnn conv2
      {{2, 8, 10, 9}, 12, 3, 3, {1, 1}, {1, 1}},
      {{2, 12, 7, 6}, 5, 3, 3, {1, 1}, {2, 1}},
      {{2, 6, 5, 5}, 7, 3, 3, {1, 1}, {1, 0}},
      {{1, 3, 4, 9}, 4, 3, 3, {1, 1}, {0, 2}},
      {{2, 5, 3, 3}, 3, 3, 3, {1, 1}, {0, 0}},  // one output pixel
      {{0, 8, 6, 6}, 8, 3, 3, {1, 1}, {1, 1}},  // empty batch
      // resnet's 16-channel 28x28 layer: over 48 KiB of planes, opted into
      {{1, 16, 28, 28}, 16, 3, 3, {1, 1}, {1, 1}},
  };
  return g;
}

}  // namespace

TEST_CASE("cuda direct backward data of small convolutions matches the cpu in every layout mix",
          "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  const OpSchema& s = runtime().ops().get("conv2d_backward_data");
  uint64_t seed = 20261128;
  int runs = 0;
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16}) {
    const plx_kernel* k = kernel_by_impl(gpu, "conv2d_backward_data", d, kImpl);
    REQUIRE(k != nullptr);
    for (const Geo& g : geometries()) {
      const ConvCase c = make_case(g, d, seed);
      const int64_t terms = g.o * g.kh * g.kw;
      for (int mix = 0; mix < 8; ++mix) {
        const Layouts l = layouts_of(mix);
        INFO(dtype_name(d) << ": " << describe(g) << ", " << layout_name(l));
        check_candidate(gpu, s, k, d, {on_gpu(gpu, c.dy, l.y), on_gpu(gpu, c.w, l.w)},
                        c.x.shape(), l.x, c.bd_attrs, c.want_dx, terms);
        ++runs;
      }
    }
  }
  CHECK(runs == 3 * 8 * static_cast<int>(geometries().size()));
}

// conv2d on "direct": these layers have more than the first-layer kernel's 32 taps (but one,
// C = 3, which it takes), so the image-by-image kernel runs them, with and without a bias.
TEST_CASE("cuda direct convolutions of small layers match the cpu in every layout mix", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  const OpSchema& s = runtime().ops().get("conv2d");
  uint64_t seed = 20261129;
  int runs = 0;
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16}) {
    const plx_kernel* k = kernel_by_impl(gpu, "conv2d", d, kImpl);
    REQUIRE(k != nullptr);
    for (const Geo& g : geometries()) {
      const ConvCase c = make_case(g, d, seed);
      const int64_t terms = g.x[1] * g.kh * g.kw + 1;
      for (int mix = 0; mix < 8; ++mix) {
        const Layouts l = layouts_of(mix);
        const Tensor gx = on_gpu(gpu, c.x, l.x), gw = on_gpu(gpu, c.w, l.w);
        for (bool bias : {false, true}) {
          INFO(dtype_name(d) << ": " << describe(g) << ", " << layout_name(l)
                             << (bias ? ", bias" : ""));
          check_candidate(gpu, s, k, d, {gx, gw, bias ? c.b.to(gpu) : Tensor()}, c.y_shape, l.y,
                          c.geo, bias ? c.want_yb : c.want_y, terms);
          ++runs;
        }
      }
    }
  }
  CHECK(runs == 3 * 8 * 2 * static_cast<int>(geometries().size()));
}

TEST_CASE("cuda direct small convolutions decline what they do not handle", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  const OpSchema& s = runtime().ops().get("conv2d_backward_data");
  const plx_dtype d = PLX_F32;
  const plx_kernel* k = kernel_by_impl(gpu, "conv2d_backward_data", d, kImpl);
  REQUIRE(k != nullptr);
  struct Decline {
    Geo g;
    std::string reason;
  };
  const std::vector<Decline> cases = {
      {{{2, 4, 9, 9}, 8, 3, 3, {2, 2}, {1, 1}}, "stride 1 and dilation 1"},
      {{{2, 4, 9, 9}, 8, 3, 3, {1, 1}, {1, 1}, {2, 2}}, "stride 1 and dilation 1"},
      {{{2, 4, 9, 9}, 8, 5, 5, {1, 1}, {2, 2}}, "3x3 filters"},
      {{{2, 4, 9, 9}, 8, 3, 3, {1, 1}, {3, 3}}, "padding 0 to 2"},
      {{{2, 4, 9, 9}, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2}, "groups = 1"},
      // 64 -> 128 channels at 28x28: 128 dy planes (backward) or 64 x planes (forward) and the
      // filter are over a block's memory.
      {{{2, 64, 28, 28}, 128, 3, 3, {1, 1}, {1, 1}}, "bytes of shared memory"},
  };
  uint64_t seed = 7;
  for (const Decline& c : cases) {
    INFO(describe(c.g) << ": expecting a decline naming " << c.reason);
    const Tensor dy = random_tensor(out_shape(c.g), d, ++seed).to(gpu);
    const Tensor w = random_tensor(w_shape(c.g), d, ++seed).to(gpu);
    Attrs attrs = geo_attrs(c.g);
    attrs.set("input_shape", Ints(c.g.x));
    Tensor dx = poisoned(gpu, c.g.x, d, false);
    CHECK_THAT(run_candidate(gpu, s, k, {dy, w}, {dx}, attrs), PLX_CONTAINS(c.reason));
    // conv2d's "direct" declines the same layers (their 36 to 128 taps are over the first-layer
    // kernel's 32 too), naming both kernels' reasons.
    const Tensor x = random_tensor(c.g.x, d, ++seed).to(gpu);
    Tensor y = poisoned(gpu, out_shape(c.g), d, false);
    const std::string why = run_candidate(gpu, runtime().ops().get("conv2d"),
                                          kernel_by_impl(gpu, "conv2d", d, kImpl),
                                          {x, w, Tensor()}, {y}, geo_attrs(c.g));
    CHECK_THAT(why, PLX_CONTAINS("image by image"));
    CHECK_THAT(why, PLX_CONTAINS(c.reason));
  }
}

namespace {

// The graph of a conv layer's max pool and its backward: x -> conv2d (3x3, `padding`) -> max_pool2d
// (`pool`); the pooled gradient dy back through max_pool2d_backward into conv2d_backward_data
// ("c.dgrad": dx), conv2d_backward_weight ("c.wgrad": dw) and the bias gradient's sum (db).
// Returns dy's shape.
Shape build_pool_backward(Graph& g, plx_dtype d, const Shape& xs, int64_t o, const Ints& padding,
                         const Attrs& pool) {
  const Var x = g.input("x", {d, xs});
  const Var w = g.parameter("c.weight", {d, {o, xs[1], 3, 3}}, init::kaiming_uniform(xs[1] * 9));
  const Var b = g.parameter("c.bias", {d, {o}}, init::uniform(-0.3, 0.3));
  const Attrs conv_attrs{{"padding", padding}};
  const Var pre = g.add1("conv2d", {x, w, b}, conv_attrs, "c");
  const std::vector<Var> p = g.add("max_pool2d", {pre}, pool, "c.pool");
  const Var dy = g.input("dy", {d, g.value(p[0]).desc.shape});
  Attrs back{{"input_shape", Ints(g.value(pre).desc.shape)}};
  for (const char* k : {"kernel", "stride", "ceil_mode", "window_index"})
    if (const AttrValue* v = pool.find(k)) back.set(k, *v);
  const Var dpre = g.add1("max_pool2d_backward", {dy, p[1]}, back, "c.pool.grad");
  g.mark_output(g.add1("sum", {dpre}, Attrs{{"axes", Ints{0, 2, 3}}}, "c.bias.grad"), "db");
  Attrs da = conv_attrs;
  da.set("input_shape", Ints(xs));
  g.mark_output(g.add1("conv2d_backward_data", {dpre, w}, da, "c.dgrad"), "dx");
  Attrs wa = conv_attrs;
  wa.set("weight_shape", Ints{o, xs[1], 3, 3});
  g.mark_output(g.add1("conv2d_backward_weight", {dpre, x}, wa, "c.wgrad"), "dw");
  g.mark_output(p[0], "y");
  return g.value(dy).desc.shape;
}

RuntimeOptions auto_options(const std::string& cache) {
  RuntimeOptions o = plugin_dir_options();
  o.kernels = KernelSide::Auto;
  o.tune_cache = cache;
  return o;
}

ExecutableOptions untuned() {
  ExecutableOptions o;
  o.tune = false;  // the cache's choices, else each node's first kernel
  return o;
}

// Runtime options whose tuning cache gives node `node` of the graph `build` makes to "direct",
// as the tuner would keep it: the node's key comes from a run that leaves it to its first kernel.
RuntimeOptions pinned_options(const TempDir& dir, const std::function<void(Graph&)>& build,
                              const std::string& node) {
  std::string key;
  {
    Runtime rt(auto_options(dir / "probe.tsv"));
    Graph g(rt.ops());
    build(g);
    TensorStore store;
    Executable e(rt.backend("cuda"), g, store, untuned());
    for (const Executable::KernelReport& k : e.kernel_choices())
      if (k.node == node) key = k.choice.key;
  }
  REQUIRE(!key.empty());
  std::ofstream(dir / "pinned.tsv") << key << "\t" << kImpl << "\t1\n";
  return auto_options(dir / "pinned.tsv");
}

}  // namespace

// The host gives the data gradient to "direct" (pinned through the tuning cache, as the tuner
// would keep it), so the group max_pool2d_backward + conv2d_backward runs as one direct launch:
// dx has the bits of the same graph run node by node (the pool's backward writing the unpooled
// gradient, then the direct data gradient alone: the same sums in the same order), dw and db are
// those within rounding (cuDNN's order there), and in f32 all three match the CPU. Windows that
// overlap run as the chunked group.
TEST_CASE(
    "the max pool backward of a small conv and its three gradients run as one "
    "direct kernel",
    "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  (void)probe;  // the runtimes below are each case's own
  struct C {
    Shape x;
    int64_t o;
    Ints padding;
    Attrs pool;
    bool direct;
    const char* what;
  };
  const C cases[] = {
      {{12, 16, 13, 13},
       32,
       {0, 0},
       Attrs{{"kernel", Ints{2, 2}}, {"relu_mask", int64_t{1}}, {"window_index", int64_t{1}}},
       true,
       "simplecnn's second layer, training form (on one SM, blocks of several images)"},
      {{3, 8, 9, 11},
       6,
       {1, 1},
       Attrs{{"kernel", Ints{2, 2}}},
       true,
       "i32 positions, a ragged last row and column"},
      {{2, 4, 9, 9},
       5,
       {1, 1},
       Attrs{{"kernel", Ints{2, 3}}, {"ceil_mode", int64_t{1}}, {"window_index", int64_t{1}}},
       true,
       "ceil_mode, a partial last window, odd O"},
      {{2, 8, 12, 12},
       8,
       {1, 1},
       Attrs{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}},
       false,
       "overlapping windows: the chunked group"},
  };
  for (plx_dtype d : {PLX_F32, PLX_BF16})
    for (const C& c : cases) {
      DYNAMIC_SECTION(dtype_name(d) << ": " << c.what) {
        TempDir dir("direct-bwd");
        Runtime rt(pinned_options(
            dir,
            [&](Graph& g) { build_pool_backward(g, d, c.x, c.o, c.padding, c.pool); },
            "c.dgrad"));
        Backend& gpu = rt.backend("cuda");
        Graph g(rt.ops());
        const Shape ps = build_pool_backward(g, d, c.x, c.o, c.padding, c.pool);
        FusedPair run(gpu, g, untuned());
        const std::string names = run.names();
        INFO(names);
        if (c.direct)
          CHECK_THAT(names, PLX_CONTAINS("max_pool2d_backward+conv2d_backward:direct"));
        else
          CHECK_THAT(names, !PLX_CONTAINS("max_pool2d_backward+conv2d_backward:direct"));
        const std::vector<double> vx = random_doubles(static_cast<size_t>(shape_numel(c.x)), 41, -1, 1);
        const std::vector<double> vdy =
            random_doubles(static_cast<size_t>(shape_numel(ps)), 42, -2, 2);
        run.run({{"x", vx}, {"dy", vdy}});
        Executable &fused = run.fused(), &plain = run.plain();
        if (c.direct) {  // the direct data gradient's bits; with the chunked group to rounding
          const auto [fused_bytes, plain_bytes] = run.bytes("dx");
          CHECK(fused_bytes == plain_bytes);
        }
        const double nmse = d == PLX_F32 ? 1e-10 : 1e-4;
        for (const char* out : {"dx", "dw", "db"}) {
          INFO(out);
          CHECK(cmp::compare_tensors(fused.tensor(out), plain.tensor(out),
                                     cmp::Tolerance{INFINITY, 0, nmse, false}) == "");
        }
        if (d == PLX_F32) {  // and the CPU's, with the parameters the GPU used
          Executable& ref = run.reference(rt.backend("cpu"), g, {{"x", vx}, {"dy", vdy}});
          for (const char* out : {"dx", "dw", "db"}) {
            INFO("cpu " << out);
            CHECK(cmp::compare_tensors(fused.tensor(out), ref.tensor(out),
                                       cmp::Tolerance{INFINITY, 0, 1e-10, false}) == "");
          }
        }
      }
    }
}

// The forward of such a layer with its ReLU and 2x2 max pool, the conv given to "direct" (pinned
// through the tuning cache), runs as one launch whose thread tiles are the pooling windows: y and
// the indices have the bits of the same graph run node by node (the image-by-image conv writing
// the pre-pool tensor, the ReLU, the pool), and in f32 those of the CPU within rounding. Windows
// other than 2x2 of stride 2 run as the chunked group.
TEST_CASE("a small conv with its relu and max pool runs as one direct kernel with the unfused bits",
          "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  (void)probe;  // the runtimes below are each case's own
  struct C {
    Shape x;
    int64_t o, padding;
    bool relu;
    Attrs pool;
    bool direct;
    const char* what;
  };
  const Attrs training{
      {"kernel", Ints{2, 2}}, {"relu_mask", int64_t{1}}, {"window_index", int64_t{1}}};
  const C cases[] = {
      {{12, 16, 13, 13}, 32, 0, true, training, true, "simplecnn's second layer, training form"},
      {{3, 8, 9, 11}, 6, 1, true, Attrs{{"kernel", Ints{2, 2}}}, true,
       "i32 positions, ReLU before the pool, O not a multiple of 4"},
      {{2, 12, 7, 8}, 8, 1, false,
       Attrs{{"kernel", Ints{2, 2}}, {"ceil_mode", int64_t{1}}, {"window_index", int64_t{1}}},
       true, "no ReLU, ceil_mode: a partial last window row"},
      {{2, 8, 12, 12}, 8, 1, true, Attrs{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}}, false,
       "overlapping windows: the chunked group"},
  };
  for (plx_dtype d : {PLX_F32, PLX_BF16})
    for (const C& c : cases) {
      DYNAMIC_SECTION(dtype_name(d) << ": " << c.what) {
        TempDir dir("direct-fwd");
        auto build = [&](Graph& g) { add_conv_relu_pool(g, d, c.x, c.o, c.padding, c.relu, c.pool); };
        Runtime rt(pinned_options(dir, build, "c"));
        Backend& gpu = rt.backend("cuda");
        Graph g(rt.ops());
        build(g);
        FusedPair run(gpu, g, untuned());
        INFO(run.names());
        const std::string want = c.relu ? "conv2d+relu+max_pool2d:direct" : "conv2d+max_pool2d:direct";
        if (c.direct) {
          CHECK_THAT(run.names(), PLX_CONTAINS(want));
          CHECK(run.kernel_count() == 1);
        } else {
          CHECK_THAT(run.names(), !PLX_CONTAINS(want));
        }
        const std::vector<double> vx = random_doubles(static_cast<size_t>(shape_numel(c.x)), 31, -1, 1);
        run.run({{"x", vx}});
        Executable &fused = run.fused(), &plain = run.plain();
        const int64_t taps = c.x[1] * 9;
        if (c.direct) {
          for (const char* out : {"y", "idx"}) {
            const auto [fused_bytes, plain_bytes] = run.bytes(out);
            CHECK(fused_bytes == plain_bytes);
          }
        } else {
          CHECK(cmp::compare_tensors(fused.tensor("y"), plain.tensor("y"),
                                     cmp::tolerance_for(d, taps + 1, false)) == "");
        }
        if (d == PLX_F32) {  // and the CPU's, with the parameters the GPU used
          Executable& ref = run.reference(rt.backend("cpu"), g, {{"x", vx}});
          CHECK(cmp::compare_tensors(fused.tensor("y"), ref.tensor("y"),
                                     cmp::tolerance_for(PLX_F32, taps + 1, false)) == "");
          CHECK(cmp::compare_tensors(fused.tensor("idx"), ref.tensor("idx"),
                                     cmp::Tolerance{0, 0, 0, true}) == "");
        }
      }
    }
}
