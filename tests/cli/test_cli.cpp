// The plexus command line, run as a user would: exit codes, reports, and clear errors.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "plexus/json.hpp"
#include "support/cli.hpp"
#include "support/harness.hpp"

using namespace plexus::test;
namespace fs = std::filesystem;

namespace {

std::string temp_file(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("plexus-cli-" + std::to_string(getpid()) + "-" + name);
  std::ofstream(p) << text;
  return p.string();
}

// "Plugins loaded (N):" for the plugins the build tree has.
std::string expected_plugins_line() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(plugin_dir()))
    if (e.path().extension() == ".so") ++n;
  return "Plugins loaded (" + std::to_string(n) + "):";
}

}  // namespace

TEST_CASE("plexus info lists the CPU plugin, its device and its ops", "[cpu][cli]") {
  const Run r = run_plexus("info");
  INFO(r.output);
  REQUIRE(r.status == 0);
  // The build tree's plugins: cpu, and cuda where the toolkit was found.
  CHECK_THAT(r.output, PLX_CONTAINS(expected_plugins_line()));
  CHECK_THAT(r.output, PLX_CONTAINS("cpu 0.1.0  ABI " + std::to_string(PLX_ABI_MAJOR) + "." +
                                    std::to_string(PLX_ABI_MINOR)));
  CHECK_THAT(r.output, PLX_CONTAINS("libplexus-cpu.so"));
  CHECK_THAT(r.output, PLX_CONTAINS("[0] CPU: "));
  CHECK_THAT(r.output, PLX_CONTAINS("relu"));
  CHECK_THAT(r.output, PLX_CONTAINS("f32 f16 bf16 f64"));
  CHECK_THAT(r.output, PLX_CONTAINS("Plugins skipped (0):"));
}

TEST_CASE("plexus info --json gives the same report as JSON", "[cpu][cli]") {
  const Run r = run_plexus("info --json");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.front() == '{');
  CHECK_THAT(r.output, PLX_CONTAINS("\"plugins\""));
  CHECK_THAT(r.output, PLX_CONTAINS("\"skipped\""));
  CHECK_THAT(r.output, PLX_CONTAINS("\"backends\""));
  CHECK_THAT(r.output, PLX_CONTAINS("\"relu\""));
  // Balanced braces and brackets outside strings: a cheap structural check.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : r.output) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    REQUIRE(depth >= 0);
  }
  CHECK(depth == 0);
}

TEST_CASE("broken plugins in PLEXUS_PLUGIN_PATH are reported and skipped", "[cpu][cli]") {
  const Run r = run_plexus("info", "PLEXUS_PLUGIN_PATH=" + fixture_dir() + "/broken");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS(expected_plugins_line()));
  CHECK_THAT(r.output, PLX_CONTAINS("Plugins skipped (6):"));
  CHECK_THAT(r.output, PLX_CONTAINS("libplexus-badabi.so"));
  CHECK_THAT(r.output, PLX_CONTAINS("built for plugin ABI 99." + std::to_string(PLX_ABI_MINOR)));
  CHECK_THAT(r.output, PLX_CONTAINS("init failed (backend error): simulated failure"));
  CHECK_THAT(r.output, PLX_CONTAINS("not a loadable shared library"));
  CHECK_THAT(r.output, PLX_CONTAINS("[warning] skipped plugin"));
}

TEST_CASE("plugins named in the config load, with their options", "[cpu][cli]") {
  const std::string cfg = temp_file("good.toml", "[plugins]\npaths = [\"" + fixture_dir() +
                                                     "/good\"]\n[plugins.options.testgood]\nfactor = 5\n");
  const Run r = run_plexus("info --config " + cfg);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS("testgood 1.2.3"));
  CHECK_THAT(r.output, PLX_CONTAINS("testdev (plugin testgood)"));
  CHECK_THAT(r.output, PLX_CONTAINS("testgood.scale"));
  CHECK_THAT(r.output, PLX_CONTAINS("initialised with factor 5"));
  fs::remove(cfg);
}

