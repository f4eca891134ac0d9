#include "support/harness.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>

#include "plexus/comm_bench.hpp"  // parse_dtype
#include "plexus/op_schema.hpp"
#include "plexus/optimizer.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus::test {

std::string fixture_dir() { return PLEXUS_TEST_FIXTURE_DIR; }
// PLEXUS_TEST_PLUGIN_DIR in the environment points the suite at another plugin folder: the CUDA
// emulator's (tests/cuda/emu), whose libplexus-cuda.so is the emulated CUDA plugin.
std::string plugin_dir() {
  const char* d = std::getenv("PLEXUS_TEST_PLUGIN_DIR");
  return d && *d ? d : PLEXUS_TEST_PLUGIN_DIR;
}
std::string source_dir() { return PLEXUS_SOURCE_DIR; }

std::vector<plx_dtype> test_dtypes(const std::vector<plx_dtype>& all) {
  const char* env = std::getenv("PLEXUS_TEST_DTYPES");
  if (!env || !*env) return all;
  std::vector<plx_dtype> keep;
  std::stringstream list(env);
  for (std::string name; std::getline(list, name, ',');)
    keep.push_back(parse_dtype("PLEXUS_TEST_DTYPES", name));
  std::vector<plx_dtype> out;
  for (plx_dtype d : all)
    if (std::find(keep.begin(), keep.end(), d) != keep.end()) out.push_back(d);
  return out;
}

RuntimeOptions plugin_dir_options() {
  RuntimeOptions o;
  o.plugins.paths = {plugin_dir()};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  return o;
}

Runtime& runtime() {
  static std::unique_ptr<Runtime> rt = [] {
    RuntimeOptions o = plugin_dir_options();
    // No timing: the tuner would choose each node's kernel by this machine's load, and the many
    // tests that hold two runs equal bit for bit (fused and unfused, resumed and uninterrupted)
    // need both on the same kernels. tests/core/test_tune.cpp tests the tuner.
    o.kernels = KernelSide::Library;
    // PLEXUS_TEST_KERNELS=native runs the suite on the backends' own kernels first (our CUDA
    // GEMM and convolutions instead of cuBLASLt and cuDNN wherever they accept the node).
    if (const char* k = std::getenv("PLEXUS_TEST_KERNELS")) o.kernels = parse_kernel_side(k, "PLEXUS_TEST_KERNELS");
    // PLEXUS_TEST_CPU_THREADS runs the suite with more (or fewer) threads than this machine has
    // cores, to exercise the multi-threaded split paths of kernels on small machines.
    if (const char* t = std::getenv("PLEXUS_TEST_CPU_THREADS")) o.plugins.options["cpu"]["threads"] = t;
    return std::make_unique<Runtime>(o);
  }();
  return *rt;
}

Backend& cpu() { return runtime().backend("cpu"); }

std::vector<double> random_doubles(size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<double> round_to(const std::vector<double>& v, plx_dtype d) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    switch (d) {
      case PLX_F32: r[i] = static_cast<float>(v[i]); break;
      case PLX_F16: r[i] = static_cast<float>(convert<half>(v[i])); break;
      case PLX_BF16: r[i] = static_cast<float>(convert<bfloat16>(v[i])); break;
      case PLX_I32: r[i] = static_cast<double>(static_cast<int32_t>(v[i])); break;
      case PLX_I64: r[i] = static_cast<double>(static_cast<int64_t>(v[i])); break;
      case PLX_U8: r[i] = static_cast<double>(static_cast<uint8_t>(v[i])); break;
      default: r[i] = v[i];
    }
  }
  return r;
}

Tensor from_doubles(const std::vector<double>& v, const Shape& shape, plx_dtype d) {
  REQUIRE(static_cast<int64_t>(v.size()) == shape_numel(shape));
  Tensor t;
  const bool known = visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> x(v.size());
    for (size_t i = 0; i < v.size(); ++i) x[i] = convert<T>(v[i]);
    t = Tensor::from_vector(cpu(), x, shape);
  });
  if (!known) FAIL("from_doubles: bad dtype " << d);
  return t;
}

