// The CUDA plugin's file of measured convolution algorithms (plugins/cuda/ops/conv_algo_cache.*):
// pure host code, so it is tested here on every machine, GPU or not. Its header keys the file to
// the device and library versions; corrupt lines are skipped with a warning; writes are atomic
// and merge what other processes added.
#include <filesystem>
#include <fstream>
#include <map>

#include "ops/conv_algo_cache.hpp"
#include "support/harness.hpp"

using namespace plexus::cuda::conv_cache;
using plexus::test::TempDir;

namespace {
std::string h100() { return header_line("NVIDIA H100\t80GB", 9, 0, 91900, 13000); }
std::string sample_key() {
  KeyParts k;
  k.op = "fwd";
  k.dtype = "f16";
  k.x = {32, 64, 56, 56};
  k.w = {64, 64, 3, 3};
  k.y = {32, 64, 56, 56};
  k.x_layout = k.w_layout = k.y_layout = "nchw";
  k.stride = {1, 1};
  k.padding = {1, 1};
  k.dilation = {1, 1};
  k.groups = 1;
  k.math = 1;
  return make_key(k);
}
}  // namespace

TEST_CASE("the algorithm cache's header and keys name everything a choice depends on",
          "[cpu][cuda-cache]") {
  CHECK(h100() == "plexus-cuda-conv-algos 1\tNVIDIA H100 80GB\tsm 9.0\tcudnn 91900\tcudart 13000");
  CHECK(sample_key() ==
        "fwd f16 x=nchw:32,64,56,56 w=nchw:64,64,3,3 y=nchw:32,64,56,56 s=1,1 p=1,1 d=1,1 g=1 m=1");
  const std::map<std::string, Choice> m{{sample_key(), {1, 4096, 1}}, {"b", {0, 0, 3}}};
  const Parsed p = parse(serialise(h100(), m), h100());
  CHECK(p.header_matches);
  CHECK(p.entries == m);
  CHECK(p.warnings.empty());
  // Another device or library version: nothing of the file is used.
  const Parsed other = parse(serialise(h100(), m), header_line("A100", 8, 0, 91900, 13000));
  CHECK_FALSE(other.header_matches);
  CHECK(other.entries.empty());
  CHECK_FALSE(parse("", h100()).header_matches);
}

TEST_CASE("corrupt lines of the algorithm cache are skipped with a warning each",
          "[cpu][cuda-cache]") {
  const std::string key = sample_key();
  const std::string text = h100() + "\n" + key + "\t1\t4096\t1\n" + "x\t1\t2\n" + "y\tz\t2\t0\n" +
                           "w\t-1\t2\t0\n" + "v\t1\t-2\t0\n" + "u\t1\t2\t9\n" +
                           "t\t1\t2\t0\textra\n" + "\t1\t2\t0\n" + "\n" +
                           "ok\t3\t18446744073709551615\t0\r\n" + "big\t1\t18446744073709551616\t0";
  Parsed p = parse(text, h100());
  CHECK(p.header_matches);
  REQUIRE(p.entries.size() == 2);
  CHECK(p.entries.count(key) == 1);
  CHECK(p.entries["ok"].workspace == 18446744073709551615ull);
  CHECK(p.warnings.size() == 8);
  CHECK(format_line("a\tb", {1, 1, 1}).empty());  // a key with a tab cannot be written
}

TEST_CASE("the algorithm cache file survives processes, merges, and other devices",
          "[cpu][cuda-cache]") {
  TempDir tmp("algos");
  const std::string path = tmp / "sub/algos.tsv";
  const std::string key = sample_key();
  {
    AlgoCache c(path, h100());
    CHECK_FALSE(c.find(key));
    c.store(key, {1, 4096, 1});
    REQUIRE(c.find(key));
    CHECK(c.find(key)->algo == 1);
  }
  {
    AlgoCache c(path, h100());  // the next run reads it back
    REQUIRE(c.find(key));
    CHECK(c.find(key)->workspace == 4096);
    {
      std::ofstream f(path, std::ios::app);  // another process adds a line, and a broken one
      f << "other\t2\t0\t0\ngarbage line\n";
    }
    c.store("mine", {5, 1, 0});
    AlgoCache again(path, h100());
    CHECK(again.find("other"));
    CHECK(again.find("mine"));
    CHECK(again.find(key));
  }
  {
    const std::string a100 = header_line("A100", 8, 0, 1, 1);
    AlgoCache c(path, a100);  // another machine's file: ignored, then rewritten
    CHECK_FALSE(c.find(key));
    c.store("a100", {0, 0, 0});
    std::ifstream f(path);
    std::string first;
    std::getline(f, first);
    CHECK(first == a100);
    AlgoCache back(path, h100());
    CHECK_FALSE(back.find(key));
  }
  // No temporary files are left beside it.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    files += e.is_regular_file();
  CHECK(files == 1);
  {
    AlgoCache c("/proc/plexus-no-such-dir/algos.tsv", h100());  // unwritable: memory only
    c.store("k", {0, 0, 0});
    CHECK(c.find("k"));
  }
  {
    AlgoCache c("", h100());
    c.store("k", {0, 0, 0});
    CHECK(c.find("k"));
  }
}
