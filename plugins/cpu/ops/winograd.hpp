// Winograd's minimal filtering F(2x2, 3x3) for the CPU plugin's 3x3, stride-1 convolutions: the
// per-node candidates of ops/conv_winograd.cpp and the conv + pool fusions of ops/conv_pool.cpp
// run an image at a time through the functions below.
//
// Each 2x2 block of outputs ("tile") is computed from the 4x4 block of input under it as
//   y = Aᵀ [ Σ_c (G g_oc Gᵀ) ⊙ (Bᵀ d_c B) ] A
// (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016), with
//   Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1],
//   Aᵀ = [1 1 1 0; 0 1 -1 -1].
// The sum over input channels is 16 GEMMs, one per position ξ of the 4x4 transformed tile:
//   M[ξ] (out, tiles) = U[ξ] (out, in) · V[ξ] (in, tiles),
// 16 multiply-adds per input channel per tile where the im2col GEMM does 36 (2.25x fewer), and
// no unfolded image: the input transform writes 4 values per input element against im2col's 9.
// On this plugin's machines the GEMMs of the models' 32- and 64-channel layers still run at
// OpenBLAS's full rate, so the saving is nearly all kept (docs/benchmarks.md).
//
// The data gradient of a 3x3 stride-1 convolution is itself one: dx = conv(dy, w′) with w′ the
// weight transposed (C, O) and turned by 180 degrees, and padding 2 − p. So the same loops run
// it, `backward` choosing how U is built from w.
//
// Numerics: the transforms add and halve (exact up to rounding of the sums), and each output is
// a different sum of the same products than the direct loop's, so results agree with im2col's
// to a few units of f32 rounding, not to the bit. f64 stays on im2col (the reference for
// gradient checks); 16-bit types are loaded into f32 and each output rounded once.
#pragma once

#include "common.hpp"

namespace plexus::cpu::winograd {

// The shape of one F(2x2, 3x3) problem: `in` channels of IH x IW planes to `out` channels of
// OH x OW, the input zero-padded by ph, pw.
struct Plan {
  int64_t in = 0, out = 0;
  int64_t IH = 0, IW = 0, OH = 0, OW = 0, ph = 0, pw = 0;
  int64_t TH = 0, TW = 0, T = 0;  // tiles of 2x2 outputs: rows, columns, all
  int64_t PH = 0, PW = 0;         // the padded plane the tiles read: (2·TH + 2) x (2·TW + 2)
  bool backward = false;          // the data gradient: U from w transposed and turned

  // The forward convolution of `g` (backward = false) or its data gradient (true). Declines what
  // F(2x2, 3x3) does not compute: other kernel sizes, strides, dilations, groups, and (for the
  // data gradient) padding beyond 2.
  static Plan make(const sdk::Conv2dParams& g, bool backward) {
    PLX_DECLINE_UNLESS(g.KH == 3 && g.KW == 3, "a %lldx%lld kernel; Winograd F(2x2, 3x3) is for 3x3",
                       static_cast<long long>(g.KH), static_cast<long long>(g.KW));
    PLX_DECLINE_UNLESS(g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1,
                       "stride %lldx%lld, dilation %lldx%lld; Winograd takes stride and dilation 1",
                       static_cast<long long>(g.sh), static_cast<long long>(g.sw),
                       static_cast<long long>(g.dh), static_cast<long long>(g.dw));
    PLX_DECLINE_UNLESS(g.groups == 1, "groups = %lld; Winograd takes ungrouped convolutions",
                       static_cast<long long>(g.groups));
    Plan p;
    p.backward = backward;
    if (!backward) {
      p.in = g.C, p.out = g.O, p.IH = g.H, p.IW = g.W, p.OH = g.OH, p.OW = g.OW;
      p.ph = g.ph, p.pw = g.pw;
    } else {
      PLX_DECLINE_UNLESS(g.ph <= 2 && g.pw <= 2,
                         "padding %lldx%lld; the data gradient by Winograd takes at most 2",
                         static_cast<long long>(g.ph), static_cast<long long>(g.pw));
      p.in = g.O, p.out = g.C, p.IH = g.OH, p.IW = g.OW, p.OH = g.H, p.OW = g.W;
      p.ph = 2 - g.ph, p.pw = 2 - g.pw;
    }
    p.TH = (p.OH + 1) / 2, p.TW = (p.OW + 1) / 2, p.T = p.TH * p.TW;
    p.PH = 2 * p.TH + 2, p.PW = 2 * p.TW + 2;
    return p;
  }

