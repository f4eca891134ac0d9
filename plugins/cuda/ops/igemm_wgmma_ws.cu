// The implicit-GEMM convolution's warp-specialized Hopper tiles (wgmma, sm_90a) in f16 and bf16:
// the persistent im2col tiles of the forward and backward data (igemm_wgmma_im2col_*_persistent)
// and the weight gradient's (igemm_wgmma_im2col_*_ws), apart from igemm_wgmma.cu so that nvcc
// builds both in parallel. Built
// for sm_90a alone (plugins/cuda/CMakeLists.txt, only when the plugin's architectures include
// 90), under names of their own (PLX_IGEMM_TU, see the header); the candidates decline devices
// other than 9.0.
#define PLX_IGEMM_TU hopper_ws
#include "ops/igemm_conv.cuh"

namespace plexus::cuda::igemm {

void add_wgmma_ws(KernelRegistry& r) {
  add_tiles<f16, Family::WarpSpec>(r);
  add_tiles<bf16, Family::WarpSpec>(r);
}

std::unique_ptr<Kernel> make_fwd_wgmma_ws(const NodeInfo& conv, CudaBackend& backend,
                                          const std::string& tile, bool relu, const Pool* pool,
                                          const char* op) {
  switch (static_cast<plx_dtype>(conv.input(0).dtype)) {
    case PLX_F16:
      return make_fwd_tiles<f16, Family::WarpSpec>(conv, backend, tile, relu, pool, op);
    case PLX_BF16:
      return make_fwd_tiles<bf16, Family::WarpSpec>(conv, backend, tile, relu, pool, op);
    default:
      break;
  }
  throw sdk::Unsupported(
      sdk::format("%s: the warp-specialized wgmma tiles take f16 or bf16, not %s", op,
                  dtype_name(static_cast<plx_dtype>(conv.input(0).dtype))));
}

}  // namespace plexus::cuda::igemm
