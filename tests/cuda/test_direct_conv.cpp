// The CUDA plugin's direct convolution for few input taps (plugins/cuda/ops/direct_conv.cu): the
// "direct" candidates of conv2d and conv2d_backward_weight, created explicitly (the ordinary
// dispatch would take cuDNN, registered first), run against the CPU plugin on first-layer shapes
// (our models' C = 1 layers, RGB-like C = 3, the K = 32 limit, strides, dilation, padding),
// ragged pixel tiles and empty batches, with and without bias, in every layout mix of x, w and y
// (NCHW contiguous or channels-last per tensor), in f32, f16 and bf16. Outputs and workspace
// start as NaN (0xFF bytes) so an element left unwritten, or scratch read before it is written,
// fails.
#include <cmath>
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

// The first layers of convnet (padding 1, 32 channels) and simplecnn (no padding, 16), at a batch
// whose pixel count leaves a ragged last tile; an RGB-like stem with stride 2; K = 32 (the
// largest direct takes) with dilation; a rectangular filter with mixed stride and padding; a 1x1;
// more channels than a warp and odd; one output pixel; an empty batch; an image over 48 KiB of
// f32, whose weight gradient is tiled (the others' go image by image).
const std::vector<Geo>& geometries() {
  static const std::vector<Geo> g = {
      {{3, 1, 28, 28}, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}},  // convnet conv1
      {{2, 1, 28, 28}, 16, 3, 3, {1, 1}, {0, 0}, {1, 1}},  // simplecnn conv1
      {{2, 3, 15, 17}, 24, 3, 3, {2, 2}, {1, 1}, {1, 1}},  // RGB stem, stride 2
      {{2, 2, 13, 12}, 8, 4, 4, {1, 1}, {2, 1}, {2, 2}},   // K = 32, dilation 2
      {{3, 1, 9, 11}, 5, 5, 2, {3, 1}, {2, 0}, {1, 1}},    // rectangular, mixed stride
      {{2, 3, 7, 7}, 200, 1, 1, {1, 1}, {0, 0}, {1, 1}},   // 1x1, 200 channels
      {{1, 1, 3, 3}, 33, 3, 3, {1, 1}, {0, 0}, {1, 1}},    // one output pixel
      {{0, 1, 8, 8}, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}},    // empty batch: dw is zero
      {{1, 1, 120, 120}, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}}, // tiled weight gradient
  };
  return g;
}

const plx_kernel* direct_kernel(Backend& gpu, const std::string& op, plx_dtype d) {
  return kernel_by_impl(gpu, op, d, kImpl);
}

// Runs the direct kernel of `op` for one node; it must accept; compares with `want`.
void check_direct(Backend& gpu, const std::string& op, plx_dtype d, const std::vector<Tensor>& in,
                  const Shape& out_shape, bool out_nhwc, const Attrs& attrs, const Tensor& want,
                  int64_t terms, const std::string& what) {
  INFO(op << " " << dtype_name(d) << ": " << what);
  check_candidate(gpu, runtime().ops().get(op), direct_kernel(gpu, op, d), d, in, out_shape,
                  out_nhwc, attrs, want, terms);
}

}  // namespace

TEST_CASE("cuda direct convolutions match the cpu reference in every layout mix", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  uint64_t seed = 20261124;
  int runs = 0;
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16}) {
    for (const Geo& g : geometries()) {
      const ConvCase c = make_case(g, d, seed);
      const int64_t taps = g.x[1] * g.kh * g.kw;
      const int64_t pixels = std::max<int64_t>(1, c.y_shape[0] * c.y_shape[2] * c.y_shape[3]);
      for (int mix = 0; mix < 8; ++mix) {
        const Layouts l = layouts_of(mix);
        const std::string what = describe(g) + ", " + layout_name(l);
        const Tensor gx = on_gpu(gpu, c.x, l.x), gw = on_gpu(gpu, c.w, l.w);
        const Tensor gdy = on_gpu(gpu, c.dy, l.y);
        check_direct(gpu, "conv2d", d, {gx, gw, Tensor()}, c.y_shape, l.y, c.geo, c.want_y,
                     taps + 1, what);
        check_direct(gpu, "conv2d", d, {gx, gw, c.b.to(gpu)}, c.y_shape, l.y, c.geo, c.want_yb,
                     taps + 1, what + ", bias");
        // dw in w's layout, from dy in y's.
        check_direct(gpu, "conv2d_backward_weight", d, {gdy, gx}, c.w_shape, l.w, c.bw_attrs,
                     c.want_dw, pixels, what);
        runs += 3;
      }
    }
  }
  CHECK(runs == 3 * 8 * 3 * static_cast<int>(geometries().size()));
}

