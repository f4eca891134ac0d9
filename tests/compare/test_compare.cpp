// plexus compare: the suite format, the built-in suite's coverage, the error statistics, rows a
// backend cannot run or gets wrong, the step and train sections, and the command line's outputs
// and exit codes.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plexus/compare.hpp"
#include "plexus/config.hpp"
#include "plexus/json.hpp"
#include "support/cli.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;
namespace fs = std::filesystem;

namespace {

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p.string();
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const CompareRow* find_row(const CompareReport& r, const std::string& name, const std::string& pass,
                           const std::string& dtype = "f32") {
  for (const CompareRow& row : r.rows)
    if (row.name == name && row.pass == pass && row.dtype == dtype) return &row;
  return nullptr;
}

// A runtime with the build tree's plugins and the deliberately wrong "wrongdev" backend.
Runtime& runtime_with_wrong() {
  static Runtime rt = [] {
    RuntimeOptions o;
    o.plugins.use_env = false;
    o.plugins.use_default_dir = false;
    o.plugins.paths = {plugin_dir(), fixture_dir() + "/wrong"};
    return Runtime(o);
  }();
  return rt;
}

// relu (wrong on wrongdev), sigmoid (right there), mul (no kernel there).
const char* const kSmallSuite = R"(
[[item]]
op = "relu"
inputs = [{ shape = [64, 33], range = [-2, 2] }]
[[item]]
op = "sigmoid"
inputs = [{ shape = [257], range = [-6, 6] }]
[[item]]
op = "mul"
inputs = [{ shape = [8] }, { shape = [8] }]
)";

CompareOptions quick(const std::string& b) {
  CompareOptions o;
  o.b = b;
  o.step = o.train = false;
  o.repeats = 1;
  o.warmup = 0;
  return o;
}

}  // namespace

TEST_CASE("compare suites name the file line and key of every problem", "[cpu][compare]") {
  const OpRegistry& ops = runtime().ops();
  const std::string bad = R"(name = "bad"
[[item]]
op = "relu"
inputs = [{ shape = [2, -3] }]

[[item]]
op = "no_such_op"

[[item]]
op = "softmax"
attrs = { axes = 1 }
inputs = [{ shape = [4, 5], range = [1, 0] }]

[[item]]
op = "matmul"
inputs = [{ shape = [2, 3] }]
colour = "blue"
)";
  try {
    parse_suite(bad, "bad.toml", &ops);
    FAIL("a bad suite parsed");
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    CHECK_THAT(m, PLX_CONTAINS("bad.toml:4:"));
    CHECK_THAT(m, PLX_CONTAINS("inputs[0].shape: expected an array of integers >= 0"));
    CHECK_THAT(m, PLX_CONTAINS("bad.toml:7:"));
    CHECK_THAT(m, PLX_CONTAINS("unknown op 'no_such_op'"));
    CHECK_THAT(m, PLX_CONTAINS("attrs.axes: op 'softmax' has no attribute 'axes' (attributes: axis)"));
    CHECK_THAT(m, PLX_CONTAINS("inputs[0].range: expected low < high"));
    CHECK_THAT(m, PLX_CONTAINS("input 1 'b' is required, the item gives 1 inputs"));
    CHECK_THAT(m, PLX_CONTAINS("unknown key 'colour' in an item"));
  }
  CHECK_THROWS_WITH(parse_suite("name = 3 [", "syntax.toml"), PLX_CONTAINS("syntax.toml:1:"));
  CHECK_THROWS_WITH(parse_suite("name = \"empty\"", "empty.toml"), PLX_CONTAINS("no [[item]] tables"));
  CHECK_THROWS_WITH(load_suite("/nonexistent/suite.toml"),
                    PLX_CONTAINS("/nonexistent/suite.toml: cannot open the suite file"));

  const Suite s = parse_suite(R"(
[tolerance]
f32 = 1e-7
[[item]]
op = "linear"
what = "head"
dtypes = ["f32", "bf16"]
backward = false
nmse = 1e-6
inputs = [{ shape = [4, 8] }, { shape = [3, 8], nonzero = [0.5, 1] }, { absent = true }]
[[item]]
op = "embedding"
inputs = [{ shape = [10, 4] }, { shape = [5], ints = [0, 10], dtype = "i64" }]
)", "good.toml", &ops);
  REQUIRE(s.items.size() == 2);
  CHECK(s.nmse.at(PLX_F32) == 1e-7);
  const SuiteItem& a = s.items[0];
  CHECK(a.what == "head");
  CHECK(a.dtypes == std::vector<plx_dtype>{PLX_F32, PLX_BF16});
  CHECK_FALSE(a.backward);
  CHECK(*a.nmse == 1e-6);
  REQUIRE(a.inputs.size() == 3);
  CHECK(a.inputs[1].kind == SuiteInput::Kind::Nonzero);
  CHECK(a.inputs[2].kind == SuiteInput::Kind::Absent);
  CHECK(s.items[1].inputs[1].kind == SuiteInput::Kind::Ints);
  CHECK(s.items[1].inputs[1].dtype == PLX_I64);
}

