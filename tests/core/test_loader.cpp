// Plugin discovery and loading: broken plugins are skipped with their reason while good ones
// load; search order; duplicates; disabling; options; custom ops from a plugin.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "plexus/error.hpp"
#include "plexus/plugin.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;
namespace fs = std::filesystem;

namespace {

RuntimeOptions only(std::vector<std::string> paths) {
  RuntimeOptions o;
  o.plugins.paths = std::move(paths);
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  return o;
}

const SkippedPlugin* skipped_file(const Runtime& rt, const std::string& file_name) {
  for (const auto& s : rt.skipped())
    if (fs::path(s.path).filename() == file_name) return &s;
  return nullptr;
}

bool loaded(const Runtime& rt, const std::string& name) {
  for (const auto& p : rt.plugins())
    if (p->name() == name) return true;
  return false;
}

// Sets an environment variable for the scope of a test.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("broken plugins are skipped with their reason while the good ones load",
          "[cpu][loader]") {
  Runtime rt(only({fixture_dir() + "/broken", plugin_dir()}));
  REQUIRE(loaded(rt, "cpu"));
  REQUIRE(rt.find_backend("cpu") != nullptr);

  const struct {
    const char* file;
    std::string reason;
  } expected[] = {
      {"libplexus-notalib.so", "not a loadable shared library"},
      {"libplexus-noentry.so", "no entry point 'plexus_plugin_entry'"},
      {"libplexus-badabi.so", "built for plugin ABI 99." + std::to_string(PLX_ABI_MINOR) +
                                  "; this host accepts ABI 1.0 to 1." +
                                  std::to_string(PLX_ABI_MINOR) + " (rebuild it against this SDK)"},
      {"libplexus-smalldesc.so", "descriptor is 16 bytes, ABI 1.0 needs 104"},
      {"libplexus-initfail.so", "init failed (backend error): simulated failure: no device found"},
      {"libplexus-noslot.so", "backend 'noslot' lacks required slot"},
  };
  for (const auto& e : expected) {
    INFO(e.file);
    const SkippedPlugin* s = skipped_file(rt, e.file);
    REQUIRE(s != nullptr);
    CHECK_THAT(s->reason, PLX_CONTAINS(e.reason));
  }
  CHECK(rt.skipped().size() == std::size(expected));
}

TEST_CASE("PLEXUS_PLUGIN_PATH is searched after the config's paths and before the default",
          "[cpu][loader]") {
  ScopedEnv env("PLEXUS_PLUGIN_PATH", fixture_dir() + "/good:" + fixture_dir() + "/broken");
  PluginSearch s;
  s.paths = {plugin_dir()};
  const auto paths = PluginLoader::search_paths(s);
  REQUIRE(paths.size() == 4);
  CHECK(paths[0] == plugin_dir());
  CHECK(paths[1] == fixture_dir() + "/good");
  CHECK(paths[2] == fixture_dir() + "/broken");
  CHECK(paths[3] == PluginLoader::default_dir());

  RuntimeOptions o;
  o.plugins.paths = {plugin_dir()};
  o.plugins.use_default_dir = false;
  Runtime rt(o);
  CHECK(loaded(rt, "cpu"));
  CHECK(loaded(rt, "testgood"));
  CHECK(skipped_file(rt, "libplexus-badabi.so") != nullptr);
}

TEST_CASE("the default plugin directory is found relative to the executable", "[cpu][loader]") {
  // Tests run from build/bin, as plexus does: build/lib/plexus/plugins holds the CPU plugin.
  CHECK(fs::equivalent(PluginLoader::default_dir(), plugin_dir()));
}

TEST_CASE("a plugin found twice loads once, the second copy is reported", "[cpu][loader]") {
  const fs::path dir = fs::temp_directory_path() / ("plexus-dup-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::copy_file(fs::path(plugin_dir()) / "libplexus-cpu.so", dir / "libplexus-cpu-copy.so",
                fs::copy_options::overwrite_existing);
  {
    // The CPU plugin's own file (the build's plugin folder may hold the CUDA plugin too).
    Runtime rt(only({(fs::path(plugin_dir()) / "libplexus-cpu.so").string(), dir.string()}));
    CHECK(rt.plugins().size() == 1);
    const SkippedPlugin* s = skipped_file(rt, "libplexus-cpu-copy.so");
    REQUIRE(s != nullptr);
    CHECK_THAT(s->reason, PLX_CONTAINS("duplicate of plugin 'cpu'"));
  }
  fs::remove_all(dir);
}

TEST_CASE("plugins.disable keeps a plugin out", "[cpu][loader]") {
  RuntimeOptions o = only({plugin_dir(), fixture_dir() + "/good"});
  o.plugins.disabled = {"testgood"};
  Runtime rt(o);
  CHECK(loaded(rt, "cpu"));
  CHECK_FALSE(loaded(rt, "testgood"));
  const SkippedPlugin* s = skipped_file(rt, "libplexus-testgood.so");
  REQUIRE(s != nullptr);
  // Known by its file name, so never loaded.
  CHECK_THAT(s->reason, PLX_CONTAINS("plugin 'testgood' is disabled by plugins.disable (not loaded)"));
}

