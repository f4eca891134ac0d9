// A small graph (input "x", output "y", and the outputs named in `also`) run on CUDA with the
// tuner's choice for one of its nodes pinned through the tuning cache, and on the CPU as the
// reference: how the fusion tests reach a fused group whose member the host gave to one
// particular candidate (the group's kernel follows the member's kernel_hint). Used by
// test_wgmma_gemm.cpp, test_cuda_conv_relu.cpp and test_cuda_linear_gelu.cpp.
#pragma once

#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/runtime.hpp"
#include "support/harness.hpp"

namespace plexus::test {

class PinnedKernelRun {
 public:
  using Build = std::function<void(Graph&)>;
  struct Result {
    std::vector<double> got, want;     // y on CUDA, on the CPU
    std::vector<std::vector<double>> also_got, also_want;  // the outputs in `also`, likewise
    std::vector<std::string> kernels;  // the CUDA executable's kernels
    Executable::KernelReport report;   // how the pinned node's kernel was chosen
  };

  // `node`: the name of the node to pin; `x`: the input's values; `seed`: the parameters' init;
  // `also`: other outputs of the graph to read back.
  PinnedKernelRun(const std::string& tag, Build build, std::string node, std::vector<double> x,
                  uint64_t seed, std::vector<std::string> also = {})
      : dir_(tag),
        build_(std::move(build)),
        node_(std::move(node)),
        x_(std::move(x)),
        seed_(seed),
        also_(std::move(also)) {
    // The node's tuning key, from a run that tunes it.
    Runtime rt(options(dir_ / "tuned.tsv"));
    TensorStore store;
    Executable::KernelReport rep;
    (void)once(rt.backend("cuda"), store, nullptr, nullptr, &rep, nullptr);
    key_ = rep.choice.key;
  }

  // The node's tuning key; empty if the node had nothing to choose between.
  const std::string& key() const { return key_; }

  // The graph on the CPU, then on CUDA with `impl` as the cached choice for the node (and the
  // CPU's parameters). `time_groups` false: a fused group around the node is not timed against
  // the group around the node's other candidates (ExecutableOptions::tune), so it follows the
  // pinned choice even where the backend declines the group around it.
  Result run(const std::string& impl, bool time_groups = true) {
    const std::string cache = dir_ / (impl + ".tsv");
    std::ofstream(cache) << key_ << "\t" << impl << "\t1\n";
    Runtime rt(options(cache));
    TensorStore store, cpu_store;
    Result r;
    r.want = once(rt.backend("cpu"), cpu_store, nullptr, nullptr, nullptr, &r.also_want);
    r.got = once(rt.backend("cuda"), store, &cpu_store, &r.kernels, &r.report, &r.also_got,
                 time_groups);
    return r;
  }

 private:
  static RuntimeOptions options(const std::string& cache) {
    RuntimeOptions o = plugin_dir_options();
    o.kernels = KernelSide::Auto;
    o.tune_cache = cache;
    return o;
  }

  std::vector<double> once(Backend& b, TensorStore& store, const TensorStore* params,
                           std::vector<std::string>* kernels, Executable::KernelReport* rep,
                           std::vector<std::vector<double>>* also, bool tune = true) {
    Graph g(b.runtime().ops());
    build_(g);
    ExecutableOptions eo;
    eo.seed = seed_;
    eo.tune = tune;
    Executable exe(b, g, store, eo);
    if (params)
      for (const auto& [name, t] : params->all()) fill(store.get(name), t.to_doubles());
    fill(exe.tensor("x"), x_);
    exe.run();
    exe.sync();
    if (kernels) *kernels = exe.kernel_names();
    if (rep)
      for (const Executable::KernelReport& k : exe.kernel_choices())
        if (k.node == node_) *rep = k;
    if (also)
      for (const std::string& name : also_) also->push_back(exe.tensor(name).to_doubles());
    return exe.tensor("y").to_doubles();
  }

  TempDir dir_;
  Build build_;
  std::string node_;
  std::vector<double> x_;
  uint64_t seed_;
  std::vector<std::string> also_;
  std::string key_;
};

}  // namespace plexus::test
