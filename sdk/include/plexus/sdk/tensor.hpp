// Helpers over plx_tensor views and plx_node_info for kernel authors.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "plexus/abi/ops.h"
#include "plexus/sdk/dtype.hpp"
#include "plexus/sdk/status.hpp"

namespace plexus::sdk {

inline int64_t numel(const plx_tensor& t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

inline bool present(const plx_tensor& t) { return t.dtype != PLX_DTYPE_NONE; }

inline bool is_contiguous(const plx_tensor& t) {
  if (numel(t) == 0) return true;  // no element to be out of place
  int64_t expected = 1;
  for (int32_t i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

// Whether t's elements fill numel(t) consecutive places in some order of its dimensions, with
// no gaps or overlaps: row-major, channels-last, any permutation (size-1 dimensions are free).
inline bool is_dense(const plx_tensor& t) {
  if (numel(t) == 0) return true;
  int32_t dims[PLX_MAX_DIMS];
  int32_t n = 0;
  for (int32_t i = 0; i < t.ndim; ++i)
    if (t.shape[i] != 1) dims[n++] = i;
  for (int32_t i = 1; i < n; ++i)  // by stride, smallest first (insertion sort: n <= 8)
    for (int32_t j = i; j > 0 && t.strides[dims[j]] < t.strides[dims[j - 1]]; --j) {
      const int32_t x = dims[j];
      dims[j] = dims[j - 1];
      dims[j - 1] = x;
    }
  int64_t expected = 1;
  for (int32_t i = 0; i < n; ++i) {
    if (t.strides[dims[i]] != expected) return false;
    expected *= t.shape[dims[i]];
  }
  return true;
}

// Whether t is 4-D (N, C, H, W) stored channels-last: strides (H*W*C, 1, W*C, C), size-1
// dimensions free. A tensor with one channel or one pixel is both this and contiguous.
inline bool is_channels_last(const plx_tensor& t) {
  if (t.ndim != 4) return false;
  if (numel(t) == 0) return true;
  const int64_t C = t.shape[1], H = t.shape[2], W = t.shape[3];
  const int64_t want[4] = {H * W * C, 1, W * C, C};
  for (int32_t i = 0; i < 4; ++i)
    if (t.shape[i] != 1 && t.strides[i] != want[i]) return false;
  return true;
}

// Same strides where a dimension has more than one entry (where the other dims do not matter).
inline bool same_layout(const plx_tensor& a, const plx_tensor& b) {
  if (a.ndim != b.ndim) return false;
  if (is_contiguous(a) && is_contiguous(b)) return true;
  for (int32_t i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i] || (a.shape[i] != 1 && a.strides[i] != b.strides[i])) return false;
  return true;
}

// For a kernel that takes a 4-D tensor in either layout (PLX_LAYOUT_NHWC): whether t is stored
// channels-last and not also NCHW contiguous (one channel or one pixel counts as NCHW); declines
// (Unsupported: "<op>: <what> must be NCHW contiguous or channels-last") any other strides.
inline bool nhwc_or_decline(const plx_tensor& t, const char* op, const char* what) {
  PLX_DECLINE_UNLESS(is_contiguous(t) || is_channels_last(t),
                     "%s: %s must be NCHW contiguous or channels-last", op, what);
  return !is_contiguous(t);
}

// What a PLX_KERNEL_DENSE kernel that works in memory order needs (abi/ops.h): every input and
// output of output 0's shape is dense and laid out as output 0; others contiguous.
inline bool dense_alike(const plx_node_info& node) {
  if (node.num_outputs < 1) return true;
  const plx_tensor& y = node.outputs[0];
  auto same_shape = [&](const plx_tensor& t) {
    if (t.ndim != y.ndim) return false;
    for (int32_t i = 0; i < t.ndim; ++i)
      if (t.shape[i] != y.shape[i]) return false;
    return true;
  };
  auto fits = [&](const plx_tensor& t) {
    if (!present(t)) return true;
    if (same_shape(t)) return is_dense(t) && same_layout(t, y);
    return is_contiguous(t);
  };
  if (!is_dense(y)) return false;
  for (int32_t i = 0; i < node.num_inputs; ++i)
    if (!fits(node.inputs[i])) return false;
  for (int32_t i = 1; i < node.num_outputs; ++i)
    if (!fits(node.outputs[i])) return false;
  return true;
}

// Whether kernel `k` may be handed `node`'s tensors under the layout contract (abi/ops.h): every
// tensor NCHW contiguous, or k reads strides (PLX_LAYOUT_NHWC, which declines at create() what
// it cannot run), or k is PLX_KERNEL_DENSE and the tensors are laid out alike (dense_alike), or
// k is PLX_KERNEL_STRIDED and only inputs are not contiguous. What the host checks before it
// hands a kernel tensors; a fused kernel that runs the backend's own kernels on tensors of its
// choosing (NodeKernel) checks the same.
inline bool takes_layouts(const plx_kernel& k, const plx_node_info& node) {
  bool inputs = true, outputs = true;
  for (int32_t i = 0; i < node.num_inputs; ++i)
    inputs = inputs && (!present(node.inputs[i]) || is_contiguous(node.inputs[i]));
  for (int32_t i = 0; i < node.num_outputs; ++i)
    outputs = outputs && is_contiguous(node.outputs[i]);
  if (inputs && outputs) return true;
  if (k.layout == PLX_LAYOUT_NHWC) return true;
  if ((k.flags & PLX_KERNEL_DENSE) != 0 && dense_alike(node)) return true;
  return (k.flags & PLX_KERNEL_STRIDED) != 0 && outputs;
}

// Typed pointer to the first element; checks the dtype.
template <class T>
T* data(const plx_tensor& t) {
  PLX_REQUIRE(t.dtype == dtype_of_v<T>, "tensor has dtype %s, kernel expected %s",
              dtype_name(t.dtype), dtype_name(dtype_of_v<T>));
  return static_cast<T*>(t.data);
}

// "(2, 3, 4)"
inline std::string shape_string(const plx_tensor& t) {
  std::string s = "(";
  for (int32_t i = 0; i < t.ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape[i]);
  }
  return s + ")";
}

// Read access to a node's attributes, by name, with types checked. Used when a kernel is
// created, never per step.
class NodeInfo {
 public:
  explicit NodeInfo(const plx_node_info* node) : n_(node) {}

  const char* op() const { return n_->op; }
  int32_t device() const { return n_->device; }
  int32_t num_inputs() const { return n_->num_inputs; }
  int32_t num_outputs() const { return n_->num_outputs; }
  const plx_tensor& input(int32_t i) const {
    PLX_REQUIRE(i >= 0 && i < n_->num_inputs, "%s: input %d of %d", n_->op, i, n_->num_inputs);
    return n_->inputs[i];
  }
  const plx_tensor& output(int32_t i) const {
    PLX_REQUIRE(i >= 0 && i < n_->num_outputs, "%s: output %d of %d", n_->op, i,
                n_->num_outputs);
    return n_->outputs[i];
  }
  bool has_input(int32_t i) const { return i < n_->num_inputs && present(n_->inputs[i]); }

  const plx_attr* find_attr(std::string_view name) const {
    for (int32_t i = 0; i < n_->num_attrs; ++i)
      if (name == n_->attrs[i].name) return &n_->attrs[i];
    return nullptr;
  }
  int64_t attr_int(std::string_view name) const { return get(name, PLX_ATTR_INT).i; }
  // An attribute newer than some hosts (a host of an older ABI minor never sends it): `fallback`,
  // its default, where the node has none.
  int64_t attr_int_or(std::string_view name, int64_t fallback) const {
    return find_attr(name) ? attr_int(name) : fallback;
  }
  double attr_float(std::string_view name) const { return get(name, PLX_ATTR_FLOAT).f; }
  std::string attr_string(std::string_view name) const { return get(name, PLX_ATTR_STRING).s; }
  std::vector<int64_t> attr_ints(std::string_view name) const {
    const plx_attr& a = get(name, PLX_ATTR_INTS);
    return std::vector<int64_t>(a.ints, a.ints + a.count);
  }
  std::vector<double> attr_floats(std::string_view name) const {
    const plx_attr& a = get(name, PLX_ATTR_FLOATS);
    return std::vector<double>(a.floats, a.floats + a.count);
  }
  const plx_node_info* raw() const { return n_; }

 private:
  const plx_attr& get(std::string_view name, int32_t type) const {
    const plx_attr* a = find_attr(name);
    PLX_REQUIRE(a != nullptr, "%s: no attribute '%.*s'", n_->op, static_cast<int>(name.size()),
                name.data());
    PLX_REQUIRE(a->type == type, "%s: attribute '%.*s' has type %d, expected %d", n_->op,
                static_cast<int>(name.size()), name.data(), a->type, type);
    return *a;
  }
  const plx_node_info* n_;
};

}  // namespace plexus::sdk
