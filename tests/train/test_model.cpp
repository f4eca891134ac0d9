// Models in TOML: the built-ins, the list and graph forms, parameter shapes, counts and init
// rules, batch norm's mode, every error with its position, and the docs naming every key.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plexus/dispatch.hpp"
#include "plexus/error.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/model.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

const OpRegistry& registry() {
  static const OpRegistry r;
  return r;
}

struct Built {
  Graph g{registry()};
  Var x, y;
  std::vector<LayerSummary> summary;
};

// Builds `spec` over an input (n, spec.input_shape...) of dtype `dt`.
std::unique_ptr<Built> build(const ModelSpec& spec, bool training = true, int64_t n = 4,
                             plx_dtype dt = PLX_F32) {
  auto b = std::make_unique<Built>();
  Shape shape{n};
  shape.insert(shape.end(), spec.input_shape.begin(), spec.input_shape.end());
  b->x = b->g.input("x", {dt, shape});
  b->y = build_model(b->g, spec, b->x, training, &b->summary);
  return b;
}

Shape param_shape(const Graph& g, const std::string& name) {
  return g.value(g.get(name)).desc.shape;
}

int count_nodes(const Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node.op_name() == op;
  return n;
}

const GraphNode& node_named(const Graph& g, const std::string& name) {
  for (const auto& node : g.nodes())
    if (node.name == name) return node;
  FAIL("no node " << name);
  throw std::logic_error("unreachable");
}

// A conv or linear layer's parameter count: weight plus bias.
int64_t conv_params(int64_t in, int64_t out, int64_t k) {
  return out * in * k * k + out;
}
int64_t linear_params(int64_t in, int64_t out) {
  return out * in + out;
}

ModelSpec parse(const std::string& text) {
  return parse_model(text, "m.toml");
}

// Writes `v` into an f32 tensor the executable owns.
void fill_f32(Tensor t, const std::vector<double>& v) {
  REQUIRE(t.dtype() == PLX_F32);
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  const std::vector<float> f(v.begin(), v.end());
  t.copy_from_host(f.data());
}

// The output of the node named `name` (a layer's output).
Var output_of(const Graph& g, const std::string& name) {
  for (const auto& node : g.nodes())
    if (node.name == name) return node.outputs.at(0);
  FAIL("no node " << name);
  return {};
}

const std::string kHead = "name = \"m\"\ninput = [1, 8, 8]\n";

}  // namespace

TEST_CASE("the built-in models are embedded, listed and each parses", "[model][cpu]") {
  CHECK(builtin_models() == std::vector<std::string>{"convnet", "mlp", "resnet", "simplecnn"});
  for (const auto& name : builtin_models()) {
    INFO(name);
    const ModelSpec spec = builtin_model(name);
    CHECK(spec.name == name);
    CHECK(spec.input_shape == Shape{1, 28, 28});
    CHECK(spec.classes == 10);
    CHECK_FALSE(spec.description.empty());
    CHECK(spec.source == "configs/models/" + name + ".toml");
    // The embedded text is the file in the source tree, byte for byte.
    std::ifstream f(source_dir() + "/configs/models/" + name + ".toml", std::ios::binary);
    REQUIRE(f);
    std::ostringstream ss;
    ss << f.rdbuf();
    CHECK(builtin_model_text(name) == ss.str());
    CHECK(find_model(name).layers.size() == spec.layers.size());
  }
  REQUIRE_THROWS_AS(builtin_model("lenet"), ConfigError);
  REQUIRE_THROWS_WITH(
      builtin_model("lenet"),
      PLX_CONTAINS("no built-in model 'lenet' (built in: convnet, mlp, resnet, simplecnn)"));
}

TEST_CASE("simplecnn builds to (N, 10) with 12810 parameters", "[model][cpu]") {
  const ModelSpec spec = builtin_model("simplecnn");
  auto b = build(spec, true, 3);
  CHECK(b->g.desc(b->y).shape == Shape{3, 10});
  CHECK(b->g.desc(b->y).dtype == PLX_F32);
  // 28 -conv 3-> 26 -pool 2-> 13 -conv 3-> 11 -pool 2-> 5: 32·5·5 = 800 features.
  const int64_t want =
      conv_params(1, 16, 3) + conv_params(16, 32, 3) + linear_params(32 * 5 * 5, 10);
  CHECK(want == 12810);
  CHECK(count_parameters(b->g) == want);
  CHECK(param_shape(b->g, "conv2d_1.weight") == Shape{16, 1, 3, 3});
  CHECK(param_shape(b->g, "conv2d_1.bias") == Shape{16});
  CHECK(param_shape(b->g, "conv2d_2.weight") == Shape{32, 16, 3, 3});
  CHECK(param_shape(b->g, "linear_1.weight") == Shape{10, 800});
  CHECK(param_shape(b->g, "linear_1.bias") == Shape{10});
  CHECK(b->g.parameters().size() == 6);

  REQUIRE(b->summary.size() == 8);
  const std::vector<std::pair<std::string, Shape>> layers = {
      {"conv2d_1", {3, 16, 26, 26}}, {"relu_1", {3, 16, 26, 26}}, {"max_pool2d_1", {3, 16, 13, 13}},
      {"conv2d_2", {3, 32, 11, 11}}, {"relu_2", {3, 32, 11, 11}}, {"max_pool2d_2", {3, 32, 5, 5}},
      {"flatten_1", {3, 800}},       {"linear_1", {3, 10}}};
  for (size_t i = 0; i < layers.size(); ++i) {
    CHECK(b->summary[i].name == layers[i].first);
    CHECK(b->summary[i].output == layers[i].second);
  }
  CHECK(b->summary[0].parameters == 160);
  CHECK(b->summary[7].parameters == 8010);
  const std::string table = format_summary(b->summary);
  CHECK_THAT(table, PLX_CONTAINS("max_pool2d_2"));
  CHECK_THAT(table, PLX_CONTAINS("(3, 32, 5, 5)"));
  CHECK_THAT(table, PLX_CONTAINS("total parameters: 12810"));
  // Nodes carry the layer names; the pool's stride defaults to its kernel.
  CHECK(node_named(b->g, "conv2d_1").op_name() == "conv2d");
  CHECK(node_named(b->g, "max_pool2d_1").attrs.get_ints("stride") == Ints{2, 2});
  CHECK(node_named(b->g, "conv2d_2").attrs.get_ints("padding") == Ints{0, 0});
}

TEST_CASE("convnet builds to (N, 10) with 1701130 parameters", "[model][cpu]") {
  auto b = build(builtin_model("convnet"), true, 2);
  CHECK(b->g.desc(b->y).shape == Shape{2, 10});
  // 28 -> 28 -> 28 -pool-> 14 -> 14 -pool-> 7: 128·7·7 = 6272 features.
  const int64_t want = conv_params(1, 32, 3) + conv_params(32, 64, 3) + conv_params(64, 128, 3) +
                       linear_params(128 * 7 * 7, 256) + linear_params(256, 10);
  CHECK(want == 1701130);
  CHECK(count_parameters(b->g) == want);
  CHECK(param_shape(b->g, "linear_1.weight") == Shape{256, 6272});
  CHECK(count_nodes(b->g, "conv2d") == 3);
  CHECK(count_nodes(b->g, "max_pool2d") == 2);
  CHECK(count_nodes(b->g, "relu") == 4);
}

TEST_CASE("mlp flattens and has two hidden layers", "[model][cpu]") {
  auto b = build(builtin_model("mlp"), true, 5);
  CHECK(b->g.desc(b->y).shape == Shape{5, 10});
  CHECK(count_parameters(b->g) ==
        linear_params(784, 512) + linear_params(512, 256) + linear_params(256, 10));
  CHECK(param_shape(b->g, "linear_1.weight") == Shape{512, 784});
  CHECK(count_nodes(b->g, "linear") == 3);
  CHECK(count_nodes(b->g, "conv2d") == 0);
}

