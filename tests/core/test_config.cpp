// Configuration: defaults, malformed TOML, unknown keys, wrong types, out-of-range values,
// --set overrides, and the README documenting every key.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plexus/config.hpp"
#include "plexus/error.hpp"
#include "plexus/log.hpp"
#include "plexus/model.hpp"
#include "support/harness.hpp"
#include "train/step_graph.hpp"

using namespace plexus;
using namespace plexus::test;

TEST_CASE("every key has a default", "[config]") {
  const Config c;
  for (const ConfigKey& k : Config::keys()) {
    INFO(k.path);
    CHECK(c.origin(k.path) == "default");
    CHECK_FALSE(k.doc.empty());
  }
  CHECK(c.get_string("backend.name") == "auto");
  CHECK(c.get_int("backend.device") == 0);
  CHECK(c.get_string("backend.fallback").empty());
  CHECK(c.get_bytes("memory.limit") == 0);
  CHECK(c.get_string("logging.level") == "info");
  CHECK(c.get_strings("plugins.paths").empty());
  CHECK(c.plugin_options().empty());
}

TEST_CASE("a valid file sets keys and remembers where each came from", "[config]") {
  const Config c = Config::parse(R"(
[plugins]
paths = ["/opt/plexus/plugins", "build/lib/plexus/plugins"]
[plugins.options.cpu]
threads = 2
[backend]
name = "cpu"
device = 0
fallback = "cpu"
[memory]
limit = "1.5GiB"
[logging]
level = "debug"
)",
                                 "run.toml");
  CHECK(c.get_strings("plugins.paths") ==
        std::vector<std::string>{"/opt/plexus/plugins", "build/lib/plexus/plugins"});
  CHECK(c.plugin_options().at("cpu").at("threads") == "2");
  CHECK(c.get_string("backend.name") == "cpu");
  CHECK(c.get_bytes("memory.limit") == 1610612736ull);
  CHECK(c.get_string("logging.level") == "debug");
  CHECK(c.origin("backend.name") == "run.toml:7:1");
  CHECK(c.origin("backend.device") == "run.toml:8:1");
  CHECK(c.origin("logging.file") == "default");
  CHECK(c.source() == "run.toml");
  const RuntimeOptions o = runtime_options(c);
  CHECK(o.plugins.paths.size() == 2);
  CHECK(o.fallback == "cpu");
  CHECK(o.memory_limit == 1610612736ull);
  CHECK(o.plugins.options.at("cpu").at("threads") == "2");
}

TEST_CASE("malformed TOML is an error with file, line and column", "[config]") {
  REQUIRE_THROWS_AS(Config::parse("[backend\nname = \"cpu\"\n", "bad.toml"), ConfigError);
  REQUIRE_THROWS_WITH(Config::parse("[backend\nname = \"cpu\"\n", "bad.toml"),
                      PLX_CONTAINS("bad.toml:1:") && PLX_CONTAINS("TOML syntax error"));
  REQUIRE_THROWS_WITH(Config::parse("[backend]\nname = \"cpu\n", "bad.toml"),
                      PLX_CONTAINS("bad.toml:2:"));
  REQUIRE_THROWS_WITH(Config::parse("[backend]\nname = \"a\"\nname = \"b\"\n", "dup.toml"),
                      PLX_CONTAINS("dup.toml:3:"));
}

TEST_CASE("unknown keys and sections are errors naming what is known", "[config]") {
  REQUIRE_THROWS_WITH(Config::parse("[backend]\nnmae = \"cpu\"\n", "run.toml"),
                      PLX_CONTAINS("run.toml:2:1: unknown key 'backend.nmae' (known keys in "
                                   "[backend]: name, device, fallback, kernels, exclude_kernels, tune_timeout_s, check_kernels, step_timeout_s, tune_cache)"));
  REQUIRE_THROWS_WITH(Config::parse("[modle]\nx = 1\n", "run.toml"),
                      PLX_CONTAINS("unknown key 'modle' (known sections: plugins, backend, "
                                   "memory, logging, model, data, train, parallel, output)"));
  REQUIRE_THROWS_WITH(Config::parse("backend = 3\n", "run.toml"),
                      PLX_CONTAINS("backend: expected a table"));
}

