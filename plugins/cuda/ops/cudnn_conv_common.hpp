// What the two cuDNN convolution kernels share: ops/conv.cpp (the legacy API, impl "cudnn") and
// ops/conv_graph.cpp (the graph API, impl "cudnn_graph"). The node's convolution as the CPU
// plugin checks it, its layouts, and the scratch memory and stream an algorithm search runs on.
#pragma once

#include <algorithm>
#include <array>

#include "common.hpp"
#include "ops/conv_algo_cache.hpp"

namespace plexus::cuda::dnn {

enum class Dir { Fwd, BwdData, BwdFilter };

inline const char* op_name(Dir d) {
  switch (d) {
    case Dir::Fwd:
      return "conv2d";
    case Dir::BwdData:
      return "conv2d_backward_data";
    case Dir::BwdFilter:
      return "conv2d_backward_weight";
  }
  return "conv2d";
}

inline cudnnDataType_t dnn_type(plx_dtype d) {
  switch (d) {
    case PLX_F32:
      return CUDNN_DATA_FLOAT;
    case PLX_F16:
      return CUDNN_DATA_HALF;
    case PLX_BF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      break;
  }
  throw sdk::Unsupported(
      sdk::format("cuDNN kernels take f32, f16 or bf16, not %s", plexus::dtype_name(d)));
}

inline const char* layout_name(bool nhwc) {
  return nhwc ? "nhwc" : "nchw";
}

// Device memory owned for the length of an algorithm search.
struct ScratchBuffer {
  void* p = nullptr;
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() {
    if (p) cudaFree(p);
  }
  // False (with the runtime's error cleared) when the memory is not there.
  bool allocate(size_t bytes) {
    if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) == cudaSuccess) return true;
    (void)cudaGetLastError();
    p = nullptr;
    return false;
  }
};
struct ScratchStream {
  cudaStream_t s = nullptr;
  ScratchStream() { PLX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ScratchStream(const ScratchStream&) = delete;
  ScratchStream& operator=(const ScratchStream&) = delete;
  ~ScratchStream() { cudaStreamDestroy(s); }
};
// Binds a cuDNN handle to a scratch stream for a scope and back to the default stream after,
// however the scope ends: the handle must not keep a stream that is about to be destroyed (every
// call sets its own stream anyway).
struct HandleOnStream {
  cudnnHandle_t h;
  HandleOnStream(cudnnHandle_t handle, cudaStream_t s) : h(handle) {
    PLX_CUDNN_CHECK(cudnnSetStream(h, s));
  }
  HandleOnStream(const HandleOnStream&) = delete;
  HandleOnStream& operator=(const HandleOnStream&) = delete;
  ~HandleOnStream() { cudnnSetStream(h, nullptr); }
};

// The forward convolution's x and w shapes of a node of direction `d`: the backward ops take the
// one they do not have from an attribute, as the CPU plugin does.
struct ConvShapes {
  std::array<int64_t, 4> x{}, w{};
};

// A conv node's convolution, checked as the CPU plugin checks it, and the layout each tensor is
// described in: channels-last where a tensor is only that, NCHW otherwise; a tensor that is both
// (a size-1 dimension makes the two coincide) follows the others. Any other strides are declined.
struct ConvProblem {
  // The tensors by role: x (N, C, H, W), w (O, C/groups, KH, KW), y (N, O, OH, OW).
  const plx_tensor* x = nullptr;
  const plx_tensor* w = nullptr;
  const plx_tensor* y = nullptr;
  ConvShapes shapes;
  sdk::Conv2dParams g;
  plx_dtype dtype = PLX_F32;
  size_t elem = 4;
  bool has_bias = false;  // forward only
  bool x_nhwc = false, w_nhwc = false, y_nhwc = false;
  int64_t out_elems = 0, N = 0, O = 0, OHW = 0;
  int64_t x_elems = 0, w_elems = 0, y_elems = 0;
  bool trivial = false;  // an empty sum: y = bias or 0

  ConvProblem(const NodeInfo& node, Dir d) : ConvProblem(node, d, roles(node, d)) {}

 private:
  struct Roles {
    const plx_tensor *x, *w, *y;
    ConvShapes shapes;
  };
  static Roles roles(const NodeInfo& node, Dir d) {
    const char* op = op_name(d);
    Roles r{};
    if (d == Dir::Fwd)
      r.x = &node.input(0), r.w = &node.input(1), r.y = &node.output(0);
    else if (d == Dir::BwdData)
      r.y = &node.input(0), r.w = &node.input(1), r.x = &node.output(0);
    else
      r.y = &node.input(0), r.x = &node.input(1), r.w = &node.output(0);
    PLX_REQUIRE(r.x->ndim == 4 && r.w->ndim == 4 && r.y->ndim == 4,
                "%s: x, w and y must be 4-D", op);
    for (size_t i = 0; i < 4; ++i) r.shapes.x[i] = r.x->shape[i], r.shapes.w[i] = r.w->shape[i];
    if (d != Dir::Fwd) {
      const char* attr = d == Dir::BwdData ? "input_shape" : "weight_shape";
      const std::vector<int64_t> v = node.attr_ints(attr);
      PLX_REQUIRE(v.size() == 4, "%s: %s must have 4 values", op, attr);
      std::array<int64_t, 4>& dst = d == Dir::BwdData ? r.shapes.x : r.shapes.w;
      for (size_t i = 0; i < 4; ++i) dst[i] = v[i];
    }
    return r;
  }

