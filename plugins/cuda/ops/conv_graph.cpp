// CUDA kernels: the conv family on cuDNN 9's graph API (impl "cudnn_graph"), beside ops/conv.cpp's
// legacy calls (impl "cudnn").
//
//   conv2d                  CONVOLUTION_FORWARD operation         y  = conv(x, w) (+ b)
//   conv2d_backward_data    CONVOLUTION_BACKWARD_DATA operation   dx = convᵀ(dy, w)
//   conv2d_backward_weight  CONVOLUTION_BACKWARD_FILTER operation dw = Σ_n dy_n ⋆ x_n
//   conv2d -> relu          forward + pointwise ADD (bias) + RELU_FWD, one fused graph
//
// Why a second cuDNN path: the legacy cudnnConvolution* functions take one of eight fixed
// algorithms per direction, and cudnnFind* times only those. The graph API describes the
// operation and lets cuDNN's heuristic list every engine configuration it has for it, including
// engines the legacy functions do not reach and runtime-fused ones for conv + bias + ReLU. This
// is how PyTorch calls cuDNN for its convolutions (through cuDNN's frontend). Both paths are
// candidates of the kernel tuner, which keeps the faster per shape (backend.kernels = "auto").
//
// The engine: each kernel builds its operation graph at creation, asks the heuristic
// (CUDNN_HEUR_MODE_A, FALLBACK where A has nothing) for its configurations, and leaves out those
// whose notes do not fit the op: engines that down-convert their inputs, Tensor Core (TF32)
// engines for f32 when the plugin's tf32 option is off, non-deterministic engines for the
// forward (conv2d claims PLX_KERNEL_DETERMINISTIC), runtime-compiled engines for a plain
// convolution (their compilation costs seconds per plan; fused graphs need them). Of the rest, those whose execution plan
// cuDNN finalizes within `conv_workspace` are timed on scratch buffers when the plugin's
// `benchmark` option is on (the first kMaxTimed of them, in the heuristic's order; a
// deterministic backward engine within 5% of the fastest is preferred), and the fastest kept;
// without `benchmark` the heuristic's first usable one. The choice is kept in the algorithm
// cache (conv_algo_cache.hpp) as the configuration's position in the heuristic's list, under
// keys of their own ("graph_fwd", ...), so a shape is timed once per machine and cuDNN version.
//
// Alignment: the tensors are described as 16-byte aligned (what the fast engines want; every
// buffer of the plugin's allocator and every chunk of the fused groups is). A call whose pointers
// are less aligned runs a second plan, built at its first use for element alignment.
//
// The bias: a forward with a bias first tries the graph with the bias ADD fused (y = conv + b in
// f32, one rounding); where no engine runs that, the bias is written into y first and the
// convolution adds onto it (beta = 1), as ops/conv.cpp does. conv2d -> relu (make_cudnn_graph_
// conv_relu, for fusion) is the graph with ADD and RELU_FWD, or declines.
#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "ops/conv_algo_cache.hpp"
#include "ops/cudnn_conv_common.hpp"
#include "ops/gemm_bias.hpp"

