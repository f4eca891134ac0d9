#include "plexus/run_output.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "atomic_file.hpp"
#include "plexus/error.hpp"

namespace plexus {

MetricsWriter::MetricsWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int err = errno;
    throw Error("cannot open metrics file '" + path_ + "' for appending: " + std::strerror(err));
  }
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_) {
  other.fd_ = -1;
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void MetricsWriter::write(const JsonObject& record) {
  if (fd_ < 0) throw Error("metrics file '" + path_ + "' is closed");
  const std::string line = record.str() + "\n";
  // One write() per line: with O_APPEND the line lands whole at the end of the file. A short
  // write (disk full) is finished off by the loop, or reported.
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw Error("cannot append to metrics file '" + path_ + "': " + std::strerror(err));
    }
    done += static_cast<size_t>(w);
  }
}

std::vector<JsonValue> read_json_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw Error("cannot open '" + path + "': " + std::strerror(err));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<JsonValue> out;
  size_t start = 0;
  for (size_t line = 1; start < text.size(); ++line) {
    const size_t nl = text.find('\n', start);
    if (nl == std::string::npos) break;  // an unfinished last line: the run died writing it
    const std::string_view l(text.data() + start, nl - start);
    start = nl + 1;
    if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    out.push_back(parse_json(l, path + ":" + std::to_string(line)));
  }
  return out;
}

void write_file_atomic(const std::string& path, std::string_view content, std::string_view what) {
  detail::AtomicFile file(path, what);
  file.write(content.data(), content.size());
  file.commit();
}

void write_manifest(const std::string& path, const JsonObject& manifest) {
  // Re-parsed to be indented: a manifest is read by people as much as by programs.
  write_file_atomic(path, parse_json(manifest.str(), "manifest").dump(2) + "\n", "manifest");
}

}  // namespace plexus
