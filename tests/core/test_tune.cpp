// Choosing among a backend's kernels (plexus/tune.hpp): the test plugin's testgood.scale has a
// correct kernel that sleeps 3 ms per call and is flagged as a library's (registered first), a
// fast one of its own, and one of its own that declines small nodes. "auto" times the two that
// accept and keeps the fast one (the gap is three orders of magnitude, so the outcome does not
// depend on this machine's load), remembers it on disk, and a second runtime takes it from there
// without timing; "native" and "library" force a side without timing; eager calls follow the
// cache or the order; a corrupt cache file is reported by file and line and ignored.
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "plexus/config.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/error.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/info.hpp"
#include "plexus/log.hpp"
#include "plexus/tune.hpp"
#include "plexus/watchdog.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

RuntimeOptions with_testdev(KernelSide side, std::string cache) {
  RuntimeOptions o;
  o.plugins.paths = {fixture_dir() + "/good"};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  o.kernels = side;
  o.tune_cache = std::move(cache);
  return o;
}

struct Prepared {
  std::vector<Executable::KernelReport> choices;
  std::vector<std::string> names;
  std::vector<float> y;
};

// A graph y = scale(x) over n elements on testdev, prepared and run once.
Prepared prepare_scale(Runtime& rt, int64_t n) {
  Backend& dev = rt.backend("testdev");
  Graph g(rt.ops());
  const Var x = g.input("x", {PLX_F32, {n}});
  g.mark_output(g.add1("testgood.scale", {x}, {}, "s"), "y");
  TensorStore store;
  Executable exe(dev, g, store);
  std::vector<float> xs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xs[static_cast<size_t>(i)] = static_cast<float>(i % 7) - 3;
  exe.tensor("x").copy_from_host(xs.data());
  exe.run();
  exe.sync();
  Prepared p;
  p.choices = exe.kernel_choices();
  p.names = exe.kernel_names();
  p.y = exe.tensor("y").to_vector<float>();
  for (int64_t i = 0; i < n; ++i) REQUIRE(p.y[static_cast<size_t>(i)] == 2 * xs[static_cast<size_t>(i)]);
  return p;
}

// y = relu(scale(x)) over 32 elements on testdev (nodes "s" and "r"), for the fusion tests.
struct ScaleRelu {
  Graph g;
  std::vector<float> xs;
  explicit ScaleRelu(Runtime& rt) : g(rt.ops()), xs(32) {
    const Var x = g.input("x", {PLX_F32, {32}});
    const Var s = g.add1("testgood.scale", {x}, {}, "s");
    g.mark_output(g.add1("relu", {s}, {}, "r"), "y");
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i) - 16;
  }
  // Runs `exe` `runs` times on xs and requires y = max(0, 2x).
  void run(Executable& exe, int runs) const {
    exe.tensor("x").copy_from_host(xs.data());
    for (int r = 0; r < runs; ++r) exe.run();
    exe.sync();
    const std::vector<float> y = exe.tensor("y").to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) REQUIRE(y[i] == std::max(0.0f, 2 * xs[i]));
  }
};

