// The CPU backend's raw table, as any backend's is used by the core: devices, memory kinds,
// copies, streams and events, and errors that carry the plugin's message.
#include <cstring>

#include "plexus/error.hpp"
#include "plexus/plugin.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

TEST_CASE("the CPU device describes itself", "[cpu][backend]") {
  Backend& b = cpu();
  REQUIRE(b.device_count() == 1);
  const DeviceInfo d = b.device(0);
  CHECK(d.name.rfind("CPU: ", 0) == 0);
  CHECK(d.total_memory > (uint64_t{1} << 28));
  CHECK(d.free_memory <= d.total_memory);
  CHECK(d.compute_units >= 1);
  CHECK(d.alignment >= 64);
  CHECK((d.caps & PLX_CAP_F64) != 0);
  CHECK((d.caps & PLX_CAP_BF16) != 0);
  CHECK((d.caps & PLX_CAP_UNIFIED_HOST) != 0);
  CHECK_FALSE((d.caps & PLX_CAP_GRAPH_CAPTURE) != 0);
  CHECK(caps_string(d.caps).find("f64") != std::string::npos);
  REQUIRE_THROWS_WITH(b.device(1), PLX_CONTAINS("backend 'cpu' has no device 1 (it has 1)"));
}

TEST_CASE("every memory kind allocates aligned memory that copies and sets", "[cpu][backend]") {
  Backend& b = cpu();
  const plx_backend& t = b.table();
  const plx_stream s = b.stream(0);
  for (plx_mem_kind kind : {PLX_MEM_DEVICE, PLX_MEM_PINNED, PLX_MEM_MANAGED}) {
    INFO("kind " << kind);
    void* p = nullptr;
    REQUIRE(t.mem_alloc(t.ctx, 0, kind, 1000, s, &p) == PLX_OK);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    std::vector<unsigned char> src(1000), back(1000);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7);
    b.copy(0, p, src.data(), 1000, PLX_COPY_H2D, s);
    b.copy(0, back.data(), p, 1000, PLX_COPY_D2H, s);
    b.sync_stream(s);
    CHECK(back == src);
    b.memset(0, p, 0xAB, 10, s);
    b.copy(0, back.data(), p, 1000, PLX_COPY_D2H, s);
    CHECK(back[0] == 0xAB);
    CHECK(back[9] == 0xAB);
    CHECK(back[10] == src[10]);
    REQUIRE(t.mem_free(t.ctx, 0, kind, p, s) == PLX_OK);
  }
  uint64_t free_bytes = 0, total = 0;
  REQUIRE(t.mem_info(t.ctx, 0, &free_bytes, &total) == PLX_OK);
  CHECK(total > 0);
}

