// The "threads" communicator: the ranks of a group are threads of this process exchanging
// buffers of the "cpu" backend through shared memory (what Gloo does on one host, without
// sockets). It lets data parallelism be tested without MPI, and exercises the whole plx_comm
// table end to end.
//
// Every operation is blocking (the CPU backend's streams are synchronous, so "enqueued" and
// "done" coincide). A collective is two rendezvous of all ranks around a compute phase:
//
//   post my arguments -> rendezvous 1 -> check that the ranks agree -> compute -> rendezvous 2
//
// Between the two rendezvous each rank reads its peers' buffers directly and writes its share
// of the result into every rank's output, so the work is spread over the ranks. The first
// rendezvous can fail (timeout, abort, a peer that left): then no rank passes it and nobody
// touches another rank's memory. The second one never fails: every rank that passed the first
// is computing and will arrive, and a rank must not return (and let its caller free buffers)
// while a peer still reads them.
//
// Reductions combine the ranks in rank order 0, 1, ..., n-1 for every element, so each element
// is the same on every rank and from run to run, whatever order the threads arrive in.
//
// Point-to-point messages are copied into a per-(src, dst) queue: send never blocks, recv
// blocks until the oldest message from that peer arrives. After a timeout or an abort the group
// is failed: every waiter wakes, and every later operation fails at once with the same status.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"

namespace plexus::cpu {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int32_t kDefaultTimeoutMs = 60000;

// Ids this communicator made start with this tag, so that an id from another communicator (or
// an uninitialised one) is refused instead of silently forming a group with a stranger.
constexpr char kIdTag[16] = "plexus.threads1";

enum class Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

// "rank 2" or "ranks 1, 3"
std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

bool overlap(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

// What one rank brings to a collective; its peers read it between the two rendezvous.
struct Post {
  Kind kind = Kind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t count = 0;
  int32_t dtype = PLX_DTYPE_NONE;
  int32_t op = -1;
  int32_t root = -1;
  std::string error;  // this rank's own argument error: every rank reports it
};

struct Message {
  std::vector<unsigned char> bytes;
  uint64_t count;
  int32_t dtype;
};

// One group of ranks, shared by their handles. Everything below `mu` is guarded by it.
struct Group {
  Group(std::string key_, int32_t size_)
      : key(std::move(key_)),
        size(size_),
        joined(static_cast<size_t>(size_), 0),
        left(static_cast<size_t>(size_), 0),
        here(static_cast<size_t>(size_), 0),
        posts(static_cast<size_t>(size_)),
        mail(static_cast<size_t>(size_) * static_cast<size_t>(size_)) {}

  const std::string key;  // the id's bytes
  const int32_t size;

  std::mutex mu;
  std::condition_variable cv;

  // Membership.
  std::vector<char> joined;  // rank called init_rank
  std::vector<char> left;    // rank destroyed its handle: it will never arrive anywhere again
  int32_t num_joined = 0;
  bool formed = false;  // every rank joined
  int32_t members = 0;  // live handles plus ranks still inside init_rank

  // Failure: once set it stays, every wait returns, every operation fails with it.
  plx_status status = PLX_OK;
  std::string error;

  // Rendezvous: a generation counter, bumped when the last rank arrives.
  uint64_t gen = 0;
  int32_t arrived = 0;
  std::vector<char> here;  // ranks waiting at the current rendezvous
  std::vector<Post> posts;

  // Point to point: mail[src * size + dst], oldest first.
  std::vector<std::deque<Message>> mail;

  void fail(plx_status s, const std::string& message) {
    if (status == PLX_OK) {
      status = s;
      error = message;
    }
    cv.notify_all();
  }
  [[noreturn]] void throw_failed(const std::string& what) const {
    throw sdk::Error(status, what + ": the group has failed: " + error);
  }
  std::vector<int32_t> absent() const {
    std::vector<int32_t> r;
    for (int32_t k = 0; k < size; ++k)
      if (!here[static_cast<size_t>(k)]) r.push_back(k);
    return r;
  }
};

// Rank r's share of `count` elements is [share_begin(r), share_begin(r + 1)): near-equal parts.
uint64_t share_begin(uint64_t count, int32_t r, int32_t n) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(count) * static_cast<uint32_t>(r) /
                               static_cast<uint32_t>(n));
}

