// Running a Graph on a backend.
//
// An Executable is made once per graph: it resolves every node's kernel once (PreparedKernel),
// creates (or finds) the persistent tensors in a TensorStore, plans activation memory by
// liveness, and allocates everything it needs up front. run() then only enqueues kernels with
// pointers fixed at plan time, which is what lets a backend capture the whole step once and
// replay it (the host changes data only inside input buffers, never addresses).
//
// Memory plan: the nodes run in graph order on one stream. An activation's memory is live from
// the node that writes it to the last node that reads it (or a view of it); graph outputs live to
// the end. Live ranges are packed into one arena, largest first, each at the lowest offset that
// overlaps no buffer live at the same time (greedy by size). A node whose kernel may write output
// 0 over input 0 (PLX_KERNEL_INPLACE) does so when input 0 dies at that node and is not also
// read through another input of it. Kernels share one workspace, sized for the largest.
//
// Fusion: before kernels are resolved the graph is offered to the backend (get_capability),
// which may claim groups of nodes to run as one kernel (a multi-tensor optimizer update, a GEMM
// with its activation). A claim is accepted when the group can run where its last node runs:
// nothing outside it between its first and last node reads a value it writes, or writes (in
// place) a value it reads or writes. The fused kernel runs at the last node's place; a value
// written and read only inside it gets no memory at all. A group the backend then declines in
// create_fused runs node by node.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/dispatch.hpp"
#include "plexus/graph.hpp"
#include "plexus/tensor.hpp"

namespace plexus {

class Backend;

// Parameters and states by name, shared by the executables of one model (a training step and an
// evaluation step) and saved by checkpoints.
class TensorStore {
 public:
  bool contains(std::string_view name) const;
  // Throws Error "no tensor 'x' in the store".
  const Tensor& get(std::string_view name) const;
  void set(const std::string& name, Tensor t);
  const std::map<std::string, Tensor, std::less<>>& all() const { return tensors_; }

 private:
  std::map<std::string, Tensor, std::less<>> tensors_;
};

// Fills `t` (any float dtype) by `init`, drawing from a Philox stream keyed by (seed, name):
// the same seed gives the same values whatever the order parameters are created in.
void initialize(Tensor& t, const InitSpec& init, uint64_t seed, std::string_view name);

struct MemoryPlan {
  uint64_t arena_bytes = 0;       // activations, after reuse
  uint64_t unplanned_bytes = 0;   // the sum of every activation buffer (no reuse)
  uint64_t workspace_bytes = 0;   // the kernels' shared scratch
  uint64_t persistent_bytes = 0;  // inputs, constants, and parameters/states created here
  int32_t activation_buffers = 0; // distinct activation buffers before reuse
  int32_t inplace_nodes = 0;      // nodes that write over their input
  int32_t fused_kernels = 0;      // kernels the backend fused from several nodes
  int32_t fused_nodes = 0;        // the nodes they run
  int32_t internal_values = 0;    // values only a fused kernel reads: never allocated
  // The layout planner's choice: 4-D activations stored channels-last (NHWC strides), their
  // bytes, and their names ("conv2d_1.out f16(128, 32, 28, 28)").
  int32_t channels_last_values = 0;
  uint64_t channels_last_bytes = 0;
  std::vector<std::string> channels_last;
  std::vector<int64_t> offset;    // per value id: byte offset in the arena, -1 if not in it
  // Where the arena is fullest: the most activation bytes live at once (at a kernel's run, the
  // buffers it reads and writes included), which no packing can go under (arena_bytes >= it),
  // the node whose kernel runs then, and what is live there, largest first.
  uint64_t live_peak_bytes = 0;
  std::string peak_node;  // "conv2d_2.grad (conv2d_backward_data)"
  struct LiveValue {
    std::string value;  // "conv2d_2.grad conv2d_backward_data f32(1024, 32, 28, 28)"
    uint64_t bytes = 0;
  };
  std::vector<LiveValue> peak_live;
  // What this executable adds to the device's memory.
  uint64_t total_bytes() const { return arena_bytes + workspace_bytes + persistent_bytes; }
};

struct ExecutableOptions {
  int32_t device = 0;
  bool reuse = true;    // false: every activation gets its own buffer (for comparison)
  bool inplace = true;  // let in-place kernels write over dying inputs
  bool capture = true;  // capture and replay the step where the backend can
  bool fuse = true;     // offer the graph to the backend for fusion (get_capability)
  bool tune = true;     // with backend.kernels = "auto": time a node's candidate kernels
  bool channels_last = true;  // let the layout planner store 4-D activations NHWC where the
                              // kernels around them take it (false: every one NCHW)
  uint64_t seed = 0;    // for parameters and states this executable creates
  // Values something outside the graph works on between the kernel that writes them and the
  // first that reads them (data parallelism all-reduces the gradients there, GradientSync): no
  // fused kernel may both write and read one of them or hold one back past other nodes, and each
  // is written to memory.
  std::vector<Var> exchanged;
  // Inputs to allocate together, in this order, each at a multiple of 256 bytes (as the
  // allocator aligns every tensor): whoever fills them from one staging buffer then needs one
  // copy (StepPipeline: the labels and the step's scalars). Names the graph lacks are skipped.
  std::vector<std::string> input_block;
  // Bytes at the start of the block for the caller's own data (StepPipeline: the sample indices
  // it gathers the images by), so that one copy fills those too; the inputs follow, 256-aligned.
  uint64_t input_block_head = 0;
};

class Executable {
 public:
  // Throws OpError naming the node (and each kernel's reason) when the backend has no kernel
  // for a node, OutOfMemoryError when the plan does not fit.
  Executable(Backend& backend, const Graph& graph, TensorStore& store,
             ExecutableOptions options = {});
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  const Graph& graph() const { return graph_; }
  Backend& backend() const { return backend_; }
  const MemoryPlan& plan() const { return plan_; }

