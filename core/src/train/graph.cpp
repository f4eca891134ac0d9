#include "plexus/graph.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <cstring>
#include <sstream>

#include "plexus/error.hpp"
#include "plexus/tensor.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus {

const char* value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::Input: return "input";
    case ValueKind::Parameter: return "parameter";
    case ValueKind::State: return "state";
    case ValueKind::Constant: return "constant";
    case ValueKind::Activation: return "activation";
  }
  return "?";
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Update: return "update";
  }
  return "?";
}

// ---- initialisation specs ----

std::string InitSpec::describe() const {
  std::ostringstream s;
  switch (kind) {
    case Kind::Zeros: return "zeros";
    case Kind::Ones: return "ones";
    case Kind::Constant: s << "constant(" << a << ")"; break;
    case Kind::Uniform: s << "uniform(" << a << ", " << b << ")"; break;
    case Kind::Normal: s << "normal(" << a << ", " << b << ")"; break;
  }
  return s.str();
}

namespace init {
InitSpec zeros() { return {InitSpec::Kind::Zeros, 0, 0}; }
InitSpec ones() { return {InitSpec::Kind::Ones, 1, 0}; }
InitSpec constant(double v) { return {InitSpec::Kind::Constant, v, 0}; }
InitSpec uniform(double lo, double hi) { return {InitSpec::Kind::Uniform, lo, hi}; }
InitSpec normal(double mean, double stddev) { return {InitSpec::Kind::Normal, mean, stddev}; }

namespace {
int64_t positive_fan(int64_t fan, const char* what) {
  if (fan <= 0) throw Error(std::string(what) + ": fan must be positive, got " + std::to_string(fan));
  return fan;
}
}  // namespace

InitSpec kaiming_uniform(int64_t fan_in, double gain) {
  const double std = gain / std::sqrt(static_cast<double>(positive_fan(fan_in, "kaiming_uniform")));
  const double bound = std::sqrt(3.0) * std;
  return uniform(-bound, bound);
}
InitSpec kaiming_normal(int64_t fan_in, double gain) {
  return normal(0, gain / std::sqrt(static_cast<double>(positive_fan(fan_in, "kaiming_normal"))));
}
InitSpec xavier_uniform(int64_t fan_in, int64_t fan_out, double gain) {
  const double fans = static_cast<double>(positive_fan(fan_in, "xavier_uniform") +
                                          positive_fan(fan_out, "xavier_uniform"));
  const double bound = std::sqrt(3.0) * gain * std::sqrt(2.0 / fans);
  return uniform(-bound, bound);
}
InitSpec xavier_normal(int64_t fan_in, int64_t fan_out, double gain) {
  const double fans = static_cast<double>(positive_fan(fan_in, "xavier_normal") +
                                          positive_fan(fan_out, "xavier_normal"));
  return normal(0, gain * std::sqrt(2.0 / fans));
}
}  // namespace init

// ---- the graph ----

namespace {

std::vector<uint8_t> filled_bytes(plx_dtype dtype, int64_t n, double v) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(dtype));
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T x = convert<T>(v);
    for (int64_t i = 0; i < n; ++i) std::memcpy(bytes.data() + i * sizeof(T), &x, sizeof(T));
  });
  return bytes;
}

}  // namespace

Graph::Graph(const OpRegistry& ops) : ops_(ops) {}

Var Graph::new_value(GraphValue v) {
  values_.push_back(std::move(v));
  return Var{static_cast<int32_t>(values_.size() - 1)};
}

void Graph::claim_name(const std::string& name) {
  if (name.empty()) throw Error("graph: a leaf or output needs a name");
  if (names_.count(name)) throw Error("graph: the name '" + name + "' is already used");
  names_.emplace(name, Var{});
}

void Graph::check_var(Var v, const std::string& what) const {
  if (v.id < 0 || v.id >= num_values())
    throw OpError(what + ": value v" + std::to_string(v.id) + " is not in this graph");
}

Var Graph::leaf(std::string name, TensorDesc desc, ValueKind kind, InitSpec init,
                std::vector<uint8_t> data) {
  claim_name(name);
  GraphValue v;
  v.name = name;
  v.desc = std::move(desc);
  v.kind = kind;
  v.requires_grad = kind == ValueKind::Parameter;
  v.init = init;
  v.data = std::move(data);
  const Var id = new_value(std::move(v));
  names_[name] = id;
  return id;
}

Var Graph::input(std::string name, TensorDesc desc) {
  return leaf(std::move(name), std::move(desc), ValueKind::Input);
}

Var Graph::parameter(std::string name, TensorDesc desc, InitSpec init) {
  return leaf(std::move(name), std::move(desc), ValueKind::Parameter, init);
}

Var Graph::state(std::string name, TensorDesc desc, InitSpec init) {
  return leaf(std::move(name), std::move(desc), ValueKind::State, init);
}

