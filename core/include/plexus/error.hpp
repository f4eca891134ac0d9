// Errors the core throws. Each message names what failed (file, key, op, backend, plugin) and
// what was expected; the CLI prints it and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace plexus {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad configuration: malformed TOML, unknown key, wrong type, value out of range.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A plugin that cannot be used, or a backend/communicator that is not there.
class PluginError : public Error {
 public:
  using Error::Error;
};

// An op that cannot run: unknown op, bad shapes or dtypes, no kernel on the backend.
class OpError : public Error {
 public:
  using Error::Error;
};

// An allocation that failed even after the cache was released.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// A failure inside a backend while it ran work (a kernel fault, a library error).
class BackendError : public Error {
 public:
  using Error::Error;
};

// A kernel that failed on its device and left the device unusable, found out by
// backend.check_kernels (Executable): the message names the node, the kernel and how to keep it
// out (backend.exclude_kernels), and the CLI exits with status 3, as when the tuner finds such
// a candidate (time_kernel, plexus/tune.hpp).
class KernelFaultError : public BackendError {
 public:
  using BackendError::BackendError;
};

}  // namespace plexus
