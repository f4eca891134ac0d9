// Matrix products on the CPU backend: matmul and linear against double-precision loops in every
// float dtype, their gradient formulas against finite differences, and the shape errors.
#include <cmath>

#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

// Result of a reference product: values and shape.
struct Ref {
  std::vector<double> v;
  Shape shape;
};

// Row-major strides of a shape, with 0 for dims of size 1 (they broadcast).
std::vector<int64_t> broadcast_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t n = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = s[i] == 1 ? 0 : n;
    n *= s[i];
  }
  return st;
}

// y = alpha op(a) op(b) with NumPy batch broadcasting, in double.
Ref ref_matmul(const std::vector<double>& a, const Shape& as, const std::vector<double>& b,
               const Shape& bs, bool ta, bool tb, double alpha) {
  const size_t ra = as.size(), rb = bs.size();
  const int64_t M = ta ? as[ra - 1] : as[ra - 2], K = ta ? as[ra - 2] : as[ra - 1];
  const int64_t N = tb ? bs[rb - 2] : bs[rb - 1];
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const size_t nb = std::max(ab.size(), bb.size());
  Shape batch(nb), pa(nb, 1), pb(nb, 1);  // batch dims of y, a and b aligned at the right
  for (size_t i = 0; i < nb; ++i) {
    if (i >= nb - ab.size()) pa[i] = ab[i - (nb - ab.size())];
    if (i >= nb - bb.size()) pb[i] = bb[i - (nb - bb.size())];
    batch[i] = pa[i] == 1 ? pb[i] : pa[i];
  }
  const auto sa = broadcast_strides(pa), sb = broadcast_strides(pb);
  const int64_t nbatch = shape_numel(batch);
  Ref r;
  r.shape = batch;
  r.shape.push_back(M);
  r.shape.push_back(N);
  r.v.assign(static_cast<size_t>(nbatch * M * N), 0.0);
  for (int64_t t = 0; t < nbatch; ++t) {
    int64_t oa = 0, ob = 0;
    for (size_t d = nb, rem = static_cast<size_t>(t); d-- > 0;) {
      const int64_t k = static_cast<int64_t>(rem) % batch[d];
      rem /= static_cast<size_t>(batch[d]);
      oa += k * sa[d];
      ob += k * sb[d];
    }
    const double* A = a.data() + oa * M * K;
    const double* B = b.data() + ob * K * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += (ta ? A[k * M + m] : A[m * K + k]) * (tb ? B[n * K + k] : B[k * N + n]);
        r.v[static_cast<size_t>((t * M + m) * N + n)] = alpha * acc;
      }
  }
  return r;
}

// Operand shape for logical (batch..., rows, cols), stored transposed if `trans`.
Shape stored(Shape s, bool trans) {
  if (trans) std::swap(s[s.size() - 1], s[s.size() - 2]);
  return s;
}

// f32 accumulation error grows with the length of the dot products: about sqrt(K) roundings of
// random sign add up, so the absolute tolerance scales with sqrt(K) (and with |alpha|, which
// scales the result).
Tol dot_tolerance(plx_dtype d, int64_t K, double alpha = 1.0) {
  Tol t = tolerance(d);
  t.atol *=
      std::sqrt(static_cast<double>(std::max<int64_t>(K, 1))) * std::max(std::fabs(alpha), 1.0);
  return t;
}

struct MatmulCase {
  Shape a, b;  // logical: a (..., M, K), b (..., K, N)
};

const std::vector<MatmulCase> kMatmulCases = {
    {{1, 1}, {1, 1}},              // M = N = K = 1
    {{3, 5}, {5, 7}},              // odd sizes
    {{1, 4}, {4, 1}},              // a row times a column
    {{7, 1}, {1, 9}},              // K = 1: outer product
    {{17, 33}, {33, 13}},          // sizes BLAS kernels do not tile evenly
    {{2, 1, 3, 4}, {5, 4, 6}},     // batch (2, 1) x (5) -> (2, 5)
    {{4, 3, 5}, {5, 2}},           // b shared by the batch (one folded GEMM when a is not trans)
    {{3, 5}, {2, 5, 4}},           // a shared by the batch
    {{2, 3, 2, 3}, {1, 3, 3, 2}},  // batch dims of 1 on one side
    {{16, 8, 9}, {16, 9, 7}},      // many small GEMMs: spread over the batch
    {{2, 70, 80}, {80, 65}},       // large enough for OpenBLAS to thread each GEMM
    {{0, 2, 3}, {3, 4}},           // empty batch
};

}  // namespace

