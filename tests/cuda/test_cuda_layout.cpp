// The layout planner on CUDA (executor.cpp plan_layouts): in 16-bit training steps the
// convolutions (cuDNN's and our implicit GEMMs, both preferring NHWC in 16 bits), the max-pools,
// the fused conv + pool groups, and the dense maps and fused ReLU backward between them keep the
// activations and their gradients channels-last, and each step computes what the NCHW step
// computes, on both kernel sides: a chain of three conv -> relu layers, convnet, simplecnn, and a
// chain whose ReLU follows its pool (the fused backward of ReLU with pooling).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cuda/compare.hpp"
#include "cuda/cuda_util.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/model.hpp"
#include "plexus/optimizer.hpp"
#include "plexus/runtime.hpp"
#include "plexus/tune.hpp"
#include "support/harness.hpp"
#include "train/step_graph.hpp"

using namespace plexus;
using namespace plexus::test;
using namespace plexus::test::cmp;

namespace {

// Eight input channels, so that our own convolutions (channels a multiple of 8) take every
// layer; the third layer strides, and flattening its output for the classifier is the edge where
// the activations turn NCHW.
constexpr const char* kModel = R"(
name = "convchain"
input = [8, 10, 10]
classes = 10
[[layers]]
type = "conv2d"
out = 16
kernel = 3
padding = 1
[[layers]]
type = "relu"
[[layers]]
type = "conv2d"
out = 16
kernel = 3
padding = 1
[[layers]]
type = "relu"
[[layers]]
type = "conv2d"
out = 8
kernel = 3
stride = 2
padding = 1
[[layers]]
type = "relu"
[[layers]]
type = "flatten"
[[layers]]
type = "linear"
out = 10
)";

struct StepOut {
  double loss = 0;
  std::map<std::string, Tensor> params;  // after the step, on the CPU
  MemoryPlan plan;
  std::vector<std::string> kernels;
};

// `tf32`: the cuda tf32 option on (f32 convolutions and GEMMs on the Tensor Cores).
// `f32_nhwc`: the cuda f32_channels_last option on (f32 kernels prefer channels-last too).
StepOut one_step(const ModelSpec& spec, KernelSide side, plx_dtype compute, bool channels_last,
                 bool tf32 = false, bool f32_nhwc = false) {
  RuntimeOptions o = plugin_dir_options();
  o.kernels = side;
  if (f32_nhwc) o.plugins.options["cuda"]["f32_channels_last"] = "true";
  Runtime rt(o);
  Backend& b = rt.backend("cuda");
  if (tf32) REQUIRE(cuda::set_tf32(b, true));
  const int64_t n = 4;
  OptimizerOptions opt;
  opt.kind = "sgd";
  opt.momentum = 0;
  auto sg = build_step(rt.ops(), spec, n, spec.input_shape, true, opt, false, compute);
  TensorStore store;
  ExecutableOptions eo;
  eo.seed = 5;
  eo.channels_last = channels_last;
  Executable exe(b, sg->graph, store, eo);
  int64_t per = 1;
  for (int64_t d : spec.input_shape) per *= d;
  fill(exe.tensor("x"), random_doubles(static_cast<size_t>(n * per), 17, -1.0, 1.0));
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>((i * 3) % 10));
  exe.tensor("labels").copy_from_host(labels.data());
  fill(exe.tensor("lr"), {0.1});
  exe.run();
  exe.sync();
  StepOut r;
  r.loss = exe.tensor("loss_value").to_doubles().at(0);
  for (const auto& [name, t] : store.all()) r.params[name] = t.to(cpu());
  r.plan = exe.plan();
  r.kernels = exe.kernel_names();
  return r;
}

