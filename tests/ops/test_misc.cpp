// copy, cast, dropout and embedding on the CPU backend: strided copies of permuted and sliced
// views, every cast pair against an independent rounding reference, dropout masks against the
// SDK's Philox stream, embedding and its deterministic backward against reference loops, and
// the gradients through the core's formulas.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "plexus/sdk/philox.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

const std::vector<plx_dtype> kAllDtypes = {PLX_F32, PLX_F16, PLX_BF16, PLX_I32,
                                           PLX_I64, PLX_U8,  PLX_F64};

// Values as doubles, NaN equal to NaN and -0 equal to 0: for ops that must be exact.
void check_exact(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = (std::isnan(got[i]) && std::isnan(want[i])) || got[i] == want[i];
    if (!same && bad++ == 0) first = i;
  }
  INFO(bad << " of " << got.size() << " differ; first at [" << first << "]: got "
           << (bad ? got[first] : 0.0) << ", want " << (bad ? want[first] : 0.0));
  CHECK(bad == 0);
}

// Row-major index of `pos` in `shape`.
int64_t flat(const Shape& shape, const std::vector<int64_t>& pos) {
  int64_t f = 0;
  for (size_t i = 0; i < shape.size(); ++i) f = f * shape[i] + pos[i];
  return f;
}

// The values of x (row-major `shape`) permuted by `order`, row-major in the permuted shape.
std::vector<double> permuted(const std::vector<double>& x, const Shape& shape,
                             const std::vector<int>& order) {
  Shape ps(order.size());
  for (size_t i = 0; i < order.size(); ++i) ps[i] = shape[static_cast<size_t>(order[i])];
  std::vector<double> out(x.size());
  std::vector<int64_t> pos(order.size(), 0), src(order.size());
  for (size_t o = 0; o < out.size(); ++o) {
    for (size_t i = 0; i < order.size(); ++i) src[static_cast<size_t>(order[i])] = pos[i];
    out[o] = x[static_cast<size_t>(flat(shape, src))];
    for (size_t k = order.size(); k-- > 0;) {
      if (++pos[k] < ps[k]) break;
      pos[k] = 0;
    }
  }
  return out;
}

// Values every dtype holds exactly (small integers), so any dtype's tensor can be checked.
Tensor iota_tensor(const Shape& shape, plx_dtype d) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 251);
  return from_doubles(v, shape, d);
}

// ---- an independent rounding reference for the 16-bit floats ----

// Every finite non-negative value of f16 or bf16 by bit pattern, decoded from the format's
// definition, plus the first value past the largest (2^16 or 2^128), whose even pattern makes
// round-to-nearest-even overflow to infinity exactly where IEEE says.
std::vector<double> decode_format(int exp_bits, int mant_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint32_t inf = ((1u << exp_bits) - 1) << mant_bits;  // the pattern of +inf
  std::vector<double> t;
  for (uint32_t b = 0; b < inf; ++b) {
    const int e = static_cast<int>(b >> mant_bits);
    const double m = b & ((1u << mant_bits) - 1);
    t.push_back(e == 0 ? std::ldexp(m, 1 - bias - mant_bits)
                       : std::ldexp(std::ldexp(1, mant_bits) + m, e - bias - mant_bits));
  }
  t.push_back(std::ldexp(1, (1 << exp_bits) - 1 - bias));  // 2^(emax + 1), pattern `inf`
  return t;
}
const std::vector<double>& format_values(bool bf16) {
  static const std::vector<double> f16 = decode_format(5, 10), b16 = decode_format(8, 7);
  return bf16 ? b16 : f16;
}

// v rounded once to f16/bf16 (nearest, ties to the even pattern), as a double.
double round16(double v, bool bf16) {
  if (std::isnan(v) || std::isinf(v)) return v;
  const std::vector<double>& t = format_values(bf16);
  const double a = std::fabs(v);
  double r;
  if (a >= t.back()) {
    r = INFINITY;
  } else {
    const size_t hi = static_cast<size_t>(std::lower_bound(t.begin(), t.end(), a) - t.begin());
    if (t[hi] == a) {
      r = a;
    } else {
      const size_t lo = hi - 1;
      const double dl = a - t[lo], dh = t[hi] - a;
      const size_t pick = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
      r = pick == t.size() - 1 ? INFINITY : t[pick];
    }
  }
  return std::signbit(v) ? -r : r;
}