TEST_CASE("a malformed config exits 2 naming file, line and column", "[cpu][cli]") {
  const std::string cfg = temp_file("bad.toml", "[backend]\nname = cpu\n");
  const Run r = run_plexus("info --config " + cfg);
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK_THAT(r.output, PLX_CONTAINS(cfg + ":2:"));
  CHECK_THAT(r.output, PLX_CONTAINS("configuration error"));
  fs::remove(cfg);
}

TEST_CASE("bad --set and bad log levels exit 2 with the reason", "[cpu][cli]") {
  Run r = run_plexus("info --set backend.nmae=cpu");
  CHECK(r.status == 2);
  CHECK_THAT(r.output, PLX_CONTAINS("unknown key 'backend.nmae'"));
  r = run_plexus("info", "PLEXUS_LOG_LEVEL=loud");
  CHECK(r.status == 2);
  CHECK_THAT(r.output, PLX_CONTAINS("unknown log level 'loud'"));
  r = run_plexus("info --config /nonexistent/run.toml");
  CHECK(r.status != 0);
  CHECK_THAT(r.output, PLX_CONTAINS("/nonexistent/run.toml"));
}

TEST_CASE("the --config-dump flag prints the resolved configuration", "[cpu][cli]") {
  const Run r = run_plexus("info --config-dump --set backend.name=cpu --set memory.limit=\\\"1GiB\\\"");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS("name = 'cpu'"));
  CHECK_THAT(r.output, PLX_CONTAINS("limit = 1073741824"));
}

TEST_CASE("usage errors and help", "[cpu][cli]") {
  Run r = run_plexus("");
  CHECK(r.status != 0);
  CHECK_THAT(r.output, PLX_CONTAINS("info"));
  r = run_plexus("info --help");
  CHECK(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS("--json"));
  r = run_plexus("--version");
  CHECK(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS("plexus 0.1.0"));
  r = run_plexus("frobnicate");
  CHECK(r.status != 0);
}

namespace {

// A quick training config in `dir`: SimpleCNN on the synthetic set, its runs under dir/run.
std::string train_config(const TempDir& dir, const std::string& name, const std::string& extra = "") {
  const std::string path = dir / name;
  std::ofstream(path) << "[model]\nname = \"simplecnn\"\n[data]\ndataset = \"synthetic\"\n"
                         "synthetic_samples = 512\n[train]\nepochs = 2\n[output]\ndir = \""
                      << (dir / "run") << "\"\n" << extra;
  return path;
}

}  // namespace

TEST_CASE("plexus train trains, prints progress and a summary, and writes the run", "[cpu][cli][train]") {
  const TempDir tmp("cli-train");
  const fs::path out = tmp / "run";
  const std::string cfg = train_config(tmp, "train-ok.toml");
  const Run r = run_plexus("train " + cfg + " --set logging.progress=plain");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS("epoch 2/2") && PLX_CONTAINS("img/s") &&
                           PLX_CONTAINS("ETA") && PLX_CONTAINS("test loss"));
  CHECK_THAT(r.output, PLX_CONTAINS("done: 2 epochs"));
  CHECK(r.output.find('\r') == std::string::npos);  // not a terminal: plain lines
  CHECK(fs::exists(out / "metrics.jsonl"));
  CHECK(fs::exists(out / "manifest.json"));
  CHECK(fs::exists(out / "checkpoint.plxckpt"));
  // Again: the old run stays, the new one goes beside it.
  const Run again = run_plexus("train " + cfg + " --set logging.progress=none");
  CHECK(again.status == 0);
  CHECK(fs::exists(fs::path(out.string() + "-2") / "checkpoint.plxckpt"));
  // Resume a finished run with more epochs.
  const Run more = run_plexus("train " + cfg + " --resume " + out.string() +
                              " --set train.epochs=3 --set logging.progress=plain");
  INFO(more.output);
  CHECK(more.status == 0);
  CHECK_THAT(more.output, PLX_CONTAINS("resuming") && PLX_CONTAINS("epoch 3/3"));
  CHECK(more.output.find("epoch 1/3") == std::string::npos);
}

