// A fused conv + max-pool group (sdk/fusion_conv_pool.hpp) run a chunk of images at a time with
// the backend's own per-node kernels: any backend that has conv2d, relu, max_pool2d and their
// backward ops (and sum) gets both fusions from this header and one small accumulate function.
// The CUDA plugin runs them (plugins/cuda/ops/conv_pool.cpp); the CPU plugin, which has its own
// per-image kernels, runs them when its fuse_chunk_bytes option is set, so the tests exercise
// this code without a GPU.
//
//  - forward, per chunk: conv2d (with its bias) into scratch, the ReLU there in place, then
//    max_pool2d from scratch into the chunk's slice of y and of the indices (with relu_mask the
//    ReLU runs after the pool instead, on y's slice, or inside the pool's kernel where the
//    backend gives one: PoolReluMaker; and the conv's bias too, added to each window's maximum,
//    where the backend gives a kernel for that: PoolBiasReluMaker);
//  - backward, per chunk: max_pool2d_backward (dy's and the indices' slices) into scratch, then
//    conv2d_backward_data into dx's slice, conv2d_backward_weight and the bias gradient's sum into
//    per-chunk partials that the backend's accumulate function adds up over the chunks (the sum
//    inside the pool's backward kernel where the backend gives one: PoolBiasMaker).
// NCHW tensors have N outermost, so a chunk of images is one contiguous slice of x, y, the
// indices, dy and dx: no copies. So do channels-last ones (the layout planner's, abi/ops.h),
// which the member kernels get as they are; the scratch tensor between the conv and the pool
// (pre-pool values, or their gradient) is channels-last where any of the group's 4-D tensors is,
// so that the convolution reads and writes one layout. Member kernels that take NCHW tensors
// only are then passed over (takes_layouts), and the group declines if no kernel is left.
//
// Each step runs the backend's own kernel for that node (NodeKernel, with the host's
// kernel_hint), created for a chunk-shaped copy of the node (OwnedNodeInfo for a part of the
// batch): the same attributes, N replaced by the chunk's images. One set of kernels per chunk
// size used (the full chunk and, when the batch does not divide, the remainder). The results are
// the nodes' own but for the sums over the batch (dw, db), which add per-chunk sums: in f32, in
// chunk order, so deterministic when the members are; for f16 and bf16 each chunk's partial is
// rounded to 16 bits by the member kernel before the f32 sum, and the total is rounded once more.
//
// A chunk holds at most `chunk_bytes` of pre-pool tensor, in a multiple of the images (at most
// 16) that keep every slice 16-byte aligned, for the member kernels' vector loads: at least that
// many images, however large (chunk_rows()).
//
// Declined (the nodes then run one by one): dtypes other than f32/f16/bf16, 4-D tensors neither
// NCHW contiguous nor channels-last, member kernels that decline their chunk's tensors, an empty
// batch or empty images.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "plexus/sdk/fusion.hpp"
#include "plexus/sdk/fusion_conv_pool.hpp"
#include "plexus/sdk/plugin.hpp"

