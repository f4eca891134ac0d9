// The caching allocator: one per (backend, device, memory kind), over the backend's raw
// mem_alloc/mem_free, so that every backend gets pooling without writing it.
//
// Requests are rounded up to a size class (512 B granules below 4 KiB, then four classes per
// power of two up to 8 MiB, so at most 25% is wasted, then multiples of 2 MiB). A freed block goes back to the free list of the
// stream it was allocated on and is reused by the next request of that stream whose class fits
// (never more than twice the request). When the backend reports out of memory, or the limit
// would be passed, the cached blocks are released and the allocation is tried once more.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "plexus/abi/backend.h"

namespace plexus {

class Backend;

struct MemoryBlock {
  void* ptr = nullptr;
  uint64_t size = 0;       // the size class actually reserved
  uint64_t requested = 0;  // what was asked for
  plx_stream stream = nullptr;
};

class CachingAllocator {
 public:
  CachingAllocator(Backend& backend, int32_t device, plx_mem_kind kind, uint64_t limit);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Never returns null; throws OutOfMemoryError naming the backend, device, size and the
  // statistics. bytes == 0 gives a block of the smallest class.
  MemoryBlock* allocate(uint64_t bytes, plx_stream stream);
  // Returns the block to its stream's cache. Null is ignored.
  void free(MemoryBlock* block);
  // Gives every cached block back to the backend.
  void release_cached();

  plx_memory_stats stats() const;
  void reset_peaks();
  void set_limit(uint64_t bytes);  // 0: no limit beyond the device's
  uint64_t limit() const;

  static uint64_t size_class(uint64_t bytes);

 private:
  void release_cached_locked();
  std::string last_failure_;  // why the last raw allocation failed, for the error message
  void* raw_alloc_locked(uint64_t size, plx_stream stream);

  Backend& backend_;
  const int32_t device_;
  const plx_mem_kind kind_;
  mutable std::mutex mu_;
  // free blocks per stream, ordered by size
  std::unordered_map<plx_stream, std::multimap<uint64_t, MemoryBlock*>> free_;
  plx_memory_stats stats_{};
};

// "1.5 GiB"
std::string format_bytes(uint64_t bytes);

}  // namespace plexus
