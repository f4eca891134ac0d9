// File readers: whole files into memory (gunzipped when they start with the gzip magic), IDX
// (MNIST, Fashion-MNIST) and CIFAR-10 binary batches. Every error names the file and says what was
// expected and what was found, since the usual causes are a truncated download or the wrong file.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "plexus/data.hpp"

namespace plexus::data {
namespace {

std::string num(uint64_t v) {
  return std::to_string(v);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError(path + ": " + what);
}

// A file's bytes after decompression; `gzip` says whether it was compressed, for messages.
struct FileBytes {
  std::vector<uint8_t> data;
  bool gzip = false;
  // "N bytes" or "N bytes (decompressed)".
  std::string size_text(uint64_t n) const {
    return num(n) + (gzip ? " bytes (decompressed)" : " bytes");
  }
};

std::vector<uint8_t> read_raw(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<uint8_t> data;
  if (std::fseek(f, 0, SEEK_END) == 0) {
    const long size = std::ftell(f);
    if (size > 0) data.reserve(static_cast<size_t>(size));
    std::rewind(f);
  }
  uint8_t buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + got);
  const bool bad = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (bad) fail(path, std::string("read error: ") + std::strerror(err));
  return data;
}

// Inflates a gzip file, members one after another as gzip(1) does.
std::vector<uint8_t> gunzip(const std::string& path, const std::vector<uint8_t>& in) {
  // The trailer holds the size mod 2^32 of the last member: a hint only, capped at deflate's
  // largest ratio so that a corrupt trailer cannot ask for gigabytes.
  size_t hint = in.size() * 4;
  if (in.size() >= 18) {
    const uint8_t* t = in.data() + in.size() - 4;
    const uint64_t isize =
        uint64_t(t[0]) | uint64_t(t[1]) << 8 | uint64_t(t[2]) << 16 | uint64_t(t[3]) << 24;
    hint = static_cast<size_t>(
        std::min<uint64_t>(std::max<uint64_t>(isize, 1024), uint64_t(in.size()) * 1032 + 1024));
  }
  std::vector<uint8_t> out(hint);
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) fail(path, "cannot initialise zlib");
  size_t in_pos = 0, out_pos = 0;
  constexpr size_t kChunk = size_t(1) << 30;  // avail_in/out are 32-bit
  for (;;) {
    if (out_pos == out.size()) out.resize(out.size() * 2);
    zs.next_in = const_cast<Bytef*>(in.data() + in_pos);
    zs.avail_in = static_cast<uInt>(std::min(in.size() - in_pos, kChunk));
    zs.next_out = out.data() + out_pos;
    zs.avail_out = static_cast<uInt>(std::min(out.size() - out_pos, kChunk));
    const uInt avail_in = zs.avail_in, avail_out = zs.avail_out;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += avail_in - zs.avail_in;
    out_pos += avail_out - zs.avail_out;
    if (rc == Z_STREAM_END) {
      if (in_pos == in.size()) break;
      // gzip(1) ignores zero padding after the last member; anything else must be a member.
      if (std::all_of(in.begin() + static_cast<std::ptrdiff_t>(in_pos), in.end(),
                      [](uint8_t b) { return b == 0; }))
        break;
      if (in.size() - in_pos < 2 || in[in_pos] != 0x1f || in[in_pos + 1] != 0x8b) {
        inflateEnd(&zs);
        fail(path, "corrupt gzip: " + num(in.size() - in_pos) +
                       " bytes of trailing data after the compressed stream");
      }
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && in_pos == in.size()) {
      inflateEnd(&zs);
      fail(path, "corrupt gzip: the compressed stream ends early (truncated file?) after " +
                     num(in.size()) + " bytes");
    }
    if (rc == Z_BUF_ERROR && out_pos == out.size()) continue;
    const std::string msg = zs.msg ? zs.msg : "error " + std::to_string(rc);
    inflateEnd(&zs);
    fail(path, "corrupt gzip: " + msg);
  }
  inflateEnd(&zs);
  out.resize(out_pos);
  return out;
}

FileBytes read_bytes(const std::string& path) {
  FileBytes f;
  f.data = read_raw(path);
  if (f.data.size() >= 2 && f.data[0] == 0x1f && f.data[1] == 0x8b) {
    f.gzip = true;
    f.data = gunzip(path, f.data);
  }
  return f;
}

uint32_t be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// Checks the IDX magic (0, 0, type 0x08 = unsigned bytes, ndims) and returns the dimensions.
std::vector<uint32_t> idx_header(const std::string& path, const FileBytes& f, uint8_t ndims,
                                 const char* what) {
  const size_t header = 4 + 4 * size_t(ndims);
  const uint32_t want = 0x0800u | ndims;
  if (f.data.size() < 4)
    fail(path, "truncated: an IDX file starts with a 4-byte magic number, file has " +
                   f.size_text(f.data.size()));
  const uint32_t magic = be32(f.data.data());
  if (magic != want) {
    std::string hint;
    if (magic == 0x0801) hint = " (that of an IDX labels file)";
    if (magic == 0x0803) hint = " (that of an IDX images file)";
    fail(path, "wrong magic number " + hex32(magic) + hint + ", expected " + hex32(want) +
                   " (IDX " + what + ": unsigned bytes, " + std::to_string(ndims) +
                   (ndims == 1 ? " dimension)" : " dimensions)"));
  }
  if (f.data.size() < header)
    fail(path, "truncated: the IDX header has " + num(header) + " bytes, file has " +
                   f.size_text(f.data.size()));
  std::vector<uint32_t> dims(ndims);
  for (size_t i = 0; i < ndims; ++i) dims[i] = be32(f.data.data() + 4 + 4 * i);
  return dims;
}

