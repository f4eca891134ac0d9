// Small helpers for the core's TOML readers (config, models, compare suites): where a node is
// written, and what kind of value it holds, for error messages.
#pragma once

#include <toml++/toml.h>

#include <sstream>
#include <string>

namespace plexus::toml_util {

// "file:line:column" of a node (the fallback name when the region has no path).
inline std::string where(const toml::source_region& r, const std::string& fallback) {
  std::ostringstream os;
  os << (r.path ? *r.path : fallback);
  if (r.begin.line) os << ':' << r.begin.line << ':' << r.begin.column;
  return os.str();
}

// "a table", "an integer", ...
inline const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date or time";
  }
}

}  // namespace plexus::toml_util
