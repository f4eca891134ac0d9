// The plugin's own implicit-GEMM convolution on the Tensor Cores (ops/igemm_conv.cuh): candidate
// kernels for conv2d, conv2d_backward_data and conv2d_backward_weight in f16, bf16 and f32
// (TF32), one per tile configuration, registered after the cuDNN kernels (so the
// first-accepting rule keeps cuDNN; the autotuner or backend.kernels = "native" picks these).
#pragma once

#include <memory>
#include <string>

#include "common.hpp"
#include "plexus/sdk/fusion_conv_pool.hpp"

namespace plexus::cuda {

// Adds the igemm_mma_* candidates to `r`, and the igemm_wgmma_* ones where they were built;
// called by register_conv after the cuDNN kernels.
void register_igemm_conv(KernelRegistry& r);

// A conv2d node's forward kernel with tile `tile` (an igemm_* impl name), with the ReLU in
// its epilogue when `relu` (a fused conv2d -> relu whose conv the host gave to that candidate).
// Throws Unsupported (a decline) where the registered candidate of that tile would.
std::unique_ptr<Kernel> make_igemm_conv(const NodeInfo& node, CudaBackend& backend,
                                        const std::string& tile, bool relu);

// A fused {conv2d, [relu,] max_pool2d} group (sdk::conv_max_pool_slots) whose conv the host gave
// to the igemm tile `tile`, as one launch that pools 2x2 windows of stride 2 in its epilogue: the
// pre-pool tensor never exists, and y and the indices are those of the igemm conv (its ReLU) and
// the pool kernel run one by one. Declines other windows and tiles. Sets `dtype`.
std::unique_ptr<Kernel> make_igemm_conv_max_pool(CudaBackend& backend, const sdk::GraphView& g,
                                                 const sdk::Boundary& b, const std::string& tile,
                                                 plx_dtype& dtype);

namespace igemm {

// A fused conv2d -> [relu ->] max_pool2d group for the forward's pool variant: the group's
// boundary slots, its pool node and whether a relu sits between the two.
struct Pool {
  sdk::ConvMaxPoolSlots slots;
  const NodeInfo* pool = nullptr;
};

// One dtype's candidates and forward factory, each in its own translation unit
// (igemm_conv_f16.cu, igemm_conv_bf16.cu, igemm_conv_f32.cu): `make_fwd_*` builds the forward
// kernel of tile `tile` with the ReLU and (pool non-null) the 2x2 pool in its epilogue; `op`
// names the node or group in a decline.
void add_f16(KernelRegistry& r);
void add_bf16(KernelRegistry& r);
void add_f32(KernelRegistry& r);
std::unique_ptr<Kernel> make_fwd_f16(const NodeInfo& conv, CudaBackend& backend,
                                     const std::string& tile, bool relu, const Pool* pool,
                                     const char* op);
std::unique_ptr<Kernel> make_fwd_bf16(const NodeInfo& conv, CudaBackend& backend,
                                      const std::string& tile, bool relu, const Pool* pool,
                                      const char* op);
std::unique_ptr<Kernel> make_fwd_f32(const NodeInfo& conv, CudaBackend& backend,
                                     const std::string& tile, bool relu, const Pool* pool,
                                     const char* op);
// The Hopper tiles (igemm_wgmma.cu, built for sm_90a where the plugin's architectures include
// 90, PLEXUS_CUDA_WGMMA): f16 and bf16, conv2d and conv2d_backward_data.
void add_wgmma(KernelRegistry& r);
std::unique_ptr<Kernel> make_fwd_wgmma(const NodeInfo& conv, CudaBackend& backend,
                                       const std::string& tile, bool relu, const Pool* pool,
                                       const char* op);
// Their warp-specialized tiles (igemm_wgmma_ws.cu, built likewise): the persistent im2col tiles
// of conv2d and conv2d_backward_data, and conv2d_backward_weight's _ws tiles.
void add_wgmma_ws(KernelRegistry& r);
std::unique_ptr<Kernel> make_fwd_wgmma_ws(const NodeInfo& conv, CudaBackend& backend,
                                          const std::string& tile, bool relu, const Pool* pool,
                                          const char* op);

}  // namespace igemm

}  // namespace plexus::cuda