TEST_CASE("wrong types are errors naming the expected type", "[config]") {
  REQUIRE_THROWS_WITH(Config::parse("[backend]\ndevice = \"zero\"\n", "run.toml"),
                      PLX_CONTAINS("run.toml:2:10: backend.device: expected an integer, got a "
                                   "string"));
  REQUIRE_THROWS_WITH(Config::parse("[plugins]\npaths = \"/opt\"\n", "run.toml"),
                      PLX_CONTAINS("plugins.paths: expected an array of strings, got a string"));
  REQUIRE_THROWS_WITH(Config::parse("[plugins]\npaths = [\"/opt\", 3]\n", "run.toml"),
                      PLX_CONTAINS("element 1 is an integer"));
  REQUIRE_THROWS_WITH(Config::parse("[plugins.options]\ncpu = 2\n", "run.toml"),
                      PLX_CONTAINS("plugins.options.cpu: expected a table of options"));
  REQUIRE_THROWS_WITH(Config::parse("[plugins.options.cpu]\nthreads = [1]\n", "run.toml"),
                      PLX_CONTAINS("plugins.options.cpu.threads: expected a string, number or "
                                   "boolean, got an array"));
}

TEST_CASE("out-of-range and unknown values are errors naming the allowed ones", "[config]") {
  REQUIRE_THROWS_WITH(Config::parse("[backend]\ndevice = -1\n", "run.toml"),
                      PLX_CONTAINS("backend.device: expected an integer >= 0, got -1"));
  REQUIRE_THROWS_WITH(Config::parse("[logging]\nlevel = \"loud\"\n", "run.toml"),
                      PLX_CONTAINS("logging.level: expected one of trace, debug, info, warn, "
                                   "error, off, got \"loud\""));
  REQUIRE_THROWS_WITH(Config::parse("[memory]\nlimit = \"lots\"\n", "run.toml"),
                      PLX_CONTAINS("memory.limit: expected a size like 512MiB"));
  REQUIRE_THROWS_WITH(Config::parse("[memory]\nlimit = -5\n", "run.toml"),
                      PLX_CONTAINS("expected a size >= 0, got -5"));
}

TEST_CASE("every problem in a file is reported at once", "[config]") {
  try {
    Config::parse("[backend]\ndevice = -1\nnmae = 1\n[logging]\nlevel = 3\n", "run.toml");
    FAIL("no error");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, PLX_CONTAINS("run.toml:2:10: backend.device"));
    CHECK_THAT(msg, PLX_CONTAINS("run.toml:3:1: unknown key 'backend.nmae'"));
    CHECK_THAT(msg, PLX_CONTAINS("run.toml:5:9: logging.level: expected a string"));
  }
}

TEST_CASE("sizes accept units", "[config]") {
  const struct {
    const char* text;
    uint64_t bytes;
  } cases[] = {{"0", 0},
               {"1048576", 1048576},
               {"\"512MiB\"", 536870912ull},
               {"\"2GB\"", 2000000000ull},
               {"\"1.5 KiB\"", 1536},
               {"\"64kb\"", 64000},
               {"\"7\"", 7}};
  for (const auto& c : cases) {
    INFO(c.text);
    CHECK(Config::parse(std::string("[memory]\nlimit = ") + c.text + "\n", "t").get_bytes(
              "memory.limit") == c.bytes);
  }
}

TEST_CASE("a --set overrides a key after the file", "[config]") {
  Config c = Config::parse("[backend]\nname = \"cpu\"\n", "run.toml");
  c.set("backend.name=cuda");  // a bare word is a string
  CHECK(c.get_string("backend.name") == "cuda");
  CHECK(c.origin("backend.name") == "--set backend.name=cuda");
  c.set("backend.device = 1");
  CHECK(c.get_int("backend.device") == 1);
  c.set("plugins.paths=[\"/a\", \"/b\"]");
  CHECK(c.get_strings("plugins.paths").size() == 2);
  c.set("memory.limit=\"2GiB\"");
  CHECK(c.get_bytes("memory.limit") == 2147483648ull);
  c.set("plugins.options.cpu.threads=4");
  c.set("plugins.options.testgood.factor=3");
  CHECK(c.plugin_options().at("cpu").at("threads") == "4");
  CHECK(c.plugin_options().at("testgood").at("factor") == "3");

  REQUIRE_THROWS_WITH(c.set("backend.nmae=cpu"),
                      PLX_CONTAINS("--set backend.nmae=cpu: unknown key 'backend.nmae' (known "
                                   "keys in [backend]: name, device, fallback, kernels, exclude_kernels, tune_timeout_s, check_kernels, step_timeout_s, tune_cache)"));
  REQUIRE_THROWS_WITH(c.set("backend.device=x"),
                      PLX_CONTAINS("--set backend.device=x: backend.device: expected an integer, "
                                   "got a string"));
  REQUIRE_THROWS_WITH(c.set("backend.device"), PLX_CONTAINS("expected key=value"));
  REQUIRE_THROWS_WITH(c.set("plugins.options.cpu=2"),
                      PLX_CONTAINS("expected plugins.options.<plugin>.<option>=value"));
  REQUIRE_THROWS_WITH(c.set("logging.level=loud"), PLX_CONTAINS("expected one of"));
}