// One of the test plugin's extras, by name.
template <class F>
F test_extra(Backend& dev, const char* name) {
  auto f = reinterpret_cast<F>(dev.table().get_proc_address(dev.table().ctx, name));
  REQUIRE(f != nullptr);
  return f;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("auto times the kernels that accept a node and keeps the fastest", "[cpu][tune]") {
  TempDir dir("tune");
  const std::string cache = dir / "sub/kernels.tsv";  // the directory is created on write
  {
    Runtime rt(with_testdev(KernelSide::Auto, cache));
    const Prepared p = prepare_scale(rt, 64);
    REQUIRE(p.choices.size() == 1);
    const auto& c = p.choices[0];
    CHECK(c.node == "s");
    CHECK(c.op == "testgood.scale");
    CHECK(c.impl == "test-scale");
    CHECK_FALSE(c.library);
    REQUIRE(c.choice.how == KernelChoice::How::Tuned);
    // The picky kernel declined; the other two were timed, fastest first.
    REQUIRE(c.choice.times.size() == 2);
    CHECK(c.choice.times[0].impl == "test-scale");
    CHECK(c.choice.times[1].impl == "test-scale-slow");
    CHECK(c.choice.times[1].library);
    CHECK(c.choice.times[1].ms >= 3.0);  // it sleeps 3 ms a call
    CHECK(c.choice.times[0].ms < c.choice.times[1].ms);
    CHECK_THAT(p.names.at(0), PLX_CONTAINS("s testgood.scale: testdev/test-scale (tuned: test-scale "));
    CHECK_THAT(p.names.at(0), PLX_CONTAINS(", test-scale-slow "));
  }
  // The runtime wrote its choice; the key names backend, op, dtype and shape.
  const std::string text = read_all(cache);
  CHECK_THAT(text, PLX_CONTAINS("# plexus kernel tuning cache v1"));
  CHECK_THAT(text, PLX_CONTAINS("testdev|"));
  CHECK_THAT(text, PLX_CONTAINS("|testgood.scale|f32[64]->f32[64]|"));
  CHECK_THAT(text, PLX_CONTAINS("\ttest-scale\t"));

  SECTION("a second runtime takes the choice from the file without timing") {
    Runtime rt(with_testdev(KernelSide::Auto, cache));
    const Prepared p = prepare_scale(rt, 64);
    REQUIRE(p.choices.size() == 1);
    CHECK(p.choices[0].impl == "test-scale");
    CHECK(p.choices[0].choice.how == KernelChoice::How::Cached);
    CHECK(p.choices[0].choice.times.empty());
    CHECK_THAT(p.names.at(0), PLX_CONTAINS("testdev/test-scale (cached)"));
    // Another shape is a new problem: timed, and added to the file beside the first.
    const Prepared q = prepare_scale(rt, 100);
    CHECK(q.choices.at(0).choice.how == KernelChoice::How::Tuned);
  }
  SECTION("eager calls take the cached choice, else the backend's order") {
    Runtime rt(with_testdev(KernelSide::Auto, cache));
    Backend& dev = rt.backend("testdev");
    const Tensor x64 = Tensor::from_vector(dev, std::vector<float>(64, 1.0f), {64});
    const Tensor x5 = Tensor::from_vector(dev, std::vector<float>(5, 1.0f), {5});
    CHECK(call(dev, "testgood.scale", {x64}).at(0).to_vector<float>() == std::vector<float>(64, 2.0f));
    CHECK(call(dev, "testgood.scale", {x5}).at(0).to_vector<float>() == std::vector<float>(5, 2.0f));
    std::vector<plx_tensor> in{make_desc(x64.desc(), 0)}, out{make_desc(x64.desc(), 0)};
    const OpSchema& s = rt.ops().get("testgood.scale");
    KernelResolution cached = resolve_kernel(dev, s, in, out, s.complete_attrs({}), 0);
    CHECK(cached.choice.how == KernelChoice::How::Cached);
    CHECK(std::string(cached.kernel->kernel().impl) == "test-scale");
    in = {make_desc(x5.desc(), 0)};
    out = in;
    KernelResolution ordered = resolve_kernel(dev, s, in, out, s.complete_attrs({}), 0);
    CHECK(ordered.choice.how == KernelChoice::How::Ordered);
    CHECK(std::string(ordered.kernel->kernel().impl) == "test-scale-slow");
  }
}

TEST_CASE("native and library force a side without timing", "[cpu][tune]") {
  {
    Runtime rt(with_testdev(KernelSide::Native, ""));
    const Prepared p = prepare_scale(rt, 64);
    REQUIRE(p.choices.size() == 1);
    CHECK(p.choices[0].impl == "test-scale");
    CHECK(p.choices[0].choice.how == KernelChoice::How::Ordered);
    CHECK(p.choices[0].choice.times.empty());
    CHECK_THAT(p.names.at(0), PLX_CONTAINS("testdev/test-scale (ordered)"));
  }
  {
    Runtime rt(with_testdev(KernelSide::Library, ""));
    const Prepared p = prepare_scale(rt, 64);
    REQUIRE(p.choices.size() == 1);
    CHECK(p.choices[0].impl == "test-scale-slow");
    CHECK(p.choices[0].library);
    CHECK(p.choices[0].choice.how == KernelChoice::How::Ordered);
  }
  // A side with no kernel for an op runs the other side's: relu has one native kernel.
  {
    Runtime rt(with_testdev(KernelSide::Library, ""));
    Backend& dev = rt.backend("testdev");
    const Tensor x = Tensor::from_vector(dev, std::vector<float>{-1, 2}, {2});
    CHECK(call(dev, "relu", {x}).at(0).to_vector<float>() == std::vector<float>{0, 2});
  }
}

TEST_CASE("a corrupt tuning cache is reported by file and line and ignored", "[cpu][tune]") {
  TempDir dir("tune");
  const std::string cache = dir / "kernels.tsv";
  {
    std::ofstream f(cache);
    f << "# plexus kernel tuning cache v1\n"
      << "only two\tfields\n"
      << "key\timpl\tfast\n"
      << "testdev|x\ttest-scale\t0.5\n";
  }
  KernelTuner t(KernelSide::Auto, cache);
  const auto problems = t.problems();
  REQUIRE(problems.size() == 2);
  CHECK_THAT(problems[0], PLX_CONTAINS(cache + ":2: expected 3 tab-separated fields"));
  CHECK_THAT(problems[1], PLX_CONTAINS(cache + ":3: the time 'fast' is not a non-negative number"));
  CHECK(t.lookup("testdev|x") == std::optional<std::string>("test-scale"));
  // Writing keeps the good line and drops the bad ones.
  t.remember("testdev|y", "test-scale-slow", 4.0);
  t.flush();
  const std::string text = read_all(cache);
  CHECK_THAT(text, PLX_CONTAINS("testdev|x\ttest-scale\t0.5\n"));
  CHECK_THAT(text, PLX_CONTAINS("testdev|y\ttest-scale-slow\t4\n"));
  CHECK(text.find("fast") == std::string::npos);
  CHECK(dir.entries() == std::set<std::string>{"kernels.tsv"});  // no temporary file left

  // The cache's choice is used only while it still accepts the node: an unknown kernel name is
  // timed again.
  Runtime rt(with_testdev(KernelSide::Auto, cache));
  const Prepared p = prepare_scale(rt, 8);
  CHECK(p.choices.at(0).choice.how == KernelChoice::How::Tuned);
}

TEST_CASE("backend.kernels and backend.tune_cache are read from the config", "[cpu][tune][config]") {
  CHECK(parse_kernel_side("auto") == KernelSide::Auto);
  CHECK(parse_kernel_side("native") == KernelSide::Native);
  CHECK(parse_kernel_side("library") == KernelSide::Library);
  REQUIRE_THROWS_AS(parse_kernel_side("fastest"), ConfigError);
  REQUIRE_THROWS_WITH(parse_kernel_side("fastest"),
                      PLX_CONTAINS("backend.kernels: 'fastest' is not a kernel side; expected \"auto\""));
  Config c = Config::parse("[backend]\nkernels = \"native\"\ntune_cache = \"off\"\n", "t.toml");
  RuntimeOptions o = runtime_options(c);
  CHECK(o.kernels == KernelSide::Native);
  CHECK(o.tune_cache.empty());
  c = Config::parse("[backend]\ntune_cache = \"/x/k.tsv\"\n", "t.toml");
  o = runtime_options(c);
  CHECK(o.kernels == KernelSide::Auto);
  CHECK(o.tune_cache == "/x/k.tsv");
  REQUIRE_THROWS_WITH(Config::parse("[backend]\nkernels = \"fast\"\n", "t.toml"),
                      PLX_CONTAINS("backend.kernels"));
}

// Inside a fused kernel the backend runs each node with the kernel the host chose for it
// (plx_graph_node.kernel_hint): the tuner's with "auto", the forced side's first otherwise.
TEST_CASE("a fused kernel runs its nodes on the kernels the host chose", "[cpu][tune][fusion]") {
  for (KernelSide side : {KernelSide::Auto, KernelSide::Library, KernelSide::Native}) {
    INFO(kernel_side_name(side));
    RuntimeOptions o = with_testdev(side, "");
    o.plugins.options["testgood"]["claims"] = "0,1";  // scale and relu as one kernel
    Runtime rt(o);
    Backend& dev = rt.backend("testdev");
    auto slow_calls = test_extra<int64_t (*)()>(dev, "testgood.slow_scale_calls");
    const ScaleRelu sr(rt);
    TensorStore store;
    Executable exe(dev, sr.g, store);
    REQUIRE(exe.plan().fused_kernels == 1);
    const int64_t before = slow_calls();
    sr.run(exe, 3);
    // The library side runs the slow kernel; auto and native the fast one.
    CHECK(slow_calls() - before == (side == KernelSide::Library ? 3 : 0));
    const auto choices = exe.kernel_choices();
    REQUIRE(choices.size() == 1);
    CHECK(choices[0].node == "s");
    CHECK(choices[0].impl == (side == KernelSide::Library ? "test-scale-slow" : "test-scale"));
    CHECK(choices[0].choice.how ==
          (side == KernelSide::Auto ? KernelChoice::How::Tuned : KernelChoice::How::Ordered));
    CHECK_THAT(exe.kernel_names().at(0), PLX_CONTAINS("; s on " + choices[0].impl));
  }
}

// A fused group is tuned as a whole (executor.cpp create_group): where the backend makes another
// fused kernel around a member's slower candidate (the test plugin's one-pass scale -> relu,
// made only around test-scale-slow), the host times that kernel against the one around the
// fastest candidate alone, or, where the backend declines that one, against the nodes one by one
// on their fastest kernels; and keeps the faster, on disk too. The sleeps (3 and 6 ms against
// microseconds) decide each outcome whatever this machine's load.
TEST_CASE("a fused group is tuned as a whole around each candidate of its members",
          "[cpu][tune][fusion]") {
  struct Case {
    const char* one_pass;
    int relu_ms, one_pass_ms;
    const char* kernel;  // the step's first kernel, "" for none fused
    const char* scale_impl;
  };
  const Case cases[] = {
      // The chain around test-scale runs the 3 ms relu; the one pass does not.
      {"accept", 3, 0, "test-scale-relu-one-pass", "test-scale-slow"},
      // No chain around test-scale: the one pass against scale and relu one by one.
      {"decline", 3, 0, "test-scale-relu-one-pass", "test-scale-slow"},
      // The one pass is the slow one: the chain, or no fusion at all.
      {"accept", 0, 6, "test-chain", "test-scale"},
      {"decline", 0, 6, "", "test-scale"},
  };
  const std::string cache =
      (std::filesystem::temp_directory_path() / "plexus-test-group-tune.tsv").string();
  for (const Case& c : cases) {
    INFO("one_pass " << c.one_pass << ", relu " << c.relu_ms << " ms, one pass " << c.one_pass_ms
                     << " ms");
    std::filesystem::remove(cache);
    // Twice with one cache file: the second runtime takes the first one's decision untimed.
    for (int run = 0; run < 2; ++run) {
      INFO("runtime " << run);
      RuntimeOptions o = with_testdev(KernelSide::Auto, cache);
      o.plugins.options["testgood"]["claims"] = "0,1";
      o.plugins.options["testgood"]["one_pass"] = c.one_pass;
      o.plugins.options["testgood"]["relu_ms"] = std::to_string(c.relu_ms);
      o.plugins.options["testgood"]["one_pass_ms"] = std::to_string(c.one_pass_ms);
      Runtime rt(o);
      Backend& dev = rt.backend("testdev");
      const ScaleRelu sr(rt);
      TensorStore store;
      Executable exe(dev, sr.g, store);
      sr.run(exe, 1);
      const auto names = exe.kernel_names();
      INFO("kernels:\n" << names.at(0) << "\n" << (names.size() > 1 ? names[1] : ""));
      CHECK(exe.plan().fused_kernels == (*c.kernel ? 1 : 0));
      if (*c.kernel) CHECK_THAT(names.at(0), PLX_CONTAINS("testdev/" + std::string(c.kernel)));
      const auto choices = exe.kernel_choices();
      REQUIRE(!choices.empty());
      CHECK(choices[0].node == "s");
      CHECK(choices[0].impl == c.scale_impl);
      // Picked around its slower candidate: "tuned" with the group's timings, then "cached".
      if (std::string(c.scale_impl) == "test-scale-slow") {
        CHECK(choices[0].choice.how ==
              (run == 0 ? KernelChoice::How::Tuned : KernelChoice::How::Cached));
        if (run == 0) CHECK_THAT(names.at(0), PLX_CONTAINS("s:testgood.scale=test-scale-slow"));
      }
      // A graph prepared without timing (ExecutableOptions::tune off, as the layout planner
      // remakes groups) still takes the cached decision.
      if (run == 1) {
        ExecutableOptions untimed;
        untimed.tune = false;
        TensorStore store2;
        Executable exe2(dev, sr.g, store2, untimed);
        CHECK(exe2.plan().fused_kernels == (*c.kernel ? 1 : 0));
        if (*c.kernel)
          CHECK_THAT(exe2.kernel_names().at(0), PLX_CONTAINS("testdev/" + std::string(c.kernel)));
      }
    }
  }
  std::filesystem::remove(cache);
}

namespace {

// Sets the value of every fused group's decision in a tune cache file ("fused|..." lines).
void set_group_decisions(const std::string& cache, const std::string& value) {
  std::istringstream in(read_all(cache));
  std::string out, line;
  int set = 0;
  while (std::getline(in, line)) {
    if (line.rfind("fused|", 0) == 0) {
      const size_t a = line.find('\t'), b = line.find('\t', a + 1);
      REQUIRE(a != std::string::npos);
      line = line.substr(0, a + 1) + value + (b == std::string::npos ? "" : line.substr(b));
      ++set;
    }
    out += line + "\n";
  }
  REQUIRE(set == 1);
  std::ofstream(cache) << out;
}

}  // namespace

// A fused kernel that does every node with its own code (PLX_KERNEL_SELF_CONTAINED, ABI 1.6;
// the test plugin's one pass with one_pass = "self") is made once, without member hints: its
// members' kernels are neither chosen nor timed (the slow one never runs, the cache holds
// nothing for them), it is not made around their other candidates nor timed as a whole, no
// decision is cached for it, and its members' kernels, which never run, are not reported. The
// same group with one_pass = "accept" is made around each candidate and its scale is tuned,
// which shows the counts are what they claim.
TEST_CASE("a self-contained fused kernel is made once and reports no member kernels",
          "[cpu][tune][fusion]") {
  TempDir dir("self-contained");
  const std::string cache = dir / "kernels.tsv";
  for (const char* mode : {"self", "self", "accept"}) {  // "self" twice: fresh cache, then its
    INFO("one_pass " << mode);
    RuntimeOptions o = with_testdev(KernelSide::Auto, cache);
    o.plugins.options["testgood"]["claims"] = "0,1";
    o.plugins.options["testgood"]["one_pass"] = mode;
    Runtime rt(o);
    Backend& dev = rt.backend("testdev");
    auto creates = test_extra<int64_t (*)()>(dev, "testgood.fused_creates");
    auto slow_calls = test_extra<int64_t (*)()>(dev, "testgood.slow_scale_calls");
    const ScaleRelu sr(rt);
    TensorStore store;
    const int64_t before = creates(), slow_before = slow_calls();
    Executable exe(dev, sr.g, store);
    sr.run(exe, 2);
    REQUIRE(exe.plan().fused_kernels == 1);
    const std::string name = exe.kernel_names().at(0);
    INFO(name);
    if (std::string(mode) == "self") {
      CHECK(creates() - before == 1);
      CHECK_THAT(name, PLX_CONTAINS("testdev/test-scale-relu-self"));
      CHECK(name.find("; s on") == std::string::npos);
      CHECK(exe.kernel_choices().empty());
      CHECK(read_all(cache).find("fused|") == std::string::npos);
      CHECK(read_all(cache).find("testgood.scale") == std::string::npos);
      CHECK(slow_calls() == slow_before);
    } else {
      CHECK(creates() - before >= 2);  // around test-scale, then test-scale-slow
      CHECK_THAT(name, PLX_CONTAINS("; s on"));
      CHECK(slow_calls() > slow_before);  // timed alone, and the group around it
      CHECK(read_all(cache).find("testgood.scale") != std::string::npos);
    }
  }
}

// backend.kernels = "library" puts a node on a vendor library's kernel where one takes it: a
// self-contained fused kernel of the plugin's own code (not flagged PLX_KERNEL_LIBRARY) is
// declined where one of its nodes has a library kernel (testgood.scale's slow one), and the nodes
// run on that side one by one; "native" takes it.
TEST_CASE("the library side declines a self-contained kernel of the plugin's own code",
          "[cpu][tune][fusion]") {
  for (KernelSide side : {KernelSide::Library, KernelSide::Native}) {
    INFO(kernel_side_name(side));
    RuntimeOptions o = with_testdev(side, "");
    o.plugins.options["testgood"]["claims"] = "0,1";
    o.plugins.options["testgood"]["one_pass"] = "self";
    Runtime rt(o);
    Backend& dev = rt.backend("testdev");
    auto slow_calls = test_extra<int64_t (*)()>(dev, "testgood.slow_scale_calls");
    const ScaleRelu sr(rt);
    TensorStore store;
    Executable exe(dev, sr.g, store);
    const int64_t before = slow_calls();
    sr.run(exe, 2);
    const auto names = exe.kernel_names();
    INFO(names.at(0));
    if (side == KernelSide::Library) {
      CHECK(exe.plan().fused_kernels == 0);
      CHECK_THAT(names.at(0), PLX_CONTAINS("testdev/test-scale-slow"));
      CHECK(slow_calls() - before == 2);
    } else {
      CHECK(exe.plan().fused_kernels == 1);
      CHECK_THAT(names.at(0), PLX_CONTAINS("testdev/test-scale-relu-self"));
      CHECK(slow_calls() == before);
    }
  }
}

TEST_CASE("PLX_KERNEL_SELF_CONTAINED is read from plugins of ABI 1.6 or later only",
          "[cpu][tune][abi]") {
  plx_kernel k{};
  k.flags = PLX_KERNEL_SELF_CONTAINED | PLX_KERNEL_CAPTURABLE;
  CHECK(is_self_contained_kernel(k, 6));
  CHECK(is_self_contained_kernel(k, 7));
  CHECK_FALSE(is_self_contained_kernel(k, 5));  // a bit an older plugin never meant
  k.flags = PLX_KERNEL_CAPTURABLE | PLX_KERNEL_DETERMINISTIC;
  CHECK_FALSE(is_self_contained_kernel(k, 6));
}

// Two members of a group with one name and one op (as a gradient's data and weight matmuls are):
// each alternative the tuner times the group around has a name of its own, "s:op=impl" and
// "s#2:op=impl", and a cached decision naming either moves that member and not the other. Once
// both were "s:..." and the decision always went to the first.
TEST_CASE("each member of a fused group has alternatives named for it alone", "[cpu][tune][fusion]") {
  TempDir dir("two-scales");
  const std::string cache = dir / "kernels.tsv";
  struct Run {
    const char* decision;  // set in the cache before the run; "" for a fresh cache
    const char *first, *second;
  };
  const Run runs[] = {{"", "test-scale", "test-scale"},
                      {"s#2:testgood.scale=test-scale-slow", "test-scale", "test-scale-slow"},
                      {"s:testgood.scale=test-scale-slow", "test-scale-slow", "test-scale"}};
  for (const Run& r : runs) {
    INFO("decision '" << r.decision << "'");
    if (*r.decision) set_group_decisions(cache, r.decision);
    RuntimeOptions o = with_testdev(KernelSide::Auto, cache);
    o.plugins.options["testgood"]["claims"] = "0,1";
    Runtime rt(o);
    Backend& dev = rt.backend("testdev");
    auto slow_calls = test_extra<int64_t (*)()>(dev, "testgood.slow_scale_calls");
    Graph g(rt.ops());
    const Var x = g.input("x", {PLX_F32, {16}});
    const Var s1 = g.add1("testgood.scale", {x}, {}, "s");
    g.mark_output(g.add1("testgood.scale", {s1}, {}, "s"), "y");
    TensorStore store;
    Executable exe(dev, g, store);
    REQUIRE(exe.plan().fused_kernels == 1);
    INFO(exe.kernel_names().at(0));
    CHECK_THAT(exe.kernel_names().at(0), PLX_CONTAINS("testdev/test-two-scales"));
    std::vector<float> xs(16);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i) - 8;
    exe.tensor("x").copy_from_host(xs.data());
    const int64_t before = slow_calls();
    for (int step = 0; step < 3; ++step) exe.run();
    exe.sync();
    const std::vector<float> y = exe.tensor("y").to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) REQUIRE(y[i] == 4 * xs[i]);
    // The slow kernel ran once a step where one member is on it, never where neither is.
    CHECK(slow_calls() - before == (*r.decision ? 3 : 0));
    const auto choices = exe.kernel_choices();
    REQUIRE(choices.size() == 2);
    CHECK(choices[0].node == "s");
    CHECK(choices[1].node == "s");
    CHECK(choices[0].impl == r.first);
    CHECK(choices[1].impl == r.second);
    // A fresh cache: the group around each member's slow kernel is timed and loses.
    if (!*r.decision) CHECK(read_all(cache).find("\ttuned\t") != std::string::npos);
  }
}