TEST_CASE("matmul forward matches a double loop for every transpose combination",
          "[cpu][ops][gemm]") {
  for (plx_dtype d : kFloatDtypes) {
    for (const MatmulCase& mc : kMatmulCases) {
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        const double alpha = t == 3 ? -0.75 : (t == 1 ? 2.0 : 1.0);
        const Shape as = stored(mc.a, ta), bs = stored(mc.b, tb);
        INFO(dtype_name(d) << " a " << shape_string(as) << " b " << shape_string(bs) << " trans_a "
                           << ta << " trans_b " << tb << " alpha " << alpha);
        const Tensor a = random_tensor(as, d, 11 + t);
        const Tensor b = random_tensor(bs, d, 23 + t);
        const Ref want = ref_matmul(a.to_doubles(), as, b.to_doubles(), bs, ta, tb, alpha);
        const Tensor y =
            call(cpu(), "matmul", {a, b},
                 {{"trans_a", int64_t{ta}}, {"trans_b", int64_t{tb}}, {"alpha", alpha}})
                .at(0);
        REQUIRE(y.dtype() == d);
        REQUIRE(y.shape() == want.shape);
        CHECK_ALLCLOSE(y.to_doubles(), round_to(want.v, d), dot_tolerance(d, mc.a.back(), alpha));
      }
    }
  }
}

TEST_CASE("linear forward matches a double loop, with and without bias", "[cpu][ops][gemm]") {
  const std::vector<Shape> x_shapes = {{5}, {1, 5}, {4, 5}, {2, 3, 5}, {0, 5}};
  for (plx_dtype d : kFloatDtypes) {
    for (const Shape& xs : x_shapes) {
      for (const int64_t out : {int64_t{1}, int64_t{7}}) {
        for (const bool bias : {false, true}) {
          const int64_t in = xs.back();
          INFO(dtype_name(d) << " x " << shape_string(xs) << " out " << out << " bias " << bias);
          const Tensor x = random_tensor(xs, d, 3);
          const Tensor w = random_tensor({out, in}, d, 4);
          const Tensor b = bias ? random_tensor({out}, d, 5) : Tensor();
          const auto xv = x.to_doubles(), wv = w.to_doubles();
          const auto bv = bias ? b.to_doubles() : std::vector<double>(static_cast<size_t>(out));
          const int64_t rows = shape_numel(xs) / in;
          std::vector<double> want(static_cast<size_t>(rows * out));
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t o = 0; o < out; ++o) {
              double acc = bv[static_cast<size_t>(o)];
              for (int64_t i = 0; i < in; ++i)
                acc += xv[static_cast<size_t>(r * in + i)] * wv[static_cast<size_t>(o * in + i)];
              want[static_cast<size_t>(r * out + o)] = acc;
            }
          Shape ys = xs;
          ys.back() = out;
          const Tensor y = call(cpu(), "linear", {x, w, b}).at(0);
          REQUIRE(y.dtype() == d);
          REQUIRE(y.shape() == ys);
          CHECK_ALLCLOSE(y.to_doubles(), round_to(want, d), dot_tolerance(d, in + 1));
        }
      }
    }
  }
}

TEST_CASE("matmul gradients match finite differences", "[cpu][ops][gemm][grad]") {
  const std::vector<MatmulCase> cases = {
      {{1, 1}, {1, 1}},          {{3, 5}, {5, 2}},
      {{2, 1, 3, 4}, {5, 4, 2}},  // a broadcast over 5, b over 2: both gradients sum_to
      {{3, 2, 3}, {3, 1}},        // b shared by the batch
      {{1, 3}, {2, 3, 1}},        // a shared by the batch
  };
  for (const MatmulCase& mc : cases) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const double alpha = t == 0 ? 1.0 : -1.5;
      const Shape as = stored(mc.a, ta), bs = stored(mc.b, tb);
      INFO("a " << shape_string(as) << " b " << shape_string(bs) << " trans_a " << ta << " trans_b "
                << tb);
      check_gradients("matmul", {random_tensor(as, PLX_F64, 7), random_tensor(bs, PLX_F64, 8)},
                      {{"trans_a", int64_t{ta}}, {"trans_b", int64_t{tb}}, {"alpha", alpha}});
    }
  }
}

