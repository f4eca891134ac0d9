// Optimizer updates on the CPU backend: several steps with the state carried between calls,
// against double-precision transcriptions of PyTorch's torch.optim.SGD and AdamW
// (single-tensor, non-foreach code paths), in f32 and f64.
#include <cmath>
#include <limits>
#include <optional>

#include "plexus/op_schema.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

const std::vector<Shape> kShapes = {{}, {1}, {7}, {3, 5}, {2, 1, 3, 4}, {40000}};
constexpr plx_dtype kParamDtypes[] = {PLX_F32, PLX_F64};
constexpr int kSteps = 5;

// lr and step as tensors: alternately shape () in f64 and shape (1) in f32, so that both shapes
// and both scalar dtypes are exercised with either param dtype.
Tensor scalar(double v, int k) {
  return k % 2 == 0 ? from_doubles({v}, Shape{}, PLX_F64) : from_doubles({v}, Shape{1}, PLX_F32);
}
// What the kernel reads from scalar(v, k).
double scalar_as_stored(double v, int k) {
  return k % 2 == 0 ? v : static_cast<float>(v);
}

struct SgdCfg {
  double momentum = 0, dampening = 0, weight_decay = 0;
  int64_t nesterov = 0;
};

// torch.optim.SGD for one parameter. PyTorch creates the buffer at the first step as a copy of
// the gradient (no dampening); the op instead expects a zero-initialised buffer, which gives the
// same first step when dampening is 0. With dampening the reference follows the op's rule, as
// docs/ops.md documents.
struct SgdRef {
  SgdCfg cfg;
  std::vector<double> buf;
  bool have_buf = false;

  void step(std::vector<double>& p, const std::vector<double>& grad, double lr) {
    if (buf.empty()) buf.assign(p.size(), 0.0);
    const bool pytorch_first_step = !have_buf && cfg.dampening == 0;
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (cfg.weight_decay != 0) g = g + cfg.weight_decay * p[i];
      if (cfg.momentum != 0) {
        if (pytorch_first_step)
          buf[i] = g;  // torch.clone(grad).detach()
        else
          buf[i] = cfg.momentum * buf[i] + (1 - cfg.dampening) * g;
        g = cfg.nesterov ? g + cfg.momentum * buf[i] : buf[i];
      }
      p[i] = p[i] - lr * g;
    }
    have_buf = true;
  }
};

struct AdamwCfg {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// torch.optim.AdamW for one parameter (amsgrad off, maximize off).
struct AdamwRef {
  AdamwCfg cfg;
  std::vector<double> m, v;

  void step(std::vector<double>& p, const std::vector<double>& grad, double lr, double t) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    const double bc1 = 1 - std::pow(cfg.beta1, t);
    const double bc2 = 1 - std::pow(cfg.beta2, t);
    const double step_size = lr / bc1;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * cfg.weight_decay;
      m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * grad[i];
      v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * grad[i] * grad[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + cfg.eps;
      p[i] -= step_size * m[i] / denom;
    }
  }
};

Attrs sgd_attrs(const SgdCfg& c) {
  return {{"momentum", c.momentum},
          {"dampening", c.dampening},
          {"weight_decay", c.weight_decay},
          {"nesterov", c.nesterov}};
}

Attrs adamw_attrs(const AdamwCfg& c) {
  return {{"beta1", c.beta1}, {"beta2", c.beta2}, {"eps", c.eps}, {"weight_decay", c.weight_decay}};
}

}  // namespace