namespace plexus::cuda {

namespace {

using dnn::Dir;

constexpr const char* kLog = "cuda.conv";
// Heuristic results looked at (the algorithm cache holds positions up to its kMaxAlgo).
constexpr int64_t kMaxConfigs = conv_cache::kMaxAlgo + 1;
// Usable plans timed per problem, in the heuristic's order.
constexpr int kMaxTimed = 8;
constexpr float kDeterministicSlack = 1.05f;
// The alignment the tensors are described with for the plan every aligned call runs.
constexpr int64_t kAlignment = 16;

std::string last_error(cudnnStatus_t s) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  return std::string(cudnnGetErrorString(s)) + (detail[0] ? std::string(": ") + detail : "");
}

// A backend descriptor, owned.
class BackendDesc {
 public:
  explicit BackendDesc(cudnnBackendDescriptorType_t type) {
    PLX_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  BackendDesc(BackendDesc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  BackendDesc& operator=(BackendDesc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  ~BackendDesc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* values) {
    PLX_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  }
  void set_int64(cudnnBackendAttributeName_t name, std::initializer_list<int64_t> v) {
    set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(v.size()), std::data(v));
  }
  void set_desc(cudnnBackendAttributeName_t name, const BackendDesc& other) {
    cudnnBackendDescriptor_t o = other.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o);
  }
  void set_type(cudnnBackendAttributeName_t name, cudnnDataType_t t) {
    set(name, CUDNN_TYPE_DATA_TYPE, 1, &t);
  }
  void finalize() { PLX_CUDNN_CHECK(cudnnBackendFinalize(d_)); }
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }
  int64_t get_int64(cudnnBackendAttributeName_t name) const {
    int64_t v = 0, n = 0;
    PLX_CUDNN_CHECK(cudnnBackendGetAttribute(d_, name, CUDNN_TYPE_INT64, 1, &n, &v));
    return v;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Tensor unique ids in the variant pack.
enum Uid : int64_t { kX = 1, kW = 2, kY = 3, kBias = 4, kConvOut = 5, kBiased = 6 };

// What runs after the forward convolution inside the graph.
struct Epilogue {
  bool bias = false;  // y = conv + b, b (1, O, 1, 1)
  bool relu = false;  // then max(0, .)
};

// One operation graph with what its descriptors need kept alive (a deque: the epilogue's
// operations refer to tensors already in it), and the uids of the tensors a call passes (the
// virtual ones excluded).
struct Graph {
  std::deque<BackendDesc> parts;
  std::optional<BackendDesc> graph;
  std::vector<int64_t> uids;
};

std::array<int64_t, 4> strides_of(const std::array<int64_t, 4>& d, bool nhwc) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

BackendDesc tensor(int64_t uid, cudnnDataType_t dt, const std::array<int64_t, 4>& dims, bool nhwc,
                   int64_t alignment, bool is_virtual = false) {
  BackendDesc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::array<int64_t, 4> strides = strides_of(dims, nhwc);
  t.set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, dt);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  t.set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, {uid});
  t.set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, {alignment});
  if (is_virtual) {
    const bool v = true;
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
  }
  t.finalize();
  return t;
}

BackendDesc pointwise_op(cudnnPointwiseMode_t mode, const BackendDesc& x, const BackendDesc* b,
                         const BackendDesc& y, std::deque<BackendDesc>& parts) {
  BackendDesc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pw.set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
  pw.finalize();
  BackendDesc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  op.finalize();
  parts.push_back(std::move(pw));
  return op;
}