namespace plexus::sdk {

// How the accumulate function folds one chunk's partial sum `part` (dtype's elements) into the
// running total:
//  - Set:   acc = part
//  - Add:   acc += part
//  - Final: out = round(acc + part), in out's dtype (acc is left as it was)
// acc is f32 (for an f32 group, the output itself); part and out have the dtype given. The
// backend enqueues it on `stream` after the chunk's kernels. Elementwise, in the chunks' fixed
// order, so the total is the same bits run to run.
enum class ChunkAccum : int32_t { Set = 0, Add = 1, Final = 2 };
using ChunkAccumulate = std::function<void(plx_dtype dtype, const void* part, float* acc, void* out,
                                           int64_t n, ChunkAccum mode, plx_stream stream)>;

// A backend's own kernel for a chunk's node that also does the work of a neighbour, so the two
// are one launch. Sets `flags` (its plx_kernel flags). Returns null where the backend has none
// for this node; the two nodes then run as two kernels. Both are optional:
//  - PoolReluMaker, for the forward of conv2d -> relu -> max_pool2d with relu_mask (where the
//    ReLU runs on the pooled chunk): a kernel for `node` (max_pool2d: x in, y and the indices
//    out) that also applies the ReLU to y as it writes it;
//  - PoolBiasMaker, for the backward with the bias gradient: a kernel for `node`
//    (max_pool2d_backward: dy and the indices in, dx out) with a second output, dx summed over
//    axes 0, 2 and 3 (the conv's bias gradient for the chunk, in dx's dtype, as the sum node
//    gives it).
using ChunkKernelMaker =
    std::function<std::unique_ptr<Kernel>(const plx_node_info& node, uint32_t& flags)>;
using PoolReluMaker = ChunkKernelMaker;
using PoolBiasMaker = ChunkKernelMaker;
// And for the forward of a conv2d with a bias -> [relu ->] max_pool2d (with relu_mask where there
// is a ReLU): a kernel for `node` (max_pool2d: x in, y and the indices out) with a second input,
// the conv's bias (C values, in x's dtype), added in f32 to each window's maximum, then the ReLU
// where `relu`, then one rounding to y's dtype; with relu_mask no index where that y is not > 0.
// The conv then runs without its bias, so the pre-pool chunk is written once (a backend whose
// conv writes the bias before the convolution adds onto it saves that pass and its launch). The
// bias is constant over a window, so the maximum is at the same place (up to rounding: in 16-bit
// types the pre-pool values are rounded before the bias is added instead of after).
using PoolBiasReluMaker = std::function<std::unique_ptr<Kernel>(const plx_node_info& node,
                                                                bool relu, uint32_t& flags)>;

namespace detail::chunked {

inline constexpr uint64_t kAlign = 256;

inline uint64_t align_up(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

// Pieces of a workspace, each starting at a multiple of kAlign (the workspace itself is at least
// that aligned), at offsets fixed at creation.
struct Carve {
  uint64_t total = 0;
  uint64_t take(uint64_t bytes) {
    const uint64_t at = total;
    total += align_up(bytes);
    return at;
  }
};

inline bool float_dtype(int32_t d) {
  return d == PLX_F32 || d == PLX_F16 || d == PLX_BF16;
}

inline void* at_bytes(void* p, uint64_t offset) {
  return static_cast<unsigned char*>(p) + offset;
}

// An input (output = false) or output of a member node.
struct Slot {
  bool output;
  int32_t k;
};

// One member kernel for one chunk size: the kernel and the descriptors of its tensors, whose
// data pointers compute() fills in (no allocation per call). `nhwc`, in make() and make_own():
// the tensors given channels-last strides (the group's scratch tensor, where it is so).
struct Member {
  std::unique_ptr<NodeKernel> kernel;
  std::unique_ptr<Kernel> own;  // instead of `kernel`: the backend's own (make_own)
  uint32_t own_flags = 0;
  std::vector<plx_tensor> in, out;

  bool present() const { return kernel != nullptr || own != nullptr; }
  uint32_t flags() const { return own ? own_flags : kernel->table().flags; }
  uint64_t workspace_bytes() const { return own ? own->workspace_bytes() : kernel->workspace_bytes(); }
  // As make(), with the kernel from `maker`; false (nothing made) where it gives none.
  bool make_own(const ChunkKernelMaker& maker, const GraphView& g, int32_t n, int64_t rows,
                std::initializer_list<int32_t> batched_in,
                std::initializer_list<int32_t> batched_out, bool patch_input_shape,
                const std::vector<Slot>& nhwc = {}) {
    OwnedNodeInfo info(g, n, rows, batched_in, batched_out, patch_input_shape ? "input_shape" : "");
    for (const Slot& s : nhwc) info.channels_last(s.output, s.k);
    own = maker(info.get(), own_flags);
    if (!own) return false;
    in = info.inputs();
    out = info.outputs();
    return true;
  }
  // `like`: an elementwise node (input 0 -> output 0) made for tensors shaped as `like`, with
  // `rows` images, instead of its own. `absent`: an optional input left out (-1: none).
  void make(Backend& backend, const GraphView& g, int32_t n, int64_t rows,
            std::initializer_list<int32_t> batched_in, std::initializer_list<int32_t> batched_out,
            bool patch_input_shape, const plx_tensor* like = nullptr, int32_t absent = -1,
            const std::vector<Slot>& nhwc = {}) {
    OwnedNodeInfo info(g, n, rows, batched_in, batched_out, patch_input_shape ? "input_shape" : "");
    if (like) {
      info.reshape(false, 0, *like, rows);
      info.reshape(true, 0, *like, rows);
    }
    if (absent >= 0) info.drop_input(absent);
    for (const Slot& s : nhwc) info.channels_last(s.output, s.k);
    kernel = std::make_unique<NodeKernel>(backend, info.get(), g.node(n).kernel_hint);
    in = info.inputs();
    out = info.outputs();
  }
  void run(void* workspace, uint64_t workspace_bytes, plx_stream stream) const {
    if (own) {
      const uint64_t need = own->workspace_bytes();
      own->compute(KernelCall{in.data(), static_cast<int32_t>(in.size()), out.data(),
                              static_cast<int32_t>(out.size()), need ? workspace : nullptr,
                              need ? workspace_bytes : 0, stream});
      return;
    }
    kernel->compute(in, out, workspace, workspace_bytes, stream);
  }
};

// Images per chunk: as many as keep the scratch tensor (scratch_image bytes per image) within
// `limit`, at most n; below n, a multiple of m, the fewest images whose slices (of slice_image
// bytes per image each) are all 16 bytes long: every chunk's slices then start 16-byte aligned
// as the tensors do, whatever vector loads the member kernels (or cuDNN's algorithms, chosen on
// aligned buffers) make. So the chunk is at least one image, and may pass `limit` by up to m - 1
// <= 15 images where one image nearly fills it.
inline int64_t chunk_rows(int64_t n, uint64_t scratch_image, uint64_t limit,
                          const std::vector<uint64_t>& slice_image) {
  const uint64_t fit = limit / scratch_image;
  if (fit >= static_cast<uint64_t>(n)) return n;
  // 16 / gcd(b, 16) is a power of two up to 16 for every b: the largest is a multiple of the rest.
  int64_t m = 1;
  for (uint64_t b : slice_image)
    m = std::max<int64_t>(m, static_cast<int64_t>(16 / std::gcd(b, uint64_t{16})));
  const int64_t rows = std::max<int64_t>(static_cast<int64_t>(fit) / m, 1) * m;
  return std::min(rows, n);
}

// The member kernels' flags the fused kernel can promise: capturable and deterministic only when
// every member is (the per-chunk sums are deterministic themselves).
inline uint32_t member_flags(const Member& m) {
  return m.present() ? m.flags() : ~0u;
}

inline constexpr const char* kLog = "fusion";

}  // namespace detail::chunked

// ---- forward: conv2d -> [relu] -> max_pool2d ----

class ChunkedConvMaxPool final : public Kernel {
  using Member = detail::chunked::Member;
  using Carve = detail::chunked::Carve;

