// Comparing a backend under test with the CPU reference, op by op (in the spirit of ggml's
// test-backend-ops).
//
// A Case names an op, its attributes and a generator of its inputs. For each dtype the CPU
// registers for the op, the engine makes the inputs on the CPU, runs the op there with the
// ordinary eager call (the reference), then copies the same bytes to the backend under test and
// runs the op there through resolve_kernel() with output buffers the engine allocated itself:
//
// - Every output lies inside a larger buffer filled with a poison byte, so an element the kernel
//   does not write keeps the poison, and a write just before or after the output lands in the
//   guard bytes around it. Each case runs twice, with poison 0xFF (NaN in every float dtype, -1
//   in the integers) and 0x5A (finite in every dtype), so no reference value can pass for an
//   unwritten element in both runs. The kernel's workspace is poisoned the same way.
// - Outputs are compared by dtype: integers exactly; floats within |got - want| <= atol + rtol *
//   |want| (atol growing with the square root of the number of terms summed into an output) and
//   by NMSE over the whole output; NaN and infinities must match exactly. Inputs the op writes in
//   place (running statistics, optimizer state) are compared after the call the same way; inputs
//   it must not write are checked byte for byte.
// - An op the CPU registers in f32, f16 or bf16 for which the backend under test has no kernel is
//   a failure, and so is a kernel that declines a valid case. Integer and f64 variants the backend
//   lacks are reported, not failed.
// - Cases marked `error` hold data a kernel must reject (a label out of range, an index out of
//   range, integer division by zero, an AdamW step below 1): both backends must fail.
//
// Inputs are fresh for every case and dtype: seeded from the base seed, the case's index and the
// dtype, and printed with every failure. PLEXUS_CMP_SEED sets the base seed (a number, or
// "random"), PLEXUS_CMP_OPS restricts the run to a comma-separated list of ops and
// PLEXUS_CMP_CASE to one case index, so a failure can be run again alone.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "support/harness.hpp"

namespace plexus::test::cmp {

// Makes the inputs of one case run, on the CPU. Every tensor it makes draws from its own
// stream, derived from the run's seed and a counter.
class Gen {
 public:
  Gen(plx_dtype type, uint64_t seed) : T(type), seed_(seed) {}

  const plx_dtype T;  // the dtype under test (of the op's type input)
  uint64_t seed() const { return seed_; }

  // Uniform in [lo, hi), rounded to `d` (PLX_DTYPE_NONE: T).
  Tensor uniform(const Shape& s, double lo = -1, double hi = 1, plx_dtype d = PLX_DTYPE_NONE);
  // Magnitude uniform in [lo, hi) and a random sign: divisors, away from zero.
  Tensor nonzero(const Shape& s, double lo, double hi, plx_dtype d = PLX_DTYPE_NONE);
  // Integers uniform in [lo, hi) (any integer dtype, or a float dtype holding whole numbers).
  Tensor ints(const Shape& s, plx_dtype d, int64_t lo, int64_t hi);
  // Integers drawn from [lo, hi) except that about one in `every` is `rare` (labels with
  // ignore_index rows, say).
  Tensor ints_with(const Shape& s, plx_dtype d, int64_t lo, int64_t hi, int64_t rare, int every);
  // Exactly these values (converted to `d`; integer targets take them as int64).
  Tensor values(const Shape& s, const std::vector<double>& v, plx_dtype d = PLX_DTYPE_NONE);
  Tensor int_values(const Shape& s, const std::vector<int64_t>& v, plx_dtype d);
  // Uniform in [lo, hi), with `specials` written at the first positions and then about one
  // element in `every` replaced by a random special.
  Tensor with_specials(const Shape& s, double lo, double hi, const std::vector<double>& specials,
                       int every, plx_dtype d = PLX_DTYPE_NONE);
  // A tensor of shape `s` (() by default) holding `v`.
  Tensor scalar(double v, plx_dtype d, const Shape& s = {});
  // Runs an op on the CPU: inputs derived from others (softmax outputs for softmax_backward,
  // max-pool indices for max_pool2d_backward, saved statistics for the norm backward ops).
  std::vector<Tensor> cpu(std::string_view op, const std::vector<Tensor>& inputs,
                          const Attrs& attrs = {});
  // Uniform doubles, from this run's next stream.
  std::vector<double> doubles(size_t n, double lo, double hi);
  std::mt19937_64 next_rng();

