// The CUDA backend's fusion (the contract is in sdk/fusion.hpp and abi/backend.h).
//
// It claims:
//  - a small CNN's whole f32 training step (find_small_cnn_steps: two layers of conv -> relu ->
//    max_pool2d flattened into linear -> softmax_cross_entropy [with the argmax], and all of
//    their backward) as two launches (ops/step_cnn.cu), before its parts' groups below, which
//    take the nodes where the kernel declines (an image that does not fit a block's shared
//    memory) or the option step_fusion is off (or f32_channels_last on);
//  - the optimizer's per-parameter updates (every f32 sgd_update, or every f32 adamw_update,
//    sharing attributes and learning rate): one multi-tensor kernel (optim_fused.hpp) updates
//    all parameters, up to kMultiTensorCapacity tensors per launch, instead of one launch per
//    parameter; under mixed precision with the casts of the 16-bit gradients to f32, which the
//    kernel then reads widened itself;
//  - linear -> relu: one cuBLASLt call whose epilogue adds the bias and applies the ReLU
//    (ops/gemm.cpp), unless the host chose another kernel for the linear node (kernel_hint): our
//    own GEMMs (ops/mma_gemm.cu, ops/wgmma_gemm.cu) then apply the ReLU in their epilogues, as
//    our implicit-GEMM convolution (ops/igemm_conv.cuh) does for a conv2d -> relu whose conv the
//    host gave it; where such a kernel declines, a chain, as below;
//  - conv2d with a bias -> relu: one cudnnConvolutionBiasActivationForward call (ops/conv.cpp)
//    where the host chose cuDNN for the conv and cuDNN takes the call; else a chain, as below;
//  - linear -> gelu (sdk::find_activation_pairs), also where gelu_backward reads the
//    pre-activation (training): where the host gave the linear to our own GEMMs, one launch
//    whose epilogue applies the GELU (erf or tanh, as the node says) and stores the
//    pre-activation beside it where it is needed outside the pair; declined on cuBLASLt (its
//    GELU epilogue is the tanh form only), where in inference the chain below takes it;
//  - other layers whose output feeds only an activation (conv2d, matmul, add, batch_norm,
//    batch_norm_apply or layer_norm, then relu, tanh, sigmoid or gelu): the layer writes into
//    the activation's output and the activation runs there in place (sdk::EpilogueChain), so
//    the pre-activation tensor is never allocated;
//  - the backward of ReLU with pooling: relu_backward feeding max_pool2d_backward, one gather
//    kernel that masks each gradient as it reads it (ops/pool.cu); and of a ReLU after a conv
//    without a pool or a linear layer: relu_backward with the layer's bias-gradient sum, one
//    kernel writing both, as for a GELU after a linear layer (gelu_backward with the sum over
//    rows);
//    for a first layer whose weight gradient the host gave to the direct kernel, with that
//    weight gradient too (ops/direct_conv.cu), so the masked gradient is never written.
//  - the classifier head: linear -> [cast to f32] -> softmax_cross_entropy, with the argmax of
//    the logits, the loss's backward and the linear's dx and db (after dlogits' cast back) when
//    the graph allows (sdk::find_linear_cross_entropy): one kernel over the rows with the
//    weight in shared memory (ops/linear_ce.cu), declined when the weight does not fit.
//  - a convolution with the max pooling after it (sdk::find_conv_max_pool: conv2d -> [relu] ->
//    max_pool2d) and the backward of the pair (sdk::find_max_pool_conv_backward:
//    max_pool2d_backward read only by conv2d_backward_data/_weight and the bias gradient's sum):
//    the plugin's own kernels run a chunk of images at a time, so neither the full pre-pool
//    tensor nor its gradient exists (ops/conv_pool.cpp); a first layer whose conv the host gave
//    to the direct kernel runs its forward as one launch instead (ops/direct_conv.cu). Claimed
//    before the epilogue chains, which would otherwise take the conv2d -> relu.
//  - f16 loss scaling's unscale and check (each gradient times 1/S, summed, the sums added up):
//    one multi-tensor launch (ops/multi_unscale.hpp), with the gradients' casts to f32;
//  - casts between f32, f16 and bf16 (a mixed-precision step's parameters to 16 bits, their
//    gradients back to f32): runs of them that can run as one, one multi-tensor launch each
//    (ops/multi_cast.hpp), claimed last, so that casts in the patterns above stay there.
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"
#include "ops/act_pair_slots.hpp"
#include "ops/conv_pool.hpp"
#include "ops/direct_conv.hpp"
#include "ops/gelu_attr.hpp"
#include "ops/igemm_conv.hpp"
#include "ops/linear_ce.hpp"
#include "ops/mma_gemm.hpp"
#include "ops/multi_cast.hpp"
#include "ops/multi_unscale.hpp"
#include "ops/optim_fused.hpp"
#include "ops/step_cnn.hpp"
#ifdef PLEXUS_CUDA_WGMMA
#include "ops/wgmma_gemm.hpp"
#endif

