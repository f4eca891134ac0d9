// How a reduction walks its input, for kernel authors: x's dimensions (size-1 ones dropped) in
// groups of adjacent kept or reduced ones, each group merged into one row-major contiguous
// dimension. The CPU and CUDA reduction kernels both plan with it; the struct is a plain
// aggregate, so a CUDA kernel can take it by value.
#pragma once

#include <cstdint>

#include "plexus/abi/types.h"

namespace plexus::sdk {

struct ReducePlan {
  int nk = 0, nr = 0;  // kept and reduced groups
  int64_t kept_size[PLX_MAX_DIMS] = {}, kept_stride[PLX_MAX_DIMS] = {};  // outer first
  int64_t red_size[PLX_MAX_DIMS] = {}, red_stride[PLX_MAX_DIMS] = {};
  int64_t out_numel = 1, red_numel = 1;
  bool columns = false;  // the innermost group is kept (else reduced, or there is none)
};

// `reduced[i]`: whether x's dimension i is reduced. x is taken as row-major contiguous.
inline ReducePlan plan_reduction(const plx_tensor& x, const bool* reduced) {
  ReducePlan p;
  int64_t strides[PLX_MAX_DIMS] = {};
  for (int64_t i = x.ndim - 1, s = 1; i >= 0; --i) {
    strides[i] = s;
    s *= x.shape[i];
  }
  int last = -1;  // kind of the previous group: 0 kept, 1 reduced
  for (int32_t i = 0; i < x.ndim; ++i) {
    const int64_t n = x.shape[i];
    if (n == 1) continue;  // contributes nothing to either loop
    const int kind = reduced[i] ? 1 : 0;
    int& count = kind ? p.nr : p.nk;
    int64_t* sizes = kind ? p.red_size : p.kept_size;
    int64_t* strs = kind ? p.red_stride : p.kept_stride;
    if (kind == last) {  // contiguous with the previous dimension of the group
      sizes[count - 1] *= n;
      strs[count - 1] = strides[i];
    } else {
      sizes[count] = n;
      strs[count] = strides[i];
      ++count;
    }
    last = kind;
  }
  for (int k = 0; k < p.nk; ++k) p.out_numel *= p.kept_size[k];
  for (int k = 0; k < p.nr; ++k) p.red_numel *= p.red_size[k];
  p.columns = last == 0 && p.nr > 0;
  return p;
}

}  // namespace plexus::sdk