 public:
  ChunkedConvMaxPool(Backend& backend, const GraphView& g, const Boundary& b, uint64_t chunk_bytes,
                     const PoolReluMaker& pool_relu = {},
                     const PoolBiasReluMaker& pool_bias_relu = {})
      : s_(conv_max_pool_slots(g, b)) {
    const plx_graph_node& conv = g.node(s_.conv);
    const plx_graph_node& pool = g.node(s_.pool);
    const plx_tensor& x = g.value(conv.inputs[0]);
    const plx_tensor& pre = g.value(conv.outputs[0]);
    const plx_tensor& y = g.value(pool.outputs[0]);
    const plx_tensor& idx = g.value(pool.outputs[1]);
    PLX_DECLINE_UNLESS(detail::chunked::float_dtype(s_.dtype),
                       "conv2d+max_pool2d: f32, f16 or bf16, not %s", plexus::dtype_name(s_.dtype));
    PLX_DECLINE_UNLESS(s_.index_dtype == PLX_I32 || s_.index_dtype == PLX_U8,
                       "conv2d+max_pool2d: i32 or u8 indices");
    PLX_DECLINE_UNLESS(x.ndim == 4 && pre.ndim == 4 && y.ndim == 4 && idx.ndim == 4,
                       "conv2d+max_pool2d: 4-D tensors expected");
    n_ = x.shape[0];
    PLX_DECLINE_UNLESS(n_ >= 1 && pre.shape[0] == n_ && y.shape[0] == n_ && idx.shape[0] == n_,
                       "conv2d+max_pool2d: an empty batch, or batches that differ");
    {
      const char* op = "conv2d+max_pool2d";
      const bool x_nhwc = nhwc_or_decline(x, op, "x"), y_nhwc = nhwc_or_decline(y, op, "y");
      const bool idx_nhwc = nhwc_or_decline(idx, op, "the indices");
      pre_nhwc_ = x_nhwc || y_nhwc || idx_nhwc;
    }
    es_ = plexus::dtype_size(s_.dtype);
    idx_es_ = plexus::dtype_size(s_.index_dtype);
    x_img_ = numel(x) / n_;
    pre_img_ = numel(pre) / n_;
    y_img_ = numel(y) / n_;
    PLX_DECLINE_UNLESS(x_img_ > 0 && pre_img_ > 0 && y_img_ > 0 && numel(idx) / n_ == y_img_,
                       "conv2d+max_pool2d: empty images");
    const uint64_t ux = static_cast<uint64_t>(x_img_), uy = static_cast<uint64_t>(y_img_);
    rows_ = detail::chunked::chunk_rows(n_, static_cast<uint64_t>(pre_img_) * es_, chunk_bytes,
                                        {ux * es_, uy * es_, uy * idx_es_});
    // With relu_mask the pool's indices are the same whether it reads the ReLU's output or its
    // input (the maximum's position where it is > 0, none elsewhere), and max then ReLU equals
    // ReLU then max: so the ReLU runs on the pooled chunk, a quarter of the pre-pool tensor for
    // 2x2 windows, instead of on the pre-pool chunk. (They differ only where a window holds a
    // NaN, which the pool takes and a ReLU would have made 0.)
    {
      const OwnedNodeInfo pool_info(g, s_.pool);
      relu_after_pool_ = s_.relu >= 0 && NodeInfo(&pool_info.get()).attr_int_or("relu_mask", 0) == 1;
    }

    // The conv's bias can move into the pool's kernel (PoolBiasReluMaker) where nothing reads
    // the biased pre-pool values but the pool: no ReLU between them, or one that runs after it.
    const bool fold_bias = s_.bias >= 0 && pool_bias_relu && (s_.relu < 0 || relu_after_pool_);
    const bool relu = s_.relu >= 0;
    const ChunkKernelMaker bias_relu = [&](const plx_node_info& node, uint32_t& f) {
      return pool_bias_relu(node, relu, f);
    };
    // The pre-pool scratch: the conv's output, the pool's input, the ReLU's before the pool.
    using Slots = std::vector<detail::chunked::Slot>;
    const Slots pre_out = pre_nhwc_ ? Slots{{true, 0}} : Slots{};
    const Slots pre_in = pre_nhwc_ ? Slots{{false, 0}} : Slots{};
    const Slots pre_both = pre_nhwc_ ? Slots{{false, 0}, {true, 0}} : Slots{};
    const int64_t rem = n_ % rows_;
    for (int64_t rows : {rows_, rem}) {
      if (rows == 0) continue;
      Pass& p = passes_.emplace_back();
      p.rows = rows;
      p.bias_in_pool =
          fold_bias && p.pool.make_own(bias_relu, g, s_.pool, rows, {0}, {0, 1}, false, pre_in);
      if (p.bias_in_pool) {
        p.pool.in.push_back(g.value(conv.inputs[2]));  // the bias, the kernel's second input
        p.pool_relu = relu;
      } else {
        // The pool with the ReLU folded in, where the backend has one (PoolReluMaker).
        p.pool_relu = relu_after_pool_ && pool_relu &&
                      p.pool.make_own(pool_relu, g, s_.pool, rows, {0}, {0, 1}, false, pre_in);
        if (!p.pool_relu)
          p.pool.make(backend, g, s_.pool, rows, {0}, {0, 1}, false, nullptr, -1, pre_in);
      }
      p.conv.make(backend, g, s_.conv, rows, {0}, {0}, false, nullptr, p.bias_in_pool ? 2 : -1,
                  pre_out);
      if (s_.relu >= 0 && !p.pool_relu) {
        if (relu_after_pool_)  // on y's chunk, in y's layout
          p.relu.make(backend, g, s_.relu, rows, {0}, {0}, false, &y);
        else
          p.relu.make(backend, g, s_.relu, rows, {0}, {0}, false, nullptr, -1, pre_both);
        PLX_DECLINE_UNLESS(p.relu.kernel->table().flags & PLX_KERNEL_INPLACE,
                           "conv2d+relu+max_pool2d: relu's kernel %s cannot run in place",
                           p.relu.kernel->table().impl);
      }
      for (const Member* m : {&p.conv, &p.relu, &p.pool}) {
        flags_ &= detail::chunked::member_flags(*m);
        if (m->present()) member_ws_ = std::max(member_ws_, m->workspace_bytes());
      }
    }
    Carve carve;
    pre_off_ = carve.take(static_cast<uint64_t>(rows_ * pre_img_) * es_);
    member_off_ = carve.total;
    workspace_ = member_off_ + member_ws_;
    PLX_LOG(PLX_LOG_DEBUG, detail::chunked::kLog,
            "conv2d+max_pool2d %s: %lld images in chunks of %lld, workspace %llu bytes",
            plexus::dtype_name(s_.dtype), static_cast<long long>(n_), static_cast<long long>(rows_),
            static_cast<unsigned long long>(workspace_));
  }

