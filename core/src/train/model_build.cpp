// Building a ModelSpec into a Graph: one or a few graph nodes per layer, parameters with their
// InitSpecs, and errors that name the layer and where it is written.
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>

#include "plexus/error.hpp"
#include "plexus/model.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus {

namespace {

bool is_float(plx_dtype d) {
  return (kFloatTypes & dtype_bit(d)) != 0;
}

// Parameters and states of a model computing in `compute`: f32 master copies under 16-bit
// activations (mixed precision, docs/training.md), the activations' own type otherwise.
plx_dtype master_dtype(plx_dtype compute) {
  return compute == PLX_F16 || compute == PLX_BF16 ? PLX_F32 : compute;
}

// Mixed precision makes every parameter's 16-bit cast before the first layer (build_model), so
// that the casts are adjacent and a backend may run them as one kernel (the CUDA plugin's
// multi-tensor cast) instead of one per layer. A first pass over the layers in a scratch graph
// records the parameters in order (`record`); the real pass then finds each, made up front, in
// `made`.
struct ParamHoist {
  struct Param {
    std::string name;
    TensorDesc desc;
    InitSpec init;
    bool cast = false;
  };
  std::vector<Param>* record = nullptr;
  std::map<std::string, Var> made;
};

// Weight init by rule (docs/models.md, Initialisation). fan_in and fan_out as PyTorch computes
// them: conv2d fan_in = C/groups·kh·kw, fan_out = out·kh·kw; linear fan_in = in, fan_out = out.
InitSpec weight_init(const std::string& rule, int64_t fan_in, int64_t fan_out) {
  if (rule == "kaiming_uniform") return init::kaiming_uniform(fan_in);
  if (rule == "kaiming_normal") return init::kaiming_normal(fan_in);
  if (rule == "xavier_uniform") return init::xavier_uniform(fan_in, fan_out);
  if (rule == "xavier_normal") return init::xavier_normal(fan_in, fan_out);
  // PyTorch's default: kaiming_uniform with a = sqrt(5), which is a bound of 1/sqrt(fan_in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return init::uniform(-bound, bound);
}

// PyTorch's default draws the bias like the weight; the other rules start it at zero.
InitSpec bias_init(const std::string& rule, int64_t fan_in) {
  if (rule != "default") return init::zeros();
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return init::uniform(-bound, bound);
}

class LayerBuilder {
 public:
  LayerBuilder(Graph& g, const ModelSpec& spec, const LayerSpec& l, plx_dtype dtype, bool training,
               std::string state_prefix = "", ParamHoist* hoist = nullptr)
      : g_(g), spec_(spec), l_(l), dtype_(dtype), training_(training),
        state_prefix_(std::move(state_prefix)), hoist_(hoist) {}

  [[noreturn]] void fail(const std::string& msg) const {
    throw ConfigError(prefix(spec_, l_) + msg);
  }
  // The same, at the position of one of the layer's keys ("op", "attrs.<name>", "params.0").
  [[noreturn]] void fail_at(const std::string& key, const std::string& msg) const {
    throw ConfigError(prefix(spec_, l_, l_.where_of(key)) + msg);
  }
  static std::string prefix(const ModelSpec& spec, const LayerSpec& l) {
    return prefix(spec, l, l.where);
  }
  static std::string prefix(const ModelSpec& spec, const LayerSpec& l, const std::string& where) {
    return (where.empty() ? (spec.source.empty() ? "" : spec.source + ": ") : where + ": ") +
           "layer '" + l.name + "' (" + l.type + "): ";
  }

  int64_t params() const { return params_; }

