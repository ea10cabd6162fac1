/*
 * cuda_stream.c: tpsh streams and events as CUDA streams and events.
 *
 * Every tpsh stream, the default one included, is a created non-blocking stream: the legacy stream 0
 * synchronises with every blocking stream of the device, which would serialise exactly the overlap
 * that tpsh exists to study. Priorities map tpsh's three levels onto the device's range (on Hopper
 * [0, -5]): low = the least priority, high = the greatest, normal = the middle, so that each level
 * really differs from the others (normal = CUDA's default 0 would make it equal to low).
 *
 * Host waits (stream and event synchronize) block in the driver as long as no NCCL communicator
 * exists. With communicators they poll instead, and ask NCCL for asynchronous errors while waiting: a
 * collective whose peer died never completes, so a blocking wait would hang the rank forever, while a
 * polled one aborts the communicator and returns the error to Lua (cuda_nccl.c).
 */
#define _GNU_SOURCE
#include "backend/cuda/cuda_backend.h"
#include <sched.h>
#include <stdlib.h>

/* ==== waiting ==================================================================================== */
/* A stream or an event, as far as a host wait is concerned. */
typedef struct waitable {
  cudaError_t (*query)(void *);
  cudaError_t (*block)(void *);
  const char *block_name;
} waitable;

static cudaError_t query_stream(void *s) { return cudaStreamQuery((cudaStream_t)s); }
static cudaError_t block_stream(void *s) { return cudaStreamSynchronize((cudaStream_t)s); }
static cudaError_t query_event(void *e) { return cudaEventQuery((cudaEvent_t)e); }
static cudaError_t block_event(void *e) { return cudaEventSynchronize((cudaEvent_t)e); }
static const waitable stream_w = {query_stream, block_stream, "cudaStreamSynchronize"};
static const waitable event_w = {query_event, block_event, "cudaEventSynchronize"};

/* Blocks in the driver, or with communicators alive (or in the REPL, which may interrupt the wait)
 * polls until query() stops answering cudaErrorNotReady, checking NCCL and the interrupt every
 * millisecond. The first 50 us spin (short waits, as in timing
 * loops, return with the latency of a blocking sync); after that each round yields the core to the
 * other ranks and stream workers of this host. */
static int host_wait(const waitable *w, void *obj) {
  if (!tpsh_cuda_nccl_active() && !tpsh_interrupt_polled) {
    cudaError_t e = w->block(obj);
    return e == cudaSuccess ? TPSH_OK : tpsh_cuda_fail(e, w->block_name);
  }
  double start = tpsh_now_ms(), next_check = start + 1.0;
  for (;;) {
    cudaError_t e = w->query(obj);
    if (e == cudaSuccess) return TPSH_OK;
    if (e != cudaErrorNotReady) return tpsh_cuda_fail(e, w->block_name);
    double t = tpsh_now_ms();
    if (t >= next_check) {
      next_check = t + 1.0;
      int rc = tpsh_cuda_nccl_active() ? tpsh_cuda_nccl_poll() : TPSH_OK;
      if (!rc) rc = tpsh_interrupt_check();          /* the REPL's Ctrl-C (tpsh_interruptible) */
      if (rc) return rc;
    }
    if (t - start > 0.05) sched_yield();
  }
}

/* A non-blocking query's answer: 1 done, 0 pending (or -status on an error, NCCL's included). */
static int query_answer(cudaError_t e, const char *call) {
  if (e == cudaSuccess) return 1;
  if (e != cudaErrorNotReady) return -tpsh_cuda_fail(e, call);
  (void)cudaGetLastError();
  int rc = tpsh_cuda_nccl_active() ? tpsh_cuda_nccl_poll() : TPSH_OK;
  return rc ? -rc : 0;
}

/* ==== streams ==================================================================================== */
int tpsh_cuda_stream_create(tpsh_stream *s) {
  int least = 0, greatest = 0;
  CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  /* numerically lower is higher priority: greatest <= least */
  int prio = s->priority > 0 ? greatest : s->priority < 0 ? least : (least + greatest) / 2;
  cuda_stream *cs = calloc(1, sizeof *cs);
  if (!cs) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  cudaError_t e = cudaStreamCreateWithPriority(&cs->stream, cudaStreamNonBlocking, prio);
  if (e != cudaSuccess) {
    free(cs);
    return tpsh_cuda_fail(e, "cudaStreamCreateWithPriority");
  }
  s->impl = cs;
  return TPSH_OK;
}

void tpsh_cuda_stream_destroy(tpsh_stream *s) {
  /* cudaStreamDestroy returns at once and the driver releases the stream when its work is done: like
   * the CPU backend, dropping a stream never blocks the host. */
  cuda_stream *cs = s->impl;
  if (!cs) return;
  tpsh_cuda_blas_release(cs);
  if (cudaStreamDestroy(cs->stream) != cudaSuccess) (void)cudaGetLastError();
  free(cs);
  s->impl = NULL;
}

