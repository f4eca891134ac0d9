// 2-D pooling on the CPU backend: forward and backward against direct loops in double precision
// in every float dtype (max-pool indices and ties included), gradients against finite
// differences, and errors naming op and problem.
#include <cmath>
#include <limits>

#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

struct PoolCase {
  Shape x;
  Ints kernel, stride{}, padding{0, 0}, dilation{1, 1};
  int64_t ceil_mode = 0;

  Ints eff_stride() const { return stride.empty() ? kernel : stride; }
  // PyTorch's pooling_output_shape.
  int64_t out(int i) const {
    const int64_t s = eff_stride()[i], p = padding[i];
    const int64_t num =
        x[2 + i] + 2 * p - dilation[i] * (kernel[i] - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t o =
        static_cast<int64_t>(std::floor(static_cast<double>(num) / static_cast<double>(s))) + 1;
    if (ceil_mode && (o - 1) * s >= x[2 + i] + p) --o;
    return o;
  }
  Shape y() const { return {x[0], x[1], out(0), out(1)}; }
  Attrs max_attrs() const {
    return {{"kernel", kernel},
            {"stride", stride},
            {"padding", padding},
            {"dilation", dilation},
            {"ceil_mode", ceil_mode}};
  }
  Attrs avg_attrs(int64_t include_pad) const {
    return {{"kernel", kernel},
            {"stride", stride},
            {"padding", padding},
            {"ceil_mode", ceil_mode},
            {"count_include_pad", include_pad}};
  }
  bool dilated() const { return dilation[0] != 1 || dilation[1] != 1; }
  std::string str() const {
    return "x " + shape_string(x) + " kernel " + attr_value_string(AttrValue(kernel)) + " stride " +
           attr_value_string(AttrValue(stride)) + " padding " +
           attr_value_string(AttrValue(padding)) + " dilation " +
           attr_value_string(AttrValue(dilation)) + " ceil_mode " + std::to_string(ceil_mode);
  }
};

// The default 2x2 pool (the fast path, also on odd planes), with ceil_mode windows running past the input, padding,
// dilation, non-square windows and strides, a window as large as the input, one larger than it
// (allowed with ceil_mode), size-1 planes, an empty batch and many planes.
const std::vector<PoolCase> kCases = {
    {.x = {2, 3, 8, 8}, .kernel = {2, 2}},
    {.x = {2, 3, 9, 7}, .kernel = {2, 2}},  // the fast path with an odd last row and column
    {.x = {2, 3, 9, 7}, .kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = 1},
    {.x = {1, 2, 7, 9}, .kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}},
    {.x = {2, 2, 10, 9}, .kernel = {3, 2}, .stride = {1, 2}, .padding = {1, 1}, .dilation = {2, 1}},
    {.x = {1, 1, 5, 5}, .kernel = {5, 5}},
    {.x = {3, 1, 6, 5}, .kernel = {3, 3}, .stride = {3, 2}, .padding = {1, 0}, .ceil_mode = 1},
    {.x = {1, 2, 1, 1}, .kernel = {1, 1}},
    {.x = {2, 3, 11, 13}, .kernel = {2, 3}, .stride = {3, 1}, .padding = {1, 1}, .ceil_mode = 1},
    {.x = {1, 1, 2, 2}, .kernel = {3, 3}, .stride = {2, 2}, .ceil_mode = 1},
    {.x = {2, 2, 9, 8},
     .kernel = {2, 3},
     .stride = {2, 2},
     .padding = {1, 1},
     .dilation = {3, 2},
     .ceil_mode = 1},
    {.x = {0, 3, 4, 4}, .kernel = {2, 2}},
    {.x = {4, 16, 26, 26}, .kernel = {2, 2}},
};

