#include "plexus/dispatch.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "plexus/allocator.hpp"
#include "plexus/backend.hpp"
#include "plexus/error.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"

namespace plexus {

PreparedKernel::PreparedKernel(Backend& backend, std::string label, const plx_kernel* kernel,
                               void* state, uint64_t workspace_bytes)
    : backend_(backend),
      label_(std::move(label)),
      kernel_(kernel),
      state_(state),
      workspace_bytes_(workspace_bytes) {}

PreparedKernel::~PreparedKernel() { kernel_->destroy(state_); }

void PreparedKernel::run(const plx_tensor* inputs, int32_t num_inputs, const plx_tensor* outputs,
                         int32_t num_outputs, void* workspace, plx_stream stream) const {
  const plx_status s = kernel_->compute(state_, inputs, num_inputs, outputs, num_outputs, workspace,
                                        workspace_bytes_, stream);
  if (s != PLX_OK)
    backend_.fail(s, label_ + " (" + (kernel_->impl ? kernel_->impl : "?") + ")",
                  backend_.kernel_plugin(kernel_));
}

std::string no_kernel_message(const Backend& backend, const OpSchema& schema, plx_dtype dtype,
                              const std::vector<std::string>& declines) {
  std::string msg = "op '" + schema.name + "' (" + dtype_name(dtype) +
                    ") has no kernel on backend '" + backend.name() + "'";
  if (!declines.empty()) {
    msg += "; its kernels declined:";
    for (const auto& d : declines) msg += " [" + d + "]";
  } else {
    std::string have;
    for (int32_t d = 0; d < PLX_DTYPE_COUNT; ++d)
      if (backend.supports(schema.id, d)) have += (have.empty() ? "" : ", ") + std::string(dtype_name(d));
    if (!have.empty()) msg += " (it has kernels for: " + have + ")";
  }
  msg += "; set backend.fallback to run such ops on another backend";
  return msg;
}

namespace {

// What a kernel must take, as a fraction of the backend's first choice's time, to replace it.
constexpr double kTuneMargin = 0.9;

// Why a kernel of `source` is not offered a node that sets an attribute newer than its ABI.
std::string too_old(const LoadedPlugin& source, const std::string& newer) {
  return "plugin '" + source.name() + "' was built against plugin ABI " +
         std::to_string(source.abi_major()) + "." + std::to_string(source.abi_minor()) +
         ", before the node's " + newer + "; rebuild it against this SDK";
}

// Which of a node's inputs are present (an absent optional one has dtype PLX_DTYPE_NONE).
std::vector<bool> given_inputs(const std::vector<plx_tensor>& inputs) {
  std::vector<bool> given;
  for (const plx_tensor& t : inputs) given.push_back(t.dtype != PLX_DTYPE_NONE);
  return given;
}

// The ABI's view of a node, valid while its arguments live.
plx_node_info node_info(const OpSchema& schema, const std::vector<plx_tensor>& inputs,
                        const std::vector<plx_tensor>& outputs, const AttrPack& pack,
                        int32_t device) {
  plx_node_info node{};
  node.struct_size = sizeof node;
  node.device = device;
  node.op = schema.name.c_str();
  node.num_inputs = static_cast<int32_t>(inputs.size());
  node.inputs = inputs.data();
  node.num_outputs = static_cast<int32_t>(outputs.size());
  node.outputs = outputs.data();
  node.attrs = pack.data();
  node.num_attrs = pack.size();
  return node;
}

}  // namespace

KernelResolution resolve_kernel(Backend& backend, const OpSchema& schema,
                                const std::vector<plx_tensor>& inputs,
                                const std::vector<plx_tensor>& outputs, const Attrs& attrs,
                                int32_t device, bool tune, const KernelFilter& accept) {
  KernelResolution r;
  const int32_t dtype = inputs.empty() ? PLX_F32 : inputs[static_cast<size_t>(schema.type_input)].dtype;
  AttrPack pack(attrs);
  const plx_node_info node = node_info(schema, inputs, outputs, pack, device);

  // The order to try: the backend's, with the forced side's kernels first.
  KernelTuner& tuner = backend.runtime().tuner();
  const auto registered = backend.kernels(schema.id, dtype);
  std::vector<const plx_kernel*> order;
  for (const plx_kernel* k : registered) {
    std::string why = tuner.exclusion(k->impl ? k->impl : "?");
    if (why.empty() && accept) why = accept(*k);
    if (why.empty()) {
      order.push_back(k);
    } else {
      spdlog::debug("op '{}' ({}) on '{}': {} not tried: {}", schema.name, dtype_name(dtype),
                    backend.name(), k->impl ? k->impl : "?", why);
      r.declines.push_back(std::string(k->impl ? k->impl : "?") + ": " + why);
    }
  }
  const KernelSide side = tuner.side();
  if (side != KernelSide::Auto)
    std::stable_partition(order.begin(), order.end(), [&](const plx_kernel* k) {
      return is_library_kernel(*k) == (side == KernelSide::Library);
    });
  // With several kernels and the side "auto", a cached choice goes first.
  const bool several = order.size() > 1;
  bool cached = false;
  if (several && side == KernelSide::Auto) {
    r.choice.key = tune_key(backend, device, schema, inputs, outputs, attrs);
    if (const auto hit = tuner.lookup(r.choice.key)) {
      auto it = std::find_if(order.begin(), order.end(), [&](const plx_kernel* k) {
        return k->impl && *hit == k->impl;
      });
      if (it != order.end()) {
        std::rotate(order.begin(), it, it + 1);
        cached = true;
      }
    }
  }

  std::string newer;
  const uint16_t need_minor = schema::abi_minor_needed(schema, attrs, &newer, given_inputs(inputs));
  auto try_create = [&](const plx_kernel* k) -> std::unique_ptr<PreparedKernel> {
    void* state = nullptr;
    uint64_t ws = 0;
    // A kernel extension gets the ctx of the plugin that gave it, and explains itself there.
    const LoadedPlugin& source = backend.kernel_plugin(k);
    if (source.abi_minor() < need_minor) {
      r.declines.push_back(std::string(k->impl ? k->impl : "?") + ": " +
                           too_old(source, newer));
      return nullptr;
    }
    const plx_status s = k->create(backend.kernel_ctx(k), k->user, &node, &state, &ws);
    const char* impl = k->impl ? k->impl : "?";
    if (s == PLX_OK) {
      spdlog::trace("op '{}' ({}) on '{}': {} accepts (plugin {})", schema.name, dtype_name(dtype),
                    backend.name(), impl, source.name());
      return std::make_unique<PreparedKernel>(backend, "op '" + schema.name + "'", k, state, ws);
    }
    if (s != PLX_ERR_UNSUPPORTED)
      backend.fail(s, "creating kernel '" + std::string(impl) + "' for op '" + schema.name + "'",
                   source);
    const std::string why = source.last_error();
    spdlog::debug("op '{}' ({}) on '{}': {} declined: {}", schema.name, dtype_name(dtype),
                  backend.name(), impl, why);
    r.declines.push_back(std::string(impl) + ": " + why);
    return nullptr;
  };

  const bool time_them = tune && several && side == KernelSide::Auto && !cached;
  std::vector<std::unique_ptr<PreparedKernel>> accepted;
  for (size_t i = 0; i < order.size(); ++i) {
    auto k = try_create(order[i]);
    if (!k) continue;
    if (i == 0 && cached) {
      r.choice.how = KernelChoice::How::Cached;
      if (auto times = tuner.timed_here(r.choice.key)) {
        r.choice.how = KernelChoice::How::Tuned;
        r.choice.times = std::move(*times);
      }
      r.kernel = std::move(k);
      return r;
    }
    accepted.push_back(std::move(k));
    if (!time_them) break;
  }
  if (accepted.empty()) return r;
  if (accepted.size() == 1) {
    // Chosen by order only when others were not tried; when timing, the others declined.
    r.choice.how = several && !time_them ? KernelChoice::How::Ordered : KernelChoice::How::Only;
    r.kernel = std::move(accepted.front());
    return r;
  }

  // Time every kernel that accepted; the fastest runs the node and is remembered.
  size_t best = accepted.size();
  for (size_t i = 0; i < accepted.size(); ++i) {
    const plx_kernel& k = accepted[i]->kernel();
    CandidateTime t;
    t.impl = k.impl ? k.impl : "?";
    t.library = is_library_kernel(k);
    try {
      t.ms = time_kernel(backend, *accepted[i], inputs, outputs, device);
    } catch (const std::exception& e) {
      t.error = e.what();
      spdlog::warn("op '{}' ({}) on '{}': timing kernel {} failed, so it is not a candidate: {}",
                   schema.name, dtype_name(dtype), backend.name(), t.impl, t.error);
    }
    r.choice.times.push_back(std::move(t));
  }
  // The backend's first choice stays unless another is clearly faster: timings of kernels
  // within a few percent of each other flip with the machine's noise, and a choice that flips
  // between runs makes their results differ in the last bits for nothing.
  for (size_t i = 0; i < accepted.size(); ++i) {
    const double ms = r.choice.times[i].ms;
    if (ms < 0) continue;
    if (best == accepted.size()) {
      best = i;
    } else if (ms < r.choice.times[best].ms * (best == 0 ? kTuneMargin : 1.0)) {
      best = i;
    }
  }
  backend.allocator(device).release_cached();  // the scratch buffers are not the step's memory
  if (best == accepted.size()) {  // none could be timed: the backend's order
    r.choice.how = KernelChoice::How::Ordered;
    r.kernel = std::move(accepted.front());
    return r;
  }
  r.choice.how = KernelChoice::How::Tuned;
  tuner.remember(r.choice.key, r.choice.times[best].impl, r.choice.times[best].ms,
                 r.choice.times);
  spdlog::debug("op '{}' ({}) on '{}': tuned, {} is fastest ({:.4f} ms) of {}", schema.name,
                dtype_name(dtype), backend.name(), r.choice.times[best].impl,
                r.choice.times[best].ms, accepted.size());
  r.kernel = std::move(accepted[best]);
  sort_fastest_first(r.choice.times);
  return r;
}

std::vector<CandidateTime> time_all_kernels(Backend& backend, const OpSchema& schema,
                                            const std::vector<plx_tensor>& inputs,
                                            const std::vector<plx_tensor>& outputs,
                                            const Attrs& attrs, int32_t device, double budget_ms) {
  const int32_t dtype = inputs.empty() ? PLX_F32 : inputs[static_cast<size_t>(schema.type_input)].dtype;
  AttrPack pack(attrs);
  const plx_node_info node = node_info(schema, inputs, outputs, pack, device);
  std::vector<CandidateTime> out;
  std::string newer;
  const uint16_t need_minor = schema::abi_minor_needed(schema, attrs, &newer, given_inputs(inputs));
  const KernelTuner& tuner = backend.runtime().tuner();
  for (const plx_kernel* k : backend.kernels(schema.id, dtype)) {
    CandidateTime t;
    t.impl = k->impl ? k->impl : "?";
    t.library = is_library_kernel(*k);
    void* state = nullptr;
    uint64_t ws = 0;
    const LoadedPlugin& source = backend.kernel_plugin(k);
    if (std::string why = tuner.exclusion(t.impl); !why.empty()) {
      t.error = why;  // never created, so never run: a kernel excluded because it hangs or faults
      out.push_back(std::move(t));
      continue;
    }
    if (source.abi_minor() < need_minor) {
      t.error = "declined: " + too_old(source, newer);
      out.push_back(std::move(t));
      continue;
    }
    const plx_status s = k->create(backend.kernel_ctx(k), k->user, &node, &state, &ws);
    if (s != PLX_OK) {
      t.error = (s == PLX_ERR_UNSUPPORTED ? "declined: " : "failed: ") + source.last_error();
      out.push_back(std::move(t));
      continue;
    }
    PreparedKernel pk(backend, "op '" + schema.name + "'", k, state, ws);
    try {
      t.ms = time_kernel(backend, pk, inputs, outputs, device, budget_ms);
    } catch (const std::exception& e) {
      t.error = std::string("failed: ") + e.what();
    }
    out.push_back(std::move(t));
  }
  backend.allocator(device).release_cached();
  return out;
}

namespace {

// Copies the contents of `src` into `dst` (same shape and dtype), across backends if needed.
void copy_into(const Tensor& src, Tensor& dst) {
  std::vector<unsigned char> host(src.nbytes());
  src.copy_to_host(host.data());
  dst.copy_from_host(host.data());
}

std::vector<Tensor> run_on_fallback(Backend& from, Backend& fb, const OpSchema& s,
                                    const std::vector<Tensor>& inputs, const Attrs& attrs,
                                    plx_dtype dtype) {
  from.runtime().note_fallback(s.name, dtype, from.name());
  std::vector<Tensor> moved;
  for (const Tensor& t : inputs) moved.push_back(t.to(fb));
  std::vector<Tensor> outs = call(fb, s.name, moved, attrs);
  // Inputs the op writes in place get their new values back.
  for (size_t i = 0; i < inputs.size() && i < s.inputs.size(); ++i) {
    if ((s.inputs[i].flags & PLX_ARG_MUTATED) && inputs[i].defined()) {
      Tensor dst = inputs[i];
      copy_into(moved[i], dst);
    }
  }
  const int32_t device = inputs.empty() || !inputs[0].defined() ? 0 : inputs[0].device();
  for (Tensor& o : outs) o = o.to(from, device);
  return outs;
}

}  // namespace

std::vector<Tensor> call(Backend& backend, std::string_view op, const std::vector<Tensor>& inputs,
                         const Attrs& attrs) {
  const OpSchema& s = backend.runtime().ops().get(op);
  const Attrs full = s.complete_attrs(attrs);
  std::vector<TensorDesc> in_descs;
  int32_t device = -1;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    in_descs.push_back(t.defined() ? t.desc() : TensorDesc{});
    if (!t.defined()) continue;
    if (&t.backend() != &backend)
      throw OpError("op '" + s.name + "': input " + std::to_string(i) + " lives on backend '" +
                    t.backend().name() + "', the op runs on '" + backend.name() + "'");
    if (device < 0) device = t.device();
    if (t.device() != device)
      throw OpError("op '" + s.name + "': inputs on devices " + std::to_string(device) + " and " +
                    std::to_string(t.device()));
  }
  if (device < 0) device = 0;
  const std::vector<TensorDesc> out_descs = s.infer_outputs(in_descs, full);
  const plx_dtype dtype = in_descs.empty() ? PLX_F32 : in_descs[static_cast<size_t>(s.type_input)].dtype;

