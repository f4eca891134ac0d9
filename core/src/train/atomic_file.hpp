// A file replaced atomically: written under a temporary name in the target's directory, synced,
// then renamed over the target. Readers (and a crash at any point) see the old file or the new
// one, never a torn one. Used by checkpoints and run manifests.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace plexus::detail {

class AtomicFile {
 public:
  // Creates the temporary file next to `path`. `what` names the kind of file in error messages
  // ("checkpoint", "manifest"). Throws Error naming the path and the errno text.
  AtomicFile(std::string path, std::string_view what);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes (buffered). Throws Error (and removes the temporary file) on a write failure.
  void write(const void* data, size_t n);
  // Flushes, fsyncs, renames over the target and fsyncs the directory. Throws Error on failure;
  // the target is then untouched and the temporary file removed.
  void commit();

  const std::string& temp_path() const { return tmp_; }

 private:
  [[noreturn]] void fail(std::string_view doing, int err);
  void flush();
  void discard() noexcept;

  std::string path_, tmp_, what_;
  int fd_ = -1;
  std::vector<char> buf_;
  bool done_ = false;
};

}  // namespace plexus::detail
