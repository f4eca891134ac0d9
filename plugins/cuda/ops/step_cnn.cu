// CUDA: a small CNN's whole training step in two launches (the group find_small_cnn_steps()
// claims, ops/step_cnn.hpp): conv -> ReLU -> max-pool twice, a linear classifier with
// softmax cross-entropy, and all of their backward.
//
// Node by node (or as the smaller fused groups) simplecnn's step at batch 128 is 7 to 13
// launches of a few microseconds each, every activation written to memory by one and read back
// by the next (docs/benchmarks.md, the forty-fifth session). Here the first launch gives each
// image a block that keeps everything of that image in shared memory: the image, both layers'
// filters, the pooled outputs and their window taps, the second conv's output over the pooled
// region, the logits, and on the way back the gradients of the features, of the second conv's
// output and of the first pool's output. Per image it writes only what leaves the SM anyway:
// the pooled features and the linear's dx (the reshapes outside the group read them), its row
// loss and prediction, dlogits, and its share of the conv layers' weight and bias gradients.
// The second launch adds the images' gradient shares up (eight runs of images per parameter,
// then the runs in order), forms the linear's dw and db as sums over the images of dlogits times
// the features, and reduces the loss as ce_reduce does. Every sum has a fixed order:
// deterministic.
//
// The arithmetic is the nodes' (conv, ReLU, pool with relu_mask taps, the linear, log-sum-exp,
// ops/linear_ce.cu's cross-entropy and argmax), summed in other orders, so results agree with
// the node-by-node kernels to rounding. The pool's taps are the first maximum in window order
// (a NaN wins), kNoTap where the pooled value is not > 0: the ReLU's backward and the pool's in
// one, as relu_mask defines them (docs/ops.md). Index math divides through FastDiv (device.cuh).
// docs/kernels.md, "A small CNN's whole step", has the phases and the cost model.
#include <cmath>

#include "device.cuh"
#include "ops/ce_reduce.cuh"
#include "ops/step_cnn.hpp"

namespace plexus::cuda {

namespace {

using Reduction = sdk::LossReduction;

constexpr int kStepThreads = 512;  // 16 warps: one block per SM, so they hide its latencies
constexpr int kReduceThreads = 256;
constexpr unsigned char kNoTap = 255;

// conv2d (stride 1, no dilation, one group) -> ReLU -> max pool of window = stride, no padding.
struct Layer {
  int C, H, W;    // input channels and size
  int O, KH, KW;  // output channels and kernel
  int ph, pw;     // the conv's padding
  int qh, qw;     // the pool's window (and stride), at most kMaxWindow a side
  int PH, PW;     // pooled size; the conv's output is used over PH*qh x PW*qw
  // The index math's divisors (device.cuh: no integer divider on a GPU): the pooled plane PH·PW
  // and its row PW, the conv's output over the pooled region (PH·qh)·(PW·qw) and its row, a
  // filter's C·KH·KW and KH·KW and its row KW, and the input channels C.
  FastDiv plane, pw_row, out_plane, out_row, filter, taps, kw, chans;
};

// A window's tap, the position of its maximum: (ty << 4) | tx, kNoTap where the pool passes no
// gradient. Windows of up to 15 a side.
constexpr int kMaxWindow = 15;
__device__ __forceinline__ unsigned char tap_of(int ty, int tx) {
  return static_cast<unsigned char>((ty << 4) | tx);
}

struct StepArgs {
  const float* x;                      // (N, C, H, W)
  const float *w1, *b1, *w2, *b2;      // the conv layers' filters and biases
  const float *wl, *bl;                // the linear (classes, F) and (classes)
  const void* labels;                  // (N), L
  const float* dloss;                  // (): the loss's backward seed
  float* feat;                         // (N, F): the pooled features
  float* dx;                           // (N, F): the linear's dx, or null
  int64_t* pred;                       // (N), or null
  float* part;                         // (N, P): per image dw1, db1, dw2, db2
  float* dl;                           // (N, classes): dlogits
  float* row_loss;                     // (N)
  Layer l1, l2;
  int N, F, classes, P;
  int off_b1, off_w2, off_b2;          // in a row of `part` (dw1 at 0)
  // Shared memory, in floats from its start.
  int s_x, s_w1, s_b1, s_p1, s_t1, s_w2, s_b2, s_c2, s_t2, s_p2, s_z, s_dp2, s_dp1, s_live;
  long long ignore;
  float on, off;  // the target: on at the label, plus off everywhere
  bool smoothing, mean;
  DeviceErrorRecord* err;
};

__device__ __forceinline__ float relu_of(float v) {
  return v > 0.f || v != v ? v : 0.f;  // NaN passes, as the ReLU node's
}
// A pool window's running maximum, fed its values in window order: v at (ty, tx) takes it from
// best where it is the first, a NaN over a number, or strictly larger (the first maximum wins).
__device__ __forceinline__ void pool_take(float v, int ty, int tx, float& best, int& tap) {
  if (tap < 0 || (v != v ? best == best : v > best)) {
    best = v;
    tap = tap_of(ty, tx);
  }
}
// The kernels are instantiated for square kernels of K taps a side (K = 3: simplecnn's, whose
// tap loops then unroll) and for any kernel (K = 0: the layer's own sizes at run time).
template <int K>
__device__ __forceinline__ int kh_of(const Layer& L) {
  return K > 0 ? K : L.KH;
}
template <int K>
__device__ __forceinline__ int kw_of(const Layer& L) {
  return K > 0 ? K : L.KW;
}

// One output of layer L's conv at (oy, ox): `in` (C, H, W), `w` the output channel's (C, KH, KW).
template <int K>
__device__ __forceinline__ float conv_at(const float* in, const float* w, float bias,
                                         const Layer& L, int oy, int ox) {
  const int KH = kh_of<K>(L), KW = kw_of<K>(L);
  float acc = 0.f;
  for (int c = 0; c < L.C; ++c)
#pragma unroll
    for (int ky = 0; ky < KH; ++ky) {
      const int iy = oy - L.ph + ky;
      if (iy < 0 || iy >= L.H) continue;
      const float* row = in + (c * L.H + iy) * L.W;
      const float* wr = w + (c * KH + ky) * KW;
#pragma unroll
      for (int kx = 0; kx < KW; ++kx) {
        const int ix = ox - L.pw + kx;
        if (ix >= 0 && ix < L.W) acc = fmaf(row[ix], wr[kx], acc);
      }
    }
  return acc + bias;
}

// Layer L's conv -> ReLU -> 2x2 max pool at pooled (py, px), for 3x3 kernels without padding
// (simplecnn's layers): the window's four outputs from one 4x4 patch of each input channel, 25
// shared-memory loads for 36 multiply-adds instead of 72, each output summed in conv_at's order
// (the same bits). Within the pooled region the patch never leaves the input.
__device__ __forceinline__ void window2x2(const float* in, const float* w, float bias,
                                          const Layer& L, int py, int px, float& best, int& tap) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const float* src0 = in + py * 2 * L.W + px * 2;
  for (int c = 0; c < L.C; ++c) {
    const float* src = src0 + c * L.H * L.W;
    float pt[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) pt[i][j] = src[i * L.W + j];
    const float* wc = w + c * 9;
#pragma unroll
    for (int ky = 0; ky < 3; ++ky)
#pragma unroll
      for (int kx = 0; kx < 3; ++kx) {
        const float wv = wc[ky * 3 + kx];
        acc[0] = fmaf(pt[ky][kx], wv, acc[0]);
        acc[1] = fmaf(pt[ky][kx + 1], wv, acc[1]);
        acc[2] = fmaf(pt[ky + 1][kx], wv, acc[2]);
        acc[3] = fmaf(pt[ky + 1][kx + 1], wv, acc[3]);
      }
  }
  best = 0.f;
  tap = -1;
#pragma unroll
  for (int i = 0; i < 4; ++i) pool_take(relu_of(acc[i] + bias), i >> 1, i & 1, best, tap);
}

// Layer L's bias gradient for one image into bpart[0, O): each channel's pooled gradient dg
// (O, PH, PW), 0 where masked, summed in order.
__device__ __forceinline__ void bias_grads(const Layer& L, const float* dg, float* bpart) {
  const int plane = L.PH * L.PW;
  for (int o = threadIdx.x; o < L.O; o += blockDim.x) {
    float acc = 0.f;
    for (int p = 0; p < plane; ++p) acc += dg[o * plane + p];
    bpart[o] = acc;
  }
}

// The weight and bias gradients of layer L's conv for one image, into part[0, O*C*KH*KW) and
// bpart[0, O): dg (O, PH, PW) the pooled gradient (0 where masked), taps its windows' taps, `in`
// the layer's input (C, H, W). A thread per weight, summing over the windows in order.
template <int K>
__device__ __forceinline__ void conv_grads(const Layer& L, const float* dg, const unsigned char* taps,
                                           const float* in, float* part, float* bpart) {
  const int KW = kw_of<K>(L);
  const int wn = L.O * L.C * kh_of<K>(L) * KW, plane = L.PH * L.PW;
  for (int e = threadIdx.x; e < wn; e += blockDim.x) {
    int o, r, c, k, ky, kx;
    L.filter.divmod(e, o, r);
    L.taps.divmod(r, c, k);
    if constexpr (K > 0) ky = k / K, kx = k - ky * K;
    else L.kw.divmod(k, ky, kx);
    const float* inc = in + c * L.H * L.W;
    const float* g = dg + o * plane;
    const unsigned char* t = taps + o * plane;
    float acc = 0.f;
    for (int py = 0, win = 0; py < L.PH; ++py)
      for (int px = 0; px < L.PW; ++px, ++win) {
        const unsigned char tap = t[win];
        if (tap == kNoTap) continue;
        const int iy = py * L.qh + (tap >> 4) - L.ph + ky, ix = px * L.qw + (tap & 15) - L.pw + kx;
        if (iy >= 0 && iy < L.H && ix >= 0 && ix < L.W) acc = fmaf(g[win], inc[iy * L.W + ix], acc);
      }
    part[e] = acc;
  }
  bias_grads(L, dg, bpart);
}

// conv_grads for K x K kernels with a thread per (output, input) channel pair instead of per
// weight: each window's tap is decoded once for the K·K weights, held in registers, and the
// window's input patch read once. The same sums in the same order (the same bits); for layers
// with enough pairs to fill the block (simplecnn's second: 512).
template <int K>
__device__ __forceinline__ void conv_grads_pairs(const Layer& L, const float* dg,
                                                 const unsigned char* taps, const float* in,
                                                 float* part, float* bpart) {
  static_assert(K > 0, "a fixed kernel size");
  const int pairs = L.O * L.C, plane = L.PH * L.PW;
  for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
    int o, c;
    L.chans.divmod(e, o, c);
    const float* inc = in + c * L.H * L.W;
    const float* g = dg + o * plane;
    const unsigned char* t = taps + o * plane;
    float acc[K * K];
#pragma unroll
    for (int k = 0; k < K * K; ++k) acc[k] = 0.f;
    for (int py = 0, win = 0; py < L.PH; ++py)
      for (int px = 0; px < L.PW; ++px, ++win) {
        const unsigned char tap = t[win];
        if (tap == kNoTap) continue;
        const int y0 = py * L.qh + (tap >> 4) - L.ph, x0 = px * L.qw + (tap & 15) - L.pw;
        const float gv = g[win];
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
          const int iy = y0 + ky;
          if (iy < 0 || iy >= L.H) continue;
#pragma unroll
          for (int kx = 0; kx < K; ++kx) {
            const int ix = x0 + kx;
            if (ix >= 0 && ix < L.W) acc[ky * K + kx] = fmaf(gv, inc[iy * L.W + ix], acc[ky * K + kx]);
          }
        }
      }
#pragma unroll
    for (int k = 0; k < K * K; ++k) part[e * K * K + k] = acc[k];
  }
  bias_grads(L, dg, bpart);
}

