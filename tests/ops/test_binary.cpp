// Elementwise arithmetic on the CPU backend: add, sub, mul, div with NumPy broadcasting, scale
// and expand. Forward against double-precision loops in every dtype, gradients (the core's
// formulas with sum_to over broadcast dimensions) against finite differences, and bad input.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>

#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

// NumPy's rule, written out independently of the core's: the broadcast shape or {} with ok=false.
std::pair<Shape, bool> ref_broadcast(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape y(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i + a.size() < n ? 1 : a[i + a.size() - n];
    const int64_t db = i + b.size() < n ? 1 : b[i + b.size() - n];
    if (da != db && da != 1 && db != 1) return {{}, false};
    y[i] = da == 1 ? db : da;
  }
  return {y, true};
}

// Flat index into `in` of output element o, `in` broadcast to `out`.
int64_t source_index(const Shape& in, const Shape& out, int64_t o) {
  int64_t idx = 0, stride = 1;
  const int64_t lead = static_cast<int64_t>(out.size()) - static_cast<int64_t>(in.size());
  for (int64_t i = static_cast<int64_t>(out.size()) - 1; i >= 0; --i) {
    const int64_t coord = o % out[static_cast<size_t>(i)];
    o /= out[static_cast<size_t>(i)];
    const int64_t j = i - lead;
    if (j < 0) continue;
    const int64_t n = in[static_cast<size_t>(j)];
    if (n != 1) idx += coord * stride;
    stride *= n;
  }
  return idx;
}

// y[o] = f(a[.], b[.]) over the broadcast shape.
std::vector<double> ref_binary(const std::vector<double>& a, const Shape& as,
                               const std::vector<double>& b, const Shape& bs, const Shape& ys,
                               const std::function<double(double, double)>& f) {
  std::vector<double> y(static_cast<size_t>(shape_numel(ys)));
  for (int64_t o = 0; o < static_cast<int64_t>(y.size()); ++o)
    y[static_cast<size_t>(o)] = f(a[static_cast<size_t>(source_index(as, ys, o))],
                                  b[static_cast<size_t>(source_index(bs, ys, o))]);
  return y;
}

struct BinaryOp {
  const char* name;
  std::function<double(double, double)> f;
};
const std::vector<BinaryOp> kFloatOps = {
    {"add", [](double a, double b) { return a + b; }},
    {"sub", [](double a, double b) { return a - b; }},
    {"mul", [](double a, double b) { return a * b; }},
    {"div", [](double a, double b) { return a / b; }},
};

// Shape pairs: equal shapes, scalars either side, row and column broadcasts, broadcasting in
// both directions, size-1 and empty dimensions, and sizes past the threading grain (rows split
// between threads mid-row).
const std::vector<std::pair<Shape, Shape>> kPairs = {
    {{7}, {7}},
    {{2, 3, 4, 5}, {2, 3, 4, 5}},
    {{3, 5}, {}},
    {{}, {3, 5}},
    {{}, {}},
    {{1}, {4, 3}},
    {{4, 5}, {5}},
    {{4, 5}, {4, 1}},
    {{4, 1}, {4, 5}},
    {{3, 1, 5}, {4, 5}},
    {{4, 5}, {3, 1, 5}},
    {{2, 1, 3, 1}, {1, 4, 1, 5}},
    {{1, 1, 1}, {1}},
    {{0, 3}, {3}},
    {{65537}, {65537}},
    {{65537}, {1}},
    {{300, 257}, {257}},
    {{5, 1, 257}, {1, 60, 1}},
};

// Divisors kept away from zero: magnitude in [0.5, 2), alternating sign.
std::vector<double> divisors(size_t n, uint64_t seed) {
  std::vector<double> v = random_doubles(n, seed, 0.5, 2.0);
  for (size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
  return v;
}

Tensor divisor_tensor(const Shape& s, plx_dtype d, uint64_t seed) {
  return from_doubles(divisors(static_cast<size_t>(shape_numel(s)), seed), s, d);
}

}  // namespace

