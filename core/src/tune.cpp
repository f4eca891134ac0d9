#include "plexus/tune.hpp"

#include <spdlog/spdlog.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "plexus/allocator.hpp"
#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/error.hpp"
#include "plexus/runtime.hpp"
#include "plexus/sdk/dtype.hpp"
#include "plexus/sdk/tensor.hpp"
#include "plexus/tensor.hpp"
#include "plexus/watchdog.hpp"
#include "text.hpp"

namespace plexus {

namespace fs = std::filesystem;

const char* kernel_side_name(KernelSide side) {
  switch (side) {
    case KernelSide::Native:
      return "native";
    case KernelSide::Library:
      return "library";
    case KernelSide::Auto:
      break;
  }
  return "auto";
}

KernelSide parse_kernel_side(std::string_view value, std::string_view key) {
  if (value == "auto") return KernelSide::Auto;
  if (value == "native") return KernelSide::Native;
  if (value == "library") return KernelSide::Library;
  throw ConfigError(std::string(key) + ": '" + std::string(value) +
                    "' is not a kernel side; expected \"auto\" (time the candidates and keep the "
                    "fastest), \"native\" (the plugin's own kernels first) or \"library\" "
                    "(cuBLAS, cuDNN, OpenBLAS first)");
}

bool is_library_kernel(const plx_kernel& k) { return (k.flags & PLX_KERNEL_LIBRARY) != 0; }

bool is_self_contained_kernel(const plx_kernel& k, uint32_t plugin_abi_minor) {
  return plugin_abi_minor >= 6 && (k.flags & PLX_KERNEL_SELF_CONTAINED) != 0;
}

const char* choice_how_name(KernelChoice::How how) {
  switch (how) {
    case KernelChoice::How::Ordered:
      return "ordered";
    case KernelChoice::How::Tuned:
      return "tuned";
    case KernelChoice::How::Cached:
      return "cached";
    case KernelChoice::How::Only:
      break;
  }
  return "only";
}

std::string default_tune_cache_path() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? v : "";
  };
  if (std::string d = env("PLEXUS_CACHE_DIR"); !d.empty()) return (fs::path(d) / "kernels.tsv").string();
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty())
    return (fs::path(d) / "plexus" / "kernels.tsv").string();
  if (std::string d = env("HOME"); !d.empty())
    return (fs::path(d) / ".cache" / "plexus" / "kernels.tsv").string();
  return "";
}

// ---- the cache ----

namespace {
constexpr const char* kHeader = "# plexus kernel tuning cache v1: key<TAB>kernel<TAB>median ms";
}

struct KernelTuner::Shared {
  std::mutex mu;
  bool loaded = false;
  std::map<std::string, Entry> entries;
  std::map<std::string, Entry> fresh;  // remembered, not yet written
  std::map<std::string, std::vector<CandidateTime>> timed;  // what this process timed
  std::vector<std::string> problems;
};

namespace {

using Entries = std::map<std::string, KernelTuner::Entry>;

void read_cache_file(const std::string& path, Entries& into, std::vector<std::string>* problems) {
  std::ifstream in(path);
  if (!in) return;  // no file yet
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    const auto fields = text::split(line, '\t');
    std::string why;
    KernelTuner::Entry e;
    if (fields.size() != 3) {
      why = "expected 3 tab-separated fields (key, kernel, ms), found " + std::to_string(fields.size());
    } else if (fields[0].empty() || fields[1].empty()) {
      why = "empty key or kernel name";
    } else {
      char* end = nullptr;
      errno = 0;
      e.ms = std::strtod(fields[2].c_str(), &end);
      if (errno || end == fields[2].c_str() || *end || !std::isfinite(e.ms) || e.ms < 0)
        why = "the time '" + fields[2] + "' is not a non-negative number";
    }
    if (!why.empty()) {
      if (problems) problems->push_back(path + ":" + std::to_string(n) + ": " + why);
      continue;
    }
    e.impl = fields[1];
    into[fields[0]] = e;
  }
}

