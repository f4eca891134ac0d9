// Dispatch: resolving a kernel for a node once, and running ops eagerly.
//
// resolve_kernel() walks the backend's kernels for (op, dtype) in order of preference and keeps
// the first whose create() accepts the node (or, when a graph is prepared with backend.kernels =
// "auto", the fastest of those that accept); each decline is logged at debug level with its
// reason. A PreparedKernel then runs with a direct function-pointer call, no look-up.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/attrs.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/tensor.hpp"
#include "plexus/tune.hpp"

namespace plexus {

class Backend;

class PreparedKernel {
 public:
  // `label` names the kernel in errors: "op 'relu'", or "fused kernel 'linear+relu'".
  PreparedKernel(Backend& backend, std::string label, const plx_kernel* kernel, void* state,
                 uint64_t workspace_bytes);
  ~PreparedKernel();
  PreparedKernel(const PreparedKernel&) = delete;
  PreparedKernel& operator=(const PreparedKernel&) = delete;

  Backend& backend() const { return backend_; }
  const plx_kernel& kernel() const { return *kernel_; }
  const std::string& label() const { return label_; }  // "op 'relu'", "fused kernel '...'"
  uint64_t workspace_bytes() const { return workspace_bytes_; }

  // Enqueues the kernel; throws the backend's error (naming op and implementation) on failure.
  void run(const plx_tensor* inputs, int32_t num_inputs, const plx_tensor* outputs,
           int32_t num_outputs, void* workspace, plx_stream stream) const;

 private:
  Backend& backend_;
  std::string label_;
  const plx_kernel* kernel_;
  void* state_;
  uint64_t workspace_bytes_;
};

struct KernelResolution {
  std::unique_ptr<PreparedKernel> kernel;  // null if every kernel declined or none exists
  std::vector<std::string> declines;       // "impl: reason" per kernel that declined
  KernelChoice choice;                     // how it was chosen among several
};

// Which kernels may run a node, besides their own create(): "" to let `k` try, else why not
// (the layout planner passes one that admits only kernels taking channels-last tensors).
using KernelFilter = std::function<std::string(const plx_kernel& k)>;

// Tries the backend's kernels for the node, in the order the runtime's kernel side gives
// (plexus/tune.hpp). With `tune` (graphs, not eager calls) and the side "auto", every kernel that
// accepts the node is timed unless the tuning cache knows the problem, and the fastest is kept.
// Kernels `accept` turns away count as declines. Errors other than a decline are thrown.
KernelResolution resolve_kernel(Backend& backend, const OpSchema& schema,
                                const std::vector<plx_tensor>& inputs,
                                const std::vector<plx_tensor>& outputs, const Attrs& attrs,
                                int32_t device, bool tune = false, const KernelFilter& accept = {});

// Times every kernel the backend registers for the node, whichever side, on scratch buffers
// (time_kernel): one entry per kernel in the backend's order, with ms < 0 and the reason in
// `error` for those that decline ("declined: ...") or fail. For `plexus bench kernels`.
std::vector<CandidateTime> time_all_kernels(Backend& backend, const OpSchema& schema,
                                            const std::vector<plx_tensor>& inputs,
                                            const std::vector<plx_tensor>& outputs,
                                            const Attrs& attrs, int32_t device, double budget_ms);

// Runs `op` once on `backend`: completes attributes, infers outputs, resolves a kernel (falling
// back to the runtime's fallback backend if configured), allocates outputs and workspace, and
// enqueues the kernel on the backend's stream. Undefined tensors stand for absent optional
// inputs. Inputs must live on `backend` (any device index is taken from the first input).
// Non-contiguous inputs are made contiguous unless the kernel accepts strides.
std::vector<Tensor> call(Backend& backend, std::string_view op, const std::vector<Tensor>& inputs,
                         const Attrs& attrs = {});

// The error for an op with no kernel: names op, dtype, backend and each decline.
std::string no_kernel_message(const Backend& backend, const OpSchema& schema, plx_dtype dtype,
                              const std::vector<std::string>& declines);

}  // namespace plexus
