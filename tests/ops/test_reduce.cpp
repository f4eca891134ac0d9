// Reductions on the CPU backend: sum, mean and argmax. Forward against plain loops (in long
// double for the sums) over every combination of axes, positive and negative, with and without
// keepdims, in every dtype; gradients against finite differences; bad axes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

struct Reduced {
  Shape shape;  // output shape
  std::vector<long double> sum;
  std::vector<int64_t> isum;  // exact integer sums
  int64_t count = 1;          // elements per output
};

// Sums x (row-major, shape s) over `axes` (normalised here, independently of the core).
Reduced ref_reduce(const std::vector<double>& x, const Shape& s, const Ints& axes, bool keep) {
  const auto nd = static_cast<int64_t>(s.size());
  std::vector<bool> red(s.size(), axes.empty());
  for (int64_t a : axes) {
    const int64_t i = a < 0 ? a + nd : a;
    if (i >= 0 && i < nd) red[static_cast<size_t>(i)] = true;  // a 0-d x has none to mark
  }
  Reduced r;
  Shape kept;  // the output's dims, reduced ones as 1 (for the index map)
  for (size_t i = 0; i < s.size(); ++i) {
    kept.push_back(red[i] ? 1 : s[i]);
    if (red[i]) r.count *= s[i];
    if (!red[i])
      r.shape.push_back(s[i]);
    else if (keep)
      r.shape.push_back(1);
  }
  const auto n_out = static_cast<size_t>(shape_numel(r.shape));
  r.sum.assign(n_out, 0.0L);
  r.isum.assign(n_out, 0);
  for (int64_t f = 0; f < static_cast<int64_t>(x.size()); ++f) {
    int64_t rem = f, o = 0, stride = 1;
    for (int64_t i = nd - 1; i >= 0; --i) {
      const int64_t c = rem % s[static_cast<size_t>(i)];
      rem /= s[static_cast<size_t>(i)];
      if (!red[static_cast<size_t>(i)]) o += c * stride;
      stride *= kept[static_cast<size_t>(i)];
    }
    r.sum[static_cast<size_t>(o)] += x[static_cast<size_t>(f)];
    r.isum[static_cast<size_t>(o)] += static_cast<int64_t>(x[static_cast<size_t>(f)]);
  }
  return r;
}

// Every subset of the axes of an n-d shape, written with positive axes and again with negative
// ones (in reverse order, which must not matter).
std::vector<Ints> all_axes(size_t n) {
  std::vector<Ints> out;
  for (uint32_t m = 0; m < (1u << n); ++m) {
    Ints pos, neg;
    for (size_t i = 0; i < n; ++i) {
      if (!(m & (1u << i))) continue;
      pos.push_back(static_cast<int64_t>(i));
      neg.insert(neg.begin(), static_cast<int64_t>(i) - static_cast<int64_t>(n));
    }
    out.push_back(pos);
    if (!neg.empty()) out.push_back(neg);
  }
  return out;
}

// Tolerance for a sum of `count` terms of order one: the catalogue allows f32 accumulation, whose
// error grows like sqrt(count) for random signs, so atol scales by sqrt(count).
Tol sum_tolerance(plx_dtype d, int64_t count) {
  Tol t = tolerance(d);
  t.atol *= std::sqrt(static_cast<double>(std::max<int64_t>(count, 1)));
  return t;
}

void check_reduce(const std::string& op, const Shape& s, const Ints& axes, bool keep, plx_dtype d) {
  INFO(op << " " << dtype_name(d) << " " << shape_string(s) << " axes " << shape_string(axes)
          << " keepdims " << keep);
  const Tensor x = random_tensor(s, d, 21, -1, 1);
  const Reduced r = ref_reduce(x.to_doubles(), s, axes, keep);
  const Tensor y =
      call(cpu(), op, {x}, {{"axes", axes}, {"keepdims", int64_t{keep ? 1 : 0}}}).at(0);
  REQUIRE(y.dtype() == d);
  REQUIRE(y.shape() == r.shape);
  std::vector<double> want(r.sum.size());
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = static_cast<double>(op == "mean" ? r.sum[i] / r.count : r.sum[i]);
  // A mean divides the error of the sum by the count as well.
  const Tol tol = op == "mean" ? tolerance(d) : sum_tolerance(d, r.count);
  CHECK_ALLCLOSE(y.to_doubles(), round_to(want, d), tol);
}

