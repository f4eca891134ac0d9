#include "plexus/plugin.hpp"

#define BOOST_DLL_USE_STD_FS
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <set>
#include <system_error>

#include "plexus/log.hpp"
#include "text.hpp"

namespace fs = std::filesystem;

namespace plexus {

struct LoadedPlugin::Library {
  boost::dll::shared_library lib;
};

LoadedPlugin::~LoadedPlugin() {
  if (desc_ && desc_->shutdown) desc_->shutdown(ctx_);
  // lib_ is released after the plugin has shut down (the mapping stays: RTLD_NODELETE).
}

std::string LoadedPlugin::last_error() const {
  if (!desc_ || !desc_->last_error) return "";
  const char* e = desc_->last_error();
  return e ? e : "";
}

namespace {

bool is_plugin_file_name(const std::string& name) {
  return name.rfind("libplexus-", 0) == 0 && name.size() > 13 &&
         name.compare(name.size() - 3, 3, ".so") == 0;
}

bool valid_plugin_name(const char* name) {
  if (!name || !*name) return false;
  for (const char* c = name; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return false;
  return true;
}

// The required slots of a backend table, by name, for a precise complaint.
std::string missing_backend_slot(const plx_backend& b) {
#define PLX_CHECK_SLOT(slot) \
  if (!b.slot) return #slot;
  PLX_CHECK_SLOT(device_count)
  PLX_CHECK_SLOT(device_props)
  PLX_CHECK_SLOT(mem_alloc)
  PLX_CHECK_SLOT(mem_free)
  PLX_CHECK_SLOT(mem_copy)
  PLX_CHECK_SLOT(mem_set)
  PLX_CHECK_SLOT(mem_info)
  PLX_CHECK_SLOT(stream_create)
  PLX_CHECK_SLOT(stream_destroy)
  PLX_CHECK_SLOT(stream_sync)
  PLX_CHECK_SLOT(stream_wait_event)
  PLX_CHECK_SLOT(event_create)
  PLX_CHECK_SLOT(event_destroy)
  PLX_CHECK_SLOT(event_record)
  PLX_CHECK_SLOT(event_sync)
  PLX_CHECK_SLOT(event_query)
  PLX_CHECK_SLOT(event_elapsed_ms)
  PLX_CHECK_SLOT(kernel_count)
  PLX_CHECK_SLOT(get_kernel)
#undef PLX_CHECK_SLOT
  if (b.get_capability && !b.create_fused) return "create_fused (required with get_capability)";
  const int capture = !!b.capture_begin + !!b.capture_end + !!b.graph_launch + !!b.graph_destroy;
  if (capture != 0 && capture != 4) return "capture_* (all four or none)";
  return "";
}

std::string missing_comm_slot(const plx_comm& c) {
#define PLX_CHECK_SLOT(slot) \
  if (!c.slot) return #slot;
  PLX_CHECK_SLOT(get_unique_id)
  PLX_CHECK_SLOT(init_rank)
  PLX_CHECK_SLOT(destroy)
  PLX_CHECK_SLOT(abort)
  PLX_CHECK_SLOT(rank)
  PLX_CHECK_SLOT(size)
  PLX_CHECK_SLOT(all_reduce)
  PLX_CHECK_SLOT(broadcast)
  PLX_CHECK_SLOT(all_gather)
  PLX_CHECK_SLOT(reduce_scatter)
  PLX_CHECK_SLOT(send)
  PLX_CHECK_SLOT(recv)
  PLX_CHECK_SLOT(barrier)
#undef PLX_CHECK_SLOT
  return "";
}

// Whether the descriptor reaches the kernel-extension slots of ABI 1.2. A descriptor of 1.0 or
// 1.1 ends before them: reading them would read past the plugin's struct.
bool has_extension_slots(const plx_plugin& d) {
  return d.struct_size >=
         offsetof(plx_plugin, get_extension_kernel) + sizeof(d.get_extension_kernel);
}

// Checks what the plugin provides; returns the first problem, or "".
std::string validate_provided(const plx_plugin& d, void* ctx) {
  const int32_t nb = d.backend_count ? d.backend_count(ctx) : 0;
  for (int32_t i = 0; i < nb; ++i) {
    const plx_backend* b = d.get_backend(ctx, i);
    if (!b) return "backend " + std::to_string(i) + " is NULL";
    if (b->struct_size < sizeof(plx_backend))
      return "backend " + std::to_string(i) + " table is " + std::to_string(b->struct_size) +
             " bytes, ABI 1.0 needs " + std::to_string(sizeof(plx_backend));
    if (!b->name || !*b->name) return "backend " + std::to_string(i) + " has no name";
    const std::string slot = missing_backend_slot(*b);
    if (!slot.empty()) return "backend '" + std::string(b->name) + "' lacks required slot " + slot;
  }
  const int32_t nc = d.comm_count ? d.comm_count(ctx) : 0;
  for (int32_t i = 0; i < nc; ++i) {
    const plx_comm* c = d.get_comm(ctx, i);
    if (!c) return "communicator " + std::to_string(i) + " is NULL";
    // A table of ABI 1.0 ends before bench_native (1.1) and stays valid: CommGroup reads the
    // slots past it only when struct_size reaches them.
    if (c->struct_size < PLX_COMM_SIZE_1_0)
      return "communicator " + std::to_string(i) + " table is " + std::to_string(c->struct_size) +
             " bytes, ABI 1.0 needs " + std::to_string(PLX_COMM_SIZE_1_0);
    if (!c->name || !*c->name) return "communicator " + std::to_string(i) + " has no name";
    const std::string slot = missing_comm_slot(*c);
    if (!slot.empty())
      return "communicator '" + std::string(c->name) + "' lacks required slot " + slot;
  }
  const int32_t ns = d.op_schema_count ? d.op_schema_count(ctx) : 0;
  for (int32_t i = 0; i < ns; ++i) {
    const plx_op_schema* s = d.get_op_schema(ctx, i);
    if (!s || s->struct_size < sizeof(plx_op_schema))
      return "op schema " + std::to_string(i) + " is NULL or too small";
  }
  // Kernel extensions (ABI 1.2): each entry must name a backend and give a kernel. Whether that
  // backend is loaded, and whether the kernel's op exists, is known only once every plugin has
  // loaded; the runtime reports those then, without refusing the plugin.
  const int32_t ne =
      has_extension_slots(d) && d.extension_kernel_count ? d.extension_kernel_count(ctx) : 0;
  for (int32_t i = 0; i < ne; ++i) {
    const plx_kernel_ext* e = d.get_extension_kernel(ctx, i);
    const std::string which = "kernel extension " + std::to_string(i);
    if (!e) return which + " is NULL";
    if (e->struct_size < sizeof(plx_kernel_ext))
      return which + " is " + std::to_string(e->struct_size) + " bytes, ABI 1.2 needs " +
             std::to_string(sizeof(plx_kernel_ext));
    if (!e->backend || !*e->backend) return which + " names no backend";
    if (!e->kernel) return which + " (for backend '" + e->backend + "') has no kernel";
  }
  return "";
}

}  // namespace

std::vector<const plx_kernel_ext*> LoadedPlugin::extension_kernels() const {
  std::vector<const plx_kernel_ext*> out;
  if (!desc_ || !has_extension_slots(*desc_) || !desc_->extension_kernel_count) return out;
  const int32_t n = desc_->extension_kernel_count(ctx_);
  for (int32_t i = 0; i < n; ++i) out.push_back(desc_->get_extension_kernel(ctx_, i));
  return out;
}

fs::path PluginLoader::default_dir() {
  std::error_code ec;
  boost::dll::fs::error_code bec;
  const fs::path exe = boost::dll::program_location(bec);
  if (bec) return {};
  fs::path dir = exe.parent_path() / ".." / "lib" / "plexus" / "plugins";
  fs::path canon = fs::weakly_canonical(dir, ec);
  return ec ? dir : canon;
}

std::vector<fs::path> PluginLoader::search_paths(const PluginSearch& search) {
  std::vector<fs::path> out;
  for (const auto& p : search.paths) out.emplace_back(p);
  if (search.use_env) {
    if (const char* env = std::getenv("PLEXUS_PLUGIN_PATH")) {
      for (const std::string& part : text::split(env, ':')) out.emplace_back(part);
    }
  }
  if (search.use_default_dir) {
    const fs::path d = default_dir();
    if (!d.empty()) out.push_back(d);
  }
  return out;
}

std::unique_ptr<LoadedPlugin> PluginLoader::load_file(const fs::path& file,
                                                      const PluginSearch& search,
                                                      std::string& reason) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    reason = "not a regular file";
    return nullptr;
  }
  // A disabled plugin named the way plexus_add_plugin() names its file (libplexus-<name>.so) is
  // not even loaded: loading maps its libraries (the CUDA plugin's cuBLAS and cuDNN: 150 MB and
  // 0.15 s in a CPU-only process), and RTLD_NODELETE keeps them mapped. Any other file is
  // checked by the name its descriptor gives, below.
  if (const std::string stem = file.filename().string();
      stem.rfind("libplexus-", 0) == 0 && stem.size() > 13 && stem.ends_with(".so")) {
    const std::string name = stem.substr(10, stem.size() - 13);
    if (std::find(search.disabled.begin(), search.disabled.end(), name) != search.disabled.end()) {
      reason = "plugin '" + name + "' is disabled by plugins.disable (not loaded)";
      return nullptr;
    }
  }
  auto plugin = std::unique_ptr<LoadedPlugin>(new LoadedPlugin());
  plugin->path_ = file.string();
  plugin->lib_ = std::make_unique<LoadedPlugin::Library>();
  try {
    // RTLD_NODELETE: the code stays mapped after shutdown(), because libraries with threads of
    // their own (OpenMP's pool, the CUDA driver's) crash when unmapped under them.
    const auto mode = static_cast<boost::dll::load_mode::type>(
        boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local | RTLD_NODELETE);
    plugin->lib_->lib.load(file, mode);
  } catch (const std::exception& e) {
    reason = std::string("not a loadable shared library: ") + e.what();
    return nullptr;
  }
  if (!plugin->lib_->lib.has(PLX_PLUGIN_ENTRY_NAME)) {
    reason = std::string("no entry point '") + PLX_PLUGIN_ENTRY_NAME +
             "' (not a Plexus plugin, or built without PLEXUS_PLUGIN)";
    return nullptr;
  }
  plx_plugin_entry_fn entry = nullptr;
  try {
    entry = &plugin->lib_->lib.get<const plx_plugin*()>(PLX_PLUGIN_ENTRY_NAME);
  } catch (const std::exception& e) {
    reason = std::string("cannot resolve the entry point: ") + e.what();
    return nullptr;
  }
  const plx_plugin* d = entry();
  if (!d) {
    reason = "the entry point returned NULL";
    return nullptr;
  }
  // Size and version before anything else.
  if (d->struct_size < offsetof(plx_plugin, abi_minor) + sizeof(d->abi_minor)) {
    reason = "descriptor too small (" + std::to_string(d->struct_size) + " bytes)";
    return nullptr;
  }
  if (d->abi_major != PLX_ABI_MAJOR) {
    reason = "built for plugin ABI " + std::to_string(d->abi_major) + "." +
             std::to_string(d->abi_minor) + "; this host accepts ABI " +
             std::to_string(PLX_ABI_MAJOR) + ".0 to " + std::to_string(PLX_ABI_MAJOR) + "." +
             std::to_string(PLX_ABI_MINOR) + " (rebuild it against this SDK)";
    return nullptr;
  }
  // Any minor of this major loads: a descriptor of 1.0 or 1.1 ends before the slots 1.2
  // appended, and the host reads those only when struct_size reaches them.
  if (d->struct_size < PLX_PLUGIN_SIZE_1_0) {
    reason = "descriptor is " + std::to_string(d->struct_size) + " bytes, ABI " +
             std::to_string(PLX_ABI_MAJOR) + ".0 needs " + std::to_string(PLX_PLUGIN_SIZE_1_0);
    return nullptr;
  }
  if (!valid_plugin_name(d->name)) {
    reason = "invalid plugin name (expected [a-z0-9_]+)";
    return nullptr;
  }
  if (!d->init || !d->shutdown || !d->last_error || !d->backend_count || !d->get_backend ||
      !d->comm_count || !d->get_comm || !d->op_schema_count || !d->get_op_schema) {
    reason = "descriptor has NULL required slots";
    return nullptr;
  }
  if (has_extension_slots(*d) && !d->extension_kernel_count != !d->get_extension_kernel) {
    reason =
        "descriptor sets only one of extension_kernel_count and get_extension_kernel "
        "(both or neither)";
    return nullptr;
  }
  if (std::find(search.disabled.begin(), search.disabled.end(), d->name) != search.disabled.end()) {
    reason = std::string("plugin '") + d->name + "' is disabled by plugins.disable";
    return nullptr;
  }
  plugin->name_ = d->name;
  plugin->version_ = d->version ? d->version : "";
  plugin->description_ = d->description ? d->description : "";

