/* MPI alone, no Plexus: a blocking collective against its non-blocking form completed four
 * ways, interleaved round by round in one process. It tells how much of `plexus bench comm`'s
 * overhead for the mpi communicator is MPI's own non-blocking path (which the plugin needs for
 * its timeout) rather than the plugin's code (docs/benchmarks.md). Run by hand:
 *
 *   mpirun --oversubscribe --allow-run-as-root -np 2 build/bin/plexus_mpi_nonblocking_bench \
 *       all_reduce 4194304 10 11
 *
 * Arguments: collective (all_reduce, broadcast, all_gather, reduce_scatter), bytes (the whole
 * buffer, as plexus bench comm counts it), calls per timed run, rounds. Prints, on rank 0, the
 * median over rounds of the slowest rank's time per call for each way, and its ratio to
 * blocking:
 *   blocking    MPI_Allreduce etc.
 *   wait        MPI_Iallreduce etc. + MPI_Wait
 *   poll        the same + MPI_Test back to back (the mpi plugin's wait since issue 5)
 *   poll-sleep  the same + MPI_Test, yielding after 2000 polls and sleeping 50 us between polls
 *               after 20000 (the mpi plugin's wait before issue 5)
 */
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BLOCKING, WAIT, POLL, POLL_SLEEP, WAYS };
static const char* const kWays[WAYS] = {"blocking", "wait", "poll", "poll-sleep"};
enum { ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER };

static void complete(MPI_Request* req, int way) {
  if (way == WAIT) {
    MPI_Wait(req, MPI_STATUS_IGNORE);
    return;
  }
  for (unsigned long polls = 0;; ++polls) {
    int done = 0;
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (way == POLL_SLEEP) {
      if (polls > 20000) {
        const struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
      } else if (polls > 2000) {
        sched_yield();
      }
    }
  }
}

/* One call of collective c on (a, b): count per rank's block for all_gather/reduce_scatter. */
static void call(int c, int way, float* a, float* b, int count, int n) {
  MPI_Request req;
  const int block = count / n;
  if (way == BLOCKING) {
    switch (c) {
      case ALL_REDUCE:
        MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case BROADCAST:
        MPI_Bcast(b, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
      case ALL_GATHER:
        MPI_Allgather(a, block, MPI_FLOAT, b, block, MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case REDUCE_SCATTER:
        MPI_Reduce_scatter_block(a, b, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    }
    return;
  }
  switch (c) {
    case ALL_REDUCE:
      MPI_Iallreduce(a, b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
      break;
    case BROADCAST:
      MPI_Ibcast(b, count, MPI_FLOAT, 0, MPI_COMM_WORLD, &req);
      break;
    case ALL_GATHER:
      MPI_Iallgather(a, block, MPI_FLOAT, b, block, MPI_FLOAT, MPI_COMM_WORLD, &req);
      break;
    default:
      MPI_Ireduce_scatter_block(a, b, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
      break;
  }
  complete(&req, way);
}

static int by_value(const void* x, const void* y) {
  const double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

int main(int argc, char** argv) {
  int provided = 0, rank = 0, n = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 5) {
    if (rank == 0) fprintf(stderr, "usage: %s COLLECTIVE BYTES ITERS ROUNDS\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  const char* const names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter"};
  int c = -1;
  for (int i = 0; i < 4; ++i)
    if (strcmp(argv[1], names[i]) == 0) c = i;
  const long long bytes = atoll(argv[2]);
  const int iters = atoi(argv[3]), rounds = atoi(argv[4]);
  if (c < 0 || bytes < 4 * n || iters < 1 || rounds < 1 || rounds > 1000) {
    if (rank == 0)
      fprintf(stderr, "bad arguments: %s %s %s %s\n", argv[1], argv[2], argv[3], argv[4]);
    MPI_Finalize();
    return 2;
  }
  const int count = (int)(bytes / 4 / n * n); /* divisible by n for the block collectives */
  float* a = malloc((size_t)count * sizeof(float));
  float* b = malloc((size_t)count * sizeof(float));
  for (int i = 0; i < count; ++i) a[i] = b[i] = (float)((rank + i) % 3);
  double* t = malloc(sizeof(double) * WAYS * (size_t)rounds);
  for (int way = 0; way < WAYS; ++way) call(c, way, a, b, count, n); /* warm-up */
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < WAYS; ++k) {
      const int way = (k + r) % WAYS; /* rotate which way goes first */
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) call(c, way, a, b, count, n);
      const double mine = (MPI_Wtime() - t0) / iters;
      MPI_Allreduce(&mine, &t[way * rounds + r], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
  if (rank == 0) {
    double base = 0;
    printf("%s %lld B, %d ranks, %d x %d calls:", names[c], (long long)count * 4, n, rounds, iters);
    for (int way = 0; way < WAYS; ++way) {
      qsort(&t[way * rounds], (size_t)rounds, sizeof(double), by_value);
      const double med = t[way * rounds + rounds / 2] * 1e6;
      if (way == BLOCKING) base = med;
      printf("  %s %.1f us (%+.1f%%)", kWays[way], med, (med / base - 1) * 100);
    }
    printf("\n");
  }
  free(a);
  free(b);
  free(t);
  MPI_Finalize();
  return 0;
}
