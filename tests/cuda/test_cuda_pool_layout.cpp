// The CUDA plugin's max-pool kernels (plugins/cuda/ops/pool.cu) in every layout mix they take:
// each 4-D tensor NCHW contiguous or channels-last, as the layout planner may hand them (they
// prefer channels-last in 16 bits). Every registered max_pool2d and max_pool2d_backward kernel,
// created by itself for each mix of (x, y, indices) and of (dy, indices, dx), against the CPU
// plugin on NCHW tensors: the pooled values and the indices exactly, dx within the tolerance of
// its sums. Outputs start as NaN (0xFF bytes), so an element left unwritten fails. Other strides
// are declined.
#include <array>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/layout_candidate.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/plugin.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::layout_candidate;

namespace {

struct PoolGeo {
  Shape x;
  Ints kernel, stride, padding, dilation;
  int64_t ceil;
};

// Our models' pools (2x2, stride 2, on an odd plane as in simplecnn), overlapping windows with
// padding, dilation, ceil_mode, a rectangular window, and an empty batch.
const std::vector<PoolGeo>& geometries() {
  static const std::vector<PoolGeo> g = {
      {{2, 16, 13, 13}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, 0},
      {{3, 8, 9, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 0},
      {{2, 12, 10, 9}, {3, 3}, {1, 1}, {1, 1}, {2, 2}, 0},
      {{2, 8, 5, 5}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, 1},
      {{1, 24, 6, 7}, {3, 2}, {1, 2}, {1, 0}, {1, 1}, 0},
      {{0, 8, 4, 4}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, 0},
  };
  return g;
}

std::string describe(const PoolGeo& g) {
  auto s = [](const std::vector<int64_t>& v) {
    std::string r = "(";
    for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + std::to_string(v[i]);
    return r + ")";
  };
  return "x" + s(g.x) + " kernel " + s(g.kernel) + " stride " + s(g.stride) + " padding " +
         s(g.padding) + " dilation " + s(g.dilation) + (g.ceil ? " ceil_mode" : "");
}

Attrs attrs_of(const PoolGeo& g) {
  return Attrs{{"kernel", g.kernel},
               {"stride", g.stride},
               {"padding", g.padding},
               {"dilation", g.dilation},
               {"ceil_mode", g.ceil}};
}

// The three tensors of a node, each channels-last or not: all eight mixes.
std::vector<std::array<bool, 3>> mixes() {
  std::vector<std::array<bool, 3>> m;
  for (int i = 0; i < 8; ++i) m.push_back({(i & 1) != 0, (i & 2) != 0, (i & 4) != 0});
  return m;
}

std::string mix_name(const char* a, const char* b, const char* c, const std::array<bool, 3>& m) {
  auto n = [](bool v) { return v ? "nhwc" : "nchw"; };
  return std::string(a) + " " + n(m[0]) + ", " + b + " " + n(m[1]) + ", " + c + " " + n(m[2]);
}

std::vector<const plx_kernel*> kernels_of(Backend& gpu, const OpSchema& s, plx_dtype d) {
  const auto span = gpu.kernels(s.id, d);
  const std::vector<const plx_kernel*> ks(span.begin(), span.end());
  REQUIRE_FALSE(ks.empty());
  return ks;
}

void check_layout_pref(const plx_kernel* k, plx_dtype d) {
  CHECK(k->layout == (d == PLX_F32 ? PLX_LAYOUT_NCHW : PLX_LAYOUT_NHWC));
  CHECK((k->flags & PLX_KERNEL_DETERMINISTIC) != 0);
}

}  // namespace

TEST_CASE("cuda max-pool kernels match the cpu in every layout mix", "[cuda][layout]") {
  PLX_REQUIRE_CUDA(gpu);
  const OpSchema& fwd = runtime().ops().get("max_pool2d");
  const OpSchema& bwd = runtime().ops().get("max_pool2d_backward");
  cmp::Tolerance exact;
  exact.exact = true;
  uint64_t seed = 20261124;
  int ran_fwd = 0, ran_bwd = 0;
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16})
    for (const PoolGeo& g : geometries())
      for (int variant = 0; variant < 3; ++variant) {
        // Plain i32 indices; with relu_mask; u8 window taps with relu_mask.
        Attrs a = attrs_of(g);
        if (variant >= 1) a.set("relu_mask", int64_t{1});
        if (variant == 2) a.set("window_index", int64_t{1});
        const std::string what = describe(g) + (variant == 1   ? ", relu_mask"
                                                : variant == 2 ? ", window_index"
                                                               : "");
        const Tensor x = random_tensor(g.x, d, ++seed);
        const std::vector<Tensor> want = call(cpu(), "max_pool2d", {x}, a);
        const Tensor& want_y = want.at(0);
        const Tensor& want_idx = want.at(1);
        Attrs ba = attrs_of(g);
        if (variant == 2) ba.set("window_index", int64_t{1});
        ba.set("input_shape", Ints(g.x));
        const Tensor dy = random_tensor(want_y.shape(), d, ++seed);
        const Tensor want_dx = call(cpu(), "max_pool2d_backward", {dy, want_idx}, ba)[0];
        const int64_t taps = g.kernel[0] * g.kernel[1];
        for (const auto& m : mixes()) {
          for (const plx_kernel* k : kernels_of(gpu, fwd, d)) {
            INFO("max_pool2d " << dtype_name(d) << " " << k->impl << ": " << what << ", "
                               << mix_name("x", "y", "indices", m));
            check_layout_pref(k, d);
            Tensor y = poisoned(gpu, want_y.shape(), d, m[1]);
            Tensor idx = poisoned(gpu, want_idx.shape(), want_idx.dtype(), m[2]);
            const std::string why = run_candidate(gpu, fwd, k, {on_gpu(gpu, x, m[0])}, {y, idx}, a);
            INFO("declined: " << why);
            REQUIRE(why.empty());
            ++ran_fwd;
            CHECK(cmp::compare_tensors(y.contiguous().to(cpu()), want_y, exact) == "");
            CHECK(cmp::compare_tensors(idx.contiguous().to(cpu()), want_idx, exact) == "");
          }
          for (const plx_kernel* k : kernels_of(gpu, bwd, d)) {
            INFO("max_pool2d_backward " << dtype_name(d) << " " << k->impl << ": " << what << ", "
                                        << mix_name("dy", "indices", "dx", m));
            check_layout_pref(k, d);
            Tensor dx = poisoned(gpu, g.x, d, m[2]);
            const std::string why = run_candidate(
                gpu, bwd, k, {on_gpu(gpu, dy, m[0]), on_gpu(gpu, want_idx, m[1])}, {dx}, ba);
            INFO("declined: " << why);
            REQUIRE(why.empty());
            ++ran_bwd;
            CHECK(cmp::compare_tensors(dx.contiguous().to(cpu()), want_dx,
                                       cmp::tolerance_for(d, taps, false)) == "");
          }
        }
      }
  CHECK(ran_fwd == 3 * 6 * 3 * 8);
  CHECK(ran_bwd == 3 * 6 * 3 * 8);
}

