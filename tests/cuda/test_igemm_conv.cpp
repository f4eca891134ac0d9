// The CUDA plugin's own implicit-GEMM convolutions (plugins/cuda/ops/igemm_conv.cuh): every
// igemm_* candidate of conv2d, conv2d_backward_data and conv2d_backward_weight, created
// explicitly one by one (the ordinary dispatch would take cuDNN, registered first), run against
// the CPU plugin on shapes with ragged tile edges, padding and stride variants, with and without
// bias, in every layout mix the kernels take (NCHW contiguous or channels-last per tensor), in f16,
// bf16 and f32 (TF32, gathered in place). Outputs start as NaN (0xFF bytes) so an element a kernel
// leaves unwritten fails, and the workspace starts as NaN too so a kernel that reads it before
// writing fails.
//
// The forward's epilogues for fused groups (a ReLU: test_cuda_conv_relu.cpp; a 2x2 max pool:
// the last test here) run through the fusion API, on graphs.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/conv_geometry.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/fused_pair.hpp"
#include "cuda/layout_candidate.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::layout_candidate;
using namespace plexus::test::conv_geo;

namespace {

constexpr const char* kPrefix = "igemm_";

// Our models' convolutions (simplecnn's and convnet's second and third layers, at a small
// batch) and shapes that leave ragged edges in M = N·OH·OW, in O, in K = KH·KW·C and in the
// weight gradient's J = KH·KW·C, for every tile (128x128, 128x64, 64x64, 128x32, BK 32).
const std::vector<Geo>& geometries() {
  static const std::vector<Geo> g = {
      {{2, 16, 13, 13}, 32, 3, 3, {1, 1}, {0, 0}},   // simplecnn conv2 (K = 144: K tail)
      {{2, 32, 28, 28}, 64, 3, 3, {1, 1}, {1, 1}},   // convnet conv2 (M = 1568)
      {{2, 64, 14, 14}, 128, 3, 3, {1, 1}, {1, 1}},  // convnet conv3
      {{2, 128, 9, 7}, 24, 3, 3, {2, 2}, {1, 1}},    // C of two 64-channel blocks, stride 2
      {{1, 96, 7, 6}, 24, 3, 3, {2, 1}, {1, 1}},     // C of three 32-channel blocks, mixed stride
      {{3, 8, 7, 9}, 16, 3, 3, {2, 2}, {1, 1}},      // stride 2, small O
      {{2, 24, 9, 6}, 8, 3, 2, {1, 2}, {2, 1}},      // rectangular kernel, mixed stride
      {{1, 8, 5, 5}, 200, 1, 1, {1, 1}, {0, 0}},     // 1x1, O over two 128 tiles, ragged
      {{2, 40, 11, 10}, 24, 5, 5, {3, 3}, {2, 2}},   // large stride and padding
      {{2, 16, 6, 6}, 16, 3, 3, {1, 1}, {2, 2}},     // padding = KH - 1 (dy padded by 0)
      {{1, 8, 3, 3}, 8, 3, 3, {1, 1}, {0, 0}},       // one output pixel
      {{0, 16, 5, 5}, 8, 3, 3, {1, 1}, {1, 1}},      // empty batch
  };
  return g;
}

// TF32 gathers 4 bytes at a time and takes any channel count from 8: odd C and O (odd rows of
// the weight gradient's partials, odd output pairs), which the 16-bit kernels decline.
const std::vector<Geo>& tf32_geometries() {
  static const std::vector<Geo> g = {
      {{2, 33, 9, 9}, 17, 3, 3, {1, 1}, {1, 1}},  // the op suite's odd case, smaller
      {{1, 9, 7, 6}, 5, 3, 2, {2, 1}, {0, 1}},    // odd everything, a rectangular kernel
  };
  return g;
}

// The Hopper tiles (wgmma, sm_90a): registered in 16 bits where the plugin was built for sm_90
// (the CUDA emulator is an H100), and declined by devices other than 9.0. The weight gradient has
// tiles of its own (64 or 128 output channels, and N a multiple of 64: MN-major operands).
const std::vector<std::string> kWgmmaTiles = {"igemm_wgmma_128x128x64", "igemm_wgmma_128x64x64",
                                              "igemm_wgmma_128x32x64"};
// The same tiles with A through the TMA's im2col mode (the forward, and backward data),
// registered after them, and the narrow one (K tiles of 32 channels, the 64-byte swizzle: C % 64
// in 1..32 only); the weight gradient's (kWgmmaWgradTiles) read x so.
const std::vector<std::string> kWgmmaIm2colTiles = {
    "igemm_wgmma_im2col_128x128x64", "igemm_wgmma_im2col_128x64x64", "igemm_wgmma_im2col_128x32x64",
    "igemm_wgmma_im2col_128x64x32"};
// The im2col tiles again, persistent and warp-specialized (a producer warp; the blocks walk the
// output tiles), registered last.
const std::vector<std::string> kWgmmaPersistentTiles = {
    "igemm_wgmma_im2col_128x128x64_persistent", "igemm_wgmma_im2col_128x64x64_persistent",
    "igemm_wgmma_im2col_128x32x64_persistent", "igemm_wgmma_im2col_128x64x32_persistent"};
// The weight gradient's: gathering, im2col, and im2col with a producer warp (_ws), the last in
// x's boxes of 32 channels (_c32: C an odd multiple of 32 only).
const std::vector<std::string> kWgmmaWgradTiles = {"igemm_wgmma_128x128x64",
                                                   "igemm_wgmma_128x64x64",
                                                   "igemm_wgmma_64x128x64",
                                                   "igemm_wgmma_im2col_128x128x64",
                                                   "igemm_wgmma_im2col_128x64x64",
                                                   "igemm_wgmma_im2col_64x128x64",
                                                   "igemm_wgmma_im2col_128x128x64_ws",
                                                   "igemm_wgmma_im2col_128x64x64_ws",
                                                   "igemm_wgmma_im2col_64x128x64_ws",
                                                   "igemm_wgmma_im2col_64x128x64_c32_ws",
                                                   "igemm_wgmma_im2col_64x96x64_c32_ws"};

bool is_wgmma_tile(const std::string& impl) {
  return impl.rfind("igemm_wgmma_", 0) == 0;
}

// Whether b registers the Hopper tiles (the plugin was built for sm_90).
bool has_wgmma_tiles(Backend& b) {
  for (const plx_kernel* k : b.kernels(runtime().ops().get("conv2d").id, PLX_BF16))
    if (k->impl && is_wgmma_tile(k->impl)) return true;
  return false;
}

std::vector<const plx_kernel*> candidates(Backend& gpu, const OpSchema& s, plx_dtype d) {
  std::vector<const plx_kernel*> out;
  for (const plx_kernel* k : gpu.kernels(s.id, d))
    if (k->impl && std::string(k->impl).rfind(kPrefix, 0) == 0) out.push_back(k);
  return out;
}

// Layout mixes: (x, w, y) channels-last or not. All NCHW is what the executor hands today;
// all channels-last is the fast path; the mixed ones exercise each staging step alone.
const Layouts kLayouts[] = {
    {false, false, false}, {true, true, true}, {true, false, false}, {false, true, true}};

// How many times each candidate ran (its results compared), by run_key.
using Runs = std::map<std::string, int>;
std::string run_key(const std::string& op, plx_dtype d, const std::string& impl) {
  return op + " " + dtype_name(d) + " " + impl;
}

// Runs every candidate of `op` for one node; checks that each one accepts when `must_accept`,
// and compares each result with `want`.
void check_candidates(Backend& gpu, const std::string& op, plx_dtype d,
                      const std::vector<Tensor>& in, const Shape& out_shape, bool out_nhwc,
                      const Attrs& attrs, const Tensor& want, int64_t terms, bool must_accept,
                      const std::string& what, Runs* ran) {
  const OpSchema& s = runtime().ops().get(op);
  const std::vector<const plx_kernel*> ks = candidates(gpu, s, d);
  REQUIRE(ks.size() >= 4);  // one per tile
  for (const plx_kernel* k : ks) {
    INFO(op << " " << dtype_name(d) << " " << k->impl << ": " << what);
    CHECK((k->flags & PLX_KERNEL_LIBRARY) == 0);
    CHECK((k->flags & PLX_KERNEL_DETERMINISTIC) != 0);
    CHECK((k->flags & PLX_KERNEL_CAPTURABLE) != 0);
    CHECK(k->layout == (d == PLX_F32 ? PLX_LAYOUT_ANY : PLX_LAYOUT_NHWC));
    Tensor out = poisoned(gpu, out_shape, d, out_nhwc);
    const std::string why = run_candidate(gpu, s, k, in, {out}, attrs);
    if (!why.empty()) {
      INFO("declined: " << why);
      // sm_90a code on another device: the decline is the whole test of such a candidate.
      const bool other_device =
          is_wgmma_tile(k->impl) && why.find("compute capability 9.0") != std::string::npos;
      // The im2col weight gradient reads x in boxes of 64 channels of one tap (the _c32 one in
      // boxes of 32, C an odd multiple of 32), and the narrow forward (K tiles of 32 channels)
      // takes only C % 64 in 1..32.
      const bool im2col_c = std::string(k->impl).rfind("igemm_wgmma_im2col_", 0) == 0 &&
                            (why.find("must be a multiple of 64") != std::string::npos ||
                             why.find("must be an odd multiple of 32") != std::string::npos ||
                             why.find("to the 64-channel ones") != std::string::npos);
      CHECK((!must_accept || other_device || im2col_c));
      continue;
    }
    ++(*ran)[run_key(op, d, k->impl)];
    const Tensor got = out.contiguous().to(cpu());
    const std::string diff =
        cmp::compare_tensors(got, want, cmp::tolerance_for(d, terms, d == PLX_F32));
    INFO(diff);
    CHECK(diff.empty());
  }
}

}  // namespace

