// The communicator conformance suite: one process per rank, started by a launcher
// (`mpirun -np N plexus_comm_conformance --comm mpi`). Every collective, reduce op and dtype at
// sizes 0, 1, odd and large (including counts that do not divide by the world size), separate
// and in place, broadcast from every root, a send/recv ring, barriers, and floats that must
// come out bit-identical on every rank. Expected values are computed here, exactly: the inputs
// are small integers, so every sum is exact in every dtype.
//
// --comm NAME      the communicator under test ("mpi", "nccl", ...)
// --backend NAME   whose buffers it exchanges (default: the first it accepts)
// --bootstrap NAME for a communicator without a launcher of its own (NCCL): join every process
//                  through NAME (the launcher's communicator, "mpi"), make the id on rank 0 and
//                  broadcast it there
//
// --scenario hung-peer  rank 1 sleeps through a collective: rank 0 must fail with a timeout
//                       naming the operation (within --timeout-ms, default 1000), not hang
// --scenario dead-peer  rank 1 exits abruptly after joining: nobody may hang (the launcher ends
//                       the job with an error)
//
// Prints one line per rank and the first failures; exits 0 when every check passed, 1 when one
// failed, 77 (skipped) when the communicator or backend is not available here.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <map>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "plexus/backend.hpp"
#include "plexus/communicator.hpp"
#include "plexus/parallel.hpp"
#include "plexus/runtime.hpp"
#include "plexus/tensor.hpp"

using namespace plexus;

namespace {

struct Failures {
  int64_t checks = 0;
  std::vector<std::string> what;
  void expect(bool ok, const std::string& msg) {
    ++checks;
    if (!ok) what.push_back(msg);
  }
};

// The input of rank r at element i: a small integer, so sums are exact in every dtype.
double value(int r, uint64_t i) { return static_cast<double>((r * 5 + i * 3) % 11); }

// Host bytes of n elements of `dtype` holding f(i).
template <class F>
std::vector<uint8_t> host(plx_dtype dtype, uint64_t n, F f) {
  std::vector<uint8_t> b(n * dtype_size(dtype) + 1);
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (uint64_t i = 0; i < n; ++i) {
      const T x = convert<T>(f(i));
      std::memcpy(b.data() + i * sizeof(T), &x, sizeof(T));
    }
  });
  return b;
}

std::vector<double> doubles(const Tensor& t) { return t.numel() ? t.to_doubles() : std::vector<double>{}; }

Tensor make(Backend& be, int32_t dev, plx_dtype dtype, uint64_t n, const std::vector<uint8_t>& bytes) {
  return Tensor::from_host(be, bytes.data(), {static_cast<int64_t>(n)}, dtype, dev);
}

// Poison: a value no check expects.
std::vector<uint8_t> poison(plx_dtype dtype, uint64_t n) {
  return host(dtype, n, [](uint64_t) { return 99.0; });
}

double reduce(plx_reduce_op op, int size, uint64_t i, plx_dtype dtype) {
  double acc = value(0, i);
  for (int r = 1; r < size; ++r) {
    const double x = value(r, i);
    if (op == PLX_REDUCE_MAX) acc = std::max(acc, x);
    else if (op == PLX_REDUCE_MIN) acc = std::min(acc, x);
    else acc += x;
  }
  if (op == PLX_REDUCE_AVG) {
    acc /= size;
    if (!(kFloatTypes & dtype_bit(dtype))) acc = std::trunc(acc);
  }
  return acc;
}

std::string at(const char* op, plx_dtype dtype, uint64_t n, const std::string& more, uint64_t i,
               double got, double want) {
  std::ostringstream s;
  s << op << " " << dtype_name(dtype) << " count " << n << more << ": element " << i << " is "
    << got << ", expected " << want;
  return s.str();
}