// W: both layers are 3x3 without padding, pooled 2x2 (window2x2); K1 and K2 are then 3.
template <class L, int K1, int K2, bool W>
__global__ void __launch_bounds__(kStepThreads, 1) step_cnn_images(StepArgs a) {
  pdl_begin();
  extern __shared__ float sm[];
  __shared__ long long shared_count[32];
  __shared__ int live_count;
  const Layer& A = a.l1;
  const Layer& B = a.l2;
  const int n = static_cast<int>(blockIdx.x), t = static_cast<int>(threadIdx.x);
  const int T = static_cast<int>(blockDim.x);
  float* xs = sm + a.s_x;
  float* w1 = sm + a.s_w1;
  float* b1 = sm + a.s_b1;
  float* p1 = sm + a.s_p1;  // A's pooled output: B's input (B.C, B.H, B.W)
  unsigned char* t1 = reinterpret_cast<unsigned char*>(sm + a.s_t1);
  float* w2 = sm + a.s_w2;
  float* b2 = sm + a.s_b2;
  float* c2 = sm + a.s_c2;  // B's conv after the ReLU over the pooled region, later its gradient
  unsigned char* t2 = reinterpret_cast<unsigned char*>(sm + a.s_t2);
  float* p2 = sm + a.s_p2;    // the features (F)
  float* z = sm + a.s_z;      // the logits, then dlogits
  float* dp2 = sm + a.s_dp2;  // the features' gradient, masked by the taps
  float* dp1 = sm + a.s_dp1;  // p1's gradient, masked by the taps
  int* live = reinterpret_cast<int*>(sm + a.s_live);  // p1's elements with a gradient

  const int xn = A.C * A.H * A.W;
  for (int i = t; i < xn; i += T) xs[i] = a.x[static_cast<int64_t>(n) * xn + i];
  const int w1n = A.O * A.C * A.KH * A.KW, w2n = B.O * B.C * B.KH * B.KW;
  for (int i = t; i < w1n; i += T) w1[i] = a.w1[i];
  for (int i = t; i < w2n; i += T) w2[i] = a.w2[i];
  for (int i = t; i < A.O; i += T) b1[i] = a.b1 ? a.b1[i] : 0.f;
  for (int i = t; i < B.O; i += T) b2[i] = a.b2 ? a.b2[i] : 0.f;
  if (t == 0) live_count = 0;
  // The backward's scale of every row: dloss, or dloss / (rows not ignored) for mean, as the
  // fused head computes it (every block counts all the labels; block_sum's order is fixed).
  const L* labels = static_cast<const L*>(a.labels);
  float scale = a.dloss[0];
  if (a.mean) {
    long long count = 0;
    for (int i = t; i < a.N; i += T) count += static_cast<long long>(labels[i]) != a.ignore ? 1 : 0;
    count = block_sum(count, shared_count);
    scale = count > 0 ? scale / static_cast<float>(count) : 0.f;
  }
  __syncthreads();

  // Layer 1: conv, ReLU and pool, a thread per pooled output. The elements the pool passes a
  // gradient through are listed (in any order: each is computed alone below) for conv2's data
  // gradient, the others' gradient zeroed.
  const int p1n = A.O * A.PH * A.PW;
  for (int e = t; e < p1n; e += T) {
    int o, r, py, px;
    A.plane.divmod(e, o, r);
    A.pw_row.divmod(r, py, px);
    const float* wo = w1 + o * A.C * A.KH * A.KW;
    float best = 0.f;
    int tap = -1;
    if constexpr (W) {
      window2x2(xs, wo, b1[o], A, py, px, best, tap);
    } else {
      for (int ty = 0; ty < A.qh; ++ty)
        for (int tx = 0; tx < A.qw; ++tx)
          pool_take(relu_of(conv_at<K1>(xs, wo, b1[o], A, py * A.qh + ty, px * A.qw + tx)), ty, tx,
                    best, tap);
    }
    p1[e] = best;
    const bool passes = best > 0.f;
    t1[e] = passes ? static_cast<unsigned char>(tap) : kNoTap;
    if (passes) live[atomicAdd(&live_count, 1)] = e;
    else dp1[e] = 0.f;
  }
  __syncthreads();

  // Layer 2: a thread per pooled window (window2x2), or the conv and ReLU over the pooled region
  // (a thread per output) and then the pool.
  const int ch = B.PH * B.qh, cw = B.PW * B.qw, c2n = B.O * ch * cw, cplane = ch * cw;
  if constexpr (!W) {
    for (int e = t; e < c2n; e += T) {
      int o, r, y, x;
      B.out_plane.divmod(e, o, r);
      B.out_row.divmod(r, y, x);
      c2[e] = relu_of(conv_at<K2>(p1, w2 + o * B.C * B.KH * B.KW, b2[o], B, y, x));
    }
    __syncthreads();
  }
  float* feat = a.feat + static_cast<int64_t>(n) * a.F;
  for (int e = t; e < a.F; e += T) {
    int o, r, py, px;
    B.plane.divmod(e, o, r);
    B.pw_row.divmod(r, py, px);
    float best = 0.f;
    int tap = -1;
    if constexpr (W) {
      window2x2(p1, w2 + o * B.C * 9, b2[o], B, py, px, best, tap);
    } else {
      const float* co = c2 + o * cplane + py * B.qh * cw + px * B.qw;
      for (int ty = 0; ty < B.qh; ++ty)
        for (int tx = 0; tx < B.qw; ++tx) pool_take(co[ty * cw + tx], ty, tx, best, tap);
    }
    p2[e] = best;
    feat[e] = best;
    t2[e] = best > 0.f ? static_cast<unsigned char>(tap) : kNoTap;
  }
  __syncthreads();

  // The logits: a warp per class, each lane a strided slice of the features; c2 zeroed for the
  // unpooled gradient.
  for (int e = t; e < c2n; e += T) c2[e] = 0.f;
  const int lane = t & 31, warp = t >> 5, warps = T >> 5, C = a.classes;
  for (int c = warp; c < C; c += warps) {
    const float* wc = a.wl + static_cast<int64_t>(c) * a.F;
    float acc = 0.f;
    for (int f = lane; f < a.F; f += 32) acc = fmaf(p2[f], wc[f], acc);
    acc = warp_sum(acc);
    if (lane == 0) z[c] = a.bl ? acc + a.bl[c] : acc;
  }
  __syncthreads();

  // The cross-entropy, its argmax and its backward, in warp 0 (ops/linear_ce.cu's arithmetic).
  if (warp == 0) {
    const float lse = warp_log_sum_exp(z, C, lane);
    float lp_sum = 0.f;
    for (int k = lane; k < C; k += 32) lp_sum += z[k] - lse;
    if (a.smoothing) lp_sum = warp_sum(lp_sum);  // a kernel argument: uniform
    const long long l = static_cast<long long>(labels[n]);
    const bool ignored = l == a.ignore;
    const bool bad = !ignored && (l < 0 || l >= C);
    if (lane == 0) {
      float li = 0.f;
      if (bad) {
        report_error(a.err, kErrCrossEntropyLabel, n, l, C);
      } else if (!ignored) {
        li = -(a.on * (z[l] - lse));
        if (a.smoothing) li -= a.off * lp_sum;
      }
      a.row_loss[n] = li;
    }
    if (a.pred) {
      const long long bi = warp_argmax(z, C, lane);
      if (lane == 0) a.pred[n] = bi;
    }
    __syncwarp();  // lane 0 has read z at the label before dlogits replace the logits
    float* dl = a.dl + static_cast<int64_t>(n) * C;
    for (int k = lane; k < C; k += 32) {
      float v = 0.f;
      if (!ignored && !bad) v = scale * (expf(z[k] - lse) - a.off - (k == l ? a.on : 0.f));
      dl[k] = v;
      z[k] = v;
    }
  }
  __syncthreads();

  // The linear's dx (written for the reshape outside the group), masked by the taps into the
  // features' gradient (the ReLU's and the pool's backward) and put at its tap in the second
  // conv's gradient (windows do not overlap: one writer per element).
  for (int f = t; f < a.F; f += T) {
    float acc = 0.f;
    for (int c = 0; c < C; ++c) acc = fmaf(z[c], a.wl[static_cast<int64_t>(c) * a.F + f], acc);
    if (a.dx) a.dx[static_cast<int64_t>(n) * a.F + f] = acc;
    const unsigned char tap = t2[f];
    dp2[f] = tap != kNoTap ? acc : 0.f;
    if (tap != kNoTap) {
      int o, r, py, px;
      B.plane.divmod(f, o, r);
      B.pw_row.divmod(r, py, px);
      c2[o * cplane + (py * B.qh + (tap >> 4)) * cw + px * B.qw + (tap & 15)] = acc;
    }
  }
  __syncthreads();

  float* part = a.part + static_cast<int64_t>(n) * a.P;
  if constexpr (K2 > 0) conv_grads_pairs<K2>(B, dp2, t2, p1, part + a.off_w2, part + a.off_b2);
  else conv_grads<K2>(B, dp2, t2, p1, part + a.off_w2, part + a.off_b2);
  // p1's gradient (the second conv's data gradient) where the first pool passes one, dense
  // over the unpooled gradient.
  const int KH2 = kh_of<K2>(B), KW2 = kw_of<K2>(B);
  for (int i = t; i < live_count; i += T) {
    const int e = live[i];
    int c, r, y, x;
    A.plane.divmod(e, c, r);
    A.pw_row.divmod(r, y, x);
    float acc = 0.f;
    for (int o = 0; o < B.O; ++o)
#pragma unroll
      for (int ky = 0; ky < KH2; ++ky) {
        const int oy = y + B.ph - ky;
        if (oy < 0 || oy >= ch) continue;
        const float* gr = c2 + o * cplane + oy * cw;
        const float* wr = w2 + ((o * B.C + c) * KH2 + ky) * KW2;
#pragma unroll
        for (int kx = 0; kx < KW2; ++kx) {
          const int ox = x + B.pw - kx;
          if (ox >= 0 && ox < cw) acc = fmaf(gr[ox], wr[kx], acc);
        }
      }
    dp1[e] = acc;
  }
  __syncthreads();
  conv_grads<K1>(A, dp1, t1, xs, part, part + a.off_b1);
}