void fill(Tensor t, const std::vector<double>& v) {
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  std::vector<uint8_t> bytes(t.nbytes());
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (size_t i = 0; i < v.size(); ++i) {
      const T x = convert<T>(v[i]);
      std::memcpy(bytes.data() + i * sizeof(T), &x, sizeof(T));
    }
  });
  t.copy_from_host(bytes.data());
}

Tensor random_tensor(const Shape& shape, plx_dtype d, uint64_t seed, double lo, double hi) {
  return from_doubles(random_doubles(static_cast<size_t>(shape_numel(shape)), seed, lo, hi), shape,
                      d);
}

Tensor random_ints(const Shape& shape, plx_dtype d, uint64_t seed, int64_t lo, int64_t hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = static_cast<double>(dist(rng));
  return from_doubles(v, shape, d);
}

Tol tolerance(plx_dtype d) {
  switch (d) {
    case PLX_F64: return {1e-12, 1e-10};
    case PLX_F32: return {1e-5, 1e-4};
    case PLX_F16: return {2e-3, 4e-3};
    case PLX_BF16: return {1.6e-2, 3e-2};
    default: return {0, 0};
  }
}

std::string CloseReport::str() const {
  std::ostringstream os;
  os.precision(10);
  os << bad << " of " << count << " elements out of tolerance; worst at [" << worst
     << "]: got " << got << ", want " << want << ", error " << err;
  return os.str();
}

CloseReport compare(const std::vector<double>& got, const std::vector<double>& want, Tol tol) {
  CloseReport r;
  r.count = want.size();
  if (got.size() != want.size()) {
    r.ok = false;
    r.bad = want.size();
    r.err = INFINITY;
    return r;
  }
  double worst_excess = -INFINITY;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const double allowed = tol.atol + tol.rtol * std::fabs(want[i]);
    const bool bad = !(err <= allowed) || std::isnan(got[i]) != std::isnan(want[i]);
    if (bad) ++r.bad;
    const double excess = std::isnan(err) ? INFINITY : err - allowed;
    if (excess > worst_excess) {
      worst_excess = excess;
      r.worst = i;
      r.got = got[i];
      r.want = want[i];
      r.err = err;
    }
  }
  r.ok = r.bad == 0;
  return r;
}

double nmse(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? num / den : num;
}

void check_gradients(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                     GradCheck o) {
  check_gradients(cpu(), op, inputs, attrs, o);
}