  // Kernels get contiguous inputs unless one of them accepts strides.
  bool strided_ok = false;
  for (const plx_kernel* k : backend.kernels(s.id, dtype))
    strided_ok = strided_ok || ((k->flags & PLX_KERNEL_STRIDED) &&
                                !backend.runtime().tuner().excluded_by(k->impl ? k->impl : "?"));
  std::vector<Tensor> ins = inputs;
  ins.resize(s.inputs.size());
  for (size_t i = 0; i < ins.size(); ++i) {
    if (!ins[i].defined() || strided_ok || ins[i].is_contiguous()) continue;
    if (s.inputs[i].flags & PLX_ARG_MUTATED)
      throw OpError("op '" + s.name + "': input '" + s.inputs[i].name +
                    "' is written in place and must be contiguous");
    if (s.name == "copy")  // contiguous() is this op: it would call itself forever
      throw OpError("op 'copy' on backend '" + backend.name() +
                    "': no kernel takes a non-contiguous input (PLX_KERNEL_STRIDED)");
    ins[i] = ins[i].contiguous();
  }

  std::vector<plx_tensor> in_views, out_views;
  for (const Tensor& t : ins) {
    plx_tensor v = t.view();
    v.data = nullptr;
    in_views.push_back(v);
  }
  for (const TensorDesc& d : out_descs) out_views.push_back(make_desc(d, device));