  Var build(const std::vector<Var>& in) {
    const std::string& t = l_.type;
    const Var x = in.at(0);
    const TensorDesc xd = g_.desc(x);
    if (t == "conv2d") return conv2d(x, xd);
    if (t == "linear") return linear(x, xd);
    if (t == "relu" || t == "tanh" || t == "sigmoid") return g_.add1(t, {x}, {}, l_.name);
    if (t == "gelu") return g_.add1(t, {x}, {{"approximate", str("approximate", "none")}}, l_.name);
    if (t == "max_pool2d" || t == "avg_pool2d") return pool(x, xd);
    if (t == "global_avg_pool") {
      if (xd.ndim() < 3)
        fail("expects (N, C, ...) with at least one dimension after C, got " + desc_string(xd));
      Ints axes;
      for (int i = 2; i < xd.ndim(); ++i) axes.push_back(i);
      return g_.add1("mean", {x}, {{"axes", axes}, {"keepdims", int64_t{0}}}, l_.name);
    }
    if (t == "batch_norm") return batch_norm(x, xd);
    if (t == "layer_norm") return layer_norm(x, xd);
    if (t == "flatten") {
      if (xd.ndim() < 2)
        fail("expects (N, ...) with at least 2 dimensions, got " + desc_string(xd));
      return g_.reshape(x, {xd.shape[0], xd.numel() / std::max<int64_t>(xd.shape[0], 1)});
    }
    if (t == "op") return op(in);
    if (t == "add") {
      const TensorDesc bd = g_.desc(in.at(1));
      // Equal shapes only: a broadcast here is almost always a wiring mistake.
      if (xd.shape != bd.shape)
        fail("inputs '" + l_.inputs.at(0) + "' " + desc_string(xd) + " and '" + l_.inputs.at(1) +
             "' " + desc_string(bd) + " differ in shape");
      return g_.add1("add", {x, in.at(1)}, {}, l_.name);
    }
    fail("no builder for this layer type");
  }

 private:
  int64_t int_attr(const std::string& k, int64_t def) const {
    auto it = l_.attrs.find(k);
    return it == l_.attrs.end() ? def : std::get<int64_t>(it->second);
  }
  double float_attr(const std::string& k, double def) const {
    auto it = l_.attrs.find(k);
    return it == l_.attrs.end() ? def : std::get<double>(it->second);
  }
  Ints pair(const std::string& k, int64_t def) const {
    auto it = l_.attrs.find(k);
    return it == l_.attrs.end() ? Ints{def, def} : std::get<Ints>(it->second);
  }
  std::string str(const std::string& k, const std::string& def) const {
    auto it = l_.attrs.find(k);
    return it == l_.attrs.end() ? def : std::get<std::string>(it->second);
  }

  // A parameter as the layer's op reads it. With 16-bit activations the parameter (the master
  // copy the optimizer updates) is f32 and the forward reads a cast of it, made once per step;
  // the cast's gradient brings the gradient back in f32. `cast` false: the op reads the f32
  // parameter itself (the norms take f32 parameters with a 16-bit x).
  Var param(const std::string& what, Shape shape, InitSpec init, bool cast = true) {
    TensorDesc d{master_dtype(dtype_), std::move(shape)};
    params_ += d.numel();
    const std::string name = l_.name + "." + what;
    if (hoist_ && hoist_->record)
      hoist_->record->push_back({name, d, init, cast && d.dtype != dtype_});
    if (hoist_ && !hoist_->record) {
      auto it = hoist_->made.find(name);
      if (it != hoist_->made.end()) return it->second;
    }
    const Var p = g_.parameter(name, d, init);
    if (!cast || d.dtype == dtype_) return p;
    return g_.add1("cast", {p}, {{"dtype", std::string(dtype_name(dtype_))}},
                   l_.name + "." + what + ".cast");
  }

  Var conv2d(Var x, const TensorDesc& xd) {
    if (xd.ndim() != 4) fail("expects (N, C, H, W), got " + desc_string(xd));
    const int64_t C = xd.shape[1], out = int_attr("out", 0), groups = int_attr("groups", 1);
    const Ints k = pair("kernel", 1);
    if (C % groups != 0)
      fail("groups = " + std::to_string(groups) + " does not divide the input channels " +
           std::to_string(C));
    if (out % groups != 0)
      fail("groups = " + std::to_string(groups) + " does not divide out = " + std::to_string(out));
    const std::string rule = str("init", spec_.init);
    const int64_t fan_in = C / groups * k[0] * k[1];
    const Var w = param("weight", {out, C / groups, k[0], k[1]},
                        weight_init(rule, fan_in, out * k[0] * k[1]));
    const Var b = int_attr("bias", 1) ? param("bias", {out}, bias_init(rule, fan_in)) : Var{};
    return g_.add1("conv2d", {x, w, b},
                   {{"stride", pair("stride", 1)},
                    {"padding", pair("padding", 0)},
                    {"dilation", pair("dilation", 1)},
                    {"groups", groups}},
                   l_.name);
  }