TEST_CASE("cuda igemm convolution candidates match the cpu reference", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_guard(gpu);
  uint64_t seed = 20261123;
  Runs ran;
  const std::vector<plx_dtype> dtypes = test_dtypes({PLX_F16, PLX_BF16, PLX_F32});
  REQUIRE(!dtypes.empty());
  for (plx_dtype d : dtypes) {
    // f32 is TF32 (the kernels decline it with the option off: the decline test).
    REQUIRE(cuda::set_tf32(gpu, d == PLX_F32));
    std::vector<Geo> geos = geometries();
    if (d == PLX_F32) geos.insert(geos.end(), tf32_geometries().begin(), tf32_geometries().end());
    for (const Geo& g : geos) {
      const ConvCase c = make_case(g, d, seed);
      const bool stride1 = g.stride[0] == 1 && g.stride[1] == 1;
      for (const Layouts& l : kLayouts) {
        const std::string what = describe(g) + ", " + layout_name(l);
        const Tensor gx = on_gpu(gpu, c.x, l.x), gw = on_gpu(gpu, c.w, l.w);
        const Tensor gdy = on_gpu(gpu, c.dy, l.y);
        const Tensor gb = c.b.to(gpu);
        check_candidates(gpu, "conv2d", d, {gx, gw, Tensor()}, c.y_shape, l.y, c.geo, c.want_y,
                         g.x[1] * g.kh * g.kw + 1, true, what, &ran);
        check_candidates(gpu, "conv2d", d, {gx, gw, gb}, c.y_shape, l.y, c.geo, c.want_yb,
                         g.x[1] * g.kh * g.kw + 1, true, what + ", bias", &ran);
        // Backward data: stride 1 only (dx as a convolution of dy); dx in x's layout.
        check_candidates(gpu, "conv2d_backward_data", d, {gdy, gw}, g.x, l.x, c.bd_attrs, c.want_dx,
                         g.o * g.kh * g.kw, stride1, what, &ran);
        // Backward weight: dw in w's layout.
        check_candidates(
            gpu, "conv2d_backward_weight", d, {gdy, gx}, c.w_shape, l.w, c.bw_attrs, c.want_dw,
            std::max<int64_t>(1, c.y_shape[0] * c.y_shape[2] * c.y_shape[3]), true, what, &ran);
      }
    }
  }
  // Every candidate ran on some geometry (one that declines everything would pass the checks
  // above untested), the Hopper tiles where the device runs them (9.0).
  const bool sm90 = cuda::runs_sm90a(gpu);
  for (const char* op : {"conv2d", "conv2d_backward_data", "conv2d_backward_weight"})
    for (plx_dtype d : dtypes)
      for (const plx_kernel* k : candidates(gpu, runtime().ops().get(op), d)) {
        if (is_wgmma_tile(k->impl) && !sm90) continue;
        INFO(run_key(op, d, k->impl));
        CHECK(ran[run_key(op, d, k->impl)] > 0);
      }
}

