#include "plexus/op_schema.hpp"

#include <algorithm>
#include <sstream>

#include "plexus/sdk/dtype.hpp"
#include "plexus/tensor.hpp"

namespace plexus {

int64_t TensorDesc::numel() const { return shape_numel(shape); }

std::string shape_string(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

std::string desc_string(const TensorDesc& d) {
  if (!d.present()) return "absent";
  return std::string(dtype_name(d.dtype)) + shape_string(d.shape);
}

// ---- InferContext ----

void InferContext::out(int i, plx_dtype dtype, Shape shape) {
  if (static_cast<int>(outputs_.size()) <= i) outputs_.resize(static_cast<size_t>(i) + 1);
  for (int64_t d : shape)
    if (d < 0) fail("inferred a negative dimension for output " + std::to_string(i) + " " +
                    shape_string(shape));
  outputs_[static_cast<size_t>(i)] = TensorDesc{dtype, std::move(shape)};
}

void InferContext::fail(const std::string& message) const {
  throw OpError("op '" + schema_.name + "': " + message);
}

// ---- GradContext ----

GradContext::GradContext(Emitter& e, const OpSchema& schema, const Attrs& attrs,
                         std::vector<Var> inputs, std::vector<Var> outputs,
                         std::vector<Var> grad_outputs, std::vector<bool> needs)
    : e_(e),
      schema_(schema),
      attrs_(attrs),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      grad_outputs_(std::move(grad_outputs)),
      needs_(std::move(needs)),
      grads_(inputs_.size()) {}

void GradContext::set_grad(int i, Var g) {
  if (i < 0 || i >= static_cast<int>(grads_.size()))
    throw OpError("op '" + schema_.name + "': gradient formula set input " + std::to_string(i) +
                  " of " + std::to_string(grads_.size()));
  if (!needs_grad(i)) return;
  if (g.valid()) {
    const TensorDesc want = e_.desc(inputs_[static_cast<size_t>(i)]);
    const TensorDesc got = e_.desc(g);
    if (want.shape != got.shape || want.dtype != got.dtype)
      throw OpError("op '" + schema_.name + "': gradient of input '" +
                    schema_.inputs[static_cast<size_t>(i)].name + "' is " + desc_string(got) +
                    ", the input is " + desc_string(want));
  }
  grads_[static_cast<size_t>(i)] = g;
}

Var GradContext::sum_to(Var g, const Shape& shape) {
  const TensorDesc d = e_.desc(g);
  if (d.shape == shape) return g;
  const size_t lead = d.shape.size() - shape.size();
  if (d.shape.size() < shape.size())
    throw OpError("op '" + schema_.name + "': cannot sum " + shape_string(d.shape) + " to " +
                  shape_string(shape));
  Ints axes;
  for (size_t i = 0; i < d.shape.size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && d.shape[i] != 1))
      axes.push_back(static_cast<int64_t>(i));
  }
  Var s = g;
  if (!axes.empty()) s = call("sum", {g}, {{"axes", axes}, {"keepdims", int64_t{1}}});
  return e_.reshape(s, shape);
}

// ---- OpSchema ----

namespace {
// `v` as attribute `def`, converting an int to a float and ints to floats; nullopt if it does
// not fit.
std::optional<AttrValue> convert_attr(const AttrDef& def, const AttrValue& v) {
  const plx_attr_type t = attr_type_of(v);
  if (t == def.type) return v;
  if (def.type == PLX_ATTR_FLOAT && t == PLX_ATTR_INT)
    return static_cast<double>(std::get<int64_t>(v));
  if (def.type == PLX_ATTR_FLOATS && t == PLX_ATTR_INTS) {
    const Ints& xs = std::get<Ints>(v);
    return Floats(xs.begin(), xs.end());
  }
  return std::nullopt;
}
}  // namespace

std::string OpSchema::attr_problem(std::string_view attr, const AttrValue& v) const {
  const auto def =
      std::find_if(attrs.begin(), attrs.end(), [&](const AttrDef& a) { return a.name == attr; });
  if (def == attrs.end()) {
    std::string list;
    for (const auto& a : attrs) list += (list.empty() ? "" : ", ") + a.name;
    return "op '" + name + "' has no attribute '" + std::string(attr) +
           "' (attributes: " + (list.empty() ? "none" : list) + ")";
  }
  if (!convert_attr(*def, v))
    return "op '" + name + "': attribute '" + def->name + "' is " +
           attr_type_name(attr_type_of(v)) + " " + attr_value_string(v) + ", expected " +
           attr_type_name(def->type);
  return "";
}

