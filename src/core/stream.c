/*
 * stream.c: streams and events as objects (refcounts, names, the list of live streams). What a stream
 * is (a worker thread, a cudaStream_t) is the backend's business, behind tpsh_backend.
 */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BE (tpsh_rt.be)

/* ==== streams ==================================================================================== */
static tpsh_stream *stream_new(int priority, const char *name, int is_default) {
  if (!tpsh_rt.initialized) return tpsh_error_null(TPSH_EINVAL, "tpsh is not initialised");
  if (priority < TPSH_PRIORITY_LOW || priority > TPSH_PRIORITY_HIGH)
    return tpsh_error_null(TPSH_EINVAL, "priority must be low (-1), normal (0) or high (1), got %d", priority);
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
  if (!s || --s->refcount > 0) return;
  if (s->prev) s->prev->next = s->next; else tpsh_rt.streams = s->next;
  if (s->next) s->next->prev = s->prev;
  BE->stream_destroy(s);
  free(s);
}

int tpsh_stream_synchronize(tpsh_stream *s) {
  if (!s) return tpsh_error(TPSH_EINVAL, "expected a stream");
  return BE->stream_synchronize(s);
}

int tpsh_stream_query(tpsh_stream *s) {
  if (!s) return -tpsh_error(TPSH_EINVAL, "expected a stream");
  return BE->stream_query(s);
}

int tpsh_stream_wait_event(tpsh_stream *s, tpsh_event *e) {
  if (!s || !e) return tpsh_error(TPSH_EINVAL, "expected a stream and an event");
  if (!e->recorded) return TPSH_OK;     /* as CUDA: waiting for an unrecorded event is a no-op */
  return BE->stream_wait_event(s, e);
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
uint64_t tpsh_stream_id(const tpsh_stream *s) { return s ? s->id : 0; }

int tpsh_synchronize(void) {
  int rc = TPSH_OK;
  for (tpsh_stream *s = tpsh_rt.streams; s; s = s->next) {
    int r = BE->stream_synchronize(s);
    if (r != TPSH_OK && rc == TPSH_OK) rc = r;
  }
  if (rc == TPSH_OK) tpsh_storage_drain_deferred();
  return rc;
}

/* ==== events ===================================================================================== */
tpsh_event *tpsh_event_create(int timing) {
  if (!tpsh_rt.initialized) return tpsh_error_null(TPSH_EINVAL, "tpsh is not initialised");
  tpsh_event *e = calloc(1, sizeof *e);
  if (!e) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  e->refcount = 1;
  e->timing = timing != 0;
  if (BE->event_create(e) != TPSH_OK) { free(e); return NULL; }
  return e;
}

void tpsh_event_release(tpsh_event *e) {
  if (!e || --e->refcount > 0) return;
  BE->event_destroy(e);
  free(e);
}

int tpsh_event_record(tpsh_event *e, tpsh_stream *s) {
  if (!e || !s) return tpsh_error(TPSH_EINVAL, "expected an event and a stream");
  int rc = BE->event_record(e, s);
  if (rc == TPSH_OK) e->recorded = 1;
  return rc;
}

int tpsh_event_query(tpsh_event *e) {
  if (!e) return -tpsh_error(TPSH_EINVAL, "expected an event");
  if (!e->recorded) return 1;
  return BE->event_query(e);
}

int tpsh_event_synchronize(tpsh_event *e) {
  if (!e) return tpsh_error(TPSH_EINVAL, "expected an event");
  if (!e->recorded) return TPSH_OK;
  return BE->event_synchronize(e);
}

int tpsh_event_elapsed(tpsh_event *a, tpsh_event *b, double *ms) {
  if (!a || !b) return tpsh_error(TPSH_EINVAL, "expected two events");
  if (!a->timing || !b->timing)
    return tpsh_error(TPSH_EINVAL, "both events must be created with timing = true");
  if (!a->recorded || !b->recorded) return tpsh_error(TPSH_EINVAL, "both events must be recorded first");
  return BE->event_elapsed(a, b, ms);
}
