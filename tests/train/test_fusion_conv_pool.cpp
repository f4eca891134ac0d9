// A conv layer with its max pool as one kernel, forward (conv2d [-> relu] -> max_pool2d) and
// backward (max_pool2d_backward -> conv2d_backward_data / conv2d_backward_weight / the bias
// sum), found by sdk/fusion_conv_pool.hpp and run image by image by the CPU plugin
// (plugins/cpu/ops/conv_pool.cpp). The fused kernels run the per-node kernels' own loops, so
// the pooled output, its indices, dx and dw must equal the unfused nodes' to the bit; the bias
// gradient sums the same values in f64 in another order and must agree to the storage type's
// rounding. The pre-pool tensor and its gradient must never be allocated.
#include <cmath>
#include <map>

#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/runtime.hpp"
#include "plexus/tune.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

struct Layer {
  plx_dtype d = PLX_F32;
  int64_t n = 5, c = 3, h = 10, w = 10, o = 4;  // x (n, c, h, w), o output channels
  int64_t k = 3, stride = 1, pad = 1, groups = 1;
  bool bias = true, relu = true;
  int64_t pool_k = 2, pool_s = 2, pool_pad = 0;
  bool relu_mask = true;     // the pool's indices carry the ReLU's mask (as reverse mode sets)
  bool window_index = true;  // u8 taps in the window, else i32 positions in the plane
  bool data = true, weight = true;  // which conv backward ops the graph has
  bool pre_pool_output = false;     // the pool's input is a graph output too: no forward fusion
  bool backward = true;             // false: an inference graph, whose indices nobody reads
  Runtime* rt = nullptr;            // the runtime whose cpu backend runs it; null: the suite's
};

struct LayerRun {
  std::map<std::string, std::vector<double>> values;  // every graph output
  MemoryPlan plan;
  std::vector<std::string> kernels;
};

Attrs conv_attrs(const Layer& l) {
  Attrs a;
  a.set("stride", std::vector<int64_t>{l.stride, l.stride});
  a.set("padding", std::vector<int64_t>{l.pad, l.pad});
  a.set("groups", l.groups);
  return a;
}

LayerRun finish(const Graph& g, const Layer& l, const std::vector<int64_t>& ps, bool fuse);

// x -> conv -> [relu] -> max_pool2d, then the pool's backward from a given pooled gradient
// and the conv's backward ops on it, written out as reverse mode writes them.
LayerRun run_layer(const Layer& l, bool fuse) {
  Graph g(l.rt ? l.rt->ops() : runtime().ops());
  const Var x = g.input("x", {l.d, {l.n, l.c, l.h, l.w}});
  const Var w = g.parameter("w", {l.d, {l.o, l.c / l.groups, l.k, l.k}}, init::uniform(-0.4, 0.4));
  std::vector<Var> conv_in = {x, w};
  if (l.bias) conv_in.push_back(g.parameter("b", {l.d, {l.o}}, init::uniform(-0.3, 0.3)));
  Var h = g.add1("conv2d", conv_in, conv_attrs(l), "conv");
  const int64_t oh = g.value(h).desc.shape[2], ow = g.value(h).desc.shape[3];
  if (l.relu) h = g.add1("relu", {h}, {}, "relu");
  if (l.pre_pool_output) g.mark_output(h, "pre_pool");
  Attrs pool;
  pool.set("kernel", std::vector<int64_t>{l.pool_k, l.pool_k});
  pool.set("stride", std::vector<int64_t>{l.pool_s, l.pool_s});
  pool.set("padding", std::vector<int64_t>{l.pool_pad, l.pool_pad});
  Attrs fwd = pool;
  fwd.set("relu_mask", int64_t{l.relu_mask ? 1 : 0});
  fwd.set("window_index", int64_t{l.window_index ? 1 : 0});
  const std::vector<Var> p = g.add("max_pool2d", {h}, fwd, "pool");
  g.mark_output(p[0], "y");
  if (l.backward) g.mark_output(p[1], "indices");
  const std::vector<int64_t> ps = g.value(p[0]).desc.shape;  // a copy: adding nodes moves values
  if (!l.backward) return finish(g, l, ps, fuse);
  const Var dy = g.input("dy", {l.d, {ps[0], ps[1], ps[2], ps[3]}});
  Attrs bwd = pool;
  bwd.set("input_shape", std::vector<int64_t>{l.n, l.o, oh, ow});
  bwd.set("window_index", int64_t{l.window_index ? 1 : 0});
  const Var un = g.add1("max_pool2d_backward", {dy, p[1]}, bwd, "pool.grad");
  if (l.data) {
    Attrs a = conv_attrs(l);
    a.set("input_shape", std::vector<int64_t>{l.n, l.c, l.h, l.w});
    g.mark_output(g.add1("conv2d_backward_data", {un, w}, a, "conv.grad"), "dx");
  }
  if (l.weight) {
    Attrs a = conv_attrs(l);
    a.set("weight_shape", std::vector<int64_t>{l.o, l.c / l.groups, l.k, l.k});
    g.mark_output(g.add1("conv2d_backward_weight", {un, x}, a, "conv.grad"), "dw");
  }
  if (l.bias) {
    Attrs a;
    a.set("axes", std::vector<int64_t>{0, 2, 3});
    g.mark_output(g.add1("sum", {un}, a, "conv.grad"), "db");
  }
  return finish(g, l, ps, fuse);
}

