// Datasets by name (where their files live, what provides them), per-channel statistics, the
// synthetic dataset and the epoch shuffle. Random numbers come from Philox only, so every
// platform and standard library gives the same samples and the same order.
#include <array>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "plexus/data.hpp"
#include "plexus/sdk/philox.hpp"

namespace plexus::data {
namespace fs = std::filesystem;

namespace {

// Philox streams keyed by the seed, told apart by the top counter word.
constexpr uint32_t kShuffleDomain = 0x53485546u;   // "SHUF"
constexpr uint32_t kTemplateDomain = 0x54454d50u;  // "TEMP"
constexpr uint32_t kSampleDomain = 0x53414d50u;    // "SAMP"
constexpr uint32_t kLabelDomain = 0x4c41424cu;     // "LABL"

Philox4 draw(uint64_t seed, uint32_t domain, uint32_t stream, uint64_t block) {
  return philox4x32(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), stream,
                    domain, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// x in [0, 2^32) mapped to [0, n) by multiply-shift.
uint32_t below(uint32_t x, uint32_t n) {
  return static_cast<uint32_t>((static_cast<uint64_t>(x) * n) >> 32);
}

std::string pretty(const std::string& kind) {
  if (kind == "fashion-mnist") return "Fashion-MNIST";
  if (kind == "mnist") return "MNIST";
  return kind;
}

// dir/base.gz, else dir/base; "" when neither exists.
std::string find_idx(const std::string& dir, const std::string& base) {
  for (const std::string& name : {base + ".gz", base}) {
    const fs::path p = fs::path(dir) / name;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return {};
}

Dataset load_mnist_like(const std::string& kind, const std::string& dir, const std::string& split) {
  const std::string what = pretty(kind);
  std::string provider;
  if (kind == "fashion-mnist")
    provider =
        "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or set "
        "data.path";
  else
    provider =
        "put the four MNIST database files (train-images-idx3-ubyte.gz, "
        "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) in a "
        "directory and set data.path to it";
  if (dir.empty()) throw DataError(what + ": no directory given; " + provider);
  const std::string prefix = split == "train" ? "train" : "t10k";
  const std::string images_base = prefix + "-images-idx3-ubyte";
  const std::string labels_base = prefix + "-labels-idx1-ubyte";
  std::error_code ec;
  const std::string where = fs::is_directory(dir, ec) ? dir : dir + " (no such directory)";
  const std::string images = find_idx(dir, images_base);
  if (images.empty())
    throw DataError(what + " not found in " + where + ": expected " + images_base +
                    ".gz (or without .gz); " + provider);
  const std::string labels = find_idx(dir, labels_base);
  if (labels.empty())
    throw DataError(what + " not found in " + where + ": expected " + labels_base +
                    ".gz (or without .gz); " + provider);
  Dataset ds = load_idx(images, labels, kind + "/" + split, 10);
  if (ds.sample_shape[1] != 28 || ds.sample_shape[2] != 28)
    throw DataError(images + ": " + what + " images are 28x28, this file has " +
                    std::to_string(ds.sample_shape[1]) + "x" + std::to_string(ds.sample_shape[2]));
  return ds;
}

Dataset load_cifar10(const std::string& dir, const std::string& split) {
  const std::string provider =
      "download https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz, extract it and set "
      "data.path to the directory holding data_batch_1.bin (cifar-10-batches-bin)";
  if (dir.empty()) throw DataError("CIFAR-10: no directory given; " + provider);
  std::vector<std::string> names;
  if (split == "train")
    for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  else
    names.push_back("test_batch.bin");
  // The archive extracts into cifar-10-batches-bin/; accept its parent too.
  std::error_code ec;
  fs::path base = dir;
  if (!fs::is_regular_file(base / names[0], ec) &&
      fs::is_regular_file(base / "cifar-10-batches-bin" / names[0], ec))
    base /= "cifar-10-batches-bin";
  std::vector<std::string> paths;
  for (const std::string& n : names) {
    const fs::path p = base / n;
    if (!fs::is_regular_file(p, ec)) {
      const std::string where = fs::is_directory(dir, ec) ? dir : dir + " (no such directory)";
      throw DataError("CIFAR-10 not found in " + where + ": expected " + n +
                      " (there or in cifar-10-batches-bin/); " + provider);
    }
    paths.push_back(p.string());
  }
  return load_cifar10_files(paths, "cifar10/" + split);
}

}  // namespace

int64_t Dataset::sample_size() const {
  int64_t s = sample_shape.empty() ? 0 : 1;
  for (int64_t d : sample_shape) s *= d;
  return s;
}

ChannelStats channel_stats(const Dataset& ds) {
  const int64_t size = ds.sample_size();
  if (ds.count <= 0 || size <= 0) throw DataError(ds.name + ": empty dataset, no statistics");
  if (static_cast<int64_t>(ds.images.size()) != ds.count * size)
    throw DataError(ds.name + ": " + std::to_string(ds.images.size()) + " image bytes, expected " +
                    std::to_string(ds.count * size) + " (count x C*H*W)");
  const int64_t channels = ds.sample_shape[0], plane = size / channels;
  // A histogram per channel is exact and keeps floating point out of the loop over pixels.
  std::vector<std::array<uint64_t, 256>> hist(static_cast<size_t>(channels));
  for (auto& h : hist) h.fill(0);
  const uint8_t* p = ds.images.data();
  for (int64_t i = 0; i < ds.count; ++i)
    for (int64_t c = 0; c < channels; ++c) {
      auto& h = hist[static_cast<size_t>(c)];
      for (int64_t j = 0; j < plane; ++j) ++h[*p++];
    }
  ChannelStats st;
  const double n = static_cast<double>(ds.count) * static_cast<double>(plane);
  for (const auto& h : hist) {
    double sum = 0;
    for (int v = 0; v < 256; ++v) sum += static_cast<double>(h[v]) * (v / 255.0);
    const double mean = sum / n;
    double var = 0;
    for (int v = 0; v < 256; ++v) {
      const double d = v / 255.0 - mean;
      var += static_cast<double>(h[v]) * d * d;
    }
    st.mean.push_back(static_cast<float>(mean));
    st.std.push_back(static_cast<float>(std::sqrt(var / n)));
  }
  return st;
}

Dataset synthetic(int64_t count, std::vector<int64_t> shape, int32_t classes, uint64_t seed,
                  uint64_t stream, int32_t noise) {
  if (count < 1)
    throw DataError("synthetic dataset: count must be >= 1, got " + std::to_string(count));
  if (shape.size() != 3 || shape[0] < 1 || shape[1] < 1 || shape[2] < 1)
    throw DataError("synthetic dataset: shape must be (C, H, W) with each >= 1");
  if (classes < 1)
    throw DataError("synthetic dataset: classes must be >= 1, got " + std::to_string(classes));
  if (noise < 0 || noise > 255)
    throw DataError("synthetic dataset: noise must be in 0..255, got " + std::to_string(noise));
  Dataset ds;
  ds.name = "synthetic";
  ds.count = count;
  ds.sample_shape = std::move(shape);
  ds.num_classes = classes;
  const int64_t size = ds.sample_size();

  // Templates depend on the seed alone, so every split shares them.
  std::vector<uint8_t> templates(static_cast<size_t>(classes * size));
  for (size_t i = 0; i < templates.size(); i += 4) {
    const Philox4 r = draw(seed, kTemplateDomain, 0, i / 4);
    for (size_t w = 0; w < 4 && i + w < templates.size(); ++w)
      templates[i + w] = static_cast<uint8_t>(r.v[w] >> 24);
  }
  const uint32_t s = static_cast<uint32_t>(stream);
  ds.labels.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; i += 4) {
    const Philox4 r = draw(seed, kLabelDomain, s, static_cast<uint64_t>(i) / 4);
    for (int64_t w = 0; w < 4 && i + w < count; ++w)
      ds.labels[static_cast<size_t>(i + w)] = static_cast<int32_t>(below(r.v[w], classes));
  }
  ds.images.resize(static_cast<size_t>(count * size));
  const uint32_t span = 2 * static_cast<uint32_t>(noise) + 1;
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* t = templates.data() + ds.labels[static_cast<size_t>(i)] * size;
    uint8_t* dst = ds.images.data() + i * size;
    // Blocks of 4 per sample, so a sample's noise does not depend on the sample size's parity.
    const uint64_t base = static_cast<uint64_t>(i) * static_cast<uint64_t>((size + 3) / 4);
    for (int64_t j = 0; j < size; j += 4) {
      const Philox4 r = draw(seed, kSampleDomain, s, base + static_cast<uint64_t>(j / 4));
      for (int64_t w = 0; w < 4 && j + w < size; ++w) {
        const int v = t[j + w] + static_cast<int>(below(r.v[w], span)) - noise;
        dst[j + w] = static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
  }
  ChannelStats st = channel_stats(ds);
  ds.mean = std::move(st.mean);
  ds.std = std::move(st.std);
  return ds;
}

std::string default_dir(const std::string& kind) {
  if (kind == "fashion-mnist") return "/usr/share/datasets/fashion-mnist";
  return {};
}

Dataset load_dataset(const std::string& kind, const std::string& dir, const std::string& split,
                     const SyntheticOptions& synth) {
  if (split != "train" && split != "test")
    throw DataError("unknown split '" + split + "' for dataset " + kind +
                    " (expected train or test)");
  const std::string d = dir.empty() ? default_dir(kind) : dir;
  if (kind == "fashion-mnist" || kind == "mnist") return load_mnist_like(kind, d, split);
  if (kind == "cifar10") return load_cifar10(d, split);
  if (kind == "synthetic") {
    const bool train = split == "train";
    Dataset ds = synthetic(train ? synth.train_count : synth.test_count, synth.shape, synth.classes,
                           synth.seed, train ? 0 : 1, synth.noise);
    ds.name = "synthetic/" + split;
    return ds;
  }
  throw DataError("unknown dataset '" + kind +
                  "' (known: fashion-mnist, mnist, cifar10, synthetic)");
}

std::vector<int64_t> shuffle_order(int64_t n, uint64_t seed, int64_t epoch) {
  if (n < 0) throw DataError("shuffle_order: n must be >= 0, got " + std::to_string(n));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  const uint64_t e = static_cast<uint64_t>(epoch);
  // Fisher-Yates from the back; position i draws j in [0, i] from counter (i, epoch). A 64-bit
  // draw scaled by multiply-shift is biased by at most n / 2^64: nothing a run can see.
  for (int64_t i = n - 1; i > 0; --i) {
    const Philox4 r =
        philox4x32(static_cast<uint32_t>(i), static_cast<uint32_t>(uint64_t(i) >> 32),
                   static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32) ^ kShuffleDomain,
                   static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    const uint64_t x = uint64_t(r.v[0]) << 32 | r.v[1];
    const auto j = static_cast<int64_t>(
        (static_cast<unsigned __int128>(x) * static_cast<unsigned __int128>(i + 1)) >> 64);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

}  // namespace plexus::data
