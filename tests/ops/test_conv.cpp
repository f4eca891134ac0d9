// 2-D convolution on the CPU backend: forward and both backward ops against direct loops in
// double precision in every float dtype; gradients (the core's formula plus the backward kernels,
// and the backward ops' own gradients) against finite differences; errors naming op and problem.
#include <cmath>

#include "plexus/dispatch.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

struct ConvCase {
  Shape x, w;
  bool bias = false;
  Ints stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;

  Attrs attrs() const {
    return {{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
  }
  std::string str() const {
    return "x " + shape_string(x) + " w " + shape_string(w) + (bias ? " +b" : "") + " stride " +
           attr_value_string(AttrValue(stride)) + " padding " +
           attr_value_string(AttrValue(padding)) + " dilation " +
           attr_value_string(AttrValue(dilation)) + " groups " + std::to_string(groups);
  }
  int64_t out(int i) const {
    return (x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) / stride[i] + 1;
  }
  Shape y() const { return {x[0], w[0], out(0), out(1)}; }
};

// The direct double loop: y[n, o, oh, ow] = b[o] + Σ_{c, kh, kw} x[n, g·Cg + c, ih, iw]·w[o, c, kh,
// kw] with ih = oh·sh − ph + kh·dh (likewise iw), terms outside the input being zero.
std::vector<double> ref_conv2d(const ConvCase& k, const std::vector<double>& x,
                               const std::vector<double>& w, const std::vector<double>* b) {
  const Shape ys = k.y();
  std::vector<double> y(static_cast<size_t>(shape_numel(ys)));
  const int64_t Cg = k.w[1], Og = k.w[0] / k.groups;
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t o = 0; o < ys[1]; ++o)
      for (int64_t oh = 0; oh < ys[2]; ++oh)
        for (int64_t ow = 0; ow < ys[3]; ++ow) {
          double acc = b ? (*b)[static_cast<size_t>(o)] : 0.0;
          const int64_t g = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < k.w[2]; ++kh)
              for (int64_t kw = 0; kw < k.w[3]; ++kw) {
                const int64_t ih = oh * k.stride[0] - k.padding[0] + kh * k.dilation[0];
                const int64_t iw = ow * k.stride[1] - k.padding[1] + kw * k.dilation[1];
                if (ih < 0 || ih >= k.x[2] || iw < 0 || iw >= k.x[3]) continue;
                acc += x[static_cast<size_t>(idx4(k.x, n, g * Cg + c, ih, iw))] *
                       w[static_cast<size_t>(idx4(k.w, o, c, kh, kw))];
              }
          y[static_cast<size_t>(idx4(ys, n, o, oh, ow))] = acc;
        }
  return y;
}

// The backward ops by the same loop, transposed: every product x·w of the forward sends dy·w to
// dx and dy·x to dw.
void ref_conv2d_backward(const ConvCase& k, const std::vector<double>& x,
                         const std::vector<double>& w, const std::vector<double>& dy,
                         std::vector<double>& dx, std::vector<double>& dw) {
  const Shape ys = k.y();
  dx.assign(static_cast<size_t>(shape_numel(k.x)), 0.0);
  dw.assign(static_cast<size_t>(shape_numel(k.w)), 0.0);
  const int64_t Cg = k.w[1], Og = k.w[0] / k.groups;
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t o = 0; o < ys[1]; ++o)
      for (int64_t oh = 0; oh < ys[2]; ++oh)
        for (int64_t ow = 0; ow < ys[3]; ++ow) {
          const double d = dy[static_cast<size_t>(idx4(ys, n, o, oh, ow))];
          const int64_t g = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < k.w[2]; ++kh)
              for (int64_t kw = 0; kw < k.w[3]; ++kw) {
                const int64_t ih = oh * k.stride[0] - k.padding[0] + kh * k.dilation[0];
                const int64_t iw = ow * k.stride[1] - k.padding[1] + kw * k.dilation[1];
                if (ih < 0 || ih >= k.x[2] || iw < 0 || iw >= k.x[3]) continue;
                const size_t xi = static_cast<size_t>(idx4(k.x, n, g * Cg + c, ih, iw));
                const size_t wi = static_cast<size_t>(idx4(k.w, o, c, kh, kw));
                dx[xi] += d * w[wi];
                dw[wi] += d * x[xi];
              }
        }
}

