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
    auto k = make_fused(*this, graph, b, dtype, flags, name);
    fused_.give(name, dtype, flags, std::move(k), kernel, state, workspace_bytes);
  }

 private:
  sdk::FusedTables fused_;
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