TEST_CASE("sgd_update matches PyTorch's SGD over several steps", "[cpu][ops][optim]") {
  const std::vector<SgdCfg> cfgs = {
      {},                                                     // plain SGD
      {.weight_decay = 0.05},                                 // decay without momentum
      {.momentum = 0.9},                                      // heavy ball
      {.momentum = 0.9, .dampening = 0.25},                   // dampened
      {.momentum = 0.9, .weight_decay = 0.01},                // momentum + decay
      {.momentum = 0.9, .nesterov = 1},                       // Nesterov
      {.momentum = 0.5, .weight_decay = 0.1, .nesterov = 1},  // Nesterov + decay
  };
  uint64_t seed = 100;
  for (plx_dtype d : kParamDtypes) {
    for (const Shape& shape : kShapes) {
      for (const SgdCfg& cfg : cfgs) {
        INFO(dtype_name(d) << " " << shape_string(shape) << " momentum " << cfg.momentum
                           << " dampening " << cfg.dampening << " wd " << cfg.weight_decay
                           << " nesterov " << cfg.nesterov);
        const size_t n = static_cast<size_t>(shape_numel(shape));
        Tensor param = random_tensor(shape, d, ++seed, -2, 2);
        Tensor buf = cfg.momentum != 0 ? Tensor::zeros(cpu(), shape, d) : Tensor();
        SgdRef ref{cfg};
        std::vector<double> p = param.to_doubles();
        for (int k = 0; k < kSteps; ++k) {
          INFO("step " << k + 1);
          const Tensor grad = random_tensor(shape, d, ++seed);
          const double lr = 0.1 / (1 + k);  // a new value each step, through the same op
          const std::vector<Tensor> outs =
              call(cpu(), "sgd_update", {param, grad, buf, scalar(lr, k)}, sgd_attrs(cfg));
          REQUIRE(outs.empty());
          ref.step(p, grad.to_doubles(), scalar_as_stored(lr, k));
          CHECK_ALLCLOSE(param.to_doubles(), p, tolerance(d));
          if (buf.defined()) CHECK_ALLCLOSE(buf.to_doubles(), ref.buf, tolerance(d));
          if (n > 1000) break;  // the large shape is there for the threaded path; one step does
        }
      }
    }
  }
}

TEST_CASE("sgd_update with momentum 0 leaves a given momentum_buf alone", "[cpu][ops][optim]") {
  const Tensor param = random_tensor({9}, PLX_F32, 1);
  const Tensor grad = random_tensor({9}, PLX_F32, 2);
  const Tensor buf = random_tensor({9}, PLX_F32, 3);
  const std::vector<double> before = buf.to_doubles();
  call(cpu(), "sgd_update", {param, grad, buf, scalar(0.1, 0)});
  CHECK(buf.to_doubles() == before);
}

TEST_CASE("adamw_update matches PyTorch's AdamW with bias correction at steps 1..5",
          "[cpu][ops][optim]") {
  const std::vector<AdamwCfg> cfgs = {
      {},  // PyTorch's defaults
      {.beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1},
      {.beta1 = 0.0, .beta2 = 0.5, .eps = 1e-3, .weight_decay = 0.0},  // no momentum, no decay
  };
  uint64_t seed = 500;
  for (plx_dtype d : kParamDtypes) {
    for (const Shape& shape : kShapes) {
      for (const AdamwCfg& cfg : cfgs) {
        INFO(dtype_name(d) << " " << shape_string(shape) << " beta1 " << cfg.beta1 << " beta2 "
                           << cfg.beta2 << " eps " << cfg.eps << " wd " << cfg.weight_decay);
        const size_t n = static_cast<size_t>(shape_numel(shape));
        Tensor param = random_tensor(shape, d, ++seed, -2, 2);
        Tensor m = Tensor::zeros(cpu(), shape, d);
        Tensor v = Tensor::zeros(cpu(), shape, d);
        AdamwRef ref{cfg};
        std::vector<double> p = param.to_doubles();
        for (int t = 1; t <= kSteps; ++t) {
          INFO("step " << t);
          const Tensor grad = random_tensor(shape, d, ++seed);
          const double lr = 1e-2 * t;  // a new value each step (a warm-up schedule)
          const std::vector<Tensor> outs =
              call(cpu(), "adamw_update", {param, grad, m, v, scalar(lr, t), scalar(t, t + 1)},
                   adamw_attrs(cfg));
          REQUIRE(outs.empty());
          ref.step(p, grad.to_doubles(), scalar_as_stored(lr, t), t);
          CHECK_ALLCLOSE(param.to_doubles(), p, tolerance(d));
          CHECK_ALLCLOSE(m.to_doubles(), ref.m, tolerance(d));
          CHECK_ALLCLOSE(v.to_doubles(), ref.v, tolerance(d));
          if (n > 1000 && t >= 2) break;  // the large shape is there for the threaded path
        }
      }
    }
  }
}

