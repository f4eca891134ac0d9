// Checkpoint files: round trips of every dtype, 0-d and empty tensors and metadata; every way a
// file can be wrong on read; and atomic writes that never cost the old file or leave a
// temporary one behind.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "plexus/checkpoint.hpp"
#include "plexus/error.hpp"
#include "plexus/sdk/dtype.hpp"
#include "support/catch.hpp"
#include "support/harness.hpp"

using namespace plexus;
namespace fs = std::filesystem;
using plexus::test::TempDir;

namespace {


int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A tensor whose bytes are a pattern depending on `seed`.
CheckpointTensor tensor(std::string name, plx_dtype dtype, std::vector<int64_t> shape,
                        unsigned seed) {
  CheckpointTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(static_cast<size_t>(numel(t.shape)) * dtype_size(dtype));
  for (size_t i = 0; i < t.data.size(); ++i)
    t.data[i] = static_cast<uint8_t>((i * 131u + seed * 17u + 7u) & 0xff);
  return t;
}

Checkpoint sample() {
  Checkpoint c;
  c.meta["epoch"] = "3";
  c.meta["step"] = "1875";
  c.meta["rng"] = std::string("\x01\x00\xff binary\n", 10);
  c.meta["config"] = "[model]\nname = \"simple_cnn\"\n";
  c.meta["empty"] = "";
  c.tensors.push_back(tensor("conv1.weight", PLX_F32, {8, 1, 3, 3}, 1));
  c.tensors.push_back(tensor("conv1.bias", PLX_F16, {8}, 2));
  c.tensors.push_back(tensor("fc.weight", PLX_BF16, {10, 16}, 3));
  c.tensors.push_back(tensor("counts", PLX_I32, {2, 3}, 4));
  c.tensors.push_back(tensor("loader.order", PLX_I64, {5}, 5));
  c.tensors.push_back(tensor("mask", PLX_U8, {7}, 6));
  c.tensors.push_back(tensor("ref", PLX_F64, {2, 2}, 7));
  c.tensors.push_back(tensor("scalar", PLX_F32, {}, 8));       // 0-d: one element
  c.tensors.push_back(tensor("nothing", PLX_F32, {0, 3}, 9));  // no elements
  return c;
}

void check_equal(const Checkpoint& got, const Checkpoint& want) {
  CHECK(got.meta == want.meta);
  REQUIRE(got.tensors.size() == want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    INFO(want.tensors[i].name);
    CHECK(got.tensors[i].name == want.tensors[i].name);
    CHECK(got.tensors[i].dtype == want.tensors[i].dtype);
    CHECK(got.tensors[i].shape == want.tensors[i].shape);
    CHECK(got.tensors[i].data == want.tensors[i].data);
  }
}

std::vector<char> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Offset of the first data byte of tensor `name` in a written file (layout in checkpoint.hpp).
size_t data_offset(const std::vector<char>& file, const CheckpointTensor& t) {
  const std::string needle = t.name;
  auto it = std::search(file.begin(), file.end(), needle.begin(), needle.end());
  REQUIRE(it != file.end());
  const size_t name_at = static_cast<size_t>(it - file.begin());
  return name_at + t.name.size() + 4 /*dtype*/ + 4 /*ndim*/ + 8 * t.shape.size() + 8 /*nbytes*/ +
         4 /*head_crc*/;
}

}  // namespace

TEST_CASE("checkpoint round trip of every dtype, 0-d and empty tensors and metadata",
          "[cpu][train]") {
  TempDir dir;
  const Checkpoint c = sample();
  const std::string path = dir / "a.ckpt";
  write_checkpoint(path, c);
  const Checkpoint r = read_checkpoint(path);
  check_equal(r, c);
  CHECK(r.meta.at("rng").size() == 10);
  REQUIRE(r.find("scalar") != nullptr);
  CHECK(r.find("scalar")->shape.empty());
  CHECK(r.find("scalar")->data.size() == 4);
  CHECK(r.find("nothing")->data.empty());
  CHECK(r.find("fc.weight")->dtype == PLX_BF16);
  CHECK(r.find("absent") == nullptr);
  CHECK(dir.entries() == std::set<std::string>{"a.ckpt"});
}

TEST_CASE("an empty checkpoint round trips", "[cpu][train]") {
  TempDir dir;
  write_checkpoint(dir / "e.ckpt", Checkpoint{});
  const Checkpoint r = read_checkpoint(dir / "e.ckpt");
  CHECK(r.meta.empty());
  CHECK(r.tensors.empty());
}

TEST_CASE("a checkpoint written over another replaces it whole", "[cpu][train]") {
  TempDir dir;
  const std::string path = dir / "last.ckpt";
  write_checkpoint(path, sample());
  Checkpoint c2;
  c2.meta["epoch"] = "4";
  c2.tensors.push_back(tensor("w", PLX_F64, {3, 3}, 42));
  write_checkpoint(path, c2);
  check_equal(read_checkpoint(path), c2);
  CHECK(dir.entries() == std::set<std::string>{"last.ckpt"});
}

