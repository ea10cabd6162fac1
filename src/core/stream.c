/*
 * stream.c: streams and events as objects (refcounts, names, the list of live streams). What a stream
 * is (a worker thread, a cudaStream_t) is the backend's business, behind tpsh_backend.
 */
#include "core/backend.h"
#include "core/chaos.h"
#include "core/internal.h"
#include "core/alloc.h"
#include "core/check.h"
#include "core/host_ending.h"
#include "core/stream.h"
#include "core/trace.h"
#include "core/work.h"
#include "core/graph.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BE (tpsh_rt.be)

/* ==== streams ==================================================================================== */
static tpsh_stream *stream_new(int priority, const char *name, int is_default) {
  if (!tpsh_rt.initialized) return tpsh_error_null(TPSH_EINVAL, "tpsh is not initialised");
  if (priority < TPSH_PRIORITY_LOW || priority > TPSH_PRIORITY_HIGH)
    return tpsh_error_null(TPSH_EINVAL, "priority must be low (-1), normal (0) or high (1), got %d", priority);
  /* Refused rather than cut: a name cut short may end inside a UTF-8 character (and two long names
   * would no longer be told apart in a trace). */
  if (name && strlen(name) >= sizeof ((tpsh_stream *)0)->name)
    return tpsh_error_null(TPSH_EINVAL, "name must be at most %d bytes, got %zu", TPSH_STREAM_NAME_MAX, strlen(name));
  tpsh_stream *s = calloc(1, sizeof *s);
  if (!s) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  s->refcount = 1;
  s->priority = priority;
  s->is_default = is_default;
  s->id = tpsh_rt.next_stream_id++;
  if (name && *name) snprintf(s->name, sizeof s->name, "%s", name);
  else snprintf(s->name, sizeof s->name, is_default ? "default" : "stream%llu", (unsigned long long)s->id);
  if (BE->stream_create(s) != TPSH_OK) { free(s); return NULL; }
  s->next = tpsh_rt.streams;
  if (tpsh_rt.streams) tpsh_rt.streams->prev = s;
  tpsh_rt.streams = s;
  return s;
}

tpsh_stream *tpsh_stream_create(int priority, const char *name) { return stream_new(priority, name, 0); }

tpsh_stream *tpsh_stream_create_default(void) { return stream_new(TPSH_PRIORITY_NORMAL, "default", 1); }

tpsh_stream *tpsh_default_stream(void) {
  if (!tpsh_rt.default_stream) return tpsh_error_null(TPSH_EINVAL, "tpsh is not initialised");
  tpsh_stream_retain(tpsh_rt.default_stream);
  return tpsh_rt.default_stream;
}

void tpsh_stream_retain(tpsh_stream *s) { if (s) s->refcount++; }

void tpsh_stream_release(tpsh_stream *s) {
  if (!s) return;
  if (--s->refcount > 0) {
    /* the caching allocator's lane is the last holder of a finished stream: let it go now */
    if (s->cache_lane && tpsh_stream_unreachable(s)) tpsh_alloc_stream_unreachable(s);
    return;
  }
  if (__builtin_expect(tpsh_graph_capturing, 0)) {   /* destroyed once the capture ends (graph.c) */
    s->refcount = 1;
    tpsh_graph_defer_stream(s);
    return;
  }
  if (s->prev) s->prev->next = s->next; else tpsh_rt.streams = s->next;
  if (s->next) s->next->prev = s->prev;
  if (tpsh_check_on) tpsh_check_stream_destroy(s);   /* sanitizer: its slot can go to a later stream */
  BE->stream_destroy(s);
  free(s);
}

/* Passive references (internal.h). Why: a storage keeps the streams that used it until it dies (its
 * free waits for them), and a Work lane keeps its stream until its Works are known complete; a long-lived
 * tensor, or a Work dropped unwaited, used on many short-lived streams kept every one of them alive (a
 * worker thread each on the CPU backend: ten thousand streams, ten thousand threads). */
void tpsh_stream_hold(tpsh_stream *s) {
  if (!s) return;
  s->refcount++;
  s->passive_refs++;
}