// Stride 2, padding, dilation 2, groups 2 and depthwise, 1x1 (pointwise and not), odd sizes,
// size-1 batch/channels/spatial, non-square kernels, an empty batch, and images large enough
// that the kernels unfold them a block of output rows at a time (the last block partial).
// Batches of one run on the calling thread, larger ones are split over the threads.
const std::vector<ConvCase> kCases = {
    {.x = {2, 3, 7, 9}, .w = {4, 3, 3, 3}, .bias = true},
    {.x = {2, 3, 9, 8}, .w = {5, 3, 3, 3}, .stride = {2, 2}, .padding = {1, 1}},
    {.x = {1, 2, 6, 5}, .w = {3, 2, 3, 2}, .bias = true, .stride = {1, 2}, .padding = {2, 1}},
    {.x = {2, 2, 9, 10}, .w = {3, 2, 3, 3}, .padding = {2, 1}, .dilation = {2, 2}},
    {.x = {2, 4, 7, 7}, .w = {6, 2, 3, 3}, .bias = true, .stride = {2, 1}, .groups = 2},
    {.x = {2, 5, 8, 8}, .w = {5, 1, 3, 3}, .padding = {1, 1}, .groups = 5},
    {.x = {1, 3, 6, 7}, .w = {6, 1, 3, 3}, .bias = true, .stride = {2, 2}, .groups = 3},
    {.x = {3, 6, 5, 7}, .w = {4, 6, 1, 1}, .bias = true},
    {.x = {2, 6, 5, 7}, .w = {4, 3, 1, 1}, .groups = 2},
    {.x = {2, 3, 5, 7}, .w = {4, 3, 1, 1}, .stride = {2, 3}},
    {.x = {2, 3, 5, 7}, .w = {2, 3, 1, 1}, .bias = true, .padding = {1, 0}},
    {.x = {3, 3, 11, 13},
     .w = {7, 3, 5, 3},
     .stride = {3, 2},
     .padding = {2, 0},
     .dilation = {1, 3}},
    {.x = {1, 1, 5, 5}, .w = {1, 1, 3, 3}, .bias = true},
    {.x = {1, 1, 1, 1}, .w = {1, 1, 1, 1}},
    {.x = {1, 1, 1, 1}, .w = {2, 1, 3, 3}, .bias = true, .padding = {1, 1}},
    {.x = {2, 3, 6, 8}, .w = {2, 3, 1, 4}, .bias = true, .padding = {0, 1}},
    {.x = {2, 3, 8, 6}, .w = {2, 3, 4, 1}, .stride = {2, 1}},
    {.x = {0, 3, 5, 5}, .w = {2, 3, 3, 3}, .bias = true},
    {.x = {5, 16, 48, 48}, .w = {8, 16, 3, 3}, .bias = true, .padding = {1, 1}},
    {.x = {3, 32, 31, 30}, .w = {8, 16, 3, 3}, .padding = {1, 1}, .groups = 2},
    {.x = {2, 256, 41, 40}, .w = {8, 256, 1, 1}, .bias = true},
    {.x = {1, 64, 20, 33}, .w = {3, 64, 3, 3}, .bias = true, .stride = {1, 2}, .padding = {1, 1}},
    {.x = {1, 128, 30, 40}, .w = {4, 128, 1, 1}},
};