// Groups by id, process-wide (the plugin library is loaded once however many runtimes use it).
struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Group>> groups;
};
Registry& registry() {
  static Registry r;
  return r;
}

// Drops `g` from the registry if nobody holds it any more. Takes both locks (registry first).
void release_if_unused(const std::shared_ptr<Group>& g) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> rl(reg.mu);
  std::lock_guard<std::mutex> gl(g->mu);
  if (g->members > 0) return;
  auto it = reg.groups.find(g->key);
  if (it != reg.groups.end() && it->second == g) reg.groups.erase(it);
}

// ---- reductions ----

// The type a reduction accumulates in: f32 for the 16-bit floats, wide integers so that an
// average of integers is exact (a sum still wraps modulo 2^bits when stored, as in NCCL).
template <class T>
struct Acc {
  using type = acc_t<T>;
};
template <>
struct Acc<int32_t> {
  using type = int64_t;
};
template <>
struct Acc<uint8_t> {
  using type = int64_t;
};
template <>
struct Acc<int64_t> {
  using type = __int128;
};

// max and min let a NaN through (as a sum does), so that a rank whose values diverged is seen
// by every rank rather than hidden by the comparison.
template <class A>
inline A max_of(A a, A x) {
  if constexpr (std::is_floating_point_v<A>)
    return (x > a || x != x) ? x : a;
  else
    return x > a ? x : a;
}
template <class A>
inline A min_of(A a, A x) {
  if constexpr (std::is_floating_point_v<A>)
    return (x < a || x != x) ? x : a;
  else
    return x < a ? x : a;
}

// dsts[d][i] = op over k of srcs[k][i] for i in [begin, end), for each of the ndst outputs.
// Each block is read completely before it is written, so an output may be one of the inputs
// (in-place all_reduce): only the calling rank touches these elements.
template <class T>
void reduce_range(const void* const* srcs, int32_t n, void* const* dsts, int32_t ndst,
                  uint64_t begin, uint64_t end, int32_t op) {
  using A = typename Acc<T>::type;
  constexpr uint64_t kBlock = 256;
  A acc[kBlock];
  for (uint64_t b = begin; b < end; b += kBlock) {
    const uint64_t m = std::min(kBlock, end - b);
    const T* s0 = static_cast<const T*>(srcs[0]) + b;
    for (uint64_t j = 0; j < m; ++j) acc[j] = convert<A>(s0[j]);
    for (int32_t k = 1; k < n; ++k) {
      const T* s = static_cast<const T*>(srcs[k]) + b;
      switch (op) {  // hoisted out of the element loop
        case PLX_REDUCE_MAX:
          for (uint64_t j = 0; j < m; ++j) acc[j] = max_of(acc[j], convert<A>(s[j]));
          break;
        case PLX_REDUCE_MIN:
          for (uint64_t j = 0; j < m; ++j) acc[j] = min_of(acc[j], convert<A>(s[j]));
          break;
        default:
          for (uint64_t j = 0; j < m; ++j) acc[j] += convert<A>(s[j]);
      }
    }
    if (op == PLX_REDUCE_AVG)  // integers: truncated toward zero
      for (uint64_t j = 0; j < m; ++j) acc[j] = acc[j] / static_cast<A>(n);
    for (int32_t d = 0; d < ndst; ++d) {
      T* dst = static_cast<T*>(dsts[d]) + b;
      for (uint64_t j = 0; j < m; ++j) dst[j] = convert<T>(acc[j]);
    }
  }
}

void reduce_dispatch(int32_t dtype, const void* const* srcs, int32_t n, void* const* dsts,
                     int32_t ndst, uint64_t begin, uint64_t end, int32_t op) {
  // Invalid dtypes are refused before the rendezvous.
  visit_dtype(dtype, [&](auto tag) {
    reduce_range<typename decltype(tag)::type>(srcs, n, dsts, ndst, begin, end, op);
  });
}

// ---- one rank ----

