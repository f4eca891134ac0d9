// plexus: the command line. It parses arguments and calls the core; nothing else lives here.
//
// Exit codes: 0 success, 1 a run-time failure, 2 a usage or configuration error, 3 a training
// stopped by a non-finite loss.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "plexus/comm_bench.hpp"
#include "plexus/kernel_bench.hpp"
#include "plexus/step_profile.hpp"
#include "plexus/compare.hpp"
#include "plexus/communicator.hpp"
#include "plexus/parallel.hpp"
#include "plexus/config.hpp"
#include "plexus/error.hpp"
#include "plexus/info.hpp"
#include "plexus/log.hpp"
#include "plexus/runtime.hpp"
#include "plexus/trainer.hpp"
#include "plexus/version.hpp"

namespace {

// This process's rank in its launch, for deciding who prints an error (0 when the launcher's
// environment does not parse: the error then says so).
int32_t launch_rank_or_0() {
  try {
    return plexus::launch_info().rank;
  } catch (const std::exception&) {
    return 0;
  }
}

struct Common {
  std::string config_file;
  std::vector<std::string> sets;
  std::string log_level;
};

// The config: defaults, then the file, then each --set in order; then logging from it.
plexus::Config load_config(const Common& c) {
  plexus::Config cfg = c.config_file.empty() ? plexus::Config() : plexus::Config::load(c.config_file);
  for (const auto& s : c.sets) cfg.set(s);
  plexus::logging::init(c.log_level.empty() ? cfg.get_string("logging.level") : c.log_level,
                        cfg.get_string("logging.file"));
  return cfg;
}

// `plexus bench comm` as typed; sizes and lists are parsed by the core, which names the option
// in its errors.
struct BenchCommArgs {
  std::string comm, backend = "cpu", bootstrap = "mpi", min_bytes = "8", max_bytes = "256M";
  std::string ops = "all", dtype = "f32", json;
  int64_t factor = 2;
  int32_t iters = 0, warmup = 5, rounds = 5, timeout_ms = 0;
  double target_ms = 20;
};

plexus::CommBenchOptions bench_comm_options(const BenchCommArgs& a) {
  plexus::CommBenchOptions o;
  o.comm = a.comm;
  o.backend = a.backend;
  o.bootstrap = a.bootstrap;
  o.min_bytes = plexus::parse_bytes("--min-bytes", a.min_bytes);
  o.max_bytes = plexus::parse_bytes("--max-bytes", a.max_bytes);
  if (a.factor < 2)
    throw plexus::ConfigError("--factor: must be at least 2, got " + std::to_string(a.factor));
  o.factor = static_cast<uint64_t>(a.factor);
  o.iters = a.iters;
  o.warmup = a.warmup;
  o.rounds = a.rounds;
  if (!(a.target_ms > 0))
    throw plexus::ConfigError("--target-ms: must be > 0, got " + std::to_string(a.target_ms));
  o.target_seconds = a.target_ms / 1e3;
  o.timeout_ms = a.timeout_ms;
  o.collectives = plexus::parse_collectives("--ops", a.ops);
  o.dtype = plexus::parse_dtype("--dtype", a.dtype);
  (void)plexus::comm_bench_comm_name(o);
  plexus::check_comm_bench_options(o);
  return o;
}

// `plexus bench kernels` as typed.
struct BenchKernelsArgs {
  std::string config, backend, gemm, dtype, json;
  int32_t device = -1;
  bool no_step = false, all = false;
  double budget_ms = 50;
};

plexus::KernelBenchOptions bench_kernels_options(const BenchKernelsArgs& a) {
  plexus::KernelBenchOptions o;
  o.backend = a.backend;
  o.device = a.device;
  o.step = !a.no_step;
  o.all = a.all;
  o.gemm = plexus::parse_gemm_shapes(a.gemm);
  if (!a.dtype.empty()) o.gemm_dtype = plexus::parse_dtype("--dtype", a.dtype);
  if (!(a.budget_ms > 0)) throw plexus::ConfigError("--budget-ms: expected a time > 0");
  o.budget_ms = a.budget_ms;
  if (!o.step && o.gemm.empty())
    throw plexus::ConfigError("--no-step: nothing left to time; give --gemm shapes");
  return o;
}

struct BenchStepArgs {
  std::string config, backend, json;
  int32_t device = -1;
  plexus::StepProfileOptions o;
};

// `plexus compare` as typed; lists are checked here, the rest by the core.
struct CompareArgs {
  std::string config, a = "cpu", b, only = "ops,step,train", suite, ops, dtypes, json, csv, plot;
  std::vector<std::string> nmse;
  int repeats = 10, warmup = 2;
  int64_t steps = 50;
  uint64_t seed = 1;
  double curve_rtol = 0.05;
  int32_t device_a = 0, device_b = 0;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  return out;
}

plexus::CompareOptions compare_options(const CompareArgs& a) {
  plexus::CompareOptions o;
  o.a = a.a;
  o.b = a.b;
  o.ops = o.step = o.train = false;
  for (const std::string& s : split_list(a.only)) {
    if (s == "ops") o.ops = true;
    else if (s == "step") o.step = true;
    else if (s == "train") o.train = true;
    else throw plexus::ConfigError("--only: unknown section '" + s + "' (expected ops, step, train)");
  }
  if (!o.ops && !o.step && !o.train) throw plexus::ConfigError("--only: name at least one of ops, step, train");
  o.suite_file = a.suite;
  o.only_ops = split_list(a.ops);
  for (const std::string& d : split_list(a.dtypes)) o.dtypes.push_back(plexus::parse_dtype("--dtypes", d));
  for (const std::string& t : a.nmse) {
    const size_t eq = t.find('=');
    if (eq == std::string::npos)
      throw plexus::ConfigError("--nmse: expected DTYPE=VALUE such as f32=1e-7, got '" + t + "'");
    const plx_dtype d = plexus::parse_dtype("--nmse", t.substr(0, eq));
    char* end = nullptr;
    const std::string v = t.substr(eq + 1);
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(x >= 0))
      throw plexus::ConfigError("--nmse: expected a tolerance >= 0 after '=', got '" + v + "'");
    o.nmse[d] = x;
  }
  o.repeats = a.repeats;
  o.warmup = a.warmup;
  o.steps = a.steps;
  o.seed = a.seed;
  o.curve_rtol = a.curve_rtol;
  o.device_a = a.device_a;
  o.device_b = a.device_b;
  return o;
}

