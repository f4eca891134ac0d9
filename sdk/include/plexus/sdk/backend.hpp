// A compute backend as a C++ class. The author overrides the virtual functions; table() builds
// the plx_backend the host sees, with trampolines that catch every exception at the boundary.
// Optional features are switched on by overriding the matching has_*() to return true.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "plexus/abi/backend.h"
#include "plexus/sdk/kernel.hpp"
#include "plexus/sdk/status.hpp"

namespace plexus::sdk {

class Backend {
 public:
  explicit Backend(std::string name) : name_(std::move(name)), kernels_(this) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const std::string& name() const { return name_; }
  KernelRegistry& kernels() { return kernels_; }

  // ---- devices ----
  virtual int32_t device_count() = 0;
  // `props` arrives zeroed with struct_size and index set.
  virtual void device_props(int32_t device, plx_device_props& props) = 0;

  // ---- raw memory ----
  virtual void* mem_alloc(int32_t device, plx_mem_kind kind, uint64_t bytes, plx_stream s) = 0;
  virtual void mem_free(int32_t device, plx_mem_kind kind, void* ptr, plx_stream s) = 0;
  virtual void mem_copy(int32_t device, void* dst, const void* src, uint64_t bytes,
                        plx_copy_dir dir, plx_stream s) = 0;
  virtual void mem_set(int32_t device, void* dst, int32_t value, uint64_t bytes,
                       plx_stream s) = 0;
  virtual void mem_info(int32_t device, uint64_t& free_bytes, uint64_t& total_bytes) = 0;

  // ---- streams and events ----
  virtual plx_stream stream_create(int32_t device) = 0;
  virtual void stream_destroy(plx_stream s) = 0;
  virtual void stream_sync(plx_stream s) = 0;
  virtual void stream_wait_event(plx_stream s, plx_event e) = 0;
  virtual plx_event event_create(int32_t device) = 0;
  virtual void event_destroy(plx_event e) = 0;
  virtual void event_record(plx_event e, plx_stream s) = 0;
  virtual void event_sync(plx_event e) = 0;
  virtual bool event_query(plx_event e) = 0;
  virtual float event_elapsed_ms(plx_event start, plx_event end) = 0;

  // ---- optional: fusion ----
  virtual bool has_fusion() const { return false; }
  virtual void get_capability(const plx_graph_view&, plx_claim_fn, void*) {}
  virtual void create_fused(const plx_graph_view&, const int32_t*, int32_t, const int32_t*,
                            int32_t, const plx_kernel**, void**, uint64_t*) {
    throw Unsupported(name_ + ": no fusion");
  }

  // ---- optional: graph capture ----
  virtual bool has_capture() const { return false; }
  virtual void capture_begin(plx_stream) {}
  virtual void* capture_end(plx_stream) { return nullptr; }
  virtual void graph_launch(void*, plx_stream) {}
  virtual void graph_destroy(void*) {}

  // ---- optional: interoperability ----
  virtual void* stream_native(plx_stream) { return nullptr; }
  virtual void* get_proc_address(const char*) { return nullptr; }

  // The C table; built on first use and kept for the backend's lifetime.
  const plx_backend* table() {
    if (table_.struct_size == 0) build_table();
    return &table_;
  }

 private:
  static Backend* self(void* ctx) { return static_cast<Backend*>(ctx); }
  // Values from C are checked before they become enums (an out-of-range enum is undefined).
  static plx_mem_kind kind(int32_t k) {
    PLX_REQUIRE(k >= PLX_MEM_DEVICE && k <= PLX_MEM_MANAGED, "invalid memory kind %d", k);
    return static_cast<plx_mem_kind>(k);
  }