// What cast should give for the exact source value v.
double cast_ref(double v, plx_dtype to) {
  auto to_int = [&](double lo, double hi) {
    if (std::isnan(v)) return 0.0;
    return std::min(hi, std::max(lo, std::trunc(v)));
  };
  switch (to) {
    case PLX_F64:
      return v;
    case PLX_F32:
      return static_cast<float>(v);
    case PLX_F16:
      return round16(v, false);
    case PLX_BF16:
      return round16(v, true);
    case PLX_I32:
      return to_int(-2147483648.0, 2147483647.0);
    case PLX_U8:
      return to_int(0, 255);
    case PLX_I64:
      // 2^63 - 1 as a double is 2^63: to_doubles gives the same for the saturated result.
      return to_int(-9223372036854775808.0, 9223372036854775807.0);
    default:
      return 0;
  }
}

// Source values for the cast tests: negatives, fractions, halfway cases, values that saturate
// every integer type, f16's and bf16's limits, and values that a double rounding through f32
// would get wrong.
std::vector<double> cast_sources(plx_dtype from) {
  const double inf = INFINITY, nan = std::nan("");
  std::vector<double> v = {
      0,      1,       -1,     0.5,    -0.5,       1.5,          2.5,           -2.5,    0.7,
      -0.7,   3.99,    -3.99,  100.25, 127.5,      200,          255,           255.9,   256,
      300,    -300,    -128.5, 1000.7, 65504,      65519.99,     65520,         70000,   -70000,
      1e10,   -1e10,   3e9,    -3e9,   2147483647, 2147483648.0, -2147483649.0, 1e19,    -1e19,
      3.4e38, -3.4e38, 1e-5,   -1e-8,  6e-8,       1e-40,        16777217,      33554435};
  // Halfway-plus-a-little: f32 would round these to a tie that RNE then resolves wrongly.
  v.push_back(1 + std::ldexp(1, -11) + std::ldexp(1, -40));  // f16: rounds up to 1 + 2^-10
  v.push_back(1 + std::ldexp(1, -8) + std::ldexp(1, -30));   // bf16: rounds up to 1 + 2^-7
  v.push_back(std::ldexp(1, 24) + std::ldexp(1, 16) + 1);    // 16842753: bf16 up; via f32 down
  v.push_back(-(std::ldexp(1, 24) + std::ldexp(1, 16) + 1));
  v.push_back(std::ldexp(1, 62));
  v.push_back(std::ldexp(1, 40) + std::ldexp(1, 32) + 1);
  if (dtype_is_float(from)) {
    v.insert(v.end(), {inf, -inf, nan, 1e300, -1e300});
    return v;
  }
  // Integer sources hold integers in their range only.
  const double lo = from == PLX_U8 ? 0 : from == PLX_I32 ? -2147483648.0 : -9.2e18;
  const double hi = from == PLX_U8 ? 255 : from == PLX_I32 ? 2147483647.0 : 9.2e18;
  std::vector<double> ints;
  for (double x : v)
    if (std::isfinite(x) && x == std::trunc(x) && x >= lo && x <= hi) ints.push_back(x);
  ints.push_back(lo);
  ints.push_back(hi);
  return ints;
}

// A tensor of dtype d holding `v`; integers written exactly (from_doubles would do for those
// in range too, but i64 extremes need care).
Tensor exact_tensor(const std::vector<double>& v, plx_dtype d) {
  const Shape shape = {static_cast<int64_t>(v.size())};
  if (d == PLX_I64) {
    std::vector<int64_t> x;
    for (double e : v) x.push_back(static_cast<int64_t>(e));
    x.push_back(std::numeric_limits<int64_t>::max());
    x.push_back(std::numeric_limits<int64_t>::min());
    return Tensor::from_vector(cpu(), x, {static_cast<int64_t>(x.size())});
  }
  return from_doubles(v, shape, d);
}

}  // namespace

// ---- copy ----

