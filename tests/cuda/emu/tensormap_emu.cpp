// The CUDA emulator's cuTensorMapEncodeTiled (cuda.h), modelled from the driver API reference
// ("Tensor Map Object Management"): every requirement it lists on the arguments is checked, and a
// violated one returns CUDA_ERROR_INVALID_VALUE with the reason on stderr, as the other emulated
// libraries report theirs. The map it writes (plx_emu_tensormap.hpp) is what the emulated TMA
// reads (runtime.cpp).
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda.h"
#include "plx_emu.hpp"
#include "plx_emu_tensormap.hpp"

namespace plx_emu {

const TensorMap& tensor_map(const void* p, const char* what) {
  if (!p || reinterpret_cast<uintptr_t>(p) % 64 != 0)
    trap((std::string(what) + ": the tensor map's address is not 64-byte aligned").c_str());
  const auto* m = static_cast<const TensorMap*>(p);
  if (m->magic != TensorMap::kMagic)
    trap((std::string(what) + ": the operand is not a tensor map cuTensorMapEncodeTiled wrote")
             .c_str());
  return *m;
}

namespace {

// The encoder being checked (cuTensorMapEncodeTiled or cuTensorMapEncodeIm2col), for refuse.
const char* g_encoder = "cuTensorMapEncodeTiled";

CUresult refuse(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "cuda emulator: %s: %s\n", g_encoder, buf);
  return CUDA_ERROR_INVALID_VALUE;
}

// Bytes per element; 0 for the packed 4- and 6-bit types, which the emulator does not model.
int element_bytes(CUtensorMapDataType t) {
  switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8:
      return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
      return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
      return 4;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

bool is_float(CUtensorMapDataType t) {
  switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
      return true;
    default:
      return false;
  }
}

}  // namespace
}  // namespace plx_emu

