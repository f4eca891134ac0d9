// Normalisation on the CPU backend: batch_norm and layer_norm forward (training and eval, with and
// without affine parameters, f32 parameters with 16-bit activations) against double-precision
// loops, the running-statistics update against PyTorch's definition, the backward ops against
// their own reference, and the core's gradient formulas against finite differences.
#include <cmath>
#include <optional>

#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

// ---- references ----

// x (N, C, S...) as (N, C, S).
struct NCS {
  int64_t n, c, s = 1;
  explicit NCS(const Shape& x) : n(x[0]), c(x[1]) {
    for (size_t i = 2; i < x.size(); ++i) s *= x[i];
  }
  int64_t at(int64_t in, int64_t ic, int64_t is) const { return (in * c + ic) * s + is; }
};

struct BnRef {
  std::vector<double> y, mean, invstd, running_mean, running_var;
};

// batch_norm in double. gamma/beta empty when absent; running stats empty when absent.
BnRef ref_batch_norm(const std::vector<double>& x, const Shape& shape,
                     const std::vector<double>& gamma, const std::vector<double>& beta,
                     std::vector<double> rm, std::vector<double> rv, bool training, double momentum,
                     double eps) {
  const NCS d(shape);
  const double m = static_cast<double>(d.n * d.s);
  BnRef r;
  r.y.resize(x.size());
  for (int64_t c = 0; c < d.c; ++c) {
    double mean, var;
    if (training) {
      double sum = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t s = 0; s < d.s; ++s) sum += x[static_cast<size_t>(d.at(n, c, s))];
      mean = sum / m;
      double sq = 0;
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t s = 0; s < d.s; ++s) {
          const double dv = x[static_cast<size_t>(d.at(n, c, s))] - mean;
          sq += dv * dv;
        }
      var = sq / m;
      if (!rm.empty()) {
        // PyTorch: running = (1 - momentum) * running + momentum * batch, unbiased variance.
        rm[c] = (1 - momentum) * rm[c] + momentum * mean;
        rv[c] = (1 - momentum) * rv[c] + momentum * sq / (m - 1);
      }
    } else {
      mean = rm[c];
      var = rv[c];
    }
    const double invstd = 1 / std::sqrt(var + eps);
    r.mean.push_back(mean);
    r.invstd.push_back(invstd);
    const double g = gamma.empty() ? 1 : gamma[c], b = beta.empty() ? 0 : beta[c];
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t s = 0; s < d.s; ++s) {
        const size_t i = static_cast<size_t>(d.at(n, c, s));
        r.y[i] = (x[i] - mean) * invstd * g + b;
      }
  }
  r.running_mean = rm;
  r.running_var = rv;
  return r;
}

struct Grads {
  std::vector<double> dx, dgamma, dbeta;
};

Grads ref_batch_norm_backward(const std::vector<double>& dy, const std::vector<double>& x,
                              const Shape& shape, const std::vector<double>& gamma,
                              const std::vector<double>& mean, const std::vector<double>& invstd,
                              bool training) {
  const NCS d(shape);
  const double m = static_cast<double>(d.n * d.s);
  Grads r;
  r.dx.resize(x.size());
  for (int64_t c = 0; c < d.c; ++c) {
    double sdy = 0, sdyx = 0;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t s = 0; s < d.s; ++s) {
        const size_t i = static_cast<size_t>(d.at(n, c, s));
        sdy += dy[i];
        sdyx += dy[i] * (x[i] - mean[c]) * invstd[c];
      }
    r.dgamma.push_back(sdyx);
    r.dbeta.push_back(sdy);
    const double g = gamma.empty() ? 1 : gamma[c];
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t s = 0; s < d.s; ++s) {
        const size_t i = static_cast<size_t>(d.at(n, c, s));
        const double xhat = (x[i] - mean[c]) * invstd[c];
        r.dx[i] =
            training ? g * invstd[c] * (dy[i] - sdy / m - xhat * sdyx / m) : g * invstd[c] * dy[i];
      }
  }
  return r;
}

// x (R, D) with D the product of the trailing k dims.
std::pair<int64_t, int64_t> rows_cols(const Shape& s, int k) {
  int64_t r = 1, d = 1;
  for (size_t i = 0; i < s.size(); ++i)
    (static_cast<int>(i) < static_cast<int>(s.size()) - k ? r : d) *= s[i];
  return {r, d};
}