std::string listing(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

bool planned(const StepOut& r, const std::string& value) {
  for (const std::string& v : r.plan.channels_last)
    if (v.rfind(value + " ", 0) == 0) return true;
  return false;
}

// One step of `spec` with train.channels_last off and on, in bf16 and f16, on both kernel sides:
// `values` channels-last each time, among them `nhwc` and none of `nchw`, and the step's loss
// and updated parameters as the NCHW step's. Our own kernels run the same sums on other strides;
// cuDNN's kernels for NHWC are other kernels than its NCHW ones, which sum in another order (the
// emulated cuDNN too: a convolution's channels innermost in NHWC), so the 16-bit activations may
// differ by a rounding here and there, and the loss to the 16-bit type's unit roundoff; the bias
// gradients sum in another order too (columns of (N·H·W, C) instead of channel planes), a
// rounding apart in 16 bits, and the updates follow.
// `terms`: the longest sum of a weight gradient.
// `kernel`: a kernel name the channels-last step must run, if any.
// `library_only`: values of `nhwc` that the native side never writes (a first layer's masked
// gradient, inside its direct relu_backward+sum+conv2d_backward_weight kernel), so that side
// plans that many fewer.
void check_planned_step(const ModelSpec& spec, int32_t values, const std::vector<std::string>& nhwc,
                        const std::vector<std::string>& nchw, int64_t terms,
                        const std::string& kernel = "",
                        const std::vector<std::string>& library_only = {}) {
  for (KernelSide side : {KernelSide::Library, KernelSide::Native})
    for (plx_dtype d : {PLX_BF16, PLX_F16}) {
      const bool native = side == KernelSide::Native;
      INFO(dtype_name(d) << (native ? ", native" : ", library") << " kernels");
      const StepOut off = one_step(spec, side, d, false);
      const StepOut on = one_step(spec, side, d, true);
      INFO("kernels, channels-last:\n"
           << listing(on.kernels) << "channels-last values:\n"
           << listing(on.plan.channels_last));
      CHECK(off.plan.channels_last_values == 0);
      CHECK(on.plan.channels_last_values ==
            values - (native ? static_cast<int32_t>(library_only.size()) : 0));
      for (const std::string& v : nhwc) {
        INFO(v);
        const bool absent =
            native && std::find(library_only.begin(), library_only.end(), v) != library_only.end();
        CHECK(planned(on, v) != absent);
      }
      for (const std::string& v : nchw) CHECK_FALSE(planned(on, v));
      if (!kernel.empty())
        CHECK(std::any_of(on.kernels.begin(), on.kernels.end(), [&](const std::string& k) {
          return k.find(kernel) != std::string::npos;
        }));
      // The loss to the 16-bit type's unit roundoff: one rounding apart in a logit moves it by
      // about that much relative to the logit, and cuDNN's NHWC kernels are not its NCHW ones.
      const double u = d == PLX_F16 ? 0x1p-11 : 0x1p-8;
      INFO("loss, channels-last " << on.loss << ", nchw " << off.loss);
      CHECK(std::abs(on.loss - off.loss) <= u * std::max(1.0, std::abs(off.loss)));
      for (const auto& [name, t] : off.params) {
        INFO(name);
        CHECK(compare_tensors(on.params.at(name), t, tolerance_for(PLX_F32, terms, false)) == "");
      }
    }
}

// The f32 form of check_planned_step: one TF32 step of `spec` with the cuda f32_channels_last
// option off (nothing in f32 prefers NHWC: no value planned channels-last) and on, on both kernel
// sides: `values` channels-last, among them `nhwc` and none of `nchw`, and the loss and updated
// parameters as the NCHW step's. Our TF32 implicit GEMMs sum each output in the same k order in
// both layouts (a channels-last activation gathered 16 bytes, 4 channels, at a time); cuDNN's
// NHWC kernels sum in another order, and the pools' bias sums too, so the loss is held to TF32's
// unit roundoff (2^-11) twice over and the parameters to TF32's tolerance.
void check_planned_f32_step(const ModelSpec& spec, int32_t values,
                            const std::vector<std::string>& nhwc,
                            const std::vector<std::string>& nchw, int64_t terms,
                            const std::vector<std::string>& library_only = {}) {
  for (KernelSide side : {KernelSide::Library, KernelSide::Native}) {
    const bool native = side == KernelSide::Native;
    INFO("f32 (TF32), " << (native ? "native" : "library") << " kernels");
    const StepOut off = one_step(spec, side, PLX_F32, true, true, false);
    const StepOut on = one_step(spec, side, PLX_F32, true, true, true);
    INFO("kernels, channels-last:\n"
         << listing(on.kernels) << "channels-last values:\n"
         << listing(on.plan.channels_last));
    CHECK(off.plan.channels_last_values == 0);
    CHECK(on.plan.channels_last_values ==
          values - (native ? static_cast<int32_t>(library_only.size()) : 0));
    for (const std::string& v : nhwc) {
      INFO(v);
      const bool absent =
          native && std::find(library_only.begin(), library_only.end(), v) != library_only.end();
      CHECK(planned(on, v) != absent);
    }
    for (const std::string& v : nchw) CHECK_FALSE(planned(on, v));
    INFO("loss, channels-last " << on.loss << ", nchw " << off.loss);
    CHECK(std::isfinite(on.loss));
    CHECK(std::abs(on.loss - off.loss) <= 0x1p-10 * std::max(1.0, std::abs(off.loss)));
    for (const auto& [name, t] : off.params) {
      INFO(name);
      CHECK(compare_tensors(on.params.at(name), t, tolerance_for(PLX_F32, terms, true)) == "");
    }
  }
}

}  // namespace

