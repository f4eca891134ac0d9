// `plexus compare`: the same work on two backends, side by side.
//
// Three sections, each optional:
// - ops: every item of a suite (a TOML file, or the built-in default that covers every op) in
//   every dtype either backend registers for it. An item is one op on inputs of given shapes and
//   value ranges; each backend runs the op as a one-node graph through the executor (kernels
//   resolved once, as in training), and, when the op has a gradient formula, that formula's
//   nodes too (the "backward" row, fed the same random output gradient on both sides).
// - step: one training step of the config's model on the config's first batch, from the same
//   initial weights: the loss, every parameter's gradient, and every parameter and state after
//   the update.
// - train: N steps of `plexus train` on each backend (the config's run with train.max_steps =
//   N): the two loss curves and the time per step.
//
// Per row: the largest absolute and relative error of backend b against backend a, a normalised
// error (NMSE: sum (b - a)^2 / sum a^2, over the elements finite on both sides), non-finite values
// that disagree, pass or fail against the tolerance of the row's dtype, the median time on each
// backend (after warm-up runs, device-synchronised: events around the kernels on each backend's
// stream) and the speed-up (time on a / time on b). A row a backend cannot run (no kernel, or
// every kernel declined) is listed as unsupported there, with the reason, and neither passes
// nor fails. docs/compare.md is the reference.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/attrs.hpp"
#include "plexus/config.hpp"
#include "plexus/op_schema.hpp"

