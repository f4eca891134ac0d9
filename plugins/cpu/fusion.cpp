// The CPU backend's fusion (the contract is in sdk/fusion.hpp and abi/backend.h).
//
// It claims:
//  - the optimizer's per-parameter updates (every sgd_update, or every adamw_update, sharing
//    attributes, learning rate and check), run as one multi-tensor kernel: one parallel loop over all
//    parameters instead of one per parameter, so a step pays one OpenMP fork/join for its update;
//  - a layer whose output feeds only an activation (linear, conv2d, matmul, add, batch_norm,
//    batch_norm_apply or layer_norm, then relu, tanh, sigmoid or gelu): the layer writes into the
//    activation's output and the activation runs there in place, so the pre-activation tensor
//    is never allocated;
//  - the backward of ReLU with pooling: relu_backward feeding max_pool2d_backward, whose kernel
//    applies the ReLU's mask as it reads the gradient (ops/pool.cpp), so the masked gradient is
//    never written.
//  - a conv layer with its pool: conv2d [-> relu] -> max_pool2d, and in the backward
//    max_pool2d_backward -> conv2d_backward_data / conv2d_backward_weight / the bias sum
//    (sdk/fusion_conv_pool.hpp), run image by image (ops/conv_pool.cpp), so neither the pre-pool
//    output nor its gradient is ever written: they are a CNN's largest tensors. Claimed before
//    the epilogue chains, which would otherwise take the conv2d -> relu pair;
//  - the classifier head: linear -> [cast to f32] -> softmax_cross_entropy, with the argmax of
//    the logits and the loss's backward when the graph allows (sdk::find_linear_cross_entropy):
//    the linear's GEMM, then one pass per row for the loss, the argmax and dlogits
//    (ops/softmax.cpp), so neither the logits nor log_probs are written when only the group
//    reads them.
// All run the same element loops as the per-node kernels: fused and unfused steps agree to the
// bit (tests/core/test_fusion.cpp).
#include "common.hpp"

namespace plexus::cpu {

namespace {

const std::vector<std::string_view> kProducers = {"linear",     "conv2d",           "matmul",
                                                  "add",        "batch_norm",       "layer_norm",
                                                  "batch_norm_apply"};
const std::vector<std::string_view> kEpilogues = {"relu", "tanh", "sigmoid", "gelu"};

}  // namespace

void claim_fusions(const plx_graph_view& graph, plx_claim_fn claim, void* host_user) {
  const sdk::GraphView g(graph);
  // A refused claim (the core explains why in its debug log) leaves the nodes to run alone.
  for (const auto& grp : sdk::same_op_groups(g, "sgd_update", {3, 4}))
    claim(host_user, grp.data(), static_cast<int32_t>(grp.size()), "multi_tensor_sgd");
  for (const auto& grp : sdk::same_op_groups(g, "adamw_update", {4, 5, 6}))
    claim(host_user, grp.data(), static_cast<int32_t>(grp.size()), "multi_tensor_adamw");
  // A conv layer with its pool, forward and backward (before the ReLU/pool pairs and the
  // epilogue chains, which would take some of their nodes).
  for (const auto& grp : sdk::find_conv_max_pool(g))
    claim(host_user, grp.data(), static_cast<int32_t>(grp.size()),
          grp.size() == 3 ? "conv2d+relu+max_pool2d" : "conv2d+max_pool2d");
  for (const auto& grp : sdk::find_max_pool_conv_backward(g))
    claim(host_user, grp.data(), static_cast<int32_t>(grp.size()),
          "max_pool2d_backward+conv2d_backward");
  // The backward of ReLU with pooling: the pool's gradient reads the ReLU's mask as it goes.
  for (const auto& pair : sdk::find_feeding_pairs(g, "relu_backward", "max_pool2d_backward", 0))
    claim(host_user, pair.data(), 2, "relu_backward+max_pool2d_backward");
  // The classifier head: the largest of its groups the core accepts.
  for (const auto& head : sdk::find_linear_cross_entropy(g))
    for (const auto& grp : head.groups)
      if (claim(host_user, grp.data(), static_cast<int32_t>(grp.size()),
                "linear+softmax_cross_entropy") == PLX_OK)
        break;
  for (const auto& chain : sdk::find_epilogue_chains(g, kProducers, kEpilogues)) {
    std::string name;
    for (int32_t n : chain) name += (name.empty() ? "" : "+") + std::string(g.node(n).op);
    claim(host_user, chain.data(), static_cast<int32_t>(chain.size()), name.c_str());
  }
}

std::unique_ptr<Kernel> make_fused(sdk::Backend& backend, const plx_graph_view& graph,
                                   const sdk::Boundary& boundary, uint64_t chunk_bytes,
                                   plx_dtype& dtype, uint32_t& flags, std::string& name) {
  const sdk::GraphView g(graph);
  PLX_REQUIRE(g.num_nodes() >= 1, "create_fused: no nodes");
  if (g.is(0, "sgd_update") || g.is(0, "adamw_update")) {
    name = g.is(0, "sgd_update") ? "multi_tensor_sgd" : "multi_tensor_adamw";
    flags = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
    return make_multi_update(g, boundary, dtype);
  }
  const bool conv_pool = (g.is(0, "conv2d") && g.is(g.num_nodes() - 1, "max_pool2d")) ||
                         (g.is(0, "max_pool2d_backward") && g.num_nodes() >= 2);
  if (conv_pool && chunk_bytes > 0)
    return make_chunked_conv_pool(backend, g, boundary, chunk_bytes, dtype, flags, name);
  if (g.is(0, "conv2d") && g.is(g.num_nodes() - 1, "max_pool2d")) {
    name = g.num_nodes() == 3 ? "conv2d+relu+max_pool2d" : "conv2d+max_pool2d";
    flags = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
    return make_conv_max_pool(backend, g, boundary, dtype);
  }
  if (g.is(0, "max_pool2d_backward") && g.num_nodes() >= 2) {
    name = "max_pool2d_backward+conv2d_backward";
    flags = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
    return make_max_pool_conv_backward(backend, g, boundary, dtype);
  }
  if (g.is(0, "relu_backward")) {
    name = "relu_backward+max_pool2d_backward";
    flags = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
    return make_relu_max_pool_backward(g, boundary, dtype);
  }
  if (g.is(0, "linear") && g.num_nodes() >= 2 &&
      std::any_of(graph.nodes, graph.nodes + graph.num_nodes, [](const plx_graph_node& n) {
        return std::string_view(n.op) == "softmax_cross_entropy";
      })) {
    name = "linear+softmax_cross_entropy";
    flags = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE;
    return make_linear_cross_entropy(g, boundary, dtype);
  }
  auto chain = std::make_unique<sdk::EpilogueChain>(backend, g, boundary);
  dtype = static_cast<plx_dtype>(g.value(g.node(0).inputs[0]).dtype);
  flags = chain->flags();
  name.clear();
  for (int32_t n = 0; n < g.num_nodes(); ++n) name += (n ? "+" : "") + std::string(g.node(n).op);
  return chain;
}

}  // namespace plexus::cpu