  uint32_t flags() const { return flags_ & (PLX_KERNEL_CAPTURABLE | PLX_KERNEL_DETERMINISTIC); }
  const ConvMaxPoolSlots& slots() const { return s_; }
  uint64_t workspace_bytes() const override { return workspace_; }

  void compute(const KernelCall& c) override {
    void* pre = detail::chunked::at_bytes(c.workspace, pre_off_);
    void* mws = member_ws_ ? detail::chunked::at_bytes(c.workspace, member_off_) : nullptr;
    const plx_tensor& x = c.in(s_.x);
    const plx_tensor& y = c.out(s_.y);
    const plx_tensor& idx = c.out(s_.indices);
    for (int64_t n0 = 0; n0 < n_; n0 += rows_) {
      Pass& p = passes_[n0 + rows_ <= n_ ? 0 : 1];
      const uint64_t img = static_cast<uint64_t>(n0);
      p.conv.in[0].data =
          detail::chunked::at_bytes(x.data, img * static_cast<uint64_t>(x_img_) * es_);
      p.conv.in[1].data = c.in(s_.w).data;
      if (s_.bias >= 0 && !p.bias_in_pool) p.conv.in[2].data = c.in(s_.bias).data;
      p.conv.out[0].data = pre;
      p.conv.run(mws, member_ws_, c.stream);
      if (p.relu.present() && !relu_after_pool_) {
        p.relu.in[0].data = pre;
        p.relu.out[0].data = pre;
        p.relu.run(mws, member_ws_, c.stream);
      }
      void* y_chunk = detail::chunked::at_bytes(y.data, img * static_cast<uint64_t>(y_img_) * es_);
      p.pool.in[0].data = pre;
      p.pool.out[0].data = y_chunk;
      p.pool.out[1].data =
          detail::chunked::at_bytes(idx.data, img * static_cast<uint64_t>(y_img_) * idx_es_);
      if (p.bias_in_pool) p.pool.in[1].data = c.in(s_.bias).data;
      p.pool.run(mws, member_ws_, c.stream);
      if (p.relu.present() && relu_after_pool_) {
        p.relu.in[0].data = y_chunk;
        p.relu.out[0].data = y_chunk;
        p.relu.run(mws, member_ws_, c.stream);
      }
    }
  }