void run_suite(CommGroup& g, Failures& f) {
  Backend& be = g.backend();
  const int32_t dev = g.device();
  const int rank = g.rank(), size = g.size();
  const std::vector<uint64_t> counts = {0, 1, 5, 1023, 65537};
  const plx_reduce_op ops[] = {PLX_REDUCE_SUM, PLX_REDUCE_AVG, PLX_REDUCE_MAX, PLX_REDUCE_MIN};
  for (int32_t d = 0; d < PLX_DTYPE_COUNT; ++d) {
    const plx_dtype dtype = static_cast<plx_dtype>(d);
    if (!(be.device(dev).caps & PLX_CAP_F64) && dtype == PLX_F64) continue;
    for (uint64_t n : counts) {
      const auto mine = host(dtype, n, [&](uint64_t i) { return value(rank, i); });
      for (plx_reduce_op op : ops) {
        const std::string how = std::string(" ") + plx_reduce_op_string(op);
        for (bool in_place : {false, true}) {
          const Tensor send = make(be, dev, dtype, n, mine);
          const Tensor recv = in_place ? send : make(be, dev, dtype, n, poison(dtype, n));
          g.all_reduce(send, recv, op);
          be.sync(dev);
          const auto got = doubles(recv);
          for (uint64_t i = 0; i < n; ++i) {
            const double want = reduce(op, size, i, dtype);
            if (got[i] != want) {
              f.expect(false, at("all_reduce", dtype, n, how + (in_place ? " in place" : ""), i, got[i], want));
              break;
            }
          }
          f.expect(true, "");
        }
        // reduce_scatter: rank r gets block r of the reduction of every rank's size*n elements.
        const auto big = host(dtype, n * static_cast<uint64_t>(size), [&](uint64_t i) { return value(rank, i); });
        const Tensor send = make(be, dev, dtype, n * static_cast<uint64_t>(size), big);
        const Tensor recv = make(be, dev, dtype, n, poison(dtype, n));
        g.reduce_scatter(send, recv, op);
        be.sync(dev);
        const auto got = doubles(recv);
        for (uint64_t i = 0; i < n; ++i) {
          const double want = reduce(op, size, static_cast<uint64_t>(rank) * n + i, dtype);
          if (got[i] != want) {
            f.expect(false, at("reduce_scatter", dtype, n, how, i, got[i], want));
            break;
          }
        }
        f.expect(true, "");
      }
      // broadcast from every root, separate and in place.
      for (int root = 0; root < size; ++root)
        for (bool in_place : {false, true}) {
          const Tensor send = make(be, dev, dtype, n, mine);
          const Tensor recv = in_place ? send : make(be, dev, dtype, n, poison(dtype, n));
          g.broadcast(send, recv, root);
          be.sync(dev);
          const auto got = doubles(recv);
          for (uint64_t i = 0; i < n; ++i)
            if (got[i] != value(root, i)) {
              f.expect(false, at("broadcast", dtype, n, " root " + std::to_string(root) +
                                                            (in_place ? " in place" : ""),
                                 i, got[i], value(root, i)));
              break;
            }
          f.expect(true, "");
        }
      // all_gather: the concatenation in rank order.
      {
        const Tensor send = make(be, dev, dtype, n, mine);
        const Tensor recv = make(be, dev, dtype, n * static_cast<uint64_t>(size),
                                 poison(dtype, n * static_cast<uint64_t>(size)));
        g.all_gather(send, recv);
        be.sync(dev);
        const auto got = doubles(recv);
        for (uint64_t i = 0; i < got.size(); ++i) {
          const double want = value(static_cast<int>(i / n), i % n);
          if (got[i] != want) {
            f.expect(false, at("all_gather", dtype, n, "", i, got[i], want));
            break;
          }
        }
        f.expect(true, "");
      }
      // A ring: every rank sends to the next and receives from the previous, grouped.
      if (size > 1) {
        const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        const Tensor out = make(be, dev, dtype, n, mine);
        const Tensor in = make(be, dev, dtype, n, poison(dtype, n));
        g.group_begin();
        g.send(out, next);
        g.recv(in, prev);
        g.group_end();
        be.sync(dev);
        const auto got = doubles(in);
        for (uint64_t i = 0; i < n; ++i)
          if (got[i] != value(prev, i)) {
            f.expect(false, at("send/recv ring", dtype, n, "", i, got[i], value(prev, i)));
            break;
          }
        f.expect(true, "");
      }
    }
  }
  // Floats that are not small integers: the sum must be the same bits on every rank (data
  // parallelism keeps replicas in step only if it is). Each rank's result is gathered and
  // compared byte for byte.
  for (plx_dtype dtype : {PLX_F32, PLX_BF16}) {
    const uint64_t n = 100003;
    std::mt19937_64 gen(1234 + static_cast<uint64_t>(rank));
    std::uniform_real_distribution<double> u(-1, 1);
    const auto bytes = host(dtype, n, [&](uint64_t) { return u(gen); });
    const Tensor t = make(be, dev, dtype, n, bytes);
    g.all_reduce(t, PLX_REDUCE_SUM);
    const Tensor u8 = t.alias(PLX_U8, {static_cast<int64_t>(t.nbytes())}, 0);
    const Tensor all = Tensor::zeros(be, {static_cast<int64_t>(u8.numel()) * size}, PLX_U8, dev);
    g.all_gather(u8, all);
    be.sync(dev);
    const std::vector<uint8_t> v = all.to_vector<uint8_t>();
    const size_t per = static_cast<size_t>(u8.numel());
    bool same = true;
    for (int r = 1; r < size && same; ++r)
      same = std::memcmp(v.data(), v.data() + per * static_cast<size_t>(r), per) == 0;
    f.expect(same, std::string("all_reduce sum of random ") + dtype_name(dtype) +
                       ": the result differs between ranks");
  }
  // Barriers, many in a row.
  for (int i = 0; i < 20; ++i) g.barrier();
  be.sync(dev);
  f.expect(true, "");
}

}  // namespace

