#include "plexus/comm_bench.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "plexus/backend.hpp"
#include "plexus/communicator.hpp"
#include "plexus/parallel.hpp"
#include "plexus/error.hpp"
#include "plexus/json.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"
#include "plexus/tensor.hpp"

namespace plexus {

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr plx_collective kAllCollectives[] = {PLX_COLL_ALL_REDUCE, PLX_COLL_BROADCAST,
                                              PLX_COLL_ALL_GATHER, PLX_COLL_REDUCE_SCATTER};

[[noreturn]] void bad_option(std::string_view option, std::string_view text,
                             const std::string& why) {
  throw ConfigError(std::string(option) + ": '" + std::string(text) + "' " + why);
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

}  // namespace

// ---- the pure parts ----

uint64_t parse_bytes(std::string_view option, std::string_view text) {
  const std::string why =
      "is not a size in bytes (digits with an optional K, M or G: 8, 64K, 256M, 1G)";
  size_t i = 0;
  uint64_t v = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10)
      bad_option(option, text, "is too large");
    v = v * 10 + d;
    ++i;
  }
  if (i == 0) bad_option(option, text, why);
  const std::string unit = lower(text.substr(i));
  int shift = 0;
  if (unit.empty() || unit == "b")
    shift = 0;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    shift = 10;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    shift = 20;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    shift = 30;
  else
    bad_option(option, text, why);
  if (shift && v > (std::numeric_limits<uint64_t>::max() >> shift))
    bad_option(option, text, "is too large");
  v <<= shift;
  if (v == 0) bad_option(option, text, "must be at least 1 byte");
  return v;
}

std::vector<plx_collective> parse_collectives(std::string_view option, std::string_view text) {
  std::vector<plx_collective> out;
  if (text == "all") return {std::begin(kAllCollectives), std::end(kAllCollectives)};
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string_view name = text.substr(start, end - start);
    bool found = false;
    for (plx_collective c : kAllCollectives)
      if (name == plx_collective_string(c)) {
        if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
        found = true;
      }
    if (!found)
      throw ConfigError(std::string(option) + ": unknown collective '" + std::string(name) +
                        "' in '" + std::string(text) +
                        "' (expected all, or a comma-separated list of all_reduce, broadcast, "
                        "all_gather, reduce_scatter)");
    start = end + 1;
  }
  return out;
}

plx_dtype parse_dtype(std::string_view option, std::string_view text) {
  const plx_dtype d = dtype_from_name(text);
  if (d == PLX_DTYPE_NONE)
    bad_option(option, text, "is not a dtype (expected f32, f16, bf16, f64, i32, i64 or u8)");
  return d;
}

std::vector<uint64_t> bench_sizes(uint64_t min_bytes, uint64_t max_bytes, uint64_t factor) {
  if (min_bytes == 0) throw ConfigError("--min-bytes: must be at least 1 byte");
  if (min_bytes > max_bytes)
    throw ConfigError("--min-bytes " + std::to_string(min_bytes) + " is larger than --max-bytes " +
                      std::to_string(max_bytes));
  if (factor < 2) throw ConfigError("--factor: must be at least 2, got " + std::to_string(factor));
  std::vector<uint64_t> sizes;
  for (uint64_t s = min_bytes;; s *= factor) {
    sizes.push_back(s);
    if (s > max_bytes / factor) break;  // the next would pass max (or overflow)
  }
  return sizes;
}

BenchShape bench_shape(plx_collective c, uint64_t nominal_bytes, uint64_t elem_size,
                       int32_t ranks) {
  BenchShape s;
  const uint64_t n = static_cast<uint64_t>(std::max(ranks, 1));
  const uint64_t elems = nominal_bytes / elem_size;
  switch (c) {
    case PLX_COLL_ALL_REDUCE:
    case PLX_COLL_BROADCAST:
      s.count = elems;
      s.send_elems = s.recv_elems = elems;
      break;
    case PLX_COLL_ALL_GATHER:
      s.count = elems / n;
      s.send_elems = s.count;
      s.recv_elems = s.count * n;
      break;
    case PLX_COLL_REDUCE_SCATTER:
      s.count = elems / n;
      s.send_elems = s.count * n;
      s.recv_elems = s.count;
      break;
  }
  s.bytes = std::max(s.send_elems, s.recv_elems) * elem_size;
  if (s.count == 0) s = BenchShape{};
  return s;
}

