// The CUDA emulator's cuDNN (include/cudnn.h): the documented semantics of the legacy convolution
// API the plugin calls, so ops/conv.cpp (and its algorithm cache) runs as written. It models the
// API, not cuDNN's kernels: descriptors are checked as cuDNN checks them (sizes, formats, types,
// the output shape the convolution gives, groups), each direction has a few algorithms that
// differ in workspace and determinism (the non-deterministic ones sum in another order, so their
// bits differ from the others') while the rest are refused, and the convolution is computed on
// the host in f32 with one rounding to the output type, summing channels and taps in the order
// the activation's layout gives (channels innermost in NHWC), so that NHWC and NCHW results
// differ in their last bits as cuDNN's kernels for the two layouts do; f32 data with any math type but
// CUDNN_FMA_MATH has its inputs rounded to TF32, as cuDNN may on Tensor Cores.
//
// cudnnConvolutionBiasActivationForward follows the cuDNN 7.5 developer guide's contract (the
// newest text found; the v9 header keeps the function and its formula, y = act(alpha1 * conv(x)
// + alpha2 * z + bias)): RELU or IDENTITY only, the latter only with IMPLICIT_PRECOMP_GEMM;
// CUDNN_NOT_PROPAGATE_NAN only; zDesc equal to yDesc; a (1, K, 1, 1) bias with unit channel stride
// in the type the data-type table gives (FLOAT for FLOAT, HALF for HALF; the table has no
// bfloat16 row, so bfloat16 is refused). z is read only when alpha2 is not 0 (the guide is silent;
// the plugin passes alpha2 = 0 and z = y). A NaN before the ReLU becomes 0, as the name
// NOT_PROPAGATE_NAN says and the CPU plugin's relu does; the hardware's choice is owed to the GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cudnn.h"
#include "plx_emu_numeric.hpp"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};
// Strides in elements of the logical (d0, d1, d2, d3) = (n, c, h, w) or (k, c, h, w).
struct Dims4 {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  int d[4] = {0, 0, 0, 0};
  int64_t s[4] = {0, 0, 0, 0};
};
struct cudnnTensorStruct : Dims4 {};
struct cudnnFilterStruct : Dims4 {};
struct cudnnActivationStruct {
  bool set = false;
  cudnnActivationMode_t mode = CUDNN_ACTIVATION_RELU;
  cudnnNanPropagation_t nan = CUDNN_NOT_PROPAGATE_NAN;
  double coef = 0.0;
};
struct cudnnConvolutionStruct {
  bool set = false;
  int ph = 0, pw = 0, u = 1, v = 1, dh = 1, dw = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  int groups = 1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace {

thread_local std::string g_last_error;

// The reason is kept for cudnnGetLastErrorString (the plugin puts it in its error); a refused
// algorithm, which callers probe for, is not printed.
cudnnStatus_t fail(cudnnStatus_t s, const std::string& why) {
  g_last_error = why;
  if (s != CUDNN_STATUS_NOT_SUPPORTED) std::fprintf(stderr, "cuda emulator: cuDNN: %s\n", why.c_str());
  return s;
}

size_t type_size(cudnnDataType_t t) {
  return t == CUDNN_DATA_FLOAT ? 4 : (t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16) ? 2 : 0;
}
plx_emu::Elem elem(cudnnDataType_t t) {
  return t == CUDNN_DATA_FLOAT ? plx_emu::Elem::kF32
         : t == CUDNN_DATA_HALF ? plx_emu::Elem::kF16
                                : plx_emu::Elem::kBF16;
}

cudnnStatus_t set4(Dims4* d, cudnnTensorFormat_t format, cudnnDataType_t type, int a, int b, int c,
                   int e, const char* what) {
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, std::string(what) + ": null descriptor");
  if (type_size(type) == 0)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(what) + ": data type " + std::to_string(type));
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(what) + ": format " + std::to_string(format));
  if (a <= 0 || b <= 0 || c <= 0 || e <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(what) + ": a size is not positive (" +
                                            std::to_string(a) + ", " + std::to_string(b) + ", " +
                                            std::to_string(c) + ", " + std::to_string(e) + ")");
  d->set = true, d->type = type, d->format = format;
  d->d[0] = a, d->d[1] = b, d->d[2] = c, d->d[3] = e;
  const int64_t C = b, H = c, W = e;
  if (format == CUDNN_TENSOR_NCHW) {
    d->s[0] = C * H * W, d->s[1] = H * W, d->s[2] = W, d->s[3] = 1;
  } else {  // NHWC: channels innermost
    d->s[0] = H * W * C, d->s[1] = 1, d->s[2] = W * C, d->s[3] = C;
  }
  return CUDNN_STATUS_SUCCESS;
}

