// Ops of a plugin's own (plx_op_schema in abi/ops.h) from C++: the schema's table, and shape
// inference written as a C++ function that throws instead of a C slot that returns a status.
//
//   // (x) -> y of x's shape; names what it rejects.
//   void infer_mine(const sdk::NodeInfo& node, plx_tensor* outputs) {
//     PLX_REQUIRE(node.input(0).ndim >= 1, "mine.op: x must have a dimension");
//     sdk::set_output(outputs[0], node.input(0));
//   }
//   const plx_arg_def kIn[] = {{"x", 0, 1u << PLX_F32}};
//   const plx_arg_def kOut[] = {{"y", 0, 0}};
//   add_op_schema(sdk::op_schema("mine.op", "what it does", kIn, kOut, sdk::infer<infer_mine>));
//
// The host keeps pointers into the schema: its arrays and strings must be static storage.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plexus/abi/ops.h"
#include "plexus/sdk/status.hpp"
#include "plexus/sdk/tensor.hpp"

namespace plexus::sdk {

using InferFn = plx_status (*)(void* user, const plx_node_info* node, plx_tensor* outputs);

// The C slot for a C++ inference function F(node, outputs): what F throws becomes the status
// and the plugin's last_error(), which the host puts in its error ("shape inference failed:
// invalid argument: <F's message>").
template <void (*F)(const NodeInfo&, plx_tensor*)>
plx_status infer(void*, const plx_node_info* node, plx_tensor* outputs) {
  return detail::guard([&] { F(NodeInfo(node), outputs); });
}

// Sets an output descriptor to `like`'s dtype and shape (the host sets strides).
inline void set_output(plx_tensor& out, const plx_tensor& like) {
  out.dtype = like.dtype;
  out.ndim = like.ndim;
  for (int32_t i = 0; i < PLX_MAX_DIMS; ++i) out.shape[i] = i < like.ndim ? like.shape[i] : 0;
}

// A schema with `n_in` inputs and `n_out` outputs; `grad_op` names the op computing its input
// gradients (abi/ops.h has its inputs and outputs), NULL if it is not differentiable.
// Attributes and type_input are set on the result when the op has them.
inline plx_op_schema op_schema(const char* name, const char* doc, const plx_arg_def* inputs,
                               int32_t n_in, const plx_arg_def* outputs, int32_t n_out,
                               InferFn infer_fn, const char* grad_op = nullptr) {
  plx_op_schema s{};
  s.struct_size = sizeof s;
  s.name = name;
  s.doc = doc;
  s.inputs = inputs;
  s.num_inputs = n_in;
  s.outputs = outputs;
  s.num_outputs = n_out;
  s.infer = infer_fn;
  s.grad_op = grad_op;
  return s;
}

template <size_t NI, size_t NO>
plx_op_schema op_schema(const char* name, const char* doc, const plx_arg_def (&inputs)[NI],
                        const plx_arg_def (&outputs)[NO], InferFn infer_fn,
                        const char* grad_op = nullptr) {
  return op_schema(name, doc, inputs, static_cast<int32_t>(NI), outputs, static_cast<int32_t>(NO),
                   infer_fn, grad_op);
}

}  // namespace plexus::sdk
