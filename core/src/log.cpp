#include "plexus/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>

#include "plexus/error.hpp"

namespace plexus::logging {

namespace {
spdlog::level::level_enum to_spdlog(plx_log_level l) {
  switch (l) {
    case PLX_LOG_TRACE: return spdlog::level::trace;
    case PLX_LOG_DEBUG: return spdlog::level::debug;
    case PLX_LOG_INFO: return spdlog::level::info;
    case PLX_LOG_WARN: return spdlog::level::warn;
    case PLX_LOG_ERROR: return spdlog::level::err;
    default: return spdlog::level::off;
  }
}
std::once_flag g_setup;

void setup_default() {
  std::call_once(g_setup, [] {
    auto logger = spdlog::stderr_color_mt("plexus");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
    spdlog::set_level(spdlog::level::info);
    if (const char* env = std::getenv("PLEXUS_LOG_LEVEL"); env && *env) {
      try {
        spdlog::set_level(to_spdlog(parse_level(env)));
      } catch (const ConfigError& e) {
        spdlog::warn("{}", e.what());
      }
    }
  });
}
}  // namespace

plx_log_level parse_level(std::string_view s) {
  if (s == "trace") return PLX_LOG_TRACE;
  if (s == "debug") return PLX_LOG_DEBUG;
  if (s == "info") return PLX_LOG_INFO;
  if (s == "warn" || s == "warning") return PLX_LOG_WARN;
  if (s == "error") return PLX_LOG_ERROR;
  if (s == "off") return PLX_LOG_OFF;
  throw ConfigError("unknown log level '" + std::string(s) +
                    "' (expected trace, debug, info, warn, error or off; from logging.level or "
                    "PLEXUS_LOG_LEVEL)");
}

const char* level_name(plx_log_level l) {
  switch (l) {
    case PLX_LOG_TRACE: return "trace";
    case PLX_LOG_DEBUG: return "debug";
    case PLX_LOG_INFO: return "info";
    case PLX_LOG_WARN: return "warn";
    case PLX_LOG_ERROR: return "error";
    default: return "off";
  }
}

void init(std::string_view level, const std::string& file) {
  setup_default();
  if (!file.empty()) {
    auto logger = spdlog::default_logger();
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false);
    sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    logger->sinks().push_back(sink);
  }
  const char* env = std::getenv("PLEXUS_LOG_LEVEL");
  if (env && *env) {
    spdlog::set_level(to_spdlog(parse_level(env)));
  } else if (!level.empty()) {
    spdlog::set_level(to_spdlog(parse_level(level)));
  }
}

void set_level(std::string_view level) {
  setup_default();
  spdlog::set_level(to_spdlog(parse_level(level)));
}

plx_log_level level() {
  setup_default();
  switch (spdlog::get_level()) {
    case spdlog::level::trace: return PLX_LOG_TRACE;
    case spdlog::level::debug: return PLX_LOG_DEBUG;
    case spdlog::level::info: return PLX_LOG_INFO;
    case spdlog::level::warn: return PLX_LOG_WARN;
    case spdlog::level::err: return PLX_LOG_ERROR;
    default: return PLX_LOG_OFF;
  }
}

void plugin_log(void* user, int32_t level, const char* source, const char* message) {
  setup_default();
  const char* plugin = static_cast<const char*>(user);
  const plx_log_level l =
      level < PLX_LOG_TRACE ? PLX_LOG_TRACE : (level > PLX_LOG_OFF ? PLX_LOG_OFF
                                                                   : static_cast<plx_log_level>(level));
  spdlog::log(to_spdlog(l), "[{}:{}] {}", plugin ? plugin : "plugin", source ? source : "",
              message ? message : "");
}

}  // namespace plexus::logging