  KernelResolution r = resolve_kernel(backend, s, in_views, out_views, full, device);
  if (!r.kernel) {
    Backend* fb = backend.runtime().fallback_backend();
    if (fb && fb != &backend) return run_on_fallback(backend, *fb, s, ins, full, dtype);
    throw OpError(no_kernel_message(backend, s, dtype, r.declines));
  }

  std::vector<Tensor> outs;
  for (size_t i = 0; i < out_descs.size(); ++i) {
    outs.push_back(Tensor::empty(backend, out_descs[i].shape, out_descs[i].dtype, device));
    out_views[i] = outs.back().view();
  }
  for (size_t i = 0; i < ins.size(); ++i) in_views[i] = ins[i].view();

  const plx_stream stream = backend.stream(device);
  MemoryBlock* ws = nullptr;
  CachingAllocator* alloc = nullptr;
  if (r.kernel->workspace_bytes() > 0) {
    alloc = &backend.allocator(device);
    ws = alloc->allocate(r.kernel->workspace_bytes(), stream);
  }
  try {
    r.kernel->run(in_views.data(), static_cast<int32_t>(in_views.size()), out_views.data(),
                  static_cast<int32_t>(out_views.size()), ws ? ws->ptr : nullptr, stream);
  } catch (...) {
    if (alloc) alloc->free(ws);
    throw;
  }
  if (alloc) alloc->free(ws);  // stream-ordered: reused only by later work on this stream
  return outs;
}

}  // namespace plexus