TEST_CASE("cuda max-pool kernels decline strides that are neither nchw nor channels-last",
          "[cuda][layout]") {
  PLX_REQUIRE_CUDA(gpu);
  const OpSchema& fwd = runtime().ops().get("max_pool2d");
  const OpSchema& bwd = runtime().ops().get("max_pool2d_backward");
  const Attrs a{{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}};
  Attrs ba = a;
  ba.set("input_shape", Ints{2, 8, 6, 6});
  for (plx_dtype d : {PLX_F32, PLX_BF16}) {
    // x with H and W swapped in memory: a transposed view of a (2, 8, 6, 6) tensor.
    const Tensor x = random_tensor({2, 8, 6, 6}, d, 7).to(gpu).permute({0, 1, 3, 2});
    const std::vector<Tensor> want = call(cpu(), "max_pool2d", {x.to(cpu()).contiguous()}, a);
    for (const plx_kernel* k : kernels_of(gpu, fwd, d)) {
      INFO("max_pool2d " << dtype_name(d) << " " << k->impl);
      Tensor y = poisoned(gpu, want[0].shape(), d, false);
      Tensor idx = poisoned(gpu, want[1].shape(), want[1].dtype(), false);
      const std::string why = run_candidate(gpu, fwd, k, {x}, {y, idx}, a);
      CHECK(why.find("x must be NCHW contiguous or channels-last") != std::string::npos);
    }
    const Tensor dy = random_tensor(want[0].shape(), d, 8).to(gpu);
    for (const plx_kernel* k : kernels_of(gpu, bwd, d)) {
      INFO("max_pool2d_backward " << dtype_name(d) << " " << k->impl);
      Tensor buf = poisoned(gpu, {2, 8, 6, 6}, d, false);
      const Tensor dx = buf.permute({0, 1, 3, 2});
      const std::string why = run_candidate(gpu, bwd, k, {dy, want[1].to(gpu)}, {dx}, ba);
      CHECK(why.find("dx must be NCHW contiguous or channels-last") != std::string::npos);
    }
  }
}
