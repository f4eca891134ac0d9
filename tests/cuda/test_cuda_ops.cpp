// The CUDA backend against the CPU reference, op by op (compare.hpp, cases.cpp), and the tests
// that keep the comparison itself honest on a machine without a GPU: the same engine with the
// CPU as the backend under test must pass, a broken result must not, and the CUDA plugin must
// load and say why it has no device.
#include <algorithm>
#include <cstring>
#include <set>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "plexus/runtime.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::cmp;

namespace {

bool has_failure_with(const Report& r, const std::string& text) {
  return std::any_of(r.failures.begin(), r.failures.end(),
                     [&](const std::string& f) { return f.find(text) != std::string::npos; });
}

// The cases of all_cases() for `op` whose description contains `what`.
std::vector<Case> pick(const std::string& op, const std::string& what) {
  std::vector<Case> out;
  for (const Case& c : cases_of(op))
    if (c.what.find(what) != std::string::npos) out.push_back(c);
  REQUIRE_FALSE(out.empty());
  return out;
}

// Writes `bytes` over the start of `t` (any backend) from host memory.
void overwrite(const Tensor& t, const std::vector<uint8_t>& bytes, uint64_t byte_offset = 0) {
  Tensor view = t.reshape({t.numel()}).alias(PLX_U8, {static_cast<int64_t>(bytes.size())}, byte_offset);
  view.copy_from_host(bytes.data());
}

}  // namespace

TEST_CASE("cuda ops match the cpu reference", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_guard(gpu);
  const Options o = options_from_env();
  const Report r = run_cases("cuda", all_cases(), o);
  INFO("seed " << o.seed << "\n" << r.summary());
  CHECK(r.missing.empty());
  CHECK(r.failed == 0);
  CHECK(r.cases > 0);

  // The f32 GEMMs and convolutions again with TF32, against its looser tolerance.
  if (cuda::set_tf32(gpu, true)) {
    Options t = o;
    t.tf32 = true;
    const Report rt = run_cases("cuda", all_cases(), t);
    cuda::set_tf32(gpu, false);
    INFO("TF32:\n" << rt.summary());
    CHECK(rt.failed == 0);
    WARN("TF32: " << rt.cases << " case/dtype combinations, " << rt.failed << " failed");
  } else {
    FAIL("the cuda backend has no \"cuda.set_tf32\" extra");
  }
  WARN(r.summary().substr(0, r.summary().find('\n')) << "\n" << r.coverage());
}

TEST_CASE("the op comparison engine passes with the cpu backend under test", "[cpu][compare]") {
  // The same engine, case table, generators, poisoning and comparisons as the CUDA test, with the
  // CPU against itself: every case must run and match (so the table holds only valid cases).
  const Options o = options_from_env();
  const Report r = run_cases("cpu", all_cases(), o);
  INFO(r.summary());
  CHECK(r.failed == 0);
  CHECK(r.missing.empty());
  CHECK(r.not_covered.empty());
  CHECK(r.runs > r.cases);  // two runs per case, by poison; one for invalid data
  WARN(all_cases().size() << " cases; " << r.summary().substr(0, r.summary().find('\n')) << "\n"
                          << r.coverage());
  if (o.ops.empty() && o.only_case < 0) {
    // Every op and dtype the CPU registers was compared at least once.
    std::string uncovered;
    for (const auto& [op, dtypes] : cpu().supported_ops()) {
      const auto it = r.dtypes_run.find(op);
      for (plx_dtype d : dtypes)
        if (it == r.dtypes_run.end() || std::find(it->second.begin(), it->second.end(), d) == it->second.end())
          uncovered += " " + op + "(" + dtype_name(d) + ")";
    }
    INFO("op/dtype pairs the CPU registers that no case ran:" << uncovered);
    CHECK(uncovered.empty());
    CHECK(r.per_op.size() == cpu().supported_ops().size());
  }
}