TEST_CASE("the residual net has skip additions, batch norms and a projection shortcut",
          "[model][cpu]") {
  const ModelSpec spec = builtin_model("resnet");
  auto b = build(spec, true, 2);
  const Graph& g = b->g;
  CHECK(g.desc(b->y).shape == Shape{2, 10});
  CHECK(count_nodes(g, "add") == 2);
  CHECK(count_nodes(g, "batch_norm") == 6);
  CHECK(count_nodes(g, "conv2d") == 6);
  CHECK(count_nodes(g, "mean") == 1);
  // Each add reads the two layers it names.
  const GraphNode& add1 = node_named(g, "b1_add");
  REQUIRE(add1.inputs.size() == 2);
  CHECK(g.value(add1.inputs[0]).producer >= 0);
  CHECK(g.nodes().at(static_cast<size_t>(g.value(add1.inputs[0]).producer)).name == "stem_relu");
  CHECK(g.nodes().at(static_cast<size_t>(g.value(add1.inputs[1]).producer)).name == "b1_bn2");
  const GraphNode& proj = node_named(g, "b2_proj");
  CHECK(g.nodes().at(static_cast<size_t>(g.value(proj.inputs[0]).producer)).name == "b1_relu");
  CHECK(proj.attrs.get_ints("stride") == Ints{2, 2});
  CHECK(param_shape(g, "b2_proj.weight") == Shape{32, 16, 1, 1});
  CHECK_FALSE(g.find("b2_proj.bias").valid());  // bias = false
  const GraphNode& add2 = node_named(g, "b2_add");
  CHECK(g.desc(add2.outputs[0]).shape == Shape{2, 32, 14, 14});
  CHECK(g.desc(node_named(g, "pool").outputs[0]).shape == Shape{2, 32});
  // Batch norm: weight and bias trained; running statistics are states, not parameters.
  CHECK(g.value(g.get("b1_bn1.weight")).kind == ValueKind::Parameter);
  CHECK(g.value(g.get("b1_bn1.running_mean")).kind == ValueKind::State);
  CHECK(g.value(g.get("b1_bn1.running_var")).kind == ValueKind::State);
  CHECK(param_shape(g, "b2_bn1.running_var") == Shape{32});
  const int64_t convs = 1 * 16 * 9 + 2 * 16 * 16 * 9 + 16 * 32 * 9 + 32 * 32 * 9 + 16 * 32;
  const int64_t bns = 2 * (3 * 16 + 3 * 32);
  CHECK(count_parameters(g) == convs + bns + linear_params(32, 10));
}

TEST_CASE("batch norm runs on batch statistics in training and on running ones in eval",
          "[model][cpu]") {
  for (bool training : {true, false}) {
    INFO(training);
    auto b = build(builtin_model("resnet"), training, 2);
    int seen = 0;
    for (const auto& node : b->g.nodes()) {
      if (node.op_name() != "batch_norm") continue;
      ++seen;
      CHECK(node.attrs.get_int("training") == (training ? 1 : 0));
      CHECK(node.attrs.get_float("momentum") == Approx(0.1));
      CHECK(node.attrs.get_float("eps") == Approx(1e-5));
      // Running statistics are always wired, so both graphs share the same states.
      REQUIRE(node.inputs.size() == 5);
      CHECK(b->g.value(node.inputs[3]).name == node.name + ".running_mean");
      CHECK(b->g.value(node.inputs[4]).name == node.name + ".running_var");
    }
    CHECK(seen == 6);
  }
}

TEST_CASE("the input shape and the classes can be changed by the caller", "[model][cpu]") {
  ModelSpec spec = builtin_model("simplecnn");
  spec.input_shape = {3, 32, 32};
  spec.classes = 100;
  auto b = build(spec, true, 2);
  // 32 -> 30 -> 15 -> 13 -> 6: 32·6·6 features, and the last layer says out = "classes".
  CHECK(b->g.desc(b->y).shape == Shape{2, 100});
  CHECK(param_shape(b->g, "conv2d_1.weight") == Shape{16, 3, 3, 3});
  CHECK(param_shape(b->g, "linear_1.weight") == Shape{100, 32 * 6 * 6});
  // f64 inputs give f64 parameters.
  auto d = build(builtin_model("mlp"), true, 2, PLX_F64);
  CHECK(d->g.value(d->g.get("linear_2.weight")).desc.dtype == PLX_F64);
}

TEST_CASE("the graph form reads named layers and the model input", "[model][cpu]") {
  const ModelSpec spec = parse(kHead + R"(
classes = 3
[[layers]]
name = "a"
type = "conv2d"
out = 4
kernel = 3
padding = 1
[[layers]]
name = "b"
type = "conv2d"
inputs = ["input"]
out = 4
kernel = [1, 1]
[[layers]]
type = "add"
inputs = ["a", "b"]
[[layers]]
type = "tanh"
[[layers]]
type = "layer_norm"
normalized_ndim = 3
[[layers]]
type = "avg_pool2d"
kernel = [2, 4]
stride = [2, 2]
[[layers]]
type = "gelu"
approximate = "tanh"
[[layers]]
type = "sigmoid"
[[layers]]
type = "flatten"
[[layers]]
name = "head"
type = "linear"
inputs = "flatten_1"
out = 3
bias = false
)");
  REQUIRE(spec.layers.size() == 10);
  CHECK(spec.layers[1].inputs == std::vector<std::string>{"input"});
  CHECK(spec.layers[2].name == "add_1");
  CHECK(spec.layers[9].inputs == std::vector<std::string>{"flatten_1"});
  CHECK(std::get<Ints>(spec.layers[1].attrs.at("kernel")) == Ints{1, 1});
  CHECK(std::get<Ints>(spec.layers[0].attrs.at("kernel")) == Ints{3, 3});  // an int is [k, k]
  CHECK(spec.layers[0].where == "m.toml:5:1");
  auto b = build(spec, true, 2);
  const Graph& g = b->g;
  CHECK(g.desc(b->y).shape == Shape{2, 3});
  const GraphNode& conv_b = node_named(g, "b");
  CHECK(conv_b.inputs[0].id == b->x.id);
  CHECK(node_named(g, "add_1").inputs[1].id == conv_b.outputs[0].id);
  CHECK(param_shape(g, "layer_norm_1.weight") == Shape{4, 8, 8});
  CHECK(node_named(g, "gelu_1").attrs.get_string("approximate") == "tanh");
  CHECK(node_named(g, "avg_pool2d_1").attrs.get_int("count_include_pad") == 1);
  CHECK(g.desc(node_named(g, "avg_pool2d_1").outputs[0]).shape == Shape{2, 4, 4, 3});
  CHECK(param_shape(g, "head.weight") == Shape{3, 48});
  CHECK_FALSE(g.find("head.bias").valid());
  CHECK(count_parameters(g) == (4 * 1 * 9 + 4) + (4 * 1 * 1 + 4) + 2 * (4 * 8 * 8) + 3 * 48);
}

