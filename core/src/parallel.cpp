#include "plexus/parallel.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>

#include "plexus/backend.hpp"
#include "plexus/communicator.hpp"
#include "plexus/error.hpp"
#include "plexus/executor.hpp"
#include "plexus/allocator.hpp"
#include "plexus/log.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// An environment variable holding a non-negative integer; nullopt when unset.
std::optional<int32_t> env_int(const std::function<const char*(const char*)>& env, const char* name) {
  const char* v = env(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > std::numeric_limits<int32_t>::max())
    throw ConfigError(std::string("launcher environment: ") + name + "='" + v +
                      "' is not a non-negative integer");
  return static_cast<int32_t>(x);
}

}  // namespace

LaunchInfo launch_info(const std::function<const char*(const char*)>& env) {
  struct Scheme {
    const char *rank, *size, *local_rank, *local_size;
  };
  static const Scheme schemes[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  LaunchInfo li;
  for (const Scheme& s : schemes) {
    const auto size = env_int(env, s.size);
    if (!size) continue;
    const auto rank = env_int(env, s.rank);
    if (!rank)
      throw ConfigError(std::string("launcher environment: ") + s.size + " is set but " + s.rank +
                        " is not");
    if (*size < 1 || *rank >= *size)
      throw ConfigError(std::string("launcher environment: rank ") + std::to_string(*rank) +
                        " (" + s.rank + ") is outside a world of " + std::to_string(*size) + " (" +
                        s.size + ")");
    li.rank = *rank;
    li.size = *size;
    li.local_rank = env_int(env, s.local_rank).value_or(0);
    li.local_size = env_int(env, s.local_size).value_or(1);
    li.source = s.size;
    return li;
  }
  return li;
}

LaunchInfo launch_info() {
  return launch_info([](const char* n) { return std::getenv(n); });
}

// ---------------------------------------------------------------------------------------------
// CommWorker

CommWorker::CommWorker() : thread_([this] { loop(); }) {}

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CommWorker::Ticket CommWorker::submit(std::function<void()> job) {
  std::lock_guard<std::mutex> lk(mu_);
  const Ticket t = next_++;
  queue_.emplace_back(t, std::move(job));
  cv_.notify_all();
  return t;
}

void CommWorker::wait(Ticket t) {
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return finished_ >= t; });
  if (error_ && t >= error_at_) {
    if (t == error_at_) std::rethrow_exception(error_);
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      throw Error(std::string("not run: an earlier communication failed: ") + e.what());
    }
  }
}

double CommWorker::busy_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return busy_;
}

void CommWorker::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    auto [t, job] = std::move(queue_.front());
    queue_.pop_front();
    const bool failed = error_ != nullptr;
    lk.unlock();
    std::exception_ptr err;
    const auto t0 = Clock::now();
    if (!failed) {
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
    }
    const double dt = seconds_since(t0);
    lk.lock();
    busy_ += dt;
    if (err && !error_) {
      error_ = err;
      error_at_ = t;
    }
    finished_ = t;
    done_cv_.notify_all();
  }
}

// ---------------------------------------------------------------------------------------------
// GradientSync

