// Model descriptions: the layer catalogue, parsing TOML into a ModelSpec, validation, and the
// built-in models embedded from configs/models/*.toml (cmake/EmbedModels.cmake).
//
// One table of layer types drives everything: which keys a layer takes, their kinds, ranges and
// defaults. The TOML path and the code path (a ModelSpec made in C++) share the same checks;
// the TOML path only adds positions and the TOML-level type errors.
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "plexus/error.hpp"
#include "plexus/model.hpp"
#include "../toml_util.hpp"

namespace plexus {

// The embedded built-ins, generated at build time (one entry per configs/models/*.toml).
namespace detail {
struct EmbeddedModel {
  const char* name;  // the file's stem
  const unsigned char* text;
  size_t size;
};
extern const EmbeddedModel kEmbeddedModels[];
extern const size_t kEmbeddedModelCount;
}  // namespace detail

namespace {

constexpr double kNoMax = std::numeric_limits<double>::infinity();

LayerAttrRule rule(std::string key, LayerAttrKind kind, bool required, double min, double max,
                   std::string def, std::string doc, std::vector<std::string> choices = {}) {
  LayerAttrRule r;
  r.key = std::move(key);
  r.kind = kind;
  r.required = required;
  r.min = min;
  r.max = max;
  r.default_text = std::move(def);
  r.doc = std::move(doc);
  r.choices = std::move(choices);
  return r;
}

// Keys every layer may have besides its own attributes.
const std::vector<std::string> kCommonKeys = {"type", "name", "inputs"};
const std::vector<std::string> kModelKeys = {"name",    "description", "input",
                                             "classes", "init",        "layers"};

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

std::string LayerSpec::where_of(std::string key) const {
  while (true) {
    if (auto it = key_where.find(key); it != key_where.end()) return it->second;
    const size_t dot = key.rfind('.');
    if (dot == std::string::npos) return where;
    key.resize(dot);
  }
}

const std::vector<std::string>& init_rules() {
  static const std::vector<std::string> r = {"default", "kaiming_uniform", "kaiming_normal",
                                             "xavier_uniform", "xavier_normal"};
  return r;
}

const std::vector<LayerType>& layer_types() {
  static const std::vector<LayerType> types = [] {
    using K = LayerAttrKind;
    const auto init = rule("init", K::String, false, 0, 0, "the model's init",
                           "weight init rule (bias: see Initialisation)", init_rules());
    const auto bias = rule("bias", K::Bool, false, 0, 1, "true", "add a learned bias");
    const auto kernel = rule("kernel", K::Pair, true, 1, kNoMax, "", "window size");
    const auto padding =
        rule("padding", K::Pair, false, 0, kNoMax, "0", "zeros added on each side");
    const auto dilation = rule("dilation", K::Pair, false, 1, kNoMax, "1", "spacing of the taps");
    const auto ceil_mode = rule("ceil_mode", K::Bool, false, 0, 1, "false",
                                "round the output size up instead of down");
    const auto eps = rule("eps", K::Float, false, 0, kNoMax, "1e-5", "added to the variance");
    const auto affine =
        rule("affine", K::Bool, false, 0, 1, "true", "learn a scale (weight) and shift (bias)");
    std::vector<LayerType> v;
    v.push_back(
        {"conv2d",
         1,
         {rule("out", K::Int, true, 1, kNoMax, "", "output channels"), kernel,
          rule("stride", K::Pair, false, 1, kNoMax, "1", "step between windows"), padding, dilation,
          rule("groups", K::Int, false, 1, kNoMax, "1",
               "channel groups; divides input and output channels"),
          bias, init},
         "2-D convolution of (N, C, H, W); weight (out, C/groups, kh, kw), bias (out)"});
    v.push_back({"linear",
                 1,
                 {rule("out", K::OutSize, true, 1, kNoMax, "",
                       "output features, or \"classes\" for the model's classes"),
                  bias, init},
                 "y = x·weightᵀ + bias over the last dimension; weight (out, in), bias (out)"});
    v.push_back({"relu", 1, {}, "max(x, 0)"});
    v.push_back({"gelu",
                 1,
                 {rule("approximate", K::String, false, 0, 0, "\"none\"",
                       "\"tanh\" for the tanh approximation", {"none", "tanh"})},
                 "Gaussian error linear unit"});
    v.push_back({"tanh", 1, {}, "hyperbolic tangent"});
    v.push_back({"sigmoid", 1, {}, "1 / (1 + exp(-x))"});
    v.push_back(
        {"max_pool2d",
         1,
         {kernel, rule("stride", K::Pair, false, 1, kNoMax, "kernel", "step between windows"),
          padding, dilation, ceil_mode},
         "maximum over each window of (N, C, H, W)"});
    v.push_back(
        {"avg_pool2d",
         1,
         {kernel, rule("stride", K::Pair, false, 1, kNoMax, "kernel", "step between windows"),
          padding, ceil_mode,
          rule("count_include_pad", K::Bool, false, 0, 1, "true", "count padding in the divisor")},
         "mean over each window of (N, C, H, W)"});
    v.push_back(
        {"global_avg_pool", 1, {}, "mean over every dimension after C: (N, C, ...) -> (N, C)"});
    v.push_back({"batch_norm",
                 1,
                 {eps,
                  rule("momentum", K::Float, false, 0, 1, "0.1",
                       "weight of the batch in the running statistics"),
                  affine},
                 "normalises each channel (axis 1) of (N, C, ...); weight, bias (C); states "
                 "running_mean, running_var (C)"});
    v.push_back({"layer_norm",
                 1,
                 {rule("normalized_ndim", K::Int, false, 1, kNoMax, "1",
                       "how many trailing dimensions are normalised together"),
                  eps, affine},
                 "normalises over the trailing dimensions; weight, bias of their shape"});
    v.push_back({"flatten", 1, {}, "(N, ...) -> (N, product of the rest)"});
    v.push_back({"add", 2, {}, "elementwise sum of two inputs of the same shape"});
    v.push_back(
        {"op",
         -1,
         {rule("op", K::String, true, 0, 0, "",
               "the op: a built-in (docs/ops.md) or a plugin's (<plugin>.<op>), checked when the "
               "model is built"),
          rule("attrs", K::OpAttrs, false, 0, 0, "{}", "the op's attributes, an inline table"),
          rule("params", K::Params, false, 0, 0, "[]",
               "learned parameters { name, shape, init } passed after the inputs"),
          rule("output", K::Int, false, 0, kNoMax, "0",
               "which of the op's outputs the layer gives")},
         "any op, built-in or a plugin's, on the layer's inputs (any number) and its parameters"});
    return v;
  }();
  return types;
}

namespace {

const LayerType* find_type(std::string_view t) {
  for (const auto& lt : layer_types())
    if (lt.type == t) return &lt;
  return nullptr;
}

std::vector<std::string> type_names() {
  std::vector<std::string> v;
  for (const auto& lt : layer_types()) v.push_back(lt.type);
  return v;
}

const LayerAttrRule* find_rule(const LayerType& lt, std::string_view key) {
  for (const auto& r : lt.attrs)
    if (r.key == key) return &r;
  return nullptr;
}

std::string kind_text(const LayerAttrRule& r) {
  switch (r.kind) {
    case LayerAttrKind::Int:
      return "an integer";
    case LayerAttrKind::Pair:
      return "an integer or [h, w]";
    case LayerAttrKind::Bool:
      return "a boolean";
    case LayerAttrKind::Float:
      return "a number";
    case LayerAttrKind::String:
      return "a string";
    case LayerAttrKind::OutSize:
      return "an integer or \"classes\"";
    case LayerAttrKind::OpAttrs:
      return "an inline table of the op's attributes";
    case LayerAttrKind::Params:
      return "an array of inline tables { name, shape, init }";
  }
  return "?";
}

std::string range_text(const LayerAttrRule& r) {
  if (r.max == kNoMax) return ">= " + number_text(r.min);
  return "in " + number_text(r.min) + ".." + number_text(r.max);
}

std::string value_text(const AttrValue& v) {
  return attr_value_string(v);
}

std::string type_text(const AttrValue& v) {
  return std::string(attr_type_name(attr_type_of(v))) + " " + value_text(v);
}

const char* dropout_message =
    "dropout is not supported in static graphs yet: its seed and offset are op attributes fixed "
    "when the graph is built, so every step would drop the same units; remove the layer";

// Normalises one attribute value in place and checks its kind and range. Returns "" or the
// problem, without location.
std::string check_attr(const LayerAttrRule& r, AttrValue& v) {
  const std::string expected = "expected " + kind_text(r);
  switch (r.kind) {
    case LayerAttrKind::Int: {
      const int64_t* i = std::get_if<int64_t>(&v);
      if (!i) return expected + ", got " + type_text(v);
      if (*i < r.min || *i > r.max)
        return "expected an integer " + range_text(r) + ", got " + std::to_string(*i);
      return "";
    }
    case LayerAttrKind::Pair: {
      if (const int64_t* i = std::get_if<int64_t>(&v)) v = Ints{*i, *i};
      const Ints* p = std::get_if<Ints>(&v);
      if (!p || p->size() != 2) return expected + " (two integers), got " + type_text(v);
      for (int64_t x : *p)
        if (x < r.min || x > r.max)
          return "expected integers " + range_text(r) + ", got " + value_text(v);
      return "";
    }
    case LayerAttrKind::Bool: {
      const int64_t* i = std::get_if<int64_t>(&v);
      if (!i || (*i != 0 && *i != 1)) return expected + " (0 or 1 in code), got " + type_text(v);
      return "";
    }
    case LayerAttrKind::Float: {
      if (const int64_t* i = std::get_if<int64_t>(&v)) v = static_cast<double>(*i);
      const double* d = std::get_if<double>(&v);
      if (!d) return expected + ", got " + type_text(v);
      if (!(*d >= r.min && *d <= r.max))
        return "expected a number " + range_text(r) + ", got " + number_text(*d);
      return "";
    }
    case LayerAttrKind::String: {
      const std::string* s = std::get_if<std::string>(&v);
      if (!s) return expected + ", got " + type_text(v);
      if (!r.choices.empty() &&
          std::find(r.choices.begin(), r.choices.end(), *s) == r.choices.end())
        return "expected one of " + join(r.choices) + ", got \"" + *s + "\"";
      return "";
    }
    case LayerAttrKind::OutSize: {
      if (const std::string* s = std::get_if<std::string>(&v)) {
        if (*s != "classes") return expected + ", got \"" + *s + "\"";
        return "";
      }
      const int64_t* i = std::get_if<int64_t>(&v);
      if (!i) return expected + ", got " + type_text(v);
      if (*i < r.min) return "expected an integer " + range_text(r) + ", got " + std::to_string(*i);
      return "";
    }
    case LayerAttrKind::OpAttrs:
    case LayerAttrKind::Params:
      // Written in TOML they never land in attrs; in code they are LayerSpec fields.
      return "expected " + kind_text(r) +
             " (in code: LayerSpec::" + (r.kind == LayerAttrKind::OpAttrs ? "op_attrs" : "params") +
             ", not attrs)";
  }
  return "unhandled attribute kind";
}

bool valid_name(const std::string& n) {
  if (n.empty()) return false;
  return std::all_of(n.begin(), n.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
}

// The init values a parameter of an op layer may name besides a number.
std::vector<std::string> param_inits() {
  std::vector<std::string> v = {"zeros", "ones"};
  v.insert(v.end(), init_rules().begin(), init_rules().end());
  return v;
}

// An op layer's parameters: each problem with the key it is about ("params.0.shape").
// Normalises an integer init to a double.
std::vector<std::pair<std::string, std::string>> check_params(std::vector<LayerParam>& params) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    LayerParam& p = params[i];
    const std::string key = "params." + std::to_string(i);
    const std::string label =
        "params[" + std::to_string(i) + "]" + (p.name.empty() ? "" : " '" + p.name + "'") + ": ";
    if (!valid_name(p.name))
      out.push_back({key + ".name", label + "name: expected letters, digits, '_' and '-', got \"" +
                                        p.name + "\""});
    else if (!seen.insert(p.name).second)
      out.push_back({key + ".name", label + "name: another parameter of the layer has it"});
    if (p.shape.empty() ||
        std::any_of(p.shape.begin(), p.shape.end(), [](int64_t d) { return d < 1; }))
      out.push_back({key + ".shape", label +
                                         "shape: expected a non-empty array of integers >= "
                                         "1, got " +
                                         shape_string(p.shape)});
    if (const int64_t* i64 = std::get_if<int64_t>(&p.init)) p.init = static_cast<double>(*i64);
    if (const std::string* rule = std::get_if<std::string>(&p.init)) {
      const auto inits = param_inits();
      if (std::find(inits.begin(), inits.end(), *rule) == inits.end())
        out.push_back({key + ".init", label + "init: expected a number or one of " + join(inits) +
                                          ", got \"" + *rule + "\""});
      else if (*rule != "zeros" && *rule != "ones" && p.shape.size() < 2)
        out.push_back({key + ".init", label + "init: \"" + *rule +
                                          "\" needs a shape of 2 or more dimensions "
                                          "(fan_in from shape[1], fan_out from shape[0]), got " +
                                          shape_string(p.shape) + "; use zeros, ones or a number"});
    } else if (!std::holds_alternative<double>(p.init)) {
      out.push_back({key + ".init", label + "init: expected a number or one of " +
                                        join(param_inits()) + ", got " + type_text(p.init)});
    }
  }
  return out;
}

std::string at(const std::string& where) {
  return where.empty() ? "" : where + ": ";
}

std::string layer_label(const LayerSpec& l, size_t index) {
  std::string s = "layer " + std::to_string(index + 1);
  if (!l.name.empty()) s += " '" + l.name + "'";
  if (!l.type.empty()) s += " (" + l.type + ")";
  return s;
}

// Where each key of a layer was written (parsing only), and the keys whose TOML value was
// already reported as malformed (so they are not also reported missing).
struct LayerSource {
  std::map<std::string, std::string> pos;      // of the value
  std::map<std::string, std::string> key_pos;  // of the key
  std::set<std::string> reported;
  // TOML-level problems (position, problem), labelled once the layer has its default name.
  std::vector<std::pair<std::string, std::string>> problems;
};

// Default names: "<type>_<n>", n counting the layers of that type from 1 (named ones too, so
// naming one layer does not rename the others).
void assign_default_names(ModelSpec& spec) {
  std::map<std::string, int> count;
  for (auto& l : spec.layers) {
    const int n = ++count[l.type];
    if (l.name.empty()) l.name = (l.type.empty() ? "layer" : l.type) + "_" + std::to_string(n);
  }
}

// The checks shared by parsing and code-built specs: each layer's type, keys and values (which
// are normalised in place), then names, inputs and the use of every output. Appends problems.
void check_spec(ModelSpec& spec, const std::vector<LayerSource>& sources,
                std::vector<std::string>& problems) {
  const std::string model_at = at(spec.source);
  if (spec.classes < 0)
    problems.push_back(model_at + "classes: expected an integer >= 1, got " +
                       std::to_string(spec.classes));
  for (int64_t d : spec.input_shape)
    if (d < 1) {
      std::ostringstream os;
      os << model_at << "input: expected sizes >= 1, got " << shape_string(spec.input_shape);
      problems.push_back(os.str());
      break;
    }
  if (std::find(init_rules().begin(), init_rules().end(), spec.init) == init_rules().end())
    problems.push_back(model_at + "init: expected one of " + join(init_rules()) + ", got \"" +
                       spec.init + "\"");
  if (spec.layers.empty())
    problems.push_back(model_at + "the model has no layers (add [[layers]] tables)");

  std::map<std::string, size_t> index_of;  // name -> first layer with it
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    LayerSpec& l = spec.layers[i];
    const std::string lat = at(l.where);
    const LayerSource& src = sources.at(i);
    auto find_or = [&](const std::map<std::string, std::string>& m, const std::string& key) {
      auto it = m.find(key);
      return it == m.end() ? l.where : it->second;
    };
    auto kw = [&](const std::string& key) { return find_or(src.pos, key); };
    auto key_at = [&](const std::string& key) { return find_or(src.key_pos, key); };
    const std::string label = layer_label(l, i);
    for (const auto& [pos, problem] : src.problems)
      problems.push_back(at(pos) + label + ": " + problem);
    if (l.type.empty()) {
      if (!src.reported.count("type"))
        problems.push_back(lat + label + ": missing key 'type' (one of: " + join(type_names()) +
                           ")");
    } else if (l.type == "dropout") {
      problems.push_back(lat + label + ": " + dropout_message);
    } else if (const LayerType* lt = find_type(l.type)) {
      std::vector<std::string> allowed;
      for (const auto& r : lt->attrs) allowed.push_back(r.key);
      for (auto& [key, value] : l.attrs) {
        const LayerAttrRule* r = find_rule(*lt, key);
        if (!r) {
          problems.push_back(at(key_at(key)) + label + ": unknown key '" + key + "' (" + l.type +
                             " takes: " + (allowed.empty() ? "no attributes" : join(allowed)) +
                             "; every layer: " + join(kCommonKeys) + ")");
          continue;
        }
        const std::string problem = check_attr(*r, value);
        if (!problem.empty()) problems.push_back(at(kw(key)) + label + ": " + key + ": " + problem);
        if (r->kind == LayerAttrKind::OutSize && problem.empty() &&
            std::holds_alternative<std::string>(value) && spec.classes == 0)
          problems.push_back(at(kw(key)) + label + ": " + key +
                             ": \"classes\" needs the model's classes (classes = N at the top)");
      }
      for (const auto& r : lt->attrs)
        if (r.required && !l.attrs.count(r.key) && !src.reported.count(r.key))
          problems.push_back(lat + label + ": missing required key '" + r.key + "' (" + r.doc +
                             ", " + kind_text(r) + ")");
      if (l.type == "op") {
        if (const auto it = l.attrs.find("op"); it != l.attrs.end()) {
          const std::string* op = std::get_if<std::string>(&it->second);
          if (op && op->empty())
            problems.push_back(at(kw("op")) + label +
                               ": op: must name an op (docs/ops.md, or "
                               "a plugin's <plugin>.<op>)");
        }
        // Parameters whose TOML was malformed were reported as such already.
        if (!src.reported.count("params"))
          for (const auto& [key, problem] : check_params(l.params))
            problems.push_back(at(l.where_of(key)) + label + ": " + problem);
      }
      const size_t want = static_cast<size_t>(lt->inputs);
      if (lt->inputs < 0) {
        // Any number: the op checks its inputs when the model is built.
      } else if (want != 1 && l.inputs.size() != want)
        problems.push_back(at(kw("inputs")) + label + ": takes " + std::to_string(want) +
                           " inputs, named in inputs = [...], got " +
                           std::to_string(l.inputs.size()));
      else if (want == 1 && l.inputs.size() > 1)
        problems.push_back(at(kw("inputs")) + label + ": takes 1 input, got " +
                           std::to_string(l.inputs.size()) + " in inputs = [" + join(l.inputs) +
                           "]");
    } else {
      problems.push_back(at(kw("type")) + label + ": unknown layer type '" + l.type +
                         "' (known: " + join(type_names()) + ")");
    }

    if (l.type != "op" && (l.op_attrs.size() > 0 || !l.params.empty()))
      problems.push_back(lat + label + ": op_attrs and params are for layers of type \"op\"");

    if (!valid_name(l.name) || l.name == "input") {
      problems.push_back(at(kw("name")) + label + ": bad name \"" + l.name +
                         "\": use letters, digits, '_' and '-', and not \"input\" (which names "
                         "the model's input)");
    } else if (auto it = index_of.find(l.name); it != index_of.end()) {
      problems.push_back(
          at(kw("name")) + label + ": duplicate layer name '" + l.name + "' (also layer " +
          std::to_string(it->second + 1) +
          (spec.layers[it->second].where.empty() ? "" : " at " + spec.layers[it->second].where) +
          "; unnamed layers are called <type>_<n>)");
    } else {
      index_of.emplace(l.name, i);
    }
    for (const auto& in : l.inputs) {
      if (in == "input") continue;
      auto it = index_of.find(in);
      if (it != index_of.end() && it->second < i) continue;
      bool later = false;
      for (size_t j = i; j < spec.layers.size(); ++j) later |= spec.layers[j].name == in;
      problems.push_back(at(kw("inputs")) + label + ": input '" + in + "' " +
                         (later ? "is not an earlier layer (a layer may only read layers above it)"
                                : "names no layer (inputs name earlier layers or \"input\")"));
    }
  }

