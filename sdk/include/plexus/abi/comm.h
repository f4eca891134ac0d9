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

/* The collectives bench_native can time (ABI 1.1). */
typedef enum plx_collective {
  PLX_COLL_ALL_REDUCE = 0,
  PLX_COLL_BROADCAST = 1,
  PLX_COLL_ALL_GATHER = 2,
  PLX_COLL_REDUCE_SCATTER = 3
} plx_collective;

/* A short, static name of a collective ("all_reduce"); "invalid" for any other value. */
static inline const char* plx_collective_string(int32_t c) {
  switch (c) {
    case PLX_COLL_ALL_REDUCE: return "all_reduce";
    case PLX_COLL_BROADCAST: return "broadcast";
    case PLX_COLL_ALL_GATHER: return "all_gather";
    case PLX_COLL_REDUCE_SCATTER: return "reduce_scatter";
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

  /* ---- ABI 1.1: read only when struct_size >= offsetof(plx_comm, bench_native) + 8 ---- */

  /* Optional: the baseline `plexus bench comm` measures this table's overhead against. Times
   * `iters` back-to-back calls of `collective` made directly on the underlying library
   * (MPI_Allreduce on the group's MPI communicator, ncclAllReduce on its NCCL communicator...),
   * with nothing of Plexus in between, and writes the elapsed wall-clock seconds to *seconds.
   * Collective over the group: every rank calls it with the same arguments. Blocking: it starts
   * with a barrier of the library (so that the ranks start together) and returns when this
   * rank's last call has completed (for a device, `stream` synchronised); the timed span starts
   * after the barrier. Buffers of cfg.backend, as the collective's slot takes them: buf_a is
   * send, buf_b recv; all_reduce `count` elements each, all_gather send count and recv
   * size * count, reduce_scatter send size * count and recv count; broadcast is in place in
   * buf_b (count elements, root 0; buf_a is not used). Reductions are sums. For measurement
   * only: unlike the other slots it need not honour the timeout or abort() (a blocking MPI call
   * cannot be bounded), so a peer that never calls it can hang it. iters >= 1. NULL (or a table
   * of ABI 1.0): the communicator has no such baseline. */
  plx_status (*bench_native)(plx_comm_handle comm, int32_t collective, uint64_t count,
                             int32_t dtype, int32_t iters, void* buf_a, void* buf_b,
                             plx_stream stream, double* seconds);
} plx_comm;

/* The size of a plx_comm of ABI 1.0, which ends at get_async_error: a host accepts tables this
 * large and reads no slot past it in them. */
#define PLX_COMM_SIZE_1_0 ((uint32_t)offsetof(plx_comm, bench_native))

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PLEXUS_ABI_COMM_H */