  Var linear(Var x, const TensorDesc& xd) {
    if (xd.ndim() < 2) fail("expects (N, ..., features), got " + desc_string(xd));
    const auto& outv = l_.attrs.at("out");
    const int64_t out =
        std::holds_alternative<std::string>(outv) ? spec_.classes : std::get<int64_t>(outv);
    if (out < 1) fail("out = \"classes\" needs the model's classes to be set");
    const int64_t in = xd.shape.back();
    const std::string rule = str("init", spec_.init);
    const Var w = param("weight", {out, in}, weight_init(rule, in, out));
    const Var b = int_attr("bias", 1) ? param("bias", {out}, bias_init(rule, in)) : Var{};
    return g_.add1("linear", {x, w, b}, {}, l_.name);
  }

  Var pool(Var x, const TensorDesc& xd) {
    if (xd.ndim() != 4) fail("expects (N, C, H, W), got " + desc_string(xd));
    const Ints kernel = pair("kernel", 1);
    Attrs a{{"kernel", kernel},
            {"stride", l_.attrs.count("stride") ? pair("stride", 1) : kernel},
            {"padding", pair("padding", 0)},
            {"ceil_mode", int_attr("ceil_mode", 0)}};
    if (l_.type == "max_pool2d") {
      a.set("dilation", pair("dilation", 1));
    } else {
      a.set("count_include_pad", int_attr("count_include_pad", 1));
    }
    return g_.add(l_.type, {x}, a, l_.name).at(0);  // max_pool2d's indices feed only backward
  }

  Var batch_norm(Var x, const TensorDesc& xd) {
    if (xd.ndim() < 2) fail("expects (N, C, ...), got " + desc_string(xd));
    const int64_t C = xd.shape[1];
    const bool affine = int_attr("affine", 1) != 0;
    const Var gamma = affine ? param("weight", {C}, init::ones(), false) : Var{};
    const Var beta = affine ? param("bias", {C}, init::zeros(), false) : Var{};
    const plx_dtype sd = master_dtype(dtype_);
    const Var rm = g_.state(state_prefix_ + l_.name + ".running_mean", {sd, {C}}, init::zeros());
    const Var rv = g_.state(state_prefix_ + l_.name + ".running_var", {sd, {C}}, init::ones());
    return g_
        .add("batch_norm", {x, gamma, beta, rm, rv},
             {{"training", int64_t{training_ ? 1 : 0}},
              {"momentum", float_attr("momentum", 0.1)},
              {"eps", float_attr("eps", 1e-5)}},
             l_.name)
        .at(0);
  }

  // Any registered op: the layer's inputs, then its parameters, with its attributes.
  Var op(const std::vector<Var>& in) {
    const std::string name = str("op", "");
    const OpSchema* s = g_.ops().find(name);
    if (!s) fail_at("op", "op: unknown op '" + name + "'" + similar_ops(g_.ops(), name));
    for (const auto& [attr, v] : l_.op_attrs) {
      const std::string problem = s->attr_problem(attr, v);
      if (!problem.empty()) fail_at("attrs." + attr, "attrs." + attr + ": " + problem);
    }
    try {
      (void)s->complete_attrs(l_.op_attrs);  // what is left: required attributes not given
    } catch (const OpError& e) {
      fail_at("attrs", std::string("attrs: ") + e.what());
    }
    // Counts first: a layer that fails leaves no parameters behind.
    const size_t given = in.size() + l_.params.size();
    size_t required = 0;
    for (const ArgDef& a : s->inputs) required += !(a.flags & PLX_ARG_OPTIONAL);
    if (given < required || given > s->inputs.size()) {
      std::string names;
      for (const ArgDef& a : s->inputs)
        names += (names.empty() ? "" : ", ") + a.name +
                 ((a.flags & PLX_ARG_OPTIONAL) ? " (optional)" : "");
      fail("op '" + s->name + "' takes " + std::to_string(s->inputs.size()) + " inputs (" + names +
           "); the layer gives " + std::to_string(in.size()) + " input(s) and " +
           std::to_string(l_.params.size()) + " parameter(s), in that order");
    }
    const int64_t output = int_attr("output", 0);
    if (output >= static_cast<int64_t>(s->outputs.size()))
      fail_at("output", "output: op '" + s->name + "' has " + std::to_string(s->outputs.size()) +
                            " output(s), so 0 to " +
                            std::to_string(static_cast<int64_t>(s->outputs.size()) - 1) + ", got " +
                            std::to_string(output));
    std::vector<Var> args = in;
    for (const LayerParam& p : l_.params) args.push_back(param(p.name, p.shape, param_init(p)));
    return g_.add(s->name, args, l_.op_attrs, l_.name).at(static_cast<size_t>(output));
  }