Var Graph::constant(std::string name, TensorDesc desc, std::vector<uint8_t> bytes) {
  const uint64_t want = static_cast<uint64_t>(desc.numel()) * dtype_size(desc.dtype);
  if (bytes.size() != want)
    throw Error("graph: constant '" + name + "' " + desc_string(desc) + " needs " +
                std::to_string(want) + " bytes, got " + std::to_string(bytes.size()));
  return leaf(std::move(name), std::move(desc), ValueKind::Constant, {}, std::move(bytes));
}

Var Graph::scalar(double value, plx_dtype dtype) {
  // Named after its value id; a user may have taken that name, so count on until one is free.
  std::string name;
  for (size_t k = values_.size(); name.empty() || names_.count(name); ++k)
    name = "const." + std::to_string(k);
  return constant(name, TensorDesc{dtype, {}}, filled_bytes(dtype, 1, value));
}

std::vector<Var> Graph::add(std::string_view op, const std::vector<Var>& inputs,
                            const Attrs& attrs, std::string name) {
  if (name.empty()) name = scope_.empty() ? std::string(op) : scope_;
  const OpSchema* schema = ops_.find(op);
  if (!schema) {
    // Let the registry phrase the error (it lists what is known).
    try {
      ops_.get(op);
    } catch (const Error& e) {
      throw OpError("node '" + name + "': " + e.what());
    }
  }
  GraphNode node;
  node.schema = schema;
  node.name = name;
  node.phase = phase_;
  std::vector<TensorDesc> descs;
  try {
    node.attrs = schema->complete_attrs(attrs);
    for (Var v : inputs) {
      if (!v.valid()) {
        descs.push_back(TensorDesc{});
        continue;
      }
      check_var(v, "op '" + schema->name + "'");
      descs.push_back(values_[static_cast<size_t>(v.id)].desc);
    }
    const std::vector<TensorDesc> outs = schema->infer_outputs(descs, node.attrs);
    node.inputs = inputs;
    node.inputs.resize(schema->inputs.size());
    // Ops write in place only into persistent memory: an activation is SSA.
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!(schema->inputs[i].flags & PLX_ARG_MUTATED) || !node.inputs[i].valid()) continue;
      const GraphValue& m = values_[static_cast<size_t>(storage_root(node.inputs[i]).id)];
      if (m.kind != ValueKind::Parameter && m.kind != ValueKind::State)
        throw OpError("op '" + schema->name + "': input '" + schema->inputs[i].name +
                      "' is written in place, so it must be a parameter or a state, not a " +
                      value_kind_name(m.kind));
    }
    bool grad_flows = false;
    if (schema->grad) {
      for (size_t i = 0; i < inputs.size(); ++i)
        if (inputs[i].valid() && !(schema->inputs[i].flags & PLX_ARG_NO_GRAD) &&
            values_[static_cast<size_t>(inputs[i].id)].requires_grad)
          grad_flows = true;
    }
    const int32_t node_id = static_cast<int32_t>(nodes_.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      GraphValue v;
      v.name = outs.size() == 1 ? name : name + ":" + std::to_string(i);
      v.desc = outs[i];
      v.kind = ValueKind::Activation;
      v.producer = node_id;
      v.output_index = static_cast<int32_t>(i);
      v.requires_grad = grad_flows && !(schema->outputs[i].flags & PLX_ARG_NO_GRAD);
      node.outputs.push_back(new_value(std::move(v)));
    }
  } catch (const OpError& e) {
    throw OpError("node '" + name + "': " + e.what());
  }
  nodes_.push_back(std::move(node));
  return nodes_.back().outputs;
}

void Graph::set_attr(int32_t n, const std::string& name, AttrValue value) {
  if (n < 0 || n >= static_cast<int32_t>(nodes_.size()))
    throw Error("set_attr: no node " + std::to_string(n) + " (the graph has " +
                std::to_string(nodes_.size()) + ")");
  GraphNode& node = nodes_[static_cast<size_t>(n)];
  if (!node.schema) throw OpError("node '" + node.name + "': a reshape view has no attributes");
  try {
    Attrs a = node.attrs;
    a.set(name, std::move(value));
    a = node.schema->complete_attrs(a);
    std::vector<TensorDesc> descs;
    for (Var v : node.inputs) descs.push_back(v.valid() ? values_[static_cast<size_t>(v.id)].desc : TensorDesc{});
    const std::vector<TensorDesc> outs = node.schema->infer_outputs(descs, a);
    auto unread = [&](Var v) {
      for (const GraphNode& m : nodes_)
        for (Var in : m.inputs)
          if (in.valid() && storage_root(in).id == v.id) return false;
      for (const auto& [k, o] : outputs_)
        if (storage_root(o).id == v.id) return false;
      return true;
    };
    for (size_t i = 0; i < outs.size() && i < node.outputs.size(); ++i) {
      const TensorDesc& was = values_[static_cast<size_t>(node.outputs[i].id)].desc;
      if ((outs[i].dtype != was.dtype || outs[i].shape != was.shape) && !unread(node.outputs[i]))
        throw OpError("attribute '" + name + "' would change output " + std::to_string(i) +
                      " from " + desc_string(was) + " to " + desc_string(outs[i]) +
                      ", which is read");
    }
    for (size_t i = 0; i < outs.size() && i < node.outputs.size(); ++i)
      values_[static_cast<size_t>(node.outputs[i].id)].desc = outs[i];
    node.attrs = std::move(a);
  } catch (const OpError& e) {
    throw OpError("node '" + node.name + "': " + e.what());
  }
}