TEST_CASE("plexus train exits 2 for a bad config and 3 for a diverged run", "[cpu][cli][train]") {
  const TempDir tmp("cli-train");
  const Run unknown = run_plexus("train " + train_config(tmp, "train-bad.toml") +
                                 " --set model.name=nosuch");
  CHECK(unknown.status == 2);
  CHECK_THAT(unknown.output, PLX_CONTAINS("nosuch"));
  const Run badkey = run_plexus("train " + train_config(tmp, "train-bad2.toml", "[train]\nepoch = 3\n"));
  CHECK(badkey.status == 2);
  const Run missing = run_plexus("train " + train_config(tmp, "train-bad3.toml") +
                                 " --set data.dataset=fashion-mnist --set data.path=/nonexistent");
  CHECK(missing.status == 1);
  CHECK_THAT(missing.output, PLX_CONTAINS("/nonexistent") && PLX_CONTAINS("dataset-fashion-mnist"));
  const Run nan = run_plexus("train " + train_config(tmp, "train-nan.toml") +
                             " --set train.lr=1e30 --set train.momentum=0 --set logging.progress=none");
  INFO(nan.output);
  CHECK(nan.status == 3);
  CHECK_THAT(nan.output, PLX_CONTAINS("training diverged: step"));
}

TEST_CASE("plexus train names a parallel launch that cannot work and exits 2", "[cpu][cli][train]") {
  const TempDir tmp("cli-parallel");
  // Pipeline stages need ranks: one process cannot hold two stages.
  const Run one = run_plexus("train " + train_config(tmp, "pp.toml") + " --set parallel.pipeline_stages=2");
  INFO(one.output);
  CHECK(one.status == 2);
  CHECK_THAT(one.output, PLX_CONTAINS("parallel.pipeline_stages = 2 needs a multiple of 2 ranks") &&
                             PLX_CONTAINS("mpirun -np 2"));
  // The launcher's environment is read before any group is joined.
  const Run bad_env = run_plexus("train " + train_config(tmp, "env.toml"),
                                 "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=x");
  INFO(bad_env.output);
  CHECK(bad_env.status == 2);
  CHECK_THAT(bad_env.output, PLX_CONTAINS("OMPI_COMM_WORLD_RANK='x' is not a non-negative integer"));
  // A global batch the ranks cannot share.
  const Run odd = run_plexus("train " + train_config(tmp, "odd.toml") + " --set train.batch_size=64",
                             "OMPI_COMM_WORLD_SIZE=3 OMPI_COMM_WORLD_RANK=0");
  INFO(odd.output);
  CHECK(odd.status == 2);
  CHECK_THAT(odd.output, PLX_CONTAINS("train.batch_size = 64 does not divide among the 3 data-parallel "
                                      "ranks of this launch (OMPI_COMM_WORLD_SIZE=3)"));
}

TEST_CASE("a killed run leaves a checkpoint that reads and resumes", "[cpu][cli][train]") {
  const TempDir tmp("cli-train");
  const fs::path out = tmp / "run";
  // Many small epochs with a checkpoint every step, killed with SIGKILL while it runs.
  const std::string cfg = train_config(tmp, "train-kill.toml",
                                       "[logging]\nprogress = \"none\"\n");
  const std::string cmd = "env -u PLEXUS_PLUGIN_PATH " + std::string(PLEXUS_BINARY_DIR) +
                          "/bin/plexus train " + cfg +
                          " --set train.epochs=1000 --set output.checkpoint_steps=1 >/dev/null 2>&1 & "
                          "pid=$!; for i in $(seq 300); do [ -f " + (out / "checkpoint.plxckpt").string() +
                          " ] && break; sleep 0.1; done; sleep 1; kill -9 $pid; wait $pid 2>/dev/null";
  std::system(cmd.c_str());
  REQUIRE(fs::exists(out / "checkpoint.plxckpt"));
  const Run resumed = run_plexus("train " + cfg + " --resume " + out.string() +
                                 " --set train.epochs=1000 --set train.max_steps=1 --set logging.progress=plain");
  INFO(resumed.output);
  // max_steps already passed or reached at once: either way the checkpoint was read whole.
  CHECK(resumed.status == 0);
  CHECK_THAT(resumed.output, PLX_CONTAINS("resuming"));
}