// Reference max pool: per window the first maximum in index order (taps in row-major order),
// and its flat index in the plane.
void ref_max_pool(const PoolCase& k, const std::vector<double>& x, std::vector<double>& y,
                  std::vector<double>& idx) {
  const Shape ys = k.y();
  y.assign(static_cast<size_t>(shape_numel(ys)), 0.0);
  idx.assign(y.size(), 0.0);
  const Ints s = k.eff_stride();
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t c = 0; c < ys[1]; ++c)
      for (int64_t oh = 0; oh < ys[2]; ++oh)
        for (int64_t ow = 0; ow < ys[3]; ++ow) {
          double best = -INFINITY;
          int64_t at = -1;
          for (int64_t kh = 0; kh < k.kernel[0]; ++kh)
            for (int64_t kw = 0; kw < k.kernel[1]; ++kw) {
              const int64_t ih = oh * s[0] - k.padding[0] + kh * k.dilation[0];
              const int64_t iw = ow * s[1] - k.padding[1] + kw * k.dilation[1];
              if (ih < 0 || ih >= k.x[2] || iw < 0 || iw >= k.x[3]) continue;
              const double v = x[static_cast<size_t>(idx4(k.x, n, c, ih, iw))];
              if (at < 0 || v > best) best = v, at = ih * k.x[3] + iw;
            }
          const size_t o = static_cast<size_t>(idx4(ys, n, c, oh, ow));
          y[o] = best;
          idx[o] = static_cast<double>(at);
        }
}

// Reference average pool (PyTorch's divisor) and its backward, by the same window walk.
void ref_avg_pool(const PoolCase& k, bool include_pad, const std::vector<double>& x,
                  const std::vector<double>& dy, std::vector<double>& y, std::vector<double>& dx) {
  const Shape ys = k.y();
  y.assign(static_cast<size_t>(shape_numel(ys)), 0.0);
  dx.assign(static_cast<size_t>(shape_numel(k.x)), 0.0);
  const Ints s = k.eff_stride();
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t c = 0; c < ys[1]; ++c)
      for (int64_t oh = 0; oh < ys[2]; ++oh)
        for (int64_t ow = 0; ow < ys[3]; ++ow) {
          const int64_t h0 = oh * s[0] - k.padding[0], w0 = ow * s[1] - k.padding[1];
          const int64_t h1 = std::min(h0 + k.kernel[0], k.x[2] + k.padding[0]);
          const int64_t w1 = std::min(w0 + k.kernel[1], k.x[3] + k.padding[1]);
          int64_t inside = 0;
          double sum = 0;
          for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h1, k.x[2]); ++ih)
            for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w1, k.x[3]); ++iw) {
              sum += x[static_cast<size_t>(idx4(k.x, n, c, ih, iw))];
              ++inside;
            }
          const double div = include_pad ? static_cast<double>((h1 - h0) * (w1 - w0))
                                         : static_cast<double>(inside);
          const size_t o = static_cast<size_t>(idx4(ys, n, c, oh, ow));
          y[o] = sum / div;
          for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h1, k.x[2]); ++ih)
            for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w1, k.x[3]); ++iw)
              dx[static_cast<size_t>(idx4(k.x, n, c, ih, iw))] += dy[o] / div;
        }
}

// Values on a grid of 1/4 in [-1, 1]: exact in every dtype and full of ties.
Tensor tied_tensor(const Shape& shape, plx_dtype d, uint64_t seed) {
  std::vector<double> v = random_doubles(static_cast<size_t>(shape_numel(shape)), seed, -1, 1);
  for (double& e : v) e = std::round(e * 4) / 4;
  return from_doubles(v, shape, d);
}

}  // namespace

TEST_CASE("max_pool2d forward matches the reference, first index on ties", "[cpu][ops][pool]") {
  for (const PoolCase& k : kCases) {
    for (plx_dtype d : kFloatDtypes) {
      for (bool tied : {true, false}) {
        INFO("max_pool2d " << dtype_name(d) << " " << k.str() << (tied ? " tied" : ""));
        const Tensor x = tied ? tied_tensor(k.x, d, 41) : random_tensor(k.x, d, 42);
        std::vector<double> want, want_idx;
        ref_max_pool(k, x.to_doubles(), want, want_idx);
        const std::vector<Tensor> out = call(cpu(), "max_pool2d", {x}, k.max_attrs());
        REQUIRE(out.at(0).dtype() == d);
        REQUIRE(out.at(0).shape() == k.y());
        REQUIRE(out.at(1).dtype() == PLX_I32);
        REQUIRE(out.at(1).shape() == k.y());
        // A maximum is one of the inputs: exact.
        CHECK_ALLCLOSE(out[0].to_doubles(), want, (Tol{0, 0}));
        CHECK_ALLCLOSE(out[1].to_doubles(), want_idx, (Tol{0, 0}));
      }
    }
  }
}