class ThreadsRank final : public sdk::CommRank {
 public:
  ThreadsRank(std::shared_ptr<Group> g, int32_t rank, std::chrono::milliseconds timeout)
      : g_(std::move(g)), rank_(rank), timeout_(timeout) {}
  ~ThreadsRank() override { leave(); }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return g_->size; }

  void all_reduce(const void* send, void* recv, uint64_t count, plx_dtype dtype, plx_reduce_op op,
                  plx_stream) override {
    Post p = make_post(Kind::kAllReduce, send, recv, count, dtype);
    p.op = op;
    check_reduction(p);
    const uint64_t bytes = count * dtype_size(dtype);
    if (p.error.empty() && send != recv) snapshot_if_overlapping(p, bytes, recv, bytes);
    // Pointer tables sized before the rendezvous: compute must not fail (see collective()).
    const int32_t n = size();
    std::vector<const void*> srcs(static_cast<size_t>(n));
    std::vector<void*> dsts(static_cast<size_t>(n));
    collective(std::move(p), [&](const std::vector<Post>& posts) {
      // This rank's share of the elements, written into every rank's output.
      const uint64_t begin = share_begin(count, rank_, n);
      const uint64_t end = share_begin(count, rank_ + 1, n);
      for (int32_t k = 0; k < n; ++k) {
        srcs[static_cast<size_t>(k)] = posts[static_cast<size_t>(k)].send;
        dsts[static_cast<size_t>(k)] = posts[static_cast<size_t>(k)].recv;
      }
      reduce_dispatch(dtype, srcs.data(), n, dsts.data(), n, begin, end, op);
    });
  }

  void broadcast(const void* send, void* recv, uint64_t count, plx_dtype dtype, int32_t root,
                 plx_stream) override {
    Post p = make_post(Kind::kBroadcast, send, recv, count, dtype);
    p.root = root;
    if (p.error.empty() && (root < 0 || root >= size()))
      p.error = sdk::format("root %d is not a rank of this group of %d", root, size());
    else if (p.error.empty() && root == rank_ && count > 0 && send == nullptr)
      p.error = "send is null on the root";
    const uint64_t bytes = count * dtype_size(dtype);
    if (p.error.empty() && root == rank_ && send != recv)
      snapshot_if_overlapping(p, bytes, recv, bytes);
    collective(std::move(p), [&](const std::vector<Post>& posts) {
      const int32_t n = size();
      const uint64_t es = dtype_size(dtype);
      const uint64_t begin = share_begin(count, rank_, n);
      const uint64_t end = share_begin(count, rank_ + 1, n);
      if (end == begin) return;
      const auto* src = static_cast<const unsigned char*>(posts[static_cast<size_t>(root)].send);
      for (const Post& q : posts) {
        auto* dst = static_cast<unsigned char*>(q.recv);
        if (dst != src) std::memcpy(dst + begin * es, src + begin * es, (end - begin) * es);
      }
    });
  }

  void all_gather(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                  plx_stream) override {
    Post p = make_post(Kind::kAllGather, send, recv, count, dtype);
    const uint64_t bytes = count * dtype_size(dtype);
    if (p.error.empty() && count > UINT64_MAX / static_cast<uint64_t>(size()) / 8)
      p.error = sdk::format("count %llu times %d ranks overflows",
                            static_cast<unsigned long long>(count), size());
    // In place in NCCL's sense: send is this rank's block of recv.
    if (p.error.empty() && send != static_cast<const unsigned char*>(recv) + rank_ * bytes)
      snapshot_if_overlapping(p, bytes, recv, bytes * static_cast<uint64_t>(size()));
    collective(std::move(p), [&](const std::vector<Post>& posts) {
      // This rank's block, pushed into every rank's output.
      const void* src = posts[static_cast<size_t>(rank_)].send;
      for (const Post& q : posts) {
        void* dst = static_cast<unsigned char*>(q.recv) + rank_ * bytes;
        if (dst != src && bytes) std::memcpy(dst, src, bytes);
      }
    });
  }

  void reduce_scatter(const void* send, void* recv, uint64_t count, plx_dtype dtype,
                      plx_reduce_op op, plx_stream) override {
    Post p = make_post(Kind::kReduceScatter, send, recv, count, dtype);
    p.op = op;
    check_reduction(p);
    const uint64_t bytes = count * dtype_size(dtype);
    if (p.error.empty() && count > UINT64_MAX / static_cast<uint64_t>(size()) / 8)
      p.error = sdk::format("count %llu times %d ranks overflows",
                            static_cast<unsigned long long>(count), size());
    // In place in NCCL's sense: recv is this rank's block of send; each element of it is read
    // (by this rank only) before it is written.
    if (p.error.empty() && recv != static_cast<const unsigned char*>(send) + rank_ * bytes)
      snapshot_if_overlapping(p, bytes * static_cast<uint64_t>(size()), recv, bytes);
    const int32_t n = size();
    std::vector<const void*> srcs(static_cast<size_t>(n));
    collective(std::move(p), [&](const std::vector<Post>& posts) {
      for (int32_t k = 0; k < n; ++k)
        srcs[static_cast<size_t>(k)] =
            static_cast<const unsigned char*>(posts[static_cast<size_t>(k)].send) + rank_ * bytes;
      void* dst = recv;
      reduce_dispatch(dtype, srcs.data(), n, &dst, 1, 0, count, op);
    });
  }

  void barrier(plx_stream) override {
    collective(make_post(Kind::kBarrier, nullptr, nullptr, 0, PLX_U8), [](const auto&) {});
  }

  void send(const void* buf, uint64_t count, plx_dtype dtype, int32_t peer, plx_stream) override {
    check_p2p("send to", buf, count, dtype, peer);
    Message m{std::vector<unsigned char>(count * dtype_size(dtype)), count, dtype};
    if (!m.bytes.empty()) std::memcpy(m.bytes.data(), buf, m.bytes.size());
    std::lock_guard<std::mutex> lk(g_->mu);
    if (g_->status != PLX_OK) g_->throw_failed(sdk::format("send to rank %d", peer));
    g_->mail[box(rank_, peer)].push_back(std::move(m));
    g_->cv.notify_all();
  }

  void recv(void* buf, uint64_t count, plx_dtype dtype, int32_t peer, plx_stream) override {
    check_p2p("recv from", buf, count, dtype, peer);
    const std::string what = sdk::format("recv from rank %d", peer);
    const auto deadline = Clock::now() + timeout_;
    Message m;
    {
      std::unique_lock<std::mutex> lk(g_->mu);
      auto& q = g_->mail[box(peer, rank_)];
      for (;;) {
        if (g_->status != PLX_OK) g_->throw_failed(what);
        if (!q.empty()) break;
        if (g_->left[static_cast<size_t>(peer)]) {
          g_->fail(PLX_ERR_COMM, sdk::format("%s: rank %d left the group with no message "
                                             "pending for rank %d",
                                             what.c_str(), peer, rank_));
          throw sdk::Error(PLX_ERR_COMM, g_->error);
        }
        if (Clock::now() >= deadline) {
          g_->fail(
              PLX_ERR_TIMEOUT,
              sdk::format("%s: rank %d waited %lld ms for a message from rank %d", what.c_str(),
                          rank_, static_cast<long long>(timeout_.count()), peer));
          throw sdk::Error(PLX_ERR_TIMEOUT, g_->error);
        }
        g_->cv.wait_until(lk, deadline);
      }
      m = std::move(q.front());
      q.pop_front();
    }
    // The message is consumed either way, so later messages still pair up in order.
    if (m.count != count || m.dtype != dtype)
      throw sdk::InvalidArgument(
          sdk::format("%s: the message holds %llu elements of %s, the receive expects %llu of %s",
                      what.c_str(), static_cast<unsigned long long>(m.count), dtype_name(m.dtype),
                      static_cast<unsigned long long>(count), dtype_name(dtype)));
    if (!m.bytes.empty()) std::memcpy(buf, m.bytes.data(), m.bytes.size());
  }

  void abort() override {
    std::lock_guard<std::mutex> lk(g_->mu);
    g_->fail(PLX_ERR_ABORTED, sdk::format("abort() was called on rank %d", rank_));
  }

  void finalize() override { leave(); }

  void check_async_error() override {
    // Operations are synchronous, so a failure is also reported by the operation that saw it;
    // here it stays visible for as long as the group exists (a failed group never recovers).
    std::lock_guard<std::mutex> lk(g_->mu);
    if (g_->status != PLX_OK) g_->throw_failed(sdk::format("rank %d", rank_));
  }

 private:
  size_t box(int32_t src, int32_t dst) const {
    return static_cast<size_t>(src) * static_cast<size_t>(g_->size) + static_cast<size_t>(dst);
  }

  // Arguments this rank can judge alone. A bad one is not thrown here: it is posted, so that
  // every rank fails the same collective instead of its peers waiting for a rank that left.
  Post make_post(Kind kind, const void* send, void* recv, uint64_t count, plx_dtype dtype) const {
    Post p;
    p.kind = kind;
    p.send = send;
    p.recv = recv;
    p.count = count;
    p.dtype = dtype;
    if (kind == Kind::kBarrier) return p;
    if (!dtype_is_valid(dtype))
      p.error = sdk::format("invalid dtype %d", static_cast<int>(dtype));
    else if (count > (UINT64_MAX >> 4))
      p.error = sdk::format("count %llu is too large", static_cast<unsigned long long>(count));
    else if (count > 0 && recv == nullptr)
      p.error = "recv is null";
    else if (count > 0 && send == nullptr && kind != Kind::kBroadcast)
      p.error = "send is null";
    return p;
  }

  void check_reduction(Post& p) const {
    if (!p.error.empty()) return;
    if (p.op < PLX_REDUCE_SUM || p.op > PLX_REDUCE_MIN)
      p.error = sdk::format("unknown reduce op %d", static_cast<int>(p.op));
    else if (!dtype_is_valid(p.dtype))
      p.error = sdk::format("cannot reduce %s", dtype_name(p.dtype));
  }

  // Peers read this rank's send while they write into its recv; if the two overlap (other than
  // in the in-place layouts each collective handles), they read a private copy instead.
  void snapshot_if_overlapping(Post& p, uint64_t send_bytes, const void* recv,
                               uint64_t recv_bytes) {
    if (!p.send || !overlap(p.send, send_bytes, recv, recv_bytes)) return;
    snapshot_.assign(static_cast<const unsigned char*>(p.send),
                     static_cast<const unsigned char*>(p.send) + send_bytes);
    p.send = snapshot_.data();
  }

  void check_p2p(const char* dir, const void* buf, uint64_t count, plx_dtype dtype,
                 int32_t peer) const {
    PLX_REQUIRE(peer >= 0 && peer < size(), "%s rank %d: not a rank of this group of %d", dir, peer,
                size());
    PLX_REQUIRE(dtype_is_valid(dtype), "%s rank %d: invalid dtype %d", dir, peer,
                static_cast<int>(dtype));
    PLX_REQUIRE(count <= (UINT64_MAX >> 4), "%s rank %d: count %llu is too large", dir, peer,
                static_cast<unsigned long long>(count));
    PLX_REQUIRE(count == 0 || buf != nullptr, "%s rank %d: buffer is null", dir, peer);
  }

  // The ranks' verdict on a collective once all have posted: every rank computes the same one
  // from the same posts.
  std::string verdict(const std::vector<Post>& posts, const std::string& what) const {
    const Post& a = posts[0];
    for (int32_t k = 1; k < size(); ++k) {
      if (posts[static_cast<size_t>(k)].kind != a.kind)
        return sdk::format(
            "%s: rank 0 called %s but rank %d called %s (the ranks issue "
            "collectives in different orders)",
            what.c_str(), kind_name(a.kind), k, kind_name(posts[static_cast<size_t>(k)].kind));
    }
    for (int32_t k = 0; k < size(); ++k) {
      const std::string& e = posts[static_cast<size_t>(k)].error;
      if (!e.empty()) return sdk::format("%s: rank %d: %s", what.c_str(), k, e.c_str());
    }
    auto differ = [&](const char* field, auto get, auto show) -> std::string {
      for (int32_t k = 1; k < size(); ++k) {
        if (get(posts[static_cast<size_t>(k)]) != get(a))
          return sdk::format("%s: the ranks disagree on the %s (rank 0: %s, rank %d: %s)",
                             what.c_str(), field, show(get(a)).c_str(), k,
                             show(get(posts[static_cast<size_t>(k)])).c_str());
      }
      return "";
    };
    auto num = [](auto v) { return std::to_string(v); };
    std::string e = differ(
        "count", [](const Post& p) { return p.count; }, num);
    if (e.empty())
      e = differ(
          "dtype", [](const Post& p) { return p.dtype; },
          [](int32_t d) { return std::string(dtype_name(d)); });
    if (e.empty())
      e = differ(
          "reduce op", [](const Post& p) { return p.op; },
          [](int32_t o) { return std::string(plx_reduce_op_string(o)); });
    if (e.empty())
      e = differ(
          "root", [](const Post& p) { return p.root; }, num);
    return e;
  }

  // Waits for every rank at a rendezvous. All ranks pass or none: once the last one arrives,
  // every waiter passes even if the group fails an instant later. An interruptible wait gives
  // up when the group fails, a missing rank has left, or the deadline passes.
  void rendezvous(std::unique_lock<std::mutex>& lk, bool interruptible, Clock::time_point deadline,
                  const std::string& what) {
    Group& g = *g_;
    const uint64_t my_gen = g.gen;
    g.here[static_cast<size_t>(rank_)] = 1;
    if (++g.arrived == g.size) {
      g.arrived = 0;
      std::fill(g.here.begin(), g.here.end(), 0);
      ++g.gen;
      g.cv.notify_all();
      return;
    }
    if (!interruptible) {
      g.cv.wait(lk, [&] { return g.gen != my_gen; });
      return;
    }
    for (;;) {
      if (g.gen != my_gen) return;
      std::vector<int32_t> gone;
      for (int32_t k : g.absent())
        if (g.left[static_cast<size_t>(k)]) gone.push_back(k);
      const bool late = Clock::now() >= deadline;
      if (g.status != PLX_OK || !gone.empty() || late) {
        const std::vector<int32_t> missing = g.absent();
        g.here[static_cast<size_t>(rank_)] = 0;  // withdraw: this rendezvous will not complete
        --g.arrived;
        if (g.status != PLX_OK) g.throw_failed(what);
        if (!gone.empty())
          g.fail(PLX_ERR_COMM, sdk::format("%s: %s left the group before reaching it", what.c_str(),
                                           rank_list(gone).c_str()));
        else
          g.fail(PLX_ERR_TIMEOUT,
                 sdk::format("%s: timed out after %lld ms on rank %d waiting for %s", what.c_str(),
                             static_cast<long long>(timeout_.count()), rank_,
                             rank_list(missing).c_str()));
        throw sdk::Error(g.status, g.error);
      }
      g.cv.wait_until(lk, deadline);
    }
  }

  template <class F>
  void collective(Post p, F&& compute) {
    const auto deadline = Clock::now() + timeout_;
    const std::string what =
        sdk::format("%s #%llu", kind_name(p.kind), static_cast<unsigned long long>(++ncoll_));
    std::unique_lock<std::mutex> lk(g_->mu);
    if (g_->status != PLX_OK) g_->throw_failed(what);
    g_->posts[static_cast<size_t>(rank_)] = std::move(p);
    rendezvous(lk, /*interruptible=*/true, deadline, what);
    // Every rank has posted; no post changes until every rank has passed rendezvous 2.
    std::string error = verdict(g_->posts, what);
    lk.unlock();
    // Peers wait for this rank at rendezvous 2 without a timeout, so nothing may keep it away.
    if (error.empty()) {
      try {
        compute(g_->posts);
      } catch (const std::exception& e) {
        error = what + ": " + e.what();
      }
    }
    lk.lock();
    rendezvous(lk, /*interruptible=*/false, deadline, what);
    if (!error.empty()) throw sdk::InvalidArgument(error);
  }

  void leave() {
    if (left_) return;
    left_ = true;
    {
      std::lock_guard<std::mutex> lk(g_->mu);
      g_->left[static_cast<size_t>(rank_)] = 1;
      --g_->members;
      g_->cv.notify_all();  // peers waiting for this rank give up now rather than at the timeout
    }
    release_if_unused(g_);
  }

  std::shared_ptr<Group> g_;
  const int32_t rank_;
  const std::chrono::milliseconds timeout_;
  uint64_t ncoll_ = 0;  // collectives issued; equal on every rank of a healthy group
  bool left_ = false;
  std::vector<unsigned char> snapshot_;
};

