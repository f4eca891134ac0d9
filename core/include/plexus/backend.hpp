// A loaded backend as the core sees it: the plugin's C table behind a C++ face, its devices,
// its caching allocators and default streams, and its kernels indexed by (op id, dtype) once at
// load, so that dispatch never looks anything up by name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/abi/backend.h"
#include "plexus/allocator.hpp"
#include "plexus/op_schema.hpp"

namespace plexus {

class LoadedPlugin;
class Runtime;

struct DeviceInfo {
  int32_t index = 0;
  std::string name;
  uint64_t total_memory = 0;
  uint64_t free_memory = 0;
  int32_t compute_units = 0;
  int32_t arch_major = 0, arch_minor = 0;
  uint32_t caps = 0;
  uint64_t alignment = 0;
};
std::string caps_string(uint32_t caps);  // "f16 bf16 f64 pinned ..."

class Backend {
 public:
  Backend(Runtime& runtime, LoadedPlugin& plugin, const plx_backend* table);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const std::string& name() const { return name_; }
  const plx_backend& table() const { return *t_; }
  LoadedPlugin& plugin() const { return plugin_; }
  Runtime& runtime() const { return runtime_; }

  // ---- devices ----
  int32_t device_count() const { return device_count_; }
  DeviceInfo device(int32_t index) const;  // throws PluginError for a bad index
  // Why the backend has no device, in the plugin's words ("no CUDA device: ..."), from its
  // optional "plexus.unavailable_reason" extra; "" when it has devices or does not say.
  const std::string& unavailable_reason() const { return unavailable_; }

  // ---- memory ----
  CachingAllocator& allocator(int32_t device, plx_mem_kind kind = PLX_MEM_DEVICE);
  void copy(int32_t device, void* dst, const void* src, uint64_t bytes, plx_copy_dir dir,
            plx_stream stream);
  void memset(int32_t device, void* dst, int32_t value, uint64_t bytes, plx_stream stream);
  // Sum of the device allocators' statistics.
  plx_memory_stats memory_stats(int32_t device) const;

  // ---- streams ----
  // The stream the core enqueues work on for `device`, created on first use.
  plx_stream stream(int32_t device);
  void sync(int32_t device);
  void sync_stream(plx_stream s);
  // More streams and events (a copy stream beside the compute stream). The caller destroys what
  // it creates; the destroy calls never throw.
  plx_stream create_stream(int32_t device);
  void destroy_stream(plx_stream s) noexcept;
  plx_event create_event(int32_t device);
  void destroy_event(plx_event e) noexcept;
  void record(plx_event e, plx_stream s);      // e completes when s reaches this point
  void wait(plx_stream s, plx_event e);        // later work on s waits for e; the host does not
  void sync_event(plx_event e);                // the host waits for e
  bool event_done(plx_event e);                // whether e has completed; never blocks
  // Milliseconds from `start` to `end`, two completed events of one device.
  double elapsed_ms(plx_event start, plx_event end);

  // ---- kernels ----
  // Kernels for (op, dtype), in the backend's order of preference; empty if none.
  std::span<const plx_kernel* const> kernels(int32_t op_id, int32_t dtype) const;
  bool supports(int32_t op_id, int32_t dtype) const { return !kernels(op_id, dtype).empty(); }
  // op name -> dtypes with at least one kernel, for reports.
  std::map<std::string, std::vector<plx_dtype>> supported_ops() const;
  // Kernels this backend registered for ops no schema describes (reported, never used).
  const std::vector<std::string>& orphan_kernels() const { return orphans_; }
  // Appends a kernel that plugin `from` gives this backend (an ABI 1.2 kernel extension) after
  // the kernels already indexed for its (op, dtype). Returns "" when it is used, or why not (a
  // malformed table, an op no schema describes).
  std::string add_extension_kernel(const plx_kernel* kernel, LoadedPlugin& from);
  // Where kernel `k` comes from: the backend's own plugin, or the plugin that gave it as an
  // extension. Its create() receives that plugin's ctx (the backend's ctx for its own kernels,
  // the giving plugin's plugin_ctx for an extension), and its last_error() explains failures.
  LoadedPlugin& kernel_plugin(const plx_kernel* k) const;
  void* kernel_ctx(const plx_kernel* k) const;

  // ---- errors ----
  // Throws the matching plexus error with the plugin's last_error text:
  // "backend 'cuda': <what>: out of memory: <plugin message>".
  [[noreturn]] void fail(plx_status status, std::string_view what) const;
  // The same, with the message from `reporter`'s last_error(): the plugin that gave a kernel
  // extension, whose failure the backend's own plugin knows nothing of.
  [[noreturn]] void fail(plx_status status, std::string_view what,
                         const LoadedPlugin& reporter) const;
  void check(plx_status status, std::string_view what) const {
    if (status != PLX_OK) fail(status, what);
  }

  // Called after the runtime adds plugin op schemas: indexes kernels by op id.
  void index_kernels(const OpRegistry& ops);

 private:
  // Appends `k` to its (op, dtype)'s kernels; null (and nothing added) when no schema has it.
  const OpSchema* index_kernel(const plx_kernel* k);

  Runtime& runtime_;
  LoadedPlugin& plugin_;
  const plx_backend* t_;
  std::string name_;
  int32_t device_count_ = 0;
  std::string unavailable_;

  mutable std::mutex mu_;
  std::map<std::pair<int32_t, int32_t>, std::unique_ptr<CachingAllocator>> allocators_;
  std::map<int32_t, plx_stream> streams_;

  // kernels_[op_id * PLX_DTYPE_COUNT + dtype]
  std::vector<std::vector<const plx_kernel*>> kernels_;
  std::vector<std::string> orphans_;
  // Kernel extensions -> the plugin that gave each; looked up when a node is prepared or a
  // kernel fails, never per step.
  std::map<const plx_kernel*, LoadedPlugin*> extension_from_;
  const OpRegistry* ops_ = nullptr;
};

// Events of one device that live as long as the object (timing a run between two of them).
class Events {
 public:
  Events(Backend& b, int32_t device, size_t n) : b_(b) {
    try {
      for (size_t i = 0; i < n; ++i) ev_.push_back(b.create_event(device));
    } catch (...) {
      release();
      throw;
    }
  }
  ~Events() { release(); }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  plx_event operator[](size_t i) const { return ev_.at(i); }
  size_t size() const { return ev_.size(); }

 private:
  void release() noexcept {
    for (plx_event e : ev_) b_.destroy_event(e);
    ev_.clear();
  }
  Backend& b_;
  std::vector<plx_event> ev_;
};

}  // namespace plexus
