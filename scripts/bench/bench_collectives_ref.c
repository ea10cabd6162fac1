/*
 * bench_collectives_ref.c: the C MPI baseline of scripts/bench_collectives.lua.
 *
 *   mpiexec -n N bench_collectives_ref [--min 1K] [--max 64M] [--ops all_gather,...] [--iters N]
 *                                      [--warmup N] [--csv FILE] [--thread-multiple]
 *
 * The same sweep, sizes, count rounding, iteration counts and timing rule (the slowest rank's mean
 * over back-to-back calls after a barrier) as the Lua benchmark, but calling the blocking MPI
 * collectives directly from main on float buffers: what tpsh's CPU backend is measured against.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_sizes.h"

enum { AG, AR, RS, BC, A2A, SR, NOPS };
static const char *names[NOPS] = {"all_gather", "all_reduce", "reduce_scatter", "broadcast", "all_to_all",
                                  "send_recv"};

static int rank, partner;            /* send_recv: pairs, as the Lua benchmark's (0-1, 2-3, ...) */

static void call(int op, float *a, float *b, long count, int n) {
  switch (op) {
  case SR:
    if (partner >= n) break;
    if (rank % 2 == 0) MPI_Send(a, (int)count, MPI_FLOAT, partner, 7, MPI_COMM_WORLD);
    else MPI_Recv(a, (int)count, MPI_FLOAT, partner, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    break;
  case AG: MPI_Allgather(a, (int)(count / n), MPI_FLOAT, b, (int)(count / n), MPI_FLOAT, MPI_COMM_WORLD); break;
  case AR: MPI_Allreduce(MPI_IN_PLACE, a, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
  case RS: MPI_Reduce_scatter_block(a, b, (int)(count / n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
  case BC: MPI_Bcast(a, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
  case A2A: MPI_Alltoall(a, (int)(count / n), MPI_FLOAT, b, (int)(count / n), MPI_FLOAT, MPI_COMM_WORLD); break;
  }
}

int main(int argc, char **argv) {
  /* --thread-multiple: initialise MPI as tpsh does (its stream workers call MPI), to separate the
   * cost of MPICH's thread safety from tpsh's own. */
  int multiple = 0, provided;
  for (int i = 1; i < argc; i++) multiple |= !strcmp(argv[i], "--thread-multiple");
  if (multiple) MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  else MPI_Init(&argc, &argv);
  int n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  partner = rank % 2 == 0 ? rank + 1 : rank - 1;
  long min = 1L << 10, max = 64L << 20;
  int fixed_iters = 0, warmup = -1;
  const char *csv = NULL, *ops = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--thread-multiple")) { i--; continue; }
    if (!strcmp(argv[i], "--min")) min = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "--max")) max = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "--iters")) fixed_iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--csv")) csv = argv[i + 1];
    else if (!strcmp(argv[i], "--ops")) ops = argv[i + 1];     /* a comma-separated list of names */
  }
  long maxcount = max / 4 + n;
  float *a = malloc((size_t)maxcount * 4), *b = malloc((size_t)maxcount * 4);
  for (long i = 0; i < maxcount; i++) a[i] = b[i] = 1.0f;
  FILE *out = NULL;
  if (rank == 0) {
    if (csv) out = fopen(csv, "w");
    if (out) fprintf(out, "collective,bytes,count,iters,time_us,algbw_GBps,busbw_GBps\n");
    printf("# C MPI reference (blocking calls from main%s), %d ranks, float\n",
           multiple ? ", MPI_THREAD_MULTIPLE" : "", n);
    printf("%-15s %12s %12s %7s %12s %10s %10s\n", "collective", "size (B)", "count", "iters", "time (us)",
           "algbw GB/s", "busbw GB/s");
  }
  double factor[NOPS] = {(n - 1.0) / n, 2.0 * (n - 1) / n, (n - 1.0) / n, 1.0, (n - 1.0) / n, 1.0};
  for (int op = 0; op < NOPS; op++) {
    if (ops ? !strstr(ops, names[op]) : op == SR) continue;     /* send_recv only when asked for */
    for (long bytes = min; bytes <= max; bytes *= 2) {
      long count = bytes / 4 < 1 ? 1 : bytes / 4;
      if (op == AG || op == RS || op == A2A) { count -= count % n; if (count < n) count = n; }
      long size = count * 4;
      for (int i = 0; i < warmup_for(size, warmup); i++) call(op, a, b, count, n);
      MPI_Barrier(MPI_COMM_WORLD);
      int iters = iters_for(size, fixed_iters);
      double t0 = MPI_Wtime();
      for (int i = 0; i < iters; i++) call(op, a, b, count, n);
      double ms = (MPI_Wtime() - t0) * 1e3 / iters, worst;
      MPI_Allreduce(&ms, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double algbw = (double)size / (worst * 1e-3) / 1e9;
      if (rank == 0) {
        printf("%-15s %12ld %12ld %7d %12.1f %10.3f %10.3f\n", names[op], size, count, iters, worst * 1e3, algbw,
               algbw * factor[op]);
        if (out) fprintf(out, "%s,%ld,%ld,%d,%.3f,%.4f,%.4f\n", names[op], size, count, iters, worst * 1e3, algbw,
                         algbw * factor[op]);
      }
    }
  }
  if (out) fclose(out);
  free(a);
  free(b);
  MPI_Finalize();
  return 0;
}
