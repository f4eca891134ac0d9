// What a training run leaves on disk besides checkpoints: a metrics file in JSON lines (one
// object per line, appended as the run goes) and a manifest (one JSON document describing the
// run: resolved config, plugin versions, devices, seed, git revision).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "plexus/json.hpp"

namespace plexus {

// Appends JSON objects to a file, one per line. Each line goes out in one write() call on a file
// opened with O_APPEND, with no buffering in between, so a run killed at any moment leaves only
// whole lines (short of the disk filling up mid-line, which read_json_lines tolerates at the end).
class MetricsWriter {
 public:
  // Opens (creating if needed) `path` for appending. Throws Error naming the path and the errno
  // text.
  explicit MetricsWriter(std::string path);
  ~MetricsWriter();
  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends `record` and a newline. Throws Error naming the path on a write failure.
  void write(const JsonObject& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Parses a JSON-lines file: one value per non-empty line. A last line without its newline (a
// run killed mid-write) is skipped; any other bad line is an Error naming the path and the line.
// A missing file is an Error.
std::vector<JsonValue> read_json_lines(const std::string& path);

// Replaces `path` atomically with `content` (temporary file, fsync, rename, directory fsync).
// `what` names the file in error messages. Throws Error naming the path and the errno text.
void write_file_atomic(const std::string& path, std::string_view content,
                       std::string_view what = "file");

// Writes `manifest` to `path` atomically, as indented JSON ending in a newline.
void write_manifest(const std::string& path, const JsonObject& manifest);

}  // namespace plexus