// Runs the graph on random x (and dy) and keeps every graph output.
LayerRun finish(const Graph& g, const Layer& l, const std::vector<int64_t>& ps, bool fuse) {
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 23;
  eo.fuse = fuse;
  Executable exe(l.rt ? l.rt->backend("cpu") : cpu(), g, store, eo);
  LayerRun r;
  r.plan = exe.plan();
  r.kernels = exe.kernel_names();
  // Values around zero, so the ReLU and its mask cut some windows whole (index "none").
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(l.n * l.c * l.h * l.w), 5, -1, 1));
  if (l.backward)
    fill(exe.tensor("dy"),
         random_doubles(static_cast<size_t>(ps[0] * ps[1] * ps[2] * ps[3]), 6, -1, 1));
  exe.run();
  exe.sync();
  for (const auto& [name, v] : g.outputs()) {
    (void)v;
    r.values[name] = exe.tensor(name).to_doubles();
  }
  return r;
}

bool has_kernel(const LayerRun& r, const std::string& text) {
  for (const auto& k : r.kernels)
    if (k.find(text) != std::string::npos) return true;
  return false;
}

std::string kernels_of(const LayerRun& r) {
  std::string s;
  for (const auto& k : r.kernels) s += k + "\n";
  return s;
}

// Relative rounding step of the storage type: the bias gradient may differ by a rounding.
double rounding(plx_dtype d) {
  switch (d) {
    case PLX_F64:
      return 1e-13;
    case PLX_F32:
      return 1e-6;
    case PLX_F16:
      return 1.0 / 1024;
    default:
      return 1.0 / 128;  // bf16
  }
}

// Sets the CPU plugin's fuse_chunk_bytes ("cpu.set_fuse_chunk_bytes") for graphs prepared while
// it lives: the SDK's chunked kernels (sdk/fusion_chunked.hpp) instead of the per-image ones.
struct Chunked {
  explicit Chunked(int64_t bytes) { REQUIRE(set(bytes)); }
  ~Chunked() { set(0); }
  Chunked(const Chunked&) = delete;
  Chunked& operator=(const Chunked&) = delete;
  static bool set(int64_t bytes) {
    const plx_backend& t = cpu().table();
    if (!t.get_proc_address) return false;
    auto fn = reinterpret_cast<void (*)(void*, int64_t)>(
        t.get_proc_address(t.ctx, "cpu.set_fuse_chunk_bytes"));
    if (!fn) return false;
    fn(t.ctx, bytes);
    return true;
  }
};

