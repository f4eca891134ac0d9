// Kernel extensions (ABI 1.2): kernels one plugin gives another plugin's backend. The runtime
// appends them after the backend's own kernels; create() gets the giving plugin's ctx and its
// errors come from that plugin's last_error(); what cannot be attached is reported, not fatal.
// Then the SDK's custom-op example (sdk/examples/custom_op, built as a fixture): example.swish
// dispatched to its extension kernel on the cpu, checked against sigmoid and mul and against
// finite differences, and trained from its TOML model through an `op` layer.
#include <dlfcn.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "plexus/error.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/info.hpp"
#include "plexus/model.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

RuntimeOptions with(const std::string& fixture_subdir) {
  RuntimeOptions o;
  o.plugins.paths = {fixture_dir() + "/" + fixture_subdir, plugin_dir() + "/libplexus-cpu.so"};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  return o;
}

const LoadedPlugin& plugin_named(const Runtime& rt, const std::string& name) {
  for (const auto& p : rt.plugins())
    if (p->name() == name) return *p;
  FAIL("plugin " << name << " is not loaded");
  throw std::logic_error("unreachable");
}

// The runtime with the example plugin, shared by the tests below (loading it is cheap, but
// one runtime keeps the tests' output short).
Runtime& example_runtime() {
  static Runtime rt(with("ext"));
  return rt;
}

Tensor f32(Backend& b, const std::vector<double>& v, const Shape& shape) {
  return Tensor::from_vector(b, std::vector<float>(v.begin(), v.end()), shape);
}

}  // namespace

TEST_CASE("kernel extensions join the named backend after its own and the rest are reported",
          "[cpu][loader][extensions]") {
  Runtime rt(with("extbad"));
  const LoadedPlugin& ext = plugin_named(rt, "extbad");
  // exthalf, beside it, is refused (tests/core/test_loader.cpp has its message).
  REQUIRE(rt.skipped().size() == 1);

  const auto& xs = rt.extension_kernels();
  REQUIRE(xs.size() == 6);
  for (const auto& x : xs) CHECK(x.plugin == "extbad");
  CHECK(xs[0].problem.empty());
  CHECK(xs[1].problem.empty());
  CHECK(xs[2].backend == "nosuch");
  CHECK(xs[2].problem == "backend 'nosuch' is not loaded");
  CHECK(xs[3].problem == "op 'extbad.missing' (f32) matches no op schema");
  CHECK_THAT(xs[4].problem, PLX_CONTAINS("malformed"));
  CHECK(xs[5].op == "relu");
  CHECK(xs[5].problem.empty());

  // Appended after the cpu's own relu kernels, which take every node: never reached.
  Backend& cpu_b = rt.backend("cpu");
  const auto relu = cpu_b.kernels(rt.ops().get("relu").id, PLX_F32);
  REQUIRE(relu.size() >= 2);
  CHECK(std::string(relu.back()->impl) == "ext-relu");
  CHECK(&cpu_b.kernel_plugin(relu.back()) == &ext);
  CHECK(cpu_b.kernel_ctx(relu.back()) == ext.ctx());
  CHECK(&cpu_b.kernel_plugin(relu.front()) == &cpu_b.plugin());
  CHECK(cpu_b.kernel_ctx(relu.front()) == cpu_b.table().ctx);
  const Tensor x = f32(cpu_b, {-1, 2, -3, 4}, {2, 2});
  CHECK(call(cpu_b, "relu", {x}).at(0).to_vector<float>() == std::vector<float>{0, 2, 0, 4});

  // extbad.negate: the first extension declines (each checks it got extbad's ctx, else fails),
  // the second runs.
  const auto negate = cpu_b.kernels(rt.ops().get("extbad.negate").id, PLX_F32);
  REQUIRE(negate.size() == 2);
  CHECK(call(cpu_b, "extbad.negate", {x}).at(0).to_vector<float>() ==
        std::vector<float>{1, -2, 3, -4});
  // Errors come with the giving plugin's message, not the cpu plugin's.
  const Tensor x3 = f32(cpu_b, {1, 2}, {1, 1, 2});
  REQUIRE_THROWS_WITH(call(cpu_b, "extbad.negate", {x3}),
                      PLX_CONTAINS("backend 'cpu': creating kernel 'ext-negate' for op "
                                   "'extbad.negate': invalid argument: ext-negate refuses 3-d "
                                   "inputs"));
  const Tensor x13 = f32(cpu_b, {13, 1}, {2});
  REQUIRE_THROWS_WITH(call(cpu_b, "extbad.negate", {x13}),
                      PLX_CONTAINS("op 'extbad.negate' (ext-negate): backend error: "
                                   "ext-negate: compute failed on purpose (x[0] = 13)"));

  // plexus info lists every extension, says which plugin gives each, and why one is unused.
  const std::string text = info_text(rt);
  CHECK_THAT(text, PLX_CONTAINS("Kernel extensions (6):"));
  CHECK_THAT(text, PLX_CONTAINS("extbad.negate f32 on cpu: ext-negate (plugin extbad)"));
  CHECK_THAT(text, PLX_CONTAINS("extbad.negate f32 on nosuch: ext-negate (plugin extbad)\n"
                                "    not used: backend 'nosuch' is not loaded"));
  CHECK_THAT(text, PLX_CONTAINS("(kernel from plugin extbad)"));
  const std::string json = info_json(rt);
  CHECK_THAT(json, PLX_CONTAINS("\"extension_kernels\""));
  CHECK_THAT(json, PLX_CONTAINS("\"problem\" : \"backend 'nosuch' is not loaded\""));
}

