// Configuration: one TOML file (toml++) selects everything. Every key is declared once in a
// table (core/src/config.cpp) with its type, default, allowed range and documentation; the
// README's config reference lists the same keys (a test checks they agree).
//
// Errors name the source and position: "run.toml:4:10: backend.device: expected an integer,
// got a string". Unknown keys, wrong types and out-of-range values are errors, never ignored.
// `--set a.b=v` overrides a key after the file is read; v is a TOML value (4, 0.5, true,
// "text", [1, 2]); a bare word that is not a TOML value is taken as a string.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/error.hpp"

namespace plexus {

enum class ConfigType {
  Bool,
  Int,
  Float,
  String,
  StringList,
  Bytes,    // an integer of bytes, or a string with a unit: "512MiB", "2GB", "0"
  Options   // a table of tables of scalars: [plugins.options.<plugin>] key = value
};
const char* config_type_name(ConfigType t);  // "a boolean", "an integer", ...

struct ConfigKey {
  std::string path;                  // "backend.device"
  ConfigType type;
  std::string default_value;         // as TOML text: "0", "\"auto\"", "[]", "true"
  std::string doc;                   // one line for the README and `plexus info --config`
  int64_t min = INT64_MIN, max = INT64_MAX;  // Int, Bytes
  double fmin = -1e308, fmax = 1e308;        // Float
  std::vector<std::string> choices;  // String: allowed values; empty = any
};

class Config {
 public:
  // Every key at its default.
  Config();
  ~Config();
  Config(const Config&);
  Config& operator=(const Config&);
  Config(Config&&) noexcept;
  Config& operator=(Config&&) noexcept;

  // Reads and validates a file. ConfigError on a missing file, a TOML syntax error, an unknown
  // key, a wrong type or a bad value, each with "file:line:column".
  static Config load(const std::string& path);
  // Same for text; `source` names it in errors.
  static Config parse(std::string_view text, const std::string& source);

  // Applies "a.b=v" (from --set). ConfigError names the assignment on failure.
  void set(std::string_view assignment);

  bool get_bool(std::string_view path) const;
  int64_t get_int(std::string_view path) const;
  double get_float(std::string_view path) const;
  std::string get_string(std::string_view path) const;
  std::vector<std::string> get_strings(std::string_view path) const;
  // A Bytes key: its size in bytes, or 0 when it holds a fraction (get_fraction).
  uint64_t get_bytes(std::string_view path) const;
  // A Bytes key given as a fraction of the device (0.8, "80%"): that fraction; 0 for a size.
  double get_fraction(std::string_view path) const;
  // [plugins.options.<plugin>] tables: plugin -> key -> value as TOML text (strings unquoted).
  std::map<std::string, std::map<std::string, std::string>> plugin_options() const;

  // Where the value of a key came from: "default", "run.toml:3:1" or "--set backend.name=cpu".
  std::string origin(std::string_view path) const;
  // The whole configuration as TOML, every key resolved (for run manifests and `--config`).
  std::string dump() const;
  // The file it was loaded from, or "" for defaults.
  const std::string& source() const;

  static const std::vector<ConfigKey>& keys();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace plexus