Attrs OpSchema::complete_attrs(const Attrs& given) const {
  // Unknown attributes first, in the order given; types below, in schema order.
  for (const auto& [attr, v] : given)
    if (std::none_of(attrs.begin(), attrs.end(), [&](const AttrDef& a) { return a.name == attr; }))
      throw OpError(attr_problem(attr, v));
  Attrs out;
  for (const auto& def : attrs) {
    const AttrValue* v = given.find(def.name);
    if (!v) {
      if (!def.default_value)
        throw OpError("op '" + name + "': missing required attribute '" + def.name + "' (" +
                      attr_type_name(def.type) + ")");
      out.set(def.name, *def.default_value);
      continue;
    }
    std::optional<AttrValue> c = convert_attr(def, *v);
    if (!c) throw OpError(attr_problem(def.name, *v));
    out.set(def.name, std::move(*c));
  }
  return out;
}

namespace {
std::string mask_string(uint32_t mask) {
  std::string s;
  for (int d = 0; d < PLX_DTYPE_COUNT; ++d)
    if (mask & (1u << d)) s += (s.empty() ? "" : "|") + std::string(dtype_name(d));
  return s;
}
}  // namespace

std::vector<TensorDesc> OpSchema::infer_outputs(const std::vector<TensorDesc>& given,
                                                const Attrs& complete) const {
  if (given.size() > inputs.size())
    throw OpError("op '" + name + "' takes " + std::to_string(inputs.size()) + " inputs, got " +
                  std::to_string(given.size()));
  std::vector<TensorDesc> in = given;
  in.resize(inputs.size());
  const TensorDesc& t = in.at(static_cast<size_t>(type_input));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ArgDef& a = inputs[i];
    if (!in[i].present()) {
      if (!(a.flags & PLX_ARG_OPTIONAL))
        throw OpError("op '" + name + "': input " + std::to_string(i) + " '" + a.name +
                      "' is required");
      continue;
    }
    if (!dtype_is_valid(in[i].dtype))
      throw OpError("op '" + name + "': input '" + a.name + "' has invalid dtype " +
                    std::to_string(in[i].dtype));
    if (a.dtypes == 0) {
      if (in[i].dtype != t.dtype)
        throw OpError("op '" + name + "': input '" + a.name + "' is " + dtype_name(in[i].dtype) +
                      ", expected " + dtype_name(t.dtype) + " like input '" +
                      inputs[static_cast<size_t>(type_input)].name + "'");
    } else if (!(a.dtypes & (1u << in[i].dtype))) {
      throw OpError("op '" + name + "': input '" + a.name + "' is " + dtype_name(in[i].dtype) +
                    ", expected one of " + mask_string(a.dtypes));
    }
    if (in[i].shape.size() > PLX_MAX_DIMS)
      throw OpError("op '" + name + "': input '" + a.name + "' has " +
                    std::to_string(in[i].shape.size()) + " dimensions, at most " +
                    std::to_string(PLX_MAX_DIMS) + " are supported");
  }
  InferContext ctx(*this, in, complete);
  infer(ctx);
  auto& outs = ctx.outputs();
  if (outs.size() != outputs.size())
    throw OpError("op '" + name + "': shape inference produced " + std::to_string(outs.size()) +
                  " outputs, the schema has " + std::to_string(outputs.size()));
  for (size_t i = 0; i < outs.size(); ++i)
    if (!outs[i].present())
      throw OpError("op '" + name + "': shape inference left output '" + outputs[i].name +
                    "' unset");
  return outs;
}

// ---- OpRegistry ----

OpRegistry::OpRegistry() {
  ops::register_activation(*this);
  ops::register_binary(*this);
  ops::register_reduce(*this);
  ops::register_conv(*this);
  ops::register_pool(*this);
  ops::register_gemm(*this);
  ops::register_softmax(*this);
  ops::register_norm(*this);
  ops::register_misc(*this);
  ops::register_optim(*this);
}

