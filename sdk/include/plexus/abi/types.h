/* Plexus plugin ABI, version 1: the basic types every table uses.
 *
 * Only C crosses the plugin boundary: plain structs, opaque handles, function pointers and a
 * status code. Once released, a struct here is frozen: new fields go at the end, the minor
 * version moves, and tests/abi/abi_layout_test.cpp pins sizeof/offsetof of every struct.
 */
#ifndef PLEXUS_ABI_TYPES_H
#define PLEXUS_ABI_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version. A host loads a plugin whose major equals its own, whatever its minor: a
 * plugin built against an older minor gives shorter tables, and the host reads no slot past
 * their struct_size; one built against a newer minor is accepted too, and the host only reads
 * the fields its own minor knows. History: 1.1 appended plx_comm.bench_native; 1.2 appended
 * plx_plugin's kernel extensions (extension_kernel_count, get_extension_kernel); 1.3 gave
 * max_pool2d the attributes relu_mask and window_index (no layout change: the host gives a node
 * that sets an attribute newer than a plugin's minor to none of that plugin's kernels, which would
 * not read it; docs/sdk.md "Versions"); 1.4 gave sgd_update and adamw_update the optional input
 * `check` (the update is skipped unless it is finite) and added the op loss_scale_update, again
 * without a layout change: a node that gives an input newer than a plugin's minor goes to none of
 * its kernels either; 1.5 gave plx_kernel.layout its contract (a kernel that prefers NHWC takes
 * each 4-D activation NCHW contiguous or channels-last) and added the flag PLX_KERNEL_DENSE, both
 * for the host's layout planner, again without a layout change: the host plans channels-last
 * tensors only around kernels of plugins built for 1.5 or later; 1.6 added the flag
 * PLX_KERNEL_SELF_CONTAINED for fused kernels, again without a layout change: the host reads it
 * only from plugins built for 1.6 or later. */
#define PLX_ABI_MAJOR 1
#define PLX_ABI_MINOR 6

/* Up to this many dimensions in a tensor view. */
#define PLX_MAX_DIMS 8

/* What every slot returns. PLX_OK is zero; everything else is a failure whose text the plugin's
 * last_error() gives on the same thread. */
typedef enum plx_status {
  PLX_OK = 0,
  PLX_ERR_INVALID_ARGUMENT = 1, /* the caller broke a contract: bad shape, dtype, handle */
  PLX_ERR_UNSUPPORTED = 2,      /* a valid request this implementation declines (a kernel that
                                   does not handle these shapes, an optional feature) */
  PLX_ERR_OUT_OF_MEMORY = 3,    /* an allocation failed; the host may free caches and retry */
  PLX_ERR_BACKEND = 4,          /* the underlying library failed (CUDA, cuDNN, BLAS, ...) */
  PLX_ERR_COMM = 5,             /* a communicator failed: a peer died, a transport broke */
  PLX_ERR_TIMEOUT = 6,          /* an operation with a deadline did not finish in time */
  PLX_ERR_ABORTED = 7,          /* the operation was cancelled by abort() */
  PLX_ERR_NOT_FOUND = 8,        /* a named thing (device, option, symbol) does not exist */
  PLX_ERR_INTERNAL = 9          /* a bug in the plugin; the text says where */
} plx_status;

