// The classifier head as one kernel on CUDA (ops/linear_ce.cu), for fusion (ops/fusion.cpp).
#pragma once

#include <memory>

#include "common.hpp"

namespace plexus::cuda {

// linear -> [cast to f32] -> softmax_cross_entropy [-> argmax] [-> its backward], the group
// sdk::linear_cross_entropy_slots parses. Declines f64, and a weight that does not fit in
// shared memory. Sets `dtype` to the linear's.
std::unique_ptr<Kernel> make_linear_cross_entropy(CudaBackend& backend, const sdk::GraphView& g,
                                                  const sdk::Boundary& b, plx_dtype& dtype);

}  // namespace plexus::cuda