// A convolution operation's descriptor type and attribute names by role: x (dx), w (dw), y (dy).
struct OpAttrs {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};
constexpr OpAttrs op_attrs(Dir d) {
  switch (d) {
    case Dir::Fwd:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case Dir::BwdData:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case Dir::BwdFilter:
      break;
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

// The operation graph of problem `p` in direction D: the convolution with `beta` (1 where the
// output already holds the bias), then the epilogue's pointwise operations (forward only).
// Throws sdk::Unsupported where cuDNN refuses the graph.
template <Dir D>
Graph build_graph(cudnnHandle_t h, const dnn::ConvProblem& p, float beta, Epilogue ep,
                  int64_t alignment) {
  const sdk::Conv2dParams& g = p.g;
  const cudnnDataType_t dt = dnn::dnn_type(p.dtype);
  Graph gr;
  const std::array<int64_t, 4> xd{g.N, g.C, g.H, g.W}, wd{g.O, g.C / g.groups, g.KH, g.KW},
      yd{g.N, g.O, g.OH, g.OW};
  const bool fused = ep.bias || ep.relu;
  BackendDesc x = tensor(kX, dt, xd, p.x_nhwc, alignment);
  BackendDesc w = tensor(kW, dt, wd, p.w_nhwc, alignment);
  // The convolution's output: y itself, or a virtual f32 tensor the epilogue reads.
  BackendDesc y = fused ? tensor(kConvOut, CUDNN_DATA_FLOAT, yd, p.y_nhwc, alignment, true)
                        : tensor(kY, dt, yd, p.y_nhwc, alignment);

  BackendDesc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  conv.set_type(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_DATA_FLOAT);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  conv.set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, {2});
  conv.set_int64(CUDNN_ATTR_CONVOLUTION_DILATIONS, {g.dh, g.dw});
  conv.set_int64(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {g.sh, g.sw});
  conv.set_int64(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {g.ph, g.pw});
  conv.set_int64(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {g.ph, g.pw});
  conv.finalize();

  const float alpha = 1.0f;
  const OpAttrs at = op_attrs(D);
  BackendDesc op(at.type);
  op.set_desc(at.x, x);
  op.set_desc(at.w, w);
  op.set_desc(at.y, y);
  op.set_desc(at.conv, conv);
  op.set(at.alpha, CUDNN_TYPE_FLOAT, 1, &alpha);
  op.set(at.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  const cudnnStatus_t st = op.try_finalize();
  PLX_DECLINE_UNLESS(st == CUDNN_STATUS_SUCCESS, "%s: cuDNN's graph API refuses the operation: %s",
                     dnn::op_name(D), last_error(st).c_str());
  std::vector<cudnnBackendDescriptor_t> ops{op.get()};
  gr.uids = {kX, kW};
  if (fused) {
    // conv -> [ADD bias ->] [RELU ->] y, through virtual f32 tensors.
    const BackendDesc* last = &y;
    if (ep.bias) {
      BackendDesc b = tensor(kBias, dt, {1, g.O, 1, 1}, false, alignment);
      BackendDesc out = ep.relu ? tensor(kBiased, CUDNN_DATA_FLOAT, yd, p.y_nhwc, alignment, true)
                                : tensor(kY, dt, yd, p.y_nhwc, alignment);
      BackendDesc add = pointwise_op(CUDNN_POINTWISE_ADD, *last, &b, out, gr.parts);
      ops.push_back(add.get());
      gr.parts.push_back(std::move(add));
      gr.parts.push_back(std::move(b));
      gr.parts.push_back(std::move(out));
      last = &gr.parts.back();
      gr.uids.push_back(kBias);
    }
    if (ep.relu) {
      BackendDesc out = tensor(kY, dt, yd, p.y_nhwc, alignment);
      BackendDesc relu = pointwise_op(CUDNN_POINTWISE_RELU_FWD, *last, nullptr, out, gr.parts);
      ops.push_back(relu.get());
      gr.parts.push_back(std::move(relu));
      gr.parts.push_back(std::move(out));
    }
  }
  gr.uids.push_back(kY);

  BackendDesc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
            static_cast<int64_t>(ops.size()), ops.data());
  const cudnnStatus_t gs = graph.try_finalize();
  PLX_DECLINE_UNLESS(gs == CUDNN_STATUS_SUCCESS, "%s%s: cuDNN's graph API refuses the graph: %s",
                     dnn::op_name(D), ep.relu ? "+bias+relu" : ep.bias ? "+bias" : "",
                     last_error(gs).c_str());
  for (BackendDesc* d : {&x, &w, &y, &conv, &op}) gr.parts.push_back(std::move(*d));
  gr.graph.emplace(std::move(graph));
  return gr;
}

// An engine configuration's numerical and behaviour notes, and its engine's global index.
struct Notes {
  int64_t engine = -1;
  bool tensor_core = false, down_convert = false, nondeterministic = false;
  bool runtime_compiled = false, reorder = false;
  std::string text() const {
    std::string s = "engine " + std::to_string(engine);
    if (tensor_core) s += " tensor-core";
    if (nondeterministic) s += " non-deterministic";
    if (runtime_compiled) s += " runtime-compiled";
    return s;
  }
};

Notes notes_of(const BackendDesc& cfg) {
  BackendDesc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  int64_t n = 0;
  PLX_CUDNN_CHECK(cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e));
  Notes out;
  out.engine = engine.get_int64(CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
  cudnnBackendNumericalNote_t num[16];
  PLX_CUDNN_CHECK(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                           CUDNN_TYPE_NUMERICAL_NOTE, 16, &n, num));
  for (int64_t i = 0; i < std::min<int64_t>(n, 16); ++i) {
    out.tensor_core = out.tensor_core || num[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
    out.down_convert = out.down_convert || num[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS;
    out.nondeterministic =
        out.nondeterministic || num[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  }
  cudnnBackendBehaviorNote_t beh[16];
  PLX_CUDNN_CHECK(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                                           CUDNN_TYPE_BEHAVIOR_NOTE, 16, &n, beh));
  for (int64_t i = 0; i < std::min<int64_t>(n, 16); ++i) {
    out.runtime_compiled =
        out.runtime_compiled || beh[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
    out.reorder = out.reorder || beh[i] == CUDNN_BEHAVIOR_NOTE_REQUIRES_FILTER_INT8x32_REORDER ||
                  beh[i] == CUDNN_BEHAVIOR_NOTE_REQUIRES_BIAS_INT8x32_REORDER;
  }
  return out;
}

// The heuristic's engine configurations for a graph, best first (at most kMaxConfigs): mode A,
// or FALLBACK where A lists none.
std::vector<BackendDesc> heuristic_configs(const BackendDesc& graph) {
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    BackendDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) continue;
    int64_t count = 0;
    if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr) !=
            CUDNN_STATUS_SUCCESS ||
        count <= 0)
      continue;
    count = std::min(count, kMaxConfigs);
    std::vector<BackendDesc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(cfgs.back().get());
    }
    int64_t got = 0;
    PLX_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                             raw.data()));
    cfgs.erase(cfgs.begin() + std::clamp<int64_t>(got, 0, count), cfgs.end());
    if (!cfgs.empty()) return cfgs;
  }
  return {};
}

