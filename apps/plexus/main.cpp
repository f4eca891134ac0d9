// plexus: the command line. It parses arguments and calls the core; nothing else lives here.
//
// Exit codes: 0 success, 1 a run-time failure, 2 a usage or configuration error, 3 a training
// stopped by a non-finite loss.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "plexus/config.hpp"
#include "plexus/error.hpp"
#include "plexus/info.hpp"
#include "plexus/log.hpp"
#include "plexus/runtime.hpp"
#include "plexus/trainer.hpp"
#include "plexus/version.hpp"

namespace {

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

  try {
    plexus::Config cfg = load_config(common);
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