// relu_1 and relu_2 (the third is flattened for the classifier: a view needs row-major memory),
// the gradients of relu_1's and relu_2's outputs and of the first and second convs' outputs, and
// the 16-bit copies of the input and of the three filters (the multi-tensor cast writes them
// channels-last): every 4-D value between two kernels that take NHWC, whichever side and
// whether the conv -> relu pairs fused into one kernel (f16 on the emulator's cuDNN) or run as a
// chain (bf16).
TEST_CASE("a 16-bit cuda step keeps its conv activations channels-last and computes the nchw step",
          "[cuda][layout]") {
  PLX_REQUIRE_CUDA(gpu);
  (void)gpu;  // each side runs in a runtime of its own (backend.kernels)
  check_planned_step(parse_model(kModel, "test_cuda_layout.cpp"), 10,
                     {"relu_1", "relu_2", "x.cast", "conv2d_1.weight.cast", "conv2d_2.weight.cast",
                      "conv2d_3.weight.cast"},
                     {"relu_3"}, 4 * 10 * 10 * 16);
}

// convnet: its max-pools take channels-last tensors in 16 bits, so only the second pool's output
// (flattened for the classifier) stays NCHW. The first layer's output (4, 32, 28, 28), the
// largest activation of the step, the first pool's output and indices, the second pool's
// indices, the data gradients of conv2d_2 and conv2d_3 (relu_1's before its backward), and the
// 16-bit copies of conv2d_2's and conv2d_3's filters go NHWC; inside the conv + relu + pool
// groups the scratch between conv and pool follows. On the native side relu_1's gradient is never
// written: the first layer's backward is one direct kernel that masks as it reads. (The first
// filter and the input image have one channel: the same memory in either layout.)
TEST_CASE(
    "a 16-bit cuda convnet step keeps its activations channels-last up to the classifier and "
    "computes the nchw step",
    "[cuda][layout]") {
  PLX_REQUIRE_CUDA(gpu);
  (void)gpu;
  check_planned_step(
      builtin_model("convnet"), 9,
      {"relu_1", "max_pool2d_1:0", "max_pool2d_1:1", "max_pool2d_2:1", "conv2d_3.grad",
       "conv2d_2.grad", "relu_1.grad", "conv2d_2.weight.cast", "conv2d_3.weight.cast"},
      {"max_pool2d_2:0"}, 4 * 28 * 28 * 32, "", {"relu_1.grad"});
}

// simplecnn: its input has one channel (the same memory in either layout) and its second pool's
// output is flattened, so what goes NHWC is the first pool's output and indices, the second
// pool's indices, the data gradient of conv2d_2 and the 16-bit copy of its filter.
TEST_CASE(
    "a 16-bit cuda simplecnn step keeps its pooled activation channels-last and computes "
    "the nchw step",
    "[cuda][layout]") {
  PLX_REQUIRE_CUDA(gpu);
  (void)gpu;
  check_planned_step(builtin_model("simplecnn"), 5,
                     {"max_pool2d_1:0", "max_pool2d_1:1", "max_pool2d_2:1", "conv2d_2.grad",
                      "conv2d_2.weight.cast"},
                     {"max_pool2d_2:0"}, 4 * 26 * 26 * 16);
}

// A ReLU after a max-pool. After a conv + relu + pool group, the pool's output, the ReLU's,
// their gradients and the indices go NHWC (the ReLU is a dense map). After a batch norm, which
// takes NCHW tensors only, the pool reads NCHW and writes NHWC, and its backward and the ReLU's
// run as one kernel (relu_backward+max_pool2d_backward, reading the ReLU's dy and y in their own
// layouts and writing dx NCHW). In both, the 16-bit copies of the input and of both filters.
TEST_CASE(
    "a 16-bit cuda step with a relu after its pool keeps the pool's side channels-last "
    "and computes the nchw step",
    "[cuda][layout]") {
  PLX_REQUIRE_CUDA(gpu);
  (void)gpu;
  auto model = [](bool batch_norm) {
    return std::string(R"(
name = "convpoolrelu"
input = [8, 10, 10]
classes = 10
[[layers]]
type = "conv2d"
out = 16
kernel = 3
padding = 1
)") + (batch_norm ? "[[layers]]\ntype = \"batch_norm\"\n" : "") +
           R"(
[[layers]]
type = "relu"
[[layers]]
type = "max_pool2d"
kernel = 2
[[layers]]
type = "relu"
[[layers]]
type = "conv2d"
out = 16
kernel = 3
padding = 1
[[layers]]
type = "relu"
[[layers]]
type = "flatten"
[[layers]]
type = "linear"
out = 10
)";
  };
  SECTION("after a conv") {
    check_planned_step(parse_model(model(false), "test_cuda_layout.cpp"), 8,
                       {"max_pool2d_1:0", "max_pool2d_1:1", "relu_2", "relu_2.grad",
                        "conv2d_2.grad", "x.cast", "conv2d_1.weight.cast", "conv2d_2.weight.cast"},
                       {"relu_3"}, 4 * 10 * 10 * 16);
  }
  SECTION("after a batch norm") {
    check_planned_step(parse_model(model(true), "test_cuda_layout.cpp"), 7,
                       {"max_pool2d_1:0", "max_pool2d_1:1", "relu_2", "conv2d_2.grad", "x.cast",
                        "conv2d_1.weight.cast", "conv2d_2.weight.cast"},
                       {"relu_1", "relu_3"}, 4 * 10 * 10 * 16, "relu_backward+max_pool2d_backward");
  }
}

