// Static graphs: a training step written down once, then differentiated, planned and run.
//
// A Graph is a list of nodes in execution order over SSA values (each value is written by one
// node, or is a graph input, parameter, state or constant). Building it validates every node
// against its op schema and infers every shape, so a model that does not fit together fails
// while it is built, naming the node. backward() appends the reverse-mode gradient graph using
// the ops' own gradient formulas (the same ones the eager API runs); the optimizer appends its
// update nodes after that. The executor (executor.hpp) then resolves each node's kernel once,
// plans activation memory by liveness, and runs the whole step on the backend's stream.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/attrs.hpp"
#include "plexus/op_schema.hpp"

namespace plexus {

enum class ValueKind : uint8_t {
  Input,       // written by the host before each run: a batch, its labels, the learning rate
  Parameter,   // trained; persistent, lives in a TensorStore under its name
  State,       // persistent, not trained: running statistics, optimizer moments
  Constant,    // data fixed when the graph is built, uploaded once
  Activation,  // written by a node; its memory is planned
};
const char* value_kind_name(ValueKind k);

// How a parameter or state is initialised when it is first created.
struct InitSpec {
  enum class Kind : uint8_t { Zeros, Ones, Constant, Uniform, Normal };
  Kind kind = Kind::Zeros;
  double a = 0, b = 0;  // Constant: value a; Uniform: [a, b); Normal: mean a, standard deviation b
  std::string describe() const;  // "uniform(-0.1, 0.1)"
};
namespace init {
InitSpec zeros();
InitSpec ones();
InitSpec constant(double v);
InitSpec uniform(double lo, double hi);
InitSpec normal(double mean, double stddev);
// He et al.: std = gain/sqrt(fan_in); uniform bound = sqrt(3)*std.
InitSpec kaiming_uniform(int64_t fan_in, double gain = 1.4142135623730951);
InitSpec kaiming_normal(int64_t fan_in, double gain = 1.4142135623730951);
// Glorot and Bengio: std = gain*sqrt(2/(fan_in+fan_out)); uniform bound = sqrt(3)*std.
InitSpec xavier_uniform(int64_t fan_in, int64_t fan_out, double gain = 1.0);
InitSpec xavier_normal(int64_t fan_in, int64_t fan_out, double gain = 1.0);
}  // namespace init

struct GraphValue {
  std::string name;  // unique for inputs, parameters, states and named outputs; may be empty
  TensorDesc desc;
  ValueKind kind = ValueKind::Activation;
  int32_t producer = -1;      // node that writes it (activations), else -1
  int32_t output_index = 0;   // which output of the producer
  int32_t view_of = -1;       // a reshape: the value whose memory this value is, else -1
  bool requires_grad = false; // a gradient can flow to a parameter through it
  InitSpec init;              // parameters and states
  std::vector<uint8_t> data;  // constants: contiguous row-major bytes
};

enum class Phase : uint8_t { Forward, Backward, Update };
const char* phase_name(Phase p);

struct GraphNode {
  const OpSchema* schema = nullptr;  // null: a reshape view, outputs[0] = inputs[0] reshaped
  Attrs attrs;                       // complete (defaults filled in)
  std::vector<Var> inputs;           // an invalid Var for an absent optional input
  std::vector<Var> outputs;
  std::string name;                  // "conv1", "conv1.grad", "sgd.conv1.weight"
  Phase phase = Phase::Forward;
  std::string op_name() const { return schema ? schema->name : "reshape"; }
};

// The graph is also an Emitter, so gradient formulas append to it directly.
class Graph : public Emitter {
 public:
  explicit Graph(const OpRegistry& ops);

  const OpRegistry& ops() const { return ops_; }

  // ---- leaves; names must be unique among leaves and named outputs ----
  Var input(std::string name, TensorDesc desc);
  Var parameter(std::string name, TensorDesc desc, InitSpec init);
  Var state(std::string name, TensorDesc desc, InitSpec init);
  Var constant(std::string name, TensorDesc desc, std::vector<uint8_t> bytes);
  // A 0-d constant holding `v` converted to `dtype`.
  Var scalar(double v, plx_dtype dtype);