// An execution plan of one engine configuration.
struct Plan {
  std::optional<BackendDesc> cfg;
  std::optional<BackendDesc> plan;
  int64_t workspace = 0;
  int32_t position = -1;  // in the heuristic's list
  Notes notes;
  float ms = -1.0f;  // measured
};

// What a kernel asks of an engine: its direction, data type, whether TF32 is allowed, and
// whether its graph is fused (conv + ADD [+ RELU_FWD]).
struct Want {
  Dir dir;
  plx_dtype dtype;
  bool tf32, fused;
};

// Why a configuration does not fit the op, or "" where it does. Runtime-compiled engines are
// left to fused graphs, which need them: compiling one takes seconds at creation, and PyTorch
// leaves them out of its plain convolutions too.
const char* unfit(const Notes& n, const Want& w) {
  if (n.down_convert) return "it down-converts its inputs";
  if (n.reorder) return "it wants int8x32 reordered operands";
  if (w.dtype == PLX_F32 && !w.tf32 && n.tensor_core) return "TF32 is off";
  if (w.dir == Dir::Fwd && n.nondeterministic) return "the forward keeps to deterministic engines";
  if (!w.fused && n.runtime_compiled) return "runtime compilation is kept for fused graphs";
  return "";
}

// The plan of configuration `cfg` at `position` (which it then owns), or nullopt (with why in
// the debug log, `cfg` left as it was) where it does not fit, cuDNN does not finalize it, or it
// wants more workspace than `limit`.
std::optional<Plan> make_plan(cudnnHandle_t h, BackendDesc& cfg, int32_t position, const Want& w,
                              uint64_t limit) {
  const Dir d = w.dir;
  Plan p;
  p.notes = notes_of(cfg);
  p.position = position;
  if (const char* why = unfit(p.notes, w); why[0]) {
    PLX_LOG(PLX_LOG_DEBUG, kLog, "%s: %s skipped: %s", dnn::op_name(d), p.notes.text().c_str(),
            why);
    return std::nullopt;
  }
  BackendDesc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
  if (const cudnnStatus_t st = plan.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
    PLX_LOG(PLX_LOG_DEBUG, kLog, "%s: %s has no plan: %s", dnn::op_name(d),
            p.notes.text().c_str(), last_error(st).c_str());
    return std::nullopt;
  }
  p.workspace = plan.get_int64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
  if (p.workspace < 0 || static_cast<uint64_t>(p.workspace) > limit) {
    PLX_LOG(PLX_LOG_DEBUG, kLog, "%s: %s wants %lld bytes of workspace, over conv_workspace",
            dnn::op_name(d), p.notes.text().c_str(), static_cast<long long>(p.workspace));
    return std::nullopt;
  }
  p.cfg.emplace(std::move(cfg));
  p.plan.emplace(std::move(plan));
  return p;
}

// The pointers of x (dx), w (dw), y (dy) and the bias in the order of `uids`.
std::vector<void*> by_uid(const std::vector<int64_t>& uids, void* x, void* w, void* y, void* b) {
  std::vector<void*> out;
  for (int64_t u : uids) out.push_back(u == kX ? x : u == kW ? w : u == kY ? y : b);
  return out;
}

