// Fusion of a convolution with the max pooling after it, forward and backward: the finders a
// backend's get_capability() calls and the one parser of each group for create_fused(), shared
// by every plugin (the contract is in fusion.hpp).
//
// Both groups exist for memory. A conv layer followed by a pool writes its full-size output
// (for ConvNet's second layer at batch 1024 in f32, 196 MiB) only for the pool to read it, and
// in training the pool's backward writes a gradient of that size only for the convolution's
// backward to read it. Where nothing else reads those tensors, one kernel that works through the
// batch a few images at a time, with one image's (or one chunk's) tensor in scratch, never needs
// them at all:
//  - forward:  conv2d(x, w[, b]) -> [relu] -> max_pool2d: the convolution of a chunk of images
//    into scratch, the ReLU there, then the pool into the pooled output and its indices;
//  - backward: max_pool2d_backward(dy, indices) read by conv2d_backward_data(., w),
//    conv2d_backward_weight(., x) and the bias gradient sum(., axes [0, 2, 3]): a chunk's
//    gradient unpooled into scratch (the pool's backward, including its relu_mask), then the
//    convolution's backward ops on it, the weight and bias gradients summed over the chunks.
// Reverse mode makes both possible in training graphs: with relu_mask the pool's indices carry
// the ReLU's mask, so neither the ReLU's output nor the convolution's is read by the backward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "plexus/sdk/fusion.hpp"