enum class Dir { Fwd, BwdData, BwdFilter };

// One convolution as the descriptors give it, checked.
struct Geometry {
  Dims4 x, w, y;
  cudnnConvolutionStruct conv;
  bool tf32 = false;
};

int out_size(int in, int pad, int k, int dil, int stride) {
  return 1 + (in + 2 * pad - ((k - 1) * dil + 1)) / stride;
}

cudnnStatus_t geometry(const Dims4* x, const Dims4* w, const cudnnConvolutionStruct* conv,
                       const Dims4* y, Geometry& g) {
  if (!x || !w || !conv || !y || !x->set || !w->set || !conv->set || !y->set)
    return fail(CUDNN_STATUS_BAD_PARAM, "a descriptor is null or was never set");
  if (x->type != w->type || x->type != y->type)
    return fail(CUDNN_STATUS_BAD_PARAM, "x, w and y have different data types");
  if (x->d[1] != w->d[1] * conv->groups)
    return fail(CUDNN_STATUS_BAD_PARAM,
                "x has " + std::to_string(x->d[1]) + " channels, the filter " +
                    std::to_string(w->d[1]) + " per group x " + std::to_string(conv->groups) +
                    " groups");
  if (w->d[0] % conv->groups != 0)
    return fail(CUDNN_STATUS_BAD_PARAM, "the filter count is not a multiple of the groups");
  const int oh = out_size(x->d[2], conv->ph, w->d[2], conv->dh, conv->u);
  const int ow = out_size(x->d[3], conv->pw, w->d[3], conv->dw, conv->v);
  if (y->d[0] != x->d[0] || y->d[1] != w->d[0] || y->d[2] != oh || y->d[3] != ow)
    return fail(CUDNN_STATUS_BAD_PARAM,
                "y is (" + std::to_string(y->d[0]) + ", " + std::to_string(y->d[1]) + ", " +
                    std::to_string(y->d[2]) + ", " + std::to_string(y->d[3]) +
                    "), the convolution gives (" + std::to_string(x->d[0]) + ", " +
                    std::to_string(w->d[0]) + ", " + std::to_string(oh) + ", " +
                    std::to_string(ow) + ")");
  g.x = *x, g.w = *w, g.y = *y, g.conv = *conv;
  g.tf32 = x->type == CUDNN_DATA_FLOAT && conv->math != CUDNN_FMA_MATH;
  return CUDNN_STATUS_SUCCESS;
}

// The emulated algorithms of a direction: workspace in bytes, or -1 where refused.
int64_t workspace_of(Dir dir, int algo, const Geometry& g) {
  const int64_t taps = static_cast<int64_t>(g.w.d[1]) * g.w.d[2] * g.w.d[3];
  switch (dir) {
    case Dir::Fwd:
      if (algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM) return 0;
      if (algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) return 8 * taps;
      if (algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM)  // an im2col buffer
        return taps * g.y.d[2] * g.y.d[3] * static_cast<int64_t>(type_size(g.x.type));
      return -1;
    case Dir::BwdData:
      if (algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0) return 0;
      if (algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1) return 8 * taps;
      return -1;
    case Dir::BwdFilter:
      if (algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3)
        return 0;
      if (algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1) return 4 * taps * g.w.d[0];
      return -1;
  }
  return -1;
}
bool deterministic(Dir dir, int algo) {
  if (dir == Dir::BwdData) return algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  if (dir == Dir::BwdFilter)
    return algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 && algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
  return true;
}
int algo_count(Dir dir) {
  if (dir == Dir::Fwd) return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  if (dir == Dir::BwdData) return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
}

