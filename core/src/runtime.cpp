#include "plexus/runtime.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "plexus/config.hpp"
#include "plexus/error.hpp"
#include "plexus/log.hpp"
#include "plexus/sdk/dtype.hpp"
#include "text.hpp"

namespace plexus {

RuntimeOptions runtime_options(const Config& config) {
  RuntimeOptions o;
  o.plugins.paths = config.get_strings("plugins.paths");
  o.plugins.disabled = config.get_strings("plugins.disable");
  o.plugins.options = config.plugin_options();
  o.fallback = config.get_string("backend.fallback");
  o.memory_limit = config.get_bytes("memory.limit");
  o.memory_fraction = config.get_fraction("memory.limit");
  o.kernels = parse_kernel_side(config.get_string("backend.kernels"));
  const std::string cache = config.get_string("backend.tune_cache");
  o.tune_cache = cache == "off" ? "" : cache.empty() ? default_tune_cache_path() : cache;
  o.exclude_kernels = config.get_strings("backend.exclude_kernels");
  o.tune_timeout_s = config.get_float("backend.tune_timeout_s");
  if (!(o.tune_timeout_s > 0))
    throw ConfigError("backend.tune_timeout_s: expected a number of seconds above 0, got " +
                      std::to_string(o.tune_timeout_s));
  o.check_kernels = config.get_bool("backend.check_kernels");
  o.step_timeout_s = config.get_float("backend.step_timeout_s");
  if (o.step_timeout_s < 0)
    throw ConfigError("backend.step_timeout_s: expected a number of seconds, 0 for no limit, got " +
                      std::to_string(o.step_timeout_s));
  for (const std::string& p : o.exclude_kernels)
    if (p.empty())
      throw ConfigError("backend.exclude_kernels: an empty pattern matches no kernel; expected "
                        "kernel names or shell patterns, e.g. \"igemm_wgmma_*\"");
  // PLEXUS_EXCLUDE_KERNELS adds comma-separated patterns (empty ones dropped) to the list, for
  // every run of a shell: a benchmark script kept clear of a kernel without editing each command.
  if (const char* env = std::getenv("PLEXUS_EXCLUDE_KERNELS"))
    for (const std::string& p : text::split(env, ','))
      if (std::find(o.exclude_kernels.begin(), o.exclude_kernels.end(), p) == o.exclude_kernels.end())
        o.exclude_kernels.push_back(p);
  return o;
}

Runtime::Runtime(RuntimeOptions options)
    : options_(std::move(options)),
      tuner_(options_.kernels, options_.tune_cache, options_.exclude_kernels) {
  logging::init();
  PluginLoadResult r = PluginLoader::load(options_.plugins);
  skipped_ = std::move(r.skipped);
  searched_ = std::move(r.searched);
  for (auto& p : r.loaded) add_plugin(std::move(p));
  for (auto& b : backends_) b->index_kernels(ops_);
  attach_extension_kernels();
  warn_unmatched_exclusions();
  if (!options_.fallback.empty() && !find_backend(options_.fallback))
    throw PluginError("backend.fallback names backend '" + options_.fallback +
                      "', which is not loaded");
}

// A pattern of backend.exclude_kernels that names none of the loaded backends' kernels is
// likely a typo; it is not an error, since one config serves machines with other plugins, and a
// fused kernel (made only when a graph is prepared) may still match it.
void Runtime::warn_unmatched_exclusions() const {
  if (options_.exclude_kernels.empty()) return;
  std::set<std::string> impls;  // every kernel name of every loaded backend, once
  std::string names;
  for (const auto& b : backends_) {
    names += (names.empty() ? "" : ", ") + b->name();
    for (const auto& [op, dts] : b->supported_ops())
      for (plx_dtype d : dts)
        for (const plx_kernel* k : b->kernels(ops_.get(op).id, d)) impls.insert(k->impl ? k->impl : "?");
  }
  for (const std::string& p : options_.exclude_kernels) {
    const bool hit = std::any_of(impls.begin(), impls.end(),
                                 [&](const std::string& i) { return kernel_name_matches(p, i); });
    if (!hit)
      spdlog::warn("backend.exclude_kernels: '{}' matches no kernel of the loaded backends ({}); "
                   "`plexus info` lists their names (a fused kernel's name is matched when it is "
                   "made)",
                   p, names.empty() ? "none" : names);
  }
}

Runtime::~Runtime() {
  tuner_.flush();
  comms_.clear();
  backends_.clear();
  plugins_.clear();
}

void Runtime::add_plugin(std::unique_ptr<LoadedPlugin> plugin) {
  const plx_plugin& d = plugin->descriptor();
  void* ctx = plugin->ctx();
  // Op schemas first: a schema that clashes makes the whole plugin unusable.
  try {
    const int32_t ns = d.op_schema_count(ctx);
    for (int32_t i = 0; i < ns; ++i)
      ops_.add_plugin_schema(*d.get_op_schema(ctx, i), plugin->name(), d.last_error);
  } catch (const Error& e) {
    spdlog::warn("skipped plugin {}: {}", plugin->path(), e.what());
    skipped_.push_back({plugin->path(), e.what()});
    return;
  }
  const int32_t nb = d.backend_count(ctx);
  for (int32_t i = 0; i < nb; ++i) {
    const plx_backend* t = d.get_backend(ctx, i);
    if (Backend* other = find_backend(t->name)) {
      const std::string why = "backend '" + std::string(t->name) + "' already provided by plugin '" +
                              other->plugin().name() + "'; this one is ignored";
      spdlog::warn("plugin {}: {}", plugin->path(), why);
      skipped_.push_back({plugin->path(), why});
      continue;
    }
    backends_.push_back(std::make_unique<Backend>(*this, *plugin, t));
  }
  const int32_t nc = d.comm_count(ctx);
  for (int32_t i = 0; i < nc; ++i) {
    const plx_comm* t = d.get_comm(ctx, i);
    bool dup = false;
    for (const auto& c : comms_) dup = dup || c->name() == t->name;
    if (dup) {
      const std::string why = "communicator '" + std::string(t->name) + "' already loaded";
      skipped_.push_back({plugin->path(), why});
      continue;
    }
    comms_.push_back(std::make_unique<Communicator>(*plugin, t));
  }
  plugins_.push_back(std::move(plugin));
}

void Runtime::attach_extension_kernels() {
  for (const auto& p : plugins_) {
    for (const plx_kernel_ext* e : p->extension_kernels()) {
      const plx_kernel& k = *e->kernel;
      ExtensionKernel x;
      x.plugin = p->name();
      x.backend = e->backend;
      x.op = x.impl = "?";
      if (k.struct_size >= sizeof(plx_kernel)) {  // else add_extension_kernel says it is malformed
        if (k.op) x.op = k.op;
        if (k.impl) x.impl = k.impl;
        x.dtype = static_cast<plx_dtype>(k.dtype);
      }
      // A missing backend is not the extension's fault: a CUDA kernel on a machine without the
      // CUDA plugin. The plugin's other kernels and ops stay usable.
      Backend* b = find_backend(x.backend);
      x.problem = b ? b->add_extension_kernel(&k, *p) : "backend '" + x.backend + "' is not loaded";
      if (x.problem.empty())
        spdlog::debug("plugin '{}' adds kernel '{}' for op '{}' ({}) to backend '{}'", x.plugin,
                      x.impl, x.op, dtype_name(x.dtype), x.backend);
      else
        spdlog::warn("plugin '{}': kernel '{}' for op '{}' on backend '{}' is not used: {}",
                     x.plugin, x.impl, x.op, x.backend, x.problem);
      extensions_.push_back(std::move(x));
    }
  }
}

std::vector<Backend*> Runtime::backends() const {
  std::vector<Backend*> r;
  for (const auto& b : backends_) r.push_back(b.get());
  return r;
}

Backend* Runtime::find_backend(std::string_view name) const {
  for (const auto& b : backends_)
    if (b->name() == name) return b.get();
  return nullptr;
}

namespace {
std::string names_of(const std::vector<std::unique_ptr<Backend>>& bs) {
  std::string s;
  for (const auto& b : bs) s += (s.empty() ? "" : ", ") + b->name();
  return s.empty() ? "none" : s;
}
}  // namespace

Backend& Runtime::backend(std::string_view name) const {
  if (Backend* b = find_backend(name)) return *b;
  std::string msg = "unknown backend '" + std::string(name) +
                    "' (loaded backends: " + names_of(backends_) + ")";
  if (!skipped_.empty()) {
    msg += "; skipped plugins:";
    for (const auto& s : skipped_) msg += " " + s.path + " (" + s.reason + ");";
  }
  if (backends_.empty()) msg += "; searched: " + [&] {
    std::string s;
    for (const auto& p : searched_) s += (s.empty() ? "" : ", ") + p;
    return s.empty() ? std::string("nothing") : s;
  }();
  throw PluginError(msg);
}

Backend& Runtime::select_backend(std::string_view name) {
  if (name != "auto") {
    Backend& b = backend(name);
    if (b.device_count() == 0)
      throw PluginError("backend '" + std::string(name) + "' is loaded but cannot be used here: " +
                        b.unavailable_reason());
    return b;
  }
  // An accelerator: a backend with a device of its own (not the host's memory, as the CPU
  // plugin and third parties' host backends have), else the CPU.
  for (const auto& b : backends_)
    if (b->name() != "cpu" && b->device_count() > 0 && !(b->device(0).caps & PLX_CAP_UNIFIED_HOST))
      return *b;
  return backend("cpu");
}

std::vector<Communicator*> Runtime::communicators() const {
  std::vector<Communicator*> r;
  for (const auto& c : comms_) r.push_back(c.get());
  return r;
}

Communicator& Runtime::communicator(std::string_view name) const {
  for (const auto& c : comms_)
    if (c->name() == name) return *c;
  std::string list;
  for (const auto& c : comms_) list += (list.empty() ? "" : ", ") + c->name();
  throw PluginError("unknown communicator '" + std::string(name) + "' (loaded: " +
                    (list.empty() ? "none" : list) + ")");
}

Backend* Runtime::fallback_backend() const {
  return options_.fallback.empty() ? nullptr : find_backend(options_.fallback);
}

void Runtime::note_fallback(const std::string& op, plx_dtype dtype, const std::string& from) {
  const std::string key = op + "/" + dtype_name(dtype) + "/" + from + "->" + options_.fallback;
  uint64_t n;
  {
    std::lock_guard<std::mutex> lock(fallback_mu_);
    n = ++fallback_counts_[key];
  }
  // Warn once per (op, dtype, backend); every later fallback is counted and logged at debug.
  if (n == 1)
    spdlog::warn("op '{}' ({}) has no kernel on backend '{}': running it on '{}' (backend.fallback)",
                 op, dtype_name(dtype), from, options_.fallback);
  else
    spdlog::debug("op '{}' ({}) fell back from '{}' to '{}' ({} times)", op, dtype_name(dtype),
                  from, options_.fallback, n);
}

std::map<std::string, uint64_t> Runtime::fallback_counts() const {
  std::lock_guard<std::mutex> lock(fallback_mu_);
  return fallback_counts_;
}

}  // namespace plexus
