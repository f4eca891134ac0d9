// Built-in op schemas: 2-D max and average pooling and their backward ops (see docs/ops.md).
//
// Output sizes follow PyTorch: floor((in + 2·pad − dilation·(k − 1) − 1) / stride) + 1, or the
// ceiling with ceil_mode, where a last window that would start in the right padding is dropped.
// The backward ops check dy against the forward's output for input_shape and the attributes.
#include <array>
#include <limits>

#include "plexus/op_schema.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

int64_t flag_attr(const InferContext& c, const std::string& name) {
  const int64_t v = c.attrs().get_int(name);
  c.require(v == 0 || v == 1, name + " must be 0 or 1, got " + std::to_string(v));
  return v;
}

struct PoolAttrs {
  Pair kernel, stride, padding, dilation{1, 1};
  bool ceil_mode;
};

PoolAttrs pool_attrs(const InferContext& c, bool has_dilation) {
  PoolAttrs a;
  a.kernel = pair_attr(c, "kernel", 1);
  // An empty stride means the kernel (non-overlapping windows), as in PyTorch.
  a.stride = c.attrs().get_ints("stride").empty() ? a.kernel : pair_attr(c, "stride", 1);
  a.padding = pair_attr(c, "padding", 0);
  if (has_dilation) a.dilation = pair_attr(c, "dilation", 1);
  a.ceil_mode = flag_attr(c, "ceil_mode") != 0;
  for (int i = 0; i < 2; ++i) {
    // Each window must hold at least one input element.
    const int64_t extent = a.dilation[i] * (a.kernel[i] - 1) + 1;
    c.require(a.padding[i] <= extent / 2,
              "padding " + attr_value_string(AttrValue(Ints{a.padding[0], a.padding[1]})) +
                  " must be at most half the " + (has_dilation ? "dilated " : "") + "kernel " +
                  std::to_string(a.kernel[0]) + "x" + std::to_string(a.kernel[1]));
  }
  return a;
}

int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// (N, C, OH, OW) for x (N, C, H, W). `what` names x in messages.
Shape pool_output_shape(const InferContext& c, const PoolAttrs& a, const Shape& x,
                        const std::string& what = "x") {
  c.require(x.size() == 4, what + " must be 4-D (N, C, H, W), got " + shape_string(x));
  Shape y = {x[0], x[1], 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t in = x[2 + i], s = a.stride[i], p = a.padding[i];
    const int64_t extent = a.dilation[i] * (a.kernel[i] - 1) + 1;
    int64_t o = floor_div(in + 2 * p - extent + (a.ceil_mode ? s - 1 : 0), s) + 1;
    if (a.ceil_mode && o > 0 && (o - 1) * s >= in + p) --o;  // would start in the padding
    c.require(o >= 1, "kernel " + std::to_string(a.kernel[0]) + "x" + std::to_string(a.kernel[1]) +
                          (a.dilation[0] * a.dilation[1] > 1 ? " (dilated)" : "") +
                          " is larger than the padded input " +
                          std::to_string(x[2] + 2 * a.padding[0]) + "x" +
                          std::to_string(x[3] + 2 * a.padding[1]));
    y[2 + i] = o;
  }
  return y;
}

// A 4-value ints attribute holding x's shape (N, C, H, W).
Shape shape_attr(const InferContext& c, const std::string& name) {
  const Ints& v = c.attrs().get_ints(name);
  c.require(v.size() == 4,
            name + " must have 4 values (N, C, H, W), got " + attr_value_string(AttrValue(v)));
  for (int64_t d : v)
    c.require(d >= 0, name + " must not be negative, got " + attr_value_string(AttrValue(v)));
  return v;
}

// dy must be exactly the forward's output for input_shape; returns input_shape.
Shape backward_input_shape(const InferContext& c, bool has_dilation) {
  const PoolAttrs a = pool_attrs(c, has_dilation);
  const Shape x = shape_attr(c, "input_shape");
  const Shape want = pool_output_shape(c, a, x, "input_shape");
  const Shape& dy = c.in(0).shape;
  c.require(dy == want, "dy " + shape_string(dy) + " is not the output shape " +
                            shape_string(want) + " of input " + shape_string(x));
  return x;
}