// The fused call's epilogue (forward only): out = act(alpha * result + alpha2 * z + bias[k]).
struct Epilogue {
  bool on = false;
  bool relu = false;
  float alpha2 = 0.0f;
  const void* z = nullptr;
  const void* bias = nullptr;
};

// The convolution itself: out = alpha * result + beta * out (out not read when beta = 0), or the
// fused call's epilogue. `reverse`: the sums run in the other order (the non-deterministic
// algorithms).
void convolve(Dir dir, const Geometry& g, float alpha, float beta, const void* xp, const void* wp,
              const void* yp, void* out, bool reverse, const Epilogue& ep = {}) {
  const plx_emu::Elem t = elem(g.x.type);
  const int N = g.x.d[0], C = g.x.d[1], H = g.x.d[2], W = g.x.d[3];
  const int K = g.w.d[0], Cg = g.w.d[1], R = g.w.d[2], S = g.w.d[3];
  const int OH = g.y.d[2], OW = g.y.d[3], G = g.conv.groups, Kg = K / G;
  const bool flip = g.conv.mode == CUDNN_CONVOLUTION;
  auto xi = [&](int n, int c, int h, int w) {
    return n * g.x.s[0] + c * g.x.s[1] + h * g.x.s[2] + w * g.x.s[3];
  };
  auto wi = [&](int k, int c, int r, int s) {
    if (flip) r = R - 1 - r, s = S - 1 - s;
    return k * g.w.s[0] + c * g.w.s[1] + r * g.w.s[2] + s * g.w.s[3];
  };
  auto yi = [&](int n, int k, int h, int w) {
    return n * g.y.s[0] + k * g.y.s[1] + h * g.y.s[2] + w * g.y.s[3];
  };
  auto in = [&](const void* p, int64_t i) {
    const float v = plx_emu::load_elem(p, i, t);
    return g.tf32 ? plx_emu::tf32_round(v) : v;
  };
  auto finish = [&](int64_t i, float s, int k = 0) {
    float v = alpha * s;
    if (ep.on) {
      if (ep.alpha2 != 0.0f) v += ep.alpha2 * plx_emu::load_elem(ep.z, i, t);
      v += plx_emu::load_elem(ep.bias, k, t);
      if (ep.relu) v = v > 0.0f ? v : 0.0f;  // NaN gives 0
    } else if (beta != 0.0f) {
      v += beta * plx_emu::load_elem(out, i, t);
    }
    plx_emu::store_elem(out, i, t, v);
  };
  // The terms of one output: summed as they come, or kept and summed last first (reversed).
  float acc = 0.0f;
  std::vector<float> terms;
  auto add = [&](float v) {
    if (reverse) terms.push_back(v);
    else acc += v;
  };
  auto sum = [&]() {
    float s = acc;
    for (size_t i = terms.size(); i-- > 0;) s += terms[i];
    acc = 0.0f;
    terms.clear();
    return s;
  };
  // The order of a forward or backward-data sum over (channel, tap) follows the layout of the
  // activation it reads, as an implicit GEMM's K does: channels innermost in NHWC (tap by tap,
  // each tap's channels in turn), taps innermost in NCHW. So the same convolution on NHWC and on
  // NCHW tensors rounds differently in its last bits (in 16 bits, a unit in the last place here
  // and there), as cuDNN's kernels for the two layouts do.
  const bool channels_inner = (dir == Dir::Fwd ? g.x : g.y).format == CUDNN_TENSOR_NHWC;
  auto taps = [&](int channels, auto&& term) {
    if (channels_inner) {
      for (int r = 0; r < R; ++r)
        for (int s = 0; s < S; ++s)
          for (int c = 0; c < channels; ++c) term(c, r, s);
    } else {
      for (int c = 0; c < channels; ++c)
        for (int r = 0; r < R; ++r)
          for (int s = 0; s < S; ++s) term(c, r, s);
    }
  };
  if (dir == Dir::Fwd) {
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        for (int oh = 0; oh < OH; ++oh)
          for (int ow = 0; ow < OW; ++ow) {
            const int c0 = (k / Kg) * Cg;
            taps(Cg, [&](int c, int r, int s) {
              const int ih = oh * g.conv.u - g.conv.ph + r * g.conv.dh;
              const int iw = ow * g.conv.v - g.conv.pw + s * g.conv.dw;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) return;
              add(in(xp, xi(n, c0 + c, ih, iw)) * in(wp, wi(k, c, r, s)));
            });
            finish(yi(n, k, oh, ow), sum(), k);
          }
  } else if (dir == Dir::BwdData) {
    for (int n = 0; n < N; ++n)
      for (int ci = 0; ci < C; ++ci)
        for (int ih = 0; ih < H; ++ih)
          for (int iw = 0; iw < W; ++iw) {
            const int grp = ci / Cg, c = ci % Cg;
            taps(Kg, [&](int kk, int r, int s) {
              const int k = grp * Kg + kk;
              const int th = ih + g.conv.ph - r * g.conv.dh;
              const int tw = iw + g.conv.pw - s * g.conv.dw;
              if (th < 0 || th % g.conv.u != 0 || th / g.conv.u >= OH) return;
              if (tw < 0 || tw % g.conv.v != 0 || tw / g.conv.v >= OW) return;
              add(in(yp, yi(n, k, th / g.conv.u, tw / g.conv.v)) * in(wp, wi(k, c, r, s)));
            });
            finish(xi(n, ci, ih, iw), sum());
          }
  } else {
    for (int k = 0; k < K; ++k)
      for (int c = 0; c < Cg; ++c)
        for (int r = 0; r < R; ++r)
          for (int s = 0; s < S; ++s) {
            const int ci = (k / Kg) * Cg + c;
            for (int n = 0; n < N; ++n)
              for (int oh = 0; oh < OH; ++oh) {
                const int ih = oh * g.conv.u - g.conv.ph + r * g.conv.dh;
                if (ih < 0 || ih >= H) continue;
                for (int ow = 0; ow < OW; ++ow) {
                  const int iw = ow * g.conv.v - g.conv.pw + s * g.conv.dw;
                  if (iw < 0 || iw >= W) continue;
                  add(in(yp, yi(n, k, oh, ow)) * in(xp, xi(n, ci, ih, iw)));
                }
              }
            finish(wi(k, c, r, s), sum());
          }
  }
}

