/* Plexus plugin ABI, version 1: communicators.
 *
 * A communicator implements collectives and point-to-point transfers on one backend's buffers
 * and streams. Data and pipeline parallelism live in the core and use only this table, so NCCL,
 * MPI or a third party's transport are interchangeable.
 */
#ifndef PLEXUS_ABI_COMM_H
#define PLEXUS_ABI_COMM_H

#include "plexus/abi/backend.h"
#include "plexus/abi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum plx_reduce_op {
  PLX_REDUCE_SUM = 0,
  PLX_REDUCE_AVG = 1, /* sum divided by the number of ranks */
  PLX_REDUCE_MAX = 2,
  PLX_REDUCE_MIN = 3
} plx_reduce_op;

/* A short, static name of a reduce op ("sum"); "invalid" for any other value. Never NULL. */
static inline const char* plx_reduce_op_string(int32_t op) {
  switch (op) {
    case PLX_REDUCE_SUM: return "sum";
    case PLX_REDUCE_AVG: return "avg";
    case PLX_REDUCE_MAX: return "max";
    case PLX_REDUCE_MIN: return "min";
  }
  return "invalid";
}

/* An opaque identifier that lets ranks find one another. Rank 0 makes it with get_unique_id;
 * the host carries it to the other ranks (through the launcher, a file or a store). */
typedef struct plx_comm_id {
  uint8_t bytes[128];
} plx_comm_id;

typedef struct plx_comm_config {
  uint32_t struct_size;
  int32_t rank;                 /* this rank, 0..size-1; -1: take it from the launcher (MPI) */
  int32_t size;                 /* number of ranks; -1: take it from the launcher */
  int32_t device;               /* device index on `backend` whose buffers the ranks exchange */
  const plx_backend* backend;   /* the backend owning buffers and streams passed to the ops */
  plx_comm_id id;               /* from get_unique_id on rank 0; ignored when rank == -1 */
  int32_t timeout_ms;           /* give up on a peer after this long (0: the plugin's default) */
  int32_t reserved0;
} plx_comm_config;

typedef struct plx_comm_s* plx_comm_handle;

/* A communicator implementation. Unless a comment says otherwise, an operation is enqueued on
 * `stream` (a stream of cfg.backend) and returns without waiting: the buffers must stay valid
 * until the stream passes it. Counts are in elements of `dtype`. An operation on a
 * communicator whose peer has died returns PLX_ERR_COMM (or, if the failure is only seen later,
 * get_async_error reports it); no slot hangs past the configured timeout. */
typedef struct plx_comm {
  uint32_t struct_size;
  uint32_t reserved0;
  const char* name;      /* "nccl", "mpi", "threads", ... */
  const char* backends;  /* comma-separated names of backends whose buffers it accepts */
  void* ctx;

  /* Makes a fresh identifier for a new group of ranks. Blocking. */
  plx_status (*get_unique_id)(void* ctx, plx_comm_id* id);

  /* Joins the group `cfg` describes. Collective: blocks until every rank has joined or the
   * timeout passes. The caller destroys the result with destroy(). */
  plx_status (*init_rank)(void* ctx, const plx_comm_config* cfg, plx_comm_handle* comm);

  /* Leaves the group after pending operations complete, and frees the handle. Blocking. */
  plx_status (*destroy)(plx_comm_handle comm);

  /* Cancels pending operations and marks the communicator failed, from any thread; they return
   * PLX_ERR_ABORTED. The handle must still be destroyed. */
  plx_status (*abort)(plx_comm_handle comm);

  int32_t (*rank)(plx_comm_handle comm);
  int32_t (*size)(plx_comm_handle comm);

  /* recv[i] = op over ranks of send[i], on every rank. send == recv is allowed. */
  plx_status (*all_reduce)(plx_comm_handle comm, const void* send, void* recv, uint64_t count,
                           int32_t dtype, int32_t op, plx_stream stream);
  /* recv = root's send, on every rank (send is read only on root). send == recv is allowed. */
  plx_status (*broadcast)(plx_comm_handle comm, const void* send, void* recv, uint64_t count,
                          int32_t dtype, int32_t root, plx_stream stream);
  /* recv (size * count elements) = the concatenation of every rank's send, in rank order. */
  plx_status (*all_gather)(plx_comm_handle comm, const void* send, void* recv, uint64_t count,
                           int32_t dtype, plx_stream stream);
  /* recv (count elements) = op over ranks of the rank-th block of count elements of send
   * (size * count elements). */
  plx_status (*reduce_scatter)(plx_comm_handle comm, const void* send, void* recv,
                               uint64_t count, int32_t dtype, int32_t op, plx_stream stream);
  /* Point to point: matched by (peer, order of issue). */
  plx_status (*send)(plx_comm_handle comm, const void* buf, uint64_t count, int32_t dtype,
                     int32_t peer, plx_stream stream);
  plx_status (*recv)(plx_comm_handle comm, void* buf, uint64_t count, int32_t dtype,
                     int32_t peer, plx_stream stream);
  /* Work enqueued on `stream` after the barrier starts only when every rank has reached it. */
  plx_status (*barrier)(plx_comm_handle comm, plx_stream stream);

  /* Optional: operations between group_begin and group_end are issued together (so a send and
   * a recv between two ranks cannot deadlock). NULL: each operation is issued on its own. */
  plx_status (*group_begin)(plx_comm_handle comm);
  plx_status (*group_end)(plx_comm_handle comm);

  /* Optional: an error that happened asynchronously (a peer died mid-operation), or PLX_OK.
   * Never blocks. NULL: errors are only reported by the operations themselves. */
  plx_status (*get_async_error)(plx_comm_handle comm);
} plx_comm;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PLEXUS_ABI_COMM_H */
