// Placeholder until the family's kernels land (same session).
#include "common.hpp"
namespace plexus::cuda {
void register_conv(KernelRegistry&) {}
}  // namespace plexus::cuda
