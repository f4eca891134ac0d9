// The plugin's own direct convolution for layers with few input taps (ops/direct_conv.cu): the
// first layer of a network, where C = 1 or 3 and K = C·KH·KW is too short for a Tensor Core
// GEMM (the implicit-GEMM kernels need C % 8 == 0). Candidates "direct" for conv2d and
// conv2d_backward_weight in f32, f16 and bf16, registered after cuDNN (the autotuner or
// backend.kernels = "native" picks them). The conv2d candidate also takes small 3x3 layers with
// more taps, image by image (ops/direct_small.cu, declared below with its backward).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"

namespace plexus::cuda {

// Host-side pieces the direct kernels' two files (ops/direct_conv.cu, ops/direct_small.cu) share.
namespace direct {

inline bool fits_i32(int64_t v) {
  return v >= 0 && v <= INT32_MAX;
}
inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
// The device's SM count (at least 1).
int sm_count(CudaBackend& b, int32_t device);

// A max pool node's window as its attributes give it, two values each: the kernel, the stride
// (the kernel where none is given), the padding and the dilation. Requires two values of each
// (naming `op`).
struct PoolWindow {
  std::vector<int64_t> kernel, stride, pad, dil;
};
PoolWindow pool_window(const NodeInfo& pool, const char* op);

// A max pool's backward that a direct kernel unpools as it stages the pooled gradient: windows
// pkh x pkw of stride = kernel, no padding or dilation, so each conv pixel is in at most one
// window; dy and the indices (N, O, PH, PW) in their layouts' canonical strides.
struct Unpool2d {
  bool u8 = false;       // u8 window taps, else i32 positions in the conv's output plane
  bool dy_nhwc = false;  // dy channels-last
  int pkh = 1, pkw = 1, PH = 0, PW = 0;
  int64_t dy_n = 0, dy_c = 0, dy_p = 0;  // dy's element (n, o, p) at n·dy_n + o·dy_c + p·dy_p
  int64_t i_n = 0, i_c = 0, i_p = 0;     // the indices' likewise
};
// Declines (naming `op`) windows of other strides, padding or dilation, dy of another dtype than
// `dtype`, indices neither i32 nor u8, and layouts neither NCHW nor channels-last.
Unpool2d unpool_geometry(const NodeInfo& pool, const plx_tensor& dy, const plx_tensor& indices,
                         int64_t N, int64_t O, plx_dtype dtype, const char* op);

}  // namespace direct

// Adds the "direct" candidates to `r`; called by register_conv after the cuDNN kernels.
void register_direct_conv(KernelRegistry& r);

// A conv2d node's direct kernel, with the ReLU applied before the one rounding when `relu` (a
// fused conv2d -> relu whose conv the host gave to "direct"). Throws Unsupported (a decline)
// where the registered candidate would.
std::unique_ptr<Kernel> make_direct_conv(const NodeInfo& node, CudaBackend& backend, bool relu);

// A fused {conv2d, [relu,] max_pool2d} group (sdk::find_conv_max_pool) as one direct launch
// that pools the conv's values as it computes them: the pre-pool tensor never exists, and y and
// the indices are those of the direct conv, ReLU and pool kernels run one by one. Declines unless
// the host gave the conv to "direct" (`impl`). Sets `dtype`.
std::unique_ptr<Kernel> make_direct_conv_max_pool(CudaBackend& backend, const sdk::GraphView& g,
                                                  const sdk::Boundary& b, const std::string& impl,
                                                  plx_dtype& dtype);

// A fused {max_pool2d_backward, conv2d_backward_weight, [bias gradient sum]} group without
// conv2d_backward_data (sdk::find_max_pool_conv_backward: a first layer's backward with its
// pool) as one direct weight-gradient launch that unpools dy as it stages it, through the pool's
// indices: the unpooled gradient never exists. Windows of stride = kernel, no padding or
// dilation; declines unless the host gave the weight gradient to "direct". Sets `dtype`.
std::unique_ptr<Kernel> make_direct_pool_wgrad(CudaBackend& backend, const sdk::GraphView& g,
                                               const sdk::Boundary& b, const std::string& impl,
                                               plx_dtype& dtype);

// The fused group relu_backward(dy, y) -> {sum (the bias gradient), conv2d_backward_weight}, the
// backward of a first layer's conv -> relu, as one direct weight-gradient launch that masks dy as
// it reads it and sums it per channel beside dw: the masked gradient never exists. Declines
// unless the host gave the conv2d_backward_weight node to "direct" (`impl`, its kernel_hint's
// impl) and nothing outside the group reads the masked gradient. Sets `dtype`.
std::unique_ptr<Kernel> make_direct_relu_wgrad(CudaBackend& backend, const sdk::GraphView& g,
                                               const sdk::Boundary& b, const std::string& impl,
                                               plx_dtype& dtype);

// Small 3x3 convolutions image by image in shared memory (ops/direct_small.cu). The backward:
// a "direct" candidate for conv2d_backward_data (stride 1, padding 0 to 2, one image's dy planes
// and the filter within a block's shared memory), registered after the igemm and direct ones.
void register_direct_backward(KernelRegistry& r);

// The small convolutions' forward image by image (ops/direct_small.cu), where the first-layer
// kernels decline (K = C·KH·KW > 32): 3x3, stride 1, padding 0 to 2, an image's x planes and the
// filter within a block's shared memory; each thread a 2x2 tile of outputs for 4 (or 1) output
// channels. make_direct_conv and the "direct" conv2d candidate fall back to it; with the ReLU
// (`relu`) in its epilogue.
std::unique_ptr<Kernel> make_small_conv(const NodeInfo& node, CudaBackend& backend, bool relu);

// The same with the 2x2 stride-2 max pool after it (a {conv2d, [relu,] max_pool2d} group): each
// thread's tile is a pooling window, so the pre-pool tensor never exists; y and the indices are
// those of the small conv, ReLU and pool kernels run one by one. Sets `dtype`.
std::unique_ptr<Kernel> make_small_conv_max_pool(CudaBackend& backend, const sdk::GraphView& g,
                                                 const sdk::Boundary& b, plx_dtype& dtype);

// A fused {max_pool2d_backward, conv2d_backward_data, [conv2d_backward_weight], [bias gradient
// sum]} group (sdk::find_max_pool_conv_backward) as one launch of that kernel: each block stages
// an image's pooled gradient unpooled through the indices (windows of stride = kernel, no
// padding or dilation) and computes its dx, or its share of dw and db (⌈O/2⌉·C <= 256). The
// caller makes it where the host gave a member to "direct". Sets `dtype`.
std::unique_ptr<Kernel> make_direct_pool_backward(CudaBackend& backend, const sdk::GraphView& g,
                                                  const sdk::Boundary& b, plx_dtype& dtype);

}  // namespace plexus::cuda