TEST_CASE("optimizer updates reject mismatched shapes", "[cpu][ops][optim][errors]") {
  const Tensor p = random_tensor({3, 5}, PLX_F32, 1);
  const Tensor g = random_tensor({3, 5}, PLX_F32, 2);
  const Tensor bad = random_tensor({3, 4}, PLX_F32, 3);
  const Tensor z = Tensor::zeros(cpu(), {3, 5}, PLX_F32);
  const Tensor lr = scalar(0.1, 0);
  const Tensor step = scalar(1, 0);
  REQUIRE_THROWS_WITH(
      call(cpu(), "sgd_update", {p, bad, Tensor(), lr}),
      PLX_CONTAINS("op 'sgd_update': grad (3, 4) and param (3, 5) differ in shape"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "sgd_update", {p, g, bad, lr}, {{"momentum", 0.9}}),
      PLX_CONTAINS("op 'sgd_update': momentum_buf (3, 4) and param (3, 5) differ in shape"));
  REQUIRE_THROWS_WITH(call(cpu(), "adamw_update", {p, bad, z, z, lr, step}),
                      PLX_CONTAINS("op 'adamw_update': grad (3, 4)"));
  REQUIRE_THROWS_WITH(call(cpu(), "adamw_update", {p, g, bad, z, lr, step}),
                      PLX_CONTAINS("op 'adamw_update': exp_avg (3, 4)"));
  REQUIRE_THROWS_WITH(call(cpu(), "adamw_update", {p, g, z, bad, lr, step}),
                      PLX_CONTAINS("op 'adamw_update': exp_avg_sq (3, 4)"));
}

TEST_CASE("optimizer updates reject non-scalar lr and step", "[cpu][ops][optim][errors]") {
  const Tensor p = random_tensor({4}, PLX_F64, 1);
  const Tensor g = random_tensor({4}, PLX_F64, 2);
  const Tensor z = Tensor::zeros(cpu(), {4}, PLX_F64);
  const Tensor lr2 = from_doubles({0.1, 0.2}, {2}, PLX_F64);
  const Tensor lr11 = from_doubles({0.1}, {1, 1}, PLX_F32);
  const Tensor one = scalar(1, 0);
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, Tensor(), lr2}),
                      PLX_CONTAINS("op 'sgd_update': lr must be a scalar tensor of shape () or "
                                   "(1), got (2)"));
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, Tensor(), lr11}),
                      PLX_CONTAINS("lr must be a scalar tensor"));
  REQUIRE_THROWS_WITH(call(cpu(), "adamw_update", {p, g, z, z, lr2, one}),
                      PLX_CONTAINS("op 'adamw_update': lr must be a scalar"));
  REQUIRE_THROWS_WITH(call(cpu(), "adamw_update", {p, g, z, z, one, lr11}),
                      PLX_CONTAINS("op 'adamw_update': step must be a scalar"));
  // An integer lr is refused by dtype, not silently converted.
  const Tensor lr_int = random_ints({1}, PLX_I32, 1, 0, 2);
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, Tensor(), lr_int}),
                      PLX_CONTAINS("input 'lr' is i32"));
}

TEST_CASE("sgd_update needs a momentum buffer when momentum > 0", "[cpu][ops][optim][errors]") {
  const Tensor p = random_tensor({4}, PLX_F32, 1);
  const Tensor g = random_tensor({4}, PLX_F32, 2);
  const Tensor lr = scalar(0.1, 1);
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, Tensor(), lr}, {{"momentum", 0.9}}),
                      PLX_CONTAINS("op 'sgd_update': momentum 0.9") &&
                          PLX_CONTAINS("needs the momentum_buf input"));
  // Nesterov without momentum, or with dampening, is refused as PyTorch refuses it.
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, Tensor(), lr}, {{"nesterov", int64_t{1}}}),
                      PLX_CONTAINS("nesterov needs momentum > 0 and dampening 0"));
  const Tensor z = Tensor::zeros(cpu(), {4}, PLX_F32);
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, z, lr},
                           {{"momentum", 0.9}, {"dampening", 0.1}, {"nesterov", int64_t{1}}}),
                      PLX_CONTAINS("nesterov needs momentum > 0 and dampening 0"));
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, z, lr}, {{"momentum", -0.5}}),
                      PLX_CONTAINS("momentum must be >= 0"));
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, Tensor(), lr}, {{"weight_decay", -1.0}}),
                      PLX_CONTAINS("weight_decay must be >= 0"));
}