// Shapes for the exhaustive axes sweep: 4-d, size-1 dims, odd sizes, 1-d, all ones.
const std::vector<Shape> kSweepShapes = {{2, 3, 4, 5}, {3, 1, 5, 2}, {7}, {1, 1, 1}, {5, 1}};

// Large cases: full reductions and bias-gradient shapes past the threading grain, where the
// reduced range is split between threads; row and column layouts; tiles wider than one.
const std::vector<std::pair<Shape, Ints>> kLargeCases = {
    {{65537}, {}},           {{70000, 3}, {0}},       {{3, 70000}, {1}},      {{257, 300}, {0}},
    {{33, 17, 129}, {0, 2}}, {{129, 17, 33}, {0, 1}}, {{4, 5000, 7}, {0, 2}}, {{2, 40000}, {}},
};

}  // namespace

TEST_CASE("sum over every combination of axes, keepdims, in every float dtype",
          "[cpu][ops][reduce]") {
  for (plx_dtype d : kFloatDtypes)
    for (const Shape& s : kSweepShapes)
      for (const Ints& axes : all_axes(s.size()))
        for (bool keep : {false, true}) check_reduce("sum", s, axes, keep, d);
}

TEST_CASE("sum of large tensors split between threads", "[cpu][ops][reduce]") {
  for (plx_dtype d : kFloatDtypes)
    for (const auto& [s, axes] : kLargeCases)
      for (bool keep : {false, true}) check_reduce("sum", s, axes, keep, d);
}

TEST_CASE("sum of scalars, size-1 and empty dimensions", "[cpu][ops][reduce]") {
  for (plx_dtype d : kFloatDtypes) {
    check_reduce("sum", {}, {}, false, d);
    check_reduce("sum", {}, {0}, false, d);  // a 0-d tensor accepts axis 0 and -1
    check_reduce("sum", {}, {-1}, true, d);
    check_reduce("sum", {1}, {0}, false, d);
    check_reduce("sum", {0, 3}, {0}, false, d);  // empty sums are 0
    check_reduce("sum", {0, 3}, {}, true, d);
    // Zero-size dimensions lead here: the core's Tensor::is_contiguous calls a tensor with a
    // later zero-size dimension non-contiguous, which a host copy then refuses.
    check_reduce("sum", {0, 3}, {1}, false, d);  // no outputs
    check_reduce("sum", {0, 2, 3}, {0, 2}, true, d);
  }
}

TEST_CASE("integer sums are exact in i64", "[cpu][ops][reduce]") {
  for (plx_dtype d : {PLX_I32, PLX_I64}) {
    for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{3, 1, 5, 2}, Shape{70000, 3}, Shape{65537}}) {
      // i64 values of 2^45 (exact in the doubles the reference reads) summing past 2^53, where
      // a double accumulator would round, yet within i64.
      const int64_t hi = d == PLX_I64 ? (int64_t{1} << 45) : 1000;
      const Tensor x = random_ints(s, d, 22, -hi, hi);
      for (const Ints& axes : all_axes(s.size())) {
        for (bool keep : {false, true}) {
          INFO(dtype_name(d) << " " << shape_string(s) << " axes " << shape_string(axes)
                             << " keepdims " << keep);
          const Reduced r = ref_reduce(x.to_doubles(), s, axes, keep);
          const Tensor y =
              call(cpu(), "sum", {x}, {{"axes", axes}, {"keepdims", int64_t{keep}}}).at(0);
          REQUIRE(y.dtype() == d);
          REQUIRE(y.shape() == r.shape);
          std::vector<int64_t> got;
          if (d == PLX_I64)
            got = y.to_vector<int64_t>();
          else
            for (int32_t v : y.to_vector<int32_t>()) got.push_back(v);
          CHECK(got == r.isum);
        }
      }
    }
  }
}

