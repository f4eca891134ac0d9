// A plugin as a C++ class plus one macro. The class's constructor receives the host's services
// (logging, options) and adds the backends, communicators, op schemas and kernels for other
// plugins' backends (kernel extensions) it provides; PLEXUS_PLUGIN emits the exported entry
// point and the plx_plugin descriptor.
//
//   class MyPlugin : public plexus::sdk::Plugin {
//    public:
//     explicit MyPlugin(const plexus::sdk::HostContext& host) {
//       add_backend(std::make_unique<MyBackend>(host.option_int("threads", 0)));
//     }
//   };
//   PLEXUS_PLUGIN(MyPlugin, "mine", "1.0.0", "what it is")
#pragma once

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/abi/plugin.h"
#include "plexus/sdk/backend.hpp"
#include "plexus/sdk/comm.hpp"
#include "plexus/sdk/status.hpp"

namespace plexus::sdk {

// ---- logging through the host's callback ----
namespace detail {
inline plx_log_fn log_fn = nullptr;
inline void* log_user = nullptr;
inline int32_t log_level = PLX_LOG_INFO;
}  // namespace detail

inline bool log_enabled(int32_t level) {
  return detail::log_fn != nullptr && level >= detail::log_level;
}
inline void log(int32_t level, const char* source, const std::string& message) {
  if (log_enabled(level)) detail::log_fn(detail::log_user, level, source, message.c_str());
}
// PLX_LOG(PLX_LOG_DEBUG, "cpu.conv", "chose %s", name): formats only if the level is on.
#define PLX_LOG(level, source, ...)                                            \
  do {                                                                         \
    if (::plexus::sdk::log_enabled(level))                                     \
      ::plexus::sdk::log(level, source, ::plexus::sdk::format(__VA_ARGS__));   \
  } while (0)

// What the host passed to init(): options from the config and the ABI version it speaks.
class HostContext {
 public:
  explicit HostContext(const plx_host* host) : host_(host) {}
  uint16_t abi_minor() const { return host_->abi_minor; }

  std::optional<std::string> option(std::string_view key) const {
    for (int32_t i = 0; i < host_->num_options; ++i)
      if (key == host_->options[i].key) return std::string(host_->options[i].value);
    return std::nullopt;
  }
  int64_t option_int(std::string_view key, int64_t fallback) const {
    const auto v = option(key);
    if (!v) return fallback;
    char* end = nullptr;
    const long long x = std::strtoll(v->c_str(), &end, 10);
    PLX_REQUIRE(end && *end == '\0' && !v->empty(), "option '%.*s': expected an integer, got '%s'",
                static_cast<int>(key.size()), key.data(), v->c_str());
    return x;
  }
  bool option_bool(std::string_view key, bool fallback) const {
    const auto v = option(key);
    if (!v) return fallback;
    if (*v == "true") return true;
    if (*v == "false") return false;
    throw InvalidArgument(format("option '%.*s': expected true or false, got '%s'",
                                 static_cast<int>(key.size()), key.data(), v->c_str()));
  }
  // Rejects options the plugin does not know, naming them and the known ones.
  void check_options(const std::vector<std::string>& known) const {
    for (int32_t i = 0; i < host_->num_options; ++i) {
      bool ok = false;
      for (const auto& k : known) ok = ok || k == host_->options[i].key;
      if (!ok) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        throw InvalidArgument(format("unknown option '%s' (known: %s)", host_->options[i].key,
                                     list.empty() ? "none" : list.c_str()));
      }
    }
  }

 private:
  const plx_host* host_;
};

class Plugin {
 public:
  virtual ~Plugin() = default;
  Plugin() = default;
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  template <class B>
  B& add_backend(std::unique_ptr<B> b) {
    B& ref = *b;
    backends_.push_back(std::move(b));
    return ref;
  }
  template <class C>
  C& add_comm(std::unique_ptr<C> c) {
    C& ref = *c;
    comms_.push_back(std::move(c));
    return ref;
  }
  // The schema's strings and arrays must outlive the plugin (static storage).
  void add_op_schema(const plx_op_schema& s) { schemas_.push_back(s); }

  // A kernel for a backend of another plugin (ABI 1.2, plx_kernel_ext in abi/plugin.h has the
  // contract): K, constructible from (const NodeInfo&), runs `op` in `dtype` on `backend`,
  // tried after that backend's own kernels. compute() gets the target backend's memory and
  // stream, so a kernel looping on the host is for host-memory backends ("cpu") only.
  //   add_kernel_for<MySwish>("cpu", "mine.swish", PLX_F32, "mine-swish-loop");
  template <class K>
  void add_kernel_for(const char* backend, const char* op, plx_dtype dtype, const char* impl,
                      uint32_t flags = 0, plx_layout layout = PLX_LAYOUT_ANY) {
    auto& reg = extension_registries_[backend];
    if (!reg) reg = std::make_unique<KernelRegistry>();
    reg->add<K>(op, dtype, impl, flags, layout);
    Extension& e = extensions_.emplace_back();
    e.backend = backend;
    e.table.struct_size = sizeof(plx_kernel_ext);
    e.table.backend = e.backend.c_str();
    e.table.kernel = reg->get(reg->size() - 1);
  }

