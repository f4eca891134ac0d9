// One convolution's geometry for the tests of the CUDA plugin's convolution candidates
// (test_igemm_conv.cpp, test_direct_conv.cpp, test_cuda_conv_graph.cpp): the node's shapes and
// attributes, a description for failure messages, random inputs with the CPU's results for each
// of the three ops, the layout mixes of x, w and y, and a registered kernel by its impl name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plexus/attrs.hpp"
#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/tensor.hpp"
#include "support/harness.hpp"

namespace plexus::test::conv_geo {

struct Geo {
  Shape x;  // N, C, H, W
  int64_t o, kh, kw;
  Ints stride, padding;
  Ints dilation = {1, 1};
  int64_t groups = 1;
};

inline Attrs geo_attrs(const Geo& g) {
  return Attrs{{"stride", g.stride}, {"padding", g.padding}, {"dilation", g.dilation},
               {"groups", g.groups}};
}

inline Shape w_shape(const Geo& g) {
  return {g.o, g.x[1] / g.groups, g.kh, g.kw};
}

inline Shape out_shape(const Geo& g) {
  const int64_t oh = (g.x[2] + 2 * g.padding[0] - g.dilation[0] * (g.kh - 1) - 1) / g.stride[0] + 1;
  const int64_t ow = (g.x[3] + 2 * g.padding[1] - g.dilation[1] * (g.kw - 1) - 1) / g.stride[1] + 1;
  return {g.x[0], g.o, oh, ow};
}

inline std::string describe(const Geo& g) {
  auto s = [](const std::vector<int64_t>& v) {
    std::string r = "(";
    for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + std::to_string(v[i]);
    return r + ")";
  };
  std::string d = "x" + s(g.x) + " o " + std::to_string(g.o) + " k " + std::to_string(g.kh) +
                  "x" + std::to_string(g.kw) + " stride " + s(g.stride) + " padding " +
                  s(g.padding);
  if (g.dilation != Ints{1, 1}) d += " dilation " + s(g.dilation);
  if (g.groups != 1) d += " groups " + std::to_string(g.groups);
  return d;
}

// One node's random inputs (NCHW, on the CPU) and the CPU's results of conv2d without and with
// the bias, conv2d_backward_data and conv2d_backward_weight on them, with each op's attributes.
// Draws x, w, b and dy in that order from seeds ++seed.
struct ConvCase {
  Shape w_shape, y_shape;
  Tensor x, w, b, dy;
  Attrs geo, bd_attrs, bw_attrs;  // conv2d's; with input_shape; with weight_shape
  Tensor want_y, want_yb, want_dx, want_dw;
};
inline ConvCase make_case(const Geo& g, plx_dtype d, uint64_t& seed) {
  ConvCase c;
  c.w_shape = w_shape(g);
  c.y_shape = out_shape(g);
  c.x = random_tensor(g.x, d, ++seed);
  c.w = random_tensor(c.w_shape, d, ++seed);
  c.b = random_tensor({g.o}, d, ++seed);
  c.dy = random_tensor(c.y_shape, d, ++seed);
  c.geo = c.bd_attrs = c.bw_attrs = geo_attrs(g);
  c.bd_attrs.set("input_shape", Ints(g.x));
  c.bw_attrs.set("weight_shape", Ints(c.w_shape));
  c.want_y = call(cpu(), "conv2d", {c.x, c.w, Tensor()}, c.geo)[0];
  c.want_yb = call(cpu(), "conv2d", {c.x, c.w, c.b}, c.geo)[0];
  c.want_dx = call(cpu(), "conv2d_backward_data", {c.dy, c.w}, c.bd_attrs)[0];
  c.want_dw = call(cpu(), "conv2d_backward_weight", {c.dy, c.x}, c.bw_attrs)[0];
  return c;
}

// Which of x, w and y are channels-last.
struct Layouts {
  bool x, w, y;
};
// Mix 0..7 of the eight: bit 0 x, bit 1 w, bit 2 y channels-last.
inline Layouts layouts_of(int mix) {
  return {(mix & 1) != 0, (mix & 2) != 0, (mix & 4) != 0};
}
inline std::string layout_name(const Layouts& l) {
  auto n = [](bool c) { return c ? "nhwc" : "nchw"; };
  return std::string("x ") + n(l.x) + ", w " + n(l.w) + ", y " + n(l.y);
}

// The backend's kernel of `op` in dtype `d` whose impl is `impl`, or null.
inline const plx_kernel* kernel_by_impl(Backend& gpu, const std::string& op, plx_dtype d,
                                        const std::string& impl) {
  const OpSchema& s = runtime().ops().get(op);
  for (const plx_kernel* k : gpu.kernels(s.id, d))
    if (k->impl && impl == k->impl) return k;
  return nullptr;
}

}  // namespace plexus::test::conv_geo
