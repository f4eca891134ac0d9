// Checkpoint files: named host tensors plus string metadata (epoch, step, RNG state, loader
// position, config text), written atomically and verified on read.
//
// Format, version 1. All integers little-endian; CRC32 is zlib's (the gzip polynomial).
//
//   header (32 bytes)
//     magic        8 bytes  "PLXCKPT\0"
//     version      u32      1
//     n_meta       u32      number of metadata entries
//     n_tensors    u32      number of tensor records
//     file_size    u64      size of the whole file in bytes (tells truncation from corruption)
//     header_crc   u32      CRC32 of the 28 bytes above
//   metadata section
//     n_meta times: key_len u32, key bytes, value_len u64, value bytes (keys sorted, unique)
//     meta_crc     u32      CRC32 of the section's bytes above
//   n_tensors tensor records, in the order given
//     name_len u32, name bytes (non-empty, unique), dtype i32 (plx_dtype), ndim u32 (<= 8),
//     shape i64 x ndim (each >= 0), nbytes u64 (= numel x dtype size)
//     head_crc     u32      CRC32 of the record's fields above
//     data         nbytes   the elements, row-major, little-endian
//     data_crc     u32      CRC32 of data
//   trailer
//     file_crc     u32      CRC32 of every byte before it
//
// Each section carries its own CRC so that a damaged byte is reported where it is ("checksum
// mismatch in tensor 'conv1.weight'"); the whole-file CRC also covers the CRC fields themselves.
// A reader refuses a version it does not know: a later version may change anything after the
// version field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/abi/types.h"

namespace plexus {

struct CheckpointTensor {
  std::string name;
  plx_dtype dtype = PLX_F32;
  std::vector<int64_t> shape;  // empty: a 0-d tensor of one element
  std::vector<uint8_t> data;   // row-major bytes, numel x dtype_size(dtype)
};

struct Checkpoint {
  std::map<std::string, std::string> meta;  // epoch, step, rng, loader position, config text...
  std::vector<CheckpointTensor> tensors;
  // The tensor called `name`, or nullptr.
  const CheckpointTensor* find(std::string_view name) const;
};

// The checkpoint format version this build writes and reads.
inline constexpr uint32_t kCheckpointVersion = 1;

// Writes `ckpt` to `path` atomically: a temporary file in the same directory, fsync, rename over
// `path`, fsync of the directory; a crash at any point leaves the old file or the new one, never
// a torn one. Validates every tensor (name, dtype, shape, data size) before touching the disk.
// Throws Error naming the path (and the errno text for system failures); never leaves the
// temporary file behind.
void write_checkpoint(const std::string& path, const Checkpoint& ckpt);

// Reads and verifies a checkpoint (magic, version, sizes, dtypes, every CRC). Throws Error naming
// the path and what is wrong: bad magic, unsupported version, truncated, checksum mismatch in a
// named tensor or section, missing or unreadable file.
Checkpoint read_checkpoint(const std::string& path);

}  // namespace plexus