TEST_CASE("max_pool2d backward sends dy to the indexed elements", "[cpu][ops][pool]") {
  for (const PoolCase& k : kCases) {
    for (plx_dtype d : kFloatDtypes) {
      INFO("max_pool2d_backward " << dtype_name(d) << " " << k.str());
      const Tensor x = tied_tensor(k.x, d, 43);
      const Tensor indices = call(cpu(), "max_pool2d", {x}, k.max_attrs()).at(1);
      const Tensor dy = random_tensor(k.y(), d, 44);
      const std::vector<double> dys = dy.to_doubles(), idx = indices.to_doubles();
      std::vector<double> want(static_cast<size_t>(shape_numel(k.x)), 0.0);
      const int64_t plane_in = k.x[2] * k.x[3], plane_out = k.out(0) * k.out(1);
      for (size_t o = 0; o < dys.size(); ++o)
        want[static_cast<size_t>(static_cast<int64_t>(o) / plane_out * plane_in +
                                 static_cast<int64_t>(idx[o]))] += dys[o];
      Attrs a = k.max_attrs();
      a.set("input_shape", k.x);
      const Tensor dx = call(cpu(), "max_pool2d_backward", {dy, indices}, a).at(0);
      REQUIRE(dx.dtype() == d);
      REQUIRE(dx.shape() == k.x);
      CHECK_ALLCLOSE(dx.to_doubles(), round_to(want, d), tolerance(d));
    }
  }
}

TEST_CASE("max_pool2d relu_mask: index -1 where y is not positive, the ReLU's backward", "[cpu][ops][pool]") {
  int kept = 0, dropped = 0;
  for (const PoolCase& k : kCases) {
    for (plx_dtype d : kFloatDtypes) {
      INFO("max_pool2d relu_mask " << dtype_name(d) << " " << k.str());
      // A ReLU's output: zeros where x was negative, and a NaN (ReLU passes it on).
      const Tensor x = call(cpu(), "relu", {random_tensor(k.x, d, 45)}).at(0);
      std::vector<double> xs = x.to_doubles();
      if (!xs.empty()) xs[xs.size() / 2] = std::nan("");
      const Tensor r = from_doubles(xs, k.x, d);
      const std::vector<Tensor> plain = call(cpu(), "max_pool2d", {r}, k.max_attrs());
      Attrs ma = k.max_attrs();
      ma.set("relu_mask", int64_t{1});
      const std::vector<Tensor> masked = call(cpu(), "max_pool2d", {r}, ma);
      const std::vector<double> y = plain[0].to_doubles(), idx = plain[1].to_doubles(),
                                ym = masked[0].to_doubles(), idxm = masked[1].to_doubles();
      REQUIRE(idxm.size() == idx.size());
      for (size_t o = 0; o < idx.size(); ++o) {
        INFO("output " << o << " y " << y[o]);
        CHECK((ym[o] == y[o] || (std::isnan(ym[o]) && std::isnan(y[o]))));
        CHECK(idxm[o] == (y[o] > 0 ? idx[o] : -1.0));
        (y[o] > 0 ? kept : dropped) += 1;
      }
      // The backward of the masked indices is relu_backward on the pooled gradient, then the
      // pool's backward: the graph rewrite's identity (graph.cpp).
      const Tensor dy = random_tensor(k.y(), d, 46);
      Attrs ba = k.max_attrs();
      ba.set("input_shape", k.x);
      const Tensor got = call(cpu(), "max_pool2d_backward", {dy, masked[1]}, ba).at(0);
      const Tensor dr = call(cpu(), "relu_backward", {dy, plain[0]}).at(0);
      const Tensor want = call(cpu(), "max_pool2d_backward", {dr, plain[1]}, ba).at(0);
      CHECK_ALLCLOSE(got.to_doubles(), want.to_doubles(), (Tol{0, 0}));
    }
  }
  CHECK(kept > 0);
  CHECK(dropped > 0);
  Attrs bad;
  bad.set("kernel", Ints{2, 2});
  bad.set("relu_mask", int64_t{2});
  CHECK_THROWS_WITH(call(cpu(), "max_pool2d", {random_tensor({1, 1, 4, 4}, PLX_F32, 1)}, bad),
                    PLX_CONTAINS("relu_mask must be 0 or 1, got 2"));
}