namespace {

// The warnings logged while it lives.
struct WarnCapture {
  std::ostringstream text;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink =
      std::make_shared<spdlog::sinks::ostream_sink_mt>(text);
  WarnCapture() {
    (void)logging::level();  // plexus's logger in place first (it replaces spdlog's default)
    sink->set_level(spdlog::level::warn);
    spdlog::default_logger()->sinks().push_back(sink);
  }
  ~WarnCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  }
};

}  // namespace

// backend.exclude_kernels (plexus/tune.hpp): an excluded kernel is passed over as a decline that
// names the pattern, by resolution, the tuner and `plexus bench kernels` alike; a fused kernel
// whose name matches is not kept; a choice tuned without some kernels is cached under a key of its
// own; a pattern that matches nothing is warned about.
TEST_CASE("backend.exclude_kernels passes over the kernels it names", "[cpu][tune][config]") {
  TempDir dir("exclude");
  const std::string cache = dir / "kernels.tsv";
  auto excluding = [&](std::vector<std::string> patterns) {
    RuntimeOptions o = with_testdev(KernelSide::Auto, cache);
    o.exclude_kernels = std::move(patterns);
    return o;
  };

  SECTION("the tuner keeps the fastest of the others, under a key of its own") {
    {
      Runtime rt(excluding({"test-scale"}));
      // y = 2x checked; the picky kernel declines 64 elements, so the slow one is the only one
      // left: no choice to report, and its name in the step's.
      const Prepared p = prepare_scale(rt, 64);
      CHECK(p.choices.empty());
      CHECK_THAT(p.names.at(0), PLX_CONTAINS("testdev/test-scale-slow"));
      // Resolution lists the exclusion among the declines, with its pattern.
      Backend& dev = rt.backend("testdev");
      const OpSchema& s = rt.ops().get("testgood.scale");
      const TensorDesc d{PLX_F32, {64}};
      std::vector<plx_tensor> in{make_desc(d, 0)}, out{make_desc(d, 0)};
      const KernelResolution r = resolve_kernel(dev, s, in, out, s.complete_attrs({}), 0, true);
      REQUIRE(r.kernel);
      CHECK(std::string(r.kernel->kernel().impl) == "test-scale-slow");
      CHECK(std::find(r.declines.begin(), r.declines.end(),
                      "test-scale: excluded by backend.exclude_kernels ('test-scale')") !=
            r.declines.end());
      // `plexus bench kernels` neither creates nor times it.
      const auto times = time_all_kernels(dev, s, in, out, s.complete_attrs({}), 0, 5);
      REQUIRE(times.size() == 3);
      for (const CandidateTime& t : times) {
        INFO(t.impl << ": " << t.ms << " ms, " << t.error);
        if (t.impl == "test-scale") {
          CHECK(t.ms < 0);
          CHECK(t.error == "excluded by backend.exclude_kernels ('test-scale')");
        }
        if (t.impl == "test-scale-slow") CHECK(t.ms >= 3.0);
      }
      // `plexus info` marks it.
      CHECK_THAT(info_text(rt), PLX_CONTAINS("test-scale [native, excluded]"));
      CHECK_THAT(info_text(rt), PLX_CONTAINS("backend.exclude_kernels = 'test-scale'"));
    }
    {
      // A pattern that leaves two candidates: timed, and remembered with the pattern in its key.
      Runtime rt(excluding({"*-picky"}));
      const Prepared p = prepare_scale(rt, 64);
      CHECK(p.choices.at(0).impl == "test-scale");
      CHECK(p.choices.at(0).choice.how == KernelChoice::How::Tuned);
    }
    CHECK_THAT(read_all(cache), PLX_CONTAINS(" exclude_kernels=*-picky|testgood.scale|"));
    // Without the list the problem is a new one: timed among all, not the cached choice.
    Runtime rt(with_testdev(KernelSide::Auto, cache));
    const Prepared p = prepare_scale(rt, 64);
    CHECK(p.choices.at(0).impl == "test-scale");
    CHECK(p.choices.at(0).choice.how == KernelChoice::How::Tuned);
  }

  SECTION("a node whose every kernel is excluded is an error naming the patterns") {
    Runtime rt(excluding({"test-scale*"}));
    Backend& dev = rt.backend("testdev");
    Graph g(rt.ops());
    const Var x = g.input("x", {PLX_F32, {64}});
    g.mark_output(g.add1("testgood.scale", {x}, {}, "s"), "y");
    TensorStore store;
    REQUIRE_THROWS_WITH(Executable(dev, g, store),
                        PLX_CONTAINS("op 'testgood.scale' (f32) has no kernel on backend "
                                     "'testdev'; its kernels declined: [test-scale-slow: "
                                     "excluded by backend.exclude_kernels ('test-scale*')]"));
    const Tensor t = Tensor::from_vector(dev, std::vector<float>(4, 1.0f), {4});
    REQUIRE_THROWS_WITH(call(dev, "testgood.scale", {t}),
                        PLX_CONTAINS("excluded by backend.exclude_kernels ('test-scale*')"));
  }

  SECTION("a fused kernel whose name matches is not kept: its nodes run apart") {
    for (const char* pattern : {"test-chain", "test-c?ain"}) {
      INFO(pattern);
      RuntimeOptions o = excluding({pattern});
      o.tune_cache = "";
      o.plugins.options["testgood"]["claims"] = "0,1";
      Runtime rt(o);
      Backend& dev = rt.backend("testdev");
      const ScaleRelu sr(rt);
      TensorStore store;
      Executable exe(dev, sr.g, store);
      CHECK(exe.plan().fused_kernels == 0);
      sr.run(exe, 2);  // y = max(0, 2x)
      for (const std::string& n : exe.kernel_names()) CHECK(n.find("test-chain") == std::string::npos);
    }
  }

  SECTION("the config's list, an empty pattern, and one that matches nothing") {
    Config c = Config::parse("[backend]\nexclude_kernels = [\"igemm_wgmma_*\", \"cudnn_graph\"]\n",
                             "t.toml");
    CHECK(runtime_options(c).exclude_kernels ==
          std::vector<std::string>{"igemm_wgmma_*", "cudnn_graph"});
    CHECK(runtime_options(Config::parse("", "t.toml")).exclude_kernels.empty());
    // backend.tune_timeout_s: 60 s unless set, and above 0.
    CHECK(runtime_options(Config::parse("", "t.toml")).tune_timeout_s == 60);
    CHECK(runtime_options(Config::parse("[backend]\ntune_timeout_s = 2.5\n", "t.toml")).tune_timeout_s == 2.5);
    REQUIRE_THROWS_WITH(runtime_options(Config::parse("[backend]\ntune_timeout_s = 0\n", "t.toml")),
                        PLX_CONTAINS("backend.tune_timeout_s"));
    c = Config::parse("[backend]\nexclude_kernels = [\"\"]\n", "t.toml");
    REQUIRE_THROWS_AS(runtime_options(c), ConfigError);
    REQUIRE_THROWS_WITH(runtime_options(c),
                        PLX_CONTAINS("backend.exclude_kernels: an empty pattern matches no kernel"));
    REQUIRE_THROWS_WITH(Config::parse("[backend]\nexclude_kernels = \"igemm\"\n", "t.toml"),
                        PLX_CONTAINS("backend.exclude_kernels"));
    // PLEXUS_EXCLUDE_KERNELS adds to the config's list, once each, empty parts dropped.
    c = Config::parse("[backend]\nexclude_kernels = [\"cudnn_graph\"]\n", "t.toml");
    ::setenv("PLEXUS_EXCLUDE_KERNELS", "igemm_*,,cudnn_graph,", 1);
    const std::vector<std::string> both = runtime_options(c).exclude_kernels;
    ::unsetenv("PLEXUS_EXCLUDE_KERNELS");
    CHECK(both == std::vector<std::string>{"cudnn_graph", "igemm_*"});
    WarnCapture warned;
    Runtime rt(excluding({"test-scal", "test-scale-slow"}));
    CHECK_THAT(warned.text.str(),
               PLX_CONTAINS("backend.exclude_kernels: 'test-scal' matches no kernel of the loaded "
                            "backends (testdev)"));
    CHECK(warned.text.str().find("'test-scale-slow'") == std::string::npos);
  }
}

