/*
 * bench_overhead_ref.c: the C side of scripts/bench_overhead.lua. The same three loops, through the
 * same C API, timed the same way (host time of the enqueue loop, streams synchronised every CHUNK ops
 * outside the timed region, median of 5), so the ratio isolates what the Lua layer costs.
 *   bench_overhead_ref [iters] [--backend cpu|cuda]
 */
#include "tpsh.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CHUNK = 1000, REPEATS = 5 };

static tpsh_tensor *x, *y;
static tpsh_stream *cur, *side;
static tpsh_event *ev;

static void add_inplace(void) { tpsh_add(cur, x, x, y, 1.0); }
static void add_alloc(void) {
  tpsh_tensor *out = tpsh_tensor_empty(x->ndim, x->sizes, x->dtype_id, cur);
  tpsh_add(cur, out, x, y, 1.0);
  tpsh_tensor_release(out);
}
static void record_wait(void) { tpsh_event_record(ev, cur); tpsh_stream_wait_event(side, ev); }

static double run(void (*fn)(void), long n_total) {
  double total = 0;
  for (long done = 0; done < n_total;) {
    long n = n_total - done < CHUNK ? n_total - done : CHUNK;
    tpsh_synchronize();
    double t0 = tpsh_now_ms();
    for (long i = 0; i < n; i++) fn();
    total += tpsh_now_ms() - t0;
    done += n;
  }
  tpsh_synchronize();
  return total * 1000.0 / (double)n_total;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  long n = 200000;
  const char *backend = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[++i];
    else n = atol(argv[i]);
  }
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (tpsh_init(backend, -1) != TPSH_OK) { fprintf(stderr, "%s\n", tpsh_last_error()); return 1; }
  int64_t shape[1] = {16};
  cur = tpsh_default_stream();
  side = tpsh_stream_create(0, "side");
  ev = tpsh_event_create(0);
  x = tpsh_tensor_empty(1, shape, TPSH_F32, cur);
  y = tpsh_tensor_empty(1, shape, TPSH_F32, cur);
  tpsh_fill(cur, x, 1);
  tpsh_fill(cur, y, 1);
  struct { const char *name; void (*fn)(void); } cases[] = {
    {"add_ (in place)", add_inplace}, {"a + b (allocates)", add_alloc}, {"event record + stream wait", record_wait}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    run(cases[c].fn, n);
    double s[REPEATS];
    for (int r = 0; r < REPEATS; r++) s[r] = run(cases[c].fn, n);
    qsort(s, REPEATS, sizeof s[0], cmp);
    if (tpsh_rank() == 0) printf("c    %-28s %8.3f us/op\n", cases[c].name, s[REPEATS / 2]);
  }
  tpsh_tensor_release(x);
  tpsh_tensor_release(y);
  tpsh_event_release(ev);
  tpsh_stream_release(side);
  tpsh_stream_release(cur);
  tpsh_shutdown();
  MPI_Finalize();
  return 0;
}
