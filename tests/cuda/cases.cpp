// The case table of the backend comparison (compare.hpp): every op the CPU plugin registers, on
// shapes that are odd on purpose (1, 3, 7, 33, 257, 4099: no multiple of 4, 8 or the warp size),
// empty and 0-d tensors, broadcasting patterns, several axes, every attribute that changes the
// code path, special values where docs/ops.md defines what they give, and data a kernel must
// reject. Each case runs in every dtype the CPU registers for its op unless it says otherwise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cuda/compare.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/runtime.hpp"

namespace plexus::test::cmp {

namespace {

constexpr plx_dtype F32 = PLX_F32, F16 = PLX_F16, BF16 = PLX_BF16, I32 = PLX_I32, I64 = PLX_I64,
                    U8 = PLX_U8, F64 = PLX_F64;
const std::vector<plx_dtype> kFloats = {F32, F16, BF16, F64};
const std::vector<plx_dtype> kInts = {I32, I64};
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

using Inputs = std::vector<Input>;
using MakeFn = std::function<Inputs(Gen&)>;

// Shapes print as "(2, 3)", attribute lists as "[1, 2]".
std::string str(const Shape& s) { return shape_string(s); }
std::string list(const Ints& v) { return attr_value_string(AttrValue(v)); }

int64_t numel(const Shape& s) { return shape_numel(s); }

// The shape of output `k` of `op` for inputs of these descriptors (shape inference, no data).
Shape out_shape(const std::string& op, const std::vector<TensorDesc>& ins, const Attrs& attrs,
                int k = 0) {
  const OpSchema& s = runtime().ops().get(op);
  return s.infer_outputs(ins, s.complete_attrs(attrs)).at(static_cast<size_t>(k)).shape;
}

class Table {
 public:
  std::vector<Case> cases;

  Case& add(std::string op, std::string what, Attrs attrs, MakeFn make, int64_t terms = 1) {
    Case c;
    c.op = std::move(op);
    c.what = std::move(what);
    c.attrs = std::move(attrs);
    c.inputs = std::move(make);
    c.terms = terms;
    c.id = static_cast<int64_t>(cases.size());
    cases.push_back(std::move(c));
    return cases.back();
  }
};

// Operands of binary ops: floats in [-1, 1), integers in [-1000, 1000).
Tensor operand(Gen& g, const Shape& s) {
  return dtype_is_float(g.T) ? g.uniform(s) : g.ints(s, g.T, -1000, 1000);
}

// ---- activation ----

const std::vector<Shape> kElementwise = {{},  {1},          {3},    {7, 33},  {257},
                                         {2, 3, 5, 7}, {4099}, {0}, {3, 0, 2}};

void activation(Table& t) {
  for (const Shape& s : kElementwise) {
    const std::string w = "x" + str(s);
    t.add("relu", w, {}, [s](Gen& g) -> Inputs { return {g.uniform(s, -6, 6)}; });
    t.add("relu_backward", w, {}, [s](Gen& g) -> Inputs {
      return {g.uniform(s), g.cpu("relu", {g.uniform(s, -6, 6)}).at(0)};
    });
    for (const char* approx : {"none", "tanh"}) {
      const Attrs a{{"approximate", std::string(approx)}};
      t.add("gelu", w + " " + approx, a, [s](Gen& g) -> Inputs { return {g.uniform(s, -6, 6)}; });
      t.add("gelu_backward", w + " " + approx, a,
            [s](Gen& g) -> Inputs { return {g.uniform(s), g.uniform(s, -6, 6)}; });
    }
    t.add("sigmoid", w, {}, [s](Gen& g) -> Inputs { return {g.uniform(s, -12, 12)}; });
    t.add("sigmoid_backward", w, {}, [s](Gen& g) -> Inputs {
      return {g.uniform(s), g.cpu("sigmoid", {g.uniform(s, -8, 8)}).at(0)};
    });
    t.add("tanh", w, {}, [s](Gen& g) -> Inputs { return {g.uniform(s, -6, 6)}; });
    t.add("tanh_backward", w, {}, [s](Gen& g) -> Inputs {
      return {g.uniform(s), g.cpu("tanh", {g.uniform(s, -4, 4)}).at(0)};
    });
  }
}

// ---- binary ----

void binary(Table& t) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{7, 33}, {7, 33}},       {{257}, {257}},        {{1}, {1}},
      {{}, {}},                 {{4099}, {4099}},      {{2, 3, 4}, {4}},
      {{4}, {2, 3, 4}},         {{5, 1}, {1, 7}},      {{4, 1, 5}, {3, 1}},
      {{}, {3, 4}},             {{3, 4}, {}},          {{2, 1, 3, 1}, {1, 4, 1, 5}},
      {{33, 65}, {65}},         {{33, 65}, {33, 1}},   {{1, 65}, {33, 1}},
      {{0, 3}, {3}},            {{3, 1}, {3, 0}},      {{2, 3, 4, 5, 6}, {3, 1, 5, 1}},
  };
  for (const char* op : {"add", "sub", "mul", "div"}) {
    const bool div = std::string(op) == "div";
    for (const auto& [sa, sb] : shapes) {
      t.add(op, "a" + str(sa) + " b" + str(sb), {}, [sa = sa, sb = sb, div](Gen& g) -> Inputs {
        Tensor b = div ? (dtype_is_float(g.T) ? g.nonzero(sb, 0.25, 2) : g.nonzero(sb, 1, 50))
                       : operand(g, sb);
        return {operand(g, sa), b};
      });
    }
    // Integer overflow wraps (two's complement), MIN / -1 = MIN.
    for (plx_dtype d : kInts) {
      const int64_t lo = d == I32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
      const int64_t hi = d == I32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
      t.add(op, "full integer range, wrapping", {}, [lo, hi, div](Gen& g) -> Inputs {
         Tensor a = g.ints({257}, g.T, lo, hi);
         Tensor b = div ? g.nonzero({257}, 1, 1000) : g.ints({257}, g.T, lo, hi);
         return {a, b};
       }).dtypes = {d};
    }
  }
  for (plx_dtype d : kInts) {
    const int64_t mn = d == I32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
    const int64_t mx = d == I32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
    t.add("div", "truncation toward zero, MIN / -1", {}, [mn, mx](Gen& g) -> Inputs {
       return {g.int_values({9}, {mn, 7, -7, 0, 5, -5, mx, -1, mn}, g.T),
               g.int_values({9}, {-1, -2, 2, 3, -5, 7, -1, 1, 1}, g.T)};
     }).dtypes = {d};
    Case& z = t.add("div", "integer division by zero", {}, [](Gen& g) -> Inputs {
      return {g.int_values({5}, {1, 2, 3, 4, 5}, g.T), g.int_values({5}, {1, 1, 0, 1, 1}, g.T)};
    });
    z.dtypes = {d};
    z.error = true;
  }
  t.add("div", "IEEE division by zero", {}, [](Gen& g) -> Inputs {
     return {g.values({6}, {1, -1, 0, 2, -3, 0.5}), g.values({6}, {0, 0, 0, -0.0, 0, 0.25})};
   }).dtypes = kFloats;

  // scale: floats in the accumulation type; integers exactly (wrapping) for whole alpha and beta,
  // otherwise in f64, truncated and saturated.
  for (const Shape& s : {Shape{7, 33}, Shape{4099}, Shape{}, Shape{0}}) {
    for (auto [alpha, beta] : {std::pair{2.5, -1.0}, {-1.0, 0.0}, {1.0, 0.5}, {3.0, -7.0}}) {
      t.add("scale", "x" + str(s) + " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta),
            {{"alpha", alpha}, {"beta", beta}}, [s](Gen& g) -> Inputs { return {operand(g, s)}; });
    }
  }
  for (plx_dtype d : kInts) {
    const int64_t lo = d == I32 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
    const int64_t hi = d == I32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
    for (auto [alpha, beta] : {std::pair{3.0, -7.0}, {-1.0, 0.0}, {1.5, 0.0}, {0.5, 0.25}}) {
      t.add("scale", "full integer range, alpha " + std::to_string(alpha) + " beta " + std::to_string(beta),
            {{"alpha", alpha}, {"beta", beta}},
            [lo, hi](Gen& g) -> Inputs { return {g.ints({257}, g.T, lo, hi)}; })
          .dtypes = {d};
    }
  }

  // expand: every dtype (pure data movement).
  const std::vector<std::pair<Shape, Shape>> ex = {
      {{3, 1}, {3, 5}},   {{1}, {2, 3, 4}},     {{4}, {3, 4}},       {{2, 1, 3}, {2, 5, 3}},
      {{}, {7}},          {{1, 1}, {33, 65}},   {{5}, {0, 5}},       {{3, 1, 1}, {3, 4, 257}},
      {{7, 33}, {7, 33}}, {{1, 9, 1}, {2, 4, 9, 3}},
  };
  for (const auto& [from, to] : ex) {
    Case& c = t.add("expand", "x" + str(from) + " to " + str(to), {{"shape", Ints(to)}},
                    [from = from](Gen& g) -> Inputs {
                      return {dtype_is_float(g.T) ? g.uniform(from) : g.ints(from, g.T, 0, 100)};
                    });
    c.exact = true;
  }
}