namespace {

// Runs the hidden test case `name` of this program in a process of its own, with `env` (VAR=value
// words) and without PLEXUS_EXCLUDE_KERNELS otherwise: its exit status and output.
std::pair<int, std::string> run_child(const std::string& name, const std::string& env) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd =
      "env -u PLEXUS_EXCLUDE_KERNELS " + env + " '" + self + "' '" + name + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// Runs the hidden test case `child` with `env` (run_child): it must exit with `status`, `text` in
// its output.
void check_child(const std::string& child, const std::string& env, int status,
                 const std::string& text) {
  const auto [st, out] = run_child(child, env);
  INFO(out);
  CHECK(st == status);
  CHECK_THAT(out, PLX_CONTAINS(text));
}

// Runs the hidden test case `child` (which prepares testgood.scale on testdev, test-scale among
// its candidates) twice in processes of its own: as is, it must exit with status 3, its log
// saying "the tuner's run of candidate test-scale " + `what` and how to keep the kernel out; with
// PLEXUS_EXCLUDE_KERNELS=test-scale it must pass.
void check_exit_naming_test_scale(const std::string& child, const std::string& what) {
  const auto [status, out] = run_child(child, "");
  INFO(out);
  CHECK(status == 3);
  CHECK_THAT(out, PLX_CONTAINS("op 'testgood.scale' on 'testdev': the tuner's run of candidate "
                               "test-scale " + what));
  CHECK_THAT(out, PLX_CONTAINS("backend.exclude_kernels = [\"test-scale\"] or "
                               "PLEXUS_EXCLUDE_KERNELS=test-scale"));
  const auto [status2, out2] = run_child(child, "PLEXUS_EXCLUDE_KERNELS=test-scale");
  INFO(out2);
  CHECK(status2 == 0);
  CHECK_THAT(out2, PLX_CONTAINS("All tests passed"));
}

// y = relu(scale(x)) on testdev, unfused, run once and waited for.
void scale_relu_step(Runtime& rt) {
  Backend& dev = rt.backend("testdev");
  Graph g(rt.ops());
  const Var x = g.input("x", {PLX_F32, {16}});
  const Var s = g.add1("testgood.scale", {x}, {}, "s");
  g.mark_output(g.add1("relu", {s}, {}, "r"), "y");
  TensorStore store;
  ExecutableOptions eo;
  eo.fuse = false;
  Executable exe(dev, g, store, eo);
  exe.run();
  exe.sync();
}

}  // namespace