  // Every output but the last must be read, else its branch is dead: it would be computed and
  // its parameters would get no gradient.
  for (size_t i = 0; i + 1 < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    bool used = spec.layers[i + 1].inputs.empty();
    for (size_t j = i + 1; j < spec.layers.size() && !used; ++j)
      for (const auto& in : spec.layers[j].inputs) used |= in == l.name;
    if (!used)
      problems.push_back(at(l.where) + layer_label(l, i) +
                         ": its output is not read by any later layer (only the last layer is "
                         "the model's output; did a later layer mean to name it in inputs?)");
  }
}

[[noreturn]] void throw_problems(const std::vector<std::string>& problems) {
  throw ConfigError(join(problems, "\n"));
}

// ---- TOML ----

using toml_util::where;
const char* node_type_name(const toml::node& n) { return toml_util::type_name(n); }

// A table's entries in the order they were written (toml++ iterates them sorted by key).
struct Entry {
  std::string key;
  toml::source_region key_source;
  const toml::node* node;
};
std::vector<Entry> in_order(const toml::table& t) {
  std::vector<Entry> v;
  for (const auto& [k, n] : t) v.push_back({std::string(k.str()), k.source(), &n});
  std::stable_sort(v.begin(), v.end(), [](const Entry& a, const Entry& b) {
    const auto &pa = a.key_source.begin, &pb = b.key_source.begin;
    return pa.line != pb.line ? pa.line < pb.line : pa.column < pb.column;
  });
  return v;
}

// A TOML value as an attribute value for `r`, or the problem when its TOML type does not fit
// (booleans are kept apart from integers here; in code both are int64). Ranges and choices are
// left to the shared check.
std::string from_toml(const LayerAttrRule& r, const toml::node& n, AttrValue& out) {
  using K = LayerAttrKind;
  const std::string wrong = "expected " + kind_text(r) + ", got " + node_type_name(n);
  if (n.is_boolean()) {
    if (r.kind != K::Bool) return wrong;
    out = int64_t{*n.value<bool>() ? 1 : 0};
  } else if (n.is_integer()) {
    if (r.kind == K::Bool || r.kind == K::String) return wrong;
    out = *n.value<int64_t>();
  } else if (n.is_floating_point()) {
    if (r.kind != K::Float) return wrong;
    out = *n.value<double>();
  } else if (n.is_string()) {
    if (r.kind != K::String && r.kind != K::OutSize) return wrong;
    out = *n.value<std::string>();
  } else if (const toml::array* a = n.as_array(); a && r.kind == K::Pair) {
    Ints v;
    for (const auto& e : *a) {
      if (!e.is_integer())
        return "expected " + kind_text(r) + ", got an array holding " + node_type_name(e);
      v.push_back(*e.value<int64_t>());
    }
    out = v;
  } else {
    return wrong;
  }
  return "";
}

// An op layer's attrs = { ... } into l.op_attrs, with each attribute's position.
// (Nodes carry their file's name: parse_model gives it to toml++.)
void read_op_attrs(const LayerAttrRule& r, const toml::node& n, LayerSpec& l, LayerSource& src) {
  const toml::table* t = n.as_table();
  if (!t) {
    src.problems.push_back({where(n.source(), ""),
                            r.key + ": expected " + kind_text(r) + ", got " + node_type_name(n)});
    src.reported.insert(r.key);
    return;
  }
  for (const Entry& e : in_order(*t)) {
    l.key_where[r.key + "." + e.key] = where(e.key_source, "");
    AttrValue v;
    const std::string problem = toml_util::attr_from_toml(*e.node, v);
    if (!problem.empty()) {
      src.problems.push_back({where(e.node->source(), ""), r.key + "." + e.key + ": " + problem});
      continue;
    }
    l.op_attrs.set(e.key, std::move(v));
  }
}

// An op layer's params = [{ name, shape, init }, ...] into l.params, with the positions of each
// parameter and its keys. TOML-level problems are reported here (and the parameters' own checks
// skipped); the rest is checked with code-built specs in check_spec.
void read_params(const LayerAttrRule& r, const toml::node& n, LayerSpec& l, LayerSource& src) {
  auto wh = [&](const toml::node& x) { return where(x.source(), ""); };
  auto problem = [&](const std::string& pos, const std::string& text) {
    src.problems.push_back({pos, text});
    src.reported.insert(r.key);
  };
  const toml::array* a = n.as_array();
  if (!a)
    return problem(wh(n), r.key + ": expected " + kind_text(r) + ", got " + node_type_name(n));
  for (size_t i = 0; i < a->size(); ++i) {
    const toml::node& pn = *a->get(i);
    const std::string key = r.key + "." + std::to_string(i);
    const std::string label = r.key + "[" + std::to_string(i) + "]";
    l.key_where[key] = wh(pn);
    LayerParam p;
    const toml::table* t = pn.as_table();
    if (!t) {
      problem(wh(pn), label + ": expected an inline table { name, shape, init }, got " +
                          node_type_name(pn));
      l.params.push_back(p);
      continue;
    }
    for (const Entry& e : in_order(*t)) {
      const toml::node& v = *e.node;
      l.key_where[key + "." + e.key] = wh(v);
      const std::string got = std::string(", got ") + node_type_name(v);
      if (e.key == "name") {
        if (v.is_string())
          p.name = *v.value<std::string>();
        else
          problem(wh(v), label + ": name: expected a string" + got);
      } else if (e.key == "shape") {
        const toml::array* sa = v.as_array();
        bool ok = sa != nullptr;
        if (ok)
          for (const auto& d : *sa) ok = ok && d.is_integer();
        if (ok)
          for (const auto& d : *sa) p.shape.push_back(*d.value<int64_t>());
        else
          problem(wh(v), label + ": shape: expected an array of integers such as [1] or [64, 32]" +
                             (sa ? ", got an array holding something else" : got));
      } else if (e.key == "init") {
        if (v.is_string())
          p.init = *v.value<std::string>();
        else if (v.is_integer() || v.is_floating_point())
          p.init = *v.value<double>();
        else
          problem(wh(v), label + ": init: expected a number or a string" + got);
      } else {
        problem(where(e.key_source, ""),
                label + ": unknown key '" + e.key + "' (a parameter has: name, shape, init)");
      }
    }
    for (const char* required : {"name", "shape"})
      if (!t->contains(required)) problem(wh(pn), label + ": missing key '" + required + "'");
    l.params.push_back(std::move(p));
  }
}

}  // namespace

