// Shared test helpers: the runtime with the build tree's CPU plugin, random tensors, comparison
// against double-precision references, and gradient checks by central finite differences.
#pragma once

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "plexus/attrs.hpp"
#include "plexus/backend.hpp"
#include "plexus/config.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/eager.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/runtime.hpp"
#include "plexus/tensor.hpp"
#include "plexus/trainer.hpp"
#include "support/catch.hpp"

namespace plexus::test {

// A runtime that loads the plugins of the build tree only (not the environment's).
Runtime& runtime();
// The options runtime() starts from: the plugins of plugin_dir() only. A test that needs a
// runtime of its own (another kernel side, a tuning cache) changes these.
RuntimeOptions plugin_dir_options();
Backend& cpu();
// Where fixture plugins and files are built.
std::string fixture_dir();
std::string plugin_dir();
std::string source_dir();

// The float dtypes every float kernel is tested in.
inline const std::vector<plx_dtype> kFloatDtypes = {PLX_F32, PLX_F16, PLX_BF16, PLX_F64};

// `all`, less the dtypes that PLEXUS_TEST_DTYPES (a comma-separated list of names, when set)
// leaves out: a test run again under a slow checker (the emulator's memcheck) can skip a dtype
// whose kernels are another's template with the same element size. An unknown name fails.
std::vector<plx_dtype> test_dtypes(const std::vector<plx_dtype>& all);

// Uniform values in [lo, hi), reproducible from the seed.
std::vector<double> random_doubles(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0);
// Values rounded to what dtype `d` stores (identity for f64).
std::vector<double> round_to(const std::vector<double>& v, plx_dtype d);
// A tensor on the CPU backend holding `v` converted to `d`.
Tensor from_doubles(const std::vector<double>& v, const Shape& shape, plx_dtype d);
// Writes `v` (converted to t's dtype) into `t`, on any backend.
void fill(Tensor t, const std::vector<double>& v);
// A random tensor on the CPU backend.
Tensor random_tensor(const Shape& shape, plx_dtype d, uint64_t seed, double lo = -1.0,
                     double hi = 1.0);
// Random integers in [lo, hi) as an i32/i64/u8 tensor.
Tensor random_ints(const Shape& shape, plx_dtype d, uint64_t seed, int64_t lo, int64_t hi);

// Tolerances for a result stored in `d` and computed with f32 accumulation (f64 for f64), for
// values of order one: |got - want| <= atol + rtol * |want|.
struct Tol {
  double atol, rtol;
};
Tol tolerance(plx_dtype d);

struct CloseReport {
  bool ok = true;
  size_t count = 0;      // elements compared
  size_t bad = 0;        // elements out of tolerance
  size_t worst = 0;      // index of the largest violation (or largest error)
  double got = 0, want = 0, err = 0;
  std::string str() const;
};
CloseReport compare(const std::vector<double>& got, const std::vector<double>& want, Tol tol);
// Normalised mean squared error sum((g-w)^2) / sum(w^2), the measure ggml's op tests use.
double nmse(const std::vector<double>& got, const std::vector<double>& want);

// CHECK that two vectors agree within a tolerance; on failure prints the worst element.
#define CHECK_ALLCLOSE(got, want, tol)                                          \
  do {                                                                          \
    const auto plx_r_ = ::plexus::test::compare((got), (want), (tol));          \
    INFO(plx_r_.str());                                                         \
    CHECK(plx_r_.ok);                                                           \
  } while (0)

struct GradCheck {
  double eps = 1e-6;     // central-difference step
  Tol tol{1e-6, 1e-5};   // analytic vs numeric
  std::vector<int> inputs;   // inputs to check; default: every float input without NO_GRAD
  std::vector<int> outputs;  // outputs in the loss; default: every float output without NO_GRAD
  uint64_t seed = 1234;      // for the upstream gradients
};

// Checks op's gradient formula (through call_grad, so the core's formula and the backward
// kernels together) against central finite differences of L = sum_k <dy_k, y_k> in f64.
// `inputs` must be f64 where they are floats (integer inputs are passed through).
void check_gradients(const std::string& op, const std::vector<Tensor>& inputs,
                     const Attrs& attrs = {}, GradCheck opts = {});
// The same on backend `b` (of any runtime: a test's own, with fixture plugins); inputs on
// another backend are copied to it.
void check_gradients(Backend& b, const std::string& op, const std::vector<Tensor>& inputs,
                     const Attrs& attrs = {}, GradCheck opts = {});

// Appends what a training step adds to a forward graph, as the tests build it: softmax
// cross-entropy of `logits` (N, classes) against `labels` (N), marked as output "loss_out",
// the backward pass to every parameter, and SGD with momentum 0.9 reading the input "lr".
// Returns the gradients, in g.parameters() order (invalid where none reaches a parameter).
std::vector<Var> add_sgd_step(Graph& g, Var logits, Var labels);
// Runs such a step `steps` times on fixed inputs and returns each run's "loss_out".
std::vector<double> train_losses(Executable& exe, int steps);

// A small, quick training configuration writing to `out`: SimpleCNN on 512 synthetic samples, 3
// epochs of 4 steps, seed 5, no progress output; `extra` is more TOML after it.
Config small_train_config(const std::filesystem::path& out, const std::string& extra = "");
// Trains as `c` says (resuming `resume` when given) with every step's loss kept and the progress
// output discarded.
TrainResult run_training(const Config& c, const std::string& resume = "");

// A fresh directory under the system's temporary directory ("plexus-<tag>-<pid>-<n>"), removed
// with its contents when the object dies.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "tmp");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::set<std::string> entries() const;  // file names directly inside
};

// Row-major flat index helpers for reference loops.
inline int64_t idx4(const Shape& s, int64_t a, int64_t b, int64_t c, int64_t d) {
  return ((a * s[1] + b) * s[2] + c) * s[3] + d;
}

}  // namespace plexus::test
