// The implicit-GEMM convolution candidates in bf16 (mma.sync m16n8k16): ops/igemm_conv.cuh's
// templates for this one dtype, a translation unit of their own so that nvcc builds the dtypes
// in parallel.
#include "ops/igemm_conv.cuh"

namespace plexus::cuda::igemm {

void add_bf16(KernelRegistry& r) {
  add_tiles<bf16>(r);
}

std::unique_ptr<Kernel> make_fwd_bf16(const NodeInfo& conv, CudaBackend& backend,
                                      const std::string& tile, bool relu, const Pool* pool,
                                      const char* op) {
  return make_fwd_tiles<bf16>(conv, backend, tile, relu, pool, op);
}

}  // namespace plexus::cuda::igemm
