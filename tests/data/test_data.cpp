// The data layer: IDX and CIFAR-10 readers (round trips and every error), the real Fashion-MNIST
// when Debian's package is installed, the synthetic dataset, the epoch shuffle, and the
// prefetching loader (resume, partial batches, normalisation, errors, shutdown).
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "plexus/data.hpp"
#include "support/catch.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::data;
namespace fs = std::filesystem;
using plexus::test::TempDir;

namespace {

using Bytes = std::vector<uint8_t>;


void write_file(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(f.good());
}

// gzip in memory with zlib (windowBits 15 + 16 writes the gzip wrapper).
Bytes gzip(const Bytes& in) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  Bytes out(deflateBound(&zs, static_cast<uLong>(in.size())) + 64);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

void put_be32(Bytes& b, uint32_t v) {
  b.push_back(static_cast<uint8_t>(v >> 24));
  b.push_back(static_cast<uint8_t>(v >> 16));
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}

// An IDX file: magic 0x000008<ndims>, the dimensions, then `payload`.
Bytes idx(uint32_t magic, const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes b;
  put_be32(b, magic);
  for (uint32_t d : dims) put_be32(b, d);
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

// Deterministic bytes for test images (not the loader's RNG: an independent pattern).
Bytes pattern(size_t n, uint32_t salt) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>((i * 37 + salt * 101 + i / 7) % 256);
  return b;
}

// A small in-memory dataset with labels cycling through the classes.
Dataset small_dataset(int64_t count, std::vector<int64_t> shape, int32_t classes) {
  Dataset ds;
  ds.name = "small";
  ds.count = count;
  ds.sample_shape = std::move(shape);
  ds.num_classes = classes;
  ds.images = pattern(static_cast<size_t>(count * ds.sample_size()), 3);
  for (int64_t i = 0; i < count; ++i) ds.labels.push_back(static_cast<int32_t>(i % classes));
  ChannelStats st = channel_stats(ds);
  ds.mean = st.mean;
  ds.std = st.std;
  return ds;
}

// Mean and std per channel computed the plain way, in double.
void plain_stats(const Dataset& ds, std::vector<double>& mean, std::vector<double>& sd) {
  const int64_t c = ds.sample_shape[0], plane = ds.sample_size() / c;
  mean.assign(static_cast<size_t>(c), 0.0);
  sd.assign(static_cast<size_t>(c), 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < ds.count; ++i)
      for (int64_t j = 0; j < plane; ++j) {
        const double v = ds.images[static_cast<size_t>((i * c + ch) * plane + j)] / 255.0;
        sum += v;
        sq += v * v;
      }
    const double n = static_cast<double>(ds.count * plane);
    mean[static_cast<size_t>(ch)] = sum / n;
    sd[static_cast<size_t>(ch)] = std::sqrt(std::max(0.0, sq / n - (sum / n) * (sum / n)));
  }
}

// Every batch of one epoch.
std::vector<Batch> epoch_batches(Loader& l, int64_t epoch, int64_t first = 0) {
  l.start(epoch, first);
  std::vector<Batch> out;
  Batch b;
  while (l.next(b)) out.push_back(b);
  return out;
}

void check_same(const Batch& a, const Batch& b) {
  CHECK(a.epoch == b.epoch);
  CHECK(a.index == b.index);
  CHECK(a.real == b.real);
  CHECK(a.samples == b.samples);
  CHECK(a.labels == b.labels);
  CHECK(a.images == b.images);
}

// Writes an MNIST-like set of four IDX files (28x28) with `n` train and `m` test images.
void write_mnist_like(const TempDir& d, uint32_t n, uint32_t m, bool gz_train, bool gz_test) {
  const auto emit = [&](const std::string& prefix, uint32_t count, bool gz, uint32_t salt) {
    Bytes labels(count);
    for (uint32_t i = 0; i < count; ++i) labels[i] = static_cast<uint8_t>((i * 3 + salt) % 10);
    const Bytes im = idx(0x803, {count, 28, 28}, pattern(size_t(count) * 784, salt));
    const Bytes lb = idx(0x801, {count}, labels);
    const std::string sfx = gz ? ".gz" : "";
    write_file(d / (prefix + "-images-idx3-ubyte" + sfx), gz ? gzip(im) : im);
    write_file(d / (prefix + "-labels-idx1-ubyte" + sfx), gz ? gzip(lb) : lb);
  };
  emit("train", n, gz_train, 1);
  emit("t10k", m, gz_test, 2);
}

}  // namespace