void tpsh_stream_unhold(tpsh_stream *s) {
  if (!s) return;
  s->passive_refs--;
  tpsh_stream_release(s);
}

int tpsh_stream_abandoned(tpsh_stream *s) {
  if (!tpsh_stream_unreachable(s)) return 0;
  return BE->stream_query(s);     /* not tpsh_stream_query: the host did not look, it learns no order */
}

/* ==== interrupting host waits (tpsh.h) =============================================================== */
static atomic_int interrupt_flag;
int tpsh_interrupt_polled;

static int polled_for_repl, polled_for_ending;    /* host thread only */

void tpsh_interrupt(int on) { atomic_store(&interrupt_flag, on != 0); }
void tpsh_interruptible(int on) {
  polled_for_repl = on != 0;
  tpsh_interrupt_polled = polled_for_repl || polled_for_ending;
}
void tpsh_interrupt_poll_for_ending(void) {
  polled_for_ending = 1;
  tpsh_interrupt_polled = 1;
}

TPSH_COLD static int interrupted(void) {
  return tpsh_error(TPSH_EINTR, "interrupted while the host waited for a stream (the work enqueued there goes on)");
}
int tpsh_interrupt_check(void) {
  if (__builtin_expect(atomic_load_explicit(&interrupt_flag, memory_order_relaxed), 0)) return interrupted();
  return __builtin_expect(tpsh_host_ending_asked(), 0) ? tpsh_host_ending_gave_way("a host wait for a stream") : 0;
}

int tpsh_stream_synchronize(tpsh_stream *s) {
  if (!s) return tpsh_error(TPSH_EINVAL, "expected a stream");
  if (tpsh_graph_capturing) return tpsh_graph_refuse("waits on the host");
  double t0 = tpsh_trace_on ? tpsh_now_ms() : 0;      /* host blocks are traced */
  if (tpsh_check_on) tpsh_check_host_join_stream(s);   /* sanitizer: the host is ordered after s */
  tpsh_watch_wait_begin_on("stream:synchronize", s);
  int rc = BE->stream_synchronize(s);
  tpsh_watch_wait_end();
  if (rc == TPSH_OK && !BE->marks_collectives) tpsh_flight_settle(s);
  /* Completed Works let their tensors go; memory freed on s is work on s, waited for too. */
  if (rc == TPSH_OK && tpsh_work_stream_done(s) > 0) rc = BE->stream_synchronize(s);
  if (tpsh_trace_on) tpsh_trace_host("stream_synchronize", s, t0);
  return tpsh_async_error_settle(rc);
}

/* A query's answer (1 done, 0 pending, -status), with an asynchronous error noted earlier as its status. */
int tpsh_query_settle(int r) {
  int rc = tpsh_async_error_settle(r < 0 ? -r : TPSH_OK);
  return rc ? -rc : r;
}

int tpsh_stream_query(tpsh_stream *s) {
  if (!s) return -tpsh_error(TPSH_EINVAL, "expected a stream");
  if (tpsh_graph_capturing) return -tpsh_graph_refuse("asks the host whether work has finished");
  int r = BE->stream_query(s);
  if (tpsh_check_on && r == 1) tpsh_check_host_join_stream(s);   /* "done" orders the host after s */
  return tpsh_query_settle(r);
}

int tpsh_stream_wait_event(tpsh_stream *s, tpsh_event *e) {
  if (!s || !e) return tpsh_error(TPSH_EINVAL, "expected a stream and an event");
  int rc = TPSH_OK;                     /* as CUDA: waiting for an unrecorded event is a no-op */
  if (e->recorded) {
    if (__builtin_expect(tpsh_graph_capturing, 0)) return tpsh_graph_wait_event(s, e);   /* tp.graph */
    if ((rc = tpsh_graph_event_usable(e, "waits for")) != TPSH_OK) return rc;
    if (tpsh_check_on) tpsh_check_stream_wait_event(s, e);   /* sanitizer: s joins the event's clock */
    if (tpsh_chaos_on) tpsh_chaos_note_wait(s, e);            /* chaos mode: what s is ordered after */
    /* traced: a span, how long s stalled */
    rc = tpsh_trace_on ? tpsh_trace_wait_event(s, e) : BE->stream_wait_event(s, e);
  }
  return tpsh_async_error_settle(rc);
}

