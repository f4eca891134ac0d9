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

// Host memory, synchronous streams and host-timestamp events come from sdk::HostBackend.
class CpuBackend final : public sdk::HostBackend {
 public:
  CpuBackend() : sdk::HostBackend("cpu", "CPU: " + cpu_model_name()) {
    register_activation(kernels());
    register_binary(kernels());
    register_reduce(kernels());
    register_conv(kernels());
    register_conv_direct(kernels());  // after im2col: candidates for the tuner
    register_conv_winograd(kernels());
    register_pool(kernels());
    register_gemm(kernels());
    register_softmax(kernels());
    register_norm(kernels());
    register_misc(kernels());
    register_optim(kernels());
  }

  void device_props(int32_t device, plx_device_props& p) override {
    sdk::HostBackend::device_props(device, p);
    p.compute_units = threads();
    p.caps |= PLX_CAP_F16 | PLX_CAP_BF16 | PLX_CAP_F64 | PLX_CAP_PINNED | PLX_CAP_MANAGED;
  }
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
    auto k = make_fused(*this, graph, b, chunk_bytes_, dtype, flags, name);
    fused_.give(name, dtype, flags, std::move(k), kernel, state, workspace_bytes);
  }

  void set_fuse_chunk_bytes(uint64_t bytes) { chunk_bytes_ = bytes; }
  // "cpu.set_fuse_chunk_bytes", void (*)(void* backend_ctx, int64_t bytes): fuse_chunk_bytes for
  // graphs prepared from now on (the tests run the SDK's chunked kernels with it).
  void* get_proc_address(const char* name) override {
    if (std::string_view(name) == "cpu.set_fuse_chunk_bytes")
      return reinterpret_cast<void*>(+[](void* ctx, int64_t bytes) {
        static_cast<CpuBackend*>(ctx)->set_fuse_chunk_bytes(bytes > 0 ? static_cast<uint64_t>(bytes) : 0);
      });
    return nullptr;
  }

 private:
  sdk::FusedTables fused_;
  uint64_t chunk_bytes_ = 0;  // fuse_chunk_bytes: 0 runs the conv + pool groups image by image
};

class CpuPlugin final : public sdk::Plugin {
 public:
  explicit CpuPlugin(const sdk::HostContext& host) {
    host.check_options({"threads", "fuse_chunk_bytes"});
    const int64_t n = host.option_int("threads", 0);
    PLX_REQUIRE(n >= 0 && n <= 4096, "option 'threads': expected 0 (all cores) to 4096, got %lld",
                static_cast<long long>(n));
    const int64_t chunk = host.option_int("fuse_chunk_bytes", 0);
    PLX_REQUIRE(chunk >= 0, "option 'fuse_chunk_bytes': expected bytes >= 0, got %lld",
                static_cast<long long>(chunk));
    set_threads(static_cast<int>(n));
    auto backend = std::make_unique<CpuBackend>();
    backend->set_fuse_chunk_bytes(static_cast<uint64_t>(chunk));
    add_backend(std::move(backend));
    add_comm(make_threads_communicator());
    PLX_LOG(PLX_LOG_DEBUG, "cpu", "CPU backend with %d threads, GEMM on %s", threads(),
            blas_description().c_str());
  }
};

}  // namespace
}  // namespace plexus::cpu

PLEXUS_PLUGIN(plexus::cpu::CpuPlugin, "cpu", "0.1.0",
              "CPU reference backend: OpenMP and OpenBLAS, f32/f64 and f16/bf16 storage")
