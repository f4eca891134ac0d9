// Choosing among a backend's kernels for a node: the side (`backend.kernels`), the autotuner and
// its cache on disk.
//
// A backend may register several kernels for one (op, dtype): its own code in several tile
// shapes, and a vendor library's (flagged PLX_KERNEL_LIBRARY). With `backend.kernels = "auto"`
// (the default) a graph times, when it is prepared, every kernel that accepts a node on scratch
// buffers of the node's shapes and keeps the fastest, as cuDNN's benchmark mode or PyTorch's
// `cudnn.benchmark` do (the backend's first choice stays unless another takes at most 90% of its
// time: closer than that, the order flips with the machine's noise); the choice is kept on disk by problem (backend, device, plugin version and
// options, op, dtypes, shapes, strides, attributes), so a shape is timed once per machine.
// "native" and "library" put that side's kernels first and take the first that accepts, with no
// timing; a node no kernel of that side accepts runs on the other side. Eager calls never time:
// they take a cached choice when there is one, else the backend's order.
//
// `backend.exclude_kernels` lists kernels never to run, as shell patterns (fnmatch) of their
// names: every consumer of a backend's kernels (resolution, the tuner, fused groups, `plexus
// bench kernels`) passes over a kernel whose name matches, as if it had declined ("excluded by
// backend.exclude_kernels ('pattern')"), and the core does not keep a fused kernel whose name
// matches (its nodes run apart, or in other groups). A tuned choice made with some kernels
// excluded is kept under a key of its own (the patterns are part of it), so it never stands in
// for the choice among all of them. The list is the escape hatch for a kernel that is wrong or
// slow on some machine: the run goes on without it while it is fixed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/attrs.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/sdk/tensor.hpp"

namespace plexus {

class Backend;
class PreparedKernel;

enum class KernelSide { Auto, Native, Library };

const char* kernel_side_name(KernelSide side);  // "auto", "native", "library"
// Throws ConfigError naming `key` and the choices for anything else.
KernelSide parse_kernel_side(std::string_view value, std::string_view key = "backend.kernels");

// Whether kernel name `impl` matches a backend.exclude_kernels pattern (fnmatch, no flags).
bool kernel_name_matches(const std::string& pattern, std::string_view impl);

// Whether a kernel is on the library side.
bool is_library_kernel(const plx_kernel& k);

// Whether a fused kernel does all of its nodes with code of its own (PLX_KERNEL_SELF_CONTAINED,
// read only from plugins built for ABI 1.6 or later): the host then makes it once, without
// timing it around its nodes' other kernels, and reports no kernel for its nodes.
bool is_self_contained_kernel(const plx_kernel& k, uint32_t plugin_abi_minor);

// One candidate in a tuning run.
struct CandidateTime {
  std::string impl;
  bool library = false;
  double ms = -1;     // median milliseconds per run; < 0 when it could not be timed
  std::string error;  // why not
};

// How the kernel of a node was chosen.
struct KernelChoice {
  enum class How {
    Only,     // one kernel accepted the node
    Ordered,  // the first that accepted, in the side's order (native, library, eager calls)
    Tuned,    // timed against the others by this process (now, or for an earlier graph or
              // fusion round with the same problem: `times` are those timings)
    Cached,   // the tuning cache's choice, from an earlier process
  };
  How how = How::Only;
  std::vector<CandidateTime> times;  // Tuned: every accepting kernel, fastest first
  std::string key;                   // the cache key (Tuned, Cached)
};
const char* choice_how_name(KernelChoice::How how);  // "only", "ordered", "tuned", "cached"

// The tuning cache file where none is configured: $PLEXUS_CACHE_DIR/kernels.tsv, else
// $XDG_CACHE_HOME/plexus/kernels.tsv, else $HOME/.cache/plexus/kernels.tsv; "" when none of the
// three is set.
std::string default_tune_cache_path();

// The side, and the cache of tuned choices. Thread-safe. The file is a text file, one choice per
// line: key, tab, impl, tab, milliseconds. A line that does not parse is reported (file and
// line) and ignored, never fatal; the file is rewritten whole (a temporary file renamed over it),
// merged with what other processes wrote meanwhile (a choice already in the file stays, so every
// later process agrees with the first), so a crash or two ranks writing at once leave a complete
// file. Tuners of one process with the same path share their choices, so two runtimes in one
// process never run a problem on different kernels (their results would differ in the last
// bits).
class KernelTuner {
 public:
  // `cache_path` "": choices live for the process only. `excluded`: backend.exclude_kernels.
  KernelTuner(KernelSide side = KernelSide::Auto, std::string cache_path = "",
              std::vector<std::string> excluded = {});

  KernelSide side() const { return side_; }
  const std::string& cache_path() const { return path_; }
  const std::vector<std::string>& excluded() const { return excluded_; }
  // The first pattern of backend.exclude_kernels that `impl` matches, else null.
  const std::string* excluded_by(std::string_view impl) const;
  // Why a kernel named `impl` is passed over ("excluded by backend.exclude_kernels ('p')"), or
  // "" when it is not.
  std::string exclusion(std::string_view impl) const;

  std::optional<std::string> lookup(const std::string& key);
  // `times`: every candidate's timing, kept for this process (timed_here).
  void remember(const std::string& key, const std::string& impl, double ms,
                std::vector<CandidateTime> times = {});
  // The timings behind a choice this process made by timing, if it did: a problem met again
  // (the evaluation graph, a group of fused nodes offered again) reports them rather than
  // "cached".
  std::optional<std::vector<CandidateTime>> timed_here(const std::string& key);
  // Writes the choices remembered since the last flush; a failure to write is logged, not thrown
  // (the cache only saves time).
  void flush();

  struct Entry {
    std::string impl;
    double ms = 0;
  };
  std::map<std::string, Entry> entries();  // every choice known (file and process)
  std::vector<std::string> problems();     // lines of the file that were ignored, and why

  struct Shared;  // the choices of one path in this process

 private:
  KernelSide side_;
  std::string path_;
  std::vector<std::string> excluded_;
  std::shared_ptr<Shared> shared_;
};

// The cache key of a node's problem on `device` of `backend` (with the runtime's
// backend.exclude_kernels, when it has any).
std::string tune_key(const Backend& backend, int32_t device, const OpSchema& schema,
                     const std::vector<plx_tensor>& inputs, const std::vector<plx_tensor>& outputs,
                     const Attrs& attrs);

// Fastest first, the untimed (ms < 0) last, ties in their order.
void sort_fastest_first(std::vector<CandidateTime>& times);

// Runs `kernel` on zero-filled scratch buffers with the descriptors' shapes and strides (and its
// workspace) on the device's stream, timed with the backend's events: one warm-up run, then runs
// until about `budget_ms` has passed (at least 3, at most 100). Returns the median milliseconds
// per run. Throws what the kernel throws. A run that has not completed after the runtime's
// backend.tune_timeout_s (a kernel that deadlocks: nothing more can run behind it), or one that
// fails and leaves the stream failing too (a kernel that faults: the device is unusable), ends
// the process with status 3, after logging the kernel and how to exclude it and writing the
// cache. A failure of the work queued before it is thrown, not blamed on the kernel.
double time_kernel(Backend& backend, const PreparedKernel& kernel,
                   const std::vector<plx_tensor>& inputs, const std::vector<plx_tensor>& outputs,
                   int32_t device, double budget_ms = 20);

}  // namespace plexus