// The same candidate twice on the same inputs gives the same bits (the flags say deterministic:
// no atomics, and the weight gradient's split-K slices are summed in a fixed order).
TEST_CASE("cuda igemm convolution candidates are deterministic", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  // convnet's conv3 (64 input channels, which the im2col weight gradients' 64-channel boxes
  // take) and conv2 (32: the _c32 tiles' boxes); each candidate on those it accepts, and on one
  // at least.
  const Geo geos[] = {{{4, 64, 14, 14}, 128, 3, 3, {1, 1}, {1, 1}},
                      {{2, 32, 28, 28}, 64, 3, 3, {1, 1}, {1, 1}}};
  cuda::Tf32Off tf32_guard(gpu);
  const bool sm90 = cuda::runs_sm90a(gpu);
  Runs tested;
  for (plx_dtype d : {PLX_F16, PLX_BF16, PLX_F32}) {
    REQUIRE(cuda::set_tf32(gpu, d == PLX_F32));
    for (const Geo& g : geos) {
      const Shape w_shape = {g.o, g.x[1], g.kh, g.kw};
      const Tensor x = random_tensor(g.x, d, 7).to(gpu);
      const Tensor dy = random_tensor(out_shape(g), d, 8).to(gpu);
      Attrs bw_attrs = geo_attrs(g);
      bw_attrs.set("weight_shape", Ints(w_shape));
      const OpSchema& s = runtime().ops().get("conv2d_backward_weight");
      for (const plx_kernel* k : candidates(gpu, s, d)) {
        INFO(dtype_name(d) << " " << k->impl << ", " << describe(g));
        Tensor probe = poisoned(gpu, w_shape, d, false);
        if (!run_candidate(gpu, s, k, {dy, x}, {probe}, bw_attrs).empty()) continue;
        ++tested[run_key(s.name, d, k->impl)];
        CHECK(same_bits_twice(gpu, s, k, {dy, x}, w_shape, d, bw_attrs));
      }
    }
    for (const plx_kernel* k : candidates(gpu, runtime().ops().get("conv2d_backward_weight"), d)) {
      if (is_wgmma_tile(k->impl) && !sm90) continue;  // declined on other devices
      INFO(dtype_name(d) << " " << k->impl);
      CHECK(tested[run_key("conv2d_backward_weight", d, k->impl)] > 0);
    }
  }
}

