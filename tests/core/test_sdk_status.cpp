// The SDK's error channel (sdk/include/plexus/sdk/status.hpp): the message a failing plugin slot
// leaves for last_error(), per thread, cut when it is too long, and still there for a slot the
// host calls after the thread's thread_local objects were destroyed. (A runtime held in a static
// tears its backends down from exit(), after the main thread's thread_local destructors: with a
// std::string there, a plugin slot failing in that teardown wrote into freed memory, seen as
// glibc's "malloc(): unsorted double linked list corrupted" after a CUDA test whose device had
// faulted.)
#include <string>
#include <thread>
#include <type_traits>

#include "plexus/sdk/status.hpp"
#include "support/catch.hpp"

namespace sdkd = plexus::sdk::detail;

namespace {

// Fails a "slot" from its destructor: a thread_local of this type made before the thread's first
// error is destroyed after the error buffer would be, were the buffer an object with a destructor.
struct LateFailure {
  std::string* seen = nullptr;
  ~LateFailure() {
    const std::string long_message(300, 'x');  // past any short-string buffer
    const plx_status s =
        sdkd::guard([&] { throw plexus::sdk::Error(PLX_ERR_BACKEND, long_message); });
    if (seen) *seen = std::to_string(static_cast<int>(s)) + ":" + sdkd::last_error;
  }
};

}  // namespace

TEST_CASE("a plugin's last error survives its thread's thread_local teardown", "[cpu]") {
  // Nothing to destroy: the buffer outlives every destructor of the thread.
  STATIC_REQUIRE(std::is_trivially_destructible_v<decltype(sdkd::last_error)>);
  // (Catch2's assertions are for the test's own thread: the other threads only record.)
  std::string seen, earlier;
  std::thread t([&] {
    static thread_local LateFailure late;  // constructed first, destroyed last
    late.seen = &seen;
    sdkd::set_error(PLX_ERR_INTERNAL, "an earlier error on this thread");
    earlier = sdkd::last_error;
  });
  t.join();
  CHECK(earlier == "an earlier error on this thread");
  CHECK(seen == std::to_string(static_cast<int>(PLX_ERR_BACKEND)) + ":" + std::string(300, 'x'));
}

TEST_CASE("a plugin's last error is per thread, cut when too long, and may be set from itself",
          "[cpu]") {
  CHECK(sdkd::set_error(PLX_ERR_INVALID_ARGUMENT, "main thread") == PLX_ERR_INVALID_ARGUMENT);
  std::string fresh = "unset", other;
  std::thread([&] {
    fresh = sdkd::last_error;  // a new thread starts with none
    sdkd::set_error(PLX_ERR_INTERNAL, "other thread");
    other = sdkd::last_error;
  }).join();
  CHECK(fresh.empty());
  CHECK(other == "other thread");
  CHECK(std::string(sdkd::last_error) == "main thread");

  // Longer than the buffer: the start kept, marked as cut, terminated within the buffer.
  const std::string huge(sdkd::kLastErrorBytes + 100, 'y');
  sdkd::set_error(PLX_ERR_INTERNAL, huge.c_str());
  const std::string got = sdkd::last_error;
  CHECK(got.size() == sdkd::kLastErrorBytes - 1);
  CHECK(got.substr(got.size() - 6) == " [...]");
  CHECK(got.substr(0, got.size() - 6) == huge.substr(0, got.size() - 6));

  // Exactly one byte short of the buffer: kept whole.
  const std::string fits(sdkd::kLastErrorBytes - 1, 'z');
  sdkd::set_error(PLX_ERR_INTERNAL, fits.c_str());
  CHECK(std::string(sdkd::last_error) == fits);

  // Its own text again (a slot rethrowing what another slot left) and a null message.
  sdkd::set_error(PLX_ERR_INTERNAL, "again");
  sdkd::set_error(PLX_ERR_INTERNAL, sdkd::last_error);
  CHECK(std::string(sdkd::last_error) == "again");
  sdkd::set_error(PLX_ERR_INTERNAL, nullptr);
  CHECK(std::string(sdkd::last_error).empty());
}
