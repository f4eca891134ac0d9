// Softmax, log_softmax and softmax cross-entropy on the CPU backend: forward and backward ops
// against double-precision loops in every float dtype, the gradient formulas against finite
// differences, and the errors.
#include <cmath>
#include <limits>

#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

// A shape seen as (outer, len, inner) around `axis`.
struct Split {
  int64_t outer = 1, len = 1, inner = 1;
};
Split split(const Shape& s, int64_t axis) {
  Split r;
  if (s.empty()) return r;
  const int64_t a = axis < 0 ? axis + static_cast<int64_t>(s.size()) : axis;
  for (int64_t i = 0; i < a; ++i) r.outer *= s[static_cast<size_t>(i)];
  r.len = s[static_cast<size_t>(a)];
  for (size_t i = static_cast<size_t>(a) + 1; i < s.size(); ++i) r.inner *= s[i];
  return r;
}

// Calls f(indices of one lane along the axis) for every lane.
template <class F>
void each_lane(const Shape& s, int64_t axis, F&& f) {
  const Split p = split(s, axis);
  std::vector<size_t> idx(static_cast<size_t>(p.len));
  for (int64_t o = 0; o < p.outer; ++o)
    for (int64_t j = 0; j < p.inner; ++j) {
      for (int64_t k = 0; k < p.len; ++k)
        idx[static_cast<size_t>(k)] = static_cast<size_t>((o * p.len + k) * p.inner + j);
      f(idx);
    }
}

std::vector<double> ref_softmax(const std::vector<double>& x, const Shape& s, int64_t axis,
                                bool log) {
  std::vector<double> y(x.size());
  each_lane(s, axis, [&](const std::vector<size_t>& idx) {
    double mx = -INFINITY, sum = 0;
    for (size_t i : idx) mx = std::max(mx, x[i]);
    for (size_t i : idx) sum += std::exp(x[i] - mx);
    for (size_t i : idx) y[i] = log ? x[i] - mx - std::log(sum) : std::exp(x[i] - mx) / sum;
  });
  return y;
}

std::vector<double> ref_softmax_backward(const std::vector<double>& dy,
                                         const std::vector<double>& y, const Shape& s, int64_t axis,
                                         bool log) {
  std::vector<double> dx(dy.size());
  each_lane(s, axis, [&](const std::vector<size_t>& idx) {
    double dot = 0;
    for (size_t i : idx) dot += log ? dy[i] : dy[i] * y[i];
    for (size_t i : idx) dx[i] = log ? dy[i] - std::exp(y[i]) * dot : y[i] * (dy[i] - dot);
  });
  return dx;
}

// Shapes with the axes to test on each; (2, 37, 40) has more inner positions than one tile of
// the kernel (32) and a partial last tile.
struct AxisCase {
  Shape shape;
  std::vector<int64_t> axes;
};
const std::vector<AxisCase> kAxisCases = {
    {{3, 4, 5}, {0, 1, 2, -1, -2, -3}},
    {{1, 7, 1}, {0, 1, 2}},
    {{2, 37, 40}, {0, 1, 2}},
    {{9}, {0, -1}},
    {{1}, {0}},
    {{}, {-1}},
    {{5, 300}, {1}},
};

// Attributes of softmax_cross_entropy(_backward).
Attrs ce_attrs(const std::string& reduction, int64_t ignore_index = -100, double smoothing = 0) {
  return {{"reduction", reduction}, {"ignore_index", ignore_index}, {"label_smoothing", smoothing}};
}

// Labels in [0, C), with every third row (from row 1) set to `ignore_index`.
std::vector<double> make_labels(int64_t n, int64_t c, int64_t ignore_index, uint64_t seed) {
  std::vector<double> l = random_doubles(static_cast<size_t>(n), seed, 0, static_cast<double>(c));
  for (size_t i = 0; i < l.size(); ++i) {
    l[i] = std::floor(l[i]);
    if (i % 3 == 1) l[i] = static_cast<double>(ignore_index);
  }
  return l;
}

