// Running the build tree's plexus command line as a user would, for the tests of its commands.
#pragma once

#include <string>

namespace plexus::test {

struct Run {
  int status;          // exit code (-1 if it did not exit normally)
  std::string output;  // stdout and stderr together
};

// Runs build/bin/plexus with `args` in a clean environment (no PLEXUS_PLUGIN_PATH,
// PLEXUS_LOG_LEVEL or PLEXUS_EXCLUDE_KERNELS) plus `env` ("NAME=value ...").
Run run_plexus(const std::string& args, const std::string& env = "");

}  // namespace plexus::test
