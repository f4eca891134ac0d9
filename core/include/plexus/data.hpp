// Training data: image classification datasets in host memory and a prefetching batch loader.
//
// Readers: IDX (MNIST, Fashion-MNIST; gzip or raw, told apart by the gzip magic bytes), the
// CIFAR-10 binary format, and a synthetic dataset for smoke tests. A dataset keeps its pixels as
// bytes; the Loader gathers a batch, scales it to [0, 1] and normalises it with the per-channel
// mean/std in one pass, on a background thread, so a training step does not wait for data.
//
// Determinism: the shuffle order depends only on (seed, epoch), from Philox and our own
// Fisher-Yates, never std::shuffle or std distributions (their results differ between standard
// libraries). So a run resumed at (epoch, batch) sees exactly the batches an uninterrupted run
// would, on any platform.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plexus/error.hpp"

namespace plexus {

// A dataset that cannot be read or used: a missing, corrupt or truncated file, a wrong magic
// number, mismatched counts, labels out of range, bad loader options.
class DataError : public Error {
 public:
  using Error::Error;
};

namespace data {

// The label of a padding row; softmax_cross_entropy ignores it (its ignore_index default).
inline constexpr int32_t kIgnoreLabel = -100;

// Images with integer class labels, in host memory.
struct Dataset {
  std::string name;                   // e.g. "fashion-mnist/train"
  int64_t count = 0;                  // number of samples
  std::vector<int64_t> sample_shape;  // (C, H, W)
  int32_t num_classes = 0;
  std::vector<uint8_t> images;  // (count, C, H, W), row-major
  std::vector<int32_t> labels;  // (count), each in [0, num_classes)
  // Per channel, over this dataset's pixels scaled to [0, 1] (population std). For a test split
  // the trainer should normalise with the training split's values (LoaderOptions::mean/std).
  std::vector<float> mean, std;