BnRef ref_layer_norm(const std::vector<double>& x, const Shape& shape, int k,
                     const std::vector<double>& gamma, const std::vector<double>& beta,
                     double eps) {
  const auto [R, D] = rows_cols(shape, k);
  BnRef r;
  r.y.resize(x.size());
  for (int64_t row = 0; row < R; ++row) {
    double sum = 0;
    for (int64_t j = 0; j < D; ++j) sum += x[static_cast<size_t>(row * D + j)];
    const double mean = sum / static_cast<double>(D);
    double sq = 0;
    for (int64_t j = 0; j < D; ++j) {
      const double dv = x[static_cast<size_t>(row * D + j)] - mean;
      sq += dv * dv;
    }
    const double invstd = 1 / std::sqrt(sq / static_cast<double>(D) + eps);
    r.mean.push_back(mean);
    r.invstd.push_back(invstd);
    for (int64_t j = 0; j < D; ++j) {
      const size_t i = static_cast<size_t>(row * D + j);
      r.y[i] = (x[i] - mean) * invstd * (gamma.empty() ? 1 : gamma[static_cast<size_t>(j)]) +
               (beta.empty() ? 0 : beta[static_cast<size_t>(j)]);
    }
  }
  return r;
}

Grads ref_layer_norm_backward(const std::vector<double>& dy, const std::vector<double>& x,
                              const Shape& shape, int k, const std::vector<double>& gamma,
                              const std::vector<double>& mean, const std::vector<double>& invstd) {
  const auto [R, D] = rows_cols(shape, k);
  Grads r;
  r.dx.resize(x.size());
  r.dgamma.assign(static_cast<size_t>(D), 0);
  r.dbeta.assign(static_cast<size_t>(D), 0);
  for (int64_t row = 0; row < R; ++row) {
    const size_t ri = static_cast<size_t>(row);
    double sg = 0, sgx = 0;
    for (int64_t j = 0; j < D; ++j) {
      const size_t i = static_cast<size_t>(row * D + j);
      const double xhat = (x[i] - mean[ri]) * invstd[ri];
      const double g = dy[i] * (gamma.empty() ? 1 : gamma[static_cast<size_t>(j)]);
      sg += g;
      sgx += g * xhat;
      r.dgamma[static_cast<size_t>(j)] += dy[i] * xhat;
      r.dbeta[static_cast<size_t>(j)] += dy[i];
    }
    for (int64_t j = 0; j < D; ++j) {
      const size_t i = static_cast<size_t>(row * D + j);
      const double xhat = (x[i] - mean[ri]) * invstd[ri];
      const double g = dy[i] * (gamma.empty() ? 1 : gamma[static_cast<size_t>(j)]);
      r.dx[i] =
          invstd[ri] * (g - sg / static_cast<double>(D) - xhat * sgx / static_cast<double>(D));
    }
  }
  return r;
}

std::vector<double> values(const Tensor& t) {
  return t.defined() ? t.to_doubles() : std::vector<double>{};
}
plx_dtype stat_dtype(plx_dtype d) {
  return d == PLX_F64 ? PLX_F64 : PLX_F32;
}

// Tolerance of a result stored in `d` whose reference sums `n` terms of order one: the rounding
// of the stored inputs (already in the reference) aside, f32 accumulation error grows like
// sqrt(n), so atol is scaled by it.
Tol scaled(plx_dtype d, int64_t n) {
  Tol t = tolerance(d);
  t.atol *= std::sqrt(static_cast<double>(std::max<int64_t>(n, 1)));
  return t;
}

const std::vector<Shape> kBnShapes = {{2, 3},       {4, 3, 5}, {2, 3, 4, 5},   {1, 1, 3},
                                      {3, 1, 2, 1}, {5, 7, 3}, {2, 2, 1, 1, 3}};

// Which affine parameters a case has, and their dtype (T or f32).
struct Affine {
  bool gamma, beta, f32;
};
const std::vector<Affine> kAffine = {{false, false, false},
                                     {true, false, false},
                                     {true, true, false},
                                     {true, true, true},
                                     {false, true, true}};

}  // namespace

// ---- batch_norm ----