TEST_CASE("add, sub, mul, div broadcast like NumPy in every float dtype", "[cpu][ops][binary]") {
  for (const BinaryOp& op : kFloatOps) {
    for (plx_dtype d : kFloatDtypes) {
      for (const auto& [as, bs] : kPairs) {
        INFO(op.name << " " << dtype_name(d) << " a " << shape_string(as) << " b "
                     << shape_string(bs));
        const Tensor a = random_tensor(as, d, 3, -2, 2);
        const Tensor b = std::string(op.name) == "div" ? divisor_tensor(bs, d, 4)
                                                       : random_tensor(bs, d, 4, -2, 2);
        const auto [ys, ok] = ref_broadcast(as, bs);
        REQUIRE(ok);
        const Tensor y = call(cpu(), op.name, {a, b}).at(0);
        REQUIRE(y.dtype() == d);
        REQUIRE(y.shape() == ys);
        const auto want = ref_binary(a.to_doubles(), as, b.to_doubles(), bs, ys, op.f);
        CHECK_ALLCLOSE(y.to_doubles(), round_to(want, d), tolerance(d));
      }
    }
  }
}

TEST_CASE("integer add, sub, mul, div are exact and div truncates toward zero",
          "[cpu][ops][binary]") {
  const std::vector<BinaryOp> ops = {
      {"add", [](double a, double b) { return a + b; }},
      {"sub", [](double a, double b) { return a - b; }},
      {"mul", [](double a, double b) { return a * b; }},
      {"div", [](double a, double b) { return std::trunc(a / b); }},
  };
  for (const BinaryOp& op : ops) {
    for (plx_dtype d : {PLX_I32, PLX_I64}) {
      for (const auto& [as, bs] : kPairs) {
        INFO(op.name << " " << dtype_name(d) << " a " << shape_string(as) << " b "
                     << shape_string(bs));
        const Tensor a = random_ints(as, d, 5, -1000, 1000);
        // Nonzero divisors of both signs, small so that quotients are mostly not whole.
        std::vector<double> bv = random_ints(bs, PLX_I64, 6, 1, 8).to_doubles();
        for (size_t i = 0; i < bv.size(); i += 3) bv[i] = -bv[i];
        const Tensor b = from_doubles(bv, bs, d);
        const Shape ys = ref_broadcast(as, bs).first;
        const Tensor y = call(cpu(), op.name, {a, b}).at(0);
        REQUIRE(y.dtype() == d);
        REQUIRE(y.shape() == ys);
        CHECK(y.to_doubles() == ref_binary(a.to_doubles(), as, bv, bs, ys, op.f));
      }
    }
  }
}

TEST_CASE("integer arithmetic wraps on overflow, MIN / -1 included", "[cpu][ops][binary]") {
  // Two's complement: 2^31 - 1 + 1 = -2^31; -2^31 - 1 = 2^31 - 1; -2^31 * -1 = -2^31.
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  const Tensor a = Tensor::from_vector(cpu(), std::vector<int32_t>{kMax, kMin, kMin, kMin}, {4});
  const Tensor b = Tensor::from_vector(cpu(), std::vector<int32_t>{1, 1, -1, -1}, {4});
  CHECK(call(cpu(), "add", {a, b}).at(0).to_vector<int32_t>()[0] == kMin);
  CHECK(call(cpu(), "sub", {a, b}).at(0).to_vector<int32_t>()[1] == kMax);
  CHECK(call(cpu(), "mul", {a, b}).at(0).to_vector<int32_t>()[2] == kMin);
  CHECK(call(cpu(), "div", {a, b}).at(0).to_vector<int32_t>()[3] == kMin);
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  const Tensor a64 = Tensor::from_vector(cpu(), std::vector<int64_t>{kMin64, 7, -7}, {3});
  const Tensor b64 = Tensor::from_vector(cpu(), std::vector<int64_t>{-1, -2, 2}, {3});
  CHECK(call(cpu(), "div", {a64, b64}).at(0).to_vector<int64_t>() ==
        std::vector<int64_t>{kMin64, -3, -3});
}