TEST_CASE("adamw_update rejects bad hyperparameters and step 0", "[cpu][ops][optim][errors]") {
  const Tensor p = random_tensor({4}, PLX_F32, 1);
  const Tensor g = random_tensor({4}, PLX_F32, 2);
  const Tensor z = Tensor::zeros(cpu(), {4}, PLX_F32);
  const Tensor lr = scalar(0.1, 0);
  REQUIRE_THROWS_WITH(call(cpu(), "adamw_update", {p, g, z, z, lr, scalar(1, 0)}, {{"beta1", 1.0}}),
                      PLX_CONTAINS("op 'adamw_update': beta1 must be in [0, 1)"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "adamw_update", {p, g, z, z, lr, scalar(1, 0)}, {{"beta2", -0.1}}),
      PLX_CONTAINS("beta2 must be in [0, 1)"));
  REQUIRE_THROWS_WITH(call(cpu(), "adamw_update", {p, g, z, z, lr, scalar(1, 0)}, {{"eps", -1e-8}}),
                      PLX_CONTAINS("eps must be >= 0"));
  // Bias correction would divide by zero at step 0; the kernel sees the value at run time.
  REQUIRE_THROWS_WITH(call(cpu(), "adamw_update", {p, g, z, z, lr, scalar(0, 1)}),
                      PLX_CONTAINS("adamw_update") && PLX_CONTAINS("step must be >= 1"));
}

TEST_CASE("optimizer updates reject wrong dtypes and non-contiguous params",
          "[cpu][ops][optim][errors]") {
  const Tensor lr = scalar(0.1, 0);
  const Tensor p16 = random_tensor({4}, PLX_F16, 1);
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p16, p16, Tensor(), lr}),
                      PLX_CONTAINS("op 'sgd_update': input 'param' is f16, expected one of"));
  const Tensor p = random_tensor({4}, PLX_F32, 1);
  const Tensor g64 = random_tensor({4}, PLX_F64, 2);
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g64, Tensor(), lr}),
                      PLX_CONTAINS("input 'grad' is f64, expected f32 like input 'param'"));
  const Tensor z64 = Tensor::zeros(cpu(), {4}, PLX_F64);
  const Tensor g = random_tensor({4}, PLX_F32, 3);
  REQUIRE_THROWS_WITH(call(cpu(), "adamw_update", {p, g, z64, z64, lr, scalar(1, 0)}),
                      PLX_CONTAINS("input 'exp_avg' is f64, expected f32"));
  // An update written into a strided view would miss the caller's storage layout.
  const Tensor pt = random_tensor({3, 5}, PLX_F32, 4).permute({1, 0});
  const Tensor gt = random_tensor({5, 3}, PLX_F32, 5);
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {pt, gt, Tensor(), lr}),
                      PLX_CONTAINS("'param' is written in place and must be contiguous"));
}

TEST_CASE("an update with a check runs when it is finite and writes nothing when it is not",
          "[cpu][ops][optim]") {
  const Shape s{3, 5};
  const std::vector<double> p0 = random_doubles(15, 11, -1, 1), g0 = random_doubles(15, 12, -1, 1);
  const Tensor lr = from_doubles({0.1}, Shape{}, PLX_F32), step = from_doubles({2}, Shape{}, PLX_F32);
  const double inf = std::numeric_limits<double>::infinity();
  for (const std::string op : {"sgd_update", "adamw_update"}) {
    for (plx_dtype dt : kParamDtypes) {
      // The same update without a check, the reference for a finite one.
      auto run = [&](std::optional<double> check) {
        Tensor p = from_doubles(p0, s, dt), g = from_doubles(g0, s, dt);
        Tensor m = from_doubles(std::vector<double>(15, 0.25), s, dt);
        Tensor v = from_doubles(std::vector<double>(15, 0.5), s, dt);
        const Tensor c = check ? from_doubles({*check}, Shape{}, PLX_F32) : Tensor();
        if (op == "sgd_update")
          call(cpu(), op, {p, g, m, lr, c}, {{"momentum", 0.9}});
        else
          call(cpu(), op, {p, g, m, v, lr, step, c});
        return std::vector<std::vector<double>>{p.to_doubles(), m.to_doubles(), v.to_doubles()};
      };
      INFO(op << " " << dtype_name(dt));
      const std::vector<double> stored = from_doubles(p0, s, dt).to_doubles();  // p0 rounded
      const auto plain = run(std::nullopt);
      CHECK(plain[0] != stored);
      CHECK(run(1e30) == plain);
      CHECK(run(-2.5) == plain);
      for (double bad : {inf, -inf, std::nan("")}) {
        INFO("check " << bad);
        const auto skipped = run(bad);
        CHECK(skipped[0] == stored);
        CHECK(skipped[1] == std::vector<double>(15, 0.25));
        CHECK(skipped[2] == std::vector<double>(15, 0.5));
      }
    }
  }
  // The check is one f32 value.
  Tensor p = from_doubles(p0, s, PLX_F32), g = from_doubles(g0, s, PLX_F32);
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, Tensor(), lr, from_doubles({1, 2}, Shape{2}, PLX_F32)}),
                      PLX_CONTAINS("op 'sgd_update': check must be a scalar tensor"));
  REQUIRE_THROWS_WITH(call(cpu(), "sgd_update", {p, g, Tensor(), lr, from_doubles({1}, Shape{}, PLX_F64)}),
                      PLX_CONTAINS("check"));
}

