// The conv + max-pool fusions on CUDA (plugins/cuda/ops/conv_pool.cpp): a two-layer
// conv -> relu -> pool network with a linear classifier, trained one step, against the same
// graph on the CPU. Reverse mode gives the pools relu_mask and u8 window indices, so each layer
// forms a "conv2d+relu+max_pool2d" group (or "conv2d+max_pool2d" without the second ReLU) and
// each backward a "max_pool2d_backward+conv2d_backward" group: the first layer's with the weight
// and bias gradients only (x is an input, no dx), the second's with dx too.
//
// The fused kernels work through the batch a chunk of images at a time; the plugin's
// fuse_chunk_bytes (set here through "cuda.set_fuse_chunk_bytes") decides the chunk, and the
// batch (37) is chosen so that the cases run the smallest chunks there are (the images that keep
// every slice 16-byte aligned: 4 in the first layer, 2 in the second, each with a remainder of 1),
// a few chunks with a larger remainder, and the whole batch as one chunk (the per-chunk sums of dw
// and db and their first and last chunks are the parts most likely to go wrong).
//
// The CUDA and CPU convolutions sum in other orders, so float results are held to the tolerances
// of the other CUDA tests. A max-pool window whose two largest values are within rounding of
// each other could pick differently on the two backends; with continuous random data over a few
// thousand windows that is improbable (see test_cuda_train.cpp for the full treatment).
#include <cmath>
#include <cstdint>
#include <map>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::cmp;

namespace {

constexpr int64_t kBatch = 37;
constexpr int64_t kClasses = 5;
constexpr int64_t kDefaultChunkBytes = int64_t{32} << 20;  // the plugin's default

// Sets the CUDA plugin's fuse_chunk_bytes for fused kernels created from now on; back to the
// default when the guard goes.
struct ChunkBytes {
  Backend& b;
  ChunkBytes(Backend& backend, int64_t bytes) : b(backend) { REQUIRE(set(bytes)); }
  ~ChunkBytes() { set(kDefaultChunkBytes); }
  ChunkBytes(const ChunkBytes&) = delete;
  ChunkBytes& operator=(const ChunkBytes&) = delete;
  bool set(int64_t bytes) {
    const plx_backend& t = b.table();
    if (!t.get_proc_address) return false;
    auto fn = reinterpret_cast<void (*)(void*, int64_t)>(
        t.get_proc_address(t.ctx, "cuda.set_fuse_chunk_bytes"));
    if (!fn) return false;
    fn(t.ctx, bytes);
    return true;
  }
};

struct ConvPoolCase {
  plx_dtype d = PLX_F32;
  bool relu2 = true;           // the second layer's ReLU (without: conv2d+max_pool2d)
  int64_t chunk_bytes = 13000;  // the CUDA plugin's fuse_chunk_bytes
};

struct Run {
  std::map<std::string, Tensor> out;
  std::vector<std::string> kernels;
};

// The graph's outputs: the logits, the loss and each parameter's gradient ("grad:" + its name).
const char* const kOutputs[] = {"logits_out",     "loss_out",       "grad:c1.weight",
                                "grad:c1.bias",   "grad:c2.weight", "grad:c2.bias",
                                "grad:fc.weight", "grad:fc.bias"};

// x (37, 3, 10, 10) -> conv 3x3 pad 1 (4 channels) -> relu -> pool 2 -> (37, 4, 5, 5) -> conv 3x3
// pad 1 (6 channels) -> [relu] -> pool 2 -> (37, 6, 2, 2) (the last row and column of the 5x5
// unpooled) -> linear (5 classes) -> mean softmax cross-entropy; the gradients of every
// parameter.
Run run_net(Backend& b, const ConvPoolCase& c, const TensorStore* params_from, TensorStore& store) {
  Graph g(runtime().ops());
  const plx_dtype d = c.d;
  const Var x = g.input("x", {d, {kBatch, 3, 10, 10}});
  const Var labels = g.input("labels", {PLX_I32, {kBatch}});
  const Attrs conv_attrs{{"stride", Ints{1, 1}},
                         {"padding", Ints{1, 1}},
                         {"dilation", Ints{1, 1}},
                         {"groups", int64_t{1}}};
  const Attrs pool_attrs{{"kernel", Ints{2, 2}},
                         {"stride", Ints{2, 2}},
                         {"padding", Ints{0, 0}},
                         {"dilation", Ints{1, 1}},
                         {"ceil_mode", int64_t{0}}};
  const Var w1 = g.parameter("c1.weight", {d, {4, 3, 3, 3}}, init::kaiming_uniform(27));
  const Var b1 = g.parameter("c1.bias", {d, {4}}, init::uniform(-0.3, 0.3));
  const Var w2 = g.parameter("c2.weight", {d, {6, 4, 3, 3}}, init::kaiming_uniform(36));
  const Var b2 = g.parameter("c2.bias", {d, {6}}, init::uniform(-0.3, 0.3));
  const Var w3 = g.parameter("fc.weight", {d, {kClasses, 24}}, init::xavier_uniform(24, kClasses));
  const Var b3 = g.parameter("fc.bias", {d, {kClasses}}, init::uniform(-0.3, 0.3));
  Var h = g.add1("conv2d", {x, w1, b1}, conv_attrs, "c1");
  h = g.add1("relu", {h}, {}, "r1");
  h = g.add("max_pool2d", {h}, pool_attrs, "p1").at(0);
  h = g.add1("conv2d", {h, w2, b2}, conv_attrs, "c2");
  if (c.relu2) h = g.add1("relu", {h}, {}, "r2");
  h = g.add("max_pool2d", {h}, pool_attrs, "p2").at(0);
  h = g.reshape(h, {kBatch, 24});
  const Var logits = g.add1("linear", {h, w3, b3}, {}, "fc");
  g.mark_output(logits, "logits_out");
  const Var loss = g.add("softmax_cross_entropy", {logits, labels},
                         {{"reduction", std::string("mean")}}, "loss")
                       .at(0);
  const std::vector<Var> params = g.parameters();
  const std::vector<Var> grads = backward(g, loss, params);
  g.mark_output(loss, "loss_out");
  for (size_t i = 0; i < params.size(); ++i) g.mark_output(grads[i], "grad:" + g.value(params[i]).name);
  ExecutableOptions eo;
  eo.seed = 29;
  Executable exe(b, g, store, eo);
  if (params_from)
    for (const auto& [name, t] : params_from->all()) fill(store.get(name), t.to_doubles());
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(kBatch * 3 * 10 * 10), 47, -1, 1));
  std::vector<int32_t> lab(static_cast<size_t>(kBatch));
  for (size_t i = 0; i < lab.size(); ++i) lab[i] = static_cast<int32_t>((i * 3) % kClasses);
  exe.tensor("labels").copy_from_host(lab.data());
  exe.run();
  exe.sync();
  Run r;
  r.kernels = exe.kernel_names();
  for (const char* name : kOutputs) r.out[name] = exe.tensor(name).to(cpu());
  return r;
}