double busbw_factor(plx_collective c, int32_t ranks) {
  const double n = ranks;
  if (ranks < 1) return 0;
  switch (c) {
    case PLX_COLL_ALL_REDUCE:
      return 2 * (n - 1) / n;
    case PLX_COLL_ALL_GATHER:
    case PLX_COLL_REDUCE_SCATTER:
      return (n - 1) / n;
    case PLX_COLL_BROADCAST:
      return 1;
  }
  return 0;
}

int32_t choose_iters(double seconds_per_call, double target_seconds, int32_t min_iters,
                     int32_t max_iters) {
  if (!(seconds_per_call > 0) || !std::isfinite(seconds_per_call)) return max_iters;
  const double want = std::ceil(target_seconds / seconds_per_call);
  if (!(want < static_cast<double>(max_iters))) return max_iters;
  return std::max(min_iters, static_cast<int32_t>(want));
}

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// ---- the benchmark ----

std::string comm_bench_comm_name(const CommBenchOptions& o) {
  if (!o.comm.empty()) return o.comm;
  if (o.backend == "cpu") return "mpi";
  if (o.backend == "cuda") return "nccl";
  throw ConfigError("--comm: no default communicator for backend '" + o.backend +
                    "' (mpi goes with cpu, nccl with cuda); name one with --comm");
}

namespace {

using Clock = std::chrono::steady_clock;

std::string not_available(const Runtime& rt, const std::string& what, const std::string& name) {
  std::string comms, plugins, skipped;
  for (const Communicator* c : rt.communicators()) comms += (comms.empty() ? "" : ", ") + c->name();
  for (const auto& p : rt.plugins()) plugins += (plugins.empty() ? "" : ", ") + p->name();
  for (const auto& s : rt.skipped())
    skipped += (skipped.empty() ? "" : "; ") + s.path + ": " + s.reason;
  std::string msg = what + " '" + name + "' is not available: no loaded plugin provides it (";
  msg += "communicators: " + (comms.empty() ? std::string("none") : comms);
  msg += "; plugins loaded: " + (plugins.empty() ? std::string("none") : plugins);
  msg += "; plugins skipped: " + (skipped.empty() ? std::string("none") : skipped) + ")";
  if (name == "mpi") msg += ". The mpi plugin is built when CMake finds MPI (libopenmpi-dev)";
  if (name == "nccl") msg += ". The nccl plugin is built when CMake finds CUDA and NCCL";
  return msg;
}

// The value rank r contributes at element i: small integers, so every sum is exact.
double value(int32_t r, uint64_t i) {
  return static_cast<double>((static_cast<uint64_t>(r) + i) % 3);
}

// What recv[i] must hold after collective c on `rank` of `n` with per-call `count`.
double expected(plx_collective c, plx_dtype dtype, int32_t rank, int32_t n, uint64_t count,
                uint64_t i) {
  double x = 0;
  switch (c) {
    case PLX_COLL_ALL_REDUCE:
      for (int32_t q = 0; q < n; ++q) x += value(q, i);
      break;
    case PLX_COLL_BROADCAST:
      x = value(0, i);
      break;
    case PLX_COLL_ALL_GATHER:
      x = value(static_cast<int32_t>(i / count), i % count);
      break;
    case PLX_COLL_REDUCE_SCATTER:
      for (int32_t q = 0; q < n; ++q) x += value(q, static_cast<uint64_t>(rank) * count + i);
      break;
  }
  return dtype == PLX_U8 ? std::fmod(x, 256.0) : x;  // u8 sums wrap
}

class Bench {
 public:
  Bench(CommGroup& g, const CommBenchOptions& o, std::ostream* out)
      : g_(g),
        be_(g.backend()),
        dev_(g.device()),
        o_(o),
        out_(out),
        rank_(g.rank()),
        n_(g.size()) {}