// Writes `text` to `path`; false (with the reason printed) if it cannot.
bool write_file(const char* option, const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (f) return true;
  std::fprintf(stderr, "plexus compare: %s: cannot write '%s': %s\n", option, path.c_str(), std::strerror(errno));
  return false;
}

void add_common(CLI::App& app, Common& c) {
  app.add_option("-c,--config", c.config_file, "TOML configuration file")->check(CLI::ExistingFile);
  app.add_option("--set", c.sets, "Override a config key: --set backend.name=cpu (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--log-level", c.log_level, "trace|debug|info|warn|error|off (overrides the config)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plexus: train deep-learning models on interchangeable backends"};
  app.set_version_flag("--version", std::string("plexus ") + PLEXUS_VERSION_STRING);
  app.require_subcommand(1);
  Common common;
  add_common(app, common);
  app.fallthrough();

  CLI::App* info = app.add_subcommand(
      "info", "Plugins found and skipped, devices, and the ops and dtypes each backend implements");
  bool json = false;
  info->add_flag("--json", json, "Print the report as JSON");
  bool dump_config = false;
  info->add_flag("--config-dump", dump_config, "Print the resolved configuration (TOML) and exit");

  CLI::App* train = app.add_subcommand(
      "train", "Train the model the config names; writes metrics, a manifest and checkpoints");
  std::string train_config;
  train->add_option("CONFIG", train_config, "TOML configuration file (same as -c)")
      ->check(CLI::ExistingFile);
  std::string resume_dir;
  train->add_option("--resume", resume_dir,
                    "Continue the run in this directory from its checkpoint")
      ->check(CLI::ExistingDirectory);

  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  CLI::App* bench_comm = bench->add_subcommand(
      "comm",
      "Per collective and message size: time, algorithm and bus bandwidth (as nccl-tests), and "
      "the overhead against the library called directly. One process per rank: mpirun -np N");
  BenchCommArgs bca;
  bench_comm->add_option("--comm", bca.comm, "Communicator (default: mpi for cpu, nccl for cuda)");
  bench_comm->add_option("--backend", bca.backend, "Backend whose buffers are exchanged")
      ->capture_default_str();
  bench_comm
      ->add_option("--bootstrap", bca.bootstrap,
                   "Communicator that carries the id of one without a launcher (NCCL)")
      ->capture_default_str();
  bench_comm->add_option("--min-bytes", bca.min_bytes, "Smallest size (K, M, G: powers of 1024)")
      ->capture_default_str();
  bench_comm->add_option("--max-bytes", bca.max_bytes, "Largest size")->capture_default_str();
  bench_comm->add_option("--factor", bca.factor, "Each size is the previous times this")
      ->capture_default_str();
  bench_comm->add_option("--iters", bca.iters, "Calls per timed run (0: chosen per size)")
      ->capture_default_str();
  bench_comm->add_option("--warmup", bca.warmup, "Untimed calls before each size")
      ->capture_default_str();
  bench_comm
      ->add_option("--rounds", bca.rounds,
                   "Timed runs of ours and of native per size, interleaved (medians kept)")
      ->capture_default_str();
  bench_comm
      ->add_option("--target-ms", bca.target_ms, "What a timed run should last when --iters is 0")
      ->capture_default_str();
  bench_comm
      ->add_option("--ops", bca.ops,
                   "all, or a comma-separated list of all_reduce, broadcast, all_gather, "
                   "reduce_scatter")
      ->capture_default_str();
  bench_comm->add_option("--dtype", bca.dtype, "f32, f16, bf16, f64, i32, i64 or u8")
      ->capture_default_str();
  bench_comm->add_option("--timeout-ms", bca.timeout_ms, "The group's timeout (0: the plugin's)")
      ->capture_default_str();
  bench_comm->add_option("--json", bca.json, "Also write the rows as JSON to this file (rank 0)");

  CLI::App* bench_kernels = bench->add_subcommand(
      "kernels",
      "Every candidate kernel of each problem of the config's training step (and of --gemm "
      "shapes) timed side by side: our kernels against cuBLAS/cuDNN/OpenBLAS, in ms and GFLOP/s");
  BenchKernelsArgs bka;
  bench_kernels->add_option("CONFIG", bka.config, "Training config (same as -c)")->check(CLI::ExistingFile);
  bench_kernels->add_option("--backend", bka.backend, "Backend (default: the config's backend.name)");
  bench_kernels->add_option("--device", bka.device, "Device (default: the config's backend.device)");
  bench_kernels->add_option("--gemm", bka.gemm,
                            "GEMM shapes as linear layers: N (square) or MxNxK, comma-separated");
  bench_kernels->add_option("--dtype", bka.dtype, "dtype of the GEMMs (default: train.precision's)");
  bench_kernels->add_flag("--no-step", bka.no_step, "Only the --gemm shapes");
  bench_kernels->add_flag("--all", bka.all, "Also the step's problems that have a single kernel");
  bench_kernels->add_option("--budget-ms", bka.budget_ms, "Timing per candidate")->capture_default_str();
  bench_kernels->add_option("--json", bka.json, "Also write the rows as JSON to this file");

  CLI::App* bench_step = bench->add_subcommand(
      "step",
      "Where the config's training step spends its time: each kernel's median time and share "
      "(run op by op with events), by kernel and by op, beside the step run as the trainer runs "
      "it");
  BenchStepArgs bsa;
  bench_step->add_option("CONFIG", bsa.config, "Training config (same as -c)")->check(CLI::ExistingFile);
  bench_step->add_option("--backend", bsa.o.backend, "Backend (default: the config's backend.name)");
  bench_step->add_option("--device", bsa.o.device, "Device (default: the config's backend.device)");
  bench_step->add_option("--warmup", bsa.o.warmup, "Untimed steps first")->capture_default_str();
  bench_step->add_option("--steps", bsa.o.steps, "Timed steps (medians kept)")->capture_default_str();
  bench_step->add_option("--top", bsa.o.top, "Kernels listed, slowest first (0: all)")->capture_default_str();
  bench_step->add_option("--json", bsa.json, "Also write the profile as JSON to this file");

  CLI::App* compare = app.add_subcommand(
      "compare",
      "The same work on two backends side by side: every op of a suite (forward and backward), "
      "a training step, N training steps; errors, pass/fail, times and speed-ups. Exit 1 when "
      "anything fails its tolerance");
  CompareArgs cma;
  compare->add_option("CONFIG", cma.config,
                      "Training config for the step and train sections (same as -c; default: "
                      "the built-in defaults)")
      ->check(CLI::ExistingFile);
  compare->add_option("--a", cma.a, "Reference backend")->capture_default_str();
  compare->add_option("--b", cma.b, "Backend under comparison (default: the best other one present)");
  compare->add_option("--only", cma.only, "Sections: ops, step, train (comma-separated)")
      ->capture_default_str();
  compare->add_option("--suite", cma.suite, "Ops suite TOML file (default: the built-in suite)")
      ->check(CLI::ExistingFile);
  compare->add_option("--ops", cma.ops, "Only the suite's items of these ops (comma-separated)");
  compare->add_option("--dtypes", cma.dtypes, "Only these dtypes in the ops section (f32,bf16,...)");
  compare->add_option("--repeats", cma.repeats, "Timed runs per row (the median is kept)")
      ->capture_default_str();
  compare->add_option("--warmup", cma.warmup, "Untimed runs before them")->capture_default_str();
  compare->add_option("--steps", cma.steps, "Training steps per backend in the train section")
      ->capture_default_str();
  compare->add_option("--seed", cma.seed, "Seed of the ops section's inputs")->capture_default_str();
  compare->add_option("--nmse", cma.nmse, "Tolerance override: --nmse f32=1e-7 (repeatable)")
      ->allow_extra_args(false);
  compare
      ->add_option("--curve-rtol", cma.curve_rtol,
                   "train: how far apart the last tenth's mean losses may be (a fraction)")
      ->capture_default_str();
  compare->add_option("--device-a", cma.device_a, "Device of backend a")->capture_default_str();
  compare->add_option("--device-b", cma.device_b, "Device of backend b")->capture_default_str();
  compare->add_option("--json", cma.json, "Also write the report as JSON to this file");
  compare->add_option("--csv", cma.csv,
                      "Also write the rows as CSV to this file (loss curves: beside it, "
                      "<name>.curves.csv)");
  compare->add_option("--plot", cma.plot, "Also draw the speed-ups and loss curves into this PNG (gnuplot)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  // A subcommand's positional CONFIG is -c's; both at once must name the same file.
  for (const auto& [cmd, name, path] :
       {std::tuple{train, "train", &train_config}, std::tuple{compare, "compare", &cma.config},
        std::tuple{bench_kernels, "bench kernels", &bka.config},
        std::tuple{bench_step, "bench step", &bsa.config}}) {
    if (!cmd->parsed() || path->empty()) continue;
    if (!common.config_file.empty() && common.config_file != *path) {
      std::fprintf(stderr, "plexus %s: two configs given (%s and -c %s)\n", name, path->c_str(),
                   common.config_file.c_str());
      return 2;
    }
    common.config_file = *path;
  }
  plexus::KernelBenchOptions kernel_bench_opts;
  if (bench_kernels->parsed()) {
    try {
      kernel_bench_opts = bench_kernels_options(bka);
    } catch (const plexus::ConfigError& e) {
      std::fprintf(stderr, "plexus bench kernels: %s\n", e.what());
      return 2;
    }
  }
  plexus::CompareOptions compare_opts;
  if (compare->parsed()) {
    try {
      compare_opts = compare_options(cma);
    } catch (const plexus::ConfigError& e) {
      std::fprintf(stderr, "plexus compare: %s\n", e.what());
      return 2;
    }
  }

  plexus::CommBenchOptions bench_options;
  if (bench_comm->parsed()) {
    try {
      bench_options = bench_comm_options(bca);
    } catch (const plexus::ConfigError& e) {
      // Every process of the launch gets the same error: one prints it.
      if (launch_rank_or_0() == 0) std::fprintf(stderr, "plexus bench comm: %s\n", e.what());
      return 2;
    }
  }

  try {
    plexus::Config cfg = load_config(common);
    if (bench_comm->parsed()) {
      plexus::Runtime rt(plexus::runtime_options(cfg));
      const plexus::CommBenchReport r = plexus::run_comm_bench(rt, bench_options, &std::cout);
      std::cout.flush();
      if (r.rank == 0 && !bca.json.empty()) {
        std::ofstream f(bca.json);
        f << plexus::comm_bench_json(r) << "\n";
        f.close();
        if (!f) {
          std::fprintf(stderr, "plexus bench comm: --json: cannot write '%s': %s\n",
                       bca.json.c_str(), std::strerror(errno));
          return 1;
        }
      }
      if (r.wrong > 0) {
        if (r.rank == 0)
          std::fprintf(stderr,
                       "plexus bench comm: %llu wrong element(s) in the results: the "
                       "communicator moved wrong data\n",
                       static_cast<unsigned long long>(r.wrong));
        return 1;
      }
      return 0;
    }
    if (bench_kernels->parsed()) {
      plexus::Runtime rt(plexus::runtime_options(cfg));
      const plexus::KernelBenchReport r = plexus::run_kernel_bench(rt, cfg, kernel_bench_opts, &std::cout);
      std::cout.flush();
      if (!bka.json.empty()) {
        std::ofstream f(bka.json);
        f << plexus::kernel_bench_json(r) << "\n";
        f.close();
        if (!f) {
          std::fprintf(stderr, "plexus bench kernels: --json: cannot write '%s': %s\n",
                       bka.json.c_str(), std::strerror(errno));
          return 1;
        }
      }
      return 0;
    }
    if (bench_step->parsed()) {
      plexus::Runtime rt(plexus::runtime_options(cfg));
      plexus::StepProfile p;
      try {
        p = plexus::profile_step(rt, cfg, bsa.o);
      } catch (const plexus::ConfigError& e) {
        std::fprintf(stderr, "plexus bench step: %s\n", e.what());
        return 2;
      }
      plexus::print_step_profile(std::cout, p, bsa.o.top);
      std::cout.flush();
      if (!bsa.json.empty() && !write_file("--json", bsa.json, plexus::step_profile_json(p) + "\n"))
        return 1;
      return 0;
    }
    if (compare->parsed()) {
      plexus::Runtime rt(plexus::runtime_options(cfg));
      const plexus::CompareReport r = plexus::run_compare(rt, cfg, compare_opts, &std::cout);
      std::cout.flush();
      // Every file is written even when one fails, so nothing measured is lost.
      bool written = true;
      if (!cma.json.empty()) written = write_file("--json", cma.json, plexus::compare_json(r) + "\n") && written;
      if (!cma.csv.empty()) {
        written = write_file("--csv", cma.csv, plexus::compare_csv(r)) && written;
        const std::string curves = plexus::compare_curves_csv(r);
        if (!curves.empty()) {
          std::string stem = cma.csv;
          if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".csv") == 0) stem.resize(stem.size() - 4);
          written = write_file("--csv", stem + ".curves.csv", curves) && written;
        }
      }
      if (!cma.plot.empty()) {
        try {
          plexus::write_compare_plot(r, cma.plot);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "plexus compare: %s\n", e.what());
          written = false;
        }
      }
      return r.ok() && written ? 0 : 1;
    }
    if (info->parsed()) {
      if (dump_config) {
        std::cout << cfg.dump();
        return 0;
      }
      plexus::Runtime rt(plexus::runtime_options(cfg));
      std::cout << (json ? plexus::info_json(rt) : plexus::info_text(rt));
      std::cout.flush();
      return 0;
    }
    if (train->parsed()) {
      plexus::Runtime rt(plexus::runtime_options(cfg));
      plexus::TrainRequest req{cfg};
      req.resume_dir = resume_dir;
      plexus::train(rt, req);
      std::cout.flush();
      return 0;
    }
  } catch (const plexus::ConfigError& e) {
    std::fprintf(stderr, "plexus: configuration error:\n%s\n", e.what());
    return 2;
  } catch (const plexus::KernelFaultError& e) {
    // As for a candidate the tuner finds faulting or stuck (time_kernel): the kernel is named
    // with how to keep it out, and status 3 says so to scripts (tests/gpu/run_lib.sh).
    std::cout.flush();
    std::fprintf(stderr, "plexus: error: %s\n", e.what());
    return 3;
  } catch (const plexus::DivergedError& e) {
    std::cout.flush();
    std::fprintf(stderr, "plexus: training diverged: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plexus: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