TEST_CASE("a model built in code is validated and normalised like a parsed one", "[model][cpu]") {
  ModelSpec spec;
  spec.name = "code";
  spec.classes = 10;
  spec.layers.push_back({"conv2d", "", {}, {{"out", int64_t{8}}, {"kernel", int64_t{3}}}, ""});
  spec.layers.push_back({"batch_norm", "", {}, {{"momentum", int64_t{0}}}, ""});
  spec.layers.push_back({"relu", "", {}, {}, ""});
  spec.layers.push_back({"global_avg_pool", "", {}, {}, ""});
  spec.layers.push_back({"linear", "fc", {}, {{"out", std::string("classes")}}, ""});
  Graph g(registry());
  const Var x = g.input("x", {PLX_F32, {2, 3, 10, 10}});
  const Var y = build_model(g, spec, x, false);
  CHECK(g.desc(y).shape == Shape{2, 10});
  CHECK(param_shape(g, "conv2d_1.weight") == Shape{8, 3, 3, 3});
  CHECK(node_named(g, "batch_norm_1").attrs.get_float("momentum") == 0.0);
  CHECK(node_named(g, "batch_norm_1").attrs.get_int("training") == 0);
  CHECK(param_shape(g, "fc.weight") == Shape{10, 8});

  ModelSpec copy = spec;
  validate_model(copy);
  CHECK(copy.layers[0].name == "conv2d_1");
  CHECK(std::get<Ints>(copy.layers[0].attrs.at("kernel")) == Ints{3, 3});
  CHECK(std::get<double>(copy.layers[1].attrs.at("momentum")) == 0.0);

  ModelSpec bad = spec;
  bad.layers[0].attrs["kernel"] = std::string("3");
  bad.layers[2].attrs["alpha"] = 0.1;
  bad.layers[4].inputs = {"nope"};
  REQUIRE_THROWS_AS(validate_model(bad), ConfigError);
  REQUIRE_THROWS_WITH(
      validate_model(bad),
      PLX_CONTAINS("layer 1 'conv2d_1' (conv2d): kernel: expected an integer or [h, w]") &&
          PLX_CONTAINS("layer 3 'relu_1' (relu): unknown key 'alpha'") &&
          PLX_CONTAINS("input 'nope' names no layer"));
  Graph g2(registry());
  const Var x2 = g2.input("x", {PLX_F32, {2, 3, 10, 10}});
  REQUIRE_THROWS_WITH(build_model(g2, bad, x2, true), PLX_CONTAINS("unknown key 'alpha'"));
}

TEST_CASE("weights follow the init rule with fan_in and fan_out as PyTorch computes them",
          "[model][cpu]") {
  const ModelSpec spec = parse(R"(
input = [6, 9, 9]
[[layers]]
type = "conv2d"
out = 4
kernel = [3, 5]
groups = 2
[[layers]]
type = "flatten"
[[layers]]
type = "linear"
out = 7
[[layers]]
type = "linear"
out = 5
init = "xavier_uniform"
[[layers]]
type = "layer_norm"
)");
  CHECK(spec.init == "default");
  auto b = build(spec);
  const Graph& g = b->g;
  auto init_of = [&](const std::string& n) { return g.value(g.get(n)).init; };
  // default (PyTorch): weight and bias uniform ±1/sqrt(fan_in); conv fan_in = C/groups·kh·kw.
  const double conv_bound = 1.0 / std::sqrt(6.0 / 2 * 3 * 5);
  for (const char* p : {"conv2d_1.weight", "conv2d_1.bias"}) {
    INFO(p);
    CHECK(init_of(p).kind == InitSpec::Kind::Uniform);
    CHECK(init_of(p).a == Approx(-conv_bound));
    CHECK(init_of(p).b == Approx(conv_bound));
  }
  CHECK(param_shape(g, "conv2d_1.weight") == Shape{4, 3, 3, 5});
  const int64_t feat = 4 * 7 * 5;
  CHECK(init_of("linear_1.weight").b == Approx(1.0 / std::sqrt(double(feat))));
  // A layer's own init: xavier_uniform bound = sqrt(6/(fan_in+fan_out)); its bias starts at 0.
  CHECK(init_of("linear_2.weight").kind == InitSpec::Kind::Uniform);
  CHECK(init_of("linear_2.weight").b == Approx(std::sqrt(6.0 / (7 + 5))));
  CHECK(init_of("linear_2.bias").kind == InitSpec::Kind::Zeros);
  CHECK(init_of("layer_norm_1.weight").kind == InitSpec::Kind::Ones);
  CHECK(init_of("layer_norm_1.bias").kind == InitSpec::Kind::Zeros);

  // The model's rule applies to every conv and linear without their own.
  const std::string body = R"(
[[layers]]
type = "conv2d"
out = 8
kernel = 3
groups = 2
[[layers]]
type = "flatten"
[[layers]]
type = "linear"
out = 3
)";
  struct Case {
    std::string rule;
    InitSpec::Kind kind;
    double conv, lin;  // Normal: stddev; Uniform: upper bound
  };
  const double fin_conv = 6.0 / 2 * 9, fout_conv = 8.0 * 9, fin_lin = 8.0 * 7 * 7, fout_lin = 3;
  const std::vector<Case> cases = {
      {"kaiming_normal", InitSpec::Kind::Normal, std::sqrt(2.0 / fin_conv),
       std::sqrt(2.0 / fin_lin)},
      {"kaiming_uniform", InitSpec::Kind::Uniform, std::sqrt(6.0 / fin_conv),
       std::sqrt(6.0 / fin_lin)},
      {"xavier_normal", InitSpec::Kind::Normal, std::sqrt(2.0 / (fin_conv + fout_conv)),
       std::sqrt(2.0 / (fin_lin + fout_lin))},
      {"xavier_uniform", InitSpec::Kind::Uniform, std::sqrt(6.0 / (fin_conv + fout_conv)),
       std::sqrt(6.0 / (fin_lin + fout_lin))},
  };
  for (const Case& c : cases) {
    INFO(c.rule);
    auto m = build(parse("input = [6, 9, 9]\ninit = \"" + c.rule + "\"\n" + body));
    const Graph& mg = m->g;
    const InitSpec w = mg.value(mg.get("conv2d_1.weight")).init;
    const InitSpec l = mg.value(mg.get("linear_1.weight")).init;
    CHECK(w.kind == c.kind);
    CHECK(l.kind == c.kind);
    if (c.kind == InitSpec::Kind::Normal) {
      CHECK(w.a == 0.0);
      CHECK(w.b == Approx(c.conv));
      CHECK(l.b == Approx(c.lin));
    } else {
      CHECK(w.a == Approx(-c.conv));
      CHECK(w.b == Approx(c.conv));
      CHECK(l.b == Approx(c.lin));
    }
    CHECK(mg.value(mg.get("conv2d_1.bias")).init.kind == InitSpec::Kind::Zeros);
    CHECK(mg.value(mg.get("linear_1.bias")).init.kind == InitSpec::Kind::Zeros);
  }
  // Batch norm: weight ones, bias zeros, running mean zeros, running variance ones.
  auto r = build(builtin_model("resnet"));
  CHECK(r->g.value(r->g.get("stem_bn.weight")).init.kind == InitSpec::Kind::Ones);
  CHECK(r->g.value(r->g.get("stem_bn.bias")).init.kind == InitSpec::Kind::Zeros);
  CHECK(r->g.value(r->g.get("stem_bn.running_mean")).init.kind == InitSpec::Kind::Zeros);
  CHECK(r->g.value(r->g.get("stem_bn.running_var")).init.kind == InitSpec::Kind::Ones);
}

// ---- errors ----

