// Times one forward+backward pass of SimpleCNN or ConvNet (the models of the roadmap) through the
// eager op API on the CPU backend: the ops the training step will run, without the graph
// executor, memory planning or the optimizer that come with `plexus train`.
//
//   plexus_step_bench [simplecnn|convnet] [batch] [threads]
//
// Before timing, it checks the first step's loss: with weights of scale 0.02 the logits are near
// zero, so the cross-entropy of 10 classes must be close to ln 10.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "plexus/dispatch.hpp"
#include "plexus/eager.hpp"
#include "plexus/runtime.hpp"

using namespace plexus;

namespace {

struct Layer {  // a conv or linear layer's parameters
  Tensor w, b;
};

Tensor random(Backend& b, const Shape& s, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = d(rng);
  return Tensor::from_vector(b, v, s);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "simplecnn";
  const int64_t batch = argc > 2 ? std::atoll(argv[2]) : 128;
  const std::string threads = argc > 3 ? argv[3] : "0";
  if (model != "simplecnn" && model != "convnet") {
    std::fprintf(stderr, "usage: plexus_step_bench [simplecnn|convnet] [batch] [threads]\n");
    return 2;
  }
  const bool convnet = model == "convnet";
  RuntimeOptions o;
  o.plugins.paths = {PLEXUS_PLUGIN_DIR};
  o.plugins.use_env = false;
  o.plugins.use_default_dir = false;
  o.plugins.options["cpu"]["threads"] = threads;
  Runtime rt(o);
  Backend& b = rt.backend("cpu");
  std::mt19937 rng(1);

  const Tensor x = random(b, {batch, 1, 28, 28}, rng, 1.0f);
  std::vector<int64_t> lab(static_cast<size_t>(batch));
  for (auto& l : lab) l = static_cast<int64_t>(rng() % 10);
  const Tensor labels = Tensor::from_vector(b, lab, {batch});
  const Tensor one = Tensor::from_vector(b, std::vector<float>{1.0f}, {});
  const Attrs pad = convnet ? Attrs{{"padding", Ints{1, 1}}} : Attrs{};
  const Attrs pool = {{"kernel", Ints{2, 2}}};
  // SimpleCNN: conv 1->16, pool, conv 16->32, pool, linear 800->10.
  // ConvNet: conv 1->32, conv 32->64, pool, conv 64->128, pool, linear 6272->256, linear 256->10.
  const std::vector<int64_t> ch = convnet ? std::vector<int64_t>{1, 32, 64, 128}
                                          : std::vector<int64_t>{1, 16, 32};
  std::vector<Layer> conv;
  for (size_t i = 0; i + 1 < ch.size(); ++i)
    conv.push_back({random(b, {ch[i + 1], ch[i], 3, 3}, rng, 0.02f), random(b, {ch[i + 1]}, rng, 0.02f)});
  std::vector<Layer> fc;
  if (convnet) {
    fc.push_back({random(b, {256, 6272}, rng, 0.02f), random(b, {256}, rng, 0.02f)});
    fc.push_back({random(b, {10, 256}, rng, 0.02f), random(b, {10}, rng, 0.02f)});
  } else {
    fc.push_back({random(b, {10, 800}, rng, 0.02f), random(b, {10}, rng, 0.02f)});
  }
  // Which conv layers are followed by a 2x2 max-pool.
  const std::vector<bool> pooled = convnet ? std::vector<bool>{false, true, true}
                                           : std::vector<bool>{true, true};

  auto step = [&]() -> double {
    // Forward, keeping what the backward needs.
    struct Saved {
      Tensor in, pre, act, pooled, idx;
    };
    std::vector<Saved> cs;
    Tensor h = x;
    for (size_t i = 0; i < conv.size(); ++i) {
      Saved s;
      s.in = h;
      s.pre = call(b, "conv2d", {h, conv[i].w, conv[i].b}, pad)[0];
      s.act = call(b, "relu", {s.pre})[0];
      h = s.act;
      if (pooled[i]) {
        auto p = call(b, "max_pool2d", {h}, pool);
        s.pooled = p[0];
        s.idx = p[1];
        h = p[0];
      }
      cs.push_back(s);
    }
    const Shape feat_shape = h.shape();
    std::vector<Tensor> fin, fpre, fact;
    h = h.reshape({batch, -1});
    for (size_t i = 0; i < fc.size(); ++i) {
      fin.push_back(h);
      fpre.push_back(call(b, "linear", {h, fc[i].w, fc[i].b})[0]);
      h = i + 1 < fc.size() ? call(b, "relu", {fpre.back()})[0] : fpre.back();
      fact.push_back(h);
    }
    const auto ce = call(b, "softmax_cross_entropy", {h, labels});
    // Backward.
    Tensor g = call_grad(b, "softmax_cross_entropy", {h, labels}, ce, {one})[0];
    for (size_t i = fc.size(); i-- > 0;) {
      if (i + 1 < fc.size()) g = call_grad(b, "relu", {fpre[i]}, {fact[i]}, {g})[0];
      g = call_grad(b, "linear", {fin[i], fc[i].w, fc[i].b}, {fpre[i]}, {g})[0];
    }
    g = g.reshape(feat_shape);
    for (size_t i = conv.size(); i-- > 0;) {
      const Saved& s = cs[i];
      if (pooled[i]) g = call_grad(b, "max_pool2d", {s.act}, {s.pooled, s.idx}, {g}, pool)[0];
      g = call_grad(b, "relu", {s.pre}, {s.act}, {g})[0];
      g = call_grad(b, "conv2d", {s.in, conv[i].w, conv[i].b}, {s.pre}, {g}, pad,
                    {i > 0, true, true})[0];
    }
    return ce[0].to_doubles()[0];
  };

  const double loss = step();
  if (!std::isfinite(loss) || std::fabs(loss - std::log(10.0)) > 0.1) {
    std::fprintf(stderr, "first loss %.4f is not close to ln 10 = %.4f: the step is wrong\n", loss,
                 std::log(10.0));
    return 1;
  }
  step();
  const int reps = convnet ? 5 : 30;
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) step();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    best = std::min(best, ms);
  }
  std::printf("%s batch %lld threads %s: %.2f ms per forward+backward, %.0f images/s (first loss %.4f)\n",
              model.c_str(), static_cast<long long>(batch), threads.c_str(), best,
              static_cast<double>(batch) / best * 1000.0, loss);
  return 0;
}