// Loss (shape () or (N)) and log_probs of softmax cross-entropy, in double.
struct CeRef {
  std::vector<double> loss, log_probs;
};
CeRef ref_cross_entropy(const std::vector<double>& x, int64_t n, int64_t c,
                        const std::vector<double>& labels, const std::string& reduction,
                        int64_t ignore_index, double eps) {
  CeRef r;
  r.log_probs = ref_softmax(x, {n, c}, 1, true);
  std::vector<double> rows(static_cast<size_t>(n), 0.0);
  double total = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t l = static_cast<int64_t>(labels[static_cast<size_t>(i)]);
    if (l == ignore_index) continue;
    ++counted;
    double li = 0;
    for (int64_t k = 0; k < c; ++k) {
      const double target = (1 - eps) * (k == l ? 1.0 : 0.0) + eps / static_cast<double>(c);
      li -= target * r.log_probs[static_cast<size_t>(i * c + k)];
    }
    rows[static_cast<size_t>(i)] = li;
    total += li;
  }
  if (reduction == "none")
    r.loss = rows;
  else if (reduction == "sum")
    r.loss = {total};
  else
    r.loss = {counted ? total / static_cast<double>(counted) : 0.0};
  return r;
}

}  // namespace

TEST_CASE("softmax and log_softmax forward match the reference along every axis",
          "[cpu][ops][softmax]") {
  for (plx_dtype d : kFloatDtypes) {
    for (const AxisCase& ac : kAxisCases) {
      for (int64_t axis : ac.axes) {
        for (const bool log : {false, true}) {
          const std::string op = log ? "log_softmax" : "softmax";
          INFO(op << " " << dtype_name(d) << " " << shape_string(ac.shape) << " axis " << axis);
          const Tensor x = random_tensor(ac.shape, d, 31, -4, 4);
          const auto want = ref_softmax(x.to_doubles(), ac.shape, axis, log);
          const Tensor y = call(cpu(), op, {x}, {{"axis", axis}}).at(0);
          REQUIRE(y.dtype() == d);
          REQUIRE(y.shape() == ac.shape);
          CHECK_ALLCLOSE(y.to_doubles(), round_to(want, d), tolerance(d));
        }
      }
    }
  }
}

TEST_CASE("softmax and log_softmax are stable for large logits", "[cpu][ops][softmax]") {
  // exp(1000) overflows every float type: only the subtracted maximum keeps these finite.
  for (plx_dtype d : {PLX_F32, PLX_F64}) {
    INFO(dtype_name(d));
    const std::vector<double> v = {1000, 1001, 999, -1000, -1001, -999};
    const Tensor x = from_doubles(v, {2, 3}, d);
    const Tensor y = call(cpu(), "softmax", {x}).at(0);
    const Tensor ly = call(cpu(), "log_softmax", {x}).at(0);
    CHECK_ALLCLOSE(y.to_doubles(), round_to(ref_softmax(v, {2, 3}, -1, false), d), tolerance(d));
    CHECK_ALLCLOSE(ly.to_doubles(), round_to(ref_softmax(v, {2, 3}, -1, true), d), tolerance(d));
  }
}

TEST_CASE("softmax_backward and log_softmax_backward match the reference", "[cpu][ops][softmax]") {
  for (plx_dtype d : kFloatDtypes) {
    for (const AxisCase& ac : kAxisCases) {
      for (int64_t axis : ac.axes) {
        for (const bool log : {false, true}) {
          const std::string op = log ? "log_softmax_backward" : "softmax_backward";
          INFO(op << " " << dtype_name(d) << " " << shape_string(ac.shape) << " axis " << axis);
          // y as the forward would give it: probabilities, or log-probabilities.
          const Tensor x = random_tensor(ac.shape, PLX_F64, 41, -3, 3);
          const auto yv = ref_softmax(x.to_doubles(), ac.shape, axis, log);
          const Tensor y = from_doubles(yv, ac.shape, d);
          const Tensor dy = random_tensor(ac.shape, d, 43);
          const auto want =
              ref_softmax_backward(dy.to_doubles(), y.to_doubles(), ac.shape, axis, log);
          const Tensor dx = call(cpu(), op, {dy, y}, {{"axis", axis}}).at(0);
          REQUIRE(dx.dtype() == d);
          REQUIRE(dx.shape() == ac.shape);
          CHECK_ALLCLOSE(dx.to_doubles(), round_to(want, d), tolerance(d));
        }
      }
    }
  }
}