struct ReduceArgs {
  const float* part;      // (N, P)
  const float* dl;        // (N, classes)
  const float* feat;      // (N, F)
  const float* row_loss;  // (N)
  const void* labels;     // (N), L
  float *dw1, *db1, *dw2, *db2, *dwl, *dbl;  // each may be null (not written)
  float* loss;            // (), or null
  int N, P, F, classes, off_b1, off_w2, off_b2;
  long long ignore;
  bool mean;
};

// The images' sums: a block takes kReduceLanes parameters, a lane each, and its kReduceSlices
// warps a run of images each (a warp's lanes read kReduceLanes consecutive values of one image:
// one coalesced load), so a parameter's 128 images are 8 runs of 16 loads in flight rather
// than 128 in a row; then the runs' sums are added in run order. Deterministic. The last block
// reduces the loss.
constexpr int kReduceSlices = kReduceThreads / 32;
constexpr int kReduceLanes = 32;

template <class L>
__global__ void __launch_bounds__(kReduceThreads) step_cnn_reduce(ReduceArgs r) {
  pdl_begin();
  if (blockIdx.x == gridDim.x - 1) {  // uniform over the block: ce_reduce_block's barriers
    if (r.loss)
      ce_reduce_block<float, L>(r.row_loss, static_cast<const L*>(r.labels), r.loss, r.N, r.ignore,
                                r.mean);
    return;
  }
  __shared__ float runs[kReduceSlices][kReduceLanes];
  const int lane = static_cast<int>(threadIdx.x) & 31, slice = static_cast<int>(threadIdx.x) >> 5;
  const int e = static_cast<int>(blockIdx.x) * kReduceLanes + lane;
  const int lin = r.classes * r.F, total = r.P + lin + r.classes;
  const int per = (r.N + kReduceSlices - 1) / kReduceSlices;
  const int n0 = slice * per, n1 = min(r.N, n0 + per);
  float acc = 0.f;
  if (e < r.P) {
    for (int n = n0; n < n1; ++n) acc += r.part[static_cast<int64_t>(n) * r.P + e];
  } else if (e < r.P + lin) {
    const int k = e - r.P, c = k / r.F, f = k - c * r.F;
    for (int n = n0; n < n1; ++n)
      acc = fmaf(r.dl[static_cast<int64_t>(n) * r.classes + c], r.feat[static_cast<int64_t>(n) * r.F + f], acc);
  } else if (e < total) {
    const int c = e - r.P - lin;
    for (int n = n0; n < n1; ++n) acc += r.dl[static_cast<int64_t>(n) * r.classes + c];
  }
  runs[slice][lane] = acc;
  __syncthreads();
  if (slice != 0 || e >= total) return;
  float sum = runs[0][lane];
  for (int s = 1; s < kReduceSlices; ++s) sum += runs[s][lane];
  float* out;
  int at;
  if (e < r.off_b1) out = r.dw1, at = e;
  else if (e < r.off_w2) out = r.db1, at = e - r.off_b1;
  else if (e < r.off_b2) out = r.dw2, at = e - r.off_w2;
  else if (e < r.P) out = r.db2, at = e - r.off_b2;
  else if (e < r.P + lin) out = r.dwl, at = e - r.P;
  else out = r.dbl, at = e - r.P - lin;
  if (out) out[at] = sum;
}