// Fused and unfused agree (to the bit but for db); returns the fused run.
LayerRun check_same(const Layer& l) {
  const LayerRun fused = run_layer(l, true);
  const LayerRun plain = run_layer(l, false);
  INFO("fused kernels:\n" << kernels_of(fused));
  CHECK(plain.plan.fused_kernels == 0);
  for (const auto& [name, v] : plain.values) {
    INFO(name);
    const std::vector<double>& f = fused.values.at(name);
    REQUIRE(f.size() == v.size());
    if (name != "db") {
      CHECK(f == v);
      continue;
    }
    double scale = 0;
    for (double e : v) scale = std::max(scale, std::fabs(e));
    for (size_t i = 0; i < v.size(); ++i) {
      INFO("db[" << i << "] fused " << f[i] << ", node by node " << v[i]);
      CHECK(std::fabs(f[i] - v[i]) <= rounding(l.d) * (std::fabs(v[i]) + 1e-3 * scale));
    }
  }
  return fused;
}

}  // namespace

TEST_CASE("a conv layer with its max pool runs as two kernels and equals the nodes",
          "[cpu][fusion]") {
  std::vector<std::pair<std::string, Layer>> cases;
  cases.emplace_back("f32 relu, 2x2 pool, u8 indices with the mask", Layer{});
  {
    Layer l;
    l.pool_k = 3, l.pool_s = 2, l.window_index = false, l.relu = false, l.relu_mask = false;
    l.bias = false;
    cases.emplace_back("f32 no relu nor bias, overlapping 3x3 windows, i32 indices", l);
  }
  {
    Layer l;
    l.d = PLX_BF16, l.n = 3;
    cases.emplace_back("bf16", l);
  }
  {
    Layer l;
    l.d = PLX_F16, l.groups = 2, l.c = 4, l.stride = 2, l.h = 13, l.w = 11, l.pool_pad = 1;
    cases.emplace_back("f16 two groups, stride 2, padded pool", l);
  }
  {
    Layer l;
    l.d = PLX_F64, l.k = 1, l.pad = 0, l.n = 1;
    cases.emplace_back("f64 pointwise conv, one image", l);
  }
  {
    Layer l;
    l.data = false;
    cases.emplace_back("the weight gradients only (a first layer)", l);
  }
  {
    Layer l;
    l.weight = false, l.bias = false;
    cases.emplace_back("the data gradient only", l);
  }
  for (const auto& [what, l] : cases) {
    INFO(what);
    const LayerRun fused = check_same(l);
    const std::string fwd = l.relu ? "conv2d+relu+max_pool2d" : "conv2d+max_pool2d";
    CHECK(has_kernel(fused, "fused kernel '" + fwd + "'"));
    CHECK(has_kernel(fused, "cpu/" + fwd));
    CHECK(has_kernel(fused, "fused kernel 'max_pool2d_backward+conv2d_backward'"));
    CHECK(has_kernel(fused, "cpu/max_pool2d_backward+conv2d_backward"));
    // The conv's output (and the ReLU's) and the unpooled gradient are never allocated.
    CHECK(fused.plan.fused_kernels == 2);
    CHECK(fused.plan.internal_values == (l.relu ? 2 : 1) + 1);
  }
}

TEST_CASE("the fused conv layer with its pool needs less memory than its nodes", "[cpu][fusion]") {
  Layer l;
  l.n = 8, l.c = 4, l.o = 16, l.h = 16, l.w = 16;
  const LayerRun fused = run_layer(l, true);
  const LayerRun plain = run_layer(l, false);
  // The pre-pool tensor: 8 images x 16 channels x 16 x 16 in f32, 128 KiB, twice (the conv's
  // output and, in place, the ReLU's; then its gradient).
  const uint64_t pre_pool = 8 * 16 * 16 * 16 * 4;
  INFO("arena fused " << fused.plan.arena_bytes << ", node by node " << plain.plan.arena_bytes
                      << "; unplanned " << fused.plan.unplanned_bytes << " vs "
                      << plain.plan.unplanned_bytes);
  CHECK(fused.plan.unplanned_bytes + 2 * pre_pool <= plain.plan.unplanned_bytes);
  CHECK(fused.plan.arena_bytes + pre_pool <= plain.plan.arena_bytes);
  CHECK(fused.plan.live_peak_bytes < plain.plan.live_peak_bytes);
}

