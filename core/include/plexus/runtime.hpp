// The runtime: loads plugins, registers their backends, communicators, op schemas and kernel
// extensions (kernels one plugin gives another's backend), and holds the policy for ops a backend
// lacks (an error, or a logged and counted fallback).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/backend.hpp"
#include "plexus/communicator.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/plugin.hpp"
#include "plexus/tune.hpp"

namespace plexus {

class Config;

struct RuntimeOptions {
  PluginSearch plugins;
  // Backend that runs ops the selected backend has no kernel for; "" makes that an error.
  std::string fallback;
  // Most bytes each device's allocator may reserve; 0 = the device's memory.
  uint64_t memory_limit = 0;
  // Or, when memory_limit is 0, this fraction of each device's total memory (0: none).
  double memory_fraction = 0;
  // Which of a backend's kernels run a node (plexus/tune.hpp), and the file tuned choices are
  // kept in ("": this process only; runtime_options() fills in the default path).
  KernelSide kernels = KernelSide::Auto;
  std::string tune_cache;
  // Shell patterns of kernel names never to run (backend.exclude_kernels, plexus/tune.hpp).
  std::vector<std::string> exclude_kernels;
  // Seconds one timing run of a candidate may take before the tuner exits the process
  // (backend.tune_timeout_s; time_kernel, plexus/tune.hpp).
  double tune_timeout_s = 60;
  // backend.check_kernels: every executable waits for each kernel before the next and names
  // the first that fails on the device (KernelFaultError); no step is captured. For finding a
  // kernel that faults, not for speed.
  bool check_kernels = false;
  // backend.step_timeout_s: seconds the host waits for a step's kernels (with check_kernels, for
  // each kernel) before it takes the device for stuck and exits with status 3, naming what it
  // waited for (plexus/watchdog.hpp); 0: no limit.
  double step_timeout_s = 600;
};

// A kernel one plugin gives a backend of another (an ABI 1.2 kernel extension), as reported by
// `plexus info`.
struct ExtensionKernel {
  std::string plugin;   // the plugin that gives it
  std::string backend;  // the backend it is for
  std::string op;
  std::string impl;
  plx_dtype dtype = PLX_DTYPE_NONE;
  std::string problem;  // "": the backend uses it; else why not ("backend 'cuda' is not loaded")
};

// RuntimeOptions from a Config: plugins.*, backend.fallback, backend.kernels,
// backend.tune_cache, backend.exclude_kernels, backend.tune_timeout_s, backend.check_kernels,
// backend.step_timeout_s, memory.limit.
RuntimeOptions runtime_options(const Config& config);

class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const OpRegistry& ops() const { return ops_; }
  const std::vector<std::unique_ptr<LoadedPlugin>>& plugins() const { return plugins_; }
  const std::vector<SkippedPlugin>& skipped() const { return skipped_; }
  const std::vector<std::string>& searched() const { return searched_; }
  const RuntimeOptions& options() const { return options_; }
  // The side and cache that choose among a backend's kernels (backend.kernels).
  KernelTuner& tuner() const { return tuner_; }

  // Every kernel extension the loaded plugins give, in load order, attached or not.
  const std::vector<ExtensionKernel>& extension_kernels() const { return extensions_; }

  std::vector<Backend*> backends() const;
  Backend* find_backend(std::string_view name) const;
  // Throws PluginError "unknown backend 'x' (loaded backends: cpu; skipped plugins: ...)".
  Backend& backend(std::string_view name) const;
  // "auto": the first backend other than cpu with a device of its own (not host memory, so a
  // host backend such as sdk/examples/backend is never picked over the cpu), else cpu.
  Backend& select_backend(std::string_view name);

  std::vector<Communicator*> communicators() const;
  Communicator& communicator(std::string_view name) const;  // PluginError if unknown

  // The fallback backend, or null if none is configured.
  Backend* fallback_backend() const;
  // Records one op run on the fallback (logged once per (op, dtype, backend) at warn level).
  void note_fallback(const std::string& op, plx_dtype dtype, const std::string& from);
  // "op/dtype/from->to" -> count
  std::map<std::string, uint64_t> fallback_counts() const;

 private:
  void add_plugin(std::unique_ptr<LoadedPlugin> plugin);
  // Appends every plugin's kernel extensions to the backends they name (after all plugins have
  // loaded and the backends indexed their own kernels); reports those it cannot attach.
  void attach_extension_kernels();
  // Warns about each backend.exclude_kernels pattern that matches none of their kernels.
  void warn_unmatched_exclusions() const;

  RuntimeOptions options_;
  OpRegistry ops_;
  // Order matters: backends and communicators die before the plugins that made them.
  std::vector<std::unique_ptr<LoadedPlugin>> plugins_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<SkippedPlugin> skipped_;
  std::vector<std::string> searched_;
  std::vector<ExtensionKernel> extensions_;
  mutable KernelTuner tuner_;  // thread-safe; its cache fills as graphs are prepared
  mutable std::mutex fallback_mu_;
  std::map<std::string, uint64_t> fallback_counts_;
};

}  // namespace plexus