// Accumulations of K products in f32: the error grows like sqrt(K) (random signs), so the
// absolute tolerance is scaled by it.
Tol conv_tol(plx_dtype d, int64_t terms) {
  Tol t = tolerance(d);
  t.atol *= std::sqrt(static_cast<double>(std::max<int64_t>(terms, 1)));
  return t;
}

}  // namespace

TEST_CASE("conv2d forward matches the direct loop", "[cpu][ops][conv]") {
  for (const ConvCase& k : kCases) {
    for (plx_dtype d : kFloatDtypes) {
      INFO("conv2d " << dtype_name(d) << " " << k.str());
      const Tensor x = random_tensor(k.x, d, 11);
      const Tensor w = random_tensor(k.w, d, 12);
      const Tensor b = k.bias ? random_tensor({k.w[0]}, d, 13) : Tensor();
      const std::vector<double> bv = k.bias ? b.to_doubles() : std::vector<double>{};
      const std::vector<double> want =
          ref_conv2d(k, x.to_doubles(), w.to_doubles(), k.bias ? &bv : nullptr);
      const Tensor y = call(cpu(), "conv2d", {x, w, b}, k.attrs()).at(0);
      REQUIRE(y.dtype() == d);
      REQUIRE(y.shape() == k.y());
      CHECK_ALLCLOSE(y.to_doubles(), round_to(want, d), conv_tol(d, k.w[1] * k.w[2] * k.w[3] + 1));
    }
  }
}

TEST_CASE("conv2d backward ops match the transposed loop", "[cpu][ops][conv]") {
  for (const ConvCase& k : kCases) {
    for (plx_dtype d : kFloatDtypes) {
      INFO("conv2d backward " << dtype_name(d) << " " << k.str());
      const Tensor x = random_tensor(k.x, d, 21);
      const Tensor w = random_tensor(k.w, d, 22);
      const Tensor dy = random_tensor(k.y(), d, 23);
      std::vector<double> dx_want, dw_want;
      ref_conv2d_backward(k, x.to_doubles(), w.to_doubles(), dy.to_doubles(), dx_want, dw_want);

      Attrs a = k.attrs();
      a.set("input_shape", k.x);
      const Tensor dx = call(cpu(), "conv2d_backward_data", {dy, w}, a).at(0);
      REQUIRE(dx.dtype() == d);
      REQUIRE(dx.shape() == k.x);
      // Each dx element sums at most O/groups·KH·KW products.
      CHECK_ALLCLOSE(dx.to_doubles(), round_to(dx_want, d),
                     conv_tol(d, k.w[0] / k.groups * k.w[2] * k.w[3]));

      Attrs b = k.attrs();
      b.set("weight_shape", k.w);
      const Tensor dw = call(cpu(), "conv2d_backward_weight", {dy, x}, b).at(0);
      REQUIRE(dw.dtype() == d);
      REQUIRE(dw.shape() == k.w);
      // Each dw element sums N·OH·OW products, of order sqrt of that in size: relative and
      // absolute tolerance both scale with it.
      const int64_t terms = k.x[0] * k.out(0) * k.out(1);
      Tol t = conv_tol(d, terms);
      CHECK_ALLCLOSE(dw.to_doubles(), round_to(dw_want, d), t);
    }
  }
}

