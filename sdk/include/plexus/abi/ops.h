/* Plexus plugin ABI, version 1: operators and kernels.
 *
 * An op is a name plus a schema (inputs, outputs, attributes, dtype rule, shape inference and
 * gradient). The core defines the built-in ops (docs/ops.md lists them); a plugin may add ops of
 * its own with a plx_op_schema. A backend registers kernels per (op, dtype). The core resolves a
 * kernel once per graph node by calling create(); after that each step calls compute() directly,
 * with no look-up by name.
 */
#ifndef PLEXUS_ABI_OPS_H
#define PLEXUS_ABI_OPS_H

#include "plexus/abi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the core knows about one node when it asks a kernel to prepare for it. */
typedef struct plx_node_info {
  uint32_t struct_size;
  int32_t device;              /* device index within the backend */
  const char* op;              /* op name */
  int32_t num_inputs;
  int32_t num_outputs;
  const plx_tensor* inputs;    /* descriptors (data NULL), in schema order; an absent optional
                                  input has dtype PLX_DTYPE_NONE */
  const plx_tensor* outputs;   /* descriptors with the shapes and dtypes the schema inferred */
  const plx_attr* attrs;       /* every attribute of the schema, defaults filled in, schema order */
  int32_t num_attrs;
  int32_t reserved0;
} plx_node_info;

/* Flags of a kernel. */
enum {
  PLX_KERNEL_INPLACE = 1u << 0,       /* output 0 may alias input 0 */
  PLX_KERNEL_STRIDED = 1u << 1,       /* inputs may have any strides; without it the core hands
                                         the kernel row-major contiguous inputs */
  PLX_KERNEL_DETERMINISTIC = 1u << 2, /* bit-identical results run to run */
  PLX_KERNEL_CAPTURABLE = 1u << 3,    /* safe inside a stream capture (no host sync, no alloc) */
  PLX_KERNEL_LIBRARY = 1u << 4,       /* the work is done by a vendor library (cuBLAS, cuDNN,
                                         OpenBLAS): the "library" side of the config's
                                         `backend.kernels`; clear for the plugin's own code (the
                                         "native" side). Hosts before it ignore the bit, and
                                         plugins that never set it count as native. */
  PLX_KERNEL_DENSE = 1u << 5,         /* (ABI 1.5) the kernel works in memory order, as an
                                         elementwise map does: when every input and output of
                                         output 0's shape has the same dense strides (a
                                         permutation of row-major, no gaps), it computes what it
                                         computes on contiguous tensors. The layout planner may
                                         then hand it such tensors all channels-last together;
                                         operands of other shapes stay as they were. */
  PLX_KERNEL_SELF_CONTAINED = 1u << 6 /* (ABI 1.6; a kernel of create_fused) it does every node
                                         of its group with code of its own and reads no node's
                                         kernel_hint: the host makes it once, neither remakes
                                         nor times it around its nodes' other kernels, and
                                         reports it, not their kernels, as what ran them.
                                         Ignored on a plugin's own kernels and on plugins built
                                         before 1.6. */
};

/* Memory layouts a kernel prefers for its 4-D activations (N, C, H, W). A tensor's shape is
 * always the logical NCHW one; channels-last (NHWC) is a matter of strides: (H*W*C, 1, W*C, C).
 *
 * The host's layout planner (ABI 1.5; docs/sdk.md "Layouts") stores a 4-D activation
 * channels-last when the kernel that writes it and every kernel that reads it take that: kernels
 * whose layout is PLX_LAYOUT_NHWC, and PLX_KERNEL_DENSE kernels in between. A kernel of a plugin
 * built for 1.5 or later that says PLX_LAYOUT_NHWC therefore takes its 4-D inputs and outputs
 * NCHW contiguous or channels-last, reading the strides at create(), and declines there a
 * combination it cannot run (the planner then offers it the channels-last tensors one at a time
 * and keeps those it refuses NCHW); every other kernel gets NCHW contiguous tensors (or any
 * strides with PLX_KERNEL_STRIDED, for inputs). The conversions happen where a channels-last
 * tensor meets a kernel that wants NCHW: inside the NHWC-preferring kernel that reads or writes
 * the NCHW side, once per edge, never as extra nodes. A fused kernel says its layout the same
 * way (create_fused's plx_kernel). */
typedef enum plx_layout {
  PLX_LAYOUT_ANY = 0,  /* no preference, or not a 4-D op */
  PLX_LAYOUT_NCHW = 1,
  PLX_LAYOUT_NHWC = 2
} plx_layout;