TEST_CASE("loss_scale_update halves on overflow and doubles after a window of finite steps",
          "[cpu][ops][optim]") {
  auto f32 = [](double v) { return from_doubles({v}, Shape{}, PLX_F32); };
  Tensor scale = f32(8), unscale = f32(0.125), good = f32(0), skipped = f32(0), step = f32(1);
  const Attrs window3{{"growth_interval", int64_t{3}}};
  // The report: the scale the step ran with, skipped, then the scale, good and skipped after.
  auto record = [&](double check, const Attrs& a) {
    return call(cpu(), "loss_scale_update", {f32(check), scale, unscale, good, skipped, step}, a)
        .at(0)
        .to_doubles();
  };
  using R = std::vector<double>;
  CHECK(record(1, window3) == R{8, 0, 8, 1, 0});
  CHECK(record(-5, window3) == R{8, 0, 8, 2, 0});
  CHECK(record(0, window3) == R{8, 0, 16, 0, 0});  // the third finite step in a row
  CHECK(unscale.to_doubles() == R{1.0 / 16});
  CHECK(step.to_doubles() == R{4});
  CHECK(record(1, window3) == R{16, 0, 16, 1, 0});
  // Skipped: halves, starts the count again and leaves the optimizer's step count alone.
  CHECK(record(std::numeric_limits<double>::infinity(), window3) == R{16, 1, 8, 0, 1});
  CHECK(record(std::nan(""), window3) == R{8, 1, 4, 0, 2});
  CHECK(step.to_doubles() == R{5});
  CHECK(unscale.to_doubles() == R{0.25});
  CHECK(good.to_doubles() == R{0});
  CHECK(skipped.to_doubles() == R{2});
  for (int i = 0; i < 2; ++i) record(1, window3);
  CHECK(record(1, window3) == R{4, 0, 8, 0, 2});
  // A scale that would overflow f32 stays where it is; the step still counts.
  scale = f32(3e38);
  const double big = static_cast<float>(3e38);
  CHECK(record(1, {{"growth_interval", int64_t{1}}}) == R{big, 0, big, 0, 2});
  // Without a step count, and the attributes checked.
  const Tensor none;
  CHECK(call(cpu(), "loss_scale_update", {f32(1), scale, unscale, good, skipped, none}).at(0).to_doubles() ==
        R{big, 0, big, 1, 2});
  REQUIRE_THROWS_WITH(record(1, {{"growth_interval", int64_t{0}}}),
                      PLX_CONTAINS("op 'loss_scale_update': growth_interval must be in [1, 2^24]"));
  REQUIRE_THROWS_WITH(record(1, {{"backoff_factor", 1.5}}), PLX_CONTAINS("backoff_factor must be in (0, 1)"));
  REQUIRE_THROWS_WITH(record(1, {{"growth_factor", 1.0}}), PLX_CONTAINS("growth_factor must be > 1"));
}

TEST_CASE("an update given a check needs a plugin of ABI 1.4", "[cpu][ops][optim][abi]") {
  const OpSchema& sgd = runtime().ops().get("sgd_update");
  const Attrs a = sgd.complete_attrs({});
  std::string why;
  CHECK(schema::abi_minor_needed(sgd, a, &why, {true, true, false, true, false}) == 0);
  CHECK(schema::abi_minor_needed(sgd, a, &why, {true, true, false, true, true}) == 4);
  CHECK(why == "input 'check' (ABI 1.4)");
  const OpSchema& adamw = runtime().ops().get("adamw_update");
  CHECK(schema::abi_minor_needed(adamw, adamw.complete_attrs({}), &why,
                                 {true, true, true, true, true, true, true}) == 4);
}