// Checks that exactly `expected` data bytes follow the header.
void check_payload(const std::string& path, const FileBytes& f, size_t header, uint64_t expected,
                   const std::string& says) {
  const uint64_t have = f.data.size() - header;
  if (have < expected)
    fail(path, "truncated: header says " + says + " (" + num(expected) + " bytes), file has " +
                   f.size_text(have) + " after the " + num(header) + "-byte header");
  if (have > expected)
    fail(path, "longer than its header says: header says " + says + " (" + num(expected) +
                   " bytes), file has " + f.size_text(have) + " after the " + num(header) +
                   "-byte header");
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path, std::string name,
                 int32_t num_classes) {
  if (num_classes < 1 || num_classes > 256)
    throw DataError(labels_path + ": num_classes must be in 1..256 for byte labels, got " +
                    std::to_string(num_classes));
  const FileBytes img = read_bytes(images_path);
  const std::vector<uint32_t> d = idx_header(images_path, img, 3, "images");
  const uint64_t count = d[0], rows = d[1], cols = d[2];
  if (rows == 0 || cols == 0)
    fail(images_path, "bad dimensions: header says images of " + num(rows) + "x" + num(cols) +
                          ", expected both at least 1");
  if (count == 0) fail(images_path, "empty: header says 0 images");
  // count, rows, cols < 2^32: rows*cols fits in 64 bits, count*rows*cols may not.
  const uint64_t plane = rows * cols;
  if (count > (uint64_t(1) << 62) / plane)
    fail(images_path, "bad dimensions: header says " + num(count) + " images of " + num(rows) +
                          "x" + num(cols) + ", more bytes than any file holds");
  check_payload(images_path, img, 16, count * plane,
                num(count) + " images of " + num(rows) + "x" + num(cols));

  const FileBytes lab = read_bytes(labels_path);
  const std::vector<uint32_t> ld = idx_header(labels_path, lab, 1, "labels");
  if (ld[0] == 0) fail(labels_path, "empty: header says 0 labels");
  check_payload(labels_path, lab, 8, ld[0], num(ld[0]) + " labels");
  if (ld[0] != count)
    throw DataError(images_path + " has " + num(count) + " images but " + labels_path + " has " +
                    num(ld[0]) + " labels; expected one label per image");

  Dataset ds;
  ds.name = std::move(name);
  ds.count = static_cast<int64_t>(count);
  ds.sample_shape = {1, static_cast<int64_t>(rows), static_cast<int64_t>(cols)};
  ds.num_classes = num_classes;
  ds.images.assign(img.data.begin() + 16, img.data.end());
  ds.labels.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t l = lab.data[8 + i];
    if (l >= num_classes)
      fail(labels_path, "label " + std::to_string(l) + " at index " + num(i) + " is outside [0, " +
                            std::to_string(num_classes) + ")");
    ds.labels[i] = l;
  }
  ChannelStats st = channel_stats(ds);
  ds.mean = std::move(st.mean);
  ds.std = std::move(st.std);
  return ds;
}

Dataset load_cifar10_files(const std::vector<std::string>& paths, std::string name) {
  constexpr size_t kPixels = 3 * 32 * 32, kRecord = 1 + kPixels;
  if (paths.empty()) throw DataError("CIFAR-10 " + name + ": no files given");
  Dataset ds;
  ds.name = std::move(name);
  ds.sample_shape = {3, 32, 32};
  ds.num_classes = 10;
  for (const std::string& path : paths) {
    const FileBytes f = read_bytes(path);
    if (f.data.empty())
      fail(path, "empty file, expected records of 3073 bytes (1 label byte + 3x32x32 pixels)");
    if (f.data.size() % kRecord != 0)
      fail(path, "truncated: " + f.size_text(f.data.size()) +
                     " is not a whole number of 3073-byte records (1 label byte + 3x32x32 "
                     "pixels): " +
                     num(f.data.size() / kRecord) + " records and " + num(f.data.size() % kRecord) +
                     " bytes of a partial one");
    const size_t records = f.data.size() / kRecord;
    ds.images.reserve(ds.images.size() + records * kPixels);
    ds.labels.reserve(ds.labels.size() + records);
    for (size_t r = 0; r < records; ++r) {
      const uint8_t* rec = f.data.data() + r * kRecord;
      if (rec[0] >= 10)
        fail(path, "record " + num(r) + " has label " + std::to_string(rec[0]) +
                       ", expected 0..9 (is this CIFAR-100?)");
      ds.labels.push_back(rec[0]);
      ds.images.insert(ds.images.end(), rec + 1, rec + kRecord);  // already (C, H, W)
    }
  }
  ds.count = static_cast<int64_t>(ds.labels.size());
  ChannelStats st = channel_stats(ds);
  ds.mean = std::move(st.mean);
  ds.std = std::move(st.std);
  return ds;
}

}  // namespace plexus::data
