// Attribute and shape parsing of built-in ops that every backend's kernels repeat, with the
// checks and messages docs/ops.md gives. Kernels construct these in create() (never per step).
#pragma once

#include <cstdint>
#include <string>

#include "plexus/sdk/status.hpp"
#include "plexus/sdk/tensor.hpp"

namespace plexus::sdk {

// conv2d and its backward ops: x (N, C, H, W), w (O, C/groups, KH, KW), y (N, O, OH, OW).
struct Conv2dParams {
  int64_t N, C, H, W;
  int64_t O, KH, KW;
  int64_t OH, OW;
  int64_t sh, sw, ph, pw, dh, dw, groups;

  // x and w point at 4 sizes each.
  Conv2dParams(const int64_t* x, const int64_t* w, const NodeInfo& node) {
    const auto stride = node.attr_ints("stride"), pad = node.attr_ints("padding"),
               dil = node.attr_ints("dilation");
    PLX_REQUIRE(stride.size() == 2 && pad.size() == 2 && dil.size() == 2,
                "%s: stride, padding and dilation must have 2 values", node.op());
    N = x[0], C = x[1], H = x[2], W = x[3];
    O = w[0], KH = w[2], KW = w[3];
    sh = stride[0], sw = stride[1], ph = pad[0], pw = pad[1], dh = dil[0], dw = dil[1];
    groups = node.attr_int("groups");
    PLX_REQUIRE(groups >= 1 && C % groups == 0 && O % groups == 0 && w[1] * groups == C,
                "%s: channels do not match groups", node.op());
    PLX_REQUIRE(
        sh >= 1 && sw >= 1 && dh >= 1 && dw >= 1 && ph >= 0 && pw >= 0 && KH >= 1 && KW >= 1,
        "%s: bad stride, padding, dilation or kernel", node.op());
    OH = (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1;
    OW = (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
    PLX_REQUIRE(OH >= 1 && OW >= 1, "%s: kernel larger than the padded input", node.op());
  }
};

enum class LossReduction { kMean, kSum, kNone };

// softmax_cross_entropy and its backward op: logits (N, C).
struct CrossEntropyParams {
  LossReduction reduction = LossReduction::kMean;
  int64_t ignore_index = -100;
  double smoothing = 0;
  int64_t n = 0, c = 0;

  CrossEntropyParams(const NodeInfo& node, const plx_tensor& logits) {
    const std::string r = node.attr_string("reduction");
    PLX_REQUIRE(r == "mean" || r == "sum" || r == "none",
                "%s: reduction must be mean, sum or none, got \"%s\"", node.op(), r.c_str());
    reduction = r == "mean"  ? LossReduction::kMean
                : r == "sum" ? LossReduction::kSum
                             : LossReduction::kNone;
    ignore_index = node.attr_int("ignore_index");
    smoothing = node.attr_float("label_smoothing");
    PLX_REQUIRE(logits.ndim == 2, "%s: expected (N, C) logits", node.op());
    n = logits.shape[0];
    c = logits.shape[1];
  }
};

}  // namespace plexus::sdk
