// Activations on the CPU backend: forward against double-precision loops in every float dtype,
// backward (the core's gradient formula plus the backward kernels) against finite differences.
#include <cmath>
#include <functional>

#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

const std::vector<Shape> kShapes = {{1}, {7}, {3, 5}, {2, 3, 4, 5}, {1, 1, 1}, {0}, {65537}};

double ref_gelu(double x, bool tanh_approx) {
  if (tanh_approx) return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

void check_unary(const std::string& op, const Attrs& attrs, const std::function<double(double)>& f) {
  for (plx_dtype d : kFloatDtypes) {
    for (const Shape& shape : kShapes) {
      INFO(op << " " << dtype_name(d) << " " << shape_string(shape));
      const Tensor x = random_tensor(shape, d, 17, -3, 3);
      const std::vector<double> xs = x.to_doubles();  // the values as stored
      std::vector<double> want(xs.size());
      for (size_t i = 0; i < xs.size(); ++i) want[i] = f(xs[i]);
      const Tensor y = call(cpu(), op, {x}, attrs).at(0);
      REQUIRE(y.dtype() == d);
      REQUIRE(y.shape() == shape);
      CHECK_ALLCLOSE(y.to_doubles(), round_to(want, d), tolerance(d));
    }
  }
}

}  // namespace

TEST_CASE("relu forward matches the reference", "[cpu][ops][activation]") {
  check_unary("relu", {}, [](double x) { return x > 0 ? x : 0; });
}

TEST_CASE("gelu forward matches the reference, exact and tanh", "[cpu][ops][activation]") {
  check_unary("gelu", {}, [](double x) { return ref_gelu(x, false); });
  check_unary("gelu", {{"approximate", std::string("tanh")}},
              [](double x) { return ref_gelu(x, true); });
}

TEST_CASE("sigmoid forward matches the reference", "[cpu][ops][activation]") {
  check_unary("sigmoid", {}, [](double x) { return 1 / (1 + std::exp(-x)); });
}

TEST_CASE("tanh forward matches the reference", "[cpu][ops][activation]") {
  check_unary("tanh", {}, [](double x) { return std::tanh(x); });
}

TEST_CASE("activation gradients match finite differences", "[cpu][ops][activation][grad]") {
  for (const Shape& shape : {Shape{1}, Shape{7}, Shape{2, 3, 5}}) {
    INFO(shape_string(shape));
    // Values kept away from relu's kink at 0, where the derivative is undefined.
    std::vector<double> v = random_doubles(static_cast<size_t>(shape_numel(shape)), 5, 0.1, 2.0);
    for (size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
    const Tensor x = from_doubles(v, shape, PLX_F64);
    check_gradients("relu", {x});
    check_gradients("gelu", {x});
    check_gradients("gelu", {x}, {{"approximate", std::string("tanh")}});
    check_gradients("sigmoid", {x});
    check_gradients("tanh", {x});
  }
}

TEST_CASE("gelu rejects an unknown approximation", "[cpu][ops][activation][errors]") {
  const Tensor x = random_tensor({4}, PLX_F32, 1);
  REQUIRE_THROWS_WITH(call(cpu(), "gelu", {x}, {{"approximate", std::string("fast")}}),
                      PLX_CONTAINS("approximate"));
}

TEST_CASE("activations reject integer inputs and mismatched backward shapes",
          "[cpu][ops][activation][errors]") {
  const Tensor i = random_ints({4}, PLX_I32, 1, 0, 5);
  REQUIRE_THROWS_WITH(call(cpu(), "relu", {i}), PLX_CONTAINS("expected one of"));
  const Tensor dy = random_tensor({4}, PLX_F32, 1);
  const Tensor y = random_tensor({5}, PLX_F32, 2);
  REQUIRE_THROWS_WITH(call(cpu(), "relu_backward", {dy, y}), PLX_CONTAINS("differ in shape"));
}