 private:
  struct Pass {
    int64_t rows = 0;
    Member conv, relu, pool;
    bool pool_relu = false;     // `pool` applies the ReLU too (no `relu`)
    bool bias_in_pool = false;  // `pool` adds the conv's bias (the conv runs without it)
  };

  ConvMaxPoolSlots s_;
  bool pre_nhwc_ = false;         // the pre-pool scratch is channels-last
  bool relu_after_pool_ = false;  // the ReLU runs on the pooled chunk (relu_mask)
  int64_t n_ = 0, rows_ = 0;
  uint64_t es_ = 0, idx_es_ = 0;
  int64_t x_img_ = 0, pre_img_ = 0, y_img_ = 0;  // elements per image
  std::vector<Pass> passes_;  // [0]: chunks of rows_ images; [1]: the remainder, if any
  uint32_t flags_ = ~0u;
  uint64_t pre_off_ = 0, member_off_ = 0, member_ws_ = 0, workspace_ = 0;
};

// ---- backward: max_pool2d_backward -> conv2d_backward_data / _weight, bias sum ----

class ChunkedMaxPoolConvBackward final : public Kernel {
  using Member = detail::chunked::Member;
  using Carve = detail::chunked::Carve;

 public:
  ChunkedMaxPoolConvBackward(Backend& backend, const GraphView& g, const Boundary& b,
                             uint64_t chunk_bytes, ChunkAccumulate accumulate,
                             const PoolBiasMaker& pool_bias = {})
      : s_(max_pool_conv_backward_slots(g, b)), accumulate_(std::move(accumulate)) {
    const char* op = "max_pool2d_backward+conv2d_backward";
    const plx_graph_node& pool = g.node(s_.pool);
    const plx_tensor& dy = g.value(pool.inputs[0]);
    const plx_tensor& idx = g.value(pool.inputs[1]);
    const plx_tensor& unpooled = g.value(pool.outputs[0]);
    PLX_DECLINE_UNLESS(detail::chunked::float_dtype(s_.dtype), "%s: f32, f16 or bf16, not %s", op,
                       plexus::dtype_name(s_.dtype));
    PLX_DECLINE_UNLESS(s_.index_dtype == PLX_I32 || s_.index_dtype == PLX_U8,
                       "%s: i32 or u8 indices", op);
    PLX_DECLINE_UNLESS(dy.ndim == 4 && idx.ndim == 4 && unpooled.ndim == 4,
                       "%s: 4-D tensors expected", op);
    n_ = dy.shape[0];
    PLX_DECLINE_UNLESS(n_ >= 1 && idx.shape[0] == n_ && unpooled.shape[0] == n_,
                       "%s: an empty batch, or batches that differ", op);
    grad_nhwc_ = nhwc_or_decline(dy, op, "dy");
    grad_nhwc_ = nhwc_or_decline(idx, op, "the indices") || grad_nhwc_;
    es_ = plexus::dtype_size(s_.dtype);
    idx_es_ = plexus::dtype_size(s_.index_dtype);
    dy_img_ = numel(dy) / n_;
    g_img_ = numel(unpooled) / n_;
    PLX_DECLINE_UNLESS(dy_img_ > 0 && g_img_ > 0 && numel(idx) / n_ == dy_img_, "%s: empty images",
                       op);
    std::vector<uint64_t> slices = {static_cast<uint64_t>(dy_img_) * es_,
                                    static_cast<uint64_t>(dy_img_) * idx_es_};
    if (s_.data >= 0) {
      const plx_tensor& dx = g.value(g.node(s_.data).outputs[0]);
      PLX_DECLINE_UNLESS(dx.ndim == 4 && dx.shape[0] == n_,
                         "%s: dx must be a 4-D batch of dy's images", op);
      grad_nhwc_ = nhwc_or_decline(dx, op, "dx") || grad_nhwc_;
      dx_img_ = numel(dx) / n_;
      PLX_DECLINE_UNLESS(dx_img_ > 0, "%s: empty images", op);
      slices.push_back(static_cast<uint64_t>(dx_img_) * es_);
    }
    if (s_.weight >= 0) {
      const plx_graph_node& wn = g.node(s_.weight);
      const plx_tensor& x = g.value(wn.inputs[1]);
      const plx_tensor& dw = g.value(wn.outputs[0]);
      PLX_DECLINE_UNLESS(x.ndim == 4 && x.shape[0] == n_,
                         "%s: x must be a 4-D batch of dy's images", op);
      grad_nhwc_ = nhwc_or_decline(x, op, "x") || grad_nhwc_;
      // The per-chunk sums are added elementwise over dw's memory: dense, in dw's own order.
      PLX_DECLINE_UNLESS(is_contiguous(dw), "%s: dw must be contiguous", op);
      x_img_ = numel(x) / n_;
      PLX_DECLINE_UNLESS(x_img_ > 0, "%s: empty images", op);
      slices.push_back(static_cast<uint64_t>(x_img_) * es_);
      dw_elems_ = numel(dw);
    }
    if (s_.bias >= 0) {
      const plx_tensor& db = g.value(g.node(s_.bias).outputs[0]);
      PLX_DECLINE_UNLESS(is_contiguous(db), "%s: db must be contiguous", op);
      db_elems_ = numel(db);
    }
    rows_ =
        detail::chunked::chunk_rows(n_, static_cast<uint64_t>(g_img_) * es_, chunk_bytes, slices);
    chunks_ = (n_ + rows_ - 1) / rows_;

    // The scratch gradient between the pool and the conv: the pool's output, the others' input.
    using Slots = std::vector<detail::chunked::Slot>;
    const Slots g_out = grad_nhwc_ ? Slots{{true, 0}} : Slots{};
    const Slots g_in = grad_nhwc_ ? Slots{{false, 0}} : Slots{};
    const int64_t rem = n_ % rows_;
    for (int64_t rows : {rows_, rem}) {
      if (rows == 0) continue;
      Pass& p = passes_.emplace_back();
      p.rows = rows;
      // The pool's backward with the bias gradient's sum, where the backend gives one
      // (PoolBiasMaker): its second output is the chunk's db.
      p.pool_bias = s_.bias >= 0 && pool_bias &&
                    p.pool.make_own(pool_bias, g, s_.pool, rows, {0, 1}, {0}, true, g_out);
      if (p.pool_bias) p.pool.out.push_back(g.value(g.node(s_.bias).outputs[0]));
      else
        p.pool.make(backend, g, s_.pool, rows, {0, 1}, {0}, true, nullptr, -1, g_out);
      if (s_.data >= 0) p.data.make(backend, g, s_.data, rows, {0}, {0}, true, nullptr, -1, g_in);
      if (s_.weight >= 0)
        p.weight.make(backend, g, s_.weight, rows, {0, 1}, {}, false, nullptr, -1, g_in);
      if (s_.bias >= 0 && !p.pool_bias)
        p.bias.make(backend, g, s_.bias, rows, {0}, {}, false, nullptr, -1, g_in);
      for (const Member* m : {&p.pool, &p.data, &p.weight, &p.bias}) {
        flags_ &= detail::chunked::member_flags(*m);
        if (m->present()) member_ws_ = std::max(member_ws_, m->workspace_bytes());
      }
    }
    Carve carve;
    g_off_ = carve.take(static_cast<uint64_t>(rows_ * g_img_) * es_);
    if (chunks_ > 1) {
      // Partials of the chunks after the first (f32: the first writes dw and db directly and
      // the rest add onto them); for f16/bf16 an f32 running sum too.
      const bool f32 = s_.dtype == PLX_F32;
      if (s_.weight >= 0) {
        part_dw_off_ = carve.take(static_cast<uint64_t>(dw_elems_) * es_);
        if (!f32) acc_dw_off_ = carve.take(static_cast<uint64_t>(dw_elems_) * sizeof(float));
      }
      if (s_.bias >= 0) {
        part_db_off_ = carve.take(static_cast<uint64_t>(db_elems_) * es_);
        if (!f32) acc_db_off_ = carve.take(static_cast<uint64_t>(db_elems_) * sizeof(float));
      }
    }
    member_off_ = carve.total;
    workspace_ = member_off_ + member_ws_;
    PLX_LOG(PLX_LOG_DEBUG, detail::chunked::kLog,
            "%s %s: %lld images in %lld chunks of %lld, workspace %llu bytes", op,
            plexus::dtype_name(s_.dtype), static_cast<long long>(n_),
            static_cast<long long>(chunks_), static_cast<long long>(rows_),
            static_cast<unsigned long long>(workspace_));
  }