// Runs `plan` with these device pointers (by uid) on the handle's current stream.
cudnnStatus_t execute(cudnnHandle_t h, const Plan& plan, const std::vector<int64_t>& uids,
                      const std::vector<void*>& ptrs, void* workspace) {
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(ptrs.size()), ptrs.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  return cudnnBackendExecute(h, plan.plan->get(), pack.get());
}

// conv2d (D = Fwd), conv2d_backward_data, conv2d_backward_weight on the graph API.
template <Dir D>
class GraphConvKernel final : public Kernel {
 public:
  // `relu` (forward only): the kernel of a fused conv2d -> relu, relu(conv(x, w) + b) as one
  // graph; declines where cuDNN has no engine for it (or there is no bias).
  GraphConvKernel(const NodeInfo& node, CudaBackend& backend, bool relu = false)
      : device_(node.device()), p_(node, D), relu_(relu) {
    const char* op = dnn::op_name(D);
    PLX_REQUIRE(D == Dir::Fwd || !relu, "%s: only the forward convolution takes a ReLU", op);
    (void)dnn::dnn_type(p_.dtype);  // declines other types
    PLX_DECLINE_UNLESS(!relu_ || p_.has_bias,
                       "conv2d+relu: the fused graph is written for a bias; the pair runs as a "
                       "chain");
    PLX_DECLINE_UNLESS(!(relu_ && p_.trivial),
                       "conv2d+relu: an empty sum; the pair runs as a chain");
    const CudaOptions& opt = backend.options();
    PLX_DECLINE_UNLESS(opt.graph_api, "%s: cudnn_graph is off (the plugin's graph_api option)",
                       op);
    if (p_.trivial) return;
    use_device(device_);
    ctx_ = &backend.context(device_);
    tf32_ = opt.tf32;
    limit_ = opt.conv_workspace;
    std::lock_guard<std::mutex> lock(ctx_->mu);
    const char* how = "";
    try {
      how = choose_plan(opt);
    } catch (const sdk::BackendError& e) {
      // A call cuDNN rejects with anything but "not supported" (BAD_PARAM for a descriptor it
      // reads otherwise than this code does, say) leaves this candidate out instead of failing
      // the run: the legacy calls and the plugin's own kernels still take the node. The tests
      // hold every shape they cover to running here, so such a rejection does not go unseen.
      PLX_LOG(PLX_LOG_WARN, kLog, "%s: cuDNN's graph API failed; cudnn_graph declines: %s", op,
              e.what());
      throw sdk::Unsupported(sdk::format("%s: cuDNN's graph API failed: %s", op, e.what()));
    }
    PLX_LOG(PLX_LOG_DEBUG, kLog,
            "%s %s on the graph API (x %s, w %s, y %s): %s %s (heuristic's #%d), workspace %lld "
            "bytes%s",
            op, dtype_name(p_.dtype), dnn::layout_name(p_.x_nhwc), dnn::layout_name(p_.w_nhwc),
            dnn::layout_name(p_.y_nhwc), how, plan_->notes.text().c_str(), plan_->position,
            static_cast<long long>(plan_->workspace),
            relu_ ? "; bias and relu fused"
            : fused_bias_ ? "; bias fused"
            : p_.has_bias ? "; bias written first"
                          : "");
  }

  uint64_t workspace_bytes() const override {
    return plan_ ? static_cast<uint64_t>(plan_->workspace) : 0;
  }