TEST_CASE("malformed TOML and unknown top-level keys name the position", "[model][cpu]") {
  REQUIRE_THROWS_AS(parse("[[layers]\ntype = \"relu\"\n"), ConfigError);
  REQUIRE_THROWS_WITH(parse("[[layers]\ntype = \"relu\"\n"),
                      PLX_CONTAINS("m.toml:1:") && PLX_CONTAINS("TOML syntax error"));
  REQUIRE_THROWS_WITH(parse("name = \"m\"\nkernel = 3\n[[layers]]\ntype = \"relu\"\n"),
                      PLX_CONTAINS("m.toml:2:1: unknown key 'kernel' (known keys: name, "
                                   "description, input, classes, init, layers)"));
  REQUIRE_THROWS_WITH(parse("name = \"m\"\n"), PLX_CONTAINS("m.toml: missing 'layers'"));
  REQUIRE_THROWS_WITH(
      parse("layers = 3\n"),
      PLX_CONTAINS("m.toml:1:10: layers: expected [[layers]] tables, got an integer"));
  REQUIRE_THROWS_WITH(parse("input = [1, 0]\n[[layers]]\ntype = \"relu\"\n"),
                      PLX_CONTAINS("m.toml:1:9: input: expected the shape of one sample"));
  REQUIRE_THROWS_WITH(parse("classes = 0\n[[layers]]\ntype = \"relu\"\n"),
                      PLX_CONTAINS("m.toml:1:11: classes: expected an integer >= 1, got 0"));
  REQUIRE_THROWS_WITH(
      parse("init = \"he\"\n[[layers]]\ntype = \"relu\"\n"),
      PLX_CONTAINS("init: expected one of default, kaiming_uniform, kaiming_normal, "
                   "xavier_uniform, xavier_normal, got \"he\""));
  REQUIRE_THROWS_WITH(parse("name = 4\n[[layers]]\ntype = \"relu\"\n"),
                      PLX_CONTAINS("m.toml:1:8: name: expected a string, got an integer"));
}

TEST_CASE("an unknown layer type lists the known ones", "[model][cpu]") {
  REQUIRE_THROWS_WITH(
      parse(kHead + "[[layers]]\ntype = \"conv\"\nout = 3\n"),
      PLX_CONTAINS("m.toml:4:8: layer 1 'conv_1' (conv): unknown layer type 'conv' "
                   "(known: conv2d, linear, relu, gelu, tanh, sigmoid, max_pool2d, "
                   "avg_pool2d, global_avg_pool, batch_norm, layer_norm, flatten, add, op)"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\nout = 3\n"),
                      PLX_CONTAINS("m.toml:3:1: layer 1 'layer_1': missing key 'type'"));
}

TEST_CASE("dropout is rejected with the reason", "[model][cpu]") {
  REQUIRE_THROWS_WITH(
      parse(kHead + "[[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"dropout\"\n"),
      PLX_CONTAINS("m.toml:5:1: layer 2 'dropout_1' (dropout): dropout is not "
                   "supported in static graphs yet") &&
          PLX_CONTAINS("seed and offset are op attributes"));
}

TEST_CASE("unknown and missing layer keys are errors listing what the layer takes",
          "[model][cpu]") {
  REQUIRE_THROWS_WITH(
      parse(kHead + "[[layers]]\ntype = \"conv2d\"\nout = 4\nkernel = 3\nstrides = 2\n"),
      PLX_CONTAINS("m.toml:7:1: layer 1 'conv2d_1' (conv2d): unknown key 'strides' "
                   "(conv2d takes: out, kernel, stride, padding, dilation, groups, "
                   "bias, init; every layer: type, name, inputs)"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\ntype = \"relu\"\nout = 4\n"),
                      PLX_CONTAINS("unknown key 'out' (relu takes: no attributes;"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\ntype = \"conv2d\"\nout = 4\n"),
                      PLX_CONTAINS("m.toml:3:1: layer 1 'conv2d_1' (conv2d): missing required key "
                                   "'kernel' (window size, an integer or [h, w])"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\ntype = \"max_pool2d\"\n"),
                      PLX_CONTAINS("missing required key 'kernel'"));
  REQUIRE_THROWS_WITH(
      parse(kHead + "[[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"linear\"\n"),
      PLX_CONTAINS("m.toml:5:1: layer 2 'linear_1' (linear): missing required key 'out'"));
}

TEST_CASE("wrong types and bad values name the key and its position", "[model][cpu]") {
  const std::string conv = kHead + "[[layers]]\ntype = \"conv2d\"\nout = 4\n";
  REQUIRE_THROWS_WITH(parse(conv + "kernel = \"3\"\n"),
                      PLX_CONTAINS("m.toml:6:10: layer 1 'conv2d_1' (conv2d): kernel: expected an "
                                   "integer or [h, w], got a string"));
  // A type error is not also reported as a missing key.
  try {
    parse(conv + "kernel = \"3\"\n");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("missing") == std::string::npos);
  }
  REQUIRE_THROWS_WITH(parse(conv + "kernel = -1\n"),
                      PLX_CONTAINS("m.toml:6:10: layer 1 'conv2d_1' (conv2d): kernel: expected "
                                   "integers >= 1, got [-1, -1]"));
  REQUIRE_THROWS_WITH(
      parse(conv + "kernel = [3]\n"),
      PLX_CONTAINS("kernel: expected an integer or [h, w] (two integers), got ints [3]"));
  REQUIRE_THROWS_WITH(
      parse(conv + "kernel = [3, 2.5]\n"),
      PLX_CONTAINS("kernel: expected an integer or [h, w], got an array holding a float"));
  REQUIRE_THROWS_WITH(parse(conv + "kernel = 3\npadding = -1\n"),
                      PLX_CONTAINS("m.toml:7:11: layer 1 'conv2d_1' (conv2d): padding: expected "
                                   "integers >= 0, got [-1, -1]"));
  REQUIRE_THROWS_WITH(parse(conv + "kernel = 3\nbias = 1\n"),
                      PLX_CONTAINS("bias: expected a boolean, got an integer"));
  REQUIRE_THROWS_WITH(parse(conv + "kernel = 3\ngroups = true\n"),
                      PLX_CONTAINS("groups: expected an integer, got a boolean"));
  REQUIRE_THROWS_WITH(parse(conv + "kernel = 3\ngroups = 0\n"),
                      PLX_CONTAINS("groups: expected an integer >= 1, got 0"));
  REQUIRE_THROWS_WITH(parse(conv + "kernel = 3\ninit = \"he\"\n"),
                      PLX_CONTAINS("init: expected one of default, kaiming_uniform"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\ntype = \"batch_norm\"\nmomentum = 2\n"),
                      PLX_CONTAINS("momentum: expected a number in 0..1, got 2"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\ntype = \"batch_norm\"\neps = \"small\"\n"),
                      PLX_CONTAINS("eps: expected a number, got a string"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\ntype = \"gelu\"\napproximate = \"erf\"\n"),
                      PLX_CONTAINS("approximate: expected one of none, tanh, got \"erf\""));
  REQUIRE_THROWS_WITH(
      parse(kHead +
            "[[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"linear\"\nout = \"all\"\n"),
      PLX_CONTAINS("out: expected an integer or \"classes\", got \"all\""));
  REQUIRE_THROWS_WITH(
      parse(kHead +
            "[[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"linear\"\nout = \"classes\"\n"),
      PLX_CONTAINS("m.toml:7:7: layer 2 'linear_1' (linear): out: \"classes\" needs "
                   "the model's classes"));
  REQUIRE_THROWS_WITH(
      parse(kHead + "[[layers]]\ntype = 3\n"),
      PLX_CONTAINS("m.toml:4:8: layer 1 'layer_1': type: expected a string, got an integer"));
  REQUIRE_THROWS_WITH(
      parse(kHead + "[[layers]]\ntype = \"relu\"\ninputs = [1]\n"),
      PLX_CONTAINS("inputs: expected layer names, a string or an array of strings"));
}

