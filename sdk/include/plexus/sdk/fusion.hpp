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
// group reads never get memory. create_fused() may decline (throw Unsupported); the nodes then
// run one by one.
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
#include <cstdint>
#include <deque>
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

// One node of a view as a plx_node_info, for creating a per-node kernel. Owns its arrays.
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
    info_.struct_size = sizeof info_;
    info_.device = g.device();
    info_.op = node.op;
    info_.num_inputs = node.num_inputs;
    info_.num_outputs = node.num_outputs;
    info_.inputs = inputs_.data();
    info_.outputs = outputs_.data();
    info_.attrs = node.attrs;
    info_.num_attrs = node.num_attrs;
  }
  OwnedNodeInfo(const OwnedNodeInfo&) = delete;
  OwnedNodeInfo& operator=(const OwnedNodeInfo&) = delete;
  const plx_node_info& get() const { return info_; }

 private:
  std::vector<plx_tensor> inputs_, outputs_;
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

// plx_kernel tables for a backend's fused kernels, one per (name, dtype, flags), with stable
// addresses until the backend is destroyed. The state behind each is a sdk::Kernel. Thread-safe.
class FusedTables {
 public:
  // Hands `k` back to the core as create_fused()'s results.
  void give(const std::string& name, plx_dtype dtype, uint32_t flags, std::unique_ptr<Kernel> k,
            const plx_kernel** kernel, void** state, uint64_t* workspace_bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      *kernel = table(name, dtype, flags);
    }
    *workspace_bytes = k->workspace_bytes();
    *state = k.release();
  }

 private:
  const plx_kernel* table(const std::string& name, plx_dtype dtype, uint32_t flags) {
    for (const Entry& e : entries_)
      if (e.name == name && e.table.dtype == dtype && e.table.flags == flags) return &e.table;
    Entry& e = entries_.emplace_back();
    e.name = name;
    e.table.struct_size = sizeof(plx_kernel);
    e.table.flags = flags;
    e.table.op = e.name.c_str();
    e.table.impl = e.name.c_str();
    e.table.dtype = dtype;
    e.table.layout = PLX_LAYOUT_ANY;
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

// For a group of independent nodes (from same_op_groups): where each node's inputs are among
// create_fused()'s inputs, so compute() finds node n's input k. Every present input must come
// from outside the group.
class GroupInputs {
 public:
  GroupInputs(const GraphView& g, const Boundary& b) {
    for (int32_t n = 0; n < g.num_nodes(); ++n) {
      const plx_graph_node& node = g.node(n);
      auto& slots = slots_.emplace_back();
      for (int32_t k = 0; k < node.num_inputs; ++k) {
        const int32_t v = node.inputs[k];
        if (!g.valid(v)) {
          slots.push_back(-1);
          continue;
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

 private:
  std::vector<std::vector<int32_t>> slots_;
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
      steps_.push_back(std::move(st));
    }
  }

  uint32_t flags() const { return flags_ & ~static_cast<uint32_t>(PLX_KERNEL_INPLACE); }
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