// ---- the group ----

bool ints_are(const NodeInfo& node, const char* name, std::initializer_list<int64_t> want) {
  const std::vector<int64_t> v = node.attr_ints(name);
  return v.size() == want.size() && std::equal(v.begin(), v.end(), want.begin());
}

// The nodes of a group, found by op and checked link by link in the group's own view (where the
// two reshapes are not: the features and dx are checked by shape instead).
struct StepNodes {
  int32_t conv[2] = {-1, -1}, relu[2] = {-1, -1}, pool[2] = {-1, -1};
  int32_t linear = -1, ce = -1, argmax = -1, ce_bwd = -1, dx = -1, dw = -1, db = -1;
  int32_t pool_bwd[2] = {-1, -1}, data_bwd = -1, wgrad[2] = {-1, -1}, bgrad[2] = {-1, -1};
};

const char* kWhat = "small cnn step";

// Node n's input k is v.
bool reads(const sdk::GraphView& g, int32_t n, int32_t k, int32_t v) {
  return n >= 0 && g.node(n).num_inputs > k && g.node(n).inputs[k] == v;
}

StepNodes parse_step(const sdk::GraphView& g) {
  StepNodes s;
  std::vector<int32_t> convs, relus, pools, matmuls, sums, pool_bwds, wgrads;
  for (int32_t n = 0; n < g.num_nodes(); ++n) {
    const std::string_view op = g.node(n).op;
    if (op == "conv2d") convs.push_back(n);
    else if (op == "relu") relus.push_back(n);
    else if (op == "max_pool2d") pools.push_back(n);
    else if (op == "matmul") matmuls.push_back(n);
    else if (op == "sum") sums.push_back(n);
    else if (op == "max_pool2d_backward") pool_bwds.push_back(n);
    else if (op == "conv2d_backward_weight") wgrads.push_back(n);
    else if (op == "linear" && s.linear < 0) s.linear = n;
    else if (op == "softmax_cross_entropy" && s.ce < 0) s.ce = n;
    else if (op == "argmax" && s.argmax < 0) s.argmax = n;
    else if (op == "softmax_cross_entropy_backward" && s.ce_bwd < 0) s.ce_bwd = n;
    else if (op == "conv2d_backward_data" && s.data_bwd < 0) s.data_bwd = n;
    else PLX_DECLINE_UNLESS(false, "%s: node %d (%s) is not one of its", kWhat, n, g.node(n).op);
  }
  PLX_DECLINE_UNLESS(convs.size() == 2 && relus.size() == 2 && pools.size() == 2 &&
                         matmuls.size() == 2 && sums.size() == 3 && pool_bwds.size() == 2 &&
                         wgrads.size() == 2 && s.linear >= 0 && s.ce >= 0 && s.ce_bwd >= 0 &&
                         s.data_bwd >= 0,
                     "%s: not two conv layers with their backward and a classifier", kWhat);
  // Forward: conv -> relu -> pool, layer 1's pool read by layer 2's conv.
  for (int i = 0; i < 2; ++i) {
    const int32_t c = convs[static_cast<size_t>(i)];
    int32_t r = -1, p = -1;
    for (int32_t x : relus)
      if (reads(g, x, 0, g.node(c).outputs[0])) r = x;
    for (int32_t x : pools)
      if (r >= 0 && reads(g, x, 0, g.node(r).outputs[0])) p = x;
    PLX_DECLINE_UNLESS(p >= 0 && g.node(c).num_inputs >= 2 && g.node(p).num_outputs == 2,
                       "%s: conv2d %d is not followed by relu and max_pool2d", kWhat, c);
    s.conv[i] = c, s.relu[i] = r, s.pool[i] = p;
  }
  PLX_DECLINE_UNLESS(reads(g, s.conv[1], 0, g.node(s.pool[0]).outputs[0]),
                     "%s: the second conv does not read the first pool", kWhat);
  // The head and its backward.
  const plx_graph_node& ce = g.node(s.ce);
  const plx_graph_node& lin = g.node(s.linear);
  PLX_DECLINE_UNLESS(ce.num_inputs == 2 && ce.num_outputs == 2 && lin.num_outputs == 1 &&
                         lin.num_inputs >= 2 && ce.inputs[0] == lin.outputs[0],
                     "%s: the cross-entropy does not read the linear", kWhat);
  if (s.argmax >= 0)
    PLX_DECLINE_UNLESS(reads(g, s.argmax, 0, lin.outputs[0]) && sdk::detail::argmax_over_classes(g, s.argmax),
                       "%s: the argmax is not over the logits' classes", kWhat);
  const plx_graph_node& bw = g.node(s.ce_bwd);
  PLX_DECLINE_UNLESS(bw.num_inputs == 3 && bw.num_outputs == 1 && bw.inputs[1] == ce.outputs[1] &&
                         bw.inputs[2] == ce.inputs[1] && sdk::same_attrs(ce, bw),
                     "%s: the backward is not the cross-entropy's", kWhat);
  const int32_t dl = bw.outputs[0], xf = lin.inputs[0];
  for (int32_t m : matmuls) {
    if (sdk::detail::linear_dx_matmul(g, m, dl, lin.inputs[1])) s.dx = m;
    else if (reads(g, m, 0, dl) && reads(g, m, 1, xf) && sdk::detail::int_attr_or(g, m, "trans_a", 0) == 1 &&
             sdk::detail::int_attr_or(g, m, "trans_b", 0) == 0 && g.node(m).num_inputs == 2) {
      const plx_attr* alpha = g.find_attr(m, "alpha");
      if (!alpha || (alpha->type == PLX_ATTR_FLOAT && alpha->f == 1.0)) s.dw = m;
    }
  }
  for (int32_t m : sums)
    if (sdk::detail::linear_db_sum(g, m, dl)) s.db = m;
  PLX_DECLINE_UNLESS(s.dx >= 0 && s.dw >= 0 && s.db >= 0 && lin.num_inputs >= 3 && g.valid(lin.inputs[2]),
                     "%s: the linear's bias, dx, dw or db is missing", kWhat);
  // Backward of the conv layers: pool_bwd(dy, the forward pool's taps) read by the conv's
  // gradients; layer 2's data gradient is layer 1's pool_bwd's dy.
  for (int i = 0; i < 2; ++i) {
    for (int32_t p : pool_bwds)
      if (reads(g, p, 1, g.node(s.pool[i]).outputs[1])) s.pool_bwd[i] = p;
    PLX_DECLINE_UNLESS(s.pool_bwd[i] >= 0, "%s: no backward of pool %d", kWhat, s.pool[i]);
    const int32_t v = g.node(s.pool_bwd[i]).outputs[0];
    const int32_t x = g.node(s.conv[i]).inputs[0];
    for (int32_t w : wgrads)
      if (reads(g, w, 0, v) && reads(g, w, 1, x)) s.wgrad[i] = w;
    for (int32_t m : sums)
      if (reads(g, m, 0, v) && sdk::detail::bias_grad_sum(g, m)) s.bgrad[i] = m;
    PLX_DECLINE_UNLESS(s.wgrad[i] >= 0 && s.bgrad[i] >= 0 && g.node(s.conv[i]).num_inputs >= 3 &&
                           g.valid(g.node(s.conv[i]).inputs[2]),
                       "%s: layer %d's bias, weight or bias gradient is missing", kWhat, i + 1);
  }
  PLX_DECLINE_UNLESS(reads(g, s.data_bwd, 0, g.node(s.pool_bwd[1]).outputs[0]) &&
                         reads(g, s.data_bwd, 1, g.node(s.conv[1]).inputs[1]) &&
                         reads(g, s.pool_bwd[0], 0, g.node(s.data_bwd).outputs[0]),
                     "%s: the second conv's data gradient does not link the layers", kWhat);
  return s;
}