// window_index: 0 or 1, and 1 only for windows of at most 255 taps (255 means "none").
bool window_index(const InferContext& c) {
  const int64_t w = c.attrs().get_int("window_index");
  c.require(w == 0 || w == 1, "window_index must be 0 or 1, got " + std::to_string(w));
  if (w) {
    const Ints& k = c.attrs().get_ints("kernel");
    const int64_t taps = k.size() == 2 ? k[0] * k[1] : 0;
    c.require(taps >= 1 && taps <= 255, "window_index = 1 needs a window of 1 to 255 taps, got " +
                                            std::to_string(taps));
  }
  return w != 0;
}

void max_pool_infer(InferContext& c) {
  const Shape& x = c.in(0).shape;
  const Shape y = pool_output_shape(c, pool_attrs(c, true), x);
  c.require(x[2] * x[3] <= std::numeric_limits<int32_t>::max(),
            "an input plane of " + std::to_string(x[2] * x[3]) +
                " elements is too large for i32 indices");
  const int64_t relu_mask = c.attrs().get_int("relu_mask");
  c.require(relu_mask == 0 || relu_mask == 1, "relu_mask must be 0 or 1, got " + std::to_string(relu_mask));
  c.out(0, c.in(0).dtype, y);
  c.out(1, window_index(c) ? PLX_U8 : PLX_I32, y);
}

void max_pool_backward_infer(InferContext& c) {
  c.require(c.in(1).shape == c.in(0).shape, "indices " + shape_string(c.in(1).shape) + " and dy " +
                                                shape_string(c.in(0).shape) + " differ in shape");
  const plx_dtype want = window_index(c) ? PLX_U8 : PLX_I32;
  c.require(c.in(1).dtype == want, std::string("indices must be ") + dtype_name(want) +
                                       " with window_index = " +
                                       std::to_string(c.attrs().get_int("window_index")) +
                                       ", got " + dtype_name(c.in(1).dtype));
  c.out(0, c.in(0).dtype, backward_input_shape(c, true));
}

void avg_pool_infer(InferContext& c) {
  c.out(0, c.in(0).dtype, pool_output_shape(c, pool_attrs(c, false), c.in(0).shape));
}

void avg_pool_backward_infer(InferContext& c) {
  c.out(0, c.in(0).dtype, backward_input_shape(c, false));
}

// `attrs` plus input_shape, for the backward op (less relu_mask, which only the forward has: the
// backward skips the -1 indices it writes as it skips a window of padding only).
Attrs with_input_shape(const Attrs& attrs, const Shape& shape) {
  Attrs a;
  for (const auto& [k, v] : attrs)
    if (k != "relu_mask") a.set(k, v);
  a.set("input_shape", shape);
  return a;
}

}  // namespace