  // Options from [plugins.options.<name>], alive during init().
  std::vector<plx_option> opts;
  if (auto it = search.options.find(plugin->name_); it != search.options.end())
    for (const auto& [k, v] : it->second) opts.push_back(plx_option{k.c_str(), v.c_str()});
  plx_host host{};
  host.struct_size = sizeof host;
  host.abi_major = PLX_ABI_MAJOR;
  host.abi_minor = PLX_ABI_MINOR;
  host.log = &logging::plugin_log;
  host.log_user = const_cast<char*>(d->name);  // static storage in the plugin
  host.log_level = logging::level();
  host.num_options = static_cast<int32_t>(opts.size());
  host.options = opts.data();
  void* ctx = nullptr;
  const plx_status st = d->init(&host, &ctx);
  if (st != PLX_OK) {
    const char* msg = d->last_error();
    reason = std::string("init failed (") + plx_status_string(st) + ")" +
             (msg && *msg ? std::string(": ") + msg : std::string());
    return nullptr;
  }
  plugin->desc_ = d;
  plugin->ctx_ = ctx;
  const std::string problem = validate_provided(*d, ctx);
  if (!problem.empty()) {
    reason = problem;
    return nullptr;  // ~LoadedPlugin shuts it down
  }
  return plugin;
}