TEST_CASE("reading a missing checkpoint names the path", "[cpu][train]") {
  TempDir dir;
  const std::string path = dir / "nope.ckpt";
  REQUIRE_THROWS_AS(read_checkpoint(path), Error);
  REQUIRE_THROWS_WITH(read_checkpoint(path),
                      PLX_CONTAINS(path) && PLX_CONTAINS("No such file or directory"));
  REQUIRE_THROWS_WITH(read_checkpoint(dir.path.string()), PLX_CONTAINS("not a regular file"));
}

TEST_CASE("a file that is not a checkpoint has a bad magic", "[cpu][train]") {
  TempDir dir;
  const std::string path = dir / "x.ckpt";
  spit(path, std::vector<char>{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'});
  REQUIRE_THROWS_WITH(read_checkpoint(path),
                      PLX_CONTAINS(path + ": not a Plexus checkpoint (bad magic)"));
  spit(path, std::vector<char>{'P', 'K'});  // short and wrong: still the magic that is wrong
  REQUIRE_THROWS_WITH(read_checkpoint(path), PLX_CONTAINS("bad magic"));
}

TEST_CASE("a truncated checkpoint is reported as truncated wherever it was cut", "[cpu][train]") {
  TempDir dir;
  const std::string good = dir / "good.ckpt";
  write_checkpoint(good, sample());
  const std::vector<char> bytes = slurp(good);
  const std::string path = dir / "cut.ckpt";
  for (size_t cut : {size_t{0}, size_t{5}, size_t{8}, size_t{20}, size_t{31}, size_t{32},
                     size_t{40}, bytes.size() / 2, bytes.size() - 5, bytes.size() - 1}) {
    INFO("cut at " << cut << " of " << bytes.size());
    spit(path, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(cut)));
    REQUIRE_THROWS_WITH(read_checkpoint(path), PLX_CONTAINS(path) && PLX_CONTAINS("truncated"));
  }
  std::vector<char> longer = bytes;
  longer.push_back('x');
  spit(path, longer);
  REQUIRE_THROWS_WITH(read_checkpoint(path), PLX_CONTAINS("trailing data"));
}

TEST_CASE("a flipped byte is a checksum mismatch naming where it is", "[cpu][train]") {
  TempDir dir;
  const Checkpoint c = sample();
  const std::string good = dir / "good.ckpt";
  write_checkpoint(good, c);
  const std::vector<char> bytes = slurp(good);
  const std::string path = dir / "bad.ckpt";
  const auto flipped = [&](size_t at) {
    std::vector<char> b = bytes;
    b[at] = static_cast<char>(b[at] ^ 0x10);
    spit(path, b);
  };

  flipped(data_offset(bytes, c.tensors[0]) + 5);
  REQUIRE_THROWS_WITH(
      read_checkpoint(path),
      PLX_CONTAINS(path) && PLX_CONTAINS("checksum mismatch in tensor 'conv1.weight'"));
  flipped(data_offset(bytes, c.tensors[6]));
  REQUIRE_THROWS_WITH(read_checkpoint(path), PLX_CONTAINS("checksum mismatch in tensor 'ref'"));
  // conv1.bias (1-d): dtype, ndim, shape[0], nbytes, head_crc, then its data.
  const size_t bias_data = data_offset(bytes, c.tensors[1]);
  flipped(bias_data - 4 - 8 - 8 - 4 - 4);  // dtype
  REQUIRE_THROWS_WITH(read_checkpoint(path),
                      PLX_CONTAINS("checksum mismatch in the record header of tensor #1") &&
                          PLX_CONTAINS("'conv1.bias'"));
  flipped(bias_data - 4 - 8 - 8 - 4);  // ndim: 1 becomes 17, refused before its CRC is reached
  REQUIRE_THROWS_WITH(read_checkpoint(path),
                      PLX_CONTAINS("corrupt record header of tensor #1: 17 dimensions"));
  flipped(16);  // n_tensors
  REQUIRE_THROWS_WITH(read_checkpoint(path), PLX_CONTAINS("checksum mismatch in the header"));
  flipped(32 + 4 + 2);  // inside the first metadata key
  REQUIRE_THROWS_WITH(read_checkpoint(path), PLX_CONTAINS("checksum mismatch in the metadata"));
  flipped(bytes.size() - 2);  // the whole-file CRC itself
  REQUIRE_THROWS_WITH(read_checkpoint(path), PLX_CONTAINS("checksum mismatch over the whole file"));

  // Every single damaged byte anywhere is caught, never read back as a checkpoint.
  for (size_t at = 0; at < bytes.size(); ++at) {
    INFO("byte " << at);
    flipped(at);
    CHECK_THROWS_AS(read_checkpoint(path), Error);
  }
}

TEST_CASE("a checkpoint of another format version is refused", "[cpu][train]") {
  TempDir dir;
  const std::string path = dir / "v.ckpt";
  write_checkpoint(path, sample());
  std::vector<char> b = slurp(path);
  b[8] = 2;  // version, little-endian u32 after the magic
  spit(path, b);
  REQUIRE_THROWS_WITH(read_checkpoint(path),
                      PLX_CONTAINS(path) &&
                          PLX_CONTAINS("unsupported checkpoint format version 2") &&
                          PLX_CONTAINS("reads version 1"));
}

TEST_CASE("writing into a missing or non-directory path names it", "[cpu][train]") {
  TempDir dir;
  const std::string missing = dir / "no/such/dir/a.ckpt";
  REQUIRE_THROWS_AS(write_checkpoint(missing, sample()), Error);
  REQUIRE_THROWS_WITH(write_checkpoint(missing, sample()),
                      PLX_CONTAINS(missing) && PLX_CONTAINS("No such file or directory"));
  spit(dir / "file", {'x'});
  const std::string under_file = dir / "file/a.ckpt";
  REQUIRE_THROWS_WITH(write_checkpoint(under_file, sample()),
                      PLX_CONTAINS(under_file) && PLX_CONTAINS("Not a directory"));
  CHECK(dir.entries() == std::set<std::string>{"file"});

  if (::geteuid() != 0) {  // root writes through permissions, so this part needs a normal user
    fs::create_directory(dir.path / "ro");
    fs::permissions(dir.path / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    const std::string ro = dir / "ro/a.ckpt";
    REQUIRE_THROWS_WITH(write_checkpoint(ro, sample()),
                        PLX_CONTAINS(ro) && PLX_CONTAINS("Permission denied"));
  }
}

TEST_CASE("an invalid tensor is refused before the old checkpoint is touched", "[cpu][train]") {
  TempDir dir;
  const std::string path = dir / "last.ckpt";
  const Checkpoint old = sample();
  write_checkpoint(path, old);

  const auto refused = [&](Checkpoint bad, const std::string& message) {
    INFO(message);
    REQUIRE_THROWS_WITH(write_checkpoint(path, bad), PLX_CONTAINS(path) && PLX_CONTAINS(message));
    check_equal(read_checkpoint(path), old);
    CHECK(dir.entries() == std::set<std::string>{"last.ckpt"});
  };
  Checkpoint c = sample();
  c.tensors[2].data.pop_back();
  refused(c, "tensor 'fc.weight' has 319 bytes of data; its shape [10, 16] of bf16 needs 320");
  c = sample();
  c.tensors[0].dtype = static_cast<plx_dtype>(42);
  refused(c, "tensor 'conv1.weight' has invalid dtype code 42");
  c = sample();
  c.tensors[3].name = "conv1.bias";
  refused(c, "two tensors are called 'conv1.bias'");
  c = sample();
  c.tensors[4].name.clear();
  refused(c, "tensor #4 has an empty name");
  c = sample();
  c.tensors.push_back(tensor("neg", PLX_F32, {2, 3}, 1));
  c.tensors.back().shape = {-2, -3};
  refused(c, "tensor 'neg' has an invalid shape [-2, -3]");
  c = sample();
  c.tensors.push_back(tensor("deep", PLX_U8, std::vector<int64_t>(9, 1), 1));
  refused(c, "tensor 'deep' has 9 dimensions (at most 8)");
}

namespace {
// Caps the size of files this process may write, so that a write fails half way (EFBIG) even
// for root; restores the limit and SIGXFSZ's action on destruction.
struct FileSizeLimit {
  rlimit old{};
  struct sigaction old_action {};
  explicit FileSizeLimit(rlim_t bytes) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    ::sigaction(SIGXFSZ, &ign, &old_action);
    ::getrlimit(RLIMIT_FSIZE, &old);
    rlimit lim = old;
    lim.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::sigaction(SIGXFSZ, &old_action, nullptr);
  }
};
}  // namespace

TEST_CASE("a write that fails half way keeps the old checkpoint and removes its temporary file",
          "[cpu][train]") {
  TempDir dir;
  const std::string path = dir / "last.ckpt";
  const Checkpoint old = sample();
  write_checkpoint(path, old);

  Checkpoint big = sample();
  big.tensors.push_back(tensor("big", PLX_F32, {1024, 1024}, 3));  // 4 MiB, over the limit
  {
    FileSizeLimit limit(1 << 20);
    REQUIRE_THROWS_WITH(write_checkpoint(path, big),
                        PLX_CONTAINS(path) && PLX_CONTAINS("File too large"));
  }
  check_equal(read_checkpoint(path), old);
  CHECK(dir.entries() == std::set<std::string>{"last.ckpt"});

  // A rename that fails after the whole file was written: the target is a directory.
  fs::create_directories(dir.path / "taken" / "x");
  const std::string taken = dir / "taken";
  REQUIRE_THROWS_WITH(write_checkpoint(taken, old), PLX_CONTAINS(taken) && PLX_CONTAINS("renam"));
  CHECK(dir.entries() == std::set<std::string>{"last.ckpt", "taken"});
  CHECK(fs::is_directory(dir.path / "taken" / "x"));
}
