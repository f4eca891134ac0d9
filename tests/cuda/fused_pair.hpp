// A graph run twice on one backend over one parameter store: with fusion, and node by node. The
// fused-kernel tests hold a fused launch to the bits (or the rounding) of the kernels it
// replaces, and check which fused kernel the plugin gave the group.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "support/harness.hpp"

namespace plexus::test {

class FusedPair {
 public:
  // `options`: both executables' (the plain one's without fusion).
  FusedPair(Backend& b, const Graph& g, ExecutableOptions options = {})
      : fused_(b, g, store_, options), plain_(b, g, store_, unfused(options)) {}

  // The fused executable's kernels, one per line (for INFO and PLX_CONTAINS).
  std::string names() const {
    std::string s;
    for (const auto& k : fused_.kernel_names()) s += k + "\n";
    return s;
  }
  size_t kernel_count() const { return fused_.kernel_names().size(); }

  // Fills the named inputs of both and runs both to completion.
  void run(const std::vector<std::pair<const char*, std::vector<double>>>& inputs) {
    for (Executable* e : {&fused_, &plain_}) {
      for (const auto& [name, v] : inputs) fill(e->tensor(name), v);
      e->run();
      e->sync();
    }
  }

  // Output `name` of both, contiguous, as host bytes.
  std::pair<std::vector<uint8_t>, std::vector<uint8_t>> bytes(const char* name) {
    return {host_bytes(fused_.tensor(name)), host_bytes(plain_.tensor(name))};
  }

  Executable& fused() { return fused_; }
  Executable& plain() { return plain_; }
  TensorStore& store() { return store_; }

  // The graph on `cpu` with the parameters these runs used and the named inputs, run to
  // completion: the CPU reference (kept until the next call).
  Executable& reference(Backend& cpu, const Graph& g,
                        const std::vector<std::pair<const char*, std::vector<double>>>& inputs) {
    ref_.reset();
    ref_store_ = std::make_unique<TensorStore>();
    ref_ = std::make_unique<Executable>(cpu, g, *ref_store_, ExecutableOptions{});
    for (const auto& [name, t] : store_.all()) fill(ref_store_->get(name), t.to_doubles());
    for (const auto& [name, v] : inputs) fill(ref_->tensor(name), v);
    ref_->run();
    ref_->sync();
    return *ref_;
  }

 private:
  static ExecutableOptions unfused(ExecutableOptions o) {
    o.fuse = false;
    return o;
  }
  static std::vector<uint8_t> host_bytes(const Tensor& t) {
    const Tensor h = t.contiguous().to(cpu());
    std::vector<uint8_t> b(h.nbytes());
    h.copy_to_host(b.data());
    return b;
  }

  TensorStore store_;
  Executable fused_, plain_;
  std::unique_ptr<TensorStore> ref_store_;  // before ref_, which holds a reference to it
  std::unique_ptr<Executable> ref_;
};

// x -> conv2d (3x3, `padding`, with bias) -> [relu ->] max_pool2d(`pool`) in dtype d, outputs
// "y" and "idx": the forward of a conv layer with its pool, as the fusion tests build it.
inline void add_conv_relu_pool(Graph& g, plx_dtype d, const Shape& x, int64_t o, int64_t padding,
                               bool relu, const Attrs& pool) {
  const Var in = g.input("x", {d, x});
  const Var w = g.parameter("c.weight", {d, {o, x[1], 3, 3}}, init::kaiming_uniform(x[1] * 9));
  const Var b = g.parameter("c.bias", {d, {o}}, init::uniform(-0.3, 0.3));
  Var v = g.add1("conv2d", {in, w, b}, Attrs{{"padding", Ints{padding, padding}}}, "c");
  if (relu) v = g.add1("relu", {v}, {}, "c.relu");
  const std::vector<Var> p = g.add("max_pool2d", {v}, pool, "c.pool");
  g.mark_output(p[0], "y");
  g.mark_output(p[1], "idx");
}

}  // namespace plexus::test
