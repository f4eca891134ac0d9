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
  }
  return "unhandled attribute kind";
}

bool valid_name(const std::string& n) {
  if (n.empty()) return false;
  return std::all_of(n.begin(), n.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
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
      const size_t want = static_cast<size_t>(lt->inputs);
      if (want != 1 && l.inputs.size() != want)
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

std::string where(const toml::source_region& r, const std::string& fallback) {
  std::ostringstream os;
  os << (r.path ? *r.path : fallback);
  if (r.begin.line) os << ':' << r.begin.line << ':' << r.begin.column;
  return os.str();
}

const char* node_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    default:
      return "a date or time";
  }
}

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