TEST_CASE("plexus bench comm names a bad option and its value, exit 2", "[cpu][cli][bench]") {
  struct Case {
    const char* args;
    const char* says;
  };
  const Case cases[] = {
      {"--max-bytes 12Q", "plexus bench comm: --max-bytes: '12Q' is not a size in bytes"},
      {"--min-bytes 1M --max-bytes 8", "--min-bytes 1048576 is larger than --max-bytes 8"},
      {"--ops all_reduce,alltoall",
       "--ops: unknown collective 'alltoall' in 'all_reduce,alltoall'"},
      {"--dtype f8", "--dtype: 'f8' is not a dtype"},
      {"--factor 1", "--factor: must be at least 2, got 1"},
      {"--rounds 0", "--rounds: must be >= 1, got 0"},
      {"--backend vulkan", "--comm: no default communicator for backend 'vulkan'"},
  };
  for (const Case& c : cases) {
    const Run r = run_plexus(std::string("bench comm ") + c.args);
    INFO(c.args << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK_THAT(r.output, PLX_CONTAINS(c.says));
  }
}

TEST_CASE("plexus bench comm names a communicator it cannot find and what it found",
          "[cpu][cli][bench]") {
  const Run r = run_plexus("bench comm --comm carrier-pigeon --max-bytes 1K");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK_THAT(r.output, PLX_CONTAINS("communicator 'carrier-pigeon' is not available") &&
                           PLX_CONTAINS("plugins loaded: cpu"));
}

TEST_CASE("plexus bench comm in one process prints the table and writes JSON",
          "[cpu][cli][bench][mpi]") {
  if (!fs::exists(fs::path(plugin_dir()) / "libplexus-mpi.so"))
    PLX_SKIP("the mpi plugin was not built (no MPI found at configure time)");
  const TempDir tmp("cli-bench");
  const std::string json = tmp / "comm.json";
  // One process without a launcher: MPI starts as a singleton, a group of one.
  const Run r = run_plexus(
      "bench comm --ops all_reduce,all_gather --max-bytes 1K --iters 2 "
      "--warmup 1 --rounds 1 --json " +
      json);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS("# plexus bench comm: mpi on cpu, 1 rank, f32"));
  CHECK_THAT(r.output, PLX_CONTAINS("busbw(GB/s)") && PLX_CONTAINS("native(us)"));
  CHECK_THAT(r.output,
             PLX_CONTAINS("# max overhead at >= 1 MiB: n/a (no size of 1 MiB or more was run)"));
  CHECK_THAT(r.output, PLX_CONTAINS("# results checked: all correct"));
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const plexus::JsonValue v = plexus::parse_json(text, json);
  CHECK(v.at("comm").string == "mpi");
  CHECK(v.at("ranks").integer == 1);
  CHECK(v.at("native").boolean);
  const auto& rows = v.at("rows").items;
  REQUIRE(rows.size() == 16);  // 8 B .. 1 KiB: 8 sizes, twice
  CHECK(rows[0].at("collective").string == "all_reduce");
  CHECK(rows[0].at("bytes").integer == 8);
  CHECK(rows[0].at("count").integer == 2);
  CHECK(rows[0].at("iters").integer == 2);
  CHECK(rows[0].at("time_us").number > 0);
  CHECK(rows[0].at("busbw_gbs").number == 0);  // one rank: nothing crosses a bus
  CHECK(rows[0].at("native_time_us").kind == plexus::JsonValue::Kind::Number);
  CHECK(rows[15].at("collective").string == "all_gather");
  CHECK(rows[15].at("bytes").integer == 1024);
  CHECK(rows[15].at("wrong").integer == 0);
}

