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
#include <vector>

#include "plexus/comm_bench.hpp"
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (train->parsed() && !train_config.empty()) {
    if (!common.config_file.empty() && common.config_file != train_config) {
      std::fprintf(stderr, "plexus train: two configs given (%s and -c %s)\n", train_config.c_str(),
                   common.config_file.c_str());
      return 2;
    }
    common.config_file = train_config;
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
