#include "atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "plexus/error.hpp"

namespace plexus::detail {

namespace {
constexpr size_t kBufferSize = size_t{1} << 20;

// Writes all of `n` bytes, retrying on EINTR and short writes. Returns 0 or an errno value.
int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

std::string directory_of(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  return dir.empty() ? std::string(".") : dir.string();
}
}  // namespace

AtomicFile::AtomicFile(std::string path, std::string_view what)
    : path_(std::move(path)), what_(what) {
  // pid + counter keeps concurrent writers (threads, processes) off each other's temporary file;
  // O_EXCL makes sure we never reuse one a crashed run left behind. 0666 lets the umask decide
  // the final permissions, as for any file the user creates.
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0;; ++attempt) {
    tmp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) break;
    if (errno != EEXIST || attempt >= 100) {
      const int err = errno;
      done_ = true;  // nothing to remove
      throw Error("cannot write " + what_ + " '" + path_ + "': cannot create temporary file '" +
                  tmp_ + "': " + std::strerror(err));
    }
  }
  buf_.reserve(kBufferSize);
}

AtomicFile::~AtomicFile() {
  if (!done_) discard();
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  done_ = true;
}

void AtomicFile::fail(std::string_view doing, int err) {
  discard();
  throw Error("cannot write " + what_ + " '" + path_ + "': " + std::string(doing) + ": " +
              std::strerror(err));
}

void AtomicFile::flush() {
  if (buf_.empty()) return;
  if (const int err = write_all(fd_, buf_.data(), buf_.size())) fail("writing '" + tmp_ + "'", err);
  buf_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
  if (done_) throw Error("cannot write " + what_ + " '" + path_ + "': file already closed");
  const char* p = static_cast<const char*>(data);
  if (buf_.size() + n <= kBufferSize) {
    buf_.insert(buf_.end(), p, p + n);
    return;
  }
  flush();
  if (n >= kBufferSize) {
    if (const int err = write_all(fd_, p, n)) fail("writing '" + tmp_ + "'", err);
  } else {
    buf_.insert(buf_.end(), p, p + n);
  }
}

void AtomicFile::commit() {
  if (done_) throw Error("cannot write " + what_ + " '" + path_ + "': file already closed");
  flush();
  // The data must be on disk before the rename is: otherwise a crash can leave the new name
  // pointing at an empty or partial file (ext4 delayed allocation, XFS).
  if (::fsync(fd_) != 0) fail("fsync of '" + tmp_ + "'", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("closing '" + tmp_ + "'", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("renaming '" + tmp_ + "' over it", errno);
  done_ = true;
  // The rename itself is durable only once the directory is synced. Some file systems refuse
  // fsync on a directory (EINVAL); the rename has happened, so that is not an error.
  const std::string dir = directory_of(path_);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    const int err = errno;
    throw Error("wrote " + what_ + " '" + path_ + "' but cannot open its directory '" + dir +
                "' to sync it: " + std::strerror(err));
  }
  if (::fsync(dfd) != 0 && errno != EINVAL) {
    const int err = errno;
    ::close(dfd);
    throw Error("wrote " + what_ + " '" + path_ + "' but cannot sync its directory '" + dir +
                "': " + std::strerror(err));
  }
  ::close(dfd);
}

}  // namespace plexus::detail