// A candidate whose run never completes (a kernel that deadlocks on the device) must not hang
// the process that tunes it: after backend.tune_timeout_s the tuner names the kernel and how to
// keep it out, and the process exits with status 3. The test plugin's option never_completes
// leaves testdev's stream stuck after its fast scale kernel runs (no event completes after it).
TEST_CASE("a candidate that never completes while timed exits the process naming it",
          "[cpu][tune]") {
  check_exit_naming_test_scale("a stuck candidate in a process of its own",
                               "has not completed in 0.2 s (backend.tune_timeout_s)");
}

// A candidate that faults (an illegal address on a GPU) leaves the device unusable: every node
// and candidate after it would fail, and every later process would time it again. The tuner
// names it and how to keep it out and exits with status 3, as for a stuck one. The test
// plugin's option faults makes testdev's waits, event queries and memsets fail once its fast
// scale kernel has run; the slow one, timed first, is fine.
TEST_CASE("a candidate that faults while timed exits the process naming it", "[cpu][tune]") {
  check_exit_naming_test_scale(
      "a faulting candidate in a process of its own",
      "failed and left the device unusable (backend 'testdev': event_query: backend error: "
      "testdev: the device is lost (test-scale faulted); the stream after it: ");
}

TEST_CASE("a faulting candidate in a process of its own", "[.][fault-child]") {
  RuntimeOptions o = with_testdev(KernelSide::Auto, "");
  o.plugins.options["testgood"]["faults"] = "1";
  if (const char* env = std::getenv("PLEXUS_EXCLUDE_KERNELS")) o.exclude_kernels = {env};
  Runtime rt(o);
  const Prepared p = prepare_scale(rt, 64);  // exits here unless test-scale is kept out
  CHECK(std::getenv("PLEXUS_EXCLUDE_KERNELS") != nullptr);
  CHECK(p.names.at(0).find("test-scale-slow") != std::string::npos);
}