// The process's table for `path`, read from the file on first use.
std::shared_ptr<KernelTuner::Shared> shared_for(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<KernelTuner::Shared>> tables;
  std::lock_guard lock(mu);
  if (auto s = tables[path].lock()) return s;
  auto s = std::make_shared<KernelTuner::Shared>();
  tables[path] = s;
  return s;
}

void load(KernelTuner::Shared& s, const std::string& path) {
  if (s.loaded) return;
  s.loaded = true;
  if (path.empty()) return;
  read_cache_file(path, s.entries, &s.problems);
  for (const std::string& p : s.problems)
    spdlog::warn("kernel tuning cache: {} (line ignored; the shape is timed again)", p);
}

}  // namespace

KernelTuner::KernelTuner(KernelSide side, std::string cache_path,
                         std::vector<std::string> excluded)
    : side_(side),
      path_(std::move(cache_path)),
      excluded_(std::move(excluded)),
      shared_(shared_for(path_)) {}

bool kernel_name_matches(const std::string& pattern, std::string_view impl) {
  return fnmatch(pattern.c_str(), std::string(impl).c_str(), 0) == 0;
}

const std::string* KernelTuner::excluded_by(std::string_view impl) const {
  for (const std::string& p : excluded_)
    if (kernel_name_matches(p, impl)) return &p;
  return nullptr;
}

std::string KernelTuner::exclusion(std::string_view impl) const {
  const std::string* p = excluded_by(impl);
  return p ? "excluded by backend.exclude_kernels ('" + *p + "')" : std::string();
}

std::optional<std::string> KernelTuner::lookup(const std::string& key) {
  std::lock_guard lock(shared_->mu);
  load(*shared_, path_);
  if (auto it = shared_->entries.find(key); it != shared_->entries.end()) return it->second.impl;
  return std::nullopt;
}

void KernelTuner::remember(const std::string& key, const std::string& impl, double ms,
                           std::vector<CandidateTime> times) {
  std::lock_guard lock(shared_->mu);
  load(*shared_, path_);
  shared_->entries[key] = Entry{impl, ms};
  shared_->fresh[key] = Entry{impl, ms};
  if (!times.empty()) shared_->timed[key] = std::move(times);
}

std::optional<std::vector<CandidateTime>> KernelTuner::timed_here(const std::string& key) {
  std::lock_guard lock(shared_->mu);
  if (auto it = shared_->timed.find(key); it != shared_->timed.end()) return it->second;
  return std::nullopt;
}

void KernelTuner::flush() {
  std::lock_guard lock(shared_->mu);
  Entries& fresh = shared_->fresh;
  if (fresh.empty() || path_.empty()) {
    fresh.clear();
    return;
  }
  // Merge with the file as it is now: another process may have added to it, and a choice it
  // wrote first stays.
  Entries all;
  read_cache_file(path_, all, nullptr);
  for (const auto& [k, e] : fresh) all.emplace(k, e);
  const fs::path target(path_);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  const std::string tmp = path_ + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kHeader << "\n";
    char ms[32];
    for (const auto& [k, e] : all) {
      std::snprintf(ms, sizeof ms, "%.6g", e.ms);
      out << k << '\t' << e.impl << '\t' << ms << '\n';
    }
    out.flush();
    if (!out) {
      spdlog::warn("kernel tuning cache: could not write '{}' ({}); the choices are kept for "
                   "this process only",
                   tmp, std::strerror(errno));
      fs::remove(tmp, ec);
      fresh.clear();
      return;
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    spdlog::warn("kernel tuning cache: could not replace '{}' ({}); the choices are kept for "
                 "this process only",
                 path_, ec.message());
    fs::remove(tmp, ec);
  } else {
    spdlog::debug("kernel tuning cache: {} new choice(s) written to {}", fresh.size(), path_);
  }
  fresh.clear();
}

std::map<std::string, KernelTuner::Entry> KernelTuner::entries() {
  std::lock_guard lock(shared_->mu);
  load(*shared_, path_);
  return shared_->entries;
}

