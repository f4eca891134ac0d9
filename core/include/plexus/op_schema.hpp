// Op schemas: name, inputs, outputs, attributes, dtype rule, shape inference and gradient
// formula. The built-in ops are defined in core/src/ops/*.cpp (docs/ops.md lists them); plugins
// add their own through plx_op_schema.
//
// A gradient formula is written once, here in the core, as calls of other ops through an
// Emitter. The eager emitter runs them at once (tests, one-off calls); the graph builder appends
// them to the backward graph. Either way the same formula is used.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "plexus/abi/ops.h"
#include "plexus/attrs.hpp"
#include "plexus/error.hpp"

namespace plexus {

// A tensor's dtype and shape, without data.
struct TensorDesc {
  plx_dtype dtype = PLX_DTYPE_NONE;
  Shape shape;
  bool present() const { return dtype != PLX_DTYPE_NONE; }
  int64_t numel() const;
  int ndim() const { return static_cast<int>(shape.size()); }
};
std::string shape_string(const Shape& s);  // "(2, 3)"
std::string desc_string(const TensorDesc& d);  // "f32(2, 3)"

// Bit mask of dtypes for ArgDef::dtypes.
constexpr uint32_t dtype_bit(plx_dtype d) { return 1u << static_cast<uint32_t>(d); }
constexpr uint32_t kFloatTypes =
    dtype_bit(PLX_F32) | dtype_bit(PLX_F16) | dtype_bit(PLX_BF16) | dtype_bit(PLX_F64);
constexpr uint32_t kIndexTypes = dtype_bit(PLX_I32) | dtype_bit(PLX_I64);
constexpr uint32_t kIntTypes = kIndexTypes | dtype_bit(PLX_U8);
constexpr uint32_t kAllTypes = kFloatTypes | kIntTypes;

struct ArgDef {
  std::string name;
  uint32_t flags = 0;   // PLX_ARG_OPTIONAL | PLX_ARG_MUTATED | PLX_ARG_NO_GRAD
  uint32_t dtypes = 0;  // accepted dtypes; 0 = must equal the type input's dtype
  // The plugin ABI minor that gave an existing op this optional input (0: the op always had
  // it). A kernel built against an older minor never reads it, so a node that gives it goes to
  // none of that plugin's kernels (see abi_minor_needed).
  uint16_t since_abi_minor = 0;
};

struct AttrDef {
  std::string name;
  plx_attr_type type;
  std::optional<AttrValue> default_value;  // none: required
  std::string doc;
  // The plugin ABI minor that gave an existing op this attribute (0: the op always had it). A
  // kernel built against an older minor never reads it, so a node that sets it to anything but
  // its default goes to none of that plugin's kernels (see abi_minor_needed).
  uint16_t since_abi_minor = 0;
};

struct OpSchema;

// What shape inference sees: validated input descriptors and complete attributes.
class InferContext {
 public:
  InferContext(const OpSchema& schema, const std::vector<TensorDesc>& inputs, const Attrs& attrs)
      : schema_(schema), inputs_(inputs), attrs_(attrs) {}

  const OpSchema& schema() const { return schema_; }
  const TensorDesc& in(int i) const { return inputs_.at(static_cast<size_t>(i)); }
  bool has(int i) const { return i < static_cast<int>(inputs_.size()) && inputs_[i].present(); }
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  const Attrs& attrs() const { return attrs_; }

  // Sets output i.
  void out(int i, plx_dtype dtype, Shape shape);

  // Throws OpError "op '<name>': <message>".
  [[noreturn]] void fail(const std::string& message) const;
  void require(bool cond, const std::string& message) const {
    if (!cond) fail(message);
  }

  std::vector<TensorDesc>& outputs() { return outputs_; }

 private:
  const OpSchema& schema_;
  const std::vector<TensorDesc>& inputs_;
  const Attrs& attrs_;
  std::vector<TensorDesc> outputs_;
};

// A value in whatever the emitter builds: an eager tensor or a graph value.
struct Var {
  int32_t id = -1;
  bool valid() const { return id >= 0; }
};

// Where gradient formulas put the ops they call.
class Emitter {
 public:
  virtual ~Emitter() = default;
  // Calls `op`; absent optional inputs are invalid Vars. Returns every output.
  virtual std::vector<Var> emit(std::string_view op, const std::vector<Var>& inputs,
                                const Attrs& attrs) = 0;
  virtual TensorDesc desc(Var v) const = 0;
  // The same data seen with another shape of the same element count (no copy).
  virtual Var reshape(Var v, const Shape& shape) = 0;
};

// What a gradient formula sees and sets.
class GradContext {
 public:
  GradContext(Emitter& e, const OpSchema& schema, const Attrs& attrs, std::vector<Var> inputs,
              std::vector<Var> outputs, std::vector<Var> grad_outputs, std::vector<bool> needs);

  Emitter& emitter() { return e_; }
  const OpSchema& schema() const { return schema_; }
  const Attrs& attrs() const { return attrs_; }
  Var input(int i) const { return inputs_.at(static_cast<size_t>(i)); }
  Var output(int i) const { return outputs_.at(static_cast<size_t>(i)); }
  // Invalid where no gradient flows into that output: the formula treats it as zero.
  Var grad_output(int i) const { return grad_outputs_.at(static_cast<size_t>(i)); }
  bool needs_grad(int i) const { return needs_.at(static_cast<size_t>(i)); }
  void set_grad(int i, Var g);
  const std::vector<Var>& grads() const { return grads_; }