TEST_CASE("conv2d gradients match finite differences", "[cpu][ops][conv][grad]") {
  const std::vector<ConvCase> cases = {
      {.x = {2, 3, 5, 6},
       .w = {4, 3, 3, 2},
       .bias = true,
       .stride = {2, 1},
       .padding = {1, 2},
       .dilation = {1, 2}},
      {.x = {1, 4, 5, 5},
       .w = {6, 2, 2, 3},
       .bias = true,
       .stride = {1, 2},
       .padding = {1, 0},
       .dilation = {2, 1},
       .groups = 2},
      {.x = {2, 3, 3, 4}, .w = {2, 3, 1, 1}, .bias = true},
      {.x = {1, 1, 4, 4}, .w = {1, 1, 3, 3}},
      {.x = {1, 3, 4, 5}, .w = {3, 1, 3, 3}, .bias = true, .padding = {1, 1}, .groups = 3},
  };
  for (const ConvCase& k : cases) {
    INFO(k.str());
    const Tensor x = random_tensor(k.x, PLX_F64, 31);
    const Tensor w = random_tensor(k.w, PLX_F64, 32);
    const Tensor b = k.bias ? random_tensor({k.w[0]}, PLX_F64, 33) : Tensor();
    check_gradients("conv2d", {x, w, b}, k.attrs());

    // The backward ops are differentiable too (double backward).
    const Tensor dy = random_tensor(k.y(), PLX_F64, 34);
    Attrs a = k.attrs();
    a.set("input_shape", k.x);
    check_gradients("conv2d_backward_data", {dy, w}, a);
    Attrs c = k.attrs();
    c.set("weight_shape", k.w);
    check_gradients("conv2d_backward_weight", {dy, x}, c);
  }
}

TEST_CASE("conv2d rejects mismatched shapes and bad attributes", "[cpu][ops][conv][errors]") {
  const Tensor x = random_tensor({1, 4, 5, 5}, PLX_F32, 1);
  const Tensor w = random_tensor({6, 2, 3, 3}, PLX_F32, 2);
  auto conv = [&](const Tensor& xx, const Tensor& ww, const Attrs& a, const Tensor& b = Tensor()) {
    return call(cpu(), "conv2d", {xx, ww, b}, a);
  };
  REQUIRE_THROWS_WITH(conv(x, w, {}), PLX_CONTAINS("op 'conv2d': channel mismatch"));
  REQUIRE_THROWS_WITH(conv(x, random_tensor({5, 2, 3, 3}, PLX_F32, 3), {{"groups", int64_t{2}}}),
                      PLX_CONTAINS("op 'conv2d': groups 2 does not divide the output channels 5"));
  REQUIRE_THROWS_WITH(conv(x, w, {{"groups", int64_t{3}}}),
                      PLX_CONTAINS("op 'conv2d': groups 3 does not divide the input channels 4"));
  REQUIRE_THROWS_WITH(conv(x, w, {{"groups", int64_t{0}}}),
                      PLX_CONTAINS("op 'conv2d': groups must be >= 1"));
  // 3x3 fits a 5x5 input, but not with dilation 3 (extent 7), unless padded by 1.
  REQUIRE_THROWS_WITH(conv(x, w, {{"groups", int64_t{2}}, {"dilation", Ints{3, 1}}}),
                      PLX_CONTAINS("op 'conv2d': kernel 3x3 (dilated extent 7) is larger than "
                                   "the padded input 5x5"));
  CHECK(conv(x, w, {{"groups", int64_t{2}}, {"dilation", Ints{3, 1}}, {"padding", Ints{1, 0}}})
            .at(0)
            .shape() == Shape{1, 6, 1, 3});
  REQUIRE_THROWS_WITH(
      conv(random_tensor({1, 1, 2, 2}, PLX_F32, 4), random_tensor({1, 1, 3, 3}, PLX_F32, 5), {}),
      PLX_CONTAINS("op 'conv2d': kernel 3x3 is larger than the padded input 2x2"));
  REQUIRE_THROWS_WITH(conv(x, w, {{"groups", int64_t{2}}, {"stride", Ints{1}}}),
                      PLX_CONTAINS("op 'conv2d': stride must have 2 values [h, w], got [1]"));
  REQUIRE_THROWS_WITH(conv(x, w, {{"groups", int64_t{2}}, {"padding", Ints{1, 1, 1}}}),
                      PLX_CONTAINS("op 'conv2d': padding must have 2 values"));
  REQUIRE_THROWS_WITH(conv(x, w, {{"groups", int64_t{2}}, {"padding", Ints{-1, 0}}}),
                      PLX_CONTAINS("op 'conv2d': padding must be >= 0, got [-1, 0]"));
  REQUIRE_THROWS_WITH(conv(x, w, {{"groups", int64_t{2}}, {"stride", Ints{1, 0}}}),
                      PLX_CONTAINS("op 'conv2d': stride must be >= 1"));
  REQUIRE_THROWS_WITH(conv(x, w, {{"groups", int64_t{2}}, {"dilation", Ints{0, 1}}}),
                      PLX_CONTAINS("op 'conv2d': dilation must be >= 1"));
  REQUIRE_THROWS_WITH(conv(x, w, {{"groups", int64_t{2}}}, random_tensor({5}, PLX_F32, 6)),
                      PLX_CONTAINS("op 'conv2d': b must have shape (6)"));
  REQUIRE_THROWS_WITH(conv(random_tensor({4, 5, 5}, PLX_F32, 7), w, {}),
                      PLX_CONTAINS("op 'conv2d': x (N, C, H, W) must be 4-D"));
  REQUIRE_THROWS_WITH(conv(x, random_tensor({6, 2, 9}, PLX_F32, 8), {}),
                      PLX_CONTAINS("op 'conv2d': w (O, C/groups, KH, KW) must be 4-D"));
  REQUIRE_THROWS_WITH(conv(x, random_tensor({6, 2, 3, 3}, PLX_F16, 9), {{"groups", int64_t{2}}}),
                      PLX_CONTAINS("op 'conv2d': input 'w' is f16, expected f32"));
  REQUIRE_THROWS_WITH(conv(random_ints({1, 4, 5, 5}, PLX_I32, 1, 0, 3), w, {}),
                      PLX_CONTAINS("op 'conv2d': input 'x' is i32, expected one of"));
}