// backend.check_kernels: a step waits for each kernel and names the first that leaves the device
// unusable (KernelFaultError, status 3 from the CLI), where otherwise the failure shows at the
// host's next wait and names no kernel.
TEST_CASE("backend.check_kernels names the kernel that leaves the device unusable", "[cpu][tune]") {
  RuntimeOptions o = with_testdev(KernelSide::Native, "");
  o.plugins.options["testgood"]["faults"] = "1";
  const auto step = scale_relu_step;
  SECTION("off: the wait after the step fails, naming no kernel") {
    Runtime rt(o);
    try {
      step(rt);
      FAIL("the step ran on a lost device");
    } catch (const KernelFaultError& e) {
      FAIL("a kernel fault named without backend.check_kernels: " << e.what());
    } catch (const std::exception& e) {
      CHECK_THAT(e.what(), PLX_CONTAINS("the device is lost (test-scale faulted)"));
    }
  }
  SECTION("on: the scale node's kernel is named, with how to keep it out") {
    o.check_kernels = true;
    Runtime rt(o);
    try {
      step(rt);
      FAIL("the step ran on a lost device");
    } catch (const KernelFaultError& e) {
      CHECK_THAT(e.what(), PLX_CONTAINS("node 's' (testgood.scale): kernel test-scale on "
                                        "'testdev' failed on the device ("));
      CHECK_THAT(e.what(), PLX_CONTAINS("the device is lost (test-scale faulted)); keep it out "
                                        "with backend.exclude_kernels = [\"test-scale\"] or "
                                        "PLEXUS_EXCLUDE_KERNELS=test-scale"));
    }
  }
  SECTION("on, with the kernel kept out: the step runs on the next one") {
    o.check_kernels = true;
    o.exclude_kernels = {"test-scale"};
    Runtime rt(o);
    REQUIRE_NOTHROW(step(rt));
  }
  SECTION("the config keys: off unless set; the step's limit 600 s, 0 for none") {
    CHECK_FALSE(runtime_options(Config::parse("", "t.toml")).check_kernels);
    CHECK(runtime_options(Config::parse("", "t.toml")).step_timeout_s == 600);
    CHECK(runtime_options(Config::parse("[backend]\nstep_timeout_s = 0\n", "t.toml")).step_timeout_s == 0);
    REQUIRE_THROWS_WITH(Config::parse("[backend]\nstep_timeout_s = -1\n", "t.toml"),
                        PLX_CONTAINS("backend.step_timeout_s"));
    CHECK(runtime_options(Config::parse("[backend]\ncheck_kernels = true\n", "t.toml")).check_kernels);
    REQUIRE_THROWS_WITH(Config::parse("[backend]\ncheck_kernels = 1\n", "t.toml"),
                        PLX_CONTAINS("backend.check_kernels"));
  }
}