// plugins.options.cuda.f32_channels_last: f32's convolutions, max pools and their fused groups
// prefer channels-last as the 16-bit ones do, so an f32 step plans what a 16-bit one does less
// the 16-bit copies (f32 casts nothing): the conv chain's relu_1 and relu_2, convnet's first
// layer's output, first pool's output and indices, second pool's indices and two data
// gradients, simplecnn's first pool's output and indices, second pool's indices and conv2d_2's
// data gradient. On the native side the TF32 igemm kernels read the channels-last activations
// 16 bytes at a time (channel counts of 8 to 64, multiples of 4).
TEST_CASE(
    "an f32 cuda step with the f32_channels_last option keeps its activations channels-last and "
    "computes the nchw step",
    "[cuda][layout]") {
  PLX_REQUIRE_CUDA(gpu);
  (void)gpu;
  SECTION("a conv chain") {
    check_planned_f32_step(parse_model(kModel, "test_cuda_layout.cpp"), 6, {"relu_1", "relu_2"},
                           {"relu_3"}, 4 * 10 * 10 * 16);
  }
  SECTION("convnet") {
    check_planned_f32_step(builtin_model("convnet"), 7,
                           {"relu_1", "max_pool2d_1:0", "max_pool2d_1:1", "max_pool2d_2:1",
                            "conv2d_3.grad", "conv2d_2.grad", "relu_1.grad"},
                           {"max_pool2d_2:0"}, 4 * 28 * 28 * 32, {"relu_1.grad"});
  }
  SECTION("simplecnn") {
    check_planned_f32_step(builtin_model("simplecnn"), 4,
                           {"max_pool2d_1:0", "max_pool2d_1:1", "max_pool2d_2:1", "conv2d_2.grad"},
                           {"max_pool2d_2:0"}, 4 * 26 * 26 * 16);
  }
}

// backend.kernels = "native" puts a node on the plugin's own kernels wherever one takes it, and
// for the models' training steps one always does: the first layer's direct convolution, igemm
// for the others (TF32 in f32), the mma_sync tiles for the linear layers and the SIMT GEMM for
// the classifier's weight gradient (dlogitsᵀ x, whose 10-element rows no tile takes). So their
// native steps run none of cuBLASLt's or cuDNN's kernels, in f32 (TF32), bf16 and f16; the
// library side, for contrast, runs both kinds.
TEST_CASE("a native cuda training step of simplecnn or convnet runs no library kernel",
          "[cuda][layout]") {
  PLX_REQUIRE_CUDA(gpu);
  (void)gpu;  // each side runs in a runtime of its own (backend.kernels)
  auto library = [](std::string k) {
    std::transform(k.begin(), k.end(), k.begin(), [](unsigned char c) { return std::tolower(c); });
    return k.find("cublas") != std::string::npos || k.find("cudnn") != std::string::npos;
  };
  for (const char* model : {"simplecnn", "convnet"})
    for (plx_dtype d : {PLX_F32, PLX_BF16, PLX_F16}) {
      INFO(model << " " << dtype_name(d));
      const ModelSpec spec = builtin_model(model);
      const StepOut native = one_step(spec, KernelSide::Native, d, true, true);
      const StepOut lib = one_step(spec, KernelSide::Library, d, true, true);
      INFO("native kernels:\n"
           << listing(native.kernels) << "library kernels:\n"
           << listing(lib.kernels));
      CHECK(std::none_of(native.kernels.begin(), native.kernels.end(), library));
      CHECK(std::any_of(lib.kernels.begin(), lib.kernels.end(), library));
      CHECK(std::isfinite(native.loss));
      CHECK(std::abs(native.loss - lib.loss) <= 2e-2 * std::max(1.0, std::abs(lib.loss)));
    }
}
