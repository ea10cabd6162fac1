/*
 * bench_collectives_ref.c: the C MPI baseline of scripts/bench_collectives.lua.
 *
 *   mpiexec -n N bench_collectives_ref [--min 1K] [--max 64M] [--ops all_gather,...] [--iters N]
 *                                      [--warmup N] [--csv FILE] [--thread-multiple] [--worker]
 *                                      [--tpsh-buffers]
 *
 * The same sweep, sizes, count rounding, iteration counts and timing rule (the slowest rank's mean
 * over back-to-back calls after a barrier) as the Lua benchmark, but calling the blocking MPI
 * collectives directly from main on float buffers: what tpsh's CPU backend is measured against.
 *
 * The three options put the C loop, one at a time, in the conditions tpsh's CPU backend runs MPI in,
 * so that a gap between tpsh and C can be split into what each condition costs (bench_collectives.sh
 * -V): MPI_THREAD_MULTIPLE; the calls made by a second thread while main sleeps in a join (a stream's
 * worker, the host thread waiting); each size's buffers allocated as cpu_alloc does (64-byte aligned,
 * 2 MiB aligned with MADV_HUGEPAGE from 2 MiB) and first written by the calling thread, instead of two
 * malloc'd buffers for every size. tpsh makes the same MPI calls on the same counts, types and ops
 * (in place where this loop is), so what is left beyond the three is tpsh's own.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_sizes.h"
#include "mpi_ref_loop.h"

static int rank;

static void call(int op, float *a, float *b, long count, int n) { mpi_ref_call(op, a, b, count, MPI_COMM_WORLD, rank, n); }

/* cpu_alloc's placement (src/backend/cpu/cpu_stream.c), for --tpsh-buffers. */
enum { HUGE_PAGE = 2 << 20 };
static float *tpsh_like_alloc(size_t nbytes) {
  void *p = NULL;
  int huge = nbytes >= HUGE_PAGE;
  if (posix_memalign(&p, huge ? HUGE_PAGE : 64, nbytes) != 0) return NULL;
  if (huge) madvise(p, nbytes / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);
  return p;
}

static struct {
  int n, fixed_iters, warmup, tpsh_buffers;
  long min, max;
  const char *csv, *ops;
} cfg;

static void *sweep(void *unused) {
  (void)unused;
  int n = cfg.n;
  long maxcount = cfg.max / 4 + n;
  float *a = NULL, *b = NULL;
  if (!cfg.tpsh_buffers) {
    a = malloc((size_t)maxcount * 4), b = malloc((size_t)maxcount * 4);
    for (long i = 0; i < maxcount; i++) a[i] = b[i] = 1.0f;
  }
  FILE *out = NULL;
  if (rank == 0 && cfg.csv) out = fopen(cfg.csv, "w");
  if (out) fprintf(out, "collective,bytes,count,iters,time_us,algbw_GBps,busbw_GBps\n");
  double factor[MPI_REF_NOPS] = {(n - 1.0) / n, 2.0 * (n - 1) / n, (n - 1.0) / n, 1.0, (n - 1.0) / n, 1.0};
  for (int op = 0; op < MPI_REF_NOPS; op++) {
    if (cfg.ops ? !strstr(cfg.ops, mpi_ref_names[op]) : op == MPI_REF_SR) continue;     /* send_recv only when asked for */
    for (long bytes = cfg.min; bytes <= cfg.max; bytes *= 2) {
      long count = bytes / 4 < 1 ? 1 : bytes / 4;
      if (op == MPI_REF_AG || op == MPI_REF_RS || op == MPI_REF_A2A) { count -= count % n; if (count < n) count = n; }
      long size = count * 4;
      if (cfg.tpsh_buffers) {      /* as bench_collectives.lua's tensors: the input and the output */
        long in = op == MPI_REF_AG ? count / n : count, outc = op == MPI_REF_RS ? count / n : count;
        a = tpsh_like_alloc((size_t)in * 4), b = tpsh_like_alloc((size_t)outc * 4);
        if (!a || !b) { fprintf(stderr, "bench_collectives_ref: out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
        for (long i = 0; i < in; i++) a[i] = 1.0f;
        if (op == MPI_REF_AR) memset(a, 0, (size_t)in * 4);       /* tp.zeros, as the Lua benchmark's */
      }
      int iters = iters_for(size, cfg.fixed_iters);
      if (bytes == cfg.min)            /* the first size: one untimed loop first, as bench_collectives.lua */
        for (int i = 0; i < iters; i++) call(op, a, b, count, n);
      for (int i = 0; i < warmup_for(size, cfg.warmup); i++) call(op, a, b, count, n);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < iters; i++) call(op, a, b, count, n);
      double ms = (MPI_Wtime() - t0) * 1e3 / iters, worst;
      MPI_Allreduce(&ms, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double algbw = (double)size / (worst * 1e-3) / 1e9;
      if (rank == 0) {
        printf("%-15s %12ld %12ld %7d %12.1f %10.3f %10.3f\n", mpi_ref_names[op], size, count, iters, worst * 1e3, algbw,
               algbw * factor[op]);
        if (out) fprintf(out, "%s,%ld,%ld,%d,%.3f,%.4f,%.4f\n", mpi_ref_names[op], size, count, iters, worst * 1e3, algbw,
                         algbw * factor[op]);
      }
      if (cfg.tpsh_buffers) { free(a); free(b); }
    }
  }
  if (out) fclose(out);
  if (!cfg.tpsh_buffers) { free(a); free(b); }
  return NULL;
}

int main(int argc, char **argv) {
  int multiple = 0, worker = 0, provided;
  for (int i = 1; i < argc; i++) {
    multiple |= !strcmp(argv[i], "--thread-multiple");
    worker |= !strcmp(argv[i], "--worker");
    cfg.tpsh_buffers |= !strcmp(argv[i], "--tpsh-buffers");
  }
  if (multiple || worker) MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  else MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &cfg.n);
  cfg.min = 1L << 10, cfg.max = 64L << 20, cfg.warmup = -1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--thread-multiple") || !strcmp(argv[i], "--worker") ||
        !strcmp(argv[i], "--tpsh-buffers") || i + 1 >= argc) continue;
    if (!strcmp(argv[i], "--min")) cfg.min = parse_size(argv[++i]);
    else if (!strcmp(argv[i], "--max")) cfg.max = parse_size(argv[++i]);
    else if (!strcmp(argv[i], "--iters")) cfg.fixed_iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup")) cfg.warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv")) cfg.csv = argv[++i];
    else if (!strcmp(argv[i], "--ops")) cfg.ops = argv[++i];     /* a comma-separated list of names */
  }
  if (rank == 0) {
    printf("# C MPI reference (blocking calls from %s%s%s), %d ranks, float\n", worker ? "a second thread" : "main",
           multiple || worker ? ", MPI_THREAD_MULTIPLE" : "", cfg.tpsh_buffers ? ", buffers as tpsh's" : "", cfg.n);
    printf("%-15s %12s %12s %7s %12s %10s %10s\n", "collective", "size (B)", "count", "iters", "time (us)",
           "algbw GB/s", "busbw GB/s");
  }
  if (worker) {
    pthread_t t;
    if (pthread_create(&t, NULL, sweep, NULL) != 0) { fprintf(stderr, "bench_collectives_ref: no thread\n"); return 1; }
    pthread_join(t, NULL);
  } else {
    sweep(NULL);
  }
  MPI_Finalize();
  return 0;
}