Var Graph::reshape(Var v, const Shape& shape_in) {
  const std::string name = scope_.empty() ? "reshape" : scope_;
  check_var(v, "node '" + name + "'");
  const GraphValue& src = values_[static_cast<size_t>(v.id)];
  Shape shape = shape_in;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && infer < 0) {
      infer = static_cast<int>(i);
    } else if (shape[i] < 0) {
      throw OpError("node '" + name + "': reshape to " + shape_string(shape_in) +
                    ": at most one -1 and no other negative size");
    } else {
      known *= shape[i];
    }
  }
  const int64_t n = src.desc.numel();
  if (infer >= 0) {
    if (known == 0 || n % known != 0)
      throw OpError("node '" + name + "': cannot reshape " + desc_string(src.desc) + " to " +
                    shape_string(shape_in));
    shape[static_cast<size_t>(infer)] = n / known;
  }
  if (shape_numel(shape) != n)
    throw OpError("node '" + name + "': cannot reshape " + desc_string(src.desc) + " (" +
                  std::to_string(n) + " elements) to " + shape_string(shape));
  GraphNode node;
  node.name = name;
  node.phase = phase_;
  node.inputs = {v};
  GraphValue out;
  out.name = name;
  out.desc = TensorDesc{src.desc.dtype, shape};
  out.kind = ValueKind::Activation;
  out.producer = static_cast<int32_t>(nodes_.size());
  out.view_of = v.id;
  out.requires_grad = src.requires_grad;
  const Var id = new_value(std::move(out));
  node.outputs = {id};
  nodes_.push_back(std::move(node));
  return id;
}

std::vector<Var> Graph::emit(std::string_view op, const std::vector<Var>& inputs,
                             const Attrs& attrs) {
  return add(op, inputs, attrs);
}

TensorDesc Graph::desc(Var v) const {
  check_var(v, "graph");
  return values_[static_cast<size_t>(v.id)].desc;
}

void Graph::mark_output(Var v, std::string name) {
  check_var(v, "output '" + name + "'");
  claim_name(name);
  names_[name] = v;
  outputs_.emplace_back(std::move(name), v);
}

const GraphValue& Graph::value(Var v) const {
  check_var(v, "graph");
  return values_[static_cast<size_t>(v.id)];
}

Var Graph::find(std::string_view name) const {
  auto it = names_.find(name);
  return it == names_.end() ? Var{} : it->second;
}

Var Graph::get(std::string_view name) const {
  const Var v = find(name);
  if (!v.valid()) throw Error("no value '" + std::string(name) + "' in the graph");
  return v;
}

std::vector<Var> Graph::parameters() const {
  std::vector<Var> out;
  for (size_t i = 0; i < values_.size(); ++i)
    if (values_[i].kind == ValueKind::Parameter) out.push_back(Var{static_cast<int32_t>(i)});
  return out;
}

Var Graph::storage_root(Var v) const {
  check_var(v, "graph");
  while (values_[static_cast<size_t>(v.id)].view_of >= 0)
    v = Var{values_[static_cast<size_t>(v.id)].view_of};
  return v;
}

std::string Graph::to_string() const {
  std::ostringstream s;
  for (size_t i = 0; i < values_.size(); ++i) {
    const GraphValue& v = values_[i];
    if (v.kind == ValueKind::Activation) continue;
    s << "  v" << i << " " << value_kind_name(v.kind) << " " << v.name << " "
      << desc_string(v.desc) << "\n";
  }
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const GraphNode& node = nodes_[n];
    s << "  " << n << " " << phase_name(node.phase) << " " << node.op_name() << " [" << node.name
      << "] (";
    for (size_t i = 0; i < node.inputs.size(); ++i)
      s << (i ? ", " : "") << (node.inputs[i].valid() ? "v" + std::to_string(node.inputs[i].id) : "-");
    s << ") ->";
    for (Var o : node.outputs) s << " v" << o.id << " " << desc_string(values_[static_cast<size_t>(o.id)].desc);
    s << "\n";
  }
  for (const auto& [name, v] : outputs_) s << "  output " << name << " = v" << v.id << "\n";
  return s.str();
}

