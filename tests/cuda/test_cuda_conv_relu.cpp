// conv2d -> relu on CUDA (plugins/cuda/ops/conv.cpp): with a bias, and cuDNN chosen for the
// convolution, the pair is one cudnnConvolutionBiasActivationForward call writing relu's output
// ("conv2d+relu:cudnn-bias-activation"); without a bias, or where cuDNN refuses the fused call,
// a chain (the convolution, then relu in place). Either way the result is the CPU's, in every
// float dtype, and a lone conv2d with a bias (which may take the same fused call with the
// identity activation) too.
//
// x (6, 3, 9, 9) -> conv 3x3, stride 1, padding 1, 5 channels [+ bias] -> relu, and a second
// output from a conv without the relu. The inputs straddle zero, so about half of the outputs
// are cut by the ReLU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/pinned_kernel.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/runtime.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::cmp;

namespace {

struct Out {
  Tensor relu, plain;
  std::vector<std::string> kernels;
};

Out run_pair(Backend& b, plx_dtype d, bool bias) {
  Graph g(runtime().ops());
  const Var x = g.input("x", {d, {6, 3, 9, 9}});
  const Var w = g.input("w", {d, {5, 3, 3, 3}});
  const Var bv = g.input("b", {d, {5}});
  const Attrs conv{{"stride", Ints{1, 1}},
                   {"padding", Ints{1, 1}},
                   {"dilation", Ints{1, 1}},
                   {"groups", int64_t{1}}};
  std::vector<Var> in{x, w};
  if (bias) in.push_back(bv);
  const Var pre = g.add1("conv2d", in, conv, "c1");
  g.mark_output(g.add1("relu", {pre}, {}, "r1"), "relu_out");
  g.mark_output(g.add1("conv2d", in, conv, "c2"), "plain_out");
  TensorStore store;
  ExecutableOptions eo;
  eo.fuse = true;
  Executable exe(b, g, store, eo);
  fill(exe.tensor("x"), random_doubles(6 * 3 * 9 * 9, 11, -1, 1));
  fill(exe.tensor("w"), random_doubles(5 * 3 * 3 * 3, 12, -0.4, 0.4));
  if (bias) fill(exe.tensor("b"), random_doubles(5, 13, -0.5, 0.5));
  exe.run();
  exe.sync();
  Out o;
  o.relu = exe.tensor("relu_out").to(cpu());
  o.plain = exe.tensor("plain_out").to(cpu());
  o.kernels = exe.kernel_names();
  return o;
}

int count(const std::vector<std::string>& kernels, const std::string& text) {
  int n = 0;
  for (const auto& k : kernels) n += k.find(text) != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("conv2d -> relu fused on cuda is one cudnn call where cudnn takes it", "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_off(gpu);
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16})
    for (bool bias : {true, false}) {
      INFO(dtype_name(d) << (bias ? " with a bias" : " without a bias"));
      const Out want = run_pair(cpu(), d, bias);
      const Out got = run_pair(gpu, d, bias);
      INFO("cuda kernels:\n"
           << [&] {
                std::string k;
                for (const auto& n : got.kernels) k += n + "\n";
                return k;
              }());
      const int fused = count(got.kernels, "cuda/conv2d+relu:cudnn-bias-activation");
      const int chain = count(got.kernels, "cuda/conv2d+relu") - fused;
      // One group either way: cuDNN's call, or the chain.
      CHECK(fused + chain == 1);
      // cuDNN's fused call needs a bias. On the emulator, which follows cuDNN's documented
      // data-type table (no bfloat16 row), f32 and f16 take it and bf16 falls back to the chain;
      // the real library decides for itself (docs/gpu-owed.md).
      if (!bias) CHECK(fused == 0);
      if (bias && cuda::emulated(gpu)) CHECK(fused == (d == PLX_BF16 ? 0 : 1));
      // 27 terms a sum.
      CHECK(compare_tensors(got.relu, want.relu, tolerance_for(d, 27, false)) == "");
      CHECK(compare_tensors(got.plain, want.plain, tolerance_for(d, 27, false)) == "");
    }
}