  // Shortcuts over the emitter.
  Var call(std::string_view op, const std::vector<Var>& inputs, const Attrs& attrs = {}) {
    return e_.emit(op, inputs, attrs).at(0);
  }
  std::vector<Var> call_all(std::string_view op, const std::vector<Var>& inputs,
                            const Attrs& attrs = {}) {
    return e_.emit(op, inputs, attrs);
  }
  TensorDesc desc(Var v) const { return e_.desc(v); }
  // Sums `g` over the dimensions that broadcasting expanded, giving a tensor of `shape`.
  Var sum_to(Var g, const Shape& shape);

 private:
  Emitter& e_;
  const OpSchema& schema_;
  const Attrs& attrs_;
  std::vector<Var> inputs_, outputs_, grad_outputs_;
  std::vector<bool> needs_;
  std::vector<Var> grads_;
};

struct OpSchema {
  std::string name;
  std::string doc;
  std::vector<ArgDef> inputs;
  std::vector<ArgDef> outputs;
  std::vector<AttrDef> attrs;
  int type_input = 0;  // the input whose dtype selects the kernel
  std::function<void(InferContext&)> infer;
  std::function<void(GradContext&)> grad;  // empty: not differentiable
  const plx_op_schema* plugin_schema = nullptr;  // set for ops a plugin added
  std::string origin = "core";                   // "core" or the plugin's name
  int32_t id = -1;                               // dense index in the registry

  // Attributes with defaults filled in and types checked, in schema order. Throws OpError
  // naming the op and attribute.
  Attrs complete_attrs(const Attrs& given) const;
  // Why `value` cannot be given as attribute `attr` ("" if it can): the op has no such
  // attribute (the message lists them), or the value's type does not convert to the attribute's.
  std::string attr_problem(std::string_view attr, const AttrValue& value) const;
  // Validates inputs against the schema (count, presence, dtypes), then runs infer().
  std::vector<TensorDesc> infer_outputs(const std::vector<TensorDesc>& inputs,
                                        const Attrs& complete) const;
};

class OpRegistry {
 public:
  OpRegistry();  // with every built-in op
  OpRegistry(const OpRegistry&) = delete;
  OpRegistry& operator=(const OpRegistry&) = delete;

  // Adds a schema; throws OpError if the name is taken. Returns it with its id set.
  const OpSchema& add(OpSchema schema);
  // Adds a plugin's schema through the ABI (infer and grad_op wired to the plugin). A failed
  // infer() is explained with `last_error` (the plugin's), when given.
  const OpSchema& add_plugin_schema(const plx_op_schema& s, const std::string& plugin,
                                    const char* (*last_error)(void) = nullptr);

  const OpSchema* find(std::string_view name) const;
  const OpSchema& get(std::string_view name) const;  // throws OpError "unknown op"
  const OpSchema& by_id(int32_t id) const { return *ops_.at(static_cast<size_t>(id)); }
  int32_t size() const { return static_cast<int32_t>(ops_.size()); }

 private:
  std::vector<std::unique_ptr<OpSchema>> ops_;
  std::unordered_map<std::string, int32_t> by_name_;
};

// Registration of the built-in op families (core/src/ops/*.cpp).
namespace ops {
void register_activation(OpRegistry& r);
void register_binary(OpRegistry& r);
void register_reduce(OpRegistry& r);
void register_conv(OpRegistry& r);
void register_pool(OpRegistry& r);
void register_gemm(OpRegistry& r);
void register_softmax(OpRegistry& r);
void register_norm(OpRegistry& r);
void register_misc(OpRegistry& r);
void register_optim(OpRegistry& r);
}  // namespace ops

// Helpers for schema authors.
namespace schema {
ArgDef in(std::string name, uint32_t dtypes = 0, uint32_t flags = 0);
ArgDef opt(std::string name, uint32_t dtypes = 0);  // optional input
ArgDef out(std::string name, uint32_t dtypes = 0, uint32_t flags = 0);
AttrDef attr(std::string name, plx_attr_type type, std::optional<AttrValue> def,
             std::string doc = "");
// `a` as an attribute added to its op in plugin ABI 1.`minor`.
AttrDef since_abi(AttrDef a, uint16_t minor);
// `a` as an optional input added to its op in plugin ABI 1.`minor`.
ArgDef since_abi(ArgDef a, uint16_t minor);
// The plugin ABI minor a kernel must be built against to honour `attrs` (complete, as a node
// holds them) and the inputs `given` (given[i]: input i is present; empty: none of the newer
// optional inputs is): the largest since_abi_minor among attributes not at their default and
// inputs given, else 0. `why` (if given) names the attribute or input that needs it:
// "attribute 'relu_mask' = 1 (ABI 1.3)", "input 'check' (ABI 1.4)".
uint16_t abi_minor_needed(const OpSchema& schema, const Attrs& attrs, std::string* why = nullptr,
                          const std::vector<bool>& given = {});
// Broadcast shape of a and b by NumPy rules, or nullopt if they do not broadcast.
std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b);
// Normalises a possibly negative axis against ndim; throws via ctx.fail if out of range.
int64_t normalize_axis(const InferContext& ctx, int64_t axis, int64_t ndim);
// Registers a float op `name` (x -> y) and its `name`_backward (dy, saved -> dx), where saved is
// the forward's output y if `saves_output`, else its input x; the gradient formula is
// dx = `name`_backward(dy, saved). Both ops take `attrs`.
void add_with_backward(OpRegistry& r, const std::string& name, const std::string& doc,
                       const std::string& backward_doc, bool saves_output,
                       const std::vector<AttrDef>& attrs,
                       std::function<void(InferContext&)> infer,
                       std::function<void(InferContext&)> backward_infer);
// A 2-value ints attribute of a 2-D op ([h, w]) whose values are at least `min`.
using Pair = std::array<int64_t, 2>;
Pair pair_attr(const InferContext& ctx, const std::string& name, int64_t min);
}  // namespace schema

}  // namespace plexus