  void compute(const KernelCall& c) override {
    if (p_.out_elems == 0) return;
    use_device(device_);
    const cudaStream_t stream = native(c.stream);
    void* out = c.out(0).data;  // y, dx or dw
    const bool bias_first = D == Dir::Fwd && p_.has_bias && !fused_bias_;
    if (bias_first) {
      // y = b, then the convolution adds onto it (beta = 1): one rounding per element.
      const void* b = c.in(2).data;
      if (p_.y_nhwc)
        fill_bias(p_.dtype, out, b, p_.N * p_.OHW, p_.O, 1, stream);
      else
        fill_bias(p_.dtype, out, b, p_.N, p_.O, p_.OHW, stream);
    }
    if (p_.trivial) {
      if (!bias_first)
        PLX_CUDA_CHECK(
            cudaMemsetAsync(out, 0, static_cast<size_t>(p_.out_elems) * p_.elem, stream));
      return;
    }
    const std::vector<void*> ptrs = pointers(c);
    bool aligned = true;
    for (void* q : ptrs) aligned = aligned && reinterpret_cast<uintptr_t>(q) % kAlignment == 0;
    std::lock_guard<std::mutex> lock(ctx_->mu);
    const Plan* plan = &*plan_;
    const Graph* graph = &graph_;
    if (!aligned) {
      if (!unaligned_plan_) make_unaligned_plan();
      plan = &*unaligned_plan_, graph = &unaligned_graph_;
    }
    void* ws = plan->workspace ? c.workspace : nullptr;
    PLX_REQUIRE(!plan->workspace || c.workspace_bytes >= static_cast<uint64_t>(plan->workspace),
                "%s: %llu bytes of workspace given, the plan needs %lld", dnn::op_name(D),
                static_cast<unsigned long long>(c.workspace_bytes),
                static_cast<long long>(plan->workspace));
    PLX_CUDNN_CHECK(cudnnSetStream(ctx_->dnn, stream));
    PLX_CUDNN_CHECK(execute(ctx_->dnn, *plan, graph->uids, ptrs, ws));
  }

 private:
  // The call's pointers in the order of graph_.uids (the unaligned graph's are the same).
  std::vector<void*> pointers(const KernelCall& c) const {
    if constexpr (D == Dir::Fwd)
      return by_uid(graph_.uids, c.in(0).data, c.in(1).data, c.out(0).data,
                    fused_bias_ ? c.in(2).data : nullptr);
    else if constexpr (D == Dir::BwdData)
      return by_uid(graph_.uids, c.out(0).data, c.in(1).data, c.in(0).data, nullptr);
    else
      return by_uid(graph_.uids, c.in(1).data, c.out(0).data, c.in(0).data, nullptr);
  }

  // Chooses the graph and its plan: with the ReLU, with the bias ADD (where an engine runs it),
  // or the convolution alone (beta = 1 over the bias written first, where there is one).
  const char* choose_plan(const CudaOptions& opt) {
    if (relu_) return choose(opt, Epilogue{true, true}, 0.0f);
    if (!p_.has_bias) return choose(opt, Epilogue{}, 0.0f);
    try {
      return choose(opt, Epilogue{true, false}, 0.0f);
    } catch (const sdk::OutOfMemory&) {
      throw;
    } catch (const sdk::Error& e) {
      PLX_LOG(PLX_LOG_DEBUG, kLog, "%s: the bias written first: %s", dnn::op_name(D), e.what());
    }
    return choose(opt, Epilogue{}, 1.0f);
  }

  Epilogue epilogue() const { return Epilogue{fused_bias_, relu_}; }
  Want want() const { return Want{D, p_.dtype, tf32_, fused_bias_}; }
  float beta() const { return D == Dir::Fwd && p_.has_bias && !fused_bias_ ? 1.0f : 0.0f; }