TEST_CASE("copy of permuted views gives the permuted values in every dtype", "[cpu][ops][misc]") {
  const Shape shape = {3, 4, 5};
  const std::vector<std::vector<int>> orders = {{0, 1, 2}, {2, 0, 1}, {1, 0, 2},
                                                {0, 2, 1}, {2, 1, 0}, {1, 2, 0}};
  for (plx_dtype d : kAllDtypes) {
    const Tensor x = iota_tensor(shape, d);
    const std::vector<double> xs = x.to_doubles();
    for (const auto& order : orders) {
      INFO(dtype_name(d) << " order " << order[0] << order[1] << order[2]);
      const Tensor p = x.permute(order);
      const std::vector<double> want = permuted(xs, shape, order);
      const Tensor y = call(cpu(), "copy", {p}).at(0);
      REQUIRE(y.dtype() == d);
      REQUIRE(y.shape() == p.shape());
      REQUIRE(y.is_contiguous());
      check_exact(y.to_doubles(), want);
      const Tensor c = p.contiguous();
      REQUIRE(c.is_contiguous());
      check_exact(c.to_doubles(), want);
      // copy_to_host of the view itself goes through contiguous(), i.e. copy.
      check_exact(p.to_doubles(), want);
    }
  }
  // 4-D with size-1 and odd dimensions, the NCHW -> NHWC permutation.
  const Shape s4 = {2, 1, 3, 7};
  const Tensor x4 = random_tensor(s4, PLX_BF16, 3);
  const Tensor p4 = x4.permute({0, 2, 3, 1});
  check_exact(call(cpu(), "copy", {p4}).at(0).to_doubles(),
              permuted(x4.to_doubles(), s4, {0, 2, 3, 1}));
  // Large enough to run in parallel.
  const Shape big = {64, 33, 31};
  const Tensor xb = random_tensor(big, PLX_F32, 4);
  check_exact(xb.permute({2, 0, 1}).contiguous().to_doubles(),
              permuted(xb.to_doubles(), big, {2, 0, 1}));
}

TEST_CASE("copy accepts sliced views with offsets and any strides", "[cpu][ops][misc]") {
  // Tensor has no slicing yet, so the views are built as ABI descriptors over a base tensor and
  // the copy kernel run directly (it declares PLX_KERNEL_STRIDED).
  const OpSchema& s = runtime().ops().get("copy");
  const Shape base_shape = {6, 8, 10};
  struct View {
    int64_t offset;
    Shape shape, strides;
  };
  const std::vector<View> views = {
      {0, {3, 4, 5}, {160, 20, 2}},  // every other element in each dim
      {11, {2, 3, 4}, {80, 10, 1}},  // a box starting at (0, 1, 1): contiguous rows
      {9, {5, 10}, {80, -1}},        // reversed innermost dimension
      {5, {4, 1, 3}, {10, 7, 0}},    // a broadcast (stride 0) and a size-1 dim
      {479, {6, 8}, {-80, -10}},     // both dims reversed, starting at the last row of a column
      {3, {1}, {1}},
      {2, {3, 4}, {1, 1}},  // overlapping (as_strided-style): element (i, j) at 2 + i + j
  };
  for (plx_dtype d : kAllDtypes) {
    const Tensor base = iota_tensor(base_shape, d);
    const std::vector<double> bv = base.to_doubles();
    for (const View& v : views) {
      INFO(dtype_name(d) << " view " << shape_string(v.shape) << " strides "
                         << shape_string(v.strides) << " offset " << v.offset);
      plx_tensor in = base.view();
      in.data = static_cast<char*>(base.data()) + v.offset * static_cast<int64_t>(dtype_size(d));
      in.ndim = static_cast<int32_t>(v.shape.size());
      for (size_t i = 0; i < v.shape.size(); ++i) {
        in.shape[i] = v.shape[i];
        in.strides[i] = v.strides[i];
      }
      const Tensor y = Tensor::empty(cpu(), v.shape, d);
      plx_tensor out = y.view();
      plx_tensor in_desc = in, out_desc = out;
      in_desc.data = out_desc.data = nullptr;
      KernelResolution r = resolve_kernel(cpu(), s, {in_desc}, {out_desc}, s.complete_attrs({}), 0);
      REQUIRE(r.kernel);
      REQUIRE((r.kernel->kernel().flags & PLX_KERNEL_STRIDED) != 0);
      r.kernel->run(&in, 1, &out, 1, nullptr, cpu().stream(0));
      std::vector<double> want;
      std::vector<int64_t> pos(v.shape.size(), 0);
      for (int64_t k = 0; k < shape_numel(v.shape); ++k) {
        int64_t off = v.offset;
        for (size_t i = 0; i < pos.size(); ++i) off += pos[i] * v.strides[i];
        want.push_back(bv[static_cast<size_t>(off)]);
        for (size_t i = pos.size(); i-- > 0;) {
          if (++pos[i] < v.shape[i]) break;
          pos[i] = 0;
        }
      }
      check_exact(y.to_doubles(), want);
    }
  }
}