std::vector<std::string> KernelTuner::problems() {
  std::lock_guard lock(shared_->mu);
  load(*shared_, path_);
  return shared_->problems;
}

// ---- keys ----

namespace {

void put_tensor(std::ostringstream& os, const plx_tensor& t) {
  if (t.dtype == PLX_DTYPE_NONE) {
    os << "-";
    return;
  }
  os << dtype_name(t.dtype) << "[";
  for (int32_t i = 0; i < t.ndim; ++i) os << (i ? "x" : "") << t.shape[i];
  if (!sdk::is_contiguous(t)) {  // strides only where they are not row-major's
    os << "/";
    for (int32_t i = 0; i < t.ndim; ++i) os << (i ? "," : "") << t.strides[i];
  }
  os << "]";
}

// Keys are one line of the cache file: no tabs or newlines.
std::string clean(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

std::string tune_key(const Backend& backend, int32_t device, const OpSchema& schema,
                     const std::vector<plx_tensor>& inputs, const std::vector<plx_tensor>& outputs,
                     const Attrs& attrs) {
  std::ostringstream os;
  const DeviceInfo dev = backend.device(device);
  os << backend.name() << "|" << dev.name << "|" << backend.plugin().name() << " "
     << backend.plugin().version();
  // The plugin's options (threads, tf32, ...) change which kernel is fastest.
  const auto& opts = backend.runtime().options().plugins.options;
  if (auto it = opts.find(backend.plugin().name()); it != opts.end())
    for (const auto& [k, v] : it->second) os << " " << k << "=" << v;
  // A choice among fewer kernels is another problem's.
  const auto& excluded = backend.runtime().tuner().excluded();
  if (!excluded.empty()) {
    os << " exclude_kernels=";
    for (size_t i = 0; i < excluded.size(); ++i) os << (i ? "," : "") << excluded[i];
  }
  os << "|" << schema.name << "|";
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) os << ",";
    put_tensor(os, inputs[i]);
  }
  os << "->";
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (i) os << ",";
    put_tensor(os, outputs[i]);
  }
  os << "|";
  bool first = true;
  for (const auto& [name, value] : attrs) {
    os << (first ? "" : ";") << name << "=" << attr_value_string(value);
    first = false;
  }
  return clean(os.str());
}

// ---- timing ----

void sort_fastest_first(std::vector<CandidateTime>& times) {
  std::stable_sort(times.begin(), times.end(), [](const CandidateTime& a, const CandidateTime& b) {
    if ((a.ms < 0) != (b.ms < 0)) return b.ms < 0;
    return a.ms < b.ms;
  });
}

namespace {

// Ends the process when the tuner's run of a candidate has broken the device (`what` says how):
// names the kernel and how to keep it out, keeps what the tuner has timed so far, and exits
// (exit_for_device). Every later process would time the kernel again if it were not named.
[[noreturn]] void exit_for_candidate(Backend& backend, const PreparedKernel& kernel,
                                     const std::string& what) {
  const std::string impl = kernel.kernel().impl ? kernel.kernel().impl : "?";
  const std::string message = fmt::format(
      "{} on '{}': the tuner's run of candidate {} {}, and the process exits; keep the kernel "
      "out with backend.exclude_kernels = [\"{}\"] or PLEXUS_EXCLUDE_KERNELS={}",
      kernel.label(), backend.name(), impl, what, impl, impl);
  backend.runtime().tuner().flush();
  exit_for_device(message);
}

// Waits for `done` as sync_event would, for at most backend.tune_timeout_s. A candidate whose run
// never completes (a kernel that deadlocks on this device) would otherwise hang the process where
// it prepares a graph, and nothing more can run on a stream stuck behind it.
void wait_for_run(Backend& backend, plx_event done, const PreparedKernel& kernel) {
  const double limit = backend.runtime().options().tune_timeout_s;
  const auto t0 = std::chrono::steady_clock::now();
  for (int polls = 0; !backend.event_done(done); ++polls) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited > limit)
      exit_for_candidate(backend, kernel,
                         fmt::format("has not completed in {:g} s (backend.tune_timeout_s), so "
                                     "the device is taken for stuck",
                                     limit));
    if (polls < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 2000 ? 20 : 1000));
  }
}

}  // namespace

