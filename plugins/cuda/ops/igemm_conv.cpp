// The implicit-GEMM convolution's entry points (ops/igemm_conv.hpp): registration of every
// dtype's candidates, and the fused forwards (conv -> relu, conv -> [relu ->] 2x2 max pool)
// by the conv's dtype. The kernels are in ops/igemm_conv.cuh, built per dtype by
// igemm_conv_{f16,bf16,f32}.cu, and the Hopper tiles by igemm_wgmma.cu and
// igemm_wgmma_ws.cu (sm_90a).
#include "ops/igemm_conv.hpp"

namespace plexus::cuda {

namespace {

std::unique_ptr<Kernel> make_fwd_of(plx_dtype dtype, const NodeInfo& conv, CudaBackend& backend,
                                    const std::string& tile, bool relu, const igemm::Pool* pool,
                                    const char* op) {
  if (tile.rfind("igemm_wgmma_", 0) == 0) {
#ifdef PLEXUS_CUDA_WGMMA
    if (tile.ends_with("_persistent"))
      return igemm::make_fwd_wgmma_ws(conv, backend, tile, relu, pool, op);
    return igemm::make_fwd_wgmma(conv, backend, tile, relu, pool, op);
#else
    throw sdk::Unsupported(
        sdk::format("%s: the plugin was built without sm_90 (no tile '%s')", op, tile.c_str()));
#endif
  }
  switch (dtype) {
    case PLX_F16:
      return igemm::make_fwd_f16(conv, backend, tile, relu, pool, op);
    case PLX_BF16:
      return igemm::make_fwd_bf16(conv, backend, tile, relu, pool, op);
    case PLX_F32:
      return igemm::make_fwd_f32(conv, backend, tile, relu, pool, op);
    default:
      break;
  }
  throw sdk::Unsupported(sdk::format("%s: the igemm kernels take f16, bf16 or f32 (TF32), not %s",
                                     op, dtype_name(dtype)));
}

}  // namespace

std::unique_ptr<Kernel> make_igemm_conv_max_pool(CudaBackend& backend, const sdk::GraphView& g,
                                                 const sdk::Boundary& b, const std::string& tile,
                                                 plx_dtype& dtype) {
  igemm::Pool p;
  p.slots = sdk::conv_max_pool_slots(g, b);
  PLX_DECLINE_UNLESS(tile.rfind("igemm_", 0) == 0, "the host gave conv2d to %s, not igemm",
                     tile.empty() ? "the default kernel" : tile.c_str());
  const sdk::OwnedNodeInfo conv_info(g, p.slots.conv), pool_info(g, p.slots.pool);
  const NodeInfo conv(&conv_info.get()), pool(&pool_info.get());
  p.pool = &pool;
  dtype = p.slots.dtype;
  return make_fwd_of(dtype, conv, backend, tile, p.slots.relu >= 0, &p, "conv2d+max_pool2d");
}

std::unique_ptr<Kernel> make_igemm_conv(const NodeInfo& node, CudaBackend& backend,
                                        const std::string& tile, bool relu) {
  return make_fwd_of(static_cast<plx_dtype>(node.input(0).dtype), node, backend, tile, relu,
                     nullptr, "conv2d");
}

void register_igemm_conv(KernelRegistry& r) {
  igemm::add_f16(r);
  igemm::add_bf16(r);
  igemm::add_f32(r);
#ifdef PLEXUS_CUDA_WGMMA
  igemm::add_wgmma(r);
  igemm::add_wgmma_ws(r);
#endif
}

}  // namespace plexus::cuda