  CommBenchReport run(const std::string& comm_name) {
    CommBenchReport r;
    r.comm = comm_name;
    r.backend = be_.name();
    r.rank = rank_;
    r.ranks = n_;
    r.dtype = o_.dtype;
    r.has_native = g_.has_bench_native();
    r.options = o_;
    const std::vector<uint64_t> sizes = bench_sizes(o_.min_bytes, o_.max_bytes, o_.factor);
    const uint64_t elem = dtype_size(o_.dtype);
    const uint64_t max_elems = o_.max_bytes / elem;
    if (max_elems == 0)
      throw ConfigError("--max-bytes " + std::to_string(o_.max_bytes) + " is smaller than one " +
                        dtype_name(o_.dtype) + " element");
    send_ = Tensor::empty(be_, {static_cast<int64_t>(max_elems)}, o_.dtype, dev_);
    recv_ = Tensor::empty(be_, {static_cast<int64_t>(max_elems)}, o_.dtype, dev_);
    fill_send(max_elems);
    if (out_) *out_ << comm_bench_header(r) << std::flush;
    for (plx_collective c : o_.collectives) {
      uint64_t last_bytes = 0;
      for (uint64_t size : sizes) {
        const BenchShape s = bench_shape(c, size, elem, n_);
        if (s.count == 0 || s.bytes == last_bytes) continue;  // too small, or the same row again
        last_bytes = s.bytes;
        r.rows.push_back(measure(c, s, r.has_native));
        const CommBenchRow& row = r.rows.back();
        if (out_) *out_ << comm_bench_row_line(row) << std::flush;
      }
    }
    for (size_t i = 0; i < r.rows.size(); ++i) {
      const CommBenchRow& row = r.rows[i];
      if (row.bytes < kMiB || !row.overhead_pct) continue;
      if (!r.max_overhead_pct_1mib || *row.overhead_pct > *r.max_overhead_pct_1mib) {
        r.max_overhead_pct_1mib = row.overhead_pct;
        r.max_overhead_row = static_cast<int64_t>(i);
      }
    }
    r.wrong = wrong_;
    if (out_) *out_ << comm_bench_summary(r) << std::flush;
    return r;
  }

 private:
  void fill_send(uint64_t elems) {
    std::vector<uint8_t> host(elems * dtype_size(o_.dtype));
    visit_dtype(o_.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* p = reinterpret_cast<T*>(host.data());
      for (uint64_t i = 0; i < elems; ++i) p[i] = convert<T>(value(rank_, i));
    });
    send_.copy_from_host(host.data());
  }

  // Our layer: the CommGroup call a trainer would make.
  void ours(plx_collective c, const Tensor& send, const Tensor& recv) {
    switch (c) {
      case PLX_COLL_ALL_REDUCE:
        g_.all_reduce(send, recv, PLX_REDUCE_SUM);
        break;
      case PLX_COLL_BROADCAST:
        g_.broadcast(recv, recv, 0);
        break;  // in place, as native
      case PLX_COLL_ALL_GATHER:
        g_.all_gather(send, recv);
        break;
      case PLX_COLL_REDUCE_SCATTER:
        g_.reduce_scatter(send, recv, PLX_REDUCE_SUM);
        break;
    }
  }

  // recv poisoned (all bits set: NaN, or -1, or 255), except a broadcast root's, which gets the
  // root's data to send.
  void prepare(plx_collective c, const Tensor& send, const Tensor& recv) {
    if (c == PLX_COLL_BROADCAST && rank_ == 0)
      be_.copy(dev_, recv.data(), send_.data(), recv.nbytes(), PLX_COPY_D2D, be_.stream(dev_));
    else
      be_.memset(dev_, recv.data(), 0xff, recv.nbytes(), be_.stream(dev_));
    (void)send;
    be_.sync(dev_);
  }

  // Compares recv with the expected values (all of it when small, else 33 windows spread over
  // it, first and last elements included); returns the number of wrong elements seen.
  uint64_t check(plx_collective c, const BenchShape& s, const Tensor& recv) {
    const uint64_t n = static_cast<uint64_t>(recv.numel());
    const uint64_t elem = dtype_size(o_.dtype);
    const uint64_t window = n <= (1u << 16) ? n : 256;
    const uint64_t windows = window == n ? 1 : 33;
    uint64_t wrong = 0;
    for (uint64_t w = 0; w < windows; ++w) {
      const uint64_t start = windows == 1 ? 0 : w * (n - window) / (windows - 1);
      const std::vector<double> got =
          recv.alias(o_.dtype, {static_cast<int64_t>(window)}, start * elem).to_doubles();
      for (uint64_t i = 0; i < window; ++i)
        if (got[i] != expected(c, o_.dtype, rank_, n_, s.count, start + i)) ++wrong;
    }
    return wrong;
  }

