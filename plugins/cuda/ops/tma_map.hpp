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

// A driver function of CUDA 12.0's API, of type Fn, from the driver the runtime loaded; null if
// it lacks it (TMA needs CUDA 12).
template <class Fn>
Fn driver_entry(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    f = nullptr;
  }
  return reinterpret_cast<Fn>(f);
}

// cuTensorMapEncodeTiled, fetched once.
inline PFN_cuTensorMapEncodeTiled_v12000 tma_encode_fn() {
  static const auto fn = driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled");
  return fn;
}

// The tensor-map element type of our 16-bit operands.
template <class T>
constexpr CUtensorMapDataType tma_dtype() {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "TMA operands: 16 bits");
  return std::is_same_v<T, bf16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// The aligned stand-in address the *_accepts checks encode a map with at creation, before a call
// gives the operand's own.
inline const void* tma_stand_in() {
  return reinterpret_cast<const void*>(uintptr_t{1} << 20);
}

// The swizzle whose rows are a box's inner `bytes` (128, 64 or 32): each box row is one swizzle
// row, the layout our wgmma descriptors read (ops/wgmma_desc.cuh).
inline CUtensorMapSwizzle tma_swizzle(uint32_t bytes) {
  return bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
         : bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                       : CU_TENSOR_MAP_SWIZZLE_32B;
}

