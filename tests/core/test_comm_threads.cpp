// The CPU plugin's "threads" communicator through the core's wrapper (Communicator, CommGroup):
// every collective, reduce op and dtype on 1 to 4 ranks with exact expected results, point to
// point, barriers, and the failure paths (missing rank, abort, a rank that left, mismatched
// calls), plus a few layouts only the raw plx_comm table can express.
//
// Catch2's assertions are not thread-safe: rank threads only record what they saw (or the
// message of what they threw) and the main thread asserts after joining them. Sleeps appear
// only to make a rank late, never to order events; no test asserts on timing.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "plexus/communicator.hpp"
#include "plexus/plugin.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

// Long enough never to fire in a passing test, short enough that a broken one ends.
constexpr int32_t kTimeoutMs = 20000;

Communicator& threads_comm() {
  return runtime().communicator("threads");
}

// What each rank's thread ended with: "" or the message of what it threw.
using Outcomes = std::vector<std::string>;

// Runs body(group, rank) on n threads joined to one fresh group.
Outcomes run_ranks(int n, const std::function<void(CommGroup&, int)>& body,
                   int32_t timeout_ms = kTimeoutMs) {
  const plx_comm_id id = threads_comm().unique_id();
  Outcomes out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<CommGroup> g = threads_comm().join(cpu(), 0, r, n, id, timeout_ms);
        body(*g, r);
      } catch (const std::exception& e) {
        out[static_cast<size_t>(r)] = std::string("threw: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void require_ok(const Outcomes& out) {
  for (size_t r = 0; r < out.size(); ++r) {
    INFO("rank " << r << ": " << out[r]);
    REQUIRE(out[r].empty());
  }
}

// Rank-dependent test data that every dtype stores exactly, and whose sums over 4 ranks are
// exact too (multiples of 0.5 below 64 in magnitude fit bf16's 8 significant bits).
double value(plx_dtype d, int r, int64_t i) {
  switch (d) {
    case PLX_I32:
      return static_cast<double>((i * 31 + r * 17) % 41 - 20 - 3 * r);
    case PLX_I64:  // beyond 32 bits, both signs
      return (r % 2 ? -3e12 : 3e12) * (r + 1) + static_cast<double>((i * 31 + r * 17) % 41);
    case PLX_U8:
      return static_cast<double>((i * 11 + r * 29) % 60);  // sums stay below 256
    default:
      return 0.5 * static_cast<double>((i * 7 + r * 13) % 23) - 5 - r;
  }
}

std::vector<double> values(plx_dtype d, int r, int64_t n, int64_t offset = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(d, r, i + offset);
  return v;
}

// The documented result of reducing xs (one value per rank, in rank order).
double reduce_ref(plx_reduce_op op, plx_dtype d, const std::vector<double>& xs) {
  double acc = xs[0];
  for (size_t k = 1; k < xs.size(); ++k) {
    if (op == PLX_REDUCE_MAX)
      acc = std::max(acc, xs[k]);
    else if (op == PLX_REDUCE_MIN)
      acc = std::min(acc, xs[k]);
    else
      acc += xs[k];
  }
  if (op == PLX_REDUCE_AVG) {
    const double n = static_cast<double>(xs.size());
    acc = dtype_is_float(d) ? acc / n : std::trunc(acc / n);  // integers truncate toward zero
  }
  // One rounding to the dtype: the f32 sum of these values is exact, and for f32, f16 and bf16
  // an f32 division then a rounding equals one correct rounding of the exact quotient.
  return round_to({acc}, d)[0];
}

constexpr plx_reduce_op kOps[] = {PLX_REDUCE_SUM, PLX_REDUCE_AVG, PLX_REDUCE_MAX, PLX_REDUCE_MIN};
const std::vector<plx_dtype> kReduceDtypes = {PLX_F32, PLX_F64, PLX_F16, PLX_BF16,
                                              PLX_I32, PLX_I64, PLX_U8};
constexpr Tol kExact{0, 0};

struct ReduceCase {
  plx_dtype d;
  plx_reduce_op op;
  int64_t count;
  bool in_place;
  std::vector<Tensor> send, recv;
  std::vector<double> want;
};

// A rank's membership through the plx_comm table directly, for buffer layouts the core's
// tensor wrapper cannot express (in-place gathers, overlapping buffers) and raw configs.
struct RawRank {
  const plx_comm& t = threads_comm().table();
  plx_comm_handle h = nullptr;
  plx_status status;

  RawRank(const plx_comm_id& id, int32_t rank, int32_t size, const plx_backend* backend = nullptr,
          int32_t timeout_ms = kTimeoutMs) {
    plx_comm_config cfg{};
    cfg.struct_size = sizeof cfg;
    cfg.rank = rank;
    cfg.size = size;
    cfg.device = 0;
    cfg.backend = backend ? backend : &cpu().table();
    cfg.id = id;
    cfg.timeout_ms = timeout_ms;
    status = t.init_rank(t.ctx, &cfg, &h);
  }
  ~RawRank() {
    if (h) t.destroy(h);
  }
  static plx_stream stream() { return cpu().stream(0); }
};

// Runs body(raw rank, rank) on n threads of one fresh group; a failed join is an outcome.
Outcomes run_raw(int n, const std::function<void(RawRank&, int)>& body) {
  const plx_comm_id id = threads_comm().unique_id();
  Outcomes out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RawRank rr(id, r, n);
      if (rr.status != PLX_OK) {
        out[static_cast<size_t>(r)] = "init_rank: " + threads_comm().plugin().last_error();
        return;
      }
      try {
        body(rr, r);
      } catch (const std::exception& e) {
        out[static_cast<size_t>(r)] = std::string("threw: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST_CASE("threads all_reduce: every op and dtype on 1 to 4 ranks, exact", "[cpu][comm]") {
  for (int n = 1; n <= 4; ++n) {
    std::vector<ReduceCase> cases;
    for (plx_dtype d : kReduceDtypes) {
      for (plx_reduce_op op : kOps) {
        // Counts below, at and above the rank count and over the reduction's block of 256.
        for (int64_t count : {int64_t{1}, int64_t{37}, int64_t{600}}) {
          for (bool in_place : {false, true}) {
            if (in_place && count != 37) continue;
            ReduceCase c{d, op, count, in_place, {}, {}, {}};
            for (int r = 0; r < n; ++r) {
              c.send.push_back(from_doubles(values(d, r, count), {count}, d));
              // In place: recv is the send tensor itself.
              c.recv.push_back(in_place ? c.send.back()
                                        : from_doubles(values(d, 7, count), {count}, d));
            }
            for (int64_t i = 0; i < count; ++i) {
              std::vector<double> xs;
              for (int r = 0; r < n; ++r) xs.push_back(value(d, r, i));
              c.want.push_back(reduce_ref(op, d, xs));
            }
            cases.push_back(std::move(c));
          }
        }
      }
    }
    require_ok(run_ranks(n, [&](CommGroup& g, int r) {
      for (ReduceCase& c : cases) {
        if (c.in_place)
          g.all_reduce(c.recv[static_cast<size_t>(r)], c.op);
        else
          g.all_reduce(c.send[static_cast<size_t>(r)], c.recv[static_cast<size_t>(r)], c.op);
      }
    }));
    for (const ReduceCase& c : cases) {
      for (int r = 0; r < n; ++r) {
        INFO(n << " ranks, rank " << r << ", " << dtype_name(c.d) << " "
               << plx_reduce_op_string(c.op) << " count " << c.count
               << (c.in_place ? " in place" : ""));
        CHECK_ALLCLOSE(c.recv[static_cast<size_t>(r)].to_doubles(), c.want, kExact);
        if (!c.in_place)  // the input is left alone
          CHECK_ALLCLOSE(c.send[static_cast<size_t>(r)].to_doubles(), values(c.d, r, c.count),
                         kExact);
      }
    }
  }
}

TEST_CASE("threads all_reduce gives bit-identical floats on every rank, in rank order",
          "[cpu][comm]") {
  // Random values whose sums round: every rank must still get the same bits, run after run.
  const int n = 3;
  const int64_t count = 1001;
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16, PLX_F64}) {
    for (plx_reduce_op op : {PLX_REDUCE_SUM, PLX_REDUCE_AVG}) {
      INFO(dtype_name(d) << " " << plx_reduce_op_string(op));
      std::vector<Tensor> send;
      std::vector<std::vector<double>> xs;
      for (int r = 0; r < n; ++r) {
        send.push_back(random_tensor({count}, d, 40 + static_cast<uint64_t>(r), -1, 1));
        xs.push_back(send.back().to_doubles());
      }
      std::vector<std::vector<Tensor>> recv(2);  // two rounds on the same data
      for (auto& round : recv)
        for (int r = 0; r < n; ++r) round.push_back(Tensor::zeros(cpu(), {count}, d));
      require_ok(run_ranks(n, [&](CommGroup& g, int r) {
        for (auto& round : recv)
          g.all_reduce(send[static_cast<size_t>(r)], round[static_cast<size_t>(r)], op);
      }));
      std::vector<double> want(static_cast<size_t>(count));
      for (size_t i = 0; i < want.size(); ++i) {
        want[i] = xs[0][i] + xs[1][i] + xs[2][i];
        if (op == PLX_REDUCE_AVG) want[i] /= n;
      }
      const std::vector<double> first = recv[0][0].to_doubles();
      // Three rounded inputs summed in f32: a few f32 ulps of 3 on top of the dtype's rounding.
      CHECK_ALLCLOSE(first, want, tolerance(d));
      for (auto& round : recv)
        for (int r = 0; r < n; ++r)
          CHECK_ALLCLOSE(round[static_cast<size_t>(r)].to_doubles(), first, kExact);
    }
  }
  // Where the order changes the f32 result, it is rank order: ((1e8 + -1e8) + 1) = 1, whereas
  // (1e8 + 1) + -1e8 would be 0.
  const std::vector<float> v = {1e8f, -1e8f, 1.0f};
  std::vector<Tensor> t;
  for (float x : v) t.push_back(Tensor::from_vector(cpu(), std::vector<float>{x}, {1}));
  require_ok(run_ranks(
      3, [&](CommGroup& g, int r) { g.all_reduce(t[static_cast<size_t>(r)], PLX_REDUCE_SUM); }));
  const float rank_order = (v[0] + v[1]) + v[2];
  for (const Tensor& x : t) CHECK(x.to_vector<float>()[0] == rank_order);
}

TEST_CASE("threads all_reduce max and min let a NaN through", "[cpu][comm]") {
  // A rank whose values diverged must be visible to all, whichever rank it is.
  const double nan = std::nan("");
  for (int bad = 0; bad < 3; ++bad) {
    for (plx_reduce_op op : {PLX_REDUCE_MAX, PLX_REDUCE_MIN, PLX_REDUCE_SUM}) {
      INFO("NaN on rank " << bad << ", " << plx_reduce_op_string(op));
      std::vector<Tensor> t;
      for (int r = 0; r < 3; ++r)
        t.push_back(from_doubles({r == bad ? nan : 1.0 * r, 5.0 + r}, {2}, PLX_F32));
      require_ok(
          run_ranks(3, [&](CommGroup& g, int r) { g.all_reduce(t[static_cast<size_t>(r)], op); }));
      for (const Tensor& x : t) {
        const std::vector<double> v = x.to_doubles();
        CHECK(std::isnan(v[0]));
        CHECK(v[1] == reduce_ref(op, PLX_F32, {5, 6, 7}));
      }
    }
  }
}

TEST_CASE("threads broadcast from every root, separate and in place", "[cpu][comm]") {
  for (int n = 1; n <= 4; ++n) {
    for (plx_dtype d : {PLX_F32, PLX_BF16, PLX_I64, PLX_U8}) {
      for (int64_t count : {int64_t{1}, int64_t{37}}) {
        for (int root = 0; root < n; ++root) {
          for (bool in_place : {false, true}) {
            INFO(n << " ranks, " << dtype_name(d) << " count " << count << " root " << root
                   << (in_place ? " in place" : ""));
            const Tensor src = from_doubles(values(d, root, count), {count}, d);
            std::vector<Tensor> recv;
            for (int r = 0; r < n; ++r)
              recv.push_back(r == root && in_place ? src
                                                   : from_doubles(values(d, 9, count), {count}, d));
            require_ok(run_ranks(n, [&](CommGroup& g, int r) {
              // Only the root names a source; the others pass none.
              g.broadcast(r == root ? src : Tensor(), recv[static_cast<size_t>(r)], root);
            }));
            for (int r = 0; r < n; ++r)
              CHECK_ALLCLOSE(recv[static_cast<size_t>(r)].to_doubles(), values(d, root, count),
                             kExact);
            CHECK_ALLCLOSE(src.to_doubles(), values(d, root, count), kExact);
          }
        }
      }
    }
  }
}

TEST_CASE("threads all_gather concatenates in rank order", "[cpu][comm]") {
  for (int n = 1; n <= 4; ++n) {
    for (plx_dtype d : {PLX_F32, PLX_F16, PLX_I32, PLX_U8}) {
      for (int64_t count : {int64_t{1}, int64_t{5}, int64_t{37}}) {
        INFO(n << " ranks, " << dtype_name(d) << " count " << count);
        std::vector<Tensor> send, recv;
        std::vector<double> want;
        for (int r = 0; r < n; ++r) {
          send.push_back(from_doubles(values(d, r, count), {count}, d));
          recv.push_back(from_doubles(values(d, 9, n * count), {n * count}, d));
          const auto v = values(d, r, count);
          want.insert(want.end(), v.begin(), v.end());
        }
        require_ok(run_ranks(n, [&](CommGroup& g, int r) {
          g.all_gather(send[static_cast<size_t>(r)], recv[static_cast<size_t>(r)]);
        }));
        for (int r = 0; r < n; ++r)
          CHECK_ALLCLOSE(recv[static_cast<size_t>(r)].to_doubles(), want, kExact);
      }
    }
  }
}

TEST_CASE("threads reduce_scatter: every op, rank r gets block r", "[cpu][comm]") {
  for (int n = 1; n <= 4; ++n) {
    for (plx_dtype d : {PLX_F32, PLX_BF16, PLX_I64, PLX_U8}) {
      for (plx_reduce_op op : kOps) {
        for (int64_t count : {int64_t{1}, int64_t{5}}) {
          INFO(n << " ranks, " << dtype_name(d) << " " << plx_reduce_op_string(op) << " count "
                 << count);
          std::vector<Tensor> send, recv;
          for (int r = 0; r < n; ++r) {
            send.push_back(from_doubles(values(d, r, n * count), {n * count}, d));
            recv.push_back(from_doubles(values(d, 9, count), {count}, d));
          }
          require_ok(run_ranks(n, [&](CommGroup& g, int r) {
            g.reduce_scatter(send[static_cast<size_t>(r)], recv[static_cast<size_t>(r)], op);
          }));
          for (int r = 0; r < n; ++r) {
            std::vector<double> want;
            for (int64_t i = 0; i < count; ++i) {
              std::vector<double> xs;
              for (int k = 0; k < n; ++k) xs.push_back(value(d, k, r * count + i));
              want.push_back(reduce_ref(op, d, xs));
            }
            INFO("rank " << r);
            CHECK_ALLCLOSE(recv[static_cast<size_t>(r)].to_doubles(), want, kExact);
          }
        }
      }
    }
  }
}

TEST_CASE("threads in-place gathers and overlapping buffers through the raw table", "[cpu][comm]") {
  const int n = 3;
  const uint64_t count = 5;
  auto val = [](int r, uint64_t i) { return static_cast<float>(10 * r + static_cast<int>(i)); };

  SECTION("all_gather with send = this rank's block of recv (NCCL's in place)") {
    std::vector<std::vector<float>> buf(n, std::vector<float>(n * count, -1.0f));
    const Outcomes out = run_raw(n, [&](RawRank& rr, int r) {
      float* mine = buf[static_cast<size_t>(r)].data();
      for (uint64_t i = 0; i < count; ++i) mine[r * count + i] = val(r, i);
      if (rr.t.all_gather(rr.h, mine + r * count, mine, count, PLX_F32, RawRank::stream()) !=
          PLX_OK)
        throw std::runtime_error(threads_comm().plugin().last_error());
    });
    require_ok(out);
    for (int r = 0; r < n; ++r)
      for (int k = 0; k < n; ++k)
        for (uint64_t i = 0; i < count; ++i)
          CHECK(buf[static_cast<size_t>(r)][k * count + i] == val(k, i));
  }

  SECTION("all_gather with send == recv: each rank's input is read before it is overwritten") {
    std::vector<std::vector<float>> buf(n, std::vector<float>(n * count, -1.0f));
    require_ok(run_raw(n, [&](RawRank& rr, int r) {
      float* mine = buf[static_cast<size_t>(r)].data();
      for (uint64_t i = 0; i < count; ++i) mine[i] = val(r, i);
      if (rr.t.all_gather(rr.h, mine, mine, count, PLX_F32, RawRank::stream()) != PLX_OK)
        throw std::runtime_error(threads_comm().plugin().last_error());
    }));
    for (int r = 0; r < n; ++r)
      for (int k = 0; k < n; ++k)
        for (uint64_t i = 0; i < count; ++i)
          CHECK(buf[static_cast<size_t>(r)][k * count + i] == val(k, i));
  }

  SECTION("reduce_scatter with recv = this rank's block of send (NCCL's in place)") {
    std::vector<std::vector<float>> buf(n, std::vector<float>(n * count));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < n * count; ++i) buf[static_cast<size_t>(r)][i] = val(r, i);
    require_ok(run_raw(n, [&](RawRank& rr, int r) {
      float* mine = buf[static_cast<size_t>(r)].data();
      if (rr.t.reduce_scatter(rr.h, mine, mine + r * count, count, PLX_F32, PLX_REDUCE_SUM,
                              RawRank::stream()) != PLX_OK)
        throw std::runtime_error(threads_comm().plugin().last_error());
    }));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int k = 0; k < n; ++k) want += val(k, r * count + i);
        CHECK(buf[static_cast<size_t>(r)][r * count + i] == want);
      }
  }

  SECTION("all_reduce into a recv that overlaps send one element further on") {
    std::vector<std::vector<float>> buf(n, std::vector<float>(count + 1));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i) buf[static_cast<size_t>(r)][i] = val(r, i);
    require_ok(run_raw(n, [&](RawRank& rr, int r) {
      float* mine = buf[static_cast<size_t>(r)].data();
      if (rr.t.all_reduce(rr.h, mine, mine + 1, count, PLX_F32, PLX_REDUCE_SUM,
                          RawRank::stream()) != PLX_OK)
        throw std::runtime_error(threads_comm().plugin().last_error());
    }));
    for (int r = 0; r < n; ++r)
      for (uint64_t i = 0; i < count; ++i)
        CHECK(buf[static_cast<size_t>(r)][i + 1] == val(0, i) + val(1, i) + val(2, i));
  }
}

