// The conv + max-pool fusions on CUDA: the SDK's chunked kernels (sdk/fusion_chunked.hpp, which
// says how they work and why) running this plugin's own conv, relu, pool and sum kernels a chunk
// of images at a time, fuse_chunk_bytes of pre-pool tensor per chunk (32 MiB by default). The
// pool takes in the conv's bias and the ReLU (where the ReLU runs after it), so the conv writes
// no bias first; the pool's backward sums the bias gradient; the per-chunk weight and bias
// gradients are added up by launch_chunk_accumulate (ops/conv_pool.cu).
#include "ops/conv_pool.hpp"

#include "plexus/sdk/fusion_chunked.hpp"

namespace plexus::cuda {

std::unique_ptr<Kernel> make_conv_max_pool(CudaBackend& backend, const sdk::GraphView& g,
                                           const sdk::Boundary& b, plx_dtype& dtype,
                                           uint32_t& flags, std::string& name) {
  return sdk::make_chunked_conv_max_pool(
      backend, g, b, backend.options().fuse_chunk_bytes, dtype, flags, name, make_max_pool_relu,
      backend.options().pool_bias ? sdk::PoolBiasReluMaker(make_max_pool_bias_relu)
                                  : sdk::PoolBiasReluMaker());
}

std::unique_ptr<Kernel> make_max_pool_conv_backward(CudaBackend& backend, const sdk::GraphView& g,
                                                    const sdk::Boundary& b, plx_dtype& dtype,
                                                    uint32_t& flags, std::string& name) {
  const int32_t device = g.device();
  auto accumulate = [device](plx_dtype dt, const void* part, float* acc, void* out, int64_t n,
                             sdk::ChunkAccum mode, plx_stream stream) {
    use_device(device);
    launch_chunk_accumulate(dt, part, acc, out, n, mode, native(stream));
  };
  const int sms = backend.context(device).prop.multiProcessorCount;
  auto pool_bias = [sms](const plx_node_info& pool, uint32_t& f) {
    return make_max_pool_backward_sum(pool, sms, f);
  };
  return sdk::make_chunked_max_pool_conv_backward(backend, g, b, backend.options().fuse_chunk_bytes,
                                                  accumulate, dtype, flags, name, pool_bias);
}

}  // namespace plexus::cuda
