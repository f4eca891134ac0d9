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
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"

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
