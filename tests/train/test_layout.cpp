// The layout planner (executor.cpp plan_layouts, abi/ops.h): 4-D activations stored channels-last
// where the kernels around them take it, on the fixture backend "testdev", whose conv2d prefers
// NHWC and reads any strides (the same sums in the same order in either layout) and whose relu
// is a dense map. The CUDA plugin's planning is tested on its emulator
// (tests/cuda/test_cuda_layout.cpp).
#include <string>
#include <vector>

#include "plexus/backend.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/plugin.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

struct Planned {
  MemoryPlan plan;
  std::vector<float> y, relu_a;  // the output, and relu_a's values (NCHW order)
  Shape relu_a_strides;
  std::vector<std::string> kernels;
};

struct LayoutCase {
  bool channels_last = true;
  std::string claims;          // the fixture's claims option ("0,1": conv_a and relu_a fused)
  bool nchw_only = false;      // the fixture's conv declines channels-last tensors
  bool relu_a_output = false;  // relu_a is also a graph output
};

// x (2, 3, 6, 5) -> conv_a (4 out, 3x3, padding 1) -> relu_a -> conv_b (4 out, 3x3, stride 2,
// padding 1, no bias) -> relu_b -> reshape (2, -1) -> relu -> y. Nodes 0 to 3 are conv_a,
// relu_a, conv_b and relu_b; node 4 is the view, node 5 the last relu.
Planned run_graph(const LayoutCase& lc) {
  RuntimeOptions o;
  o.plugins.paths = {fixture_dir() + "/good"};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  if (!lc.claims.empty()) o.plugins.options["testgood"]["claims"] = lc.claims;
  if (lc.nchw_only) o.plugins.options["testgood"]["conv_nchw_only"] = "1";
  Runtime rt(o);
  Backend& dev = rt.backend("testdev");
  Graph g(rt.ops());
  const Var x = g.input("x", {PLX_F32, {2, 3, 6, 5}});
  const Var wa = g.parameter("wa", {PLX_F32, {4, 3, 3, 3}}, init::uniform(-0.5, 0.5));
  const Var ba = g.parameter("ba", {PLX_F32, {4}}, init::uniform(-0.5, 0.5));
  const Var wb = g.parameter("wb", {PLX_F32, {4, 4, 3, 3}}, init::uniform(-0.5, 0.5));
  Attrs a;
  a.set("padding", std::vector<int64_t>{1, 1});
  const Var ca = g.add1("conv2d", {x, wa, ba}, a, "conv_a");
  const Var ra = g.add1("relu", {ca}, {}, "relu_a");
  Attrs b = a;
  b.set("stride", std::vector<int64_t>{2, 2});
  const Var cb = g.add1("conv2d", {ra, wb, Var{}}, b, "conv_b");
  const Var rb = g.add1("relu", {cb}, {}, "relu_b");
  g.mark_output(g.add1("relu", {g.reshape(rb, {2, -1})}, {}, "head"), "y");
  if (lc.relu_a_output) g.mark_output(ra, "relu_a");
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 3;
  eo.channels_last = lc.channels_last;
  Executable exe(dev, g, store, eo);
  std::vector<float> xs(2 * 3 * 6 * 5);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((i * 37) % 23) / 11.0f - 1.0f;
  exe.tensor("x").copy_from_host(xs.data());
  exe.run();
  exe.sync();
  Planned p;
  p.plan = exe.plan();
  p.y = exe.tensor("y").to_vector<float>();
  p.relu_a = exe.tensor(ra).to_vector<float>();
  p.relu_a_strides = exe.tensor(ra).strides();
  p.kernels = exe.kernel_names();
  return p;
}

const Shape kNhwc = {6 * 5 * 4, 1, 5 * 4, 4};  // relu_a: (2, 4, 6, 5) channels-last
const Shape kNchw = {4 * 6 * 5, 6 * 5, 5, 1};

}  // namespace

TEST_CASE("the layout planner stores activations channels-last between kernels that take it",
          "[layout]") {
  LayoutCase off;
  off.channels_last = false;
  const Planned ref = run_graph(off);
  CHECK(ref.plan.channels_last_values == 0);
  CHECK(ref.relu_a_strides == kNchw);
  // relu_a by hand at one place: the planner must not change what is computed.
  REQUIRE(ref.y.size() == 2 * 4 * 3 * 3);

  SECTION("node by node") {
    const Planned p = run_graph(LayoutCase{});
    // conv_a's and relu_a's outputs go NHWC: conv_b reads them as they are. relu_b's output is
    // viewed by the reshape (a view needs row-major memory), so it stays NCHW, and so does
    // conv_b's, which the dense relu_b ties to it: conv_b converts, once, as it writes.
    CHECK(p.plan.channels_last_values == 2);
    CHECK(p.plan.channels_last_bytes == 2 * 2 * 4 * 6 * 5 * sizeof(float));
    REQUIRE(p.plan.channels_last.size() == 2);
    CHECK_THAT(p.plan.channels_last[0], PLX_CONTAINS("conv_a f32(2, 4, 6, 5)"));
    CHECK_THAT(p.plan.channels_last[1], PLX_CONTAINS("relu_a f32(2, 4, 6, 5)"));
    CHECK(p.relu_a_strides == kNhwc);
    CHECK(p.y == ref.y);  // the same sums in the same order: the same bits
    CHECK(p.relu_a == ref.relu_a);
    // relu_a runs in place over conv_a: the two share a layout, so element i over element i.
    CHECK(p.plan.inplace_nodes == ref.plan.inplace_nodes);
  }
  SECTION("with conv_a and relu_a fused into one chain") {
    LayoutCase lc;
    lc.claims = "0,1";
    const Planned p = run_graph(lc);
    // The chain's conv prefers NHWC and its ReLU is a dense map: the chain takes either layout,
    // and the value inside it is described in its output's layout.
    CHECK(p.plan.fused_kernels == 1);
    CHECK(p.plan.channels_last_values == 1);
    CHECK(p.relu_a_strides == kNhwc);
    CHECK(p.y == ref.y);
    CHECK(p.relu_a == ref.relu_a);
  }
  SECTION("a kernel that declines channels-last tensors keeps its values NCHW") {
    LayoutCase lc;
    lc.nchw_only = true;
    const Planned p = run_graph(lc);
    // conv_a was made again for NHWC and declined: its values are planned NCHW again, and the
    // graph still runs, on the NCHW kernels.
    CHECK(p.plan.channels_last_values == 0);
    CHECK(p.relu_a_strides == kNchw);
    CHECK(p.y == ref.y);
  }
  SECTION("graph outputs stay NCHW, and what a dense kernel ties to them") {
    LayoutCase lc;
    lc.relu_a_output = true;
    const Planned p = run_graph(lc);
    CHECK(p.plan.channels_last_values == 0);
    CHECK(p.relu_a_strides == kNchw);
    CHECK(p.y == ref.y);
    CHECK(p.relu_a == ref.relu_a);
  }
}
