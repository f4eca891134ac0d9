/* Plexus plugin ABI, version 1: compute backends.
 *
 * Levels are kept apart: a plugin gives backends (registry level); a backend has devices; a
 * device has streams and events (compute) and raw memory (allocate/free/copy/set). The core's
 * caching allocator sits on top of the raw memory slots for every backend, so a backend never
 * caches memory itself.
 */
#ifndef PLEXUS_ABI_BACKEND_H
#define PLEXUS_ABI_BACKEND_H

#include "plexus/abi/ops.h"
#include "plexus/abi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Capabilities of a device, bits of plx_device_props.caps. */
enum {
  PLX_CAP_F16 = 1u << 0,           /* f16 kernels */
  PLX_CAP_BF16 = 1u << 1,          /* bf16 kernels */
  PLX_CAP_F64 = 1u << 2,           /* f64 kernels */
  PLX_CAP_PINNED = 1u << 3,        /* PLX_MEM_PINNED allocations */
  PLX_CAP_MANAGED = 1u << 4,       /* PLX_MEM_MANAGED allocations */
  PLX_CAP_ASYNC = 1u << 5,         /* streams run asynchronously to the host */
  PLX_CAP_GRAPH_CAPTURE = 1u << 6, /* capture_begin/capture_end work */
  PLX_CAP_TENSOR_CORES = 1u << 7,  /* matrix units for f16/bf16/tf32 */
  PLX_CAP_UNIFIED_HOST = 1u << 8   /* device memory is host memory (CPU backends) */
};

typedef struct plx_device_props {
  uint32_t struct_size;       /* set by the host before the call */
  int32_t index;
  char name[128];             /* NUL-terminated, e.g. "NVIDIA H100 80GB HBM3" */
  uint64_t total_memory;      /* bytes */
  uint64_t free_memory;       /* bytes, when the call was made */
  int32_t compute_units;      /* SMs, or CPU threads the backend uses */
  int32_t arch_major;         /* compute capability for CUDA; 0 for CPUs */
  int32_t arch_minor;
  uint32_t caps;              /* PLX_CAP_* */
  uint64_t alignment;         /* the alignment mem_alloc guarantees, bytes */
} plx_device_props;

/* Memory statistics, in bytes unless named otherwise. The core's caching allocator keeps them
 * per device; the struct is in the ABI so that plugins and tools read the same figures. */
typedef struct plx_memory_stats {
  uint32_t struct_size;
  uint32_t reserved0;
  uint64_t in_use;         /* handed out to tensors and workspaces now */
  uint64_t peak_in_use;
  uint64_t reserved;       /* obtained from the backend, in use or cached */
  uint64_t peak_reserved;
  uint64_t limit;          /* the most the allocator may reserve; 0 = the device's memory */
  uint64_t num_allocs;     /* allocations served */
  uint64_t num_cache_hits; /* of which served from the cache */
  uint64_t num_raw_allocs; /* calls to the backend's mem_alloc */
  uint64_t num_ooms;       /* allocations that failed even after the cache was released */
} plx_memory_stats;

/* A graph offered to a backend for fusion: values are tensor descriptors, nodes are ops whose
 * inputs and outputs index values. Nodes are in topological order. */
typedef struct plx_graph_node {
  const char* op;
  const int32_t* inputs;   /* value indices; -1 for an absent optional input */
  const int32_t* outputs;  /* value indices */
  const plx_attr* attrs;
  int32_t num_inputs;
  int32_t num_outputs;
  int32_t num_attrs;
  /* In create_fused's view: 1 + the index (get_kernel) of the kernel the host chose for this
   * node among the backend's candidates (backend.kernels: the tuner's choice, or the forced
   * side's first), for the backend to use inside the fused kernel; 0: no choice, the backend's
   * own order. Hosts before it leave it 0 (it was reserved); backends may ignore it. 0 in
   * get_capability's view. */
  int32_t kernel_hint;
} plx_graph_node;

typedef struct plx_graph_view {
  uint32_t struct_size;
  int32_t device;
  const plx_tensor* values;      /* descriptors, data NULL */
  const plx_graph_node* nodes;
  int32_t num_values;
  int32_t num_nodes;
} plx_graph_view;

/* The host's callback through which a backend claims a subgraph in get_capability(): the node
 * indices it will run as one kernel, and a name for logs. Returns PLX_ERR_INVALID_ARGUMENT if
 * the nodes overlap an earlier claim or are not convex. */
typedef plx_status (*plx_claim_fn)(void* host_user, const int32_t* nodes, int32_t num_nodes,
                                   const char* name);

/* A backend: one table per backend a plugin provides. Slots marked "optional" may be NULL; the
 * core then supplies the default named in the comment. All others are required. Every slot
 * takes `ctx` first. Unless a comment says otherwise a slot is thread-safe, returns PLX_OK or a
 * failure whose text is in the plugin's last_error(), and never throws or aborts. */
