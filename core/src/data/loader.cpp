// The prefetching loader. One worker thread fills a fixed set of `prefetch` batch buffers ahead of
// the consumer; next() swaps a filled buffer with the consumer's Batch, so buffers circulate and
// nothing is allocated once each has reached its size. start() bumps a generation counter: work
// for an older generation is dropped, which is how an abandoned epoch is cancelled.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "plexus/data.hpp"

namespace plexus::data {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

struct Loader::State {
  const Dataset& ds;
  LoaderOptions opt;
  int64_t n = 0, batches = 0, size = 0, plane = 0, channels = 0;
  std::vector<float> scale, bias;  // per channel: x * scale + bias == (x / 255 - mean) / std

  std::mutex mu;
  std::condition_variable to_worker, to_consumer;
  std::vector<Batch> slots;  // the buffers; each is owned by the worker, the queue or nobody
  std::vector<int> free;     // slot indices the worker may fill (capacity reserved: no allocation)
  std::vector<int> ring;     // ready slot indices in batch order, a ring of `prefetch`
  size_t head = 0, queued = 0;
  uint64_t generation = 0;  // bumped by start()
  int64_t epoch = 0, first_batch = 0;
  bool started = false, done = false, stop = false;
  std::exception_ptr error;  // the worker's, for the current generation
  LoaderStats stats;
  std::thread worker;

  State(const Dataset& d, LoaderOptions o) : ds(d), opt(std::move(o)) {}