  // The tensor of a value: inputs, constants, parameters and states always; activations hold
  // the last run's data until the next run (outputs are never overwritten before the end).
  Tensor tensor(Var v) const;
  // By the name of an input, parameter, state or output. Throws Error naming it if unknown.
  Tensor tensor(std::string_view name) const;

  // Enqueues one step on the backend's stream (does not wait). The first run goes op by op;
  // where the backend can capture and every kernel is capturable, the second run records the
  // step and every later run replays it.
  void run() { run(Around{}); }
  // Work the caller enqueues on stream() just before and just after the step: a pipeline slot's
  // copies in and out. Where it only enqueues capturable stream work (`capturable`: kernels that
  // promise it, copies between device and pinned memory) and the step is captured, it is
  // recorded with the step, one graph per `variant` (each variant's work has its own addresses),
  // and a replay runs it and the step as one launch. Otherwise it runs around the step each time.
  struct Around {
    int32_t variant = 0;
    std::function<void()> before, after;
    bool capturable = false;
  };
  void run(const Around& around);
  // Waits for the stream.
  void sync();
  bool replaying() const { return !graphs_.empty(); }
  // Whether `around` would be recorded with the step (for reports and tests). A capture that
  // fails with the work around inside it (the backend refusing a copy, say) is not fatal: a
  // warning, and from then on that work runs outside the step's graph.
  bool captures(const Around& around) const {
    return around.capturable && can_capture_ && !around_refused_;
  }

  // "conv1 conv2d: cpu/im2col_blas" per kernel, for reports; a choice among several kernels
  // says how it was made: "(tuned: a 0.12 ms, b 0.31 ms)", "(cached)", "(ordered)".
  std::vector<std::string> kernel_names() const;

  // How each kernel that had several candidates was chosen, with the step's node name.
  struct KernelReport {
    std::string node, op, impl;
    bool library = false;
    KernelChoice choice;
    // A member of a fused group kept around another candidate than its fastest alone: the
    // group's timings as a whole (docs/training.md).
    std::vector<CandidateTime> group_times;
  };
  std::vector<KernelReport> kernel_choices() const;