TEST_CASE("plexus bench comm over a communicator without a native baseline says so",
          "[cpu][cli][bench]") {
  // threads (ranks as threads of one process) has no library under it: a group of one here.
  const Run r =
      run_plexus("bench comm --comm threads --ops all_reduce --max-bytes 64 --iters 2 --rounds 1");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS("# native: none (communicator 'threads' has no bench_native)"));
  CHECK_THAT(
      r.output,
      PLX_CONTAINS(
          "# max overhead at >= 1 MiB: n/a (communicator 'threads' has no native baseline)"));
  CHECK_THAT(r.output, PLX_CONTAINS("# results checked: all correct"));
}

namespace {
std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST_CASE("plexus bench kernels times every candidate of the step and of GEMM shapes",
          "[cpu][cli][tune]") {
  TempDir dir("bench-kernels");
  const fs::path json = dir.path / "k.json";
  const Run r = run_plexus("bench kernels " + source_dir() + "/configs/simplecnn.toml --backend cpu " +
                           "--set train.batch_size=8 --gemm 16x8x32,24 --budget-ms 1 --json " +
                           json.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS("Training step of model 'simplecnn', batch 8, f32"));
  CHECK_THAT(r.output, PLX_CONTAINS("conv2d_1  conv2d  f32[8x1x28x28] f32[16x1x3x3] f32[16] -> f32[8x16x26x26]"));
  CHECK_THAT(r.output, PLX_CONTAINS("GEMMs as linear"));
  const plexus::JsonValue j = plexus::parse_json(read_text(json));
  CHECK(j.at("backend").string == "cpu");
  const auto& rows = j.at("rows").items;
  // conv2d_1 and conv2d_2 forward, conv2d_2's data gradient (im2col and Winograd), their two
  // weight gradients, two GEMMs.
  REQUIRE(rows.size() == 7);
  bool direct_timed = false, winograd_timed = false, declined = false;
  for (const auto& row : rows) {
    for (const auto& k : row.at("kernels").items) {
      if (k.find("ms")) CHECK(k.at("ms").number > 0);
      if (k.at("kernel").string == "direct" && k.find("ms")) direct_timed = true;
      if (k.at("kernel").string == "winograd_f2x3" && k.find("ms")) winograd_timed = true;
      if (const auto* e = k.find("error")) declined = declined || e->string.find("declined: ") == 0;
    }
    if (row.at("op").string == "linear") {
      CHECK(row.at("where").string.rfind("gemm ", 0) == 0);
      CHECK(row.at("kernels").items.at(0).at("kernel").string == "openblas");
      CHECK(row.at("gflop").number > 0);
    }
  }
  CHECK(direct_timed);    // the first layer's 9 taps
  // Both layers' 3x3 stride-1 forwards and weight gradients, the second's data gradient.
  CHECK(winograd_timed);
  CHECK(declined);        // the second's 144 taps are too many for the direct kernel
  CHECK(rows.at(5).at("where").string == "gemm 16x8x32");
  CHECK(rows.at(6).at("where").string == "gemm 24x24x24");

  const Run bad = run_plexus("bench kernels --gemm 12x3");
  CHECK(bad.status == 2);
  CHECK_THAT(bad.output, PLX_CONTAINS("--gemm: '12x3' has 2 sizes; expected N (square) or MxNxK"));
}

TEST_CASE("plexus bench step says where the training step's time goes", "[cpu][cli][bench]") {
  TempDir dir("bench-step");
  const fs::path json = dir.path / "s.json";
  const Run r = run_plexus("bench step " + source_dir() + "/configs/simplecnn.toml --backend cpu " +
                           "--set train.batch_size=8 --warmup 1 --steps 2 --top 3 --json " +
                           json.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, PLX_CONTAINS("Training step of model 'simplecnn', batch 8, f32, on cpu"));
  CHECK_THAT(r.output, PLX_CONTAINS("the step run as the trainer runs it"));
  CHECK_THAT(r.output, PLX_CONTAINS("the step fed by the trainer's pipeline"));
  CHECK_THAT(r.output, PLX_CONTAINS("by kernel (slowest first, top 3)"));
  CHECK_THAT(r.output, PLX_CONTAINS("by op:"));
  CHECK_THAT(r.output, PLX_CONTAINS("memory plan: activations "));
  const plexus::JsonValue j = plexus::parse_json(read_text(json));
  CHECK(j.at("backend").string == "cpu");
  CHECK(j.at("model").string == "simplecnn");
  CHECK(j.at("arena_bytes").number > 0);
  CHECK(j.at("persistent_bytes").number > 0);
  CHECK(j.at("pipeline_ms").number > 0);  // a wall-clock time: the steps took some time
  const auto& ks = j.at("kernels").items;
  REQUIRE(ks.size() > 5);
  double ms = 0, share = 0;
  bool conv_pool = false, update = false;
  for (const auto& k : ks) {
    CHECK_THAT(k.at("kernel").string, PLX_CONTAINS("cpu/"));
    CHECK(k.at("ms").number >= 0);
    ms += k.at("ms").number;
    share += k.at("share").number;
    conv_pool = conv_pool || k.at("op").string == "fused conv2d+relu+max_pool2d";
    update = update || k.at("op").string == "fused multi_tensor_sgd";
  }
  // The step's kernels as the trainer fuses them, and shares that are the kernels' parts.
  CHECK(conv_pool);
  CHECK(update);
  CHECK(ms == Approx(j.at("kernels_ms").number).epsilon(1e-9));
  if (ms > 0) CHECK(share == Approx(1.0).epsilon(1e-9));

  // f16 splits the step around the host's check of the gradients: both graphs are profiled,
  // the update's kernels last.
  const fs::path json16 = dir.path / "s16.json";
  const Run h = run_plexus("bench step " + source_dir() + "/configs/simplecnn.toml --backend cpu " +
                           "--set train.batch_size=8 --set train.precision=\\\"f16\\\" --warmup 0 " +
                           "--steps 1 --json " + json16.string());
  INFO(h.output);
  REQUIRE(h.status == 0);
  const plexus::JsonValue j16 = plexus::parse_json(read_text(json16));
  const auto& k16 = j16.at("kernels").items;
  REQUIRE(k16.size() > ks.size());
  CHECK(j16.at("pipeline_ms").number > 0);  // loss scaling's report read back with the loss
  bool check = false;
  for (const auto& k : k16) check = check || k.at("kernel").string.find("grad_check") != std::string::npos;
  CHECK(check);
  // The step ends with its updates (reading the check) and the loss scale's update.
  REQUIRE(k16.size() >= 2);
  CHECK(k16[k16.size() - 2].at("op").string == "fused multi_tensor_sgd");
  CHECK(k16.back().at("op").string == "loss_scale_update");

  const Run bad = run_plexus("bench step " + source_dir() + "/configs/simplecnn.toml --steps 0");
  CHECK(bad.status == 2);
  CHECK_THAT(bad.output, PLX_CONTAINS("--steps must be >= 1, got 0"));
}

TEST_CASE("a run's manifest says how each kernel was chosen, and a second run takes the cache's",
          "[cpu][cli][tune]") {
  TempDir dir("tune-cli");
  const std::string cache = (dir.path / "kernels.tsv").string();
  const std::string cfg = (dir.path / "tune.toml").string();
  std::ofstream(cfg) << "[model]\nname = \"simplecnn\"\n[data]\ndataset = \"synthetic\"\n"
                        "synthetic_samples = 64\n[train]\nepochs = 1\nbatch_size = 16\neval = false\n"
                        "[backend]\nname = \"cpu\"\ntune_cache = \""
                     << cache << "\"\n[logging]\nprogress = \"none\"\n";
  for (int run = 0; run < 2; ++run) {
    const fs::path out = dir.path / ("run" + std::to_string(run));
    const Run r = run_plexus("train " + cfg + " --set output.dir=\\\"" + out.string() + "\\\"");
    INFO(r.output);
    REQUIRE(r.status == 0);
    const plexus::JsonValue m = plexus::parse_json(read_text(out / "manifest.json"));
    const plexus::JsonValue& kc = m.at("kernel_choice");
    CHECK(kc.at("side").string == "auto");
    CHECK(kc.at("cache").string == cache);
    // Nodes with several candidates: conv2d_1 (inside its fused conv2d+relu kernel: im2col,
    // direct, Winograd), conv2d_2 and both its gradients (im2col, Winograd: too many taps for
    // the direct kernel), conv2d_1's weight gradient (im2col, direct, Winograd).
    const std::map<std::string, size_t> candidates = {{"conv2d_1 conv2d", 3},
                                                      {"conv2d_2 conv2d", 2},
                                                      {"conv2d_2.grad conv2d_backward_data", 2},
                                                      {"conv2d_2.grad conv2d_backward_weight", 2},
                                                      {"conv2d_1.grad conv2d_backward_weight", 3}};
    std::vector<std::string> seen;
    for (const plexus::JsonValue& n : kc.at("nodes").items) {
      seen.push_back(n.at("node").string + " " + n.at("op").string);
      INFO(seen.back());
      if (run == 0) {
        CHECK(n.at("how").string == "tuned");
        CHECK(n.at("ms").members.size() == candidates.at(seen.back()));
      } else {
        CHECK(n.at("how").string == "cached");
      }
    }
    CHECK(seen == std::vector<std::string>{"conv2d_1 conv2d", "conv2d_2 conv2d",
                                           "conv2d_2.grad conv2d_backward_data",
                                           "conv2d_2.grad conv2d_backward_weight",
                                           "conv2d_1.grad conv2d_backward_weight"});
    CHECK(kc.at("tuned").integer == (run == 0 ? 5 : 0));
    CHECK(kc.at("cached").integer == (run == 0 ? 0 : 5));
    CHECK(kc.at("excluded").items.empty());
  }
  {
    // Winograd excluded: the manifest lists the pattern, no node runs or times it, and the
    // choices among what is left are tuned afresh (another key), not read from the cache.
    const fs::path out = dir.path / "excluded";
    const Run r = run_plexus("train " + cfg + " --set output.dir=\\\"" + out.string() +
                             "\\\" --set 'backend.exclude_kernels=[\"winograd*\"]'");
    INFO(r.output);
    REQUIRE(r.status == 0);
    const plexus::JsonValue m = plexus::parse_json(read_text(out / "manifest.json"));
    const plexus::JsonValue& kc = m.at("kernel_choice");
    REQUIRE(kc.at("excluded").items.size() == 1);
    CHECK(kc.at("excluded").items[0].string == "winograd*");
    std::vector<std::string> seen;
    for (const plexus::JsonValue& n : kc.at("nodes").items) {
      seen.push_back(n.at("node").string + " " + n.at("op").string);
      INFO(seen.back());
      CHECK(n.at("how").string == "tuned");
      CHECK(n.at("ms").members.size() == 2);  // im2col and direct
      for (const auto& [impl, ms] : n.at("ms").members) CHECK(impl.find("winograd") == std::string::npos);
    }
    CHECK(seen == std::vector<std::string>{"conv2d_1 conv2d", "conv2d_1.grad conv2d_backward_weight"});
    for (const plexus::JsonValue& k : m.at("kernels").items)
      CHECK(k.string.find("winograd") == std::string::npos);
  }
  const Run info = run_plexus("info --config " + cfg);
  CHECK_THAT(info.output, PLX_CONTAINS("Kernel candidates on cpu (backend.kernels = auto):"));
  CHECK_THAT(info.output, PLX_CONTAINS("im2col_blas [library], direct [native], winograd_f2x3 [native]"));
  CHECK_THAT(info.output, PLX_CONTAINS("in " + cache + ":"));
  CHECK_THAT(info.output, PLX_CONTAINS("cpu conv2d_backward_weight f32[16x16x26x26],f32[16x1x28x28]->f32[16x1x3x3]"));
}