TEST_CASE("error statistics of compare rows", "[cpu][compare]") {
  const double nan = std::nan("");
  const ErrorStats s = error_stats({1.0, 2.5, -4.0, nan, 0.0}, {1.0, 2.0, -5.0, nan, 0.0});
  CHECK(s.max_abs == 1.0);
  CHECK(s.max_rel == Approx(0.25));
  CHECK(s.nmse == Approx((0.25 + 1.0) / (1.0 + 4.0 + 25.0)));
  CHECK(s.nonfinite_mismatch == 0);
  CHECK(s.elements == 5);
  const ErrorStats t = error_stats({nan, 1.0, INFINITY}, {1.0, 1.0, -INFINITY});
  CHECK(t.nonfinite_mismatch == 2);
  CHECK(t.nmse == 0);
  CHECK(default_nmse(PLX_F32) == 1e-9);
  CHECK(default_nmse(PLX_BF16, true) == Approx(1e-2));
  CHECK(default_nmse(PLX_I32) == 0);
}

TEST_CASE("the built-in compare suite runs every op and dtype the cpu registers", "[cpu][compare]") {
  CompareOptions o = quick("cpu");
  const CompareReport r = run_compare(runtime(), Config(), o);
  CHECK(r.a == "cpu");
  CHECK(r.b == "cpu");
  CHECK(r.failed() == 0);
  for (const CompareRow& row : r.rows)
    if (row.failed()) FAIL_CHECK(row.name << " " << row.pass << " " << row.dtype << ": " << row.note);
  for (const auto& [op, dtypes] : cpu().supported_ops()) {
    INFO("op " << op);
    const auto it = r.ops_covered.find(op);
    REQUIRE(it != r.ops_covered.end());
    for (plx_dtype d : dtypes) {
      INFO("dtype " << dtype_name(d));
      CHECK(std::find(it->second.begin(), it->second.end(), dtype_name(d)) != it->second.end());
    }
  }
  // Forward and backward rows, timed on both sides.
  const CompareRow* conv = find_row(r, "conv2d", "backward");
  REQUIRE(conv);
  CHECK_THAT(conv->ops_run, PLX_CONTAINS("conv2d_backward_data"));
  CHECK_THAT(conv->ops_run, PLX_CONTAINS("conv2d_backward_weight"));
  CHECK(conv->ms_a > 0);
  CHECK(conv->ms_b > 0);
  // A forward row names the kernel that ran on each side.
  const CompareRow* conv_f = find_row(r, "conv2d", "forward");
  REQUIRE(conv_f);
  CHECK_THAT(conv_f->ops_run, PLX_CONTAINS("conv2d (cpu/"));
  const CompareRow* sgd = find_row(r, "sgd_update", "update");
  REQUIRE(sgd);
  CHECK(sgd->status == CompareRow::Status::Pass);
}

