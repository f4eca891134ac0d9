// Tensors: host round trips in every dtype, views, copies across backends, the ABI view.
#include <cmath>

#include "plexus/error.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

TEST_CASE("host round trips keep values in every dtype", "[cpu][tensor]") {
  const std::vector<double> v = {0, 1, -2, 3.5, 100, -0.25};
  for (int d = 0; d < PLX_DTYPE_COUNT; ++d) {
    const plx_dtype dt = static_cast<plx_dtype>(d);
    INFO(dtype_name(dt));
    std::vector<double> in = v;
    if (dt == PLX_U8) in = {0, 1, 2, 3, 100, 255};
    if (!dtype_is_float(dt) && dt != PLX_U8) in = {0, 1, -2, 3, 100, -7};
    const Tensor t = from_doubles(in, {2, 3}, dt);
    CHECK(t.dtype() == dt);
    CHECK(t.shape() == Shape{2, 3});
    CHECK(t.nbytes() == 6 * dtype_size(dt));
    CHECK(t.to_doubles() == round_to(in, dt));
  }
}

TEST_CASE("16-bit conversions round to nearest even", "[tensor]") {
  // 1 + 2^-11 lies halfway between two f16 values: it rounds to the even one, 1.0.
  CHECK(static_cast<float>(half(1.0f + 0.00048828125f)) == 1.0f);
  CHECK(static_cast<float>(half(1.0f + 3 * 0.00048828125f)) == 1.001953125f);
  CHECK(static_cast<float>(half(65504.0f)) == 65504.0f);
  CHECK(std::isinf(static_cast<float>(half(65520.0f))));
  CHECK(static_cast<float>(half(5.9604644775390625e-8f)) == 5.9604644775390625e-8f);  // subnormal
  CHECK(std::isnan(static_cast<float>(half(NAN))));
  CHECK(static_cast<float>(bfloat16(1.0f + 0.00390625f)) == 1.0f);  // halfway: to even
  CHECK(static_cast<float>(bfloat16(1.0f + 3 * 0.00390625f)) == 1.015625f);
  CHECK(std::isnan(static_cast<float>(bfloat16(NAN))));
  // Every f16 bit pattern converts to f32 and back unchanged (NaNs stay NaN).
  for (uint32_t b = 0; b < 65536; ++b) {
    const half h = half::from_bits(static_cast<uint16_t>(b));
    const float f = static_cast<float>(h);
    if (std::isnan(f)) continue;
    REQUIRE(half(f).bits == h.bits);
  }
}

TEST_CASE("the f16 conversions in use equal the portable ones", "[tensor]") {
  // With F16C (PLX_HAVE_F16C) the conversions are the hardware's; the portable code is what
  // device code and other CPUs run. Every half, and floats across the whole range: the same
  // bits (NaN: a NaN of the same sign either way).
  INFO("hardware F16C path: " << PLX_HAVE_F16C);
  auto same = [](float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
    return detail::f32_bits(a) == detail::f32_bits(b);
  };
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    REQUIRE(same(f16_bits_to_f32(h), f16_bits_to_f32_portable(h)));
  }
  auto check = [](float f) {
    const uint16_t a = f32_to_f16_bits(f), p = f32_to_f16_bits_portable(f);
    if (std::isnan(f)) {
      REQUIRE((a & 0x7c00u) == 0x7c00u);
      REQUIRE((a & 0x3ffu) != 0);
      REQUIRE((a & 0x8000u) == (p & 0x8000u));
    } else {
      INFO("f32 bits " << detail::f32_bits(f));
      REQUIRE(a == p);
    }
  };
  // Every 4099th float bit pattern (about a million), the halves' ties and their neighbours.
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) check(detail::f32_from_bits(static_cast<uint32_t>(u)));
  for (uint32_t b = 0; b < 0x7c00u; ++b) {
    const float lo = f16_bits_to_f32_portable(static_cast<uint16_t>(b));
    const float hi = f16_bits_to_f32_portable(static_cast<uint16_t>(b + 1));
    const float mid = lo + (hi - lo) / 2;  // exact in f32
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      check(f);
      check(-f);
    }
  }
}