namespace plexus::sdk {

namespace detail {
// An INTS attribute of node a equals that of node b (both absent counts as equal).
inline bool same_ints_attr(const GraphView& g, int32_t a, int32_t b, std::string_view name) {
  const plx_attr* x = g.find_attr(a, name);
  const plx_attr* y = g.find_attr(b, name);
  if (!x || !y) return !x && !y;
  if (x->type != y->type) return false;
  if (x->type == PLX_ATTR_INT) return x->i == y->i;
  return x->type == PLX_ATTR_INTS && x->count == y->count &&
         std::equal(x->ints, x->ints + x->count, y->ints);
}
// The convolution attributes of two conv-family nodes agree.
inline bool same_conv_attrs(const GraphView& g, int32_t a, int32_t b) {
  for (std::string_view k : {"stride", "padding", "dilation", "groups"})
    if (!same_ints_attr(g, a, b, k)) return false;
  return true;
}
// The value's only reader is node r, through exactly one of its inputs.
inline bool only_reader(const GraphView& g, int32_t v, int32_t r) {
  const auto& rd = g.readers(v);
  if (rd.size() != 1 || rd[0] != r) return false;
  int32_t uses = 0;
  for (int32_t k = 0; k < g.node(r).num_inputs; ++k) uses += g.node(r).inputs[k] == v;
  return uses == 1;
}
// A sum over axes 0, 2 and 3 of a 4-D tensor, keepdims off: a conv's bias gradient.
inline bool bias_grad_sum(const GraphView& g, int32_t n) {
  const plx_graph_node& s = g.node(n);
  if (s.num_inputs != 1 || s.num_outputs != 1 || !g.valid(s.inputs[0]) ||
      g.value(s.inputs[0]).ndim != 4)
    return false;
  const plx_attr* keep = g.find_attr(n, "keepdims");
  if (keep && (keep->type != PLX_ATTR_INT || keep->i != 0)) return false;
  const plx_attr* axes = g.find_attr(n, "axes");
  if (!axes || axes->type != PLX_ATTR_INTS || axes->count != 3) return false;
  std::vector<int64_t> a(axes->ints, axes->ints + axes->count);
  for (int64_t& x : a) x = x < 0 ? x + 4 : x;
  std::sort(a.begin(), a.end());
  return a == std::vector<int64_t>{0, 2, 3};
}
}  // namespace detail

// Groups {conv2d, [relu,] max_pool2d} (ascending node ids): the conv's output is read only by
// the ReLU (or, without one, by the pool), the ReLU's only by the pool, and both have the pool's
// input's dtype and size. In a training graph this holds when the pool has relu_mask (reverse
// mode sets it) and the layer's input is not needed in a form the group hides.
inline std::vector<std::vector<int32_t>> find_conv_max_pool(const GraphView& g) {
  std::vector<std::vector<int32_t>> groups;
  for (int32_t c = 0; c < g.num_nodes(); ++c) {
    if (!g.is(c, "conv2d")) continue;
    const plx_graph_node& conv = g.node(c);
    if (conv.num_inputs < 2 || conv.num_outputs != 1) continue;
    int32_t v = conv.outputs[0];
    const auto& rd = g.readers(v);
    if (rd.size() != 1) continue;
    std::vector<int32_t> nodes{c};
    int32_t next = rd[0];
    if (g.is(next, "relu")) {
      const plx_graph_node& relu = g.node(next);
      if (relu.num_inputs != 1 || relu.num_outputs != 1 || relu.inputs[0] != v) continue;
      nodes.push_back(next);
      v = relu.outputs[0];
      const auto& r2 = g.readers(v);
      if (r2.size() != 1) continue;
      next = r2[0];
    }
    if (!g.is(next, "max_pool2d") || !detail::only_reader(g, v, next)) continue;
    const plx_graph_node& pool = g.node(next);
    if (pool.num_inputs != 1 || pool.inputs[0] != v || pool.num_outputs != 2) continue;
    if (g.value(v).dtype != g.value(conv.outputs[0]).dtype ||
        numel(g.value(v)) != numel(g.value(conv.outputs[0])))
      continue;
    nodes.push_back(next);
    if (detail::runs_at_last(g, nodes)) groups.push_back(std::move(nodes));
  }
  return groups;
}

// Where create_fused()'s boundary puts each value of a {conv2d, [relu,] max_pool2d} group.
// Declines (Unsupported) any other group, or one whose conv or ReLU output is needed outside.
struct ConvMaxPoolSlots {
  int32_t conv = -1, relu = -1, pool = -1;  // nodes, as indices into the group's view
  int32_t x = -1, w = -1, bias = -1;        // boundary inputs (bias -1: none)
  int32_t y = -1, indices = -1;             // boundary outputs: the pooled values, the indices
  plx_dtype dtype = PLX_DTYPE_NONE;         // x, w, b and every output but the indices
  plx_dtype index_dtype = PLX_DTYPE_NONE;   // i32, or u8 with window_index
};
inline ConvMaxPoolSlots conv_max_pool_slots(const GraphView& g, const Boundary& b) {
  ConvMaxPoolSlots s;
  detail::assign_nodes(g, {{"conv2d", &s.conv}, {"relu", &s.relu}, {"max_pool2d", &s.pool}},
                       "conv2d [+ relu] + max_pool2d");
  PLX_DECLINE_UNLESS(s.conv >= 0 && s.pool >= 0, "a conv2d and a max_pool2d expected");
  const plx_graph_node& conv = g.node(s.conv);
  const plx_graph_node& pool = g.node(s.pool);
  PLX_DECLINE_UNLESS(conv.num_inputs >= 2 && conv.num_outputs == 1 && pool.num_inputs == 1 &&
                         pool.num_outputs == 2,
                     "unexpected arity");
  int32_t v = conv.outputs[0];
  PLX_DECLINE_UNLESS(b.output(v) < 0, "the convolution's output is needed outside the group");
  if (s.relu >= 0) {
    const plx_graph_node& relu = g.node(s.relu);
    PLX_DECLINE_UNLESS(relu.num_inputs == 1 && relu.num_outputs == 1 && relu.inputs[0] == v,
                       "the ReLU does not read the convolution's output");
    v = relu.outputs[0];
    PLX_DECLINE_UNLESS(b.output(v) < 0, "the ReLU's output is needed outside the group");
  }
  PLX_DECLINE_UNLESS(pool.inputs[0] == v, "the pool does not read the layer's output");
  s.x = b.input(conv.inputs[0]);
  s.w = b.input(conv.inputs[1]);
  if (conv.num_inputs >= 3 && g.valid(conv.inputs[2])) {
    s.bias = b.input(conv.inputs[2]);
    PLX_DECLINE_UNLESS(s.bias >= 0, "the bias comes from inside the group");
  }
  s.y = b.output(pool.outputs[0]);
  s.indices = b.output(pool.outputs[1]);
  PLX_DECLINE_UNLESS(s.x >= 0 && s.w >= 0 && s.y >= 0 && s.indices >= 0,
                     "an input or output is not at the boundary");
  s.dtype = static_cast<plx_dtype>(g.value(conv.inputs[0]).dtype);
  PLX_DECLINE_UNLESS(g.value(conv.inputs[1]).dtype == s.dtype &&
                         g.value(conv.outputs[0]).dtype == s.dtype && g.value(v).dtype == s.dtype &&
                         g.value(pool.outputs[0]).dtype == s.dtype &&
                         (s.bias < 0 || g.value(conv.inputs[2]).dtype == s.dtype),
                     "mixed dtypes");
  s.index_dtype = static_cast<plx_dtype>(g.value(pool.outputs[1]).dtype);
  return s;
}

// Groups {max_pool2d_backward, then any of conv2d_backward_data, conv2d_backward_weight and
// the bias gradient sum} (ascending node ids): the pool's gradient is read by nothing else, each
// of them reads it as dy (input 0) once, at least one is a conv backward op, and the two conv
// ops have the same convolution. The pool's gradient then never exists: the group unpools a
// chunk of it at a time.
inline std::vector<std::vector<int32_t>> find_max_pool_conv_backward(const GraphView& g) {
  std::vector<std::vector<int32_t>> groups;
  for (int32_t p = 0; p < g.num_nodes(); ++p) {
    if (!g.is(p, "max_pool2d_backward")) continue;
    const plx_graph_node& pool = g.node(p);
    if (pool.num_inputs != 2 || pool.num_outputs != 1) continue;
    const int32_t v = pool.outputs[0];
    if (g.value(v).ndim != 4) continue;
    int32_t data = -1, weight = -1, bias = -1;
    bool other = false;
    for (int32_t r : g.readers(v)) {
      const plx_graph_node& rn = g.node(r);
      int32_t uses = 0;
      for (int32_t k = 0; k < rn.num_inputs; ++k) uses += rn.inputs[k] == v;
      const bool as_dy =
          rn.num_inputs >= 1 && rn.inputs[0] == v && uses == 1 && rn.num_outputs == 1;
      if (as_dy && data < 0 && g.is(r, "conv2d_backward_data") && rn.num_inputs == 2)
        data = r;
      else if (as_dy && weight < 0 && g.is(r, "conv2d_backward_weight") && rn.num_inputs == 2)
        weight = r;
      else if (as_dy && bias < 0 && g.is(r, "sum") && detail::bias_grad_sum(g, r))
        bias = r;
      else
        other = true;
    }
    if (other || (data < 0 && weight < 0)) continue;
    if (data >= 0 && weight >= 0 && !detail::same_conv_attrs(g, data, weight)) continue;
    std::vector<int32_t> nodes{p};
    for (int32_t n : {data, weight, bias})
      if (n >= 0) nodes.push_back(n);
    std::sort(nodes.begin(), nodes.end());
    if (detail::runs_at_last(g, nodes)) groups.push_back(std::move(nodes));
  }
  return groups;
}

// Where create_fused()'s boundary puts each value of a find_max_pool_conv_backward() group.
// Declines (Unsupported) any other group, or one whose unpooled gradient is needed outside.
struct MaxPoolConvBackwardSlots {
  int32_t pool = -1, data = -1, weight = -1, bias = -1;  // nodes in the view; -1: absent
  int32_t dy = -1, indices = -1;      // boundary inputs: the pooled gradient and the indices
  int32_t w = -1;                     // the weight, with conv2d_backward_data
  int32_t x = -1;                     // the layer's input, with conv2d_backward_weight
  int32_t dx = -1, dw = -1, db = -1;  // boundary outputs of the nodes present
  plx_dtype dtype = PLX_DTYPE_NONE;
  plx_dtype index_dtype = PLX_DTYPE_NONE;
};
inline MaxPoolConvBackwardSlots max_pool_conv_backward_slots(const GraphView& g,
                                                             const Boundary& b) {
  MaxPoolConvBackwardSlots s;
  detail::assign_nodes(g,
                       {{"max_pool2d_backward", &s.pool},
                        {"conv2d_backward_data", &s.data},
                        {"conv2d_backward_weight", &s.weight},
                        {"sum", &s.bias}},
                       "max_pool2d_backward + conv backward");
  PLX_DECLINE_UNLESS(s.pool >= 0 && (s.data >= 0 || s.weight >= 0),
                     "a max_pool2d_backward and a conv backward op expected");
  const plx_graph_node& pool = g.node(s.pool);
  PLX_DECLINE_UNLESS(pool.num_inputs == 2 && pool.num_outputs == 1, "unexpected arity");
  const int32_t v = pool.outputs[0];
  PLX_DECLINE_UNLESS(b.output(v) < 0, "the unpooled gradient is needed outside the group");
  s.dy = b.input(pool.inputs[0]);
  s.indices = b.input(pool.inputs[1]);
  PLX_DECLINE_UNLESS(s.dy >= 0 && s.indices >= 0, "dy or the indices come from inside the group");
  s.dtype = static_cast<plx_dtype>(g.value(v).dtype);
  s.index_dtype = static_cast<plx_dtype>(g.value(pool.inputs[1]).dtype);
  PLX_DECLINE_UNLESS(g.value(pool.inputs[0]).dtype == s.dtype, "mixed dtypes");
  auto reads_dy = [&](int32_t n) {
    const plx_graph_node& node = g.node(n);
    return node.num_inputs >= 1 && node.inputs[0] == v && node.num_outputs == 1 &&
           g.value(node.outputs[0]).dtype == s.dtype;
  };
  if (s.data >= 0) {
    const plx_graph_node& d = g.node(s.data);
    PLX_DECLINE_UNLESS(reads_dy(s.data) && d.num_inputs == 2,
                       "conv2d_backward_data does not read the unpooled gradient");
    s.w = b.input(d.inputs[1]);
    s.dx = b.output(d.outputs[0]);
    PLX_DECLINE_UNLESS(s.w >= 0 && s.dx >= 0 && g.value(d.inputs[1]).dtype == s.dtype,
                       "conv2d_backward_data: w or dx is not at the boundary");
  }
  if (s.weight >= 0) {
    const plx_graph_node& w = g.node(s.weight);
    PLX_DECLINE_UNLESS(reads_dy(s.weight) && w.num_inputs == 2,
                       "conv2d_backward_weight does not read the unpooled gradient");
    s.x = b.input(w.inputs[1]);
    s.dw = b.output(w.outputs[0]);
    PLX_DECLINE_UNLESS(s.x >= 0 && s.dw >= 0 && g.value(w.inputs[1]).dtype == s.dtype,
                       "conv2d_backward_weight: x or dw is not at the boundary");
  }
  if (s.data >= 0 && s.weight >= 0)
    PLX_DECLINE_UNLESS(detail::same_conv_attrs(g, s.data, s.weight),
                       "the two conv backward ops are of different convolutions");
  if (s.bias >= 0) {
    PLX_DECLINE_UNLESS(reads_dy(s.bias) && detail::bias_grad_sum(g, s.bias),
                       "the sum is not the bias gradient of the unpooled gradient");
    s.db = b.output(g.node(s.bias).outputs[0]);
    PLX_DECLINE_UNLESS(s.db >= 0, "the bias gradient is not at the boundary");
  }
  return s;
}

}  // namespace plexus::sdk