  // Builds graph_ and chooses plan_: cached, measured or the heuristic's first usable plan.
  // Returns how. Throws sdk::Unsupported where no engine runs the graph. Called with ctx_->mu.
  const char* choose(const CudaOptions& opt, Epilogue ep, float beta) {
    fused_bias_ = ep.bias;  // what pointers() and measure() pass
    graph_ = build_graph<D>(ctx_->dnn, p_, beta, ep, kAlignment);
    std::vector<BackendDesc> cfgs = heuristic_configs(*graph_.graph);
    PLX_DECLINE_UNLESS(!cfgs.empty(), "%s: cuDNN's heuristic has no engine for the graph",
                       dnn::op_name(D));
    const std::string key = conv_cache::make_key(dnn::cache_key(p_, cache_op(ep), math_code()));
    conv_cache::AlgoCache* cache =
        opt.benchmark ? &conv_cache::shared_cache(opt.algo_cache, dnn::cache_header(*ctx_)) : nullptr;
    if (cache) {
      if (const auto c = cache->find(key); c && c->algo >= 0 &&
                                             c->algo < static_cast<int32_t>(cfgs.size())) {
        if (auto p = make_plan(ctx_->dnn, cfgs[static_cast<size_t>(c->algo)], c->algo, want(),
                               limit_)) {
          plan_ = std::move(p);
          return "cached";
        }
      }
    }
    std::vector<Plan> usable;
    for (size_t i = 0; i < cfgs.size(); ++i) {
      if (!cache && !usable.empty()) break;
      if (cache && usable.size() >= static_cast<size_t>(kMaxTimed)) break;
      if (auto p = make_plan(ctx_->dnn, cfgs[i], static_cast<int32_t>(i), want(), limit_))
        usable.push_back(std::move(*p));
    }
    PLX_DECLINE_UNLESS(!usable.empty(),
                       "%s: none of cuDNN's %zu engine configurations for the graph runs here "
                       "within conv_workspace = %llu bytes (--log-level debug says why)",
                       dnn::op_name(D), cfgs.size(), static_cast<unsigned long long>(limit_));
    if (!cache) {
      plan_ = std::move(usable.front());
      return "heuristic";
    }
    size_t best = measure(usable);
    plan_ = std::move(usable[best]);
    conv_cache::Choice stored;
    stored.algo = plan_->position;
    stored.workspace = static_cast<uint64_t>(plan_->workspace);
    cache->store(key, stored);
    return "measured";
  }

  // Times every plan on scratch buffers of this node's shapes (three runs each after one to warm
  // up) and returns the index of the one to keep. Plans that fail to run are left out; where
  // none runs, or the memory for the measurement is not there, the heuristic's first.
  size_t measure(std::vector<Plan>& plans) {
    int64_t ws_bytes = 0;
    for (const Plan& p : plans) ws_bytes = std::max(ws_bytes, p.workspace);
    const size_t bytes[4] = {static_cast<size_t>(p_.x_elems) * p_.elem,
                             static_cast<size_t>(p_.w_elems) * p_.elem,
                             static_cast<size_t>(p_.y_elems) * p_.elem,
                             static_cast<size_t>(p_.O) * p_.elem};
    dnn::ScratchBuffer buf[4], ws;
    bool ok = ws.allocate(static_cast<size_t>(ws_bytes));
    for (int i = 0; i < 4; ++i) ok = ok && buf[i].allocate(bytes[i]);
    if (!ok) {
      PLX_LOG(PLX_LOG_INFO, kLog, "%s: no device memory to time engines; using the heuristic's",
              dnn::op_name(D));
      return 0;
    }
    dnn::ScratchStream stream;
    const dnn::HandleOnStream bound(ctx_->dnn, stream.s);
    // Defined inputs: garbage could hold NaNs or denormals and time differently.
    for (int i = 0; i < 4; ++i) PLX_CUDA_CHECK(cudaMemsetAsync(buf[i].p, 0, bytes[i], stream.s));
    const std::vector<void*> ptrs = by_uid(graph_.uids, buf[0].p, buf[1].p, buf[2].p, buf[3].p);
    cudaEvent_t ev[2];
    PLX_CUDA_CHECK(cudaEventCreate(&ev[0]));
    PLX_CUDA_CHECK(cudaEventCreate(&ev[1]));
    int best = -1, best_det = -1;
    for (size_t i = 0; i < plans.size(); ++i) {
      Plan& p = plans[i];
      cudnnStatus_t st = execute(ctx_->dnn, p, graph_.uids, ptrs, ws.p);
      PLX_CUDA_CHECK(cudaEventRecord(ev[0], stream.s));
      for (int r = 0; r < 3 && st == CUDNN_STATUS_SUCCESS; ++r)
        st = execute(ctx_->dnn, p, graph_.uids, ptrs, ws.p);
      PLX_CUDA_CHECK(cudaEventRecord(ev[1], stream.s));
      PLX_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      if (st != CUDNN_STATUS_SUCCESS) {
        PLX_LOG(PLX_LOG_DEBUG, kLog, "%s: %s failed to run: %s", dnn::op_name(D),
                p.notes.text().c_str(), last_error(st).c_str());
        continue;
      }
      float ms = 0.0f;
      PLX_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      p.ms = ms / 3.0f;
      PLX_LOG(PLX_LOG_DEBUG, kLog, "%s: %s (#%d) %.4f ms, workspace %lld bytes", dnn::op_name(D),
              p.notes.text().c_str(), p.position, static_cast<double>(p.ms),
              static_cast<long long>(p.workspace));
      const int k = static_cast<int>(i);
      if (best < 0 || p.ms < plans[static_cast<size_t>(best)].ms) best = k;
      if (!p.notes.nondeterministic &&
          (best_det < 0 || p.ms < plans[static_cast<size_t>(best_det)].ms))
        best_det = k;
    }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    PLX_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    if (best < 0) return 0;
    if (best_det >= 0 &&
        plans[static_cast<size_t>(best_det)].ms <=
            kDeterministicSlack * plans[static_cast<size_t>(best)].ms)
      best = best_det;
    return static_cast<size_t>(best);
  }

