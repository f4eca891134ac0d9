// A wait on a device that may never end: a kernel that hangs leaves the host blocked in a stream
// or event wait with nothing said, until something outside kills the process. A WaitWatch around
// such a wait has a thread of the watchdog's end the process with status 3 once the wait has
// lasted `timeout_s`, after logging what `what()` says (which wait, what may hang and how to find
// or keep it out). The process cannot go on: the stuck stream holds everything behind it, and
// unwinding would wait on it again. What a watch costs the waiting thread: a lock to register and
// one to leave, never a poll.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace plexus {

class WaitWatch {
 public:
  // timeout_s <= 0: no watch. `what` is called on the watchdog's thread while the waiting thread
  // is still inside the wait, so it may read what the waiter's scope holds; `before_exit` (if
  // any) runs there first, e.g. to write the tuning cache.
  WaitWatch(double timeout_s, std::function<std::string()> what,
            std::function<void()> before_exit = {});
  ~WaitWatch();
  WaitWatch(const WaitWatch&) = delete;
  WaitWatch& operator=(const WaitWatch&) = delete;

 private:
  uint64_t id_ = 0;  // 0: not watched
};

// Logs `message` as critical, flushes the logs and C streams, and ends the process with status 3
// without unwinding: for a device that is stuck or unusable, where destructors would wait on it
// or fail. What a watch that fires does, and what the tuner does for a candidate that faults.
[[noreturn]] void exit_for_device(const std::string& message);

}  // namespace plexus