TEST_CASE("conv2d backward ops reject shapes that do not match the forward",
          "[cpu][ops][conv][errors]") {
  const Tensor w = random_tensor({6, 2, 3, 3}, PLX_F32, 1);
  const Tensor dy = random_tensor({1, 6, 3, 3}, PLX_F32, 2);
  const Attrs base = {{"groups", int64_t{2}}};
  Attrs a = base;
  a.set("input_shape", Ints{1, 4, 5, 5});
  CHECK(call(cpu(), "conv2d_backward_data", {dy, w}, a).at(0).shape() == Shape{1, 4, 5, 5});
  a.set("input_shape", Ints{1, 4, 6, 5});
  REQUIRE_THROWS_WITH(call(cpu(), "conv2d_backward_data", {dy, w}, a),
                      PLX_CONTAINS("op 'conv2d_backward_data': dy (1, 6, 3, 3) is not the output "
                                   "shape (1, 6, 4, 3)"));
  a.set("input_shape", Ints{1, 4, 5});
  REQUIRE_THROWS_WITH(call(cpu(), "conv2d_backward_data", {dy, w}, a),
                      PLX_CONTAINS("op 'conv2d_backward_data': input_shape must have 4 values"));
  a.set("input_shape", Ints{1, 3, 5, 5});
  REQUIRE_THROWS_WITH(call(cpu(), "conv2d_backward_data", {dy, w}, a),
                      PLX_CONTAINS("op 'conv2d_backward_data': groups 2 does not divide the input "
                                   "channels 3"));
  a.set("input_shape", Ints{1, -4, 5, 5});
  REQUIRE_THROWS_WITH(call(cpu(), "conv2d_backward_data", {dy, w}, a),
                      PLX_CONTAINS("input_shape must not be negative"));
  REQUIRE_THROWS_WITH(call(cpu(), "conv2d_backward_data", {dy, w}, base),
                      PLX_CONTAINS("op 'conv2d_backward_data': missing required attribute "
                                   "'input_shape'"));

  const Tensor x = random_tensor({1, 4, 5, 5}, PLX_F32, 3);
  Attrs b = base;
  b.set("weight_shape", Ints{6, 2, 3, 3});
  CHECK(call(cpu(), "conv2d_backward_weight", {dy, x}, b).at(0).shape() == Shape{6, 2, 3, 3});
  b.set("weight_shape", Ints{6, 2, 2, 3});
  REQUIRE_THROWS_WITH(call(cpu(), "conv2d_backward_weight", {dy, x}, b),
                      PLX_CONTAINS("op 'conv2d_backward_weight': dy (1, 6, 3, 3) is not the "
                                   "output shape (1, 6, 4, 3)"));
  b.set("weight_shape", Ints{6, 3, 3, 3});
  REQUIRE_THROWS_WITH(call(cpu(), "conv2d_backward_weight", {dy, x}, b),
                      PLX_CONTAINS("op 'conv2d_backward_weight': channel mismatch"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "conv2d_backward_weight", {dy, random_tensor({1, 4, 5, 5}, PLX_F64, 4)}, b),
      PLX_CONTAINS("op 'conv2d_backward_weight': input 'x' is f64, expected f32"));
}