namespace plx_emu {
namespace {

// The requirements both encoders share (the driver API reference lists them for each); on
// success `esize` is the element size and `m` holds everything but the box. inner_elems: the
// box's inner extent (boxDim[0], or an im2col map's channels per pixel).
CUresult check_common(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                      cuuint32_t tensorRank, void* globalAddress, const cuuint64_t* globalDim,
                      const cuuint64_t* globalStrides, const cuuint32_t* elementStrides,
                      CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                      CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill,
                      cuuint32_t inner_elems, TensorMap& m) {
  if (!tensorMap || reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0)
    return refuse("tensorMap must be aligned to 64 bytes");
  if (tensorDataType < CU_TENSOR_MAP_DATA_TYPE_UINT8 ||
      tensorDataType > CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B)
    return refuse("tensorDataType %d is no CUtensorMapDataType", static_cast<int>(tensorDataType));
  const int esize = plx_emu::element_bytes(tensorDataType);
  if (esize == 0)
    return refuse("tensorDataType %d (packed 4- or 6-bit values) is not modelled by the emulator",
                  static_cast<int>(tensorDataType));
  if (interleave < CU_TENSOR_MAP_INTERLEAVE_NONE || interleave > CU_TENSOR_MAP_INTERLEAVE_32B)
    return refuse("interleave %d is no CUtensorMapInterleave", static_cast<int>(interleave));
  if (swizzle < CU_TENSOR_MAP_SWIZZLE_NONE || swizzle > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B)
    return refuse("swizzle %d is no CUtensorMapSwizzle", static_cast<int>(swizzle));
  if (l2Promotion < CU_TENSOR_MAP_L2_PROMOTION_NONE ||
      l2Promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B)
    return refuse("l2Promotion %d is no CUtensorMapL2promotion", static_cast<int>(l2Promotion));
  if (oobFill < CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE ||
      oobFill > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)
    return refuse("oobFill %d is no CUtensorMapFloatOOBfill", static_cast<int>(oobFill));
  if (tensorRank == 0 || tensorRank > 5) return refuse("tensorRank %u must be 1 to 5", tensorRank);
  if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && tensorRank < 3)
    return refuse("tensorRank %u must be at least 3 with an interleaved layout", tensorRank);
  if (!globalDim || !elementStrides || (tensorRank > 1 && !globalStrides))
    return refuse("a null array argument");
  const bool i32 = interleave == CU_TENSOR_MAP_INTERLEAVE_32B;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(globalAddress);
  if (addr % (i32 ? 32 : 16) != 0)
    return refuse("globalAddress %p must be %d-byte aligned", globalAddress, i32 ? 32 : 16);
  for (cuuint32_t i = 0; i < tensorRank; ++i)
    if (globalDim[i] == 0 || globalDim[i] > (cuuint64_t{1} << 32))
      return refuse("globalDim[%u] = %llu must be 1 to 2^32", i,
                    static_cast<unsigned long long>(globalDim[i]));
  // globalStrides[i] is dimension i + 1's stride in bytes; each includes the one before it
  // (globalStrides[0] >= globalDim[0] * element size, globalStrides[i] >= globalStrides[i - 1] *
  // globalDim[i], the rest padding).
  for (cuuint32_t i = 0; i + 1 < tensorRank; ++i) {
    const cuuint64_t s = globalStrides[i];
    if (s % (i32 ? 32 : 16) != 0 || s >= (cuuint64_t{1} << 40))
      return refuse("globalStrides[%u] = %llu must be a multiple of %d below 2^40", i,
                    static_cast<unsigned long long>(s), i32 ? 32 : 16);
    const unsigned __int128 inner =
        i == 0 ? static_cast<unsigned __int128>(globalDim[0]) * esize
               : static_cast<unsigned __int128>(globalStrides[i - 1]) * globalDim[i];
    if (s < inner)
      return refuse("globalStrides[%u] = %llu is smaller than the dimensions inside it", i,
                    static_cast<unsigned long long>(s));
  }
  for (cuuint32_t i = 0; i < tensorRank; ++i)
    if (elementStrides[i] == 0 || elementStrides[i] > 8)
      return refuse("elementStrides[%u] = %u must be 1 to 8", i, elementStrides[i]);
  const cuuint64_t inner_bytes = static_cast<cuuint64_t>(inner_elems) * esize;
  if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE) {
    if (inner_bytes % 16 != 0)
      return refuse("the box's inner extent * element size = %llu bytes must be a multiple of 16",
                    static_cast<unsigned long long>(inner_bytes));
    const cuuint64_t span = swizzle == CU_TENSOR_MAP_SWIZZLE_32B    ? 32
                            : swizzle == CU_TENSOR_MAP_SWIZZLE_64B  ? 64
                            : swizzle == CU_TENSOR_MAP_SWIZZLE_NONE ? 0
                                                                    : 128;
    if (span && inner_bytes > span)
      return refuse("the box's inner dimension (%llu bytes) exceeds the swizzle's %llu bytes",
                    static_cast<unsigned long long>(inner_bytes),
                    static_cast<unsigned long long>(span));
  }
  if (i32 && swizzle != CU_TENSOR_MAP_SWIZZLE_32B)
    return refuse("an interleave of 32 bytes needs CU_TENSOR_MAP_SWIZZLE_32B");
  if (oobFill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA &&
      !plx_emu::is_float(tensorDataType))
    return refuse("the NaN out-of-bounds fill needs a floating-point tensorDataType");

  m = TensorMap{};
  m.magic = TensorMap::kMagic;
  m.address = addr;
  m.rank = static_cast<uint8_t>(tensorRank);
  m.dtype = static_cast<uint8_t>(tensorDataType);
  m.elem_bytes = static_cast<uint8_t>(esize);
  m.interleave = static_cast<uint8_t>(interleave);
  m.swizzle = static_cast<uint8_t>(swizzle);
  m.oob_nan = oobFill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
  m.strides[0] = static_cast<uint64_t>(esize);
  for (cuuint32_t i = 0; i < tensorRank; ++i) {
    m.dims[i] = globalDim[i];
    if (i > 0) m.strides[i] = globalStrides[i - 1];
    m.elem_strides[i] = static_cast<uint8_t>(elementStrides[i]);
  }
  return CUDA_SUCCESS;
}