TEST_CASE("batch_norm training forward and running statistics match the reference",
          "[cpu][ops][norm]") {
  const double momentum = 0.3, eps = 1e-3;
  for (plx_dtype d : kFloatDtypes) {
    for (const Shape& shape : kBnShapes) {
      for (const Affine& a : kAffine) {
        for (bool running : {false, true}) {
          INFO(dtype_name(d) << " " << shape_string(shape) << " gamma " << a.gamma << " beta "
                             << a.beta << " f32 params " << a.f32 << " running " << running);
          const int64_t C = shape[1];
          const plx_dtype pd = a.f32 ? PLX_F32 : d;
          const Tensor x = random_tensor(shape, d, 11, -2, 3);
          const Tensor g = a.gamma ? random_tensor({C}, pd, 12, 0.5, 2) : Tensor();
          const Tensor b = a.beta ? random_tensor({C}, pd, 13) : Tensor();
          const Tensor rm = running ? random_tensor({C}, pd, 14) : Tensor();
          const Tensor rv = running ? random_tensor({C}, pd, 15, 0.5, 2) : Tensor();
          const std::vector<double> rm0 = values(rm), rv0 = values(rv);
          const auto outs =
              call(cpu(), "batch_norm", {x, g, b, rm, rv}, {{"momentum", momentum}, {"eps", eps}});
          const BnRef want = ref_batch_norm(x.to_doubles(), shape, values(g), values(b), rm0, rv0,
                                            true, momentum, eps);
          REQUIRE(outs.size() == 3);
          REQUIRE(outs[0].dtype() == d);
          REQUIRE(outs[0].shape() == shape);
          REQUIRE(outs[1].dtype() == stat_dtype(d));
          REQUIRE(outs[1].shape() == Shape{C});
          CHECK_ALLCLOSE(outs[0].to_doubles(), round_to(want.y, d), tolerance(d));
          CHECK_ALLCLOSE(outs[1].to_doubles(), want.mean, tolerance(stat_dtype(d)));
          CHECK_ALLCLOSE(outs[2].to_doubles(), want.invstd, tolerance(stat_dtype(d)));
          if (running) {
            CHECK_ALLCLOSE(rm.to_doubles(), round_to(want.running_mean, pd), tolerance(pd));
            CHECK_ALLCLOSE(rv.to_doubles(), round_to(want.running_var, pd), tolerance(pd));
          }
        }
      }
    }
  }
}

TEST_CASE("batch_norm running statistics follow PyTorch over several steps", "[cpu][ops][norm]") {
  // Three training steps with defaults (momentum 0.1): running_mean starts at 0, running_var at
  // 1, as torch.nn.BatchNorm2d initialises them; each step blends in the batch mean and the
  // unbiased batch variance.
  const Shape shape = {3, 4, 2, 5};
  const Tensor rm = from_doubles(std::vector<double>(4, 0.0), {4}, PLX_F64);
  const Tensor rv = from_doubles(std::vector<double>(4, 1.0), {4}, PLX_F64);
  std::vector<double> want_m(4, 0.0), want_v(4, 1.0);
  for (uint64_t step = 0; step < 3; ++step) {
    const Tensor x = random_tensor(shape, PLX_F64, 100 + step, -1, 4);
    call(cpu(), "batch_norm", {x, Tensor(), Tensor(), rm, rv});
    const std::vector<double> xs = x.to_doubles();
    for (int64_t c = 0; c < 4; ++c) {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < 3; ++n)
        for (int64_t s = 0; s < 10; ++s) sum += xs[static_cast<size_t>((n * 4 + c) * 10 + s)];
      const double mean = sum / 30;
      for (int64_t n = 0; n < 3; ++n)
        for (int64_t s = 0; s < 10; ++s) {
          const double dv = xs[static_cast<size_t>((n * 4 + c) * 10 + s)] - mean;
          sq += dv * dv;
        }
      want_m[c] = 0.9 * want_m[c] + 0.1 * mean;
      want_v[c] = 0.9 * want_v[c] + 0.1 * sq / 29;
    }
    CHECK_ALLCLOSE(rm.to_doubles(), want_m, tolerance(PLX_F64));
    CHECK_ALLCLOSE(rv.to_doubles(), want_v, tolerance(PLX_F64));
  }
}

TEST_CASE("batch_norm eval forward uses the running statistics and leaves them alone",
          "[cpu][ops][norm]") {
  const double eps = 1e-2;
  for (plx_dtype d : kFloatDtypes) {
    for (const Shape& shape : {Shape{2, 3}, Shape{1, 4, 3, 3}, Shape{3, 1, 5}, Shape{1, 2}}) {
      for (bool f32 : {false, true}) {
        INFO(dtype_name(d) << " " << shape_string(shape) << " f32 params " << f32);
        const int64_t C = shape[1];
        const plx_dtype pd = f32 ? PLX_F32 : d;
        const Tensor x = random_tensor(shape, d, 21, -2, 2);
        const Tensor g = random_tensor({C}, pd, 22, 0.5, 2);
        const Tensor b = random_tensor({C}, pd, 23);
        const Tensor rm = random_tensor({C}, pd, 24);
        const Tensor rv = random_tensor({C}, pd, 25, 0.2, 3);
        const std::vector<double> rm0 = rm.to_doubles(), rv0 = rv.to_doubles();
        const auto outs =
            call(cpu(), "batch_norm", {x, g, b, rm, rv}, {{"training", int64_t{0}}, {"eps", eps}});
        const BnRef want = ref_batch_norm(x.to_doubles(), shape, g.to_doubles(), b.to_doubles(),
                                          rm0, rv0, false, 0.1, eps);
        CHECK_ALLCLOSE(outs[0].to_doubles(), round_to(want.y, d), tolerance(d));
        CHECK_ALLCLOSE(outs[1].to_doubles(), want.mean, tolerance(stat_dtype(d)));
        CHECK_ALLCLOSE(outs[2].to_doubles(), want.invstd, tolerance(stat_dtype(d)));
        CHECK(rm.to_doubles() == rm0);
        CHECK(rv.to_doubles() == rv0);
      }
    }
  }
}