TEST_CASE("compare lists ops a backend cannot run and fails the ones it gets wrong", "[cpu][compare]") {
  TempDir dir("compare");
  const std::string suite = write(dir.path / "suite.toml", kSmallSuite);
  CompareOptions o = quick("wrongdev");
  o.suite_file = suite;
  o.dtypes = {PLX_F32, PLX_F64};
  std::ostringstream live;
  const CompareReport r = run_compare(runtime_with_wrong(), Config(), o, &live);
  CHECK(r.b == "wrongdev");

  const CompareRow* relu = find_row(r, "relu", "forward");
  REQUIRE(relu);
  CHECK(relu->status == CompareRow::Status::Fail);
  CHECK(relu->err.max_abs == Approx(1e-3).epsilon(1e-3));
  CHECK(relu->err.nmse > relu->tolerance);
  // relu_backward: wrongdev has no kernel, so the backward cannot run there.
  const CompareRow* relu_b = find_row(r, "relu", "backward");
  REQUIRE(relu_b);
  CHECK(relu_b->status == CompareRow::Status::UnsupportedB);
  CHECK_THAT(relu_b->note, PLX_CONTAINS("relu_backward"));

  const CompareRow* sig = find_row(r, "sigmoid", "forward");
  REQUIRE(sig);
  CHECK(sig->status == CompareRow::Status::Pass);
  CHECK(sig->err.nmse <= sig->tolerance);
  CHECK(sig->ms_a > 0);
  CHECK(sig->ms_b > 0);

  // Listed, not dropped: mul has no kernel there; f64 rows exist for every op.
  const CompareRow* mul = find_row(r, "mul", "forward");
  REQUIRE(mul);
  CHECK(mul->status == CompareRow::Status::UnsupportedB);
  CHECK_THAT(mul->note, PLX_CONTAINS("no kernel for mul (f32) on wrongdev"));
  const CompareRow* sig64 = find_row(r, "sigmoid", "forward", "f64");
  REQUIRE(sig64);
  CHECK(sig64->status == CompareRow::Status::UnsupportedB);

  CHECK_FALSE(r.ok());
  CHECK(r.failed() == 1);
  CHECK(r.passed() == 1);
  CHECK(r.unsupported() == static_cast<int64_t>(r.rows.size()) - 2);
  CHECK_THAT(live.str(), PLX_CONTAINS("FAILED: ops/relu f32"));

  // The outputs carry every row.
  const JsonValue j = parse_json(compare_json(r));
  CHECK(j.at("failed").integer == 1);
  CHECK(j.at("rows").items.size() == r.rows.size());
  const std::string csv = compare_csv(r);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == static_cast<long>(r.rows.size()) + 1);
  CHECK_THAT(csv, PLX_CONTAINS("ops,relu,forward,f32,"));
}

TEST_CASE("compare runs a training step and training curves on two backends", "[cpu][compare]") {
  TempDir dir("compare-train");
  Config cfg;
  cfg.set("model.name=\"mlp\"");
  cfg.set("data.dataset=\"synthetic\"");
  cfg.set("data.synthetic_samples=512");
  cfg.set("train.batch_size=32");
  cfg.set("train.optimizer=\"adamw\"");
  cfg.set("train.lr=0.001");
  CompareOptions o;
  o.b = "cpu";
  o.ops = false;
  o.steps = 12;
  o.repeats = 2;
  o.warmup = 1;
  const CompareReport r = run_compare(runtime(), cfg, o);
  CHECK(r.ok());
  CHECK(r.model == "mlp");
  const CompareRow* loss = find_row(r, "loss", "step");
  REQUIRE(loss);
  CHECK(loss->status == CompareRow::Status::Pass);
  CHECK(loss->ms_a > 0);
  // Every parameter: its gradient and its value after the update; the optimizer's moments.
  int grads = 0, updated = 0, states = 0;
  for (const CompareRow& row : r.rows) {
    if (row.section != "step") continue;
    grads += row.name.rfind("grad ", 0) == 0;
    updated += row.name.find("(updated)") != std::string::npos;
    states += row.name.find("(state)") != std::string::npos;
  }
  CHECK(grads == 6);  // mlp: three linear layers
  CHECK(updated == 6);
  CHECK(states == 12);  // AdamW: two moments each
  REQUIRE(r.curves.a.size() == 12);
  REQUIRE(r.curves.b.size() == 12);
  CHECK(r.curves.a == r.curves.b);  // the same backend twice: the same run
  CHECK(r.curves.ms_a > 0);
  const CompareRow* curve = find_row(r, "loss curve", "train");
  REQUIRE(curve);
  CHECK(curve->status == CompareRow::Status::Pass);
  CHECK_THAT(curve->note, PLX_CONTAINS("mean loss of the last"));

  // The step follows train.precision: a bf16 step, held to bf16's step tolerance.
  cfg.set("train.precision=\"bf16\"");
  o.train = false;
  const CompareReport h = run_compare(runtime(), cfg, o);
  CHECK(h.ok());
  const CompareRow* hl = find_row(h, "loss", "step");
  REQUIRE(hl);
  CHECK_THAT(hl->what, PLX_CONTAINS("bf16"));
  CHECK(hl->tolerance == default_nmse(PLX_BF16, true));

  // f16: the step with its loss scale, as training runs it; the scaler's states are rows.
  cfg.set("train.precision=\"f16\"");
  cfg.set("train.loss_scale_init=1024");
  const CompareReport f = run_compare(runtime(), cfg, o);
  CHECK(f.ok());
  const CompareRow* scale = find_row(f, "loss_scaler.scale (state)", "step");
  REQUIRE(scale);
  CHECK(scale->status == CompareRow::Status::Pass);
}

