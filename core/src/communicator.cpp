#include "plexus/communicator.hpp"

#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "plexus/backend.hpp"
#include "plexus/error.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"
#include "plexus/tensor.hpp"
#include "text.hpp"

namespace plexus {

Communicator::Communicator(LoadedPlugin& plugin, const plx_comm* table)
    : plugin_(plugin), t_(table), name_(table->name) {
  backends_ = text::split(table->backends ? table->backends : "", ',');
}

bool Communicator::accepts(std::string_view backend) const {
  for (const auto& b : backends_)
    if (b == backend) return true;
  return false;
}

void Communicator::fail(plx_status s, std::string_view what) const {
  std::string msg = "communicator '" + name_ + "': " + std::string(what) + ": " +
                    plx_status_string(s);
  const std::string detail = plugin_.last_error();
  if (!detail.empty()) msg += ": " + detail;
  if (s == PLX_ERR_OUT_OF_MEMORY) throw OutOfMemoryError(msg);
  throw BackendError(msg);
}

plx_comm_id Communicator::unique_id() const {
  plx_comm_id id{};
  check(t_->get_unique_id(t_->ctx, &id), "get_unique_id");
  return id;
}

std::unique_ptr<CommGroup> Communicator::join(Backend& backend, int32_t device, int32_t rank,
                                              int32_t size, const plx_comm_id& id,
                                              int32_t timeout_ms) const {
  if (!accepts(backend.name())) {
    std::string list;
    for (const auto& b : backends_) list += (list.empty() ? "" : ", ") + b;
    throw PluginError("communicator '" + name_ + "' does not work on backend '" + backend.name() +
                      "' (it accepts: " + list + ")");
  }
  plx_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.size = size;
  cfg.device = device;
  cfg.backend = &backend.table();
  cfg.id = id;
  cfg.timeout_ms = timeout_ms;
  plx_comm_handle h = nullptr;
  check(t_->init_rank(t_->ctx, &cfg, &h), "init_rank");
  return std::make_unique<CommGroup>(*this, backend, device, h);
}

CommGroup::CommGroup(const Communicator& comm, Backend& backend, int32_t device,
                     plx_comm_handle h)
    : comm_(comm), backend_(backend), device_(device), h_(h) {}

CommGroup::~CommGroup() {
  const plx_status s = comm_.table().destroy(h_);
  if (s != PLX_OK)
    spdlog::warn("communicator '{}': destroy failed: {}", comm_.name(), comm_.plugin().last_error());
}

int32_t CommGroup::rank() const { return comm_.table().rank(h_); }
int32_t CommGroup::size() const { return comm_.table().size(h_); }
plx_stream CommGroup::stream() const { return stream_ ? stream_ : backend_.stream(device_); }

namespace {
void same_place(const CommGroup& g, const Tensor& t, const char* what) {
  if (&t.backend() != &g.backend() || t.device() != g.device())
    throw OpError(std::string("communicator ") + what + ": tensor lives on " + t.str() +
                  ", the group on backend '" + g.backend().name() + "' device " +
                  std::to_string(g.device()));
  if (!t.is_contiguous()) throw OpError(std::string("communicator ") + what + ": non-contiguous tensor");
}
}  // namespace

void CommGroup::all_reduce(const Tensor& send, const Tensor& recv, plx_reduce_op op) {
  same_place(*this, send, "all_reduce");
  same_place(*this, recv, "all_reduce");
  if (send.numel() != recv.numel() || send.dtype() != recv.dtype())
    throw OpError("all_reduce: send " + desc_string(send.desc()) + " and recv " +
                  desc_string(recv.desc()) + " differ");
  comm_.check(comm_.table().all_reduce(h_, send.data(), recv.data(),
                                       static_cast<uint64_t>(send.numel()), send.dtype(), op,
                                       stream()),
              "all_reduce");
}

void CommGroup::broadcast(const Tensor& send, const Tensor& recv, int32_t root) {
  same_place(*this, recv, "broadcast");
  const void* src = send.defined() ? send.data() : recv.data();
  comm_.check(comm_.table().broadcast(h_, src, recv.data(), static_cast<uint64_t>(recv.numel()),
                                      recv.dtype(), root, stream()),
              "broadcast");
}

void CommGroup::all_gather(const Tensor& send, const Tensor& recv) {
  same_place(*this, send, "all_gather");
  same_place(*this, recv, "all_gather");
  if (recv.numel() != send.numel() * size())
    throw OpError("all_gather: recv has " + std::to_string(recv.numel()) + " elements, expected " +
                  std::to_string(send.numel() * size()));
  comm_.check(comm_.table().all_gather(h_, send.data(), recv.data(),
                                       static_cast<uint64_t>(send.numel()), send.dtype(),
                                       stream()),
              "all_gather");
}

void CommGroup::reduce_scatter(const Tensor& send, const Tensor& recv, plx_reduce_op op) {
  same_place(*this, send, "reduce_scatter");
  same_place(*this, recv, "reduce_scatter");
  if (send.numel() != recv.numel() * size())
    throw OpError("reduce_scatter: send has " + std::to_string(send.numel()) +
                  " elements, expected " + std::to_string(recv.numel() * size()));
  comm_.check(comm_.table().reduce_scatter(h_, send.data(), recv.data(),
                                           static_cast<uint64_t>(recv.numel()), recv.dtype(), op,
                                           stream()),
              "reduce_scatter");
}

void CommGroup::send(const Tensor& t, int32_t peer) {
  same_place(*this, t, "send");
  comm_.check(comm_.table().send(h_, t.data(), static_cast<uint64_t>(t.numel()), t.dtype(), peer,
                                 stream()),
              "send");
}

void CommGroup::recv(const Tensor& t, int32_t peer) {
  same_place(*this, t, "recv");
  comm_.check(comm_.table().recv(h_, t.data(), static_cast<uint64_t>(t.numel()), t.dtype(), peer,
                                 stream()),
              "recv");
}

void CommGroup::barrier() { comm_.check(comm_.table().barrier(h_, stream()), "barrier"); }

void CommGroup::group_begin() {
  if (comm_.table().group_begin) comm_.check(comm_.table().group_begin(h_), "group_begin");
}

void CommGroup::group_end() {
  if (comm_.table().group_end) comm_.check(comm_.table().group_end(h_), "group_end");
}

void CommGroup::abort() { comm_.check(comm_.table().abort(h_), "abort"); }

void CommGroup::check_async_error() {
  if (comm_.table().get_async_error)
    comm_.check(comm_.table().get_async_error(h_), "asynchronous error");
}

bool CommGroup::has_bench_native() const {
  const plx_comm& t = comm_.table();
  // A table of ABI 1.0 ends before the slot: reading it would read past the plugin's struct.
  return t.struct_size >= offsetof(plx_comm, bench_native) + sizeof(t.bench_native) &&
         t.bench_native != nullptr;
}

std::optional<double> CommGroup::bench_native(plx_collective collective, const Tensor& send,
                                              const Tensor& recv, int32_t iters) {
  if (!has_bench_native()) return std::nullopt;
  const char* what = plx_collective_string(collective);
  same_place(*this, recv, what);
  if (collective != PLX_COLL_BROADCAST) {
    same_place(*this, send, what);
    if (send.dtype() != recv.dtype())
      throw OpError(std::string("bench_native ") + what + ": send is " + dtype_name(send.dtype()) +
                    ", recv " + dtype_name(recv.dtype()));
  }
  if (iters < 1) throw OpError("bench_native: iters must be >= 1, got " + std::to_string(iters));
  const int64_t n = size();
  int64_t count = recv.numel();
  int64_t want_send = count;
  if (collective == PLX_COLL_ALL_GATHER) {
    count = send.numel();
    want_send = count;
    if (recv.numel() != count * n)
      throw OpError("bench_native all_gather: recv has " + std::to_string(recv.numel()) +
                    " elements, expected " + std::to_string(count * n));
  } else if (collective == PLX_COLL_REDUCE_SCATTER) {
    want_send = count * n;
  } else if (collective != PLX_COLL_ALL_REDUCE && collective != PLX_COLL_BROADCAST) {
    throw OpError("bench_native: invalid collective " + std::to_string(collective));
  }
  if (collective != PLX_COLL_BROADCAST && send.numel() != want_send)
    throw OpError(std::string("bench_native ") + what + ": send has " +
                  std::to_string(send.numel()) + " elements, expected " +
                  std::to_string(want_send));
  void* a = collective == PLX_COLL_BROADCAST ? recv.data() : send.data();
  double seconds = 0;
  comm_.check(comm_.table().bench_native(h_, collective, static_cast<uint64_t>(count), recv.dtype(),
                                         iters, a, recv.data(), stream(), &seconds),
              std::string("bench_native ") + what);
  return seconds;
}

LaunchGroup join_launch(Runtime& rt, const Communicator& comm, Backend& backend, int32_t device,
                        const std::string& bootstrap, int32_t timeout_ms) {
  LaunchGroup g;
  if (bootstrap.empty() || bootstrap == comm.name()) {
    g.group = comm.join(backend, device, -1, -1, plx_comm_id{}, timeout_ms);
    return g;
  }
  const Communicator& bc = rt.communicator(bootstrap);
  if (bc.backends().empty())
    throw PluginError("communicator '" + bootstrap + "' names no backend, so it cannot carry " +
                      "the id of communicator '" + comm.name() + "'");
  Backend& bb = rt.backend(bc.backends().front());
  g.bootstrap = bc.join(bb, 0, -1, -1, plx_comm_id{}, timeout_ms);
  plx_comm_id id{};
  if (g.bootstrap->rank() == 0) id = comm.unique_id();
  const Tensor idt =
      Tensor::from_host(bb, id.bytes, {static_cast<int64_t>(sizeof id.bytes)}, PLX_U8, 0);
  g.bootstrap->broadcast(idt, idt, 0);
  bb.sync(0);
  std::memcpy(id.bytes, idt.to_vector<uint8_t>().data(), sizeof id.bytes);
  g.group = comm.join(backend, device, g.bootstrap->rank(), g.bootstrap->size(), id, timeout_ms);
  return g;
}

}  // namespace plexus
