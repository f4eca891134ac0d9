#include "support/cli.hpp"

#include <sys/wait.h>

#include <cstdio>

#include "support/catch.hpp"

namespace plexus::test {

Run run_plexus(const std::string& args, const std::string& env) {
  const std::string cmd = "env -u PLEXUS_PLUGIN_PATH -u PLEXUS_LOG_LEVEL -u PLEXUS_EXCLUDE_KERNELS " + env + " " +
                          std::string(PLEXUS_BINARY_DIR) + "/bin/plexus " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace plexus::test