TEST_CASE("batch_norm_backward matches the reference in every dtype", "[cpu][ops][norm]") {
  for (plx_dtype d : kFloatDtypes) {
    for (const Shape& shape : kBnShapes) {
      for (bool training : {true, false}) {
        for (bool has_gamma : {false, true}) {
          INFO(dtype_name(d) << " " << shape_string(shape) << " training " << training << " gamma "
                             << has_gamma);
          const int64_t C = shape[1];
          const Tensor x = random_tensor(shape, d, 31, -2, 2);
          const Tensor dy = random_tensor(shape, d, 32);
          const Tensor g = has_gamma ? random_tensor({C}, d, 33, 0.5, 2) : Tensor();
          // The saved statistics as the forward gives them.
          const Tensor rm = random_tensor({C}, d, 34), rv = random_tensor({C}, d, 35, 0.5, 2);
          const auto fwd = call(cpu(), "batch_norm", {x, g, Tensor(), rm, rv},
                                {{"training", int64_t{training}}});
          const auto outs = call(cpu(), "batch_norm_backward", {dy, x, g, fwd[1], fwd[2]},
                                 {{"training", int64_t{training}}});
          const Grads want =
              ref_batch_norm_backward(dy.to_doubles(), x.to_doubles(), shape, values(g),
                                      fwd[1].to_doubles(), fwd[2].to_doubles(), training);
          const int64_t m = shape_numel(shape) / C;
          CHECK_ALLCLOSE(outs[0].to_doubles(), round_to(want.dx, d), tolerance(d));
          // dgamma and dbeta sum m terms: stored in d, so their error scales with sqrt(m).
          CHECK_ALLCLOSE(outs[1].to_doubles(), round_to(want.dgamma, d), scaled(d, m));
          CHECK_ALLCLOSE(outs[2].to_doubles(), round_to(want.dbeta, d), scaled(d, m));
        }
      }
    }
  }
}

TEST_CASE("batch_norm gradients match finite differences in training mode",
          "[cpu][ops][norm][grad]") {
  for (const Shape& shape : {Shape{2, 3}, Shape{3, 2, 5}, Shape{1, 2, 3, 1}, Shape{2, 1, 3, 3}}) {
    const int64_t C = shape[1];
    INFO(shape_string(shape));
    const Tensor x = random_tensor(shape, PLX_F64, 41, -2, 2);
    const Tensor g = random_tensor({C}, PLX_F64, 42, 0.5, 2);
    const Tensor b = random_tensor({C}, PLX_F64, 43);
    check_gradients("batch_norm", {x});
    check_gradients("batch_norm", {x, g});
    check_gradients("batch_norm", {x, g, b}, {{"eps", 1e-2}});
    check_gradients("batch_norm", {x, Tensor(), b});
    // With running statistics: they change on every call but do not enter y in training mode.
    const Tensor rm = random_tensor({C}, PLX_F64, 44), rv = random_tensor({C}, PLX_F64, 45, 0.5, 2);
    check_gradients("batch_norm", {x, g, b, rm, rv}, {{"momentum", 0.25}});
  }
}

TEST_CASE("batch_norm in eval mode and batch_norm_apply: gradients match finite differences",
          "[cpu][ops][norm][grad]") {
  // Both normalise with statistics that are constants: batch_norm_apply's are given (rm and rv
  // stand in for a mean and an invstd), and its gradient is the eval-mode backward.
  for (const Shape& shape : {Shape{2, 3}, Shape{1, 2, 5}, Shape{2, 1, 2, 3}, Shape{3, 2, 5}}) {
    const int64_t C = shape[1];
    INFO(shape_string(shape));
    const Tensor x = random_tensor(shape, PLX_F64, 51, -2, 2);
    const Tensor g = random_tensor({C}, PLX_F64, 52, 0.5, 2);
    const Tensor b = random_tensor({C}, PLX_F64, 53);
    const Tensor rm = random_tensor({C}, PLX_F64, 54), rv = random_tensor({C}, PLX_F64, 55, 0.5, 2);
    const Attrs eval = {{"training", int64_t{0}}, {"eps", 1e-3}};
    check_gradients("batch_norm", {x, g, b, rm, rv}, eval);
    check_gradients("batch_norm", {x, Tensor(), Tensor(), rm, rv}, eval);
    check_gradients("batch_norm_apply", {x, g, b, rm, rv});
    check_gradients("batch_norm_apply", {x, Tensor(), b, rm, rv});
    check_gradients("batch_norm_apply", {x, g, Tensor(), rm, rv});
  }
}