TEST_CASE("a configured plugin path that does not exist is reported", "[cpu][loader]") {
  Runtime rt(only({plugin_dir(), "/nonexistent/plexus/plugins"}));
  CHECK(loaded(rt, "cpu"));
  bool found = false;
  for (const auto& s : rt.skipped())
    if (s.path == "/nonexistent/plexus/plugins") {
      found = true;
      CHECK_THAT(s.reason, PLX_CONTAINS("does not exist"));
    }
  CHECK(found);
}

TEST_CASE("files that are not named like plugins are ignored in directories", "[cpu][loader]") {
  const fs::path dir = fs::temp_directory_path() / ("plexus-names-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "README.txt") << "not a plugin\n";
  std::ofstream(dir / "libother.so") << "not a plugin either\n";
  {
    Runtime rt(only({dir.string()}));
    CHECK(rt.plugins().empty());
    CHECK(rt.skipped().empty());
    // ... but named explicitly, a file is tried and its problem reported.
    Runtime rt2(only({(dir / "libother.so").string()}));
    REQUIRE(rt2.skipped().size() == 1);
    CHECK_THAT(rt2.skipped()[0].reason, PLX_CONTAINS("not a loadable shared library"));
  }
  fs::remove_all(dir);
}

TEST_CASE("plugin options reach init, and unknown options fail it", "[cpu][loader]") {
  RuntimeOptions o = only({plugin_dir(), fixture_dir() + "/good"});
  o.plugins.options["testgood"]["factor"] = "3";
  {
    Runtime rt(o);
    REQUIRE(loaded(rt, "testgood"));
    Backend& dev = rt.backend("testdev");
    const Tensor x = Tensor::from_vector(dev, std::vector<float>{1, -2, 4}, {3});
    const Tensor y = call(dev, "testgood.scale", {x}).at(0);
    CHECK(y.to_vector<float>() == std::vector<float>{3, -6, 12});
  }
  o.plugins.options["testgood"]["colour"] = "blue";
  Runtime rt(o);
  CHECK_FALSE(loaded(rt, "testgood"));
  const SkippedPlugin* s = skipped_file(rt, "libplexus-testgood.so");
  REQUIRE(s != nullptr);
  CHECK_THAT(s->reason,
             PLX_CONTAINS("unknown option 'colour' (known: factor, claims, conv_nchw_only, one_pass"));

  RuntimeOptions c = only({plugin_dir()});
  c.plugins.options["cpu"]["threads"] = "many";
  Runtime rt_cpu(c);
  CHECK_FALSE(loaded(rt_cpu, "cpu"));
  REQUIRE(rt_cpu.skipped().size() == 1);
  CHECK_THAT(rt_cpu.skipped()[0].reason, PLX_CONTAINS("option 'threads': expected an integer"));

  RuntimeOptions chunk = only({plugin_dir()});
  chunk.plugins.options["cpu"]["fuse_chunk_bytes"] = "-1";
  Runtime rt_chunk(chunk);
  CHECK_FALSE(loaded(rt_chunk, "cpu"));
  REQUIRE(rt_chunk.skipped().size() == 1);
  CHECK_THAT(rt_chunk.skipped()[0].reason,
             PLX_CONTAINS("option 'fuse_chunk_bytes': expected bytes >= 0, got -1"));
}

TEST_CASE("a plugin's own ops get schemas, kernels and gradients", "[cpu][loader]") {
  Runtime rt(only({plugin_dir(), fixture_dir() + "/good"}));
  const OpSchema* s = rt.ops().find("testgood.scale");
  REQUIRE(s != nullptr);
  CHECK(s->origin == "testgood");
  CHECK(s->doc == "y = factor * x");
  Backend& dev = rt.backend("testdev");
  CHECK(dev.supports(s->id, PLX_F32));
  CHECK_FALSE(rt.backend("cpu").supports(s->id, PLX_F32));

  const Tensor x = Tensor::from_vector(dev, std::vector<float>{1, 2}, {2});
  const Tensor y = call(dev, "testgood.scale", {x}).at(0);
  CHECK(y.to_vector<float>() == std::vector<float>{2, 4});
  const Tensor dy = Tensor::from_vector(dev, std::vector<float>{1, 10}, {2});
  const auto grads = call_grad(dev, "testgood.scale", {x}, {y}, {dy});
  REQUIRE(grads.size() == 1);
  CHECK(grads[0].to_vector<float>() == std::vector<float>{2, 20});

  // Its schema's dtype rule is enforced by the core.
  const Tensor xd = Tensor::from_vector(dev, std::vector<double>{1}, {1});
  REQUIRE_THROWS_WITH(call(dev, "testgood.scale", {xd}), PLX_CONTAINS("expected one of f32"));
}

TEST_CASE("auto picks an accelerator and never a host backend over the cpu", "[cpu][loader]") {
  // testdev keeps its tensors in host memory (PLX_CAP_UNIFIED_HOST), as the cpu does.
  Runtime rt(only({fixture_dir() + "/good", (fs::path(plugin_dir()) / "libplexus-cpu.so").string()}));
  REQUIRE(rt.find_backend("testdev") != nullptr);
  CHECK(&rt.select_backend("auto") == &rt.backend("cpu"));
}

TEST_CASE("kernels for ops no schema describes are reported, not used", "[cpu][loader]") {
  Runtime rt(only({fixture_dir() + "/good"}));
  const auto& orphans = rt.backend("testdev").orphan_kernels();
  REQUIRE(orphans.size() == 1);
  CHECK(orphans[0] == "no_such_op/f32");
}

TEST_CASE("asking for a backend that is not loaded names the loaded ones", "[cpu][loader]") {
  Runtime rt(only({(fs::path(plugin_dir()) / "libplexus-cpu.so").string(), fixture_dir() + "/broken"}));
  REQUIRE_THROWS_AS(rt.backend("cuda"), PluginError);
  REQUIRE_THROWS_WITH(rt.backend("cuda"), PLX_CONTAINS("unknown backend 'cuda' (loaded backends: cpu)"));
  REQUIRE_THROWS_WITH(rt.backend("cuda"), PLX_CONTAINS("libplexus-initfail.so"));
  CHECK(&rt.select_backend("auto") == &rt.backend("cpu"));
  RuntimeOptions bad = only({plugin_dir()});
  bad.fallback = "tpu";
  REQUIRE_THROWS_WITH(Runtime(bad), PLX_CONTAINS("backend.fallback names backend 'tpu'"));
}

TEST_CASE("with no plugins at all the error says where it looked", "[cpu][loader]") {
  Runtime rt(only({"/nonexistent/dir"}));
  REQUIRE_THROWS_WITH(rt.backend("cpu"), PLX_CONTAINS("searched: /nonexistent/dir"));
}

// Appending a slot (ABI 1.1: plx_comm.bench_native) must not strand plugins built against 1.0:
// their shorter table loads; one shorter than 1.0's is refused, naming both sizes.
TEST_CASE("a communicator table of ABI 1.0 still loads, a shorter one is refused",
          "[cpu][loader][comm]") {
  Runtime rt(only({fixture_dir() + "/abi10", plugin_dir()}));
  CHECK(loaded(rt, "abi10"));
  bool listed = false;
  for (const Communicator* c : rt.communicators()) listed = listed || c->name() == "abi10";
  CHECK(listed);
  const SkippedPlugin* s = skipped_file(rt, "libplexus-commsmall.so");
  REQUIRE(s != nullptr);
  CHECK_THAT(s->reason, PLX_CONTAINS("communicator 0 table is 152 bytes, ABI 1.0 needs 160"));
}

// ABI 1.2 appended the kernel-extension slots to plx_plugin: a descriptor of 1.1 (and 1.0) ends
// before them and must still load, its slots past struct_size never read. The fixture keeps
// extension slots there that would attach kernels (one computing relu as 42) if they were read.
TEST_CASE("a plugin descriptor of ABI 1.1 still loads and nothing past its size is read",
          "[cpu][loader]") {
  Runtime rt(only({fixture_dir() + "/abi11", plugin_dir()}));
  REQUIRE(loaded(rt, "abi11"));
  for (const auto& p : rt.plugins())
    if (p->name() == "abi11") {
      CHECK(p->abi_minor() == 1);
      CHECK(p->descriptor().struct_size == PLX_PLUGIN_SIZE_1_1);
      CHECK(p->extension_kernels().empty());
    }
  CHECK(rt.skipped().empty());
  CHECK(rt.extension_kernels().empty());
  const OpSchema* s = rt.ops().find("abi11.negate");
  REQUIRE(s != nullptr);
  CHECK(s->origin == "abi11");
  // The cpu's relu kernels are its own: nothing was appended.
  Backend& cpu_b = rt.backend("cpu");
  const int32_t relu = rt.ops().get("relu").id;
  for (const plx_kernel* k : cpu_b.kernels(relu, PLX_F32)) {
    INFO(k->impl);
    CHECK(&cpu_b.kernel_plugin(k) == &cpu_b.plugin());
  }
  const Tensor x = Tensor::from_vector(cpu_b, std::vector<float>{-1, 2}, {2});
  CHECK(call(cpu_b, "relu", {x}).at(0).to_vector<float>() == std::vector<float>{0, 2});
}

TEST_CASE("a descriptor that sets one of the two kernel-extension slots is refused",
          "[cpu][loader]") {
  Runtime rt(only({fixture_dir() + "/extbad/libplexus-exthalf.so"}));
  REQUIRE(rt.skipped().size() == 1);
  CHECK_THAT(rt.skipped()[0].reason,
             PLX_CONTAINS("sets only one of extension_kernel_count and get_extension_kernel "
                          "(both or neither)"));
}