TEST_CASE("threads send/recv: a ring, several messages in order, matched by peer", "[cpu][comm]") {
  for (int n = 1; n <= 4; ++n) {
    INFO(n << " ranks");
    const int kMessages = 3;
    const int64_t count = 6;
    // sent[r][m]: rank r's m-th message to its right neighbour; got[r][m]: from its left one.
    std::vector<std::vector<Tensor>> sent(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      for (int m = 0; m < kMessages; ++m) {
        sent[static_cast<size_t>(r)].push_back(
            from_doubles(values(PLX_F32, r, count, 100 * m), {count}, PLX_F32));
        got[static_cast<size_t>(r)].push_back(Tensor::zeros(cpu(), {count}, PLX_F32));
      }
    require_ok(run_ranks(n, [&](CommGroup& g, int r) {
      const int right = (r + 1) % n, left = (r + n - 1) % n;  // with 1 rank, itself
      // Every send before any recv: sends are buffered, so this cannot deadlock.
      for (int m = 0; m < kMessages; ++m)
        g.send(sent[static_cast<size_t>(r)][static_cast<size_t>(m)], right);
      for (int m = 0; m < kMessages; ++m)
        g.recv(got[static_cast<size_t>(r)][static_cast<size_t>(m)], left);
    }));
    for (int r = 0; r < n; ++r) {
      const int left = (r + n - 1) % n;
      for (int m = 0; m < kMessages; ++m) {
        INFO("rank " << r << " message " << m);
        CHECK_ALLCLOSE(got[static_cast<size_t>(r)][static_cast<size_t>(m)].to_doubles(),
                       values(PLX_F32, left, count, 100 * m), kExact);
      }
    }
  }

  // Rank 1 receives from rank 2 first although rank 0 may well have sent earlier.
  std::vector<Tensor> msg = {from_doubles({1, 2}, {2}, PLX_I32), Tensor(),
                             from_doubles({3, 4}, {2}, PLX_I32)};
  Tensor from0 = Tensor::zeros(cpu(), {2}, PLX_I32), from2 = Tensor::zeros(cpu(), {2}, PLX_I32);
  require_ok(run_ranks(3, [&](CommGroup& g, int r) {
    if (r == 1) {
      g.recv(from2, 2);
      g.recv(from0, 0);
    } else {
      g.send(msg[static_cast<size_t>(r)], 1);
    }
  }));
  CHECK(from0.to_doubles() == std::vector<double>{1, 2});
  CHECK(from2.to_doubles() == std::vector<double>{3, 4});
}

TEST_CASE("threads recv of a message of another size fails on the receiver", "[cpu][comm]") {
  const Tensor four = from_doubles({1, 2, 3, 4}, {4}, PLX_F32);
  const Tensor five = Tensor::zeros(cpu(), {5}, PLX_F32);
  const Tensor ok_send = from_doubles({7}, {1}, PLX_F32);
  const Tensor ok_recv = Tensor::zeros(cpu(), {1}, PLX_F32);
  const Outcomes out = run_ranks(2, [&](CommGroup& g, int r) {
    if (r == 0) {
      g.send(four, 1);
      g.send(ok_send, 1);
    } else {
      try {
        g.recv(five, 0);
      } catch (...) {
        g.recv(ok_recv, 0);  // the bad message was consumed; the next one pairs up
        throw;
      }
    }
  });
  CHECK(out[0].empty());
  CHECK_THAT(out[1], PLX_CONTAINS("recv from rank 0: the message holds 4 elements of f32, the "
                                  "receive expects 5 of f32"));
  CHECK(ok_recv.to_doubles() == std::vector<double>{7});
}

TEST_CASE("threads barrier: writes before it are seen by every rank after it", "[cpu][comm]") {
  const int n = 4, rounds = 20;
  std::vector<int> stamp(n, -1);
  std::vector<int> stale(n, 0);
  require_ok(run_ranks(n, [&](CommGroup& g, int r) {
    for (int k = 0; k < rounds; ++k) {
      if (r == n - 1 && k % 5 == 0)  // the last rank is late now and then
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      stamp[static_cast<size_t>(r)] = k;
      g.barrier();
      for (int j = 0; j < n; ++j)
        stale[static_cast<size_t>(r)] += stamp[static_cast<size_t>(j)] != k;
      g.barrier();  // nobody stamps round k + 1 while a rank still reads round k
    }
  }));
  for (int r = 0; r < n; ++r) CHECK(stale[static_cast<size_t>(r)] == 0);
}

TEST_CASE("threads groups are independent, and a thread may be in two", "[cpu][comm]") {
  // Two groups of two running at once on four threads.
  std::vector<Tensor> t;
  for (int r = 0; r < 4; ++r) t.push_back(from_doubles({static_cast<double>(r + 1)}, {1}, PLX_F64));
  const plx_comm_id a = threads_comm().unique_id(), b = threads_comm().unique_id();
  Outcomes out(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      try {
        auto g = threads_comm().join(cpu(), 0, r % 2, 2, r < 2 ? a : b, kTimeoutMs);
        for (int k = 0; k < 10; ++k) {
          g->barrier();
          g->all_reduce(t[static_cast<size_t>(r)], PLX_REDUCE_SUM);
        }
      } catch (const std::exception& e) {
        out[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  require_ok(out);
  // Each step doubles a group's sum: (1 + 2) * 2^9 and (3 + 4) * 2^9.
  CHECK(t[0].to_doubles()[0] == 3 * 512.0);
  CHECK(t[1].to_doubles()[0] == 3 * 512.0);
  CHECK(t[2].to_doubles()[0] == 7 * 512.0);
  CHECK(t[3].to_doubles()[0] == 7 * 512.0);

  // Two threads, each a member of two groups at once.
  std::vector<Tensor> x = {from_doubles({1}, {1}, PLX_F32), from_doubles({2}, {1}, PLX_F32)};
  std::vector<Tensor> y = {from_doubles({10}, {1}, PLX_F32), from_doubles({20}, {1}, PLX_F32)};
  const plx_comm_id c = threads_comm().unique_id(), d = threads_comm().unique_id();
  Outcomes out2(2);
  std::vector<std::thread> pair;
  for (int r = 0; r < 2; ++r)
    pair.emplace_back([&, r] {
      try {
        auto gc = threads_comm().join(cpu(), 0, r, 2, c, kTimeoutMs);
        auto gd = threads_comm().join(cpu(), 0, 1 - r, 2, d, kTimeoutMs);  // other rank order
        gc->all_reduce(x[static_cast<size_t>(r)], PLX_REDUCE_SUM);
        gd->all_reduce(y[static_cast<size_t>(r)], PLX_REDUCE_MAX);
        gc->all_reduce(x[static_cast<size_t>(r)], PLX_REDUCE_SUM);
      } catch (const std::exception& e) {
        out2[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& th : pair) th.join();
  require_ok(out2);
  for (int r = 0; r < 2; ++r) {
    CHECK(x[static_cast<size_t>(r)].to_doubles()[0] == 6);
    CHECK(y[static_cast<size_t>(r)].to_doubles()[0] == 20);
  }
}

TEST_CASE("threads destroy frees the group: its id can form a new one", "[cpu][comm]") {
  const plx_comm_id id = threads_comm().unique_id();
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    Outcomes out(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          auto g = threads_comm().join(cpu(), 0, r, 2, id, kTimeoutMs);
          g->barrier();
        } catch (const std::exception& e) {
          out[static_cast<size_t>(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    require_ok(out);  // round 1 would see "already joined" had round 0's group survived
  }
}

TEST_CASE("threads init_rank: a rank that never joins times out, naming it",
          "[cpu][comm][errors]") {
  const plx_comm_id id = threads_comm().unique_id();
  Outcomes out(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)  // ranks 0 and 1 of 3; rank 2 never comes
    threads.emplace_back([&, r] {
      try {
        threads_comm().join(cpu(), 0, r, 3, id, 300);
      } catch (const std::exception& e) {
        out[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(out[static_cast<size_t>(r)], PLX_CONTAINS("init_rank: timeout"));
    // "rank 2 of the group ...", or "ranks 1, 2 of ..." should rank 1's thread start late.
    CHECK_THAT(out[static_cast<size_t>(r)],
               PLX_CONTAINS("2 of the group of 3 never joined (joined: rank"));
  }
}

TEST_CASE(
    "threads collectives: a rank that does not come times out, naming it, and the group stays "
    "failed",
    "[cpu][comm][errors]") {
  std::promise<void> failed0, failed1;
  std::vector<std::string> later(2);
  // A short timeout, but not so short that the join or the first barrier could run out on a
  // loaded machine: the test is about the second barrier.
  const Outcomes out = run_ranks(
      3,
      [&](CommGroup& g, int r) {
        g.barrier();   // all three are here: ranks 0 and 1 reach the next barrier together
        if (r == 2) {  // alive but busy elsewhere until its peers have given up
          failed0.get_future().wait();
          failed1.get_future().wait();
          try {
            g.check_async_error();
          } catch (const std::exception& e) {
            later[0] = e.what();
          }
          try {
            g.barrier();
          } catch (const std::exception& e) {
            later[1] = e.what();
          }
          return;
        }
        try {
          g.barrier();
        } catch (...) {
          (r == 0 ? failed0 : failed1).set_value();
          throw;
        }
        (r == 0 ? failed0 : failed1).set_value();
      },
      1000);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(out[static_cast<size_t>(r)], PLX_CONTAINS("barrier: timeout"));
    CHECK_THAT(out[static_cast<size_t>(r)], PLX_CONTAINS("barrier #2: timed out after 1000 ms"));
    CHECK_THAT(out[static_cast<size_t>(r)], PLX_CONTAINS("waiting for rank 2"));
  }
  CHECK(out[2].empty());
  CHECK_THAT(later[0], PLX_CONTAINS("asynchronous error: timeout"));
  CHECK_THAT(later[0], PLX_CONTAINS("waiting for rank 2"));
  CHECK_THAT(later[1], PLX_CONTAINS("barrier: timeout"));
  CHECK_THAT(later[1], PLX_CONTAINS("the group has failed"));
}

TEST_CASE("threads abort from another thread wakes every blocked rank", "[cpu][comm][errors]") {
  std::promise<CommGroup*> group1;
  std::promise<void> aborted;
  std::vector<std::string> later(2);
  const Tensor x = from_doubles({1, 2}, {2}, PLX_F32);
  const Tensor y = Tensor::zeros(cpu(), {2}, PLX_F32);
  std::thread watchdog([&] {
    CommGroup* g = group1.get_future().get();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the ranks are blocked by now
    g->abort();
    aborted.set_value();
  });
  const Outcomes out = run_ranks(2, [&](CommGroup& g, int r) {
    try {
      if (r == 0) {
        g.all_reduce(x, y, PLX_REDUCE_SUM);  // rank 1 never joins it
      } else {
        group1.set_value(&g);
        g.recv(y, 0);  // rank 0 never sends
      }
    } catch (...) {
      try {
        g.barrier();  // fails at once: the group is failed
      } catch (const std::exception& e) {
        later[static_cast<size_t>(r)] = e.what();
      }
      try {
        g.check_async_error();
      } catch (const std::exception& e) {
        later[static_cast<size_t>(r)] += std::string(" | ") + e.what();
      }
      if (r == 1) aborted.get_future().wait();  // the watchdog is done with this group
      throw;
    }
  });
  watchdog.join();
  CHECK_THAT(out[0], PLX_CONTAINS("all_reduce: aborted"));
  CHECK_THAT(out[1], PLX_CONTAINS("recv: aborted"));
  for (const std::string& s : out) CHECK_THAT(s, PLX_CONTAINS("abort() was called on rank 1"));
  for (const std::string& s : later) {
    CHECK_THAT(s, PLX_CONTAINS("barrier: aborted"));
    CHECK_THAT(s, PLX_CONTAINS("| communicator 'threads': asynchronous error: aborted"));
  }
}

TEST_CASE("threads: a rank that left makes its waiting peers fail at once", "[cpu][comm][errors]") {
  const Tensor t = Tensor::zeros(cpu(), {1}, PLX_F32);
  // Rank 1 destroys its communicator right after joining; the default 60 s timeout would be the
  // only way out if leaving were not noticed.
  const Outcomes out = run_ranks(
      2,
      [&](CommGroup& g, int r) {
        if (r == 0) g.barrier();
      },
      0);
  CHECK_THAT(out[0], PLX_CONTAINS("barrier: communicator error"));
  CHECK_THAT(out[0], PLX_CONTAINS("rank 1 left the group"));
  CHECK(out[1].empty());

  const Outcomes out2 = run_ranks(2, [&](CommGroup& g, int r) {
    if (r == 0) g.recv(t, 1);
  });
  CHECK_THAT(out2[0], PLX_CONTAINS("recv from rank 1: rank 1 left the group with no message"));
}

TEST_CASE("threads detects ranks that disagree on a collective, the group stays usable",
          "[cpu][comm][errors]") {
  // Not const: CommGroup's in-place all_reduce takes a Tensor&.
  Tensor f4a = Tensor::zeros(cpu(), {4}, PLX_F32), f4b = Tensor::zeros(cpu(), {4}, PLX_F32);
  Tensor f5 = Tensor::zeros(cpu(), {5}, PLX_F32);
  Tensor d4 = Tensor::zeros(cpu(), {4}, PLX_F64);
  std::vector<Tensor> ones = {from_doubles({1}, {1}, PLX_I32), from_doubles({1}, {1}, PLX_I32)};
  std::vector<std::vector<std::string>> seen(2);
  const Outcomes out = run_ranks(2, [&](CommGroup& g, int r) {
    auto attempt = [&](const std::function<void()>& f) {
      try {
        f();
        seen[static_cast<size_t>(r)].push_back("");
      } catch (const std::exception& e) {
        seen[static_cast<size_t>(r)].push_back(e.what());
      }
    };
    Tensor& mine = r == 0 ? f4a : f4b;
    attempt([&] { g.all_reduce(r == 0 ? f4a : f5, PLX_REDUCE_SUM); });               // count
    attempt([&] { g.all_reduce(r == 0 ? f4a : d4, PLX_REDUCE_SUM); });               // dtype
    attempt([&] { g.all_reduce(mine, r == 0 ? PLX_REDUCE_SUM : PLX_REDUCE_MAX); });  // op
    attempt([&] { g.broadcast(mine, mine, r); });                                    // root
    attempt([&] {                                                                    // kind
      if (r == 0)
        g.all_reduce(mine, PLX_REDUCE_SUM);
      else
        g.barrier();
    });
    attempt([&] { g.broadcast(mine, mine, r == 1 ? 5 : 0); });  // one rank's own bad argument
    attempt([&] { g.all_reduce(ones[static_cast<size_t>(r)], PLX_REDUCE_SUM); });  // still works
  });
  require_ok(out);
  const std::vector<std::string> want = {
      "all_reduce #1: the ranks disagree on the count (rank 0: 4, rank 1: 5)",
      "all_reduce #2: the ranks disagree on the dtype (rank 0: f32, rank 1: f64)",
      "all_reduce #3: the ranks disagree on the reduce op (rank 0: sum, rank 1: max)",
      "broadcast #4: the ranks disagree on the root (rank 0: 0, rank 1: 1)",
      "rank 0 called all_reduce but rank 1 called barrier",
      "broadcast #6: rank 1: root 5 is not a rank of this group of 2"};
  for (int r = 0; r < 2; ++r) {
    REQUIRE(seen[static_cast<size_t>(r)].size() == want.size() + 1);
    for (size_t k = 0; k < want.size(); ++k) {
      INFO("rank " << r << " call " << k + 1);
      CHECK_THAT(seen[static_cast<size_t>(r)][k], PLX_CONTAINS(want[k]));
    }
    CHECK(seen[static_cast<size_t>(r)].back().empty());
    CHECK(ones[static_cast<size_t>(r)].to_doubles()[0] == 2);
  }
}

TEST_CASE("threads init_rank rejects bad configurations", "[cpu][comm][errors]") {
  Communicator& c = threads_comm();
  const plx_comm_id id = c.unique_id();
  REQUIRE_THROWS_WITH(c.join(cpu(), 0, -1, -1, id),
                      PLX_CONTAINS("cannot take rank and size from a launcher"));
  REQUIRE_THROWS_WITH(c.join(cpu(), 0, 2, 2, id), PLX_CONTAINS("rank 2 is not in [0, 2)"));
  REQUIRE_THROWS_WITH(c.join(cpu(), 0, 0, 0, id), PLX_CONTAINS("size must be >= 1"));
  REQUIRE_THROWS_WITH(c.join(cpu(), 0, 0, 1, id, -5), PLX_CONTAINS("timeout_ms must be >= 0"));
  plx_comm_id foreign{};  // not made by this communicator
  REQUIRE_THROWS_WITH(c.join(cpu(), 0, 0, 1, foreign), PLX_CONTAINS("the id was not made by"));

  // A second rank 0, and a rank that gives another size, are refused; the group still forms.
  const plx_comm_id id2 = c.unique_id();
  Outcomes out(3);
  std::string wrong_size, again;
  std::promise<void> refused;  // set by the thread refused as a second rank 0
  std::shared_future<void> refused_f = refused.get_future().share();
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      std::unique_ptr<CommGroup> g;
      try {
        g = c.join(cpu(), 0, i == 2 ? 1 : 0, 2, id2, kTimeoutMs);  // threads 0, 1: rank 0
      } catch (const std::exception& e) {
        out[static_cast<size_t>(i)] = e.what();
        refused.set_value();
        return;
      }
      try {
        // The group lives until the refused thread is done, so that it cannot form a new one.
        refused_f.wait_for(std::chrono::milliseconds(kTimeoutMs));
        g->barrier();
        if (i == 2) {  // the group is formed and alive: late joiners are refused at once
          try {
            c.join(cpu(), 0, 1, 3, id2);
          } catch (const std::exception& e) {
            wrong_size = e.what();
          }
          try {
            c.join(cpu(), 0, 1, 2, id2);
          } catch (const std::exception& e) {
            again = e.what();
          }
        }
        g->barrier();
      } catch (const std::exception& e) {
        out[static_cast<size_t>(i)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  CHECK(out[2].empty());
  // Whichever of the two came second was refused, the other formed the group.
  CHECK((out[0].empty() != out[1].empty()));
  CHECK_THAT(out[0] + out[1], PLX_CONTAINS("rank 0 already joined this group"));
  CHECK_THAT(wrong_size, PLX_CONTAINS("rank 1 gives the group size 3, the ranks that joined "
                                      "before gave 2"));
  CHECK_THAT(again, PLX_CONTAINS("rank 1 already joined this group"));
}

TEST_CASE("threads accepts cpu buffers only", "[cpu][comm][errors]") {
  // A runtime with the test plugin's "testdev" backend; the threads communicator belongs to the
  // main test runtime.
  RuntimeOptions o;
  o.plugins.paths = {fixture_dir() + "/good"};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  Runtime other(o);
  Backend& testdev = other.backend("testdev");
  Communicator& c = threads_comm();
  CHECK(c.accepts("cpu"));
  CHECK_FALSE(c.accepts("testdev"));
  const plx_comm_id id = c.unique_id();
  // The core refuses before calling the plugin ...
  REQUIRE_THROWS_WITH(c.join(testdev, 0, 0, 1, id),
                      PLX_CONTAINS("communicator 'threads' does not work on backend 'testdev' "
                                   "(it accepts: cpu)"));
  // ... and the plugin refuses on its own when called directly.
  RawRank raw(id, 0, 1, &testdev.table());
  CHECK(raw.status == PLX_ERR_INVALID_ARGUMENT);
  CHECK_THAT(c.plugin().last_error(),
             PLX_CONTAINS("exchanges buffers of backend 'cpu', not 'testdev'"));
}

TEST_CASE("threads check_async_error is quiet on a healthy group, ids are distinct",
          "[cpu][comm]") {
  require_ok(run_ranks(2, [&](CommGroup& g, int) {
    g.barrier();
    g.check_async_error();
  }));
  const plx_comm_id a = threads_comm().unique_id(), b = threads_comm().unique_id();
  CHECK(std::memcmp(a.bytes, b.bytes, sizeof a.bytes) != 0);
}