 private:
  plx_dtype pick(plx_dtype d) const { return d == PLX_DTYPE_NONE ? T : d; }
  uint64_t seed_;
  uint64_t counter_ = 0;
};

// One input: a contiguous CPU tensor (undefined for an absent optional input) and, optionally, a
// view applied to it on each backend after the copy (a permuted or narrowed input for `copy`).
struct Input {
  Input() = default;
  Input(Tensor t) : tensor(std::move(t)) {}  // NOLINT: implicit, so {a, b, c} lists work
  Input(Tensor t, std::function<Tensor(const Tensor&)> v) : tensor(std::move(t)), view(std::move(v)) {}
  Tensor tensor;
  std::function<Tensor(const Tensor&)> view;
};

struct Case {
  std::string op;
  std::string what;  // a short description: "axis -1", "stride 2, groups 2"
  Attrs attrs;
  std::function<std::vector<Input>(Gen&)> inputs;
  // Dtypes of the type input to run; empty: every dtype the CPU registers for the op.
  std::vector<plx_dtype> dtypes;
  int64_t terms = 1;   // values summed into one output (scales the tolerance), 1: elementwise
  bool exact = false;  // float outputs must match exactly too (cast, copy, expand)
  bool tf32 = false;   // an f32 GEMM or convolution: also run with TF32 and its tolerance
  bool error = false;  // the data is invalid: both backends must raise an error
  int64_t id = -1;     // index in all_cases() (seeds derive from it), set by all_cases()
};

// Every case: each op the CPU plugin registers, on several shapes and attribute sets.
const std::vector<Case>& all_cases();

struct Tolerance {
  double atol = 0, rtol = 0, nmse = 0;
  bool exact = false;
};
// The tolerance for a float output stored in `d` summing `terms` values each (of order one).
Tolerance tolerance_for(plx_dtype d, int64_t terms, bool tf32);

// Compares two tensors of the same shape and dtype (any backends): "" if `got` matches `want`
// within `tol` (integers always exactly), else what differs, with the first and worst element.
std::string compare_tensors(const Tensor& got, const Tensor& want, const Tolerance& tol);
// Normalised mean squared error of `got` against `want` over the elements where both are finite,
// and the number of elements where they are not finite in the same way (NaN vs a number, ...).
struct Nmse {
  double nmse = 0;
  int64_t mismatched_nonfinite = 0;
};
Nmse nmse_of(const Tensor& got, const Tensor& want);

// What a tamper hook sees after the run on the backend under test and before the comparison:
// the engine's own tests use it to break a correct result on purpose.
struct RunState {
  const Case& c;
  plx_dtype dtype;
  uint8_t poison;
  std::vector<Tensor> outputs;  // the op's outputs (inside their guarded buffers)
  std::vector<Tensor> buffers;  // the guarded buffers, u8, kGuardBytes before and after
  std::vector<Tensor> inputs;   // the inputs as passed (views applied), undefined if absent
};
inline constexpr uint64_t kGuardBytes = 256;

struct Options {
  uint64_t seed = 0;
  bool tf32 = false;  // only the cases marked tf32, in f32, with the TF32 tolerance
  std::vector<std::string> ops;  // only these ops (all if empty)
  int64_t only_case = -1;        // only this case index (all if negative)
  std::function<void(RunState&)> tamper;
  // Stop listing failures after this many (the count stays right).
  size_t max_failures = 200;
};

// Options from PLEXUS_CMP_SEED, PLEXUS_CMP_OPS and PLEXUS_CMP_CASE (default seed: fixed).
Options options_from_env();

struct Report {
  std::string backend;
  int64_t cases = 0;  // case x dtype combinations run
  int64_t runs = 0;   // runs on the backend under test (two per combination, by poison)
  int64_t failed = 0;
  std::vector<std::string> failures;     // one paragraph each
  std::vector<std::string> missing;      // "op (dtype)": float kernels the backend lacks
  std::vector<std::string> not_covered;  // "op (dtype)": integer/f64 kernels it lacks
  std::map<std::string, int64_t> per_op;           // op -> combinations run
  std::map<std::string, std::vector<plx_dtype>> dtypes_run;  // op -> dtypes compared
  bool ok() const { return failed == 0 && missing.empty(); }
  std::string summary() const;  // counts, then every failure
  std::string coverage() const;  // one line per op: combinations run and their dtypes
};

// Runs `cases` with `under_test` against the CPU backend of the tests' runtime. The backend may
// belong to another runtime (ops are looked up by name in each).
Report run_cases(Backend& under_test, const std::vector<Case>& cases, const Options& options);
// The same with the backend under test named in the tests' runtime ("cuda", "cpu"); throws
// plexus::PluginError naming the loaded backends if there is none of that name.
Report run_cases(std::string_view backend, const std::vector<Case>& cases, const Options& options);

// The cases of all_cases() for `op` (for the engine's own tests).
std::vector<Case> cases_of(std::string_view op);

}  // namespace plexus::test::cmp
