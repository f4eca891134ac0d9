// The convolution algorithm cache: which cuDNN algorithm a convolution shape runs with, once
// measured, kept in memory for the process and in a text file across runs.
//
// Host code only, with no CUDA or cuDNN type in its interface, so that the file format (parsing,
// writing, the header that ties a file to one machine) and the keys can be tested without a GPU.
//
// File format (UTF-8 text, one record a line, fields separated by tabs):
//   line 1: the header, naming what the measurements are only valid for:
//           "plexus-cuda-conv-algos 1 <TAB> <device name> <TAB> sm <major>.<minor>
//            <TAB> cudnn <version> <TAB> cudart <version>"
//   then:   <key> <TAB> <algorithm number> <TAB> <workspace bytes> <TAB> <math type>
// The math type is the cudnnMathType_t the measurement ran the algorithm with: cuDNN may run an
// algorithm with a different one than was asked for, and the call must then ask for the same.
// A file whose header differs (another GPU, another cuDNN) is ignored and replaced by the next
// write; a line that does not parse is skipped with a warning. Writes go to a temporary file
// renamed over the old one, so a reader never sees half a file.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace plexus::cuda::conv_cache {

// One measured choice.
struct Choice {
  int32_t algo = -1;       // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  uint64_t workspace = 0;  // bytes the algorithm needs
  int32_t math = 0;        // cudnnMathType_t it runs with
};
inline bool operator==(const Choice& a, const Choice& b) {
  return a.algo == b.algo && a.workspace == b.workspace && a.math == b.math;
}

// Largest algorithm number and math type a line may hold (cuDNN 9 has at most 8 algorithms per
// direction and 4 math types); anything beyond is a corrupt line.
constexpr int32_t kMaxAlgo = 63;
constexpr int32_t kMaxMath = 3;

// The first line of a cache file for this machine. Tabs and line breaks in the device name
// become spaces (the header is one line of tab-separated fields).
std::string header_line(std::string_view device_name, int major, int minor, uint64_t cudnn_version,
                        int cudart_version);

// Everything a measurement depends on. Layouts are "nchw" or "nhwc" (the filter's "nhwc" is
// (O, KH, KW, C/groups) in memory).
struct KeyParts {
  std::string op;     // "fwd", "bwd_data" or "bwd_filter"
  std::string dtype;  // "f32", "f16", "bf16"
  std::array<int64_t, 4> x{}, w{},
      y{};  // logical shapes (N, C, H, W), (O, C/g, KH, KW), (N, O, OH, OW)
  std::string x_layout, w_layout, y_layout;
  std::array<int64_t, 2> stride{}, padding{}, dilation{};
  int64_t groups = 1;
  int32_t math = 0;  // the cudnnMathType_t asked for (it says whether TF32 was allowed)
};
// e.g. "fwd f16 x=nchw:32,64,56,56 w=nchw:64,64,3,3 y=nchw:32,64,56,56 s=1,1 p=1,1 d=1,1 g=1 m=1"
std::string make_key(const KeyParts& k);

// What a file's text holds for `header`. entries is empty when the header does not match.
struct Parsed {
  bool header_matches = false;
  std::map<std::string, Choice> entries;
  std::vector<std::string> warnings;  // one per line skipped, naming its number
};
Parsed parse(std::string_view text, std::string_view header);

// One line of the file for (key, choice), with its line break; "" if the key cannot be stored
// (empty, or holding a tab or line break).
std::string format_line(std::string_view key, const Choice& c);
// The whole file: header, then the entries in key order (a stable file for the same contents).
std::string serialise(std::string_view header, const std::map<std::string, Choice>& entries);

// Writes `text` to `path` atomically: a temporary file in the same directory renamed over it.
// Creates the directory if needed. Returns "" on success, else why it failed.
std::string write_atomically(const std::string& path, std::string_view text);

// The cache for one file and one machine. Thread-safe.
class AlgoCache {
 public:
  // Reads `path` ("" keeps everything in memory), logging what it skips.
  AlgoCache(std::string path, std::string header);

  std::optional<Choice> find(const std::string& key) const;
  // Remembers a choice and rewrites the file with it, merged with what other processes have
  // written there meanwhile. A file that cannot be written is logged once and left alone.
  void store(const std::string& key, const Choice& c);

  const std::string& path() const { return path_; }

 private:
  std::string path_, header_;
  mutable std::mutex mu_;
  std::map<std::string, Choice> entries_;
  bool write_failed_ = false;
};

// The process's cache for (path, header): one per file and machine kind, shared by all kernels.
AlgoCache& shared_cache(const std::string& path, const std::string& header);

}  // namespace plexus::cuda::conv_cache
