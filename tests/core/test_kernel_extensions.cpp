// Kernel extensions (ABI 1.2): kernels one plugin gives another plugin's backend. The runtime
// appends them after the backend's own kernels; create() gets the giving plugin's ctx and its
// errors come from that plugin's last_error(); what cannot be attached is reported, not fatal.
#include "plexus/error.hpp"
#include "plexus/info.hpp"
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