TEST_CASE("layer names must be unique and inputs must name earlier layers", "[model][cpu]") {
  REQUIRE_THROWS_WITH(
      parse(
          kHead +
          "[[layers]]\nname = \"a\"\ntype = \"relu\"\n[[layers]]\nname = \"a\"\ntype = \"tanh\"\n"),
      PLX_CONTAINS("m.toml:7:8: layer 2 'a' (tanh): duplicate layer name 'a' (also "
                   "layer 1 at m.toml:3:1"));
  // A written name may collide with a default one.
  REQUIRE_THROWS_WITH(
      parse(kHead +
            "[[layers]]\ntype = \"relu\"\n[[layers]]\nname = \"relu_1\"\ntype = \"tanh\"\n"),
      PLX_CONTAINS("duplicate layer name 'relu_1'") &&
          PLX_CONTAINS("unnamed layers are called <type>_<n>"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\nname = \"a.b\"\ntype = \"relu\"\n"),
                      PLX_CONTAINS("m.toml:4:8: layer 1 'a.b' (relu): bad name \"a.b\""));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\nname = \"input\"\ntype = \"relu\"\n"),
                      PLX_CONTAINS("bad name \"input\""));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\nname = \"\"\ntype = \"relu\"\n"),
                      PLX_CONTAINS("m.toml:4:8: layer 1 'relu_1' (relu): name: must not be empty"));
  REQUIRE_THROWS_WITH(
      parse(kHead +
            "[[layers]]\ntype = \"relu\"\n[[layers]]\ntype = \"tanh\"\ninputs = [\"relu1\"]\n"),
      PLX_CONTAINS("m.toml:7:10: layer 2 'tanh_1' (tanh): input 'relu1' names no layer"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\ntype = \"tanh\"\ninputs = "
                                    "[\"later\"]\n[[layers]]\nname = \"later\"\ntype = \"relu\"\n"),
                      PLX_CONTAINS("input 'later' is not an earlier layer"));
  REQUIRE_THROWS_WITH(
      parse(kHead +
            "[[layers]]\ntype = \"relu\"\n[[layers]]\ntype = \"add\"\ninputs = [\"relu_1\"]\n"),
      PLX_CONTAINS("layer 2 'add_1' (add): takes 2 inputs, named in inputs = [...], got 1"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\ntype = \"relu\"\n[[layers]]\ntype = \"add\"\n"),
                      PLX_CONTAINS("takes 2 inputs"));
  REQUIRE_THROWS_WITH(parse(kHead + "[[layers]]\ntype = \"relu\"\n[[layers]]\ntype = "
                                    "\"tanh\"\ninputs = [\"input\", \"relu_1\"]\n"),
                      PLX_CONTAINS("takes 1 input, got 2"));
  // A branch nobody reads would run and its parameters would get no gradient.
  REQUIRE_THROWS_WITH(
      parse(kHead + "[[layers]]\nname = \"dead\"\ntype = \"relu\"\n[[layers]]\ntype = "
                    "\"tanh\"\ninputs = [\"input\"]\n"),
      PLX_CONTAINS("m.toml:3:1: layer 1 'dead' (relu): its output is not read by any "
                   "later layer"));
}

TEST_CASE("every problem of a file is reported at once", "[model][cpu]") {
  try {
    parse(kHead +
          "[[layers]]\ntype = \"conv2d\"\nkernel = 0\n[[layers]]\ntype = \"pool\"\n"
          "[[layers]]\ntype = \"relu\"\nalpha = 1\n");
    FAIL("no error");
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    CHECK_THAT(m, PLX_CONTAINS(
                      "m.toml:5:10: layer 1 'conv2d_1' (conv2d): kernel: expected integers >= 1"));
    CHECK_THAT(m,
               PLX_CONTAINS("m.toml:3:1: layer 1 'conv2d_1' (conv2d): missing required key 'out'"));
    CHECK_THAT(m, PLX_CONTAINS("m.toml:7:8: layer 2 'pool_1' (pool): unknown layer type 'pool'"));
    CHECK_THAT(m, PLX_CONTAINS("m.toml:10:1: layer 3 'relu_1' (relu): unknown key 'alpha'"));
  }
}

TEST_CASE("shapes that do not fit name the layer and where it is written", "[model][cpu]") {
  // Each attempt on a fresh graph: a failed build may leave parameters behind.
  auto try_build = [](const ModelSpec& spec, const TensorDesc& in) {
    Graph g(registry());
    build_model(g, spec, g.input("x", in), true);
  };
  const TensorDesc image{PLX_F32, {2, 1, 8, 8}}, flat{PLX_F32, {2, 64}};
  // The graph's own check (kernel larger than the input), with the layer's position.
  const ModelSpec big = parse(kHead + "[[layers]]\ntype = \"conv2d\"\nout = 4\nkernel = 9\n");
  REQUIRE_THROWS_AS(try_build(big, image), ConfigError);
  REQUIRE_THROWS_WITH(try_build(big, image),
                      PLX_CONTAINS("m.toml:3:1: layer 'conv2d_1' (conv2d): ") &&
                          PLX_CONTAINS("larger than the padded input"));
  const ModelSpec no_flatten =
      parse(kHead +
            "classes = 10\n[[layers]]\ntype = \"relu\"\n[[layers]]\ntype = \"linear\"\nout = 10\n");
  REQUIRE_THROWS_WITH(try_build(no_flatten, image),
                      PLX_CONTAINS("m.toml:6:1: layer 'linear_1' (linear): the model's output is "
                                   "f32(2, 1, 8, 10), expected (2, classes = 10); add a flatten"));
  const ModelSpec wrong_classes = parse(
      kHead +
      "classes = 10\n[[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"linear\"\nout = 9\n");
  REQUIRE_THROWS_WITH(try_build(wrong_classes, image),
                      PLX_CONTAINS("the model's output is f32(2, 9), expected (2, classes = 10)"));
  const ModelSpec add = parse(kHead + R"([[layers]]
name = "c"
type = "conv2d"
out = 2
kernel = 3
[[layers]]
name = "sum"
type = "add"
inputs = ["input", "c"]
)");
  REQUIRE_THROWS_WITH(try_build(add, image),
                      PLX_CONTAINS("m.toml:8:1: layer 'sum' (add): inputs 'input' f32(2, 1, 8, 8) "
                                   "and 'c' f32(2, 2, 6, 6) differ in shape"));
  const ModelSpec conv = parse(kHead + "[[layers]]\ntype = \"conv2d\"\nout = 4\nkernel = 3\n");
  REQUIRE_THROWS_WITH(
      try_build(conv, flat),
      PLX_CONTAINS("layer 'conv2d_1' (conv2d): expects (N, C, H, W), got f32(2, 64)"));
  const ModelSpec grouped =
      parse(kHead + "[[layers]]\ntype = \"conv2d\"\nout = 4\nkernel = 3\ngroups = 2\n");
  REQUIRE_THROWS_WITH(try_build(grouped, image),
                      PLX_CONTAINS("groups = 2 does not divide the input channels 1"));
  const ModelSpec ln = parse(kHead + "[[layers]]\ntype = \"layer_norm\"\nnormalized_ndim = 2\n");
  REQUIRE_THROWS_WITH(
      try_build(ln, flat),
      PLX_CONTAINS("normalized_ndim = 2 reaches the batch dimension of f32(2, 64)"));
  const ModelSpec pool = parse(kHead + "[[layers]]\ntype = \"max_pool2d\"\nkernel = 2\n");
  REQUIRE_THROWS_WITH(try_build(pool, flat),
                      PLX_CONTAINS("layer 'max_pool2d_1' (max_pool2d): expects (N, C, H, W)"));
  const ModelSpec gap = parse(kHead + "[[layers]]\ntype = \"global_avg_pool\"\n");
  REQUIRE_THROWS_WITH(try_build(gap, flat), PLX_CONTAINS("at least one dimension after C"));
  REQUIRE_THROWS_WITH(try_build(conv, TensorDesc{PLX_I32, {2, 1, 8, 8}}),
                      PLX_CONTAINS("m.toml: model 'm': the input must be a float tensor"));
}

