#include "plexus/backend.hpp"

#include <spdlog/spdlog.h>

#include "plexus/error.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus {

std::string caps_string(uint32_t caps) {
  static const std::pair<uint32_t, const char*> names[] = {
      {PLX_CAP_F16, "f16"},           {PLX_CAP_BF16, "bf16"},
      {PLX_CAP_F64, "f64"},           {PLX_CAP_PINNED, "pinned"},
      {PLX_CAP_MANAGED, "managed"},   {PLX_CAP_ASYNC, "async"},
      {PLX_CAP_GRAPH_CAPTURE, "graph-capture"}, {PLX_CAP_TENSOR_CORES, "tensor-cores"},
      {PLX_CAP_UNIFIED_HOST, "host-memory"}};
  std::string s;
  for (const auto& [bit, name] : names)
    if (caps & bit) s += (s.empty() ? "" : " ") + std::string(name);
  return s;
}

Backend::Backend(Runtime& runtime, LoadedPlugin& plugin, const plx_backend* table)
    : runtime_(runtime), plugin_(plugin), t_(table), name_(table->name) {
  device_count_ = t_->device_count(t_->ctx);
  if (device_count_ < 0) device_count_ = 0;
  if (device_count_ == 0 && t_->get_proc_address) {
    using ReasonFn = const char* (*)(void*);
    if (auto fn = reinterpret_cast<ReasonFn>(t_->get_proc_address(t_->ctx, "plexus.unavailable_reason")))
      if (const char* r = fn(t_->ctx)) unavailable_ = r;
  }
  if (device_count_ == 0 && unavailable_.empty()) unavailable_ = "the backend reports no device";
}

Backend::~Backend() {
  // Allocators first (they give memory back through the streams), then the streams.
  for (auto& [dev, s] : streams_) {
    if (t_->stream_sync(t_->ctx, s) != PLX_OK)
      spdlog::warn("backend '{}': stream of device {} failed at shutdown: {}", name_, dev,
                   plugin_.last_error());
  }
  allocators_.clear();
  for (auto& [dev, s] : streams_) t_->stream_destroy(t_->ctx, s);
}

DeviceInfo Backend::device(int32_t index) const {
  if (index < 0 || index >= device_count_)
    throw PluginError("backend '" + name_ + "' has no device " + std::to_string(index) + " (it has " +
                      std::to_string(device_count_) + ")");
  plx_device_props p{};
  p.struct_size = sizeof p;
  check(t_->device_props(t_->ctx, index, &p), "device_props");
  DeviceInfo d;
  d.index = index;
  p.name[sizeof p.name - 1] = '\0';
  d.name = p.name;
  d.total_memory = p.total_memory;
  d.free_memory = p.free_memory;
  d.compute_units = p.compute_units;
  d.arch_major = p.arch_major;
  d.arch_minor = p.arch_minor;
  d.caps = p.caps;
  d.alignment = p.alignment;
  return d;
}

CachingAllocator& Backend::allocator(int32_t device, plx_mem_kind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& a = allocators_[{device, static_cast<int32_t>(kind)}];
  if (!a) {
    if (device < 0 || device >= device_count_)
      throw PluginError("backend '" + name_ + "' has no device " + std::to_string(device));
    // The limit is on the device's own memory; pinned and managed memory are host memory.
    uint64_t limit = 0;
    if (kind == PLX_MEM_DEVICE) {
      const RuntimeOptions& o = runtime_.options();
      limit = o.memory_limit;
      if (limit == 0 && o.memory_fraction > 0) {
        plx_device_props p{};
        p.struct_size = sizeof p;
        check(t_->device_props(t_->ctx, device, &p), "device_props");
        limit = static_cast<uint64_t>(o.memory_fraction * static_cast<double>(p.total_memory));
      }
    }
    a = std::make_unique<CachingAllocator>(*this, device, kind, limit);
  }
  return *a;
}

void Backend::copy(int32_t device, void* dst, const void* src, uint64_t bytes, plx_copy_dir dir,
                   plx_stream stream) {
  if (bytes == 0) return;
  check(t_->mem_copy(t_->ctx, device, dst, src, bytes, dir, stream), "mem_copy");
}

void Backend::memset(int32_t device, void* dst, int32_t value, uint64_t bytes, plx_stream stream) {
  if (bytes == 0) return;
  check(t_->mem_set(t_->ctx, device, dst, value, bytes, stream), "mem_set");
}

plx_memory_stats Backend::memory_stats(int32_t device) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocators_.find({device, static_cast<int32_t>(PLX_MEM_DEVICE)});
  if (it == allocators_.end()) {
    plx_memory_stats s{};
    s.struct_size = sizeof s;
    s.limit = runtime_.options().memory_limit;
    return s;
  }
  return it->second->stats();
}

plx_stream Backend::stream(int32_t device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(device);
  if (it != streams_.end()) return it->second;
  if (device < 0 || device >= device_count_)
    throw PluginError("backend '" + name_ + "' has no device " + std::to_string(device));
  plx_stream s = nullptr;
  check(t_->stream_create(t_->ctx, device, &s), "stream_create");
  streams_.emplace(device, s);
  return s;
}

void Backend::sync(int32_t device) { sync_stream(stream(device)); }

void Backend::sync_stream(plx_stream s) { check(t_->stream_sync(t_->ctx, s), "stream_sync"); }

plx_stream Backend::create_stream(int32_t device) {
  if (device < 0 || device >= device_count_)
    throw PluginError("backend '" + name_ + "' has no device " + std::to_string(device));
  plx_stream s = nullptr;
  check(t_->stream_create(t_->ctx, device, &s), "stream_create");
  return s;
}