TEST_CASE("copy gradient is the identity, empty and scalar tensors copy",
          "[cpu][ops][misc][grad]") {
  const Tensor x = random_tensor({3, 4}, PLX_F64, 5);
  check_gradients("copy", {x.permute({1, 0})});
  const Tensor e = random_tensor({0, 3}, PLX_F32, 6);
  CHECK(call(cpu(), "copy", {e.permute({1, 0})}).at(0).shape() == Shape{3, 0});
  const Tensor sc = from_doubles({2.5}, {}, PLX_F16);
  CHECK(call(cpu(), "copy", {sc}).at(0).to_doubles() == std::vector<double>{2.5});
}

// ---- cast ----

TEST_CASE("cast converts every dtype pair", "[cpu][ops][misc]") {
  for (plx_dtype from : kAllDtypes) {
    // The source tensor, and the exact values it holds (to_doubles is exact except for i64
    // beyond 2^53, where the reference sees the same rounded value the result does).
    const Tensor x = exact_tensor(cast_sources(from), from);
    const std::vector<double> xs = x.to_doubles();
    for (plx_dtype to : kAllDtypes) {
      INFO("cast " << dtype_name(from) << " -> " << dtype_name(to));
      const Tensor y = call(cpu(), "cast", {x}, {{"dtype", std::string(dtype_name(to))}}).at(0);
      REQUIRE(y.dtype() == to);
      REQUIRE(y.shape() == x.shape());
      std::vector<double> want;
      for (double v : xs) want.push_back(cast_ref(v, to));
      if (from == PLX_I64 && dtype_is_float(to)) {
        // INT64_MAX/MIN appended last: their exact values, rounded once.
        want[want.size() - 2] = to == PLX_F16 ? INFINITY : std::ldexp(1.0, 63);
        want[want.size() - 1] = to == PLX_F16 ? -INFINITY : -std::ldexp(1.0, 63);
      }
      check_exact(y.to_doubles(), want);
    }
  }
}

TEST_CASE("cast specifics: truncation, saturation, NaN and double rounding", "[cpu][ops][misc]") {
  auto cast1 = [](double v, plx_dtype from, plx_dtype to) {
    return call(cpu(), "cast", {from_doubles({v}, {1}, from)},
                {{"dtype", std::string(dtype_name(to))}})
        .at(0)
        .to_doubles()[0];
  };
  CHECK(cast1(-2.7, PLX_F32, PLX_I32) == -2);
  CHECK(cast1(2.7, PLX_F32, PLX_I32) == 2);
  CHECK(cast1(-2.7, PLX_F32, PLX_U8) == 0);
  CHECK(cast1(1e10, PLX_F64, PLX_I32) == 2147483647);
  CHECK(cast1(-1e10, PLX_F64, PLX_I32) == -2147483648.0);
  CHECK(cast1(300, PLX_F16, PLX_U8) == 255);
  CHECK(cast1(std::nan(""), PLX_F32, PLX_I64) == 0);
  CHECK(cast1(INFINITY, PLX_BF16, PLX_I32) == 2147483647);
  CHECK(cast1(300, PLX_I32, PLX_U8) == 255);
  CHECK(cast1(-5, PLX_I64, PLX_U8) == 0);
  CHECK(cast1(70000, PLX_F32, PLX_F16) == INFINITY);
  CHECK(std::isnan(cast1(std::nan(""), PLX_F64, PLX_BF16)));
  // One rounding from f64: 1 + 2^-11 + 2^-40 is just above the f16 halfway point.
  CHECK(cast1(1 + std::ldexp(1, -11) + std::ldexp(1, -40), PLX_F64, PLX_F16) ==
        1 + std::ldexp(1, -10));
  CHECK(cast1(16842753, PLX_I32, PLX_BF16) == 16908288);  // 2^24 + 2^17
}