// What the kernels do not handle they decline, with the reason, and cuDNN takes the node.
TEST_CASE("cuda igemm convolution candidates decline what they do not handle", "[cuda]") {
  PLX_REQUIRE_CUDA(gpu);
  const plx_dtype d = PLX_BF16;
  const OpSchema& s = runtime().ops().get("conv2d");
  struct Decline {
    Shape x;
    int64_t o;
    Attrs attrs;
    std::string reason;
    int64_t k = 3;  // KH = KW
  };
  const std::vector<Decline> cases = {
      // The first layer of our models: one input channel.
      {{2, 1, 28, 28}, 32, Attrs{{"padding", Ints{1, 1}}}, "multiple of 8"},
      {{2, 16, 8, 8}, 16, Attrs{{"groups", int64_t{2}}}, "groups"},
      {{2, 16, 12, 12}, 16, Attrs{{"dilation", Ints{2, 2}}}, "dilation"},
      // 49 taps: the 16-bit gather keeps a bit per tap of each receptive field.
      {{2, 8, 14, 14}, 8, Attrs{}, "at most 32 taps", 7},
  };
  for (const Decline& c : cases) {
    const int64_t groups = c.attrs.has("groups") ? c.attrs.get_int("groups") : 1;
    const Shape w_shape = {c.o, c.x[1] / groups, c.k, c.k};
    const Tensor x = random_tensor(c.x, d, 1).to(gpu);
    const Tensor w = random_tensor(w_shape, d, 2).to(gpu);
    const Shape y_shape = call(gpu, "conv2d", {x, w, Tensor()}, c.attrs)[0].shape();  // cuDNN
    for (const plx_kernel* k : candidates(gpu, s, d)) {
      INFO(k->impl << ": expecting a decline naming " << c.reason);
      Tensor out = poisoned(gpu, y_shape, d, false);
      const std::string why = run_candidate(gpu, s, k, {x, w, Tensor()}, {out}, c.attrs);
      CHECK_THAT(why, PLX_CONTAINS(c.reason));
    }
  }
  // f32 runs on the Tensor Cores as TF32: with the cuda tf32 option off every f32 candidate of
  // the three ops declines, naming the option; with it on, a first layer's single input channel
  // is left to the direct kernel, and a filter of 49 taps to cuDNN (the TF32 gather keeps a bit
  // per tap too).
  cuda::Tf32Off tf32_guard(gpu);
  const Tensor x = random_tensor({2, 16, 8, 8}, PLX_F32, 3).to(gpu);
  const Tensor x1 = random_tensor({2, 1, 8, 8}, PLX_F32, 3).to(gpu);
  const Tensor w = random_tensor({8, 16, 3, 3}, PLX_F32, 4).to(gpu);
  const Tensor w1 = random_tensor({8, 1, 3, 3}, PLX_F32, 4).to(gpu);
  const Tensor dy = random_tensor({2, 8, 6, 6}, PLX_F32, 5).to(gpu);
  const Tensor x7 = random_tensor({2, 16, 14, 14}, PLX_F32, 3).to(gpu);
  const Tensor w7 = random_tensor({8, 16, 7, 7}, PLX_F32, 4).to(gpu);
  const Tensor dy7 = random_tensor({2, 8, 8, 8}, PLX_F32, 5).to(gpu);
  const Attrs none;
  Attrs bd = none, bd1 = none, bw = none, bw1 = none;
  bd.set("input_shape", Ints{2, 16, 8, 8}), bd1.set("input_shape", Ints{2, 1, 8, 8});
  bw.set("weight_shape", Ints{8, 16, 3, 3}), bw1.set("weight_shape", Ints{8, 1, 3, 3});
  Attrs bd7 = none;
  bd7.set("input_shape", Ints{2, 16, 14, 14});
  struct F32Case {
    const char* op;
    std::vector<Tensor> in;
    Shape out;
    Attrs attrs;
    bool tf32;
    const char* reason;
  };
  const std::vector<F32Case> f32_cases = {
      {"conv2d", {x, w, Tensor()}, {2, 8, 6, 6}, none, false, "tf32 option is off"},
      {"conv2d_backward_data", {dy, w}, {2, 16, 8, 8}, bd, false, "tf32 option is off"},
      {"conv2d_backward_weight", {dy, x}, {8, 16, 3, 3}, bw, false, "tf32 option is off"},
      {"conv2d", {x1, w1, Tensor()}, {2, 8, 6, 6}, none, true, "direct kernel"},
      {"conv2d_backward_weight", {dy, x1}, {8, 1, 3, 3}, bw1, true, "direct kernel"},
      {"conv2d", {x7, w7, Tensor()}, {2, 8, 8, 8}, none, true, "at most 32 taps"},
      {"conv2d_backward_data", {dy7, w7}, {2, 16, 14, 14}, bd7, true, "at most 32 taps"},
  };
  for (const F32Case& c : f32_cases) {
    REQUIRE(cuda::set_tf32(gpu, c.tf32));
    const OpSchema& os = runtime().ops().get(c.op);
    const std::vector<const plx_kernel*> ks = candidates(gpu, os, PLX_F32);
    CHECK(ks.size() == 5);  // every tile but 256x32, which has no TF32 form
    for (const plx_kernel* k : ks) {
      INFO(c.op << " f32 " << k->impl << (c.tf32 ? ", tf32 on" : ", tf32 off"));
      Tensor out = poisoned(gpu, c.out, PLX_F32, false);
      const std::string why = run_candidate(gpu, os, k, c.in, {out}, c.attrs);
      CHECK_THAT(why, PLX_CONTAINS(c.reason));
    }
  }
}

