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