// ---- reverse mode ----

std::vector<Var> backward(Graph& g, Var loss, const std::vector<Var>& wrt) {
  return backward(g, loss, wrt, Var{});
}

namespace {

// The graph as gradient formulas see it when values are recomputed: every node a formula adds
// reads, in place of a recomputed forward value, its copy (made on first use). The formula
// itself still sees the forward's values (input(i), output(i)), so only what it actually reads
// is recomputed.
class Recomputing final : public Emitter {
 public:
  Recomputing(Graph& g, std::function<Var(Var)> fetch) : g_(g), fetch_(std::move(fetch)) {}
  std::vector<Var> emit(std::string_view op, const std::vector<Var>& inputs,
                        const Attrs& attrs) override {
    std::vector<Var> in = inputs;
    for (Var& v : in) v = fetch_(v);
    return g_.emit(op, in, attrs);
  }
  TensorDesc desc(Var v) const override { return g_.desc(v); }
  Var reshape(Var v, const Shape& shape) override { return g_.reshape(fetch_(v), shape); }

 private:
  Graph& g_;
  std::function<Var(Var)> fetch_;
};

// How backward recomputes a node of a listed op (train.recompute): the op its copy runs, with
// what attributes, the values the copy reads, and how many of the node's outputs (its first
// ones) the copy gives again. Most ops run again on their inputs. batch_norm runs
// batch_norm_apply on its saved statistics, which backward keeps for batch_norm_backward, and
// gives y only: running batch_norm again would reduce the batch again and update the running
// statistics a second time.
struct RecomputeForm {
  std::string op;
  Attrs attrs;
  std::vector<Var> reads;
  size_t outputs = 0;
};
RecomputeForm recompute_form(const GraphNode& node) {
  if (node.schema->name == "batch_norm")
    return {"batch_norm_apply", {},
            {node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[1], node.outputs[2]}, 1};
  return {node.schema->name, node.attrs, node.inputs, node.outputs.size()};
}

// Reverse mode (backward() below). `recompute`, when given, marks forward values (by storage
// root, indexed by value id) that the gradient formulas must not read from the forward: each is
// computed again, by a copy of its node, just before the first backward node that reads it.
std::vector<Var> backward_impl(Graph& g, Var loss, const std::vector<Var>& wrt, Var seed_grad,
                               const std::vector<char>* recompute) {
  const TensorDesc loss_desc = g.desc(loss);
  if (seed_grad.valid() && (g.desc(seed_grad).dtype != loss_desc.dtype ||
                            g.desc(seed_grad).shape != loss_desc.shape))
    throw OpError("backward: the seed gradient is " + desc_string(g.desc(seed_grad)) + ", the value " +
                  desc_string(loss_desc));
  const size_t forward_nodes = g.nodes().size();
  const size_t nvalues = static_cast<size_t>(g.num_values());

  // Which values depend on a `wrt` value through differentiable inputs.
  std::vector<bool> dep(nvalues, false);
  for (Var w : wrt) {
    g.value(w);  // validates
    dep[static_cast<size_t>(w.id)] = true;
  }
  for (size_t n = 0; n < forward_nodes; ++n) {
    const GraphNode& node = g.nodes()[n];
    bool any = false;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const Var in = node.inputs[i];
      if (!in.valid() || !dep[static_cast<size_t>(in.id)]) continue;
      if (node.schema && (node.schema->inputs[i].flags & PLX_ARG_NO_GRAD)) continue;
      any = true;
    }
    if (!any) continue;
    for (size_t o = 0; o < node.outputs.size(); ++o)
      if (!node.schema || !(node.schema->outputs[o].flags & PLX_ARG_NO_GRAD))
        dep[static_cast<size_t>(node.outputs[o].id)] = true;
  }

  const Phase old_phase = g.phase();
  const std::string old_scope = g.scope();
  g.set_phase(Phase::Backward);
  std::vector<Var> grads(static_cast<size_t>(g.num_values()));
  auto grad_of = [&](Var v) -> Var& {
    if (static_cast<size_t>(v.id) >= grads.size()) grads.resize(static_cast<size_t>(v.id) + 1);
    return grads[static_cast<size_t>(v.id)];
  };
  auto accumulate = [&](Var v, Var gv) {
    Var& slot = grad_of(v);
    if (!slot.valid()) {
      slot = gv;
    } else {
      const Var sum = g.add1("add", {slot, gv});
      grad_of(v) = sum;  // grad_of may have resized
    }
  };