// Registration, checked on any machine where the plugin was built (no device needed): six
// tiles per op in 16 bits and five in f32 (TF32: no 256x32), native (no PLX_KERNEL_LIBRARY), after
// cuDNN so that the first-accepting rule keeps cuDNN until the tuner or backend.kernels =
// "native" chooses.
TEST_CASE("the cuda plugin registers its igemm convolutions after cudnn", "[cpu]") {
  if (!cuda::plugin_built()) PLX_SKIP("the CUDA plugin was not built (no nvcc or cuDNN at configure time)");
  Backend* b = cuda::backend();
  INFO("loader: " << cuda::skip_reason());
  REQUIRE(b != nullptr);
  const std::vector<std::string> tiles = {"igemm_mma_128x128x32", "igemm_mma_128x64x32",
                                          "igemm_mma_64x64x32",   "igemm_mma_128x32x32",
                                          "igemm_mma_64x128x32",  "igemm_mma_256x32x32"};
  for (const char* op : {"conv2d", "conv2d_backward_data", "conv2d_backward_weight"}) {
    const OpSchema& s = runtime().ops().get(op);
    for (plx_dtype d : {PLX_F16, PLX_BF16, PLX_F32}) {
      INFO(op << " " << dtype_name(d));
      std::vector<std::string> impls;
      for (const plx_kernel* k : b->kernels(s.id, d)) impls.push_back(k->impl ? k->impl : "?");
      REQUIRE_FALSE(impls.empty());
      CHECK(impls.front() == "cudnn");
      std::vector<std::string> igemm;
      for (const std::string& i : impls)
        if (i.rfind(kPrefix, 0) == 0) igemm.push_back(i);
      std::vector<std::string> want = tiles;
      if (d == PLX_F32) want.pop_back();
      // The Hopper tiles after them: 16 bits, where built for sm_90 (as the wgmma GEMM is: the
      // emulator's plugin always, a GPU build with 90 in its architectures).
      const bool hopper = has_wgmma_tiles(*b);
      const std::vector<std::string>& hopper_tiles =
          std::string(op) == "conv2d_backward_weight" ? kWgmmaWgradTiles : kWgmmaTiles;
      if (hopper && d != PLX_F32) {
        want.insert(want.end(), hopper_tiles.begin(), hopper_tiles.end());
        if (std::string(op) != "conv2d_backward_weight") {
          want.insert(want.end(), kWgmmaIm2colTiles.begin(), kWgmmaIm2colTiles.end());
          want.insert(want.end(), kWgmmaPersistentTiles.begin(), kWgmmaPersistentTiles.end());
        }
      }
      CHECK(igemm == want);
      for (const plx_kernel* k : candidates(*b, s, d)) {
        CHECK((k->flags & PLX_KERNEL_LIBRARY) == 0);
        CHECK((k->flags & PLX_KERNEL_STRIDED) != 0);
        CHECK((k->flags & PLX_KERNEL_DETERMINISTIC) != 0);
        CHECK((k->flags & PLX_KERNEL_CAPTURABLE) != 0);
        // 16 bits prefer channels-last; TF32 reads any layout in place and keeps f32's NCHW.
        CHECK(k->layout == (d == PLX_F32 ? PLX_LAYOUT_ANY : PLX_LAYOUT_NHWC));
      }
    }
  }
}

