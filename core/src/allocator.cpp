#include "plexus/allocator.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "plexus/backend.hpp"
#include "plexus/error.hpp"
#include "plexus/plugin.hpp"

namespace plexus {

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

CachingAllocator::CachingAllocator(Backend& backend, int32_t device, plx_mem_kind kind,
                                   uint64_t limit)
    : backend_(backend), device_(device), kind_(kind) {
  stats_.struct_size = sizeof(plx_memory_stats);
  stats_.limit = limit;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
  if (stats_.in_use != 0)
    spdlog::debug("backend '{}' device {}: allocator destroyed with {} still in use",
                  backend_.name(), device_, format_bytes(stats_.in_use));
}

uint64_t CachingAllocator::size_class(uint64_t bytes) {
  constexpr uint64_t kGranule = 512;
  if (bytes <= 4096) return std::max<uint64_t>(kGranule, (bytes + kGranule - 1) / kGranule * kGranule);
  // Four classes per power of two, 2^k * {1, 1.25, 1.5, 1.75}, up to 8 MiB; above that,
  // multiples of 2 MiB (as PyTorch rounds large blocks): a step's 399 MiB arena would otherwise
  // take a 448 MiB block.
  constexpr uint64_t kLargeStep = uint64_t{2} << 20;
  int k = 63 - __builtin_clzll(bytes);
  const uint64_t step = std::min((uint64_t{1} << k) / 4, kLargeStep);
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::raw_alloc_locked(uint64_t size, plx_stream stream) {
  const plx_backend& t = backend_.table();
  if (stats_.limit != 0 && stats_.reserved + size > stats_.limit) {
    last_failure_ = "over the limit";
    return nullptr;
  }
  void* p = nullptr;
  const plx_status st = t.mem_alloc(t.ctx, device_, kind_, size, stream, &p);
  if (st == PLX_OK && p) {
    ++stats_.num_raw_allocs;
    return p;
  }
  if (st == PLX_ERR_OUT_OF_MEMORY) last_failure_ = backend_.plugin().last_error();
  if (st != PLX_OK && st != PLX_ERR_OUT_OF_MEMORY) backend_.fail(st, "mem_alloc");
  return nullptr;
}

MemoryBlock* CachingAllocator::allocate(uint64_t bytes, plx_stream stream) {
  const uint64_t size = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.num_allocs;
  auto& pool = free_[stream];
  // The smallest cached block that fits, if it is not more than twice the request.
  auto it = pool.lower_bound(size);
  if (it != pool.end() && it->first <= 2 * size) {
    MemoryBlock* b = it->second;
    pool.erase(it);
    b->requested = bytes;
    ++stats_.num_cache_hits;
    stats_.in_use += b->size;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    return b;
  }
  void* p = raw_alloc_locked(size, stream);
  if (!p) {
    // Out of memory (or over the limit): give the cache back and try once more.
    release_cached_locked();
    p = raw_alloc_locked(size, stream);
  }
  if (!p) {
    ++stats_.num_ooms;
    std::string msg = "backend '" + backend_.name() + "' device " + std::to_string(device_) +
                      ": out of memory allocating " + format_bytes(bytes) + " (in use " +
                      format_bytes(stats_.in_use) + ", reserved " + format_bytes(stats_.reserved);
    if (stats_.limit) msg += ", limit " + format_bytes(stats_.limit) + " from memory.limit";
    msg += ", peak in use " + format_bytes(stats_.peak_in_use) + ", " +
           std::to_string(stats_.num_ooms) + " failed allocation(s) so far; the cache was released "
           "and the allocation retried)";
    if (!last_failure_.empty() && last_failure_ != "over the limit")
      msg += ": " + last_failure_;
    throw OutOfMemoryError(msg);
  }
  auto* b = new MemoryBlock{p, size, bytes, stream};
  stats_.reserved += size;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  stats_.in_use += size;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return b;
}

void CachingAllocator::free(MemoryBlock* b) {
  if (!b) return;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.in_use -= b->size;
  free_[b->stream].emplace(b->size, b);
}

// After a device error (a kernel that faulted) every free fails alike, and the device's memory
// goes with its context: one warning for all the blocks, not one a block, so that the error that
// ended the run stays the last thing the user reads.
void CachingAllocator::release_cached_locked() {
  const plx_backend& t = backend_.table();
  uint64_t blocks = 0, failed = 0, failed_bytes = 0;
  plx_status first = PLX_OK;
  std::string why;
  for (auto& [stream, pool] : free_) {
    for (auto& [size, b] : pool) {
      const plx_status st = t.mem_free(t.ctx, device_, kind_, b->ptr, stream);
      ++blocks;
      if (st != PLX_OK) {
        if (failed++ == 0) {
          first = st;
          why = backend_.plugin().last_error();
        }
        failed_bytes += size;
      }
      stats_.reserved -= size;
      delete b;
    }
    pool.clear();
  }
  if (failed > 0)
    spdlog::warn("backend '{}' device {}: mem_free failed for {} of {} cached blocks ({}): {}{}{}",
                 backend_.name(), device_, failed, blocks, format_bytes(failed_bytes),
                 plx_status_string(first), why.empty() ? "" : ": ", why);
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

plx_memory_stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use = stats_.in_use;
  stats_.peak_reserved = stats_.reserved;
}

void CachingAllocator::set_limit(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.limit = bytes;
}

uint64_t CachingAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.limit;
}

}  // namespace plexus
