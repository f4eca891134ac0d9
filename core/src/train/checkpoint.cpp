// Checkpoint files; the format is described in plexus/checkpoint.hpp.
#include "plexus/checkpoint.hpp"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>

#include "atomic_file.hpp"
#include "plexus/error.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus {

// Tensor data is stored as the caller's bytes; the format says little-endian, so a big-endian
// host would need a byte swap per element here.
static_assert(std::endian::native == std::endian::little,
              "checkpoint data is little-endian; add byte swapping for this host");

namespace {

constexpr char kMagic[8] = {'P', 'L', 'X', 'C', 'K', 'P', 'T', '\0'};
constexpr size_t kHeaderSize = 32;  // magic, version, n_meta, n_tensors, file_size, header_crc
constexpr size_t kTrailerSize = 4;

uint32_t crc_update(uint32_t crc, const void* data, size_t n) {
  // zlib's crc32 takes a uInt length: feed it in pieces so sizes over 4 GiB work.
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    crc = static_cast<uint32_t>(::crc32(crc, p, static_cast<uInt>(chunk)));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

template <class T>
void put_le(std::string& out, T v) {
  using U = std::make_unsigned_t<T>;
  const U u = static_cast<U>(v);
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

template <class T>
T get_le(const unsigned char* p) {
  using U = std::make_unsigned_t<T>;
  U u = 0;
  for (size_t i = 0; i < sizeof(T); ++i) u |= static_cast<U>(static_cast<U>(p[i]) << (8 * i));
  return static_cast<T>(u);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// numel x dtype size, or nullopt-like -1 on overflow or a negative dim.
int64_t expected_bytes(plx_dtype dtype, const std::vector<int64_t>& shape) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 &&
        n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(d))
      return -1;
    n *= static_cast<uint64_t>(d);
  }
  return static_cast<int64_t>(n);
}

// The fixed-size fields of a tensor record, up to and including nbytes.
std::string record_head(const CheckpointTensor& t) {
  std::string h;
  put_le<uint32_t>(h, static_cast<uint32_t>(t.name.size()));
  h += t.name;
  put_le<int32_t>(h, static_cast<int32_t>(t.dtype));
  put_le<uint32_t>(h, static_cast<uint32_t>(t.shape.size()));
  for (int64_t d : t.shape) put_le<int64_t>(h, d);
  put_le<uint64_t>(h, static_cast<uint64_t>(t.data.size()));
  return h;
}

void validate(const std::string& path, const Checkpoint& ckpt) {
  const auto bad = [&](const std::string& what) {
    throw Error("cannot write checkpoint '" + path + "': " + what);
  };
  if (ckpt.meta.size() > std::numeric_limits<uint32_t>::max()) bad("too many metadata entries");
  if (ckpt.tensors.size() > std::numeric_limits<uint32_t>::max()) bad("too many tensors");
  for (const auto& [key, value] : ckpt.meta)
    if (key.size() > std::numeric_limits<uint32_t>::max()) bad("metadata key too long");
  std::set<std::string_view> names;
  for (size_t i = 0; i < ckpt.tensors.size(); ++i) {
    const CheckpointTensor& t = ckpt.tensors[i];
    if (t.name.empty()) bad("tensor #" + std::to_string(i) + " has an empty name");
    if (t.name.size() > std::numeric_limits<uint32_t>::max()) bad("tensor name too long");
    if (!names.insert(t.name).second) bad("two tensors are called '" + t.name + "'");
    if (!dtype_is_valid(t.dtype))
      bad("tensor '" + t.name + "' has invalid dtype code " + std::to_string(t.dtype));
    if (t.shape.size() > PLX_MAX_DIMS)
      bad("tensor '" + t.name + "' has " + std::to_string(t.shape.size()) +
          " dimensions (at most " + std::to_string(PLX_MAX_DIMS) + ")");
    const int64_t want = expected_bytes(t.dtype, t.shape);
    if (want < 0) bad("tensor '" + t.name + "' has an invalid shape " + shape_str(t.shape));
    if (static_cast<uint64_t>(want) != t.data.size())
      bad("tensor '" + t.name + "' has " + std::to_string(t.data.size()) +
          " bytes of data; its shape " + shape_str(t.shape) + " of " + dtype_name(t.dtype) +
          " needs " + std::to_string(want));
  }
}

// Writes through an AtomicFile, keeping the whole-file CRC.
struct Sink {
  detail::AtomicFile& file;
  uint32_t file_crc = 0;
  void put(const void* p, size_t n) {
    file_crc = crc_update(file_crc, p, n);
    file.write(p, n);
  }
  void put(const std::string& s) { put(s.data(), s.size()); }
  void put_crc(uint32_t crc) {
    std::string b;
    put_le<uint32_t>(b, crc);
    put(b);
  }
};

// Reads a checkpoint file sequentially with bounds checked against the file size.
class Source {
 public:
  Source(const std::string& path) : path_(path) {
    f_.reset(std::fopen(path.c_str(), "rb"));
    if (!f_) fail_errno("cannot open checkpoint");
    struct stat st {};
    if (::fstat(::fileno(f_.get()), &st) != 0) fail_errno("cannot stat checkpoint");
    if (!S_ISREG(st.st_mode)) fail("not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
  }

  uint64_t size() const { return size_; }
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  // Bytes left before the trailer's file CRC.
  uint64_t body_left() const { return remaining() > kTrailerSize ? remaining() - kTrailerSize : 0; }
  uint32_t file_crc() const { return file_crc_; }

  // Reads exactly n bytes (the caller has checked they exist).
  void read(void* dst, size_t n) {
    if (n == 0) return;
    if (std::fread(dst, 1, n, f_.get()) != n) {
      if (std::ferror(f_.get())) fail_errno("read error");
      fail("truncated: file ended at byte " + std::to_string(pos_) +
           " while reading (it changed while being read?)");
    }
    pos_ += n;
    file_crc_ = crc_update(file_crc_, dst, n);
  }

  [[noreturn]] void fail(const std::string& what) const { throw Error(path_ + ": " + what); }
  [[noreturn]] void fail_errno(const std::string& what) const {
    const int err = errno;
    fail(what + ": " + std::strerror(err));
  }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, Closer> f_;
  uint64_t size_ = 0, pos_ = 0;
  uint32_t file_crc_ = 0;
};

// Reads `n` bytes of a section into `out`, updating its CRC; `what` says what the bytes are when
// they would run past the end of the file (only a corrupt length field does that: the header's
// file size has already been checked against the real one).
void read_section(Source& src, std::string& out, uint64_t n, uint32_t& crc,
                  const std::string& what) {
  if (n > src.body_left())
    src.fail("corrupt " + what + ": length " + std::to_string(n) +
             " runs past the end of the file");
  const size_t old = out.size();
  out.resize(old + static_cast<size_t>(n));
  src.read(out.data() + old, static_cast<size_t>(n));
  crc = crc_update(crc, out.data() + old, static_cast<size_t>(n));
}

uint32_t read_crc(Source& src, const std::string& what) {
  if (src.body_left() < 4) src.fail("corrupt " + what + ": runs past the end of the file");
  unsigned char b[4];
  src.read(b, 4);
  return get_le<uint32_t>(b);
}

template <class T>
T read_field(Source& src, std::string& section, uint32_t& crc, const std::string& what) {
  const size_t old = section.size();
  read_section(src, section, sizeof(T), crc, what);
  return get_le<T>(reinterpret_cast<const unsigned char*>(section.data() + old));
}

}  // namespace

const CheckpointTensor* Checkpoint::find(std::string_view name) const {
  for (const CheckpointTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void write_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  validate(path, ckpt);  // before the disk is touched: a bad tensor must not cost the old file

  // The size goes in the header so a reader can tell a cut file from a damaged one.
  uint64_t file_size = kHeaderSize + 4 /*meta_crc*/ + kTrailerSize;
  for (const auto& [key, value] : ckpt.meta) file_size += 4 + key.size() + 8 + value.size();
  for (const CheckpointTensor& t : ckpt.tensors)
    file_size += 4 + t.name.size() + 4 + 4 + 8 * t.shape.size() + 8 + 4 + t.data.size() + 4;

  std::string header(kMagic, sizeof(kMagic));
  put_le<uint32_t>(header, kCheckpointVersion);
  put_le<uint32_t>(header, static_cast<uint32_t>(ckpt.meta.size()));
  put_le<uint32_t>(header, static_cast<uint32_t>(ckpt.tensors.size()));
  put_le<uint64_t>(header, file_size);

  detail::AtomicFile file(path, "checkpoint");
  Sink sink{file};
  sink.put(header);
  sink.put_crc(crc_update(0, header.data(), header.size()));

  std::string meta;
  for (const auto& [key, value] : ckpt.meta) {
    put_le<uint32_t>(meta, static_cast<uint32_t>(key.size()));
    meta += key;
    put_le<uint64_t>(meta, value.size());
    meta += value;
  }
  sink.put(meta);
  sink.put_crc(crc_update(0, meta.data(), meta.size()));

  for (const CheckpointTensor& t : ckpt.tensors) {
    const std::string head = record_head(t);
    sink.put(head);
    sink.put_crc(crc_update(0, head.data(), head.size()));
    sink.put(t.data.data(), t.data.size());
    sink.put_crc(crc_update(0, t.data.data(), t.data.size()));
  }
  sink.put_crc(sink.file_crc);
  file.commit();
}

Checkpoint read_checkpoint(const std::string& path) {
  Source src(path);

  // Header. The magic comes first so that any other file is called what it is, not "truncated".
  unsigned char h[kHeaderSize];
  const size_t have = static_cast<size_t>(std::min<uint64_t>(src.size(), kHeaderSize));
  src.read(h, have);
  if (std::memcmp(h, kMagic, std::min(have, sizeof(kMagic))) != 0)
    src.fail("not a Plexus checkpoint (bad magic)");
  if (have < kHeaderSize)
    src.fail("truncated: " + std::to_string(src.size()) + " bytes, less than the " +
             std::to_string(kHeaderSize) + "-byte header");
  const uint32_t version = get_le<uint32_t>(h + 8);
  if (version != kCheckpointVersion)
    src.fail("unsupported checkpoint format version " + std::to_string(version) +
             " (this build reads version " + std::to_string(kCheckpointVersion) + ")");
  if (crc_update(0, h, kHeaderSize - 4) != get_le<uint32_t>(h + 28))
    src.fail("checksum mismatch in the header");
  const uint32_t n_meta = get_le<uint32_t>(h + 12);
  const uint32_t n_tensors = get_le<uint32_t>(h + 16);
  const uint64_t file_size = get_le<uint64_t>(h + 20);
  if (src.size() < file_size)
    src.fail("truncated: " + std::to_string(src.size()) + " bytes, the header says " +
             std::to_string(file_size) + " (the write did not complete or the file was cut)");
  if (src.size() > file_size)
    src.fail(std::to_string(src.size()) + " bytes, the header says " + std::to_string(file_size) +
             " (trailing data)");
  if (file_size < kHeaderSize + 4 + kTrailerSize) src.fail("corrupt header: file size too small");

  Checkpoint ckpt;
  std::string section;
  uint32_t crc = 0;
  for (uint32_t i = 0; i < n_meta; ++i) {
    const std::string what = "metadata entry #" + std::to_string(i);
    section.clear();
    const uint32_t klen = read_field<uint32_t>(src, section, crc, what);
    section.clear();
    read_section(src, section, klen, crc, what);
    std::string key = section;
    if (ckpt.meta.count(key)) src.fail("corrupt metadata: key '" + key + "' appears twice");
    section.clear();
    const uint64_t vlen = read_field<uint64_t>(src, section, crc, what);
    section.clear();
    read_section(src, section, vlen, crc, what);
    ckpt.meta.emplace(std::move(key), section);
  }
  if (read_crc(src, "metadata") != crc) src.fail("checksum mismatch in the metadata");

  for (uint32_t i = 0; i < n_tensors; ++i) {
    const std::string what = "record header of tensor #" + std::to_string(i);
    CheckpointTensor t;
    section.clear();
    crc = 0;
    const uint32_t name_len = read_field<uint32_t>(src, section, crc, what);
    read_section(src, section, name_len, crc, what);
    t.name = section.substr(4);
    const int32_t dtype = read_field<int32_t>(src, section, crc, what);
    const uint32_t ndim = read_field<uint32_t>(src, section, crc, what);
    if (ndim > PLX_MAX_DIMS)
      src.fail("corrupt " + what + ": " + std::to_string(ndim) + " dimensions (at most " +
               std::to_string(PLX_MAX_DIMS) + ")");
    for (uint32_t d = 0; d < ndim; ++d)
      t.shape.push_back(read_field<int64_t>(src, section, crc, what));
    const uint64_t nbytes = read_field<uint64_t>(src, section, crc, what);
    if (read_crc(src, what) != crc)
      src.fail("checksum mismatch in the " + what + " (name read as '" + t.name + "')");
    // The header is intact, so what follows is what the writer meant; check it anyway, a file
    // may come from another writer.
    if (!dtype_is_valid(dtype))
      src.fail("tensor '" + t.name + "' has invalid dtype code " + std::to_string(dtype));
    t.dtype = static_cast<plx_dtype>(dtype);
    const int64_t want = expected_bytes(t.dtype, t.shape);
    if (want < 0) src.fail("tensor '" + t.name + "' has an invalid shape " + shape_str(t.shape));
    if (static_cast<uint64_t>(want) != nbytes)
      src.fail("tensor '" + t.name + "' stores " + std::to_string(nbytes) + " bytes; its shape " +
               shape_str(t.shape) + " of " + dtype_name(t.dtype) + " needs " +
               std::to_string(want));
    if (nbytes > src.body_left())
      src.fail("corrupt tensor '" + t.name + "': " + std::to_string(nbytes) +
               " bytes of data run past the end of the file");
    if (ckpt.find(t.name)) src.fail("two tensors are called '" + t.name + "'");
    t.data.resize(static_cast<size_t>(nbytes));
    src.read(t.data.data(), t.data.size());
    if (read_crc(src, "tensor '" + t.name + "'") != crc_update(0, t.data.data(), t.data.size()))
      src.fail("checksum mismatch in tensor '" + t.name + "'");
    ckpt.tensors.push_back(std::move(t));
  }

  if (src.remaining() != kTrailerSize)
    src.fail("corrupt: " + std::to_string(src.remaining() - kTrailerSize) +
             " unexpected bytes after the last tensor");
  const uint32_t want_crc = src.file_crc();
  unsigned char trailer[kTrailerSize];
  src.read(trailer, kTrailerSize);
  if (get_le<uint32_t>(trailer) != want_crc) src.fail("checksum mismatch over the whole file");
  return ckpt;
}

}  // namespace plexus