GradientSync::GradientSync(CommGroup& group, Executable& exe, const std::vector<Var>& grads,
                           const std::vector<std::string>& names, GradSyncOptions options)
    : group_(group), exe_(exe), options_(options) {
  Backend& backend = group.backend();
  const int32_t dev = group.device();
  if (&exe.backend() != &backend)
    throw Error("gradient sync: the step runs on backend '" + exe.backend().name() +
                "', the communicator's group on '" + backend.name() + "'");
  const Graph& g = exe.graph();
  struct Item {
    Var v;
    std::string name;
    int32_t produced, read;
    uint64_t bytes;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].valid()) continue;
    const GraphValue& gv = g.value(grads[i]);
    const std::string name = i < names.size() ? names[i] : gv.name;
    const int32_t p = exe.producer_kernel(grads[i]);
    const int32_t r = exe.first_reader_kernel(grads[i]);
    if (p < 0 || r < 0)
      throw Error("gradient sync: gradient of '" + name + "' is " +
                  (p < 0 ? "written by no kernel" : "read by no kernel") +
                  "; data parallelism needs the step's update to read each gradient");
    items.push_back(Item{grads[i], name, p, r, static_cast<uint64_t>(gv.desc.numel()) * dtype_size(gv.desc.dtype)});
  }
  // In the order the gradients are written (the reverse of the forward, roughly).
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.produced < b.produced; });
  const int32_t last_grad = items.empty() ? -1 : items.back().produced;
  for (const Item& it : items) {
    Bucket* b = buckets_.empty() ? nullptr : &buckets_.back();
    const int32_t ready = b ? std::max(b->ready, it.produced) : it.produced;
    const int32_t need = b ? std::min(b->need, it.read) : it.read;
    const bool fits = b && b->dtype == g.value(it.v).desc.dtype &&
                      b->bytes + it.bytes <= options_.bucket_bytes && ready < need;
    if (!fits) {
      if (it.read <= it.produced)
        throw Error("gradient sync: gradient of '" + it.name + "' is read before it is written");
      buckets_.emplace_back();
      b = &buckets_.back();
      b->dtype = g.value(it.v).desc.dtype;
      b->ready = it.produced;
      b->need = it.read;
    } else {
      b->ready = ready;
      b->need = need;
    }
    b->grads.push_back(it.v);
    b->names.push_back(it.name);
    b->bytes += it.bytes;
  }
  if (!options_.overlap)
    for (Bucket& b : buckets_) {
      if (b.need <= last_grad)
        throw Error("gradient sync: with overlap off every bucket starts after the last "
                    "gradient, but a gradient is read before then");
      b.ready = last_grad;
    }

  for (const Bucket& b : buckets_) {
    std::vector<Tensor> ts;
    for (Var v : b.grads) ts.push_back(exe.tensor(v));
    grad_tensors_.push_back(std::move(ts));
    labels_.push_back("gradient all-reduce of bucket " + std::to_string(labels_.size()) + " (" +
                      std::to_string(b.grads.size()) + (b.grads.size() == 1 ? " gradient, " : " gradients, ") +
                      format_bytes(b.bytes) + ", from '" + b.names.front() + "')");
  }
  async_ = backend.device(dev).caps & PLX_CAP_ASYNC;
  try {
    for (Bucket& b : buckets_)
      b.flat = Tensor::empty(backend, {static_cast<int64_t>(b.bytes / dtype_size(b.dtype))}, b.dtype, dev);
    if (async_) {
      comm_stream_ = backend.create_stream(dev);
      for (size_t i = 0; i < buckets_.size(); ++i) {
        ready_ev_.push_back(backend.create_event(dev));
        done_ev_.push_back(backend.create_event(dev));
      }
    } else {
      worker_ = std::make_unique<CommWorker>();
      tickets_.assign(buckets_.size(), 0);
    }
  } catch (...) {
    for (plx_event e : ready_ev_) backend.destroy_event(e);
    for (plx_event e : done_ev_) backend.destroy_event(e);
    backend.destroy_stream(comm_stream_);
    throw;
  }
  for (size_t i = 0; i < buckets_.size(); ++i) {
    exe.add_hook(buckets_[i].ready, Executable::HookPoint::After, [this, i] { start(i); }, async_);
    exe.add_hook(buckets_[i].need, Executable::HookPoint::Before, [this, i] { finish(i); }, async_);
  }
  if (!buckets_.empty())
    exe.add_hook(buckets_.back().need, Executable::HookPoint::Before, [this] { ++steps_; }, async_);
  spdlog::debug("gradient sync over {} ranks ({}): {} buckets\n{}", group.size(),
                async_ ? "communication stream" : "communication thread", buckets_.size(),
                describe());
}