int count_kernels(const Run& r, const std::string& text) {
  int n = 0;
  for (const auto& k : r.kernels) n += k.find(text) != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("conv + max-pool fused on cuda matches the cpu", "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(gpu);
  cuda::Tf32Off tf32_off(gpu);
  std::vector<ConvPoolCase> cases;
  // Images per chunk (pre-pool bytes per image: 1600 and 600 in f32, half that in 16 bits):
  //   1 byte:     4 and 2 (slice alignment), remainders 1 and 1;
  //   13000:      f32 8 and 20, remainders 5 and 17; f16/bf16 16 and the whole batch, remainder 5;
  //   1 GiB:      the whole batch in one chunk, dw and db written directly.
  for (plx_dtype d : {PLX_F32, PLX_BF16, PLX_F16})
    for (int64_t bytes : {int64_t{1}, int64_t{13000}, int64_t{1} << 30}) {
      ConvPoolCase c;
      c.d = d;
      c.chunk_bytes = bytes;
      cases.push_back(c);
    }
  ConvPoolCase no_relu;
  no_relu.relu2 = false;
  cases.push_back(no_relu);
  for (const ConvPoolCase& c : cases) {
    INFO(dtype_name(c.d) << (c.relu2 ? "" : " without the second relu") << ", fuse_chunk_bytes "
                         << c.chunk_bytes);
    TensorStore cpu_store, gpu_store;
    const Run want = run_net(cpu(), c, nullptr, cpu_store);
    Run got;
    {
      ChunkBytes chunk(gpu, c.chunk_bytes);
      got = run_net(gpu, c, &cpu_store, gpu_store);
    }
    INFO("cuda kernels:\n" << [&] {
      std::string k;
      for (const auto& n : got.kernels) k += n + "\n";
      return k;
    }());
    CHECK(count_kernels(got, "cuda/conv2d+relu+max_pool2d") == (c.relu2 ? 2 : 1));
    CHECK(count_kernels(got, "cuda/conv2d+max_pool2d") == (c.relu2 ? 0 : 1));
    CHECK(count_kernels(got, "cuda/max_pool2d_backward+conv2d_backward") == 2);
    // The logits sum 24 pooled values, each a 36-term convolution of 27-term ones.
    CHECK(compare_tensors(got.out.at("logits_out"), want.out.at("logits_out"),
                          tolerance_for(c.d, 24 * 36, false)) == "");
    CHECK(compare_tensors(got.out.at("loss_out"), want.out.at("loss_out"),
                          tolerance_for(c.d, kClasses * kBatch, false)) == "");
    // Weight and bias gradients sum over every image and position of their layer.
    CHECK(compare_tensors(got.out.at("grad:c1.weight"), want.out.at("grad:c1.weight"),
                          tolerance_for(c.d, kBatch * 100, false)) == "");
    CHECK(compare_tensors(got.out.at("grad:c1.bias"), want.out.at("grad:c1.bias"),
                          tolerance_for(c.d, kBatch * 100, false)) == "");
    CHECK(compare_tensors(got.out.at("grad:c2.weight"), want.out.at("grad:c2.weight"),
                          tolerance_for(c.d, kBatch * 25, false)) == "");
    CHECK(compare_tensors(got.out.at("grad:c2.bias"), want.out.at("grad:c2.bias"),
                          tolerance_for(c.d, kBatch * 25, false)) == "");
    CHECK(compare_tensors(got.out.at("grad:fc.weight"), want.out.at("grad:fc.weight"),
                          tolerance_for(c.d, kBatch, false)) == "");
    CHECK(compare_tensors(got.out.at("grad:fc.bias"), want.out.at("grad:fc.bias"),
                          tolerance_for(c.d, kBatch, false)) == "");
  }
}

// The network above with the CPU alone: it runs here, so the graph building is known to work
// before a GPU machine sees it.
TEST_CASE("the conv + max-pool test network trains on the cpu", "[cpu][compare]") {
  for (plx_dtype d : {PLX_F32, PLX_BF16}) {
    INFO(dtype_name(d));
    ConvPoolCase c;
    c.d = d;
    TensorStore store;
    const Run r = run_net(cpu(), c, nullptr, store);
    for (const char* name : kOutputs) {
      INFO(name);
      const std::vector<double> v = r.out.at(name).to_doubles();
      bool finite = true, nonzero = false;
      for (double e : v) finite = finite && std::isfinite(e), nonzero = nonzero || e != 0;
      CHECK(finite);
      CHECK(nonzero);
    }
  }
}

// A linear layer's ReLU backward with its bias gradient (the sum over rows) fused on CUDA
// (ops/pool.cu, relu_column_sum_kernel): dx is the CPU's bit for bit (dy where y > 0, else 0),
// db its column sums to rounding. The shapes cover one element, columns that are not a multiple
// of the 32-column tile, several row splits (the emulator's 4 SMs give 4 for 45 columns and 300
// rows) and no rows at all.
struct SumCase {
  int64_t rows, cols;
  plx_dtype d;
};
const SumCase kSumCases[] = {{1, 1, PLX_F32},     {7, 33, PLX_F32},    {300, 45, PLX_F32},
                             {1024, 256, PLX_F32}, {300, 45, PLX_BF16}, {129, 70, PLX_F16},
                             {0, 5, PLX_F32}};

TEST_CASE("relu_backward with its sum over rows fused on cuda matches the cpu", "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(gpu);
  for (const SumCase& c : kSumCases) {
    DYNAMIC_SECTION(c.rows << " x " << c.cols << " " << dtype_name(c.d)) {
      Graph g(runtime().ops());
      const Var dy = g.input("dy", {c.d, {c.rows, c.cols}}), y = g.input("y", {c.d, {c.rows, c.cols}});
      const Var dx = g.add1("relu_backward", {dy, y}, {}, "relu.grad");
      Attrs sa;
      sa.set("axes", Ints{0});
      g.mark_output(g.add1("sum", {dx}, sa, "bias.grad"), "db");
      g.mark_output(dx, "dx");
      ExecutableOptions eo;
      TensorStore sa_store, sb_store;
      Executable a(gpu, g, sa_store, eo), b(cpu(), g, sb_store, eo);
      std::string names;
      for (const auto& k : a.kernel_names()) names += k + "\n";
      INFO(names);
      if (c.rows > 0) CHECK_THAT(names, PLX_CONTAINS("fused kernel 'relu_backward+sum'"));
      const int64_t n = c.rows * c.cols;
      const std::vector<double> vdy = random_doubles(static_cast<size_t>(n), 5, -2, 2);
      std::vector<double> vy = random_doubles(static_cast<size_t>(n), 6, -1, 1);
      for (size_t i = 0; i < vy.size(); i += 7) vy[i] = 0;  // y = 0 passes no gradient
      for (Executable* e : {&a, &b}) {
        fill(e->tensor("dy"), vdy);
        fill(e->tensor("y"), vy);
        e->run();
        e->sync();
      }
      CHECK(compare_tensors(a.tensor("dx"), b.tensor("dx"), Tolerance{0, 0, 0, true}) == "");
      const double nmse = c.d == PLX_F32 ? 1e-10 : 1e-4;
      CHECK(compare_tensors(a.tensor("db"), b.tensor("db"), Tolerance{INFINITY, 0, nmse, false}) == "");
    }
  }
}

// A linear layer's GELU backward with its bias gradient fused on CUDA (ops/pool.cu, GeluCols):
// dx is the unfused CUDA gelu_backward's bit for bit (one formula, ops/gelu.cuh) and the CPU's
// to a few ulps of erff, tanhf and expf, db the CPU's column sums to rounding; both forms, the
// shapes of the ReLU test above.
TEST_CASE("gelu_backward with its sum over rows fused on cuda matches the cpu", "[cuda][fusion]") {
  PLX_REQUIRE_CUDA(gpu);
  for (const char* approximate : {"none", "tanh"})
    for (const SumCase& c : kSumCases) {
      DYNAMIC_SECTION(approximate << " " << c.rows << " x " << c.cols << " " << dtype_name(c.d)) {
        Graph g(runtime().ops());
        const Var dy = g.input("dy", {c.d, {c.rows, c.cols}});
        const Var x = g.input("x", {c.d, {c.rows, c.cols}});
        const Var dx = g.add1("gelu_backward", {dy, x}, {{"approximate", std::string(approximate)}},
                              "gelu.grad");
        Attrs sa;
        sa.set("axes", Ints{0});
        g.mark_output(g.add1("sum", {dx}, sa, "bias.grad"), "db");
        g.mark_output(dx, "dx");
        ExecutableOptions eo, unfused;
        unfused.fuse = false;
        TensorStore s_fused, s_unfused, s_cpu;
        Executable a(gpu, g, s_fused, eo), u(gpu, g, s_unfused, unfused), b(cpu(), g, s_cpu, eo);
        std::string names;
        for (const auto& k : a.kernel_names()) names += k + "\n";
        INFO(names);
        if (c.rows > 0) CHECK_THAT(names, PLX_CONTAINS("fused kernel 'gelu_backward+sum'"));
        const int64_t n = c.rows * c.cols;
        const std::vector<double> vdy = random_doubles(static_cast<size_t>(n), 5, -2, 2);
        const std::vector<double> vx = random_doubles(static_cast<size_t>(n), 6, -4, 4);
        for (Executable* e : {&a, &u, &b}) {
          fill(e->tensor("dy"), vdy);
          fill(e->tensor("x"), vx);
          e->run();
          e->sync();
        }
        CHECK(compare_tensors(a.tensor("dx"), u.tensor("dx"), Tolerance{0, 0, 0, true}) == "");
        CHECK(compare_tensors(a.tensor("dx"), b.tensor("dx"), tolerance_for(c.d, 1, false)) == "");
        const Tolerance db_tol{INFINITY, 0, c.d == PLX_F32 ? 1e-10 : 1e-4, false};
        CHECK(compare_tensors(a.tensor("db"), b.tensor("db"), db_tol) == "");
      }
    }
}
