// Placeholder until the family's kernels land (same session).
#include "device.cuh"
namespace plexus::cuda {
void register_elementwise(KernelRegistry&) {}
}  // namespace plexus::cuda