  // C*H*W, the bytes of one sample.
  int64_t sample_size() const;
  int64_t channels() const { return sample_shape.empty() ? 0 : sample_shape[0]; }
};

// Per-channel mean and population std of a dataset's pixels scaled to [0, 1], exact (from a byte
// histogram per channel). Throws DataError for an empty or inconsistent dataset.
struct ChannelStats {
  std::vector<float> mean, std;
};
ChannelStats channel_stats(const Dataset& ds);

// Reads an IDX image file (magic 0x00000803: count, rows, cols) and an IDX label file (magic
// 0x00000801), each gzip-compressed or raw. Returns samples of shape (1, rows, cols) with stats.
// Throws DataError naming the file and what was expected vs found: unreadable or corrupt gzip,
// wrong magic, truncated or over-long data, zero dimensions, count mismatch, label >= num_classes.
Dataset load_idx(const std::string& images_path, const std::string& labels_path, std::string name,
                 int32_t num_classes = 10);

// Reads CIFAR-10 binary batch files (records of 1 label byte + 3*32*32 bytes, CHW) into one
// dataset of shape (3, 32, 32) with stats, in the order given. Throws DataError for a missing or
// empty file, a partial record, or a label >= 10.
Dataset load_cifar10_files(const std::vector<std::string>& paths, std::string name);

// The synthetic dataset: each class has a fixed random template (from the seed alone), a sample
// is its class's template plus uniform noise in [-noise, noise] (clamped to 0..255), labels drawn
// at random. Learnable by a small model in a few steps. Splits share templates, not samples.
struct SyntheticOptions {
  int64_t train_count = 8192;
  int64_t test_count = 2048;
  std::vector<int64_t> shape = {1, 28, 28};  // (C, H, W)
  int32_t classes = 10;
  uint64_t seed = 0;
  int32_t noise = 96;  // pixel units, 0..255
};
// `stream` tells splits apart (train 0, test 1): same templates, different samples and labels.
// Throws DataError for a non-positive count, shape or class count, or noise outside 0..255.
Dataset synthetic(int64_t count, std::vector<int64_t> shape, int32_t classes, uint64_t seed,
                  uint64_t stream = 0, int32_t noise = 96);

// The directory a kind is read from when data.path is empty: Debian's dataset-fashion-mnist
// location for "fashion-mnist", "" (none) for the others.
std::string default_dir(const std::string& kind);

// Loads split "train" or "test" of kind "fashion-mnist" | "mnist" | "cifar10" | "synthetic" from
// `dir` ("" = default_dir(kind)). IDX files may be named with or without ".gz"; CIFAR-10 files
// may sit in dir or in dir/cifar-10-batches-bin. A missing dataset is a DataError that says which
// files were expected and which package or download provides them.
Dataset load_dataset(const std::string& kind, const std::string& dir, const std::string& split,
                     const SyntheticOptions& synth = {});

// The sample order of an epoch: a permutation of 0..n-1 from (seed, epoch) by Fisher-Yates over
// Philox; the same on every platform.
std::vector<int64_t> shuffle_order(int64_t n, uint64_t seed, int64_t epoch);

// What to do with the samples left over after the last full batch.
enum class PartialBatch {
  Drop,  // skip them: every batch is full
  Pad,   // one last batch padded with zero images and label kIgnoreLabel
};

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;
  uint64_t seed = 0;
  PartialBatch partial = PartialBatch::Drop;
  std::vector<float> mean, std;  // per channel; empty: the dataset's (computed if it has none)
  int prefetch = 2;              // batches assembled ahead of the consumer, >= 1
  int64_t limit = 0;             // use only the first `limit` samples; 0: all
  bool images = true;            // false: batches carry labels and samples only (the images are
                                 // resident on the device and gathered there)
  // Data parallelism: batch_size is the global batch, split into `shards` equal slices by row;
  // this loader hands out slice `shard` of each global batch (rows shard*B/S .. (shard+1)*B/S),
  // so the shards of one epoch together are exactly the batches of an unsharded loader.
  // batch_size must divide by shards.
  int shards = 1;
  int shard = 0;
};

// One batch. Buffers are reused: next() swaps them with the loader's, so a consumer that keeps
// passing the same Batch gets no allocations after the first few calls.
struct Batch {
  std::vector<float> images;     // (rows, C, H, W), normalised; padding rows are zero
  std::vector<int32_t> labels;   // (rows); padding rows kIgnoreLabel
  std::vector<int64_t> samples;  // (rows) dataset index of each row; padding rows -1
  int64_t rows = 0;              // always batch_size / shards
  int64_t real = 0;              // rows holding samples (< rows only in a padded last batch)
  int64_t global_real = 0;       // rows holding samples in the whole global batch (all shards)
  int64_t epoch = 0;
  int64_t index = 0;  // batch index within the epoch
};

struct LoaderStats {
  int64_t batches = 0;          // batches handed out by next()
  int64_t waits = 0;            // next() calls that found no batch ready and blocked
  double wait_seconds = 0;      // time next() spent blocked
  double assemble_seconds = 0;  // worker time spent gathering and normalising
  int queued = 0;               // batches ready now
};

// Prefetching loader: a worker thread assembles the batches of the current epoch into a bounded
// queue of `prefetch` buffers. Use from one consumer thread. The dataset must outlive the loader.
class Loader {
 public:
  // Checks the options against the dataset (DataError: batch_size < 1, prefetch < 1, limit < 0,
  // mean/std not one per channel or std <= 0, image/label sizes that disagree with count, no
  // batch to make) and starts the worker, idle until start().
  Loader(const Dataset& ds, LoaderOptions opt);
  // Stops and joins the worker, whatever the state of the queue.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Batches in one epoch: floor(n / batch_size) with Drop, ceil with Pad (n = samples used).
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Samples used per epoch: min(count, limit) (all when limit is 0).
  int64_t samples() const { return n_; }
  // Begins epoch `epoch` at batch `first_batch` (0 <= first_batch <= batches_per_epoch()),
  // dropping whatever was queued. The batches are those an uninterrupted epoch has from there.
  void start(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the epoch into `out` (its old buffers are recycled); false at the end of
  // the epoch. Rethrows an exception raised by the worker for this epoch, after the batches made
  // before it. Throws Error if start() was never called.
  bool next(Batch& out);
  // Total time next() waited for the worker.
  double wait_seconds() const;
  // Sample `sample`'s image, normalised exactly as batches are, into dst (C*H*W floats).
  void normalise(int64_t sample, float* dst) const;
  LoaderStats stats() const;

 private:
  struct State;  // the queue and the worker, shared with the worker thread
  std::unique_ptr<State> s_;
  int64_t n_ = 0, batches_per_epoch_ = 0;
};

}  // namespace data
}  // namespace plexus