// A linear -> relu or conv2d -> relu pair whose layer the host gave to one of our own kernels
// (the tuner's choice, pinned here through the tuning cache) runs as that kernel with the ReLU in
// its epilogue (ops/fusion.cpp, make_act_pair): one kernel writing relu's output, against
// the same graph on the CPU. One input is NaN: the ReLU gives 0 there, as the relu op does on
// every backend (a NaN would poison the comparison). The Hopper GEMM's pair has its own test
// (test_wgmma_gemm.cpp).
TEST_CASE("a layer -> relu pair given to our own kernel runs with the relu in its epilogue",
          "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(probe);
  if (probe.device(0).arch_major < 8)
    PLX_SKIP("mma.sync with bf16 needs compute capability 8.0 or later");
  struct Layer {
    const char* op;
    std::vector<std::string> tiles;
    Shape xs, ws;
  };
  // Ragged: the linear 70 x 64 -> 40, the conv (6, 16, 9, 9) -> 24 channels, 3x3, padding 1; a
  // first layer (one input channel, 9 taps) for the direct kernel, and a layer of 144 taps for
  // its image-by-image form (ops/direct_small.cu).
  // The Hopper convolution tiles where the plugin has them and the device runs them (9.0): the
  // gathered tile, its im2col twin (A through the TMA's im2col mode) and that one persistent.
  std::vector<std::string> conv_tiles = {"igemm_mma_128x128x32", "igemm_mma_128x64x32",
                                         "igemm_mma_64x64x32",   "igemm_mma_128x32x32",
                                         "igemm_mma_64x128x32",  "igemm_mma_256x32x32"};
  bool hopper = false;
  for (const plx_kernel* k : probe.kernels(runtime().ops().get("conv2d").id, PLX_BF16))
    hopper = hopper || (k->impl && std::string(k->impl) == "igemm_wgmma_im2col_128x64x64");
  if (hopper && cuda::runs_sm90a(probe))
    conv_tiles.insert(conv_tiles.end(), {"igemm_wgmma_128x64x64", "igemm_wgmma_im2col_128x64x64",
                                         "igemm_wgmma_im2col_128x64x64_persistent"});
  const Layer layers[] = {{"linear",
                           {"mma_sync_128x128x32", "mma_sync_64x64x32", "mma_sync_32x32x64"},
                           {70, 64},
                           {40, 64}},
                          {"conv2d", conv_tiles, {6, 16, 9, 9}, {24, 16, 3, 3}},
                          {"conv2d", {"direct"}, {5, 1, 11, 9}, {20, 1, 3, 3}},
                          {"conv2d", {"direct"}, {4, 16, 9, 7}, {12, 16, 3, 3}}};
  for (const Layer& layer : layers) {
    const bool conv = std::string(layer.op) == "conv2d";
    INFO(layer.op);
    const Shape& xs = layer.xs;
    const Shape& ws = layer.ws;
    const int64_t outs = ws[0];
    std::vector<double> x = random_doubles(static_cast<size_t>(shape_numel(xs)), 21, -1, 1);
    x[5] = std::nan("");
    auto build = [&](Graph& g) {
      const Var xv = g.input("x", {PLX_BF16, xs});
      const Var w = g.parameter("l.weight", {PLX_BF16, ws}, init::uniform(-0.3, 0.3));
      const Var b = g.parameter("l.bias", {PLX_BF16, {outs}}, init::uniform(-0.5, 0.5));
      const Attrs attrs = conv ? Attrs{{"stride", Ints{1, 1}},
                                       {"padding", Ints{1, 1}},
                                       {"dilation", Ints{1, 1}},
                                       {"groups", int64_t{1}}}
                               : Attrs{};
      g.mark_output(g.add1("relu", {g.add1(layer.op, {xv, w, b}, attrs, "l")}, {}, "l.relu"), "y");
    };
    PinnedKernelRun pinned(std::string("own-relu-") + layer.op + "-" + layer.tiles.front(), build,
                           "l", x, 5);
    REQUIRE_FALSE(pinned.key().empty());
    for (const std::string& tile : layer.tiles) {
      INFO(tile);
      const PinnedKernelRun::Result r = pinned.run(tile);
      CHECK(r.report.impl == tile);
      INFO("kernels: " << r.kernels.size()
                       << ", first: " << (r.kernels.empty() ? "" : r.kernels.front()));
      int fused = 0;
      for (const std::string& n : r.kernels)
        fused += n.find(std::string(layer.op) + "+relu:" + tile + "-epilogue") != std::string::npos;
      CHECK(fused == 1);
      CHECK(r.kernels.size() == 1);
      CHECK(std::count(r.got.begin(), r.got.end(), 0.0) > 0);  // the ReLU cut something
      // One rounding of the f32 sum to bf16 on each side, in different orders.
      CHECK_ALLCLOSE(r.got, r.want, (Tol{2e-2, 2e-2}));
    }
  }
}