const char* dir_name(Dir d) {
  return d == Dir::Fwd ? "cudnnConvolutionForward"
         : d == Dir::BwdData ? "cudnnConvolutionBackwardData"
                             : "cudnnConvolutionBackwardFilter";
}

// Runs (or records) one convolution with `algo` on the handle's stream.
cudnnStatus_t run(cudnnHandle_t h, Dir dir, const Geometry& g, int algo, void* ws, size_t ws_bytes,
                  const void* alpha, const void* beta, const void* x, const void* w, const void* y,
                  void* out, const Epilogue& ep = {}) {
  if (!h) return fail(CUDNN_STATUS_NOT_INITIALIZED, "a null handle");
  const int64_t need = algo >= 0 && algo < algo_count(dir) ? workspace_of(dir, algo, g) : -1;
  if (need < 0)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(dir_name(dir)) + ": algorithm " +
                                                std::to_string(algo) + " is not supported here");
  if (need > 0 && (!ws || ws_bytes < static_cast<size_t>(need)))
    return fail(CUDNN_STATUS_BAD_PARAM,
                std::string(dir_name(dir)) + ": algorithm " + std::to_string(algo) + " needs " +
                    std::to_string(need) + " bytes of workspace, " +
                    std::to_string(ws ? ws_bytes : 0) + " given");
  if (!alpha || !beta || !x || !w || !y || !out)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(dir_name(dir)) + ": a null pointer");
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const bool rev = !deterministic(dir, algo);
  ::plx_emu::submit_library_call(
      h->stream,
      [=] {
        if (need > 0) std::memset(ws, 0xA5, static_cast<size_t>(need));
        convolve(dir, g, a, b, x, w, y, out, rev, ep);
      },
      ep.on ? "cudnnConvolutionBiasActivationForward" : dir_name(dir));
  return CUDNN_STATUS_SUCCESS;
}