  void run();
  void assemble(const std::vector<int64_t>& order, int64_t epoch, int64_t index, Batch& b) const;
  // (x / 255 - mean) / std per channel, as x * scale + bias.
  void normalise(int64_t sample, float* dst) const {
    const uint8_t* src = ds.images.data() + sample * size;  // (C, H, W)
    for (int64_t c = 0; c < channels; ++c) {
      const float k = scale[static_cast<size_t>(c)], o = bias[static_cast<size_t>(c)];
      const uint8_t* sp = src + c * plane;
      float* dp = dst + c * plane;
      for (int64_t j = 0; j < plane; ++j) dp[j] = static_cast<float>(sp[j]) * k + o;
    }
  }
};

void Loader::State::assemble(const std::vector<int64_t>& order, int64_t ep, int64_t index,
                             Batch& b) const {
  const int64_t rows = opt.batch_size / opt.shards;
  const int64_t global_begin = index * opt.batch_size;
  const int64_t begin = global_begin + opt.shard * rows;
  const int64_t real = std::clamp<int64_t>(n - begin, 0, rows);
  b.images.resize(opt.images ? static_cast<size_t>(rows * size) : 0);  // (rows, C, H, W)
  b.labels.resize(static_cast<size_t>(rows));
  b.samples.resize(static_cast<size_t>(rows));
  b.rows = rows;
  b.real = real;
  b.global_real = std::min(opt.batch_size, n - global_begin);
  b.epoch = ep;
  b.index = index;
  for (int64_t r = 0; r < real; ++r) {
    const int64_t s = order[static_cast<size_t>(begin + r)];
    const int32_t label = ds.labels[static_cast<size_t>(s)];
    // Checked here rather than up front: the loader accepts any Dataset, and a bad label must
    // not reach the loss, where it would index out of bounds on some backend.
    if (label < 0 || label >= ds.num_classes)
      throw DataError(ds.name + ": sample " + std::to_string(s) + " has label " +
                      std::to_string(label) + ", outside [0, " + std::to_string(ds.num_classes) +
                      ")");
    b.labels[static_cast<size_t>(r)] = label;
    b.samples[static_cast<size_t>(r)] = s;
    if (opt.images) normalise(s, b.images.data() + r * size);
  }
  if (real < rows) {
    if (opt.images) std::fill(b.images.begin() + real * size, b.images.end(), 0.0f);
    std::fill(b.labels.begin() + real, b.labels.end(), kIgnoreLabel);
    std::fill(b.samples.begin() + real, b.samples.end(), int64_t{-1});
  }
}

void Loader::State::run() {
  std::vector<int64_t> order;
  uint64_t mine = 0;  // the generation being worked on; 0: none yet
  std::unique_lock<std::mutex> lk(mu);
  for (;;) {
    to_worker.wait(lk, [&] { return stop || generation != mine; });
    if (stop) return;
    mine = generation;
    const int64_t ep = epoch;
    int64_t b = first_batch;
    lk.unlock();
    std::exception_ptr err;
    try {
      if (opt.shuffle) {
        order = shuffle_order(n, opt.seed, ep);
      } else if (static_cast<int64_t>(order.size()) != n) {
        order.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
      }
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    for (; !err && b < batches; ++b) {
      to_worker.wait(lk, [&] { return stop || generation != mine || !free.empty(); });
      if (stop) return;
      if (generation != mine) break;
      const int k = free.back();
      free.pop_back();
      lk.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      try {
        assemble(order, ep, b, slots[static_cast<size_t>(k)]);
      } catch (...) {
        err = std::current_exception();
      }
      const double dt = seconds_since(t0);
      lk.lock();
      stats.assemble_seconds += dt;
      if (stop) return;
      if (generation != mine || err) {
        free.push_back(k);
        break;
      }
      ring[(head + queued) % ring.size()] = k;
      ++queued;
      to_consumer.notify_one();
    }
    if (generation == mine) {
      if (err)
        error = err;
      else
        done = true;
      to_consumer.notify_one();
    }
  }
}

Loader::Loader(const Dataset& ds, LoaderOptions opt)
    : s_(std::make_unique<State>(ds, std::move(opt))) {
  State& s = *s_;
  const LoaderOptions& o = s.opt;
  const std::string who = "data loader for " + (ds.name.empty() ? std::string("dataset") : ds.name);
  if (o.batch_size < 1)
    throw DataError(who + ": batch_size must be >= 1, got " + std::to_string(o.batch_size));
  if (o.prefetch < 1)
    throw DataError(who + ": prefetch must be >= 1, got " + std::to_string(o.prefetch));
  if (o.shards < 1 || o.shard < 0 || o.shard >= o.shards)
    throw DataError(who + ": shard " + std::to_string(o.shard) + " of " + std::to_string(o.shards) +
                    " is not a valid shard (expected 0 <= shard < shards)");
  if (o.batch_size % o.shards != 0)
    throw DataError(who + ": batch_size " + std::to_string(o.batch_size) +
                    " does not divide into " + std::to_string(o.shards) + " equal shards");
  if (o.limit < 0) throw DataError(who + ": limit must be >= 0, got " + std::to_string(o.limit));
  if (ds.sample_shape.empty())
    throw DataError(who + ": the dataset has no sample shape, expected (C, H, W)");
  for (int64_t d : ds.sample_shape)
    if (d < 1) throw DataError(who + ": sample shape has a dimension < 1");
  if (ds.num_classes < 1)
    throw DataError(who + ": num_classes must be >= 1, got " + std::to_string(ds.num_classes));
  if (ds.count < 1) throw DataError(who + ": the dataset is empty");
  s.size = ds.sample_size();
  s.channels = ds.sample_shape[0];
  s.plane = s.size / s.channels;
  if (static_cast<int64_t>(ds.images.size()) != ds.count * s.size)
    throw DataError(who + ": " + std::to_string(ds.images.size()) + " image bytes, expected " +
                    std::to_string(ds.count * s.size) + " (count " + std::to_string(ds.count) +
                    " x " + std::to_string(s.size) + ")");
  if (static_cast<int64_t>(ds.labels.size()) != ds.count)
    throw DataError(who + ": " + std::to_string(ds.labels.size()) + " labels, expected count " +
                    std::to_string(ds.count));

  s.n = o.limit > 0 ? std::min(o.limit, ds.count) : ds.count;
  s.batches = o.partial == PartialBatch::Drop ? s.n / o.batch_size
                                              : (s.n + o.batch_size - 1) / o.batch_size;
  if (s.batches == 0)
    throw DataError(who + ": " + std::to_string(s.n) + " samples make no full batch of " +
                    std::to_string(o.batch_size) +
                    " and the last partial batch is dropped; use a smaller batch or pad");

  std::vector<float> mean = o.mean, stdev = o.std;
  if (mean.empty() != stdev.empty()) throw DataError(who + ": give both mean and std, or neither");
  if (mean.empty()) {
    if (ds.mean.size() == static_cast<size_t>(s.channels) &&
        ds.std.size() == static_cast<size_t>(s.channels)) {
      mean = ds.mean;
      stdev = ds.std;
    } else {
      ChannelStats st = channel_stats(ds);
      mean = std::move(st.mean);
      stdev = std::move(st.std);
    }
  }
  if (mean.size() != static_cast<size_t>(s.channels) ||
      stdev.size() != static_cast<size_t>(s.channels))
    throw DataError(who + ": mean and std need one value per channel (" +
                    std::to_string(s.channels) + "), got " + std::to_string(mean.size()) + " and " +
                    std::to_string(stdev.size()));
  for (int64_t c = 0; c < s.channels; ++c) {
    const float m = mean[static_cast<size_t>(c)], d = stdev[static_cast<size_t>(c)];
    if (!(d > 0) || !std::isfinite(d) || !std::isfinite(m))
      throw DataError(who + ": channel " + std::to_string(c) + " has mean " + std::to_string(m) +
                      " and std " + std::to_string(d) + ", expected finite values with std > 0");
    s.scale.push_back(1.0f / (255.0f * d));
    s.bias.push_back(-m / d);
  }

  n_ = s.n;
  batches_per_epoch_ = s.batches;
  s.slots.resize(static_cast<size_t>(o.prefetch));
  s.ring.resize(static_cast<size_t>(o.prefetch));
  s.free.reserve(static_cast<size_t>(o.prefetch));
  for (int k = o.prefetch - 1; k >= 0; --k) s.free.push_back(k);
  State* st = s_.get();
  s.worker = std::thread([st] { st->run(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    s_->stop = true;
  }
  s_->to_worker.notify_all();
  s_->worker.join();
}

void Loader::start(int64_t epoch, int64_t first_batch) {
  if (epoch < 0) throw DataError("Loader::start: epoch must be >= 0, got " + std::to_string(epoch));
  if (first_batch < 0 || first_batch > batches_per_epoch_)
    throw DataError("Loader::start: first_batch " + std::to_string(first_batch) +
                    " is outside [0, " + std::to_string(batches_per_epoch_) +
                    "] (batches per epoch)");
  State& s = *s_;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    ++s.generation;
    s.epoch = epoch;
    s.first_batch = first_batch;
    s.started = true;
    s.done = false;
    s.error = nullptr;
    for (; s.queued > 0; --s.queued, s.head = (s.head + 1) % s.ring.size())
      s.free.push_back(s.ring[s.head]);
  }
  s.to_worker.notify_one();
}

bool Loader::next(Batch& out) {
  State& s = *s_;
  std::unique_lock<std::mutex> lk(s.mu);
  if (!s.started) throw DataError("Loader::next: no epoch started; call start(epoch) first");
  if (s.queued == 0 && !s.done && !s.error) {
    const auto t0 = std::chrono::steady_clock::now();
    s.to_consumer.wait(lk, [&] { return s.queued > 0 || s.done || s.error; });
    s.stats.wait_seconds += seconds_since(t0);
    ++s.stats.waits;
  }
  if (s.queued > 0) {
    const int k = s.ring[s.head];
    s.head = (s.head + 1) % s.ring.size();
    --s.queued;
    std::swap(out, s.slots[static_cast<size_t>(k)]);
    s.free.push_back(k);
    ++s.stats.batches;
    lk.unlock();
    s.to_worker.notify_one();
    return true;
  }
  if (s.error) std::rethrow_exception(s.error);
  return false;
}

double Loader::wait_seconds() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  return s_->stats.wait_seconds;
}

LoaderStats Loader::stats() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  LoaderStats st = s_->stats;
  st.queued = static_cast<int>(s_->queued);
  return st;
}

void Loader::normalise(int64_t sample, float* dst) const {
  if (sample < 0 || sample >= s_->ds.count)
    throw DataError(s_->ds.name + ": sample " + std::to_string(sample) + " outside [0, " +
                    std::to_string(s_->ds.count) + ")");
  s_->normalise(sample, dst);
}

}  // namespace plexus::data