// After a kernel leaves the device unusable every free of the allocator's cached blocks fails
// alike (testdev's mem_free fails once the device is lost, as cudaFree does after a fault): one
// warning for them all, with the count and the backend's reason, rather than one a block after
// the error that ended the run.
TEST_CASE("the cached blocks a lost device cannot free are one warning", "[cpu][tune]") {
  RuntimeOptions o = with_testdev(KernelSide::Native, "");
  o.plugins.options["testgood"]["faults"] = "1";
  WarnCapture warnings;
  {
    Runtime rt(o);
    CHECK_THROWS_WITH(scale_relu_step(rt), PLX_CONTAINS("the device is lost"));
  }  // the runtime, its backends and their allocators go here
  const std::string text = warnings.text.str();
  INFO(text);
  size_t lines = 0;
  for (size_t at = text.find("mem_free"); at != std::string::npos;
       at = text.find("mem_free", at + 1))
    ++lines;
  CHECK(lines == 1);
  std::smatch m;
  const std::regex one(R"(backend 'testdev' device 0: mem_free failed for (\d+) of (\d+) cached )"
                       R"(blocks \(.+\): backend error: testdev: the device is lost)");
  REQUIRE(std::regex_search(text, m, one));
  CHECK(m[1].str() == m[2].str());
  CHECK(std::stoi(m[1].str()) >= 2);  // several blocks, so one warning a block would show
}