TEST_CASE("example.swish runs on the cpu through its kernel extension and equals sigmoid and mul",
          "[cpu][extensions][sdk]") {
  Runtime& rt = example_runtime();
  Backend& cpu_b = rt.backend("cpu");
  const OpSchema& swish = rt.ops().get("example.swish");
  CHECK(swish.origin == "example");
  REQUIRE(rt.extension_kernels().size() == 4);  // swish and its backward, f32 and f64
  for (const auto& x : rt.extension_kernels()) {
    CHECK(x.backend == "cpu");
    CHECK(x.problem.empty());
  }
  // The cpu has no kernel of its own for the op: the extension is the one dispatched.
  const auto ks = cpu_b.kernels(swish.id, PLX_F32);
  REQUIRE(ks.size() == 1);
  CHECK(std::string(ks[0]->impl) == "example-swish-loop");
  CHECK(cpu_b.kernel_plugin(ks[0]).name() == "example");

  // beta: one for all, and one per feature (x's last dimension).
  for (const Shape& beta_shape : {Shape{1}, Shape{5}}) {
    INFO("beta " << shape_string(beta_shape));
    const int64_t nb = beta_shape[0];
    const Tensor x = f32(cpu_b, random_doubles(20, 7, -3, 3), {4, 5});
    const Tensor beta = f32(cpu_b, random_doubles(static_cast<size_t>(nb), 8, 0.5, 2), beta_shape);
    const Tensor y = call(cpu_b, "example.swish", {x, beta}).at(0);
    const Tensor ref =
        call(cpu_b, "mul", {x, call(cpu_b, "sigmoid", {call(cpu_b, "mul", {x, beta}).at(0)}).at(0)})
            .at(0);
    CHECK(y.shape() == Shape{4, 5});
    CHECK_ALLCLOSE(y.to_doubles(), ref.to_doubles(), tolerance(PLX_F32));

    // The gradient op, through the core's grad_op wiring: f64 against finite differences.
    const Tensor x64 = from_doubles(random_doubles(20, 9, -3, 3), {4, 5}, PLX_F64);
    const Tensor beta64 =
        from_doubles(random_doubles(static_cast<size_t>(nb), 10, 0.5, 2), beta_shape, PLX_F64);
    check_gradients(cpu_b, "example.swish", {x64, beta64});
  }

  // The plugin's shape inference explains itself.
  const Tensor x = f32(cpu_b, random_doubles(6, 1), {2, 3});
  const Tensor beta2 = f32(cpu_b, {1, 1}, {2});
  REQUIRE_THROWS_WITH(call(cpu_b, "example.swish", {x, beta2}),
                      PLX_CONTAINS("shape inference failed: invalid argument: example.swish: "
                                   "beta (2) must have 1 element or one per feature (x's last "
                                   "dimension, 3); x is (2, 3)"));
}