TEST_CASE("float division by zero follows IEEE", "[cpu][ops][binary]") {
  for (plx_dtype d : kFloatDtypes) {
    INFO(dtype_name(d));
    const Tensor a = from_doubles({1.0, -1.0, 0.0, 2.5}, {4}, d);
    const Tensor b = from_doubles({0.0}, {1}, d);
    const std::vector<double> y = call(cpu(), "div", {a, b}).at(0).to_doubles();
    CHECK((std::isinf(y[0]) && y[0] > 0));
    CHECK((std::isinf(y[1]) && y[1] < 0));
    CHECK(std::isnan(y[2]));
    CHECK((std::isinf(y[3]) && y[3] > 0));
  }
}

TEST_CASE("scale computes alpha * x + beta", "[cpu][ops][binary]") {
  const std::vector<std::pair<double, double>> params = {{1.0, 0.0}, {2.5, -0.75}, {-1.0, 0.0}};
  for (plx_dtype d : kFloatDtypes) {
    for (const Shape& s : {Shape{}, Shape{1}, Shape{7}, Shape{2, 3, 5}, Shape{0}, Shape{65537}}) {
      for (const auto& [alpha, beta] : params) {
        INFO(dtype_name(d) << " " << shape_string(s) << " alpha " << alpha << " beta " << beta);
        const Tensor x = random_tensor(s, d, 8, -2, 2);
        const Tensor y = call(cpu(), "scale", {x}, {{"alpha", alpha}, {"beta", beta}}).at(0);
        REQUIRE(y.dtype() == d);
        REQUIRE(y.shape() == s);
        std::vector<double> want = x.to_doubles();
        for (double& v : want) v = alpha * v + beta;
        CHECK_ALLCLOSE(y.to_doubles(), round_to(want, d), tolerance(d));
      }
    }
  }
  // Defaults: the identity.
  const Tensor x = random_tensor({3, 4}, PLX_F32, 9);
  CHECK(call(cpu(), "scale", {x}).at(0).to_doubles() == x.to_doubles());
}

TEST_CASE("integer scale is exact for whole factors, truncated and saturated otherwise",
          "[cpu][ops][binary]") {
  for (plx_dtype d : {PLX_I32, PLX_I64}) {
    INFO(dtype_name(d));
    const Tensor x = random_ints({3, 7}, d, 10, -1000, 1000);
    const std::vector<double> xs = x.to_doubles();
    std::vector<double> want(xs.size());
    // Whole factors: exact.
    for (size_t i = 0; i < xs.size(); ++i) want[i] = 3 * xs[i] - 7;
    CHECK(call(cpu(), "scale", {x}, {{"alpha", int64_t{3}}, {"beta", int64_t{-7}}})
              .at(0)
              .to_doubles() == want);
    // Fractional: computed in f64, truncated toward zero.
    for (size_t i = 0; i < xs.size(); ++i) want[i] = std::trunc(0.3 * xs[i] + 0.25);
    CHECK(call(cpu(), "scale", {x}, {{"alpha", 0.3}, {"beta", 0.25}}).at(0).to_doubles() == want);
  }
  // Out of range: saturates at the type's limits, like cast.
  const Tensor x = Tensor::from_vector(cpu(), std::vector<int32_t>{-3, 0, 5}, {3});
  const auto y =
      call(cpu(), "scale", {x}, {{"alpha", 1e10}, {"beta", 0.5}}).at(0).to_vector<int32_t>();
  CHECK(y == std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 0,
                                  std::numeric_limits<int32_t>::max()});
}

TEST_CASE("expand broadcasts to a shape in every dtype", "[cpu][ops][binary]") {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 1}, {2, 3, 4}},
      {{1}, {5}},
      {{}, {2, 2}},
      {{4}, {3, 4}},
      {{2, 1, 3}, {2, 4, 3}},
      {{2, 3}, {2, 3}},
      {{1}, {0}},
      {{1, 1}, {1, 1}},
      {{1, 257}, {300, 257}},
      {{300, 1}, {300, 257}},
      {{5, 1, 7}, {2, 5, 9, 7}},
  };
  const std::vector<plx_dtype> dtypes = {PLX_F32, PLX_F16, PLX_BF16, PLX_F64,
                                         PLX_I32, PLX_I64, PLX_U8};
  for (plx_dtype d : dtypes) {
    for (const auto& [xs, to] : cases) {
      INFO(dtype_name(d) << " " << shape_string(xs) << " to " << shape_string(to));
      const Tensor x =
          dtype_is_float(d) ? random_tensor(xs, d, 11) : random_ints(xs, d, 11, 0, 100);
      const Tensor y = call(cpu(), "expand", {x}, {{"shape", to}}).at(0);
      REQUIRE(y.dtype() == d);
      REQUIRE(y.shape() == to);
      const std::vector<double> xv = x.to_doubles();
      std::vector<double> want(static_cast<size_t>(shape_numel(to)));
      for (int64_t o = 0; o < static_cast<int64_t>(want.size()); ++o)
        want[static_cast<size_t>(o)] = xv[static_cast<size_t>(source_index(xs, to, o))];
      CHECK(y.to_doubles() == want);  // pure data movement: exact
    }
  }
}