  // ---- host hooks (data parallelism starts a gradient bucket's all-reduce after the kernel
  // that produces its last gradient, and waits for it before the first update that reads one) ----
  enum class HookPoint : uint8_t { Before, After };
  // `fn` runs on the host in every run(), just before (Before) or just after (After) kernel
  // `kernel` (0 .. num_kernels()-1, in run order) is enqueued. A hook that only enqueues work on
  // streams may be recorded with the step (capturable); any other hook turns capture off. Add
  // hooks before the first run(). Throws Error for an index out of range.
  void add_hook(int32_t kernel, HookPoint when, std::function<void()> fn, bool capturable = false);
  int32_t num_kernels() const;
  // The position of the kernel that runs `node` in the run order (a fused node: its group's);
  // -1 for a reshape, which runs no kernel.
  int32_t kernel_index(int32_t node) const;
  // The index of the kernel that writes `v` (following reshape views to their source); -1 for a
  // value no kernel writes (an input, parameter, state or constant).
  int32_t producer_kernel(Var v) const;
  // The smallest index among the kernels that read `v` or a view of it; -1 if none does.
  int32_t first_reader_kernel(Var v) const;
  // The stream the step runs on.
  plx_stream stream() const { return stream_; }
  // The block of ExecutableOptions::input_block's inputs (bytes, its head first); undefined
  // without one.
  const Tensor& input_block() const { return input_block_; }

 private:
  struct Fused;     // a group of nodes the backend runs as one kernel
  struct AbiGraph;  // the graph as the ABI's plx_graph_view, with the planned strides
  std::vector<Fused> fuse();
  // Creates the fused kernel of f (nodes, in and out set): its members' kernels chosen by the
  // host (among those `accept` admits) as hints, then create_fused. "" with f.kernel and
  // f.members set, or the backend's reason for declining; throws on other failures.
  std::string create_group(Fused& f, const AbiGraph& ag, const KernelFilter& accept);
  // The layout planner: stores 4-D activations channels-last where the kernels that write and
  // read them take it, creating those kernels again for the new strides (see the .cpp).
  void plan_layouts();
  void run_nodes();
  void run_step(const Around& around, bool inside);  // `inside`: recorded with the step
  void* graph_of(int32_t key) const;  // the captured graph of variant `key`, or null
  void plan_memory();

  Backend& backend_;
  const Graph& graph_;
  TensorStore& store_;
  ExecutableOptions options_;
  MemoryPlan plan_;
  std::vector<Tensor> tensors_;  // per value id (undefined for none)
  std::vector<plx_tensor> descs_;  // per value id: the ABI descriptor kernels are created with
  Tensor arena_, workspace_, input_block_;
  struct Step;  // a node ready to run: kernel and ABI views
  // "{node}: kernel K on 'backend' {what}; keep it out with ...".
  std::string blame(const Step& st, const std::string& what) const;
  // backend.check_kernels: waits for `st`'s kernel, and throws KernelFaultError naming it if the
  // stream fails, with `error` (the kernel's own, when its run threw) or the wait's.
  void check_kernel(const Step& st, const char* error);
  // Waits for the stream, for at most backend.step_timeout_s (then the process exits with
  // status 3 naming `st`'s kernel, or the graph's kernels when null).
  void wait_for_kernels(const Step* st);
  std::vector<Step> steps_;
  std::vector<int32_t> pos_;      // per node: where it runs (a fused node at its group's last)
  std::vector<int32_t> kernel_of_;  // per node: index of the kernel that runs it, -1 for none
  std::vector<char> internal_;    // per value: only read inside the fused kernel that writes it
  struct Hook {
    HookPoint when;
    std::function<void()> fn;
  };
  std::vector<std::vector<Hook>> hooks_;  // per kernel, in the order added
  plx_stream stream_ = nullptr;
  int64_t runs_ = 0;
  bool can_capture_ = false;
  bool check_kernels_ = false;   // backend.check_kernels: wait for each kernel, name a fault
  bool around_refused_ = false;  // capturing the work around the step failed once
  // Captured graphs by variant (-1: the step alone, with its work around it outside).
  std::vector<std::pair<int32_t, void*>> graphs_;
};

}  // namespace plexus