Layer layer_of(const sdk::GraphView& g, int32_t conv, int32_t pool) {
  const sdk::OwnedNodeInfo ci(g, conv), pi(g, pool);
  const NodeInfo cn(&ci.get()), pn(&pi.get());
  const plx_tensor& x = g.value(g.node(conv).inputs[0]);
  const plx_tensor& w = g.value(g.node(conv).inputs[1]);
  const plx_tensor& y = g.value(g.node(pool).outputs[0]);
  PLX_DECLINE_UNLESS(x.ndim == 4 && w.ndim == 4 && y.ndim == 4, "%s: 4-D tensors expected", kWhat);
  const sdk::Conv2dParams p(x.shape, w.shape, cn);
  PLX_DECLINE_UNLESS(p.sh == 1 && p.sw == 1 && p.dh == 1 && p.dw == 1 && p.groups == 1,
                     "%s: convolutions of stride 1, dilation 1 and one group only", kWhat);
  const std::vector<int64_t> k = pn.attr_ints("kernel");
  std::vector<int64_t> st = pn.attr_ints("stride");
  if (st.empty()) st = k;
  PLX_DECLINE_UNLESS(k.size() == 2 && st == k && ints_are(pn, "padding", {0, 0}) &&
                         ints_are(pn, "dilation", {1, 1}) && pn.attr_int("ceil_mode") == 0 &&
                         pn.attr_int("relu_mask") == 1,
                     "%s: pools of window = stride, no padding, floor, relu_mask only", kWhat);
  Layer L{};
  L.C = static_cast<int>(p.C), L.H = static_cast<int>(p.H), L.W = static_cast<int>(p.W);
  L.O = static_cast<int>(p.O), L.KH = static_cast<int>(p.KH), L.KW = static_cast<int>(p.KW);
  L.ph = static_cast<int>(p.ph), L.pw = static_cast<int>(p.pw);
  L.qh = static_cast<int>(k[0]), L.qw = static_cast<int>(k[1]);
  L.PH = static_cast<int>(p.OH / k[0]), L.PW = static_cast<int>(p.OW / k[1]);
  PLX_DECLINE_UNLESS(L.PH >= 1 && L.PW >= 1 && y.shape[2] == L.PH && y.shape[3] == L.PW &&
                         y.shape[1] == L.O,
                     "%s: the pool's output is not the conv's pooled", kWhat);
  PLX_DECLINE_UNLESS(L.qh <= kMaxWindow && L.qw <= kMaxWindow, "%s: pool windows over %d a side",
                     kWhat, kMaxWindow);
  L.plane = FastDiv(int64_t{L.PH} * L.PW);
  L.pw_row = FastDiv(L.PW);
  L.out_plane = FastDiv(int64_t{L.PH} * L.qh * L.PW * L.qw);
  L.out_row = FastDiv(int64_t{L.PW} * L.qw);
  L.filter = FastDiv(int64_t{L.C} * L.KH * L.KW);
  L.taps = FastDiv(int64_t{L.KH} * L.KW);
  L.kw = FastDiv(L.KW);
  L.chans = FastDiv(L.C);
  return L;
}

