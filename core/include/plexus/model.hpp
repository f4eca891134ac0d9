// Models described in TOML and built into a Graph.
//
// A model file is a list of layers ([[layers]] tables) with their attributes. Without `inputs`
// a layer reads the previous layer, so a plain list is a sequential model; with `name` and
// `inputs` layers form a small graph (residual connections). The last layer is the output.
// docs/models.md is the format reference; configs/models/*.toml are the built-in models, embedded
// into the library when it is built.
//
// Parsing checks everything that does not depend on the input's shape (layer types, keys, value
// types and ranges, names and inputs), collecting every problem as "file:line:column: ...".
// Building checks the rest (shapes) layer by layer, naming the layer and where it is written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/attrs.hpp"
#include "plexus/graph.hpp"

namespace plexus {

// A learned parameter of an `op` layer, named "<layer>.<name>" and passed to the op after the
// layer's inputs, in the order written.
struct LayerParam {
  std::string name;
  Shape shape;  // sizes >= 1
  // "zeros", "ones", a weight init rule of init_rules() (fan_in and fan_out from a shape of 2
  // or more dimensions, as PyTorch computes them), or a number (double): every element.
  AttrValue init = std::string("zeros");
};

// One layer. Attribute values are normalised: ints as int64, booleans as int64 0/1, [h, w]
// attributes as Ints of two (an int k becomes [k, k]), floats as double, strings as strings;
// linear's `out` may be the string "classes". Absent attributes take their defaults at build.
struct LayerSpec {
  std::string type;                 // "conv2d", "relu", ... (see layer_types())
  std::string name;                 // unique; parse_model gives "<type>_<n>" if not written
  std::vector<std::string> inputs;  // earlier layers' names or "input"; empty: the previous
  std::map<std::string, AttrValue> attrs;
  std::string where;  // "convnet.toml:12:1", for errors; may be empty
  // type = "op" only (its `op` and `output` are in attrs): the op's attributes, as written (the
  // op's schema checks them when the model is built, since parsing needs no runtime), and the
  // learned parameters it takes.
  Attrs op_attrs;
  std::vector<LayerParam> params;
  // Where keys were written, for the errors found when building: "op", "output", "attrs",
  // "attrs.<name>", "params", "params.<i>" (i from 0) -> "m.toml:14:6". May be empty.
  std::map<std::string, std::string> key_where;

  // Where `key` was written: the key itself, else the nearest enclosing key ("params.0.shape",
  // then "params.0", then "params"), else the layer's `where`.
  std::string where_of(std::string key) const;
};

struct ModelSpec {
  std::string name;
  std::string description;
  std::string source;                // the file (or text's name) it was parsed from
  std::vector<int64_t> input_shape;  // one sample, e.g. (C, H, W); empty: not given
  int64_t classes = 0;               // the output is (N, classes); 0: not checked
  std::string init = "default";      // default weight init of conv2d and linear layers
  std::vector<LayerSpec> layers;
};

// ---- the layer catalogue (drives parsing, validation and the docs test) ----

enum class LayerAttrKind : uint8_t {
  Int,      // an integer
  Pair,     // an integer or [h, w]
  Bool,     // true/false
  Float,    // a number
  String,   // one of `choices`
  OutSize,  // an integer, or "classes" (the model's classes)
  OpAttrs,  // an inline table of an op's attributes (LayerSpec::op_attrs)
  Params,   // an array of { name, shape, init } tables (LayerSpec::params)
};

struct LayerAttrRule {
  std::string key;
  LayerAttrKind kind;
  bool required = false;
  double min = 0, max = 0;           // Int, Pair, Float, OutSize: allowed range (inclusive)
  std::vector<std::string> choices;  // String
  std::string default_text;          // as written in the docs: "1", "true", "= kernel"
  std::string doc;
};

struct LayerType {
  std::string type;
  int inputs = 1;  // how many inputs it reads; -1: any number (the op layer)
  std::vector<LayerAttrRule> attrs;
  std::string doc;
};

// Every supported layer type, in the order docs/models.md lists them.
const std::vector<LayerType>& layer_types();
// The weight init rules a model or layer may name: default, kaiming_uniform, ...
const std::vector<std::string>& init_rules();

// ---- reading ----

// Parses a model description. ConfigError listing every problem with "source:line:column".
ModelSpec parse_model(std::string_view toml_text, const std::string& source);
// Reads and parses a file. ConfigError if it cannot be read or does not parse.
ModelSpec load_model(const std::string& path);
// A built-in model by name. ConfigError naming the built-ins if there is none.
ModelSpec builtin_model(std::string_view name);
// The TOML text of a built-in model. ConfigError naming the built-ins if there is none.
const std::string& builtin_model_text(std::string_view name);
// Names of the built-in models, sorted.
std::vector<std::string> builtin_models();
// A built-in model if `name_or_path` names one, else the file it names (ConfigError saying both
// were tried if neither exists).
ModelSpec find_model(const std::string& name_or_path);

// Checks a spec made in code (parse_model already did this): layer types, keys, values, names
// and inputs; gives unnamed layers their default names and normalises attribute values (an int
// for a [h, w] attribute becomes [k, k], an int for a float becomes a double). ConfigError
// listing every problem.
void validate_model(ModelSpec& spec);

// ---- building ----

struct LayerSummary {
  std::string name, type;
  Shape output;            // shape of the layer's output (N included)
  int64_t parameters = 0;  // trained elements it created
};

// Appends the model's forward pass to `g` reading `x` (N, ...) of a float dtype, creating its
// parameters ("<layer>.weight", "<layer>.bias") and batch-norm states ("<layer>.running_mean",
// "<layer>.running_var") in x's dtype with their InitSpecs. With an f16 or bf16 x (mixed
// precision) they are f32 instead: each layer reads a `cast` of its parameters to x's dtype
// (named "<parameter>.cast"), except the norms, which take their f32 parameters and statistics
// as they are. `training` selects batch statistics
// (and running-statistics updates) in batch norm; otherwise the running statistics are used.
// Returns the output, (N, classes) when spec.classes is set. ConfigError naming the layer and
// where it is written when the spec is invalid or a layer does not fit its input. Fills
// `summary` (one entry per layer) if given.
//
// `range` builds part of the model, a pipeline stage: layers [first, last) (last -1: to the end)
// reading `x` as the output of layer first-1 (the model's input when first is 0). A layer of the
// range may read only layers of the range and layer first-1 (ConfigError naming it otherwise).
// `state_prefix` goes before the batch-norm states' names (a stage's forward recomputed in
// backward updates statistics of its own, not the model's).
struct BuildRange {
  int first = 0;
  int last = -1;
  std::string state_prefix;
};
Var build_model(Graph& g, const ModelSpec& spec, Var x, bool training,
                std::vector<LayerSummary>* summary = nullptr, const BuildRange& range = {});

// Total elements of the graph's parameters (states not included).
int64_t count_parameters(const Graph& g);

// A table of the layers: name, type, output shape, parameters, and the total.
std::string format_summary(const std::vector<LayerSummary>& layers);

}  // namespace plexus