TEST_CASE("max_pool2d window_index: u8 taps in the window name the same elements as i32", "[cpu][ops][pool]") {
  for (const PoolCase& k : kCases) {
    for (plx_dtype d : kFloatDtypes) {
      for (int64_t rm : {0, 1}) {
        INFO("max_pool2d window_index " << dtype_name(d) << " " << k.str() << " relu_mask " << rm);
        const Tensor x = tied_tensor(k.x, d, 47);
        Attrs a = k.max_attrs();
        a.set("relu_mask", rm);
        const std::vector<Tensor> wide = call(cpu(), "max_pool2d", {x}, a);
        a.set("window_index", int64_t{1});
        const std::vector<Tensor> narrow = call(cpu(), "max_pool2d", {x}, a);
        REQUIRE(narrow.at(1).dtype() == PLX_U8);
        CHECK(narrow[0].to_doubles() == wide[0].to_doubles());
        // Each tap, decoded, is the plane position the i32 index holds.
        const Ints kernel = k.kernel, pad = k.padding, stride = k.eff_stride(), dil = k.dilation;
        const std::vector<double> taps = narrow[1].to_doubles(), flat = wide[1].to_doubles();
        const int64_t oh_n = k.out(0), ow_n = k.out(1);
        for (size_t o = 0; o < taps.size(); ++o) {
          const int64_t oh = static_cast<int64_t>(o) / ow_n % oh_n, ow = static_cast<int64_t>(o) % ow_n;
          const int64_t t = static_cast<int64_t>(taps[o]);
          const int64_t pos = t == 255 ? -1
                                       : (oh * stride[0] - pad[0] + t / kernel[1] * dil[0]) * k.x[3] +
                                             ow * stride[1] - pad[1] + t % kernel[1] * dil[1];
          INFO("output " << o << " tap " << t);
          CHECK(pos == static_cast<int64_t>(flat[o]));
        }
        // The backward of either gives the same dx, bit for bit.
        const Tensor dy = random_tensor(k.y(), d, 48);
        Attrs ba = k.max_attrs();
        ba.set("input_shape", k.x);
        const Tensor want = call(cpu(), "max_pool2d_backward", {dy, wide[1]}, ba).at(0);
        ba.set("window_index", int64_t{1});
        const Tensor got = call(cpu(), "max_pool2d_backward", {dy, narrow[1]}, ba).at(0);
        CHECK_ALLCLOSE(got.to_doubles(), want.to_doubles(), (Tol{0, 0}));
      }
    }
  }
  const Tensor x = random_tensor({1, 1, 16, 16}, PLX_F32, 3);
  Attrs big;
  big.set("kernel", Ints{16, 16});
  big.set("window_index", int64_t{1});
  CHECK_THROWS_WITH(call(cpu(), "max_pool2d", {x}, big),
                    PLX_CONTAINS("window_index = 1 needs a window of 1 to 255 taps, got 256"));
  // The backward's indices must be the kind its attribute says.
  Attrs ba;
  ba.set("kernel", Ints{2, 2});
  ba.set("input_shape", Ints{1, 1, 16, 16});
  ba.set("window_index", int64_t{1});
  const Tensor i32 = call(cpu(), "max_pool2d", {x}, {{"kernel", Ints{2, 2}}}).at(1);
  CHECK_THROWS_WITH(call(cpu(), "max_pool2d_backward", {random_tensor({1, 1, 8, 8}, PLX_F32, 4), i32}, ba),
                    PLX_CONTAINS("indices must be u8 with window_index = 1, got i32"));
}