/* A kernel: one implementation of one op for one dtype. A backend lists its kernels fastest
 * first; for a node the core tries them in order and takes the first whose create() succeeds,
 * logging each decline with its reason.
 *
 * `dtype` is the dtype of the schema's type input (plx_op_schema.type_input; the first input for
 * built-in ops unless docs/ops.md says otherwise). */
typedef struct plx_kernel {
  uint32_t struct_size;
  uint32_t flags;         /* PLX_KERNEL_* */
  const char* op;         /* op name */
  const char* impl;       /* implementation name for logs, e.g. "im2col+sgemm" */
  int32_t dtype;          /* plx_dtype */
  int32_t layout;         /* plx_layout it prefers */
  void* user;             /* passed back to create() unchanged */

  /* Prepares for one node. Blocking; called when a graph is prepared, never per step. Reads the
   * attributes and shapes it needs from `node` (valid during the call only), may precompute
   * (plans, descriptors, algorithm choice), and returns an opaque state and the workspace it
   * needs per compute() call. Returns PLX_ERR_UNSUPPORTED with a reason in last_error() to
   * decline the node (the core then tries the next kernel). `backend_ctx` is the ctx of the
   * backend table that registered the kernel. */
  plx_status (*create)(void* backend_ctx, void* user, const plx_node_info* node, void** state,
                       uint64_t* workspace_bytes);

  /* Runs the node. Asynchronous with respect to the host on backends with streams: it enqueues
   * work on `stream` and returns. Inputs and outputs have the shapes and dtypes given to
   * create(); outputs are allocated by the core and do not alias inputs unless the kernel has
   * PLX_KERNEL_INPLACE. `workspace` holds `workspace_bytes` bytes (NULL if 0) and is valid until
   * the stream reaches the end of this call's work. Must not allocate device memory. */
  plx_status (*compute)(void* state, const plx_tensor* inputs, int32_t num_inputs,
                        const plx_tensor* outputs, int32_t num_outputs, void* workspace,
                        uint64_t workspace_bytes, plx_stream stream);

  /* Frees the state. Called once per successful create(), after the last compute() using it has
   * completed on its stream. Must not fail. */
  void (*destroy)(void* state);
} plx_kernel;

/* Flags of an input or output in a schema. */
enum {
  PLX_ARG_OPTIONAL = 1u << 0, /* the input may be absent */
  PLX_ARG_MUTATED = 1u << 1,  /* the kernel writes this input in place (running stats, optimizer
                                 state) */
  PLX_ARG_NO_GRAD = 1u << 2   /* no gradient flows through it (indices, labels, saved stats) */
};

typedef struct plx_arg_def {
  const char* name;
  uint32_t flags;      /* PLX_ARG_* */
  uint32_t dtypes;     /* bit mask of accepted dtypes, bit (1u << plx_dtype); 0 = same as type
                          input */
} plx_arg_def;

typedef struct plx_attr_def {
  const char* name;
  int32_t type;            /* plx_attr_type */
  int32_t required;        /* non-zero: no default; `default_value` ignored */
  plx_attr default_value;  /* its name and type fields are ignored */
} plx_attr_def;

/* A plugin's own op. The name must be "<plugin>.<op>" so it cannot collide with a built-in. */
typedef struct plx_op_schema {
  uint32_t struct_size;
  int32_t type_input;       /* index of the input whose dtype selects the kernel */
  const char* name;
  const char* doc;          /* one line, shown by `plexus info` */
  const plx_arg_def* inputs;
  const plx_arg_def* outputs;
  const plx_attr_def* attrs;
  int32_t num_inputs;
  int32_t num_outputs;
  int32_t num_attrs;
  int32_t reserved0;
  void* user;               /* passed back to infer() */

  /* Shape and dtype inference. Blocking, pure. `node->outputs` is NULL; the function fills
   * `outputs[i].dtype`, `.ndim` and `.shape` for each output (the core sets strides). Returns
   * PLX_ERR_INVALID_ARGUMENT with a message that names the offending input or attribute. */
  plx_status (*infer)(void* user, const plx_node_info* node, plx_tensor* outputs);

  /* Optional: the op that computes this op's input gradients, or NULL if not differentiable. Its
   * inputs are the gradients of this op's outputs (one per output, absent where none flows),
   * then this op's inputs, then this op's outputs; its outputs are the gradients of this op's
   * inputs, in order; its attributes are this op's. */
  const char* grad_op;
} plx_op_schema;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PLEXUS_ABI_OPS_H */