// ---- reduce ----

void reduce(Table& t) {
  struct R {
    Shape shape;
    Ints axes;
    int64_t keepdims;
    double lo, hi;
  };
  const std::vector<R> rs = {
      {{257}, {}, 0, -1, 1},          {{7, 33}, {0}, 0, -1, 1},      {{7, 33}, {1}, 1, -1, 1},
      {{7, 33}, {-1}, 0, -1, 1},      {{7, 33}, {0, 1}, 0, -1, 1},   {{3, 5, 7, 9}, {1, 3}, 0, -1, 1},
      {{3, 5, 7, 9}, {0, 2}, 1, -1, 1}, {{3, 5, 7, 9}, {2}, 0, -1, 1}, {{2, 4099}, {1}, 0, 0, 1},
      {{4099, 3}, {0}, 0, 0, 1},      {{33, 65, 17}, {0, 2}, 0, -1, 1}, {{0, 5}, {0}, 0, -1, 1},
      {{5, 0}, {1}, 1, -1, 1},        {{}, {}, 0, -1, 1},            {{1, 1, 1}, {1}, 0, -1, 1},
      {{2, 3, 4, 5, 6}, {0, 2, 4}, 0, -1, 1}, {{1, 100000}, {1}, 0, 0, 1},
  };
  for (const R& r : rs) {
    int64_t n = 1;
    if (r.axes.empty()) {
      n = numel(r.shape);
    } else {
      for (int64_t a : r.axes) n *= r.shape[static_cast<size_t>(a < 0 ? a + static_cast<int64_t>(r.shape.size()) : a)];
    }
    const Attrs a{{"axes", r.axes}, {"keepdims", r.keepdims}};
    const std::string w = "x" + str(r.shape) + " axes " + list(r.axes) + (r.keepdims ? " keepdims" : "");
    const Shape s = r.shape;
    const double lo = r.lo, hi = r.hi;
    t.add("sum", w, a, [s, lo, hi](Gen& g) -> Inputs {
      return {dtype_is_float(g.T) ? g.uniform(s, lo, hi) : g.ints(s, g.T, -1000, 1000)};
    }, n);
    t.add("mean", w, a, [s, lo, hi](Gen& g) -> Inputs { return {g.uniform(s, lo, hi)}; }, n);
  }
  // Integer sums accumulate in i64 and wrap.
  t.add("sum", "full i32 range, wrapping", {{"axes", Ints{1}}}, [](Gen& g) -> Inputs {
     return {g.ints({7, 257}, g.T, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max())};
   }).dtypes = {I32};

  struct A {
    Shape shape;
    int64_t axis, keepdims;
  };
  const std::vector<A> as = {{{257}, 0, 0},      {{7, 33}, 0, 0},       {{7, 33}, -1, 1},
                             {{3, 5, 7, 9}, 1, 0}, {{3, 5, 7, 9}, 2, 1}, {{2, 4099}, 1, 0},
                             {{4099, 3}, 0, 0},  {{}, 0, 0},           {{5, 0}, 0, 0},
                             {{1, 100000}, -1, 0}};
  for (const A& r : as) {
    const Attrs a{{"axis", r.axis}, {"keepdims", r.keepdims}};
    const std::string w = "x" + str(r.shape) + " axis " + std::to_string(r.axis) + (r.keepdims ? " keepdims" : "");
    const Shape s = r.shape;
    t.add("argmax", w, a, [s](Gen& g) -> Inputs { return {operand(g, s)}; });
    // Ties: the first index of the maximum wins.
    t.add("argmax", w + " ties", a, [s](Gen& g) -> Inputs { return {g.ints(s, g.T, 0, 3)}; });
  }
  // NaN counts as the maximum, the first NaN wins.
  t.add("argmax", "NaN and infinities", {{"axis", int64_t{1}}}, [](Gen& g) -> Inputs {
     return {g.with_specials({9, 33}, -1, 1, {kInf, kNaN, -kInf, kNaN}, 7)};
   }).dtypes = kFloats;
}

// ---- conv ----