// plugins.options.cuda.f32_channels_last: every f32 convolution and max pool whose f16 namesake
// (the same op and impl) prefers channels-last prefers it too, our TF32 igemm tiles and cuDNN's
// kernels among them, and nothing else changes; without it f32 keeps its NCHW preferences. A bad
// value is an error naming the option. No device needed.
TEST_CASE("the cuda plugin's f32_channels_last option makes f32 convolutions and pools prefer nhwc",
          "[cpu]") {
  if (!cuda::plugin_built()) PLX_SKIP("the CUDA plugin was not built (no nvcc or cuDNN at configure time)");
  const auto layouts = [](Runtime& rt, plx_dtype d) {
    Backend& b = *rt.find_backend("cuda");
    std::map<std::pair<std::string, std::string>, int32_t> out;
    for (int32_t id = 0; id < rt.ops().size(); ++id)
      for (const plx_kernel* k : b.kernels(id, d))
        out[{rt.ops().by_id(id).name, k->impl ? k->impl : "?"}] = k->layout;
    return out;
  };
  RuntimeOptions plain = plugin_dir_options();
  RuntimeOptions on = plugin_dir_options();
  on.plugins.options["cuda"]["f32_channels_last"] = "true";
  Runtime rt_plain(plain), rt_on(on);
  REQUIRE(rt_plain.find_backend("cuda") != nullptr);
  REQUIRE(rt_on.find_backend("cuda") != nullptr);
  const auto f16 = layouts(rt_on, PLX_F16);
  const auto f32_plain = layouts(rt_plain, PLX_F32), f32_on = layouts(rt_on, PLX_F32);
  REQUIRE(f32_plain.size() == f32_on.size());
  const std::set<std::string> ops = {"conv2d", "conv2d_backward_data", "conv2d_backward_weight",
                                     "max_pool2d", "max_pool2d_backward"};
  std::set<std::string> changed_ops;
  for (const auto& [key, layout] : f32_on) {
    INFO(key.first << " " << key.second);
    const auto half = f16.find(key);
    const bool follows = ops.count(key.first) != 0 && half != f16.end() &&
                         half->second == PLX_LAYOUT_NHWC;
    CHECK(layout == (follows ? PLX_LAYOUT_NHWC : f32_plain.at(key)));
    CHECK((follows || layout == f32_plain.at(key)));
    if (follows) changed_ops.insert(key.first);
    // Without the option no f32 convolution or pool prefers channels-last.
    if (ops.count(key.first) != 0) CHECK(f32_plain.at(key) != PLX_LAYOUT_NHWC);
  }
  CHECK(changed_ops == ops);
  CHECK(f32_on.at({"conv2d", "cudnn"}) == PLX_LAYOUT_NHWC);
  CHECK(f32_on.at({"conv2d", "igemm_mma_128x64x32"}) == PLX_LAYOUT_NHWC);
  CHECK(f32_on.at({"conv2d_backward_weight", "igemm_mma_128x64x32"}) == PLX_LAYOUT_NHWC);

  RuntimeOptions bad = plugin_dir_options();
  bad.plugins.options["cuda"]["f32_channels_last"] = "sometimes";
  Runtime rt_bad(bad);
  CHECK(rt_bad.find_backend("cuda") == nullptr);
  std::string why;
  for (const SkippedPlugin& sp : rt_bad.skipped())
    if (std::filesystem::path(sp.path).filename() == "libplexus-cuda.so") why = sp.reason;
  CHECK_THAT(why, PLX_CONTAINS("option 'f32_channels_last': expected true or false, got "
                               "'sometimes'"));
}