  // How an op layer's parameter starts (validated when the model was parsed or validated).
  static InitSpec param_init(const LayerParam& p) {
    if (const double* v = std::get_if<double>(&p.init)) return init::constant(*v);
    const std::string& rule = std::get<std::string>(p.init);
    if (rule == "zeros") return init::zeros();
    if (rule == "ones") return init::ones();
    // PyTorch's fans: (out, in, k...) -> fan_in = in·k..., fan_out = out·k...
    int64_t receptive = 1;
    for (size_t i = 2; i < p.shape.size(); ++i) receptive *= p.shape[i];
    return weight_init(rule, p.shape.at(1) * receptive, p.shape.at(0) * receptive);
  }

  // " (ops named like it: ...)" for an unknown op: a plugin's ops of the same prefix, or the
  // ops whose names share its start or contain it.
  static std::string similar_ops(const OpRegistry& ops, const std::string& name) {
    const size_t dot = name.find('.');
    std::vector<std::string> like;
    for (int32_t i = 0; i < ops.size(); ++i) {
      const std::string& o = ops.by_id(i).name;
      const bool match = dot != std::string::npos
                             ? o.compare(0, dot + 1, name, 0, dot + 1) == 0
                             : (name.size() >= 3 && (o.compare(0, 3, name, 0, 3) == 0 ||
                                                     o.find(name) != std::string::npos));
      if (match) like.push_back(o);
    }
    if (!like.empty()) {
      std::string list;
      for (size_t i = 0; i < like.size() && i < 12; ++i) list += (i ? ", " : "") + like[i];
      if (like.size() > 12) list += ", ...";
      return " (ops named like it: " + list + ")";
    }
    if (dot != std::string::npos)
      return "; no loaded plugin has ops named '" + name.substr(0, dot + 1) +
             "*' (is the plugin in plugins.paths or PLEXUS_PLUGIN_PATH? plexus info lists what "
             "loaded)";
    return " (docs/ops.md lists the built-in ops, plexus info every loaded one)";
  }

  Var layer_norm(Var x, const TensorDesc& xd) {
    const int64_t k = int_attr("normalized_ndim", 1);
    // The batch dimension is never normalised: samples stay independent.
    if (k > xd.ndim() - 1)
      fail("normalized_ndim = " + std::to_string(k) + " reaches the batch dimension of " +
           desc_string(xd) + " (at most " + std::to_string(xd.ndim() - 1) + ")");
    const Shape shape(xd.shape.end() - k, xd.shape.end());
    const bool affine = int_attr("affine", 1) != 0;
    const Var gamma = affine ? param("weight", shape, init::ones(), false) : Var{};
    const Var beta = affine ? param("bias", shape, init::zeros(), false) : Var{};
    return g_
        .add("layer_norm", {x, gamma, beta},
             {{"normalized_ndim", k}, {"eps", float_attr("eps", 1e-5)}}, l_.name)
        .at(0);
  }

 private:
  Graph& g_;
  const ModelSpec& spec_;
  const LayerSpec& l_;
  plx_dtype dtype_;
  bool training_;
  std::string state_prefix_;
  ParamHoist* hoist_;
  int64_t params_ = 0;
};

}  // namespace