// The same kernel twice on the same inputs gives the same bits: the weight gradient's blocks are
// added in a fixed order, with no atomics, as the flags say (image by image, and tiled for an
// image over 48 KiB).
TEST_CASE("cuda direct convolutions are deterministic", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  for (const Geo& g : {Geo{{16, 1, 28, 28}, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}},
                       Geo{{2, 1, 120, 120}, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}}}) {
    for (plx_dtype d : {PLX_F32, PLX_BF16}) {
      const Shape w_shape = {g.o, g.x[1], g.kh, g.kw};
      const Shape y_shape = out_shape(g);
      const Tensor x = random_tensor(g.x, d, 7).to(gpu);
      const Tensor w = random_tensor(w_shape, d, 8).to(gpu);
      const Tensor dy = random_tensor(y_shape, d, 9).to(gpu);
      Attrs bw_attrs = geo_attrs(g);
      bw_attrs.set("weight_shape", Ints(w_shape));
      struct Run {
        const char* op;
        std::vector<Tensor> in;
        Shape out;
        Attrs attrs;
      };
      const Run runs[] = {{"conv2d", {x, w, Tensor()}, y_shape, geo_attrs(g)},
                          {"conv2d_backward_weight", {dy, x}, w_shape, bw_attrs}};
      for (const Run& r : runs) {
        INFO(r.op << " " << dtype_name(d) << " " << describe(g));
        const plx_kernel* k = direct_kernel(gpu, r.op, d);
        REQUIRE(k != nullptr);
        CHECK(same_bits_twice(gpu, runtime().ops().get(r.op), k, r.in, r.out, d, r.attrs));
      }
    }
  }
}

// What the kernels do not handle they decline with the reason, and another kernel takes the node.
TEST_CASE("cuda direct convolutions decline what they do not handle", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  const plx_dtype d = PLX_BF16;
  struct Decline {
    Shape x;
    int64_t o, k;
    Attrs attrs;
    std::string reason;
    bool forward;  // conv2d declines too (else the small layers' kernel takes it image by image,
                   // tests/cuda/test_direct_small.cpp)
  };
  const std::vector<Decline> cases = {
      // Too many taps: simplecnn's second layer (16 x 3 x 3 = 144), the Tensor Cores' case.
      {{2, 16, 13, 13}, 32, 3, Attrs{}, "C·KH·KW <= 32", false},
      {{2, 4, 8, 8}, 8, 3, Attrs{{"groups", int64_t{2}}}, "groups", true},
      {{1, 1, 8, 8}, 300, 3, Attrs{}, "at most 256 output channels", false},
      {{1, 1, 8, 8}, 300, 5, Attrs{}, "at most 256 output channels", true},
  };
  for (const Decline& c : cases) {
    const int64_t groups = c.attrs.has("groups") ? c.attrs.get_int("groups") : 1;
    const Shape w_shape = {c.o, c.x[1] / groups, c.k, c.k};
    const Tensor x = random_tensor(c.x, d, 1).to(gpu);
    const Tensor w = random_tensor(w_shape, d, 2).to(gpu);
    const Tensor y = call(gpu, "conv2d", {x, w, Tensor()}, c.attrs)[0];  // cuDNN
    Attrs bw_attrs = c.attrs;
    bw_attrs.set("weight_shape", Ints(w_shape));
    INFO("expecting a decline naming " << c.reason);
    for (const char* op : {"conv2d", "conv2d_backward_weight"}) {
      INFO(op);
      const OpSchema& s = runtime().ops().get(op);
      const bool fwd = std::string(op) == "conv2d";
      if (fwd && !c.forward) continue;
      Tensor out = poisoned(gpu, fwd ? y.shape() : w_shape, d, false);
      const std::string why =
          fwd ? run_candidate(gpu, s, direct_kernel(gpu, op, d), {x, w, Tensor()}, {out}, c.attrs)
              : run_candidate(gpu, s, direct_kernel(gpu, op, d), {y, x}, {out}, bw_attrs);
      CHECK_THAT(why, PLX_CONTAINS(c.reason));
    }
  }
  // Strides that are neither NCHW contiguous nor channels-last: x with H and W swapped in memory.
  const Tensor x = random_tensor({2, 1, 8, 8}, d, 3).to(gpu).permute({0, 1, 3, 2});
  const Tensor w = random_tensor({8, 1, 3, 3}, d, 4).to(gpu);
  const Attrs geo{{"padding", Ints{1, 1}}};
  Tensor out = poisoned(gpu, {2, 8, 8, 8}, d, false);
  const OpSchema& s = runtime().ops().get("conv2d");
  CHECK_THAT(run_candidate(gpu, s, direct_kernel(gpu, "conv2d", d), {x, w, Tensor()}, {out}, geo),
             PLX_CONTAINS("x must be NCHW contiguous or channels-last"));
}