TEST_CASE("a conv layer whose pre-pool tensor is needed elsewhere is not fused forward",
          "[cpu][fusion]") {
  Layer l;
  l.pre_pool_output = true;
  const LayerRun fused = check_same(l);
  INFO(kernels_of(fused));
  // The ReLU's output is a graph output, which the backend's view of the graph does not show:
  // it claims the layer, and declines the claim in create_fused() once the core names the
  // ReLU's output among the group's outputs. The core then offers the graph again with that
  // claim refused, and the backend's next pattern takes the conv with its ReLU as an epilogue
  // (which writes the ReLU's output, a boundary value). The pool runs alone; the backward is
  // still one kernel.
  CHECK_FALSE(has_kernel(fused, "conv2d+relu+max_pool2d"));
  CHECK(has_kernel(fused, "fused kernel 'conv2d+relu' [conv, relu]: cpu/conv2d+relu"));
  CHECK(has_kernel(fused, "pool max_pool2d: cpu/omp"));
  CHECK(has_kernel(fused, "cpu/max_pool2d_backward+conv2d_backward"));
  CHECK(fused.plan.fused_kernels == 2);
  CHECK(fused.plan.fused_nodes == 2 + 4);
}

TEST_CASE("an inference graph runs a conv layer with its pool as one kernel", "[cpu][fusion]") {
  // Nothing reads the pool's indices: the core still hands them to the fused kernel as an
  // output (a value read by nobody is written), so the group is the same as in training.
  Layer l;
  l.backward = false, l.relu_mask = false, l.window_index = false;
  const LayerRun fused = check_same(l);
  INFO(kernels_of(fused));
  CHECK(has_kernel(fused, "cpu/conv2d+relu+max_pool2d"));
  CHECK(fused.plan.fused_kernels == 1);
  CHECK(fused.plan.internal_values == 2);
}

TEST_CASE("the sdk's chunked conv and pool kernels equal the nodes on the cpu", "[cpu][fusion]") {
  // The kernels the CUDA plugin runs (sdk/fusion_chunked.hpp), here on the CPU plugin's own
  // per-node kernels: chunks of the batch through chunk-shaped copies of the nodes, the weight
  // and bias gradients added up over the chunks in f32. The pooled output, its indices and dx
  // come from the nodes' kernels on slices of the batch, so they must be the same bits; dw and db
  // sum in another grouping. 9 images of 4 x 10 x 10 pre-pool f32 values (1600 bytes each):
  // 3200 bytes make chunks of 4 images (the fewest whose x slices stay 16-byte aligned: x has
  // 300 values of 4 bytes an image), so 4 + 4 + 1.
  for (plx_dtype d : {PLX_F32, PLX_BF16, PLX_F16})
    for (int64_t bytes : {int64_t{3200}, int64_t{1} << 30}) {
      Layer l;
      l.d = d, l.n = 9;
      INFO(dtype_name(d) << ", fuse_chunk_bytes " << bytes);
      LayerRun fused;
      {
        const Chunked chunked(bytes);
        fused = run_layer(l, true);
      }
      const LayerRun plain = run_layer(l, false);
      INFO("fused kernels:\n" << kernels_of(fused));
      CHECK(has_kernel(fused, "cpu/conv2d+relu+max_pool2d"));
      CHECK(has_kernel(fused, "cpu/max_pool2d_backward+conv2d_backward"));
      CHECK(fused.plan.internal_values == 3);
      for (const auto& [name, v] : plain.values) {
        INFO(name);
        const std::vector<double>& f = fused.values.at(name);
        REQUIRE(f.size() == v.size());
        if (name != "dw" && name != "db") {
          CHECK(f == v);
          continue;
        }
        // Each chunk's 16-bit partial is rounded before the f32 sum: a few roundings.
        double scale = 0;
        for (double e : v) scale = std::max(scale, std::fabs(e));
        for (size_t i = 0; i < v.size(); ++i) {
          INFO(name << "[" << i << "] chunked " << f[i] << ", node by node " << v[i]);
          CHECK(std::fabs(f[i] - v[i]) <= 4 * rounding(l.d) * (std::fabs(v[i]) + 1e-2 * scale));
        }
      }
    }
}