double time_kernel(Backend& backend, const PreparedKernel& kernel,
                   const std::vector<plx_tensor>& inputs, const std::vector<plx_tensor>& outputs,
                   int32_t device, double budget_ms) {
  const plx_stream stream = backend.stream(device);
  std::vector<Tensor> keep;  // the scratch buffers, freed at return
  auto scratch = [&](const plx_tensor& d) {
    plx_tensor v = d;
    if (d.dtype == PLX_DTYPE_NONE) return v;  // an absent optional input
    int64_t span = 1;
    for (int32_t i = 0; i < d.ndim; ++i) {
      if (d.shape[i] == 0) span = 0;
      if (span) span += (d.shape[i] - 1) * std::abs(d.strides[i]);
    }
    const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(span, 1)) * dtype_size(d.dtype);
    Tensor t = Tensor::empty(backend, {static_cast<int64_t>(bytes)}, PLX_U8, device);
    backend.memset(device, t.data(), 0, bytes, stream);
    const plx_tensor tv = t.view();
    v.data = tv.data;
    v.device = tv.device;
    v.mem_kind = tv.mem_kind;
    keep.push_back(std::move(t));
    return v;
  };
  std::vector<plx_tensor> in, out;
  for (const plx_tensor& d : inputs) in.push_back(scratch(d));
  for (const plx_tensor& d : outputs) out.push_back(scratch(d));
  // What was queued before the candidate has run: a failure from here on is the candidate's.
  backend.sync_stream(stream);

  CachingAllocator& alloc = backend.allocator(device);
  MemoryBlock* ws = kernel.workspace_bytes() ? alloc.allocate(kernel.workspace_bytes(), stream) : nullptr;
  const plx_event start = backend.create_event(device);
  const plx_event end = backend.create_event(device);
  auto cleanup = [&] {
    backend.destroy_event(start);
    backend.destroy_event(end);
    if (ws) alloc.free(ws);
  };
  std::vector<double> per_run;
  try {
    auto run = [&](int reps) {
      backend.record(start, stream);
      for (int r = 0; r < reps; ++r)
        kernel.run(in.data(), static_cast<int32_t>(in.size()), out.data(),
                   static_cast<int32_t>(out.size()), ws ? ws->ptr : nullptr, stream);
      backend.record(end, stream);
      wait_for_run(backend, end, kernel);
      return backend.elapsed_ms(start, end);
    };
    run(1);  // warm-up: first-touch pages, lazy module loads, caches
    const double first = std::max(run(1), 1e-4);
    // Batches of runs long enough (about 0.2 ms) that the launch of the first is hidden.
    const int reps = static_cast<int>(std::clamp(std::ceil(0.2 / first), 1.0, 50.0));
    per_run.push_back(first);
    double spent = first;
    while (per_run.size() < 3 || (spent < budget_ms && per_run.size() < 100)) {
      const double ms = run(reps);
      spent += ms;
      per_run.push_back(ms / reps);
    }
    backend.sync_stream(stream);
  } catch (...) {
    // A candidate that declines at run time or runs out of memory leaves the stream working: it
    // is no candidate, and the caller goes on. One that faulted (an illegal address on a GPU)
    // leaves the device unusable, so that every node and candidate after it would fail too.
    std::string error = "an exception", after;
    try {
      throw;
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
    }
    try {
      backend.sync_stream(stream);
    } catch (const std::exception& s) {
      after = s.what();
    } catch (...) {
      after = "an exception";
    }
    if (!after.empty())
      exit_for_candidate(backend, kernel,
                         fmt::format("failed and left the device unusable ({}; the stream after "
                                     "it: {})",
                                     error, after));
    cleanup();
    throw;
  }
  cleanup();
  std::sort(per_run.begin(), per_run.end());
  return per_run[per_run.size() / 2];
}

}  // namespace plexus