TEST_CASE("batch_norm and layer_norm give parameter gradients in the parameters' dtypes",
          "[cpu][ops][norm][grad]") {
  // f16 activations with f32 parameters; and beta alone, whose gradient the backward op makes in
  // gamma's dtype (T without gamma) and the formula casts.
  const Tensor x = random_tensor({4, 3, 2}, PLX_F16, 61);
  const Tensor g = random_tensor({3}, PLX_F32, 62), b = random_tensor({3}, PLX_F32, 63);
  const Tensor dy = random_tensor({4, 3, 2}, PLX_F16, 64);
  for (const char* op : {"batch_norm", "layer_norm"}) {
    INFO(op);
    const bool bn = std::string(op) == "batch_norm";
    const Tensor gg = bn ? g : random_tensor({2}, PLX_F32, 65);
    const Tensor bb = bn ? b : random_tensor({2}, PLX_F32, 66);
    auto outs = call(cpu(), op, {x, gg, bb});
    auto grads = call_grad(cpu(), op, {x, gg, bb}, outs, {dy});
    REQUIRE(grads.size() == (bn ? 5u : 3u));  // one per input
    CHECK(grads[0].dtype() == PLX_F16);
    CHECK(grads[1].dtype() == PLX_F32);
    CHECK(grads[2].dtype() == PLX_F32);
    outs = call(cpu(), op, {x, Tensor(), bb});
    grads = call_grad(cpu(), op, {x, Tensor(), bb}, outs, {dy});
    CHECK(!grads[1].defined());
    REQUIRE(grads[2].defined());
    CHECK(grads[2].dtype() == PLX_F32);
    CHECK(grads[2].shape() == bb.shape());
  }
}

TEST_CASE("batch_norm and layer_norm match the reference on shapes large enough for threads",
          "[cpu][ops][norm]") {
  // Big enough that the per-channel, per-plane, per-row and per-column loops are split among
  // threads; the other cases are small and run serially.
  for (plx_dtype d : {PLX_F32, PLX_BF16}) {
    INFO(dtype_name(d));
    const Shape shape = {8, 16, 32, 32};
    const Tensor x = random_tensor(shape, d, 301, -1, 2), dy = random_tensor(shape, d, 302);
    const Tensor g = random_tensor({16}, PLX_F32, 303, 0.5, 2),
                 b = random_tensor({16}, PLX_F32, 304);
    const Tensor rm = random_tensor({16}, PLX_F32, 305),
                 rv = random_tensor({16}, PLX_F32, 306, 0.5, 2);
    const std::vector<double> rm0 = rm.to_doubles(), rv0 = rv.to_doubles();
    const auto fwd = call(cpu(), "batch_norm", {x, g, b, rm, rv});
    const BnRef want = ref_batch_norm(x.to_doubles(), shape, g.to_doubles(), b.to_doubles(), rm0,
                                      rv0, true, 0.1, 1e-5);
    CHECK_ALLCLOSE(fwd[0].to_doubles(), round_to(want.y, d), tolerance(d));
    CHECK_ALLCLOSE(rv.to_doubles(), round_to(want.running_var, PLX_F32), tolerance(PLX_F32));
    const auto bwd = call(cpu(), "batch_norm_backward", {dy, x, g, fwd[1], fwd[2]});
    const Grads gw = ref_batch_norm_backward(dy.to_doubles(), x.to_doubles(), shape, g.to_doubles(),
                                             fwd[1].to_doubles(), fwd[2].to_doubles(), true);
    CHECK_ALLCLOSE(bwd[0].to_doubles(), round_to(gw.dx, d), tolerance(d));
    CHECK_ALLCLOSE(bwd[1].to_doubles(), round_to(gw.dgamma, PLX_F32), scaled(PLX_F32, 8192));

    const Shape ls = {512, 257};
    const Tensor lx = random_tensor(ls, d, 311, -1, 2), ldy = random_tensor(ls, d, 312);
    const Tensor lg = random_tensor({257}, d, 313, 0.5, 2), lb = random_tensor({257}, d, 314);
    const auto lf = call(cpu(), "layer_norm", {lx, lg, lb});
    const BnRef lwant =
        ref_layer_norm(lx.to_doubles(), ls, 1, lg.to_doubles(), lb.to_doubles(), 1e-5);
    CHECK_ALLCLOSE(lf[0].to_doubles(), round_to(lwant.y, d), tolerance(d));
    const auto lbwd = call(cpu(), "layer_norm_backward", {ldy, lx, lg, lf[1], lf[2]});
    const Grads lgw =
        ref_layer_norm_backward(ldy.to_doubles(), lx.to_doubles(), ls, 1, lg.to_doubles(),
                                lf[1].to_doubles(), lf[2].to_doubles());
    CHECK_ALLCLOSE(lbwd[0].to_doubles(), round_to(lgw.dx, d), tolerance(d));
    CHECK_ALLCLOSE(lbwd[1].to_doubles(), round_to(lgw.dgamma, d), scaled(d, 512));
    CHECK_ALLCLOSE(lbwd[2].to_doubles(), round_to(lgw.dbeta, d), scaled(d, 512));
  }
}

