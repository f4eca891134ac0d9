// One registered kernel of the CUDA plugin created for one node and run by itself, as the
// dispatcher would create it (create() sees descriptors only), on tensors in a chosen layout:
// NCHW contiguous or channels-last (NHWC in memory, the same logical shape), as the layout
// planner hands them. Outputs and the workspace start as NaN (0xFF bytes), so an element a kernel
// leaves unwritten, or scratch it reads before writing, fails the comparison. Shared by
// test_igemm_conv.cpp, test_cuda_pool_layout.cpp, test_direct_conv.cpp and test_direct_small.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plexus/attrs.hpp"
#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/plugin.hpp"
#include "cuda/compare.hpp"
#include "plexus/tensor.hpp"
#include "support/harness.hpp"

namespace plexus::test::layout_candidate {

// `t` (a CPU tensor, logical NCHW) on the GPU, NCHW contiguous or channels-last (NHWC in memory,
// the same logical shape).
inline Tensor on_gpu(Backend& gpu, const Tensor& t, bool channels_last) {
  if (!channels_last) return t.to(gpu);
  return t.permute({0, 2, 3, 1}).contiguous().to(gpu).permute({0, 3, 1, 2});
}

// A GPU buffer of logical shape `s` in the layout, every byte 0xFF (NaN in f16 and bf16).
inline Tensor poisoned(Backend& gpu, const Shape& s, plx_dtype d, bool channels_last) {
  const Shape mem = channels_last ? Shape{s[0], s[2], s[3], s[1]} : s;
  Tensor t = Tensor::empty(gpu, mem, d);
  if (t.nbytes() > 0) {
    const std::vector<uint8_t> ff(t.nbytes(), 0xFF);
    t.copy_from_host(ff.data());
  }
  return channels_last ? t.permute({0, 3, 1, 2}) : t;
}

// Creates kernel `k` for the node and, if it accepts, runs it `times` times, each time into
// outputs and a workspace poisoned again (so a kernel whose state goes wrong after its first
// call, a cross-block counter left set, say, leaves the last run's outputs unwritten). Returns
// the decline reason, or "" when it ran (the outputs then hold its last result). `workspace`, if
// given, receives the workspace the kernel asked for.
inline std::string run_candidate(Backend& gpu, const OpSchema& s, const plx_kernel* k,
                                 const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                                 const Attrs& attrs, int times = 1,
                                 uint64_t* workspace = nullptr) {
  const Attrs full = s.complete_attrs(attrs);
  const AttrPack pack(full);
  std::vector<plx_tensor> in_views, out_views;
  for (const Tensor& t : in) in_views.push_back(t.view());
  for (const Tensor& t : out) out_views.push_back(t.view());
  // create() sees descriptors only, as in resolve_kernel().
  std::vector<plx_tensor> in_desc = in_views, out_desc = out_views;
  for (plx_tensor& v : in_desc) v.data = nullptr;
  for (plx_tensor& v : out_desc) v.data = nullptr;
  plx_node_info node{};
  node.struct_size = sizeof node;
  node.device = 0;
  node.op = s.name.c_str();
  node.num_inputs = static_cast<int32_t>(in_desc.size());
  node.inputs = in_desc.data();
  node.num_outputs = static_cast<int32_t>(out_desc.size());
  node.outputs = out_desc.data();
  node.attrs = pack.data();
  node.num_attrs = pack.size();
  void* state = nullptr;
  uint64_t ws = 0;
  const plx_status st = k->create(gpu.kernel_ctx(k), k->user, &node, &state, &ws);
  if (st == PLX_ERR_UNSUPPORTED) {
    const std::string why = gpu.kernel_plugin(k).last_error();
    return why.empty() ? "declined without a reason" : why;
  }
  INFO("create failed: " << gpu.kernel_plugin(k).last_error());
  REQUIRE(st == PLX_OK);
  if (workspace) *workspace = ws;
  PreparedKernel pk(gpu, "op '" + s.name + "'", k, state, ws);
  Tensor wsbuf;
  if (ws > 0) wsbuf = Tensor::empty(gpu, {static_cast<int64_t>(ws)}, PLX_U8);
  for (int t = 0; t < times; ++t) {
    if (ws > 0) {
      const std::vector<uint8_t> ff(ws, 0xFF);
      wsbuf.copy_from_host(ff.data());
    }
    if (t > 0)
      for (Tensor o : out) {  // (a handle; the callers' repeated runs write NCHW outputs)
        REQUIRE(o.is_contiguous());
        const std::vector<uint8_t> ff(o.nbytes(), 0xFF);
        if (!ff.empty()) o.copy_from_host(ff.data());
      }
    pk.run(in_views.data(), static_cast<int32_t>(in_views.size()), out_views.data(),
           static_cast<int32_t>(out_views.size()), wsbuf.defined() ? wsbuf.data() : nullptr,
           gpu.stream(0));
    gpu.sync(0);
  }
  return "";
}

// Runs kernel `k` on the same inputs into a fresh NaN-poisoned NCHW output of `out_shape`, once
// and then three times with one kernel object (run_candidate's `times`); whether the outputs have
// the same bytes (a kernel flagged deterministic must, and its state must survive its calls).
inline bool same_bits_twice(Backend& gpu, const OpSchema& s, const plx_kernel* k,
                            const std::vector<Tensor>& in, const Shape& out_shape, plx_dtype d,
                            const Attrs& attrs) {
  std::vector<uint8_t> runs[2];
  int times = 1;
  for (std::vector<uint8_t>& bytes : runs) {
    Tensor out = poisoned(gpu, out_shape, d, false);
    REQUIRE(run_candidate(gpu, s, k, in, {out}, attrs, times).empty());
    times = 3;
    bytes.resize(out.nbytes());
    out.copy_to_host(bytes.data());
  }
  return runs[0] == runs[1];
}

// Runs kernel `k`, which must accept, into a NaN-poisoned output of `out_shape` in the layout
// `out_nhwc` says, and checks it against `want` (on the CPU) within the tolerance of `d` for sums
// of `terms` terms.
inline void check_candidate(Backend& gpu, const OpSchema& s, const plx_kernel* k, plx_dtype d,
                            const std::vector<Tensor>& in, const Shape& out_shape, bool out_nhwc,
                            const Attrs& attrs, const Tensor& want, int64_t terms) {
  REQUIRE(k != nullptr);
  Tensor out = poisoned(gpu, out_shape, d, out_nhwc);
  const std::string why = run_candidate(gpu, s, k, in, {out}, attrs);
  INFO("declined: " << why);
  REQUIRE(why.empty());
  const std::string diff =
      cmp::compare_tensors(out.contiguous().to(cpu()), want, cmp::tolerance_for(d, terms, false));
  INFO(diff);
  CHECK(diff.empty());
}

}  // namespace plexus::test::layout_candidate
