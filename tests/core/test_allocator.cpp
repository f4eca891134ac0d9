// The caching allocator: size classes, reuse per stream, statistics, limits, out of memory.
#include "plexus/allocator.hpp"
#include "plexus/error.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

RuntimeOptions cpu_only(uint64_t limit = 0) {
  RuntimeOptions o;
  o.plugins.paths = {plugin_dir()};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  o.memory_limit = limit;
  return o;
}

}  // namespace

TEST_CASE("size classes cover the request and waste at most a quarter", "[cpu][allocator]") {
  uint64_t prev = 0;
  for (uint64_t n : {0ull, 1ull, 511ull, 512ull, 513ull, 4096ull, 4097ull, 10000ull, 65536ull,
                     1000001ull, (1ull << 30) + 1}) {
    INFO(n);
    const uint64_t c = CachingAllocator::size_class(n);
    CHECK(c >= n);
    CHECK(c >= 512);
    CHECK(c % 512 == 0);
    CHECK(c >= prev);
    if (n > 4096) CHECK(static_cast<double>(c) <= 1.25 * static_cast<double>(n) + 1);
    prev = c;
  }
  // Large blocks: multiples of 2 MiB, at most 2 MiB over.
  for (uint64_t n : {(8ull << 20) + 1, 417857536ull, (1ull << 30) + 1}) {
    INFO(n);
    const uint64_t c = CachingAllocator::size_class(n);
    CHECK(c % (2ull << 20) == 0);
    CHECK(c >= n);
    CHECK(c - n < (2ull << 20));
  }
}

TEST_CASE("freed blocks are reused on the same stream and counted", "[cpu][allocator]") {
  Runtime rt(cpu_only());
  Backend& b = rt.backend("cpu");
  CachingAllocator& a = b.allocator(0);
  const plx_stream s = b.stream(0);
  MemoryBlock* x = a.allocate(1000, s);
  CHECK(a.stats().num_raw_allocs == 1);
  CHECK(a.stats().in_use == CachingAllocator::size_class(1000));
  void* ptr = x->ptr;
  a.free(x);
  CHECK(a.stats().in_use == 0);
  CHECK(a.stats().reserved == CachingAllocator::size_class(1000));
  MemoryBlock* y = a.allocate(900, s);  // same class: served from the cache
  CHECK(y->ptr == ptr);
  CHECK(a.stats().num_cache_hits == 1);
  CHECK(a.stats().num_raw_allocs == 1);
  MemoryBlock* z = a.allocate(100000, s);  // too big for the cached block: a new one
  CHECK(a.stats().num_raw_allocs == 2);
  CHECK(a.stats().peak_in_use == y->size + z->size);
  a.free(y);
  a.free(z);
  // A cached block much larger than the request is not handed out for it.
  MemoryBlock* mid = a.allocate(40000, s);  // cached: 1 KiB (too small), 104 KiB (> 2x)
  CHECK(a.stats().num_raw_allocs == 3);
  a.free(mid);
  a.release_cached();
  CHECK(a.stats().reserved == 0);
  CHECK(a.stats().num_allocs == 4);
}

TEST_CASE("a block freed on one stream is not handed to another", "[cpu][allocator]") {
  Runtime rt(cpu_only());
  Backend& b = rt.backend("cpu");
  CachingAllocator& a = b.allocator(0);
  plx_stream other = nullptr;
  REQUIRE(b.table().stream_create(b.table().ctx, 0, &other) == PLX_OK);
  MemoryBlock* x = a.allocate(2048, b.stream(0));
  a.free(x);
  MemoryBlock* y = a.allocate(2048, other);
  CHECK(a.stats().num_cache_hits == 0);
  a.free(y);
  a.release_cached();
  b.table().stream_destroy(b.table().ctx, other);
}

TEST_CASE("the memory limit releases the cache first, then fails naming the limit",
          "[cpu][allocator]") {
  Runtime rt(cpu_only(1 << 20));  // 1 MiB
  Backend& b = rt.backend("cpu");
  CachingAllocator& a = b.allocator(0);
  const plx_stream s = b.stream(0);
  MemoryBlock* x = a.allocate(600 << 10, s);
  a.free(x);  // cached, still reserved
  CHECK(a.stats().reserved > 0);
  // 700 KiB does not fit beside the cached 600 KiB: the cache goes, then it fits.
  MemoryBlock* y = a.allocate(700 << 10, s);
  CHECK(a.stats().reserved == y->size);
  REQUIRE_THROWS_AS(a.allocate(600 << 10, s), OutOfMemoryError);
  REQUIRE_THROWS_WITH(a.allocate(600 << 10, s), PLX_CONTAINS("limit 1.0 MiB from memory.limit"));
  CHECK(a.stats().num_ooms == 2);
  a.free(y);
}

TEST_CASE("an allocation the backend cannot satisfy is an out-of-memory error",
          "[cpu][allocator]") {
  Runtime rt(cpu_only());
  Backend& b = rt.backend("cpu");
  REQUIRE_THROWS_AS(Tensor::empty(b, {int64_t{1} << 48}, PLX_F32), OutOfMemoryError);
  REQUIRE_THROWS_WITH(Tensor::empty(b, {int64_t{1} << 48}, PLX_F32),
                      PLX_CONTAINS("backend 'cpu' device 0: out of memory allocating 1024.0 TiB"));
  // The backend is still usable afterwards.
  const Tensor t = Tensor::zeros(b, {4}, PLX_F32);
  CHECK(t.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
}

TEST_CASE("tensors give their memory back when the last reference goes", "[cpu][allocator]") {
  Runtime rt(cpu_only());
  Backend& b = rt.backend("cpu");
  {
    Tensor t = Tensor::empty(b, {256, 256}, PLX_F32);
    Tensor view = t.reshape({65536});
    t = Tensor();
    CHECK(b.memory_stats(0).in_use > 0);  // the view keeps it
  }
  CHECK(b.memory_stats(0).in_use == 0);
  CHECK(b.memory_stats(0).peak_in_use >= 256 * 256 * 4);
}

TEST_CASE("format_bytes is readable", "[allocator]") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(3ull << 30) == "3.0 GiB");
}

TEST_CASE("a memory limit given as a fraction is that share of the device, for device memory only",
          "[cpu][allocator]") {
  RuntimeOptions o = cpu_only();
  o.memory_fraction = 0.25;
  Runtime rt(o);
  Backend& b = rt.backend("cpu");
  const uint64_t total = b.device(0).total_memory;
  REQUIRE(total > 0);
  CHECK(b.allocator(0).stats().limit == static_cast<uint64_t>(0.25 * static_cast<double>(total)));
  // Pinned memory is host memory: the device's limit does not apply to it.
  CHECK(b.allocator(0, PLX_MEM_PINNED).stats().limit == 0);
}

TEST_CASE("out of memory names the size, the statistics and the retry", "[cpu][allocator]") {
  Runtime rt(cpu_only(1 << 20));
  Backend& b = rt.backend("cpu");
  CachingAllocator& a = b.allocator(0);
  MemoryBlock* keep = a.allocate(700 << 10, b.stream(0));
  REQUIRE_THROWS_AS(a.allocate(600 << 10, b.stream(0)), OutOfMemoryError);
  REQUIRE_THROWS_WITH(a.allocate(600 << 10, b.stream(0)),
                      PLX_CONTAINS("out of memory allocating 600.0 KiB") &&
                          PLX_CONTAINS("peak in use") &&
                          PLX_CONTAINS("the cache was released and the allocation retried"));
  CHECK(a.stats().num_ooms == 2);
  a.free(keep);
}