int main(int argc, char** argv) {
  std::string comm_name, backend_name, bootstrap, scenario;
  int32_t timeout_ms = 0;
  std::map<std::string, std::map<std::string, std::string>> options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "conformance: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--comm") comm_name = next();
    else if (a == "--backend") backend_name = next();
    else if (a == "--bootstrap") bootstrap = next();
    else if (a == "--scenario") scenario = next();
    else if (a == "--timeout-ms") timeout_ms = std::atoi(next().c_str());
    else if (a == "--option") {  // plugin.key=value, as [plugins.options.plugin] key = value
      const std::string o = next();
      const size_t dot = o.find('.'), eq = o.find('=');
      if (dot == std::string::npos || eq == std::string::npos || eq < dot) {
        std::cerr << "conformance: --option " << o << ": expected plugin.key=value\n";
        return 2;
      }
      options[o.substr(0, dot)][o.substr(dot + 1, eq - dot - 1)] = o.substr(eq + 1);
    }
    else {
      std::cerr << "conformance: unknown argument '" << a
                << "' (expected --comm, --backend, --bootstrap, --scenario, --timeout-ms, --option)\n";
      return 2;
    }
  }
  if (comm_name.empty()) {
    std::cerr << "conformance: --comm NAME is required\n";
    return 2;
  }
  RuntimeOptions o;
  // PLEXUS_TEST_PLUGIN_DIR: another plugin folder, as for plexus_tests (the CUDA emulator's).
  const char* dir = std::getenv("PLEXUS_TEST_PLUGIN_DIR");
  o.plugins.paths = {dir && *dir ? dir : PLEXUS_PLUGIN_DIR};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  o.plugins.options = options;
  Runtime rt(o);
  Communicator* comm = nullptr;
  for (Communicator* c : rt.communicators())
    if (c->name() == comm_name) comm = c;
  if (!comm) {
    std::cout << "SKIPPED: no communicator '" << comm_name << "' was built here\n";
    return 77;
  }
  if (backend_name.empty()) backend_name = comm->backends().at(0);
  Backend* be = rt.find_backend(backend_name);
  if (!be || be->device_count() == 0) {
    std::cout << "SKIPPED: backend '" << backend_name << "' has no device here\n";
    return 77;
  }
  Failures f;
  int rank = -1, size = -1;
  try {
    std::unique_ptr<CommGroup> boot, group;
    const int32_t dev = launch_info().local_rank % be->device_count();
    if (!scenario.empty()) {
      if (timeout_ms <= 0) timeout_ms = 1000;
      group = comm->join(*be, dev, -1, -1, plx_comm_id{}, timeout_ms);
      const Tensor t = Tensor::zeros(*be, {1000}, PLX_F32, dev);
      group->all_reduce(t, PLX_REDUCE_SUM);  // everybody is here
      be->sync(dev);
      if (group->rank() == 1) {
        if (scenario == "dead-peer") _exit(3);  // no finalize, no goodbye
        std::this_thread::sleep_for(std::chrono::milliseconds(4 * timeout_ms));
        std::cout << "rank 1: slept through the collective\n";
        return 0;
      }
      try {
        group->all_reduce(t, PLX_REDUCE_SUM);
        be->sync(dev);
        std::cout << "rank " << group->rank() << ": the all_reduce completed without rank 1\n";
        return 1;
      } catch (const std::exception& e) {
        std::cout << "rank " << group->rank() << ": failed as expected: " << e.what() << "\n";
        std::cout.flush();
        group.reset();
        _exit(0);  // MPI cannot be finalised with a peer missing; the launcher sees the exit
      }
    } else {
      // Directly from the launcher, or (--bootstrap) with the id broadcast over its group.
      LaunchGroup lg = join_launch(rt, *comm, *be, dev, bootstrap);
      boot = std::move(lg.bootstrap);
      group = std::move(lg.group);
    }
    rank = group->rank();
    size = group->size();
    run_suite(*group, f);
    group.reset();
    boot.reset();
  } catch (const std::exception& e) {
    f.expect(false, std::string("threw: ") + e.what());
  }
  std::cout << "rank " << rank << " of " << size << " (" << comm_name << " on " << backend_name
            << "): " << f.checks << " checks, " << f.what.size() << " failed\n";
  for (size_t i = 0; i < f.what.size() && i < 20; ++i) std::cout << "  " << f.what[i] << "\n";
  return f.what.empty() ? 0 : 1;
}