TEST_CASE("model files are read from disk and found by name or path", "[model][cpu]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("plexus-model-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "tiny.toml").string();
  {
    std::ofstream f(path);
    f << "input = [4]\nclasses = 2\n[[layers]]\ntype = \"linear\"\nout = \"classes\"\n";
  }
  const ModelSpec spec = load_model(path);
  CHECK(spec.name == "tiny");  // no name: the file's stem
  CHECK(spec.source == path);
  CHECK(spec.layers.at(0).where == path + ":3:1");
  CHECK(find_model(path).classes == 2);
  auto b = build(spec, true, 3);
  CHECK(b->g.desc(b->y).shape == Shape{3, 2});
  REQUIRE_THROWS_WITH(load_model((dir / "none.toml").string()),
                      PLX_CONTAINS("none.toml: cannot open the model file"));
  REQUIRE_THROWS_WITH(find_model("resnet50"),
                      PLX_CONTAINS("model 'resnet50' is neither a built-in model (convnet, mlp, "
                                   "resnet, simplecnn) nor a model file"));
  fs::remove_all(dir);
}

TEST_CASE("docs/models.md documents every layer type, key and built-in model", "[model][cpu]") {
  std::ifstream f(source_dir() + "/docs/models.md");
  REQUIRE(f);
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const LayerType& t : layer_types()) {
    INFO(t.type);
    CHECK(doc.find("`" + t.type + "`") != std::string::npos);
    for (const LayerAttrRule& r : t.attrs) {
      INFO(r.key);
      // Each key appears in its type's row of the table, with its default.
      const size_t row = doc.find("| `" + t.type + "` |");
      REQUIRE(row != std::string::npos);
      const std::string line = doc.substr(row, doc.find('\n', row) - row);
      CHECK(line.find("`" + r.key + "`") != std::string::npos);
      if (!r.required) CHECK(line.find(r.default_text) != std::string::npos);
    }
  }
  for (const auto& rule : init_rules()) CHECK(doc.find("`" + rule + "`") != std::string::npos);
  for (const auto& m : builtin_models()) CHECK(doc.find("`" + m + "`") != std::string::npos);
}

// ---- running the built models ----

TEST_CASE("simplecnn runs on the CPU backend and matches eager ops with the same parameters",
          "[model][cpu]") {
  const int64_t n = 3;
  Graph g(runtime().ops());
  const Var x = g.input("x", {PLX_F32, {n, 1, 28, 28}});
  const Var y = build_model(g, builtin_model("simplecnn"), x, false);
  g.mark_output(y, "logits");
  TensorStore store;
  ExecutableOptions opt;
  opt.seed = 21;
  Executable exe(cpu(), g, store, opt);
  fill_f32(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 28 * 28), 5, 0.0, 1.0));
  exe.run();
  exe.sync();
  const std::vector<double> got = exe.tensor("logits").to_doubles();
  REQUIRE(got.size() == static_cast<size_t>(n * 10));

  // The parameters were drawn by the default rule: within ±1/sqrt(fan_in), and not all equal.
  const std::vector<double> w1 = store.get("conv2d_1.weight").to_doubles();
  const double bound = 1.0 / 3.0;  // fan_in = 1·3·3
  CHECK(*std::max_element(w1.begin(), w1.end()) <= bound);
  CHECK(*std::min_element(w1.begin(), w1.end()) >= -bound);
  CHECK(*std::max_element(w1.begin(), w1.end()) > *std::min_element(w1.begin(), w1.end()));

  // The same network written op by op, eagerly.
  Backend& be = cpu();
  auto p = [&](const char* name) { return store.get(name); };
  const Attrs pool{{"kernel", Ints{2, 2}}};
  Tensor h = call(be, "conv2d", {exe.tensor("x"), p("conv2d_1.weight"), p("conv2d_1.bias")})[0];
  h = call(be, "relu", {h})[0];
  h = call(be, "max_pool2d", {h}, pool)[0];
  h = call(be, "conv2d", {h, p("conv2d_2.weight"), p("conv2d_2.bias")})[0];
  h = call(be, "relu", {h})[0];
  h = call(be, "max_pool2d", {h}, pool)[0];
  CHECK(h.shape() == Shape{n, 32, 5, 5});
  h = h.contiguous().reshape({n, 800});
  h = call(be, "linear", {h, p("linear_1.weight"), p("linear_1.bias")})[0];
  const std::vector<double> want = h.to_doubles();
  CHECK_ALLCLOSE(got, want, (Tol{1e-5, 1e-5}));
  // Not a vacuous match: the logits differ between samples.
  CHECK(got[0] != got[10]);
}

TEST_CASE("the residual net runs: skips add their inputs and batch norm updates its statistics",
          "[model][cpu]") {
  const int64_t n = 2;
  Graph g(runtime().ops());
  const Var x = g.input("x", {PLX_F32, {n, 1, 28, 28}});
  const Var y = build_model(g, builtin_model("resnet"), x, true);
  g.mark_output(y, "logits");
  for (const char* name : {"stem_relu", "b1_bn2", "b1_add", "b2_bn2", "b2_proj_bn", "b2_add"})
    g.mark_output(output_of(g, name), std::string("out.") + name);
  TensorStore store;
  ExecutableOptions opt;
  opt.seed = 4;
  Executable exe(cpu(), g, store, opt);
  fill_f32(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 28 * 28), 9));
  exe.run();
  exe.sync();
  auto out = [&](const std::string& name) { return exe.tensor("out." + name).to_doubles(); };
  auto sum = [](std::vector<double> a, const std::vector<double>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  CHECK_ALLCLOSE(out("b1_add"), sum(out("stem_relu"), out("b1_bn2")), (Tol{1e-6, 1e-6}));
  CHECK_ALLCLOSE(out("b2_add"), sum(out("b2_bn2"), out("b2_proj_bn")), (Tol{1e-6, 1e-6}));
  const std::vector<double> logits = exe.tensor("logits").to_doubles();
  REQUIRE(logits.size() == static_cast<size_t>(n * 10));
  for (double v : logits) CHECK(std::isfinite(v));
  // Training-mode batch norm moved its running mean away from zero and its variance from one.
  const std::vector<double> rm = store.get("stem_bn.running_mean").to_doubles();
  const std::vector<double> rv = store.get("stem_bn.running_var").to_doubles();
  CHECK(std::any_of(rm.begin(), rm.end(), [](double v) { return v != 0.0; }));
  CHECK(std::any_of(rv.begin(), rv.end(), [](double v) { return v != 1.0; }));

  // An evaluation graph over the same store uses those statistics and leaves them alone.
  Graph ge(runtime().ops());
  const Var xe = ge.input("x", {PLX_F32, {n, 1, 28, 28}});
  ge.mark_output(build_model(ge, builtin_model("resnet"), xe, false), "logits");
  Executable eval(cpu(), ge, store, opt);
  fill_f32(eval.tensor("x"), random_doubles(static_cast<size_t>(n * 28 * 28), 9));
  eval.run();
  eval.sync();
  CHECK(store.get("stem_bn.running_mean").to_doubles() == rm);
  for (double v : eval.tensor("logits").to_doubles()) CHECK(std::isfinite(v));
}