  ConvProblem(const NodeInfo& node, Dir d, const Roles& r)
      : x(r.x), w(r.w), y(r.y), shapes(r.shapes), g(r.shapes.x.data(), r.shapes.w.data(), node) {
    const char* op = op_name(d);
    const int64_t want_y[4] = {g.N, g.O, g.OH, g.OW};
    for (int i = 0; i < 4; ++i) {
      PLX_REQUIRE(y->shape[i] == want_y[i],
                  "%s: dy/y has shape %s, the convolution gives (%lld, %lld, %lld, %lld)", op,
                  sdk::shape_string(*y).c_str(), static_cast<long long>(g.N),
                  static_cast<long long>(g.O), static_cast<long long>(g.OH),
                  static_cast<long long>(g.OW));
      PLX_REQUIRE(x->shape[i] == shapes.x[static_cast<size_t>(i)] &&
                      w->shape[i] == shapes.w[static_cast<size_t>(i)],
                  "%s: tensor shapes differ from the shape attributes", op);
    }
    dtype = static_cast<plx_dtype>(y->dtype);
    elem = plexus::dtype_size(dtype);
    const plx_tensor& out = d == Dir::Fwd ? *y : (d == Dir::BwdData ? *x : *w);
    out_elems = numel(out);
    N = g.N, O = g.O, OHW = g.OH * g.OW;

    const plx_tensor* all[3] = {x, w, y};
    bool prefer_nhwc = false;
    for (const plx_tensor* t : all)
      prefer_nhwc = prefer_nhwc || (!sdk::is_contiguous(*t) && sdk::is_channels_last(*t));
    bool nhwc[3];
    for (int i = 0; i < 3; ++i) {
      const bool nchw_ok = sdk::is_contiguous(*all[i]), nhwc_ok = sdk::is_channels_last(*all[i]);
      PLX_DECLINE_UNLESS(nchw_ok || nhwc_ok,
                         "%s: a tensor's strides are neither NCHW contiguous nor channels-last",
                         op);
      nhwc[i] = prefer_nhwc ? nhwc_ok : !nchw_ok;
    }
    x_nhwc = nhwc[0], w_nhwc = nhwc[1], y_nhwc = nhwc[2];
    if (d == Dir::Fwd) {
      has_bias = node.has_input(2);
      if (has_bias) {
        const plx_tensor& b = node.input(2);
        PLX_DECLINE_UNLESS(b.ndim == 1 && (b.shape[0] <= 1 || b.strides[0] == 1),
                           "%s: the bias must be contiguous", op);
      }
    }
    x_elems = numel(*x), w_elems = numel(*w), y_elems = numel(*y);
    trivial = out_elems == 0 || x_elems == 0 || w_elems == 0 || y_elems == 0;
  }
};

// The header of the algorithm cache file for this device and these libraries.
inline std::string cache_header(const DeviceContext& ctx) {
  int runtime = 0;
  PLX_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  return conv_cache::header_line(ctx.prop.name, ctx.prop.major, ctx.prop.minor,
                                 static_cast<uint64_t>(cudnnGetVersion()), runtime);
}

// The algorithm cache's key for this problem: `op` names the API and direction, `math` what the
// search was allowed (the legacy API's cudnnMathType_t; the graph API's own code).
inline conv_cache::KeyParts cache_key(const ConvProblem& p, const char* op, int32_t math) {
  const sdk::Conv2dParams& g = p.g;
  conv_cache::KeyParts k;
  k.op = op;
  k.dtype = plexus::dtype_name(p.dtype);
  k.x = {g.N, g.C, g.H, g.W};
  k.w = {g.O, g.C / g.groups, g.KH, g.KW};
  k.y = {g.N, g.O, g.OH, g.OW};
  k.x_layout = layout_name(p.x_nhwc);
  k.w_layout = layout_name(p.w_nhwc);
  k.y_layout = layout_name(p.y_nhwc);
  k.stride = {g.sh, g.sw}, k.padding = {g.ph, g.pw}, k.dilation = {g.dh, g.dw};
  k.groups = g.groups;
  k.math = math;
  return k;
}

}  // namespace plexus::cuda::dnn