// The heuristic's list: every algorithm, the supported ones first (with the workspace-free one
// after the others, as cuDNN tends to rank the faster ones with workspace first).
template <class Perf>
cudnnStatus_t heuristic(Dir dir, const Geometry& g, int requested, int* returned, Perf* perf) {
  if (!returned || !perf || requested < 1) return fail(CUDNN_STATUS_BAD_PARAM, "bad result array");
  std::vector<int> order;
  for (int a = 0; a < algo_count(dir); ++a)
    if (workspace_of(dir, a, g) > 0) order.push_back(a);
  for (int a = 0; a < algo_count(dir); ++a)
    if (workspace_of(dir, a, g) == 0) order.push_back(a);
  for (int a = 0; a < algo_count(dir); ++a)
    if (workspace_of(dir, a, g) < 0) order.push_back(a);
  *returned = std::min<int>(requested, static_cast<int>(order.size()));
  for (int i = 0; i < *returned; ++i) {
    const int a = order[static_cast<size_t>(i)];
    const int64_t ws = workspace_of(dir, a, g);
    Perf& p = perf[i];
    std::memset(&p, 0, sizeof p);
    p.algo = static_cast<decltype(p.algo)>(a);
    p.status = ws < 0 ? CUDNN_STATUS_NOT_SUPPORTED : CUDNN_STATUS_SUCCESS;
    p.time = -1.0f;
    p.memory = ws < 0 ? 0 : static_cast<size_t>(ws);
    p.determinism = deterministic(dir, a) ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    p.mathType = g.conv.math;
  }
  return CUDNN_STATUS_SUCCESS;
}

// Find*Ex: runs every supported algorithm whose workspace fits on the given buffers (overwriting
// the output, as cuDNN does) and returns them fastest first, the others after.
template <class Perf>
cudnnStatus_t find(cudnnHandle_t h, Dir dir, const Geometry& g, const void* x, const void* w,
                   const void* y, void* out, int requested, int* returned, Perf* perf, void* ws,
                   size_t ws_bytes) {
  if (!h) return fail(CUDNN_STATUS_NOT_INITIALIZED, "a null handle");
  if (!returned || !perf || requested < 1) return fail(CUDNN_STATUS_BAD_PARAM, "bad result array");
  std::vector<Perf> all;
  const float one = 1.0f, zero = 0.0f;
  for (int a = 0; a < algo_count(dir); ++a) {
    Perf p;
    std::memset(&p, 0, sizeof p);
    p.algo = static_cast<decltype(p.algo)>(a);
    p.determinism = deterministic(dir, a) ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    p.mathType = g.conv.math;
    p.time = -1.0f;
    const int64_t need = workspace_of(dir, a, g);
    if (need < 0) {
      p.status = CUDNN_STATUS_NOT_SUPPORTED;
    } else if (need > 0 && (!ws || ws_bytes < static_cast<size_t>(need))) {
      p.status = CUDNN_STATUS_ALLOC_FAILED;
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      const cudnnStatus_t s = run(h, dir, g, a, ws, ws_bytes, &one, &zero, x, w, y, out);
      if (s != CUDNN_STATUS_SUCCESS) return s;
      if (cudaStreamSynchronize(h->stream) != cudaSuccess)
        return fail(CUDNN_STATUS_BAD_PARAM, "Find*Ex on a stream that cannot be synchronised");
      p.status = CUDNN_STATUS_SUCCESS;
      p.memory = static_cast<size_t>(need);
      p.time = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    all.push_back(p);
  }
  std::stable_sort(all.begin(), all.end(), [](const Perf& a, const Perf& b) {
    if ((a.status == CUDNN_STATUS_SUCCESS) != (b.status == CUDNN_STATUS_SUCCESS))
      return a.status == CUDNN_STATUS_SUCCESS;
    return a.status == CUDNN_STATUS_SUCCESS && a.time < b.time;
  });
  *returned = std::min<int>(requested, static_cast<int>(all.size()));
  for (int i = 0; i < *returned; ++i) perf[i] = all[static_cast<size_t>(i)];
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

size_t cudnnGetVersion() { return 90000; }
const char* cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_ALLOC_FAILED:
      return "CUDNN_STATUS_ALLOC_FAILED";
  }
  return "CUDNN_STATUS_?";
}
void cudnnGetLastErrorString(char* buf, size_t n) {
  if (!buf || n == 0) return;
  std::snprintf(buf, n, "%s", g_last_error.c_str());
  g_last_error.clear();
}
namespace {
// The handle and the descriptors: created empty, set by their own calls.
template <class T>
cudnnStatus_t new_object(T** p) {
  if (!p) return CUDNN_STATUS_BAD_PARAM;
  *p = new T();
  return CUDNN_STATUS_SUCCESS;
}
template <class T>
cudnnStatus_t delete_object(T* p) {
  delete p;
  return CUDNN_STATUS_SUCCESS;
}
}  // namespace