namespace plexus {

class Runtime;

// ---- the ops suite ----

// How one input of a suite item is made. Values are drawn from a counter-based generator keyed
// by the run's seed, the item, the dtype and the input, so both backends (and every rerun with
// the same seed) see the same bytes.
struct SuiteInput {
  enum class Kind : uint8_t {
    Absent,   // an optional input left out
    Uniform,  // uniform in [lo, hi)
    Nonzero,  // magnitude uniform in [lo, hi), random sign (divisors)
    Ints,     // integers uniform in [lo, hi)
    Value,    // every element `lo`
  };
  Kind kind = Kind::Uniform;
  Shape shape;
  plx_dtype dtype = PLX_DTYPE_NONE;  // none: the item's dtype
  double lo = -1, hi = 1;
};

struct SuiteItem {
  std::string op;
  std::string what;  // a description; empty: made from the shapes and attributes
  Attrs attrs;
  std::vector<SuiteInput> inputs;
  std::vector<plx_dtype> dtypes;  // empty: every dtype either backend registers for the op
  bool backward = true;           // also run the op's gradient formula, if it has one
  std::optional<double> nmse;     // this item's tolerance for every dtype (default: the suite's)
  std::string where;              // "suite.toml:12:1"
};

struct Suite {
  std::string name;
  std::string source;
  std::vector<SuiteItem> items;
  std::map<plx_dtype, double> nmse;  // tolerance overrides by dtype ([tolerance] table)
};

// Parses a suite. ConfigError listing every problem as "source:line:column: ...". Ops and
// attributes are checked against `ops` when given (an op no plugin registers is an error there).
Suite parse_suite(std::string_view toml_text, const std::string& source,
                  const OpRegistry* ops = nullptr);
Suite load_suite(const std::string& path, const OpRegistry* ops = nullptr);
// The built-in suite (configs/compare/ops.toml, compiled in): every op the core defines.
const std::string& default_suite_text();
Suite default_suite(const OpRegistry* ops = nullptr);

// ---- tolerances ----

// The NMSE a row of this dtype may reach and pass: f64 1e-20, f32 1e-9 (rounding, summation
// order, cuDNN's Winograd and FFT algorithms), f16 1e-5 and bf16 1e-4 (one rounding of the stored
// result, which may fall either side); integers and masks must match exactly. `step` rows (a
// whole training step, where a ReLU or max-pool decision within rounding of a tie may flip and
// move a whole term of a gradient) allow 100 times more.
double default_nmse(plx_dtype d, bool step = false);

// Errors of `got` against `want` (same element count).
struct ErrorStats {
  double max_abs = 0;  // largest |got - want| over elements finite on both sides
  double max_rel = 0;  // largest |got - want| / |want| over those with want != 0
  double nmse = 0;     // sum (got - want)^2 / sum want^2 (the plain sum of squares if want is 0)
  int64_t nonfinite_mismatch = 0;  // NaN or infinities that differ (NaN vs a number, +inf vs -inf)
  int64_t elements = 0;
  // Merges another tensor's statistics into these (maxima; NMSE: the worst of the two).
  void merge(const ErrorStats& o);
};
ErrorStats error_stats(const std::vector<double>& got, const std::vector<double>& want);

// ---- running a comparison ----

struct CompareOptions {
  std::string a = "cpu";  // the reference
  std::string b;          // empty: the best other backend present (see pick_backend_b)
  bool ops = true, step = true, train = true;  // sections
  std::string suite_file;                      // empty: the built-in suite
  std::vector<std::string> only_ops;           // ops section: only items of these ops
  std::vector<plx_dtype> dtypes;               // ops section: only these dtypes
  int repeats = 10;  // timed runs per row (median kept)
  int warmup = 2;    // untimed runs before them
  int64_t steps = 50;  // train section: steps per backend
  uint64_t seed = 1;   // the ops section's input generator
  std::map<plx_dtype, double> nmse;  // tolerance overrides (after the suite's)
  double curve_rtol = 0.05;  // train: the last tenth's mean loss may differ by this fraction
  int32_t device_a = 0, device_b = 0;
};

// The default backend b: the first backend other than a with devices of its own, else the first
// other backend with any device, else a itself (a comparison of a backend with itself still
// checks the suite and times it; the report says so).
std::string pick_backend_b(Runtime& rt, const std::string& a);

struct CompareRow {
  enum class Status : uint8_t { Pass, Fail, UnsupportedA, UnsupportedB, Error };
  std::string section;  // "ops", "step", "train"
  std::string name;     // op name; "loss", "grad conv1.weight", "conv1.weight", "loss curve"
  std::string pass;     // "forward", "backward", "update", "step", "train"
  std::string dtype;    // "f32"; "" for none
  std::string what;     // shapes and attributes
  std::string ops_run;  // the ops of the row's kernels (a backward row: its formula's)
  Status status = Status::Pass;
  std::string note;     // why unsupported, what failed, which tensor is the worst
  ErrorStats err;
  double tolerance = 0;  // the NMSE the row may reach (train rows: curve_rtol)
  double ms_a = -1, ms_b = -1;  // median time, -1 if not timed
  double speedup() const { return ms_a > 0 && ms_b > 0 ? ms_a / ms_b : 0; }
  bool failed() const { return status == Status::Fail || status == Status::Error; }
};
const char* status_name(CompareRow::Status s);  // "pass", "FAIL", "unsupported on a", ...

struct LossCurves {
  std::vector<double> a, b;   // per step
  double ms_a = 0, ms_b = 0;  // median time per step
};

struct CompareReport {
  std::string a, b;                // backend names
  std::string device_a, device_b;  // device names
  std::string suite;               // the suite's name and source
  std::string model;               // the step and train sections' model
  std::vector<CompareRow> rows;
  LossCurves curves;               // empty unless the train section ran
  std::map<std::string, std::vector<std::string>> ops_covered;  // op -> dtypes run on both
  int64_t passed() const;
  int64_t failed() const;
  int64_t unsupported() const;
  bool ok() const { return failed() == 0; }
};

// Runs the sections `options` asks for. `config` gives the plugins' options (already in `rt`),
// and for the step and train sections the model, data, batch and optimizer (backend.name is
// replaced by each of a and b). Rows are written to `live` as they finish (the table's lines),
// if given. Throws ConfigError for bad options, a bad suite or config; failures of the work
// itself become rows.
CompareReport run_compare(Runtime& rt, const Config& config, const CompareOptions& options,
                          std::ostream* live = nullptr);

// ---- output ----

// The terminal table: a header, one line per row, a summary.
std::string compare_table_header(const CompareReport& r);
std::string compare_table_row(const CompareReport& r, const CompareRow& row);
std::string compare_summary(const CompareReport& r);
std::string compare_json(const CompareReport& r);
// One line per row (with a header line); RFC 4180 quoting.
std::string compare_csv(const CompareReport& r);
// The loss curves: step, loss_a, loss_b (with a header line); "" if there are none.
std::string compare_curves_csv(const CompareReport& r);
// Draws the speed-ups of the ops and step rows (log scale, failures marked) and the loss curves
// into a PNG with gnuplot. Error naming what is missing if gnuplot is not installed (Debian:
// gnuplot-nox) or fails.
void write_compare_plot(const CompareReport& r, const std::string& png_path);

}  // namespace plexus