  // Seconds for `iters` calls of ours on this rank, from after a barrier to the stream's end.
  double time_ours(plx_collective c, const Tensor& send, const Tensor& recv, int32_t iters) {
    g_.barrier();
    be_.sync(dev_);
    const auto t0 = Clock::now();
    for (int32_t i = 0; i < iters; ++i) ours(c, send, recv);
    be_.sync(dev_);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Element-wise max over the ranks.
  std::vector<double> max_over_ranks(const std::vector<double>& v) {
    const plx_dtype t = (be_.device(dev_).caps & PLX_CAP_F64) ? PLX_F64 : PLX_F32;
    std::vector<uint8_t> host(v.size() * dtype_size(t));
    for (size_t i = 0; i < v.size(); ++i) {
      if (t == PLX_F64)
        reinterpret_cast<double*>(host.data())[i] = v[i];
      else
        reinterpret_cast<float*>(host.data())[i] = static_cast<float>(v[i]);
    }
    const Tensor x = Tensor::from_host(be_, host.data(), {static_cast<int64_t>(v.size())}, t, dev_);
    g_.all_reduce(x, PLX_REDUCE_MAX);
    be_.sync(dev_);
    return x.to_doubles();
  }

  CommBenchRow measure(plx_collective c, const BenchShape& s, bool native) {
    const Tensor send = send_.alias(o_.dtype, {static_cast<int64_t>(s.send_elems)}, 0);
    const Tensor recv = recv_.alias(o_.dtype, {static_cast<int64_t>(s.recv_elems)}, 0);
    // Checked first, ours and native: a baseline that moved nothing would look fast.
    uint64_t wrong = 0;
    prepare(c, send, recv);
    ours(c, send, recv);
    be_.sync(dev_);
    wrong += check(c, s, recv);
    if (native) {
      prepare(c, send, recv);
      (void)g_.bench_native(c, send, recv, 1);
      wrong += check(c, s, recv);
    }
    // Warm-up, which also estimates one call's time (the slowest rank's, so all agree on iters).
    const int32_t warm = std::max(o_.warmup, 1);
    const double est = time_ours(c, send, recv, warm) / warm;
    if (native && o_.warmup > 0) (void)g_.bench_native(c, send, recv, o_.warmup);
    const int32_t iters =
        o_.iters > 0 ? o_.iters : choose_iters(max_over_ranks({est})[0], o_.target_seconds);
    // Rounds of ours and native interleaved, alternating which goes first, so that drift (the
    // machine's load, caches, clocks) falls on both alike.
    const size_t rounds = static_cast<size_t>(o_.rounds);
    std::vector<double> times(2 * rounds + 1, 0.0);
    for (size_t k = 0; k < rounds; ++k) {
      const bool ours_first = k % 2 == 0;
      if (ours_first) times[k] = time_ours(c, send, recv, iters);
      if (native) times[rounds + k] = *g_.bench_native(c, send, recv, iters);
      if (!ours_first) times[k] = time_ours(c, send, recv, iters);
    }
    times[2 * rounds] = static_cast<double>(wrong);
    const std::vector<double> worst = max_over_ranks(times);

    CommBenchRow row;
    row.collective = c;
    row.bytes = s.bytes;
    row.count = s.count;
    row.dtype = o_.dtype;
    row.iters = iters;
    for (size_t k = 0; k < rounds; ++k) {
      row.ours_rounds_us.push_back(worst[k] / iters * 1e6);
      if (native) row.native_rounds_us.push_back(worst[rounds + k] / iters * 1e6);
    }
    row.time_us = median(row.ours_rounds_us);
    row.algbw_gbs = static_cast<double>(s.bytes) / (row.time_us * 1e-6) / 1e9;
    row.busbw_gbs = row.algbw_gbs * busbw_factor(c, n_);
    if (native) {
      row.native_us = median(row.native_rounds_us);
      // Per round, ours against the native run beside it (the same moment's load), then the
      // median: steadier on a shared machine than the ratio of the two medians.
      std::vector<double> ratios;
      for (size_t k = 0; k < rounds; ++k)
        ratios.push_back((row.ours_rounds_us[k] - row.native_rounds_us[k]) /
                         row.native_rounds_us[k] * 100);
      row.overhead_pct = median(ratios);
    }
    row.wrong = static_cast<uint64_t>(worst[2 * rounds]);
    wrong_ += row.wrong;
    return row;
  }

  CommGroup& g_;
  Backend& be_;
  const int32_t dev_;
  const CommBenchOptions& o_;
  std::ostream* out_;
  const int32_t rank_, n_;
  Tensor send_, recv_;
  uint64_t wrong_ = 0;
};

}  // namespace

