// f16 loss scaling's unscale and check as one multi-tensor kernel on CUDA
// (plugins/cuda/ops/misc.cu, multi_tensor_unscale_check, claimed by ops/fusion.cpp): per
// gradient u = mul(cast(g), U) and s = sum(u), a chain of adds totalling the sums into the check,
// whose finiteness decides whether the step is skipped. Each block of the kernel writes its
// partial sum, and the last block to arrive (a counter, reset for the next launch) totals them.
//
// The training-step tests only see whether the check is finite, and a non-finite gradient
// usually spans many blocks, so a block's partial left over from the launch before would go
// unseen. Here one executable runs launch after launch with a single +inf in a different
// gradient's last element each time (the last chunk of a tensor: one block), between all-finite
// launches, and every launch's check and unscaled gradients must be the CPU's.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/runtime.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::cmp;

namespace {

// Gradient sizes: 2, 1 and 3 blocks of the kernel's 4,096-element chunks.
const std::vector<int64_t> kSizes = {5000, 300, 9000};

Graph unscale_check_graph() {
  Graph g(runtime().ops());
  const Var unscale = g.input("unscale", {PLX_F32, {}});
  Var total;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const std::string n = std::to_string(i);
    const Var grad = g.input("g" + n, {PLX_F16, {kSizes[i]}});
    const Var wide = g.add1("cast", {grad}, {{"dtype", std::string("f32")}}, "cast" + n);
    const Var u = g.add1("mul", {wide, unscale}, {}, "unscale" + n);
    g.mark_output(u, "u" + n);
    const Var s = g.add1("sum", {u}, {}, "sum" + n);
    total = i == 0 ? s : g.add1("add", {total, s}, {}, "total" + n);
  }
  g.mark_output(total, "check");
  return g;
}

// Launch `pass`'s gradients: random in [-1, 1), with +inf as the last element of gradient
// `inf_at` (-1: none).
void feed(Executable& e, int pass, int inf_at) {
  const float unscale = 1.f / 1024;
  e.tensor("unscale").copy_from_host(&unscale);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    std::vector<double> v = random_doubles(static_cast<size_t>(kSizes[i]),
                                           static_cast<uint64_t>(100 * pass + 7 * i + 1));
    if (static_cast<int>(i) == inf_at) v.back() = std::numeric_limits<double>::infinity();
    fill(e.tensor("g" + std::to_string(i)), v);
  }
}

}  // namespace

TEST_CASE(
    "the cuda multi-tensor unscale and check sees a non-finite gradient in any block launch after "
    "launch",
    "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(gpu);
  const Graph g = unscale_check_graph();
  TensorStore cpu_store, gpu_store;
  Executable want(cpu(), g, cpu_store);
  Executable got(gpu, g, gpu_store);
  std::string kernels;
  bool fused = false;
  for (const auto& k : got.kernel_names()) {
    kernels += k + "\n";
    fused = fused || k.find("fused kernel 'multi_tensor_unscale_check'") != std::string::npos;
  }
  INFO("the cuda kernels:\n" << kernels);
  REQUIRE(fused);
  // Finite, then +inf in each gradient's last block with a finite launch after each.
  const std::vector<int> inf_at = {-1, 0, -1, 1, -1, 2, -1, 2, 0, -1};
  int64_t terms = 0;
  for (int64_t n : kSizes) terms += n;
  for (size_t pass = 0; pass < inf_at.size(); ++pass) {
    INFO("launch " << pass + 1 << ", +inf in gradient " << inf_at[pass]);
    for (Executable* e : {&want, &got}) {
      feed(*e, static_cast<int>(pass), inf_at[pass]);
      e->run();
      e->sync();
    }
    const double check = got.tensor("check").to_doubles().at(0);
    if (inf_at[pass] >= 0) {
      CHECK(std::isinf(check));
      CHECK(check > 0);
    } else {
      CHECK(std::isfinite(check));
      CHECK(compare_tensors(got.tensor("check").to(cpu()), want.tensor("check"),
                            tolerance_for(PLX_F32, terms, false)) == "");
    }
    // The unscaled gradients: one f32 product of the widened f16 each, the CPU's bits.
    for (size_t i = 0; i < kSizes.size(); ++i) {
      const std::string name = "u" + std::to_string(i);
      INFO(name);
      CHECK(got.tensor(name).to_doubles() == want.tensor(name).to_doubles());
    }
  }
}