  uint32_t flags() const { return flags_ & (PLX_KERNEL_CAPTURABLE | PLX_KERNEL_DETERMINISTIC); }
  plx_dtype dtype() const { return s_.dtype; }
  uint64_t workspace_bytes() const override { return workspace_; }

  void compute(const KernelCall& c) override {
    void* grad = detail::chunked::at_bytes(c.workspace, g_off_);
    void* mws = member_ws_ ? detail::chunked::at_bytes(c.workspace, member_off_) : nullptr;
    const plx_tensor& dy = c.in(s_.dy);
    const plx_tensor& idx = c.in(s_.indices);
    int64_t k = 0;
    for (int64_t n0 = 0; n0 < n_; n0 += rows_, ++k) {
      Pass& p = passes_[n0 + rows_ <= n_ ? 0 : 1];
      const uint64_t img = static_cast<uint64_t>(n0);
      const bool first = k == 0, last = k == chunks_ - 1;
      p.pool.in[0].data =
          detail::chunked::at_bytes(dy.data, img * static_cast<uint64_t>(dy_img_) * es_);
      p.pool.in[1].data =
          detail::chunked::at_bytes(idx.data, img * static_cast<uint64_t>(dy_img_) * idx_es_);
      p.pool.out[0].data = grad;
      void* db_part = nullptr;
      if (p.pool_bias) {
        db_part = sum_target(c, c.out(s_.db).data, part_db_off_, first);
        p.pool.out[1].data = db_part;
      }
      p.pool.run(mws, member_ws_, c.stream);
      if (p.pool_bias)
        sum_fold(c, db_part, c.out(s_.db).data, acc_db_off_, db_elems_, first, last);
      if (p.data.present()) {
        p.data.in[0].data = grad;
        p.data.in[1].data = c.in(s_.w).data;
        p.data.out[0].data = detail::chunked::at_bytes(c.out(s_.dx).data,
                                                       img * static_cast<uint64_t>(dx_img_) * es_);
        p.data.run(mws, member_ws_, c.stream);
      }
      if (p.weight.present()) {
        p.weight.in[0].data = grad;
        p.weight.in[1].data =
            detail::chunked::at_bytes(c.in(s_.x).data, img * static_cast<uint64_t>(x_img_) * es_);
        sum_chunk(p.weight, c, c.out(s_.dw).data, part_dw_off_, acc_dw_off_, dw_elems_, first, last,
                  mws);
      }
      if (p.bias.present()) {
        p.bias.in[0].data = grad;
        sum_chunk(p.bias, c, c.out(s_.db).data, part_db_off_, acc_db_off_, db_elems_, first, last,
                  mws);
      }
    }
  }

