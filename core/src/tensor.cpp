#include "plexus/tensor.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/error.hpp"

namespace plexus {

// Owns one block of the caching allocator; never copied, so the block is freed exactly once.
struct Tensor::Storage {
  Storage(Backend* b, int32_t d, CachingAllocator* a, MemoryBlock* m)
      : backend(b), device(d), alloc(a), block(m) {}
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() { alloc->free(block); }
  Backend* backend;
  int32_t device;
  CachingAllocator* alloc;
  MemoryBlock* block;
};

Shape contiguous_strides(const Shape& shape) {
  Shape s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return s;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(Backend& backend, Shape shape, plx_dtype dtype, int32_t device) {
  if (!dtype_is_valid(dtype)) throw OpError("Tensor::empty: invalid dtype " + std::to_string(dtype));
  if (shape.size() > PLX_MAX_DIMS)
    throw OpError("Tensor::empty: " + std::to_string(shape.size()) + " dimensions, at most " +
                  std::to_string(PLX_MAX_DIMS));
  for (int64_t d : shape)
    if (d < 0) throw OpError("Tensor::empty: negative dimension in " + shape_string(shape));
  Tensor t;
  const uint64_t bytes = static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype);
  CachingAllocator& alloc = backend.allocator(device);
  MemoryBlock* block = alloc.allocate(bytes, backend.stream(device));
  t.storage_ = std::make_shared<Storage>(&backend, device, &alloc, block);
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::zeros(Backend& backend, Shape shape, plx_dtype dtype, int32_t device) {
  Tensor t = empty(backend, std::move(shape), dtype, device);
  backend.memset(device, t.data(), 0, t.nbytes(), backend.stream(device));
  return t;
}

Tensor Tensor::from_host(Backend& backend, const void* src, Shape shape, plx_dtype dtype,
                         int32_t device) {
  Tensor t = empty(backend, std::move(shape), dtype, device);
  t.copy_from_host(src);
  return t;
}

Backend& Tensor::backend() const {
  if (!storage_) throw OpError("use of an undefined tensor");
  return *storage_->backend;
}

int32_t Tensor::device() const {
  if (!storage_) throw OpError("use of an undefined tensor");
  return storage_->device;
}

void* Tensor::data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->block->ptr) +
         offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to be out of place
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Tensor Tensor::reshape(Shape shape) const {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw OpError("reshape: more than one -1 in " + shape_string(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0 && known != 0) shape[static_cast<size_t>(infer)] = numel() / known;
  if (shape_numel(shape) != numel())
    throw OpError("reshape: cannot view " + shape_string(shape_) + " as " + shape_string(shape));
  if (!is_contiguous())
    throw OpError("reshape: tensor " + shape_string(shape_) +
                  " is not contiguous; call contiguous() first");
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::alias(plx_dtype dtype, Shape shape, uint64_t byte_offset) const {
  if (!storage_) throw OpError("alias of an undefined tensor");
  const uint64_t size = dtype_size(dtype);
  const uint64_t base = static_cast<uint64_t>(offset_) * dtype_size(dtype_) + byte_offset;
  const uint64_t need = static_cast<uint64_t>(shape_numel(shape)) * size;
  if (size == 0 || base % size != 0)
    throw OpError("alias: byte offset " + std::to_string(byte_offset) + " is not aligned for " +
                  dtype_name(dtype));
  if (base + need > storage_->block->requested)
    throw OpError("alias: " + std::string(dtype_name(dtype)) + shape_string(shape) + " at byte " +
                  std::to_string(base) + " runs past the " +
                  std::to_string(storage_->block->requested) + "-byte buffer");
  Tensor t;
  t.storage_ = storage_;
  t.offset_ = static_cast<int64_t>(base / size);
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::permute(const std::vector<int>& order) const {
  if (order.size() != shape_.size())
    throw OpError("permute: order has " + std::to_string(order.size()) + " entries, tensor has " +
                  std::to_string(shape_.size()) + " dimensions");
  std::vector<bool> seen(order.size());
  Tensor t = *this;
  for (size_t i = 0; i < order.size(); ++i) {
    const int o = order[i];
    if (o < 0 || o >= ndim() || seen[static_cast<size_t>(o)])
      throw OpError("permute: invalid order");
    seen[static_cast<size_t>(o)] = true;
    t.shape_[i] = shape_[static_cast<size_t>(o)];
    t.strides_[i] = strides_[static_cast<size_t>(o)];
  }
  return t;
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t length) const {
  if (dim < 0) dim += ndim();
  if (dim < 0 || dim >= ndim())
    throw OpError("narrow: dimension " + std::to_string(dim) + " of a " + std::to_string(ndim()) +
                  "-d tensor");
  const int64_t size = shape_[static_cast<size_t>(dim)];
  if (start < 0 || length < 0 || start + length > size)
    throw OpError("narrow: entries [" + std::to_string(start) + ", " +
                  std::to_string(start + length) + ") of dimension " + std::to_string(dim) +
                  " of size " + std::to_string(size));
  Tensor t = *this;
  t.offset_ += start * strides_[static_cast<size_t>(dim)];
  t.shape_[static_cast<size_t>(dim)] = length;
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return call(backend(), "copy", {*this}).at(0);
}

Tensor Tensor::to(Backend& dst, int32_t dst_device) const {
  if (!storage_) return Tensor();
  if (&dst == storage_->backend && dst_device == storage_->device) return *this;
  // Staged through host memory: backends cannot address each other's memory.
  const Tensor src = contiguous();
  std::vector<unsigned char> host(src.nbytes());
  src.copy_to_host(host.data());
  return from_host(dst, host.data(), shape_, dtype_, dst_device);
}

void Tensor::copy_to_host(void* dst) const {
  if (!storage_) throw OpError("copy_to_host of an undefined tensor");
  Backend& b = *storage_->backend;
  const plx_stream s = b.stream(storage_->device);
  if (is_contiguous()) {
    b.copy(storage_->device, dst, data(), nbytes(), PLX_COPY_D2H, s);
    b.sync_stream(s);
    return;
  }
  // A view (permuted, narrowed, channels-last): the memory it spans, gathered in row-major order
  // on the host, so that any backend can be read (no strided copy kernel needed).
  const int64_t n = numel();
  if (n == 0) return;
  int64_t span = 1;
  for (int i = 0; i < ndim(); ++i) {
    if (strides_[static_cast<size_t>(i)] < 0)
      throw OpError("copy_to_host: negative strides are not supported");
    span += (shape_[static_cast<size_t>(i)] - 1) * strides_[static_cast<size_t>(i)];
  }
  const size_t es = dtype_size(dtype_);
  std::vector<unsigned char> raw(static_cast<size_t>(span) * es);
  b.copy(storage_->device, raw.data(), data(), raw.size(), PLX_COPY_D2H, s);
  b.sync_stream(s);
  auto* out = static_cast<unsigned char*>(dst);
  std::vector<int64_t> idx(shape_.size(), 0);
  int64_t off = 0;
  for (int64_t k = 0; k < n; ++k) {
    std::memcpy(out + static_cast<size_t>(k) * es, raw.data() + static_cast<size_t>(off) * es, es);
    for (int d = ndim() - 1; d >= 0; --d) {  // the next index, last dimension fastest
      const size_t u = static_cast<size_t>(d);
      off += strides_[u];
      if (++idx[u] < shape_[u]) break;
      off -= strides_[u] * shape_[u];
      idx[u] = 0;
    }
  }
}

void Tensor::copy_from_host(const void* src) {
  if (!storage_) throw OpError("copy_from_host into an undefined tensor");
  if (!is_contiguous()) throw OpError("copy_from_host into a non-contiguous tensor");
  Backend& b = *storage_->backend;
  const plx_stream s = b.stream(storage_->device);
  b.copy(storage_->device, data(), src, nbytes(), PLX_COPY_H2D, s);
  b.sync_stream(s);
}

std::vector<double> Tensor::to_doubles() const {
  std::vector<unsigned char> raw(nbytes());
  copy_to_host(raw.data());
  const size_t n = static_cast<size_t>(numel());
  std::vector<double> out(n);
  const bool known = visit_dtype(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = reinterpret_cast<const T*>(raw.data());
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(convert<acc_t<T>>(p[i]));
  });
  if (!known) throw OpError("to_doubles: invalid dtype");
  return out;
}

plx_tensor Tensor::view() const {
  plx_tensor v{};
  if (!storage_) {
    v.dtype = PLX_DTYPE_NONE;
    return v;
  }
  v.data = data();
  v.dtype = dtype_;
  v.ndim = ndim();
  for (size_t i = 0; i < shape_.size(); ++i) {
    v.shape[i] = shape_[i];
    v.strides[i] = strides_[i];
  }
  v.device = storage_->device;
  v.mem_kind = PLX_MEM_DEVICE;
  return v;
}

std::string Tensor::str() const {
  if (!storage_) return "undefined";
  return storage_->backend->name() + ":" + std::to_string(storage_->device) + " " +
         desc_string(desc());
}

plx_tensor make_desc(const TensorDesc& d, int32_t device) {
  plx_tensor v{};
  v.dtype = d.dtype;
  if (!d.present()) return v;
  v.ndim = d.ndim();
  const Shape st = contiguous_strides(d.shape);
  for (size_t i = 0; i < d.shape.size() && i < PLX_MAX_DIMS; ++i) {
    v.shape[i] = d.shape[i];
    v.strides[i] = st[i];
  }
  v.device = device;
  v.mem_kind = PLX_MEM_DEVICE;
  return v;
}

}  // namespace plexus
