// Built-in op schemas: matrix products, matmul and linear (see docs/ops.md).
#include "plexus/op_schema.hpp"

namespace plexus::ops {

using namespace schema;

namespace {

// "a (2, 3)" or "a (2, 3) with trans_a", for messages that must name both operands.
std::string operand(const char* name, const Shape& s, bool trans) {
  return std::string(name) + " " + shape_string(s) +
         (trans ? std::string(" with trans_") + name : "");
}

void matmul_infer(InferContext& c) {
  const Shape& a = c.in(0).shape;  // (..., M, K) or (..., K, M) with trans_a
  const Shape& b = c.in(1).shape;  // (..., K, N) or (..., N, K) with trans_b
  const bool ta = c.attrs().get_int("trans_a") != 0;
  const bool tb = c.attrs().get_int("trans_b") != 0;
  c.require(a.size() >= 2 && b.size() >= 2, "operands need at least 2 dimensions, got a " +
                                                shape_string(a) + " and b " + shape_string(b) +
                                                " (reshape a vector to (1, K) or (K, 1))");
  const size_t ra = a.size(), rb = b.size();
  const int64_t M = ta ? a[ra - 1] : a[ra - 2];
  const int64_t Ka = ta ? a[ra - 2] : a[ra - 1];
  const int64_t Kb = tb ? b[rb - 1] : b[rb - 2];
  const int64_t N = tb ? b[rb - 2] : b[rb - 1];
  c.require(Ka == Kb, "inner dimensions differ: " + operand("a", a, ta) +
                          " has K = " + std::to_string(Ka) + ", " + operand("b", b, tb) +
                          " has K = " + std::to_string(Kb));
  const Shape batch_a(a.begin(), a.end() - 2), batch_b(b.begin(), b.end() - 2);
  const auto batch = broadcast_shapes(batch_a, batch_b);
  c.require(batch.has_value(), "batch dimensions of a " + shape_string(a) + " and b " +
                                   shape_string(b) + " do not broadcast");
  Shape y = *batch;
  y.push_back(M);
  y.push_back(N);
  c.out(0, c.in(0).dtype, y);
}

// y = alpha op(A) op(B), with op(A) = A' (M, K) and op(B) = B' (K, N):
//   dA' = alpha dY B'^T, dB' = alpha A'^T dY,
// and dA = dA'^T where A was given transposed (likewise B). Each gradient comes out with the
// broadcast batch dimensions of y; sum_to folds them back onto the operand's own.
void matmul_grad(GradContext& g) {
  const Var dy = g.grad_output(0);
  if (!dy.valid()) return;
  const bool ta = g.attrs().get_int("trans_a") != 0;
  const bool tb = g.attrs().get_int("trans_b") != 0;
  const double alpha = g.attrs().get_float("alpha");
  const Var a = g.input(0), b = g.input(1);
  auto mm = [&](Var x, Var y, bool tx, bool ty) {
    return g.call("matmul", {x, y},
                  {{"trans_a", int64_t{tx}}, {"trans_b", int64_t{ty}}, {"alpha", alpha}});
  };
  if (g.needs_grad(0)) {
    const Var da = ta ? mm(b, dy, tb, true)     // (K, M) = B' dY^T
                      : mm(dy, b, false, !tb);  // (M, K) = dY B'^T
    g.set_grad(0, g.sum_to(da, g.desc(a).shape));
  }
  if (g.needs_grad(1)) {
    const Var db = tb ? mm(dy, a, true, ta)     // (N, K) = dY^T A'
                      : mm(a, dy, !ta, false);  // (K, N) = A'^T dY
    g.set_grad(1, g.sum_to(db, g.desc(b).shape));
  }
}

void linear_infer(InferContext& c) {
  const Shape& x = c.in(0).shape;  // (..., in)
  const Shape& w = c.in(1).shape;  // (out, in)
  c.require(!x.empty(), "x must have at least 1 dimension (..., in), got " + shape_string(x));
  c.require(w.size() == 2, "w must be (out, in), got " + shape_string(w));
  c.require(x.back() == w[1], "x " + shape_string(x) + " has " + std::to_string(x.back()) +
                                  " features, w " + shape_string(w) + " expects " +
                                  std::to_string(w[1]));
  if (c.has(2))
    c.require(c.in(2).shape == Shape{w[0]}, "b must be (out) = (" + std::to_string(w[0]) +
                                                "), got " + shape_string(c.in(2).shape));
  Shape y = x;
  y.back() = w[0];
  c.out(0, c.in(0).dtype, y);
}

// y2 = x2 w^T + b on the rows flattened to 2-D: x2 (R, in), dy2 (R, out). Then
//   dx2 = dy2 w, dw = dy2^T x2, db = dy summed over every row.
void linear_grad(GradContext& g) {
  const Var dy = g.grad_output(0);  // (..., out)
  if (!dy.valid()) return;
  const Var x = g.input(0), w = g.input(1);
  const Shape x_shape = g.desc(x).shape;  // (..., in)
  const Shape w_shape = g.desc(w).shape;  // (out, in)
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x_shape.size(); ++i) rows *= x_shape[i];
  Emitter& e = g.emitter();
  // 2-D x (the usual case) needs no reshapes: dx, db and dw then read dy itself, which lets a
  // backend fuse them with what made dy (sdk::find_linear_cross_entropy).
  const bool flat = x_shape.size() == 2;
  const Var dy2 = flat ? dy : e.reshape(dy, {rows, w_shape[0]});  // (R, out)
  // db first, then dx and dw: db right after what made dy (a ReLU's backward, which the CUDA
  // plugin runs with the sum in one pass), and no node between db and dx reads dy (the CUDA
  // plugin's classifier head computes both with dy; dw, a GEMM over the rows, stays out).
  if (g.needs_grad(2) && g.input(2).valid())
    g.set_grad(2, flat ? g.call("sum", {dy}, {{"axes", Ints{0}}, {"keepdims", int64_t{0}}})
                       : g.sum_to(dy, {w_shape[0]}));
  if (g.needs_grad(0)) {
    const Var dx2 = g.call("matmul", {dy2, w});  // (R, in)
    g.set_grad(0, flat ? dx2 : e.reshape(dx2, x_shape));
  }
  if (g.needs_grad(1)) {
    const Var x2 = flat ? x : e.reshape(x, {rows, w_shape[1]});           // (R, in)
    g.set_grad(1, g.call("matmul", {dy2, x2}, {{"trans_a", int64_t{1}}}));  // (out, in)
  }
}

}  // namespace

void register_gemm(OpRegistry& r) {
  r.add(OpSchema{
      .name = "matmul",
      .doc = "y = alpha op(a) op(b), op transposing the last two dims when trans_*; batch dims "
             "broadcast",
      .inputs = {in("a", kFloatTypes), in("b")},
      .outputs = {out("y")},
      .attrs = {attr("trans_a", PLX_ATTR_INT, int64_t{0}, "a is (..., K, M)"),
                attr("trans_b", PLX_ATTR_INT, int64_t{0}, "b is (..., N, K)"),
                attr("alpha", PLX_ATTR_FLOAT, 1.0, "scale of the product")},
      .infer = matmul_infer,
      .grad = matmul_grad,
  });
  r.add(OpSchema{
      .name = "linear",
      .doc = "y = x w^T + b over the last dim of x",
      .inputs = {in("x", kFloatTypes), in("w"), opt("b")},
      .outputs = {out("y")},
      .infer = linear_infer,
      .grad = linear_grad,
  });
}

}  // namespace plexus::ops
