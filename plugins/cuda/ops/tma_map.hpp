// The host side of the TMA (the tensor copy engine) for our Hopper kernels: the Hopper GEMM
// (ops/wgmma_gemm.cu) and the implicit-GEMM convolution's wgmma tiles (ops/igemm_conv.cuh).
// A tensor map holds its operand's global address, which is only known when a kernel is called,
// so the kernels encode theirs on the host per call (cuTensorMapEncodeTiled is a pure host
// function) and pass them as __grid_constant__ parameters: a captured graph keeps its own copy.
// libcuda is not linked: the function comes from the driver the runtime already loaded.
#pragma once

#include <cuda.h>          // CUtensorMap and its enums (types only)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "device.cuh"

namespace plexus::cuda {

// cuTensorMapEncodeTiled, fetched once; null if the driver lacks it (TMA needs CUDA 12).
inline PFN_cuTensorMapEncodeTiled_v12000 tma_encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// One 16-bit operand as its tensor map sees it: `outer` rows of `inner` contiguous elements, row
// stride `ld` elements, `batch` entries `bstride` elements apart (batch 1: the driver still
// checks bstride, so it is the whole matrix). Boxes of box_inner x box_outer elements, read with
// the 128-byte swizzle (box_inner 64: one 128-byte swizzle row); the box's parts outside the
// tensor are zero-filled, and complete_tx still counts the whole box.
struct TmaOperand {
  uint64_t inner = 0, outer = 0, ld = 0, batch = 1, bstride = 0;
  uint32_t box_inner = 64, box_outer = 0;
};

// A matrix (batch 1) of `outer` rows of `inner` contiguous elements, in boxes of 64 x box_outer.
inline TmaOperand tma_matrix(int64_t inner, int64_t outer, uint32_t box_outer) {
  TmaOperand o;
  o.inner = o.ld = static_cast<uint64_t>(inner);
  o.outer = static_cast<uint64_t>(outer);
  o.bstride = o.ld * o.outer;
  o.box_outer = box_outer;
  return o;
}

// Encodes o at ptr into m (3-D: inner, outer, batch); false where the driver refuses it (strides
// not multiples of 16 bytes, a misaligned address, dimensions past 2^32).
template <class T>
bool tma_encode(CUtensorMap& m, const TmaOperand& o, const void* ptr) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "TMA operands: 16 bits");
  constexpr CUtensorMapDataType kType = std::is_same_v<T, bf16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const cuuint64_t dims[3] = {o.inner, o.outer, o.batch};
  const cuuint64_t strides[2] = {o.ld * sizeof(T), o.bstride * sizeof(T)};  // bytes, dims 1, 2
  const cuuint32_t box[3] = {o.box_inner, o.box_outer, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return tma_encode_fn()(&m, kType, 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Whether the driver takes o at all: encoded once with a stand-in (aligned) address, so that a
// kernel declines at creation every shape its calls would be refused.
template <class T>
bool tma_accepts(const TmaOperand& o) {
  if (tma_encode_fn() == nullptr) return false;
  CUtensorMap m;
  return tma_encode<T>(m, o, reinterpret_cast<const void*>(uintptr_t{1} << 20));
}

}  // namespace plexus::cuda
