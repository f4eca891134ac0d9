// Errors on the plugin side of the boundary: C++ exceptions inside, status codes across.
// A plugin throws plexus::sdk::Error (or lets std exceptions fly); the trampolines the SDK
// generates catch everything at the edge, store the message for last_error() and return a status.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "plexus/abi/types.h"

namespace plexus::sdk {

class Error : public std::runtime_error {
 public:
  Error(plx_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  plx_status status() const noexcept { return status_; }

 private:
  plx_status status_;
};

// A kernel throws this from its constructor to decline a node; the message says why.
struct Unsupported : Error {
  explicit Unsupported(const std::string& why) : Error(PLX_ERR_UNSUPPORTED, why) {}
};
struct InvalidArgument : Error {
  explicit InvalidArgument(const std::string& what) : Error(PLX_ERR_INVALID_ARGUMENT, what) {}
};
struct OutOfMemory : Error {
  explicit OutOfMemory(const std::string& what) : Error(PLX_ERR_OUT_OF_MEMORY, what) {}
};
struct BackendError : Error {
  explicit BackendError(const std::string& what) : Error(PLX_ERR_BACKEND, what) {}
};

// printf-style formatting into a std::string.
inline std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

namespace detail {

// The plugin's last error on this thread. Plugins are built with hidden visibility, so every
// plugin library has its own copy. A fixed buffer, not a std::string: a host may call a slot
// after this thread's thread_local objects were destroyed (a runtime held in a static tears its
// backends down from exit(), after the main thread's thread_local destructors ran), and a
// failing slot would then write into a freed string. Longer messages are cut, marked " [...]".
inline constexpr size_t kLastErrorBytes = 16384;
inline thread_local char last_error[kLastErrorBytes] = "";

inline plx_status set_error(plx_status status, const char* message) noexcept {
  static constexpr char kCut[] = " [...]";
  if (message == nullptr) message = "";
  size_t n = std::strlen(message);
  const bool cut = n >= kLastErrorBytes;
  if (cut) n = kLastErrorBytes - sizeof kCut;
  std::memmove(last_error, message, n);  // message may be last_error itself
  if (cut)
    std::memcpy(last_error + n, kCut, sizeof kCut);
  else
    last_error[n] = '\0';
  return status;
}

// Runs `f` and turns whatever it throws into a status; the only way plugin code is entered.
template <class F>
plx_status guard(F&& f) noexcept {
  try {
    f();
    return PLX_OK;
  } catch (const Error& e) {
    return set_error(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return set_error(PLX_ERR_OUT_OF_MEMORY, "host memory exhausted (std::bad_alloc)");
  } catch (const std::exception& e) {
    return set_error(PLX_ERR_INTERNAL, e.what());
  } catch (...) {
    return set_error(PLX_ERR_INTERNAL, "unknown exception");
  }
}

}  // namespace detail

// Throws InvalidArgument with a formatted message unless `cond` holds.
#define PLX_REQUIRE(cond, ...)                                                      \
  do {                                                                              \
    if (!(cond)) throw ::plexus::sdk::InvalidArgument(::plexus::sdk::format(__VA_ARGS__)); \
  } while (0)

// Throws Unsupported with a formatted message unless `cond` holds: a kernel's way to decline.
#define PLX_DECLINE_UNLESS(cond, ...)                                            \
  do {                                                                           \
    if (!(cond)) throw ::plexus::sdk::Unsupported(::plexus::sdk::format(__VA_ARGS__)); \
  } while (0)

}  // namespace plexus::sdk
