#include "plexus/watchdog.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace plexus {
namespace {

using Clock = std::chrono::steady_clock;

struct Watched {
  uint64_t id;
  Clock::time_point deadline;
  std::function<std::string()> what;
  std::function<void()> before_exit;
};

// The watches in force and the thread that watches them, started at the first watch. Never
// destroyed: the thread may be waiting on it when the process exits.
struct Dog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Watched> active;
  uint64_t next = 1;
  bool started = false;
  // When the thread wakes next (max: when a watch comes). A watch whose deadline is later needs
  // no wake-up: the thread looks again then. Every watch of a run has the same timeout, so a
  // step's watch costs its thread two short locks, and the watchdog one wake-up a timeout.
  Clock::time_point wake = Clock::time_point::max();

  [[noreturn]] void run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (active.empty()) {
        wake = Clock::time_point::max();
        cv.wait(lock);
        continue;
      }
      const auto soonest = std::min_element(
          active.begin(), active.end(),
          [](const Watched& a, const Watched& b) { return a.deadline < b.deadline; });
      if (Clock::now() < soonest->deadline) {
        wake = soonest->deadline;
        cv.wait_until(lock, wake);
        continue;
      }
      // The waiter is still blocked in its wait (it leaves only after taking the lock), so what
      // its watch refers to is alive.
      if (soonest->before_exit) soonest->before_exit();
      exit_for_device(soonest->what());
    }
  }
};

}  // namespace

void exit_for_device(const std::string& message) {
  spdlog::critical("{}", message);
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(3);
}

namespace {

Dog& dog() {
  static Dog* d = new Dog;
  return *d;
}

}  // namespace

WaitWatch::WaitWatch(double timeout_s, std::function<std::string()> what,
                     std::function<void()> before_exit) {
  if (!(timeout_s > 0)) return;
  Dog& d = dog();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  const std::lock_guard<std::mutex> lock(d.mu);
  if (!d.started) {
    std::thread([&d] { d.run(); }).detach();
    d.started = true;
  }
  id_ = d.next++;
  d.active.push_back({id_, deadline, std::move(what), std::move(before_exit)});
  if (deadline < d.wake) d.cv.notify_one();
}

WaitWatch::~WaitWatch() {
  if (!id_) return;
  Dog& d = dog();
  const std::lock_guard<std::mutex> lock(d.mu);
  d.active.erase(std::remove_if(d.active.begin(), d.active.end(),
                                [&](const Watched& w) { return w.id == id_; }),
                 d.active.end());
}

}  // namespace plexus