TEST_CASE("binary gradients sum over broadcast dimensions", "[cpu][ops][binary][grad]") {
  // Broadcasting a into b, b into a, both at once, none, and scalars.
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{3, 1, 5}, {4, 5}}, {{4, 5}, {3, 1, 5}}, {{2, 1, 3}, {1, 4, 1}}, {{3, 4}, {3, 4}}, {{5}, {}},
      {{}, {2, 3}},        {{1}, {1}},          {{2, 3}, {2, 1}},
  };
  for (const auto& [as, bs] : pairs) {
    INFO("a " << shape_string(as) << " b " << shape_string(bs));
    const Tensor a = random_tensor(as, PLX_F64, 12, -2, 2);
    const Tensor b = random_tensor(bs, PLX_F64, 13, -2, 2);
    check_gradients("add", {a, b});
    check_gradients("sub", {a, b});
    check_gradients("mul", {a, b});
    check_gradients("div", {a, divisor_tensor(bs, PLX_F64, 14)});
  }
}

TEST_CASE("binary gradients for one operand only", "[cpu][ops][binary][grad]") {
  const Tensor a = random_tensor({3, 1, 5}, PLX_F64, 15);
  const Tensor b = divisor_tensor({4, 5}, PLX_F64, 16);
  for (const char* op : {"add", "sub", "mul", "div"}) {
    GradCheck only_a;
    only_a.inputs = {0};
    check_gradients(op, {a, b}, {}, only_a);
    GradCheck only_b;
    only_b.inputs = {1};
    check_gradients(op, {a, b}, {}, only_b);
  }
}

TEST_CASE("scale and expand gradients", "[cpu][ops][binary][grad]") {
  for (const Shape& s : {Shape{}, Shape{1}, Shape{2, 3, 5}}) {
    INFO(shape_string(s));
    const Tensor x = random_tensor(s, PLX_F64, 17);
    check_gradients("scale", {x});
    check_gradients("scale", {x}, {{"alpha", 2.5}, {"beta", -1.0}});
    check_gradients("scale", {x}, {{"alpha", -0.5}, {"beta", 3.0}});
  }
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 1}, {2, 3, 4}}, {{}, {2, 3}}, {{1, 4}, {3, 1, 4}}, {{2, 3}, {2, 3}}, {{1}, {5}}};
  for (const auto& [xs, to] : cases) {
    INFO(shape_string(xs) << " to " << shape_string(to));
    check_gradients("expand", {random_tensor(xs, PLX_F64, 18)}, {{"shape", to}});
  }
}

TEST_CASE("integer operands get no gradient", "[cpu][ops][binary][grad]") {
  const Tensor a = random_ints({2, 3}, PLX_I32, 19, -5, 5);
  const Tensor b = random_ints({3}, PLX_I32, 20, 1, 5);
  const Tensor y = call(cpu(), "mul", {a, b}).at(0);
  const Tensor dy = random_ints({2, 3}, PLX_I32, 21, -5, 5);
  const auto grads = call_grad(cpu(), "mul", {a, b}, {y}, {dy});
  REQUIRE(grads.size() == 2);
  CHECK_FALSE(grads[0].defined());
  CHECK_FALSE(grads[1].defined());
}