struct ConvCfg {
  Shape x;  // N, C, H, W
  int64_t o, kh, kw;
  Ints stride, padding, dilation;
  int64_t groups;
  bool bias;
};

void conv(Table& t) {
  const std::vector<ConvCfg> cfgs = {
      {{2, 3, 7, 9}, 4, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
      {{1, 4, 8, 8}, 6, 3, 3, {2, 2}, {1, 1}, {1, 1}, 2, true},
      {{2, 3, 11, 10}, 5, 3, 2, {1, 2}, {2, 1}, {2, 1}, 1, true},
      {{3, 16, 5, 5}, 8, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false},   // 1x1
      {{2, 8, 7, 7}, 16, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, true},    // 1x1, stride 2
      {{2, 8, 9, 9}, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 8, true},     // depthwise
      {{2, 6, 8, 8}, 4, 3, 3, {2, 2}, {2, 2}, {2, 2}, 2, false},    // groups, dilation, stride
      {{2, 33, 17, 17}, 17, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {{1, 1, 1, 1}, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},
      {{2, 5, 13, 11}, 7, 5, 5, {3, 3}, {2, 2}, {1, 1}, 1, false},
      {{0, 3, 5, 5}, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},     // empty batch
      {{2, 64, 14, 14}, 128, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},  // a convnet layer
      {{1, 3, 32, 32}, 8, 7, 7, {2, 2}, {3, 3}, {1, 1}, 1, true},
  };
  for (const ConvCfg& c : cfgs) {
    const Shape w = {c.o, c.x[1] / c.groups, c.kh, c.kw};
    const Attrs geo{{"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation}, {"groups", c.groups}};
    const Shape y = out_shape("conv2d", {{F32, c.x}, {F32, w}}, geo);
    const std::string what = "x" + str(c.x) + " w" + str(w) + " stride " + list(c.stride) + " padding " +
                             list(c.padding) + " dilation " + list(c.dilation) + " groups " +
                             std::to_string(c.groups) + (c.bias ? " bias" : "");
    const Shape xs = c.x;
    const bool bias = c.bias;
    const int64_t o = c.o;
    Case& f = t.add("conv2d", what, geo, [xs, w, bias, o](Gen& g) -> Inputs {
      return {g.uniform(xs), g.uniform(w), bias ? g.uniform({o}) : Tensor()};
    }, w[1] * c.kh * c.kw + 1);
    f.tf32 = true;
    Attrs da = geo;
    da.set("input_shape", Ints(c.x));
    Case& bd = t.add("conv2d_backward_data", what, da, [y, w](Gen& g) -> Inputs {
      return {g.uniform(y), g.uniform(w)};
    }, (c.o / c.groups) * c.kh * c.kw);
    bd.tf32 = true;
    Attrs wa = geo;
    wa.set("weight_shape", Ints(w));
    Case& bw = t.add("conv2d_backward_weight", what, wa, [y, xs](Gen& g) -> Inputs {
      return {g.uniform(y), g.uniform(xs)};
    }, std::max<int64_t>(1, y[0] * y[2] * y[3]));
    bw.tf32 = true;
  }
}

// ---- pool ----

struct PoolCfg {
  Shape x;
  Ints kernel, stride, padding, dilation;
  int64_t ceil;
};

Attrs pool_attrs(const PoolCfg& c, bool max) {
  Attrs a{{"kernel", c.kernel}, {"stride", c.stride}, {"padding", c.padding}, {"ceil_mode", c.ceil}};
  if (max) a.set("dilation", c.dilation);
  return a;
}

std::string pool_what(const PoolCfg& c, bool max) {
  std::string w = "x" + str(c.x) + " kernel " + list(c.kernel) + " stride " + list(c.stride) +
                  " padding " + list(c.padding);
  if (max) w += " dilation " + list(c.dilation);
  if (c.ceil) w += " ceil_mode";
  return w;
}

void pool(Table& t) {
  const std::vector<PoolCfg> maxes = {
      {{2, 3, 8, 8}, {2, 2}, {}, {0, 0}, {1, 1}, 0},
      {{2, 3, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 0},
      {{1, 2, 7, 7}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, 1},
      {{2, 3, 10, 9}, {3, 3}, {1, 1}, {1, 1}, {2, 2}, 0},
      {{1, 4, 5, 6}, {3, 2}, {1, 2}, {0, 0}, {1, 1}, 0},
      {{1, 2, 2, 2}, {2, 2}, {1, 1}, {1, 1}, {3, 3}, 0},  // windows of padding only: -inf, -1
      {{2, 3, 6, 7}, {2, 2}, {1, 1}, {1, 1}, {3, 3}, 1},
      {{2, 16, 33, 33}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 0},
      {{2, 3, 8, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      {{0, 3, 4, 4}, {2, 2}, {}, {0, 0}, {1, 1}, 0},
      {{1, 1, 1, 1}, {1, 1}, {}, {0, 0}, {1, 1}, 0},
      {{1, 2, 1, 257}, {1, 3}, {1, 2}, {0, 1}, {1, 1}, 1},
  };
  for (const PoolCfg& c : maxes) {
    const Attrs a = pool_attrs(c, true);
    const std::string w = pool_what(c, true);
    const Shape xs = c.x;
    t.add("max_pool2d", w, a, [xs](Gen& g) -> Inputs { return {g.uniform(xs)}; });
    t.add("max_pool2d", w + " ties", a, [xs](Gen& g) -> Inputs { return {g.ints(xs, g.T, 0, 3)}; });
    // The indices carry a ReLU's mask: -1 where the maximum is not positive.
    Attrs rm = a;
    rm.set("relu_mask", int64_t{1});
    t.add("max_pool2d", w + " relu_mask", rm, [xs](Gen& g) -> Inputs { return {g.uniform(xs)}; });
    // u8 taps in the window (reverse mode's choice for windows of at most 255 taps).
    Attrs wi = rm;
    wi.set("window_index", int64_t{1});
    t.add("max_pool2d", w + " window_index", wi, [xs](Gen& g) -> Inputs { return {g.uniform(xs)}; });
    Attrs ba = a;
    ba.set("input_shape", Ints(c.x));
    const int64_t k = c.kernel[0] * c.kernel[1];
    // Indices as the forward makes them (overlapping windows send several to one input).
    t.add("max_pool2d_backward", w, ba, [xs, a](Gen& g) -> Inputs {
      const Tensor idx = g.cpu("max_pool2d", {g.uniform(xs)}, a).at(1);
      return {g.uniform(idx.shape()), idx};
    }, k);
    Attrs bu = ba;
    bu.set("window_index", int64_t{1});
    Attrs au = a;
    au.set("window_index", int64_t{1});
    au.set("relu_mask", int64_t{1});
    t.add("max_pool2d_backward", w + " window_index", bu, [xs, au](Gen& g) -> Inputs {
      const Tensor idx = g.cpu("max_pool2d", {g.uniform(xs)}, au).at(1);
      return {g.uniform(idx.shape()), idx};
    }, k);
  }
  t.add("max_pool2d", "NaN and infinities", {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}},
        [](Gen& g) -> Inputs {
          return {g.with_specials({2, 3, 9, 9}, -1, 1, {kNaN, kInf, -kInf, kNaN}, 9)};
        })
      .dtypes = kFloats;

  struct AvgCfg {
    PoolCfg p;
    int64_t include_pad;
  };
  const std::vector<AvgCfg> avgs = {
      {{{2, 3, 8, 8}, {2, 2}, {}, {0, 0}, {1, 1}, 0}, 1},
      {{{2, 3, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 0}, 1},
      {{{2, 3, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 0}, 0},
      {{{1, 2, 7, 7}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, 1}, 1},
      {{{1, 2, 6, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 1}, 1},
      {{{1, 2, 6, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 1}, 0},
      {{{1, 4, 5, 6}, {3, 2}, {1, 2}, {0, 0}, {1, 1}, 0}, 1},
      {{{2, 16, 33, 33}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 0}, 0},
      {{{0, 3, 4, 4}, {2, 2}, {}, {0, 0}, {1, 1}, 0}, 1},
      {{{1, 1, 1, 1}, {1, 1}, {}, {0, 0}, {1, 1}, 0}, 1},
      {{{1, 2, 1, 257}, {1, 3}, {1, 2}, {0, 1}, {1, 1}, 1}, 0},
  };
  for (const AvgCfg& c : avgs) {
    Attrs a = pool_attrs(c.p, false);
    a.set("count_include_pad", c.include_pad);
    const std::string w = pool_what(c.p, false) + (c.include_pad ? " count_include_pad" : "");
    const Shape xs = c.p.x;
    const int64_t k = c.p.kernel[0] * c.p.kernel[1];
    t.add("avg_pool2d", w, a, [xs](Gen& g) -> Inputs { return {g.uniform(xs)}; }, k);
    Attrs ba = a;
    ba.set("input_shape", Ints(c.p.x));
    const Shape y = out_shape("avg_pool2d", {{F32, xs}}, a);
    t.add("avg_pool2d_backward", w, ba, [y](Gen& g) -> Inputs { return {g.uniform(y)}; }, k);
  }
}

// ---- gemm ----

void gemm(Table& t) {
  struct M {
    Shape a, b;
    int64_t ta, tb;
    double alpha;
  };
  const std::vector<M> ms = {
      {{1, 1}, {1, 1}, 0, 0, 1},          {{3, 7}, {7, 5}, 0, 0, 1},
      {{33, 65}, {65, 17}, 0, 0, 1},      {{65, 33}, {65, 17}, 1, 0, 1},
      {{33, 65}, {17, 65}, 0, 1, 1},      {{65, 33}, {17, 65}, 1, 1, 1},
      {{64, 128}, {128, 32}, 0, 0, 1},    {{257, 31}, {31, 129}, 0, 0, 1},
      {{7, 9}, {9, 5}, 0, 0, 0.5},        {{2, 3, 4}, {2, 4, 5}, 0, 0, 1},
      {{3, 1, 4, 5}, {2, 5, 6}, 0, 0, 1}, {{5, 4, 6}, {6, 7}, 0, 0, 1},
      {{5, 4, 6}, {7, 6}, 0, 1, -2},      {{2, 4, 3}, {2, 4, 5}, 1, 0, 1},
      {{3, 0}, {0, 4}, 0, 0, 1},          {{0, 5}, {5, 3}, 0, 0, 1},
      {{8, 2048}, {2048, 8}, 0, 0, 1},    {{4, 1, 3}, {1, 3, 1}, 1, 1, 1},
      {{2, 3, 33, 17}, {3, 17, 9}, 0, 0, 1},
  };
  for (const M& m : ms) {
    const int64_t k = m.ta ? m.a[m.a.size() - 2] : m.a.back();
    Case& c = t.add("matmul",
                    "a" + str(m.a) + " b" + str(m.b) + (m.ta ? " trans_a" : "") + (m.tb ? " trans_b" : "") +
                        (m.alpha != 1 ? " alpha " + std::to_string(m.alpha) : ""),
                    {{"trans_a", m.ta}, {"trans_b", m.tb}, {"alpha", m.alpha}},
                    [a = m.a, b = m.b](Gen& g) -> Inputs { return {g.uniform(a), g.uniform(b)}; },
                    std::max<int64_t>(k, 1));
    c.tf32 = true;
  }
  struct L {
    Shape x;
    int64_t out;
    bool bias;
  };
  const std::vector<L> ls = {{{7, 33}, 17, true},   {{33}, 5, true},      {{2, 3, 16}, 8, false},
                             {{0, 4}, 3, true},     {{128, 256}, 64, true}, {{1, 1}, 1, true},
                             {{9, 257}, 31, false}};
  for (const L& l : ls) {
    const int64_t in = l.x.back();
    Case& c = t.add("linear", "x" + str(l.x) + " out " + std::to_string(l.out) + (l.bias ? " bias" : ""), {},
                    [l](Gen& g) -> Inputs {
                      return {g.uniform(l.x), g.uniform({l.out, l.x.back()}), l.bias ? g.uniform({l.out}) : Tensor()};
                    },
                    in + 1);
    c.tf32 = true;
  }
}

// ---- softmax ----

void softmax(Table& t) {
  struct S {
    Shape shape;
    int64_t axis;
    double range;
  };
  const std::vector<S> ss = {{{7, 33}, -1, 5},     {{7, 33}, 0, 5},      {{2, 3, 257}, 1, 5},
                             {{4, 1000}, -1, 5},   {{5}, 0, 5},          {{}, 0, 5},
                             {{0, 3}, -1, 5},      {{2, 5, 3, 4}, 2, 5}, {{1, 4099}, -1, 5},
                             {{7, 33}, -1, 50},    {{3, 1}, -1, 5},      {{64, 32}, 1, 5}};
  for (const S& s : ss) {
    const Shape x = s.shape;
    const double r = s.range;
    const Attrs a{{"axis", s.axis}};
    const int64_t n = x.empty() ? 1 : x[static_cast<size_t>(s.axis < 0 ? s.axis + static_cast<int64_t>(x.size()) : s.axis)];
    const std::string w = "x" + str(x) + " axis " + std::to_string(s.axis) + " range " + std::to_string(static_cast<int>(r));
    for (const char* op : {"softmax", "log_softmax"}) {
      const std::string fwd = op;
      t.add(fwd, w, a, [x, r](Gen& g) -> Inputs { return {g.uniform(x, -r, r)}; }, n);
      t.add(fwd + "_backward", w, a, [x, r, fwd, a](Gen& g) -> Inputs {
        return {g.uniform(x), g.cpu(fwd, {g.uniform(x, -r, r)}, a).at(0)};
      }, n);
    }
  }
  // -inf entries; a lane of -inf only gives NaN.
  for (const char* op : {"softmax", "log_softmax"}) {
    t.add(op, "-inf entries and a lane of -inf only", {{"axis", int64_t{-1}}}, [](Gen& g) -> Inputs {
       std::vector<double> v = g.doubles(4 * 7, -3, 3);
       for (int i = 0; i < 7; ++i) v[7 + i] = -kInf;  // row 1
       v[0] = v[16] = v[27] = -kInf;
       return {g.values({4, 7}, v)};
     }).dtypes = kFloats;
  }

  // softmax_cross_entropy and its backward.
  struct X {
    int64_t n, c;
    std::string reduction;
    plx_dtype labels;
    int64_t ignore_index;
    double smoothing;
    int ignore_every;  // about one row in this many has label == ignore_index (0: none)
    double range;
  };
  std::vector<X> xs;
  for (auto [n, c] : {std::pair<int64_t, int64_t>{1, 1}, {7, 10}, {33, 257}, {64, 1000}, {5, 3}})
    for (const char* red : {"mean", "sum", "none"})
      xs.push_back({n, c, red, I32, -100, 0.0, 4, 3});
  xs.push_back({7, 10, "mean", I64, -100, 0.1, 4, 3});
  xs.push_back({33, 257, "sum", I64, 3, 0.25, 4, 3});  // ignore_index is a valid class
  xs.push_back({7, 10, "none", I32, -100, 1.0, 3, 3});
  xs.push_back({64, 1000, "mean", I32, -100, 0.0, 5, 10});
  xs.push_back({4099, 3, "mean", I64, -100, 0.05, 6, 3});
  for (const char* red : {"mean", "sum", "none"})
    xs.push_back({5, 3, red, I32, -100, 0.0, 1, 3});  // every row ignored
  for (const X& x : xs) {
    Attrs a{{"reduction", x.reduction}, {"ignore_index", x.ignore_index}, {"label_smoothing", x.smoothing}};
    const std::string w = "logits(" + std::to_string(x.n) + ", " + std::to_string(x.c) + ") labels " +
                          dtype_name(x.labels) + " " + x.reduction + " ignore_index " +
                          std::to_string(x.ignore_index) + " smoothing " + std::to_string(x.smoothing) +
                          (x.ignore_every == 1 ? " all rows ignored" : "");
    const int64_t terms = x.reduction == "none" ? x.c : x.n * x.c;
    auto labels = [x](Gen& g) {
      if (x.ignore_every == 0) return g.ints({x.n}, x.labels, 0, x.c);
      return g.ints_with({x.n}, x.labels, 0, x.c, x.ignore_index, x.ignore_every);
    };
    t.add("softmax_cross_entropy", w, a, [x, labels](Gen& g) -> Inputs {
      return {g.uniform({x.n, x.c}, -x.range, x.range), labels(g)};
    }, terms);
    const Shape dloss = x.reduction == "none" ? Shape{x.n} : Shape{};
    t.add("softmax_cross_entropy_backward", w, a, [x, labels, dloss](Gen& g) -> Inputs {
      const Tensor lp = g.cpu("log_softmax", {g.uniform({x.n, x.c}, -x.range, x.range)}, {{"axis", int64_t{1}}}).at(0);
      return {g.uniform(dloss), lp, labels(g)};
    }, x.c);
  }
  // Labels outside [0, C) that are not ignore_index: both ops must fail.
  for (int64_t bad : {int64_t{10}, int64_t{-5}}) {
    Case& f = t.add("softmax_cross_entropy", "label " + std::to_string(bad) + " of 10 classes", {},
                    [bad](Gen& g) -> Inputs {
                      return {g.uniform({4, 10}), g.int_values({4}, {1, bad, 2, 3}, I32)};
                    });
    f.error = true;
    Case& b = t.add("softmax_cross_entropy_backward", "label " + std::to_string(bad) + " of 10 classes", {},
                    [bad](Gen& g) -> Inputs {
                      const Tensor lp = g.cpu("log_softmax", {g.uniform({4, 10})}, {{"axis", int64_t{1}}}).at(0);
                      return {g.uniform({}), lp, g.int_values({4}, {1, 2, bad, 3}, I64)};
                    });
    b.error = true;
  }
}

// ---- norm ----

void norm(Table& t) {
  struct B {
    Shape x;
    bool gamma, beta, running;
    int64_t training;
    double momentum, eps;
    bool f32_params;  // f32 parameters and statistics with 16-bit x
  };
  const std::vector<B> bs = {
      {{4, 3}, true, true, true, 1, 0.1, 1e-5, false},
      {{2, 3, 5, 7}, true, true, false, 1, 0.1, 1e-5, false},
      {{2, 3, 5, 7}, false, false, true, 1, 0.1, 1e-5, false},
      {{8, 16, 9, 9}, true, true, true, 1, 0.3, 1e-5, false},
      {{2, 5, 3, 3}, true, true, true, 0, 0.1, 1e-5, false},
      {{3, 4, 1, 1}, true, false, true, 1, 0.1, 1e-5, false},
      {{2, 3, 5, 7}, false, false, true, 0, 0.1, 1e-5, false},
      {{16, 7, 33}, true, true, true, 1, 0.1, 1e-3, false},
      {{2, 3, 5, 7}, true, true, true, 1, 0.1, 1e-5, true},
      {{2, 3, 5, 7}, true, true, true, 0, 0.1, 1e-5, true},
      {{64, 33}, true, true, true, 1, 0.1, 1e-5, false},
      {{0, 3, 2, 2}, true, true, true, 0, 0.1, 1e-5, false},
  };
  for (const B& b : bs) {
    const Attrs a{{"training", b.training}, {"momentum", b.momentum}, {"eps", b.eps}};
    const std::string w = "x" + str(b.x) + (b.training ? " training" : " eval") +
                          (b.gamma ? " gamma" : "") + (b.beta ? " beta" : "") +
                          (b.running ? " running stats" : "") + (b.f32_params ? " f32 params" : "") +
                          " momentum " + std::to_string(b.momentum) + " eps " + std::to_string(b.eps);
    const int64_t per_channel = b.x[1] ? numel(b.x) / b.x[1] : 1;
    const Shape ch = {b.x[1]};
    // x is offset from zero so that a one-pass variance would lose digits.
    auto params = [b, ch](Gen& g) {
      const plx_dtype pd = b.f32_params ? F32 : g.T;
      Inputs in = {b.gamma ? g.uniform(ch, 0.5, 1.5, pd) : Tensor(), b.beta ? g.uniform(ch, -0.5, 0.5, pd) : Tensor(),
                   b.running ? g.uniform(ch, -0.5, 0.5, pd) : Tensor(), b.running ? g.uniform(ch, 0.5, 2, pd) : Tensor()};
      return in;
    };
    Case& f = t.add("batch_norm", w, a, [b, params](Gen& g) -> Inputs {
      Inputs in = {g.uniform(b.x, 2, 4)};
      for (Input& p : params(g)) in.push_back(p);
      return in;
    }, per_channel);
    if (b.f32_params) f.dtypes = {F16, BF16};
    const Attrs ba{{"training", b.training}, {"eps", b.eps}};
    Case& bw = t.add("batch_norm_backward", w, ba, [b, params, a](Gen& g) -> Inputs {
      const Tensor x = g.uniform(b.x, 2, 4);
      Inputs p = params(g);
      const auto fwd = g.cpu("batch_norm", {x, p[0].tensor, p[1].tensor, p[2].tensor, p[3].tensor}, a);
      return {g.uniform(b.x), x, p[0], fwd.at(1), fwd.at(2)};
    }, per_channel);
    if (b.f32_params) bw.dtypes = {F16, BF16};
    // What backward recomputes batch_norm's output with: the saved statistics of a CPU forward.
    Case& ap = t.add("batch_norm_apply", w, {}, [b, params, a](Gen& g) -> Inputs {
      const Tensor x = g.uniform(b.x, 2, 4);
      Inputs p = params(g);
      const auto fwd = g.cpu("batch_norm", {x, p[0].tensor, p[1].tensor, p[2].tensor, p[3].tensor}, a);
      return {x, p[0], p[1], fwd.at(1), fwd.at(2)};
    });
    if (b.f32_params) ap.dtypes = {F16, BF16};
  }

  struct L {
    Shape x;
    int64_t nd;
    bool gamma, beta, f32_params;
  };
  const std::vector<L> ls = {{{7, 33}, 1, true, true, false},      {{2, 3, 5, 7}, 2, true, true, false},
                             {{4, 1000}, 1, true, false, false},   {{3, 5}, 2, false, false, false},
                             {{1, 1}, 1, true, true, false},       {{5, 4099}, 1, true, true, false},
                             {{2, 3, 4}, 1, true, true, true},     {{0, 8}, 1, true, true, false},
                             {{2, 3, 5, 7}, 3, false, true, false}, {{257}, 1, true, true, false}};
  for (const L& l : ls) {
    const Attrs a{{"normalized_ndim", l.nd}, {"eps", 1e-5}};
    const Shape norm(l.x.end() - l.nd, l.x.end());
    const std::string w = "x" + str(l.x) + " normalized_ndim " + std::to_string(l.nd) + (l.gamma ? " gamma" : "") +
                          (l.beta ? " beta" : "") + (l.f32_params ? " f32 params" : "");
    auto params = [l, norm](Gen& g) {
      const plx_dtype pd = l.f32_params ? F32 : g.T;
      return Inputs{l.gamma ? g.uniform(norm, 0.5, 1.5, pd) : Tensor(), l.beta ? g.uniform(norm, -0.5, 0.5, pd) : Tensor()};
    };
    Case& f = t.add("layer_norm", w, a, [l, params](Gen& g) -> Inputs {
      Inputs p = params(g);
      return {g.uniform(l.x, 2, 4), p[0], p[1]};
    }, std::max<int64_t>(1, numel(norm)));
    if (l.f32_params) f.dtypes = {F16, BF16};
    Case& bw = t.add("layer_norm_backward", w, a, [l, params, a](Gen& g) -> Inputs {
      const Tensor x = g.uniform(l.x, 2, 4);
      Inputs p = params(g);
      const auto fwd = g.cpu("layer_norm", {x, p[0].tensor, p[1].tensor}, a);
      return {g.uniform(l.x), x, p[0], fwd.at(1), fwd.at(2)};
    }, std::max<int64_t>({1, numel(l.x) / std::max<int64_t>(1, numel(norm)), numel(norm)}));
    if (l.f32_params) bw.dtypes = {F16, BF16};
  }
}

// ---- misc ----

std::vector<double> float_specials() {
  return {kNaN,    kInf,      -kInf,     0.0,       -0.0,      0.5,        -0.5,
          1.5,     2.5,       -2.7,      255.5,     256,       -1,         65504,
          65520,   70000,     1e10,      -1e10,     3e38,      -3e38,      1e-8,
          2147483647.0, 2147483648.0, -2147483649.0, 9.3e18, -9.3e18, 16777217,
          1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30),   // f64 -> f16 must not round twice
          1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30),    // f64 -> bf16 likewise
          1 + std::ldexp(1.0, -24) + std::ldexp(1.0, -40)};  // f64 -> f32
}

std::vector<int64_t> int_specials(plx_dtype d) {
  if (d == U8) return {0, 1, 127, 128, 254, 255};
  // 2^30 + 2^22 + 1 is just above a tie in bf16 but exactly on one once rounded to f32: an
  // integer -> bf16 cast through f32 rounds it twice, to the wrong neighbour.
  std::vector<int64_t> v = {0, 1, -1, 127, 128, 255, 256, -128, -129, 65504, 70000, 16777217,
                            (int64_t{1} << 30) + (int64_t{1} << 22) + 1,
                            -((int64_t{1} << 30) + (int64_t{1} << 22) + 1),
                            std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
  if (d == I64) {
    for (int64_t x : {int64_t{1} << 40, -(int64_t{1} << 40), (int64_t{1} << 53) + 1,
                      (int64_t{1} << 40) + (int64_t{1} << 32) + 1, (int64_t{1} << 60) + (int64_t{1} << 36) + 1,
                      std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()})
      v.push_back(x);
  }
  return v;
}

void misc(Table& t) {
  const std::vector<plx_dtype> all = {F32, F16, BF16, I32, I64, U8, F64};
  auto any_values = [](Gen& g, const Shape& s) {
    return dtype_is_float(g.T) ? g.uniform(s, -100, 100) : g.ints(s, g.T, 0, 100);
  };
  // copy: contiguous, and views its kernels must read through strides.
  for (const Shape& s : {Shape{7, 33}, Shape{4099}, Shape{}, Shape{0, 3}}) {
    t.add("copy", "x" + str(s), {}, [s, any_values](Gen& g) -> Inputs { return {any_values(g, s)}; }).exact = true;
  }
  t.add("copy", "x(3, 4, 5) permuted (2, 0, 1)", {}, [any_values](Gen& g) -> Inputs {
     return {Input(any_values(g, {3, 4, 5}), [](const Tensor& x) { return x.permute({2, 0, 1}); })};
   }).exact = true;
  t.add("copy", "x(8, 9) narrowed to columns 2..6", {}, [any_values](Gen& g) -> Inputs {
     return {Input(any_values(g, {8, 9}), [](const Tensor& x) { return x.narrow(1, 2, 5); })};
   }).exact = true;
  t.add("copy", "x(4, 6, 33) permuted (1, 0, 2) then narrowed", {}, [any_values](Gen& g) -> Inputs {
     return {Input(any_values(g, {4, 6, 33}), [](const Tensor& x) { return x.permute({1, 0, 2}).narrow(0, 1, 3); })};
   }).exact = true;
  t.add("copy", "x(33, 65) transposed", {}, [any_values](Gen& g) -> Inputs {
     return {Input(any_values(g, {33, 65}), [](const Tensor& x) { return x.permute({1, 0}); })};
   }).exact = true;

  // cast: every pair, with the values whose rounding, truncation or saturation is defined.
  for (plx_dtype from : all) {
    for (plx_dtype to : all) {
      Case& c = t.add("cast", std::string(dtype_name(from)) + " to " + dtype_name(to),
                      {{"dtype", std::string(dtype_name(to))}}, [](Gen& g) -> Inputs {
                        if (dtype_is_float(g.T)) return {g.with_specials({257}, -300, 300, float_specials(), 9)};
                        const std::vector<int64_t> sp = int_specials(g.T);
                        Tensor body = g.T == U8 ? g.ints({257}, U8, 0, 256) : g.ints({257}, g.T, -100000, 100000);
                        std::vector<int64_t> v(257);
                        const std::vector<double> b = body.to_doubles();
                        for (size_t i = 0; i < v.size(); ++i)
                          v[i] = i < sp.size() ? sp[i] : static_cast<int64_t>(b[i]);
                        return {g.int_values({257}, v, g.T)};
                      });
      c.dtypes = {from};
      c.exact = true;
    }
  }

  // dropout: the same Philox stream on every backend, so masks match exactly.
  struct D {
    Shape s;
    double p;
    int64_t seed, offset, training;
  };
  const std::vector<D> ds = {{{4099}, 0.5, 1, 0, 1},
                             {{7, 33}, 0.1, 123456789012, 7, 1},
                             {{257}, 0.0, 5, 0, 1},
                             {{3, 5, 7}, 0.9, (int64_t{1} << 40) + 3, int64_t{1} << 33, 1},
                             {{1}, 0.5, 0, 0, 1},
                             {{0}, 0.5, 3, 0, 1},
                             {{7, 33}, 0.3, 9, 1, 0},
                             {{65, 129}, 0.25, -1, -2, 1}};
  for (const D& d : ds) {
    const Attrs a{{"p", d.p}, {"seed", d.seed}, {"offset", d.offset}, {"training", d.training}};
    const std::string w = "x" + str(d.s) + " p " + std::to_string(d.p) + " seed " + std::to_string(d.seed) +
                          " offset " + std::to_string(d.offset) + (d.training ? "" : " eval");
    const Shape s = d.s;
    t.add("dropout", w, a, [s](Gen& g) -> Inputs { return {g.uniform(s)}; });
    t.add("dropout_backward", "dy" + str(s) + " p " + std::to_string(d.p), {{"p", d.p}},
          [s](Gen& g) -> Inputs { return {g.uniform(s), g.ints(s, U8, 0, 2)}; });
  }
  t.add("dropout", "NaN kept and dropped", {{"p", 0.5}, {"seed", int64_t{11}}}, [](Gen& g) -> Inputs {
     return {g.with_specials({257}, -1, 1, {kNaN, kInf, -kInf}, 5)};
   }).dtypes = kFloats;

  // embedding: index rows of any width; padding_idx still reads its row forward.
  struct E {
    int64_t v, d;
    Shape idx;
    plx_dtype idx_dtype;
    int64_t padding_idx;
  };
  const std::vector<E> es = {{10, 3, {5}, I32, -1},        {1000, 33, {2, 3}, I64, -1},
                             {7, 1, {}, I32, -1},          {10, 3, {0}, I64, -1},
                             {50, 257, {4, 7}, I32, 2},    {3, 4099, {2}, I64, 0},
                             {5, 3, {20}, I64, 1},         {50, 33, {2, 100}, I32, -1},
                             {1000, 8, {7}, I32, 999},     {20, 64, {3, 11}, I64, 4}};
  for (const E& e : es) {
    const Attrs fa{{"padding_idx", e.padding_idx}};
    const std::string w = "weight(" + std::to_string(e.v) + ", " + std::to_string(e.d) + ") indices " +
                          dtype_name(e.idx_dtype) + str(e.idx) + " padding_idx " + std::to_string(e.padding_idx);
    t.add("embedding", w, fa, [e](Gen& g) -> Inputs {
      return {g.uniform({e.v, e.d}), g.ints(e.idx, e.idx_dtype, 0, e.v)};
    });
    Shape dy = e.idx;
    dy.push_back(e.d);
    const Attrs ba{{"num_weights", e.v}, {"padding_idx", e.padding_idx}};
    t.add("embedding_backward", w, ba, [e, dy](Gen& g) -> Inputs {
      return {g.uniform(dy), g.ints(e.idx, e.idx_dtype, 0, e.v)};
    }, std::max<int64_t>(1, numel(e.idx)));
  }
  for (int64_t bad : {int64_t{10}, int64_t{-1}}) {
    t.add("embedding", "index " + std::to_string(bad) + " of 10 rows", {}, [bad](Gen& g) -> Inputs {
       return {g.uniform({10, 3}), g.int_values({4}, {0, 9, bad, 1}, I64)};
     }).error = true;
    t.add("embedding_backward", "index " + std::to_string(bad) + " of 10 rows", {{"num_weights", int64_t{10}}},
          [bad](Gen& g) -> Inputs { return {g.uniform({4, 3}), g.int_values({4}, {0, bad, 9, 1}, I32)}; })
        .error = true;
  }
}

// ---- optim ----

void optim(Table& t) {
  struct S {
    Shape s;
    double momentum, dampening, wd;
    int64_t nesterov;
    bool buf;
    Shape lr_shape;
    plx_dtype lr_dtype;
  };
  std::vector<S> ss;
  for (const Shape& s : {Shape{1}, Shape{7, 33}, Shape{4099}, Shape{0}}) {
    ss.push_back({s, 0, 0, 0, 0, false, {}, F32});
    ss.push_back({s, 0.9, 0, 0, 0, true, {}, F32});
    ss.push_back({s, 0.9, 0, 0.01, 1, true, {1}, F32});
  }
  ss.push_back({{257}, 0, 0, 0, 0, true, {}, F32});  // momentum 0: the buffer is left alone
  ss.push_back({{257}, 0.9, 0.1, 0, 0, true, {}, F64});
  ss.push_back({{257}, 0, 0, 0.05, 0, false, {1}, F64});
  ss.push_back({{33, 65}, 0.5, 0, 0.001, 0, true, {}, F32});
  for (const S& s : ss) {
    const Attrs a{{"momentum", s.momentum}, {"dampening", s.dampening}, {"weight_decay", s.wd}, {"nesterov", s.nesterov}};
    const std::string w = "param" + str(s.s) + " momentum " + std::to_string(s.momentum) + " dampening " +
                          std::to_string(s.dampening) + " weight_decay " + std::to_string(s.wd) +
                          (s.nesterov ? " nesterov" : "") + (s.buf ? " buffer" : "") + " lr " +
                          dtype_name(s.lr_dtype) + str(s.lr_shape);
    t.add("sgd_update", w, a, [s](Gen& g) -> Inputs {
      return {g.uniform(s.s), g.uniform(s.s), s.buf ? g.uniform(s.s, -0.1, 0.1) : Tensor(),
              g.scalar(0.05, s.lr_dtype, s.lr_shape)};
    });
  }
  struct A {
    Shape s;
    double step, beta1, beta2, eps, wd;
    plx_dtype lr_dtype;
  };
  const std::vector<A> as = {{{1}, 1, 0.9, 0.999, 1e-8, 0.01, F32},      {{7, 33}, 1, 0.9, 0.999, 1e-8, 0.01, F32},
                             {{4099}, 10, 0.9, 0.999, 1e-8, 0.0, F32},   {{257}, 1000, 0.5, 0.9, 1e-3, 0.1, F64},
                             {{0}, 3, 0.9, 0.999, 1e-8, 0.01, F32},      {{33, 65}, 7, 0.0, 0.0, 1e-8, 0.01, F64}};
  for (const A& s : as) {
    const Attrs a{{"beta1", s.beta1}, {"beta2", s.beta2}, {"eps", s.eps}, {"weight_decay", s.wd}};
    const std::string w = "param" + str(s.s) + " step " + std::to_string(s.step) + " beta1 " + std::to_string(s.beta1) +
                          " beta2 " + std::to_string(s.beta2) + " eps " + std::to_string(s.eps) + " weight_decay " +
                          std::to_string(s.wd) + " lr " + dtype_name(s.lr_dtype);
    t.add("adamw_update", w, a, [s](Gen& g) -> Inputs {
      return {g.uniform(s.s), g.uniform(s.s), g.uniform(s.s, -0.1, 0.1), g.uniform(s.s, 0, 0.01),
              g.scalar(1e-3, s.lr_dtype, {1}), g.scalar(s.step, s.lr_dtype)};
    });
  }
  // f16's gradient check: the update runs when it is finite and leaves every tensor alone when
  // it is not (a skipped AdamW step with a step below 1 is no error either).
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (double check : {3.5, -1e30, inf, -inf, nan}) {
    const std::string w = "check " + std::to_string(check);
    t.add("sgd_update", w + " momentum 0.9", Attrs{{"momentum", 0.9}}, [check](Gen& g) -> Inputs {
      return {g.uniform({4099}), g.uniform({4099}), g.uniform({4099}, -0.1, 0.1), g.scalar(0.05, F32),
              g.scalar(check, F32)};
    });
    t.add("sgd_update", w + " plain", {}, [check](Gen& g) -> Inputs {
      return {g.uniform({7, 33}), g.uniform({7, 33}), Tensor(), g.scalar(0.05, F32), g.scalar(check, F32, {1})};
    });
    const bool finite = std::isfinite(check);
    t.add("adamw_update", w, {}, [check, finite](Gen& g) -> Inputs {
      return {g.uniform({4099}), g.uniform({4099}), g.uniform({4099}, -0.1, 0.1), g.uniform({4099}, 0, 0.01),
              g.scalar(1e-3, F32), g.scalar(finite ? 3.0 : 0.0, F32), g.scalar(check, F32)};
    });
  }
  // f16's loss scale: check, scale, unscale, good, skipped, step (optional); the report out.
  struct L {
    double check, scale, good, skipped;
    bool step;
    int64_t interval;
  };
  const std::vector<L> ls = {{12.5, 1024, 0, 0, true, 2000},  {12.5, 1024, 2, 1, true, 3},
                             {-3, 65536, 1, 4, false, 3},    {inf, 65536, 2, 0, true, 3},
                             {nan, 1, 5, 9, false, 2000},    {-inf, 3e38, 0, 0, true, 1},
                             {0.0, 3e38, 0, 0, true, 1},     {1.0, 1000, 6, 2, true, 7}};
  for (const L& l : ls) {
    const std::string w = "check " + std::to_string(l.check) + " scale " + std::to_string(l.scale) + " good " +
                          std::to_string(l.good) + " interval " + std::to_string(l.interval) +
                          (l.step ? " step" : "");
    t.add("loss_scale_update", w, Attrs{{"growth_interval", l.interval}}, [l](Gen& g) -> Inputs {
      return {g.scalar(l.check, g.T), g.scalar(l.scale, g.T), g.scalar(1.0 / l.scale, g.T), g.scalar(l.good, g.T),
              g.scalar(l.skipped, g.T), l.step ? g.scalar(12, g.T) : Tensor()};
    });
  }
  // step < 1 is an error of the kernel (it is data).
  for (double step : {0.0, 0.5}) {
    t.add("adamw_update", "step " + std::to_string(step), {}, [step](Gen& g) -> Inputs {
       return {g.uniform({5}), g.uniform({5}), g.uniform({5}), g.uniform({5}, 0, 1), g.scalar(1e-3, F32),
               g.scalar(step, F32)};
     }).error = true;
  }
}

}  // namespace

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = [] {
    Table t;
    activation(t);
    binary(t);
    reduce(t);
    conv(t);
    pool(t);
    gemm(t);
    softmax(t);
    norm(t);
    misc(t);
    optim(t);
    return std::move(t.cases);
  }();
  return cases;
}

}  // namespace plexus::test::cmp