TEST_CASE("the example's f32 gradients equal those of sigmoid and mul", "[cpu][extensions][sdk]") {
  Runtime& rt = example_runtime();
  Backend& cpu_b = rt.backend("cpu");
  const Tensor x = f32(cpu_b, random_doubles(24, 3, -3, 3), {4, 6});
  const Tensor beta = f32(cpu_b, random_doubles(6, 4, 0.5, 2), {6});
  const Tensor dy = f32(cpu_b, random_doubles(24, 5), {4, 6});
  const Tensor y = call(cpu_b, "example.swish", {x, beta}).at(0);
  const auto grads = call_grad(cpu_b, "example.swish", {x, beta}, {y}, {dy});
  REQUIRE(grads.size() == 2);

  // The same through the built-in ops' gradients: y = x * s, s = sigmoid(z), z = x * beta.
  const Tensor z = call(cpu_b, "mul", {x, beta}).at(0);
  const Tensor s = call(cpu_b, "sigmoid", {z}).at(0);
  const Tensor y_ref = call(cpu_b, "mul", {x, s}).at(0);
  const auto g_mul = call_grad(cpu_b, "mul", {x, s}, {y_ref}, {dy});     // dx (direct), ds
  const auto g_sig = call_grad(cpu_b, "sigmoid", {z}, {s}, {g_mul[1]});  // dz
  const auto g_z = call_grad(cpu_b, "mul", {x, beta}, {z}, {g_sig[0]});  // dx (via z), dbeta
  const Tensor dx_ref = call(cpu_b, "add", {g_mul[0], g_z[0]}).at(0);
  CHECK_ALLCLOSE(grads[0].to_doubles(), dx_ref.to_doubles(), tolerance(PLX_F32));
  REQUIRE(grads[1].shape() == Shape{6});
  CHECK_ALLCLOSE(grads[1].to_doubles(), g_z[1].to_doubles(), (Tol{1e-5, 1e-4}));
}

TEST_CASE("the example's TOML model trains beta through its op layer",
          "[cpu][extensions][sdk][model]") {
  Runtime& rt = example_runtime();
  ModelSpec spec = load_model(source_dir() + "/sdk/examples/custom_op/swish_mlp.toml");
  spec.input_shape = {1, 6, 6};
  const int64_t n = 8;
  Graph g(rt.ops());
  const Var x = g.input("x", {PLX_F32, {n, 1, 6, 6}});
  const Var labels = g.input("labels", {PLX_I32, {n}});
  std::vector<LayerSummary> layers;
  const Var logits = build_model(g, spec, x, true, &layers);
  REQUIRE(layers.size() == 4);
  CHECK(layers[2].name == "swish");
  CHECK(layers[2].type == "op");
  CHECK(layers[2].parameters == 1);  // beta
  const Var beta = g.get("swish.beta");
  CHECK(g.value(beta).desc.shape == Shape{1});
  bool dispatched = false;
  for (const auto& node : g.nodes()) dispatched |= node.op_name() == "example.swish";
  CHECK(dispatched);

  const std::vector<Var> params = g.parameters();
  const std::vector<Var> grads = add_sgd_step(g, logits, labels);
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(g.value(params[i]).name);
    CHECK(grads[i].valid());
  }
  TensorStore store;
  ExecutableOptions opt;
  opt.seed = 3;
  Executable exe(rt.backend("cpu"), g, store, opt);
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(n * 36), 11));
  exe.tensor("labels").copy_from_host(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}.data());
  fill(exe.tensor("lr"), {0.05});
  CHECK(store.get("swish.beta").to_doubles() == std::vector<double>{1.0});  // init = "ones"
  const std::vector<double> losses = train_losses(exe, 30);
  INFO("first loss " << losses.front() << ", last " << losses.back());
  CHECK(std::isfinite(losses.back()));
  CHECK(losses.back() < 0.5 * losses.front());
  const double b = store.get("swish.beta").to_doubles().at(0);
  CHECK(std::isfinite(b));
  CHECK(b != 1.0);  // the gradient reached beta through the plugin's grad_op
}

// A plugin built against ABI 1.2 loads on a host of 1.1, which never reads the kernel-extension
// slots: the SDK says so in the plugin's log instead of leaving the kernels silently unused.
TEST_CASE("the SDK warns a host of ABI 1.1 that it cannot use the plugin's kernel extensions",
          "[cpu][extensions][sdk]") {
  // A copy of the library, so that this init and shutdown touch no other test's instance.
  const TempDir tmp("ext-old-host");
  const std::string copy = tmp / "libplexus-example.so";
  std::filesystem::copy_file(fixture_dir() + "/ext/libplexus-example.so", copy);
  void* lib = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  const auto entry = reinterpret_cast<plx_plugin_entry_fn>(dlsym(lib, PLX_PLUGIN_ENTRY_NAME));
  REQUIRE(entry != nullptr);
  const plx_plugin* d = entry();
  CHECK(d->abi_minor == PLX_ABI_MINOR);
  CHECK(d->struct_size == sizeof(plx_plugin));

  std::vector<std::string> logged;
  plx_host host{};
  host.struct_size = sizeof host;
  host.abi_major = 1;
  host.abi_minor = 1;  // a host from before kernel extensions
  host.log = [](void* user, int32_t level, const char*, const char* message) {
    if (level >= PLX_LOG_WARN) static_cast<std::vector<std::string>*>(user)->push_back(message);
  };
  host.log_user = &logged;
  host.log_level = PLX_LOG_INFO;
  void* ctx = nullptr;
  REQUIRE(d->init(&host, &ctx) == PLX_OK);
  CHECK(d->extension_kernel_count(ctx) == 4);
  d->shutdown(ctx);
  dlclose(lib);
  REQUIRE(logged.size() == 1);
  CHECK(logged[0] ==
        "this host speaks plugin ABI 1.1, which has no kernel extensions: the "
        "plugin's 4 kernel(s) for other backends are not used");
}

