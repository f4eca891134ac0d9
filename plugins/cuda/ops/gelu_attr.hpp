// Which GELU a gelu or gelu_backward node asks for, as every CUDA kernel of the two reads it (the
// ops in ops/elementwise.cu, the GEMMs' GELU epilogues chosen in ops/fusion.cpp, gelu_backward
// with its bias sum in ops/pool.cu). Host code; the formulas are ops/gelu.cuh.
#pragma once

#include <string>

#include "common.hpp"

namespace plexus::cuda {

// True for approximate = "tanh", false for "none"; any other value is an error naming it.
inline bool gelu_tanh(const NodeInfo& node) {
  const std::string a = node.attr_string("approximate");
  PLX_REQUIRE(a == "none" || a == "tanh",
              "gelu: approximate must be \"none\" or \"tanh\", got \"%s\"", a.c_str());
  return a == "tanh";
}

}  // namespace plexus::cuda
