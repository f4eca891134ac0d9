// A communicator as C++ classes: Communicator makes groups, CommRank is one rank's membership
// (the plx_comm_handle). table() builds the plx_comm the host sees.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "plexus/abi/comm.h"
#include "plexus/sdk/status.hpp"

namespace plexus::sdk {

class CommRank {
 public:
  virtual ~CommRank() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  virtual void all_reduce(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                          plx_reduce_op op, plx_stream s) = 0;
  virtual void broadcast(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                         int32_t root, plx_stream s) = 0;
  virtual void all_gather(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                          plx_stream s) = 0;
  virtual void reduce_scatter(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                              plx_reduce_op op, plx_stream s) = 0;
  virtual void send(const void* buf, uint64_t count, plx_dtype dtype, int32_t peer,
                    plx_stream s) = 0;
  virtual void recv(void* buf, uint64_t count, plx_dtype dtype, int32_t peer, plx_stream s) = 0;
  virtual void barrier(plx_stream s) = 0;
  // Called from any thread; pending and later operations fail with PLX_ERR_ABORTED.
  virtual void abort() = 0;
  // Leaves the group; the destructor follows. Blocking.
  virtual void finalize() {}
  // Optional grouping of operations.
  virtual bool has_group() const { return false; }
  virtual void group_begin() {}
  virtual void group_end() {}
  // A failure seen asynchronously (a dead peer), thrown as an Error; nothing if none. A failed
  // communicator does not recover, so it keeps reporting the failure.
  virtual void check_async_error() {}
  // The bench_native slot (plexus/abi/comm.h has the contract): times `iters` calls of `c` made
  // directly on the underlying library and returns the seconds. Called only when the
  // Communicator's has_bench_native() says so.
  virtual double bench_native(plx_collective c, uint64_t count, plx_dtype dtype, int32_t iters,
                              void* buf_a, void* buf_b, plx_stream s) {
    (void)c, (void)count, (void)dtype, (void)iters, (void)buf_a, (void)buf_b, (void)s;
    throw Unsupported("bench_native: this communicator has no native baseline");
  }
};

class Communicator {
 public:
  // `backends`: comma-separated names of the backends whose buffers it accepts.
  Communicator(std::string name, std::string backends)
      : name_(std::move(name)), backends_(std::move(backends)) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const std::string& name() const { return name_; }
  // Whether its ranks implement bench_native (the table's slot is NULL otherwise).
  virtual bool has_bench_native() const { return false; }
  virtual plx_comm_id unique_id() = 0;
  virtual std::unique_ptr<CommRank> init_rank(const plx_comm_config& cfg) = 0;

  const plx_comm* table() {
    if (table_.struct_size == 0) build_table();
    return &table_;
  }

 private:
  static CommRank* r(plx_comm_handle h) { return reinterpret_cast<CommRank*>(h); }
  // Values from C are checked before they become enums (an out-of-range enum is undefined).
  static plx_dtype dt(int32_t d) {
    PLX_REQUIRE(d >= 0 && d < PLX_DTYPE_COUNT, "invalid dtype %d", d);
    return static_cast<plx_dtype>(d);
  }
  static plx_reduce_op ro(int32_t o) {
    PLX_REQUIRE(o >= PLX_REDUCE_SUM && o <= PLX_REDUCE_MIN, "invalid reduce op %d", o);
    return static_cast<plx_reduce_op>(o);
  }

  void build_table() {
    plx_comm& t = table_;
    std::memset(&t, 0, sizeof t);
    t.struct_size = sizeof(plx_comm);
    t.name = name_.c_str();
    t.backends = backends_.c_str();
    t.ctx = this;
    t.get_unique_id = [](void* c, plx_comm_id* id) {
      return detail::guard([&] { *id = static_cast<Communicator*>(c)->unique_id(); });
    };
    t.init_rank = [](void* c, const plx_comm_config* cfg, plx_comm_handle* h) {
      return detail::guard([&] {
        PLX_REQUIRE(cfg && cfg->struct_size >= sizeof(plx_comm_config),
                    "init_rank: config struct too small");
        *h = reinterpret_cast<plx_comm_handle>(
            static_cast<Communicator*>(c)->init_rank(*cfg).release());
      });
    };
    t.destroy = [](plx_comm_handle h) {
      return detail::guard([&] {
        std::unique_ptr<CommRank> owned(r(h));
        owned->finalize();
      });
    };
    t.abort = [](plx_comm_handle h) { return detail::guard([&] { r(h)->abort(); }); };
    t.rank = [](plx_comm_handle h) -> int32_t { return r(h)->rank(); };
    t.size = [](plx_comm_handle h) -> int32_t { return r(h)->size(); };
    t.all_reduce = [](plx_comm_handle h, const void* s, void* d, uint64_t n, int32_t dtype,
                      int32_t op, plx_stream st) {
      return detail::guard([&] { r(h)->all_reduce(s, d, n, dt(dtype), ro(op), st); });
    };
    t.broadcast = [](plx_comm_handle h, const void* s, void* d, uint64_t n, int32_t dtype,
                     int32_t root, plx_stream st) {
      return detail::guard([&] { r(h)->broadcast(s, d, n, dt(dtype), root, st); });
    };
    t.all_gather = [](plx_comm_handle h, const void* s, void* d, uint64_t n, int32_t dtype,
                      plx_stream st) {
      return detail::guard([&] { r(h)->all_gather(s, d, n, dt(dtype), st); });
    };
    t.reduce_scatter = [](plx_comm_handle h, const void* s, void* d, uint64_t n, int32_t dtype,
                          int32_t op, plx_stream st) {
      return detail::guard([&] { r(h)->reduce_scatter(s, d, n, dt(dtype), ro(op), st); });
    };
    t.send = [](plx_comm_handle h, const void* b, uint64_t n, int32_t dtype, int32_t peer,
                plx_stream st) {
      return detail::guard([&] { r(h)->send(b, n, dt(dtype), peer, st); });
    };
    t.recv = [](plx_comm_handle h, void* b, uint64_t n, int32_t dtype, int32_t peer,
                plx_stream st) {
      return detail::guard([&] { r(h)->recv(b, n, dt(dtype), peer, st); });
    };
    t.barrier = [](plx_comm_handle h, plx_stream st) {
      return detail::guard([&] { r(h)->barrier(st); });
    };
    t.group_begin = [](plx_comm_handle h) {
      return detail::guard([&] {
        if (r(h)->has_group()) r(h)->group_begin();
      });
    };
    t.group_end = [](plx_comm_handle h) {
      return detail::guard([&] {
        if (r(h)->has_group()) r(h)->group_end();
      });
    };
    t.get_async_error = [](plx_comm_handle h) {
      return detail::guard([&] { r(h)->check_async_error(); });
    };
    if (has_bench_native())
      t.bench_native = [](plx_comm_handle h, int32_t c, uint64_t n, int32_t dtype, int32_t iters,
                          void* a, void* b, plx_stream st, double* seconds) {
        return detail::guard([&] {
          PLX_REQUIRE(c >= PLX_COLL_ALL_REDUCE && c <= PLX_COLL_REDUCE_SCATTER,
                      "bench_native: invalid collective %d", c);
          PLX_REQUIRE(iters >= 1, "bench_native: iters must be >= 1, got %d", iters);
          PLX_REQUIRE(seconds != nullptr, "bench_native: seconds is null");
          *seconds =
              r(h)->bench_native(static_cast<plx_collective>(c), n, dt(dtype), iters, a, b, st);
        });
      };
  }

  std::string name_, backends_;
  plx_comm table_{};
};

}  // namespace plexus::sdk