PluginLoadResult PluginLoader::load(const PluginSearch& search) {
  PluginLoadResult result;
  std::set<fs::path> seen_files;
  auto try_file = [&](const fs::path& file) {
    std::error_code ec;
    fs::path canon = fs::weakly_canonical(file, ec);
    if (ec) canon = file;
    if (!seen_files.insert(canon).second) return;
    std::string reason;
    auto p = load_file(file, search, reason);
    if (p) {
      for (const auto& other : result.loaded) {
        if (other->name() == p->name()) {
          reason = "duplicate of plugin '" + p->name() + "' already loaded from " + other->path();
          p.reset();
          break;
        }
      }
    }
    if (p) {
      spdlog::debug("loaded plugin '{}' {} from {}", p->name(), p->version(), p->path());
      result.loaded.push_back(std::move(p));
    } else {
      spdlog::warn("skipped plugin {}: {}", file.string(), reason);
      result.skipped.push_back({file.string(), reason});
    }
  };
  for (const fs::path& path : search_paths(search)) {
    result.searched.push_back(path.string());
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(path, ec))
        if (is_plugin_file_name(e.path().filename().string())) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) try_file(f);
    } else if (fs::exists(path, ec)) {
      try_file(path);
    } else if (std::find(search.paths.begin(), search.paths.end(), path.string()) !=
               search.paths.end()) {
      // A path the user named explicitly must exist; the environment and default may not.
      spdlog::warn("plugin path {} (from plugins.paths) does not exist", path.string());
      result.skipped.push_back({path.string(), "path does not exist (from plugins.paths)"});
    }
  }
  return result;
}

}  // namespace plexus