  if (dep[static_cast<size_t>(loss.id)] && seed_grad.valid()) {
    grad_of(loss) = seed_grad;
  } else if (dep[static_cast<size_t>(loss.id)]) {
    g.set_scope(g.value(loss).name + ".seed");
    Var seed = g.scalar(1.0, loss_desc.dtype);
    if (!loss_desc.shape.empty()) {
      Attrs a;
      a.set("shape", loss_desc.shape);
      seed = g.add1("expand", {seed}, a);
    }
    grad_of(loss) = seed;
  }

  // A ReLU read only by max-pools (conv, ReLU, pool): the pool's output is positive exactly
  // where the ReLU passed the element each window picked, and every other element gets no
  // gradient from the pool. So the pool writes index -1 (no gradient) where its output is not
  // positive (its attribute relu_mask) and its gradient goes straight to the ReLU's input: the
  // same gradient (up to the sign of a zero sum), and backward reads neither the ReLU's output
  // nor the pool's, so the first is free once the pools have run (for convnet, the largest
  // activation of the step) and the second once the next layer's backward has read it. Before
  // relu_mask the mask came from relu_backward(dy, pooled), which kept the pooled output to the
  // pool's backward.
  std::vector<int32_t> relu_of_pool(forward_nodes, -1);  // pool node -> the ReLU node it reads
  {
    std::vector<int32_t> readers(nvalues, 0), pool_readers(nvalues, 0);
    for (size_t n = 0; n < forward_nodes; ++n) {
      const GraphNode& node = g.nodes()[n];
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        if (!node.inputs[i].valid()) continue;
        ++readers[static_cast<size_t>(node.inputs[i].id)];
        if (i == 0 && node.schema && node.schema->name == "max_pool2d")
          ++pool_readers[static_cast<size_t>(node.inputs[i].id)];
      }
    }
    for (const auto& [name, v] : g.outputs()) ++readers[static_cast<size_t>(v.id)];
    for (Var w : wrt) ++readers[static_cast<size_t>(w.id)];
    for (size_t n = 0; n < forward_nodes; ++n) {
      const GraphNode& node = g.nodes()[n];
      if (!node.schema || node.schema->name != "max_pool2d") continue;
      const GraphValue& in = g.value(node.inputs[0]);
      if (in.producer < 0) continue;
      const GraphNode& r = g.nodes()[static_cast<size_t>(in.producer)];
      const size_t id = static_cast<size_t>(node.inputs[0].id);
      // The indices are for the pool's backward alone: relu_mask changes them.
      if (r.schema && r.schema->name == "relu" && readers[id] == pool_readers[id] &&
          readers[static_cast<size_t>(node.outputs[1].id)] == 0)
        relu_of_pool[n] = in.producer;
    }
    // Before any recomputed copy of a pool is made, so the copies carry them: the ReLU's mask,
    // and u8 indices in the window (a quarter of i32's memory) wherever only the pool's own
    // backward will read them and the window has at most 255 taps.
    for (size_t n = 0; n < forward_nodes; ++n) {
      const GraphNode& node = g.nodes()[n];
      if (!node.schema || node.schema->name != "max_pool2d") continue;
      const Ints k = node.attrs.get_ints("kernel");  // a copy: set_attr replaces the attributes
      const Var indices = node.outputs[1], x = node.inputs[0];
      if (relu_of_pool[n] >= 0) g.set_attr(static_cast<int32_t>(n), "relu_mask", int64_t{1});
      if (readers[static_cast<size_t>(indices.id)] == 0 && k.size() == 2 &&
          k[0] * k[1] <= 255 && dep[static_cast<size_t>(x.id)])
        g.set_attr(static_cast<int32_t>(n), "window_index", int64_t{1});
    }
  }

  // What a gradient formula reads for forward value v: v, or its recomputed copy.
  std::vector<Var> copy_of(recompute ? recompute->size() : 0);
  auto fetch = [&](auto& self, Var v) -> Var {
    if (!recompute || !v.valid() || static_cast<size_t>(v.id) >= copy_of.size()) return v;
    if (!(*recompute)[static_cast<size_t>(g.storage_root(v).id)]) return v;
    if (copy_of[static_cast<size_t>(v.id)].valid()) return copy_of[static_cast<size_t>(v.id)];
    const GraphValue value = g.value(v);  // copies: adding nodes moves the vectors
    const GraphNode src = g.nodes()[static_cast<size_t>(value.producer)];
    // A reshape view (no schema) of a recomputed value is the same view of its copy.
    const RecomputeForm form =
        src.schema ? recompute_form(src) : RecomputeForm{"", {}, {src.inputs.at(0)}, 1};
    std::vector<Var> ins;
    for (Var i : form.reads) ins.push_back(self(self, i));
    const std::string scope = g.scope();
    g.set_scope(src.name + ".recompute");
    if (!src.schema) {
      copy_of[static_cast<size_t>(v.id)] = g.reshape(ins.at(0), value.desc.shape);
    } else {
      const std::vector<Var> outs = g.add(form.op, ins, form.attrs);
      for (size_t k = 0; k < form.outputs; ++k)
        copy_of[static_cast<size_t>(src.outputs[k].id)] = outs[k];
    }
    g.set_scope(scope);
    return copy_of[static_cast<size_t>(v.id)];
  };
  Recomputing recomputing(g, [&](Var v) { return fetch(fetch, v); });

  // A parameter's cast to the compute dtype (mixed precision: build_model makes them all before
  // the first layer) has its gradient emitted as soon as every reader of the cast has given its
  // share, not at the end of backward where its place in the forward would put it: the f32
  // gradient is then ready layer by layer, so data parallelism's buckets start during backward.
  std::vector<int32_t> cast_readers(forward_nodes, 0);  // per param cast: readers left
  std::vector<int32_t> cast_of_value(nvalues, -1);      // a param cast's output -> the cast node
  std::vector<char> emitted(forward_nodes, 0);
  for (size_t n = 0; n < forward_nodes; ++n) {
    const GraphNode& node = g.nodes()[n];
    for (Var in : node.inputs)  // count the readers of the casts found so far (they come first)
      if (in.valid() && cast_of_value[static_cast<size_t>(in.id)] >= 0)
        ++cast_readers[static_cast<size_t>(cast_of_value[static_cast<size_t>(in.id)])];
    if (node.schema && node.schema->name == "cast" && node.inputs.size() == 1 &&
        node.inputs[0].valid() && g.value(node.inputs[0]).kind == ValueKind::Parameter &&
        dep[static_cast<size_t>(node.inputs[0].id)])
      cast_of_value[static_cast<size_t>(node.outputs[0].id)] = static_cast<int32_t>(n);
  }
  // A graph output's gradient is not complete early: such a cast waits for its place.
  for (const auto& [name, v] : g.outputs()) cast_of_value[static_cast<size_t>(v.id)] = -1;

  auto process = [&](auto& self, size_t n) -> void {
    const GraphNode node = g.nodes()[n];  // a copy: appending nodes moves the vector
    emitted[n] = 1;
    // Each parameter cast this node reads has one reader fewer to wait for.
    std::vector<size_t> ready;
    for (Var in : node.inputs) {
      if (!in.valid() || static_cast<size_t>(in.id) >= cast_of_value.size()) continue;
      const int32_t c = cast_of_value[static_cast<size_t>(in.id)];
      if (c >= 0 && --cast_readers[static_cast<size_t>(c)] == 0) ready.push_back(static_cast<size_t>(c));
    }
    const auto emit_ready = [&] {
      for (size_t c : ready)
        if (!emitted[c]) self(self, c);
    };
    std::vector<Var> gouts;
    bool any_out = false;
    for (Var o : node.outputs) {
      gouts.push_back(grad_of(o));
      any_out = any_out || gouts.back().valid();
    }
    if (!any_out) return emit_ready();
    std::vector<bool> needs(node.inputs.size(), false);
    bool any_in = false;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const Var in = node.inputs[i];
      if (!in.valid() || !dep[static_cast<size_t>(in.id)]) continue;
      if (node.schema && (node.schema->inputs[i].flags & PLX_ARG_NO_GRAD)) continue;
      needs[i] = true;
      any_in = true;
    }
    if (!any_in) return emit_ready();
    g.set_scope(node.name + ".grad");
    if (!node.schema) {  // a reshape view: the gradient is the view back
      accumulate(node.inputs[0], g.reshape(gouts[0], g.desc(node.inputs[0]).shape));
      return emit_ready();
    }
    if (!node.schema->grad) {
      std::string which;
      for (size_t i = 0; i < needs.size(); ++i)
        if (needs[i]) which += (which.empty() ? "'" : ", '") + node.schema->inputs[i].name + "'";
      throw OpError("node '" + node.name + "': op '" + node.schema->name +
                    "' has no gradient formula, but a gradient must flow to its input " + which);
    }
    // Where the gradient of input i goes: the input, or past a ReLU read only by pools.
    std::vector<Var> targets = node.inputs;
    if (const int32_t relu = relu_of_pool[n]; relu >= 0 && gouts[0].valid())
      targets[0] = g.nodes()[static_cast<size_t>(relu)].inputs[0];  // depends on wrt, as the ReLU does
    GradContext ctx(recompute ? static_cast<Emitter&>(recomputing) : g, *node.schema, node.attrs,
                    node.inputs, node.outputs, gouts, needs);
    try {
      node.schema->grad(ctx);
    } catch (const OpError& e) {
      throw OpError("gradient of node '" + node.name + "': " + e.what());
    }
    for (size_t i = 0; i < needs.size(); ++i) {
      if (!needs[i] || i >= ctx.grads().size() || !ctx.grads()[i].valid()) continue;
      const Var gi = ctx.grads()[i];
      const TensorDesc want = g.desc(node.inputs[i]), got = g.desc(gi);
      if (want.dtype != got.dtype || want.shape != got.shape)
        throw OpError("gradient of node '" + node.name + "' (op " + node.schema->name +
                      "): input '" + node.schema->inputs[i].name + "' is " + desc_string(want) +
                      " but its gradient is " + desc_string(got));
      accumulate(targets[i], gi);
    }
    emit_ready();
  };
  for (size_t n = forward_nodes; n-- > 0;)
    if (!emitted[n]) process(process, n);
  g.set_phase(old_phase);
  g.set_scope(old_scope);

  std::vector<Var> out;
  for (Var w : wrt) out.push_back(grad_of(w));
  return out;
}