// Registration, checked wherever the plugin was built (no device needed): one "direct" kernel per
// op (conv2d, both gradients) and dtype, native, deterministic, capturable, after cuDNN and the igemm tiles; channels-last
// preferred in 16 bits, NCHW in f32, as the other convolutions there.
TEST_CASE("the cuda plugin registers its direct convolutions after cudnn", "[cpu]") {
  if (!cuda::plugin_built())
    PLX_SKIP("the CUDA plugin was not built (no nvcc or cuDNN at configure time)");
  Backend* b = cuda::backend();
  INFO("loader: " << cuda::skip_reason());
  REQUIRE(b != nullptr);
  // conv2d_backward_data's is the small convolutions' backward (ops/direct_small.cu).
  for (const char* op : {"conv2d", "conv2d_backward_weight", "conv2d_backward_data"}) {
    const OpSchema& s = runtime().ops().get(op);
    for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16}) {
      INFO(op << " " << dtype_name(d));
      const auto ks = b->kernels(s.id, d);
      REQUIRE_FALSE(ks.empty());
      CHECK(std::string(ks.front()->impl) == "cudnn");
      CHECK(std::string(ks.back()->impl) == kImpl);
      int n = 0;
      for (const plx_kernel* k : ks) n += std::string(k->impl ? k->impl : "") == kImpl;
      CHECK(n == 1);
      const plx_kernel* k = ks.back();
      CHECK((k->flags & PLX_KERNEL_LIBRARY) == 0);
      CHECK((k->flags & PLX_KERNEL_DETERMINISTIC) != 0);
      CHECK((k->flags & PLX_KERNEL_CAPTURABLE) != 0);
      CHECK(k->layout == (d == PLX_F32 ? PLX_LAYOUT_NCHW : PLX_LAYOUT_NHWC));
    }
  }
}

