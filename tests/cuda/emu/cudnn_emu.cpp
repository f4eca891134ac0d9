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
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
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

// A buffer without a destructor, as the SDK's (sdk/include/plexus/sdk/status.hpp): a call
// failing in a static's teardown at exit, after this thread's thread_local objects were
// destroyed, must not write into a freed string.
thread_local char g_last_error[4096];

// The reason is kept for cudnnGetLastErrorString (the plugin puts it in its error); a refused
// algorithm, which callers probe for, is not printed.
cudnnStatus_t fail(cudnnStatus_t s, const std::string& why) {
  std::snprintf(g_last_error, sizeof g_last_error, "%s", why.c_str());
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

// `who` (the backend API's operation) starts the reasons.
cudnnStatus_t geometry(const Dims4* x, const Dims4* w, const cudnnConvolutionStruct* conv,
                       const Dims4* y, Geometry& g, const std::string& who = {}) {
  if (!x || !w || !conv || !y || !x->set || !w->set || !conv->set || !y->set)
    return fail(CUDNN_STATUS_BAD_PARAM, who + "a descriptor is null or was never set");
  if (x->type != w->type || x->type != y->type)
    return fail(CUDNN_STATUS_BAD_PARAM, who + "x, w and y have different data types");
  if (x->d[1] != w->d[1] * conv->groups)
    return fail(CUDNN_STATUS_BAD_PARAM,
                who + "x has " + std::to_string(x->d[1]) + " channels, the filter " +
                    std::to_string(w->d[1]) + " per group x " + std::to_string(conv->groups) +
                    " groups");
  if (w->d[0] % conv->groups != 0)
    return fail(CUDNN_STATUS_BAD_PARAM, who + "the filter count is not a multiple of the groups");
  const int oh = out_size(x->d[2], conv->ph, w->d[2], conv->dh, conv->u);
  const int ow = out_size(x->d[3], conv->pw, w->d[3], conv->dw, conv->v);
  if (y->d[0] != x->d[0] || y->d[1] != w->d[0] || y->d[2] != oh || y->d[3] != ow)
    return fail(CUDNN_STATUS_BAD_PARAM,
                who + "y is (" + std::to_string(y->d[0]) + ", " + std::to_string(y->d[1]) + ", " +
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
  plx_emu::Elem bias_type = plx_emu::Elem::kF32;  // the bias's own type and channel stride
  int64_t bias_stride = 1;
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
      v += plx_emu::load_elem(ep.bias, k * ep.bias_stride, ep.bias_type);
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
  std::snprintf(buf, n, "%s", g_last_error);
  g_last_error[0] = '\0';
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
  ep.bias_type = elem(biasd->type);
  const float zero = 0.0f;
  return run(h, Dir::Fwd, g, algo, ws, ws_bytes, alpha1, &zero, x, w, y, y, ep);
}

// The backend (graph) API of cuDNN 9, the part ops/conv_graph.cpp calls (names and values as in
// cuDNN 9.19's cudnn_graph.h). Modelled: descriptors as heap objects that live from
// cudnnBackendCreateDescriptor to cudnnBackendDestroyDescriptor (a pointer that is not a live one
// is refused), each kind with the attributes the set_* functions below take, checked at
// cudnnBackendSetAttribute (an attribute of that kind, its element type and count, the values) and
// at cudnnBackendFinalize (what is required, shapes, the graph's pattern). A finalized descriptor
// takes no more attributes and no second finalize, an unfinalized one gives no attribute back (all
// BAD_PARAM), and a descriptor set as an attribute of another must be finalized already (its
// contents are copied, so destroying it afterwards is harmless). Tensors are 4-D with any positive
// strides (logical N, C, H, W or K, C, R, S); a convolution is 2-D with equal pre and post
// paddings, its groups given by the filter's C (x's C = filter C x groups). A graph is one
// convolution in any direction, or a forward convolution into a virtual f32 tensor, a pointwise ADD
// of a (1, K, 1, 1) bias and an optional RELU_FWD (its input virtual f32 too); anything else is
// NOT_SUPPORTED.
//
// The heuristic ranks five emulated engines (global indices): 0, implicit GEMM with a workspace of
// 8 x C/groups x R x S bytes, deterministic, Tensor Cores (f32 inputs rounded to TF32), the only
// one that runs the fused graph, and only on packed NHWC x and y in f16 or bf16 (with the
// runtime-compilation note); 1, no workspace, full f32 for f32 data, its backward convolutions
// non-deterministic (summed in the other order); 2, computed as 1 in the deterministic order but
// noted DOWN_CONVERT_INPUTS; 3, listed but refused by every execution plan; 4, ranked first for
// a plain convolution, computed as 0 without workspace but noted RUNTIME_COMPILATION (callers
// may keep such engines for fused graphs). A fused graph gets engines 0 and 3 only. The arithmetic is convolve()'s, so a graph gives the bits of the legacy
// call with the same sum order and rounding. cudnnBackendExecute checks that the variant pack gives
// every non-virtual tensor of the graph an aligned pointer and the plan's workspace, then enqueues
// the work on the handle's stream as run() does (the workspace filled with 0xA5 first). A
// GetAttribute with requestedElementCount 0 writes the attribute's element count; otherwise it
// writes min(requested, count) elements and that number.
//
// Not modelled: other descriptor kinds and attributes (engines and engine configurations come from
// the heuristic only, not from a global index; no knobs, no intermediate info, no attribute reads
// beyond the heuristic's results, the engines' index and notes and the workspace sizes), 3-D or 5-D
// tensors, vectorized or by-value tensors, pointwise alpha1/alpha2, other pointwise modes, and
// cuDNN's real engine list and ranking.
namespace {

#define PLX_NAME(x) \
  case x:           \
    return #x;
std::string kind_name(cudnnBackendDescriptorType_t k) {
  switch (k) {
    PLX_NAME(CUDNN_BACKEND_POINTWISE_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_ENGINE_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    PLX_NAME(CUDNN_BACKEND_TENSOR_DESCRIPTOR)
  }
  return "descriptor type " + std::to_string(k);
}
std::string attr_name(cudnnBackendAttributeName_t a) {
  switch (a) {
    PLX_NAME(CUDNN_ATTR_POINTWISE_MODE)
    PLX_NAME(CUDNN_ATTR_POINTWISE_MATH_PREC)
    PLX_NAME(CUDNN_ATTR_CONVOLUTION_COMP_TYPE)
    PLX_NAME(CUDNN_ATTR_CONVOLUTION_CONV_MODE)
    PLX_NAME(CUDNN_ATTR_CONVOLUTION_DILATIONS)
    PLX_NAME(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES)
    PLX_NAME(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS)
    PLX_NAME(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS)
    PLX_NAME(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS)
    PLX_NAME(CUDNN_ATTR_ENGINEHEUR_MODE)
    PLX_NAME(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)
    PLX_NAME(CUDNN_ATTR_ENGINEHEUR_RESULTS)
    PLX_NAME(CUDNN_ATTR_ENGINECFG_ENGINE)
    PLX_NAME(CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE)
    PLX_NAME(CUDNN_ATTR_EXECUTION_PLAN_HANDLE)
    PLX_NAME(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)
    PLX_NAME(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X)
    PLX_NAME(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY)
    PLX_NAME(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR)
    PLX_NAME(CUDNN_ATTR_OPERATION_POINTWISE_XDESC)
    PLX_NAME(CUDNN_ATTR_OPERATION_POINTWISE_BDESC)
    PLX_NAME(CUDNN_ATTR_OPERATION_POINTWISE_YDESC)
    PLX_NAME(CUDNN_ATTR_OPERATIONGRAPH_HANDLE)
    PLX_NAME(CUDNN_ATTR_OPERATIONGRAPH_OPS)
    PLX_NAME(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT)
    PLX_NAME(CUDNN_ATTR_TENSOR_DATA_TYPE)
    PLX_NAME(CUDNN_ATTR_TENSOR_DIMENSIONS)
    PLX_NAME(CUDNN_ATTR_TENSOR_STRIDES)
    PLX_NAME(CUDNN_ATTR_TENSOR_UNIQUE_ID)
    PLX_NAME(CUDNN_ATTR_TENSOR_IS_VIRTUAL)
    PLX_NAME(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)
    PLX_NAME(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)
    PLX_NAME(CUDNN_ATTR_VARIANT_PACK_WORKSPACE)
    PLX_NAME(CUDNN_ATTR_ENGINE_GLOBAL_INDEX)
    PLX_NAME(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE)
    PLX_NAME(CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE)
  }
  return "attribute " + std::to_string(a);
}
std::string attr_type_name(cudnnBackendAttributeType_t t) {
  switch (t) {
    PLX_NAME(CUDNN_TYPE_HANDLE)
    PLX_NAME(CUDNN_TYPE_DATA_TYPE)
    PLX_NAME(CUDNN_TYPE_BOOLEAN)
    PLX_NAME(CUDNN_TYPE_INT64)
    PLX_NAME(CUDNN_TYPE_FLOAT)
    PLX_NAME(CUDNN_TYPE_DOUBLE)
    PLX_NAME(CUDNN_TYPE_VOID_PTR)
    PLX_NAME(CUDNN_TYPE_CONVOLUTION_MODE)
    PLX_NAME(CUDNN_TYPE_HEUR_MODE)
    PLX_NAME(CUDNN_TYPE_NUMERICAL_NOTE)
    PLX_NAME(CUDNN_TYPE_POINTWISE_MODE)
    PLX_NAME(CUDNN_TYPE_BACKEND_DESCRIPTOR)
    PLX_NAME(CUDNN_TYPE_BEHAVIOR_NOTE)
  }
  return "attribute type " + std::to_string(t);
}
#undef PLX_NAME

// A tensor descriptor's attributes.
struct BTensor {
  bool has_type = false, has_uid = false, has_align = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  int64_t uid = 0, align = 0;
  bool is_virtual = false;
};
struct BConv {
  bool has_comp = false, has_mode = false, has_spatial = false;
  cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  int64_t spatial = 0;
  std::vector<int64_t> dilations, strides, pre, post;
};
struct BPointwise {
  bool has_mode = false, has_prec = false;
  cudnnPointwiseMode_t mode = CUDNN_POINTWISE_ADD;
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;
};
// An operation: a convolution's tensors in the legacy roles (t[0] = x or dx, t[1] = w or dw,
// t[2] = y or dy), or a pointwise operation's x, b and y.
struct BOp {
  cudnnBackendDescriptorType_t kind = CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR;
  bool has[3] = {false, false, false};
  BTensor t[3];
  bool has_conv = false, has_pw = false, has_alpha = false, has_beta = false;
  BConv conv;
  BPointwise pw;
  double alpha = 1.0, beta = 0.0;
};
// A finalized operation graph as the engines see it: the convolution in the legacy roles (for a
// fused graph y is the graph's output) and the tensors the variant pack gives.
struct Problem {
  Dir dir = Dir::Fwd;
  Geometry g;
  float alpha = 1.0f, beta = 0.0f;
  bool fused = false, relu = false;
  BTensor io[4];  // x, w and y in the legacy roles, then the bias of a fused graph
  const char* io_name[4] = {"x", "w", "y", "bias"};
  int n_io = 3;
};

// A cudnnBackendDescriptor_t: every kind's state in one object, the used part by its kind.
struct Backend {
  cudnnBackendDescriptorType_t kind;
  bool finalized = false;
  BTensor tensor;
  BConv conv;
  BPointwise pw;
  BOp op;
  cudnnHandle_t handle = nullptr;  // graph, plan
  std::vector<BOp> ops;            // graph
  bool has_ops = false, has_graph = false, has_mode = false, has_cfg = false;
  // The graph (once the graph is finalized), and the heuristic's, a configuration's, an
  // engine's or a plan's graph.
  std::shared_ptr<const Problem> problem;
  int engine = -1;            // engine configuration, engine, plan
  std::vector<int64_t> uids;  // variant pack
  std::vector<void*> pointers;
  void* workspace = nullptr;
  bool has_uids = false, has_pointers = false;
};

std::mutex g_backend_mutex;
std::unordered_set<const void*> g_backend_live;

Backend* live(cudnnBackendDescriptor_t d) {
  std::lock_guard<std::mutex> lock(g_backend_mutex);
  return g_backend_live.count(d) ? static_cast<Backend*>(d) : nullptr;
}

// One cudnnBackendSetAttribute or cudnnBackendGetAttribute call, for its checks and reasons.
struct Call {
  const char* fn;
  const Backend* d;
  cudnnBackendAttributeName_t name;
  cudnnBackendAttributeType_t type;
  int64_t count;
  std::string where() const {
    return std::string(fn) + ": " + attr_name(name) + " of a " + kind_name(d->kind);
  }
  cudnnStatus_t bad(const std::string& why) const {
    return fail(CUDNN_STATUS_BAD_PARAM, where() + ": " + why);
  }
  // The element type, and a count within [lo, hi].
  cudnnStatus_t expect(cudnnBackendAttributeType_t t, int64_t lo, int64_t hi) const {
    if (type != t) return bad("takes " + attr_type_name(t) + ", not " + attr_type_name(type));
    if (count < lo || count > hi)
      return bad(
          "takes " +
          (lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi)) +
          (lo == 1 && hi == 1 ? " element" : " elements") + ", not " + std::to_string(count));
    return CUDNN_STATUS_SUCCESS;
  }
  cudnnStatus_t not_here() const {
    return bad("not an attribute of this descriptor type that the emulator models");
  }
};
#define PLX_TRY(e) \
  if (const cudnnStatus_t s_ = (e); s_ != CUDNN_STATUS_SUCCESS) return s_

// The finalized descriptor of kind `want` that element i of `a` names.
cudnnStatus_t operand(const Call& c, const void* a, int64_t i,
                      std::initializer_list<cudnnBackendDescriptorType_t> want,
                      const Backend** out) {
  const Backend* b = live(static_cast<cudnnBackendDescriptor_t const*>(a)[i]);
  if (!b)
    return c.bad("element " + std::to_string(i) +
                 " is not a live descriptor (null, never created or destroyed)");
  if (std::find(want.begin(), want.end(), b->kind) == want.end())
    return c.bad("element " + std::to_string(i) + " is a " + kind_name(b->kind) + ", not a " +
                 kind_name(*want.begin()));
  if (!b->finalized)
    return c.bad("element " + std::to_string(i) + " (a " + kind_name(b->kind) +
                 ") is not finalized");
  *out = b;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t set_tensor(Backend& d, const Call& c, const void* a) {
  BTensor& t = d.tensor;
  switch (c.name) {
    case CUDNN_ATTR_TENSOR_DATA_TYPE:
      PLX_TRY(c.expect(CUDNN_TYPE_DATA_TYPE, 1, 1));
      t.type = *static_cast<const cudnnDataType_t*>(a), t.has_type = true;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_DIMENSIONS:
    case CUDNN_ATTR_TENSOR_STRIDES: {
      PLX_TRY(c.expect(CUDNN_TYPE_INT64, 1, 8));
      if (c.count != 4)
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    c.where() + ": " + std::to_string(c.count) +
                        " dimensions; the emulator models 4-D tensors only");
      const int64_t* v = static_cast<const int64_t*>(a);
      (c.name == CUDNN_ATTR_TENSOR_DIMENSIONS ? t.dims : t.strides).assign(v, v + 4);
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_TENSOR_UNIQUE_ID:
      PLX_TRY(c.expect(CUDNN_TYPE_INT64, 1, 1));
      t.uid = *static_cast<const int64_t*>(a), t.has_uid = true;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
      PLX_TRY(c.expect(CUDNN_TYPE_INT64, 1, 1));
      t.align = *static_cast<const int64_t*>(a), t.has_align = true;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
      PLX_TRY(c.expect(CUDNN_TYPE_BOOLEAN, 1, 1));
      t.is_virtual = *static_cast<const bool*>(a);
      return CUDNN_STATUS_SUCCESS;
    default:
      return c.not_here();
  }
}

cudnnStatus_t set_conv(Backend& d, const Call& c, const void* a) {
  BConv& v = d.conv;
  switch (c.name) {
    case CUDNN_ATTR_CONVOLUTION_COMP_TYPE:
      PLX_TRY(c.expect(CUDNN_TYPE_DATA_TYPE, 1, 1));
      v.comp = *static_cast<const cudnnDataType_t*>(a), v.has_comp = true;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_CONVOLUTION_CONV_MODE: {
      PLX_TRY(c.expect(CUDNN_TYPE_CONVOLUTION_MODE, 1, 1));
      const auto m = *static_cast<const cudnnConvolutionMode_t*>(a);
      if (m != CUDNN_CONVOLUTION && m != CUDNN_CROSS_CORRELATION)
        return c.bad("mode " + std::to_string(m) + " is not an enumerant");
      v.mode = m, v.has_mode = true;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS:
      PLX_TRY(c.expect(CUDNN_TYPE_INT64, 1, 1));
      v.spatial = *static_cast<const int64_t*>(a), v.has_spatial = true;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_CONVOLUTION_DILATIONS:
    case CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES:
    case CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS:
    case CUDNN_ATTR_CONVOLUTION_POST_PADDINGS: {
      PLX_TRY(c.expect(CUDNN_TYPE_INT64, 1, 3));
      const int64_t* p = static_cast<const int64_t*>(a);
      const bool pad = c.name == CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS ||
                       c.name == CUDNN_ATTR_CONVOLUTION_POST_PADDINGS;
      for (int64_t i = 0; i < c.count; ++i)
        if (p[i] < (pad ? 0 : 1) || p[i] > INT_MAX)
          return c.bad("element " + std::to_string(i) + " is " + std::to_string(p[i]) +
                       (pad ? " (a padding below 0)" : " (a stride or dilation below 1)"));
      std::vector<int64_t>& dst = c.name == CUDNN_ATTR_CONVOLUTION_DILATIONS        ? v.dilations
                                  : c.name == CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES ? v.strides
                                  : c.name == CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS   ? v.pre
                                                                                    : v.post;
      dst.assign(p, p + c.count);
      return CUDNN_STATUS_SUCCESS;
    }
    default:
      return c.not_here();
  }
}

cudnnStatus_t set_pointwise(Backend& d, const Call& c, const void* a) {
  switch (c.name) {
    case CUDNN_ATTR_POINTWISE_MODE:
      PLX_TRY(c.expect(CUDNN_TYPE_POINTWISE_MODE, 1, 1));
      d.pw.mode = *static_cast<const cudnnPointwiseMode_t*>(a), d.pw.has_mode = true;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_POINTWISE_MATH_PREC:
      PLX_TRY(c.expect(CUDNN_TYPE_DATA_TYPE, 1, 1));
      d.pw.prec = *static_cast<const cudnnDataType_t*>(a), d.pw.has_prec = true;
      return CUDNN_STATUS_SUCCESS;
    default:
      return c.not_here();
  }
}

// What an operation's attribute sets: a tensor role (0, 1, 2), the convolution or pointwise
// descriptor (3), alpha (4), beta (5); -1 where the operation has no such attribute.
int op_slot(cudnnBackendDescriptorType_t k, cudnnBackendAttributeName_t a) {
  // A convolution's six attributes follow its ALPHA in the order alpha, beta, conv, w (dw),
  // x (dx), y (dy) in every direction.
  cudnnBackendAttributeName_t alpha;
  switch (k) {
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
      alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA;
      break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
      alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA;
      break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
      alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA;
      break;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
      if (a >= CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR &&
          a <= CUDNN_ATTR_OPERATION_POINTWISE_YDESC)
        return a == CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR
                   ? 3
                   : a - CUDNN_ATTR_OPERATION_POINTWISE_XDESC;  // x, b, y
      return -1;
    default:
      return -1;
  }
  static const int slot[] = {4, 5, 3, 1, 0, 2};
  const int i = static_cast<int>(a) - static_cast<int>(alpha);
  return i >= 0 && i < 6 ? slot[i] : -1;
}

cudnnStatus_t set_op(Backend& d, const Call& c, const void* a) {
  const int slot = op_slot(d.kind, c.name);
  BOp& op = d.op;
  const bool pointwise = d.kind == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR;
  if (slot < 0) return c.not_here();
  if (slot >= 4) {  // alpha or beta
    if (c.type != CUDNN_TYPE_FLOAT && c.type != CUDNN_TYPE_DOUBLE)
      return c.bad("takes CUDNN_TYPE_FLOAT or CUDNN_TYPE_DOUBLE, not " + attr_type_name(c.type));
    PLX_TRY(c.expect(c.type, 1, 1));
    const double v =
        c.type == CUDNN_TYPE_FLOAT ? *static_cast<const float*>(a) : *static_cast<const double*>(a);
    (slot == 4 ? op.alpha : op.beta) = v;
    (slot == 4 ? op.has_alpha : op.has_beta) = true;
    return CUDNN_STATUS_SUCCESS;
  }
  PLX_TRY(c.expect(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1));
  const Backend* b = nullptr;
  if (slot == 3) {
    if (pointwise) {
      PLX_TRY(operand(c, a, 0, {CUDNN_BACKEND_POINTWISE_DESCRIPTOR}, &b));
      op.pw = b->pw, op.has_pw = true;
    } else {
      PLX_TRY(operand(c, a, 0, {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR}, &b));
      op.conv = b->conv, op.has_conv = true;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  PLX_TRY(operand(c, a, 0, {CUDNN_BACKEND_TENSOR_DESCRIPTOR}, &b));
  op.t[slot] = b->tensor, op.has[slot] = true;
  return CUDNN_STATUS_SUCCESS;
}

bool is_op(cudnnBackendDescriptorType_t k) {
  return k == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR ||
         k == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR ||
         k == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR ||
         k == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR;
}

cudnnStatus_t set_handle(const Call& c, const void* a, cudnnHandle_t* out) {
  PLX_TRY(c.expect(CUDNN_TYPE_HANDLE, 1, 1));
  const cudnnHandle_t h = *static_cast<const cudnnHandle_t*>(a);
  if (!h) return c.bad("a null handle");
  *out = h;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t set_other(Backend& d, const Call& c, const void* a) {
  const Backend* b = nullptr;
  switch (d.kind) {
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      if (c.name == CUDNN_ATTR_OPERATIONGRAPH_HANDLE) return set_handle(c, a, &d.handle);
      if (c.name != CUDNN_ATTR_OPERATIONGRAPH_OPS) return c.not_here();
      PLX_TRY(c.expect(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, INT_MAX));
      d.ops.clear();
      for (int64_t i = 0; i < c.count; ++i) {
        PLX_TRY(operand(c, a, i,
                        {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                         CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                         CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                         CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR},
                        &b));
        d.ops.push_back(b->op);
      }
      d.has_ops = true;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      if (c.name == CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) {
        PLX_TRY(c.expect(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1));
        PLX_TRY(operand(c, a, 0, {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR}, &b));
        d.problem = b->problem, d.has_graph = true;
        return CUDNN_STATUS_SUCCESS;
      }
      if (c.name == CUDNN_ATTR_ENGINEHEUR_MODE) {
        PLX_TRY(c.expect(CUDNN_TYPE_HEUR_MODE, 1, 1));
        const auto m = *static_cast<const cudnnBackendHeurMode_t*>(a);
        if (m != CUDNN_HEUR_MODE_INSTANT && m != CUDNN_HEUR_MODE_A && m != CUDNN_HEUR_MODE_B &&
            m != CUDNN_HEUR_MODE_FALLBACK)
          return c.bad("mode " + std::to_string(m) + " is not an enumerant");
        d.has_mode = true;
        return CUDNN_STATUS_SUCCESS;
      }
      return c.not_here();
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      if (c.name == CUDNN_ATTR_EXECUTION_PLAN_HANDLE) return set_handle(c, a, &d.handle);
      if (c.name != CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG) return c.not_here();
      PLX_TRY(c.expect(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1));
      PLX_TRY(operand(c, a, 0, {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR}, &b));
      d.problem = b->problem, d.engine = b->engine, d.has_cfg = true;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      if (c.name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) {
        PLX_TRY(c.expect(CUDNN_TYPE_INT64, 0, INT_MAX));
        const int64_t* v = static_cast<const int64_t*>(a);
        d.uids.assign(v, v + c.count), d.has_uids = true;
        return CUDNN_STATUS_SUCCESS;
      }
      if (c.name == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS) {
        PLX_TRY(c.expect(CUDNN_TYPE_VOID_PTR, 0, INT_MAX));
        void* const* v = static_cast<void* const*>(a);
        d.pointers.assign(v, v + c.count), d.has_pointers = true;
        return CUDNN_STATUS_SUCCESS;
      }
      if (c.name == CUDNN_ATTR_VARIANT_PACK_WORKSPACE) {
        PLX_TRY(c.expect(CUDNN_TYPE_VOID_PTR, 1, 1));
        d.workspace = *static_cast<void* const*>(a);
        return CUDNN_STATUS_SUCCESS;
      }
      return c.not_here();
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      return fail(CUDNN_STATUS_NOT_SUPPORTED,
                  c.where() +
                      ": the emulator's engines and engine configurations come from the "
                      "heuristic's results only and take no attributes");
    default:
      return c.not_here();
  }
}

// ---- Finalize ----

std::string dims_text(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ")";
}

cudnnStatus_t finalize_tensor(const BTensor& t) {
  const std::string f = "cudnnBackendFinalize: CUDNN_BACKEND_TENSOR_DESCRIPTOR: ";
  const char* missing = !t.has_type         ? "CUDNN_ATTR_TENSOR_DATA_TYPE"
                        : t.dims.empty()    ? "CUDNN_ATTR_TENSOR_DIMENSIONS"
                        : t.strides.empty() ? "CUDNN_ATTR_TENSOR_STRIDES"
                        : !t.has_uid        ? "CUDNN_ATTR_TENSOR_UNIQUE_ID"
                        : !t.has_align      ? "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT"
                                            : nullptr;
  if (missing) return fail(CUDNN_STATUS_BAD_PARAM, f + missing + " was never set");
  for (size_t i = 0; i < 4; ++i)
    if (t.dims[i] <= 0 || t.dims[i] > INT_MAX)
      return fail(CUDNN_STATUS_BAD_PARAM,
                  f + "a dimension is not positive or too large: " + dims_text(t.dims));
  for (size_t i = 0; i < 4; ++i)
    if (t.strides[i] <= 0)
      return fail(CUDNN_STATUS_BAD_PARAM, f + "a stride is not positive: " + dims_text(t.strides));
  if (t.align <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM,
                f + "byte alignment " + std::to_string(t.align) + " is not positive");
  if (type_size(t.type) == 0)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, f + "data type " + std::to_string(t.type) +
                                                " (the emulator has FLOAT, HALF and BFLOAT16)");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_conv(const BConv& v) {
  const std::string f = "cudnnBackendFinalize: CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: ";
  const char* missing = !v.has_comp           ? "CUDNN_ATTR_CONVOLUTION_COMP_TYPE"
                        : !v.has_mode         ? "CUDNN_ATTR_CONVOLUTION_CONV_MODE"
                        : !v.has_spatial      ? "CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS"
                        : v.dilations.empty() ? "CUDNN_ATTR_CONVOLUTION_DILATIONS"
                        : v.strides.empty()   ? "CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES"
                        : v.pre.empty()       ? "CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS"
                        : v.post.empty()      ? "CUDNN_ATTR_CONVOLUTION_POST_PADDINGS"
                                              : nullptr;
  if (missing) return fail(CUDNN_STATUS_BAD_PARAM, f + missing + " was never set");
  if (v.spatial < 1 || v.spatial > 3)
    return fail(CUDNN_STATUS_BAD_PARAM,
                f + "spatial dimensions " + std::to_string(v.spatial) + " (1 to 3)");
  for (const auto* a : {&v.dilations, &v.strides, &v.pre, &v.post})
    if (static_cast<int64_t>(a->size()) != v.spatial)
      return fail(CUDNN_STATUS_BAD_PARAM, f + "dilations, filter strides and paddings need " +
                                              std::to_string(v.spatial) +
                                              " elements each (the spatial dimensions)");
  if (v.spatial != 2)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, f + "the emulator models 2-D convolutions only, not " +
                                                std::to_string(v.spatial) + "-D");
  if (v.pre != v.post)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, f + "pre paddings " + dims_text(v.pre) +
                                                " differ from post paddings " + dims_text(v.post));
  if (v.comp != CUDNN_DATA_FLOAT)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, f + "compute type " + std::to_string(v.comp) +
                                                "; the emulator computes in CUDNN_DATA_FLOAT");
  return CUDNN_STATUS_SUCCESS;
}

Dims4 dims4(const BTensor& t, cudnnDataType_t type) {
  Dims4 d;
  d.set = true, d.type = type;
  for (int i = 0; i < 4; ++i) d.d[i] = static_cast<int>(t.dims[i]), d.s[i] = t.strides[i];
  // The layout that sets the sum order (convolve): channels innermost where their stride is 1.
  d.format = t.strides[1] == 1 && t.dims[1] > 1 ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  return d;
}

// The convolution of x (or dx), w (or dw) and y (or dy) checked as geometry() does, the groups
// from the filter's channels; `type` for all three (a virtual y's own type is checked by the
// graph).
cudnnStatus_t conv_geometry(const std::string& f, const BTensor& x, const BTensor& w,
                            const BConv& v, const BTensor& y, cudnnDataType_t ytype, Geometry& g) {
  if (x.dims[1] % w.dims[1] != 0)
    return fail(CUDNN_STATUS_BAD_PARAM, f + "x has " + std::to_string(x.dims[1]) +
                                            " channels, not a multiple of the filter's " +
                                            std::to_string(w.dims[1]) +
                                            " (the groups are x's channels / the filter's)");
  cudnnConvolutionStruct c;
  c.set = true;
  c.ph = static_cast<int>(v.pre[0]), c.pw = static_cast<int>(v.pre[1]);
  c.u = static_cast<int>(v.strides[0]), c.v = static_cast<int>(v.strides[1]);
  c.dh = static_cast<int>(v.dilations[0]), c.dw = static_cast<int>(v.dilations[1]);
  c.mode = v.mode;
  c.compute = v.comp;
  c.groups = static_cast<int>(x.dims[1] / w.dims[1]);
  const Dims4 dx = dims4(x, x.type), dw = dims4(w, w.type), dy = dims4(y, ytype);
  PLX_TRY(geometry(&dx, &dw, &c, &dy, g, f));
  g.tf32 = false;  // set by the engine
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op(const Backend& d) {
  const BOp& op = d.op;
  const std::string f = "cudnnBackendFinalize: " + kind_name(d.kind) + ": ";
  if (d.kind == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) {
    if (!op.has_pw)
      return fail(CUDNN_STATUS_BAD_PARAM, f + "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR "
                                              "was never set");
    if (!op.has[0] || !op.has[2])
      return fail(CUDNN_STATUS_BAD_PARAM, f + "XDESC or YDESC was never set");
    const bool add = op.pw.mode == CUDNN_POINTWISE_ADD;
    if (add != op.has[1])
      return fail(CUDNN_STATUS_BAD_PARAM,
                  f + (add ? "ADD needs BDESC" : "RELU_FWD takes no BDESC"));
    if (op.t[2].dims != op.t[0].dims)
      return fail(CUDNN_STATUS_BAD_PARAM, f + "y " + dims_text(op.t[2].dims) +
                                              " is not the shape of x " + dims_text(op.t[0].dims));
    if (add)
      for (int i = 0; i < 4; ++i)
        if (op.t[1].dims[i] != 1 && op.t[1].dims[i] != op.t[0].dims[i])
          return fail(CUDNN_STATUS_BAD_PARAM, f + "b " + dims_text(op.t[1].dims) +
                                                  " does not broadcast to x " +
                                                  dims_text(op.t[0].dims));
    return CUDNN_STATUS_SUCCESS;
  }
  const char* role[3] = {"x", "w", "y"};
  if (d.kind == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR)
    role[0] = "dx", role[2] = "dy";
  if (d.kind == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR)
    role[1] = "dw", role[2] = "dy";
  for (int i = 0; i < 3; ++i)
    if (!op.has[i]) return fail(CUDNN_STATUS_BAD_PARAM, f + role[i] + " was never set");
  if (!op.has_conv) return fail(CUDNN_STATUS_BAD_PARAM, f + "CONV_DESC was never set");
  if (!op.has_alpha || !op.has_beta)
    return fail(CUDNN_STATUS_BAD_PARAM, f + "ALPHA or BETA was never set");
  Geometry g;
  // A virtual output (the fused graph's) may be of another type: the graph checks it.
  const cudnnDataType_t ytype = op.t[2].is_virtual ? op.t[0].type : op.t[2].type;
  return conv_geometry(f, op.t[0], op.t[1], op.conv, op.t[2], ytype, g);
}

bool same_tensor(const BTensor& a, const BTensor& b) {
  return a.type == b.type && a.dims == b.dims && a.strides == b.strides &&
         a.is_virtual == b.is_virtual && a.align == b.align;
}

// The graph's pattern: one convolution, or forward convolution -> ADD bias [-> RELU_FWD].
cudnnStatus_t analyse(const std::vector<BOp>& ops, Problem& p) {
  const std::string f = "cudnnBackendFinalize: CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: ";
  auto unsupported = [&](const std::string& why) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, f + why);
  };
  // Tensors with one uid are one tensor.
  std::vector<const BTensor*> all;
  for (const BOp& op : ops)
    for (int i = 0; i < 3; ++i)
      if (op.has[i]) all.push_back(&op.t[i]);
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (all[i]->uid == all[j]->uid && !same_tensor(*all[i], *all[j]))
        return fail(CUDNN_STATUS_BAD_PARAM,
                    f + "two different tensors have uid " + std::to_string(all[i]->uid));
  const BOp* conv = nullptr;
  std::vector<const BOp*> pointwise;
  for (const BOp& op : ops) {
    if (op.kind == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) {
      pointwise.push_back(&op);
    } else {
      if (conv) return unsupported("more than one convolution");
      conv = &op;
    }
  }
  if (!conv) return unsupported("no convolution (the emulator's engines run convolutions)");
  p.dir = conv->kind == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR ? Dir::Fwd
          : conv->kind == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
              ? Dir::BwdData
              : Dir::BwdFilter;
  p.alpha = static_cast<float>(conv->alpha), p.beta = static_cast<float>(conv->beta);
  p.io[0] = conv->t[0], p.io[1] = conv->t[1], p.io[2] = conv->t[2];
  if (p.dir == Dir::BwdData) p.io_name[0] = "dx", p.io_name[2] = "dy";
  if (p.dir == Dir::BwdFilter) p.io_name[1] = "dw", p.io_name[2] = "dy";
  for (int i = 0; i < 2; ++i)
    if (conv->t[i].is_virtual) return unsupported(std::string(p.io_name[i]) + " is virtual");
  if (pointwise.empty()) {
    if (conv->t[2].is_virtual) return unsupported(std::string(p.io_name[2]) + " is virtual");
  } else {
    if (p.dir != Dir::Fwd) return unsupported("a pointwise operation after a backward convolution");
    if (pointwise.size() > 2) return unsupported("more than two pointwise operations");
    const BOp* add = nullptr;
    const BOp* relu = nullptr;
    for (const BOp* op : pointwise) {
      if (op->pw.mode == CUDNN_POINTWISE_ADD && op->t[0].uid == conv->t[2].uid)
        add = op;
      else if (op->pw.mode == CUDNN_POINTWISE_RELU_FWD)
        relu = op;
    }
    if (!add) return unsupported("no ADD takes the convolution's y as its x");
    if (pointwise.size() == 2 && (!relu || relu->t[0].uid != add->t[2].uid))
      return unsupported("the second pointwise operation is not a RELU_FWD of the ADD's y");
    const BTensor& out = relu ? relu->t[2] : add->t[2];
    std::vector<const BTensor*> inner = {&conv->t[2]};
    if (relu) inner.push_back(&add->t[2]);
    for (const BTensor* t : inner) {
      if (!t->is_virtual)
        return unsupported("the tensor with uid " + std::to_string(t->uid) +
                           " between two operations is not virtual");
      if (t->type != CUDNN_DATA_FLOAT)
        return unsupported("the virtual tensor with uid " + std::to_string(t->uid) +
                           " is not FLOAT (the emulator keeps intermediates in f32)");
    }
    if (out.is_virtual) return unsupported("the graph's output is virtual");
    const BTensor& bias = add->t[1];
    if (bias.is_virtual) return unsupported("the bias is virtual");
    if (bias.dims != std::vector<int64_t>{1, conv->t[1].dims[0], 1, 1})
      return unsupported("the bias is " + dims_text(bias.dims) + ", not (1, " +
                         std::to_string(conv->t[1].dims[0]) + ", 1, 1)");
    if (p.beta != 0.0f) return unsupported("a fused graph needs the convolution's beta = 0");
    p.fused = true, p.relu = relu != nullptr;
    p.io[2] = out, p.io[3] = bias, p.n_io = 4;
  }
  for (int i = 0; i < p.n_io; ++i)
    for (int j = 0; j < i; ++j)
      if (p.io[i].uid == p.io[j].uid)
        return fail(CUDNN_STATUS_BAD_PARAM, f + p.io_name[j] + " and " + p.io_name[i] +
                                                " have the same uid " +
                                                std::to_string(p.io[i].uid));
  return conv_geometry(f, p.io[0], p.io[1], conv->conv, p.io[2], p.io[2].type, p.g);
}

// ---- The emulated engines ----

bool packed_nhwc(const BTensor& t) {
  const int64_t C = t.dims[1], H = t.dims[2], W = t.dims[3];
  return t.strides == std::vector<int64_t>{H * W * C, 1, W * C, C};
}
std::vector<int> engines_for(const Problem& p) {
  if (p.fused) return {0, 3};
  return {4, 0, 1, 2, 3};
}
int64_t engine_workspace(const Problem& p, int e) {
  return e == 0 ? 8 * static_cast<int64_t>(p.g.w.d[1]) * p.g.w.d[2] * p.g.w.d[3] : 0;
}
std::vector<cudnnBackendNumericalNote_t> numerical_notes(const Problem& p, int e) {
  const bool f32 = p.g.x.type == CUDNN_DATA_FLOAT;
  std::vector<cudnnBackendNumericalNote_t> n;
  if (e == 0 || e == 4 || ((e == 1 || e == 2) && !f32))
    n.push_back(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
  if (e == 1 && p.dir != Dir::Fwd) n.push_back(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
  if (e == 2) n.push_back(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
  return n;
}
std::vector<cudnnBackendBehaviorNote_t> behavior_notes(const Problem& p, int e) {
  if ((e == 0 && p.fused) || e == 4) return {CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION};
  return {};
}
// Why engine e cannot run the graph; empty where it can.
std::string engine_refusal(const Problem& p, int e) {
  if (e == 3) return "engine 3 does not support this graph";
  if (p.fused && e != 0) return "engine " + std::to_string(e) + " does not run fused graphs";
  if (p.fused && !(packed_nhwc(p.io[0]) && packed_nhwc(p.io[2])))
    return "engine 0 runs a fused graph on packed NHWC x and y only";
  if (p.fused && p.g.x.type != CUDNN_DATA_HALF && p.g.x.type != CUDNN_DATA_BFLOAT16)
    return "engine 0 runs a fused graph in HALF or BFLOAT16 only";
  return {};
}

// ---- GetAttribute ----

// Writes `n` values of type T (count only when requested is 0).
template <class T>
cudnnStatus_t put(const Call& c, const std::vector<T>& v, int64_t requested, int64_t* count,
                  void* a) {
  const int64_t n = static_cast<int64_t>(v.size());
  if (requested == 0) {
    if (!count) return c.bad("requestedElementCount 0 and a null elementCount");
    *count = n;
    return CUDNN_STATUS_SUCCESS;
  }
  const int64_t k = std::min(requested, n);
  for (int64_t i = 0; i < k; ++i) static_cast<T*>(a)[i] = v[static_cast<size_t>(i)];
  if (count) *count = k;
  return CUDNN_STATUS_SUCCESS;
}

// Fills the caller's descriptor of kind `want` (element i of `a`) as a finalized engine or
// engine configuration.
cudnnStatus_t fill(const Call& c, void* a, int64_t i, cudnnBackendDescriptorType_t want,
                   const std::shared_ptr<const Problem>& p, int engine) {
  Backend* b = live(static_cast<cudnnBackendDescriptor_t*>(a)[i]);
  if (!b)
    return c.bad("element " + std::to_string(i) +
                 " is not a live descriptor (null, never created or destroyed)");
  if (b->kind != want)
    return c.bad("element " + std::to_string(i) + " is a " + kind_name(b->kind) + ", not a " +
                 kind_name(want));
  b->problem = p, b->engine = engine, b->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t get(const Backend& d, const Call& c, int64_t requested, int64_t* count, void* a) {
  const std::string none = "not an attribute of this descriptor type that the emulator reads back";
  if (!d.problem) return c.bad(none);  // the kinds with no readable attribute
  const Problem& p = *d.problem;
  switch (d.kind) {
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
      if (c.name != CUDNN_ATTR_ENGINEHEUR_RESULTS) break;
      PLX_TRY(c.expect(CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, INT64_MAX));
      const std::vector<int> e = engines_for(p);
      if (requested == 0) return put(c, e, 0, count, a);
      const int64_t k = std::min<int64_t>(requested, static_cast<int64_t>(e.size()));
      for (int64_t i = 0; i < k; ++i)
        PLX_TRY(fill(c, a, i, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, d.problem,
                     e[static_cast<size_t>(i)]));
      if (count) *count = k;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      if (c.name == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE) {
        PLX_TRY(c.expect(CUDNN_TYPE_INT64, 0, INT64_MAX));
        return put(c, std::vector<int64_t>{engine_workspace(p, d.engine)}, requested, count, a);
      }
      if (c.name != CUDNN_ATTR_ENGINECFG_ENGINE) break;
      PLX_TRY(c.expect(CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, INT64_MAX));
      if (requested > 0)
        PLX_TRY(fill(c, a, 0, CUDNN_BACKEND_ENGINE_DESCRIPTOR, d.problem, d.engine));
      if (count) *count = 1;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      if (c.name == CUDNN_ATTR_ENGINE_GLOBAL_INDEX) {
        PLX_TRY(c.expect(CUDNN_TYPE_INT64, 0, INT64_MAX));
        return put(c, std::vector<int64_t>{d.engine}, requested, count, a);
      }
      if (c.name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) {
        PLX_TRY(c.expect(CUDNN_TYPE_NUMERICAL_NOTE, 0, INT64_MAX));
        return put(c, numerical_notes(p, d.engine), requested, count, a);
      }
      if (c.name == CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE) {
        PLX_TRY(c.expect(CUDNN_TYPE_BEHAVIOR_NOTE, 0, INT64_MAX));
        return put(c, behavior_notes(p, d.engine), requested, count, a);
      }
      break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      if (c.name != CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) break;
      PLX_TRY(c.expect(CUDNN_TYPE_INT64, 0, INT64_MAX));
      return put(c, std::vector<int64_t>{engine_workspace(p, d.engine)}, requested, count, a);
    default:
      break;
  }
  return c.bad(none);
}

}  // namespace

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* descriptor) {
  if (!descriptor)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendCreateDescriptor: a null descriptor pointer");
  if (kind_name(type).rfind("CUDNN_BACKEND_", 0) != 0)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendCreateDescriptor: " + kind_name(type) +
                                                " is not one the emulator models");
  Backend* b = new Backend();
  b->kind = type;
  b->op.kind = type;
  std::lock_guard<std::mutex> lock(g_backend_mutex);
  g_backend_live.insert(b);
  *descriptor = b;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  if (!descriptor)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendDestroyDescriptor: a null descriptor");
  {
    std::lock_guard<std::mutex> lock(g_backend_mutex);
    if (!g_backend_live.erase(descriptor))
      return fail(CUDNN_STATUS_BAD_PARAM,
                  "cudnnBackendDestroyDescriptor: not a live descriptor (never created or "
                  "already destroyed)");
  }
  delete static_cast<Backend*>(descriptor);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t elementCount,
                                       const void* arrayOfElements) {
  Backend* d = live(descriptor);
  if (!d)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: " + attr_name(name) +
                                            " of a descriptor that is not live (null, never "
                                            "created or destroyed)");
  const Call c{"cudnnBackendSetAttribute", d, name, type, elementCount};
  if (d->finalized) return c.bad("the descriptor is finalized");
  if (elementCount < 0) return c.bad("a negative element count");
  if (elementCount > 0 && !arrayOfElements) return c.bad("a null array of elements");
  switch (d->kind) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      return set_tensor(*d, c, arrayOfElements);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
      return set_conv(*d, c, arrayOfElements);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      return set_pointwise(*d, c, arrayOfElements);
    default:
      if (is_op(d->kind)) return set_op(*d, c, arrayOfElements);
      return set_other(*d, c, arrayOfElements);
  }
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  Backend* d = live(descriptor);
  if (!d)
    return fail(CUDNN_STATUS_BAD_PARAM,
                "cudnnBackendFinalize: not a live descriptor (null, "
                "never created or destroyed)");
  const std::string f = "cudnnBackendFinalize: " + kind_name(d->kind) + ": ";
  if (d->finalized) return fail(CUDNN_STATUS_BAD_PARAM, f + "already finalized");
  switch (d->kind) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      PLX_TRY(finalize_tensor(d->tensor));
      break;
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
      PLX_TRY(finalize_conv(d->conv));
      break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      if (!d->pw.has_mode || !d->pw.has_prec)
        return fail(CUDNN_STATUS_BAD_PARAM, f + "MODE or MATH_PREC was never set");
      if (d->pw.mode != CUDNN_POINTWISE_ADD && d->pw.mode != CUDNN_POINTWISE_RELU_FWD)
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    f + "mode " + std::to_string(d->pw.mode) +
                        "; the emulator has CUDNN_POINTWISE_ADD and CUDNN_POINTWISE_RELU_FWD");
      if (d->pw.prec != CUDNN_DATA_FLOAT)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, f + "math precision " + std::to_string(d->pw.prec) +
                                                    "; the emulator computes in FLOAT");
      break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
      if (!d->handle) return fail(CUDNN_STATUS_BAD_PARAM, f + "HANDLE was never set");
      if (!d->has_ops) return fail(CUDNN_STATUS_BAD_PARAM, f + "OPS was never set");
      auto p = std::make_shared<Problem>();
      PLX_TRY(analyse(d->ops, *p));
      d->problem = p;
      break;
    }
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      if (!d->has_graph || !d->has_mode)
        return fail(CUDNN_STATUS_BAD_PARAM, f + "OPERATION_GRAPH or MODE was never set");
      break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
      if (!d->handle || !d->has_cfg)
        return fail(CUDNN_STATUS_BAD_PARAM, f + "HANDLE or ENGINE_CONFIG was never set");
      const std::string why = engine_refusal(*d->problem, d->engine);
      if (!why.empty()) return fail(CUDNN_STATUS_NOT_SUPPORTED, f + why);
      break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      if (!d->has_uids || !d->has_pointers)
        return fail(CUDNN_STATUS_BAD_PARAM, f + "UNIQUE_IDS or DATA_POINTERS was never set");
      if (d->uids.size() != d->pointers.size())
        return fail(CUDNN_STATUS_BAD_PARAM,
                    f + std::to_string(d->uids.size()) + " unique ids but " +
                        std::to_string(d->pointers.size()) + " data pointers");
      for (size_t i = 0; i < d->uids.size(); ++i)
        for (size_t j = 0; j < i; ++j)
          if (d->uids[i] == d->uids[j])
            return fail(CUDNN_STATUS_BAD_PARAM,
                        f + "uid " + std::to_string(d->uids[i]) + " appears twice");
      break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      return fail(CUDNN_STATUS_NOT_SUPPORTED,
                  f + "the emulator's engines and engine configurations come from the "
                      "heuristic's results only");
    default:
      PLX_TRY(finalize_op(*d));
      break;
  }
  d->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type,
                                       int64_t requestedElementCount, int64_t* elementCount,
                                       void* arrayOfElements) {
  const Backend* d = live(descriptor);
  if (!d)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: " + attr_name(name) +
                                            " of a descriptor that is not live (null, never "
                                            "created or destroyed)");
  const Call c{"cudnnBackendGetAttribute", d, name, type, requestedElementCount};
  if (!d->finalized) return c.bad("the descriptor is not finalized");
  if (requestedElementCount < 0) return c.bad("a negative requestedElementCount");
  if (requestedElementCount > 0 && !arrayOfElements) return c.bad("a null array of elements");
  return get(*d, c, requestedElementCount, elementCount, arrayOfElements);
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack) {
  const std::string f = "cudnnBackendExecute: ";
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, f + "a null handle");
  const Backend* plan = live(executionPlan);
  const Backend* pack = live(variantPack);
  if (!plan || plan->kind != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !plan->finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, f + "executionPlan is not a finalized "
                                            "CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR");
  if (!pack || pack->kind != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !pack->finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, f + "variantPack is not a finalized "
                                            "CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR");
  const Problem& p = *plan->problem;
  void* ptr[4] = {nullptr, nullptr, nullptr, nullptr};
  for (int i = 0; i < p.n_io; ++i) {
    const BTensor& t = p.io[i];
    const std::string what = std::string(p.io_name[i]) + " (uid " + std::to_string(t.uid) + ")";
    const auto at = std::find(pack->uids.begin(), pack->uids.end(), t.uid);
    if (at == pack->uids.end())
      return fail(CUDNN_STATUS_BAD_PARAM, f + "the variant pack has no pointer for " + what);
    ptr[i] = pack->pointers[static_cast<size_t>(at - pack->uids.begin())];
    if (!ptr[i]) return fail(CUDNN_STATUS_BAD_PARAM, f + "a null pointer for " + what);
    if (reinterpret_cast<uintptr_t>(ptr[i]) % static_cast<uintptr_t>(t.align) != 0)
      return fail(CUDNN_STATUS_BAD_PARAM, f + "the pointer for " + what +
                                              " is not aligned to its byte alignment " +
                                              std::to_string(t.align));
  }
  const int64_t need = engine_workspace(p, plan->engine);
  void* ws = pack->workspace;
  if (need > 0 && !ws)
    return fail(CUDNN_STATUS_BAD_PARAM, f + "the plan needs " + std::to_string(need) +
                                            " bytes of workspace and the variant pack has none");
  Geometry g = p.g;
  g.tf32 = (plan->engine == 0 || plan->engine == 4) && g.x.type == CUDNN_DATA_FLOAT;
  const bool rev = plan->engine == 1 && p.dir != Dir::Fwd;
  Epilogue ep;
  if (p.fused) {
    ep.on = true, ep.relu = p.relu, ep.bias = ptr[3];
    ep.bias_type = elem(p.io[3].type), ep.bias_stride = p.io[3].strides[1];
  }
  // The output: y forward, dx backward data, dw backward filter.
  void* out = ptr[p.dir == Dir::Fwd ? 2 : p.dir == Dir::BwdData ? 0 : 1];
  const Dir dir = p.dir;
  const float a = p.alpha, b = p.beta;
  ::plx_emu::submit_library_call(
      handle->stream,
      [=] {
        if (need > 0) std::memset(ws, 0xA5, static_cast<size_t>(need));
        convolve(dir, g, a, b, ptr[0], ptr[1], ptr[2], out, rev, ep);
      },
      "cudnnBackendExecute");
  return CUDNN_STATUS_SUCCESS;
}