 private:
  struct Pass {
    int64_t rows = 0;
    Member pool, data, weight, bias;
    bool pool_bias = false;  // `pool` writes the chunk's db too (no `bias`)
  };

  // Runs a member whose output sums over the batch (dw, db) on this chunk and adds it to the
  // total in `out`. One chunk: straight into out. f32: the first chunk into out, the others into
  // a partial added onto out. f16/bf16: every chunk into a partial, summed in f32 and rounded
  // into out with the last.
  void sum_chunk(Member& m, const KernelCall& c, void* out, uint64_t part_off, uint64_t acc_off,
                 int64_t elems, bool first, bool last, void* mws) {
    void* part = sum_target(c, out, part_off, first);
    m.out[0].data = part;
    m.run(mws, member_ws_, c.stream);
    sum_fold(c, part, out, acc_off, elems, first, last);
  }
  // Where this chunk's partial sum goes: `out` itself when it is the total (one chunk, or f32's
  // first), else the partial in the workspace.
  void* sum_target(const KernelCall& c, void* out, uint64_t part_off, bool first) const {
    const bool direct = chunks_ == 1 || (s_.dtype == PLX_F32 && first);
    return direct ? out : detail::chunked::at_bytes(c.workspace, part_off);
  }
  // Adds the chunk's partial (written at sum_target) into the total.
  void sum_fold(const KernelCall& c, void* part, void* out, uint64_t acc_off, int64_t elems,
                bool first, bool last) {
    if (part == out) return;
    if (s_.dtype == PLX_F32) {
      accumulate_(PLX_F32, part, static_cast<float*>(out), nullptr, elems, ChunkAccum::Add,
                  c.stream);
    } else {
      float* acc = static_cast<float*>(detail::chunked::at_bytes(c.workspace, acc_off));
      const ChunkAccum mode =
          first ? ChunkAccum::Set : (last ? ChunkAccum::Final : ChunkAccum::Add);
      accumulate_(s_.dtype, part, acc, out, elems, mode, c.stream);
    }
  }