TEST_CASE("max_pool2d: NaN is the maximum, padding-only windows give -inf", "[cpu][ops][pool]") {
  for (plx_dtype d : kFloatDtypes) {
    INFO(dtype_name(d));
    // Plane (1, 1, 2, 4), windows 2x2: a NaN at flat 1 in the first, at 2 and 6 in the second.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const Tensor x = from_doubles({0.5, nan, nan, 3, 1, 2, nan, -1}, {1, 1, 2, 4}, d);
    const auto out = call(cpu(), "max_pool2d", {x}, {{"kernel", Ints{2, 2}}});
    const std::vector<double> y = out.at(0).to_doubles(), idx = out.at(1).to_doubles();
    CHECK(std::isnan(y.at(0)));
    CHECK(std::isnan(y.at(1)));
    CHECK(idx == std::vector<double>{1, 2});

    // Rows of 5 windows (f32 runs them four at a time, the last group overlapping): a NaN in
    // each tap position across the row, ties, and a NaN after a NaN, each with its own index.
    const Tensor wide = from_doubles({1, nan, 4, 4, 2, 0, 7, 7, nan, 1,    // row 0
                                      nan, 3, 9, nan, 2, 5, 0, nan, nan, 1},  // row 1
                                     {1, 1, 2, 10}, d);
    for (int64_t u8 : {0, 1}) {
      INFO("window_index " << u8);
      const auto w = call(cpu(), "max_pool2d", {wide}, {{"kernel", Ints{2, 2}}, {"window_index", u8}});
      const std::vector<double> wy = w.at(0).to_doubles(), wi = w.at(1).to_doubles();
      // Windows: {1, nan | nan, 3} → the first NaN (tap 1); {4, 4 | 9, nan} → nan (tap 3);
      // {2, 0 | 2, 5} → 5 (tap 3); {7, 7 | 0, nan} → nan (tap 3); {nan, 1 | nan, 1} → the first
      // NaN (tap 0).
      for (size_t o : {0, 1, 3, 4}) CHECK(std::isnan(wy.at(o)));
      CHECK(wy.at(2) == 5);
      const std::vector<double> taps = {1, 3, 3, 3, 0};
      const std::vector<double> flats = {1, 13, 15, 17, 8};
      CHECK(wi == (u8 ? taps : flats));
    }

    // 1x1 input, 2x2 taps 3 apart padded by 2: the windows hold only padding.
    const Tensor one = from_doubles({0.25}, {1, 1, 1, 1}, d);
    const auto pad = call(cpu(), "max_pool2d", {one},
                          {{"kernel", Ints{2, 2}},
                           {"stride", Ints{1, 1}},
                           {"padding", Ints{2, 2}},
                           {"dilation", Ints{3, 3}}});
    REQUIRE(pad.at(0).shape() == Shape{1, 1, 2, 2});
    for (double v : pad[0].to_doubles()) CHECK(v == -INFINITY);
    for (double v : pad[1].to_doubles()) CHECK(v == -1);
    // ...and the backward op skips them.
    const Tensor dx =
        call(cpu(), "max_pool2d_backward", {random_tensor({1, 1, 2, 2}, d, 1), pad[1]},
             {{"input_shape", Ints{1, 1, 1, 1}},
              {"kernel", Ints{2, 2}},
              {"stride", Ints{1, 1}},
              {"padding", Ints{2, 2}},
              {"dilation", Ints{3, 3}}})
            .at(0);
    CHECK(dx.to_doubles() == std::vector<double>{0});
  }
}