TEST_CASE("a model from TOML trains: every parameter gets a gradient and the loss falls",
          "[model][cpu]") {
  const ModelSpec spec = parse(R"(
input = [2, 6, 6]
classes = 4
init = "kaiming_uniform"
[[layers]]
name = "stem"
type = "conv2d"
out = 6
kernel = 3
padding = 1
[[layers]]
name = "bn"
type = "batch_norm"
[[layers]]
name = "act"
type = "relu"
[[layers]]
type = "conv2d"
out = 6
kernel = 3
padding = 1
[[layers]]
type = "tanh"
[[layers]]
type = "add"
inputs = ["act", "tanh_1"]
[[layers]]
type = "max_pool2d"
kernel = 2
[[layers]]
type = "flatten"
[[layers]]
type = "linear"
out = "classes"
)");
  const int64_t n = 8;
  Graph g(runtime().ops());
  const Var x = g.input("x", {PLX_F32, {n, 2, 6, 6}});
  const Var labels = g.input("labels", {PLX_I32, {n}});
  const Var logits = build_model(g, spec, x, true);
  const std::vector<Var> params = g.parameters();
  CHECK(params.size() == 8);  // weight and bias of two convs, the batch norm and the linear
  const std::vector<Var> grads = add_sgd_step(g, logits, labels);
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(g.value(params[i]).name);
    CHECK(grads[i].valid());
  }
  TensorStore store;
  ExecutableOptions opt;
  opt.seed = 12;
  Executable exe(cpu(), g, store, opt);
  fill_f32(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 72), 3));
  exe.tensor("labels").copy_from_host(std::vector<int32_t>{0, 1, 2, 3, 3, 2, 1, 0}.data());
  fill_f32(exe.tensor("lr"), {0.05});
  const std::vector<double> losses = train_losses(exe, 40);
  INFO("first loss " << losses.front() << ", last " << losses.back());
  CHECK(std::isfinite(losses.back()));
  // Eight fixed samples are memorised: the loss falls well below its start.
  CHECK(losses.back() < 0.25 * losses.front());
}

// ---- the op layer: any registered op ----

namespace {

struct Trained {
  std::map<std::string, std::vector<double>> params;
  std::vector<double> losses;
};

// Trains `spec` (input (8), 3 classes) for a few SGD steps on fixed data; every parameter after.
Trained train_steps(const ModelSpec& spec) {
  const int64_t n = 6;
  Graph g(runtime().ops());
  const Var x = g.input("x", {PLX_F32, {n, 8}});
  const Var logits = build_model(g, spec, x, true);
  add_sgd_step(g, logits, g.input("labels", {PLX_I32, {n}}));
  TensorStore store;
  ExecutableOptions opt;
  opt.seed = 5;
  Executable exe(cpu(), g, store, opt);
  fill_f32(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 8), 13));
  exe.tensor("labels").copy_from_host(std::vector<int32_t>{0, 1, 2, 2, 1, 0}.data());
  fill_f32(exe.tensor("lr"), {0.1});
  Trained t;
  for (int step = 0; step < 8; ++step) {
    exe.run();
    exe.sync();
    t.losses.push_back(exe.tensor("loss_out").to_doubles().at(0));
  }
  for (Var p : g.parameters()) t.params[g.value(p).name] = store.get(g.value(p).name).to_doubles();
  return t;
}

}  // namespace

TEST_CASE("an op layer calling relu trains to exactly the parameters of a relu layer",
          "[model][cpu]") {
  const std::string head =
      "input = [8]\nclasses = 3\n[[layers]]\nname = \"fc1\"\ntype = \"linear\"\nout = 6\n";
  const std::string tail = "[[layers]]\nname = \"fc2\"\ntype = \"linear\"\nout = \"classes\"\n";
  const Trained layer =
      train_steps(parse(head + "[[layers]]\nname = \"act\"\ntype = \"relu\"\n" + tail));
  const Trained op = train_steps(
      parse(head + "[[layers]]\nname = \"act\"\ntype = \"op\"\nop = \"relu\"\n" + tail));
  REQUIRE(layer.params.size() == 4);
  CHECK(op.losses == layer.losses);
  CHECK(op.params == layer.params);  // bit for bit
  CHECK(layer.losses.back() < layer.losses.front());
}

TEST_CASE("an op layer passes attributes and parameters to its op and picks an output",
          "[model][cpu]") {
  const ModelSpec spec = parse(R"(
input = [4, 6, 6]
[[layers]]
name = "g"
type = "op"
op = "gelu"
attrs = { approximate = "tanh" }
[[layers]]
name = "both"
type = "op"
op = "add"
inputs = ["input", "g"]
[[layers]]
name = "scaled"
type = "op"
op = "mul"
params = [{ name = "scale", shape = [6], init = 0.5 }]
[[layers]]
name = "conv"
type = "op"
op = "conv2d"
attrs = { padding = [1, 1] }
params = [{ name = "weight", shape = [3, 4, 3, 3], init = "kaiming_uniform" },
          { name = "bias", shape = [3] }]
[[layers]]
name = "pool"
type = "op"
op = "max_pool2d"
attrs = { kernel = [2, 2], stride = [2, 2] }
output = 1
)");
  CHECK(spec.layers.at(0).op_attrs.get_string("approximate") == "tanh");
  CHECK(spec.layers.at(0).key_where.at("attrs.approximate") == "m.toml:7:11");
  CHECK(spec.layers.at(3).params.size() == 2);
  auto b = build(spec, true, 2);
  CHECK(node_named(b->g, "g").attrs.get_string("approximate") == "tanh");
  const GraphNode& both = node_named(b->g, "both");
  CHECK(both.inputs.at(0).id == b->x.id);
  CHECK(both.inputs.at(1).id == output_of(b->g, "g").id);
  // Parameters are "<layer>.<name>", passed after the inputs, with their init.
  const GraphNode& scaled = node_named(b->g, "scaled");
  REQUIRE(scaled.inputs.size() == 2);
  CHECK(scaled.inputs[1].id == b->g.get("scaled.scale").id);
  const InitSpec half = b->g.value(b->g.get("scaled.scale")).init;
  CHECK(half.kind == InitSpec::Kind::Constant);
  CHECK(half.a == 0.5);
  CHECK(param_shape(b->g, "conv.weight") == Shape{3, 4, 3, 3});
  const InitSpec w = b->g.value(b->g.get("conv.weight")).init;
  const InitSpec want = init::kaiming_uniform(4 * 3 * 3);  // fan_in = C·kh·kw, as PyTorch
  CHECK(w.kind == want.kind);
  CHECK(w.a == want.a);
  CHECK(w.b == want.b);
  CHECK(b->g.value(b->g.get("conv.bias")).init.kind == InitSpec::Kind::Zeros);  // the default
  CHECK(node_named(b->g, "conv").attrs.get_ints("padding") == Ints{1, 1});
  // output = 1: max_pool2d's indices.
  CHECK(b->y.id == node_named(b->g, "pool").outputs.at(1).id);
  CHECK(b->summary.at(2).parameters == 6);
  CHECK(b->summary.at(3).parameters == 3 * 4 * 3 * 3 + 3);
  CHECK(b->summary.at(4).output == Shape{2, 3, 3, 3});

  // The same in code: op_attrs and params are LayerSpec fields.
  ModelSpec code;
  code.input_shape = {4, 6, 6};
  LayerSpec l{"op", "s", {}, {{"op", std::string("mul")}}, ""};
  l.params.push_back({"scale", {6}, int64_t{2}});  // an integer init is a number
  code.layers.push_back(l);
  validate_model(code);
  CHECK(std::get<double>(code.layers[0].params[0].init) == 2.0);
  const auto built = build(code, true, 2);
  CHECK(built->g.value(built->g.get("s.scale")).init.a == 2.0);
  ModelSpec misplaced;
  misplaced.layers.push_back(LayerSpec{"relu", "r", {}, {}, ""});
  misplaced.layers[0].params.push_back({"p", {1}});
  REQUIRE_THROWS_WITH(validate_model(misplaced),
                      PLX_CONTAINS("layer 1 'r' (relu): op_attrs and params are for layers of "
                                   "type \"op\""));
}

