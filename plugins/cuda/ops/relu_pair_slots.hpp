// A fused layer -> relu pair as its kernels see it (linear -> relu: cuBLASLt's epilogue in
// gemm.cpp, the Hopper GEMM's in wgmma_gemm.cu; conv2d -> relu: cuDNN's fused convolution, bias
// and activation in conv.cpp): where the layer's inputs and the relu's output sit among the
// fused kernel's, and the layer's call made from the fused one.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common.hpp"
#include "plexus/sdk/fusion.hpp"

namespace plexus::cuda {

class ReluPairSlots {
 public:
  // Declines unless `g` is `layer` -> relu, only the relu reads the pre-activation, and the
  // relu's output is laid out as the layer's (the layer writes it in the layer's layout).
  ReluPairSlots(const sdk::GraphView& g, const sdk::Boundary& b, const char* layer) {
    PLX_DECLINE_UNLESS(g.num_nodes() == 2 && g.is(0, layer) && g.is(1, "relu"),
                       "not a %s -> relu pair", layer);
    const plx_graph_node& lin = g.node(0);
    const plx_graph_node& act = g.node(1);
    PLX_DECLINE_UNLESS(act.inputs[0] == lin.outputs[0] && b.output(lin.outputs[0]) < 0,
                       "%s's output is needed outside the pair", layer);
    out_ = b.output(act.outputs[0]);
    PLX_DECLINE_UNLESS(out_ >= 0, "relu's output is not among the fused outputs");
    const plx_tensor& pre = g.value(lin.outputs[0]);
    const plx_tensor& post = g.value(act.outputs[0]);
    bool same = pre.ndim == post.ndim && pre.dtype == post.dtype;
    for (int32_t i = 0; same && i < pre.ndim; ++i)
      same =
          pre.shape[i] == post.shape[i] && (pre.shape[i] == 1 || pre.strides[i] == post.strides[i]);
    PLX_DECLINE_UNLESS(same, "relu's output is not laid out as %s's", layer);
    for (int32_t k = 0; k < lin.num_inputs; ++k) {
      const int32_t v = lin.inputs[k];
      in_.push_back(g.valid(v) ? b.input(v) : -1);
      PLX_DECLINE_UNLESS(!g.valid(v) || in_.back() >= 0, "%s's input %d is not an input", layer, k);
    }
  }

  // The layer's call: its inputs (an absent bias as PLX_DTYPE_NONE) from the fused call's, its
  // output the relu's. Valid until the next call.
  KernelCall layer_call(const KernelCall& c) {
    args_.clear();
    for (int32_t k : in_) {
      plx_tensor t{};
      if (k >= 0)
        t = c.in(k);
      else
        t.dtype = PLX_DTYPE_NONE;
      args_.push_back(t);
    }
    y_.assign(1, c.out(out_));
    return KernelCall{args_.data(), static_cast<int32_t>(args_.size()),
                      y_.data(),    1,
                      c.workspace,  c.workspace_bytes,
                      c.stream};
  }
  // The relu's output as the last layer_call gave it, for a kernel run over it in place.
  const std::vector<plx_tensor>& output() const { return y_; }

 private:
  std::vector<int32_t> in_;  // the layer's inputs among the fused inputs (-1: absent bias)
  int32_t out_ = 0;
  std::vector<plx_tensor> args_, y_;  // per call
};

// A layer -> relu pair run as one kernel of the layer's that applies the ReLU itself (our own
// GEMMs' and convolution's epilogues, cuDNN's fused call), writing relu's output: the
// pre-activation is never stored.
class ReluPairKernel final : public Kernel {
 public:
  ReluPairKernel(ReluPairSlots slots, std::unique_ptr<Kernel> layer)
      : slots_(std::move(slots)), layer_(std::move(layer)) {}
  uint64_t workspace_bytes() const override { return layer_->workspace_bytes(); }
  void compute(const KernelCall& c) override { layer_->compute(slots_.layer_call(c)); }

 private:
  ReluPairSlots slots_;
  std::unique_ptr<Kernel> layer_;
};

}  // namespace plexus::cuda