// The most activation bytes live at once when the nodes run in order: a value (by storage
// root) lives from its producer to its last reader, a graph output to the end. It ignores the
// planner's packing, workspaces and fusion: a yardstick for comparing two versions of a step.
uint64_t activation_live_peak(const Graph& g) {
  const size_t nn = g.nodes().size();
  std::vector<int64_t> delta(nn + 2, 0);
  std::vector<int32_t> death(static_cast<size_t>(g.num_values()), -1);
  for (size_t n = 0; n < nn; ++n)
    for (Var in : g.nodes()[n].inputs)
      if (in.valid()) {
        int32_t& d = death[static_cast<size_t>(g.storage_root(in).id)];
        d = std::max(d, static_cast<int32_t>(n));
      }
  for (const auto& [name, v] : g.outputs())
    death[static_cast<size_t>(g.storage_root(v).id)] = static_cast<int32_t>(nn);
  for (int32_t id = 0; id < g.num_values(); ++id) {
    const GraphValue& v = g.value(Var{id});
    if (v.kind != ValueKind::Activation || v.view_of >= 0 || v.producer < 0) continue;
    const int64_t bytes =
        v.desc.numel() * static_cast<int64_t>(dtype_size(static_cast<int32_t>(v.desc.dtype)));
    const size_t from = static_cast<size_t>(v.producer);
    const size_t to = static_cast<size_t>(std::max(death[static_cast<size_t>(id)], v.producer));
    delta[from] += bytes;
    delta[to + 1] -= bytes;
  }
  int64_t live = 0, peak = 0;
  for (int64_t d : delta) peak = std::max(peak, live += d);
  return static_cast<uint64_t>(peak);
}

}  // namespace