int tpsh_stream_wait_stream(tpsh_stream *s, tpsh_stream *other) {
  if (!s || !other) return tpsh_error(TPSH_EINVAL, "expected two streams");
  if (s == other) return TPSH_OK;
  tpsh_event *e = tpsh_event_create(0);
  if (!e) return TPSH_ENOMEM;
  int rc = tpsh_event_record(e, other);
  if (rc == TPSH_OK) rc = tpsh_stream_wait_event(s, e);
  tpsh_event_release(e);
  return rc;
}

const char *tpsh_stream_name(const tpsh_stream *s) { return s ? s->name : ""; }
int tpsh_stream_priority(const tpsh_stream *s) { return s ? s->priority : 0; }
TPSH_HOT uint64_t tpsh_stream_id(const tpsh_stream *s) { return s ? s->id : 0; }
void *tpsh_stream_handle(tpsh_stream *s) {
  return s && tpsh_rt.be->stream_handle ? tpsh_rt.be->stream_handle(s) : NULL;
}

/* Every stream of this rank, through the backend (no trace, no sanitizer join): the first error, after
 * waiting for all of them. */
static int synchronize_each(void) {
  int rc = TPSH_OK;
  for (tpsh_stream *s = tpsh_rt.streams; s; s = s->next) {
    int r = BE->stream_synchronize(s);
    if (r != TPSH_OK && rc == TPSH_OK) rc = r;
  }
  return rc;
}

int tpsh_streams_wait_idle(const char *why) {
  tpsh_watch_wait_begin_on(why, TPSH_WAIT_ALL_STREAMS);
  int rc = synchronize_each();
  tpsh_watch_wait_end();
  return rc;
}

int tpsh_stream_count(void) {
  int n = 0;
  for (tpsh_stream *s = tpsh_rt.streams; s; s = s->next) n++;
  return n;
}

int tpsh_synchronize(void) {
  if (tpsh_graph_capturing) return tpsh_graph_refuse("waits on the host");
  double t0 = tpsh_trace_on ? tpsh_now_ms() : 0;
  if (tpsh_check_on) tpsh_check_host_join_all();     /* sanitizer: the host is ordered after every stream */
  tpsh_watch_wait_begin_on("tp.synchronize", TPSH_WAIT_ALL_STREAMS);
  int rc = synchronize_each();
  if (rc == TPSH_OK && !BE->marks_collectives) tpsh_flight_settle(NULL);
  /* Completed Works let their tensors go, and parked frees become due: both enqueue work (the frees,
   * events on the streams that used the memory), waited for too, so that every stream is idle on
   * return. That wait completes no Work, so one more pass is the last. */
  if (rc == TPSH_OK) {
    int released = tpsh_work_all_done();               /* first: it may park more frees */
    if (tpsh_storage_drain_deferred() + released > 0) rc = synchronize_each();
    if (rc == TPSH_OK) tpsh_alloc_tidy();            /* finished streams the cache held go */
  }
  tpsh_watch_wait_end();
  if (tpsh_trace_on) tpsh_trace_host("synchronize", NULL, t0);
  return tpsh_async_error_settle(rc);
}

/* ==== events ===================================================================================== */
/* Released events are kept for reuse, per timing flag: every collective's Work takes two timing events,
 * and creating and destroying a CUDA event costs microseconds, as much as a small collective itself.
 * Only the host thread creates and releases events. */
enum { EVENT_POOL_MAX = 4096 };   /* enough for a loop of small collectives between two GC cycles */
static tpsh_event *event_pool[2][EVENT_POOL_MAX];
static int event_pool_n[2];