TEST_CASE("a conv layer the host gave the direct kernel is not fused with its pool", "[cpu][fusion][tune]") {
  // The fused kernels run im2col only. A first layer of one channel has 9 taps, which the CPU's
  // direct kernels take; forced to the native side they are the host's choice for conv2d and
  // conv2d_backward_weight, and both groups are declined. In the next round the conv and its
  // ReLU are taken as an epilogue chain (running the direct kernel, the host's choice); the
  // rest runs node by node, the same result as unfused. On the library side im2col is the
  // choice and both groups are fused.
  for (KernelSide side : {KernelSide::Native, KernelSide::Library}) {
    INFO(kernel_side_name(side));
    RuntimeOptions o;
    o.plugins.paths = {plugin_dir()};
    o.plugins.use_env = false;
    o.plugins.use_default_dir = false;
    o.kernels = side;
    o.tune_cache = "off";
    Runtime rt(o);
    Layer l;
    l.c = 1, l.data = false, l.rt = &rt;
    const LayerRun fused = check_same(l);
    INFO(kernels_of(fused));
    const bool native = side == KernelSide::Native;
    CHECK(has_kernel(fused, "fused kernel 'conv2d+relu' [conv, relu]: cpu/conv2d+relu; conv on direct") == native);
    CHECK(has_kernel(fused, "cpu/conv2d+relu+max_pool2d") == !native);
    CHECK(has_kernel(fused, "cpu/max_pool2d_backward+conv2d_backward") == !native);
  }
}

TEST_CASE("a conv layer the host gave Winograd's kernels runs fused with its pool and equals the nodes",
          "[cpu][fusion][tune]") {
  // Eight input channels are 72 taps, more than the direct kernels take, so on the native side
  // Winograd's F(2x2, 3x3) (conv_winograd.cpp) is the host's choice for conv2d and both
  // gradients (f64 excepted, which stays on im2col). The fused kernels then run Winograd's
  // functions for all three, and their results equal the nodes' to the bit, odd planes (a last
  // tile half outside) included.
  RuntimeOptions o;
  o.plugins.paths = {plugin_dir()};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  o.kernels = KernelSide::Native;
  o.tune_cache = "off";
  Runtime rt(o);
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16, PLX_F64}) {
    for (int64_t size : {10, 9}) {
      INFO(dtype_name(d) << ", planes of " << size << "x" << size);
      Layer l;
      l.d = d, l.c = 8, l.h = size, l.w = size - 2, l.rt = &rt;
      const LayerRun fused = check_same(l);
      INFO(kernels_of(fused));
      CHECK(fused.plan.fused_kernels == 2);
      CHECK(has_kernel(fused, "cpu/conv2d+relu+max_pool2d"));
      CHECK(has_kernel(fused, "cpu/max_pool2d_backward+conv2d_backward"));
      CHECK(has_kernel(fused, "conv on winograd_f2x3") == (d != PLX_F64));
      CHECK(has_kernel(fused, "conv.grad on winograd_f2x3") == (d != PLX_F64));
      CHECK(has_kernel(fused, "on im2col_blas") == (d == PLX_F64));  // the weight gradient too
    }
  }
}