TEST_CASE("streams and events order and time work", "[cpu][backend]") {
  Backend& b = cpu();
  const plx_backend& t = b.table();
  plx_stream s = nullptr;
  plx_event e0 = nullptr, e1 = nullptr;
  REQUIRE(t.stream_create(t.ctx, 0, &s) == PLX_OK);
  REQUIRE(t.event_create(t.ctx, 0, &e0) == PLX_OK);
  REQUIRE(t.event_create(t.ctx, 0, &e1) == PLX_OK);
  REQUIRE(t.event_record(t.ctx, e0, s) == PLX_OK);
  const Tensor x = random_tensor({1 << 16}, PLX_F32, 3);
  call(cpu(), "relu", {x});
  REQUIRE(t.event_record(t.ctx, e1, s) == PLX_OK);
  REQUIRE(t.stream_wait_event(t.ctx, s, e1) == PLX_OK);
  REQUIRE(t.event_sync(t.ctx, e1) == PLX_OK);
  int32_t done = 0;
  REQUIRE(t.event_query(t.ctx, e1, &done) == PLX_OK);
  CHECK(done == 1);
  float ms = -1;
  REQUIRE(t.event_elapsed_ms(t.ctx, e0, e1, &ms) == PLX_OK);
  CHECK(ms >= 0);
  // An event never recorded cannot be timed: a status and a message, not a crash.
  plx_event e2 = nullptr;
  REQUIRE(t.event_create(t.ctx, 0, &e2) == PLX_OK);
  CHECK(t.event_elapsed_ms(t.ctx, e0, e2, &ms) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(b.plugin().last_error(), PLX_CONTAINS("never recorded"));
  for (plx_event e : {e0, e1, e2}) CHECK(t.event_destroy(t.ctx, e) == PLX_OK);
  CHECK(t.stream_sync(t.ctx, s) == PLX_OK);
  CHECK(t.stream_destroy(t.ctx, s) == PLX_OK);
}

TEST_CASE("a failing slot returns a status and the plugin's message", "[cpu][backend]") {
  Backend& b = cpu();
  const plx_backend& t = b.table();
  plx_stream s = nullptr;
  CHECK(t.stream_create(t.ctx, 7, &s) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(b.plugin().last_error(), PLX_CONTAINS("one device (0), not 7"));
  REQUIRE_THROWS_AS(b.check(PLX_ERR_INVALID_ARGUMENT, "stream_create"), OpError);
  REQUIRE_THROWS_WITH(b.check(PLX_ERR_INVALID_ARGUMENT, "stream_create"),
                      PLX_CONTAINS("backend 'cpu': stream_create: invalid argument: the 'cpu' "
                                   "backend has one device (0), not 7"));
  void* p = nullptr;
  CHECK(t.mem_alloc(t.ctx, 0, PLX_MEM_DEVICE, uint64_t{1} << 62, nullptr, &p) ==
        PLX_ERR_OUT_OF_MEMORY);
  REQUIRE_THROWS_AS(b.check(PLX_ERR_OUT_OF_MEMORY, "mem_alloc"), OutOfMemoryError);
}

TEST_CASE("the plugin descriptor is what the ABI promises", "[cpu][backend]") {
  const LoadedPlugin& p = cpu().plugin();
  CHECK(p.name() == "cpu");
  CHECK(p.abi_major() == PLX_ABI_MAJOR);
  CHECK(p.descriptor().struct_size == sizeof(plx_plugin));
  CHECK_FALSE(p.version().empty());
  CHECK_FALSE(p.description().empty());
  CHECK(p.descriptor().backend_count(p.ctx()) == 1);
  const plx_backend* t = p.descriptor().get_backend(p.ctx(), 0);
  REQUIRE(t != nullptr);
  CHECK(t->struct_size == sizeof(plx_backend));
  CHECK(std::string(t->name) == "cpu");
  CHECK(p.descriptor().get_backend(p.ctx(), 1) == nullptr);
  // It fuses (both fusion slots are filled); optional slots it does not fill are NULL, as the
  // contract says.
  CHECK(t->get_capability != nullptr);
  CHECK(t->create_fused != nullptr);
  CHECK(t->capture_begin == nullptr);
  CHECK(t->capture_end == nullptr);
}

TEST_CASE("out-of-range enum values from C are rejected, not cast", "[cpu][backend][comm]") {
  Backend& b = cpu();
  const plx_backend& t = b.table();
  void* p = nullptr;
  CHECK(t.mem_alloc(t.ctx, 0, 9, 64, nullptr, &p) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(b.plugin().last_error(), PLX_CONTAINS("invalid memory kind 9"));
  float x = 1, y = 0;
  CHECK(t.mem_copy(t.ctx, 0, &y, &x, sizeof x, 7, nullptr) == PLX_ERR_INVALID_ARGUMENT);

  // A one-rank group of the threads communicator, driven through its C table.
  Communicator& comm = runtime().communicator("threads");
  const plx_comm& ct = comm.table();
  plx_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = 0;
  cfg.size = 1;
  cfg.backend = &t;
  cfg.id = comm.unique_id();
  plx_comm_handle h = nullptr;
  REQUIRE(ct.init_rank(ct.ctx, &cfg, &h) == PLX_OK);
  CHECK(ct.all_reduce(h, &x, &y, 1, PLX_F32, 9, nullptr) == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(b.plugin().last_error(), PLX_CONTAINS("invalid reduce op 9"));
  CHECK(ct.all_reduce(h, &x, &y, 1, 42, PLX_REDUCE_SUM, nullptr) == PLX_ERR_INVALID_ARGUMENT);
  CHECK(ct.all_reduce(h, &x, &y, 1, PLX_F32, PLX_REDUCE_SUM, nullptr) == PLX_OK);
  CHECK(y == 1);
  CHECK(ct.destroy(h) == PLX_OK);
}