void Backend::destroy_stream(plx_stream s) noexcept {
  if (s) (void)t_->stream_destroy(t_->ctx, s);
}

plx_event Backend::create_event(int32_t device) {
  if (device < 0 || device >= device_count_)
    throw PluginError("backend '" + name_ + "' has no device " + std::to_string(device));
  plx_event e = nullptr;
  check(t_->event_create(t_->ctx, device, &e), "event_create");
  return e;
}

void Backend::destroy_event(plx_event e) noexcept {
  if (e) (void)t_->event_destroy(t_->ctx, e);
}

void Backend::record(plx_event e, plx_stream s) { check(t_->event_record(t_->ctx, e, s), "event_record"); }
void Backend::wait(plx_stream s, plx_event e) { check(t_->stream_wait_event(t_->ctx, s, e), "stream_wait_event"); }
void Backend::sync_event(plx_event e) { check(t_->event_sync(t_->ctx, e), "event_sync"); }
bool Backend::event_done(plx_event e) {
  int32_t done = 0;
  check(t_->event_query(t_->ctx, e, &done), "event_query");
  return done != 0;
}
double Backend::elapsed_ms(plx_event start, plx_event end) {
  float ms = 0;
  check(t_->event_elapsed_ms(t_->ctx, start, end, &ms), "event_elapsed_ms");
  return ms;
}

std::span<const plx_kernel* const> Backend::kernels(int32_t op_id, int32_t dtype) const {
  if (op_id < 0 || dtype < 0 || dtype >= PLX_DTYPE_COUNT) return {};
  const size_t i = static_cast<size_t>(op_id) * PLX_DTYPE_COUNT + static_cast<size_t>(dtype);
  if (i >= kernels_.size()) return {};
  return kernels_[i];
}

std::map<std::string, std::vector<plx_dtype>> Backend::supported_ops() const {
  std::map<std::string, std::vector<plx_dtype>> r;
  if (!ops_) return r;
  for (int32_t op = 0; op < ops_->size(); ++op)
    for (int32_t d = 0; d < PLX_DTYPE_COUNT; ++d)
      if (supports(op, d)) r[ops_->by_id(op).name].push_back(static_cast<plx_dtype>(d));
  return r;
}

namespace {
bool malformed(const plx_kernel* k) {
  return !k || k->struct_size < sizeof(plx_kernel) || !k->op || !k->create || !k->compute ||
         !k->destroy;
}
}  // namespace

const OpSchema* Backend::index_kernel(const plx_kernel* k) {
  const OpSchema* s = ops_->find(k->op);
  if (!s || !dtype_is_valid(k->dtype)) return nullptr;
  kernels_[static_cast<size_t>(s->id) * PLX_DTYPE_COUNT + static_cast<size_t>(k->dtype)].push_back(
      k);
  return s;
}

void Backend::index_kernels(const OpRegistry& ops) {
  ops_ = &ops;
  kernels_.assign(static_cast<size_t>(ops.size()) * PLX_DTYPE_COUNT, {});
  orphans_.clear();
  extension_from_.clear();
  const int32_t n = t_->kernel_count(t_->ctx);
  for (int32_t i = 0; i < n; ++i) {
    const plx_kernel* k = t_->get_kernel(t_->ctx, i);
    if (malformed(k)) {
      spdlog::warn("backend '{}' (plugin {}): kernel {} is malformed and ignored", name_,
                   plugin_.path(), i);
      continue;
    }
    if (!index_kernel(k)) {
      orphans_.push_back(std::string(k->op) + "/" + dtype_name(k->dtype));
      spdlog::warn("backend '{}': kernel '{}' for {} ({}) matches no op schema and is ignored",
                   name_, k->impl ? k->impl : "?", k->op, dtype_name(k->dtype));
    }
  }
}

std::string Backend::add_extension_kernel(const plx_kernel* k, LoadedPlugin& from) {
  if (!ops_) throw PluginError("backend '" + name_ + "': kernels are not indexed yet");
  if (malformed(k))
    return "its plx_kernel is malformed (too small, or without op, create, compute or destroy)";
  if (!index_kernel(k))
    return std::string("op '") + k->op + "' (" + dtype_name(k->dtype) + ") matches no op schema";
  extension_from_[k] = &from;
  return "";
}

LoadedPlugin& Backend::kernel_plugin(const plx_kernel* k) const {
  auto it = extension_from_.find(k);
  return it == extension_from_.end() ? plugin_ : *it->second;
}

void* Backend::kernel_ctx(const plx_kernel* k) const {
  auto it = extension_from_.find(k);
  return it == extension_from_.end() ? t_->ctx : it->second->ctx();
}

void Backend::fail(plx_status status, std::string_view what) const {
  fail(status, what, plugin_);
}

void Backend::fail(plx_status status, std::string_view what, const LoadedPlugin& reporter) const {
  std::string msg = "backend '" + name_ + "': " + std::string(what) + ": " +
                    plx_status_string(status);
  const std::string detail = reporter.last_error();
  if (!detail.empty()) msg += ": " + detail;
  switch (status) {
    case PLX_ERR_OUT_OF_MEMORY: throw OutOfMemoryError(msg);
    case PLX_ERR_INVALID_ARGUMENT:
    case PLX_ERR_UNSUPPORTED: throw OpError(msg);
    default: throw BackendError(msg);
  }
}

}  // namespace plexus
