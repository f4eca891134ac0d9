// The implicit-GEMM convolution's Hopper tiles (igemm_wgmma_*: wgmma, sm_90a) in f16 and bf16:
// ops/igemm_conv.cuh's templates for those tiles. Built for sm_90a alone
// (plugins/cuda/CMakeLists.txt, only when the plugin's architectures include 90), under names of
// their own (PLX_IGEMM_TU, see the header); the candidates decline devices other than 9.0.
#define PLX_IGEMM_TU hopper
#include "ops/igemm_conv.cuh"

namespace plexus::cuda::igemm {

void add_wgmma(KernelRegistry& r) {
  add_tiles<f16, Family::Hopper>(r);
  add_tiles<bf16, Family::Hopper>(r);
}

std::unique_ptr<Kernel> make_fwd_wgmma(const NodeInfo& conv, CudaBackend& backend,
                                       const std::string& tile, bool relu, const Pool* pool,
                                       const char* op) {
  switch (static_cast<plx_dtype>(conv.input(0).dtype)) {
    case PLX_F16:
      return make_fwd_tiles<f16, Family::Hopper>(conv, backend, tile, relu, pool, op);
    case PLX_BF16:
      return make_fwd_tiles<bf16, Family::Hopper>(conv, backend, tile, relu, pool, op);
    default:
      break;
  }
  throw sdk::Unsupported(sdk::format("%s: the wgmma tiles take f16 or bf16, not %s", op,
                                     dtype_name(static_cast<plx_dtype>(conv.input(0).dtype))));
}

}  // namespace plexus::cuda::igemm