tpsh_event *tpsh_event_create(int timing) {
  if (!tpsh_rt.initialized) return tpsh_error_null(TPSH_EINVAL, "tpsh is not initialised");
  timing = timing != 0;
  if (event_pool_n[timing] > 0) {
    tpsh_event *e = event_pool[timing][--event_pool_n[timing]];
    e->refcount = 1;
    e->recorded = 0;
    e->captured = 0;
    return e;
  }
  tpsh_event *e = calloc(1, sizeof *e);
  if (!e) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  e->refcount = 1;
  e->timing = timing;
  if (BE->event_create(e) != TPSH_OK) { free(e); return NULL; }
  return e;
}

void tpsh_event_release(tpsh_event *e) {
  if (!e || --e->refcount > 0) return;
  TPSH_CHECK_EVENT_RELEASE(e);                        /* the sanitizer forgets the event's clock */
  if (event_pool_n[e->timing] < EVENT_POOL_MAX) {
    event_pool[e->timing][event_pool_n[e->timing]++] = e;
    return;
  }
  BE->event_destroy(e);
  free(e);
}

/* At shut-down, before the backend goes. */
void tpsh_event_pool_drain(void) {
  for (int t = 0; t < 2; t++)
    while (event_pool_n[t] > 0) {
      tpsh_event *e = event_pool[t][--event_pool_n[t]];
      BE->event_destroy(e);
      free(e);
    }
}

TPSH_HOT int tpsh_event_record(tpsh_event *e, tpsh_stream *s) {
  if (!e || !s) return tpsh_error(TPSH_EINVAL, "expected an event and a stream");
  if (__builtin_expect(tpsh_graph_capturing, 0)) return tpsh_graph_event_record(e, s);   /* tp.graph */
  int rc = BE->event_record(e, s);
  if (rc == TPSH_OK) { e->recorded = 1; e->captured = 0; }
  if (rc == TPSH_OK && tpsh_check_on) tpsh_check_event_record(e, s);   /* sanitizer: e keeps s's clock */
  if (tpsh_chaos_on) tpsh_chaos_note_record(e, s);
  return rc;
}

int tpsh_event_query(tpsh_event *e) {
  if (!e) return -tpsh_error(TPSH_EINVAL, "expected an event");
  if (tpsh_graph_capturing) return -tpsh_graph_refuse("asks the host whether work has finished");
  if (!e->recorded) return tpsh_query_settle(1);
  int usable = tpsh_graph_event_usable(e, "asks about");
  if (usable) return -usable;
  int r = BE->event_query(e);
  if (tpsh_check_on && r == 1) tpsh_check_host_join_event(e);   /* "done" orders the host after e */
  return tpsh_query_settle(r);
}

int tpsh_event_synchronize(tpsh_event *e) {
  if (!e) return tpsh_error(TPSH_EINVAL, "expected an event");
  if (tpsh_graph_capturing) return tpsh_graph_refuse("waits on the host");
  if (!e->recorded) return tpsh_async_error_settle(TPSH_OK);
  int usable = tpsh_graph_event_usable(e, "waits on the host for");
  if (usable) return usable;
  double t0 = tpsh_trace_on ? tpsh_now_ms() : 0;
  if (tpsh_check_on) tpsh_check_host_join_event(e);   /* sanitizer: the host is ordered after e */
  tpsh_watch_wait_begin("event:synchronize (or w:block())");
  int rc = BE->event_synchronize(e);
  tpsh_watch_wait_end();
  if (tpsh_trace_on) tpsh_trace_host("event_synchronize", NULL, t0);
  return tpsh_async_error_settle(rc);
}

int tpsh_event_elapsed(tpsh_event *a, tpsh_event *b, double *ms) {
  if (!a || !b) return tpsh_error(TPSH_EINVAL, "expected two events");
  if (!a->timing || !b->timing)
    return tpsh_error(TPSH_EINVAL, "both events must be created with timing = true");
  if (!a->recorded || !b->recorded) return tpsh_error(TPSH_EINVAL, "both events must be recorded first");
  if (tpsh_graph_capturing) return tpsh_graph_refuse("reads event times on the host");
  int usable = tpsh_graph_event_usable(a, "reads the time of");
  if (!usable) usable = tpsh_graph_event_usable(b, "reads the time of");
  if (usable) return usable;
  return BE->event_elapsed(a, b, ms);
}
