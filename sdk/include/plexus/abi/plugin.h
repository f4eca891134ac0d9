/* Plexus plugin ABI, version 1: the plugin descriptor and its entry point.
 *
 * A plugin is a shared library exporting one C function, PLX_PLUGIN_ENTRY_NAME, which returns a
 * static descriptor. The host reads `struct_size` and `abi_major` before anything else and
 * refuses the plugin if they do not match. Then it calls init() with its services, asks for the
 * backends, communicators, op schemas and kernel extensions the plugin provides, and finally
 * calls shutdown().
 */
#ifndef PLEXUS_ABI_PLUGIN_H
#define PLEXUS_ABI_PLUGIN_H

#include "plexus/abi/backend.h"
#include "plexus/abi/comm.h"
#include "plexus/abi/ops.h"
#include "plexus/abi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exported symbol. */
#define PLX_PLUGIN_ENTRY_NAME "plexus_plugin_entry"

/* A key/value option for a plugin, from the config's [plugins.options.<name>] table. */
typedef struct plx_option {
  const char* key;
  const char* value; /* the TOML value written as text: 4, 0.5, true, "text" without quotes */
} plx_option;

/* What the host gives a plugin at init. Valid during init() only, except `log` and `log_user`,
 * which stay valid until shutdown() returns. */
typedef struct plx_host {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  plx_log_fn log;          /* never NULL */
  void* log_user;          /* first argument of `log` */
  int32_t log_level;       /* messages below it are dropped; a plugin may skip formatting them */
  int32_t num_options;
  const plx_option* options;
} plx_host;

/* A kernel extension (ABI 1.2): a kernel one plugin gives to a backend of another plugin, as
 * PyTorch's TORCH_LIBRARY_IMPL adds a kernel for a dispatch key, or an ONNX Runtime custom-op
 * domain adds an op for an execution provider. This is how a plugin's own op (a plx_op_schema)
 * runs on the cpu or cuda backend, or how a built-in op gains another implementation there.
 *
 * After every plugin has loaded, the host appends each extension kernel to the named backend's
 * kernels for its (op, dtype), after that backend's own: the backend's kernels are tried first,
 * then the extensions in load order. A backend that is not loaded is reported (a warning, and
 * `plexus info` lists the kernel as not used, with the reason), and the plugin still loads. The
 * op must have a schema (a built-in, or any loaded plugin's), else the kernel is reported and
 * ignored.
 *
 * The kernel runs inside the target backend, whose plugin knows nothing of it:
 * - create() receives as `backend_ctx` the `plugin_ctx` that init() returned to the plugin giving
 *   the extension (never the target backend's ctx, which only its own plugin may use). Its
 *   failure text is read from the giving plugin's last_error().
 * - compute() receives tensors in the target backend's memory (allocated by its mem_alloc;
 *   `device` indexes its devices) and the target backend's `stream`. The kernel must run its
 *   work in the order of that stream, with the target's conventions: on "cpu" (host memory,
 *   synchronous streams) a kernel that loops on the host is valid; on "cuda" the plx_stream is
 *   the cudaStream_t to launch on (the CUDA plugin's documented convention) and the pointers are
 *   device memory, so a host loop there would read device pointers on the host. A kernel written
 *   for host memory is valid only for backends whose devices have PLX_CAP_UNIFIED_HOST.
 * - The same rules as any kernel otherwise: no allocation in compute(), workspace stated at
 *   create(), flags and layout honoured, destroy() once per successful create(). */
typedef struct plx_kernel_ext {
  uint32_t struct_size; /* sizeof(plx_kernel_ext) as the plugin was built */
  uint32_t reserved0;
  const char* backend;      /* the target backend's name: "cpu", "cuda", ... */
  const plx_kernel* kernel; /* lives until the giving plugin's shutdown() */
} plx_kernel_ext;

typedef struct plx_plugin {
  uint32_t struct_size;        /* sizeof(plx_plugin) as the plugin was built */
  uint16_t abi_major;          /* PLX_ABI_MAJOR as the plugin was built */
  uint16_t abi_minor;
  const char* name;            /* unique: [a-z0-9_]+ */
  const char* version;         /* the plugin's own version, e.g. "1.2.0" */
  const char* description;     /* one line */

  /* Initialises the plugin. Blocking, called once, before any slot but last_error. Returns a
   * context passed to the other slots. On failure the host reads last_error(), does not call
   * shutdown(), and unloads the library; the plugin must have released what it took. */
  plx_status (*init)(const plx_host* host, void** plugin_ctx);

  /* Releases everything the plugin holds; every handle the host got from it is dead afterwards.
   * Blocking. Must not fail. */
  void (*shutdown)(void* plugin_ctx);

  /* The message of the last failure on the calling thread; never NULL, "" if none. Valid until
   * the next call into the plugin on that thread. */
  const char* (*last_error)(void);

  /* What the plugin provides. Tables live until shutdown(). Blocking, cheap. */
  int32_t (*backend_count)(void* plugin_ctx);
  const plx_backend* (*get_backend)(void* plugin_ctx, int32_t index);
  int32_t (*comm_count)(void* plugin_ctx);
  const plx_comm* (*get_comm)(void* plugin_ctx, int32_t index);
  int32_t (*op_schema_count)(void* plugin_ctx);
  const plx_op_schema* (*get_op_schema)(void* plugin_ctx, int32_t index);

  /* ---- ABI 1.2: kernel extensions (optional: both or neither; read only when struct_size
   * reaches them). Kernels for other plugins' backends (see plx_kernel_ext). Blocking, cheap,
   * called after init() (the host checks the entries then) and again once every plugin has
   * loaded; the same entries each time, living until shutdown(). NULL: none. ---- */
  int32_t (*extension_kernel_count)(void* plugin_ctx);
  const plx_kernel_ext* (*get_extension_kernel)(void* plugin_ctx, int32_t index);
} plx_plugin;

/* The size of a plx_plugin of ABI 1.0, which ends at get_op_schema; ABI 1.1 kept it (1.1 only
 * appended to plx_comm). A host accepts descriptors this large and reads no slot past them. */
#define PLX_PLUGIN_SIZE_1_0 ((uint32_t)offsetof(plx_plugin, extension_kernel_count))
#define PLX_PLUGIN_SIZE_1_1 PLX_PLUGIN_SIZE_1_0

/* The entry point's type. It has no side effects: it only returns the static descriptor. */
typedef const plx_plugin* (*plx_plugin_entry_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PLEXUS_ABI_PLUGIN_H */