void check_comm_bench_options(const CommBenchOptions& o) {
  (void)bench_sizes(o.min_bytes, o.max_bytes, o.factor);
  if (o.iters < 0)
    throw ConfigError("--iters: must be >= 0 (0: chosen per size), got " + std::to_string(o.iters));
  if (o.warmup < 0) throw ConfigError("--warmup: must be >= 0, got " + std::to_string(o.warmup));
  if (o.rounds < 1) throw ConfigError("--rounds: must be >= 1, got " + std::to_string(o.rounds));
  if (o.collectives.empty()) throw ConfigError("--ops: no collective to run");
  if (dtype_size(o.dtype) == 0) throw ConfigError("--dtype: not a dtype");
  if (o.max_bytes < dtype_size(o.dtype))
    throw ConfigError("--max-bytes " + std::to_string(o.max_bytes) + " is smaller than one " +
                      dtype_name(o.dtype) + " element");
  if (o.timeout_ms < 0)
    throw ConfigError("--timeout-ms: must be >= 0, got " + std::to_string(o.timeout_ms));
}

CommBenchReport run_comm_bench(Runtime& rt, const CommBenchOptions& o, std::ostream* out) {
  // Options first, so that a bad one fails before any process waits for the others.
  check_comm_bench_options(o);
  const std::string name = comm_bench_comm_name(o);
  Communicator* comm = nullptr;
  for (Communicator* c : rt.communicators())
    if (c->name() == name) comm = c;
  if (!comm) throw PluginError(not_available(rt, "communicator", name));
  Backend* be = rt.find_backend(o.backend);
  if (!be) {
    std::string list;
    for (const Backend* b : rt.backends()) list += (list.empty() ? "" : ", ") + b->name();
    throw PluginError("backend '" + o.backend + "' is not available (loaded backends: " +
                      (list.empty() ? "none" : list) + ")");
  }
  if (be->device_count() == 0)
    throw PluginError("backend '" + o.backend + "' has no device" +
                      (be->unavailable_reason().empty() ? "" : ": " + be->unavailable_reason()));
  const int32_t dev = launch_info().local_rank % be->device_count();
  LaunchGroup lg =
      join_launch(rt, *comm, *be, dev, o.bootstrap == name ? "" : o.bootstrap, o.timeout_ms);
  Bench bench(*lg.group, o, lg.group->rank() == 0 ? out : nullptr);
  return bench.run(name);
}

// ---- the report ----

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string size_text(uint64_t b) {
  if (b >= kMiB && b % kMiB == 0) return std::to_string(b / kMiB) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b / 1024) + " KiB";
  return std::to_string(b) + " B";
}

}  // namespace

std::string comm_bench_header(const CommBenchReport& r) {
  const CommBenchOptions& o = r.options;
  std::string s = "# plexus bench comm: " + r.comm + " on " + r.backend + ", " +
                  std::to_string(r.ranks) + (r.ranks == 1 ? " rank" : " ranks") + ", " +
                  dtype_name(r.dtype) + ", reductions sum, broadcast in place from rank 0\n";
  s += "# sizes " + size_text(o.min_bytes) + " to " + size_text(o.max_bytes) + " (x" +
       std::to_string(o.factor) + "), warmup " + std::to_string(o.warmup) + ", rounds " +
       std::to_string(o.rounds) + ", iters " +
       (o.iters > 0 ? std::to_string(o.iters)
                    : "per size (runs of ~" + fmt("%.0f", o.target_seconds * 1e3) + " ms, >= 5)") +
       "\n";
  s += "# time: median over rounds of the slowest rank's time per call; busbw as nccl-tests\n";
  if (r.has_native)
    s +=
        "# native: the same calls made directly on the library (bench_native), interleaved;\n"
        "# overhead: median over rounds of (ours - native) / native, each round against its pair\n";
  else
    s += "# native: none (communicator '" + r.comm + "' has no bench_native)\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "#%15s %12s %12s %5s %7s %12s %11s %11s %12s %9s %6s\n",
                "collective", "size(B)", "count", "type", "iters", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "native(us)", "overhead", "wrong");
  s += buf;
  return s;
}