const OpSchema& OpRegistry::add(OpSchema s) {
  if (s.name.empty()) throw OpError("an op schema has no name");
  if (by_name_.count(s.name)) throw OpError("op '" + s.name + "' is defined twice");
  if (!s.infer) throw OpError("op '" + s.name + "' has no shape inference");
  if (s.type_input < 0 || (s.type_input >= static_cast<int>(s.inputs.size()) && !s.inputs.empty()))
    throw OpError("op '" + s.name + "': type_input out of range");
  s.id = static_cast<int32_t>(ops_.size());
  by_name_.emplace(s.name, s.id);
  ops_.push_back(std::make_unique<OpSchema>(std::move(s)));
  return *ops_.back();
}

const OpSchema* OpRegistry::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : ops_[static_cast<size_t>(it->second)].get();
}

const OpSchema& OpRegistry::get(std::string_view name) const {
  if (const OpSchema* s = find(name)) return *s;
  throw OpError("unknown op '" + std::string(name) + "' (see docs/ops.md or `plexus info`)");
}

const OpSchema& OpRegistry::add_plugin_schema(const plx_op_schema& p, const std::string& plugin,
                                              const char* (*last_error)(void)) {
  const std::string name = p.name ? p.name : "";
  const std::string prefix = plugin + ".";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size())
    throw OpError("plugin '" + plugin + "' defines op '" + name + "': plugin ops must be named '" +
                  prefix + "<op>'");
  if (!p.infer) throw OpError("plugin op '" + name + "' has no infer function");
  OpSchema s;
  s.name = name;
  s.doc = p.doc ? p.doc : "";
  s.origin = plugin;
  s.plugin_schema = &p;
  s.type_input = p.type_input;
  for (int32_t i = 0; i < p.num_inputs; ++i)
    s.inputs.push_back({p.inputs[i].name, p.inputs[i].flags, p.inputs[i].dtypes});
  for (int32_t i = 0; i < p.num_outputs; ++i)
    s.outputs.push_back({p.outputs[i].name, p.outputs[i].flags, p.outputs[i].dtypes});
  for (int32_t i = 0; i < p.num_attrs; ++i) {
    const plx_attr_def& a = p.attrs[i];
    AttrDef d{a.name, static_cast<plx_attr_type>(a.type), std::nullopt, ""};
    if (!a.required) {
      plx_attr dv = a.default_value;
      dv.name = a.name;
      dv.type = a.type;
      d.default_value = attr_from_abi(dv);
    }
    s.attrs.push_back(std::move(d));
  }
  s.infer = [&p, last_error](InferContext& ctx) {
    std::vector<plx_tensor> in;
    for (int i = 0; i < ctx.num_inputs(); ++i) in.push_back(make_desc(ctx.in(i), 0));
    AttrPack pack(ctx.attrs());
    plx_node_info node{};
    node.struct_size = sizeof node;
    node.op = p.name;
    node.num_inputs = static_cast<int32_t>(in.size());
    node.inputs = in.data();
    node.num_outputs = p.num_outputs;
    node.attrs = pack.data();
    node.num_attrs = pack.size();
    std::vector<plx_tensor> out(static_cast<size_t>(p.num_outputs));
    for (auto& o : out) o.dtype = PLX_DTYPE_NONE;
    const plx_status st = p.infer(p.user, &node, out.data());
    if (st != PLX_OK) {
      const char* why = last_error ? last_error() : nullptr;
      ctx.fail(std::string("shape inference failed: ") + plx_status_string(st) +
               (why && *why ? std::string(": ") + why : std::string()));
    }
    for (int32_t i = 0; i < p.num_outputs; ++i) {
      const plx_tensor& o = out[static_cast<size_t>(i)];
      if (!dtype_is_valid(o.dtype) || o.ndim < 0 || o.ndim > PLX_MAX_DIMS)
        ctx.fail("shape inference returned an invalid output " + std::to_string(i));
      ctx.out(i, static_cast<plx_dtype>(o.dtype), Shape(o.shape, o.shape + o.ndim));
    }
  };
  if (p.grad_op) {
    const std::string grad_op = p.grad_op;
    s.grad = [grad_op](GradContext& g) {
      std::vector<Var> args;
      const int n_in = static_cast<int>(g.schema().inputs.size());
      const int n_out = static_cast<int>(g.schema().outputs.size());
      for (int i = 0; i < n_out; ++i) args.push_back(g.grad_output(i));
      for (int i = 0; i < n_in; ++i) args.push_back(g.input(i));
      for (int i = 0; i < n_out; ++i) args.push_back(g.output(i));
      auto grads = g.call_all(grad_op, args, g.attrs());
      for (int i = 0; i < n_in && i < static_cast<int>(grads.size()); ++i) g.set_grad(i, grads[i]);
    };
  }
  return add(std::move(s));
}