  MaxPoolConvBackwardSlots s_;
  ChunkAccumulate accumulate_;
  bool grad_nhwc_ = false;  // the scratch gradient is channels-last
  int64_t n_ = 0, rows_ = 0, chunks_ = 0;
  uint64_t es_ = 0, idx_es_ = 0;
  int64_t dy_img_ = 0, g_img_ = 0, dx_img_ = 0, x_img_ = 0;  // elements per image
  int64_t dw_elems_ = 0, db_elems_ = 0;
  std::vector<Pass> passes_;  // [0]: chunks of rows_ images; [1]: the remainder, if any
  uint32_t flags_ = ~0u;
  uint64_t g_off_ = 0, part_dw_off_ = 0, acc_dw_off_ = 0, part_db_off_ = 0, acc_db_off_ = 0;
  uint64_t member_off_ = 0, member_ws_ = 0, workspace_ = 0;
};

// The fused kernel of a {conv2d, [relu,] max_pool2d} group with its dtype, flags and name
// ("conv2d+relu+max_pool2d" or "conv2d+max_pool2d"), for create_fused(). Declines (Unsupported)
// what it cannot run.
inline std::unique_ptr<Kernel> make_chunked_conv_max_pool(
    Backend& backend, const GraphView& g, const Boundary& b, uint64_t chunk_bytes,
    plx_dtype& dtype, uint32_t& flags, std::string& name, const PoolReluMaker& pool_relu = {},
    const PoolBiasReluMaker& pool_bias_relu = {}) {
  auto k = std::make_unique<ChunkedConvMaxPool>(backend, g, b, chunk_bytes, pool_relu,
                                                pool_bias_relu);
  dtype = k->slots().dtype;
  flags = k->flags();
  name = k->slots().relu >= 0 ? "conv2d+relu+max_pool2d" : "conv2d+max_pool2d";
  return k;
}

// The fused kernel of a {max_pool2d_backward, [conv2d_backward_data], [conv2d_backward_weight],
// [bias gradient sum]} group ("max_pool2d_backward+conv2d_backward").
inline std::unique_ptr<Kernel> make_chunked_max_pool_conv_backward(
    Backend& backend, const GraphView& g, const Boundary& b, uint64_t chunk_bytes,
    ChunkAccumulate accumulate, plx_dtype& dtype, uint32_t& flags, std::string& name,
    const PoolBiasMaker& pool_bias = {}) {
  auto k = std::make_unique<ChunkedMaxPoolConvBackward>(backend, g, b, chunk_bytes,
                                                        std::move(accumulate), pool_bias);
  dtype = k->dtype();
  flags = k->flags();
  name = "max_pool2d_backward+conv2d_backward";
  return k;
}

}  // namespace plexus::sdk