TEST_CASE("the op comparison engine catches an output element left unwritten", "[cpu][compare]") {
  // The tamper hook puts the poison back into one element after the run, as if the kernel had
  // skipped it.
  Options o;
  o.seed = 7;
  o.tamper = [](RunState& s) {
    Tensor& y = s.outputs.at(0);
    if (y.numel() == 0) return;
    const uint64_t size = dtype_size(y.dtype());
    overwrite(y, std::vector<uint8_t>(size, s.poison), (static_cast<uint64_t>(y.numel()) - 1) * size);
  };
  SECTION("a float output") {
    const Report r = run_cases(cpu(), pick("relu", "x(7, 33)"), o);
    INFO(r.summary());
    CHECK(r.failed == static_cast<int64_t>(r.cases));
    CHECK(has_failure_with(r, "the poison value: never written?"));
  }
  SECTION("an integer output") {
    const Report r = run_cases(cpu(), pick("argmax", "x(7, 33) axis 0"), o);
    INFO(r.summary());
    CHECK(r.failed > 0);
    CHECK(r.failed == static_cast<int64_t>(r.cases));
  }
  SECTION("a value equal to the first poison is caught by the second") {
    // Casting 300 to u8 saturates to 255 = 0xFF, the first poison: only the run with poison
    // 0x5A can tell an unwritten element from a written one.
    Case c;
    c.op = "cast";
    c.what = "saturating to 255";
    c.attrs = {{"dtype", std::string("u8")}};
    c.dtypes = {PLX_F32};
    c.inputs = [](Gen& g) -> std::vector<Input> { return {g.values({5}, {300, 1, 2, 3, 400})}; };
    const Report r = run_cases(cpu(), {c}, o);
    INFO(r.summary());
    CHECK(r.failed == 1);
    CHECK(has_failure_with(r, "poison 0x5A"));
    CHECK(r.runs == 2);
  }
}

TEST_CASE("the op comparison engine catches writes outside an output", "[cpu][compare]") {
  Options o;
  o.seed = 8;
  SECTION("after the end") {
    o.tamper = [](RunState& s) {
      const uint64_t end = kGuardBytes + s.outputs.at(0).nbytes();
      overwrite(s.buffers.at(0), {static_cast<uint8_t>(s.poison ^ 1)}, end + 3);
    };
    const Report r = run_cases(cpu(), pick("add", "a(33, 65) b(65)"), o);
    INFO(r.summary());
    CHECK(r.failed == static_cast<int64_t>(r.cases));
    CHECK(has_failure_with(r, "wrote at byte 3 past the output's end"));
  }
  SECTION("before the start") {
    o.tamper = [](RunState& s) {
      overwrite(s.buffers.at(0), {static_cast<uint8_t>(s.poison ^ 1)}, kGuardBytes - 1);
    };
    const Report r = run_cases(cpu(), pick("sum", "axes [1, 3]"), o);
    INFO(r.summary());
    CHECK(r.failed == static_cast<int64_t>(r.cases));
    CHECK(has_failure_with(r, "wrote 1 bytes before the output's start"));
  }
}

TEST_CASE("the op comparison engine catches wrong values and writes to inputs", "[cpu][compare]") {
  Options o;
  o.seed = 9;
  SECTION("a value off by more than the tolerance") {
    o.tamper = [](RunState& s) {
      Tensor& y = s.outputs.at(0);
      std::vector<float> v = y.to_vector<float>();
      v[v.size() / 2] += 1e-3f * (1.0f + std::fabs(v[v.size() / 2]));
      y.copy_from_host(v.data());
    };
    Case c = pick("matmul", "a(33, 65) b(65, 17)").at(0);
    c.dtypes = {PLX_F32};
    const Report r = run_cases(cpu(), {c}, o);
    INFO(r.summary());
    CHECK(r.failed == 1);
    CHECK(has_failure_with(r, "out of tolerance"));
  }
  SECTION("a value within the tolerance passes") {
    o.tamper = [](RunState& s) {
      Tensor& y = s.outputs.at(0);
      std::vector<float> v = y.to_vector<float>();
      v[v.size() / 2] *= 1.0f + 1e-6f;
      y.copy_from_host(v.data());
    };
    Case c = pick("matmul", "a(33, 65) b(65, 17)").at(0);
    c.dtypes = {PLX_F32};
    const Report r = run_cases(cpu(), {c}, o);
    INFO(r.summary());
    CHECK(r.failed == 0);
  }
  SECTION("an input the op must not write") {
    o.tamper = [](RunState& s) { overwrite(s.inputs.at(0), {0x12, 0x34}); };
    Case c = pick("softmax", "x(7, 33) axis -1 range 5").at(0);
    const Report r = run_cases(cpu(), {c}, o);
    INFO(r.summary());
    CHECK(r.failed == static_cast<int64_t>(r.cases));
    CHECK(has_failure_with(r, "was modified, but the op must not write it"));
  }
  SECTION("an input written in place with the wrong value") {
    // sgd_update has no outputs: only the comparison of its in-place param can catch this.
    o.tamper = [](RunState& s) {
      Tensor& p = s.inputs.at(0);
      std::vector<float> v = p.to_vector<float>();
      v[0] += 0.5f;
      p.copy_from_host(v.data());
    };
    Case c = pick("sgd_update", "param(7, 33) momentum 0.900000").at(0);
    c.dtypes = {PLX_F32};
    const Report r = run_cases(cpu(), {c}, o);
    INFO(r.summary());
    CHECK(r.failed == 1);
    CHECK(has_failure_with(r, "input 0 'param' (written in place)"));
  }
}

