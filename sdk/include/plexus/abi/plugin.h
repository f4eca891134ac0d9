/* Plexus plugin ABI, version 1: the plugin descriptor and its entry point.
 *
 * A plugin is a shared library exporting one C function, PLX_PLUGIN_ENTRY_NAME, which returns a
 * static descriptor. The host reads `struct_size` and `abi_major` before anything else and
 * refuses the plugin if they do not match. Then it calls init() with its services, asks for the
 * backends, communicators and op schemas the plugin provides, and finally calls shutdown().
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
} plx_plugin;

/* The entry point's type. It has no side effects: it only returns the static descriptor. */
typedef const plx_plugin* (*plx_plugin_entry_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PLEXUS_ABI_PLUGIN_H */
