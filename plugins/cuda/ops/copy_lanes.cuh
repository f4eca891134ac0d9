// Which lane of a block copies which 16-byte chunk of a shared-memory stage, for the Tensor Core
// kernels' cp.async copies (ops/igemm_conv.cuh, ops/mma_gemm.cu). Index math only, no PTX, so
// the CUDA emulator compiles it as it is.
#pragma once

namespace plexus::cuda {

// The row and 16-byte chunk that thread tid copies, for rows of Cpr chunks padded by one chunk
// (an odd pitch in chunks). A warp's 16-byte copies reach shared memory as four requests of 8
// lanes, each one wavefront only where its 8 chunks fall on distinct banks. Chunks first (lane l
// on chunk l % Cpr of row l / Cpr) does that for Cpr = 8: a request is one row. With Cpr <= 4 it
// puts 8 / Cpr rows in a request, and the pad wraps the second row onto the first's first chunk
// (two wavefronts, PLEXUS_EMU_ACCESS's count on the emulator); so there rows go first (lane l of
// warp w on row w·R + l % R, chunk l / R, R = 32 / Cpr rows a warp), and a request is 8 rows'
// same chunk, an odd pitch apart: 8 distinct chunks of the banks. The warp copies the same rows
// and chunks either way (the same global sectors), and each thread keeps one chunk column and
// rows THREADS / Cpr apart.
template <int Cpr>
__device__ __forceinline__ int copy_row(int tid) {
  if constexpr (Cpr <= 4) return (tid >> 5) * (32 / Cpr) + (tid & 31) % (32 / Cpr);
  else return tid / Cpr;
}
template <int Cpr>
__device__ __forceinline__ int copy_chunk(int tid) {
  if constexpr (Cpr <= 4) return (tid & 31) / (32 / Cpr);
  else return tid % Cpr;
}

}  // namespace plexus::cuda
