// Kernels as C++ classes. An author derives from Kernel, reads attributes and shapes in the
// constructor (throwing Unsupported to decline a node), and implements compute(). The registry
// turns each class into a plx_kernel table.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "plexus/abi/ops.h"
#include "plexus/sdk/status.hpp"
#include "plexus/sdk/tensor.hpp"

namespace plexus::sdk {

class Backend;

// The arguments of one compute() call.
struct KernelCall {
  const plx_tensor* inputs;
  int32_t num_inputs;
  const plx_tensor* outputs;
  int32_t num_outputs;
  void* workspace;           // workspace_bytes() bytes, NULL if 0
  uint64_t workspace_bytes;
  plx_stream stream;

  const plx_tensor& in(int32_t i) const { return inputs[i]; }
  const plx_tensor& out(int32_t i) const { return outputs[i]; }
  bool has_in(int32_t i) const { return i < num_inputs && present(inputs[i]); }
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Bytes of scratch memory each compute() needs; fixed at creation.
  virtual uint64_t workspace_bytes() const { return 0; }
  virtual void compute(const KernelCall& call) = 0;
};

// Collects a backend's kernels as plx_kernel tables. Order of add() is the order of preference
// within an (op, dtype): add the fastest implementation first and the reference last.
class KernelRegistry {
 public:
  explicit KernelRegistry(Backend* backend = nullptr) : backend_(backend) {}
  KernelRegistry(const KernelRegistry&) = delete;
  KernelRegistry& operator=(const KernelRegistry&) = delete;

  // Registers K for (op, dtype). K is constructible from (const NodeInfo&) or, when B is given,
  // from (const NodeInfo&, B&) where B is the registering backend's class.
  template <class K, class B = void>
  void add(const char* op, plx_dtype dtype, const char* impl, uint32_t flags = 0,
           plx_layout layout = PLX_LAYOUT_ANY) {
    static_assert(std::is_base_of_v<Kernel, K>, "K must derive from plexus::sdk::Kernel");
    Entry& e = entries_.emplace_back();
    e.op = op;
    e.impl = impl;
    e.table.struct_size = sizeof(plx_kernel);
    e.table.flags = flags;
    e.table.op = e.op.c_str();
    e.table.impl = e.impl.c_str();
    e.table.dtype = dtype;
    e.table.layout = layout;
    e.table.user = nullptr;
    e.table.create = &create<K, B>;
    e.table.compute = &compute;
    e.table.destroy = &destroy;
  }

  int32_t size() const { return static_cast<int32_t>(entries_.size()); }
  // The tables registered for (op, dtype), in order of preference.
  std::vector<const plx_kernel*> find(std::string_view op, int32_t dtype) const {
    std::vector<const plx_kernel*> out;
    for (const Entry& e : entries_)
      if (e.table.dtype == dtype && e.op == op) out.push_back(&e.table);
    return out;
  }
  const plx_kernel* get(int32_t i) const {
    return i >= 0 && i < size() ? &entries_[static_cast<size_t>(i)].table : nullptr;
  }
  // Sets the layout the kernel registered for (op, dtype, impl) prefers; false where there is
  // none. For a backend whose options change a dtype's preference, before the host reads the
  // tables (a kernel that says PLX_LAYOUT_NHWC must take what abi/ops.h says it does).
  bool set_layout(std::string_view op, int32_t dtype, std::string_view impl, plx_layout layout) {
    bool found = false;
    for (Entry& e : entries_)
      if (e.table.dtype == dtype && e.op == op && e.impl == impl) {
        e.table.layout = layout;
        found = true;
      }
    return found;
  }

 private:
  struct Entry {
    std::string op, impl;
    plx_kernel table{};
  };

  template <class K, class B>
  static plx_status create(void* backend_ctx, void*, const plx_node_info* node, void** state,
                           uint64_t* workspace_bytes) {
    return detail::guard([&] {
      const NodeInfo info(node);
      Kernel* k;
      if constexpr (std::is_void_v<B>) {
        k = new K(info);
      } else {
        k = new K(info, *static_cast<B*>(static_cast<Backend*>(backend_ctx)));
      }
      *state = k;
      *workspace_bytes = k->workspace_bytes();
    });
  }
  static plx_status compute(void* state, const plx_tensor* in, int32_t n_in,
                            const plx_tensor* out, int32_t n_out, void* ws, uint64_t ws_bytes,
                            plx_stream stream) {
    return detail::guard([&] {
      static_cast<Kernel*>(state)->compute(KernelCall{in, n_in, out, n_out, ws, ws_bytes, stream});
    });
  }
  static void destroy(void* state) { delete static_cast<Kernel*>(state); }

  Backend* backend_;
  std::deque<Entry> entries_;  // deque: tables keep their addresses as entries are added
};

}  // namespace plexus::sdk