  void build_table() {
    plx_backend& t = table_;
    std::memset(&t, 0, sizeof t);
    t.struct_size = sizeof(plx_backend);
    t.name = name_.c_str();
    t.ctx = this;
    t.device_count = [](void* c) -> int32_t {
      int32_t n = 0;
      return detail::guard([&] { n = self(c)->device_count(); }) == PLX_OK ? n : 0;
    };
    t.device_props = [](void* c, int32_t d, plx_device_props* p) {
      return detail::guard([&] {
        const uint32_t size = p->struct_size;
        PLX_REQUIRE(size >= sizeof(plx_device_props), "device_props: struct_size %u too small",
                    size);
        std::memset(p, 0, sizeof(plx_device_props));
        p->struct_size = size;
        p->index = d;
        self(c)->device_props(d, *p);
      });
    };
    t.mem_alloc = [](void* c, int32_t d, int32_t k, uint64_t b, plx_stream s, void** p) {
      return detail::guard([&] { *p = self(c)->mem_alloc(d, kind(k), b, s); });
    };
    t.mem_free = [](void* c, int32_t d, int32_t k, void* p, plx_stream s) {
      return detail::guard([&] { self(c)->mem_free(d, kind(k), p, s); });
    };
    t.mem_copy = [](void* c, int32_t d, void* dst, const void* src, uint64_t b, int32_t dir,
                    plx_stream s) {
      return detail::guard([&] {
        PLX_REQUIRE(dir >= PLX_COPY_H2D && dir <= PLX_COPY_H2H, "invalid copy direction %d", dir);
        self(c)->mem_copy(d, dst, src, b, static_cast<plx_copy_dir>(dir), s);
      });
    };
    t.mem_set = [](void* c, int32_t d, void* dst, int32_t v, uint64_t b, plx_stream s) {
      return detail::guard([&] { self(c)->mem_set(d, dst, v, b, s); });
    };
    t.mem_info = [](void* c, int32_t d, uint64_t* f, uint64_t* tot) {
      return detail::guard([&] { self(c)->mem_info(d, *f, *tot); });
    };
    t.stream_create = [](void* c, int32_t d, plx_stream* s) {
      return detail::guard([&] { *s = self(c)->stream_create(d); });
    };
    t.stream_destroy = [](void* c, plx_stream s) {
      return detail::guard([&] { self(c)->stream_destroy(s); });
    };
    t.stream_sync = [](void* c, plx_stream s) {
      return detail::guard([&] { self(c)->stream_sync(s); });
    };
    t.stream_wait_event = [](void* c, plx_stream s, plx_event e) {
      return detail::guard([&] { self(c)->stream_wait_event(s, e); });
    };
    t.event_create = [](void* c, int32_t d, plx_event* e) {
      return detail::guard([&] { *e = self(c)->event_create(d); });
    };
    t.event_destroy = [](void* c, plx_event e) {
      return detail::guard([&] { self(c)->event_destroy(e); });
    };
    t.event_record = [](void* c, plx_event e, plx_stream s) {
      return detail::guard([&] { self(c)->event_record(e, s); });
    };
    t.event_sync = [](void* c, plx_event e) {
      return detail::guard([&] { self(c)->event_sync(e); });
    };
    t.event_query = [](void* c, plx_event e, int32_t* done) {
      return detail::guard([&] { *done = self(c)->event_query(e) ? 1 : 0; });
    };
    t.event_elapsed_ms = [](void* c, plx_event a, plx_event b, float* ms) {
      return detail::guard([&] { *ms = self(c)->event_elapsed_ms(a, b); });
    };
    t.kernel_count = [](void* c) -> int32_t { return self(c)->kernels_.size(); };
    t.get_kernel = [](void* c, int32_t i) { return self(c)->kernels_.get(i); };
    if (has_fusion()) {
      t.get_capability = [](void* c, const plx_graph_view* g, plx_claim_fn claim, void* u) {
        return detail::guard([&] { self(c)->get_capability(*g, claim, u); });
      };
      t.create_fused = [](void* c, const plx_graph_view* g, const int32_t* in, int32_t n_in,
                          const int32_t* out, int32_t n_out, const plx_kernel** k, void** st,
                          uint64_t* ws) {
        return detail::guard([&] { self(c)->create_fused(*g, in, n_in, out, n_out, k, st, ws); });
      };
    }
    if (has_capture()) {
      t.capture_begin = [](void* c, plx_stream s) {
        return detail::guard([&] { self(c)->capture_begin(s); });
      };
      t.capture_end = [](void* c, plx_stream s, void** g) {
        return detail::guard([&] { *g = self(c)->capture_end(s); });
      };
      t.graph_launch = [](void* c, void* g, plx_stream s) {
        return detail::guard([&] { self(c)->graph_launch(g, s); });
      };
      t.graph_destroy = [](void* c, void* g) {
        detail::guard([&] { self(c)->graph_destroy(g); });
      };
    }
    t.stream_native = [](void* c, plx_stream s) -> void* {
      void* r = nullptr;
      detail::guard([&] { r = self(c)->stream_native(s); });
      return r;
    };
    t.get_proc_address = [](void* c, const char* n) -> void* {
      void* r = nullptr;
      detail::guard([&] { r = self(c)->get_proc_address(n); });
      return r;
    };
  }

  std::string name_;
  KernelRegistry kernels_;
  plx_backend table_{};
};

}  // namespace plexus::sdk