TEST_CASE("avg_pool2d forward and backward match the reference", "[cpu][ops][pool]") {
  for (const PoolCase& k : kCases) {
    if (k.dilated()) continue;  // average pooling has no dilation
    for (int64_t include_pad : {1, 0}) {
      for (plx_dtype d : kFloatDtypes) {
        INFO("avg_pool2d " << dtype_name(d) << " " << k.str() << " count_include_pad "
                           << include_pad);
        const Tensor x = random_tensor(k.x, d, 51);
        const Tensor dy = random_tensor(k.y(), d, 52);
        std::vector<double> want_y, want_dx;
        ref_avg_pool(k, include_pad != 0, x.to_doubles(), dy.to_doubles(), want_y, want_dx);
        const Tensor y = call(cpu(), "avg_pool2d", {x}, k.avg_attrs(include_pad)).at(0);
        REQUIRE(y.dtype() == d);
        REQUIRE(y.shape() == k.y());
        CHECK_ALLCLOSE(y.to_doubles(), round_to(want_y, d), tolerance(d));
        Attrs a = k.avg_attrs(include_pad);
        a.set("input_shape", k.x);
        const Tensor dx = call(cpu(), "avg_pool2d_backward", {dy}, a).at(0);
        REQUIRE(dx.dtype() == d);
        REQUIRE(dx.shape() == k.x);
        CHECK_ALLCLOSE(dx.to_doubles(), round_to(want_dx, d), tolerance(d));
      }
    }
  }
}

TEST_CASE("pooling gradients match finite differences", "[cpu][ops][pool][grad]") {
  const std::vector<PoolCase> cases = {
      {.x = {2, 3, 4, 4}, .kernel = {2, 2}},
      {.x = {1, 2, 5, 7}, .kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 1}, .ceil_mode = 1},
      {.x = {1, 1, 6, 5},
       .kernel = {2, 2},
       .stride = {1, 2},
       .padding = {1, 0},
       .dilation = {2, 1}},
      {.x = {1, 1, 1, 1}, .kernel = {1, 1}},
  };
  for (const PoolCase& k : cases) {
    INFO(k.str());
    // Distinct random values: the max is differentiable away from ties.
    const Tensor x = random_tensor(k.x, PLX_F64, 61);
    check_gradients("max_pool2d", {x}, k.max_attrs());
    if (k.dilated()) continue;
    for (int64_t include_pad : {1, 0}) {
      check_gradients("avg_pool2d", {x}, k.avg_attrs(include_pad));
      Attrs a = k.avg_attrs(include_pad);
      a.set("input_shape", k.x);
      check_gradients("avg_pool2d_backward", {random_tensor(k.y(), PLX_F64, 62)}, a);
    }
  }
}