TEST_CASE("Fashion-MNIST from Debian's dataset-fashion-mnist has its documented shape",
          "[cpu][data]") {
  const std::string dir = default_dir("fashion-mnist");
  if (!fs::exists(fs::path(dir) / "train-images-idx3-ubyte.gz") &&
      !fs::exists(fs::path(dir) / "train-images-idx3-ubyte"))
    PLX_SKIP("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)");
  const Dataset train = load_dataset("fashion-mnist", "", "train");
  const Dataset test = load_dataset("fashion-mnist", "", "test");
  CHECK(train.name == "fashion-mnist/train");
  CHECK(train.count == 60000);
  CHECK(test.count == 10000);
  for (const Dataset* ds : {&train, &test}) {
    CHECK(ds->sample_shape == std::vector<int64_t>{1, 28, 28});
    CHECK(ds->num_classes == 10);
    CHECK(ds->images.size() == static_cast<size_t>(ds->count) * 784);
    REQUIRE(ds->labels.size() == static_cast<size_t>(ds->count));
    // Fashion-MNIST is balanced: 6000 (train) or 1000 (test) images per class.
    std::vector<int64_t> per_class(10, 0);
    int64_t out_of_range = 0;
    for (int32_t l : ds->labels) {
      if (l < 0 || l >= 10)
        ++out_of_range;
      else
        ++per_class[static_cast<size_t>(l)];
    }
    CHECK(out_of_range == 0);
    for (int64_t k : per_class) CHECK(k == ds->count / 10);
  }
  // The stats against a plain computation, and against the commonly published values.
  std::vector<double> mean, sd;
  plain_stats(train, mean, sd);
  REQUIRE(train.mean.size() == 1);
  CHECK(train.mean[0] == Approx(mean[0]).epsilon(1e-6));
  CHECK(train.std[0] == Approx(sd[0]).epsilon(1e-5));
  CHECK(train.mean[0] == Approx(0.2860).margin(5e-4));
  CHECK(train.std[0] == Approx(0.3530).margin(5e-4));
}

TEST_CASE("IDX files round trip, gzip and raw", "[cpu][data]") {
  TempDir d("idx");
  const Bytes pixels = pattern(5 * 3 * 4, 9);
  const Bytes labels = {3, 0, 7, 7, 1};
  const Bytes im = idx(0x803, {5, 3, 4}, pixels), lb = idx(0x801, {5}, labels);
  write_file(d / "raw-images", im);
  write_file(d / "raw-labels", lb);
  write_file(d / "gz-images", gzip(im));
  write_file(d / "gz-labels", gzip(lb));
  // gzip(1) writes members one after another when files are concatenated; accept that too.
  const Bytes g1 = gzip(Bytes(im.begin(), im.begin() + 20)),
              g2 = gzip(Bytes(im.begin() + 20, im.end()));
  Bytes two = g1;
  two.insert(two.end(), g2.begin(), g2.end());
  write_file(d / "two-members", two);
  for (const auto& [images, lab] :
       {std::pair{"raw-images", "raw-labels"}, std::pair{"gz-images", "gz-labels"},
        std::pair{"two-members", "raw-labels"}}) {
    INFO(images);
    const Dataset ds = load_idx(d / images, d / lab, "tiny", 8);
    CHECK(ds.name == "tiny");
    CHECK(ds.count == 5);
    CHECK(ds.sample_shape == std::vector<int64_t>{1, 3, 4});
    CHECK(ds.sample_size() == 12);
    CHECK(ds.num_classes == 8);
    CHECK(ds.images == pixels);
    CHECK(ds.labels == std::vector<int32_t>{3, 0, 7, 7, 1});
    std::vector<double> mean, sd;
    plain_stats(ds, mean, sd);
    REQUIRE(ds.mean.size() == 1);
    CHECK(ds.mean[0] == Approx(mean[0]).epsilon(1e-6));
    CHECK(ds.std[0] == Approx(sd[0]).epsilon(1e-5));
  }
}

TEST_CASE("load_dataset finds IDX files with and without .gz", "[cpu][data]") {
  TempDir d("named");
  write_mnist_like(d, 7, 3, true, false);
  for (const std::string kind : {"fashion-mnist", "mnist"}) {
    const Dataset train = load_dataset(kind, d.path.string(), "train");
    const Dataset test = load_dataset(kind, d.path.string(), "test");
    CHECK(train.name == kind + "/train");
    CHECK(train.count == 7);
    CHECK(test.count == 3);
    CHECK(train.images == pattern(7 * 784, 1));
    CHECK(test.images == pattern(3 * 784, 2));
    CHECK(test.labels == std::vector<int32_t>{2, 5, 8});
  }
}