TEST_CASE("a node setting an attribute newer than a plugin's ABI goes to none of its kernels",
          "[cpu][loader][extensions][abi]") {
  RuntimeOptions o = with("abi12");
  o.kernels = KernelSide::Library;  // the extension (flagged library) first
  Runtime rt(o);
  REQUIRE(plugin_named(rt, "abi12").abi_minor() == 2);
  Backend& cpu_b = rt.backend("cpu");
  const Tensor x = f32(cpu_b, {-1, 0.5, -2, -4, 2, 2.5, -7, 0, 4, -10, 5, 5.5, -13, 6.5, 7, -16},
                       {1, 1, 4, 4});
  Attrs a;
  a.set("kernel", Ints{2, 2});
  // Without relu_mask the extension (a library kernel, tried first by the test side) runs.
  const std::vector<Tensor> plain = call(cpu_b, "max_pool2d", {x}, a);
  CHECK(plain.at(0).to_doubles() == std::vector<double>(4, 7.0));
  // With it, the 1.2 kernel is passed over and the cpu's own computes the masked indices.
  a.set("relu_mask", int64_t{1});
  const std::vector<Tensor> masked = call(cpu_b, "max_pool2d", {x}, a);
  CHECK(masked.at(0).to_doubles() == std::vector<double>{2.5, 0, 6.5, 7});
  CHECK(masked.at(1).to_doubles() == std::vector<double>{5, -1, 13, 14});  // 0 is not > 0
  // The decline names the plugin, its ABI and the attribute (an error lists it where no kernel
  // is left).
  const OpSchema& pool = rt.ops().get("max_pool2d");
  std::vector<plx_tensor> ins = {x.view()}, outs = {masked[0].view(), masked[1].view()};
  const KernelResolution r = resolve_kernel(cpu_b, pool, ins, outs, pool.complete_attrs(a), 0, false);
  REQUIRE(r.kernel);
  bool named = false;
  for (const std::string& d : r.declines)
    named = named || d == "ext-pool-abi12: plugin 'abi12' was built against plugin ABI 1.2, before "
                          "the node's attribute 'relu_mask' = 1 (ABI 1.3); rebuild it against this SDK";
  CHECK(named);
}

TEST_CASE("an update given a check goes to no kernel of a plugin from before ABI 1.4",
          "[cpu][loader][extensions][abi]") {
  RuntimeOptions o = with("abi12");
  o.kernels = KernelSide::Library;  // the extension (flagged library) first
  Runtime rt(o);
  Backend& cpu_b = rt.backend("cpu");
  const Tensor lr = f32(cpu_b, {0.5}, {});
  auto param = [&] { return f32(cpu_b, {1, 2, 3, 4}, {4}); };
  const Tensor grad = f32(cpu_b, {2, 2, 2, 2}, {4});
  // No check: the old kernel takes the node (momentum 0, so the rule is the same).
  Tensor p = param();
  call(cpu_b, "sgd_update", {p, grad, Tensor(), lr});
  CHECK(p.to_doubles() == std::vector<double>{0, 1, 2, 3});
  // A check that is not finite: the old kernel would update anyway; the cpu's own skips.
  Tensor q = param();
  const Tensor inf = f32(cpu_b, {std::numeric_limits<float>::infinity()}, {});
  call(cpu_b, "sgd_update", {q, grad, Tensor(), lr, inf});
  CHECK(q.to_doubles() == std::vector<double>{1, 2, 3, 4});
  const OpSchema& sgd = rt.ops().get("sgd_update");
  std::vector<plx_tensor> ins = {q.view(), grad.view(), Tensor().view(), lr.view(), inf.view()};
  const KernelResolution r = resolve_kernel(cpu_b, sgd, ins, {}, sgd.complete_attrs({}), 0, false);
  REQUIRE(r.kernel);
  bool named = false;
  for (const std::string& d : r.declines)
    named = named || d == "ext-sgd-abi12: plugin 'abi12' was built against plugin ABI 1.2, before "
                          "the node's input 'check' (ABI 1.4); rebuild it against this SDK";
  CHECK(named);
}