template <class L, int K1, int K2, bool W>
void launch_step(const StepArgs& a, const ReduceArgs& r, unsigned reduce_grid, uint64_t smem,
                 cudaStream_t stream) {
  if (smem > 48 * 1024) allow_dynamic_smem(step_cnn_images<L, K1, K2, W>, static_cast<int>(smem));
  launch_kernel(step_cnn_images<L, K1, K2, W>, static_cast<unsigned>(a.N), kStepThreads, smem, stream, a);
  launch_kernel(step_cnn_reduce<L>, reduce_grid, kReduceThreads, 0, stream, r);
}

class SmallCnnStep final : public Kernel {
 public:
  SmallCnnStep(CudaBackend& backend, const sdk::GraphView& g, const sdk::Boundary& b)
      : device_(g.device()) {
    const StepNodes s = parse_step(g);
    // Every value f32 but the labels and the prediction; 4-D ones contiguous (NCHW).
    for (int32_t n = 0; n < g.num_nodes(); ++n) {
      const plx_graph_node& node = g.node(n);
      for (int32_t k = 0; k < node.num_inputs; ++k) {
        const int32_t v = node.inputs[k];
        if (!g.valid(v) || (n == s.ce && k == 1) || (n == s.ce_bwd && k == 2)) continue;
        const bool taps = (n == s.pool_bwd[0] || n == s.pool_bwd[1]) && k == 1;
        PLX_DECLINE_UNLESS(taps || g.value(v).dtype == PLX_F32, "%s: f32 only (%s's input %d)",
                           kWhat, node.op, k);
        PLX_DECLINE_UNLESS(sdk::is_contiguous(g.value(v)), "%s: contiguous tensors only", kWhat);
      }
      for (int32_t k = 0; k < node.num_outputs; ++k)
        PLX_DECLINE_UNLESS(sdk::is_contiguous(g.value(node.outputs[k])),
                           "%s: contiguous tensors only", kWhat);
    }
    l1_ = layer_of(g, s.conv[0], s.pool[0]);
    l2_ = layer_of(g, s.conv[1], s.pool[1]);
    PLX_DECLINE_UNLESS(l2_.C == l1_.O && l2_.H == l1_.PH && l2_.W == l1_.PW,
                       "%s: the layers do not chain", kWhat);
    const plx_tensor& x = g.value(g.node(s.conv[0]).inputs[0]);
    n_ = static_cast<int>(x.shape[0]);
    f_ = l2_.O * l2_.PH * l2_.PW;
    const plx_tensor& wl = g.value(g.node(s.linear).inputs[1]);
    const plx_tensor& xf = g.value(g.node(s.linear).inputs[0]);
    PLX_DECLINE_UNLESS(wl.ndim == 2 && xf.ndim == 2 && xf.shape[0] == n_ && xf.shape[1] == f_ &&
                           wl.shape[1] == f_,
                       "%s: the linear does not read the flattened features", kWhat);
    classes_ = static_cast<int>(wl.shape[0]);
    PLX_DECLINE_UNLESS(n_ >= 1 && classes_ >= 1, "%s: an empty batch or no classes", kWhat);
    // The reshape of dx that the second pool's backward reads is dx's shape as the features'.
    const plx_tensor& dy2 = g.value(g.node(s.pool_bwd[1]).inputs[0]);
    PLX_DECLINE_UNLESS(dy2.ndim == 4 && numel(dy2) == int64_t{n_} * f_ && dy2.shape[1] == l2_.O,
                       "%s: the second pool's backward does not read the linear's dx", kWhat);
    const sdk::OwnedNodeInfo ci(g, s.ce);
    const NodeInfo cen(&ci.get());
    const sdk::CrossEntropyParams p(cen, g.value(g.node(s.ce).inputs[0]));
    PLX_DECLINE_UNLESS(p.reduction != Reduction::kNone, "%s: reduction none", kWhat);
    mean_ = p.reduction == Reduction::kMean;
    ignore_ = static_cast<long long>(p.ignore_index);
    on_ = static_cast<float>(1 - p.smoothing);
    off_ = static_cast<float>(p.smoothing / static_cast<double>(p.c));
    smoothing_ = p.smoothing != 0;
    label_dtype_ = static_cast<plx_dtype>(g.value(g.node(s.ce).inputs[1]).dtype);
    PLX_DECLINE_UNLESS(label_dtype_ == PLX_I32 || label_dtype_ == PLX_I64, "%s: i32 or i64 labels",
                       kWhat);

    // Where create_fused's boundary puts everything. Inputs: only the ones the kernel reads.
    auto in = [&](int32_t node, int32_t k) {
      const int32_t slot = b.input(g.node(node).inputs[k]);
      PLX_DECLINE_UNLESS(slot >= 0, "%s: %s's input %d is made inside the group", kWhat,
                         g.node(node).op, k);
      return slot;
    };
    in_x_ = in(s.conv[0], 0);
    in_w1_ = in(s.conv[0], 1), in_b1_ = in(s.conv[0], 2);
    in_w2_ = in(s.conv[1], 1), in_b2_ = in(s.conv[1], 2);
    in_wl_ = in(s.linear, 1), in_bl_ = in(s.linear, 2);
    in_labels_ = in(s.ce, 1), in_dloss_ = in(s.ce_bwd, 0);
    PLX_DECLINE_UNLESS(numel(g.value(g.node(s.ce_bwd).inputs[0])) == 1, "%s: dloss is not a scalar",
                       kWhat);
    // Outputs: each must be one the kernel writes.
    const int32_t feat_v = g.node(s.pool[1]).outputs[0];
    const int32_t known[] = {
        g.node(s.ce).outputs[0], s.argmax >= 0 ? g.node(s.argmax).outputs[0] : -1,
        g.node(s.wgrad[0]).outputs[0], g.node(s.bgrad[0]).outputs[0],
        g.node(s.wgrad[1]).outputs[0], g.node(s.bgrad[1]).outputs[0],
        g.node(s.dw).outputs[0], g.node(s.db).outputs[0], feat_v, g.node(s.dx).outputs[0]};
    int32_t* slots[] = {&out_loss_, &out_pred_, &out_dw1_, &out_db1_, &out_dw2_,
                        &out_db2_,  &out_dwl_,  &out_dbl_, &out_feat_, &out_dx_};
    for (int32_t k = 0; k < static_cast<int32_t>(b.outputs().size()); ++k) {
      const int32_t v = b.outputs()[static_cast<size_t>(k)];
      const int32_t* at = std::find(std::begin(known), std::end(known), v);
      PLX_DECLINE_UNLESS(at != std::end(known), "%s: value %d is needed outside the group", kWhat, v);
      *slots[at - std::begin(known)] = k;
    }
    if (out_pred_ >= 0)
      PLX_DECLINE_UNLESS(g.value(g.node(s.argmax).outputs[0]).dtype == PLX_I64,
                         "%s: the argmax's output is not i64", kWhat);
    PLX_DECLINE_UNLESS(g.value(g.node(s.ce).outputs[0]).ndim == 0, "%s: the loss is not a scalar", kWhat);

    // Shared memory, in floats (the taps, a byte each, rounded up to whole floats).
    const Layer& A = l1_;
    const Layer& B = l2_;
    int at = 0;
    auto take = [&](int floats) {
      const int off = at;
      at += (floats + 3) / 4 * 4;  // 16-byte aligned regions
      return off;
    };
    const int p1n = A.O * A.PH * A.PW;
    s_x_ = take(A.C * A.H * A.W);
    s_w1_ = take(A.O * A.C * A.KH * A.KW);
    s_b1_ = take(A.O);
    s_p1_ = take(p1n);
    s_t1_ = take((p1n + 3) / 4);
    s_w2_ = take(B.O * B.C * B.KH * B.KW);
    s_b2_ = take(B.O);
    s_c2_ = take(B.O * B.PH * B.qh * B.PW * B.qw);
    s_t2_ = take((f_ + 3) / 4);
    s_p2_ = take(f_);
    s_z_ = take(classes_);
    s_dp2_ = take(f_);
    s_dp1_ = take(p1n);
    s_live_ = take(p1n);  // ints
    smem_ = static_cast<uint64_t>(at) * sizeof(float);
    const DeviceContext& ctx = backend.context(device_);
    // Static shared memory (block_sum's and the live count: 272 to 1,296 bytes as nvcc 13 builds
    // it, cuobjdump --dump-resource-usage) beside the dynamic.
    PLX_DECLINE_UNLESS(smem_ + 4096 <= ctx.prop.sharedMemPerBlockOptin,
                       "%s: an image needs %llu bytes of shared memory, over the device's %llu",
                       kWhat, static_cast<unsigned long long>(smem_),
                       static_cast<unsigned long long>(ctx.prop.sharedMemPerBlockOptin));
    err_ = ctx.error_dev;
    off_b1_ = A.O * A.C * A.KH * A.KW;
    off_w2_ = off_b1_ + A.O;
    off_b2_ = off_w2_ + B.O * B.C * B.KH * B.KW;
    p_ = off_b2_ + B.O;
    PLX_DECLINE_UNLESS(int64_t{n_} * std::max(p_, f_) < INT32_MAX &&
                           int64_t{p_} + int64_t{classes_} * (f_ + 1) < INT32_MAX,
                       "%s: too large", kWhat);
    auto bytes = [](int64_t floats) { return (static_cast<uint64_t>(floats) * 4 + 255) / 256 * 256; };
    ws_part_ = bytes(int64_t{n_} * p_);
    ws_dl_ = bytes(int64_t{n_} * classes_);
    ws_loss_ = bytes(n_);
    ws_feat_ = out_feat_ >= 0 ? 0 : bytes(int64_t{n_} * f_);
  }