// ---- schema helpers ----

namespace schema {

ArgDef in(std::string name, uint32_t dtypes, uint32_t flags) {
  return ArgDef{std::move(name), flags, dtypes};
}
ArgDef opt(std::string name, uint32_t dtypes) {
  return ArgDef{std::move(name), PLX_ARG_OPTIONAL, dtypes};
}
ArgDef out(std::string name, uint32_t dtypes, uint32_t flags) {
  return ArgDef{std::move(name), flags, dtypes};
}
AttrDef attr(std::string name, plx_attr_type type, std::optional<AttrValue> def, std::string doc) {
  return AttrDef{std::move(name), type, std::move(def), std::move(doc)};
}

AttrDef since_abi(AttrDef a, uint16_t minor) {
  a.since_abi_minor = minor;
  return a;
}

ArgDef since_abi(ArgDef a, uint16_t minor) {
  a.since_abi_minor = minor;
  return a;
}

uint16_t abi_minor_needed(const OpSchema& schema, const Attrs& attrs, std::string* why,
                          const std::vector<bool>& given) {
  uint16_t need = 0;
  for (size_t i = 0; i < schema.inputs.size() && i < given.size(); ++i) {
    const ArgDef& d = schema.inputs[i];
    if (d.since_abi_minor <= need || !given[i]) continue;
    need = d.since_abi_minor;
    if (why)
      *why = "input '" + d.name + "' (ABI " + std::to_string(PLX_ABI_MAJOR) + "." +
             std::to_string(need) + ")";
  }
  for (const AttrDef& d : schema.attrs) {
    if (d.since_abi_minor <= need || !d.default_value || !attrs.has(d.name)) continue;
    const AttrValue* v = attrs.find(d.name);
    if (!v || *v == *d.default_value) continue;
    need = d.since_abi_minor;
    if (why)
      *why = "attribute '" + d.name + "' = " + attr_value_string(*v) + " (ABI " +
             std::to_string(PLX_ABI_MAJOR) + "." + std::to_string(need) + ")";
  }
  return need;
}

std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape r(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    r[i] = da == 1 ? db : da;
  }
  return r;
}

int64_t normalize_axis(const InferContext& ctx, int64_t axis, int64_t ndim) {
  // A 0-d tensor takes axis 0 or -1, as in PyTorch.
  const int64_t n = std::max<int64_t>(ndim, 1);
  const int64_t a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n)
    ctx.fail("axis " + std::to_string(axis) + " is out of range for " + std::to_string(ndim) +
             " dimensions");
  return a;
}

void add_with_backward(OpRegistry& r, const std::string& name, const std::string& doc,
                       const std::string& backward_doc, bool saves_output,
                       const std::vector<AttrDef>& attrs,
                       std::function<void(InferContext&)> infer,
                       std::function<void(InferContext&)> backward_infer) {
  const std::string bwd = name + "_backward";
  r.add(OpSchema{
      .name = name,
      .doc = doc,
      .inputs = {in("x", kFloatTypes)},
      .outputs = {out("y")},
      .attrs = attrs,
      .infer = std::move(infer),
      .grad =
          [bwd, saves_output](GradContext& g) {
            if (!g.grad_output(0).valid()) return;
            const Var saved = saves_output ? g.output(0) : g.input(0);
            g.set_grad(0, g.call(bwd, {g.grad_output(0), saved}, g.attrs()));
          },
  });
  r.add(OpSchema{
      .name = bwd,
      .doc = backward_doc,
      .inputs = {in("dy", kFloatTypes), in(saves_output ? "y" : "x")},
      .outputs = {out("dx")},
      .attrs = attrs,
      .infer = std::move(backward_infer),
  });
}

Pair pair_attr(const InferContext& c, const std::string& name, int64_t min) {
  const Ints& v = c.attrs().get_ints(name);
  c.require(v.size() == 2,
            name + " must have 2 values [h, w], got " + attr_value_string(AttrValue(v)));
  c.require(v[0] >= min && v[1] >= min, name + " must be >= " + std::to_string(min) + ", got " +
                                            attr_value_string(AttrValue(v)));
  return {v[0], v[1]};
}

}  // namespace schema
}  // namespace plexus
