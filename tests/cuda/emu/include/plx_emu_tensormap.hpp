// The CUDA emulator's contents of a CUtensorMap (cuda.h): what its cuTensorMapEncodeTiled
// (tensormap_emu.cpp) writes and its TMA (runtime.cpp, cp.async.bulk.tensor) reads. The real
// encoding is opaque; this one only has to fit in the 128 bytes and be recognisable.
#pragma once

#include <cstdint>

#include "cuda.h"

namespace plx_emu {

struct TensorMap {
  static constexpr uint64_t kMagic = 0x3150414d54584c50ull;  // "PLXTMAP1"
  uint64_t magic;
  uint64_t address;     // the global address of element (0, ..., 0)
  uint64_t dims[5];     // elements per dimension, innermost first
  uint64_t strides[5];  // bytes between neighbours per dimension (strides[0]: the element size)
  uint16_t box[5];      // the box's extent per dimension, in elements
  uint8_t elem_strides[5];
  uint8_t rank, dtype, elem_bytes, interleave, swizzle, oob_nan;
};
static_assert(sizeof(TensorMap) <= sizeof(CUtensorMap), "the emulated tensor map fits");

// The tensor map at p, or a trap (naming `what`) if p holds none the emulator encoded.
const TensorMap& tensor_map(const void* p, const char* what);

}  // namespace plx_emu