namespace plexus::cuda {

namespace {

const std::vector<std::string_view> kProducers = {"linear",     "conv2d",           "matmul",
                                                  "add",        "batch_norm",       "layer_norm",
                                                  "batch_norm_apply"};
const std::vector<std::string_view> kEpilogues = {"relu", "tanh", "sigmoid", "gelu"};

bool is_f32_group(const sdk::GraphView& g, const std::vector<int32_t>& grp) {
  return g.value(g.node(grp[0]).inputs[0]).dtype == PLX_F32;
}

// The loss_scale_update that reads the check (input `check_at`) of the optimizer nodes `grp`,
// after all of them, and (AdamW) their step count; -1 if none.
int32_t scaler_after(const sdk::GraphView& g, const std::vector<int32_t>& grp, int32_t check_at) {
  const plx_graph_node& first = g.node(grp[0]);
  if (first.num_inputs <= check_at || !g.valid(first.inputs[check_at])) return -1;
  const int32_t check = first.inputs[check_at];
  for (int32_t n = grp.back() + 1; n < g.num_nodes(); ++n) {
    if (!g.is(n, "loss_scale_update") || g.node(n).num_inputs != 6 || g.node(n).inputs[0] != check)
      continue;
    const int32_t step = g.node(n).inputs[5];
    // AdamW reads the step count the loss scale then moves; SGD has none.
    const bool adamw = check_at == 6;
    if (adamw ? step != first.inputs[5] : g.valid(step)) return -1;
    return n;
  }
  return -1;
}

// A sum of a 2-d value over its rows (axes {0}, no keepdims): a linear layer's bias gradient.
bool row_sum(const sdk::GraphView& g, int32_t n) {
  const plx_graph_node& s = g.node(n);
  if (s.num_inputs != 1 || s.num_outputs != 1 || !g.valid(s.inputs[0]) || g.value(s.inputs[0]).ndim != 2)
    return false;
  const plx_attr* keep = g.find_attr(n, "keepdims");
  if (keep && (keep->type != PLX_ATTR_INT || keep->i != 0)) return false;
  const plx_attr* axes = g.find_attr(n, "axes");
  return axes && axes->type == PLX_ATTR_INTS && axes->count == 1 && (axes->ints[0] == 0 || axes->ints[0] == -2);
}

// The first node of `op` in the view, -1 if none.
int32_t first_of(const sdk::GraphView& g, std::string_view op) {
  for (int32_t n = 0; n < g.num_nodes(); ++n)
    if (g.is(n, op)) return n;
  return -1;
}

// A cast from f16 or bf16 to f32.
bool widening_cast(const sdk::GraphView& g, int32_t n) {
  if (!g.is(n, "cast") || g.node(n).num_inputs != 1 || g.node(n).num_outputs != 1) return false;
  const int32_t from = g.value(g.node(n).inputs[0]).dtype;
  return (from == PLX_F16 || from == PLX_BF16) && g.value(g.node(n).outputs[0]).dtype == PLX_F32;
}

// A mixed-precision step's optimizer group with its gradients' casts: the optimizer nodes `grp`
// and, when every one's gradient (input 1) is a widening cast of one source dtype read by that
// node alone, those casts too (sorted). The update then reads the 16-bit gradients itself.
// Empty where the gradients are not all such casts.
std::vector<int32_t> with_grad_casts(const sdk::GraphView& g, const std::vector<int32_t>& grp) {
  std::vector<int32_t> nodes = grp;
  int32_t from = -1;
  for (int32_t n : grp) {
    const int32_t v = g.node(n).inputs[1];
    const int32_t c = g.valid(v) ? g.producer(v) : -1;
    if (c < 0 || !widening_cast(g, c) || g.readers(v).size() != 1) return {};
    const int32_t d = g.value(g.node(c).inputs[0]).dtype;
    if (from >= 0 && d != from) return {};
    from = d;
    nodes.push_back(c);
  }
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

// The gradients' dtype of a multi-tensor group (MultiSgd, MultiAdamw, MultiUnscaleCheck) whose
// inputs `in` were found with the op as members: input 1 of an update, input 0 of the unscale's
// mul. f32, or the one 16-bit dtype that widening casts in the group (with_grad_casts), each
// read by its member alone, bring to f32.
int32_t grad_dtype(const sdk::GraphView& g, const sdk::Boundary& b, const sdk::GroupInputs& in,
                   const char* op, int32_t k = 1) {
  int32_t dtype = -1;
  for (int32_t n = 0; n < in.nodes(); ++n) {
    const int32_t c = in.feeder(n, k);
    int32_t d = PLX_F32;
    if (c >= 0) {
      PLX_DECLINE_UNLESS(widening_cast(g, c) && b.output(g.node(c).outputs[0]) < 0,
                         "multi-tensor %s: a gradient made in the group that is not a widening "
                         "cast read by its %s alone", op, op);
      d = g.value(g.node(c).inputs[0]).dtype;
    }
    PLX_DECLINE_UNLESS(dtype < 0 || dtype == d, "multi-tensor %s: gradients of two dtypes", op);
    dtype = d;
  }
  return dtype;
}

// The loss_scale_update node of an optimizer group (f16's loss scale, claimed after the updates
// that read its check), run by the last block of the updates' launches.
class FusedScaler {
 public:
  FusedScaler(const sdk::GraphView& g, const sdk::Boundary& b) {
    const int32_t n = first_of(g, "loss_scale_update");
    if (n < 0) return;
    const plx_graph_node& node = g.node(n);
    PLX_DECLINE_UNLESS(node.num_inputs == 6 && node.num_outputs == 1, "loss_scale_update: %d inputs",
                       node.num_inputs);
    for (int32_t k = 0; k < 6; ++k) {
      in_[k] = g.valid(node.inputs[k]) ? b.input(node.inputs[k]) : -1;
      PLX_DECLINE_UNLESS(in_[k] >= 0 || (k == 5 && !g.valid(node.inputs[k])),
                         "loss_scale_update: input %d is made inside the group", k);
      PLX_DECLINE_UNLESS((k == 5 && in_[k] < 0) || g.value(node.inputs[k]).dtype == PLX_F32,
                         "loss_scale_update: f32 only");
    }
    out_ = b.output(node.outputs[0]);
    PLX_DECLINE_UNLESS(out_ >= 0, "loss_scale_update: its report is not written");
    const sdk::OwnedNodeInfo info(g, n);
    const NodeInfo ni(&info.get());
    args_.interval = static_cast<float>(ni.attr_int("growth_interval"));
    args_.growth = static_cast<float>(ni.attr_float("growth_factor"));
    args_.backoff = static_cast<float>(ni.attr_float("backoff_factor"));
    done_ = std::make_unique<BlockCounter>();
  }
  // The loss scale's arguments in this call; null without one.
  const LossScaleArgs* args(const KernelCall& c) {
    if (!done_) return nullptr;
    auto f = [&](int32_t k) { return in_[k] < 0 ? nullptr : static_cast<float*>(c.in(in_[k]).data); };
    args_.check = f(0);
    args_.scale = f(1);
    args_.unscale = f(2);
    args_.good = f(3);
    args_.skipped = f(4);
    args_.step = f(5);
    args_.report = static_cast<float*>(c.out(out_).data);
    return &args_;
  }
  unsigned* done() const { return done_ ? done_->p : nullptr; }

 private:
  int32_t in_[6] = {-1, -1, -1, -1, -1, -1};
  int32_t out_ = -1;
  LossScaleArgs args_;
  std::unique_ptr<BlockCounter> done_;
};

// Every sgd_update of a group in one launch per kMultiTensorCapacity tensors.
class MultiSgd final : public Kernel {
 public:
  MultiSgd(const sdk::GraphView& g, const sdk::Boundary& b, int32_t device)
      : in_(g, b, "sgd_update"),
        device_(device),
        grad_dtype_(grad_dtype(g, b, in_, "sgd_update")),
        scaler_(g, b) {
    const sdk::OwnedNodeInfo info(g, first_of(g, "sgd_update"));
    const NodeInfo node(&info.get());
    args_.momentum = node.attr_float("momentum");
    args_.dampening = node.attr_float("dampening");
    args_.weight_decay = node.attr_float("weight_decay");
    args_.nesterov = node.attr_int("nesterov") != 0;
    for (int32_t n = 0; n < in_.nodes(); ++n) {
      PLX_REQUIRE(args_.momentum == 0 || in_.has(n, 2), "sgd_update: momentum needs momentum_buf");
      numel_.push_back(in_.numel(n));
    }
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    param_.clear(), grad_.clear(), buf_.clear();
    for (int32_t n = 0; n < in_.nodes(); ++n) {
      param_.push_back(sdk::data<float>(in_.get(c, n, 0)));
      grad_.push_back(in_.get(c, n, 1).data);
      buf_.push_back(args_.momentum != 0 ? sdk::data<float>(in_.get(c, n, 2)) : nullptr);
    }
    const plx_tensor lr = in_.get(c, 0, 3);
    MultiSgdArgs a = args_;
    a.count = in_.nodes();
    a.param = param_.data();
    a.grad = grad_.data();
    a.grad_dtype = grad_dtype_;
    a.momentum_buf = buf_.data();
    a.numel = numel_.data();
    a.lr = lr.data;
    a.lr_dtype = lr.dtype;
    a.check = static_cast<const float*>(in_.get(c, 0, 4).data);
    a.scaler = scaler_.args(c);
    a.done = scaler_.done();
    launch_multi_sgd(a, native(c.stream));
  }

 private:
  sdk::GroupInputs in_;
  int32_t device_;
  int32_t grad_dtype_;
  FusedScaler scaler_;
  MultiSgdArgs args_;
  std::vector<int64_t> numel_;
  std::vector<float*> param_, buf_;
  std::vector<const void*> grad_;
};

class MultiAdamw final : public Kernel {
 public:
  MultiAdamw(const sdk::GraphView& g, const sdk::Boundary& b, CudaBackend& backend, int32_t device)
      : in_(g, b, "adamw_update"),
        device_(device),
        grad_dtype_(grad_dtype(g, b, in_, "adamw_update")),
        scaler_(g, b) {
    const sdk::OwnedNodeInfo info(g, first_of(g, "adamw_update"));
    const NodeInfo node(&info.get());
    args_.beta1 = node.attr_float("beta1");
    args_.beta2 = node.attr_float("beta2");
    args_.eps = node.attr_float("eps");
    args_.weight_decay = node.attr_float("weight_decay");
    args_.error = backend.context(device).error_dev;
    for (int32_t n = 0; n < in_.nodes(); ++n) numel_.push_back(in_.numel(n));
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    param_.clear(), grad_.clear(), m_.clear(), v_.clear();
    for (int32_t n = 0; n < in_.nodes(); ++n) {
      param_.push_back(sdk::data<float>(in_.get(c, n, 0)));
      grad_.push_back(in_.get(c, n, 1).data);
      m_.push_back(sdk::data<float>(in_.get(c, n, 2)));
      v_.push_back(sdk::data<float>(in_.get(c, n, 3)));
    }
    const plx_tensor lr = in_.get(c, 0, 4);
    const plx_tensor step = in_.get(c, 0, 5);
    MultiAdamwArgs a = args_;
    a.count = in_.nodes();
    a.param = param_.data();
    a.grad = grad_.data();
    a.grad_dtype = grad_dtype_;
    a.exp_avg = m_.data();
    a.exp_avg_sq = v_.data();
    a.numel = numel_.data();
    a.lr = lr.data;
    a.lr_dtype = lr.dtype;
    a.step = step.data;
    a.step_dtype = step.dtype;
    a.check = static_cast<const float*>(in_.get(c, 0, 6).data);
    a.scaler = scaler_.args(c);
    a.done = scaler_.done();
    launch_multi_adamw(a, native(c.stream));
  }

 private:
  sdk::GroupInputs in_;
  int32_t device_;
  int32_t grad_dtype_;
  FusedScaler scaler_;
  MultiAdamwArgs args_;
  std::vector<int64_t> numel_;
  std::vector<float*> param_, m_, v_;
  std::vector<const void*> grad_;
};

// f16 loss scaling's unscale and check (core/src/train/step_graph.cpp): per gradient, u =
// mul(g, U) with U one f32 scalar shared by all and g f32 (or a widening cast's output, read by
// that mul alone, which joins), s = sum(u) over every axis, read only by the chain of adds that
// totals the sums into the check. The unscaled gradients and the check are written for the
// updates and the loss scale's update after the group. The group (sorted), or empty where the
// graph has no such pattern; without the gradients' casts when `casts` is false.
std::vector<int32_t> find_unscale_check(const sdk::GraphView& g, bool casts_join = true) {
  int32_t unscale = -1;
  std::vector<int32_t> muls, sums, adds, casts;
  std::vector<int32_t> open;  // sums and adds whose output the chain has not read yet
  auto only_reader = [&](int32_t v, int32_t n) {
    return g.readers(v).size() == 1 && g.readers(v)[0] == n;
  };
  for (int32_t n = 0; n < g.num_nodes(); ++n) {
    const plx_graph_node& node = g.node(n);
    if (g.is(n, "sum") && node.num_inputs == 1 && node.num_outputs == 1 &&
        g.value(node.outputs[0]).ndim == 0 && g.value(node.outputs[0]).dtype == PLX_F32) {
      const int32_t u = node.inputs[0];
      const int32_t m = g.valid(u) ? g.producer(u) : -1;
      // The unscaled gradient may have readers after the group too (the updates); the core
      // refuses a claim with one between its members.
      if (m < 0 || !g.is(m, "mul")) continue;
      const plx_graph_node& mn = g.node(m);
      if (mn.num_inputs != 2 || !g.valid(mn.inputs[0]) || !g.valid(mn.inputs[1])) continue;
      const plx_tensor& sc = g.value(mn.inputs[1]);
      const plx_tensor& x = g.value(mn.inputs[0]);
      if (sc.dtype != PLX_F32 || sdk::numel(sc) != 1 || sc.ndim != 0 || x.dtype != PLX_F32 ||
          g.value(u).dtype != PLX_F32 || sdk::numel(x) != sdk::numel(g.value(u)) ||
          !sdk::is_contiguous(x) || g.producer(mn.inputs[1]) >= 0)
        continue;
      if (unscale >= 0 && mn.inputs[1] != unscale) return {};
      unscale = mn.inputs[1];
      muls.push_back(m);
      sums.push_back(n);
      open.push_back(n);
    } else if (g.is(n, "add") && node.num_inputs == 2 && node.num_outputs == 1 &&
               g.valid(node.inputs[0]) && g.valid(node.inputs[1])) {
      // An add of two open totals joins the chain; each must be read by it alone.
      const int32_t p0 = g.producer(node.inputs[0]), p1 = g.producer(node.inputs[1]);
      auto is_open = [&](int32_t p) { return std::find(open.begin(), open.end(), p) != open.end(); };
      if (p0 < 0 || p0 == p1 || !is_open(p0) || !is_open(p1)) continue;
      if (!only_reader(node.inputs[0], n) || !only_reader(node.inputs[1], n)) return {};
      std::erase(open, p0);
      std::erase(open, p1);
      adds.push_back(n);
      open.push_back(n);
    }
  }
  // One total (the updates and the loss scale's update read it after the group).
  if (sums.empty() || open.size() != 1) return {};
  // The gradients' casts join when every mul reads one (one source dtype) and nothing else does.
  int32_t from = -1;
  for (int32_t m : muls) {
    if (!casts_join) break;
    const int32_t v = g.node(m).inputs[0];
    const int32_t c = g.producer(v);
    if (c < 0 || !widening_cast(g, c) || !only_reader(v, m)) {
      casts.clear();
      break;
    }
    const int32_t d = g.value(g.node(c).inputs[0]).dtype;
    if (from >= 0 && d != from) {
      casts.clear();
      break;
    }
    from = d;
    casts.push_back(c);
  }
  std::vector<int32_t> nodes = muls;
  for (const auto* v : {&sums, &adds, &casts}) nodes.insert(nodes.end(), v->begin(), v->end());
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

// The group find_unscale_check() claims, as one multi-tensor launch (ops/multi_unscale.hpp).
class MultiUnscaleCheck final : public Kernel {
 public:
  MultiUnscaleCheck(const sdk::GraphView& g, const sdk::Boundary& b, int32_t device)
      : in_(g, b, "mul"), device_(device), in_dtype_(grad_dtype(g, b, in_, "mul", 0)) {
    int32_t root = -1;
    for (int32_t n = 0; n < g.num_nodes(); ++n) {
      const plx_graph_node& node = g.node(n);
      if ((g.is(n, "sum") || g.is(n, "add")) && g.readers(node.outputs[0]).empty()) {
        PLX_DECLINE_UNLESS(root < 0, "multi-tensor unscale: two totals");
        root = n;
      }
      if (!g.is(n, "mul")) continue;
      const int32_t out = b.output(node.outputs[0]);
      PLX_DECLINE_UNLESS(out >= 0, "multi-tensor unscale: an unscaled gradient is not written");
      out_.push_back(out);
    }
    for (int32_t m = 0; m < in_.nodes(); ++m) {
      PLX_DECLINE_UNLESS(in_.has(m, 1) && in_.slot(m, 1) == in_.slot(0, 1),
                         "multi-tensor unscale: two scales");
      numel_.push_back(in_.numel(m));
    }
    PLX_DECLINE_UNLESS(root >= 0 && in_.nodes() > 0, "multi-tensor unscale: no total");
    check_ = b.output(g.node(root).outputs[0]);
    PLX_DECLINE_UNLESS(check_ >= 0, "multi-tensor unscale: the total is not written");
    blocks_ = multi_unscale_blocks(in_.nodes(), numel_.data());
  }

  uint64_t workspace_bytes() const override { return static_cast<uint64_t>(blocks_) * sizeof(float); }

  void compute(const KernelCall& c) override {
    use_device(device_);
    src_.clear(), dst_.clear();
    for (int32_t m = 0; m < in_.nodes(); ++m) {
      src_.push_back(in_.get(c, m, 0).data);
      dst_.push_back(static_cast<float*>(c.out(out_[static_cast<size_t>(m)]).data));
    }
    MultiUnscaleArgs a;
    a.count = in_.nodes();
    a.in = src_.data();
    a.in_dtype = in_dtype_;
    a.out = dst_.data();
    a.numel = numel_.data();
    a.unscale = static_cast<const float*>(in_.get(c, 0, 1).data);
    a.check = static_cast<float*>(c.out(check_).data);
    a.partial = static_cast<float*>(c.workspace);
    a.done = done_.p;
    launch_multi_unscale(a, native(c.stream));
  }

 private:
  sdk::GroupInputs in_;  // the muls': the gradient (through its cast) and the scale
  int32_t device_;
  int32_t in_dtype_;
  int32_t check_ = -1;
  std::vector<int32_t> out_;
  std::vector<int64_t> numel_;
  int64_t blocks_ = 0;
  BlockCounter done_;
  std::vector<const void*> src_;
  std::vector<float*> dst_;
};

// Every cast of a group (independent casts, one dtype pair) in one launch per
// kMultiCastCapacity tensors.
class MultiCast final : public Kernel {
 public:
  MultiCast(const sdk::GraphView& g, const sdk::Boundary& b, int32_t device)
      : in_(g, b), device_(device) {
    from_ = static_cast<plx_dtype>(g.value(g.node(0).inputs[0]).dtype);
    to_ = static_cast<plx_dtype>(g.value(g.node(0).outputs[0]).dtype);
    for (int32_t n = 0; n < in_.nodes(); ++n) {
      const plx_graph_node& node = g.node(n);
      PLX_DECLINE_UNLESS(node.num_outputs == 1 && g.value(node.outputs[0]).dtype == to_ &&
                             g.value(node.inputs[0]).dtype == from_,
                         "multi-tensor cast: casts of one dtype pair");
      const int32_t slot = b.output(node.outputs[0]);
      PLX_DECLINE_UNLESS(slot >= 0, "multi-tensor cast: a cast read only inside the group");
      out_slot_.push_back(slot);
      numel_.push_back(in_.numel(n));
      // Contiguous inputs; outputs contiguous or, for 4-D ones, channels-last (the layout
      // planner's, for the 16-bit copies of conv filters that NHWC convolutions read).
      const plx_tensor& x = g.value(node.inputs[0]);
      const plx_tensor& y = g.value(node.outputs[0]);
      const bool cl = !sdk::is_contiguous(y) && sdk::is_channels_last(y);
      PLX_DECLINE_UNLESS(sdk::is_contiguous(x) && (sdk::is_contiguous(y) || cl),
                         "multi-tensor cast: contiguous inputs, outputs contiguous or "
                         "channels-last");
      PLX_DECLINE_UNLESS(!cl || y.shape[1] <= INT32_MAX, "multi-tensor cast: too many channels");
      cl_c_.push_back(cl ? static_cast<int32_t>(y.shape[1]) : 0);
      cl_hw_.push_back(cl ? y.shape[2] * y.shape[3] : 0);
    }
  }

  void compute(const KernelCall& c) override {
    use_device(device_);
    src_.clear(), dst_.clear();
    for (int32_t n = 0; n < in_.nodes(); ++n) {
      src_.push_back(in_.get(c, n, 0).data);
      dst_.push_back(c.out(out_slot_[static_cast<size_t>(n)]).data);
    }
    launch_multi_cast(from_, to_, in_.nodes(), src_.data(), dst_.data(), numel_.data(),
                      cl_c_.data(), cl_hw_.data(), native(c.stream));
  }

 private:
  sdk::GroupInputs in_;
  int32_t device_;
  plx_dtype from_ = PLX_F32, to_ = PLX_F32;
  std::vector<int32_t> out_slot_;
  std::vector<int64_t> numel_;
  std::vector<int32_t> cl_c_;  // per cast: C of a channels-last output, else 0
  std::vector<int64_t> cl_hw_;
  std::vector<const void*> src_;
  std::vector<void*> dst_;
};

bool float_dtype(int32_t d) { return d == PLX_F32 || d == PLX_F16 || d == PLX_BF16; }

// Runs of casts (one dtype pair, floats) that may run as one kernel at the place of their last
// member: no node between the first and the last reads what a member writes (the rule the core
// checks claims against). Greedy in graph order; runs of one are left out. `taken`: nodes in
// earlier claims.
std::vector<std::vector<int32_t>> cast_runs(const sdk::GraphView& g, const std::vector<bool>& taken) {
  std::vector<std::vector<int32_t>> runs;
  for (const auto& grp : sdk::same_op_groups(g, "cast", {})) {
    std::vector<int32_t> run;
    auto flush = [&] {
      if (run.size() >= 2) runs.push_back(run);
      run.clear();
    };
    for (int32_t n : grp) {
      const plx_graph_node& node = g.node(n);
      if (taken[static_cast<size_t>(n)] || node.num_outputs != 1 ||
          !float_dtype(g.value(node.inputs[0]).dtype) || !float_dtype(g.value(node.outputs[0]).dtype))
        continue;
      // Would a node after the run's last member and before n read a member's output?
      bool clash = false;
      for (int32_t m : run)
        for (int32_t r : g.readers(g.node(m).outputs[0]))
          clash = clash || (r > run.back() && r < n);
      if (clash) flush();
      run.push_back(n);
    }
    flush();
  }
  return runs;
}

// A linear -> relu, conv2d -> relu or linear -> gelu pair as one kernel of the layer's that
// applies the activation itself, chosen by the host's choice for the layer (`impl`, "" for
// none): cuDNN's fused call for a conv given to cuDNN or to nothing (unless conv_bias_activation
// is off), our own kernels' epilogues for one given to them. A gelu pair is only ours (cuBLASLt's
// GELU epilogue is the tanh form alone), and keeps the pre-activation where it is needed outside
// the pair (in training gelu_backward reads it): the epilogue stores it beside the activation.
// Null where no such kernel applies or it declines (the debug log says why); `name` is the fused
// kernel's.
std::unique_ptr<Kernel> make_act_pair(CudaBackend& backend, const sdk::GraphView& g,
                                      const sdk::Boundary& b, const std::string& impl,
                                      std::string& name) {
  const bool linear = g.is(0, "linear");
  const bool gelu = g.num_nodes() == 2 && g.is(1, "gelu");
  const char* act_op = gelu ? "gelu" : "relu";
  try {
    ActPairSlots slots(g, b, linear ? "linear" : "conv2d", act_op, /*keep_pre=*/gelu);
    const sdk::OwnedNodeInfo info(g, 0);
    const NodeInfo node(&info.get());
    MmaAct act = MmaAct::Relu;
    if (gelu) {
      const sdk::OwnedNodeInfo ai(g, 1);
      act = gelu_tanh(NodeInfo(&ai.get())) ? MmaAct::GeluTanh : MmaAct::Gelu;
    }
    std::unique_ptr<Kernel> layer;
    name = std::string(g.node(0).op) + "+" + act_op + ":" + impl + "-epilogue";
    if (gelu) {
      PLX_DECLINE_UNLESS(linear && (impl.starts_with("mma_sync_") || impl.starts_with("wgmma_")),
                         "a %s -> gelu pair is one kernel only on the plugin's own GEMM tiles, "
                         "and the host chose %s for the %s",
                         g.node(0).op, impl.empty() ? "no kernel" : impl.c_str(), g.node(0).op);
    }
    if (!linear && (impl.empty() || impl == "cudnn")) {
      if (!backend.options().conv_bias_activation) return nullptr;
      layer = make_cudnn_conv_relu(node, backend);
      name = "conv2d+relu:cudnn-bias-activation";
    } else if (!linear && impl == "cudnn_graph") {
      layer = make_cudnn_graph_conv_relu(node, backend);
      name = "conv2d+relu:cudnn_graph-fused";
    } else if (linear && impl.starts_with("mma_sync_")) {
      layer = make_mma_linear(node, backend, impl, act);
#ifdef PLEXUS_CUDA_WGMMA
    } else if (linear && impl.starts_with("wgmma_")) {
      layer = make_wgmma_linear(node, backend, impl, act);
#endif
    } else if (!linear && impl.starts_with("igemm_")) {
      layer = make_igemm_conv(node, backend, impl, /*relu=*/true);
    } else if (!linear && impl == "direct") {
      layer = make_direct_conv(node, backend, /*relu=*/true);
    }
    if (!layer) return nullptr;
    return std::make_unique<ActPairKernel>(std::move(slots), std::move(layer));
  } catch (const sdk::Unsupported& e) {
    PLX_LOG(PLX_LOG_DEBUG, "cuda.fusion", "%s+%s on %s: %s", g.node(0).op, act_op,
            impl.empty() ? "the default kernel" : impl.c_str(), e.what());
    return nullptr;
  }
}

}  // namespace

void CudaBackend::get_capability(const plx_graph_view& graph, plx_claim_fn claim_fn, void* user) {
  const sdk::GraphView g(graph);
  // The nodes of accepted claims, so that the casts' runs (claimed last) leave them out.
  std::vector<bool> taken(static_cast<size_t>(std::max(g.num_nodes(), 0)), false);
  auto claim = [&](void* u, const int32_t* nodes, int32_t count, const char* name) {
    const plx_status st = claim_fn(u, nodes, count, name);
    if (st == PLX_OK)
      for (int32_t i = 0; i < count; ++i) taken[static_cast<size_t>(nodes[i])] = true;
    return st;
  };
  // A refused claim (the core's debug log says why) leaves the nodes to run alone.
  // The updates with their gradients' casts where they can (one launch for both), else alone.
  // And with f16's loss scale after them (its last block moves it), where one reads their check.
  auto claim_optim = [&](const std::vector<int32_t>& grp, int32_t check_at, const char* name) {
    const std::vector<int32_t> with_casts = with_grad_casts(g, grp);
    const int32_t scaler = scaler_after(g, grp, check_at);
    std::vector<std::vector<int32_t>> tries;
    for (const auto* base : {&with_casts, &grp}) {
      if (base->empty()) continue;
      if (scaler >= 0) {
        tries.push_back(*base);
        tries.back().push_back(scaler);
      }
      tries.push_back(*base);
    }
    for (const auto& t : tries)
      if (claim(user, t.data(), static_cast<int32_t>(t.size()), name) == PLX_OK) return;
  };
  for (const auto& grp : sdk::same_op_groups(g, "sgd_update", {3, 4}))
    if (is_f32_group(g, grp)) claim_optim(grp, 4, "multi_tensor_sgd");
  for (const auto& grp : sdk::same_op_groups(g, "adamw_update", {4, 5, 6}))
    if (is_f32_group(g, grp)) claim_optim(grp, 6, "multi_tensor_adamw");
  // f16 loss scaling's unscale and check: one launch (before the casts' runs, which would take
  // the gradients' casts).
  // Without the casts where the core refuses them (data parallelism all-reduces the gradients
  // between the casts and the unscale).
  if (const auto grp = find_unscale_check(g); !grp.empty() &&
      claim(user, grp.data(), static_cast<int32_t>(grp.size()), "multi_tensor_unscale_check") != PLX_OK)
    if (const auto bare = find_unscale_check(g, false); bare.size() < grp.size())
      claim(user, bare.data(), static_cast<int32_t>(bare.size()), "multi_tensor_unscale_check");
  // A small CNN's whole step (ops/step_cnn.cu): before its parts' groups below, which take the
  // nodes where the core refuses it or the kernel declines. Not where f32_channels_last asks for
  // channels-last activations, which the kernel does not take.
  if (options().step_fusion && !options().f32_channels_last)
    for (const auto& grp : find_small_cnn_steps(g))
      claim(user, grp.data(), static_cast<int32_t>(grp.size()), "small_cnn_step");
  // A conv layer with its max pool, forward and backward (ops/conv_pool.cpp): before the
  // epilogue chains, as claims are first come, first served. Inference graphs too: indices
  // nobody reads are still among the group's outputs (the core writes every value read by
  // nobody), as the CPU's test of an inference graph shows.
  for (const auto& grp : sdk::find_conv_max_pool(g))
    claim(user, grp.data(), static_cast<int32_t>(grp.size()),
          grp.size() == 3 ? "conv2d+relu+max_pool2d" : "conv2d+max_pool2d");
  for (const auto& grp : sdk::find_max_pool_conv_backward(g))
    claim(user, grp.data(), static_cast<int32_t>(grp.size()), "max_pool2d_backward+conv2d_backward");
  // The backward of ReLU with pooling: the pool's gradient masks as it reads (ops/pool.cu).
  for (const auto& pair : sdk::find_feeding_pairs(g, "relu_backward", "max_pool2d_backward", 0))
    claim(user, pair.data(), 2, "relu_backward+max_pool2d_backward");
  // A first layer's backward (conv -> relu, nothing reads dx): the ReLU's backward with both
  // readers of what it writes, the bias gradient's sum and the weight gradient, as one direct
  // weight-gradient launch (ops/direct_conv.cu) where the host gave the weight gradient to it;
  // else declined at creation, and the pair below takes the ReLU and the sum.
  for (int32_t n = 0; n < g.num_nodes(); ++n) {
    if (!g.is(n, "relu_backward") || g.node(n).num_outputs != 1) continue;
    const int32_t v = g.node(n).outputs[0];
    if (!g.valid(v) || g.value(v).ndim != 4) continue;
    const std::vector<int32_t> rd = g.readers(v);
    if (rd.size() != 2) continue;
    int32_t sum = -1, wgrad = -1;
    for (int32_t r : rd) {
      if (g.is(r, "sum") && sdk::detail::bias_grad_sum(g, r))
        sum = r;
      else if (g.is(r, "conv2d_backward_weight") && g.node(r).inputs[0] == v)
        wgrad = r;
    }
    if (sum < 0 || wgrad < 0) continue;
    const int32_t grp[3] = {n, std::min(sum, wgrad), std::max(sum, wgrad)};
    claim(user, grp, 3, "relu_backward+sum+conv2d_backward_weight");
  }
  // A ReLU's backward with the bias gradient's sum of what it writes (a conv layer without a
  // pool, or a linear layer: the sum over rows of a 2-d gradient), and a GELU's backward with a
  // linear layer's: one pass over the gradient instead of two (ops/pool.cu).
  for (int32_t n = 0; n < g.num_nodes(); ++n) {
    const bool gelu = g.is(n, "gelu_backward");
    if ((!gelu && !g.is(n, "relu_backward")) || g.node(n).num_outputs != 1) continue;
    const int32_t v = g.node(n).outputs[0];
    if (!g.valid(v) || !(g.value(v).ndim == 2 || (!gelu && g.value(v).ndim == 4))) continue;
    for (int32_t r : g.readers(v))
      if (g.is(r, "sum") && (g.value(v).ndim == 4 ? sdk::detail::bias_grad_sum(g, r) : row_sum(g, r))) {
        const int32_t pair[2] = {n, r};
        claim(user, pair, 2, gelu ? "gelu_backward+sum" : "relu_backward+sum");
        break;
      }
  }
  // The classifier head: the largest of its groups the core accepts.
  for (const auto& head : sdk::find_linear_cross_entropy(g, /*linear_backward=*/true))
    for (const auto& grp : head.groups)
      if (claim(user, grp.data(), static_cast<int32_t>(grp.size()), "linear+softmax_cross_entropy") ==
          PLX_OK)
        break;
  for (const auto& chain : sdk::find_epilogue_chains(g, kProducers, kEpilogues)) {
    std::string name;
    for (int32_t n : chain) name += (name.empty() ? "" : "+") + std::string(g.node(n).op);
    claim(user, chain.data(), static_cast<int32_t>(chain.size()), name.c_str());
  }
  // linear -> gelu, also where gelu_backward reads the pre-activation (training): our GEMMs'
  // epilogues apply the GELU and store the pre-activation beside it. Declined at creation where
  // the host gave the linear to cuBLASLt (then, in inference, a chain with the GELU in place).
  for (const auto& pair : sdk::find_activation_pairs(g, "linear", "gelu"))
    claim(user, pair.data(), 2, "linear+gelu");
  // A run the core refuses (under data parallelism it would hold a gradient back from its
  // all-reduce) is tried again as its parts of casts next to each other in graph order (a
  // layer's weight and bias gradients).
  for (const auto& run : cast_runs(g, taken)) {
    if (claim(user, run.data(), static_cast<int32_t>(run.size()), "multi_tensor_cast") == PLX_OK) continue;
    for (size_t i = 0; i < run.size();) {
      size_t j = i + 1;
      while (j < run.size() && run[j] == run[j - 1] + 1) ++j;
      if (j - i >= 2 && j - i < run.size())
        claim(user, run.data() + i, static_cast<int32_t>(j - i), "multi_tensor_cast");
      i = j;
    }
  }
}

void CudaBackend::create_fused(const plx_graph_view& graph, const int32_t* inputs,
                               int32_t num_inputs, const int32_t* outputs, int32_t num_outputs,
                               const plx_kernel** kernel, void** state,
                               uint64_t* workspace_bytes) {
  const sdk::GraphView g(graph);
  const sdk::Boundary b(inputs, num_inputs, outputs, num_outputs);
  PLX_REQUIRE(g.num_nodes() >= 1, "create_fused: no nodes");
  check_device(graph.device);
  const plx_dtype dtype = static_cast<plx_dtype>(g.value(g.node(0).inputs[0]).dtype);
  // The multi-tensor kernels and the whole small-CNN step do every node with code of their own
  // and read no kernel_hint (PLX_KERNEL_SELF_CONTAINED: the host makes them once, untimed around
  // their nodes' other kernels); the other groups run a node on the kernel the host chose.
  const uint32_t own = PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE | PLX_KERNEL_SELF_CONTAINED;
  // An optimizer group (maybe with its gradients' casts first): its dtype is the parameters'.
  auto param_dtype = [&](int32_t n) { return static_cast<plx_dtype>(g.value(g.node(n).inputs[0]).dtype); };
  if (const int32_t n = first_of(g, "sgd_update"); n >= 0) {
    const plx_dtype pd = param_dtype(n);
    PLX_DECLINE_UNLESS(pd == PLX_F32, "multi-tensor sgd_update: f32 only, got %s", dtype_name(pd));
    fused_.give("multi_tensor_sgd", pd, own,
                std::make_unique<MultiSgd>(g, b, graph.device), kernel, state, workspace_bytes);
    return;
  }
  if (const int32_t n = first_of(g, "adamw_update"); n >= 0) {
    const plx_dtype pd = param_dtype(n);
    PLX_DECLINE_UNLESS(pd == PLX_F32, "multi-tensor adamw_update: f32 only, got %s", dtype_name(pd));
    fused_.give("multi_tensor_adamw", pd, own,
                std::make_unique<MultiAdamw>(g, b, *this, graph.device), kernel, state,
                workspace_bytes);
    return;
  }
  {
    bool unscale = first_of(g, "mul") >= 0 && first_of(g, "sum") >= 0;
    for (int32_t n = 0; n < g.num_nodes() && unscale; ++n)
      unscale = g.is(n, "mul") || g.is(n, "sum") || g.is(n, "add") || g.is(n, "cast");
    if (unscale) {
      fused_.give("multi_tensor_unscale_check", PLX_F32, own,
                  std::make_unique<MultiUnscaleCheck>(g, b, graph.device), kernel, state,
                  workspace_bytes);
      return;
    }
  }
  if (g.is(0, "cast")) {
    // Casts of f32 parameters to 16 bits write a 4-D copy channels-last when the layout planner
    // asks (a conv filter that the 16-bit convolutions, which prefer NHWC, then read in place).
    const bool narrowing = g.value(g.node(0).inputs[0]).dtype == PLX_F32 &&
                           g.value(g.node(0).outputs[0]).dtype != PLX_F32;
    fused_.give("multi_tensor_cast", dtype, own,
                std::make_unique<MultiCast>(g, b, graph.device), kernel, state, workspace_bytes,
                narrowing ? PLX_LAYOUT_NHWC : PLX_LAYOUT_ANY);
    return;
  }
  if (first_of(g, "softmax_cross_entropy") >= 0 && first_of(g, "max_pool2d") >= 0) {
    // Only find_small_cnn_steps() claims a group with both (its kernel takes NCHW tensors).
    fused_.give("small_cnn_step", PLX_F32, own,
                make_small_cnn_step(*this, g, b), kernel, state, workspace_bytes, PLX_LAYOUT_NCHW);
    return;
  }
  bool conv_pool = false, conv_pool_backward = false;
  for (int32_t n = 0; n < g.num_nodes(); ++n) {
    conv_pool = conv_pool || g.is(n, "max_pool2d");
    conv_pool_backward = conv_pool_backward || g.is(n, "max_pool2d_backward");
  }
  if (conv_pool) {
    // A conv the host gave to one of our own kernels, with its ReLU and pool in one launch and
    // no pre-pool tensor: a first layer on the direct kernel (ops/direct_conv.cu), or an igemm
    // tile with the 2x2 pool in its epilogue (ops/igemm_conv.cuh); where that declines, the
    // chunked group below.
    const int32_t c = first_of(g, "conv2d");
    const int32_t hint = c >= 0 ? g.node(c).kernel_hint : 0;
    const plx_kernel* hinted = hint > 0 ? kernels().get(hint - 1) : nullptr;
    const std::string_view impl = hinted && hinted->impl ? hinted->impl : "";
    const bool direct = impl == "direct", igemm = impl.rfind("igemm_", 0) == 0;
    if (direct || igemm) {
      const char* side = direct ? "direct" : "igemm";
      try {
        plx_dtype dt = dtype;
        auto k = direct ? make_direct_conv_max_pool(*this, g, b, hinted->impl, dt)
                        : make_igemm_conv_max_pool(*this, g, b, hinted->impl, dt);
        const std::string name = std::string(first_of(g, "relu") >= 0 ? "conv2d+relu+max_pool2d:"
                                                                      : "conv2d+max_pool2d:") +
                                 side;
        fused_.give(name, dt, PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE, std::move(k),
                    kernel, state, workspace_bytes,
                    prefers_nhwc(dt) ? PLX_LAYOUT_NHWC : PLX_LAYOUT_ANY);
        return;
      } catch (const sdk::Unsupported& e) {
        PLX_LOG(PLX_LOG_DEBUG, "cuda.fusion", "conv2d+max_pool2d on %s: %s", side, e.what());
      }
    }
  }
  if (conv_pool_backward && !conv_pool && !g.is(0, "relu_backward")) {
    // The pool's backward with its conv's gradients as one direct launch that unpools as it
    // reads, where the host gave a gradient to the direct kernels: a small conv's backward, dx
    // included, given its data (or weight) gradient (ops/direct_small.cu), or a first layer's
    // (no dx) given its weight gradient (ops/direct_conv.cu); else the chunked group below.
    const int32_t w = first_of(g, "conv2d_backward_weight");
    const int32_t d = first_of(g, "conv2d_backward_data");
    auto direct_hint = [&](int32_t n) {
      const int32_t hint = n >= 0 ? g.node(n).kernel_hint : 0;
      const plx_kernel* k = hint > 0 ? kernels().get(hint - 1) : nullptr;
      return k && k->impl && std::string_view(k->impl) == "direct";
    };
    if (direct_hint(w) || (d >= 0 && direct_hint(d))) {
      const char* name = d >= 0 ? "max_pool2d_backward+conv2d_backward:direct"
                                : "max_pool2d_backward+conv2d_backward_weight:direct";
      try {
        plx_dtype dt = dtype;
        auto k = d >= 0 ? make_direct_pool_backward(*this, g, b, dt)
                        : make_direct_pool_wgrad(*this, g, b, "direct", dt);
        fused_.give(name, dt, PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE, std::move(k),
                    kernel, state, workspace_bytes, prefers_nhwc(dt) ? PLX_LAYOUT_NHWC : PLX_LAYOUT_ANY);
        return;
      } catch (const sdk::Unsupported& e) {
        PLX_LOG(PLX_LOG_DEBUG, "cuda.fusion", "max_pool2d_backward+conv2d_backward on direct: %s",
                e.what());
      }
    }
  }
  if (conv_pool || (conv_pool_backward && !g.is(0, "relu_backward"))) {
    plx_dtype dt = dtype;
    uint32_t flags = 0;
    std::string fused_name;
    auto k = conv_pool ? make_conv_max_pool(*this, g, b, dt, flags, fused_name)
                       : make_max_pool_conv_backward(*this, g, b, dt, flags, fused_name);
    // Every tensor in either layout, as the member kernels take them (the pre-pool scratch
    // channels-last where the group's tensors are: sdk/fusion_chunked.hpp); in 16 bits they
    // prefer NHWC.
    const plx_layout layout = prefers_nhwc(dt) ? PLX_LAYOUT_NHWC : PLX_LAYOUT_ANY;
    fused_.give(fused_name, dt, flags, std::move(k), kernel, state, workspace_bytes, layout);
    return;
  }
  if (g.num_nodes() == 3 && g.is(0, "relu_backward") &&
      (g.is(1, "conv2d_backward_weight") || g.is(2, "conv2d_backward_weight"))) {
    const int32_t w = g.is(1, "conv2d_backward_weight") ? 1 : 2;
    const int32_t hint = g.node(w).kernel_hint;
    const plx_kernel* hinted = hint > 0 ? kernels().get(hint - 1) : nullptr;
    plx_dtype dt = dtype;
    auto k = make_direct_relu_wgrad(*this, g, b, hinted && hinted->impl ? hinted->impl : "", dt);
    // Every 4-D tensor in either layout (dy and relu's y alike), as the direct kernels; in 16
    // bits channels-last preferred, as the convolutions there.
    fused_.give("relu_backward+sum+conv2d_backward_weight:direct", dt,
                PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE, std::move(k), kernel, state,
                workspace_bytes, prefers_nhwc(dt) ? PLX_LAYOUT_NHWC : PLX_LAYOUT_ANY);
    return;
  }
  if (g.num_nodes() == 2 && (g.is(0, "relu_backward") || g.is(0, "gelu_backward")) &&
      g.is(1, "sum")) {
    plx_dtype dt = dtype;
    auto k = make_act_backward_sum(g, b, context(graph.device).prop.multiProcessorCount, dt);
    // dy, y and dx laid out alike in any dense layout: the layout planner may hand it all three
    // channels-last (abi/ops.h); the sums are then column sums over (N·H·W, C).
    fused_.give(std::string(g.node(0).op) + "+sum", dt,
                PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE | PLX_KERNEL_DENSE, std::move(k),
                kernel, state, workspace_bytes);
    return;
  }
  if (g.is(0, "relu_backward")) {
    plx_dtype dt = dtype;
    auto k = make_relu_max_pool_backward(g, b, dt);
    // Either layout for each tensor, as the max-pool kernels; channels-last preferred in 16 bits.
    fused_.give("relu_backward+max_pool2d_backward", dt,
                PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE, std::move(k), kernel, state,
                workspace_bytes, prefers_nhwc(dt) ? PLX_LAYOUT_NHWC : PLX_LAYOUT_ANY);
    return;
  }
  bool head = false;
  for (int32_t n = 0; n < g.num_nodes(); ++n) head = head || g.is(n, "softmax_cross_entropy");
  if (head) {
    plx_dtype dt = dtype;
    auto k = make_linear_cross_entropy(*this, g, b, dt);
    fused_.give("linear+softmax_cross_entropy", dt,
                PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE, std::move(k), kernel, state,
                workspace_bytes);
    return;
  }
  std::string name;
  for (int32_t n = 0; n < g.num_nodes(); ++n) name += (n ? "+" : "") + std::string(g.node(n).op);
  // The host's choice for the linear node (kernel_hint): cuBLASLt's epilogue when it chose
  // cuBLASLt or nothing; another kernel (our own GEMM) runs as a chain with the ReLU in place.
  const int32_t hint = g.node(0).kernel_hint;
  const plx_kernel* hinted = hint > 0 ? kernels().get(hint - 1) : nullptr;
  const bool lt = !hinted || std::string_view(hinted->impl) == "cublaslt";
  if (g.num_nodes() == 2 && g.is(0, "linear") && g.is(1, "relu") && lt) {
    uint32_t flags = 0;
    auto k = make_linear_relu(*this, g, b, flags);
    fused_.give("linear+relu:cublaslt-epilogue", dtype, flags, std::move(k), kernel, state,
                workspace_bytes);
    return;
  }
  // Any other linear -> relu or conv2d -> relu: one kernel applying the ReLU itself where the
  // host's choice for the layer has one (cuDNN's fused call for a conv; our own GEMMs' and
  // convolution's epilogues); one launch and no pre-activation. linear -> gelu on our own
  // GEMMs' epilogues, the pre-activation stored beside where it is needed. Else the chain below
  // (which declines a pre-activation needed outside).
  if (g.num_nodes() == 2 && (g.is(1, "relu") || g.is(1, "gelu")) &&
      (g.is(0, "linear") || (g.is(0, "conv2d") && g.is(1, "relu")))) {
    std::string pair_name;
    if (auto k = make_act_pair(*this, g, b, hinted ? hinted->impl : "", pair_name)) {
      // A conv pair takes x and y in either layout (cuDNN's descriptors, igemm's staging) and,
      // in 16 bits, prefers channels-last as the conv does (register_conv).
      const plx_layout layout =
          g.is(0, "conv2d") && prefers_nhwc(dtype) ? PLX_LAYOUT_NHWC : PLX_LAYOUT_ANY;
      fused_.give(pair_name, dtype, PLX_KERNEL_DETERMINISTIC | PLX_KERNEL_CAPTURABLE, std::move(k),
                  kernel, state, workspace_bytes, layout);
      return;
    }
  }
  auto chain = std::make_unique<sdk::EpilogueChain>(*this, g, b);
  const uint32_t flags = chain->flags();
  const plx_layout layout = chain->layout();
  fused_.give(name, dtype, flags, std::move(chain), kernel, state, workspace_bytes, layout);
}

}  // namespace plexus::cuda