Var build_model(Graph& g, const ModelSpec& spec_in, Var x, bool training,
                std::vector<LayerSummary>* summary, const BuildRange& range) {
  ModelSpec spec = spec_in;
  validate_model(spec);
  const std::string model_at = spec.source.empty() ? "" : spec.source + ": ";
  const TensorDesc xd = g.desc(x);
  if (!is_float(xd.dtype) || xd.ndim() < 1)
    throw ConfigError(model_at + "model '" + spec.name +
                      "': the input must be a float tensor (N, ...), got " + desc_string(xd));

  const int n_layers = static_cast<int>(spec.layers.size());
  const int first = range.first, last = range.last < 0 ? n_layers : range.last;
  if (first < 0 || first >= last || last > n_layers)
    throw ConfigError(model_at + "model '" + spec.name + "': layers [" + std::to_string(first) +
                      ", " + std::to_string(last) + ") are not a range of its " +
                      std::to_string(n_layers) + " layers");
  // x stands for the input (first 0) or for layer first-1's output.
  const std::string x_name = first == 0 ? "input" : spec.layers[static_cast<size_t>(first - 1)].name;
  // The layers [first, last) on x in `gg`, each builder given `hoist`; their summary if asked.
  auto build_layers = [&](Graph& gg, Var x0, ParamHoist* hoist,
                          std::vector<LayerSummary>* sum) -> Var {
    std::map<std::string, Var> outputs{{x_name, x0}};
    Var prev = x0;
    if (sum) sum->clear();
    for (int li = first; li < last; ++li) {
      const LayerSpec& l = spec.layers[static_cast<size_t>(li)];
      std::vector<Var> in;
      if (l.inputs.empty()) in.push_back(prev);
      for (const auto& name : l.inputs) {
        auto it = outputs.find(name);
        if (it == outputs.end())
          throw ConfigError(LayerBuilder::prefix(spec, l) + "reads '" + name +
                            "', which is in an earlier pipeline stage than layer '" + x_name +
                            "' (a stage may read only its own layers and the one before its first)");
        in.push_back(it->second);
      }
      LayerBuilder b(gg, spec, l, xd.dtype, training, range.state_prefix, hoist);
      Var y;
      try {
        y = b.build(in);
      } catch (const ConfigError&) {
        throw;
      } catch (const Error& e) {
        // The graph's own checks (shapes, attributes): say which layer and where it is written.
        throw ConfigError(LayerBuilder::prefix(spec, l) + e.what());
      }
      outputs[l.name] = y;
      prev = y;
      if (sum) sum->push_back({l.name, l.type, gg.desc(y).shape, b.params()});
    }
    return prev;
  };
  Var prev;
  if (master_dtype(xd.dtype) != xd.dtype) {
    // Mixed precision: the parameters, in the order the layers make them, and their casts first
    // (ParamHoist).
    std::vector<ParamHoist::Param> params;
    ParamHoist hoist;
    hoist.record = &params;
    {
      Graph scratch(g.ops());
      build_layers(scratch, scratch.input(x_name, xd), &hoist, nullptr);
    }
    hoist.record = nullptr;
    for (const auto& p : params) {
      const Var v = g.parameter(p.name, p.desc, p.init);
      hoist.made[p.name] =
          p.cast ? g.add1("cast", {v}, {{"dtype", std::string(dtype_name(xd.dtype))}}, p.name + ".cast")
                 : v;
    }
    prev = build_layers(g, x, &hoist, summary);
  } else {
    prev = build_layers(g, x, nullptr, summary);
  }

  const TensorDesc yd = g.desc(prev);
  if (last == n_layers && spec.classes > 0 && (yd.ndim() != 2 || yd.shape[1] != spec.classes)) {
    const LayerSpec& last = spec.layers.back();
    std::string msg = LayerBuilder::prefix(spec, last) + "the model's output is " +
                      desc_string(yd) + ", expected (" + std::to_string(xd.shape[0]) +
                      ", classes = " + std::to_string(spec.classes) + ")";
    if (yd.ndim() > 2) msg += "; add a flatten or global_avg_pool layer before the last linear";
    throw ConfigError(msg);
  }
  return prev;
}

int64_t count_parameters(const Graph& g) {
  int64_t n = 0;
  for (Var p : g.parameters()) n += g.value(p).desc.numel();
  return n;
}

std::string format_summary(const std::vector<LayerSummary>& layers) {
  size_t wn = 5, wt = 4, ws = 6;
  std::vector<std::string> shapes;
  for (const auto& l : layers) {
    shapes.push_back(shape_string(l.output));
    wn = std::max(wn, l.name.size());
    wt = std::max(wt, l.type.size());
    ws = std::max(ws, shapes.back().size());
  }
  std::ostringstream os;
  os << std::left << std::setw(static_cast<int>(wn)) << "layer"
     << "  " << std::setw(static_cast<int>(wt)) << "type"
     << "  " << std::setw(static_cast<int>(ws)) << "output"
     << "  " << std::right << std::setw(12) << "parameters"
     << "\n";
  int64_t total = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& l = layers[i];
    os << std::left << std::setw(static_cast<int>(wn)) << l.name << "  "
       << std::setw(static_cast<int>(wt)) << l.type << "  " << std::setw(static_cast<int>(ws))
       << shapes[i] << "  " << std::right << std::setw(12) << l.parameters << "\n";
    total += l.parameters;
  }
  os << "total parameters: " << total << "\n";
  return os.str();
}

}  // namespace plexus