CUresult write_map(CUtensorMap* tensorMap, const TensorMap& m) {
  std::memset(tensorMap, 0, sizeof *tensorMap);
  std::memcpy(tensorMap, &m, sizeof m);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace plx_emu

CUresult cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                cuuint32_t tensorRank, void* globalAddress,
                                const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
                                const cuuint32_t* boxDim, const cuuint32_t* elementStrides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion l2Promotion,
                                CUtensorMapFloatOOBfill oobFill) {
  using plx_emu::refuse;
  plx_emu::g_encoder = "cuTensorMapEncodeTiled";
  if (!boxDim) return refuse("a null array argument");
  for (cuuint32_t i = 0; i < tensorRank && i < 5; ++i)
    if (boxDim[i] == 0 || boxDim[i] > 256)
      return refuse("boxDim[%u] = %u must be 1 to 256", i, boxDim[i]);
  plx_emu::TensorMap m;
  const CUresult r = plx_emu::check_common(tensorMap, tensorDataType, tensorRank, globalAddress,
                                           globalDim, globalStrides, elementStrides, interleave,
                                           swizzle, l2Promotion, oobFill, boxDim[0], m);
  if (r != CUDA_SUCCESS) return r;
  for (cuuint32_t i = 0; i < tensorRank; ++i) m.box[i] = static_cast<uint16_t>(boxDim[i]);
  return plx_emu::write_map(tensorMap, m);
}

CUresult cuTensorMapEncodeIm2col(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                 cuuint32_t tensorRank, void* globalAddress,
                                 const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
                                 const int* pixelBoxLowerCorner, const int* pixelBoxUpperCorner,
                                 cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,
                                 const cuuint32_t* elementStrides, CUtensorMapInterleave interleave,
                                 CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                 CUtensorMapFloatOOBfill oobFill) {
  using plx_emu::refuse;
  plx_emu::g_encoder = "cuTensorMapEncodeIm2col";
  if (tensorRank < 3 || tensorRank > 5)
    return refuse("tensorRank %u must be 3, 4 or 5 (channels, 1 to 3 spatial dimensions, images)",
                  tensorRank);
  if (!pixelBoxLowerCorner || !pixelBoxUpperCorner) return refuse("a null array argument");
  if (channelsPerPixel == 0 || channelsPerPixel > 256)
    return refuse("channelsPerPixel = %u must be 1 to 256", channelsPerPixel);
  if (pixelsPerColumn == 0 || pixelsPerColumn > 1024)
    return refuse("pixelsPerColumn = %u must be 1 to 1024", pixelsPerColumn);
  plx_emu::TensorMap m;
  const CUresult r = plx_emu::check_common(tensorMap, tensorDataType, tensorRank, globalAddress,
                                           globalDim, globalStrides, elementStrides, interleave,
                                           swizzle, l2Promotion, oobFill, channelsPerPixel, m);
  if (r != CUDA_SUCCESS) return r;
  // The corners' range by rank: 16 bits for one spatial dimension, 8 for two, 5 for three.
  const int spatial = static_cast<int>(tensorRank) - 2;
  const int lim = spatial == 1 ? 32768 : spatial == 2 ? 128 : 16;
  for (int i = 0; i < spatial; ++i) {
    const int lo = pixelBoxLowerCorner[i], hi = pixelBoxUpperCorner[i];
    if (lo < -lim || lo >= lim || hi < -lim || hi >= lim)
      return refuse(
          "the bounding box's corners [%d, %d] of spatial dimension %d must lie in "
          "[%d, %d] for rank %u",
          lo, hi, i, -lim, lim - 1, tensorRank);
    // Lower from the first element, upper from the last: at least one position between them.
    if (static_cast<int64_t>(globalDim[i + 1]) - 1 + hi < lo)
      return refuse(
          "the bounding box of spatial dimension %d is empty (lower corner %d, upper "
          "corner %d on %llu elements)",
          i, lo, hi, static_cast<unsigned long long>(globalDim[i + 1]));
    m.lower[i] = static_cast<int16_t>(lo), m.upper[i] = static_cast<int16_t>(hi);
  }
  m.im2col = 1;
  m.box[0] = static_cast<uint16_t>(channelsPerPixel);
  m.box[1] = static_cast<uint16_t>(pixelsPerColumn);
  return plx_emu::write_map(tensorMap, m);
}