TEST_CASE("corrupt IDX files are errors naming the file and what was expected", "[cpu][data]") {
  TempDir d("bad");
  const Bytes pixels = pattern(5 * 3 * 4, 9);
  const Bytes labels = {3, 0, 7, 7, 1};
  const Bytes im = idx(0x803, {5, 3, 4}, pixels), lb = idx(0x801, {5}, labels);
  write_file(d / "images", im);
  write_file(d / "labels", lb);
  const std::string I = d / "images", L = d / "labels", X = d / "x";

  SECTION("truncated images") {
    write_file(X, Bytes(im.begin(), im.end() - 10));
    REQUIRE_THROWS_AS(load_idx(X, L, "t"), DataError);
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"),
                        PLX_CONTAINS(X + ": truncated: header says 5 images of 3x4 (60 bytes), "
                                         "file has 50 bytes after the 16-byte header"));
  }
  SECTION("truncated gzip-compressed images say the size is decompressed") {
    write_file(X, gzip(Bytes(im.begin(), im.end() - 10)));
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"), PLX_CONTAINS("file has 50 bytes (decompressed)"));
  }
  SECTION("truncated header") {
    write_file(X, Bytes(im.begin(), im.begin() + 9));
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"),
                        PLX_CONTAINS(X + ": truncated: the IDX header has 16 bytes, file has 9"));
    write_file(X, Bytes{0, 0});
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"), PLX_CONTAINS("4-byte magic number, file has 2 bytes"));
  }
  SECTION("images longer than the header says") {
    Bytes longer = im;
    longer.push_back(0);
    write_file(X, longer);
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"),
                        PLX_CONTAINS("longer than its header says") && PLX_CONTAINS("61 bytes"));
  }
  SECTION("truncated labels") {
    write_file(X, Bytes(lb.begin(), lb.end() - 2));
    REQUIRE_THROWS_WITH(load_idx(I, X, "t"),
                        PLX_CONTAINS(X + ": truncated: header says 5 labels (5 bytes), file has 3 "
                                         "bytes after the 8-byte header"));
  }
  SECTION("wrong magic: the files swapped") {
    REQUIRE_THROWS_AS(load_idx(L, I, "t"), DataError);
    REQUIRE_THROWS_WITH(load_idx(L, I, "t"),
                        PLX_CONTAINS(L + ": wrong magic number 0x00000801 (that of an IDX labels "
                                         "file), expected 0x00000803"));
    REQUIRE_THROWS_WITH(load_idx(I, I, "t"),
                        PLX_CONTAINS(I + ": wrong magic number 0x00000803 (that of an IDX images "
                                         "file), expected 0x00000801"));
  }
  SECTION("wrong magic: not unsigned bytes") {
    write_file(X, idx(0x0d03, {5, 3, 4}, pixels));
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"),
                        PLX_CONTAINS("wrong magic number 0x00000d03, expected 0x00000803"));
  }
  SECTION("count mismatch") {
    write_file(X, idx(0x801, {4}, Bytes{1, 2, 3, 4}));
    REQUIRE_THROWS_WITH(load_idx(I, X, "t"),
                        PLX_CONTAINS(I + " has 5 images but " + X + " has 4 labels"));
  }
  SECTION("corrupt gzip") {
    Bytes z = gzip(im);
    for (size_t i = 12; i < z.size() - 8; ++i) z[i] = static_cast<uint8_t>(z[i] ^ 0x5a);
    write_file(X, z);
    REQUIRE_THROWS_AS(load_idx(X, L, "t"), DataError);
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"), PLX_CONTAINS(X + ": corrupt gzip"));
  }
  SECTION("truncated gzip") {
    const Bytes z = gzip(im);
    write_file(X, Bytes(z.begin(), z.begin() + static_cast<std::ptrdiff_t>(z.size() / 2)));
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"),
                        PLX_CONTAINS(X + ": corrupt gzip: the compressed stream ends early"));
  }
  SECTION("garbage after the gzip stream") {
    Bytes z = gzip(im);
    z.insert(z.end(), {'j', 'u', 'n', 'k'});
    write_file(X, z);
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"), PLX_CONTAINS("4 bytes of trailing data"));
  }
  SECTION("bad dimensions") {
    write_file(X, idx(0x803, {5, 0, 4}, Bytes{}));
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"),
                        PLX_CONTAINS(X + ": bad dimensions: header says images of 0x4"));
    write_file(X, idx(0x803, {0xffffffffu, 0xffffffffu, 0xffffffffu}, Bytes{}));
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"), PLX_CONTAINS("more bytes than any file holds"));
    write_file(X, idx(0x803, {0, 3, 4}, Bytes{}));
    REQUIRE_THROWS_WITH(load_idx(X, L, "t"), PLX_CONTAINS(X + ": empty: header says 0 images"));
  }
  SECTION("wrong image size for a known dataset") {
    write_mnist_like(d, 2, 2, true, true);
    write_file(d / "train-images-idx3-ubyte.gz",
               gzip(idx(0x803, {2, 27, 28}, pattern(2 * 27 * 28, 0))));
    REQUIRE_THROWS_WITH(load_dataset("fashion-mnist", d.path.string(), "train"),
                        PLX_CONTAINS("Fashion-MNIST images are 28x28, this file has 27x28"));
  }
  SECTION("labels out of range") {
    write_file(X, idx(0x801, {5}, Bytes{1, 2, 10, 3, 4}));
    REQUIRE_THROWS_WITH(load_idx(I, X, "t"),
                        PLX_CONTAINS(X + ": label 10 at index 2 is outside [0, 10)"));
    REQUIRE_THROWS_WITH(load_idx(I, L, "t", 7),
                        PLX_CONTAINS("label 7 at index 2 is outside [0, 7)"));
  }
  SECTION("a file that is not there") {
    REQUIRE_THROWS_WITH(load_idx(d / "nope", L, "t"),
                        PLX_CONTAINS(d / "nope" + ": cannot open: No such file"));
  }
}

