// A backend whose device is the host: memory from aligned_alloc, work run synchronously on the
// calling thread, so a stream is an ordered queue that is always drained, stream_sync and events
// are trivially complete, and event times are host timestamps taken when an event is recorded.
//
// The CPU plugin is one; a third party's CPU backend derives from it and adds kernels:
//
//   class Mine final : public plexus::sdk::HostBackend {
//    public:
//     Mine() : HostBackend("mine", "my CPU") { kernels().add<MyRelu>("relu", PLX_F32, "mine/relu"); }
//   };
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "plexus/sdk/backend.hpp"

namespace plexus::sdk {

class HostBackend : public Backend {
 public:
  // `device_name` is what plexus info shows for its one device.
  HostBackend(std::string name, std::string device_name)
      : Backend(std::move(name)), device_name_(std::move(device_name)) {}

  int32_t device_count() override { return 1; }

  // Fills name, memory, one compute unit, alignment and PLX_CAP_UNIFIED_HOST; override to
  // change them (call this first).
  void device_props(int32_t device, plx_device_props& p) override {
    check_device(device);
    std::snprintf(p.name, sizeof p.name, "%s", device_name_.c_str());
    p.total_memory = physical_bytes();
    p.free_memory = meminfo_bytes("MemAvailable:");
    p.compute_units = 1;
    p.caps = PLX_CAP_UNIFIED_HOST;
    p.alignment = kAlignment;
  }

  void* mem_alloc(int32_t device, plx_mem_kind, uint64_t bytes, plx_stream) override {
    check_device(device);
    const uint64_t size = (std::max<uint64_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, size);
    if (!p)
      throw OutOfMemory(format("%s: aligned_alloc of %llu bytes failed", name().c_str(),
                               static_cast<unsigned long long>(bytes)));
    return p;
  }
  void mem_free(int32_t, plx_mem_kind, void* ptr, plx_stream) override { std::free(ptr); }
  void mem_copy(int32_t, void* dst, const void* src, uint64_t bytes, plx_copy_dir,
                plx_stream) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void mem_set(int32_t, void* dst, int32_t value, uint64_t bytes, plx_stream) override {
    if (bytes) std::memset(dst, value, bytes);
  }
  void mem_info(int32_t device, uint64_t& free_bytes, uint64_t& total_bytes) override {
    check_device(device);
    free_bytes = meminfo_bytes("MemAvailable:");
    total_bytes = physical_bytes();
  }

  plx_stream stream_create(int32_t device) override {
    check_device(device);
    return reinterpret_cast<plx_stream>(new Stream{device});
  }
  void stream_destroy(plx_stream s) override { delete reinterpret_cast<Stream*>(s); }
  void stream_sync(plx_stream) override {}
  void stream_wait_event(plx_stream, plx_event) override {}
  plx_event event_create(int32_t device) override {
    check_device(device);
    return reinterpret_cast<plx_event>(new Event{});
  }
  void event_destroy(plx_event e) override { delete reinterpret_cast<Event*>(e); }
  void event_record(plx_event e, plx_stream) override {
    auto* ev = reinterpret_cast<Event*>(e);
    ev->time = std::chrono::steady_clock::now();
    ev->recorded = true;
  }
  void event_sync(plx_event) override {}
  bool event_query(plx_event) override { return true; }
  float event_elapsed_ms(plx_event start, plx_event end) override {
    const auto* a = reinterpret_cast<Event*>(start);
    const auto* b = reinterpret_cast<Event*>(end);
    PLX_REQUIRE(a->recorded && b->recorded, "event_elapsed_ms: an event was never recorded");
    return std::chrono::duration<float, std::milli>(b->time - a->time).count();
  }

 protected:
  static constexpr uint64_t kAlignment = 64;
  void check_device(int32_t device) const {
    PLX_REQUIRE(device == 0, "the '%s' backend has one device (0), not %d", name().c_str(), device);
  }
  static uint64_t physical_bytes() {
    return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  }
  // A /proc/meminfo field in bytes ("MemAvailable:"), 0 when absent.
  static uint64_t meminfo_bytes(const char* key) {
    std::ifstream f("/proc/meminfo");
    std::string k, unit;
    uint64_t kb = 0;
    while (f >> k >> kb >> unit)
      if (k == key) return kb * 1024;
    return 0;
  }

 private:
  struct Stream {
    int32_t device;
  };
  struct Event {
    std::chrono::steady_clock::time_point time{};
    bool recorded = false;
  };
  std::string device_name_;
};

}  // namespace plexus::sdk