  // ---- nodes ----
  // Appends a node running `op`, checked against its schema (OpError naming the node on a bad
  // input, dtype, shape or attribute). Returns every output.
  std::vector<Var> add(std::string_view op, const std::vector<Var>& inputs, const Attrs& attrs = {},
                       std::string name = "");
  // The first output only.
  Var add1(std::string_view op, const std::vector<Var>& inputs, const Attrs& attrs = {},
           std::string name = "") {
    return add(op, inputs, attrs, std::move(name)).at(0);
  }
  // A view of `v` with another shape of the same element count (no copy, no kernel).
  Var reshape(Var v, const Shape& shape) override;
  // Sets attribute `name` of node `node` (an op, not a view) to `value`, checked by its schema
  // as add() checks; an output read by a node or marked as a graph output must keep its dtype
  // and shape (OpError otherwise), one nothing reads yet takes the new ones. For rewrites of
  // what a node computes (reverse mode's max_pool2d relu_mask and window_index).
  void set_attr(int32_t node, const std::string& name, AttrValue value);

  // Emitter: gradient formulas call this; nodes are named "<scope>" (see set_scope).
  std::vector<Var> emit(std::string_view op, const std::vector<Var>& inputs,
                        const Attrs& attrs) override;
  TensorDesc desc(Var v) const override;

  // The phase and name given to nodes appended from now on.
  void set_phase(Phase p) { phase_ = p; }
  Phase phase() const { return phase_; }
  void set_scope(std::string scope) { scope_ = std::move(scope); }
  const std::string& scope() const { return scope_; }

  // ---- outputs: values the host reads after a run; they live to the end of the step ----
  void mark_output(Var v, std::string name);
  const std::vector<std::pair<std::string, Var>>& outputs() const { return outputs_; }

  // ---- inspection ----
  const GraphValue& value(Var v) const;
  int32_t num_values() const { return static_cast<int32_t>(values_.size()); }
  const std::vector<GraphValue>& values() const { return values_; }
  const std::vector<GraphNode>& nodes() const { return nodes_; }
  // A leaf or named output by name; an invalid Var if none.
  Var find(std::string_view name) const;
  // Throws Error "no value 'x' in the graph" if absent.
  Var get(std::string_view name) const;
  std::vector<Var> parameters() const;  // in creation order
  // The value whose memory `v` uses (follows reshape views).
  Var storage_root(Var v) const;
  // One line per node: "  12 conv2d_backward_data [conv1.grad] (v3, v7) -> v15 f32(128, 1, 28, 28)".
  std::string to_string() const;

 private:
  Var new_value(GraphValue v);
  // A named input, parameter, state or constant.
  Var leaf(std::string name, TensorDesc desc, ValueKind kind, InitSpec init = {},
           std::vector<uint8_t> data = {});
  void check_var(Var v, const std::string& what) const;
  void claim_name(const std::string& name);

  const OpRegistry& ops_;
  std::vector<GraphValue> values_;
  std::vector<GraphNode> nodes_;
  std::vector<std::pair<std::string, Var>> outputs_;
  std::map<std::string, Var, std::less<>> names_;
  Phase phase_ = Phase::Forward;
  std::string scope_;
};

// Reverse mode. Appends to `g`, in Phase::Backward, the nodes that compute d(loss)/d(w) for each
// w in `wrt`, seeding d(loss) with ones (so a non-scalar loss is summed). Gradients reaching a
// value along several paths are added. Returns one Var per entry of `wrt`, invalid where the
// loss does not depend on it. Throws OpError naming the node whose op has no gradient formula
// when a gradient must flow through it.
std::vector<Var> backward(Graph& g, Var loss, const std::vector<Var>& wrt);
// The same from a given gradient of `loss` (a value of loss's dtype and shape, e.g. an input
// holding what the next pipeline stage sent back) instead of ones.
std::vector<Var> backward(Graph& g, Var loss, const std::vector<Var>& wrt, Var seed_grad);

struct BackwardOptions {
  Var seed_grad;  // invalid: ones
  // Ops (of recomputable_ops()) whose outputs backward computes again instead of keeping them
  // from the forward (train.recompute). A node of such an op is recomputed when backward reads
  // an output of it (none a graph output) and each of its inputs is persistent, recomputed
  // itself, or kept to a backward reader at or after the copy's place anyway: the copy, made by
  // the same op on the same inputs just before the first backward node that reads the output,
  // is bit for bit the forward's value and lengthens no other value's life. Reverse mode runs
  // once on a copy of the graph to learn what backward reads. OpError for an op not in the list.
  std::vector<std::string> recompute;
};
std::vector<Var> backward(Graph& g, Var loss, const std::vector<Var>& wrt,
                          const BackwardOptions& opts);
// The ops train.recompute may name: elementwise activations, casts, pools and elementwise
// arithmetic, whose outputs cost less to compute than to keep.
const std::vector<std::string>& recomputable_ops();

}  // namespace plexus