/* A short, static, English name of a status ("out of memory"). Never NULL. */
static inline const char* plx_status_string(plx_status s) {
  switch (s) {
    case PLX_OK: return "ok";
    case PLX_ERR_INVALID_ARGUMENT: return "invalid argument";
    case PLX_ERR_UNSUPPORTED: return "unsupported";
    case PLX_ERR_OUT_OF_MEMORY: return "out of memory";
    case PLX_ERR_BACKEND: return "backend error";
    case PLX_ERR_COMM: return "communicator error";
    case PLX_ERR_TIMEOUT: return "timeout";
    case PLX_ERR_ABORTED: return "aborted";
    case PLX_ERR_NOT_FOUND: return "not found";
    case PLX_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

/* Element types. Numbering is part of the ABI. */
typedef enum plx_dtype {
  PLX_DTYPE_NONE = -1, /* an absent optional tensor */
  PLX_F32 = 0,
  PLX_F16 = 1,
  PLX_BF16 = 2,
  PLX_I32 = 3,
  PLX_I64 = 4,
  PLX_U8 = 5,
  PLX_F64 = 6, /* for reference checks; the CPU backend implements it, others need not */
  PLX_DTYPE_COUNT = 7
} plx_dtype;

/* Kinds of memory a backend allocates. */
typedef enum plx_mem_kind {
  PLX_MEM_DEVICE = 0, /* the device's own memory (host memory for the CPU backend) */
  PLX_MEM_PINNED = 1, /* page-locked host memory the device can copy from asynchronously */
  PLX_MEM_MANAGED = 2 /* memory addressable from host and device, migrated on demand */
} plx_mem_kind;

/* Directions of a copy. "Host" is ordinary or pinned host memory. */
typedef enum plx_copy_dir {
  PLX_COPY_H2D = 0,
  PLX_COPY_D2H = 1,
  PLX_COPY_D2D = 2,
  PLX_COPY_H2H = 3
} plx_copy_dir;

/* A view of a tensor: it never owns its memory. The same struct describes a tensor without data
 * (data == NULL) when kernels are created, before memory exists. */
typedef struct plx_tensor {
  void* data;                      /* first element; NULL in descriptors */
  int32_t dtype;                   /* plx_dtype; PLX_DTYPE_NONE marks an absent optional input */
  int32_t ndim;                    /* 0 for a scalar */
  int64_t shape[PLX_MAX_DIMS];     /* entries past ndim are 0 */
  int64_t strides[PLX_MAX_DIMS];   /* in elements, not bytes; row-major contiguous unless the
                                      kernel declared PLX_KERNEL_STRIDED */
  int32_t device;                  /* device index within the backend that owns the memory */
  int32_t mem_kind;                /* plx_mem_kind */
} plx_tensor;

/* Attribute values of an op (stride, padding, epsilon, ...). */
typedef enum plx_attr_type {
  PLX_ATTR_INT = 1,
  PLX_ATTR_FLOAT = 2,
  PLX_ATTR_INTS = 3,
  PLX_ATTR_FLOATS = 4,
  PLX_ATTR_STRING = 5
} plx_attr_type;

/* One attribute. Exactly the field its type names is meaningful. Pointers stay valid for the
 * duration of the call they are passed to. */
typedef struct plx_attr {
  const char* name;
  int32_t type;          /* plx_attr_type */
  int32_t count;         /* number of elements of ints/floats */
  int64_t i;             /* PLX_ATTR_INT */
  double f;              /* PLX_ATTR_FLOAT */
  const int64_t* ints;   /* PLX_ATTR_INTS */
  const double* floats;  /* PLX_ATTR_FLOATS */
  const char* s;         /* PLX_ATTR_STRING, NUL-terminated */
} plx_attr;

/* Opaque handles owned by a backend. A NULL stream means the device's default stream. */
typedef struct plx_stream_s* plx_stream;
typedef struct plx_event_s* plx_event;

/* Log levels of the host's logging callback. */
typedef enum plx_log_level {
  PLX_LOG_TRACE = 0,
  PLX_LOG_DEBUG = 1,
  PLX_LOG_INFO = 2,
  PLX_LOG_WARN = 3,
  PLX_LOG_ERROR = 4,
  PLX_LOG_OFF = 5
} plx_log_level;

/* The host's logging callback. Thread-safe; may be called from any thread at any time between
 * init and shutdown. `source` names the part of the plugin ("cuda.conv"), `message` is UTF-8.
 * Neither pointer is kept after the call returns. */
typedef void (*plx_log_fn)(void* user, int32_t level, const char* source, const char* message);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PLEXUS_ABI_TYPES_H */