ModelSpec parse_model(std::string_view text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(source));
  } catch (const toml::parse_error& e) {
    throw ConfigError(where(e.source(), source) +
                      ": TOML syntax error: " + std::string(e.description()));
  }
  ModelSpec spec;
  spec.source = source;
  spec.name = std::filesystem::path(source).stem().string();
  std::vector<std::string> problems;
  auto wh = [&](const toml::node& n) { return where(n.source(), source); };

  // Layers come with their keys' positions, for the shared checks.
  std::vector<LayerSource> sources;
  for (const Entry& entry : in_order(root)) {
    const std::string& key = entry.key;
    const toml::node& n = *entry.node;
    const std::string got = std::string(", got ") + node_type_name(n);
    if (key == "name" || key == "description" || key == "init") {
      if (!n.is_string()) {
        problems.push_back(wh(n) + ": " + key + ": expected a string" + got);
        continue;
      }
      const std::string v = *n.value<std::string>();
      (key == "name" ? spec.name : key == "description" ? spec.description : spec.init) = v;
      if (key == "name" && v.empty()) problems.push_back(wh(n) + ": name: must not be empty");
    } else if (key == "classes") {
      if (!n.is_integer() || *n.value<int64_t>() < 1) {
        problems.push_back(wh(n) + ": classes: expected an integer >= 1" +
                           (n.is_integer() ? ", got " + std::to_string(*n.value<int64_t>()) : got));
        continue;
      }
      spec.classes = *n.value<int64_t>();
    } else if (key == "input") {
      const toml::array* a = n.as_array();
      bool ok = a && !a->empty();
      if (ok)
        for (const auto& e : *a) ok = ok && e.is_integer() && *e.value<int64_t>() >= 1;
      if (!ok) {
        problems.push_back(wh(n) +
                           ": input: expected the shape of one sample, an array of "
                           "integers >= 1 such as [1, 28, 28] (C, H, W)" +
                           (a ? "" : got));
        continue;
      }
      for (const auto& e : *a) spec.input_shape.push_back(*e.value<int64_t>());
    } else if (key == "layers") {
      const toml::array* a = n.as_array();
      if (!a || !a->is_array_of_tables()) {
        problems.push_back(wh(n) + ": layers: expected [[layers]] tables" + got);
        continue;
      }
      for (const auto& e : *a) {
        const toml::table& t = *e.as_table();
        LayerSpec l;
        l.where = wh(t);
        LayerSource src;
        auto& pos = src.pos;
        const LayerType* lt = nullptr;
        if (const toml::node* tn = t.get("type"); tn && tn->is_string()) {
          lt = find_type(*tn->value<std::string>());
        }
        for (const Entry& le : in_order(t)) {
          const std::string& k = le.key;
          const toml::node* vn = le.node;
          pos[k] = wh(*vn);
          src.key_pos[k] = where(le.key_source, source);
          const std::string vgot = std::string(", got ") + node_type_name(*vn);
          if (k == "type" || k == "name") {
            if (!vn->is_string()) {
              src.problems.push_back({wh(*vn), k + ": expected a string" + vgot});
              src.reported.insert(k);
              continue;
            }
            (k == "type" ? l.type : l.name) = *vn->value<std::string>();
            if (k == "name" && l.name.empty())
              src.problems.push_back({wh(*vn), "name: must not be empty"});
          } else if (k == "inputs") {
            // A string or an array of strings.
            if (vn->is_string()) {
              l.inputs.push_back(*vn->value<std::string>());
              continue;
            }
            const toml::array* ia = vn->as_array();
            bool ok = ia != nullptr;
            if (ok)
              for (const auto& ie : *ia) ok = ok && ie.is_string();
            if (!ok) {
              src.problems.push_back(
                  {wh(*vn),
                   "inputs: expected layer names, a string or an array of strings" + vgot});
              continue;
            }
            for (const auto& ie : *ia) l.inputs.push_back(*ie.value<std::string>());
          } else {
            const LayerAttrRule* r = lt ? find_rule(*lt, k) : nullptr;
            l.key_where[k] = wh(*vn);
            if (r && r->kind == LayerAttrKind::OpAttrs) {
              read_op_attrs(*r, *vn, l, src);
              continue;
            }
            if (r && r->kind == LayerAttrKind::Params) {
              read_params(*r, *vn, l, src);
              continue;
            }
            if (!r) {
              // Unknown keys (or any key of an unknown type) are reported by the shared checks;
              // keep the raw value so they see it.
              l.attrs[k] = int64_t{0};
              continue;
            }
            AttrValue v;
            const std::string problem = from_toml(*r, *vn, v);
            if (!problem.empty()) {
              src.problems.push_back({wh(*vn), k + ": " + problem});
              src.reported.insert(k);
              continue;
            }
            l.attrs[k] = std::move(v);
          }
        }
        // Keys of an unknown type are only reported as the unknown type.
        if (!l.type.empty() && !lt) l.attrs.clear();
        sources.push_back(std::move(src));
        spec.layers.push_back(std::move(l));
      }
    } else {
      // Unknown keys at the top: often a layer attribute written before the first [[layers]].
      problems.push_back(where(entry.key_source, source) + ": unknown key '" + key +
                         "' (known keys: " + join(kModelKeys) + ")");
    }
  }
  if (!root.contains("layers"))
    problems.push_back(source + ": missing 'layers': describe the layers as [[layers]] tables");

  assign_default_names(spec);
  if (root.contains("layers")) check_spec(spec, sources, problems);
  if (!problems.empty()) throw_problems(problems);
  return spec;
}