void register_pool(OpRegistry& r) {
  const AttrDef kernel = attr("kernel", PLX_ATTR_INTS, std::nullopt, "[h, w] window, >= 1");
  const AttrDef stride = attr("stride", PLX_ATTR_INTS, Ints{}, "[h, w], >= 1; empty: = kernel");
  const AttrDef padding =
      attr("padding", PLX_ATTR_INTS, Ints{0, 0}, "[h, w] on each side, at most half the kernel");
  const AttrDef dilation = attr("dilation", PLX_ATTR_INTS, Ints{1, 1}, "[h, w] tap spacing");
  const AttrDef ceil_mode =
      attr("ceil_mode", PLX_ATTR_INT, int64_t{0}, "1: round the output size up");
  const AttrDef count_include_pad =
      attr("count_include_pad", PLX_ATTR_INT, int64_t{1}, "1: padding counts in the divisor");
  const AttrDef input_shape =
      attr("input_shape", PLX_ATTR_INTS, std::nullopt, "the forward's x shape (N, C, H, W)");
  const std::vector<AttrDef> max_attrs = {kernel, stride, padding, dilation, ceil_mode};
  // Reverse mode sets it on a pool of a ReLU's output that nothing else reads (graph.cpp):
  // then the indices carry the ReLU's mask, and backward needs neither tensor.
  const AttrDef relu_mask = since_abi(
      attr("relu_mask", PLX_ATTR_INT, int64_t{0},
           "1: index -1 (no gradient) where y is not > 0, the mask of the ReLU that x comes from"),
      3);
  // Reverse mode sets it where the window has at most 255 taps: a quarter of the i32 indices'
  // memory, and the pool's backward finds the element from the window's position.
  const AttrDef window_index_attr = since_abi(
      attr("window_index", PLX_ATTR_INT, int64_t{0},
           "1: indices are u8 positions in the window (kh * kernel_w + kw, 255: none) instead of "
           "i32 positions in the plane"),
      3);
  const std::vector<AttrDef> avg_attrs = {kernel, stride, padding, ceil_mode, count_include_pad};
  auto plus_shape = [&](std::vector<AttrDef> v) {
    v.insert(v.begin(), input_shape);
    return v;
  };

  r.add(OpSchema{
      .name = "max_pool2d",
      .doc = "maximum over each window of x (N, C, H, W), with the flat index h·W + w of the "
             "first maximum in its plane",
      .inputs = {in("x", kFloatTypes)},
      .outputs = {out("y"), out("indices", dtype_bit(PLX_I32) | dtype_bit(PLX_U8), PLX_ARG_NO_GRAD)},
      .attrs = [&] {
        auto v = max_attrs;
        v.push_back(relu_mask);
        v.push_back(window_index_attr);
        return v;
      }(),
      .infer = max_pool_infer,
      .grad =
          [](GradContext& g) {
            if (!g.grad_output(0).valid()) return;
            g.set_grad(0, g.call("max_pool2d_backward", {g.grad_output(0), g.output(1)},
                                 with_input_shape(g.attrs(), g.desc(g.input(0)).shape)));
          },
  });
  r.add(OpSchema{
      .name = "max_pool2d_backward",
      .doc = "gradient of max_pool2d: dy sent to the input element each window's index names",
      .inputs = {in("dy", kFloatTypes),
                 in("indices", dtype_bit(PLX_I32) | dtype_bit(PLX_U8), PLX_ARG_NO_GRAD)},
      .outputs = {out("dx")},
      .attrs = [&] {
        auto v = plus_shape(max_attrs);
        v.push_back(window_index_attr);
        return v;
      }(),
      .infer = max_pool_backward_infer,
  });
  r.add(OpSchema{
      .name = "avg_pool2d",
      .doc = "mean over each window of x (N, C, H, W)",
      .inputs = {in("x", kFloatTypes)},
      .outputs = {out("y")},
      .attrs = avg_attrs,
      .infer = avg_pool_infer,
      .grad =
          [](GradContext& g) {
            if (!g.grad_output(0).valid()) return;
            g.set_grad(0, g.call("avg_pool2d_backward", {g.grad_output(0)},
                                 with_input_shape(g.attrs(), g.desc(g.input(0)).shape)));
          },
  });
  r.add(OpSchema{
      .name = "avg_pool2d_backward",
      .doc = "gradient of avg_pool2d: dy spread evenly over each window",
      .inputs = {in("dy", kFloatTypes)},
      .outputs = {out("dx")},
      .attrs = plus_shape(avg_attrs),
      .infer = avg_pool_backward_infer,
      // Linear in dy with avg_pool2d as its adjoint (double backward).
      .grad =
          [](GradContext& g) {
            if (!g.grad_output(0).valid()) return;
            Attrs a;
            for (const auto& [k, v] : g.attrs())
              if (k != "input_shape") a.set(k, v);
            g.set_grad(0, g.call("avg_pool2d", {g.grad_output(0)}, a));
          },
  });
}

}  // namespace plexus::ops
