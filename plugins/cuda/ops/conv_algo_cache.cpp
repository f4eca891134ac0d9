// The convolution algorithm cache's file format and its in-memory table (conv_algo_cache.hpp).
#include "ops/conv_algo_cache.hpp"

#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <system_error>
#include <utility>

#include "plexus/sdk/plugin.hpp"

namespace plexus::cuda::conv_cache {

namespace {

constexpr const char* kLogSource = "cuda.conv";

// Replaces the characters that would break the one-line, tab-separated header.
std::string one_field(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return out;
}

// The same for a whole line (the header keeps its tabs).
std::string one_line(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  return out;
}

bool storable_key(std::string_view key) {
  return !key.empty() && key.find_first_of("\t\n\r") == std::string_view::npos;
}

// A whole field as a number of type V (decimal, no sign for unsigned, nothing left over).
template <class V>
bool parse_number(std::string_view s, V& v) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  const auto r = std::from_chars(s.data(), end, v);
  return r.ec == std::errc() && r.ptr == end;
}

void append_ints(std::string& s, const int64_t* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
}

// The file's text, or nullopt when it does not exist or cannot be read.
std::optional<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return std::nullopt;
  return ss.str();
}

}  // namespace

std::string header_line(std::string_view device_name, int major, int minor, uint64_t cudnn_version,
                        int cudart_version) {
  return "plexus-cuda-conv-algos 1\t" + one_field(device_name) + "\tsm " + std::to_string(major) +
         "." + std::to_string(minor) + "\tcudnn " + std::to_string(cudnn_version) + "\tcudart " +
         std::to_string(cudart_version);
}

std::string make_key(const KeyParts& k) {
  std::string s = one_field(k.op) + " " + one_field(k.dtype);
  s += " x=" + one_field(k.x_layout) + ":";
  append_ints(s, k.x.data(), k.x.size());
  s += " w=" + one_field(k.w_layout) + ":";
  append_ints(s, k.w.data(), k.w.size());
  s += " y=" + one_field(k.y_layout) + ":";
  append_ints(s, k.y.data(), k.y.size());
  s += " s=";
  append_ints(s, k.stride.data(), 2);
  s += " p=";
  append_ints(s, k.padding.data(), 2);
  s += " d=";
  append_ints(s, k.dilation.data(), 2);
  s += " g=" + std::to_string(k.groups) + " m=" + std::to_string(k.math);
  return s;
}

Parsed parse(std::string_view text, std::string_view header) {
  Parsed p;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // written on Windows
    if (line_no == 1) {
      p.header_matches = line == header;
      if (!p.header_matches) return p;  // another machine's measurements: nothing here applies
      continue;
    }
    if (line.empty()) continue;
    // key, algorithm, workspace, math type
    std::string_view f[4];
    size_t n = 0, start = 0;
    bool too_many = false;
    while (true) {
      const size_t tab = line.find('\t', start);
      const std::string_view field =
          line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start);
      if (n == 4) {
        too_many = true;
        break;
      }
      f[n++] = field;
      if (tab == std::string_view::npos) break;
      start = tab + 1;
    }
    Choice c;
    const bool ok = !too_many && n == 4 && !f[0].empty() && parse_number(f[1], c.algo) &&
                    c.algo >= 0 && c.algo <= kMaxAlgo && parse_number(f[2], c.workspace) &&
                    parse_number(f[3], c.math) && c.math >= 0 && c.math <= kMaxMath;
    if (!ok) {
      p.warnings.push_back("line " + std::to_string(line_no) +
                           ": expected <key> TAB <algorithm> TAB <workspace bytes> TAB <math "
                           "type>, skipped");
      continue;
    }
    p.entries[std::string(f[0])] = c;  // a later line for the same key wins
  }
  return p;
}

std::string format_line(std::string_view key, const Choice& c) {
  if (!storable_key(key)) return "";
  return std::string(key) + "\t" + std::to_string(c.algo) + "\t" + std::to_string(c.workspace) +
         "\t" + std::to_string(c.math) + "\n";
}

std::string serialise(std::string_view header, const std::map<std::string, Choice>& entries) {
  std::string s = one_line(header) + "\n";
  for (const auto& [key, c] : entries) s += format_line(key, c);
  return s;
}

std::string write_atomically(const std::string& path, std::string_view text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target(path);
  if (target.has_parent_path()) {
    fs::create_directories(target.parent_path(), ec);
    if (ec) return "cannot create directory " + target.parent_path().string() + ": " + ec.message();
  }
  // Unique per process and per call, so concurrent writers never share a temporary file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long long>(::getpid())) +
                          "." + std::to_string(counter.fetch_add(1));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return "cannot create " + tmp;
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.flush();
    if (!f) {
      f.close();
      fs::remove(tmp, ec);
      return "cannot write " + tmp;
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    return "cannot rename " + tmp + " to " + path + ": " + ec.message();
  }
  return "";
}

AlgoCache::AlgoCache(std::string path, std::string header)
    : path_(std::move(path)), header_(one_line(header)) {
  if (path_.empty()) return;
  const auto text = read_file(path_);
  if (!text || text->empty()) {
    PLX_LOG(PLX_LOG_DEBUG, kLogSource, "no convolution algorithm cache at %s yet", path_.c_str());
    return;
  }
  Parsed p = parse(*text, header_);
  if (!p.header_matches) {
    PLX_LOG(PLX_LOG_INFO, kLogSource,
            "convolution algorithm cache %s was measured on another device or library version; "
            "ignoring it (it is rewritten with this machine's measurements)",
            path_.c_str());
    return;
  }
  for (const std::string& w : p.warnings)
    PLX_LOG(PLX_LOG_WARN, kLogSource, "convolution algorithm cache %s: %s", path_.c_str(),
            w.c_str());
  entries_ = std::move(p.entries);
  PLX_LOG(PLX_LOG_DEBUG, kLogSource, "read %zu convolution algorithm choices from %s",
          entries_.size(), path_.c_str());
}

std::optional<Choice> AlgoCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void AlgoCache::store(const std::string& key, const Choice& c) {
  if (!storable_key(key)) return;
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = c;
  if (path_.empty() || write_failed_) return;
  // Another process may have added its own measurements since this one read the file: keep them
  // (this process's choices win for the keys both have).
  if (const auto text = read_file(path_)) {
    Parsed p = parse(*text, header_);
    if (p.header_matches)
      for (auto& [k, v] : p.entries) entries_.emplace(k, v);
  }
  const std::string why = write_atomically(path_, serialise(header_, entries_));
  if (!why.empty()) {
    write_failed_ = true;  // say it once; the choices stay in memory
    PLX_LOG(PLX_LOG_WARN, kLogSource,
            "cannot write the convolution algorithm cache (%s); keeping choices in memory only",
            why.c_str());
  }
}

AlgoCache& shared_cache(const std::string& path, const std::string& header) {
  static std::mutex mu;
  // Never destroyed: kernels may still look choices up while the process exits.
  static auto* caches =
      new std::map<std::pair<std::string, std::string>, std::unique_ptr<AlgoCache>>;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*caches)[{path, header}];
  if (!slot) slot = std::make_unique<AlgoCache>(path, header);
  return *slot;
}

}  // namespace plexus::cuda::conv_cache