TEST_CASE("plexus compare writes its outputs and exits 1 when a row fails", "[cpu][compare][cli]") {
  TempDir dir("compare-cli");
  const std::string suite = write(dir.path / "suite.toml", kSmallSuite);
  const fs::path json = dir.path / "out.json", csv = dir.path / "out.csv", png = dir.path / "out.png";
  const std::string files = " --json " + json.string() + " --csv " + csv.string() + " --plot " + png.string();
  // The cpu against itself: everything passes.
  Run ok = run_plexus("compare --only ops --repeats 2 --dtypes f32 --suite " + suite + files);
  INFO(ok.output);
  const bool have_gnuplot = std::system("command -v gnuplot >/dev/null 2>&1") == 0;
  if (have_gnuplot) {
    CHECK(ok.status == 0);
    const std::string p = read(png);
    REQUIRE(p.size() > 8);
    CHECK(p.substr(1, 3) == "PNG");
  } else {
    // Nothing measured is lost: the JSON and CSV are written, the missing tool is named.
    CHECK(ok.status == 1);
    CHECK_THAT(ok.output, PLX_CONTAINS("gnuplot is not on the PATH"));
  }
  CHECK_THAT(ok.output, PLX_CONTAINS("a = cpu"));
  CHECK_THAT(ok.output, PLX_CONTAINS("6 rows: 6 passed, 0 failed"));
  const JsonValue j = parse_json(read(json));
  CHECK(j.at("rows").items.size() == 6);
  CHECK_THAT(read(csv), PLX_CONTAINS("section,item,pass,dtype"));

  // A backend that gets relu wrong: exit 1, the failure named.
  Run bad = run_plexus("compare --only ops --repeats 1 --dtypes f32 --b wrongdev --suite " + suite,
                       "PLEXUS_PLUGIN_PATH=" + fixture_dir() + "/wrong");
  INFO(bad.output);
  CHECK(bad.status == 1);
  CHECK_THAT(bad.output, PLX_CONTAINS("FAILED: ops/relu f32"));
  CHECK_THAT(bad.output, PLX_CONTAINS("unsupported on b"));

  // Usage errors exit 2 and name the option.
  Run r = run_plexus("compare --only opz");
  CHECK(r.status == 2);
  CHECK_THAT(r.output, PLX_CONTAINS("--only: unknown section 'opz'"));
  r = run_plexus("compare --nmse f33=1");
  CHECK(r.status == 2);
  CHECK_THAT(r.output, PLX_CONTAINS("--nmse"));
  r = run_plexus("compare --only ops --ops no_such_op");
  CHECK(r.status == 2);
  CHECK_THAT(r.output, PLX_CONTAINS("--ops: unknown op 'no_such_op'"));
  r = run_plexus("compare --only ops --b nosuchbackend");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, PLX_CONTAINS("unknown backend 'nosuchbackend'"));
}