TEST_CASE("a missing dataset says which package or download provides it", "[cpu][data]") {
  TempDir d("missing");
  const std::string gone = (d.path / "absent").string();
  REQUIRE_THROWS_AS(load_dataset("fashion-mnist", gone, "train"), DataError);
  REQUIRE_THROWS_WITH(
      load_dataset("fashion-mnist", gone, "train"),
      PLX_CONTAINS(
          "Fashion-MNIST not found in " + gone +
          " (no such directory): expected "
          "train-images-idx3-ubyte.gz (or without .gz); install Debian's "
          "dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or set data.path"));
  // An existing directory with the images but not the labels names the labels file.
  write_file(d / "t10k-images-idx3-ubyte", idx(0x803, {1, 28, 28}, Bytes(784, 0)));
  REQUIRE_THROWS_WITH(load_dataset("fashion-mnist", d.path.string(), "test"),
                      PLX_CONTAINS("not found in " + d.path.string() +
                                   ": expected t10k-labels-idx1-ubyte.gz (or without .gz)"));
  REQUIRE_THROWS_WITH(load_dataset("mnist", "", "train"),
                      PLX_CONTAINS("MNIST: no directory given") && PLX_CONTAINS("data.path"));
  REQUIRE_THROWS_WITH(load_dataset("cifar10", gone, "train"),
                      PLX_CONTAINS("CIFAR-10 not found in " + gone) &&
                          PLX_CONTAINS("cifar-10-binary.tar.gz") && PLX_CONTAINS("data.path"));
  REQUIRE_THROWS_WITH(load_dataset("cifar10", "", "test"), PLX_CONTAINS("cifar-10-binary.tar.gz"));
  REQUIRE_THROWS_WITH(load_dataset("imagenet", "", "train"),
                      PLX_CONTAINS("unknown dataset 'imagenet' (known: fashion-mnist, mnist, "
                                   "cifar10, synthetic)"));
  REQUIRE_THROWS_WITH(load_dataset("synthetic", "", "valid"),
                      PLX_CONTAINS("unknown split 'valid'") && PLX_CONTAINS("train or test"));
}

TEST_CASE("CIFAR-10 binary batches round trip", "[cpu][data]") {
  TempDir d("cifar");
  const fs::path sub = d.path / "cifar-10-batches-bin";
  fs::create_directories(sub);
  // File f holds 3 records (test_batch 2); record r of file f has label (f + r) % 10.
  std::vector<Bytes> want_images;
  std::vector<int32_t> want_labels;
  const auto write_batch = [&](const std::string& name, int f, int records) {
    Bytes b;
    for (int r = 0; r < records; ++r) {
      const int label = (f + r) % 10;
      const Bytes px = pattern(3072, static_cast<uint32_t>(f * 10 + r));
      b.push_back(static_cast<uint8_t>(label));
      b.insert(b.end(), px.begin(), px.end());
      if (f > 0) {
        want_images.push_back(px);
        want_labels.push_back(label);
      }
    }
    write_file((sub / name).string(), b);
  };
  for (int f = 1; f <= 5; ++f) write_batch("data_batch_" + std::to_string(f) + ".bin", f, 3);
  write_batch("test_batch.bin", 0, 2);

  const Dataset train = load_dataset("cifar10", d.path.string(), "train");
  CHECK(train.name == "cifar10/train");
  CHECK(train.count == 15);
  CHECK(train.sample_shape == std::vector<int64_t>{3, 32, 32});
  CHECK(train.num_classes == 10);
  CHECK(train.labels == want_labels);
  REQUIRE(train.images.size() == 15 * 3072u);
  for (size_t i = 0; i < 15; ++i)
    CHECK(Bytes(train.images.begin() + static_cast<std::ptrdiff_t>(i * 3072),
                train.images.begin() + static_cast<std::ptrdiff_t>((i + 1) * 3072)) ==
          want_images[i]);
  std::vector<double> mean, sd;
  plain_stats(train, mean, sd);
  REQUIRE(train.mean.size() == 3);
  for (size_t c = 0; c < 3; ++c) {
    CHECK(train.mean[c] == Approx(mean[c]).epsilon(1e-6));
    CHECK(train.std[c] == Approx(sd[c]).epsilon(1e-5));
  }
  // The directory holding the files works as well as its parent.
  const Dataset test = load_dataset("cifar10", sub.string(), "test");
  CHECK(test.count == 2);
  CHECK(test.labels == std::vector<int32_t>{0, 1});

  SECTION("a partial record is an error") {
    const std::string p = (sub / "test_batch.bin").string();
    write_file(p, Bytes(3073 * 2 + 100, 1));
    REQUIRE_THROWS_AS(load_dataset("cifar10", d.path.string(), "test"), DataError);
    REQUIRE_THROWS_WITH(load_dataset("cifar10", d.path.string(), "test"),
                        PLX_CONTAINS(p + ": truncated: 6246 bytes is not a whole number of "
                                         "3073-byte records") &&
                            PLX_CONTAINS("2 records and 100 bytes of a partial one"));
  }
  SECTION("a label out of range is an error") {
    const std::string p = (sub / "test_batch.bin").string();
    Bytes b(3073, 0);
    b[0] = 42;
    write_file(p, b);
    REQUIRE_THROWS_WITH(load_dataset("cifar10", d.path.string(), "test"),
                        PLX_CONTAINS(p + ": record 0 has label 42, expected 0..9"));
  }
  SECTION("an empty or missing batch file is an error") {
    write_file((sub / "test_batch.bin").string(), Bytes{});
    REQUIRE_THROWS_WITH(load_dataset("cifar10", d.path.string(), "test"),
                        PLX_CONTAINS("test_batch.bin: empty file, expected records of 3073 bytes"));
    fs::remove(sub / "data_batch_4.bin");
    REQUIRE_THROWS_WITH(load_dataset("cifar10", d.path.string(), "train"),
                        PLX_CONTAINS("expected data_batch_4.bin"));
  }
}