  uint64_t workspace_bytes() const override { return ws_part_ + ws_dl_ + ws_loss_ + ws_feat_; }

  void compute(const KernelCall& c) override {
    use_device(device_);
    auto out = [&](int32_t slot) { return slot >= 0 ? static_cast<float*>(c.out(slot).data) : nullptr; };
    auto* ws = static_cast<unsigned char*>(c.workspace);
    StepArgs a{};
    a.x = static_cast<const float*>(c.in(in_x_).data);
    a.w1 = static_cast<const float*>(c.in(in_w1_).data);
    a.b1 = static_cast<const float*>(c.in(in_b1_).data);
    a.w2 = static_cast<const float*>(c.in(in_w2_).data);
    a.b2 = static_cast<const float*>(c.in(in_b2_).data);
    a.wl = static_cast<const float*>(c.in(in_wl_).data);
    a.bl = static_cast<const float*>(c.in(in_bl_).data);
    a.labels = c.in(in_labels_).data;
    a.dloss = static_cast<const float*>(c.in(in_dloss_).data);
    a.part = reinterpret_cast<float*>(ws);
    a.dl = reinterpret_cast<float*>(ws + ws_part_);
    a.row_loss = reinterpret_cast<float*>(ws + ws_part_ + ws_dl_);
    a.feat = out_feat_ >= 0 ? out(out_feat_) : reinterpret_cast<float*>(ws + ws_part_ + ws_dl_ + ws_loss_);
    a.dx = out(out_dx_);
    a.pred = out_pred_ >= 0 ? static_cast<int64_t*>(c.out(out_pred_).data) : nullptr;
    a.l1 = l1_, a.l2 = l2_;
    a.N = n_, a.F = f_, a.classes = classes_, a.P = p_;
    a.off_b1 = off_b1_, a.off_w2 = off_w2_, a.off_b2 = off_b2_;
    a.s_x = s_x_, a.s_w1 = s_w1_, a.s_b1 = s_b1_, a.s_p1 = s_p1_, a.s_t1 = s_t1_;
    a.s_w2 = s_w2_, a.s_b2 = s_b2_, a.s_c2 = s_c2_, a.s_t2 = s_t2_, a.s_p2 = s_p2_;
    a.s_z = s_z_, a.s_dp2 = s_dp2_, a.s_dp1 = s_dp1_, a.s_live = s_live_;
    a.ignore = ignore_, a.on = on_, a.off = off_, a.smoothing = smoothing_, a.mean = mean_;
    a.err = err_;
    ReduceArgs r{};
    r.part = a.part, r.dl = a.dl, r.feat = a.feat, r.row_loss = a.row_loss, r.labels = a.labels;
    r.dw1 = out(out_dw1_), r.db1 = out(out_db1_), r.dw2 = out(out_dw2_), r.db2 = out(out_db2_);
    r.dwl = out(out_dwl_), r.dbl = out(out_dbl_), r.loss = out(out_loss_);
    r.N = n_, r.P = p_, r.F = f_, r.classes = classes_;
    r.off_b1 = off_b1_, r.off_w2 = off_w2_, r.off_b2 = off_b2_;
    r.ignore = ignore_, r.mean = mean_;
    const int64_t elems = int64_t{p_} + int64_t{classes_} * (f_ + 1);
    const auto grid = static_cast<unsigned>((elems + kReduceLanes - 1) / kReduceLanes + 1);
    const cudaStream_t stream = native(c.stream);
    // 3x3 kernels in both layers unrolled, and without padding and with 2x2 pools (simplecnn)
    // a window at a time; any others at run time.
    const bool k3 = l1_.KH == 3 && l1_.KW == 3 && l2_.KH == 3 && l2_.KW == 3;
    auto window = [](const Layer& L) { return L.ph == 0 && L.pw == 0 && L.qh == 2 && L.qw == 2; };
    const bool w = k3 && window(l1_) && window(l2_);
    if (label_dtype_ == PLX_I32) {
      if (w) launch_step<int32_t, 3, 3, true>(a, r, grid, smem_, stream);
      else if (k3) launch_step<int32_t, 3, 3, false>(a, r, grid, smem_, stream);
      else launch_step<int32_t, 0, 0, false>(a, r, grid, smem_, stream);
    } else {
      if (w) launch_step<int64_t, 3, 3, true>(a, r, grid, smem_, stream);
      else if (k3) launch_step<int64_t, 3, 3, false>(a, r, grid, smem_, stream);
      else launch_step<int64_t, 0, 0, false>(a, r, grid, smem_, stream);
    }
  }