void validate_model(ModelSpec& spec) {
  assign_default_names(spec);
  std::vector<std::string> problems;
  check_spec(spec, std::vector<LayerSource>(spec.layers.size()), problems);
  if (!problems.empty()) throw_problems(problems);
}

ModelSpec load_model(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(path + ": cannot open the model file");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_model(ss.str(), path);
}

namespace {
const std::map<std::string, std::string, std::less<>>& builtins() {
  static const std::map<std::string, std::string, std::less<>> m = [] {
    std::map<std::string, std::string, std::less<>> r;
    for (size_t i = 0; i < detail::kEmbeddedModelCount; ++i) {
      const auto& e = detail::kEmbeddedModels[i];
      r.emplace(e.name, std::string(reinterpret_cast<const char*>(e.text), e.size));
    }
    return r;
  }();
  return m;
}
}  // namespace

std::vector<std::string> builtin_models() {
  std::vector<std::string> v;
  for (const auto& [name, text] : builtins()) v.push_back(name);
  return v;
}

const std::string& builtin_model_text(std::string_view name) {
  auto it = builtins().find(name);
  if (it == builtins().end())
    throw ConfigError("no built-in model '" + std::string(name) +
                      "' (built in: " + join(builtin_models()) + ")");
  return it->second;
}

ModelSpec builtin_model(std::string_view name) {
  return parse_model(builtin_model_text(name), "configs/models/" + std::string(name) + ".toml");
}

ModelSpec find_model(const std::string& name_or_path) {
  if (builtins().count(name_or_path)) return builtin_model(name_or_path);
  std::error_code ec;
  if (std::filesystem::is_regular_file(name_or_path, ec)) return load_model(name_or_path);
  throw ConfigError("model '" + name_or_path + "' is neither a built-in model (" +
                    join(builtin_models()) + ") nor a model file");
}

}  // namespace plexus