TEST_CASE("batch_norm rejects bad inputs", "[cpu][ops][norm][errors]") {
  const Tensor x = random_tensor({2, 3, 4}, PLX_F32, 1);
  const Tensor c3 = random_tensor({3}, PLX_F32, 2), c4 = random_tensor({4}, PLX_F32, 3);
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {x, c4}),
                      PLX_CONTAINS("op 'batch_norm': gamma (4) does not match (3)"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {x, c3, c4}), PLX_CONTAINS("beta (4)"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {x, Tensor(), Tensor(), c4, c4}),
                      PLX_CONTAINS("running_mean (4)"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {x}, {{"training", int64_t{0}}}),
                      PLX_CONTAINS("eval mode (training = 0) needs running_mean and running_var"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {x, Tensor(), Tensor(), c3}),
                      PLX_CONTAINS("must be given together"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {random_tensor({5}, PLX_F32, 4)}),
                      PLX_CONTAINS("at least 2 dimensions"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {random_tensor({1, 3}, PLX_F32, 4)}),
                      PLX_CONTAINS("more than 1 value per channel"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {x, random_tensor({3}, PLX_F16, 5)}),
                      PLX_CONTAINS("gamma is f16, expected f32"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {x}, {{"eps", -1.0}}), PLX_CONTAINS("eps"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm", {random_ints({2, 3}, PLX_I32, 1, 0, 3)}),
                      PLX_CONTAINS("expected one of"));
  const Tensor bad_stat = random_tensor({3}, PLX_F64, 6);
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm_backward", {x, x, Tensor(), bad_stat, bad_stat}),
                      PLX_CONTAINS("save_mean is f64, expected f32"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm_backward",
                           {random_tensor({2, 3, 5}, PLX_F32, 7), x, Tensor(), c3, c3}),
                      PLX_CONTAINS("differ in shape"));
}

// ---- batch_norm_apply ----

TEST_CASE("batch_norm_apply gives batch_norm's output to the bit from its saved statistics",
          "[cpu][ops][norm]") {
  // What backward recomputes batch_norm's output with (train.recompute): it must be the same
  // bits, in every dtype, with f32 parameters under 16-bit activations, in both modes, and on a
  // shape large enough that the planes are split among threads.
  struct C {
    Shape x;
    plx_dtype t, param;
    bool gamma, beta, training;
  };
  const std::vector<C> cases = {
      {{4, 3, 5}, PLX_F32, PLX_F32, true, true, true},
      {{4, 3, 5}, PLX_F64, PLX_F64, true, true, true},
      {{4, 3, 2, 3}, PLX_F16, PLX_F32, true, true, true},
      {{4, 3, 2, 3}, PLX_BF16, PLX_BF16, true, false, true},
      {{6, 5}, PLX_BF16, PLX_F32, false, true, true},
      {{3, 2, 7}, PLX_F32, PLX_F32, false, false, false},
      {{3, 2, 7}, PLX_F16, PLX_F16, true, true, false},
      {{8, 16, 32, 32}, PLX_F32, PLX_F32, true, true, true},
      {{8, 16, 32, 32}, PLX_BF16, PLX_F32, true, true, true},
  };
  for (const C& c : cases) {
    INFO(shape_string(c.x) << " " << dtype_name(c.t) << " params " << dtype_name(c.param)
                           << (c.gamma ? " gamma" : "") << (c.beta ? " beta" : "")
                           << (c.training ? " training" : " eval"));
    const int64_t ch = c.x[1];
    const Tensor x = random_tensor(c.x, c.t, 71, 1, 3);
    const Tensor g = c.gamma ? random_tensor({ch}, c.param, 72, 0.5, 1.5) : Tensor();
    const Tensor b = c.beta ? random_tensor({ch}, c.param, 73) : Tensor();
    const Tensor rm = random_tensor({ch}, c.param, 74), rv = random_tensor({ch}, c.param, 75, 0.5, 2);
    const auto fwd = call(cpu(), "batch_norm", {x, g, b, rm, rv},
                          {{"training", int64_t{c.training}}, {"eps", 1e-3}});
    const auto again = call(cpu(), "batch_norm_apply", {x, g, b, fwd[1], fwd[2]});
    REQUIRE(again.size() == 1);
    CHECK(again[0].dtype() == c.t);
    CHECK(again[0].shape() == c.x);
    CHECK(again[0].to_doubles() == fwd[0].to_doubles());
  }
}