TEST_CASE("mean over axes in every float dtype", "[cpu][ops][reduce]") {
  for (plx_dtype d : kFloatDtypes) {
    for (const Shape& s : kSweepShapes)
      for (const Ints& axes : all_axes(s.size()))
        for (bool keep : {false, true}) check_reduce("mean", s, axes, keep, d);
    for (const auto& [s, axes] : kLargeCases) check_reduce("mean", s, axes, false, d);
    check_reduce("mean", {}, {}, false, d);
  }
}

TEST_CASE("mean over an empty axis is nan", "[cpu][ops][reduce]") {
  for (plx_dtype d : kFloatDtypes) {
    INFO(dtype_name(d));
    const Tensor x = random_tensor({0, 3}, d, 1);
    const Tensor y = call(cpu(), "mean", {x}, {{"axes", Ints{0}}}).at(0);
    REQUIRE(y.shape() == Shape{3});
    for (double v : y.to_doubles()) CHECK(std::isnan(v));
  }
}

TEST_CASE("sum and mean gradients broadcast dy back", "[cpu][ops][reduce][grad]") {
  const std::vector<std::pair<Shape, Ints>> cases = {
      {{2, 3, 4}, {}},     {{2, 3, 4}, {1}},     {{2, 3, 4}, {-1}},
      {{2, 3, 4}, {0, 2}}, {{2, 3, 4}, {2, -3}}, {{3, 1, 5}, {1}},
      {{3, 1, 5}, {0, 1}}, {{5}, {0}},           {{}, {}},
      {{1}, {}},           {{4, 1}, {0}},
  };
  for (const auto& [s, axes] : cases) {
    for (int64_t keep : {0, 1}) {
      INFO(shape_string(s) << " axes " << shape_string(axes) << " keepdims " << keep);
      const Tensor x = random_tensor(s, PLX_F64, 23);
      check_gradients("sum", {x}, {{"axes", axes}, {"keepdims", keep}});
      check_gradients("mean", {x}, {{"axes", axes}, {"keepdims", keep}});
    }
  }
}

namespace {

// First index of the maximum along `axis`, nan counting as the maximum (the first nan wins).
std::vector<double> ref_argmax(const std::vector<double>& x, const Shape& s, int64_t axis) {
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= s[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(axis) + 1; i < s.size(); ++i) inner *= s[i];
  const int64_t n = s[static_cast<size_t>(axis)];
  std::vector<double> y(static_cast<size_t>(outer * inner));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      int64_t best = 0;
      for (int64_t r = 0; r < n; ++r) {
        const double v = x[static_cast<size_t>((o * n + r) * inner + j)];
        if (std::isnan(v)) {
          best = r;
          break;
        }
        if (v > x[static_cast<size_t>((o * n + best) * inner + j)]) best = r;
      }
      y[static_cast<size_t>(o * inner + j)] = static_cast<double>(best);
    }
  }
  return y;
}

void check_argmax(const Tensor& x, int64_t axis, bool keep) {
  const Shape& s = x.shape();
  const auto nd = static_cast<int64_t>(s.size());
  const int64_t a = axis < 0 ? axis + nd : axis;
  INFO(dtype_name(x.dtype()) << " " << shape_string(s) << " axis " << axis << " keepdims " << keep);
  Shape ys = s;
  if (keep)
    ys[static_cast<size_t>(a)] = 1;
  else
    ys.erase(ys.begin() + a);
  const Tensor y =
      call(cpu(), "argmax", {x}, {{"axis", axis}, {"keepdims", int64_t{keep ? 1 : 0}}}).at(0);
  REQUIRE(y.dtype() == PLX_I64);
  REQUIRE(y.shape() == ys);
  CHECK(y.to_doubles() == ref_argmax(x.to_doubles(), s, a));
}

}  // namespace

TEST_CASE("argmax finds the first maximum along an axis", "[cpu][ops][reduce]") {
  const std::vector<Shape> shapes = {{7}, {3, 5},  {2, 3, 4, 5}, {3, 1, 5},
                                     {1}, {70000}, {3, 300, 257}};
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16, PLX_F64, PLX_I32, PLX_I64}) {
    for (const Shape& s : shapes) {
      // Integers from a small range, so ties (where the first index must win) are common.
      const Tensor x =
          dtype_is_float(d) ? random_tensor(s, d, 24, -3, 3) : random_ints(s, d, 24, 0, 4);
      const auto nd = static_cast<int64_t>(s.size());
      for (int64_t axis = -nd; axis < nd; ++axis)
        for (bool keep : {false, true}) check_argmax(x, axis, keep);
    }
  }
}