typedef struct plx_backend {
  uint32_t struct_size;
  uint32_t reserved0;
  const char* name;   /* unique among loaded backends: "cpu", "cuda", ... */
  void* ctx;

  /* ---- devices ---- */

  /* Number of devices; 0 means the backend has nothing to run on here (the core then reports
   * it, but does not select it). Blocking, cheap. */
  int32_t (*device_count)(void* ctx);

  /* Fills `props` (its struct_size is set by the host; write no further). Blocking. */
  plx_status (*device_props)(void* ctx, int32_t device, plx_device_props* props);

  /* ---- raw memory (the core caches on top) ---- */

  /* Allocates `bytes` (> 0) of `kind` on `device`, aligned to at least props.alignment. Stream-
   * ordered where the backend supports it: the memory may be used by work on `stream` at once.
   * PLX_ERR_OUT_OF_MEMORY when the memory is not there; the caller owns the result and frees it
   * with mem_free on the same backend. */
  plx_status (*mem_alloc)(void* ctx, int32_t device, int32_t kind, uint64_t bytes,
                          plx_stream stream, void** ptr);

  /* Frees memory from mem_alloc with the same device and kind, after the work already enqueued
   * on `stream` is done with it. */
  plx_status (*mem_free)(void* ctx, int32_t device, int32_t kind, void* ptr, plx_stream stream);

  /* Copies `bytes` from `src` to `dst` in direction `dir` (plx_copy_dir), enqueued on `stream`.
   * Asynchronous: host memory involved must stay valid until the stream passes the copy; a copy
   * from or to pageable (non-pinned) host memory may block the host. */
  plx_status (*mem_copy)(void* ctx, int32_t device, void* dst, const void* src, uint64_t bytes,
                         int32_t dir, plx_stream stream);

  /* Sets `bytes` bytes at `dst` (device memory) to `value`, enqueued on `stream`. */
  plx_status (*mem_set)(void* ctx, int32_t device, void* dst, int32_t value, uint64_t bytes,
                        plx_stream stream);

  /* Free and total memory of the device, in bytes. Blocking. */
  plx_status (*mem_info)(void* ctx, int32_t device, uint64_t* free_bytes, uint64_t* total_bytes);

  /* ---- streams and events ---- */

  /* Creates an ordered queue of work on `device`. The caller destroys it with stream_destroy. */
  plx_status (*stream_create)(void* ctx, int32_t device, plx_stream* stream);
  /* Destroys a stream after its pending work completes. Does not block the host. */
  plx_status (*stream_destroy)(void* ctx, plx_stream stream);
  /* Blocks the host until all work enqueued on `stream` has completed; reports errors of
   * asynchronous work (e.g. a kernel fault) as its status. */
  plx_status (*stream_sync)(void* ctx, plx_stream stream);
  /* Makes future work on `stream` wait until `event` has completed. Does not block the host. */
  plx_status (*stream_wait_event)(void* ctx, plx_stream stream, plx_event event);

  plx_status (*event_create)(void* ctx, int32_t device, plx_event* event);
  plx_status (*event_destroy)(void* ctx, plx_event event);
  /* Records `event` at the current end of `stream`. */
  plx_status (*event_record)(void* ctx, plx_event event, plx_stream stream);
  /* Blocks the host until `event` has completed. */
  plx_status (*event_sync)(void* ctx, plx_event event);
  /* Sets *done to 1 if `event` has completed, 0 otherwise. Never blocks. */
  plx_status (*event_query)(void* ctx, plx_event event, int32_t* done);
  /* Milliseconds between two completed events recorded on the same device. */
  plx_status (*event_elapsed_ms)(void* ctx, plx_event start, plx_event end, float* ms);

  /* ---- kernels ---- */

  /* The kernels this backend registers, fastest first within each (op, dtype). The tables live
   * until the plugin's shutdown. Blocking, called once at load. */
  int32_t (*kernel_count)(void* ctx);
  const plx_kernel* (*get_kernel)(void* ctx, int32_t index);

  /* ---- optional: fusion ----
   * When a graph is prepared the core offers it to the backend, which may claim subgraphs it
   * runs as one kernel by calling `claim` (any number of times). NULL: nothing is fused. After
   * create_fused declines a claim the core may call it again on the same graph: the claims it
   * created stay and are refused again, as is the declined node set itself, so the backend's
   * other patterns may take the freed nodes (a claim that fails is not an error). */
  plx_status (*get_capability)(void* ctx, const plx_graph_view* graph, plx_claim_fn claim,
                               void* host_user);

  /* Optional (required if get_capability is set): prepares a claimed subgraph. `graph` holds
   * just the claimed nodes; `inputs` and `outputs` list the values crossing its boundary, in the
   * order compute() receives them. Returns a kernel table (owned by the backend, valid until
   * shutdown) whose compute() and destroy() the core uses with the returned state. */
  plx_status (*create_fused)(void* ctx, const plx_graph_view* graph, const int32_t* inputs,
                             int32_t num_inputs, const int32_t* outputs, int32_t num_outputs,
                             const plx_kernel** kernel, void** state, uint64_t* workspace_bytes);

  /* ---- optional: graph capture (all four or none) ----
   * Records the work enqueued on `stream` between begin and end into a replayable graph. NULL:
   * the core runs the step op by op every time. */
  plx_status (*capture_begin)(void* ctx, plx_stream stream);
  plx_status (*capture_end)(void* ctx, plx_stream stream, void** graph);
  /* Enqueues one replay of `graph` on `stream`. */
  plx_status (*graph_launch)(void* ctx, void* graph, plx_stream stream);
  void (*graph_destroy)(void* ctx, void* graph);

  /* ---- optional: interoperability ---- */

  /* The backend's native handle of `stream` (a cudaStream_t for CUDA), for communicator plugins
   * working on this backend's buffers. NULL slot or NULL result: there is none. */
  void* (*stream_native)(void* ctx, plx_stream stream);

  /* Vendor extras by name (e.g. "cuda.set_math_mode"), NULL if unknown. The signature of each
   * name is documented by the plugin. NULL slot: no extras. */
  void* (*get_proc_address)(void* ctx, const char* name);
} plx_backend;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PLEXUS_ABI_BACKEND_H */