TEST_CASE("pooling rejects bad attributes and shapes", "[cpu][ops][pool][errors]") {
  const Tensor x = random_tensor({1, 2, 5, 5}, PLX_F32, 1);
  for (const char* op : {"max_pool2d", "avg_pool2d"}) {
    const std::string name = std::string("op '") + op + "': ";
    INFO(op);
    auto pool = [&](const Attrs& a, const Tensor& t) { return call(cpu(), op, {t}, a); };
    REQUIRE_THROWS_WITH(pool({}, x), PLX_CONTAINS("missing required attribute 'kernel'"));
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{2}}}, x),
                        PLX_CONTAINS(name + "kernel must have 2 values [h, w], got [2]"));
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{0, 2}}}, x),
                        PLX_CONTAINS(name + "kernel must be >= 1"));
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{2, 2}}, {"stride", Ints{1, -1}}}, x),
                        PLX_CONTAINS(name + "stride must be >= 1, got [1, -1]"));
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{2, 2}}, {"stride", Ints{1, 1, 1}}}, x),
                        PLX_CONTAINS(name + "stride must have 2 values"));
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{2, 2}}, {"padding", Ints{-1, 0}}}, x),
                        PLX_CONTAINS(name + "padding must be >= 0"));
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{3, 3}}, {"padding", Ints{2, 0}}}, x),
                        PLX_CONTAINS(name + "padding [2, 0] must be at most half the"));
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{2, 2}}, {"ceil_mode", int64_t{2}}}, x),
                        PLX_CONTAINS(name + "ceil_mode must be 0 or 1, got 2"));
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{6, 2}}}, x),
                        PLX_CONTAINS(name + "kernel 6x2 is larger than the padded input 5x5"));
    CHECK(pool({{"kernel", Ints{6, 2}}, {"padding", Ints{1, 0}}}, x).at(0).shape() ==
          Shape{1, 2, 1, 2});
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{2, 2}}}, random_tensor({2, 5, 5}, PLX_F32, 2)),
                        PLX_CONTAINS(name + "x must be 4-D (N, C, H, W), got (2, 5, 5)"));
    REQUIRE_THROWS_WITH(pool({{"kernel", Ints{2, 2}}}, random_ints({1, 1, 4, 4}, PLX_I64, 3, 0, 5)),
                        PLX_CONTAINS(name + "input 'x' is i64, expected one of"));
  }
  REQUIRE_THROWS_WITH(
      call(cpu(), "max_pool2d", {x}, {{"kernel", Ints{2, 2}}, {"dilation", Ints{1, 0}}}),
      PLX_CONTAINS("op 'max_pool2d': dilation must be >= 1"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "max_pool2d", {x}, {{"kernel", Ints{3, 3}}, {"dilation", Ints{3, 3}}}),
      PLX_CONTAINS("op 'max_pool2d': kernel 3x3 (dilated) is larger than the "
                   "padded input 5x5"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "avg_pool2d", {x}, {{"kernel", Ints{2, 2}}, {"dilation", Ints{1, 1}}}),
      PLX_CONTAINS("op 'avg_pool2d' has no attribute 'dilation'"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "max_pool2d", {x}, {{"kernel", Ints{2, 2}}, {"count_include_pad", int64_t{0}}}),
      PLX_CONTAINS("op 'max_pool2d' has no attribute 'count_include_pad'"));
}

TEST_CASE("pooling backward ops reject shapes that do not match the forward",
          "[cpu][ops][pool][errors]") {
  const Tensor dy = random_tensor({1, 2, 2, 2}, PLX_F32, 1);
  const Tensor idx = random_ints({1, 2, 2, 2}, PLX_I32, 2, 0, 4);
  Attrs a = {{"kernel", Ints{2, 2}}, {"input_shape", Ints{1, 2, 4, 5}}};
  CHECK(call(cpu(), "max_pool2d_backward", {dy, idx}, a).at(0).shape() == Shape{1, 2, 4, 5});
  CHECK(call(cpu(), "avg_pool2d_backward", {dy}, a).at(0).shape() == Shape{1, 2, 4, 5});
  a.set("input_shape", Ints{1, 2, 6, 5});
  REQUIRE_THROWS_WITH(call(cpu(), "max_pool2d_backward", {dy, idx}, a),
                      PLX_CONTAINS("op 'max_pool2d_backward': dy (1, 2, 2, 2) is not the output "
                                   "shape (1, 2, 3, 2) of input (1, 2, 6, 5)"));
  REQUIRE_THROWS_WITH(call(cpu(), "avg_pool2d_backward", {dy}, a),
                      PLX_CONTAINS("op 'avg_pool2d_backward': dy (1, 2, 2, 2) is not the output"));
  a.set("input_shape", Ints{1, 2, 4});
  REQUIRE_THROWS_WITH(call(cpu(), "avg_pool2d_backward", {dy}, a),
                      PLX_CONTAINS("op 'avg_pool2d_backward': input_shape must have 4 values"));
  a.set("input_shape", Ints{1, 2, 4, 5});
  REQUIRE_THROWS_WITH(
      call(cpu(), "max_pool2d_backward", {dy, random_ints({1, 2, 2, 3}, PLX_I32, 2, 0, 4)}, a),
      PLX_CONTAINS("op 'max_pool2d_backward': indices (1, 2, 2, 3) and dy (1, 2, 2, 2) differ"));
  REQUIRE_THROWS_WITH(
      call(cpu(), "max_pool2d_backward", {dy, random_ints({1, 2, 2, 2}, PLX_I64, 2, 0, 4)}, a),
      PLX_CONTAINS("op 'max_pool2d_backward': input 'indices' is i64, expected one of i32"));
}
