// Placeholder until the family's kernels land (same session).
#include "device.cuh"
namespace plexus::cuda {
void register_reduce(KernelRegistry&) {}
}  // namespace plexus::cuda
