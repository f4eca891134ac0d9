// The CUDA backend as the tests find it: whether its plugin was built, whether it loaded, whether
// it has a device, and its vendor extras (get_proc_address).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "plexus/abi/backend.h"
#include "plexus/backend.hpp"
#include "plexus/runtime.hpp"
#include "support/harness.hpp"

namespace plexus::test::cuda {

// The plugin's file in the build tree; absent when CMake found no nvcc or cuDNN.
inline std::string plugin_file() { return plugin_dir() + "/libplexus-cuda.so"; }
inline bool plugin_built() { return std::filesystem::exists(plugin_file()); }

// The loader's reason for skipping the plugin file, "" if it did not skip it.
inline std::string skip_reason() {
  for (const SkippedPlugin& s : runtime().skipped())
    if (std::filesystem::path(s.path).filename() == "libplexus-cuda.so") return s.reason;
  return "";
}

inline Backend* backend() { return runtime().find_backend("cuda"); }

// Why the backend has no device ("plexus.unavailable_reason"), "" if it has one or cannot say.
inline std::string unavailable_reason(Backend& b) {
  const plx_backend& t = b.table();
  if (!t.get_proc_address) return "";
  auto fn = reinterpret_cast<const char* (*)(void*)>(t.get_proc_address(t.ctx, "plexus.unavailable_reason"));
  const char* r = fn ? fn(t.ctx) : nullptr;
  return r ? r : "";
}

// Whether the backend is the CUDA emulator (tests/cuda/emu): the CUDA plugin's kernels run on the
// CPU, with cuBLASLt, cuDNN and the Hopper GEMM's PTX emulated.
inline bool emulated(Backend& b) {
  return b.device_count() > 0 && b.device(0).name.find("CUDA emulator") != std::string::npos;
}

// Whether the backend's device runs the plugin's sm_90a code (its Hopper kernels: wgmma, the
// TMA): compute capability 9.0, or the emulator (an H100). Elsewhere those candidates decline.
inline bool runs_sm90a(Backend& b) {
  if (emulated(b)) return true;
  if (b.device_count() == 0) return false;
  const DeviceInfo& d = b.device(0);
  return d.arch_major == 9 && d.arch_minor == 0;
}

// Calls the backend's extra `name`, a void (*)(void* backend_ctx, int32_t on); false if the
// backend has no such extra.
inline bool set_switch(Backend& b, const char* name, bool on) {
  const plx_backend& t = b.table();
  if (!t.get_proc_address) return false;
  auto fn = reinterpret_cast<void (*)(void*, int32_t)>(t.get_proc_address(t.ctx, name));
  if (!fn) return false;
  fn(t.ctx, on ? 1 : 0);
  return true;
}

// Allows TF32 for f32 GEMMs and convolutions created from now on ("cuda.set_tf32"); false if the
// backend has no such extra.
inline bool set_tf32(Backend& b, bool on) { return set_switch(b, "cuda.set_tf32", on); }

// A kernel whose listed name (Executable::kernel_names) contains `text`.
inline bool has_kernel(const std::vector<std::string>& kernels, const std::string& text) {
  for (const auto& k : kernels)
    if (k.find(text) != std::string::npos) return true;
  return false;
}

// TF32 stays as the test found it (off) whatever the test does.
struct Tf32Off {
  Backend& b;
  explicit Tf32Off(Backend& backend) : b(backend) { set_tf32(b, false); }
  ~Tf32Off() { set_tf32(b, false); }
  Tf32Off(const Tf32Off&) = delete;
  Tf32Off& operator=(const Tf32Off&) = delete;
};

// Why [cuda] tests cannot run here ("" if they can). A plugin that was built but did not load is
// not a reason to skip: that is a failure, reported by the caller.
inline std::string why_not_runnable(bool* load_failed) {
  *load_failed = false;
  Backend* b = backend();
  if (!b) {
    if (!plugin_built()) return "the CUDA plugin was not built (no nvcc or cuDNN at configure time)";
    *load_failed = true;
    const std::string why = skip_reason();
    return plugin_file() + " was built but did not load" + (why.empty() ? "" : ": " + why);
  }
  if (b->device_count() == 0) {
    const std::string why = unavailable_reason(*b);
    return "the cuda backend has no device" + (why.empty() ? "" : ": " + why);
  }
  return "";
}

}  // namespace plexus::test::cuda

// Skips the running test when there is no usable CUDA device; fails it when the plugin was built
// but did not load. Leaves `var` pointing at the backend otherwise.
#define PLX_REQUIRE_CUDA(var)                                                 \
  bool plx_load_failed_ = false;                                              \
  const std::string plx_why_ = ::plexus::test::cuda::why_not_runnable(&plx_load_failed_); \
  if (plx_load_failed_) FAIL(plx_why_);                                       \
  if (!plx_why_.empty()) PLX_SKIP(plx_why_.c_str());                          \
  ::plexus::Backend& var = *::plexus::test::cuda::backend()