TEST_CASE("a missing config file is an error naming it", "[config]") {
  REQUIRE_THROWS_WITH(Config::load("/nonexistent/run.toml"),
                      PLX_CONTAINS("/nonexistent/run.toml: cannot open the config file"));
}

TEST_CASE("the resolved configuration dumps to TOML that reads back the same", "[config]") {
  Config c;
  c.set("backend.name=cpu");
  c.set("memory.limit=\"1MiB\"");
  c.set("plugins.paths=[\"/x\"]");
  c.set("plugins.options.cpu.threads=2");
  const std::string text = c.dump();
  const Config back = Config::parse(text, "dump");
  CHECK(back.get_string("backend.name") == "cpu");
  CHECK(back.get_bytes("memory.limit") == 1048576);
  CHECK(back.get_strings("plugins.paths") == std::vector<std::string>{"/x"});
  CHECK(back.plugin_options().at("cpu").at("threads") == "2");
  CHECK(back.get_string("logging.level") == "info");
}

TEST_CASE("the README documents every config key with its type and default", "[config]") {
  std::ifstream f(source_dir() + "/README.md");
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string readme = ss.str();
  for (const ConfigKey& k : Config::keys()) {
    INFO(k.path);
    // A table row: | `key` | type | default | ...
    const std::string row = "| `" + k.path + "` |";
    const auto pos = readme.find(row);
    REQUIRE(pos != std::string::npos);
    const std::string line = readme.substr(pos, readme.find('\n', pos) - pos);
    if (k.type != ConfigType::Options) CHECK_THAT(line, PLX_CONTAINS("`" + k.default_value + "`"));
  }
}

TEST_CASE("log levels are checked", "[config]") {
  CHECK(logging::parse_level("warn") == PLX_LOG_WARN);
  REQUIRE_THROWS_WITH(logging::parse_level("loud"),
                      PLX_CONTAINS("unknown log level 'loud' (expected trace, debug"));
}

TEST_CASE("memory.limit takes a fraction of the device as a number or a percentage", "[config]") {
  Config c = Config::parse("[memory]\nlimit = 0.8\n", "run.toml");
  CHECK(c.get_fraction("memory.limit") == 0.8);
  CHECK(c.get_bytes("memory.limit") == 0);
  CHECK(runtime_options(c).memory_fraction == 0.8);
  CHECK(runtime_options(c).memory_limit == 0);
  c.set("memory.limit=\"25%\"");
  CHECK(c.get_fraction("memory.limit") == 0.25);
  c.set("memory.limit=\"1GiB\"");
  CHECK(c.get_fraction("memory.limit") == 0);
  CHECK(c.get_bytes("memory.limit") == 1073741824ull);
  REQUIRE_THROWS_WITH(Config::parse("[memory]\nlimit = 1.5\n", "run.toml"),
                      PLX_CONTAINS("run.toml") && PLX_CONTAINS("memory.limit") &&
                          PLX_CONTAINS("expected a fraction of the device in (0, 1]"));
  REQUIRE_THROWS_WITH(Config::parse("[memory]\nlimit = \"150%\"\n", "run.toml"),
                      PLX_CONTAINS("expected a percentage in (0%, 100%], got \"150%\""));
  REQUIRE_THROWS_WITH(Config::parse("[memory]\nlimit = \"lots%\"\n", "run.toml"),
                      PLX_CONTAINS("expected a percentage"));
}

TEST_CASE("every config under configs/ loads and names a model that builds", "[config]") {
  // The shipped run configs (configs/models/ holds model files, configs/compare/ op suites).
  int loaded = 0;
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/configs")) {
    if (!e.is_regular_file() || e.path().extension() != ".toml") continue;
    INFO(e.path().string());
    const ModelSpec spec = model_of(Config::load(e.path().string()));  // as the trainer reads it
    CHECK(!spec.layers.empty());
    ++loaded;
  }
  CHECK(loaded >= 5);  // simplecnn, convnet, convnet_tta, mlp, resnet
  // The one-epoch time-to-accuracy recipe (docs/benchmarks.md) as the GPU run takes it.
  const Config tta = Config::load(source_dir() + "/configs/convnet_tta.toml");
  CHECK(tta.get_int("train.epochs") == 1);
  CHECK(tta.get_string("train.optimizer") == "adamw");
  CHECK(tta.get_float("train.label_smoothing") == Approx(0.1));
  CHECK(tta.get_float("train.target_accuracy") == Approx(0.91));
}