// A conv -> [relu ->] max_pool2d group whose conv the native side gives to an igemm tile runs as
// one launch with the 2x2 pool in the conv's epilogue (the pre-pool tensor never written), and
// its y and indices have the bits of the same graph run node by node (the igemm conv, the ReLU,
// the pool kernel): the models' second and third layers in their training form (relu_mask, u8
// window taps) and with i32 positions, the ReLU before the pool, no ReLU, a conv output with an
// odd row and column (floor mode drops them), ragged M and O tiles. A pool igemm does not take
// (3x3, stride 2, padding 1) runs as the chunked group, with the same bits.
namespace {

// A conv + pool group's outputs, y and the indices, the same bytes fused and node by node.
void check_same_pool_outputs(FusedPair& run) {
  for (const char* out : {"y", "idx"}) {
    INFO(out);
    const auto [fused, plain] = run.bytes(out);
    REQUIRE(!fused.empty());
    CHECK(fused == plain);
  }
}

}  // namespace

TEST_CASE("a conv with its relu and 2x2 max pool runs as one igemm kernel with the unfused bits",
          "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  (void)probe;  // the runtimes below are each test's own
  struct C {
    Shape x;
    int64_t o, pad;
    bool relu;
    Attrs pool;
    bool igemm;
    const char* what;
  };
  const Attrs training{
      {"kernel", Ints{2, 2}}, {"relu_mask", int64_t{1}}, {"window_index", int64_t{1}}};
  const C cases[] = {
      {{5, 16, 13, 13}, 32, 0, true, training, true, "simplecnn's second layer, training form"},
      {{2, 32, 14, 14}, 64, 1, true, training, true, "convnet's layers, training form"},
      {{3, 16, 9, 11},
       24,
       1,
       true,
       Attrs{{"kernel", Ints{2, 2}}},
       true,
       "i32 positions, the ReLU before the pool, odd conv output"},
      {{2, 8, 10, 9},
       40,
       1,
       false,
       Attrs{{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}},
       true,
       "no ReLU, O over a 32 tile"},
      {{2, 16, 12, 12},
       16,
       1,
       true,
       Attrs{{"kernel", Ints{2, 2}}, {"relu_mask", int64_t{1}}},
       true,
       "relu_mask with i32 positions"},
      {{2, 16, 12, 12},
       16,
       1,
       true,
       Attrs{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}},
       false,
       "overlapping windows: the chunked group"},
  };
  RuntimeOptions opts = plugin_dir_options();
  opts.kernels = KernelSide::Native;
  Runtime rt(opts);
  Backend& gpu = rt.backend("cuda");
  cuda::Tf32Off tf32_guard(gpu);
  for (plx_dtype d : {PLX_BF16, PLX_F16, PLX_F32})
    for (const C& c : cases) {
      DYNAMIC_SECTION(dtype_name(d) << ": " << c.what) {
        REQUIRE(cuda::set_tf32(gpu, d == PLX_F32));  // f32 on the igemm kernels is TF32
        Graph g(rt.ops());
        add_conv_relu_pool(g, d, c.x, c.o, c.pad, c.relu, c.pool);
        FusedPair run(gpu, g);
        const std::string names = run.names();
        INFO(names);
        const std::string want =
            c.relu ? "conv2d+relu+max_pool2d:igemm" : "conv2d+max_pool2d:igemm";
        if (c.igemm) {
          CHECK_THAT(names, PLX_CONTAINS(want));
          CHECK(run.kernel_count() == 1);
        } else {
          CHECK(names.find(":igemm") == std::string::npos);
        }
        run.run({{"x", random_doubles(static_cast<size_t>(shape_numel(c.x)), 37, -1, 1)}});
        check_same_pool_outputs(run);
      }
    }
}