TEST_CASE("reshape and permute are views, contiguous copies", "[cpu][tensor]") {
  const Tensor t = from_doubles({0, 1, 2, 3, 4, 5}, {2, 3}, PLX_F32);
  const Tensor r = t.reshape({3, 2});
  CHECK(r.data() == t.data());
  CHECK(r.shape() == Shape{3, 2});
  CHECK(t.reshape({-1}).shape() == Shape{6});
  REQUIRE_THROWS_WITH(t.reshape({4, 2}), PLX_CONTAINS("cannot view (2, 3) as (4, 2)"));
  const Tensor p = t.permute({1, 0});
  CHECK(p.shape() == Shape{3, 2});
  CHECK_FALSE(p.is_contiguous());
  CHECK(p.data() == t.data());
  REQUIRE_THROWS_WITH(p.reshape({6}), PLX_CONTAINS("not contiguous"));
  // Reading a permuted view gives the permuted values.
  CHECK(p.to_doubles() == std::vector<double>{0, 3, 1, 4, 2, 5});
  const Tensor c = p.contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.data() != t.data());
  CHECK(c.to_doubles() == std::vector<double>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("ops take non-contiguous inputs through a contiguous copy", "[cpu][tensor]") {
  const Tensor t = from_doubles({-1, 2, -3, 4, -5, 6}, {2, 3}, PLX_F32);
  const Tensor y = call(cpu(), "relu", {t.permute({1, 0})}).at(0);
  CHECK(y.shape() == Shape{3, 2});
  CHECK(y.to_doubles() == std::vector<double>{0, 4, 2, 0, 0, 6});
}

TEST_CASE("tensors move between backends through the host", "[cpu][tensor]") {
  RuntimeOptions o;
  o.plugins.paths = {plugin_dir(), fixture_dir() + "/good"};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  Runtime rt(o);
  const Tensor a = Tensor::from_vector(rt.backend("cpu"), std::vector<float>{1, 2, 3}, {3});
  const Tensor b = a.to(rt.backend("testdev"));
  CHECK(&b.backend() == &rt.backend("testdev"));
  CHECK(b.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(b.str() == "testdev:0 f32(3)");
  CHECK(a.to(rt.backend("cpu")).data() == a.data());  // already there: no copy
}

TEST_CASE("the ABI view describes the tensor", "[cpu][tensor]") {
  const Tensor t = Tensor::zeros(cpu(), {2, 3, 4}, PLX_BF16);
  const plx_tensor v = t.view();
  CHECK(v.data == t.data());
  CHECK(v.dtype == PLX_BF16);
  CHECK(v.ndim == 3);
  CHECK(v.shape[0] == 2);
  CHECK(v.shape[2] == 4);
  CHECK(v.strides[0] == 12);
  CHECK(v.strides[2] == 1);
  CHECK(t.is_contiguous());
  CHECK(Tensor().view().dtype == PLX_DTYPE_NONE);
  for (double x : t.to_doubles()) CHECK(x == 0.0);
}

TEST_CASE("bad tensor requests are errors", "[cpu][tensor]") {
  REQUIRE_THROWS_WITH(Tensor::empty(cpu(), {2, -1}, PLX_F32), PLX_CONTAINS("negative dimension"));
  REQUIRE_THROWS_WITH(Tensor::empty(cpu(), Shape(9, 1), PLX_F32), PLX_CONTAINS("at most 8"));
  REQUIRE_THROWS_WITH(Tensor::empty(cpu(), {2}, PLX_F32, 3), PLX_CONTAINS("has no device 3"));
  REQUIRE_THROWS_WITH(Tensor().copy_to_host(nullptr), PLX_CONTAINS("undefined tensor"));
}

TEST_CASE("narrow views a range of a dimension", "[cpu][tensor]") {
  const Tensor t = from_doubles({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {4, 3}, PLX_F32);
  const Tensor rows = t.narrow(0, 1, 2);  // rows 1 and 2
  CHECK(rows.shape() == Shape{2, 3});
  CHECK(rows.is_contiguous());
  CHECK(rows.to_doubles() == std::vector<double>{3, 4, 5, 6, 7, 8});
  const Tensor cols = t.narrow(-1, 1, 2);  // columns 1 and 2: strided
  CHECK_FALSE(cols.is_contiguous());
  CHECK(cols.to_doubles() == std::vector<double>{1, 2, 4, 5, 7, 8, 10, 11});
  // Ops see the view's values, and writing through a view writes the base tensor.
  CHECK(call(cpu(), "sum", {cols}).at(0).to_doubles() == std::vector<double>{48});
  Tensor last = t.narrow(0, 3, 1);
  last.copy_from_host(std::vector<float>{-1, -2, -3}.data());
  CHECK(t.to_doubles().back() == -3);
  CHECK(t.narrow(0, 4, 0).numel() == 0);
  REQUIRE_THROWS_WITH(t.narrow(0, 3, 2), PLX_CONTAINS("entries [3, 5) of dimension 0 of size 4"));
  REQUIRE_THROWS_WITH(t.narrow(2, 0, 1), PLX_CONTAINS("dimension 2 of a 2-d tensor"));
}