GradientSync::~GradientSync() {
  Backend& backend = group_.backend();
  if (worker_) {
    for (CommWorker::Ticket t : tickets_)
      if (t) try {
          worker_->wait(t);
        } catch (...) {
          // Already reported by the step that waited for it (or the run is failing anyway).
        }
    worker_.reset();
  }
  if (comm_stream_) {
    try {
      backend.sync_stream(comm_stream_);
    } catch (...) {
    }
    group_.set_stream(nullptr);
  }
  for (plx_event e : ready_ev_) backend.destroy_event(e);
  for (plx_event e : done_ev_) backend.destroy_event(e);
  backend.destroy_stream(comm_stream_);
}

uint64_t GradientSync::bytes() const {
  uint64_t n = 0;
  for (const Bucket& b : buckets_) n += b.bytes;
  return n;
}

GradSyncStats GradientSync::stats() const {
  GradSyncStats s;
  s.steps = steps_;
  s.comm_seconds = worker_ ? worker_->busy_seconds() : 0;
  s.wait_seconds = wait_seconds_;
  return s;
}

std::string GradientSync::describe() const {
  std::ostringstream s;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    s << "  bucket " << i << ": " << b.grads.size() << " gradients (" << b.names.front();
    if (b.names.size() > 1) s << " .. " << b.names.back();
    s << "), " << format_bytes(b.bytes) << " " << dtype_name(b.dtype) << ", after kernel "
      << b.ready << ", before kernel " << b.need;
    if (i + 1 < buckets_.size()) s << "\n";
  }
  return s.str();
}

// Gradients -> the bucket's buffer, all-reduce, and back. Each gradient's memory is its own
// from the kernel that writes it to the update that reads it, so nothing else touches it while
// the bucket is in flight.
void GradientSync::start(size_t i) {
  const Bucket& b = buckets_[i];
  Backend& backend = group_.backend();
  const int32_t dev = group_.device();
  const Tensor flat = b.flat;
  const std::vector<Tensor>& grads = grad_tensors_[i];
  auto gather = [&backend, dev, flat, &grads](plx_stream s) {
    auto* dst = static_cast<unsigned char*>(flat.data());
    for (const Tensor& t : grads) {
      backend.copy(dev, dst, t.data(), t.nbytes(), PLX_COPY_D2D, s);
      dst += t.nbytes();
    }
  };
  auto scatter = [&backend, dev, flat, &grads](plx_stream s) {
    const auto* src = static_cast<const unsigned char*>(flat.data());
    for (const Tensor& t : grads) {
      backend.copy(dev, t.data(), src, t.nbytes(), PLX_COPY_D2D, s);
      src += t.nbytes();
    }
  };
  const plx_reduce_op op = options_.op;
  if (async_) {
    backend.record(ready_ev_[i], exe_.stream());
    backend.wait(comm_stream_, ready_ev_[i]);
    gather(comm_stream_);
    group_.set_stream(comm_stream_);
    group_.all_reduce(flat, op);
    scatter(comm_stream_);
    backend.record(done_ev_[i], comm_stream_);
  } else {
    gather(exe_.stream());  // a synchronous backend: done when it returns
    CommGroup& group = group_;
    const std::string& what = labels_[i];
    tickets_[i] = worker_->submit([&group, flat, op, scatter, &what] {
      try {
        group.all_reduce(flat, op);
      } catch (const std::exception& e) {
        throw Error(what + ": " + e.what());
      }
      scatter(nullptr);
    });
  }
}

void GradientSync::finish(size_t i) {
  if (async_) {
    group_.backend().wait(exe_.stream(), done_ev_[i]);
    return;
  }
  const auto t0 = Clock::now();
  const CommWorker::Ticket t = tickets_[i];
  tickets_[i] = 0;
  if (t) worker_->wait(t);
  wait_seconds_ += seconds_since(t0);
}

void broadcast_store(CommGroup& group, const TensorStore& store, int32_t root,
                     const std::vector<std::string>& only) {
  for (const auto& [name, t] : store.all()) {
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
    try {
      group.broadcast(t, t, root);
    } catch (const std::exception& e) {
      throw Error("broadcasting '" + name + "' from rank " + std::to_string(root) + ": " + e.what());
    }
  }
  group.backend().sync_stream(group.backend().stream(group.device()));
}

}  // namespace plexus