const std::vector<std::string>& recomputable_ops() {
  static const std::vector<std::string> ops = {
      "relu", "gelu", "sigmoid", "tanh", "cast", "max_pool2d", "avg_pool2d", "add", "sub", "mul",
      "scale", "batch_norm"};
  return ops;
}

std::vector<Var> backward(Graph& g, Var loss, const std::vector<Var>& wrt, Var seed_grad) {
  BackwardOptions o;
  o.seed_grad = seed_grad;
  return backward(g, loss, wrt, o);
}

std::vector<Var> backward(Graph& g, Var loss, const std::vector<Var>& wrt,
                          const BackwardOptions& opts) {
  if (opts.recompute.empty()) return backward_impl(g, loss, wrt, opts.seed_grad, nullptr);
  const auto& allowed = recomputable_ops();
  for (const std::string& op : opts.recompute)
    if (std::find(allowed.begin(), allowed.end(), op) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw OpError("backward: op '" + op + "' cannot be recomputed (it can be one of: " + list +
                    ")");
    }

  // Which forward values backward reads, and when: reverse mode on a copy of the graph.
  const size_t nv = static_cast<size_t>(g.num_values());
  const size_t nf = g.nodes().size();
  Graph probe = g;
  backward_impl(probe, loss, wrt, opts.seed_grad, nullptr);
  constexpr int32_t kNever = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> first(nv, kNever), last(nv, -1);  // per root: backward readers' span
  for (size_t n = nf; n < probe.nodes().size(); ++n)
    for (Var in : probe.nodes()[n].inputs) {
      if (!in.valid()) continue;
      const size_t r = static_cast<size_t>(probe.storage_root(in).id);
      if (r >= nv) continue;
      first[r] = std::min(first[r], static_cast<int32_t>(n));
      last[r] = std::max(last[r], static_cast<int32_t>(n));
    }
  std::vector<char> is_output(nv, 0);
  for (const auto& [name, v] : g.outputs())
    if (static_cast<size_t>(v.id) < nv) is_output[static_cast<size_t>(g.storage_root(v).id)] = 1;

  // A node of a listed op is recomputed when backward needs an output of it (none a graph
  // output), directly or through a recomputed node that reads it, and every value its copy reads
  // is persistent, kept for a backward reader at or after the copy's place anyway, or recomputed
  // itself with no backward reader of its own after that place (else its copy would be made
  // early for this one). The copy then costs a kernel and never lengthens another value's life,
  // and the outputs are free from their last forward reader until backward needs them.
  // What a copy reads and gives again is recompute_form()'s (batch_norm: its y, from the saved
  // statistics). Chains (batch_norm -> relu, batch_norm -> add -> relu) are why this is a fixed
  // point: start from every candidate and drop those that fail until none does.
  std::vector<char> listed(nf, 0);
  std::vector<RecomputeForm> forms(nf);  // of the listed nodes
  std::vector<std::vector<Var>> given(nf);  // the outputs each listed node's copy gives again
  for (size_t n = 0; n < nf; ++n) {
    const GraphNode& node = g.nodes()[n];
    if (!node.schema || std::find(opts.recompute.begin(), opts.recompute.end(),
                                  node.schema->name) == opts.recompute.end())
      continue;
    forms[n] = recompute_form(node);
    given[n].assign(node.outputs.begin(),
                    node.outputs.begin() + static_cast<std::ptrdiff_t>(forms[n].outputs));
    bool ok = true;
    for (Var o : given[n]) ok = ok && !is_output[static_cast<size_t>(o.id)];
    listed[n] = ok;
  }
  // Forward nodes reading each value (by storage root).
  std::vector<std::vector<int32_t>> readers(nv);
  for (size_t n = 0; n < nf; ++n)
    for (Var in : g.nodes()[n].inputs)
      if (in.valid())
        readers[static_cast<size_t>(g.storage_root(in).id)].push_back(static_cast<int32_t>(n));
  // The fixed point from the candidates `cand` (left holding the nodes recomputed): the values
  // recomputed, by id.
  auto settle = [&](std::vector<char>& cand) {
    std::vector<char> rec(nv, 0);
    std::vector<int32_t> need(nf, kNever);  // where backward first needs a candidate's outputs
    for (bool changed = true; changed;) {
      changed = false;
      std::fill(rec.begin(), rec.end(), 0);
      for (size_t n = 0; n < nf; ++n)
        if (cand[n])
          for (Var o : given[n]) rec[static_cast<size_t>(o.id)] = 1;
      // Readers come after their producers: one pass from the end settles every chain.
      for (size_t n = nf; n-- > 0;) {
        if (!cand[n]) continue;
        int32_t at = kNever;
        for (Var o : given[n]) {
          const size_t r = static_cast<size_t>(o.id);
          at = std::min(at, first[r]);
          for (int32_t reader : readers[r])
            if (cand[static_cast<size_t>(reader)])
              at = std::min(at, need[static_cast<size_t>(reader)]);
        }
        need[n] = at;
      }
      for (size_t n = 0; n < nf; ++n) {
        if (!cand[n]) continue;
        bool ok = need[n] != kNever;
        for (Var in : forms[n].reads) {
          if (!ok || !in.valid()) continue;
          const Var r = g.storage_root(in);
          const size_t ri = static_cast<size_t>(r.id);
          if (g.value(r).kind != ValueKind::Activation) continue;
          // A recomputed input whose copy backward reads later would be made early for this
          // copy and live from here (resnet: a block's output needs the block input, which the
          // block's own weight gradient reads much later).
          if (rec[ri]) ok = first[ri] == kNever || first[ri] <= need[n];
          else ok = last[ri] >= need[n];
        }
        if (!ok) {
          cand[n] = 0;
          changed = true;
        }
      }
    }
    return rec;
  };
  std::vector<char> cand = listed;
  std::vector<char> rec = settle(cand);

  // The rules above see one node at a time. A copy made where little else is live (the last
  // block's output, needed again right after the head's backward) saves nothing and its inputs'
  // copies cost memory there, so each recomputed node, last first, is dropped when the step's
  // live activation bytes (a liveness estimate of the whole step, without the planner's
  // packing) do not grow without it. A trial is one reverse mode on a copy of the graph; past
  // kMaxTrials the rest are kept as the rules chose.
  constexpr int kMaxTrials = 64;
  auto step_peak = [&](const std::vector<char>& r) {
    Graph t = g;
    backward_impl(t, loss, wrt, opts.seed_grad, &r);
    return activation_live_peak(t);
  };
  if (std::any_of(cand.begin(), cand.end(), [](char c) { return c != 0; })) {
    uint64_t best = step_peak(rec);
    int trials = 0;
    for (size_t n = nf; n-- > 0 && trials < kMaxTrials;) {
      if (!cand[n]) continue;
      std::vector<char> without = cand;
      without[n] = 0;
      std::vector<char> r = settle(without);
      const uint64_t peak = step_peak(r);
      ++trials;
      if (peak <= best) {
        best = peak;
        cand = std::move(without);
        rec = std::move(r);
      }
    }
  }
  return backward_impl(g, loss, wrt, opts.seed_grad, &rec);
}

}  // namespace plexus
