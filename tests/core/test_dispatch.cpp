// Dispatch: kernels resolved per (op, dtype), declines with reasons, missing ops as errors
// naming op and backend, and the fallback policy (logged and counted).
#include <cmath>

#include "plexus/error.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

RuntimeOptions with_testdev(std::string fallback = "") {
  RuntimeOptions o;
  o.plugins.paths = {plugin_dir(), fixture_dir() + "/good"};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  o.fallback = std::move(fallback);
  return o;
}

}  // namespace

TEST_CASE("an op the backend lacks is an error naming op and backend", "[cpu][dispatch]") {
  Runtime rt(with_testdev());
  Backend& dev = rt.backend("testdev");
  const Tensor x = Tensor::from_vector(dev, std::vector<float>{1, 2, 3}, {3});
  REQUIRE_THROWS_AS(call(dev, "sigmoid", {x}), OpError);
  REQUIRE_THROWS_WITH(call(dev, "sigmoid", {x}),
                      PLX_CONTAINS("op 'sigmoid' (f32) has no kernel on backend 'testdev'"));
  REQUIRE_THROWS_WITH(call(dev, "sigmoid", {x}), PLX_CONTAINS("backend.fallback"));
}

TEST_CASE("a missing dtype names the dtypes the backend has", "[cpu][dispatch]") {
  Runtime rt(with_testdev());
  Backend& dev = rt.backend("testdev");
  const Tensor x = Tensor::from_vector(dev, std::vector<double>{1, 2}, {2});
  REQUIRE_THROWS_WITH(call(dev, "relu", {x}),
                      PLX_CONTAINS("op 'relu' (f64) has no kernel on backend 'testdev' (it has kernels for: f32)"));
}

TEST_CASE("a kernel that declines a node says why", "[cpu][dispatch]") {
  Runtime rt(with_testdev());
  Backend& dev = rt.backend("testdev");
  const Tensor a = Tensor::from_vector(dev, std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Tensor::from_vector(dev, std::vector<float>{10, 20, 30}, {3});
  // Same shapes: the test kernel takes it.
  const Tensor s = call(dev, "add", {a, a}).at(0);
  CHECK(s.to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
  // Broadcasting: it declines, and with no fallback the error carries the reason.
  REQUIRE_THROWS_WITH(call(dev, "add", {a, b}),
                      PLX_CONTAINS("test-add: testdev add does not broadcast ((2, 3) + (3))"));
}

TEST_CASE("with backend.fallback, missing ops run elsewhere, logged and counted",
          "[cpu][dispatch]") {
  Runtime rt(with_testdev("cpu"));
  Backend& dev = rt.backend("testdev");
  const Tensor x = Tensor::from_vector(dev, std::vector<float>{-1, 0, 2}, {3});
  for (int i = 0; i < 3; ++i) {
    const Tensor y = call(dev, "sigmoid", {x}).at(0);
    CHECK(&y.backend() == &dev);  // results come back to the backend the op was asked on
    const auto v = y.to_vector<float>();
    CHECK(v[0] == Approx(1 / (1 + std::exp(1.0f))));
    CHECK(v[1] == Approx(0.5f));
  }
  const auto counts = rt.fallback_counts();
  REQUIRE(counts.count("sigmoid/f32/testdev->cpu") == 1);
  CHECK(counts.at("sigmoid/f32/testdev->cpu") == 3);
  // Ops the backend has do not fall back.
  call(dev, "relu", {x});
  CHECK(rt.fallback_counts().size() == 1);
}

TEST_CASE("unknown ops and attributes are errors naming them", "[cpu][dispatch]") {
  const Tensor x = random_tensor({3}, PLX_F32, 1);
  REQUIRE_THROWS_WITH(call(cpu(), "relux", {x}), PLX_CONTAINS("unknown op 'relux'"));
  REQUIRE_THROWS_WITH(call(cpu(), "relu", {x}, {{"alpha", 0.1}}),
                      PLX_CONTAINS("op 'relu' has no attribute 'alpha' (attributes: none)"));
  REQUIRE_THROWS_WITH(call(cpu(), "gelu", {x}, {{"approximate", int64_t{1}}}),
                      PLX_CONTAINS("attribute 'approximate' is int 1, expected string"));
  REQUIRE_THROWS_WITH(call(cpu(), "relu", {}), PLX_CONTAINS("input 0 'x' is required"));
  REQUIRE_THROWS_WITH(call(cpu(), "relu", {x, x}), PLX_CONTAINS("takes 1 inputs, got 2"));
}

TEST_CASE("inputs on another backend are rejected", "[cpu][dispatch]") {
  Runtime rt(with_testdev());
  const Tensor on_cpu = Tensor::from_vector(rt.backend("cpu"), std::vector<float>{1}, {1});
  REQUIRE_THROWS_WITH(call(rt.backend("testdev"), "relu", {on_cpu}),
                      PLX_CONTAINS("lives on backend 'cpu', the op runs on 'testdev'"));
}

TEST_CASE("kernels are resolved once per node and run by pointer", "[cpu][dispatch]") {
  // A PreparedKernel keeps its kernel state; running it twice gives the same result with no
  // look-up in between.
  Backend& b = cpu();
  const OpSchema& relu = runtime().ops().get("relu");
  const Tensor x = Tensor::from_vector(b, std::vector<float>{-1, 3}, {2});
  const Tensor y = Tensor::empty(b, {2}, PLX_F32);
  plx_tensor in = x.view(), out = y.view();
  plx_tensor in_desc = in, out_desc = out;
  in_desc.data = out_desc.data = nullptr;
  KernelResolution r = resolve_kernel(b, relu, {in_desc}, {out_desc}, relu.complete_attrs({}), 0);
  REQUIRE(r.kernel != nullptr);
  CHECK(std::string(r.kernel->kernel().op) == "relu");
  for (int i = 0; i < 2; ++i) {
    r.kernel->run(&in, 1, &out, 1, nullptr, b.stream(0));
    CHECK(y.to_vector<float>() == std::vector<float>{0, 3});
  }
}

TEST_CASE("the CPU backend registers every op of the catalogue in every float dtype",
          "[cpu][dispatch]") {
  Backend& b = cpu();
  const auto ops = b.supported_ops();
  for (int32_t id = 0; id < runtime().ops().size(); ++id) {
    const OpSchema& s = runtime().ops().by_id(id);
    if (s.origin != "core") continue;
    INFO(s.name);
    REQUIRE(ops.count(s.name) == 1);
    const auto& dts = ops.at(s.name);
    const bool has_f32 = std::find(dts.begin(), dts.end(), PLX_F32) != dts.end();
    const bool has_f64 = std::find(dts.begin(), dts.end(), PLX_F64) != dts.end();
    CHECK(has_f32);
    CHECK(has_f64);
  }
}