cudnnStatus_t cudnnCreate(cudnnHandle_t* h) {
  return new_object(h);
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  return delete_object(h);
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) {
  return new_object(d);
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
  return delete_object(d);
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  return set4(d, format, type, n, c, h, w, "cudnnSetTensor4dDescriptor");
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) {
  return new_object(d);
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
  return delete_object(d);
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  // The filter's NHWC is (k, h, w, c) in memory: the same strides as a tensor's.
  return set4(d, format, type, k, c, h, w, "cudnnSetFilter4dDescriptor");
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) {
  return new_object(d);
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
  return delete_object(d);
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dilation_h, int dilation_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolution2dDescriptor: null descriptor");
  if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM,
                "cudnnSetConvolution2dDescriptor: negative padding or a stride or dilation below 1");
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolution2dDescriptor: mode");
  if (compute != CUDNN_DATA_FLOAT)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                "cudnnSetConvolution2dDescriptor: the emulator computes in CUDNN_DATA_FLOAT");
  d->set = true;
  d->ph = pad_h, d->pw = pad_w, d->u = u, d->v = v, d->dh = dilation_h, d->dw = dilation_w;
  d->mode = mode, d->compute = compute;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* d) {
  return new_object(d);
}
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t d) {
  return delete_object(d);
}
cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t d,
                                           cudnnActivationMode_t mode,
                                           cudnnNanPropagation_t relu_nan, double coef) {
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetActivationDescriptor: null descriptor");
  if (mode < CUDNN_ACTIVATION_SIGMOID || mode > CUDNN_ACTIVATION_SWISH ||
      (relu_nan != CUDNN_NOT_PROPAGATE_NAN && relu_nan != CUDNN_PROPAGATE_NAN))
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetActivationDescriptor: mode " +
                                            std::to_string(mode) + " or NaN option " +
                                            std::to_string(relu_nan) + " is not an enumerant");
  d->set = true, d->mode = mode, d->nan = relu_nan, d->coef = coef;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups) {
  if (!d || groups < 1) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount");
  d->groups = groups;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) {
  if (!d || m < CUDNN_DEFAULT_MATH || m > CUDNN_FMA_MATH)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType");
  d->math = m;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(cudnnConvolutionDescriptor_t conv,
                                                    cudnnTensorDescriptor_t x,
                                                    cudnnFilterDescriptor_t w, int* n, int* c,
                                                    int* h, int* wd) {
  if (!conv || !x || !w || !conv->set || !x->set || !w->set || !n || !c || !h || !wd)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetConvolution2dForwardOutputDim");
  if (x->d[1] != w->d[1] * conv->groups)
    return fail(CUDNN_STATUS_BAD_PARAM,
                "cudnnGetConvolution2dForwardOutputDim: channels differ from filter x groups");
  *n = x->d[0];
  *c = w->d[0];
  *h = out_size(x->d[2], conv->ph, w->d[2], conv->dh, conv->u);
  *wd = out_size(x->d[3], conv->pw, w->d[3], conv->dw, conv->v);
  return CUDNN_STATUS_SUCCESS;
}

#define PLX_GEOMETRY(x, w, conv, y)                                         \
  Geometry g;                                                               \
  if (const cudnnStatus_t s_ = geometry(x, w, conv, y, g); s_ != CUDNN_STATUS_SUCCESS) \
    return s_

namespace {
cudnnStatus_t workspace(Dir dir, const Geometry& g, int algo, size_t* bytes) {
  if (!bytes) return fail(CUDNN_STATUS_BAD_PARAM, "a null size");
  const int64_t ws = algo >= 0 && algo < algo_count(dir) ? workspace_of(dir, algo, g) : -1;
  if (ws < 0)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                std::string(dir_name(dir)) + ": algorithm " + std::to_string(algo) +
                    " is not supported for these descriptors");
  *bytes = static_cast<size_t>(ws);
  return CUDNN_STATUS_SUCCESS;
}
}  // namespace

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                      cudnnFilterDescriptor_t w,
                                                      cudnnConvolutionDescriptor_t conv,
                                                      cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t algo,
                                                      size_t* bytes) {
  PLX_GEOMETRY(x, w, conv, y);
  return workspace(Dir::Fwd, g, algo, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
  PLX_GEOMETRY(dx, w, conv, dy);
  return workspace(Dir::BwdData, g, algo, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
  PLX_GEOMETRY(x, dw, conv, dy);
  return workspace(Dir::BwdFilter, g, algo, bytes);
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t conv,
                                                     cudnnTensorDescriptor_t y, int requested,
                                                     int* returned,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf) {
  PLX_GEOMETRY(x, w, conv, y);
  return heuristic(Dir::Fwd, g, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx, int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  PLX_GEOMETRY(dx, w, conv, dy);
  return heuristic(Dir::BwdData, g, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw, int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  PLX_GEOMETRY(x, dw, conv, dy);
  return heuristic(Dir::BwdFilter, g, requested, returned, perf);
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void* x, cudnnFilterDescriptor_t wd,
    const void* w, cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t yd, void* y,
    int requested, int* returned, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, size_t ws_bytes) {
  PLX_GEOMETRY(xd, wd, conv, yd);
  return find(h, Dir::Fwd, g, x, w, y, y, requested, returned, perf, ws, ws_bytes);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, cudnnFilterDescriptor_t wd, const void* w, cudnnTensorDescriptor_t dyd,
    const void* dy, cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dxd, void* dx,
    int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws,
    size_t ws_bytes) {
  PLX_GEOMETRY(dxd, wd, conv, dyd);
  return find(h, Dir::BwdData, g, dx, w, dy, dx, requested, returned, perf, ws, ws_bytes);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void* x, cudnnTensorDescriptor_t dyd,
    const void* dy, cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dwd, void* dw,
    int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws,
    size_t ws_bytes) {
  PLX_GEOMETRY(xd, dwd, conv, dyd);
  return find(h, Dir::BwdFilter, g, x, dw, dy, dw, requested, returned, perf, ws, ws_bytes);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void* alpha,
                                      cudnnTensorDescriptor_t xd, const void* x,
                                      cudnnFilterDescriptor_t wd, const void* w,
                                      cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void* ws, size_t ws_bytes,
                                      const void* beta, cudnnTensorDescriptor_t yd, void* y) {
  PLX_GEOMETRY(xd, wd, conv, yd);
  return run(h, Dir::Fwd, g, algo, ws, ws_bytes, alpha, beta, x, w, y, y);
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void* alpha,
                                           cudnnFilterDescriptor_t wd, const void* w,
                                           cudnnTensorDescriptor_t dyd, const void* dy,
                                           cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* ws,
                                           size_t ws_bytes, const void* beta,
                                           cudnnTensorDescriptor_t dxd, void* dx) {
  PLX_GEOMETRY(dxd, wd, conv, dyd);
  return run(h, Dir::BwdData, g, algo, ws, ws_bytes, alpha, beta, dx, w, dy, dx);
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void* alpha,
                                             cudnnTensorDescriptor_t xd, const void* x,
                                             cudnnTensorDescriptor_t dyd, const void* dy,
                                             cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* ws,
                                             size_t ws_bytes, const void* beta,
                                             cudnnFilterDescriptor_t dwd, void* dw) {
  PLX_GEOMETRY(xd, dwd, conv, dyd);
  return run(h, Dir::BwdFilter, g, algo, ws, ws_bytes, alpha, beta, x, dw, dy, dw);
}
cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t h, const void* alpha1, cudnnTensorDescriptor_t xd, const void* x,
    cudnnFilterDescriptor_t wd, const void* w, cudnnConvolutionDescriptor_t conv,
    cudnnConvolutionFwdAlgo_t algo, void* ws, size_t ws_bytes, const void* alpha2,
    cudnnTensorDescriptor_t zd, const void* z, cudnnTensorDescriptor_t biasd, const void* bias,
    cudnnActivationDescriptor_t act, cudnnTensorDescriptor_t yd, void* y) {
  const std::string f = "cudnnConvolutionBiasActivationForward: ";
  PLX_GEOMETRY(xd, wd, conv, yd);
  if (!zd || !z || !biasd || !bias || !act || !alpha2)
    return fail(CUDNN_STATUS_BAD_PARAM,
                f + "zDesc, z, biasDesc, bias, activationDesc or alpha2 is null");
  if (!act->set || !zd->set || !biasd->set)
    return fail(CUDNN_STATUS_BAD_PARAM, f + "a descriptor was never set");
  if (act->mode != CUDNN_ACTIVATION_RELU && act->mode != CUDNN_ACTIVATION_IDENTITY)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, f + "activation mode " + std::to_string(act->mode) +
                                                " is neither RELU nor IDENTITY");
  if (act->nan != CUDNN_NOT_PROPAGATE_NAN)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                f + "the activation's NaN option is not CUDNN_NOT_PROPAGATE_NAN");
  if (act->mode == CUDNN_ACTIVATION_IDENTITY &&
      algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
    return fail(
        CUDNN_STATUS_NOT_SUPPORTED,
        f + "IDENTITY takes only IMPLICIT_PRECOMP_GEMM, not algorithm " + std::to_string(algo));
  bool same = zd->type == yd->type && zd->format == yd->format;
  for (int i = 0; i < 4; ++i) same = same && zd->d[i] == yd->d[i] && zd->s[i] == yd->s[i];
  if (!same) return fail(CUDNN_STATUS_BAD_PARAM, f + "zDesc and yDesc do not match");
  if (biasd->d[1] != wd->d[0])
    return fail(CUDNN_STATUS_BAD_PARAM, f + "the bias has " + std::to_string(biasd->d[1]) +
                                            " channels, the filter " + std::to_string(wd->d[0]));
  if (biasd->d[0] != 1 || biasd->d[2] != 1 || biasd->d[3] != 1)
    return fail(CUDNN_STATUS_BAD_PARAM, f + "the bias is not (1, K, 1, 1)");
  if (biasd->s[1] != 1)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, f + "the bias's channel stride is not 1");
  if (yd->type == CUDNN_DATA_BFLOAT16)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, f + "no bfloat16 configuration in the data-type table");
  if (biasd->type != yd->type)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                f + "the bias's data type is not y's, as the table asks");
  Epilogue ep;
  ep.on = true;
  ep.relu = act->mode == CUDNN_ACTIVATION_RELU;
  ep.alpha2 = *static_cast<const float*>(alpha2);
  ep.z = z;
  ep.bias = bias;
  const float zero = 0.0f;
  return run(h, Dir::Fwd, g, algo, ws, ws_bytes, alpha1, &zero, x, w, y, y, ep);
}
