#pragma once

#include <string>

#define PLEXUS_VERSION_STRING "0.1.0"

namespace plexus {
// The git revision the core was built from: the short commit hash ("3219302"), with "-dirty"
// when tracked files had changes, or "unknown" outside a git checkout (a release tarball).
std::string git_revision();
}  // namespace plexus