// A first layer's backward (x is an input: no dx): relu_backward with its two readers, the bias
// gradient's sum and the weight gradient, runs as one direct launch where the host gives the
// weight gradient to "direct" (backend.kernels = "native": the igemm tiles decline C = 1), the
// masked gradient never written; against the same graph on the CPU. Where the host chose cuDNN
// (the library side) the group is declined and the ReLU's backward pairs with its sum instead.
TEST_CASE(
    "the relu backward of a first layer with its bias sum and weight gradient runs as one direct "
    "kernel",
    "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  (void)probe;  // the runtimes below are each case's own
  struct C {
    Shape x;
    int64_t o;
    Ints padding;
    plx_dtype d;
  };
  const C cases[] = {{{5, 1, 12, 10}, 16, {1, 1}, PLX_F32},
                     {{4, 1, 28, 28}, 32, {1, 1}, PLX_BF16},
                     {{3, 3, 9, 9}, 8, {0, 0}, PLX_F16},
                     {{0, 1, 8, 8}, 8, {1, 1}, PLX_F32},
                     {{2, 1, 120, 120}, 8, {1, 1}, PLX_F32}};  // tiled: x over 48 KiB
  for (KernelSide side : {KernelSide::Native, KernelSide::Library}) {
    RuntimeOptions o = plugin_dir_options();
    o.kernels = side;
    Runtime rt(o);
    Backend& gpu = rt.backend("cuda");
    const bool native = side == KernelSide::Native;
    for (const C& c : cases) {
      DYNAMIC_SECTION((native ? "native " : "library ")
                      << "x (" << c.x[0] << ", " << c.x[1] << ", " << c.x[2] << ", " << c.x[3]
                      << ") " << dtype_name(c.d)) {
        const Shape w_shape = {c.o, c.x[1], 3, 3};
        const Shape y_shape = {c.x[0], c.o, c.x[2] + 2 * c.padding[0] - 2,
                               c.x[3] + 2 * c.padding[1] - 2};
        Graph g(rt.ops());
        const Var x = g.input("x", {c.d, c.x});
        const Var dy = g.input("dy", {c.d, y_shape}), y = g.input("y", {c.d, y_shape});
        const Var dyr = g.add1("relu_backward", {dy, y}, {}, "relu.grad");
        g.mark_output(g.add1("sum", {dyr}, Attrs{{"axes", Ints{0, 2, 3}}}, "bias.grad"), "db");
        const Attrs wa{{"stride", Ints{1, 1}},
                       {"padding", c.padding},
                       {"dilation", Ints{1, 1}},
                       {"groups", int64_t{1}},
                       {"weight_shape", Ints(w_shape)}};
        g.mark_output(g.add1("conv2d_backward_weight", {dyr, x}, wa, "conv.weight_grad"), "dw");
        ExecutableOptions eo;
        TensorStore sa, sb;
        Executable a(gpu, g, sa, eo), b(rt.backend("cpu"), g, sb, eo);
        std::string names;
        for (const auto& k : a.kernel_names()) names += k + "\n";
        INFO(names);
        if (native) {
          CHECK_THAT(names, PLX_CONTAINS("relu_backward+sum+conv2d_backward_weight:direct"));
          CHECK(a.kernel_names().size() == 1);
        } else {
          CHECK_THAT(names, !PLX_CONTAINS(":direct"));
          CHECK_THAT(names, PLX_CONTAINS("fused kernel 'relu_backward+sum'"));
        }
        const int64_t ny = shape_numel(y_shape);
        const std::vector<double> vdy = random_doubles(static_cast<size_t>(ny), 11, -2, 2);
        std::vector<double> vy = random_doubles(static_cast<size_t>(ny), 12, -1, 1);
        for (size_t i = 0; i < vy.size(); i += 7) vy[i] = 0;  // y = 0 passes no gradient
        const std::vector<double> vx =
            random_doubles(static_cast<size_t>(shape_numel(c.x)), 13, -1, 1);
        for (Executable* e : {&a, &b}) {
          fill(e->tensor("x"), vx);
          fill(e->tensor("dy"), vdy);
          fill(e->tensor("y"), vy);
          e->run();
          e->sync();
        }
        const double nmse = c.d == PLX_F32 ? 1e-10 : 1e-4;
        for (const char* out : {"dw", "db"}) {
          INFO(out);
          CHECK(cmp::compare_tensors(a.tensor(out), b.tensor(out),
                                     cmp::Tolerance{INFINITY, 0, nmse, false}) == "");
        }
      }
    }
  }
}