TEST_CASE("cast f32 to f16 and bf16 rounds like the harness", "[cpu][ops][misc]") {
  // Random f32 values over many binades, including f16 subnormals and overflow.
  std::vector<double> v = random_doubles(100000, 9, -1, 1);  // enough to run in parallel
  const std::vector<double> scale = random_doubles(v.size(), 10, -30, 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(v[i] * std::exp2(scale[i]));
  const Tensor x = from_doubles(v, {static_cast<int64_t>(v.size())}, PLX_F32);
  for (plx_dtype to : {PLX_F16, PLX_BF16}) {
    INFO(dtype_name(to));
    const Tensor y = call(cpu(), "cast", {x}, {{"dtype", std::string(dtype_name(to))}}).at(0);
    const std::vector<double> got = y.to_doubles();
    check_exact(got, round_to(v, to));
    // ...and like the independent reference (a check of the reference itself).
    std::vector<double> want;
    for (double e : v) want.push_back(round16(e, to == PLX_BF16));
    check_exact(got, want);
  }
}

TEST_CASE("cast gradient casts back between floats only", "[cpu][ops][misc][grad]") {
  const Tensor x = random_tensor({2, 3}, PLX_F64, 11);
  check_gradients("cast", {x}, {{"dtype", std::string("f64")}});
  const Tensor xf = random_tensor({2, 3}, PLX_F32, 12);
  const Tensor y = call(cpu(), "cast", {xf}, {{"dtype", std::string("bf16")}}).at(0);
  const Tensor dy = random_tensor({2, 3}, PLX_BF16, 13);
  const auto g = call_grad(cpu(), "cast", {xf}, {y}, {dy}, {{"dtype", std::string("bf16")}});
  REQUIRE(g[0].defined());
  CHECK(g[0].dtype() == PLX_F32);
  check_exact(g[0].to_doubles(), dy.to_doubles());
  const Tensor yi = call(cpu(), "cast", {xf}, {{"dtype", std::string("i32")}}).at(0);
  const auto gi = call_grad(cpu(), "cast", {xf}, {yi}, {random_ints({2, 3}, PLX_I32, 1, 0, 3)},
                            {{"dtype", std::string("i32")}});
  CHECK(!gi[0].defined());
}

TEST_CASE("cast rejects an unknown dtype name", "[cpu][ops][misc][errors]") {
  const Tensor x = random_tensor({3}, PLX_F32, 1);
  REQUIRE_THROWS_WITH(call(cpu(), "cast", {x}, {{"dtype", std::string("float32")}}),
                      PLX_CONTAINS("op 'cast': unknown dtype 'float32'"));
  REQUIRE_THROWS_WITH(call(cpu(), "cast", {x}), PLX_CONTAINS("missing required attribute 'dtype'"));
  REQUIRE_THROWS_WITH(call(cpu(), "cast", {x}, {{"dtype", int64_t{0}}}),
                      PLX_CONTAINS("attribute 'dtype'"));
}

// ---- dropout ----

TEST_CASE("dropout mask follows philox_uniform and kept values are scaled", "[cpu][ops][misc]") {
  struct Case {
    double p;
    int64_t seed, offset;
  };
  const std::vector<Case> cases = {
      {0.5, 0, 0}, {0.1, 7, 3}, {0.9, 123456789012345, 1ll << 40}, {0.0, 1, 1}, {0.3, -1, 5}};
  for (plx_dtype d : kFloatDtypes) {
    for (const Shape& shape : {Shape{1}, Shape{7}, Shape{3, 5}, Shape{2, 1, 33}, Shape{0}}) {
      for (const Case& cs : cases) {
        INFO(dtype_name(d) << " " << shape_string(shape) << " p " << cs.p << " seed " << cs.seed
                           << " offset " << cs.offset);
        const Tensor x = random_tensor(shape, d, 21, -3, 3);
        const auto outs =
            call(cpu(), "dropout", {x}, {{"p", cs.p}, {"seed", cs.seed}, {"offset", cs.offset}});
        REQUIRE(outs[1].dtype() == PLX_U8);
        REQUIRE(outs[1].shape() == shape);
        const std::vector<double> xs = x.to_doubles();
        std::vector<double> want_mask, want_y;
        for (size_t i = 0; i < xs.size(); ++i) {
          const float u =
              philox_uniform(static_cast<uint64_t>(cs.seed), static_cast<uint64_t>(cs.offset), i);
          const bool keep = u >= static_cast<float>(cs.p);
          want_mask.push_back(keep ? 1 : 0);
          want_y.push_back(keep ? xs[i] / (1 - cs.p) : 0);
        }
        check_exact(outs[1].to_doubles(), want_mask);
        CHECK_ALLCLOSE(outs[0].to_doubles(), round_to(want_y, d), tolerance(d));
        if (cs.p == 0) check_exact(outs[0].to_doubles(), xs);
      }
    }
  }
}

TEST_CASE("dropout keeps an element whose uniform equals p", "[cpu][ops][misc]") {
  // The rule is keep when u >= p: with p set to element 3's own uniform (exact in f32 and f64),
  // element 3 stays and any element below it goes.
  const Tensor x = random_tensor({64}, PLX_F64, 23, 1, 2);
  const double p = philox_uniform(5, 6, 3);
  const auto mask =
      call(cpu(), "dropout", {x}, {{"p", p}, {"seed", int64_t{5}}, {"offset", int64_t{6}}})
          .at(1)
          .to_doubles();
  CHECK(mask[3] == 1);
  for (size_t i = 0; i < mask.size(); ++i)
    CHECK(mask[i] == (philox_uniform(5, 6, i) >= static_cast<float>(p) ? 1 : 0));
}

TEST_CASE("dropout in eval mode passes x through with a mask of ones", "[cpu][ops][misc]") {
  for (plx_dtype d : kFloatDtypes) {
    const Tensor x = random_tensor({4, 9}, d, 22);
    const auto outs = call(cpu(), "dropout", {x}, {{"p", 0.7}, {"training", int64_t{0}}});
    check_exact(outs[0].to_doubles(), x.to_doubles());
    check_exact(outs[1].to_doubles(), std::vector<double>(36, 1.0));
  }
}

TEST_CASE("dropout masks differ across offsets and seeds, and keep about 1-p", "[cpu][ops][misc]") {
  const int64_t n = 1 << 20;
  const Tensor x = from_doubles(std::vector<double>(static_cast<size_t>(n), 1.0), {n}, PLX_F32);
  auto mask = [&](int64_t seed, int64_t offset) {
    return call(cpu(), "dropout", {x}, {{"p", 0.3}, {"seed", seed}, {"offset", offset}})
        .at(1)
        .to_vector<uint8_t>();
  };
  const auto m0 = mask(42, 0), m1 = mask(42, 1), m2 = mask(43, 0);
  auto differing = [](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    size_t k = 0;
    for (size_t i = 0; i < a.size(); ++i) k += a[i] != b[i];
    return k;
  };
  // Independent masks with keep probability 0.7 differ in 2 * 0.7 * 0.3 = 42% of places.
  CHECK(differing(m0, m1) > static_cast<size_t>(n) / 3);
  CHECK(differing(m0, m2) > static_cast<size_t>(n) / 3);
  CHECK(mask(42, 0) == m0);  // and the same (seed, offset) gives the same mask
  // The kept fraction's standard deviation is sqrt(0.21 / n) = 4.5e-4; 0.005 is 11 of them.
  const double kept =
      static_cast<double>(std::count(m0.begin(), m0.end(), 1)) / static_cast<double>(n);
  CHECK(std::fabs(kept - 0.7) < 0.005);
}

TEST_CASE("dropout_backward scales by the mask", "[cpu][ops][misc]") {
  for (plx_dtype d : kFloatDtypes) {
    for (const Shape& shape : {Shape{1}, Shape{5, 3}, Shape{2, 1, 7}}) {
      INFO(dtype_name(d) << " " << shape_string(shape));
      const Tensor dy = random_tensor(shape, d, 31);
      const Tensor mask = random_ints(shape, PLX_U8, 32, 0, 2);
      const Tensor dx = call(cpu(), "dropout_backward", {dy, mask}, {{"p", 0.25}}).at(0);
      const std::vector<double> g = dy.to_doubles(), m = mask.to_doubles();
      std::vector<double> want;
      for (size_t i = 0; i < g.size(); ++i) want.push_back(g[i] * m[i] / 0.75);
      CHECK_ALLCLOSE(dx.to_doubles(), round_to(want, d), tolerance(d));
    }
  }
}

TEST_CASE("dropout gradients match finite differences", "[cpu][ops][misc][grad]") {
  for (const Shape& shape : {Shape{1}, Shape{7}, Shape{3, 1, 5}}) {
    INFO(shape_string(shape));
    const Tensor x = random_tensor(shape, PLX_F64, 41);
    check_gradients("dropout", {x});
    check_gradients("dropout", {x}, {{"p", 0.2}, {"seed", int64_t{9}}, {"offset", int64_t{4}}});
    check_gradients("dropout", {x}, {{"p", 0.6}, {"training", int64_t{0}}});
  }
}

TEST_CASE("dropout rejects p outside 0 <= p < 1", "[cpu][ops][misc][errors]") {
  const Tensor x = random_tensor({4}, PLX_F32, 1);
  for (double p : {1.0, -0.1, 1.5}) {
    REQUIRE_THROWS_WITH(call(cpu(), "dropout", {x}, {{"p", p}}),
                        PLX_CONTAINS("op 'dropout': p must be in [0, 1)"));
  }
  const Tensor mask = random_ints({4}, PLX_U8, 2, 0, 2);
  REQUIRE_THROWS_WITH(call(cpu(), "dropout_backward", {x, mask}, {{"p", 1.0}}),
                      PLX_CONTAINS("op 'dropout_backward': p must be in [0, 1)"));
  REQUIRE_THROWS_WITH(call(cpu(), "dropout_backward", {x, random_ints({5}, PLX_U8, 2, 0, 2)}),
                      PLX_CONTAINS("differ in shape"));
  REQUIRE_THROWS_WITH(call(cpu(), "dropout_backward", {x, random_ints({4}, PLX_I32, 2, 0, 2)}),
                      PLX_CONTAINS("input 'mask' is i32"));
}

// ---- embedding ----

TEST_CASE("embedding forward gathers rows in every dtype", "[cpu][ops][misc]") {
  const int64_t V = 11;
  for (plx_dtype d : kFloatDtypes) {
    for (plx_dtype id : {PLX_I32, PLX_I64}) {
      // (5000) is enough rows to copy in parallel.
      for (const Shape& ishape :
           {Shape{5}, Shape{2, 3}, Shape{1}, Shape{2, 1, 3}, Shape{}, Shape{5000}}) {
        for (int64_t D : {1, 4, 7}) {
          INFO(dtype_name(d) << " " << dtype_name(id) << " indices " << shape_string(ishape)
                             << " D " << D);
          const Tensor w = random_tensor({V, D}, d, 51);
          const Tensor idx = random_ints(ishape, id, 52, 0, V);
          const Tensor y = call(cpu(), "embedding", {w, idx}).at(0);
          Shape ys = ishape;
          ys.push_back(D);
          REQUIRE(y.shape() == ys);
          const std::vector<double> wv = w.to_doubles(), iv = idx.to_doubles();
          std::vector<double> want;
          for (double i : iv)
            for (int64_t j = 0; j < D; ++j)
              want.push_back(wv[static_cast<size_t>(static_cast<int64_t>(i) * D + j)]);
          check_exact(y.to_doubles(), want);
        }
      }
    }
  }
}

TEST_CASE("embedding_backward sums rows by index and skips padding_idx", "[cpu][ops][misc]") {
  const int64_t V = 6, D = 17;
  for (plx_dtype d : kFloatDtypes) {
    for (plx_dtype id : {PLX_I32, PLX_I64}) {
      for (int64_t pad : {int64_t{-1}, int64_t{2}}) {
        // Repeated indices, a row never used, and (4000) enough work to split the columns among
        // threads.
        for (const Shape& ishape : {Shape{9}, Shape{3, 4}, Shape{1}, Shape{4000}}) {
          INFO(dtype_name(d) << " " << dtype_name(id) << " pad " << pad << " "
                             << shape_string(ishape));
          Shape ys = ishape;
          ys.push_back(D);
          const Tensor idx = random_ints(ishape, id, 61, 0, V - 1);  // row V-1 never used
          const Tensor dy = random_tensor(ys, d, 62);
          const Tensor dw = call(cpu(), "embedding_backward", {dy, idx},
                                 {{"num_weights", V}, {"padding_idx", pad}})
                                .at(0);
          REQUIRE(dw.shape() == Shape{V, D});
          REQUIRE(dw.dtype() == d);
          const std::vector<double> g = dy.to_doubles(), iv = idx.to_doubles();
          std::vector<double> want(static_cast<size_t>(V * D), 0.0);
          std::vector<int64_t> count(static_cast<size_t>(V), 0);
          for (size_t i = 0; i < iv.size(); ++i) {
            const int64_t v = static_cast<int64_t>(iv[i]);
            if (v == pad) continue;
            ++count[static_cast<size_t>(v)];
            for (int64_t j = 0; j < D; ++j)
              want[static_cast<size_t>(v * D + j)] +=
                  g[i * static_cast<size_t>(D) + static_cast<size_t>(j)];
          }
          // A row sums `count` values: f32 accumulation error grows like sqrt(count).
          const int64_t most = *std::max_element(count.begin(), count.end());
          Tol tol = tolerance(d);
          tol.atol *= std::sqrt(static_cast<double>(std::max<int64_t>(most, 1)));
          CHECK_ALLCLOSE(dw.to_doubles(), round_to(want, d), tol);
          if (pad >= 0) {
            const std::vector<double> got = dw.to_doubles();
            for (int64_t j = 0; j < D; ++j) CHECK(got[static_cast<size_t>(pad * D + j)] == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("embedding_backward is deterministic", "[cpu][ops][misc]") {
  const Tensor idx = random_ints({20000}, PLX_I64, 71, 0, 7);
  const Tensor dy = random_tensor({20000, 3}, PLX_F32, 72);
  const auto a = call(cpu(), "embedding_backward", {dy, idx}, {{"num_weights", int64_t{7}}}).at(0);
  const auto b = call(cpu(), "embedding_backward", {dy, idx}, {{"num_weights", int64_t{7}}}).at(0);
  CHECK(a.to_vector<float>() == b.to_vector<float>());
}

TEST_CASE("embedding gradients match finite differences, padding_idx gets none",
          "[cpu][ops][misc][grad]") {
  const Tensor w = random_tensor({5, 3}, PLX_F64, 81);
  for (plx_dtype id : {PLX_I32, PLX_I64}) {
    const Tensor idx = from_doubles({1, 3, 1, 0, 3, 3}, {2, 3}, id);
    check_gradients("embedding", {w, idx});
    // padding_idx on a row the indices do not use: finite differences agree (zero) as well.
    check_gradients("embedding", {w, idx}, {{"padding_idx", int64_t{4}}});
    // On a used row, the gradient is zero by definition, not the derivative.
    const Attrs pad = {{"padding_idx", int64_t{3}}};
    const auto y = call(cpu(), "embedding", {w, idx}, pad);
    const Tensor dy = random_tensor({2, 3, 3}, PLX_F64, 82);
    const auto g = call_grad(cpu(), "embedding", {w, idx}, y, {dy}, pad);
    REQUIRE(g[0].shape() == Shape{5, 3});
    CHECK(!g[1].defined());
    const std::vector<double> gv = g[0].to_doubles(), dv = dy.to_doubles();
    for (int64_t j = 0; j < 3; ++j) {
      CHECK(gv[static_cast<size_t>(3 * 3 + j)] == 0);
      const double want = dv[static_cast<size_t>(0 * 3 + j)] + dv[static_cast<size_t>(2 * 3 + j)];
      CHECK(std::fabs(gv[static_cast<size_t>(1 * 3 + j)] - want) < 1e-12);
    }
  }
}

TEST_CASE("embedding rejects out-of-range indices and bad shapes", "[cpu][ops][misc][errors]") {
  const Tensor w = random_tensor({10, 4}, PLX_F32, 1);
  for (plx_dtype id : {PLX_I32, PLX_I64}) {
    const Tensor idx = from_doubles({1, 2, 3, 12, 4}, {5}, id);
    REQUIRE_THROWS_WITH(call(cpu(), "embedding", {w, idx}),
                        PLX_CONTAINS("embedding: index 12 at position 3 is outside [0, 10)"));
    const Tensor neg = from_doubles({-1}, {1}, id);
    REQUIRE_THROWS_WITH(call(cpu(), "embedding", {w, neg}), PLX_CONTAINS("index -1 at position 0"));
    const Tensor dy = random_tensor({5, 4}, PLX_F32, 2);
    REQUIRE_THROWS_WITH(
        call(cpu(), "embedding_backward", {dy, idx}, {{"num_weights", int64_t{10}}}),
        PLX_CONTAINS("embedding_backward: index 12 at position 3"));
  }
  const Tensor idx = random_ints({3}, PLX_I32, 3, 0, 10);
  REQUIRE_THROWS_WITH(call(cpu(), "embedding", {random_tensor({10}, PLX_F32, 4), idx}),
                      PLX_CONTAINS("op 'embedding': weight (10) must be 2-D"));
  REQUIRE_THROWS_WITH(call(cpu(), "embedding", {w, random_tensor({3}, PLX_F32, 5)}),
                      PLX_CONTAINS("input 'indices' is f32"));
  REQUIRE_THROWS_WITH(call(cpu(), "embedding", {w, idx}, {{"padding_idx", int64_t{10}}}),
                      PLX_CONTAINS("padding_idx 10"));
  REQUIRE_THROWS_WITH(call(cpu(), "embedding_backward",
                           {random_tensor({3, 5}, PLX_F32, 6), random_ints({4}, PLX_I32, 1, 0, 3)},
                           {{"num_weights", int64_t{10}}}),
                      PLX_CONTAINS("must be indices (4) plus the embedding dimension"));
  REQUIRE_THROWS_WITH(call(cpu(), "embedding_backward", {random_tensor({3, 5}, PLX_F32, 6), idx}),
                      PLX_CONTAINS("missing required attribute 'num_weights'"));
}
