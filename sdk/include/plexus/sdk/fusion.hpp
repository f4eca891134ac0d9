// Fusion for backend authors: reading the graph the core offers in get_capability(), building a
// fused kernel out of the backend's own per-node kernels, and handing fused kernels back from
// create_fused().
//
// The contract (abi/backend.h): when a graph is prepared the core calls get_capability() with the
// whole graph; the backend calls `claim` once per group of nodes it wants to run as one kernel.
// The core checks each claim (no overlap with an earlier one; the group must be able to run where
// its last node runs: nothing outside it between its first and last node reads what it writes
// or writes what it reads), then calls create_fused() with the group, the values it reads from
// outside and the values it writes that are read outside (or are graph outputs). Values only the
// group reads never get memory. create_fused() may decline (throw Unsupported); the core then
// offers the graph again with that claim refused, so a smaller pattern may take the nodes, and
// the nodes no claim takes run one by one.
//
// Two shapes of fusion come ready-made here, both built from kernels the backend already
// registers (so they compute exactly what the nodes compute one by one):
//  - an epilogue chain: a producer (linear, conv2d, add, ...) whose output only feeds an in-place
//    elementwise op (relu, ...): the producer writes straight into the chain's output and the
//    epilogue runs over it in place; the intermediate tensor is never allocated;
//  - a node group: independent nodes of one op (the optimizer's per-parameter updates) run by
//    one kernel the backend writes (a multi-tensor update), found by same_op_groups().
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/abi/backend.h"
#include "plexus/sdk/backend.hpp"
#include "plexus/sdk/kernel.hpp"
#include "plexus/sdk/status.hpp"
#include "plexus/sdk/tensor.hpp"

namespace plexus::sdk {

// Read access to a plx_graph_view: each value's producer and readers.
class GraphView {
 public:
  explicit GraphView(const plx_graph_view& g)
      : g_(g),
        producer_(static_cast<size_t>(std::max(g.num_values, 0)), -1),
        readers_(static_cast<size_t>(std::max(g.num_values, 0))) {
    for (int32_t n = 0; n < g.num_nodes; ++n) {
      const plx_graph_node& node = g.nodes[n];
      for (int32_t k = 0; k < node.num_outputs; ++k)
        if (valid(node.outputs[k])) producer_[static_cast<size_t>(node.outputs[k])] = n;
      for (int32_t k = 0; k < node.num_inputs; ++k) {
        const int32_t v = node.inputs[k];
        if (!valid(v)) continue;
        auto& r = readers_[static_cast<size_t>(v)];
        if (r.empty() || r.back() != n) r.push_back(n);
      }
    }
  }

  const plx_graph_view& raw() const { return g_; }
  int32_t device() const { return g_.device; }
  int32_t num_nodes() const { return g_.num_nodes; }
  int32_t num_values() const { return g_.num_values; }
  const plx_graph_node& node(int32_t n) const { return g_.nodes[n]; }
  bool is(int32_t n, std::string_view op) const { return op == g_.nodes[n].op; }
  const plx_tensor& value(int32_t v) const { return g_.values[v]; }
  bool valid(int32_t v) const { return v >= 0 && v < g_.num_values; }
  // The node that writes `v` (-1 for inputs, parameters, states, constants).
  int32_t producer(int32_t v) const { return producer_[static_cast<size_t>(v)]; }
  // The nodes that read `v`, in graph order, each once. A value the host reads after the step
  // (a graph output) may have no reader here and still be needed: the core says so in
  // create_fused()'s outputs.
  const std::vector<int32_t>& readers(int32_t v) const { return readers_[static_cast<size_t>(v)]; }

  const plx_attr* find_attr(int32_t n, std::string_view name) const {
    const plx_graph_node& node = g_.nodes[n];
    for (int32_t i = 0; i < node.num_attrs; ++i)
      if (name == node.attrs[i].name) return &node.attrs[i];
    return nullptr;
  }