void check_gradients(Backend& b, const std::string& op, const std::vector<Tensor>& inputs_in,
                     const Attrs& attrs, GradCheck o) {
  const OpSchema& s = b.runtime().ops().get(op);
  // The helpers below make tensors on the harness's cpu; `b` may be another runtime's backend.
  auto on_b = [&](const Tensor& t) { return !t.defined() || &t.backend() == &b ? t : t.to(b); };
  std::vector<Tensor> inputs;
  for (const Tensor& t : inputs_in) inputs.push_back(on_b(t));
  const std::vector<Tensor> outs = call(b, op, inputs, attrs);

  if (o.outputs.empty()) {
    for (size_t k = 0; k < outs.size(); ++k)
      if (!(s.outputs[k].flags & PLX_ARG_NO_GRAD) && dtype_is_float(outs[k].dtype()))
        o.outputs.push_back(static_cast<int>(k));
  }
  if (o.inputs.empty()) {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && !(s.inputs[i].flags & PLX_ARG_NO_GRAD) &&
          dtype_is_float(inputs[i].dtype()))
        o.inputs.push_back(static_cast<int>(i));
  }
  std::vector<Tensor> dys(outs.size());
  std::vector<std::vector<double>> dy_vals(outs.size());
  for (int k : o.outputs) {
    REQUIRE(outs[static_cast<size_t>(k)].dtype() == PLX_F64);
    dys[static_cast<size_t>(k)] = on_b(random_tensor(outs[static_cast<size_t>(k)].shape(), PLX_F64,
                                                     o.seed + static_cast<uint64_t>(k)));
    dy_vals[static_cast<size_t>(k)] = dys[static_cast<size_t>(k)].to_doubles();
  }
  auto loss = [&](const std::vector<Tensor>& ins) {
    const std::vector<Tensor> ys = call(b, op, ins, attrs);
    double l = 0;
    for (int k : o.outputs) {
      const std::vector<double> y = ys[static_cast<size_t>(k)].to_doubles();
      for (size_t j = 0; j < y.size(); ++j) l += y[j] * dy_vals[static_cast<size_t>(k)][j];
    }
    return l;
  };

  std::vector<bool> needs(s.inputs.size(), false);
  for (int i : o.inputs) needs[static_cast<size_t>(i)] = true;
  const std::vector<Tensor> grads = call_grad(b, op, inputs, outs, dys, attrs, needs);

  for (int i : o.inputs) {
    const Tensor& x = inputs[static_cast<size_t>(i)];
    INFO("op '" << op << "', gradient of input " << i << " '" << s.inputs[static_cast<size_t>(i)].name
                << "' " << x.str());
    REQUIRE(x.dtype() == PLX_F64);
    REQUIRE(grads.at(static_cast<size_t>(i)).defined());
    REQUIRE(grads[static_cast<size_t>(i)].shape() == x.shape());
    const std::vector<double> analytic = grads[static_cast<size_t>(i)].to_doubles();
    const std::vector<double> base = x.to_doubles();
    std::vector<double> numeric(base.size());
    std::vector<Tensor> ins = inputs;
    for (size_t j = 0; j < base.size(); ++j) {
      std::vector<double> p = base;
      p[j] = base[j] + o.eps;
      ins[static_cast<size_t>(i)] = on_b(from_doubles(p, x.shape(), PLX_F64));
      const double lp = loss(ins);
      p[j] = base[j] - o.eps;
      ins[static_cast<size_t>(i)] = on_b(from_doubles(p, x.shape(), PLX_F64));
      const double lm = loss(ins);
      numeric[j] = (lp - lm) / (2 * o.eps);
    }
    CHECK_ALLCLOSE(analytic, numeric, o.tol);
  }
}

std::vector<Var> add_sgd_step(Graph& g, Var logits, Var labels) {
  const Var loss = g.add1("softmax_cross_entropy", {logits, labels}, {}, "loss");
  const std::vector<Var> params = g.parameters();
  const std::vector<Var> grads = backward(g, loss, params);
  OptimizerOptions o;
  o.kind = "sgd";
  o.momentum = 0.9;
  add_optimizer(g, params, grads, o);
  g.mark_output(loss, "loss_out");
  return grads;
}

std::vector<double> train_losses(Executable& exe, int steps) {
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    exe.run();
    exe.sync();
    losses.push_back(exe.tensor("loss_out").to_doubles().at(0));
  }
  return losses;
}

Config small_train_config(const std::filesystem::path& out, const std::string& extra) {
  Config c = Config::parse(R"(
[model]
name = "simplecnn"
[data]
dataset = "synthetic"
synthetic_samples = 512
[train]
epochs = 3
batch_size = 128
seed = 5
lr = 0.05
[logging]
progress = "none"
)" + extra,
                           "test.toml");
  c.set("output.dir=\"" + out.string() + "\"");
  return c;
}

TrainResult run_training(const Config& c, const std::string& resume) {
  std::ostringstream sink;
  TrainRequest r{c};
  r.resume_dir = resume;
  r.out = &sink;
  r.keep_losses = true;
  return train(runtime(), r);
}

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  path = std::filesystem::temp_directory_path() /
         ("plexus-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::set<std::string> TempDir::entries() const {
  std::set<std::string> s;
  for (const auto& e : std::filesystem::directory_iterator(path)) s.insert(e.path().filename().string());
  return s;
}

}  // namespace plexus::test