TEST_CASE("batch_norm_apply rejects bad inputs", "[cpu][ops][norm][errors]") {
  const Tensor x = random_tensor({2, 3, 4}, PLX_F32, 1);
  const Tensor c3 = random_tensor({3}, PLX_F32, 2), c4 = random_tensor({4}, PLX_F32, 3);
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm_apply", {x, Tensor(), Tensor(), c4, c3}),
                      PLX_CONTAINS("mean (4), expected (3)"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm_apply", {x, c4, Tensor(), c3, c3}),
                      PLX_CONTAINS("gamma (4) does not match (3)"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "batch_norm_apply", {x, Tensor(), Tensor(), c3, random_tensor({3}, PLX_F64, 4)}),
      PLX_CONTAINS("invstd is f64, expected f32 for f32 x"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm_apply", {random_tensor({5}, PLX_F32, 5), Tensor(),
                                                       Tensor(), c3, c3}),
                      PLX_CONTAINS("at least 2 dimensions"));
  REQUIRE_THROWS_WITH(call(cpu(), "batch_norm_apply", {x, Tensor(), Tensor(), c3}),
                      PLX_CONTAINS("invstd"));
}

// ---- layer_norm ----

TEST_CASE("layer_norm forward matches the reference", "[cpu][ops][norm]") {
  struct Case {
    Shape shape;
    int k;
  };
  const std::vector<Case> cases = {{{4}, 1},       {{3, 5}, 1},    {{2, 3, 4}, 1},
                                   {{2, 3, 4}, 2}, {{2, 3, 4}, 3}, {{1, 7}, 1},
                                   {{5, 1}, 1},    {{3, 1, 5}, 2}, {{2, 2, 1, 33}, 1}};
  const double eps = 1e-4;
  for (plx_dtype d : kFloatDtypes) {
    for (const Case& cs : cases) {
      for (const Affine& a : kAffine) {
        INFO(dtype_name(d) << " " << shape_string(cs.shape) << " k " << cs.k << " gamma " << a.gamma
                           << " beta " << a.beta << " f32 params " << a.f32);
        const Shape norm(cs.shape.end() - cs.k, cs.shape.end());
        const Shape rows(cs.shape.begin(), cs.shape.end() - cs.k);
        const plx_dtype pd = a.f32 ? PLX_F32 : d;
        const Tensor x = random_tensor(cs.shape, d, 71, -1, 3);
        const Tensor g = a.gamma ? random_tensor(norm, pd, 72, 0.5, 2) : Tensor();
        const Tensor b = a.beta ? random_tensor(norm, pd, 73) : Tensor();
        const auto outs = call(cpu(), "layer_norm", {x, g, b},
                               {{"normalized_ndim", int64_t{cs.k}}, {"eps", eps}});
        const BnRef want =
            ref_layer_norm(x.to_doubles(), cs.shape, cs.k, values(g), values(b), eps);
        REQUIRE(outs[0].shape() == cs.shape);
        REQUIRE(outs[1].shape() == rows);
        REQUIRE(outs[1].dtype() == stat_dtype(d));
        CHECK_ALLCLOSE(outs[0].to_doubles(), round_to(want.y, d), tolerance(d));
        CHECK_ALLCLOSE(outs[1].to_doubles(), want.mean, tolerance(stat_dtype(d)));
        // invstd reaches 1/sqrt(eps) = 100 for a single normalised element: relative tolerance.
        CHECK_ALLCLOSE(outs[2].to_doubles(), want.invstd, tolerance(stat_dtype(d)));
      }
    }
  }
}