 private:
  const plx_graph_view& g_;
  std::vector<int32_t> producer_;
  std::vector<std::vector<int32_t>> readers_;
};

// Two attribute lists hold the same names and values.
inline bool same_attrs(const plx_graph_node& a, const plx_graph_node& b) {
  if (a.num_attrs != b.num_attrs) return false;
  for (int32_t i = 0; i < a.num_attrs; ++i) {
    const plx_attr& x = a.attrs[i];
    const plx_attr& y = b.attrs[i];
    if (std::string_view(x.name) != y.name || x.type != y.type) return false;
    switch (x.type) {
      case PLX_ATTR_INT:
        if (x.i != y.i) return false;
        break;
      case PLX_ATTR_FLOAT:
        if (x.f != y.f) return false;
        break;
      case PLX_ATTR_STRING:
        if (std::string_view(x.s) != y.s) return false;
        break;
      case PLX_ATTR_INTS:
        if (x.count != y.count || !std::equal(x.ints, x.ints + x.count, y.ints)) return false;
        break;
      case PLX_ATTR_FLOATS:
        if (x.count != y.count || !std::equal(x.floats, x.floats + x.count, y.floats)) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

// One node of a view as a plx_node_info, for creating a per-node kernel. Owns its arrays, so it
// neither copies nor moves.
class OwnedNodeInfo {
 public:
  OwnedNodeInfo(const GraphView& g, int32_t n) {
    const plx_graph_node& node = g.node(n);
    for (int32_t k = 0; k < node.num_inputs; ++k) {
      plx_tensor t{};
      if (g.valid(node.inputs[k])) t = g.value(node.inputs[k]);
      else t.dtype = PLX_DTYPE_NONE;
      inputs_.push_back(t);
    }
    for (int32_t k = 0; k < node.num_outputs; ++k) outputs_.push_back(g.value(node.outputs[k]));
    attrs_.assign(node.attrs, node.attrs + node.num_attrs);
    info_.struct_size = sizeof info_;
    info_.device = g.device();
    info_.op = node.op;
    info_.num_inputs = node.num_inputs;
    info_.num_outputs = node.num_outputs;
    info_.inputs = inputs_.data();
    info_.outputs = outputs_.data();
    info_.attrs = attrs_.empty() ? nullptr : attrs_.data();
    info_.num_attrs = static_cast<int32_t>(attrs_.size());
  }
  // The same node for a part of the batch, `rows` images (a fused kernel that works through a
  // batch a chunk at a time runs each member's own kernel on such a copy): the inputs and
  // outputs listed (4-D, the batch first) get shape[0] = rows and contiguous strides (or keep
  // channels-last ones, which are the same for any batch), and the
  // 4-value INTS attribute `batch_attr`, when named (the backward ops' "input_shape"), its first
  // value. Declines (Unsupported) a node without that attribute.
  OwnedNodeInfo(const GraphView& g, int32_t n, int64_t rows, std::initializer_list<int32_t> batched_in,
                std::initializer_list<int32_t> batched_out, std::string_view batch_attr = {})
      : OwnedNodeInfo(g, n) {
    auto batch = [&](std::vector<plx_tensor>& ts, int32_t k) {
      PLX_REQUIRE(k >= 0 && k < static_cast<int32_t>(ts.size()) &&
                      present(ts[static_cast<size_t>(k)]) && ts[static_cast<size_t>(k)].ndim == 4,
                  "%s: tensor %d is not a 4-D batch", info_.op, k);
      plx_tensor& t = ts[static_cast<size_t>(k)];
      // Channels-last stays so: its strides do not depend on the batch (the layout planner's
      // tensors, which a chunk of images slices as NCHW ones are sliced).
      const bool nhwc = is_channels_last(t) && !is_contiguous(t);
      t.shape[0] = rows;
      if (nhwc) return;
      for (int64_t i = t.ndim - 1, step = 1; i >= 0; --i) {
        t.strides[i] = step;
        step *= t.shape[i];
      }
    };
    for (int32_t k : batched_in) batch(inputs_, k);
    for (int32_t k : batched_out) batch(outputs_, k);
    if (batch_attr.empty()) return;
    bool found = false;
    for (plx_attr& a : attrs_) {
      if (batch_attr != a.name) continue;
      PLX_DECLINE_UNLESS(a.type == PLX_ATTR_INTS && a.count == 4, "%s: %s must have 4 values",
                         info_.op, a.name);
      std::copy(a.ints, a.ints + 4, batch_shape_.begin());
      batch_shape_[0] = rows;
      a.ints = batch_shape_.data();
      found = true;
    }
    PLX_DECLINE_UNLESS(found, "%s: no %.*s attribute", info_.op, static_cast<int>(batch_attr.size()),
                       batch_attr.data());
  }
  OwnedNodeInfo(const OwnedNodeInfo&) = delete;
  OwnedNodeInfo& operator=(const OwnedNodeInfo&) = delete;
  // Gives input (or output) k the shape of `like` with shape[0] = rows, contiguous or, where
  // `like` is, channels-last: an elementwise node run on another tensor than its own (a ReLU
  // applied after the max-pool that read its input, which is the same where the pool's indices
  // carry the ReLU's mask).
  void reshape(bool output, int32_t k, const plx_tensor& like, int64_t rows) {
    std::vector<plx_tensor>& ts = output ? outputs_ : inputs_;
    PLX_REQUIRE(k >= 0 && k < static_cast<int32_t>(ts.size()) && like.ndim >= 1,
                "%s: no %s %d to reshape", info_.op, output ? "output" : "input", k);
    plx_tensor& t = ts[static_cast<size_t>(k)];
    t.ndim = like.ndim;
    for (int32_t i = 0; i < like.ndim; ++i) t.shape[i] = like.shape[i];
    t.shape[0] = rows;
    for (int64_t i = t.ndim - 1, step = 1; i >= 0; --i) {
      t.strides[i] = step;
      step *= t.shape[i];
    }
    if (is_channels_last(like) && !is_contiguous(like)) channels_last(output, k);
  }
  // Gives 4-D input (or output) k channels-last strides, (H·W·C, 1, W·C, C): a fused kernel's
  // scratch tensor laid out as the tensors around it.
  void channels_last(bool output, int32_t k) {
    std::vector<plx_tensor>& ts = output ? outputs_ : inputs_;
    PLX_REQUIRE(
        k >= 0 && k < static_cast<int32_t>(ts.size()) && ts[static_cast<size_t>(k)].ndim == 4,
        "%s: no 4-D %s %d to lay out channels-last", info_.op, output ? "output" : "input", k);
    plx_tensor& t = ts[static_cast<size_t>(k)];
    const int64_t C = t.shape[1], H = t.shape[2], W = t.shape[3];
    t.strides[0] = H * W * C, t.strides[1] = 1, t.strides[2] = W * C, t.strides[3] = C;
  }
  // Input k absent, as an optional input nobody gave (dtype PLX_DTYPE_NONE): a conv2d run
  // without its bias, which a fused kernel applies elsewhere.
  void drop_input(int32_t k) {
    PLX_REQUIRE(k >= 0 && k < static_cast<int32_t>(inputs_.size()), "%s: no input %d to drop",
                info_.op, k);
    inputs_[static_cast<size_t>(k)] = plx_tensor{};
    inputs_[static_cast<size_t>(k)].dtype = PLX_DTYPE_NONE;
  }
  const plx_node_info& get() const { return info_; }
  const std::vector<plx_tensor>& inputs() const { return inputs_; }
  const std::vector<plx_tensor>& outputs() const { return outputs_; }

 private:
  std::vector<plx_tensor> inputs_, outputs_;
  std::vector<plx_attr> attrs_;
  std::array<int64_t, 4> batch_shape_{};
  plx_node_info info_{};
};

// One of the backend's registered kernels, created for one node: the first of the kernels for
// (op, dtype of input 0) whose create() accepts it, as the core would pick. (For ops whose
// type input is not input 0, docs/ops.md, create the kernel yourself.)
class NodeKernel {
 public:
  // `hint`: plx_graph_node.kernel_hint, the host's choice among the backend's kernels (tried
  // first when it is a kernel of this op and dtype); 0: the registration order alone.
  NodeKernel(Backend& backend, const plx_node_info& node, int32_t hint = 0) {
    const int32_t dtype = node.num_inputs > 0 ? node.inputs[0].dtype : PLX_F32;
    std::string declines;
    std::vector<const plx_kernel*> order = backend.kernels().find(node.op, dtype);
    if (const plx_kernel* h = hint > 0 ? backend.kernels().get(hint - 1) : nullptr) {
      auto it = std::find(order.begin(), order.end(), h);
      if (it != order.end()) std::rotate(order.begin(), it, it + 1);
    }
    for (const plx_kernel* k : order) {
      if (!takes_layouts(*k, node)) {
        declines += (declines.empty() ? "" : "; ") + std::string(k->impl) +
                    ": it takes NCHW contiguous tensors only";
        continue;
      }
      void* state = nullptr;
      uint64_t ws = 0;
      const plx_status s = k->create(static_cast<void*>(&backend), k->user, &node, &state, &ws);
      if (s == PLX_OK) {
        kernel_ = k;
        state_ = state;
        workspace_ = ws;
        return;
      }
      if (s != PLX_ERR_UNSUPPORTED) throw Error(s, detail::last_error);
      declines += (declines.empty() ? "" : "; ") + std::string(k->impl) + ": " + detail::last_error;
    }
    if (declines.empty()) declines = "none registered";
    throw Unsupported(format("no %s kernel for %s (%s)", backend.name().c_str(), node.op,
                             declines.c_str()));
  }
  ~NodeKernel() {
    if (kernel_) kernel_->destroy(state_);
  }
  NodeKernel(const NodeKernel&) = delete;
  NodeKernel& operator=(const NodeKernel&) = delete;

  const plx_kernel& table() const { return *kernel_; }
  uint64_t workspace_bytes() const { return workspace_; }
  void compute(const std::vector<plx_tensor>& in, const std::vector<plx_tensor>& out,
               void* workspace, uint64_t workspace_bytes, plx_stream stream) const {
    const plx_status s = kernel_->compute(state_, in.data(), static_cast<int32_t>(in.size()),
                                          out.data(), static_cast<int32_t>(out.size()),
                                          workspace_ ? workspace : nullptr,
                                          workspace_ ? workspace_bytes : 0, stream);
    if (s != PLX_OK) throw Error(s, detail::last_error);
  }

 private:
  const plx_kernel* kernel_ = nullptr;
  void* state_ = nullptr;
  uint64_t workspace_ = 0;
};

// plx_kernel tables for a backend's fused kernels, one per (name, dtype, flags, layout), with
// stable addresses until the backend is destroyed. The state behind each is a sdk::Kernel.
// Thread-safe.
class FusedTables {
 public:
  // Hands `k` back to the core as create_fused()'s results. `layout` PLX_LAYOUT_NHWC promises
  // what it promises for any kernel (abi/ops.h): each 4-D value at the group's boundary may come
  // NCHW contiguous or channels-last, and `k` reads the strides it was created with.
  void give(const std::string& name, plx_dtype dtype, uint32_t flags, std::unique_ptr<Kernel> k,
            const plx_kernel** kernel, void** state, uint64_t* workspace_bytes,
            plx_layout layout = PLX_LAYOUT_ANY) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      *kernel = table(name, dtype, flags, layout);
    }
    *workspace_bytes = k->workspace_bytes();
    *state = k.release();
  }

 private:
  const plx_kernel* table(const std::string& name, plx_dtype dtype, uint32_t flags,
                          plx_layout layout) {
    for (const Entry& e : entries_)
      if (e.name == name && e.table.dtype == dtype && e.table.flags == flags &&
          e.table.layout == layout)
        return &e.table;
    Entry& e = entries_.emplace_back();
    e.name = name;
    e.table.struct_size = sizeof(plx_kernel);
    e.table.flags = flags;
    e.table.op = e.name.c_str();
    e.table.impl = e.name.c_str();
    e.table.dtype = dtype;
    e.table.layout = layout;
    e.table.create = [](void*, void*, const plx_node_info*, void**, uint64_t*) {
      return detail::set_error(PLX_ERR_UNSUPPORTED, "a fused kernel is made by create_fused");
    };
    e.table.compute = [](void* state, const plx_tensor* in, int32_t n_in, const plx_tensor* out,
                         int32_t n_out, void* ws, uint64_t ws_bytes, plx_stream stream) {
      return detail::guard([&] {
        static_cast<Kernel*>(state)->compute(KernelCall{in, n_in, out, n_out, ws, ws_bytes, stream});
      });
    };
    e.table.destroy = [](void* state) { delete static_cast<Kernel*>(state); };
    return &e.table;
  }

  struct Entry {
    std::string name;
    plx_kernel table{};
  };
  std::mutex mu_;               // graphs may be prepared on several threads at once
  std::deque<Entry> entries_;  // deque: tables keep their addresses
};

// Where a fused kernel finds a value at compute(): boundary input k, boundary output k, or an
// absent optional input.
struct Slot {
  enum Kind : uint8_t { Absent, Input, Output } kind = Absent;
  int32_t index = 0;
};

// Maps value ids to their places among create_fused()'s inputs and outputs.
class Boundary {
 public:
  Boundary(const int32_t* inputs, int32_t num_inputs, const int32_t* outputs, int32_t num_outputs)
      : in_(inputs, inputs + num_inputs), out_(outputs, outputs + num_outputs) {}
  // -1 if `v` is not a boundary input / output.
  int32_t input(int32_t v) const { return find(in_, v); }
  int32_t output(int32_t v) const { return find(out_, v); }
  const std::vector<int32_t>& inputs() const { return in_; }
  const std::vector<int32_t>& outputs() const { return out_; }

 private:
  static int32_t find(const std::vector<int32_t>& xs, int32_t v) {
    for (size_t i = 0; i < xs.size(); ++i)
      if (xs[i] == v) return static_cast<int32_t>(i);
    return -1;
  }
  std::vector<int32_t> in_, out_;
};

// A fused group relu_backward(dy, y) -> max_pool2d_backward(., indices) (find_feeding_pairs):
// where create_fused()'s boundary puts dy, y, the indices and dx, and the dtype. Declines
// (Unsupported) any other group, or one whose masked gradient is needed outside it.
struct ReluMaxPoolBackwardSlots {
  int32_t dy = -1, y = -1, indices = -1, dx = -1;  // boundary input / output slots
  plx_dtype dtype = PLX_DTYPE_NONE;
};
inline ReluMaxPoolBackwardSlots relu_max_pool_backward_slots(const GraphView& g, const Boundary& b) {
  PLX_DECLINE_UNLESS(g.num_nodes() == 2 && g.is(0, "relu_backward") && g.is(1, "max_pool2d_backward"),
                     "not relu_backward then max_pool2d_backward");
  const plx_graph_node& relu = g.node(0);
  const plx_graph_node& pool = g.node(1);
  PLX_DECLINE_UNLESS(b.output(relu.outputs[0]) < 0, "the ReLU's gradient is needed outside");
  ReluMaxPoolBackwardSlots s;
  s.dy = b.input(relu.inputs[0]);
  s.y = b.input(relu.inputs[1]);
  s.indices = b.input(pool.inputs[1]);
  s.dx = b.output(pool.outputs[0]);
  PLX_DECLINE_UNLESS(s.dy >= 0 && s.y >= 0 && s.indices >= 0 && s.dx >= 0,
                     "an input or output is not at the boundary");
  const plx_tensor& tdy = g.value(relu.inputs[0]);
  const plx_tensor& ty = g.value(relu.inputs[1]);
  PLX_DECLINE_UNLESS(tdy.dtype == ty.dtype && numel(tdy) == numel(ty), "dy and y differ");
  s.dtype = static_cast<plx_dtype>(tdy.dtype);
  return s;
}

// The classifier head: linear(x, w[, b]) -> [cast to f32] -> softmax_cross_entropy(logits,
// labels), with argmax(logits, axis 1) and the loss's softmax_cross_entropy_backward when the
// graph allows, as one kernel: the logits and log_probs then never exist outside it.
//
// find_linear_cross_entropy() gives, per head, the groups a backend may claim, largest first
// (the backend claims them in turn until the core accepts one):
//  - the linear's output (or the cast's, a widening f16/bf16 -> f32 cast of mixed precision,
//    whose input nothing else reads) is read by the cross-entropy as its logits and otherwise
//    only by one argmax over the classes (axis 1), which may join the group; any other reader:
//    no group;
//  - the backward may join when its log_probs are this cross-entropy's, read by nothing else,
//    with the same labels and attributes;
//  - a group runs where its last node runs, so no node outside it between its first and last
//    node may read a value it writes (the core's rule). A node that reads the loss right after
//    the cross-entropy (a `mul` by a scale, say) keeps the backward and the argmax after it out:
//    the group is then linear + cross-entropy, writing the logits for the argmax and log_probs
//    for the backward. (The core's training steps seed backward with their loss scales instead,
//    so no such node is there.)
// linear_cross_entropy_slots() is the one parser of such a group for create_fused().
struct LinearCrossEntropyCandidates {
  std::vector<std::vector<int32_t>> groups;  // ascending node ids, largest group first
};

namespace detail {
// Whether `nodes` (ascending) could run at the last one's place: no node outside the group
// between the first and the last reads a value one of them writes. (The core checks more, such
// as values written in place; this only keeps claims it would refuse out of the log.)
inline bool runs_at_last(const GraphView& g, const std::vector<int32_t>& nodes) {
  for (int32_t k = nodes.front() + 1; k < nodes.back(); ++k) {
    if (std::find(nodes.begin(), nodes.end(), k) != nodes.end()) continue;
    const plx_graph_node& other = g.node(k);
    for (int32_t i = 0; i < other.num_inputs; ++i) {
      const int32_t v = other.inputs[i];
      if (!g.valid(v)) continue;
      const int32_t p = g.producer(v);
      if (p >= 0 && std::find(nodes.begin(), nodes.end(), p) != nodes.end()) return false;
    }
  }
  return true;
}
// The argmax reads a 2-D tensor along axis 1 (or -1).
inline bool argmax_over_classes(const GraphView& g, int32_t n) {
  const plx_graph_node& a = g.node(n);
  if (a.num_inputs < 1 || !g.valid(a.inputs[0]) || g.value(a.inputs[0]).ndim != 2) return false;
  const plx_attr* axis = g.find_attr(n, "axis");
  return axis && axis->type == PLX_ATTR_INT && (axis->i == 1 || axis->i == -1);
}
// A cast from f16/bf16 to f32: exact, so the fused kernel may widen the rounded logits itself.
inline bool widening_cast(const GraphView& g, int32_t n) {
  const plx_graph_node& c = g.node(n);
  if (c.num_inputs != 1 || c.num_outputs != 1 || !g.valid(c.inputs[0])) return false;
  const int32_t from = g.value(c.inputs[0]).dtype, to = g.value(c.outputs[0]).dtype;
  return (from == PLX_F16 || from == PLX_BF16) && to == PLX_F32;
}
// Node n's int attribute, `def` where it has none.
inline int64_t int_attr_or(const GraphView& g, int32_t n, std::string_view name, int64_t def) {
  const plx_attr* a = g.find_attr(n, name);
  return a && a->type == PLX_ATTR_INT ? a->i : def;
}
// The linear's dx: matmul(dl, w) with neither operand transposed and alpha 1, 2-D.
inline bool linear_dx_matmul(const GraphView& g, int32_t n, int32_t dl, int32_t w) {
  if (!g.is(n, "matmul")) return false;
  const plx_graph_node& m = g.node(n);
  const plx_attr* alpha = g.find_attr(n, "alpha");
  return m.num_inputs == 2 && m.num_outputs == 1 && m.inputs[0] == dl && m.inputs[1] == w &&
         int_attr_or(g, n, "trans_a", 0) == 0 && int_attr_or(g, n, "trans_b", 0) == 0 &&
         (!alpha || (alpha->type == PLX_ATTR_FLOAT && alpha->f == 1.0)) &&
         g.value(m.outputs[0]).ndim == 2;
}
// The linear's bias gradient: sum(dl) over axis 0 only (dl is 2-D).
inline bool linear_db_sum(const GraphView& g, int32_t n, int32_t dl) {
  if (!g.is(n, "sum")) return false;
  const plx_graph_node& s = g.node(n);
  const plx_attr* axes = g.find_attr(n, "axes");
  return s.num_inputs == 1 && s.num_outputs == 1 && s.inputs[0] == dl && axes &&
         axes->type == PLX_ATTR_INTS && axes->count == 1 &&
         (axes->ints[0] == 0 || axes->ints[0] == -2);
}
}  // namespace detail

inline std::vector<LinearCrossEntropyCandidates> find_linear_cross_entropy(const GraphView& g,
                                                                           bool linear_backward = false) {
  std::vector<LinearCrossEntropyCandidates> heads;
  for (int32_t ce = 0; ce < g.num_nodes(); ++ce) {
    if (!g.is(ce, "softmax_cross_entropy")) continue;
    const plx_graph_node& cen = g.node(ce);
    if (cen.num_inputs != 2 || cen.num_outputs != 2 || !g.valid(cen.inputs[0])) continue;
    const int32_t logits = cen.inputs[0];
    if (cen.inputs[1] == logits) continue;
    int32_t producer = g.producer(logits), cast = -1;
    if (producer < 0) continue;
    if (g.is(producer, "cast")) {
      if (!detail::widening_cast(g, producer)) continue;
      const int32_t pre = g.node(producer).inputs[0];
      if (g.readers(pre).size() != 1) continue;  // the rounded logits are read elsewhere
      cast = producer;
      producer = g.producer(pre);
      if (producer < 0) continue;
    }
    if (!g.is(producer, "linear")) continue;
    const plx_graph_node& lin = g.node(producer);
    if (lin.num_inputs < 2 || lin.num_outputs != 1 || !g.valid(lin.inputs[0]) ||
        !g.valid(lin.inputs[1]) || g.value(lin.inputs[0]).ndim != 2)
      continue;
    // The logits' other readers: at most one argmax over the classes.
    int32_t argmax = -1;
    bool other = false;
    for (int32_t r : g.readers(logits)) {
      if (r == ce) continue;
      if (argmax < 0 && g.is(r, "argmax") && g.node(r).num_inputs == 1 &&
          detail::argmax_over_classes(g, r))
        argmax = r;
      else
        other = true;
    }
    if (other) continue;
    // The backward: reads this cross-entropy's log_probs (and nothing else does), same labels
    // and attributes, dloss from outside.
    int32_t bwd = -1;
    const auto& lp_readers = g.readers(cen.outputs[1]);
    if (lp_readers.size() == 1 && g.is(lp_readers[0], "softmax_cross_entropy_backward")) {
      const plx_graph_node& b = g.node(lp_readers[0]);
      if (b.num_inputs == 3 && b.num_outputs == 1 && b.inputs[1] == cen.outputs[1] &&
          b.inputs[2] == cen.inputs[1] && b.inputs[0] != cen.outputs[0] &&
          b.inputs[0] != cen.outputs[1] && same_attrs(cen, b))
        bwd = lp_readers[0];
    }
    // The linear's own backward (`linear_backward`): dx = matmul(dl, w) and db = sum(dl, axis
    // 0), where dl is dlogits or, after the mixed-precision cast, the narrowing cast of them
    // back to the linear's dtype (which then joins too). dw (a sum over the rows) stays out.
    std::vector<int32_t> dx_db;  // [dcast,] dx [, db]
    if (linear_backward && bwd >= 0) {
      int32_t dl = g.node(bwd).outputs[0], dcast = -1;
      if (cast >= 0) {
        const auto& r = g.readers(dl);
        if (r.size() == 1 && g.is(r[0], "cast") && g.node(r[0]).num_outputs == 1 &&
            g.value(g.node(r[0]).outputs[0]).dtype == g.value(lin.outputs[0]).dtype) {
          dcast = r[0];
          dl = g.node(dcast).outputs[0];
        } else {
          dl = -1;
        }
      }
      int32_t dx = -1, db = -1;
      if (dl >= 0)
        for (int32_t r : g.readers(dl)) {
          if (dx < 0 && detail::linear_dx_matmul(g, r, dl, lin.inputs[1])) dx = r;
          else if (db < 0 && lin.num_inputs >= 3 && g.valid(lin.inputs[2]) &&
                   detail::linear_db_sum(g, r, dl))
            db = r;
        }
      if (dx >= 0) {
        if (dcast >= 0) dx_db.push_back(dcast);
        dx_db.push_back(dx);
        if (db >= 0) dx_db.push_back(db);
      }
    }
    LinearCrossEntropyCandidates head;
    auto add = [&](bool with_argmax, bool with_bwd, size_t extra = 0) {
      std::vector<int32_t> nodes{producer, ce};
      if (cast >= 0) nodes.push_back(cast);
      if (with_argmax) nodes.push_back(argmax);
      if (with_bwd) nodes.push_back(bwd);
      nodes.insert(nodes.end(), dx_db.begin(), dx_db.begin() + static_cast<std::ptrdiff_t>(extra));
      std::sort(nodes.begin(), nodes.end());
      if (detail::runs_at_last(g, nodes)) head.groups.push_back(std::move(nodes));
    };
    // Largest first (the backward before the argmax: it saves log_probs). An argmax left out
    // between the first and last node reads the logits: runs_at_last() drops that group. With
    // the linear's backward: dx and db, then dx alone (db may come after dw's matmul, which
    // reads dl).
    std::vector<size_t> extras;
    if (!dx_db.empty()) extras.push_back(dx_db.size());
    if (dx_db.size() >= 2 && g.is(dx_db.back(), "sum")) extras.push_back(dx_db.size() - 1);
    for (size_t extra : extras) {
      if (argmax >= 0) add(true, true, extra);
      add(false, true, extra);
    }
    if (bwd >= 0 && argmax >= 0) add(true, true);
    if (bwd >= 0) add(false, true);
    if (argmax >= 0) add(true, false);
    add(false, false);
    if (!head.groups.empty()) heads.push_back(std::move(head));
  }
  return heads;
}

// Where create_fused()'s boundary puts each value of a linear + cross-entropy group, which node
// of the group is which, and the shapes and dtypes. Outputs at -1 are internal to the group
// (never written: they have no memory). Declines (Unsupported) any other group.
struct LinearCrossEntropySlots {
  // Nodes, as indices into the group's view; -1 where absent. dcast, dx_matmul and db_sum: the
  // linear's backward (find_linear_cross_entropy's linear_backward).
  int32_t linear = -1, cast = -1, ce = -1, argmax = -1, backward = -1;
  int32_t dcast = -1, dx_matmul = -1, db_sum = -1;
  // Boundary inputs; bias and dloss -1 where absent.
  int32_t x = -1, w = -1, bias = -1, labels = -1, dloss = -1;
  // Boundary outputs: the linear's output, the cast's, the loss, log_probs, argmax's, dlogits;
  // dlogits cast back to the linear's dtype, the linear's dx and db.
  int32_t logits = -1, cast_logits = -1, loss = -1, log_probs = -1, pred = -1, dlogits = -1;
  int32_t dlogits_cast = -1, dx = -1, db = -1;
  plx_dtype dtype = PLX_DTYPE_NONE;       // the linear's (x, w, b, its output)
  plx_dtype loss_dtype = PLX_DTYPE_NONE;  // the cross-entropy's (f32 after a cast, else dtype)
  plx_dtype label_dtype = PLX_DTYPE_NONE;
  int64_t n = 0, k = 0, c = 0;  // x (n, k), w (c, k)
};
namespace detail {
// Sets each node's slot by its op (ops and slots in pairs); declines (Unsupported) a node of
// another op, or a second node of one op, as not a `what` group.
// `twice`: an op that may have two nodes, the second going to `second`.
inline void assign_nodes(const GraphView& g,
                         std::initializer_list<std::pair<std::string_view, int32_t*>> slots,
                         const char* what, std::string_view twice = {},
                         int32_t* second = nullptr) {
  for (int32_t n = 0; n < g.num_nodes(); ++n) {
    int32_t* slot = nullptr;
    for (const auto& [op, at] : slots)
      if (g.is(n, op)) slot = at;
    if (slot && *slot >= 0 && second && g.is(n, twice)) slot = second;
    PLX_DECLINE_UNLESS(slot && *slot < 0, "not a %s group (%s)", what, g.node(n).op);
    *slot = n;
  }
}
}  // namespace detail

inline LinearCrossEntropySlots linear_cross_entropy_slots(const GraphView& g, const Boundary& b) {
  LinearCrossEntropySlots s;
  // Two casts at most: the logits' (its input comes from the linear) and dlogits' (from the
  // backward), told apart once the rest are known.
  int32_t casts[2] = {-1, -1}, cast2 = -1;
  detail::assign_nodes(g,
                       {{"linear", &s.linear},
                        {"cast", &casts[0]},
                        {"softmax_cross_entropy", &s.ce},
                        {"argmax", &s.argmax},
                        {"softmax_cross_entropy_backward", &s.backward},
                        {"matmul", &s.dx_matmul},
                        {"sum", &s.db_sum}},
                       "linear + softmax_cross_entropy", "cast", &cast2);
  casts[1] = cast2;
  PLX_DECLINE_UNLESS(s.linear >= 0 && s.ce >= 0, "a linear and a softmax_cross_entropy expected");
  const plx_graph_node& lin = g.node(s.linear);
  const plx_graph_node& ce = g.node(s.ce);
  PLX_DECLINE_UNLESS(lin.num_inputs >= 2 && lin.num_outputs == 1 && ce.num_inputs == 2 &&
                         ce.num_outputs == 2,
                     "unexpected arity");
  const int32_t z = lin.outputs[0];
  for (int32_t c : casts) {
    if (c < 0) continue;
    PLX_DECLINE_UNLESS(g.node(c).num_inputs == 1 && g.node(c).num_outputs == 1, "unexpected arity");
    int32_t& slot = g.node(c).inputs[0] == z ? s.cast : s.dcast;
    PLX_DECLINE_UNLESS(slot < 0, "two casts of the logits");
    slot = c;
  }
  int32_t logits = z;
  if (s.cast >= 0) {
    PLX_DECLINE_UNLESS(detail::widening_cast(g, s.cast) && g.node(s.cast).inputs[0] == z,
                       "the cast is not an f16/bf16 -> f32 cast of the linear's output");
    logits = g.node(s.cast).outputs[0];
  }
  PLX_DECLINE_UNLESS(ce.inputs[0] == logits, "the cross-entropy does not read the logits");
  if (s.argmax >= 0)
    PLX_DECLINE_UNLESS(g.node(s.argmax).num_inputs == 1 && g.node(s.argmax).inputs[0] == logits &&
                           detail::argmax_over_classes(g, s.argmax),
                       "the argmax is not over the logits' classes");
  if (s.backward >= 0) {
    const plx_graph_node& bw = g.node(s.backward);
    PLX_DECLINE_UNLESS(bw.num_inputs == 3 && bw.num_outputs == 1 && bw.inputs[1] == ce.outputs[1] &&
                           bw.inputs[2] == ce.inputs[1] && same_attrs(ce, bw),
                       "the backward is not this cross-entropy's");
    s.dloss = b.input(bw.inputs[0]);
    PLX_DECLINE_UNLESS(s.dloss >= 0, "dloss comes from inside the group");
    s.dlogits = b.output(bw.outputs[0]);
  }
  s.x = b.input(lin.inputs[0]);
  s.w = b.input(lin.inputs[1]);
  if (lin.num_inputs >= 3 && g.valid(lin.inputs[2])) {
    s.bias = b.input(lin.inputs[2]);
    PLX_DECLINE_UNLESS(s.bias >= 0, "the bias comes from inside the group");
  }
  s.labels = b.input(ce.inputs[1]);
  PLX_DECLINE_UNLESS(s.x >= 0 && s.w >= 0 && s.labels >= 0,
                     "x, w or the labels come from inside the group");
  s.logits = b.output(z);
  if (s.cast >= 0) s.cast_logits = b.output(logits);
  s.loss = b.output(ce.outputs[0]);
  s.log_probs = b.output(ce.outputs[1]);
  if (s.argmax >= 0) s.pred = b.output(g.node(s.argmax).outputs[0]);
  const plx_tensor& x = g.value(lin.inputs[0]);
  const plx_tensor& w = g.value(lin.inputs[1]);
  PLX_DECLINE_UNLESS(x.ndim == 2 && w.ndim == 2 && x.shape[1] == w.shape[1],
                     "linear: x (N, K) and w (C, K) expected");
  s.n = x.shape[0];
  s.k = x.shape[1];
  s.c = w.shape[0];
  s.dtype = static_cast<plx_dtype>(x.dtype);
  PLX_DECLINE_UNLESS(w.dtype == x.dtype && g.value(z).dtype == x.dtype &&
                         (s.bias < 0 || g.value(lin.inputs[2]).dtype == x.dtype),
                     "linear: mixed dtypes");
  s.loss_dtype = static_cast<plx_dtype>(g.value(logits).dtype);
  PLX_DECLINE_UNLESS(g.value(ce.outputs[0]).dtype == s.loss_dtype &&
                         (s.backward < 0 ||
                          g.value(g.node(s.backward).inputs[0]).dtype == s.loss_dtype),
                     "the loss, dloss and logits differ in dtype");
  s.label_dtype = static_cast<plx_dtype>(g.value(ce.inputs[1]).dtype);
  PLX_DECLINE_UNLESS(s.label_dtype == PLX_I32 || s.label_dtype == PLX_I64,
                     "labels must be i32 or i64");
  // The linear's backward: dl is dlogits, or their cast back to the linear's dtype (which the
  // mixed-precision group needs, and only it).
  if (s.dcast >= 0 || s.dx_matmul >= 0 || s.db_sum >= 0) {
    PLX_DECLINE_UNLESS(s.backward >= 0 && s.dx_matmul >= 0,
                       "the linear's backward without the loss's backward or dx");
    int32_t dl = g.node(s.backward).outputs[0];
    PLX_DECLINE_UNLESS((s.cast >= 0) == (s.dcast >= 0),
                       "dlogits are cast back only after the logits were cast");
    if (s.dcast >= 0) {
      PLX_DECLINE_UNLESS(g.node(s.dcast).inputs[0] == dl &&
                             g.value(g.node(s.dcast).outputs[0]).dtype == s.dtype,
                         "the second cast is not dlogits' cast to the linear's dtype");
      dl = g.node(s.dcast).outputs[0];
      s.dlogits_cast = b.output(dl);
    }
    PLX_DECLINE_UNLESS(detail::linear_dx_matmul(g, s.dx_matmul, dl, lin.inputs[1]),
                       "the matmul is not the linear's dx");
    const plx_tensor& dxv = g.value(g.node(s.dx_matmul).outputs[0]);
    PLX_DECLINE_UNLESS(dxv.dtype == s.dtype && dxv.shape[0] == s.n && dxv.shape[1] == s.k,
                       "dx is not (N, K) in the linear's dtype");
    s.dx = b.output(g.node(s.dx_matmul).outputs[0]);
    if (s.db_sum >= 0) {
      PLX_DECLINE_UNLESS(s.bias >= 0 && detail::linear_db_sum(g, s.db_sum, dl),
                         "the sum is not the linear's bias gradient");
      const plx_tensor& dbv = g.value(g.node(s.db_sum).outputs[0]);
      PLX_DECLINE_UNLESS(dbv.dtype == s.dtype && numel(dbv) == s.c,
                         "db is not (C) in the linear's dtype");
      s.db = b.output(g.node(s.db_sum).outputs[0]);
    }
    PLX_DECLINE_UNLESS(s.dx >= 0 && (s.db_sum < 0 || s.db >= 0), "dx or db is not written");
  }
  return s;
}

// For a group of independent nodes (from same_op_groups): where each node's inputs are among
// create_fused()'s inputs, so compute() finds node n's input k. Every present input must come
// from outside the group.
// With `member` given, the group's members are its nodes of that op (numbered in view order)
// and each other node must make one member input from one outside value (a one-input,
// one-output node, such as a cast widening the gradient an update reads): the member's input
// is then that outside value, and feeder(n, k) names the node that was skipped.
class GroupInputs {
 public:
  GroupInputs(const GraphView& g, const Boundary& b, std::string_view member = {}) {
    for (int32_t n = 0; n < g.num_nodes(); ++n) {
      if (!member.empty() && !g.is(n, member)) continue;
      const plx_graph_node& node = g.node(n);
      auto& slots = slots_.emplace_back();
      auto& feeders = feeders_.emplace_back();
      for (int32_t k = 0; k < node.num_inputs; ++k) {
        int32_t v = node.inputs[k];
        feeders.push_back(-1);
        if (!g.valid(v)) {
          slots.push_back(-1);
          continue;
        }
        if (const int32_t f = g.producer(v); !member.empty() && f >= 0) {
          const plx_graph_node& fn = g.node(f);
          PLX_DECLINE_UNLESS(fn.num_inputs == 1 && fn.num_outputs == 1 && g.valid(fn.inputs[0]),
                             "%s: input %d is made in the group by a %s, not one value's", node.op,
                             k, fn.op);
          feeders.back() = f;
          v = fn.inputs[0];
        }
        PLX_DECLINE_UNLESS(b.input(v) >= 0, "%s: input %d comes from inside the group", node.op, k);
        slots.push_back(b.input(v));
      }
      PLX_REQUIRE(node.num_inputs >= 1 && g.valid(node.inputs[0]), "%s: no input 0", node.op);
      numel_.push_back(sdk::numel(g.value(node.inputs[0])));
    }
  }
  int32_t nodes() const { return static_cast<int32_t>(slots_.size()); }
  bool has(int32_t n, int32_t k) const {
    const auto& s = slots_[static_cast<size_t>(n)];
    return k < static_cast<int32_t>(s.size()) && s[static_cast<size_t>(k)] >= 0;
  }
  // Node n's input k in this call; an absent input has dtype PLX_DTYPE_NONE.
  plx_tensor get(const KernelCall& c, int32_t n, int32_t k) const {
    if (!has(n, k)) {
      plx_tensor t{};
      t.dtype = PLX_DTYPE_NONE;
      return t;
    }
    return c.in(slots_[static_cast<size_t>(n)][static_cast<size_t>(k)]);
  }
  // Elements of node n's input 0.
  int64_t numel(int32_t n) const { return numel_[static_cast<size_t>(n)]; }
  // Where node n's input k is among create_fused()'s inputs, or -1 where it is absent.
  int32_t slot(int32_t n, int32_t k) const {
    return has(n, k) ? slots_[static_cast<size_t>(n)][static_cast<size_t>(k)] : -1;
  }
  // The group's node that made node n's input k (with `member`), or -1.
  int32_t feeder(int32_t n, int32_t k) const {
    const auto& f = feeders_[static_cast<size_t>(n)];
    return k < static_cast<int32_t>(f.size()) ? f[static_cast<size_t>(k)] : -1;
  }

 private:
  std::vector<std::vector<int32_t>> slots_, feeders_;
  std::vector<int64_t> numel_;
};

// Nodes [producer, e1, e2, ...] where e1 is one of `epilogues` reading only the producer's
// output 0 as its input 0, e2 reads only e1's output, and so on; each intermediate output has no
// other reader. One chain per producer of one of `producers`, longest first.
inline std::vector<std::vector<int32_t>> find_epilogue_chains(
    const GraphView& g, const std::vector<std::string_view>& producers,
    const std::vector<std::string_view>& epilogues) {
  auto any_of = [&](int32_t n, const std::vector<std::string_view>& ops) {
    for (std::string_view op : ops)
      if (g.is(n, op)) return true;
    return false;
  };
  std::vector<std::vector<int32_t>> chains;
  for (int32_t p = 0; p < g.num_nodes(); ++p) {
    if (!any_of(p, producers) || g.node(p).num_outputs < 1) continue;
    std::vector<int32_t> chain{p};
    int32_t cur = p;
    for (;;) {
      const int32_t v = g.node(cur).outputs[0];
      const auto& r = g.readers(v);
      if (r.size() != 1) break;
      const int32_t e = r[0];
      const plx_graph_node& en = g.node(e);
      if (!any_of(e, epilogues) || en.num_inputs < 1 || en.inputs[0] != v || en.num_outputs < 1)
        break;
      bool other_use = false;  // the value also read through another input of the epilogue
      for (int32_t k = 1; k < en.num_inputs; ++k) other_use = other_use || en.inputs[k] == v;
      const plx_tensor& a = g.value(v);
      const plx_tensor& b = g.value(en.outputs[0]);
      if (other_use || a.dtype != b.dtype || numel(a) != numel(b)) break;
      chain.push_back(e);
      cur = e;
    }
    if (chain.size() > 1) chains.push_back(std::move(chain));
  }
  return chains;
}

// Pairs {a, b}: a node of op `first` whose output 0 is read by nobody but a node b of op
// `second`, as b's input `input` (and through no other input of b). For a consumer that can
// apply an elementwise producer as it reads, e.g. relu_backward feeding max_pool2d_backward.
inline std::vector<std::vector<int32_t>> find_feeding_pairs(const GraphView& g,
                                                            std::string_view first,
                                                            std::string_view second,
                                                            int32_t input) {
  std::vector<std::vector<int32_t>> pairs;
  for (int32_t a = 0; a < g.num_nodes(); ++a) {
    if (!g.is(a, first) || g.node(a).num_outputs < 1) continue;
    const int32_t v = g.node(a).outputs[0];
    const auto& rd = g.readers(v);
    if (rd.size() != 1 || !g.is(rd[0], second)) continue;
    const plx_graph_node& b = g.node(rd[0]);
    int32_t uses = 0;
    for (int32_t k = 0; k < b.num_inputs; ++k) uses += b.inputs[k] == v;
    if (input < b.num_inputs && b.inputs[input] == v && uses == 1) pairs.push_back({a, rd[0]});
  }
  return pairs;
}

// Pairs {p, a}: a node of op `producer` and a node a of op `act` that reads p's output 0 as
// its input 0 (through no other input), of the same dtype and size. Unlike
// find_epilogue_chains, p's output may have other readers: in training an activation's
// backward reads its input (gelu_backward reads the pre-activation), so a kernel that applies
// the activation in the producer's epilogue also writes the pre-activation where the group's
// boundary lists it among the outputs (linear -> gelu).
inline std::vector<std::vector<int32_t>> find_activation_pairs(const GraphView& g,
                                                               std::string_view producer,
                                                               std::string_view act) {
  std::vector<std::vector<int32_t>> pairs;
  for (int32_t p = 0; p < g.num_nodes(); ++p) {
    if (!g.is(p, producer) || g.node(p).num_outputs < 1) continue;
    const int32_t v = g.node(p).outputs[0];
    for (int32_t r : g.readers(v)) {
      const plx_graph_node& a = g.node(r);
      if (!g.is(r, act) || a.num_inputs < 1 || a.inputs[0] != v || a.num_outputs < 1) continue;
      int32_t uses = 0;
      for (int32_t k = 0; k < a.num_inputs; ++k) uses += a.inputs[k] == v;
      const plx_tensor& x = g.value(v);
      const plx_tensor& y = g.value(a.outputs[0]);
      if (uses == 1 && x.dtype == y.dtype && numel(x) == numel(y)) {
        pairs.push_back({p, r});
        break;
      }
    }
  }
  return pairs;
}

// A producer and in-place epilogues from find_epilogue_chains(), run by the backend's own
// kernels: the producer writes into the last epilogue's output buffer and each epilogue runs over
// it in place, so the intermediates never exist. Declines (Unsupported) when an intermediate is
// needed outside the group, or an epilogue's kernel cannot run in place.
class EpilogueChain final : public Kernel {
 public:
  EpilogueChain(Backend& backend, const GraphView& g, const Boundary& b) {
    const plx_graph_view& v = g.raw();
    PLX_DECLINE_UNLESS(v.num_nodes >= 2, "an epilogue chain needs two nodes or more");
    for (int32_t n = 0; n < v.num_nodes; ++n)
      PLX_DECLINE_UNLESS(v.nodes[n].num_outputs >= 1 && v.nodes[n].num_inputs >= 1,
                         "%s has no output to chain", v.nodes[n].op);
    for (int32_t n = 1; n < v.num_nodes; ++n)
      PLX_DECLINE_UNLESS(v.nodes[n].inputs[0] == v.nodes[n - 1].outputs[0],
                         "%s does not read %s's output as its first input", v.nodes[n].op,
                         v.nodes[n - 1].op);
    // The chain's running value: the producer's output 0, then each epilogue's output 0.
    const int32_t last_out = v.nodes[v.num_nodes - 1].outputs[0];
    const int32_t final_slot = b.output(last_out);
    PLX_DECLINE_UNLESS(final_slot >= 0, "the chain's result is not read outside it");
    for (int32_t n = 0; n < v.num_nodes; ++n) {
      OwnedNodeInfo info(g, n);
      Step st;
      st.kernel = std::make_unique<NodeKernel>(backend, info.get(), v.nodes[n].kernel_hint);
      flags_ &= st.kernel->table().flags;
      workspace_ = std::max(workspace_, st.kernel->workspace_bytes());
      const plx_graph_node& node = v.nodes[n];
      for (int32_t k = 0; k < node.num_inputs; ++k) {
        const int32_t in = node.inputs[k];
        if (n > 0 && k == 0) {
          st.in.push_back(Slot{Slot::Output, final_slot});  // the running value, in place
        } else if (!g.valid(in)) {
          st.in.push_back(Slot{});
        } else {
          PLX_DECLINE_UNLESS(b.input(in) >= 0, "%s's input %d comes from inside the group",
                             node.op, k);
          st.in.push_back(Slot{Slot::Input, b.input(in)});
        }
      }
      for (int32_t k = 0; k < node.num_outputs; ++k) {
        const int32_t out = node.outputs[k];
        const bool chained = k == 0 && n + 1 < v.num_nodes;
        if (chained) {
          PLX_DECLINE_UNLESS(b.output(out) < 0,
                             "%s's output is also needed outside the chain", node.op);
          st.out.push_back(Slot{Slot::Output, final_slot});
        } else {
          const int32_t o = b.output(out);
          PLX_DECLINE_UNLESS(o >= 0 || (k == 0 && out == last_out),
                             "%s's output %d is not among the fused outputs", node.op, k);
          st.out.push_back(Slot{Slot::Output, o});
        }
      }
      if (n > 0)
        PLX_DECLINE_UNLESS(st.kernel->table().flags & PLX_KERNEL_INPLACE,
                           "%s's kernel %s cannot run in place", node.op, st.kernel->table().impl);
      // Channels-last as a whole where the producer's kernel takes either layout and each
      // epilogue is a dense map over the running value alone (the host describes the values
      // inside the group in the layout of the group's output of their shape, abi/ops.h).
      if (n == 0) {
        nhwc_ = st.kernel->table().layout == PLX_LAYOUT_NHWC;
      } else {
        bool alone = (st.kernel->table().flags & PLX_KERNEL_DENSE) != 0;
        const plx_tensor& y = g.value(node.outputs[0]);
        for (int32_t k = 1; k < node.num_inputs && alone; ++k) {
          if (!g.valid(node.inputs[k])) continue;
          const plx_tensor& t = g.value(node.inputs[k]);
          bool same = t.ndim == y.ndim;
          for (int32_t i = 0; same && i < t.ndim; ++i) same = t.shape[i] == y.shape[i];
          alone = !same;
        }
        nhwc_ = nhwc_ && alone;
      }
      steps_.push_back(std::move(st));
    }
  }

  uint32_t flags() const { return flags_ & ~static_cast<uint32_t>(PLX_KERNEL_INPLACE); }
  // PLX_LAYOUT_NHWC where the chain as a whole takes each boundary tensor in either layout.
  plx_layout layout() const { return nhwc_ ? PLX_LAYOUT_NHWC : PLX_LAYOUT_ANY; }
  uint64_t workspace_bytes() const override { return workspace_; }

  void compute(const KernelCall& c) override {
    for (Step& st : steps_) {
      st.in_t.resize(st.in.size());
      st.out_t.resize(st.out.size());
      for (size_t k = 0; k < st.in.size(); ++k) st.in_t[k] = resolve(c, st.in[k]);
      for (size_t k = 0; k < st.out.size(); ++k) st.out_t[k] = resolve(c, st.out[k]);
      st.kernel->compute(st.in_t, st.out_t, c.workspace, c.workspace_bytes, c.stream);
    }
  }

 private:
  struct Step {
    std::unique_ptr<NodeKernel> kernel;
    std::vector<Slot> in, out;
    std::vector<plx_tensor> in_t, out_t;  // filled per call
  };

  static plx_tensor resolve(const KernelCall& c, const Slot& s) {
    switch (s.kind) {
      case Slot::Input: return c.in(s.index);
      case Slot::Output: return c.out(s.index);
      default: {
        plx_tensor t{};
        t.dtype = PLX_DTYPE_NONE;
        return t;
      }
    }
  }

  bool nhwc_ = false;
  std::vector<Step> steps_;
  uint64_t workspace_ = 0;
  uint32_t flags_ = ~0u;
};

// Groups of nodes of op `op` that share dtype (of input 0), attributes and the values at the
// inputs listed in `shared` (e.g. the learning rate), in graph order; groups of one are left out.
// For multi-tensor kernels over the optimizer's per-parameter updates.
inline std::vector<std::vector<int32_t>> same_op_groups(const GraphView& g, std::string_view op,
                                                        const std::vector<int32_t>& shared) {
  std::vector<std::vector<int32_t>> groups;
  for (int32_t n = 0; n < g.num_nodes(); ++n) {
    if (!g.is(n, op) || g.node(n).num_inputs < 1 || !g.valid(g.node(n).inputs[0])) continue;
    bool placed = false;
    for (auto& grp : groups) {
      const plx_graph_node& a = g.node(grp[0]);
      const plx_graph_node& b = g.node(n);
      bool same = a.num_inputs == b.num_inputs &&
                  g.value(a.inputs[0]).dtype == g.value(b.inputs[0]).dtype && same_attrs(a, b);
      for (int32_t k : shared) same = same && k < a.num_inputs && a.inputs[k] == b.inputs[k];
      if (same) {
        grp.push_back(n);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({n});
  }
  std::erase_if(groups, [](const auto& grp) { return grp.size() < 2; });
  return groups;
}

}  // namespace plexus::sdk