std::string comm_bench_row_line(const CommBenchRow& row) {
  char buf[256];
  const std::string native = row.native_us ? fmt("%.2f", *row.native_us) : "-";
  const std::string over = row.overhead_pct ? fmt("%+.2f%%", *row.overhead_pct) : "-";
  std::snprintf(buf, sizeof buf, "%16s %12llu %12llu %5s %7d %12.2f %11.3f %11.3f %12s %9s %6llu\n",
                plx_collective_string(row.collective), static_cast<unsigned long long>(row.bytes),
                static_cast<unsigned long long>(row.count), dtype_name(row.dtype), row.iters,
                row.time_us, row.algbw_gbs, row.busbw_gbs, native.c_str(), over.c_str(),
                static_cast<unsigned long long>(row.wrong));
  return buf;
}

std::string comm_bench_summary(const CommBenchReport& r) {
  std::string s = "# max overhead at >= 1 MiB: ";
  if (!r.has_native) {
    s += "n/a (communicator '" + r.comm + "' has no native baseline)\n";
  } else if (!r.max_overhead_pct_1mib) {
    s += "n/a (no size of 1 MiB or more was run)\n";
  } else {
    const CommBenchRow& row = r.rows[static_cast<size_t>(r.max_overhead_row)];
    s += fmt("%+.2f%%", *r.max_overhead_pct_1mib) + " (" + plx_collective_string(row.collective) +
         ", " + size_text(row.bytes) + ")\n";
  }
  // The largest size run of each collective: its bus bandwidth.
  std::string big;
  for (plx_collective c : r.options.collectives) {
    const CommBenchRow* last = nullptr;
    for (const CommBenchRow& row : r.rows)
      if (row.collective == c) last = &row;
    if (last)
      big += (big.empty() ? "" : ", ") + std::string(plx_collective_string(c)) + " " +
             fmt("%.3f", last->busbw_gbs) + " GB/s at " + size_text(last->bytes);
  }
  if (!big.empty()) s += "# busbw at the largest size: " + big + "\n";
  s += r.wrong == 0 ? "# results checked: all correct\n"
                    : "# results checked: " + std::to_string(r.wrong) +
                          " wrong element(s) (column wrong, the most any rank saw per size)\n";
  return s;
}

std::string comm_bench_json(const CommBenchReport& r) {
  const CommBenchOptions& o = r.options;
  JsonArray colls;
  for (plx_collective c : o.collectives) colls.push(plx_collective_string(c));
  JsonObject opts;
  opts.add("min_bytes", o.min_bytes)
      .add("max_bytes", o.max_bytes)
      .add("factor", o.factor)
      .add("iters", o.iters)
      .add("warmup", o.warmup)
      .add("rounds", o.rounds)
      .add("target_seconds", o.target_seconds)
      .add("collectives", colls);
  JsonArray rows;
  for (const CommBenchRow& row : r.rows) {
    JsonObject j;
    JsonArray ours, native;
    for (double v : row.ours_rounds_us) ours.push(v);
    for (double v : row.native_rounds_us) native.push(v);
    j.add("collective", plx_collective_string(row.collective))
        .add("bytes", row.bytes)
        .add("count", row.count)
        .add("dtype", dtype_name(row.dtype))
        .add("iters", row.iters)
        .add("time_us", row.time_us)
        .add("algbw_gbs", row.algbw_gbs)
        .add("busbw_gbs", row.busbw_gbs);
    if (row.native_us)
      j.add("native_time_us", *row.native_us);
    else
      j.add_null("native_time_us");
    if (row.overhead_pct)
      j.add("overhead_pct", *row.overhead_pct);
    else
      j.add_null("overhead_pct");
    j.add("wrong", row.wrong).add("rounds_us", ours).add("native_rounds_us", native);
    rows.push(j);
  }
  JsonObject root;
  root.add("benchmark", "comm")
      .add("comm", r.comm)
      .add("backend", r.backend)
      .add("ranks", r.ranks)
      .add("dtype", dtype_name(r.dtype))
      .add("native", r.has_native)
      .add("options", opts)
      .add("rows", rows);
  if (r.max_overhead_pct_1mib)
    root.add("max_overhead_pct_at_1mib_and_above", *r.max_overhead_pct_1mib);
  else
    root.add_null("max_overhead_pct_at_1mib_and_above");
  root.add("wrong", r.wrong);
  return root.str();
}

}  // namespace plexus
