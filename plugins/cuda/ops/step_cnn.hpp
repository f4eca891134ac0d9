// A small CNN's whole training step, forward and backward, as two launches (ops/step_cnn.cu),
// for fusion (ops/fusion.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common.hpp"

namespace plexus::cuda {

// The groups of a training graph that make_small_cnn_step() runs, each ascending: two layers of
// conv2d (stride 1, one group, no dilation) -> relu -> max_pool2d (relu_mask, windows of stride
// = kernel), flattened by a reshape into linear -> softmax_cross_entropy [with the argmax of the
// logits], and the whole backward of it: the loss's backward, the linear's dx, db and dw, the
// second layer's pool backward with its conv's data, weight and bias gradients, the first
// layer's with its weight and bias gradients (nothing reads the image's gradient). All f32. The
// two reshapes (views, which run nothing) stay outside the group: the group writes the pooled
// features and the linear's dx for them, and reads neither view.
std::vector<std::vector<int32_t>> find_small_cnn_steps(const sdk::GraphView& g);

// One such group (create_fused's view and boundary) as one kernel object: a block per image runs
// the image's forward and backward in shared memory, then a second launch sums the images'
// weight gradients in image order and reduces the loss. Declines (Unsupported) another group,
// attributes or dtypes it does not take, and an image whose activations do not fit in a block's
// shared memory.
std::unique_ptr<Kernel> make_small_cnn_step(CudaBackend& backend, const sdk::GraphView& g,
                                            const sdk::Boundary& b);

}  // namespace plexus::cuda