TEST_CASE("the op comparison engine fails missing float kernels and declined cases", "[cpu][compare]") {
  // The test fixture's backend "testdev" registers relu and add in f32 only, and its add
  // declines broadcasting.
  RuntimeOptions ro;
  ro.plugins.paths = {fixture_dir() + "/good"};
  ro.plugins.use_env = false;
  ro.plugins.use_default_dir = false;
  Runtime other(ro);
  Backend& dev = other.backend("testdev");
  Options o;
  o.seed = 10;

  const Report relu = run_cases(dev, pick("relu", "x(7, 33)"), o);
  INFO(relu.summary());
  CHECK(relu.failed == 0);  // its f32 relu is right
  CHECK(relu.cases == 1);
  CHECK(std::find(relu.missing.begin(), relu.missing.end(), "relu (f16)") != relu.missing.end());
  CHECK(std::find(relu.missing.begin(), relu.missing.end(), "relu (bf16)") != relu.missing.end());
  CHECK(std::find(relu.not_covered.begin(), relu.not_covered.end(), "relu (f64)") != relu.not_covered.end());
  CHECK_FALSE(relu.ok());

  const Report tanh = run_cases(dev, pick("tanh", "x(257)"), o);
  CHECK(std::find(tanh.missing.begin(), tanh.missing.end(), "tanh (f32)") != tanh.missing.end());

  Case bc = pick("add", "a(2, 3, 4) b(4)").at(0);
  bc.dtypes = {PLX_F32};
  const Report add = run_cases(dev, {bc}, o);
  INFO(add.summary());
  CHECK(add.failed == 1);
  CHECK(has_failure_with(add, "testdev add does not broadcast"));
}

TEST_CASE("the op comparison engine needs both backends to reject invalid data", "[cpu][compare]") {
  Options o;
  o.seed = 11;
  const Report r = run_cases(cpu(), pick("softmax_cross_entropy", "label 10 of 10 classes"), o);
  INFO(r.summary());
  CHECK(r.failed == 0);
  CHECK(r.cases > 0);
  // A case marked invalid whose data the reference accepts is reported as a wrong case.
  Case c = pick("softmax_cross_entropy", "label 10 of 10 classes").at(0);
  c.inputs = [](Gen& g) -> std::vector<Input> {
    return {g.uniform({4, 10}), g.int_values({4}, {1, 2, 3, 4}, PLX_I32)};
  };
  c.dtypes = {PLX_F32};
  const Report w = run_cases(cpu(), {c}, o);
  CHECK(w.failed == 1);
  CHECK(has_failure_with(w, "the case is wrong"));
}

TEST_CASE("the op comparison seeds inputs from the case and dtype, not the run order", "[cpu][compare]") {
  // A failure prints the base seed and case index; running that case alone must draw the same
  // inputs, whatever ran before it.
  const std::vector<Case> cs = pick("add", "a(7, 33)");
  std::vector<std::vector<double>> seen;
  Options o;
  o.seed = 12;
  o.tamper = [&](RunState& s) {
    if (s.poison == 0xFF && s.dtype == PLX_F32) seen.push_back(s.inputs.at(0).to_doubles());
  };
  run_cases(cpu(), all_cases(), [&] {
    Options a = o;
    a.ops = {"add"};
    return a;
  }());
  const size_t all_runs = seen.size();
  REQUIRE(all_runs > 1);
  Options one = o;
  one.only_case = cs.at(0).id;
  run_cases(cpu(), all_cases(), one);
  REQUIRE(seen.size() == all_runs + 1);
  CHECK(std::find(seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(all_runs), seen.back()) !=
        seen.begin() + static_cast<std::ptrdiff_t>(all_runs));
}

TEST_CASE("the cuda plugin loads and says why it has no device", "[cpu]") {
  if (!cuda::plugin_built()) PLX_SKIP("the CUDA plugin was not built (no nvcc or cuDNN at configure time)");
  Backend* b = cuda::backend();
  INFO("loader: " << cuda::skip_reason());
  REQUIRE(b != nullptr);
  if (b->device_count() > 0) PLX_SKIP("this machine has a CUDA device: nothing to check here");
  CHECK(b->device_count() == 0);
  const std::string why = cuda::unavailable_reason(*b);
  INFO("reason: " << why);
  CHECK(why.rfind("no CUDA device", 0) == 0);
  // Memory on a backend without devices is an error, not a crash.
  CHECK_THROWS_WITH(Tensor::empty(*b, {4}, PLX_F32), PLX_CONTAINS("no device"));
}