namespace {

// Runs every kernel the CPU backend registers for `op` that accepts the node (not only the one
// dispatch would pick), each on its own output; returns (impl, output) pairs.
std::vector<std::pair<std::string, Tensor>> run_each_kernel(const std::string& op,
                                                            const std::vector<Tensor>& ins,
                                                            const Attrs& given) {
  const OpSchema& s = cpu().runtime().ops().get(op);
  const Attrs attrs = s.complete_attrs(given);
  std::vector<TensorDesc> in_descs;
  std::vector<plx_tensor> in_views, in_desc_views;
  for (const Tensor& t : ins) {
    in_descs.push_back(t.defined() ? t.desc() : TensorDesc{});
    in_views.push_back(t.defined() ? t.view() : Tensor().view());
    plx_tensor d = in_views.back();
    d.data = nullptr;
    in_desc_views.push_back(d);
  }
  const TensorDesc out = s.infer_outputs(in_descs, attrs).at(0);
  const plx_tensor out_desc = make_desc(out, 0);
  AttrPack pack(attrs);
  plx_node_info node{};
  node.struct_size = sizeof node;
  node.op = s.name.c_str();
  node.num_inputs = static_cast<int32_t>(in_desc_views.size());
  node.inputs = in_desc_views.data();
  node.num_outputs = 1;
  node.outputs = &out_desc;
  node.attrs = pack.data();
  node.num_attrs = pack.size();
  std::vector<std::pair<std::string, Tensor>> results;
  for (const plx_kernel* k : cpu().kernels(s.id, ins.at(0).dtype())) {
    void* state = nullptr;
    uint64_t ws = 0;
    if (k->create(cpu().kernel_ctx(k), k->user, &node, &state, &ws) != PLX_OK) continue;
    PreparedKernel pk(cpu(), op, k, state, ws);
    Tensor y = Tensor::empty(cpu(), out.shape, out.dtype);
    const Tensor work = Tensor::empty(cpu(), {static_cast<int64_t>(std::max<uint64_t>(ws, 1))}, PLX_U8);
    const plx_tensor yv = y.view();
    pk.run(in_views.data(), static_cast<int32_t>(in_views.size()), &yv, 1, ws ? work.data() : nullptr,
           cpu().stream(0));
    results.emplace_back(k->impl, y);
  }
  return results;
}

}  // namespace