 private:
  int32_t device_;
  Layer l1_{}, l2_{};
  int n_ = 0, f_ = 0, classes_ = 0, p_ = 0, off_b1_ = 0, off_w2_ = 0, off_b2_ = 0;
  bool mean_ = true, smoothing_ = false;
  long long ignore_ = -100;
  float on_ = 1, off_ = 0;
  plx_dtype label_dtype_ = PLX_I32;
  int32_t in_x_ = -1, in_w1_ = -1, in_b1_ = -1, in_w2_ = -1, in_b2_ = -1, in_wl_ = -1, in_bl_ = -1;
  int32_t in_labels_ = -1, in_dloss_ = -1;
  int32_t out_loss_ = -1, out_pred_ = -1, out_dw1_ = -1, out_db1_ = -1, out_dw2_ = -1, out_db2_ = -1;
  int32_t out_dwl_ = -1, out_dbl_ = -1, out_feat_ = -1, out_dx_ = -1;
  int s_x_ = 0, s_w1_ = 0, s_b1_ = 0, s_p1_ = 0, s_t1_ = 0, s_w2_ = 0, s_b2_ = 0, s_c2_ = 0;
  int s_t2_ = 0, s_p2_ = 0, s_z_ = 0, s_dp2_ = 0, s_dp1_ = 0, s_live_ = 0;
  uint64_t smem_ = 0, ws_part_ = 0, ws_dl_ = 0, ws_loss_ = 0, ws_feat_ = 0;
  DeviceErrorRecord* err_ = nullptr;
};

// A group may run where its last node runs: no node between its first and last outside it reads
// what it writes, the reshapes (views, which run nothing) aside.
bool runs_at_last_but_views(const sdk::GraphView& g, const std::vector<int32_t>& nodes) {
  for (int32_t k = nodes.front() + 1; k < nodes.back(); ++k) {
    if (std::binary_search(nodes.begin(), nodes.end(), k) || g.is(k, "reshape")) continue;
    const plx_graph_node& other = g.node(k);
    for (int32_t i = 0; i < other.num_inputs; ++i) {
      const int32_t v = other.inputs[i];
      if (g.valid(v) && g.producer(v) >= 0 && std::binary_search(nodes.begin(), nodes.end(), g.producer(v)))
        return false;
    }
  }
  return true;
}

// The one reshape reading v, and what it makes; -1 if v has another reader.
int32_t only_reshape_of(const sdk::GraphView& g, int32_t v) {
  const auto& rd = g.readers(v);
  if (rd.size() != 1 || !g.is(rd[0], "reshape") || g.node(rd[0]).num_outputs != 1) return -1;
  return g.node(rd[0]).outputs[0];
}

}  // namespace

std::vector<std::vector<int32_t>> find_small_cnn_steps(const sdk::GraphView& g) {
  std::vector<std::vector<int32_t>> steps;
  const auto fwd = sdk::find_conv_max_pool(g);
  const auto bwd = sdk::find_max_pool_conv_backward(g);
  auto group_with = [](const std::vector<std::vector<int32_t>>& groups, int32_t n, size_t size) {
    for (const auto& grp : groups)
      if (grp.size() == size && std::find(grp.begin(), grp.end(), n) != grp.end()) return &grp;
    return static_cast<const std::vector<int32_t>*>(nullptr);
  };
  for (const auto& head : sdk::find_linear_cross_entropy(g, /*linear_backward=*/true)) {
    // The largest group: linear, cross-entropy, [argmax,] backward, dx, db.
    const std::vector<int32_t>& h = head.groups.front();
    int32_t lin = -1, ce = -1, bw = -1, dx = -1, db = -1;
    bool other = false;  // a cast: mixed precision
    for (int32_t n : h) {
      if (g.is(n, "linear")) lin = n;
      else if (g.is(n, "softmax_cross_entropy")) ce = n;
      else if (g.is(n, "softmax_cross_entropy_backward")) bw = n;
      else if (g.is(n, "matmul")) dx = n;
      else if (g.is(n, "sum")) db = n;
      else if (!g.is(n, "argmax")) other = true;
    }
    if (other || lin < 0 || ce < 0 || bw < 0 || dx < 0 || db < 0) continue;
    if (g.value(g.node(lin).inputs[0]).dtype != PLX_F32) continue;
    // The features: a reshape of the second layer's pool, and dx reshaped back for its backward.
    const int32_t xf = g.node(lin).inputs[0];
    const int32_t r1 = g.producer(xf);
    if (r1 < 0 || !g.is(r1, "reshape") || g.node(r1).num_inputs != 1) continue;
    const int32_t pool2 = g.producer(g.node(r1).inputs[0]);
    const auto* f2 = pool2 >= 0 ? group_with(fwd, pool2, 3) : nullptr;
    if (!f2) continue;
    const int32_t pool1 = g.producer(g.node(f2->front()).inputs[0]);
    const auto* f1 = pool1 >= 0 ? group_with(fwd, pool1, 3) : nullptr;
    if (!f1) continue;
    // dw: the other reader of dlogits.
    const int32_t dl = g.node(bw).outputs[0];
    int32_t dw = -1;
    for (int32_t r : g.readers(dl))
      if (r != dx && r != db && g.is(r, "matmul")) dw = r;
    if (dw < 0 || g.readers(dl).size() != 3) continue;
    const int32_t dxv = only_reshape_of(g, g.node(dx).outputs[0]);
    if (dxv < 0 || g.readers(dxv).size() != 1) continue;
    const auto* b2 = group_with(bwd, g.readers(dxv)[0], 4);
    if (!b2) continue;
    int32_t data = -1;
    for (int32_t n : *b2)
      if (g.is(n, "conv2d_backward_data")) data = n;
    if (data < 0 || g.readers(g.node(data).outputs[0]).size() != 1) continue;
    const auto* b1 = group_with(bwd, g.readers(g.node(data).outputs[0])[0], 3);
    if (!b1) continue;
    std::vector<int32_t> nodes = h;
    nodes.push_back(dw);
    for (const auto* grp : {f1, f2, b2, b1}) nodes.insert(nodes.end(), grp->begin(), grp->end());
    std::sort(nodes.begin(), nodes.end());
    if (std::adjacent_find(nodes.begin(), nodes.end()) != nodes.end()) continue;
    if (runs_at_last_but_views(g, nodes)) steps.push_back(std::move(nodes));
  }
  return steps;
}

std::unique_ptr<Kernel> make_small_cnn_step(CudaBackend& backend, const sdk::GraphView& g,
                                            const sdk::Boundary& b) {
  return std::make_unique<SmallCnnStep>(backend, g, b);
}

}  // namespace plexus::cuda
