// The CPU plugin: the correctness reference every other backend is held to, and an honest
// multi-threaded baseline (OpenMP for elementwise work, OpenBLAS for GEMM and convolution).
//
// Work runs synchronously on the calling thread (and its OpenMP team): a stream is an ordered
// queue that is always drained, so stream_sync and events are trivially complete and event
// times are host timestamps taken when the event is recorded.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common.hpp"

namespace plexus::cpu {
namespace {

struct CpuStream {
  int32_t device;
};
struct CpuEvent {
  std::chrono::steady_clock::time_point time{};
  bool recorded = false;
};

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string s = line.substr(colon + 1);
        s.erase(0, s.find_first_not_of(" \t"));
        return s;
      }
    }
  }
  return "unknown CPU";
}

uint64_t meminfo_bytes(const char* key) {
  std::ifstream f("/proc/meminfo");
  std::string k;
  uint64_t kb = 0;
  std::string unit;
  while (f >> k >> kb >> unit)
    if (k == key) return kb * 1024;
  return 0;
}

class CpuBackend final : public sdk::Backend {
 public:
  CpuBackend() : sdk::Backend("cpu") {
    register_activation(kernels());
    register_binary(kernels());
    register_reduce(kernels());
    register_conv(kernels());
    register_pool(kernels());
    register_gemm(kernels());
    register_softmax(kernels());
    register_norm(kernels());
    register_misc(kernels());
    register_optim(kernels());
  }

  int32_t device_count() override { return 1; }

  void device_props(int32_t device, plx_device_props& p) override {
    check_device(device);
    const std::string name = "CPU: " + cpu_model_name();
    std::snprintf(p.name, sizeof p.name, "%s", name.c_str());
    p.total_memory = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                     static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
    p.free_memory = meminfo_bytes("MemAvailable:");
    p.compute_units = threads();
    p.caps = PLX_CAP_F16 | PLX_CAP_BF16 | PLX_CAP_F64 | PLX_CAP_PINNED | PLX_CAP_MANAGED |
             PLX_CAP_UNIFIED_HOST;
    p.alignment = kAlignment;
  }

  void* mem_alloc(int32_t device, plx_mem_kind, uint64_t bytes, plx_stream) override {
    check_device(device);
    const uint64_t size = (std::max<uint64_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, size);
    if (!p) throw sdk::OutOfMemory(sdk::format("aligned_alloc of %llu bytes failed",
                                               static_cast<unsigned long long>(size)));
    return p;
  }
  void mem_free(int32_t, plx_mem_kind, void* ptr, plx_stream) override { std::free(ptr); }
  void mem_copy(int32_t, void* dst, const void* src, uint64_t bytes, plx_copy_dir,
                plx_stream) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void mem_set(int32_t, void* dst, int32_t value, uint64_t bytes, plx_stream) override {
    if (bytes) std::memset(dst, value, bytes);
  }
  void mem_info(int32_t device, uint64_t& free_bytes, uint64_t& total_bytes) override {
    check_device(device);
    free_bytes = meminfo_bytes("MemAvailable:");
    total_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                  static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  }

  plx_stream stream_create(int32_t device) override {
    check_device(device);
    return reinterpret_cast<plx_stream>(new CpuStream{device});
  }
  void stream_destroy(plx_stream s) override { delete reinterpret_cast<CpuStream*>(s); }
  void stream_sync(plx_stream) override {}
  void stream_wait_event(plx_stream, plx_event) override {}
  plx_event event_create(int32_t device) override {
    check_device(device);
    return reinterpret_cast<plx_event>(new CpuEvent{});
  }
  void event_destroy(plx_event e) override { delete reinterpret_cast<CpuEvent*>(e); }
  void event_record(plx_event e, plx_stream) override {
    auto* ev = reinterpret_cast<CpuEvent*>(e);
    ev->time = std::chrono::steady_clock::now();
    ev->recorded = true;
  }
  void event_sync(plx_event) override {}
  bool event_query(plx_event) override { return true; }
  bool has_fusion() const override { return true; }
  void get_capability(const plx_graph_view& graph, plx_claim_fn claim, void* user) override {
    claim_fusions(graph, claim, user);
  }
  void create_fused(const plx_graph_view& graph, const int32_t* inputs, int32_t num_inputs,
                    const int32_t* outputs, int32_t num_outputs, const plx_kernel** kernel,
                    void** state, uint64_t* workspace_bytes) override {
    const sdk::Boundary b(inputs, num_inputs, outputs, num_outputs);
    plx_dtype dtype = PLX_F32;
    uint32_t flags = 0;
    std::string name;
    auto k = make_fused(*this, graph, b, dtype, flags, name);
    fused_.give(name, dtype, flags, std::move(k), kernel, state, workspace_bytes);
  }

  float event_elapsed_ms(plx_event start, plx_event end) override {
    const auto* a = reinterpret_cast<CpuEvent*>(start);
    const auto* b = reinterpret_cast<CpuEvent*>(end);
    PLX_REQUIRE(a->recorded && b->recorded, "event_elapsed_ms: an event was never recorded");
    return std::chrono::duration<float, std::milli>(b->time - a->time).count();
  }

 private:
  static constexpr uint64_t kAlignment = 64;
  sdk::FusedTables fused_;
  static void check_device(int32_t device) {
    PLX_REQUIRE(device == 0, "the CPU backend has one device (0), not %d", device);
  }
};

class CpuPlugin final : public sdk::Plugin {
 public:
  explicit CpuPlugin(const sdk::HostContext& host) {
    host.check_options({"threads"});
    const int64_t n = host.option_int("threads", 0);
    PLX_REQUIRE(n >= 0 && n <= 4096, "option 'threads': expected 0 (all cores) to 4096, got %lld",
                static_cast<long long>(n));
    set_threads(static_cast<int>(n));
    add_backend(std::make_unique<CpuBackend>());
    add_comm(make_threads_communicator());
    PLX_LOG(PLX_LOG_DEBUG, "cpu", "CPU backend with %d threads, GEMM on %s", threads(),
            blas_description().c_str());
  }
};

}  // namespace
}  // namespace plexus::cpu

PLEXUS_PLUGIN(plexus::cpu::CpuPlugin, "cpu", "0.1.0",
              "CPU reference backend: OpenMP and OpenBLAS, f32/f64 and f16/bf16 storage")