// The pool epilogue on every tile: the group's conv pinned to each igemm tile through the tuning
// cache (the group follows its conv's kernel_hint, as in pinned_kernel.hpp), so that each tile's
// staging of the accumulators through shared memory is run, TF32's 128x128 in its two passes of
// half the columns among them. y and the indices are the bits of the same graph run node by node.
TEST_CASE("a conv with its relu and 2x2 max pool runs as one igemm kernel on every tile",
          "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  const Attrs training{
      {"kernel", Ints{2, 2}}, {"relu_mask", int64_t{1}}, {"window_index", int64_t{1}}};
  const Attrs plain_pool{{"kernel", Ints{2, 2}}};
  struct C {
    Shape x;
    int64_t o;
    bool relu;
    const Attrs* pool;
    const char* what;
  };
  // Ragged M (windows past M in the last tile) and O (a 40-channel output over 32- and 64-wide
  // tiles), u8 taps with the ReLU's mask and i32 positions with the ReLU before the pool.
  const C cases[] = {{{3, 16, 10, 12}, 40, true, &training, "training form, u8 taps"},
                     {{2, 24, 9, 11}, 136, false, &plain_pool, "no relu, i32 positions"}};
  std::vector<std::string> tiles = {"igemm_mma_128x128x32", "igemm_mma_128x64x32",
                                    "igemm_mma_64x64x32",   "igemm_mma_128x32x32",
                                    "igemm_mma_64x128x32",  "igemm_mma_256x32x32"};
  // The Hopper tiles where they were built and the device runs them (9.0).
  if (has_wgmma_tiles(probe) && cuda::runs_sm90a(probe)) {
    tiles.insert(tiles.end(), kWgmmaTiles.begin(), kWgmmaTiles.end());
    tiles.insert(tiles.end(), kWgmmaIm2colTiles.begin(), kWgmmaIm2colTiles.end());
    tiles.insert(tiles.end(), kWgmmaPersistentTiles.begin(), kWgmmaPersistentTiles.end());
  }
  TempDir dir("igemm-pool-tiles");
  for (plx_dtype d : {PLX_BF16, PLX_F16, PLX_F32})
    for (const C& c : cases) {
      // The group run fused and node by node on a runtime whose tuning cache is `cache`.
      auto with_pair = [&](const std::string& cache, auto&& fn) {
        RuntimeOptions opts = plugin_dir_options();
        opts.tune_cache = cache;
        Runtime rt(opts);
        Backend& gpu = rt.backend("cuda");
        cuda::Tf32Off tf32_guard(gpu);
        REQUIRE(cuda::set_tf32(gpu, d == PLX_F32));
        Graph g(rt.ops());
        add_conv_relu_pool(g, d, c.x, c.o, 1, c.relu, *c.pool);
        FusedPair run(gpu, g);
        fn(run);
      };
      // The conv's tuning keys (the fused run's and the plain run's, whose conv may write
      // another layout), from a run that tunes the graph; its other choices are kept in the
      // pinned caches, so that those runs time nothing. Both convs run the pinned tile: the
      // plain run's conv on another kernel would round other sums (the direct kernel's f16 y
      // differed by an ulp).
      std::set<std::string> keys;
      with_pair(dir / "tuned.tsv", [&](FusedPair& run) {
        for (Executable* e : {&run.fused(), &run.plain()})
          for (const Executable::KernelReport& k : e->kernel_choices())
            if (k.node == "c" && !k.choice.key.empty()) keys.insert(k.choice.key);
      });
      REQUIRE_FALSE(keys.empty());
      std::string others;
      {
        std::ifstream in(dir / "tuned.tsv");
        for (std::string line; std::getline(in, line);)
          if (!keys.count(line.substr(0, line.find('\t')))) others += line + "\n";
      }
      // (No sections: Catch2 would rerun the key runs above for each one.)
      for (const std::string& tile : tiles) {
        // No TF32 form of 256x32 or of the Hopper tiles.
        if (d == PLX_F32 && (tile == "igemm_mma_256x32x32" || is_wgmma_tile(tile))) continue;
        INFO(dtype_name(d) << ": " << c.what << ", " << tile);
        const std::string cache = dir / (tile + ".tsv");
        {
          std::ofstream out(cache);
          out << others;
          for (const std::string& key : keys) out << key << "\t" << tile << "\t1\n";
        }
        with_pair(cache, [&](FusedPair& run) {
          const std::string names = run.names();
          INFO(names);
          CHECK_THAT(names, PLX_CONTAINS(std::string(c.relu ? "conv2d+relu+max_pool2d:igemm"
                                                            : "conv2d+max_pool2d:igemm")));
          CHECK_THAT(names, PLX_CONTAINS(std::string("c on ") + tile + " (cached)"));
          CHECK(run.kernel_count() == 1);
          std::string plain_names;
          for (const std::string& k : run.plain().kernel_names()) plain_names += k + "\n";
          CHECK_THAT(plain_names, PLX_CONTAINS(std::string("cuda/") + tile + " (cached)"));
          run.run({{"x", random_doubles(static_cast<size_t>(shape_numel(c.x)), 41, -1, 1)}});
          check_same_pool_outputs(run);
        });
      }
    }
}