TEST_CASE("softmax and log_softmax gradients match finite differences",
          "[cpu][ops][softmax][grad]") {
  const std::vector<AxisCase> cases = {
      {{2, 3, 4}, {0, 1, 2, -1}}, {{1, 5, 1}, {1, -3}}, {{3, 1}, {0, 1}}, {{7}, {0}}};
  for (const AxisCase& ac : cases) {
    for (int64_t axis : ac.axes) {
      INFO(shape_string(ac.shape) << " axis " << axis);
      const Tensor x = random_tensor(ac.shape, PLX_F64, 5, -2, 2);
      check_gradients("softmax", {x}, {{"axis", axis}});
      check_gradients("log_softmax", {x}, {{"axis", axis}});
    }
  }
}

TEST_CASE("softmax_cross_entropy forward matches the reference", "[cpu][ops][softmax]") {
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1}, {5, 7}, {8, 3}, {33, 40}};
  for (plx_dtype d : kFloatDtypes) {
    for (const auto& [n, c] : sizes) {
      for (const std::string reduction : {"mean", "sum", "none"}) {
        for (const double eps : {0.0, 0.1}) {
          for (const plx_dtype ld : {PLX_I32, PLX_I64}) {
            // -100 outside the classes, and a class (0) used as the ignored label.
            for (const int64_t ignore : {int64_t{-100}, int64_t{0}}) {
              INFO(dtype_name(d) << " (" << n << ", " << c << ") " << reduction << " eps " << eps
                                 << " labels " << dtype_name(ld) << " ignore " << ignore);
              const Tensor x = random_tensor({n, c}, d, 51, -3, 3);
              const auto lv = make_labels(n, c, ignore, 52);
              const Tensor labels = from_doubles(lv, {n}, ld);
              const CeRef want =
                  ref_cross_entropy(x.to_doubles(), n, c, lv, reduction, ignore, eps);
              const auto out = call(cpu(), "softmax_cross_entropy", {x, labels},
                                    ce_attrs(reduction, ignore, eps));
              REQUIRE(out.size() == 2);
              REQUIRE(out[0].dtype() == d);
              REQUIRE(out[0].shape() == (reduction == "none" ? Shape{n} : Shape{}));
              REQUIRE(out[1].shape() == Shape{n, c});
              CHECK_ALLCLOSE(out[0].to_doubles(), round_to(want.loss, d), tolerance(d));
              CHECK_ALLCLOSE(out[1].to_doubles(), round_to(want.log_probs, d), tolerance(d));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("softmax_cross_entropy with every row ignored gives 0", "[cpu][ops][softmax]") {
  // PyTorch gives nan for the mean here; we give 0 (docs/ops.md) so that a batch of padding
  // does not poison the running loss.
  const Tensor x = random_tensor({3, 4}, PLX_F32, 1);
  const Tensor labels = from_doubles({-100, -100, -100}, {3}, PLX_I64);
  for (const std::string reduction : {"mean", "sum", "none"}) {
    INFO(reduction);
    const auto out = call(cpu(), "softmax_cross_entropy", {x, labels}, ce_attrs(reduction));
    for (double v : out[0].to_doubles()) CHECK(v == 0.0);
    const Tensor dloss = random_tensor(out[0].shape(), PLX_F32, 2);
    const Tensor dx =
        call(cpu(), "softmax_cross_entropy_backward", {dloss, out[1], labels}, ce_attrs(reduction))
            .at(0);
    for (double v : dx.to_doubles()) CHECK(v == 0.0);
  }
}

TEST_CASE("softmax_cross_entropy_backward matches the reference", "[cpu][ops][softmax]") {
  for (plx_dtype d : kFloatDtypes) {
    for (const auto& [n, c] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {6, 5}, {17, 31}}) {
      for (const std::string reduction : {"mean", "sum", "none"}) {
        for (const double eps : {0.0, 0.2}) {
          for (const plx_dtype ld : {PLX_I32, PLX_I64}) {
            INFO(dtype_name(d) << " (" << n << ", " << c << ") " << reduction << " eps " << eps
                               << " labels " << dtype_name(ld));
            const int64_t ignore = 3;
            const auto lv = make_labels(n, c, ignore, 61);
            const Tensor labels = from_doubles(lv, {n}, ld);
            const auto lp =
                ref_softmax(random_doubles(static_cast<size_t>(n * c), 62, -3, 3), {n, c}, 1, true);
            const Tensor log_probs = from_doubles(lp, {n, c}, d);
            const Tensor dloss = random_tensor(reduction == "none" ? Shape{n} : Shape{}, d, 63);
            const auto lpv = log_probs.to_doubles(), gv = dloss.to_doubles();
            int64_t counted = 0;
            for (double l : lv) counted += static_cast<int64_t>(l) != ignore;
            std::vector<double> want(lpv.size(), 0.0);
            for (int64_t i = 0; i < n; ++i) {
              const int64_t l = static_cast<int64_t>(lv[static_cast<size_t>(i)]);
              if (l == ignore) continue;
              const double g = reduction == "none"  ? gv[static_cast<size_t>(i)]
                               : reduction == "sum" ? gv[0]
                                                    : gv[0] / static_cast<double>(counted);
              for (int64_t k = 0; k < c; ++k) {
                const size_t j = static_cast<size_t>(i * c + k);
                want[j] =
                    g * (std::exp(lpv[j]) - (1 - eps) * (k == l) - eps / static_cast<double>(c));
              }
            }
            const Tensor dx = call(cpu(), "softmax_cross_entropy_backward",
                                   {dloss, log_probs, labels}, ce_attrs(reduction, ignore, eps))
                                  .at(0);
            REQUIRE(dx.dtype() == d);
            REQUIRE(dx.shape() == Shape{n, c});
            CHECK_ALLCLOSE(dx.to_doubles(), round_to(want, d), tolerance(d));
          }
        }
      }
    }
  }
}

TEST_CASE("softmax_cross_entropy gradients match finite differences", "[cpu][ops][softmax][grad]") {
  for (const auto& [n, c] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 4}, {5, 3}}) {
    for (const std::string reduction : {"mean", "sum", "none"}) {
      for (const double eps : {0.0, 0.25}) {
        for (const int64_t ignore : {int64_t{-100}, int64_t{2}}) {
          INFO("(" << n << ", " << c << ") " << reduction << " eps " << eps << " ignore "
                   << ignore);
          const Tensor x = random_tensor({n, c}, PLX_F64, 71, -2, 2);
          const Tensor labels = from_doubles(make_labels(n, c, ignore, 72), {n}, PLX_I64);
          check_gradients("softmax_cross_entropy", {x, labels}, ce_attrs(reduction, ignore, eps));
        }
      }
    }
  }
}

TEST_CASE("softmax ops reject bad axes and shapes", "[cpu][ops][softmax][errors]") {
  const Tensor x = random_tensor({2, 3, 4}, PLX_F32, 1);
  REQUIRE_THROWS_WITH(call(cpu(), "softmax", {x}, {{"axis", int64_t{3}}}),
                      PLX_CONTAINS("softmax") && PLX_CONTAINS("axis 3 is out of range"));
  REQUIRE_THROWS_WITH(call(cpu(), "log_softmax", {x}, {{"axis", int64_t{-4}}}),
                      PLX_CONTAINS("log_softmax") && PLX_CONTAINS("axis -4 is out of range"));
  REQUIRE_THROWS_WITH(call(cpu(), "softmax_backward", {x, random_tensor({2, 3}, PLX_F32, 2)}),
                      PLX_CONTAINS("softmax_backward") && PLX_CONTAINS("differ in shape"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "log_softmax_backward", {x, random_tensor({2, 3, 4}, PLX_F64, 2)}),
      PLX_CONTAINS("input 'y' is f64, expected f32"));
  REQUIRE_THROWS_WITH(call(cpu(), "softmax", {random_ints({3}, PLX_I64, 1, 0, 4)}),
                      PLX_CONTAINS("expected one of"));
}

TEST_CASE("softmax_cross_entropy rejects bad labels and attributes",
          "[cpu][ops][softmax][errors]") {
  const std::string op = "softmax_cross_entropy";
  const Tensor x = random_tensor({4, 5}, PLX_F32, 1);
  const Tensor good = from_doubles({0, 4, 2, 1}, {4}, PLX_I64);
  REQUIRE_THROWS_WITH(
      call(cpu(), op, {x, from_doubles({0, 4, 2, 1}, {4, 1}, PLX_I64)}),
      PLX_CONTAINS(op) && PLX_CONTAINS("labels must be (N) = (4)") && PLX_CONTAINS("got (4, 1)"));
  REQUIRE_THROWS_WITH(call(cpu(), op, {x, from_doubles({0, 1, 2}, {3}, PLX_I64)}),
                      PLX_CONTAINS("labels must be (N) = (4)"));
  REQUIRE_THROWS_WITH(call(cpu(), op, {x, from_doubles({0, 4, 2, 1}, {4}, PLX_F32)}),
                      PLX_CONTAINS("input 'labels' is f32, expected one of i32|i64"));
  REQUIRE_THROWS_WITH(call(cpu(), op, {random_tensor({2, 3, 4}, PLX_F32, 1), good}),
                      PLX_CONTAINS("logits must be (N, C), got (2, 3, 4)"));
  // Out of range, naming the row and the label; -1 is not the ignore_index (-100) either.
  for (const plx_dtype ld : {PLX_I32, PLX_I64}) {
    REQUIRE_THROWS_WITH(
        call(cpu(), op, {x, from_doubles({0, 4, 5, 1}, {4}, ld)}),
        PLX_CONTAINS(op) && PLX_CONTAINS("row 2 has label 5") && PLX_CONTAINS("outside [0, 5)"));
    REQUIRE_THROWS_WITH(call(cpu(), op, {x, from_doubles({0, 4, 3, -1}, {4}, ld)}),
                        PLX_CONTAINS("row 3 has label -1"));
  }
  REQUIRE_THROWS_WITH(call(cpu(), op, {x, good}, ce_attrs("avg")),
                      PLX_CONTAINS(op) && PLX_CONTAINS("reduction must be"));
  REQUIRE_THROWS_WITH(call(cpu(), op, {x, good}, ce_attrs("mean", -100, 1.5)),
                      PLX_CONTAINS("label_smoothing must be in [0, 1]"));

  const std::string bwd = "softmax_cross_entropy_backward";
  const Tensor lp = random_tensor({4, 5}, PLX_F32, 2);
  REQUIRE_THROWS_WITH(call(cpu(), bwd, {random_tensor({4}, PLX_F32, 3), lp, good}),
                      PLX_CONTAINS(bwd) && PLX_CONTAINS("dloss must be ()"));
  REQUIRE_THROWS_WITH(call(cpu(), bwd, {random_tensor({}, PLX_F32, 3), lp, good}, ce_attrs("none")),
                      PLX_CONTAINS("dloss must be (4)"));
  REQUIRE_THROWS_WITH(
      call(cpu(), bwd,
           {random_tensor({}, PLX_F32, 3), lp, from_doubles({0, 9, 2, 1}, {4}, PLX_I32)}),
      PLX_CONTAINS(bwd) && PLX_CONTAINS("row 1 has label 9"));
}