TEST_CASE("layer_norm_backward matches the reference in every dtype", "[cpu][ops][norm]") {
  struct Case {
    Shape shape;
    int k;
  };
  for (plx_dtype d : kFloatDtypes) {
    for (const Case& cs : {Case{{3, 5}, 1}, Case{{2, 3, 4}, 2}, Case{{1, 9}, 1}, Case{{6, 1, 3}, 1},
                           Case{{37, 3}, 1}}) {
      for (bool has_gamma : {false, true}) {
        INFO(dtype_name(d) << " " << shape_string(cs.shape) << " k " << cs.k << " gamma "
                           << has_gamma);
        const Shape norm(cs.shape.end() - cs.k, cs.shape.end());
        const Attrs attrs = {{"normalized_ndim", int64_t{cs.k}}};
        const Tensor x = random_tensor(cs.shape, d, 81, -2, 2);
        const Tensor dy = random_tensor(cs.shape, d, 82);
        const Tensor g = has_gamma ? random_tensor(norm, d, 83, 0.5, 2) : Tensor();
        const auto fwd = call(cpu(), "layer_norm", {x, g}, attrs);
        const auto outs = call(cpu(), "layer_norm_backward", {dy, x, g, fwd[1], fwd[2]}, attrs);
        const Grads want =
            ref_layer_norm_backward(dy.to_doubles(), x.to_doubles(), cs.shape, cs.k, values(g),
                                    fwd[1].to_doubles(), fwd[2].to_doubles());
        const int64_t rows = shape_numel(cs.shape) / shape_numel(norm);
        CHECK_ALLCLOSE(outs[0].to_doubles(), round_to(want.dx, d), tolerance(d));
        // Column sums over the rows, stored in d.
        CHECK_ALLCLOSE(outs[1].to_doubles(), round_to(want.dgamma, d), scaled(d, rows));
        CHECK_ALLCLOSE(outs[2].to_doubles(), round_to(want.dbeta, d), scaled(d, rows));
      }
    }
  }
}

TEST_CASE("layer_norm gradients match finite differences", "[cpu][ops][norm][grad]") {
  struct Case {
    Shape shape;
    int k;
  };
  for (const Case& cs : {Case{{3, 5}, 1}, Case{{2, 3, 4}, 2}, Case{{1, 6}, 1}, Case{{2, 1, 3}, 2},
                         Case{{4, 1}, 1}, Case{{3}, 1}}) {
    INFO(shape_string(cs.shape) << " k " << cs.k);
    const Shape norm(cs.shape.end() - cs.k, cs.shape.end());
    const Tensor x = random_tensor(cs.shape, PLX_F64, 91, -2, 2);
    const Tensor g = random_tensor(norm, PLX_F64, 92, 0.5, 2);
    const Tensor b = random_tensor(norm, PLX_F64, 93);
    const Attrs attrs = {{"normalized_ndim", int64_t{cs.k}}, {"eps", 1e-3}};
    check_gradients("layer_norm", {x}, attrs);
    check_gradients("layer_norm", {x, g, b}, attrs);
    check_gradients("layer_norm", {x, Tensor(), b}, attrs);
  }
}

TEST_CASE("layer_norm rejects bad inputs", "[cpu][ops][norm][errors]") {
  const Tensor x = random_tensor({2, 3, 4}, PLX_F32, 1);
  for (int64_t k : {0, 4, -1}) {
    REQUIRE_THROWS_WITH(
        call(cpu(), "layer_norm", {x}, {{"normalized_ndim", k}}),
        PLX_CONTAINS("op 'layer_norm': normalized_ndim " + std::to_string(k) + " is out of range"));
  }
  REQUIRE_THROWS_WITH(call(cpu(), "layer_norm", {x, random_tensor({3}, PLX_F32, 2)}),
                      PLX_CONTAINS("gamma (3) does not match (4)"));
  REQUIRE_THROWS_WITH(call(cpu(), "layer_norm", {x, random_tensor({3, 4}, PLX_F32, 2)}),
                      PLX_CONTAINS("gamma (3, 4) does not match (4)"));
  REQUIRE_THROWS_WITH(call(cpu(), "layer_norm", {x, Tensor(), random_tensor({4}, PLX_F64, 2)}),
                      PLX_CONTAINS("beta is f64"));
  const auto fwd = call(cpu(), "layer_norm", {x});
  REQUIRE_THROWS_WITH(call(cpu(), "layer_norm_backward", {x, x, Tensor(), fwd[1], fwd[2]},
                           {{"normalized_ndim", int64_t{2}}}),
                      PLX_CONTAINS("mean (2, 3), expected (2)"));
}
