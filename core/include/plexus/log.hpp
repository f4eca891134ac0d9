// Logging (spdlog). The level comes from the config's logging.level, overridden by the
// environment variable PLEXUS_LOG_LEVEL. Plugins log through the host callback, which lands here
// with the plugin's name as the source.
#pragma once

#include <string>
#include <string_view>

#include "plexus/abi/types.h"

namespace plexus::logging {

// Sets up the "plexus" logger on stderr. `level` is trace|debug|info|warn|error|off; "" keeps the
// current level. PLEXUS_LOG_LEVEL, when set, wins. Throws ConfigError for an unknown level.
void init(std::string_view level = "", const std::string& file = "");
void set_level(std::string_view level);
plx_log_level level();
plx_log_level parse_level(std::string_view level);  // throws ConfigError
const char* level_name(plx_log_level level);

// The callback handed to plugins.
void plugin_log(void* user, int32_t level, const char* source, const char* message);

}  // namespace plexus::logging