TEST_CASE("op layer errors found when parsing name the key and its position", "[model][cpu]") {
  const std::string op = kHead + "[[layers]]\ntype = \"op\"\n";
  REQUIRE_THROWS_WITH(parse(op),
                      PLX_CONTAINS("m.toml:3:1: layer 1 'op_1' (op): missing required key 'op'"));
  REQUIRE_THROWS_WITH(parse(op + "op = 3\n"),
                      PLX_CONTAINS("m.toml:5:6: layer 1 'op_1' (op): op: expected a string, got "
                                   "an integer"));
  REQUIRE_THROWS_WITH(parse(op + "op = \"\"\n"),
                      PLX_CONTAINS("m.toml:5:6: layer 1 'op_1' (op): op: must name an op"));
  REQUIRE_THROWS_WITH(parse(op + "op = \"relu\"\nattrs = 3\n"),
                      PLX_CONTAINS("m.toml:6:9: layer 1 'op_1' (op): attrs: expected an inline "
                                   "table of the op's attributes, got an integer"));
  REQUIRE_THROWS_WITH(parse(op + "op = \"relu\"\nattrs = { a = 1, b = { c = 2 } }\n"),
                      PLX_CONTAINS("m.toml:6:22: layer 1 'op_1' (op): attrs.b: expected an "
                                   "integer, a number, a boolean, a string or an array of "
                                   "numbers, got a table"));
  REQUIRE_THROWS_WITH(parse(op + "op = \"relu\"\noutput = -1\n"),
                      PLX_CONTAINS("m.toml:6:10: layer 1 'op_1' (op): output: expected an "
                                   "integer >= 0, got -1"));
  const std::string mul = op + "op = \"mul\"\n";
  REQUIRE_THROWS_WITH(parse(mul + "params = 3\n"),
                      PLX_CONTAINS("m.toml:6:10: layer 1 'op_1' (op): params: expected an array "
                                   "of inline tables { name, shape, init }, got an integer"));
  REQUIRE_THROWS_WITH(parse(mul + "params = [3]\n"),
                      PLX_CONTAINS("m.toml:6:11: layer 1 'op_1' (op): params[0]: expected an "
                                   "inline table { name, shape, init }, got an integer"));
  REQUIRE_THROWS_WITH(parse(mul + "params = [{ shape = [1] }]\n"),
                      PLX_CONTAINS("m.toml:6:11: layer 1 'op_1' (op): params[0]: missing key "
                                   "'name'"));
  REQUIRE_THROWS_WITH(parse(mul + "params = [{ name = \"b\", shape = [1], colour = 1 }]\n"),
                      PLX_CONTAINS("m.toml:6:38: layer 1 'op_1' (op): params[0]: unknown key "
                                   "'colour' (a parameter has: name, shape, init)"));
  REQUIRE_THROWS_WITH(parse(mul + "params = [{ name = \"b\", shape = 2 }]\n"),
                      PLX_CONTAINS("m.toml:6:33: layer 1 'op_1' (op): params[0]: shape: expected "
                                   "an array of integers such as [1] or [64, 32], got an integer"));
  // The checks a spec made in code shares, at the position of the key they are about.
  REQUIRE_THROWS_WITH(parse(mul + "params = [{ name = \"b\", shape = [0] }]\n"),
                      PLX_CONTAINS("m.toml:6:33: layer 1 'op_1' (op): params[0] 'b': shape: "
                                   "expected a non-empty array of integers >= 1, got (0)"));
  REQUIRE_THROWS_WITH(parse(mul + "params = [{ name = \"b c\", shape = [1] }]\n"),
                      PLX_CONTAINS("m.toml:6:20: layer 1 'op_1' (op): params[0] 'b c': name: "
                                   "expected letters, digits, '_' and '-', got \"b c\""));
  REQUIRE_THROWS_WITH(parse(mul + "params = [{ name = \"b\", shape = [1] }, { name = \"b\", "
                                  "shape = [1] }]\n"),
                      PLX_CONTAINS("params[1] 'b': name: another parameter of the layer has it"));
  REQUIRE_THROWS_WITH(parse(mul + "params = [{ name = \"b\", shape = [1], init = \"he\" }]\n"),
                      PLX_CONTAINS("m.toml:6:45: layer 1 'op_1' (op): params[0] 'b': init: "
                                   "expected a number or one of zeros, ones, default, "
                                   "kaiming_uniform, kaiming_normal, xavier_uniform, "
                                   "xavier_normal, got \"he\""));
  REQUIRE_THROWS_WITH(
      parse(mul + "params = [{ name = \"b\", shape = [4], init = \"xavier_normal\" }]\n"),
      PLX_CONTAINS("params[0] 'b': init: \"xavier_normal\" needs a shape of 2 or "
                   "more dimensions (fan_in from shape[1], fan_out from shape[0]), "
                   "got (4); use zeros, ones or a number"));
}

TEST_CASE("op layer errors found when building name the layer and where its key is written",
          "[model][cpu]") {
  auto try_build = [](const std::string& layer) {
    Graph g(registry());
    build_model(g, parse(kHead + "[[layers]]\ntype = \"op\"\n" + layer),
                g.input("x", {PLX_F32, {2, 1, 8, 8}}), true);
  };
  REQUIRE_THROWS_AS(try_build("op = \"rleu\"\n"), ConfigError);
  REQUIRE_THROWS_WITH(try_build("op = \"rleu\"\n"),
                      PLX_CONTAINS("m.toml:5:6: layer 'op_1' (op): op: unknown op 'rleu' "
                                   "(docs/ops.md lists the built-in ops, plexus info every "
                                   "loaded one)"));
  REQUIRE_THROWS_WITH(
      try_build("op = \"relx\"\n"),
      PLX_CONTAINS("op: unknown op 'relx' (ops named like it: relu, relu_backward)"));
  REQUIRE_THROWS_WITH(try_build("op = \"example.swish\"\n"),
                      PLX_CONTAINS("m.toml:5:6: layer 'op_1' (op): op: unknown op "
                                   "'example.swish'; no loaded plugin has ops named 'example.*' "
                                   "(is the plugin in plugins.paths or PLEXUS_PLUGIN_PATH?"));
  REQUIRE_THROWS_WITH(try_build("op = \"gelu\"\nattrs = { approx = \"tanh\" }\n"),
                      PLX_CONTAINS("m.toml:6:11: layer 'op_1' (op): attrs.approx: op 'gelu' has "
                                   "no attribute 'approx' (attributes: approximate)"));
  REQUIRE_THROWS_WITH(try_build("op = \"gelu\"\nattrs = { approximate = 1 }\n"),
                      PLX_CONTAINS("m.toml:6:11: layer 'op_1' (op): attrs.approximate: op "
                                   "'gelu': attribute 'approximate' is int 1, expected string"));
  REQUIRE_THROWS_WITH(try_build("op = \"relu\"\nparams = [{ name = \"b\", shape = [1] }]\n"),
                      PLX_CONTAINS("m.toml:3:1: layer 'op_1' (op): op 'relu' takes 1 inputs (x); "
                                   "the layer gives 1 input(s) and 1 parameter(s), in that order"));
  REQUIRE_THROWS_WITH(try_build("op = \"relu\"\noutput = 1\n"),
                      PLX_CONTAINS("m.toml:6:10: layer 'op_1' (op): output: op 'relu' has 1 "
                                   "output(s), so 0 to 0, got 1"));
  // The op's own checks (shapes), with the layer's position.
  REQUIRE_THROWS_WITH(try_build("op = \"mul\"\nparams = [{ name = \"b\", shape = [3] }]\n"),
                      PLX_CONTAINS("m.toml:3:1: layer 'op_1' (op): ") && PLX_CONTAINS("mul"));
}
