// Tensors owned by the core: memory from a backend's caching allocator, a dtype, a shape and
// strides (in elements). Copies are cheap (shared storage); views share memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plexus/abi/types.h"
#include "plexus/attrs.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus {

class Backend;
struct MemoryBlock;

// Row-major contiguous strides of `shape`.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;  // undefined: stands for an absent optional input

  // Uninitialised memory on `backend`'s device `device`.
  static Tensor empty(Backend& backend, Shape shape, plx_dtype dtype, int32_t device = 0);
  static Tensor zeros(Backend& backend, Shape shape, plx_dtype dtype, int32_t device = 0);
  // Copies `bytes` of host data in (synchronous).
  static Tensor from_host(Backend& backend, const void* src, Shape shape, plx_dtype dtype,
                          int32_t device = 0);
  template <class T>
  static Tensor from_vector(Backend& backend, const std::vector<T>& v, Shape shape,
                            int32_t device = 0) {
    return from_host(backend, v.data(), std::move(shape), dtype_of_v<T>, device);
  }

  bool defined() const { return storage_ != nullptr; }
  plx_dtype dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i)); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  uint64_t nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype_); }
  TensorDesc desc() const { return TensorDesc{dtype_, shape_}; }
  Backend& backend() const;
  int32_t device() const;
  void* data() const;  // first element
  bool is_contiguous() const;

  // A view with another shape of the same element count; requires contiguity.
  Tensor reshape(Shape shape) const;
  // A view of dims permuted (no copy; generally non-contiguous).
  Tensor permute(const std::vector<int>& order) const;
  // A view of `length` entries of dimension `dim` from `start` (no copy). Narrowing dimension 0
  // of a contiguous tensor stays contiguous: that is how a batch is cut from a dataset.
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  // A contiguous copy, or this tensor if already contiguous.
  Tensor contiguous() const;
  // A contiguous view of this tensor's memory seen as `dtype` and `shape`, starting
  // `byte_offset` bytes after its first element (how the executor cuts activations from its
  // arena). Throws OpError if it does not fit or the offset is not aligned for `dtype`.
  Tensor alias(plx_dtype dtype, Shape shape, uint64_t byte_offset) const;
  // A copy on another backend/device (through host memory when backends differ).
  Tensor to(Backend& backend, int32_t device = 0) const;

  // Host transfer; both synchronise the stream.
  void copy_to_host(void* dst) const;  // nbytes() bytes, row-major
  void copy_from_host(const void* src);  // requires contiguity
  template <class T>
  std::vector<T> to_vector() const {
    std::vector<T> v(static_cast<size_t>(numel()));
    copy_to_host(v.data());
    return v;
  }
  // Element values as double (any dtype), for tests and reports.
  std::vector<double> to_doubles() const;

  // The ABI view.
  plx_tensor view() const;

  std::string str() const;  // "cpu:0 f32(2, 3)"

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // elements
  plx_dtype dtype_ = PLX_DTYPE_NONE;
  Shape shape_, strides_;
};

// An ABI descriptor (data NULL) for a desc with contiguous strides.
plx_tensor make_desc(const TensorDesc& d, int32_t device);

}  // namespace plexus