  int32_t extension_count() const { return static_cast<int32_t>(extensions_.size()); }
  const plx_kernel_ext* extension(int32_t i) const {
    return i >= 0 && i < extension_count() ? &extensions_[static_cast<size_t>(i)].table : nullptr;
  }

  int32_t backend_count() const { return static_cast<int32_t>(backends_.size()); }
  const plx_backend* backend_table(int32_t i) {
    return i >= 0 && i < backend_count() ? backends_[static_cast<size_t>(i)]->table() : nullptr;
  }
  int32_t comm_count() const { return static_cast<int32_t>(comms_.size()); }
  const plx_comm* comm_table(int32_t i) {
    return i >= 0 && i < comm_count() ? comms_[static_cast<size_t>(i)]->table() : nullptr;
  }
  int32_t schema_count() const { return static_cast<int32_t>(schemas_.size()); }
  const plx_op_schema* schema(int32_t i) const {
    return i >= 0 && i < schema_count() ? &schemas_[static_cast<size_t>(i)] : nullptr;
  }

 private:
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<plx_op_schema> schemas_;
  struct Extension {
    std::string backend;
    plx_kernel_ext table{};
  };
  // Deques and unique_ptrs: the tables keep their addresses as kernels are added.
  std::map<std::string, std::unique_ptr<KernelRegistry>> extension_registries_;
  std::deque<Extension> extensions_;
};

namespace detail {

template <class P>
const plx_plugin* make_descriptor(const char* name, const char* version, const char* description) {
  static const plx_plugin d = [&] {
    plx_plugin p{};
    p.struct_size = sizeof(plx_plugin);
    p.abi_major = PLX_ABI_MAJOR;
    p.abi_minor = PLX_ABI_MINOR;
    p.name = name;
    p.version = version;
    p.description = description;
    p.init = [](const plx_host* host, void** ctx) {
      return guard([&] {
        PLX_REQUIRE(host != nullptr && host->struct_size >= sizeof(plx_host) && host->log,
                    "init: the host's plx_host is missing or too small");
        PLX_REQUIRE(host->abi_major == PLX_ABI_MAJOR,
                    "init: host speaks ABI %u, plugin was built for %u", host->abi_major,
                    PLX_ABI_MAJOR);
        log_fn = host->log;
        log_user = host->log_user;
        log_level = host->log_level;
        try {
          *ctx = new P(HostContext(host));
        } catch (...) {
          log_fn = nullptr;
          throw;
        }
        const int32_t n_ext = static_cast<P*>(*ctx)->extension_count();
        if (n_ext > 0 && host->abi_minor < 2)
          log(PLX_LOG_WARN, "sdk.plugin",
              format("this host speaks plugin ABI %u.%u, which has no kernel extensions: the "
                     "plugin's %d kernel(s) for other backends are not used",
                     host->abi_major, host->abi_minor, n_ext));
      });
    };
    p.shutdown = [](void* ctx) {
      guard([&] { delete static_cast<P*>(ctx); });
      log_fn = nullptr;
    };
    p.last_error = []() -> const char* { return detail::last_error; };
    p.backend_count = [](void* ctx) { return static_cast<P*>(ctx)->backend_count(); };
    p.get_backend = [](void* ctx, int32_t i) { return static_cast<P*>(ctx)->backend_table(i); };
    p.comm_count = [](void* ctx) { return static_cast<P*>(ctx)->comm_count(); };
    p.get_comm = [](void* ctx, int32_t i) { return static_cast<P*>(ctx)->comm_table(i); };
    p.op_schema_count = [](void* ctx) { return static_cast<P*>(ctx)->schema_count(); };
    p.get_op_schema = [](void* ctx, int32_t i) { return static_cast<P*>(ctx)->schema(i); };
    p.extension_kernel_count = [](void* ctx) { return static_cast<P*>(ctx)->extension_count(); };
    p.get_extension_kernel = [](void* ctx, int32_t i) {
      return static_cast<P*>(ctx)->extension(i);
    };
    return p;
  }();
  return &d;
}

}  // namespace detail
}  // namespace plexus::sdk

#define PLX_EXPORT extern "C" __attribute__((visibility("default")))

// Emits the plugin's entry point. Use once per plugin library, at namespace scope.
#define PLEXUS_PLUGIN(PluginClass, name, version, description)                      \
  PLX_EXPORT const plx_plugin* plexus_plugin_entry(void) {                          \
    return ::plexus::sdk::detail::make_descriptor<PluginClass>(name, version, description); \
  }