  // The plan for calls whose pointers are not kAlignment-aligned: the same graph described with
  // element alignment, on the heuristic's first usable engine. Called with ctx_->mu held.
  void make_unaligned_plan() {
    unaligned_graph_ =
        build_graph<D>(ctx_->dnn, p_, beta(), epilogue(), static_cast<int64_t>(p_.elem));
    std::vector<BackendDesc> cfgs = heuristic_configs(*unaligned_graph_.graph);
    // The aligned plan's workspace is what the host set aside; one that needs more cannot run.
    for (size_t i = 0; i < cfgs.size() && !unaligned_plan_; ++i)
      unaligned_plan_ = make_plan(ctx_->dnn, cfgs[i], static_cast<int32_t>(i), want(),
                                  static_cast<uint64_t>(plan_->workspace));
    PLX_REQUIRE(unaligned_plan_,
                "%s: cuDNN has no engine for tensors that are not %lld-byte aligned within the "
                "workspace set aside",
                dnn::op_name(D), static_cast<long long>(kAlignment));
    PLX_LOG(PLX_LOG_DEBUG, kLog, "%s: unaligned pointers run %s", dnn::op_name(D),
            unaligned_plan_->notes.text().c_str());
  }

  static const char* cache_op(Epilogue ep) {
    if constexpr (D == Dir::Fwd)
      return ep.relu ? "graph_fwd_bias_relu" : ep.bias ? "graph_fwd_bias" : "graph_fwd";
    else if constexpr (D == Dir::BwdData)
      return "graph_bwd_data";
    else
      return "graph_bwd_filter";
  }
  // What the engine search was allowed, for the cache key: TF32 or not (16 bits: always Tensor
  // Cores).
  int32_t math_code() const { return p_.dtype == PLX_F32 && !tf32_ ? 1 : 0; }

  int32_t device_;
  dnn::ConvProblem p_;
  bool relu_ = false;
  bool fused_bias_ = false;  // the bias ADD in the graph
  bool tf32_ = false;
  uint64_t limit_ = 0;
  DeviceContext* ctx_ = nullptr;
  Graph graph_;
  std::optional<Plan> plan_;
  Graph unaligned_graph_;
  std::optional<Plan> unaligned_plan_;
};

}  // namespace

std::unique_ptr<Kernel> make_cudnn_graph_conv_relu(const NodeInfo& node, CudaBackend& backend) {
  return std::make_unique<GraphConvKernel<Dir::Fwd>>(node, backend, /*relu=*/true);
}

void register_conv_graph(KernelRegistry& r) {
  const uint32_t f = PLX_KERNEL_CAPTURABLE | PLX_KERNEL_STRIDED | PLX_KERNEL_LIBRARY;
  for (plx_dtype d : {PLX_F32, PLX_F16, PLX_BF16}) {
    const plx_layout l = d == PLX_F32 ? PLX_LAYOUT_ANY : PLX_LAYOUT_NHWC;
    r.add<GraphConvKernel<Dir::Fwd>, CudaBackend>("conv2d", d, "cudnn_graph",
                                                  f | PLX_KERNEL_DETERMINISTIC, l);
    r.add<GraphConvKernel<Dir::BwdData>, CudaBackend>("conv2d_backward_data", d, "cudnn_graph", f,
                                                      l);
    r.add<GraphConvKernel<Dir::BwdFilter>, CudaBackend>("conv2d_backward_weight", d,
                                                        "cudnn_graph", f, l);
  }
}

}  // namespace plexus::cuda