// ---- the communicator ----

class ThreadsCommunicator final : public sdk::Communicator {
 public:
  ThreadsCommunicator() : sdk::Communicator("threads", "cpu") {}

  plx_comm_id unique_id() override {
    static std::atomic<uint64_t> counter{0};
    plx_comm_id id{};
    std::memcpy(id.bytes, kIdTag, sizeof kIdTag);
    // A counter makes ids of this process distinct; random bytes keep them unguessable.
    const uint64_t n = ++counter;
    std::memcpy(id.bytes + sizeof kIdTag, &n, sizeof n);
    std::random_device rd;
    for (size_t i = sizeof kIdTag + sizeof n; i < sizeof id.bytes; i += 4) {
      const uint32_t r = rd();
      std::memcpy(id.bytes + i, &r, std::min<size_t>(4, sizeof id.bytes - i));
    }
    return id;
  }

  std::unique_ptr<sdk::CommRank> init_rank(const plx_comm_config& cfg) override {
    PLX_REQUIRE(cfg.rank != -1 && cfg.size != -1,
                "init_rank: the threads communicator cannot take rank and size from a launcher "
                "(rank/size -1): its ranks are threads of one process, so give each thread its "
                "rank and the group size");
    PLX_REQUIRE(cfg.size >= 1, "init_rank: size must be >= 1, got %d", cfg.size);
    PLX_REQUIRE(cfg.rank >= 0 && cfg.rank < cfg.size, "init_rank: rank %d is not in [0, %d)",
                cfg.rank, cfg.size);
    const char* backend = cfg.backend && cfg.backend->name ? cfg.backend->name : "(none)";
    PLX_REQUIRE(std::strcmp(backend, "cpu") == 0,
                "init_rank: the threads communicator exchanges buffers of backend 'cpu', not '%s'",
                backend);
    PLX_REQUIRE(cfg.device == 0, "init_rank: the cpu backend has one device (0), not %d",
                cfg.device);
    PLX_REQUIRE(cfg.timeout_ms >= 0, "init_rank: timeout_ms must be >= 0 (0: default), got %d",
                cfg.timeout_ms);
    PLX_REQUIRE(std::memcmp(cfg.id.bytes, kIdTag, sizeof kIdTag) == 0,
                "init_rank: the id was not made by the threads communicator's get_unique_id");
    const std::chrono::milliseconds timeout(cfg.timeout_ms ? cfg.timeout_ms : kDefaultTimeoutMs);
    const std::string key(reinterpret_cast<const char*>(cfg.id.bytes), sizeof cfg.id.bytes);

    Registry& reg = registry();
    std::unique_lock<std::mutex> rl(reg.mu);
    std::shared_ptr<Group>& slot = reg.groups[key];
    if (!slot) slot = std::make_shared<Group>(key, cfg.size);
    const std::shared_ptr<Group> g = slot;
    std::unique_lock<std::mutex> lk(g->mu);
    rl.unlock();
    const size_t r = static_cast<size_t>(cfg.rank);
    PLX_REQUIRE(g->size == cfg.size,
                "init_rank: rank %d gives the group size %d, the ranks that joined before gave %d",
                cfg.rank, cfg.size, g->size);
    if (g->status != PLX_OK) g->throw_failed(sdk::format("init_rank (rank %d)", cfg.rank));
    PLX_REQUIRE(!g->joined[r],
                "init_rank: rank %d already joined this group (one id, one join "
                "per rank)",
                cfg.rank);
    g->joined[r] = 1;
    ++g->num_joined;
    ++g->members;
    if (g->num_joined == g->size) {
      g->formed = true;
      g->cv.notify_all();
    }

    const auto deadline = Clock::now() + timeout;
    while (!g->formed && g->status == PLX_OK) {
      if (Clock::now() >= deadline) {
        std::vector<int32_t> missing, present;
        for (int32_t k = 0; k < g->size; ++k)
          (g->joined[static_cast<size_t>(k)] ? present : missing).push_back(k);
        g->fail(PLX_ERR_TIMEOUT,
                sdk::format("init_rank: timed out after %lld ms on rank %d: %s of the group of %d "
                            "never joined (joined: %s)",
                            static_cast<long long>(timeout.count()), cfg.rank,
                            rank_list(missing).c_str(), g->size, rank_list(present).c_str()));
        break;
      }
      g->cv.wait_until(lk, deadline);
    }
    if (!g->formed) {
      const plx_status status = g->status;
      const std::string error = g->error;
      g->joined[r] = 0;
      --g->num_joined;
      --g->members;
      lk.unlock();
      release_if_unused(g);
      throw sdk::Error(status, error);
    }
    lk.unlock();
    return std::make_unique<ThreadsRank>(g, cfg.rank, timeout);
  }
};

}  // namespace

std::unique_ptr<sdk::Communicator> make_threads_communicator() {
  return std::make_unique<ThreadsCommunicator>();
}

}  // namespace plexus::cpu
