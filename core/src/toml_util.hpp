// Small helpers for the core's TOML readers (config, models, compare suites): where a node is
// written, and what kind of value it holds, for error messages.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "plexus/attrs.hpp"

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

// An op attribute written in TOML (a model's `op` layer, a compare suite's item): integers,
// numbers, booleans (as 0/1), strings, and arrays of integers (Ints) or of numbers (Floats); the
// op's schema converts an integer for a float attribute later. Returns the problem, or "".
inline std::string attr_from_toml(const toml::node& n, AttrValue& out) {
  if (n.is_boolean()) {
    out = int64_t{*n.value<bool>() ? 1 : 0};
  } else if (n.is_integer()) {
    out = *n.value<int64_t>();
  } else if (n.is_floating_point()) {
    out = *n.value<double>();
  } else if (n.is_string()) {
    out = *n.value<std::string>();
  } else if (const toml::array* a = n.as_array()) {
    bool ints = true;
    for (const auto& e : *a) {
      if (!e.is_integer() && !e.is_floating_point())
        return std::string("expected an array of numbers, got an array holding ") + type_name(e);
      ints = ints && e.is_integer();
    }
    if (ints) {
      Ints v;
      for (const auto& e : *a) v.push_back(*e.value<int64_t>());
      out = v;
    } else {
      Floats v;
      for (const auto& e : *a) v.push_back(*e.value<double>());
      out = v;
    }
  } else {
    return std::string("expected an integer, a number, a boolean, a string or an array of numbers, got ") +
           type_name(n);
  }
  return "";
}

}  // namespace plexus::toml_util
