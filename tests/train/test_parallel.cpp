// Data parallelism's pieces in one process: reading the launcher's environment, the
// communication thread, and gradient buckets hooked into a step. Ranks are threads joined by the
// CPU plugin's "threads" communicator; each runs its own executable on its slice of the batch,
// and after a few steps every rank's parameters must match one executable trained on the whole
// batch. Whole trainings under mpirun are checked by tests/parallel/ (ctest).
//
// Catch2's assertions are not thread-safe: rank threads record, the main thread asserts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "plexus/backend.hpp"
#include "plexus/communicator.hpp"
#include "plexus/error.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/model.hpp"
#include "plexus/optimizer.hpp"
#include "plexus/parallel.hpp"
#include "plexus/plugin.hpp"
#include "support/harness.hpp"
#include "train/pipeline.hpp"
#include "train/step_graph.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

constexpr int64_t kBatch = 8, kIn = 6, kHidden = 12, kClasses = 4;

// x -> linear -> relu -> linear -> relu -> linear -> cross-entropy summed, times loss_scale
// (one over the global batch), SGD with momentum: what the trainer builds under data parallelism.
struct Step {
  Graph g;
  std::vector<Var> params, grads;
  explicit Step(int64_t rows) : g(runtime().ops()) {
    const Var x = g.input("x", {PLX_F32, {rows, kIn}});
    const Var labels = g.input("labels", {PLX_I32, {rows}});
    const Var scale = g.input("loss_scale", {PLX_F32, {}});
    auto layer = [&](Var h, const std::string& name, int64_t in, int64_t out) {
      const Var w = g.parameter(name + ".weight", {PLX_F32, {out, in}}, init::kaiming_uniform(in));
      const Var b = g.parameter(name + ".bias", {PLX_F32, {out}}, init::uniform(-0.1, 0.1));
      return g.add1("linear", {h, w, b}, {}, name);
    };
    Var h = g.add1("relu", {layer(x, "fc1", kIn, kHidden)}, {}, "relu1");
    h = g.add1("relu", {layer(h, "fc2", kHidden, kHidden)}, {}, "relu2");
    const Var logits = layer(h, "out", kHidden, kClasses);
    Attrs la;
    la.set("reduction", std::string("sum"));
    Var loss = g.add1("softmax_cross_entropy", {logits, labels}, la, "loss");
    loss = g.add1("mul", {loss, scale}, {}, "loss.scale");
    params = g.parameters();
    grads = backward(g, loss, params);
    OptimizerOptions o;
    o.momentum = 0.9;
    add_optimizer(g, params, grads, o);
    g.mark_output(loss, "loss_value");
  }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (Var p : params) n.push_back(g.value(p).name);
    return n;
  }
};

std::vector<double> batch_x(int64_t step) { return random_doubles(kBatch * kIn, 100 + step); }
std::vector<int32_t> batch_labels(int64_t step) {
  std::vector<int32_t> l(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) l[i] = static_cast<int32_t>((i * 7 + step * 3) % kClasses);
  return l;
}

// Runs `steps` SGD steps on rows [first, first + rows) of each global batch; returns every
// parameter after them, by name.
using Params = std::map<std::string, std::vector<float>>;
Params train_slice(Backend& be, int64_t first, int64_t rows, int steps, CommGroup* group,
                   GradSyncOptions gso, std::string* buckets_out = nullptr) {
  Step s(rows);
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 5;
  Executable exe(be, s.g, store, eo);
  std::unique_ptr<GradientSync> sync;
  if (group) {
    broadcast_store(*group, store, 0);
    sync = std::make_unique<GradientSync>(*group, exe, s.grads, s.names(), gso);
    if (buckets_out) *buckets_out = sync->describe();
  }
  fill(exe.tensor("lr"), {0.1});
  fill(exe.tensor("loss_scale"), {1.0 / kBatch});
  for (int k = 0; k < steps; ++k) {
    const std::vector<double> x = batch_x(k);
    const std::vector<int32_t> l = batch_labels(k);
    fill(exe.tensor("x"), std::vector<double>(x.begin() + first * kIn, x.begin() + (first + rows) * kIn));
    exe.tensor("labels").copy_from_host(l.data() + first);
    exe.run();
    exe.sync();
  }
  if (group && buckets_out) *buckets_out += exe.replaying() ? " (step captured)" : "";
  Params out;
  for (Var p : s.params) {
    const Tensor t = exe.tensor(p);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    t.copy_to_host(v.data());
    out[s.g.value(p).name] = v;
  }
  return out;
}