TEST_CASE("binary ops reject shapes that do not broadcast, naming both",
          "[cpu][ops][binary][errors]") {
  const Tensor a = random_tensor({3, 4}, PLX_F32, 1);
  const Tensor b = random_tensor({5}, PLX_F32, 2);
  for (const char* op : {"add", "sub", "mul", "div"}) {
    INFO(op);
    REQUIRE_THROWS_WITH(call(cpu(), op, {a, b}), PLX_CONTAINS(std::string("'") + op + "'"));
    REQUIRE_THROWS_WITH(call(cpu(), op, {a, b}), PLX_CONTAINS("(3, 4)"));
    REQUIRE_THROWS_WITH(call(cpu(), op, {a, b}), PLX_CONTAINS("(5)"));
    REQUIRE_THROWS_WITH(call(cpu(), op, {a, b}), PLX_CONTAINS("do not broadcast"));
  }
  const Tensor c = random_tensor({2, 3, 1}, PLX_F32, 3);
  const Tensor e = random_tensor({4, 2}, PLX_F32, 4);
  REQUIRE_THROWS_WITH(call(cpu(), "add", {c, e}), PLX_CONTAINS("(2, 3, 1) and b (4, 2)"));
}

TEST_CASE("binary ops reject mismatched and unsupported dtypes", "[cpu][ops][binary][errors]") {
  const Tensor a = random_tensor({3}, PLX_F32, 1);
  const Tensor b = random_tensor({3}, PLX_F64, 2);
  REQUIRE_THROWS_WITH(call(cpu(), "add", {a, b}), PLX_CONTAINS("'add'"));
  REQUIRE_THROWS_WITH(call(cpu(), "add", {a, b}), PLX_CONTAINS("expected f32"));
  const Tensor i = random_ints({3}, PLX_I32, 3, 0, 5);
  REQUIRE_THROWS_WITH(call(cpu(), "mul", {i, a}), PLX_CONTAINS("expected i32"));
  const Tensor u = random_ints({3}, PLX_U8, 4, 0, 5);
  REQUIRE_THROWS_WITH(call(cpu(), "sub", {u, u}), PLX_CONTAINS("expected one of"));
  REQUIRE_THROWS_WITH(call(cpu(), "scale", {u}), PLX_CONTAINS("expected one of"));
}

TEST_CASE("integer division by zero is an error naming the op", "[cpu][ops][binary][errors]") {
  for (plx_dtype d : {PLX_I32, PLX_I64}) {
    INFO(dtype_name(d));
    const Tensor a = random_ints({2, 3}, d, 1, -5, 5);
    const Tensor b = from_doubles({1, 0, 2}, {3}, d);
    REQUIRE_THROWS_AS(call(cpu(), "div", {a, b}), OpError);
    REQUIRE_THROWS_WITH(call(cpu(), "div", {a, b}), PLX_CONTAINS("'div'"));
    REQUIRE_THROWS_WITH(call(cpu(), "div", {a, b}), PLX_CONTAINS("division by zero"));
    const Tensor zero = from_doubles({0}, {}, d);  // a broadcast scalar zero
    REQUIRE_THROWS_WITH(call(cpu(), "div", {a, zero}), PLX_CONTAINS("division by zero"));
  }
}

TEST_CASE("expand rejects incompatible shapes and bad attributes", "[cpu][ops][binary][errors]") {
  const Tensor x = random_tensor({3, 4}, PLX_F32, 1);
  REQUIRE_THROWS_WITH(call(cpu(), "expand", {x}, {{"shape", Ints{5, 4}}}),
                      PLX_CONTAINS("cannot expand (3, 4) to (5, 4)"));
  REQUIRE_THROWS_WITH(call(cpu(), "expand", {x}, {{"shape", Ints{4}}}),
                      PLX_CONTAINS("cannot expand (3, 4) to (4)"));
  REQUIRE_THROWS_WITH(call(cpu(), "expand", {x}, {{"shape", Ints{2, 3, 8}}}),
                      PLX_CONTAINS("'expand'"));
  REQUIRE_THROWS_WITH(call(cpu(), "expand", {x}, {{"shape", Ints{-1, 4}}}),
                      PLX_CONTAINS("negative"));
  REQUIRE_THROWS_WITH(call(cpu(), "expand", {x}),
                      PLX_CONTAINS("missing required attribute 'shape'"));
  REQUIRE_THROWS_WITH(call(cpu(), "scale", {x}, {{"alpha", std::string("two")}}),
                      PLX_CONTAINS("attribute 'alpha'"));
}
