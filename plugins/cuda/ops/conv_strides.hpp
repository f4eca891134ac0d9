// Element strides of a convolution's 4-D tensors in the two layouts the plugin's own
// convolutions take (igemm_conv.cuh, direct_conv.cu).
#pragma once

#include <cstdint>

namespace plexus::cuda {

// Canonical element strides of a logical (d0, d1, d2, d3) tensor stored NCHW contiguous or
// channels-last (NHWC in memory). For a tensor that satisfies both patterns (size-1 dimensions)
// the two give the same offsets for every valid index, so either choice is right.
inline void canonical_strides(const int64_t (&d)[4], bool channels_last, int64_t (&s)[4]) {
  if (channels_last) {
    s[0] = d[2] * d[3] * d[1], s[1] = 1, s[2] = d[3] * d[1], s[3] = d[1];
  } else {
    s[0] = d[1] * d[2] * d[3], s[1] = d[2] * d[3], s[2] = d[3], s[3] = 1;
  }
}

}  // namespace plexus::cuda