Communicator& threads_comm() { return runtime().communicator("threads"); }

// The nodes a fused kernel's name lists ("fused kernel 'x' [n1, n2, ...]: ...").
int listed_nodes(const std::string& kernel) {
  return static_cast<int>(std::count(kernel.begin(), kernel.end(), ',')) + 1;
}

// The CUDA backend with a device and the NCCL communicator, or why a [cuda][comm] test cannot run.
struct CudaNccl {
  Backend* gpu = nullptr;
  Communicator* nccl = nullptr;
  const char* missing = nullptr;
};
CudaNccl cuda_nccl() {
  CudaNccl r;
  r.gpu = runtime().find_backend("cuda");
  if (!r.gpu || r.gpu->device_count() == 0) {
    r.missing = "no CUDA device";
    return r;
  }
  for (Communicator* c : runtime().communicators())
    if (c->name() == "nccl") r.nccl = c;
  if (!r.nccl) r.missing = "the NCCL communicator plugin is not loaded";
  return r;
}

}  // namespace

TEST_CASE("launch_info reads OpenMPI, PMI and Slurm environments", "[cpu][parallel]") {
  std::map<std::string, std::string> env;
  auto get = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  SECTION("no launcher: one process") {
    const LaunchInfo li = launch_info(get);
    CHECK_FALSE(li.launched());
    CHECK(li.rank == 0);
    CHECK(li.size == 1);
  }
  SECTION("OpenMPI") {
    env = {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
    const LaunchInfo li = launch_info(get);
    CHECK(li.launched());
    CHECK(li.rank == 3);
    CHECK(li.size == 4);
    CHECK(li.local_rank == 1);
    CHECK(li.local_size == 2);
    CHECK(li.source == "OMPI_COMM_WORLD_SIZE");
  }
  SECTION("MPICH's PMI") {
    env = {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}};
    const LaunchInfo li = launch_info(get);
    CHECK(li.rank == 1);
    CHECK(li.size == 2);
    CHECK(li.local_rank == 1);
    CHECK(li.source == "PMI_SIZE");
  }
  SECTION("Slurm") {
    env = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}};
    const LaunchInfo li = launch_info(get);
    CHECK(li.rank == 5);
    CHECK(li.size == 8);
    CHECK(li.local_rank == 1);
  }
  SECTION("a value that is not a number is an error naming the variable") {
    env = {{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
    CHECK_THROWS_WITH(launch_info(get), PLX_CONTAINS("OMPI_COMM_WORLD_RANK='x1'"));
  }
  SECTION("a rank outside the world is an error") {
    env = {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
    CHECK_THROWS_WITH(launch_info(get), PLX_CONTAINS("outside a world of 2"));
  }
  SECTION("a size without a rank is an error") {
    env = {{"PMI_SIZE", "2"}};
    CHECK_THROWS_WITH(launch_info(get), PLX_CONTAINS("PMI_RANK is not"));
  }
}

TEST_CASE("CommWorker runs jobs in order and reports the first failure", "[cpu][parallel]") {
  CommWorker w;
  std::vector<int> seen;
  const auto a = w.submit([&] { seen.push_back(1); });
  const auto b = w.submit([&] { seen.push_back(2); });
  w.wait(b);
  w.wait(a);  // already done
  CHECK(seen == std::vector<int>{1, 2});
  const auto bad = w.submit([] { throw std::runtime_error("peer went away"); });
  const auto after = w.submit([&] { seen.push_back(3); });
  CHECK_THROWS_WITH(w.wait(bad), PLX_CONTAINS("peer went away"));
  CHECK_THROWS_WITH(w.wait(after), PLX_CONTAINS("an earlier communication failed") &&
                                       PLX_CONTAINS("peer went away"));
  CHECK(seen == std::vector<int>{1, 2});  // the job after the failure never ran
}

TEST_CASE("gradient buckets follow the order gradients are written", "[cpu][parallel]") {
  const plx_comm_id id = threads_comm().unique_id();
  std::unique_ptr<CommGroup> g = threads_comm().join(cpu(), 0, 0, 1, id, 20000);
  Step s(kBatch);
  TensorStore store;
  Executable exe(cpu(), s.g, store, {});
  SECTION("small buckets: one gradient each, started as written, each before its update") {
    GradSyncOptions o;
    o.bucket_bytes = 4;  // smaller than any gradient
    GradientSync sync(*g, exe, s.grads, s.names(), o);
    REQUIRE(sync.buckets().size() == s.params.size());
    for (size_t i = 0; i < sync.buckets().size(); ++i) {
      const auto& b = sync.buckets()[i];
      CHECK(b.grads.size() == 1);
      CHECK(b.ready < b.need);
      if (i) CHECK(sync.buckets()[i - 1].ready <= b.ready);
    }
    // The output layer's gradients are written first.
    CHECK(sync.buckets().front().names.front().rfind("out.", 0) == 0);
    CHECK(sync.buckets().back().names.front().rfind("fc1.", 0) == 0);
  }
  SECTION("a large bucket holds every gradient") {
    GradientSync sync(*g, exe, s.grads, s.names(), {});
    REQUIRE(sync.buckets().size() == 1);
    CHECK(sync.buckets()[0].grads.size() == s.params.size());
    uint64_t bytes = 0;
    for (Var p : s.params) bytes += static_cast<uint64_t>(s.g.value(p).desc.numel()) * 4;
    CHECK(sync.bytes() == bytes);
  }
  SECTION("without overlap every bucket starts after the last gradient") {
    GradSyncOptions o;
    o.bucket_bytes = 4;
    o.overlap = false;
    GradientSync sync(*g, exe, s.grads, s.names(), o);
    for (const auto& b : sync.buckets()) CHECK(b.ready == sync.buckets().back().ready);
  }
}

TEST_CASE("data-parallel ranks reach the parameters of one process on the whole batch",
          "[cpu][parallel]") {
  const int steps = 4;
  const Params whole = train_slice(cpu(), 0, kBatch, steps, nullptr, {});
  for (int n : {2, 4}) {
    for (uint64_t bucket : {uint64_t{4}, uint64_t{600}, uint64_t{25} << 20}) {
      for (bool overlap : {true, false}) {
        DYNAMIC_SECTION(n << " ranks, buckets of " << bucket << " bytes, overlap " << overlap) {
          const plx_comm_id id = threads_comm().unique_id();
          std::vector<Params> got(static_cast<size_t>(n));
          std::vector<std::string> err(static_cast<size_t>(n));
          std::string buckets;
          std::vector<std::thread> threads;
          for (int r = 0; r < n; ++r)
            threads.emplace_back([&, r] {
              try {
                auto g = threads_comm().join(cpu(), 0, r, n, id, 20000);
                GradSyncOptions o;
                o.bucket_bytes = bucket;
                o.overlap = overlap;
                got[static_cast<size_t>(r)] =
                    train_slice(cpu(), r * (kBatch / n), kBatch / n, steps, g.get(), o, r ? nullptr : &buckets);
              } catch (const std::exception& e) {
                err[static_cast<size_t>(r)] = e.what();
              }
            });
          for (auto& t : threads) t.join();
          INFO(buckets);
          for (int r = 0; r < n; ++r) {
            INFO("rank " << r);
            REQUIRE(err[static_cast<size_t>(r)].empty());
            for (const auto& [name, want] : whole) {
              INFO(name);
              const std::vector<float>& v = got[static_cast<size_t>(r)].at(name);
              REQUIRE(v.size() == want.size());
              double worst = 0;
              for (size_t i = 0; i < v.size(); ++i)
                worst = std::max(worst, std::abs(static_cast<double>(v[i]) - want[i]) /
                                            (1e-3 + std::abs(static_cast<double>(want[i]))));
              CHECK(worst < 1e-4);  // f32 sums in another order
              // Every rank holds the same bits.
              CHECK(std::memcmp(v.data(), got[0].at(name).data(), v.size() * sizeof(float)) == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("a rank whose peer never joins the all-reduce fails with a timeout, not a hang",
          "[cpu][parallel]") {
  const plx_comm_id id = threads_comm().unique_id();
  std::string err0;
  std::thread other([&] {
    // Rank 1 joins, then leaves without stepping.
    try {
      auto g = threads_comm().join(cpu(), 0, 1, 2, id, 500);
    } catch (const std::exception&) {
    }
  });
  try {
    auto g = threads_comm().join(cpu(), 0, 0, 2, id, 500);
    (void)train_slice(cpu(), 0, kBatch / 2, 1, g.get(), {});
  } catch (const std::exception& e) {
    err0 = e.what();
  }
  other.join();
  CHECK_THAT(err0, PLX_CONTAINS("broadcast") || PLX_CONTAINS("all_reduce"));
}

TEST_CASE("pipeline cuts balance parameters and respect residual connections", "[cpu][parallel]") {
  auto summary_of = [](const ModelSpec& spec) {
    Graph g(runtime().ops());
    Shape xs = {2};
    xs.insert(xs.end(), spec.input_shape.begin(), spec.input_shape.end());
    std::vector<LayerSummary> summary;
    build_model(g, spec, g.input("x", {PLX_F32, xs}), true, &summary);
    return summary;
  };
  const ModelSpec mlp = builtin_model("mlp");  // flatten, linear 401920, relu, linear 131328, relu, linear 2570
  const auto ms = summary_of(mlp);
  SECTION("balanced by parameters") {
    CHECK(pipeline_cuts(mlp, 1, {}, ms) == std::vector<int>{0, 6});
    CHECK(pipeline_cuts(mlp, 2, {}, ms) == std::vector<int>{0, 2, 6});  // after the first linear
    const std::vector<int> four = pipeline_cuts(mlp, 4, {}, ms);
    REQUIRE(four.size() == 5);
    for (size_t i = 1; i < four.size(); ++i) CHECK(four[i] > four[i - 1]);  // no empty stage
  }
  SECTION("named cuts") {
    CHECK(pipeline_cuts(mlp, 3, {"linear_2", "linear_3"}, ms) == std::vector<int>{0, 3, 5, 6});
    CHECK_THROWS_WITH(pipeline_cuts(mlp, 3, {"linear_2"}, ms), PLX_CONTAINS("names 1 layers; 3 stages need 2"));
    CHECK_THROWS_WITH(pipeline_cuts(mlp, 2, {"nope"}, ms), PLX_CONTAINS("has no layer 'nope'"));
    CHECK_THROWS_WITH(pipeline_cuts(mlp, 3, {"linear_3", "linear_2"}, ms),
                      PLX_CONTAINS("does not come after"));
    CHECK_THROWS_WITH(pipeline_cuts(mlp, 7, {}, ms), PLX_CONTAINS("has only 6 layers"));
  }
  SECTION("a residual connection is never cut") {
    const ModelSpec resnet = builtin_model("resnet");
    const auto rs = summary_of(resnet);
    std::map<std::string, int> index;
    for (size_t i = 0; i < resnet.layers.size(); ++i) index[resnet.layers[i].name] = static_cast<int>(i);
    for (int stages : {2, 3, 4}) {
      const std::vector<int> cuts = pipeline_cuts(resnet, stages, {}, rs);
      for (size_t k = 1; k + 1 < cuts.size(); ++k)
        for (int i = cuts[k]; i < static_cast<int>(resnet.layers.size()); ++i)
          for (const std::string& in : resnet.layers[static_cast<size_t>(i)].inputs)
            CHECK((in != "input" && index.at(in) >= cuts[k] - 1));
    }
    // b1_bn2 is read by the residual add after b1_relu's block: no stage may start between.
    CHECK_THROWS_WITH(pipeline_cuts(resnet, 2, {"b1_conv2"}, rs), PLX_CONTAINS("residual connection"));
  }
}

TEST_CASE("a part of a model builds from the layer before it", "[cpu][parallel]") {
  const ModelSpec mlp = builtin_model("mlp");
  Graph g(runtime().ops());
  BuildRange r;
  r.first = 3;  // linear_2 reads relu_1's (2, 512)
  std::vector<LayerSummary> summary;
  const Var y = build_model(g, mlp, g.input("act_in", {PLX_F32, {2, 512}}), true, &summary, r);
  CHECK(g.desc(y).shape == Shape{2, 10});
  CHECK(summary.size() == 3);
  CHECK(g.find("linear_2.weight").valid());
  CHECK_FALSE(g.find("linear_1.weight").valid());
  BuildRange bad;
  bad.first = 4;
  bad.last = 2;
  Graph h(runtime().ops());
  CHECK_THROWS_WITH(build_model(h, mlp, h.input("a", {PLX_F32, {2, 256}}), true, nullptr, bad),
                    PLX_CONTAINS("are not a range"));
}

TEST_CASE("tensors packed for the wire unpack to the same tensors", "[cpu][parallel]") {
  std::vector<CheckpointTensor> in(2);
  in[0].name = "a.weight";
  in[0].dtype = PLX_F32;
  in[0].shape = {2, 3};
  in[0].data.assign(24, 7);
  in[1].name = "b";
  in[1].dtype = PLX_I64;
  in[1].shape = {};
  in[1].data.assign(8, 1);
  const std::string packed = pack_tensors(in);
  const std::vector<CheckpointTensor> out = unpack_tensors(packed);
  REQUIRE(out.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(out[i].name == in[i].name);
    CHECK(out[i].dtype == in[i].dtype);
    CHECK(out[i].shape == in[i].shape);
    CHECK(out[i].data == in[i].data);
  }
  CHECK_THROWS_WITH(unpack_tensors(packed.substr(0, packed.size() - 3)), PLX_CONTAINS("truncated"));
}

TEST_CASE("gradient buckets on a cuda communication stream leave a one-rank step unchanged",
          "[cuda][comm][parallel]") {
  // The stream path of GradientSync (events, a communication stream, a captured step) on one
  // GPU: an all-reduce over one rank changes nothing, so 4 steps must give the same bits as
  // without it, with the step captured and replayed after its second run.
  const CudaNccl cn = cuda_nccl();
  if (cn.missing) PLX_SKIP(cn.missing);
  Backend* gpu = cn.gpu;
  Communicator* nccl = cn.nccl;
  const Params plain = train_slice(*gpu, 0, kBatch, 4, nullptr, {});
  auto g = nccl->join(*gpu, 0, 0, 1, nccl->unique_id(), 20000);
  GradSyncOptions o;
  o.bucket_bytes = 600;  // several buckets
  std::string buckets;
  const Params synced = train_slice(*gpu, 0, kBatch, 4, g.get(), o, &buckets);
  INFO(buckets);
  CHECK_THAT(buckets, PLX_CONTAINS("(step captured)"));
  for (const auto& [name, want] : plain) {
    INFO(name);
    const std::vector<float>& got = synced.at(name);
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("a 16-bit cuda step all-reduces its gradients between their casts and their readers",
          "[cuda][comm][parallel]") {
  // The trainer's convnet step in bf16 and f16 (build_step, data-parallel loss): the CUDA
  // plugin would fuse each gradient's cast to f32 into the kernel that reads it (the update, or
  // f16's unscale), which leaves nothing to all-reduce in between. With the gradients exchanged
  // (ExecutableOptions::exchanged, as the trainer sets them) the core refuses those groups, the
  // plugin claims the same kernels without the casts, and 3 steps over a one-rank group give the
  // same bits as without it.
  const CudaNccl cn = cuda_nccl();
  if (cn.missing) PLX_SKIP(cn.missing);
  Backend* gpu = cn.gpu;
  Communicator* nccl = cn.nccl;
  auto group = nccl->join(*gpu, 0, 0, 1, nccl->unique_id(), 20000);
  const ModelSpec spec = builtin_model("convnet");
  const int64_t rows = 8;
  OptimizerOptions opt;
  opt.kind = "sgd";
  opt.momentum = 0.9;
  LossScaling scaling;
  scaling.init = 1024;
  for (const plx_dtype compute : {PLX_BF16, PLX_F16}) {
    DYNAMIC_SECTION(dtype_name(compute)) {
      auto sg = build_step(runtime().ops(), spec, rows, spec.input_shape, true, opt, true, compute,
                           compute == PLX_F16 ? &scaling : nullptr);
      std::vector<std::string> names;
      for (Var p : sg->params) names.push_back(sg->graph.value(p).name);
      auto train = [&](CommGroup* g, std::string* kernels, std::string* buckets) {
        TensorStore store;
        ExecutableOptions eo;
        eo.seed = 5;
        for (Var v : sg->grads)
          if (v.valid()) eo.exchanged.push_back(v);
        Executable exe(*gpu, sg->graph, store, eo);
        std::unique_ptr<GradientSync> sync;
        if (g) {
          GradSyncOptions o;
          o.bucket_bytes = 4096;  // several buckets
          sync = std::make_unique<GradientSync>(*g, exe, sg->grads, names, o);
          *buckets = sync->describe();
        }
        for (const auto& k : exe.kernel_names()) *kernels += k + "\n";
        fill(exe.tensor("lr"), {0.01});
        fill(exe.tensor("loss_scale"), {1.0 / static_cast<double>(rows)});
        for (int k = 0; k < 3; ++k) {
          fill(exe.tensor("x"), random_doubles(static_cast<size_t>(rows * 28 * 28), 40 + k, -2, 2));
          std::vector<int32_t> labels;
          for (int64_t i = 0; i < rows; ++i) labels.push_back(static_cast<int32_t>((i * 3 + k) % 10));
          exe.tensor("labels").copy_from_host(labels.data());
          exe.run();
          exe.sync();
        }
        std::map<std::string, std::vector<double>> out;
        for (const auto& [name, t] : store.all()) out[name] = t.to_doubles();
        return out;
      };
      std::string plain_kernels, synced_kernels, buckets;
      const auto plain = train(nullptr, &plain_kernels, nullptr);
      const auto synced = train(group.get(), &synced_kernels, &buckets);
      INFO("kernels:\n" << synced_kernels << "buckets:\n" << buckets);
      CHECK(plain_kernels == synced_kernels);
      // The gradients' casts run at their layer's place, so the buckets start during backward:
      // not all after one kernel (a multi-tensor cast gathering them at the end), but a layer's
      // weight and bias casts, next to each other, as one (5 layers: 5 launches for 10 casts).
      std::istringstream lines(synced_kernels);
      int grad_cast_launches = 0;
      for (std::string k; std::getline(lines, k);) {
        if (k.find(".cast.grad") == std::string::npos || k.find("logits.cast.grad") != std::string::npos)
          continue;
        ++grad_cast_launches;
        if (k.find("multi_tensor_cast") != std::string::npos) CHECK(listed_nodes(k) == 2);
      }
      CHECK(grad_cast_launches == 5);
      std::set<std::string> afters;
      for (size_t at = buckets.find("after kernel "); at != std::string::npos;
           at = buckets.find("after kernel ", at + 1))
        afters.insert(buckets.substr(at, buckets.find(',', at) - at));
      CHECK(afters.size() > 1);
      // The updates (and f16's unscale) are still one kernel each, without the casts.
      CHECK_THAT(synced_kernels, PLX_CONTAINS("fused kernel 'multi_tensor_sgd'"));
      if (compute == PLX_F16) CHECK_THAT(synced_kernels, PLX_CONTAINS("fused kernel 'multi_tensor_unscale_check'"));
      REQUIRE(plain.size() == synced.size());
      for (const auto& [name, want] : plain) {
        INFO(name);
        CHECK(synced.at(name) == want);
      }
    }
  }
}
