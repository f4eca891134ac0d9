// The CUDA emulator's contents of a CUtensorMap (cuda.h): what its cuTensorMapEncodeTiled and
// cuTensorMapEncodeIm2col (tensormap_emu.cpp) write and its TMA (runtime.cpp,
// cp.async.bulk.tensor) reads. The real encoding is opaque; this one only has to fit in the 128
// bytes and be recognisable.
#pragma once

#include <cstdint>

#include "cuda.h"

namespace plx_emu {

struct TensorMap {
  static constexpr uint32_t kMagic = 0x544c5850u;  // "PXLT"
  uint32_t magic;
  uint8_t rank, dtype, elem_bytes, interleave;
  uint64_t address;     // the global address of element (0, ..., 0)
  uint64_t dims[5];     // elements per dimension, innermost first
  uint64_t strides[5];  // bytes between neighbours per dimension (strides[0]: the element size)
  // Tiled maps: the box's extent per dimension, in elements. Im2col maps (cuTensorMapEncodeIm2col):
  // box[0] the channels per pixel, box[1] the pixels per column.
  uint16_t box[5];
  uint8_t elem_strides[5];  // the traversal strides
  uint8_t swizzle, oob_nan;
  uint8_t im2col;  // written by cuTensorMapEncodeIm2col: read by the im2col copies only
  // Im2col maps: the bounding box's corners per spatial dimension (W, H, D: dimensions 1 to
  // rank - 2), the lower from the tensor's first element, the upper from its last.
  int16_t lower[3], upper[3];
};
static_assert(sizeof(TensorMap) <= sizeof(CUtensorMap), "the emulated tensor map fits");

// The tensor map at p, or a trap (naming `what`) if p holds none the emulator encoded.
const TensorMap& tensor_map(const void* p, const char* what);

}  // namespace plx_emu
