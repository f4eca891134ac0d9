// Links the installed Plexus::core, loads the plugins PLEXUS_PLUGIN_PATH names, and trains one
// SGD step of a linear layer on the cpu backend: the library works outside its build tree.
#include <cstdio>
#include <vector>

#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/optimizer.hpp"
#include "plexus/runtime.hpp"

int main() {
  plexus::Runtime rt;
  for (plexus::Backend* b : rt.backends()) std::printf("backend %s\n", b->name().c_str());
  plexus::Graph g(rt.ops());
  const auto x = g.input("x", {PLX_F32, {4, 3}});
  const auto y = g.input("labels", {PLX_I32, {4}});
  const auto w = g.parameter("fc.weight", {PLX_F32, {2, 3}}, plexus::init::constant(0.1));
  const auto loss = g.add1("softmax_cross_entropy", {g.add1("linear", {x, w}), y});
  const auto params = g.parameters();
  plexus::add_optimizer(g, params, plexus::backward(g, loss, params), {.kind = "sgd"});
  g.mark_output(loss, "loss_value");
  plexus::TensorStore store;
  plexus::Executable step(rt.backend("cpu"), g, store);
  const std::vector<float> xs = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1};
  const std::vector<int> ls = {0, 1, 0, 1};
  const float lr = 0.5f;
  step.tensor("x").copy_from_host(xs.data());
  step.tensor("labels").copy_from_host(ls.data());
  step.tensor("lr").copy_from_host(&lr);
  float first = 0, second = 0;
  step.run();
  step.sync();
  step.tensor("loss_value").copy_to_host(&first);
  step.run();
  step.sync();
  step.tensor("loss_value").copy_to_host(&second);
  std::printf("loss %.6f then %.6f\n", first, second);
  if (!(second < first)) {
    std::printf("the loss did not fall\n");
    return 1;
  }
  std::printf("embedded runtime trained\n");
  return 0;
}