  // Floats of the transformed weight U (16, out, in).
  int64_t weight_floats() const { return 16 * out * in; }
  // Floats of one worker's scratch: the padded plane, V (16, in, T) and M (16, out, T).
  int64_t scratch_floats() const { return PH * PW + 16 * in * T + 16 * out * T; }
  // That scratch carved: the padded plane (PH, PW), V (16, in, T), and M (16, out, T), which the
  // weight gradient uses for its Y.
  struct Parts {
    float *pad, *V, *M;
  };
  Parts parts(float* scratch) const {
    float* V = scratch + PH * PW;
    return {scratch, V, V + 16 * in * T};
  }
};

// U[ξ] (out, in) = G g Gᵀ for every pair, from w (O, C, 3, 3): g = w[oc, ic] forward; for the
// data gradient g = w[ic, oc] turned by 180 degrees.
template <class T>
void transform_weight(const Plan& p, const T* w, float* U) {
  for (int64_t oc = 0; oc < p.out; ++oc)
    for (int64_t ic = 0; ic < p.in; ++ic) {
      float g[3][3];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
          g[i][j] = p.backward
                        ? static_cast<float>(load(w, ((ic * p.out + oc) * 3 + (2 - i)) * 3 + (2 - j)))
                        : static_cast<float>(load(w, ((oc * p.in + ic) * 3 + i) * 3 + j));
      float t[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        t[0][j] = g[0][j];
        t[1][j] = 0.5f * (g[0][j] + g[1][j] + g[2][j]);
        t[2][j] = 0.5f * (g[0][j] - g[1][j] + g[2][j]);
        t[3][j] = g[2][j];
      }
      for (int i = 0; i < 4; ++i) {  // (G g) Gᵀ
        const float u[4] = {t[i][0], 0.5f * (t[i][0] + t[i][1] + t[i][2]),
                            0.5f * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
        for (int j = 0; j < 4; ++j) U[((i * 4 + j) * p.out + oc) * p.in + ic] = u[j];
      }
    }
}

// The input transform of one image src (in, IH, IW), a channel at a time through the zero-padded
// plane `pad` (PH x PW floats), so the tile loops need no bounds tests:
// V[ξ][ic][t] = (Bᵀ d B)[ξ] for the 4x4 block d at (2·th, 2·tw) of the padded plane.
template <class In>
void input_transform(const Plan& p, const In* src, float* pad, float* V) {
  const int64_t T = p.T, PW = p.PW;
  const int64_t rows = std::min(p.IH, p.PH - p.ph), cols = std::min(p.IW, p.PW - p.pw);
  for (int64_t ic = 0; ic < p.in; ++ic) {
    std::fill(pad, pad + p.PH * PW, 0.0f);
    const In* plane = src + ic * p.IH * p.IW;
    for (int64_t h = 0; h < rows; ++h) {
      float* row = pad + (h + p.ph) * PW + p.pw;
      const In* in = plane + h * p.IW;
      for (int64_t w = 0; w < cols; ++w) row[w] = static_cast<float>(load(in, w));
    }
    float* v = V + ic * T;
    const int64_t stride = p.in * T;  // from one ξ to the next
    for (int64_t th = 0; th < p.TH; ++th) {
      const float* r0 = pad + 2 * th * PW;
      const float* r1 = r0 + PW;
      const float* r2 = r1 + PW;
      const float* r3 = r2 + PW;
      float* vt = v + th * p.TW;
#pragma GCC ivdep  // V and Y never alias pad: lets GCC vectorise over the tiles
      for (int64_t tw = 0; tw < p.TW; ++tw) {
        const int64_t c = 2 * tw;
        float t[4][4];  // Bᵀ d, row by row
        for (int j = 0; j < 4; ++j) {
          t[0][j] = r0[c + j] - r2[c + j];
          t[1][j] = r1[c + j] + r2[c + j];
          t[2][j] = r2[c + j] - r1[c + j];
          t[3][j] = r1[c + j] - r3[c + j];
        }
        for (int i = 0; i < 4; ++i) {  // (Bᵀ d) B
          vt[(i * 4 + 0) * stride + tw] = t[i][0] - t[i][2];
          vt[(i * 4 + 1) * stride + tw] = t[i][1] + t[i][2];
          vt[(i * 4 + 2) * stride + tw] = t[i][2] - t[i][1];
          vt[(i * 4 + 3) * stride + tw] = t[i][1] - t[i][3];
        }
      }
    }
  }
}

// dst (out, OH, OW) = the convolution of one image src (in, IH, IW) (+ bias[oc]), with U from
// transform_weight and `scratch` of p.scratch_floats() floats. In is the input's storage type
// (the image's, or f32 for a gradient already converted); dst is f32.
template <class In, class B>
void image(const Plan& p, const float* U, const In* src, const B* bias, float* dst,
           float* scratch) {
  if (p.T == 0) return;
  const auto [pad, V, M] = p.parts(scratch);
  const int64_t T = p.T;
  input_transform(p, src, pad, V);
  for (int64_t xi = 0; xi < 16; ++xi)
    gemm<float>(false, false, p.out, T, p.in, 1.0f, U + xi * p.out * p.in, p.in,
                V + xi * p.in * T, T, 0.0f, M + xi * p.out * T, T, nullptr);
  // Output transform: y = Aᵀ m A for each tile, the bias added, clipped to the plane's edge. A
  // row of tiles at a time into two rows of `pad` (free again: 2·(2·TW) floats fit in it), a
  // loop GCC vectorises, then the rows' first OW values into the plane.
  const int64_t stride = p.out * T, QW = 2 * p.TW;
  float* r0 = pad;
  float* r1 = pad + QW;
  for (int64_t oc = 0; oc < p.out; ++oc) {
    const float b = bias ? static_cast<float>(load(bias, oc)) : 0.0f;
    const float* m = M + oc * T;
    float* plane = dst + oc * p.OH * p.OW;
    for (int64_t th = 0; th < p.TH; ++th) {
      const float* mt = m + th * p.TW;
#pragma GCC ivdep  // r0 and r1 never alias M
      for (int64_t tw = 0; tw < p.TW; ++tw) {
        float s[2][4];  // Aᵀ m
        for (int j = 0; j < 4; ++j) {
          const float m0 = mt[(0 * 4 + j) * stride + tw], m1 = mt[(1 * 4 + j) * stride + tw],
                      m2 = mt[(2 * 4 + j) * stride + tw], m3 = mt[(3 * 4 + j) * stride + tw];
          s[0][j] = m0 + m1 + m2;
          s[1][j] = m1 - m2 - m3;
        }
        r0[2 * tw] = s[0][0] + s[0][1] + s[0][2] + b;
        r0[2 * tw + 1] = s[0][1] - s[0][2] - s[0][3] + b;
        r1[2 * tw] = s[1][0] + s[1][1] + s[1][2] + b;
        r1[2 * tw + 1] = s[1][1] - s[1][2] - s[1][3] + b;
      }
      float* y0 = plane + 2 * th * p.OW;
      std::copy(r0, r0 + p.OW, y0);
      if (2 * th + 1 < p.OH) std::copy(r1, r1 + p.OW, y0 + p.OW);  // an odd last row: one
    }
  }
}

// ---- the weight gradient ----
//
// For y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A per tile, the gradient of Σ_t <dy_t, y_t> with respect to g
// is Gᵀ [ Σ_t (A dy_t Aᵀ) ⊙ (Bᵀ d_t B) ] G, where dy_t is the tile's 2x2 block of the output
// gradient (zero past the plane's edge). So with V from the forward's input transform of x and
// Y[ξ] (out, T) = (A dy Aᵀ)[ξ], every image adds 16 GEMMs
//   S[ξ] (out, in) += Y[ξ] (out, tiles) · V[ξ] (in, tiles)ᵀ,
// 16 multiply-adds per channel pair per tile where im2col's GEMM does 36, and dw = Gᵀ S G once
// at the end. The plan is the forward's (in = C, out = O); the same scratch holds pad, V and Y.

// Floats of the sums S (16, out, in).
inline int64_t weight_grad_floats(const Plan& p) { return 16 * p.out * p.in; }

// S += this image's terms, for x (in, IH, IW) and dy (out, OH, OW) of one image.
template <class X, class D>
void weight_grad_image(const Plan& p, const X* x, const D* dy, float* S, float* scratch) {
  if (p.T == 0) return;
  const auto [pad, V, Y] = p.parts(scratch);
  const int64_t T = p.T;
  input_transform(p, x, pad, V);
  // Y = A e Aᵀ for each 2x2 block e of dy, with A = [1 0; 1 1; 1 -1; 0 -1]: rows of A e are
  // e0, e0 + e1, e0 − e1, −e1, and each row [a b] times Aᵀ is [a, a + b, a − b, −b]. A plane at
  // a time through `pad`, zero past an odd edge, so the tile loop has no bounds tests.
  const int64_t stride = p.out * T, QW = 2 * p.TW;  // (2·TH, 2·TW) fit in (PH, PW)
  for (int64_t oc = 0; oc < p.out; ++oc) {
    const D* plane = dy + oc * p.OH * p.OW;
    for (int64_t h = 0; h < p.OH; ++h) {
      float* row = pad + h * QW;
      for (int64_t w = 0; w < p.OW; ++w) row[w] = static_cast<float>(load(plane, h * p.OW + w));
      if (p.OW < QW) row[p.OW] = 0.0f;
    }
    if (p.OH < 2 * p.TH) std::fill(pad + p.OH * QW, pad + (p.OH + 1) * QW, 0.0f);
    float* yt = Y + oc * T;
    for (int64_t th = 0; th < p.TH; ++th) {
      const float* e0 = pad + 2 * th * QW;
      const float* e1 = e0 + QW;
      float* o = yt + th * p.TW;
#pragma GCC ivdep  // V and Y never alias pad: lets GCC vectorise over the tiles
      for (int64_t tw = 0; tw < p.TW; ++tw) {
        const float e00 = e0[2 * tw], e01 = e0[2 * tw + 1], e10 = e1[2 * tw], e11 = e1[2 * tw + 1];
        const float r[4][2] = {{e00, e01}, {e00 + e10, e01 + e11}, {e00 - e10, e01 - e11},
                               {-e10, -e11}};
        for (int i = 0; i < 4; ++i) {
          o[(i * 4 + 0) * stride + tw] = r[i][0];
          o[(i * 4 + 1) * stride + tw] = r[i][0] + r[i][1];
          o[(i * 4 + 2) * stride + tw] = r[i][0] - r[i][1];
          o[(i * 4 + 3) * stride + tw] = -r[i][1];
        }
      }
    }
  }
  for (int64_t xi = 0; xi < 16; ++xi)
    gemm<float>(false, true, p.out, p.in, T, 1.0f, Y + xi * p.out * T, T, V + xi * p.in * T, T,
                1.0f, S + xi * p.out * p.in, p.in, nullptr);
}

// dw (out, in, 3, 3) = Gᵀ S G for every channel pair, S the sum of `workers` workers' sums of
// weight_grad_image (S (workers, 16, out, in)), added into the first in worker order, so the
// result does not depend on timing.
template <class T>
void finish_weight_grad(const Plan& p, float* S, int64_t workers, T* dw) {
  const int64_t n = weight_grad_floats(p);
  for (int64_t wk = 1; wk < workers; ++wk)
    for (int64_t i = 0; i < n; ++i) S[i] += S[wk * n + i];
  const int64_t pairs = p.out * p.in;
  for (int64_t k = 0; k < pairs; ++k) {
    float m[4][4];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) m[i][j] = S[(i * 4 + j) * pairs + k];
    float t[3][4];  // Gᵀ m, with G = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1]
    for (int j = 0; j < 4; ++j) {
      t[0][j] = m[0][j] + 0.5f * (m[1][j] + m[2][j]);
      t[1][j] = 0.5f * (m[1][j] - m[2][j]);
      t[2][j] = 0.5f * (m[1][j] + m[2][j]) + m[3][j];
    }
    T* out = dw + k * 9;
    for (int i = 0; i < 3; ++i) {  // (Gᵀ m) G
      out[i * 3 + 0] = convert<T>(t[i][0] + 0.5f * (t[i][1] + t[i][2]));
      out[i * 3 + 1] = convert<T>(0.5f * (t[i][1] - t[i][2]));
      out[i * 3 + 2] = convert<T>(0.5f * (t[i][1] + t[i][2]) + t[i][3]);
    }
  }
}

}  // namespace plexus::cpu::winograd
