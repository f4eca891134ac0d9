// One Tensor Core GEMM candidate (plugins/cuda/ops/mma_gemm.cu, wgmma_gemm.cu) run by itself, as
// the autotuner creates it, against the CPU's result: shared by test_mma_gemm.cpp and
// test_wgmma_gemm.cpp. The output sits in a poisoned buffer with guard bytes, so an unwritten
// element or a stray write fails; a second run must give the same bytes (the kernels claim
// determinism).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "plexus/attrs.hpp"
#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"

namespace plexus::test::gemm_candidate {

inline constexpr uint8_t kPoison = 0xFF;  // NaN in every float dtype
inline constexpr uint64_t kGuard = 256;

struct GemmCase {
  std::string op;  // "matmul" or "linear"
  Shape a, b;      // matmul: a, b; linear: x, w
  int64_t ta = 0, tb = 0;
  double alpha = 1;
  bool bias = false;     // linear
  bool decline = false;  // every Tensor Core candidate must decline it
  bool simt_decline = false;  // the SIMT candidate too (batch dims that broadcast partially)
  // Offsets (in elements) of the first input and of the output inside their buffers: 1 makes
  // them misaligned (the first input then goes to the SIMT fallback).
  int64_t in_offset = 0, out_offset = 0;

  std::string what() const {
    std::string s = op + " " + shape_string(a) + " " + shape_string(b);
    if (ta) s += " trans_a";
    if (tb) s += " trans_b";
    if (alpha != 1) s += " alpha " + std::to_string(alpha);
    if (bias) s += " bias";
    if (in_offset) s += " input offset " + std::to_string(in_offset);
    if (out_offset) s += " output offset " + std::to_string(out_offset);
    return s;
  }
  int64_t k() const {
    if (op == "linear") return a.back();
    return ta ? a[a.size() - 2] : a.back();
  }
  Attrs attrs() const {
    if (op == "linear") return {};
    return {{"trans_a", ta}, {"trans_b", tb}, {"alpha", alpha}};
  }
};

// Appends a case to `v` and returns it (valid until the next append): linear x (.., K) · w
// (out, K)ᵀ [+ b], or matmul a · b with the transposes and alpha.
inline GemmCase* add_linear(std::vector<GemmCase>& v, Shape x, int64_t out, bool bias) {
  GemmCase c;
  c.op = "linear";
  c.b = {out, x.back()};
  c.a = std::move(x);
  c.bias = bias;
  v.push_back(c);
  return &v.back();
}
inline GemmCase* add_matmul(std::vector<GemmCase>& v, Shape a, Shape b, int64_t ta, int64_t tb,
                            double alpha = 1) {
  GemmCase c;
  c.op = "matmul";
  c.a = std::move(a);
  c.b = std::move(b);
  c.ta = ta, c.tb = tb, c.alpha = alpha;
  v.push_back(c);
  return &v.back();
}

inline std::vector<uint8_t> host_bytes(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  if (!b.empty()) t.copy_to_host(b.data());
  return b;
}

// `src` (CPU) copied onto `gpu` at `offset` elements into a larger buffer (which is kept alive
// by the returned view).
inline Tensor to_gpu_at(const Tensor& src, Backend& gpu, int64_t offset) {
  const uint64_t es = dtype_size(src.dtype());
  const uint64_t bytes = src.nbytes() + 16 + static_cast<uint64_t>(offset) * es;
  Tensor buf = Tensor::empty(gpu, {static_cast<int64_t>(bytes)}, PLX_U8, 0);
  Tensor view = buf.alias(src.dtype(), src.shape(), static_cast<uint64_t>(offset) * es);
  const std::vector<uint8_t> b = host_bytes(src);
  if (!b.empty()) view.copy_from_host(b.data());
  return view;
}

// A split-K candidate ("..._splitk"), and whether a reason it declined with is one split-K gives
// (ops/gemm_problem.hpp, plan_split_k): the tiles fill the device, or K has too few tiles.
inline bool is_split(const plx_kernel* k) {
  return std::string(k->impl).find("splitk") != std::string::npos;
}
inline bool is_split_decline(const std::string& reason) {
  return reason.find("without splitting K") != std::string::npos ||
         reason.find("nothing to split") != std::string::npos;
}

struct Outcome {
  bool declined = false;
  std::string reason;   // why it declined
  std::string failure;  // "" if it matched
};

// Creates candidate `k` for the case and, unless it declines, runs it twice against `want`
// (the CPU's result; undefined for a case that must be declined, which is never run).
// `tf32`: f32 runs with TF32 (the tolerance widens); `wants_workspace`: whether the candidate
// must ask for workspace (split-K) or must not.
inline Outcome run_candidate(Backend& gpu, const plx_kernel* k, const GemmCase& c,
                             const std::vector<Tensor>& cpu_in, const Tensor& want, bool tf32,
                             bool wants_workspace) {
  Outcome o;
  const OpSchema& s = gpu.runtime().ops().get(c.op);
  const Attrs full = s.complete_attrs(c.attrs());
  std::vector<TensorDesc> in_descs;
  for (const Tensor& t : cpu_in) in_descs.push_back(t.defined() ? t.desc() : TensorDesc{});
  const TensorDesc out_desc = s.infer_outputs(in_descs, full).at(0);
  std::vector<Tensor> in;
  for (size_t i = 0; i < cpu_in.size(); ++i)
    in.push_back(cpu_in[i].defined() ? to_gpu_at(cpu_in[i], gpu, i == 0 ? c.in_offset : 0)
                                     : Tensor());
  std::vector<plx_tensor> in_views;
  for (const Tensor& t : in) {
    plx_tensor v{};
    if (t.defined()) {
      v = t.view();
      v.data = nullptr;
    } else {
      v.dtype = PLX_DTYPE_NONE;
    }
    in_views.push_back(v);
  }
  std::vector<plx_tensor> out_views = {make_desc(out_desc, 0)};
  AttrPack pack(full);
  plx_node_info node{};
  node.struct_size = sizeof node;
  node.device = 0;
  node.op = s.name.c_str();
  node.num_inputs = static_cast<int32_t>(in_views.size());
  node.inputs = in_views.data();
  node.num_outputs = 1;
  node.outputs = out_views.data();
  node.attrs = pack.data();
  node.num_attrs = pack.size();
  void* state = nullptr;
  uint64_t ws_bytes = 0;
  const plx_status st = k->create(gpu.kernel_ctx(k), k->user, &node, &state, &ws_bytes);
  if (st == PLX_ERR_UNSUPPORTED) {
    o.declined = true;
    o.reason = gpu.kernel_plugin(k).last_error();
    return o;
  }
  if (st != PLX_OK) {
    o.failure = "create failed: " + gpu.kernel_plugin(k).last_error();
    return o;
  }
  const PreparedKernel prepared(gpu, "op '" + c.op + "'", k, state, ws_bytes);
  if (!want.defined()) {
    o.failure = "accepted a node it must decline";
    return o;
  }
  if ((ws_bytes != 0) != wants_workspace) {
    o.failure = "asks for " + std::to_string(ws_bytes) + " bytes of workspace";
    return o;
  }
  // Poisoned like the output, before each run: the split-K partials must all be written before
  // they are read, in every run (a tile counter left wrong by the first run would make the second
  // sum before the last split has written, which stale partials from the first would hide).
  Tensor ws;
  if (ws_bytes > 0) ws = Tensor::empty(gpu, {static_cast<int64_t>(ws_bytes)}, PLX_U8, 0);
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].defined()) in_views[i] = in[i].view();

  const uint64_t es = dtype_size(want.dtype());
  const uint64_t out_off = kGuard + static_cast<uint64_t>(c.out_offset) * es;
  const uint64_t n = want.nbytes();
  std::vector<uint8_t> first;
  for (int run = 0; run < 2; ++run) {
    const plx_stream stream = gpu.stream(0);
    Tensor buf = Tensor::empty(gpu, {static_cast<int64_t>(n + out_off + kGuard)}, PLX_U8, 0);
    gpu.memset(0, buf.data(), kPoison, n + out_off + kGuard, stream);
    if (ws.defined()) gpu.memset(0, ws.data(), kPoison, ws_bytes, stream);
    Tensor y = buf.alias(want.dtype(), want.shape(), out_off);
    out_views[0] = y.view();
    try {
      prepared.run(in_views.data(), static_cast<int32_t>(in_views.size()), out_views.data(), 1,
                   ws.defined() ? ws.data() : nullptr, stream);
      gpu.sync(0);
    } catch (const std::exception& e) {
      o.failure = std::string("run failed: ") + e.what();
      return o;
    }
    const std::vector<uint8_t> b = host_bytes(buf);
    for (uint64_t i = 0; i < out_off; ++i)
      if (b[i] != kPoison) {
        o.failure = "wrote before the output's start";
        return o;
      }
    for (uint64_t i = out_off + n; i < b.size(); ++i)
      if (b[i] != kPoison) {
        o.failure = "wrote past the output's end";
        return o;
      }
    if (run == 0) {
      cmp::Tolerance tol = cmp::tolerance_for(want.dtype(), std::max<int64_t>(c.k(), 1) + 1, tf32);
      o.failure = cmp::compare_tensors(y, want, tol);
      if (!o.failure.empty()) return o;
      first.assign(b.begin(), b.end());
    } else if (b != first) {
      o.failure = "a second run gave different bytes (the kernel claims determinism)";
    }
  }
  return o;
}

}  // namespace plexus::test::gemm_candidate