// A first layer with its ReLU and max pool, the conv given to "direct" (backend.kernels =
// "native"), runs as one direct launch that pools the conv's values as it computes them, and
// gives the bits of the same graph run node by node (ExecutableOptions::fuse off: the direct
// conv, the ReLU and max_pool2d one after another): y and the indices, in the training form
// (relu_mask, u8 window taps) and others (i32 positions, the ReLU before the pool, no ReLU,
// overlapping windows with padding, a ragged last window row). In f32 against the CPU too.
TEST_CASE(
    "a first layer with its relu and max pool runs as one direct kernel with the unfused bits",
    "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  (void)probe;  // the runtimes below are each case's own
  struct C {
    Shape x;
    int64_t o;
    bool relu;
    Attrs pool;
    const char* what;
  };
  const Attrs training{
      {"kernel", Ints{2, 2}}, {"relu_mask", int64_t{1}}, {"window_index", int64_t{1}}};
  const C cases[] = {
      {{5, 1, 28, 28}, 16, true, training, "simplecnn's first layer, training form"},
      {{3, 1, 13, 11},
       8,
       true,
       Attrs{{"kernel", Ints{2, 2}}},
       "i32 positions, ReLU before the pool"},
      {{2, 3, 12, 12},
       20,
       false,
       Attrs{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}},
       "no ReLU, overlapping windows with padding"},
      {{2, 1, 9, 9},
       4,
       true,
       Attrs{{"kernel", Ints{2, 3}}, {"relu_mask", int64_t{1}}, {"ceil_mode", int64_t{1}}},
       "relu_mask with i32 positions, ceil_mode"},
  };
  RuntimeOptions opts = plugin_dir_options();
  opts.kernels = KernelSide::Native;
  Runtime rt(opts);
  Backend& gpu = rt.backend("cuda");
  for (plx_dtype d : {PLX_F32, PLX_BF16, PLX_F16})
    for (const C& c : cases) {
      DYNAMIC_SECTION(dtype_name(d) << ": " << c.what) {
        Graph g(rt.ops());
        const int64_t taps = c.x[1] * 9;
        add_conv_relu_pool(g, d, c.x, c.o, 1, c.relu, c.pool);
        FusedPair run(gpu, g);
        INFO(run.names());
        CHECK_THAT(run.names(), PLX_CONTAINS(c.relu ? "conv2d+relu+max_pool2d:direct"
                                                    : "conv2d+max_pool2d:direct"));
        CHECK(run.kernel_count() == 1);
        std::vector<double> vx = random_doubles(static_cast<size_t>(shape_numel(c.x)), 31, -1, 1);
        run.run({{"x", vx}});
        for (const char* out : {"y", "idx"}) {
          INFO(out);
          const auto [fused_bytes, plain_bytes] = run.bytes(out);
          CHECK(fused_bytes == plain_bytes);
        }
        Executable& fused = run.fused();
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

// The backward of that layer: max_pool2d_backward read only by the weight gradient and the bias
// gradient's sum (x is an input: no dx), the weight gradient given to "direct", runs as one
// direct launch. Where an image of x fits in shared memory the launch walks the pooled gradient
// image by image (direct_pool_wgrad_kernel): dw and db within rounding of the same graph run node
// by node (the pool's backward writing the unpooled gradient, then the tiled direct weight
// gradient: another summation order), the same bits when run again, and in f32 both match the
// CPU. A larger image takes the tiled kernel, which unpools dy as it stages it: dw then has the
// node-by-node bits. Windows that overlap (stride below the kernel) are declined and run as the
// chunked group.
TEST_CASE(
    "the max pool backward of a first layer with its weight and bias gradients runs as one direct "
    "kernel",
    "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  (void)probe;  // the runtimes below are each case's own
  enum class Path { Image, Tiled, Chunked };
  struct C {
    Shape x;
    int64_t o;
    Attrs pool;
    Path path;
    const char* what;
  };
  const Attrs training{
      {"kernel", Ints{2, 2}}, {"relu_mask", int64_t{1}}, {"window_index", int64_t{1}}};
  const C cases[] = {
      {{5, 1, 28, 28}, 16, training, Path::Image, "simplecnn's first layer, training form"},
      {{3, 1, 13, 11},
       8,
       Attrs{{"kernel", Ints{2, 2}}},
       Path::Image,
       "i32 positions, a ragged last row and column"},
      {{2, 3, 9, 9},
       6,
       Attrs{{"kernel", Ints{2, 3}}, {"ceil_mode", int64_t{1}}, {"window_index", int64_t{1}}},
       Path::Image,
       "ceil_mode, a partial last window, 27 taps"},
      {{2, 1, 120, 120}, 4, training, Path::Tiled, "an image over 48 KiB: the tiled kernel"},
      {{2, 1, 12, 12},
       4,
       Attrs{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}},
       Path::Chunked,
       "overlapping windows: the chunked group"},
  };
  RuntimeOptions opts = plugin_dir_options();
  opts.kernels = KernelSide::Native;
  Runtime rt(opts);
  Backend& gpu = rt.backend("cuda");
  for (plx_dtype d : {PLX_F32, PLX_BF16})
    for (const C& c : cases) {
      DYNAMIC_SECTION(dtype_name(d) << ": " << c.what) {
        Graph g(rt.ops());
        const Var x = g.input("x", {d, c.x});
        const Var w =
            g.parameter("c.weight", {d, {c.o, c.x[1], 3, 3}}, init::kaiming_uniform(c.x[1] * 9));
        const Var b = g.parameter("c.bias", {d, {c.o}}, init::uniform(-0.3, 0.3));
        const Attrs conv_attrs{{"padding", Ints{1, 1}}};
        const Var pre = g.add1("conv2d", {x, w, b}, conv_attrs, "c");
        const std::vector<Var> p = g.add("max_pool2d", {pre}, c.pool, "c.pool");
        const Shape ps = g.value(p[0]).desc.shape;
        const Var dy = g.input("dy", {d, ps});
        Attrs back{{"input_shape", Ints(g.value(pre).desc.shape)}};
        for (const char* k : {"kernel", "stride", "ceil_mode", "window_index"})
          if (const AttrValue* v = c.pool.find(k)) back.set(k, *v);
        const Var dpre = g.add1("max_pool2d_backward", {dy, p[1]}, back, "c.pool.grad");
        g.mark_output(g.add1("sum", {dpre}, Attrs{{"axes", Ints{0, 2, 3}}}, "c.bias.grad"), "db");
        Attrs wa = conv_attrs;
        wa.set("weight_shape", Ints{c.o, c.x[1], 3, 3});
        g.mark_output(g.add1("conv2d_backward_weight", {dpre, x}, wa, "c.weight.grad"), "dw");
        g.mark_output(p[0], "y");
        FusedPair run(gpu, g);
        const std::string names = run.names();
        INFO(names);
        const bool direct = c.path != Path::Chunked;
        if (direct)
          CHECK_THAT(names, PLX_CONTAINS("max_pool2d_backward+conv2d_backward_weight:direct"));
        else
          CHECK_THAT(names, !PLX_CONTAINS("max_pool2d_backward+conv2d_backward_weight:direct"));
        const std::vector<double> vx =
            random_doubles(static_cast<size_t>(shape_numel(c.x)), 41, -1, 1);
        const std::vector<double> vdy =
            random_doubles(static_cast<size_t>(shape_numel(ps)), 42, -2, 2);
        run.run({{"x", vx}, {"dy", vdy}});
        Executable &fused = run.fused(), &plain = run.plain();
        if (c.path == Path::Tiled) {  // the unfused kernels' bits; otherwise only to rounding
          const auto [fused_bytes, plain_bytes] = run.bytes("dw");
          CHECK(fused_bytes == plain_bytes);
        }
        if (c.path == Path::Image) {  // run again: the same bits (split_sum's counters reset)
          const auto first_dw = run.bytes("dw").first, first_db = run.bytes("db").first;
          fused.run();
          fused.sync();
          CHECK(run.bytes("dw").first == first_dw);
          CHECK(run.bytes("db").first == first_db);
        }
        const double nmse = d == PLX_F32 ? 1e-10 : 1e-4;
        for (const char* out : {"dw", "db"}) {
          INFO(out);
          CHECK(cmp::compare_tensors(fused.tensor(out), plain.tensor(out),
                                     cmp::Tolerance{INFINITY, 0, nmse, false}) == "");
        }
        if (d == PLX_F32) {  // and the CPU's, with the parameters the GPU used
          Executable& ref = run.reference(rt.backend("cpu"), g, {{"x", vx}, {"dy", vdy}});
          for (const char* out : {"dw", "db"}) {
            INFO("cpu " << out);
            CHECK(cmp::compare_tensors(fused.tensor(out), ref.tensor(out),
                                       cmp::Tolerance{INFINITY, 0, 1e-10, false}) == "");
          }
        }
      }
    }
}
