// Plugin discovery and loading (Boost.DLL).
//
// Search order: the paths the config names (files or directories), then PLEXUS_PLUGIN_PATH
// (colon-separated), then the install's plugin directory (<prefix>/lib/plexus/plugins, found
// relative to the running executable). In a directory, files named libplexus-*.so are plugins.
// A file that is not a shared library, lacks the entry point, speaks another ABI, or fails its
// own init() is skipped with a warning naming the file and the reason; the others load. The
// first plugin of a name wins; later ones with that name are skipped as duplicates.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "plexus/abi/plugin.h"

namespace plexus {

struct SkippedPlugin {
  std::string path;
  std::string reason;
};

// Where to look, and what to pass to plugins' init().
struct PluginSearch {
  std::vector<std::string> paths;  // from the config, searched first
  bool use_env = true;             // PLEXUS_PLUGIN_PATH
  bool use_default_dir = true;     // <prefix>/lib/plexus/plugins
  // Plugin name -> options ("key" -> TOML value as text).
  std::map<std::string, std::map<std::string, std::string>> options;
  std::vector<std::string> disabled;  // plugin names not to load
};

// A plugin whose init() succeeded. Shuts it down on destruction; its code stays mapped
// (RTLD_NODELETE) since thread pools inside plugin libraries outlive shutdown.
class LoadedPlugin {
 public:
  ~LoadedPlugin();
  LoadedPlugin(const LoadedPlugin&) = delete;
  LoadedPlugin& operator=(const LoadedPlugin&) = delete;

  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const std::string& description() const { return description_; }
  uint16_t abi_major() const { return desc_->abi_major; }
  uint16_t abi_minor() const { return desc_->abi_minor; }
  const plx_plugin& descriptor() const { return *desc_; }
  void* ctx() const { return ctx_; }
  // The plugin's last_error() on this thread.
  std::string last_error() const;
  // The kernels it gives other plugins' backends (ABI 1.2 kernel extensions), validated at load;
  // none when its descriptor predates them (struct_size short of the slots) or leaves them NULL.
  std::vector<const plx_kernel_ext*> extension_kernels() const;

 private:
  friend class PluginLoader;
  LoadedPlugin() = default;
  struct Library;  // hides Boost.DLL from users of this header
  std::unique_ptr<Library> lib_;
  const plx_plugin* desc_ = nullptr;
  void* ctx_ = nullptr;
  std::string path_, name_, version_, description_;
};

struct PluginLoadResult {
  std::vector<std::unique_ptr<LoadedPlugin>> loaded;
  std::vector<SkippedPlugin> skipped;
  std::vector<std::string> searched;  // directories and files looked at, in order
};

class PluginLoader {
 public:
  // The ordered list of paths `search` resolves to.
  static std::vector<std::filesystem::path> search_paths(const PluginSearch& search);
  // The install's default plugin directory, relative to the executable.
  static std::filesystem::path default_dir();
  static PluginLoadResult load(const PluginSearch& search);
  // Loads one file; returns null and fills `reason` if it is skipped.
  static std::unique_ptr<LoadedPlugin> load_file(const std::filesystem::path& file,
                                                 const PluginSearch& search,
                                                 std::string& reason);
};

}  // namespace plexus