// A kernel that hangs outside the tuner (a node with one kernel, a fused step made once) would
// leave the host waiting for the step with nothing said: after backend.step_timeout_s the
// process says what it waited for and exits with status 3, and with backend.check_kernels it
// names the kernel and how to keep it out. (The test plugin's never_completes: every wait after
// its fast scale kernel blocks, as behind a kernel that hangs on a GPU.)
TEST_CASE("a step that never completes exits the process, naming the kernel with check_kernels",
          "[cpu][tune]") {
  const std::string child = "a stuck step in a process of its own";
  check_child(child, "", 3,
              "the kernels of a graph on 'testdev' have not completed in 0.2 s "
              "(backend.step_timeout_s), so the device is taken for stuck and the process exits; "
              "a kernel may hang on the device (backend.check_kernels = true names the kernel)");
  check_child(child, "PLEXUS_TEST_CHECK_KERNELS=1", 3,
              "node 's' (testgood.scale): kernel test-scale on 'testdev' has not completed in "
              "0.2 s (backend.step_timeout_s), so the device is taken for stuck and the process "
              "exits; keep it out with backend.exclude_kernels = [\"test-scale\"] or "
              "PLEXUS_EXCLUDE_KERNELS=test-scale");
  check_child(child, "PLEXUS_TEST_CHECK_KERNELS=1 PLEXUS_EXCLUDE_KERNELS=test-scale", 0,
              "All tests passed");
}

TEST_CASE("a stuck step in a process of its own", "[.][stuck-step-child]") {
  RuntimeOptions o = with_testdev(KernelSide::Native, "");
  o.plugins.options["testgood"]["never_completes"] = "1";
  o.step_timeout_s = 0.2;
  o.check_kernels = std::getenv("PLEXUS_TEST_CHECK_KERNELS") != nullptr;
  if (const char* env = std::getenv("PLEXUS_EXCLUDE_KERNELS")) o.exclude_kernels = {env};
  Runtime rt(o);
  scale_relu_step(rt);  // exits here unless test-scale is kept out
  CHECK(std::getenv("PLEXUS_EXCLUDE_KERNELS") != nullptr);
}

// The watchdog under those messages: a watched wait that ends in time is let be, however many
// come and go; one that lasts past its timeout ends the process with status 3 and its message,
// after its before_exit.
TEST_CASE("a watched wait that ends in time is let be, and one that does not ends the process",
          "[cpu][tune]") {
  static std::atomic<int> fired{0};
  for (int i = 0; i < 10000; ++i) {
    const WaitWatch w(0.05, [] { return std::string("a short wait fired"); }, [] { ++fired; });
  }
  {
    const WaitWatch w(0.2, [] { return std::string("a wait of 50 ms fired"); }, [] { ++fired; });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const WaitWatch off(0, [] { return std::string("a watch with no limit fired"); }, [] { ++fired; });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past every deadline above
  CHECK(fired.load() == 0);
  const auto [status, out] = run_child("a watched wait past its time in a process of its own", "");
  INFO(out);
  CHECK(status == 3);
  CHECK_THAT(out, PLX_CONTAINS("before exit\n"));
  CHECK_THAT(out, PLX_CONTAINS("[critical] the wait of 0.1 s fired"));
  CHECK(out.find("the wait of 0.05 s fired") == std::string::npos);
  CHECK(out.find("still waiting") == std::string::npos);
}

TEST_CASE("a watched wait past its time in a process of its own", "[.][watch-child]") {
  { const WaitWatch ended(0.05, [] { return std::string("the wait of 0.05 s fired"); }); }
  const WaitWatch w(0.1, [] { return std::string("the wait of 0.1 s fired"); },
                    [] { std::fputs("before exit\n", stdout); });
  std::this_thread::sleep_for(std::chrono::seconds(5));
  std::puts("still waiting");
}

TEST_CASE("a stuck candidate in a process of its own", "[.][stuck-child]") {
  Config c = Config::parse("[plugins]\npaths = [\"" + fixture_dir() + "/good\"]\n"
                           "[plugins.options.testgood]\nnever_completes = 1\n"
                           "[backend]\ntune_timeout_s = 0.2\ntune_cache = \"off\"\n",
                           "stuck.toml");
  RuntimeOptions o = runtime_options(c);
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  Runtime rt(o);
  const Prepared p = prepare_scale(rt, 64);  // exits here unless test-scale is kept out
  CHECK(std::getenv("PLEXUS_EXCLUDE_KERNELS") != nullptr);
  CHECK(p.names.at(0).find("test-scale-slow") != std::string::npos);
}