TEST_CASE("linear gradients match finite differences", "[cpu][ops][gemm][grad]") {
  for (const Shape& xs : {Shape{3}, Shape{1, 3}, Shape{4, 3}, Shape{2, 3, 3}}) {
    for (const int64_t out : {int64_t{1}, int64_t{5}}) {
      INFO("x " << shape_string(xs) << " out " << out);
      const Tensor x = random_tensor(xs, PLX_F64, 1);
      const Tensor w = random_tensor({out, xs.back()}, PLX_F64, 2);
      check_gradients("linear", {x, w});
      check_gradients("linear", {x, w, random_tensor({out}, PLX_F64, 3)});
    }
  }
}

TEST_CASE("matmul rejects bad shapes and dtypes", "[cpu][ops][gemm][errors]") {
  const Tensor a = random_tensor({2, 3}, PLX_F32, 1);
  const Tensor b = random_tensor({4, 5}, PLX_F32, 2);
  REQUIRE_THROWS_WITH(call(cpu(), "matmul", {a, b}),
                      PLX_CONTAINS("matmul") && PLX_CONTAINS("inner dimensions differ") &&
                          PLX_CONTAINS("a (2, 3)") && PLX_CONTAINS("b (4, 5)"));
  // With trans_b, b (4, 5) is (N, K) = K 5: still not a's 3, and the message says trans_b.
  REQUIRE_THROWS_WITH(call(cpu(), "matmul", {a, b}, {{"trans_b", int64_t{1}}}),
                      PLX_CONTAINS("b (4, 5) with trans_b"));
  const Tensor v = random_tensor({3}, PLX_F32, 3);
  REQUIRE_THROWS_WITH(call(cpu(), "matmul", {v, random_tensor({3, 2}, PLX_F32, 4)}),
                      PLX_CONTAINS("matmul") && PLX_CONTAINS("at least 2 dimensions"));
  REQUIRE_THROWS_WITH(call(cpu(), "matmul", {a, v}), PLX_CONTAINS("at least 2 dimensions"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "matmul",
           {random_tensor({2, 2, 3}, PLX_F32, 5), random_tensor({3, 3, 4}, PLX_F32, 6)}),
      PLX_CONTAINS("batch dimensions") && PLX_CONTAINS("do not broadcast"));
  REQUIRE_THROWS_WITH(call(cpu(), "matmul", {a, random_tensor({3, 2}, PLX_F64, 7)}),
                      PLX_CONTAINS("input 'b' is f64, expected f32"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "matmul",
           {random_ints({2, 3}, PLX_I32, 1, 0, 3), random_ints({3, 2}, PLX_I32, 2, 0, 3)}),
      PLX_CONTAINS("expected one of"));
}

TEST_CASE("linear rejects bad shapes", "[cpu][ops][gemm][errors]") {
  const Tensor x = random_tensor({4, 3}, PLX_F32, 1);
  REQUIRE_THROWS_WITH(call(cpu(), "linear", {x, random_tensor({5, 4}, PLX_F32, 2)}),
                      PLX_CONTAINS("linear") && PLX_CONTAINS("x (4, 3) has 3 features") &&
                          PLX_CONTAINS("w (5, 4) expects 4"));
  REQUIRE_THROWS_WITH(call(cpu(), "linear", {x, random_tensor({3}, PLX_F32, 2)}),
                      PLX_CONTAINS("w must be (out, in)"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "linear", {x, random_tensor({5, 3}, PLX_F32, 2), random_tensor({4}, PLX_F32, 3)}),
      PLX_CONTAINS("b must be (out) = (5)"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "linear", {random_tensor({}, PLX_F32, 1), random_tensor({5, 1}, PLX_F32, 2)}),
      PLX_CONTAINS("at least 1 dimension"));
}