TEST_CASE("the synthetic dataset is deterministic and learnable", "[cpu][data]") {
  SyntheticOptions o;
  o.train_count = 600;
  o.test_count = 300;
  o.shape = {2, 5, 6};
  o.classes = 4;
  o.seed = 11;
  const Dataset train = load_dataset("synthetic", "", "train", o);
  const Dataset test = load_dataset("synthetic", "", "test", o);
  CHECK(train.name == "synthetic/train");
  CHECK(train.count == 600);
  CHECK(test.count == 300);
  CHECK(train.sample_shape == std::vector<int64_t>{2, 5, 6});
  CHECK(train.images.size() == 600u * 60);
  CHECK(train.mean.size() == 2);
  for (int32_t l : train.labels) {
    REQUIRE(l >= 0);
    REQUIRE(l < 4);
  }
  // Same seed, same data; another seed, other data; splits differ.
  const Dataset again = load_dataset("synthetic", "", "train", o);
  CHECK(again.images == train.images);
  CHECK(again.labels == train.labels);
  CHECK(test.images != Bytes(train.images.begin(), train.images.begin() + 300 * 60));
  SyntheticOptions o2 = o;
  o2.seed = 12;
  CHECK(load_dataset("synthetic", "", "train", o2).images != train.images);

  // Learnable: class means of the training split classify the test split (nearest centroid).
  std::vector<std::vector<double>> centroid(4, std::vector<double>(60, 0.0));
  std::vector<int> per(4, 0);
  for (int64_t i = 0; i < train.count; ++i) {
    const int l = train.labels[static_cast<size_t>(i)];
    ++per[static_cast<size_t>(l)];
    for (int j = 0; j < 60; ++j)
      centroid[static_cast<size_t>(l)][static_cast<size_t>(j)] +=
          train.images[static_cast<size_t>(i * 60 + j)];
  }
  for (int k = 0; k < 4; ++k) {
    REQUIRE(per[static_cast<size_t>(k)] > 0);
    for (double& v : centroid[static_cast<size_t>(k)]) v /= per[static_cast<size_t>(k)];
  }
  int correct = 0;
  for (int64_t i = 0; i < test.count; ++i) {
    int best = -1;
    double best_d = 1e300;
    for (int k = 0; k < 4; ++k) {
      double dist = 0;
      for (int j = 0; j < 60; ++j) {
        const double diff = test.images[static_cast<size_t>(i * 60 + j)] -
                            centroid[static_cast<size_t>(k)][static_cast<size_t>(j)];
        dist += diff * diff;
      }
      if (dist < best_d) best_d = dist, best = k;
    }
    correct += best == test.labels[static_cast<size_t>(i)];
  }
  CHECK(correct >= 0.95 * static_cast<double>(test.count));

  REQUIRE_THROWS_WITH(synthetic(0, {1, 2, 2}, 3, 0), PLX_CONTAINS("count must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(synthetic(4, {1, 2}, 3, 0), PLX_CONTAINS("shape must be (C, H, W)"));
  REQUIRE_THROWS_WITH(synthetic(4, {1, 2, 2}, 3, 0, 0, 300),
                      PLX_CONTAINS("noise must be in 0..255"));
}

TEST_CASE("the epoch shuffle is a deterministic permutation that changes each epoch",
          "[cpu][data]") {
  const int64_t n = 1000;
  const std::vector<int64_t> a = shuffle_order(n, 7, 0);
  std::vector<int64_t> sorted = a, iota(n);
  std::sort(sorted.begin(), sorted.end());
  std::iota(iota.begin(), iota.end(), int64_t{0});
  CHECK(sorted == iota);
  CHECK(a != iota);
  CHECK(shuffle_order(n, 7, 0) == a);
  CHECK(shuffle_order(n, 7, 1) != a);
  CHECK(shuffle_order(n, 8, 0) != a);
  CHECK(shuffle_order(0, 7, 0).empty());
  CHECK(shuffle_order(1, 7, 0) == std::vector<int64_t>{0});
  // Through the loader: every sample exactly once per epoch, in the order shuffle_order gives.
  const Dataset ds = small_dataset(103, {1, 2, 2}, 5);
  LoaderOptions o;
  o.batch_size = 10;
  o.seed = 7;
  o.partial = PartialBatch::Pad;
  Loader l(ds, o);
  std::vector<int64_t> seen;
  for (const Batch& b : epoch_batches(l, 3))
    for (int64_t r = 0; r < b.real; ++r) seen.push_back(b.samples[static_cast<size_t>(r)]);
  CHECK(seen == shuffle_order(103, 7, 3));
  o.shuffle = false;
  Loader plain(ds, o);
  seen.clear();
  for (const Batch& b : epoch_batches(plain, 3))
    for (int64_t r = 0; r < b.real; ++r) seen.push_back(b.samples[static_cast<size_t>(r)]);
  std::vector<int64_t> in_order(103);
  std::iota(in_order.begin(), in_order.end(), int64_t{0});
  CHECK(seen == in_order);
}

TEST_CASE("a resumed loader gives the batches of an uninterrupted run", "[cpu][data]") {
  const Dataset ds = small_dataset(95, {1, 3, 3}, 4);
  LoaderOptions o;
  o.batch_size = 8;
  o.seed = 42;
  o.prefetch = 3;
  Loader full(ds, o);
  const std::vector<Batch> e0 = epoch_batches(full, 0), e1 = epoch_batches(full, 1);
  REQUIRE(e0.size() == 11);
  REQUIRE(e1.size() == 11);
  CHECK(e0[0].samples != e1[0].samples);
  for (size_t i = 0; i < e1.size(); ++i) {
    CHECK(e1[i].epoch == 1);
    CHECK(e1[i].index == static_cast<int64_t>(i));
  }

  for (int64_t k : {0, 1, 5, 10, 11}) {
    INFO("resume at batch " << k);
    Loader resumed(ds, o);
    const std::vector<Batch> got = epoch_batches(resumed, 1, k);
    REQUIRE(got.size() == e1.size() - static_cast<size_t>(k));
    for (size_t i = 0; i < got.size(); ++i) check_same(got[i], e1[static_cast<size_t>(k) + i]);
  }
  // The same loader abandons an epoch half way and resumes another.
  Loader l(ds, o);
  l.start(0);
  Batch b;
  REQUIRE(l.next(b));
  REQUIRE(l.next(b));
  const std::vector<Batch> again = epoch_batches(l, 1, 4);
  REQUIRE(again.size() == 7);
  for (size_t i = 0; i < again.size(); ++i) check_same(again[i], e1[4 + i]);
  CHECK_FALSE(l.next(b));  // the end of an epoch stays the end

  REQUIRE_THROWS_WITH(l.start(1, 12), PLX_CONTAINS("first_batch 12 is outside [0, 11]"));
  REQUIRE_THROWS_WITH(l.start(-1), PLX_CONTAINS("epoch must be >= 0"));
}

TEST_CASE("a partial last batch is dropped or padded with ignored labels", "[cpu][data]") {
  const Dataset ds = small_dataset(10, {1, 2, 3}, 3);
  LoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  {
    Loader l(ds, o);
    CHECK(l.batches_per_epoch() == 2);
    CHECK(l.samples() == 10);
    const std::vector<Batch> bs = epoch_batches(l, 0);
    REQUIRE(bs.size() == 2);
    for (const Batch& b : bs) {
      CHECK(b.rows == 4);
      CHECK(b.real == 4);
      CHECK(b.images.size() == 24u);
    }
  }
  o.partial = PartialBatch::Pad;
  {
    Loader l(ds, o);
    CHECK(l.batches_per_epoch() == 3);
    const std::vector<Batch> bs = epoch_batches(l, 0);
    REQUIRE(bs.size() == 3);
    const Batch& last = bs[2];
    CHECK(last.rows == 4);
    CHECK(last.real == 2);
    CHECK(last.labels == std::vector<int32_t>{8 % 3, 9 % 3, kIgnoreLabel, kIgnoreLabel});
    CHECK(kIgnoreLabel == -100);
    CHECK(last.samples == std::vector<int64_t>{8, 9, -1, -1});
    REQUIRE(last.images.size() == 24u);
    for (size_t i = 12; i < 24; ++i) CHECK(last.images[i] == 0.0f);
    CHECK(last.images[0] != 0.0f);
  }
  // limit: only the first samples, in either mode.
  o.limit = 7;
  {
    Loader l(ds, o);
    CHECK(l.samples() == 7);
    CHECK(l.batches_per_epoch() == 2);
    const std::vector<Batch> bs = epoch_batches(l, 0);
    CHECK(bs[1].real == 3);
    CHECK(bs[1].samples == std::vector<int64_t>{4, 5, 6, -1});
  }
  o.partial = PartialBatch::Drop;
  o.shuffle = true;
  {
    Loader l(ds, o);
    CHECK(l.batches_per_epoch() == 1);
    const std::vector<Batch> bs = epoch_batches(l, 2);
    REQUIRE(bs.size() == 1);
    for (int64_t s : bs[0].samples) {
      CHECK(s >= 0);
      CHECK(s < 7);
    }
  }
  o.limit = 100;  // more than there are: all of them
  CHECK(Loader(ds, o).samples() == 10);
}

TEST_CASE("batches are normalised per channel with the dataset's or given mean and std",
          "[cpu][data]") {
  const Dataset ds = small_dataset(6, {3, 2, 2}, 2);
  REQUIRE(ds.mean.size() == 3);
  std::vector<double> mean, sd;
  plain_stats(ds, mean, sd);
  for (size_t c = 0; c < 3; ++c) {
    CHECK(ds.mean[c] == Approx(mean[c]).epsilon(1e-6));
    CHECK(ds.std[c] == Approx(sd[c]).epsilon(1e-5));
    CHECK(ds.mean[c] != ds.mean[(c + 1) % 3]);  // the channels differ: per-channel is tested
  }
  const auto check = [&](const LoaderOptions& o, const std::vector<double>& m,
                         const std::vector<double>& s) {
    Loader l(ds, o);
    for (const Batch& b : epoch_batches(l, 0))
      for (int64_t r = 0; r < b.real; ++r) {
        const int64_t smp = b.samples[static_cast<size_t>(r)];
        for (int64_t j = 0; j < 12; ++j) {
          const size_t c = static_cast<size_t>(j / 4);
          const double want = (ds.images[static_cast<size_t>(smp * 12 + j)] / 255.0 - m[c]) / s[c];
          CHECK(b.images[static_cast<size_t>(r * 12 + j)] == Approx(want).margin(1e-5));
        }
      }
  };
  LoaderOptions o;
  o.batch_size = 4;
  o.partial = PartialBatch::Pad;
  check(o, mean, sd);
  o.mean = {0.5f, 0.25f, 0.0f};
  o.std = {0.5f, 2.0f, 1.0f};
  check(o, {0.5, 0.25, 0.0}, {0.5, 2.0, 1.0});
  // A dataset without stats gets them computed.
  Dataset bare = ds;
  bare.mean.clear();
  bare.std.clear();
  {
    LoaderOptions o2;
    o2.batch_size = 3;
    Loader l(bare, o2);
    Loader ref(ds, o2);
    const std::vector<Batch> a = epoch_batches(l, 0), b = epoch_batches(ref, 0);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) check_same(a[i], b[i]);
  }
}

TEST_CASE("bad loader options and inconsistent datasets are errors", "[cpu][data]") {
  const Dataset ds = small_dataset(10, {1, 2, 2}, 3);
  const auto with = [](auto f) {
    LoaderOptions o;
    o.batch_size = 4;
    f(o);
    return o;
  };
  REQUIRE_THROWS_AS(Loader(ds, with([](LoaderOptions& o) { o.batch_size = 0; })), DataError);
  REQUIRE_THROWS_WITH(Loader(ds, with([](LoaderOptions& o) { o.batch_size = 0; })),
                      PLX_CONTAINS("data loader for small: batch_size must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(Loader(ds, with([](LoaderOptions& o) { o.prefetch = 0; })),
                      PLX_CONTAINS("prefetch must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(Loader(ds, with([](LoaderOptions& o) { o.limit = -1; })),
                      PLX_CONTAINS("limit must be >= 0, got -1"));
  REQUIRE_THROWS_WITH(Loader(ds, with([](LoaderOptions& o) { o.batch_size = 11; })),
                      PLX_CONTAINS("10 samples make no full batch of 11"));
  REQUIRE_THROWS_WITH(Loader(ds, with([](LoaderOptions& o) {
                               o.mean = {0.1f, 0.2f};
                               o.std = {1.0f, 1.0f};
                             })),
                      PLX_CONTAINS("one value per channel (1), got 2 and 2"));
  REQUIRE_THROWS_WITH(Loader(ds, with([](LoaderOptions& o) { o.mean = {0.1f}; })),
                      PLX_CONTAINS("give both mean and std"));
  REQUIRE_THROWS_WITH(Loader(ds, with([](LoaderOptions& o) {
                               o.mean = {0.1f};
                               o.std = {0.0f};
                             })),
                      PLX_CONTAINS("channel 0 has mean") && PLX_CONTAINS("std > 0"));
  Dataset bad = ds;
  bad.images.pop_back();
  REQUIRE_THROWS_WITH(Loader(bad, LoaderOptions{}),
                      PLX_CONTAINS("39 image bytes, expected 40 (count 10 x 4)"));
  bad = ds;
  bad.labels.pop_back();
  REQUIRE_THROWS_WITH(Loader(bad, LoaderOptions{}), PLX_CONTAINS("9 labels, expected count 10"));
  Dataset empty;
  empty.name = "nothing";
  empty.sample_shape = {1, 2, 2};
  empty.num_classes = 2;
  REQUIRE_THROWS_WITH(Loader(empty, LoaderOptions{}),
                      PLX_CONTAINS("data loader for nothing: the dataset is empty"));
  REQUIRE_THROWS_WITH(channel_stats(empty), PLX_CONTAINS("nothing: empty dataset"));

  Loader l(ds, with([](LoaderOptions&) {}));
  Batch b;
  REQUIRE_THROWS_WITH(l.next(b), PLX_CONTAINS("no epoch started; call start(epoch) first"));
}

TEST_CASE("an error on the loader thread reaches next after the batches before it", "[cpu][data]") {
  Dataset ds = small_dataset(16, {1, 2, 2}, 3);
  ds.labels[9] = 3;  // out of [0, 3): batch 2 of 4 (no shuffle) cannot be made
  LoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  Loader l(ds, o);
  for (int pass = 0; pass < 2; ++pass) {  // a new start() clears the error
    l.start(0);
    Batch b;
    REQUIRE(l.next(b));
    CHECK(b.index == 0);
    REQUIRE(l.next(b));
    CHECK(b.index == 1);
    REQUIRE_THROWS_AS(l.next(b), DataError);
    REQUIRE_THROWS_WITH(l.next(b), PLX_CONTAINS("small: sample 9 has label 3, outside [0, 3)"));
  }
  // An epoch that does not reach the bad sample runs through.
  l.start(1, 3);
  Batch b;
  REQUIRE(l.next(b));
  CHECK(b.index == 3);
  CHECK_FALSE(l.next(b));
}

TEST_CASE("a loader stops cleanly with a full queue, mid-epoch or never started", "[cpu][data]") {
  const Dataset ds = small_dataset(200, {1, 4, 4}, 5);
  LoaderOptions o;
  o.batch_size = 8;
  o.prefetch = 3;
  { Loader never(ds, o); }
  {
    Loader l(ds, o);
    l.start(0);
    // Wait (boundedly) until the worker has filled the queue and is blocked on it.
    for (int i = 0; i < 2000 && l.stats().queued < 3; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(l.stats().queued == 3);
  }  // the destructor must not hang
  {
    Loader l(ds, o);
    l.start(0);
    Batch b;
    REQUIRE(l.next(b));
    for (int e = 1; e < 20; ++e) l.start(e);  // each start cancels the last
    REQUIRE(l.next(b));
    CHECK(b.epoch == 19);
    CHECK(b.index == 0);
  }
}

TEST_CASE("batch buffers are recycled and the loader counts batches and waits", "[cpu][data]") {
  const Dataset ds = small_dataset(400, {1, 4, 4}, 5);
  LoaderOptions o;
  o.batch_size = 8;
  o.prefetch = 2;
  Loader l(ds, o);
  std::set<const float*> buffers;
  Batch b;
  int64_t n = 0;
  for (int e = 0; e < 2; ++e) {
    l.start(e);
    while (l.next(b)) {
      buffers.insert(b.images.data());
      ++n;
    }
  }
  CHECK(n == 2 * l.batches_per_epoch());
  // prefetch buffers plus the consumer's own: no allocation per batch.
  CHECK(buffers.size() <= 3u);
  const LoaderStats st = l.stats();
  CHECK(st.batches == n);
  CHECK(st.waits <= n + 2);
  CHECK(st.wait_seconds >= 0.0);
  CHECK(l.wait_seconds() == st.wait_seconds);
  CHECK(st.assemble_seconds >= 0.0);
}

TEST_CASE("sharded loaders split each global batch by rows with its padding", "[cpu][data]") {
  const Dataset ds = small_dataset(11, {1, 2, 3}, 3);
  LoaderOptions o;
  o.batch_size = 8;
  o.seed = 5;
  o.partial = PartialBatch::Pad;
  Loader whole(ds, o);
  const std::vector<Batch> want = epoch_batches(whole, 1);  // 2 batches: 8 real, then 3 real
  REQUIRE(want.size() == 2);
  for (int shards : {2, 4}) {
    std::vector<std::vector<Batch>> got;
    for (int r = 0; r < shards; ++r) {
      LoaderOptions so = o;
      so.shards = shards;
      so.shard = r;
      Loader l(ds, so);
      CHECK(l.batches_per_epoch() == whole.batches_per_epoch());
      got.push_back(epoch_batches(l, 1));
    }
    for (size_t bi = 0; bi < want.size(); ++bi) {
      INFO(shards << " shards, batch " << bi);
      std::vector<int64_t> samples;
      std::vector<int32_t> labels;
      std::vector<float> images;
      int64_t real = 0;
      for (int r = 0; r < shards; ++r) {
        const Batch& b = got[static_cast<size_t>(r)][bi];
        CHECK(b.rows == 8 / shards);
        CHECK(b.global_real == want[bi].real);
        real += b.real;
        samples.insert(samples.end(), b.samples.begin(), b.samples.end());
        labels.insert(labels.end(), b.labels.begin(), b.labels.end());
        images.insert(images.end(), b.images.begin(), b.images.end());
      }
      CHECK(real == want[bi].real);
      CHECK(samples == want[bi].samples);
      CHECK(labels == want[bi].labels);
      CHECK(images == want[bi].images);
    }
  }
  // With 4 shards of 2 rows, the last batch's 3 samples leave shard 3 all padding.
  LoaderOptions so = o;
  so.shards = 4;
  so.shard = 3;
  Loader l(ds, so);
  const std::vector<Batch> last = epoch_batches(l, 1);
  CHECK(last[1].real == 0);
  CHECK(last[1].labels == std::vector<int32_t>{kIgnoreLabel, kIgnoreLabel});

  LoaderOptions bad = o;
  bad.shards = 3;
  CHECK_THROWS_WITH(Loader(ds, bad), PLX_CONTAINS("batch_size 8 does not divide into 3 equal shards"));
  bad.shards = 2;
  bad.shard = 2;
  CHECK_THROWS_WITH(Loader(ds, bad), PLX_CONTAINS("shard 2 of 2 is not a valid shard"));
}