TEST_CASE("argmax with ties, infinities and nan", "[cpu][ops][reduce]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (plx_dtype d : kFloatDtypes) {
    // Rows: ties, a nan after the maximum, two nans, -inf only, +inf then nan.
    const Tensor x = from_doubles({1,    3,    3,    0,     //
                                   5,    1,    nan,  9,     //
                                   nan,  2,    nan,  7,     //
                                   -inf, -inf, -inf, -inf,  //
                                   0,    inf,  1,    nan},
                                  {5, 4}, d);
    check_argmax(x, 1, false);
    check_argmax(x, 0, true);
    const std::vector<double> rows = call(cpu(), "argmax", {x}).at(0).to_doubles();
    CHECK(rows == std::vector<double>{1, 2, 0, 0, 3});
  }
  // A scalar is its own maximum.
  const Tensor s = from_doubles({4.0}, {}, PLX_F32);
  const Tensor y = call(cpu(), "argmax", {s}).at(0);
  CHECK(y.shape() == Shape{});
  CHECK(y.to_doubles() == std::vector<double>{0});
}

TEST_CASE("reductions reject bad axes", "[cpu][ops][reduce][errors]") {
  const Tensor x = random_tensor({3, 4}, PLX_F32, 1);
  for (const char* op : {"sum", "mean"}) {
    INFO(op);
    REQUIRE_THROWS_WITH(call(cpu(), op, {x}, {{"axes", Ints{2}}}),
                        PLX_CONTAINS("axis 2 is out of range for 2 dimensions"));
    REQUIRE_THROWS_WITH(call(cpu(), op, {x}, {{"axes", Ints{-3}}}), PLX_CONTAINS("out of range"));
    REQUIRE_THROWS_WITH(call(cpu(), op, {x}, {{"axes", Ints{0, 0}}}), PLX_CONTAINS("distinct"));
    REQUIRE_THROWS_WITH(call(cpu(), op, {x}, {{"axes", Ints{1, -1}}}),
                        PLX_CONTAINS(std::string("op '") + op + "'"));
    REQUIRE_THROWS_WITH(call(cpu(), op, {x}, {{"axes", Ints{1, -1}}}), PLX_CONTAINS("distinct"));
    REQUIRE_THROWS_WITH(call(cpu(), op, {x}, {{"axes", int64_t{0}}}),
                        PLX_CONTAINS("attribute 'axes'"));
  }
  REQUIRE_THROWS_WITH(call(cpu(), "argmax", {x}, {{"axis", int64_t{2}}}),
                      PLX_CONTAINS("out of range"));
  REQUIRE_THROWS_WITH(call(cpu(), "argmax", {x}, {{"axis", int64_t{-3}}}),
                      PLX_CONTAINS("op 'argmax'"));
  const Tensor e = random_tensor({0, 3}, PLX_F32, 2);
  REQUIRE_THROWS_WITH(call(cpu(), "argmax", {e}, {{"axis", int64_t{0}}}),
                      PLX_CONTAINS("empty axis"));
}

TEST_CASE("reductions reject unsupported dtypes, argmax has no gradient",
          "[cpu][ops][reduce][errors]") {
  const Tensor i = random_ints({3}, PLX_I32, 1, 0, 5);
  REQUIRE_THROWS_WITH(call(cpu(), "mean", {i}), PLX_CONTAINS("expected one of"));
  const Tensor u = random_ints({3}, PLX_U8, 1, 0, 5);
  REQUIRE_THROWS_WITH(call(cpu(), "sum", {u}), PLX_CONTAINS("expected one of"));
  REQUIRE_THROWS_WITH(call(cpu(), "argmax", {u}), PLX_CONTAINS("expected one of"));
  const Tensor x = random_tensor({3}, PLX_F64, 2);
  const Tensor y = call(cpu(), "argmax", {x}).at(0);
  REQUIRE_THROWS_WITH(call_grad(cpu(), "argmax", {x}, {y}, {Tensor()}),
                      PLX_CONTAINS("not differentiable"));
}