// The tuner may run any kernel that accepts a node, so each must be right on its own: im2col's
// GEMMs and the direct loops (conv_direct.cpp, for few taps) against the double loops.
TEST_CASE("every conv kernel candidate matches the direct loop", "[cpu][ops][conv][tune]") {
  std::vector<ConvCase> cases = kCases;
  // The models' first layers, where the direct kernels are meant to win.
  cases.push_back({.x = {4, 1, 28, 28}, .w = {32, 1, 3, 3}, .bias = true, .padding = {1, 1}});
  cases.push_back({.x = {3, 1, 28, 28}, .w = {16, 1, 3, 3}, .bias = true});
  cases.push_back({.x = {2, 3, 300, 17}, .w = {5, 3, 3, 3}, .stride = {1, 1}, .padding = {1, 1}});
  // Winograd's (conv_winograd.cpp): the models' 3x3 layers, odd planes (a last tile half
  // outside), padding 0 and 2 (the data gradient's 2 and 0), a plane smaller than a tile.
  cases.push_back({.x = {3, 32, 14, 14}, .w = {64, 32, 3, 3}, .bias = true, .padding = {1, 1}});
  cases.push_back({.x = {2, 5, 9, 7}, .w = {6, 5, 3, 3}, .bias = true, .padding = {2, 0}});
  cases.push_back({.x = {2, 4, 3, 4}, .w = {3, 4, 3, 3}, .padding = {0, 1}});
  int direct_runs = 0, winograd_runs = 0;
  for (const ConvCase& k : cases) {
    for (plx_dtype d : kFloatDtypes) {
      INFO("conv2d candidates " << dtype_name(d) << " " << k.str());
      const Tensor x = random_tensor(k.x, d, 31);
      const Tensor w = random_tensor(k.w, d, 32);
      const Tensor b = k.bias ? random_tensor({k.w[0]}, d, 33) : Tensor();
      const Tensor dy = random_tensor(k.y(), d, 34);
      const std::vector<double> bv = k.bias ? b.to_doubles() : std::vector<double>{};
      const std::vector<double> y_want =
          ref_conv2d(k, x.to_doubles(), w.to_doubles(), k.bias ? &bv : nullptr);
      std::vector<double> dx_want, dw_want;
      ref_conv2d_backward(k, x.to_doubles(), w.to_doubles(), dy.to_doubles(), dx_want, dw_want);

      const auto ys = run_each_kernel("conv2d", {x, w, b}, k.attrs());
      REQUIRE_FALSE(ys.empty());
      for (const auto& [impl, y] : ys) {
        INFO("kernel " << impl);
        direct_runs += impl == "direct";
        winograd_runs += impl == "winograd_f2x3";
        CHECK_ALLCLOSE(y.to_doubles(), round_to(y_want, d), conv_tol(d, k.w[1] * k.w[2] * k.w[3] + 1));
      }
      Attrs da = k.attrs();
      da.set("input_shape", k.x);
      const auto dxs = run_each_kernel("conv2d_backward_data", {dy, w}, da);
      REQUIRE_FALSE(dxs.empty());
      for (const auto& [impl, dx] : dxs) {
        INFO("kernel " << impl);
        winograd_runs += impl == "winograd_f2x3";
        CHECK_ALLCLOSE(dx.to_doubles(), round_to(dx_want, d), conv_tol(d, k.w[0] * k.w[2] * k.w[3]));
      }
      Attrs a = k.attrs();
      a.set("weight_shape", k.w);
      const auto dws = run_each_kernel("conv2d_backward_weight", {dy, x}, a);
      REQUIRE_FALSE(dws.empty());
      for (const auto& [impl, dw] : dws) {
        INFO("kernel " << impl);
        direct_runs += impl == "direct";
        winograd_runs += impl == "winograd_f2x3";
        CHECK_ALLCLOSE(dw.to_doubles(), round_to(dw_want, d),
                       conv_tol(d, k.x[0] * k.y()[2] * k.y()[3]));
      }
    }
  }
  CHECK(direct_runs > 40);  // the direct kernels took the small cases, in every dtype
  // Winograd took every 3x3 stride-1 ungrouped case, forward and both gradients, in f32, f16 and
  // bf16 (not f64).
  CHECK(winograd_runs >= 3 * 3 * 8);
}