// One 16-bit operand as its tensor map sees it: `outer` rows of `inner` contiguous elements, row
// stride `ld` elements, `batch` entries `bstride` elements apart (batch 1: the driver still
// checks bstride, so it is the whole matrix). Boxes of box_inner x box_outer elements, read with
// the swizzle of box_inner's bytes (64: the 128-byte swizzle, 32: the 64-byte one); the box's
// parts outside the tensor are zero-filled, and complete_tx still counts the whole box.
struct TmaOperand {
  uint64_t inner = 0, outer = 0, ld = 0, batch = 1, bstride = 0;
  uint32_t box_inner = 64, box_outer = 0, box_batch = 1;
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

// A convolution filter (O, KH, KW, C) channels-last, as (C, taps, O) with boxes of box_c (64 or
// 32) channels of one tap for box_o output channels: a box lands as box_o rows of box_c channels
// (one swizzle row each), the layout of a (O, K) row-major box of box_c k, with channels past C
// zero-filled instead of running into the next tap's.
inline TmaOperand tma_filter_by_tap(int64_t C, int64_t taps, int64_t O, uint32_t box_o,
                                    uint32_t box_c = 64) {
  TmaOperand o;
  o.box_inner = box_c;
  o.inner = o.ld = static_cast<uint64_t>(C);
  o.outer = static_cast<uint64_t>(taps);
  o.batch = static_cast<uint64_t>(O);
  o.bstride = o.ld * o.outer;
  o.box_outer = 1;
  o.box_batch = box_o;
  return o;
}

// Encodes o at ptr into m (3-D: inner, outer, batch); false where the driver refuses it (strides
// not multiples of 16 bytes, a misaligned address, dimensions past 2^32).
template <class T>
bool tma_encode(CUtensorMap& m, const TmaOperand& o, const void* ptr) {
  constexpr CUtensorMapDataType kType = tma_dtype<T>();
  const cuuint64_t dims[3] = {o.inner, o.outer, o.batch};
  const cuuint64_t strides[2] = {o.ld * sizeof(T), o.bstride * sizeof(T)};  // bytes, dims 1, 2
  const cuuint32_t box[3] = {o.box_inner, o.box_outer, o.box_batch};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return tma_encode_fn()(&m, kType, 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                         CU_TENSOR_MAP_INTERLEAVE_NONE,
                         tma_swizzle(o.box_inner * static_cast<uint32_t>(sizeof(T))),
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Whether the driver takes o at all: encoded once with a stand-in (aligned) address, so that a
// kernel declines at creation every shape its calls would be refused.
template <class T>
bool tma_accepts(const TmaOperand& o) {
  if (tma_encode_fn() == nullptr) return false;
  CUtensorMap m;
  return tma_encode<T>(m, o, tma_stand_in());
}

// cuTensorMapEncodeIm2col, fetched once.
inline PFN_cuTensorMapEncodeIm2col_v12000 tma_im2col_fn() {
  static const auto fn =
      driver_entry<PFN_cuTensorMapEncodeIm2col_v12000>("cuTensorMapEncodeIm2col");
  return fn;
}

// A channels-last activation (N, H, W, C) as the im2col tensor map of a convolution: `pixels`
// rows of a copy (the GEMM's A rows, in the order n, oh, ow), `channels` each (64: one 128-byte
// row of the 128-byte swizzle; 32: a 64-byte row of the 64-byte swizzle; channels past C are
// zero-filled). The bounding box holds the filter
// bases (the top-left tap's input pixel) of the rows: from lower past the tensor's first element
// to upper past its last, walked with the traversal strides (tw, th); a copy adds the tap as its
// im2col offsets. Pixels past the last image, and taps in the padding, are zero-filled.
struct TmaIm2col {
  int64_t N = 0, H = 0, W = 0, C = 0;
  int64_t lo_w = 0, lo_h = 0, up_w = 0, up_h = 0;
  int64_t tw = 1, th = 1;
  uint32_t pixels = 0, channels = 64;
};

// The rows of a convolution (KH x KW filter, strides sh, sw, padding ph, pw): every output
// pixel, OW x OH bases from (-pw, -ph) to (pw - (KW-1), ph - (KH-1)) past the last element.
inline TmaIm2col im2col_conv(int64_t N, int64_t H, int64_t W, int64_t C, int64_t KH, int64_t KW,
                             int64_t sh, int64_t sw, int64_t ph, int64_t pw, uint32_t pixels) {
  TmaIm2col o;
  o.N = N, o.H = H, o.W = W, o.C = C;
  o.lo_w = -pw, o.lo_h = -ph, o.up_w = pw - (KW - 1), o.up_h = ph - (KH - 1);
  o.tw = sw, o.th = sh;
  o.pixels = pixels;
  return o;
}

// The rows of one corner of a convolution's 2x2 pooling windows (stride 2, PH x PW windows): the
// bases of the windows' top-left pixels, every second output pixel along each axis (strides 2 sw,
// 2 sh) up to the last whole window; a copy adds the corner (dw·sw, dh·sh) to the tap.
inline TmaIm2col im2col_pool_corners(int64_t N, int64_t H, int64_t W, int64_t C, int64_t sh,
                                     int64_t sw, int64_t ph, int64_t pw, int64_t PH, int64_t PW,
                                     uint32_t pixels) {
  TmaIm2col o;
  o.N = N, o.H = H, o.W = W, o.C = C;
  o.lo_w = -pw, o.lo_h = -ph;
  o.up_w = -pw + 2 * sw * (PW - 1) - (W - 1), o.up_h = -ph + 2 * sh * (PH - 1) - (H - 1);
  o.tw = 2 * sw, o.th = 2 * sh;
  o.pixels = pixels;
  return o;
}

template <class T>
bool tma_encode_im2col(CUtensorMap& m, const TmaIm2col& o, const void* ptr) {
  constexpr CUtensorMapDataType kType = tma_dtype<T>();
  // The driver's limits for rank 4: corners in [-128, 127], traversal strides 1 to 8.
  const auto fits8 = [](int64_t v) { return v >= -128 && v <= 127; };
  if (!fits8(o.lo_w) || !fits8(o.lo_h) || !fits8(o.up_w) || !fits8(o.up_h) || o.tw < 1 ||
      o.tw > 8 || o.th < 1 || o.th > 8)
    return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(o.C), static_cast<cuuint64_t>(o.W),
                              static_cast<cuuint64_t>(o.H), static_cast<cuuint64_t>(o.N)};
  const cuuint64_t row = static_cast<cuuint64_t>(o.C) * sizeof(T);
  const cuuint64_t strides[3] = {row, row * dims[1], row * dims[1] * dims[2]};  // W, H, N
  const int lower[2] = {static_cast<int>(o.lo_w), static_cast<int>(o.lo_h)};
  const int upper[2] = {static_cast<int>(o.up_w), static_cast<int>(o.up_h)};
  const cuuint32_t elem_strides[4] = {1, static_cast<cuuint32_t>(o.tw),
                                      static_cast<cuuint32_t>(o.th), 1};
  return tma_im2col_fn()(&m, kType, 4, const_cast<void*>(ptr), dims, strides, lower, upper,
                         o.channels, o.pixels, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         tma_swizzle(o.channels * static_cast<uint32_t>(sizeof(T))),
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Whether the driver takes the im2col map o (a stand-in aligned address, as tma_accepts).
template <class T>
bool tma_im2col_accepts(const TmaIm2col& o) {
  if (tma_im2col_fn() == nullptr) return false;
  CUtensorMap m;
  return tma_encode_im2col<T>(m, o, tma_stand_in());
}

}  // namespace plexus::cuda