int tpsh_cuda_stream_synchronize(tpsh_stream *s) {
  cuda_stream *cs = s->impl;
  uint64_t marks = cs->marks;
  int rc = host_wait(&stream_w, cs->stream);
  if (rc == TPSH_OK) cs->passed = marks;
  return rc;
}

/* Points for the caching allocator: numbered marks, all passed once the stream is seen idle (a query
 * costs a driver call, so an answer once known is kept). Not recorded events: a free would pay an
 * event record, and the question is asked only when another stream wants a block this one freed. */
uint64_t tpsh_cuda_stream_mark(tpsh_stream *s) { return ++((cuda_stream *)s->impl)->marks; }

int tpsh_cuda_stream_passed(tpsh_stream *s, uint64_t mark) {
  cuda_stream *cs = s->impl;
  if (mark <= cs->passed) return 1;
  uint64_t marks = cs->marks;
  cudaError_t e = cudaStreamQuery(cs->stream);
  if (e == cudaSuccess) { cs->passed = marks; return 1; }
  if (e == cudaErrorNotReady) (void)cudaGetLastError();
  return 0;      /* an error stays for the stream's next wait to report */
}

int tpsh_cuda_stream_query(tpsh_stream *s) {
  return query_answer(cudaStreamQuery(tpsh_cuda_stream(s)), "cudaStreamQuery");
}

/* ==== events ===================================================================================== */
int tpsh_cuda_event_create(tpsh_event *e) {
  cudaEvent_t ev;
  /* Timing costs a timestamp write at record; events that only order streams skip it. */
  CUDA_TRY(cudaEventCreateWithFlags(&ev, e->timing ? cudaEventDefault : cudaEventDisableTiming));
  e->impl = ev;
  return TPSH_OK;
}

void tpsh_cuda_event_destroy(tpsh_event *e) {
  if (e->impl && cudaEventDestroy((cudaEvent_t)e->impl) != cudaSuccess) (void)cudaGetLastError();
  e->impl = NULL;
}

/* Event records go to the driver's cuEventRecord directly (tpsh_cuda_driver_fn): every collective's
 * Work records one, and the runtime's wrapper costs about 0.1 us of host time a record on the GPU
 * machine (docs/perf.md, diag_host_cost), a percent of a small collective. Should the driver call fail,
 * the runtime call is made again, so that the error and its message are the runtime's. The host thread
 * made the device's primary context current at start-up (cudaSetDevice), which is the context of every
 * tpsh event and stream. */
typedef int (*cu_event_record_fn)(cudaEvent_t, cudaStream_t);
static cu_event_record_fn cu_event_record;
static int cu_event_record_looked_up;

static cu_event_record_fn driver_event_record(void) {
  if (!cu_event_record_looked_up) {
    cu_event_record_looked_up = 1;
    cu_event_record = (cu_event_record_fn)tpsh_cuda_driver_fn("cuEventRecord");
  }
  return cu_event_record;
}

TPSH_HOT int tpsh_cuda_event_record(tpsh_event *e, tpsh_stream *s) {
  cu_event_record_fn rec = driver_event_record();
  if (rec && rec((cudaEvent_t)e->impl, tpsh_cuda_stream(s)) == 0) return TPSH_OK;
  CUDA_TRY(cudaEventRecord((cudaEvent_t)e->impl, tpsh_cuda_stream(s)));
  return TPSH_OK;
}

int tpsh_cuda_stream_wait_event(tpsh_stream *s, tpsh_event *e) {
  CUDA_TRY(cudaStreamWaitEvent(tpsh_cuda_stream(s), (cudaEvent_t)e->impl, 0));
  return TPSH_OK;
}

int tpsh_cuda_event_query(tpsh_event *e) {
  return query_answer(cudaEventQuery((cudaEvent_t)e->impl), "cudaEventQuery");
}

int tpsh_cuda_event_synchronize(tpsh_event *e) { return host_wait(&event_w, e->impl); }

int tpsh_cuda_event_wait_host(cudaEvent_t ev) { return host_wait(&event_w, ev); }

int tpsh_cuda_event_elapsed(tpsh_event *a, tpsh_event *b, double *ms) {
  float f = 0;
  cudaError_t e = cudaEventElapsedTime(&f, (cudaEvent_t)a->impl, (cudaEvent_t)b->impl);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return tpsh_error(TPSH_EINVAL, "the events have not completed yet (synchronize first)");
  }
  if (e != cudaSuccess) return tpsh_cuda_fail(e, "cudaEventElapsedTime");
  *ms = f;
  return TPSH_OK;
}
