// An example communicator plugin written against the Plexus SDK alone (sdk/README.md): the
// skeleton a transport starts from, complete for the one case it can serve without a network.
//
// Communicator "solo" forms groups of exactly one rank on "cpu" buffers. Every collective of one
// rank is a copy (a sum, max or min over one rank is the value itself, an average divides by 1);
// a send to itself is queued until the matching receive, so a grouped send/recv pair to self
// works as it does over NCCL or MPI. A real transport replaces the bodies marked "transport":
// each collective moves data between ranks and honours the group's timeout, abort() makes
// pending operations fail, and check_async_error reports a dead peer.
//
// bench_native times std::memcpy of the same bytes: `plexus bench comm --comm solo` then shows
// what the plugin layer costs over the cheapest possible "collective".
#include <chrono>
#include <cstring>
#include <deque>
#include <vector>

#include "plexus/sdk.hpp"

namespace {

using namespace plexus;

class SoloRank final : public sdk::CommRank {
 public:
  int32_t rank() const override { return 0; }
  int32_t size() const override { return 1; }

  void all_reduce(const void* send, void* recv, uint64_t count, plx_dtype dtype, plx_reduce_op,
                  plx_stream) override {
    copy(send, recv, count, dtype);  // transport: reduce across the ranks
  }
  void broadcast(const void* send, void* recv, uint64_t count, plx_dtype dtype, int32_t root,
                 plx_stream) override {
    PLX_REQUIRE(root == 0, "solo: broadcast from root %d of a group of 1", root);
    copy(send, recv, count, dtype);  // transport: the root's buffer to every rank
  }
  void all_gather(const void* send, void* recv, uint64_t count, plx_dtype dtype, plx_stream) override {
    copy(send, recv, count, dtype);  // transport: rank r's block lands at offset r * count
  }
  void reduce_scatter(const void* send, void* recv, uint64_t count, plx_dtype dtype, plx_reduce_op,
                      plx_stream) override {
    copy(send, recv, count, dtype);  // transport: block r of the reduction to rank r
  }
  void send(const void* buf, uint64_t count, plx_dtype dtype, int32_t peer, plx_stream) override {
    check_alive();
    PLX_REQUIRE(peer == 0, "solo: send to rank %d of a group of 1", peer);
    const auto* p = static_cast<const unsigned char*>(buf);
    queue_.emplace_back(p, p + count * plexus::dtype_size(dtype));
  }
  void recv(void* buf, uint64_t count, plx_dtype dtype, int32_t peer, plx_stream) override {
    check_alive();
    PLX_REQUIRE(peer == 0, "solo: receive from rank %d of a group of 1", peer);
    // transport: wait for the peer's message, within the timeout
    PLX_REQUIRE(!queue_.empty(), "solo: receive with no message sent (it would wait forever)");
    const std::vector<unsigned char>& m = queue_.front();
    PLX_REQUIRE(m.size() == count * plexus::dtype_size(dtype),
                "solo: the message holds %zu bytes, the receive expects %llu", m.size(),
                static_cast<unsigned long long>(count * plexus::dtype_size(dtype)));
    std::memcpy(buf, m.data(), m.size());
    queue_.pop_front();
  }
  void barrier(plx_stream) override { check_alive(); }
  void abort() override { aborted_ = true; }

  double bench_native(plx_collective, uint64_t count, plx_dtype dtype, int32_t iters, void* a,
                      void* b, plx_stream) override {
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < iters; ++i) std::memcpy(b, a, count * plexus::dtype_size(dtype));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  void check_alive() const {
    if (aborted_) throw sdk::Error(PLX_ERR_ABORTED, "solo: the communicator was aborted");
  }
  void copy(const void* send, void* recv, uint64_t count, plx_dtype dtype) const {
    check_alive();
    if (send != recv && count) std::memmove(recv, send, count * plexus::dtype_size(dtype));
  }
  std::deque<std::vector<unsigned char>> queue_;
  bool aborted_ = false;
};

class SoloCommunicator final : public sdk::Communicator {
 public:
  SoloCommunicator() : sdk::Communicator("solo", "cpu") {}
  bool has_bench_native() const override { return true; }
  plx_comm_id unique_id() override { return plx_comm_id{}; }  // transport: a rendezvous address
  std::unique_ptr<sdk::CommRank> init_rank(const plx_comm_config& cfg) override {
    PLX_REQUIRE((cfg.rank == -1 && cfg.size == -1) || (cfg.rank == 0 && cfg.size == 1),
                "solo: groups of one rank only (asked for rank %d of %d); use mpi or nccl for more",
                cfg.rank, cfg.size);
    PLX_REQUIRE(cfg.backend && cfg.backend->name && std::strcmp(cfg.backend->name, "cpu") == 0,
                "solo: takes cpu buffers, not '%s'", cfg.backend && cfg.backend->name ? cfg.backend->name : "?");
    return std::make_unique<SoloRank>();
  }
};

class SoloPlugin final : public sdk::Plugin {
 public:
  explicit SoloPlugin(const sdk::HostContext& host) {
    host.check_options({});
    add_comm(std::make_unique<SoloCommunicator>());
  }
};

}  // namespace

PLEXUS_PLUGIN(SoloPlugin, "solo", "0.1.0", "example communicator: groups of one rank on cpu buffers")
