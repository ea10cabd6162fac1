/*
 * trace.c: what tp.trace records, backend-neutral.
 *
 * Every op reaches the backend through tpsh_launch (kernels) or the collectives' dispatch point, and
 * every cross-stream wait and host block through stream.c / tpsh_to_host; when tracing is on, those
 * paths call in here. A device op is bracketed by two timing events recorded on its stream through the
 * backend's vtable, so the same code works on the CPU backend (markers stamped by the worker's
 * CLOCK_MONOTONIC) and on CUDA (cudaEventRecord), without reading the device clock on the hot path.
 * Events are turned into times only when somebody asks (tpsh_trace_resolve: at summary, save, or
 * after each variant of tp.compare): op time = ref_host + elapsed(ref, event), where ref is an event
 * recorded on the default stream at start while the host noted its own clock. Host blocks are spans
 * on the host clock, taken at once, and so are named spans of the script's time (tp.trace.span, and
 * each variant of tp.compare: its warm-up and its timed iterations) and the script's ranges (tp.range:
 * range.c), which the timelines draw on tracks of their own and the statistics leave out.
 *
 * Zero cost when off: the hot paths test the one flag tpsh_trace_on and call nothing else. Records
 * live in one growable array owned by the host thread (workers never touch it; they only reach the
 * events), capped so that a forgotten trace cannot eat the host's memory. Events are pooled: creating
 * a CUDA event costs more than recording one.
 */
#include "core/backend.h"
#include "core/group.h"
#include "core/check.h"
#include "core/coll_kinds.h"
#include "core/intern.h"
#include "core/trace.h"
#include "core/graph.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BE (tpsh_rt.be)
#define MAX_RECORDS (1 << 20)

int tpsh_trace_on;

typedef struct rec_events { tpsh_event *begin, *end; } rec_events;
/* last_end: the end marker of the stream's last traced op, shared (refcount) with the next op's record
 * as its begin while the stream is still busy: the next op then starts exactly when the marker is
 * reached, and one timing event per op is saved (on a GPU a timing-event record costs about 1 us of
 * host time and delays the stream a little; tracing must not distort what it measures). */
typedef struct trace_stream { uint64_t id; char name[TPSH_STREAM_NAME_MAX + 1]; tpsh_event *last_end; } trace_stream;

static struct {
  tpsh_trace_record *recs;
  rec_events *evs;            /* parallel to recs; both NULL for host records and once resolved */
  int64_t n, cap, resolved, dropped, op_seq;
  int warned;
  tpsh_event *ref;            /* on the default stream at start */
  double ref_host;            /* the host clock when ref was reached */
  trace_stream *streams;
  int nstreams, capstreams;
  uint64_t last_id;           /* one-entry cache of the stream table: most records hit it */
  int last_index;
} T = {.last_index = -1};

/* ==== events and streams ======================================================================== */
/* Timing events come from the core's pool (tpsh_event_create / tpsh_event_release, refcounted: a marker
 * shared by two records goes back once both let go); they are recorded through the vtable directly. */
static tpsh_event *event_get(void) { return tpsh_event_create(1); }
static void event_put(tpsh_event *e) { tpsh_event_release(e); }

/* Records a pooled timing event on s, straight through the vtable: tracing must not trace itself. */
static tpsh_event *mark(tpsh_stream *s) {
  tpsh_event *e = event_get();
  if (!e) return NULL;
  if (BE->event_record(e, s) != TPSH_OK) { event_put(e); return NULL; }
  e->recorded = 1;
  return e;
}

static int stream_index(const tpsh_stream *s) {
  if (T.last_index >= 0 && T.last_id == s->id) return T.last_index;
  int i = 0;
  while (i < T.nstreams && T.streams[i].id != s->id) i++;
  if (i == T.nstreams) {
    if (T.nstreams == T.capstreams) {
      int c = T.capstreams ? T.capstreams * 2 : 8;
      trace_stream *p = realloc(T.streams, (size_t)c * sizeof *p);
      if (!p) return -1;
      T.streams = p;
      T.capstreams = c;
    }
    T.streams[i].id = s->id;
    T.streams[i].last_end = NULL;
    snprintf(T.streams[i].name, sizeof T.streams[i].name, "%s", s->name);
    T.nstreams++;
  }
  T.last_id = s->id;
  T.last_index = i;
  return i;
}

/* ==== records ==================================================================================== */
/* A new record, or NULL past the cap (counted, warned about once) or when out of memory. */
static tpsh_trace_record *record_new(int64_t *id) {
  if (T.n >= MAX_RECORDS) {
    T.dropped++;
    if (!T.warned) {
      T.warned = 1;
      fprintf(stderr, "[rank %d] tpsh trace: more than %d records; later ones are dropped "
              "(trace a shorter run, or tp.trace.clear() between parts)\n", tpsh_rt.rank, MAX_RECORDS);
    }
    return NULL;
  }
  if (T.n == T.cap) {
    int64_t c = T.cap ? T.cap * 2 : 4096;
    if (c > MAX_RECORDS) c = MAX_RECORDS;
    tpsh_trace_record *r = realloc(T.recs, (size_t)c * sizeof *r);
    if (!r) return NULL;
    T.recs = r;
    rec_events *e = realloc(T.evs, (size_t)c * sizeof *e);
    if (!e) return NULL;
    T.evs = e;
    T.cap = c;
  }
  *id = T.n;
  tpsh_trace_record *r = &T.recs[T.n];
  memset(r, 0, sizeof *r);
  T.evs[T.n] = (rec_events){0};
  T.n++;
  return r;
}

int64_t tpsh_trace_op_begin(tpsh_stream *s, const char *name, int category, double bytes, int64_t seq) {
  if (!tpsh_trace_on || !s) return -1;
  int64_t id;
  tpsh_trace_record *r = record_new(&id);
  if (!r) return -1;
  r->category = category;
  r->stream = stream_index(s);
  r->name = name ? name : "op";
  r->bytes = bytes;
  r->seq = seq;
  tpsh_event *prev = r->stream >= 0 ? T.streams[r->stream].last_end : NULL;
  if (prev && BE->event_query(prev) == 0) {    /* still busy: this op starts when prev is reached */
    prev->refcount++;
    T.evs[id].begin = prev;
  } else {                                      /* idle (or first): the op starts at its own marker */
    T.evs[id].begin = mark(s);
  }
  if (!T.evs[id].begin) r->category = -1;      /* could not be timed: left out of everything */
  return id;
}

TPSH_HOT void tpsh_trace_op_end(tpsh_stream *s, int64_t id) {
  if (id < 0 || id >= T.n || !s || T.recs[id].category < 0) return;
  tpsh_event *e = mark(s);
  T.evs[id].end = e;
  if (!e) { T.recs[id].category = -1; return; }
  int si = T.recs[id].stream;
  if (si >= 0) {
    event_put(T.streams[si].last_end);
    e->refcount++;
    T.streams[si].last_end = e;
  }
}

void tpsh_trace_untraced(tpsh_stream *s) {
  if (!tpsh_trace_on || !s) return;
  /* untraced work (a free, an upload) between two records would otherwise be counted in the next one's
     time: a 72 ms free between a 300 ms spin and a 1 ms one made the 1 ms spin 78 ms */
  int si = stream_index(s);
  if (si < 0) return;
  event_put(T.streams[si].last_end);
  T.streams[si].last_end = NULL;
}

/* At start and stop: markers of another tracing period are not shared with this one. */
static void forget_last_ends(void) {
  for (int i = 0; i < T.nstreams; i++) {
    event_put(T.streams[i].last_end);
    T.streams[i].last_end = NULL;
  }
}

/* Sets the args of the record id (shapes, dtypes...): called by the hooks that know them. */
static void set_args(int64_t id, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_args(int64_t id, const char *fmt, ...) {
  if (id < 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(T.recs[id].args, sizeof T.recs[id].args, fmt, ap);
  va_end(ap);
}

/* "f32[64, 32]" for each tensor of k, and the bytes they span (what the op reads and writes). */
static double describe_kernel(const tpsh_kargs *k, char *buf, size_t n) {
  double bytes = 0;
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < k->nt && used < n; i++) {
    char shape[96];
    used += (size_t)snprintf(buf + used, n - used, "%s%s%s", i ? " " : "", tpsh_dtype_name(k->t[i].dtype_id),
                             tpsh_shape_str(&k->t[i], shape, sizeof shape));
    bytes += (double)tpsh_tensor_numel(&k->t[i]) * (double)tpsh_tensor_elsize(&k->t[i]);
  }
  if (k->op == TPSH_K_SPIN) snprintf(buf, n, "%g ms", k->s[0]);
  return bytes;
}

int tpsh_trace_launch(tpsh_stream *s, const tpsh_kargs *k) {
  char args[sizeof T.recs[0].args];
  double bytes = describe_kernel(k, args, sizeof args);
  int64_t id = tpsh_trace_op_begin(s, k->name, TPSH_TRACE_COMPUTE, bytes, T.op_seq++);
  int rc = BE->launch(s, k);
  if (id < 0) return rc;
  if (rc != TPSH_OK) { T.recs[id].category = -1; return rc; }
  memcpy(T.recs[id].args, args, sizeof args);
  tpsh_trace_op_end(s, id);
  return rc;
}

TPSH_HOT int64_t tpsh_trace_collectives_begin(tpsh_stream *s, const tpsh_group *g, int n, const tpsh_coll_args *c) {
  if (!tpsh_trace_on || n < 1) return -1;
  /* bytes: the larger buffer of each call (the gathered output, the scattered input). */
  double bytes = 0;
  for (int i = 0; i < n; i++) {
    int64_t ns = tpsh_coll_send_count(c[i].kind, c[i].count, g->size);
    int64_t nr = tpsh_coll_recv_count(c[i].kind, c[i].count, g->size);
    bytes += (double)(ns > nr ? ns : nr) * tpsh_dtype_size(c[i].dtype);
  }
  int64_t id = tpsh_trace_op_begin(s, n == 1 ? c[0].name : "batch", TPSH_TRACE_COMM, bytes, (int64_t)c[0].seq);
  /* Each call as "name" (a send or a receive with its peer, a broadcast or reduce with its root, as
   * ranks of the group, and the world rank where the group's differs): a timeline of a pipeline then
   * reads who talks to whom. A batch lists its calls while they fit. */
  char text[sizeof T.recs[0].args], tail[40];
  int tail_len = snprintf(tail, sizeof tail, ", group %llu of %d", (unsigned long long)g->id, g->size);
  size_t room = sizeof text - (size_t)tail_len, len = 0;
  if (n == 1)
    len = (size_t)snprintf(text, room, "%s x %lld%s", tpsh_dtype_name(c[0].dtype), (long long)c[0].count,
                           tpsh_coll_is_p2p(c[0].kind) ? "" : " per rank");
  else
    len = (size_t)snprintf(text, room, "%d calls:", n);
  for (int i = 0; i < n && len < room; i++) {
    int peer = tpsh_coll_kinds[c[i].kind].peer, wr = c[i].peer;
    if (wr >= 0 && wr < g->size && g->world_ranks) wr = g->world_ranks[wr];
    const char *rel = peer == TPSH_CK_PEER_TO     ? " to"
                      : peer == TPSH_CK_PEER_FROM ? " from"
                      : n == 1                    ? ", root"
                                                  : " root";
    int has_rank = peer != TPSH_CK_PEER_NONE;
    char one[96];
    int m = snprintf(one, sizeof one, "%s%s", n == 1 ? "" : i == 0 ? " " : ", ", n == 1 ? "" : c[i].name);
    if (has_rank) m += snprintf(one + m, sizeof one - (size_t)m, "%s rank %d", rel, (int)c[i].peer);
    if (has_rank && wr != c[i].peer) m += snprintf(one + m, sizeof one - (size_t)m, " (world rank %d)", wr);
    if (len + (size_t)m + 4 >= room && i + 1 < n) { len += (size_t)snprintf(text + len, room - len, " ..."); break; }
    len += (size_t)snprintf(text + len, room - len, "%s", one);
  }
  if (len >= room) len = room - 1;
  set_args(id, "%.*s%s", (int)len, text, tail);
  return id;
}

int tpsh_trace_wait_event(tpsh_stream *s, tpsh_event *e) {
  /* A span on the waiting stream: from reaching the wait to passing it, i.e. how long it stalled. */
  int64_t id = tpsh_trace_op_begin(s, "wait", TPSH_TRACE_WAIT, 0, -1);
  int rc = BE->stream_wait_event(s, e);
  if (id < 0) return rc;
  if (rc != TPSH_OK) { T.recs[id].category = -1; return rc; }
  tpsh_trace_op_end(s, id);
  return rc;
}

/* A record of host time, from t0 to now (host blocks and spans), or NULL when none is to be made. */
static tpsh_trace_record *host_record(int category, const char *name, double t0) {
  if (!tpsh_trace_on || t0 <= 0) return NULL;
  double t1 = tpsh_now_ms();
  int64_t id;
  tpsh_trace_record *r = record_new(&id);
  if (!r) return NULL;
  r->category = category;
  r->stream = -1;
  r->name = name;
  r->seq = -1;
  r->t0 = t0;
  r->t1 = t1;
  return r;
}

void tpsh_trace_host(const char *name, const tpsh_stream *s, double t0) {
  tpsh_trace_record *r = host_record(TPSH_TRACE_HOST, name, t0);
  if (r && s) snprintf(r->args, sizeof r->args, "stream %s", s->name);
}

/* Span names come from Lua, whose strings may be collected while a record points at them: each
 * distinct name is copied once and kept for the process (a script uses a handful; past MAX_SPAN_NAMES
 * they share one). */
#define MAX_SPAN_NAMES 4096
static int nspan_names;

static const char *span_name(const char *name) {
  if (nspan_names >= MAX_SPAN_NAMES) {          /* past the cap only names already seen keep theirs */
    const char *seen = tpsh_intern_find(name);
    return seen ? seen : "span (too many distinct names)";
  }
  bool added;
  const char *r = tpsh_intern(name, &added);
  if (added) nspan_names++;
  return r ? r : "span";
}

void tpsh_trace_span(const char *name, double t0) {
  if (tpsh_trace_on && name) host_record(TPSH_TRACE_SPAN, span_name(name), t0);
}

void tpsh_trace_range(const char *name, double t0, int depth, int unfinished, const char *note) {
  if (!tpsh_trace_on || !name) return;
  tpsh_trace_record *r = host_record(TPSH_TRACE_RANGE, span_name(name), t0);
  if (!r) return;
  r->seq = depth;
  r->unfinished = unfinished;
  if (note) snprintf(r->args, sizeof r->args, "%s", note);
}

/* ==== start, stop, resolve ======================================================================== */
/* Waits for e without taking a stream's sticky error when it has already completed. */
static int reached(tpsh_event *e) {
  if (BE->event_query(e) == 1) return TPSH_OK;
  return BE->event_synchronize(e);
}

/* A record's events go back to the pool once it has its times (or will never have them). */
static void release_events(rec_events *ev) {
  event_put(ev->begin);
  event_put(ev->end);
  *ev = (rec_events){0};
}

int tpsh_trace_resolve(void) {
  if (tpsh_graph_capturing && T.resolved < T.n) return tpsh_graph_refuse("waits on the host for the trace's events");
  int rc = TPSH_OK;
  for (int64_t i = T.resolved; i < T.n; i++) {
    tpsh_trace_record *r = &T.recs[i];
    rec_events *ev = &T.evs[i];
    if (r->category >= 0 && ev->begin) {           /* a device record; host ones have no events */
      double a = 0, b = 0;
      int ok = ev->end && T.ref;
      if (ok && (rc = reached(ev->end)) != TPSH_OK) ok = 0;
      if (ok) ok = reached(ev->begin) == TPSH_OK && BE->event_elapsed(T.ref, ev->begin, &a) == TPSH_OK &&
                   BE->event_elapsed(T.ref, ev->end, &b) == TPSH_OK;
      if (ok) {
        r->t0 = T.ref_host + a;
        r->t1 = T.ref_host + (b > a ? b : a);
      } else {
        r->category = -1;
      }
    }
    release_events(ev);
    if (rc != TPSH_OK) { T.resolved = i + 1; return rc; }
  }
  T.resolved = T.n;
  return TPSH_OK;
}

/* The end of a run that failed (tp.trace._save_own, called by the host before every rank is ended):
 * the records as far as the streams got, without waiting for any of them (one may never get further: a
 * collective whose peers are gone, a device in error). An op whose start was reached but not its end
 * runs to now, marked unfinished (it is where a stream stood when the run ended); one not started is
 * left out. Counts the two in counts[0] and counts[1]. Everything is resolved after it. */
void tpsh_trace_resolve_reached(int64_t counts[2]) {
  double now = tpsh_now_ms();
  counts[0] = counts[1] = 0;
  for (int64_t i = T.resolved; i < T.n; i++) {
    tpsh_trace_record *r = &T.recs[i];
    rec_events *ev = &T.evs[i];
    if (r->category >= 0 && ev->begin) {
      double a = 0, b = 0;
      int began = T.ref && BE->event_query(ev->begin) == 1 && BE->event_elapsed(T.ref, ev->begin, &a) == TPSH_OK;
      int ended = began && ev->end && BE->event_query(ev->end) == 1 &&
                  BE->event_elapsed(T.ref, ev->end, &b) == TPSH_OK;
      if (ended) {
        r->t0 = T.ref_host + a;
        r->t1 = T.ref_host + (b > a ? b : a);
      } else if (began && ev->end) {
        r->t0 = T.ref_host + a;
        r->t1 = now > r->t0 ? now : r->t0;
        r->unfinished = 1;
        counts[0]++;
      } else {
        r->category = -1;
        if (ev->end) counts[1]++;     /* (without an end marker the op failed at its launch: not queued) */
      }
    }
    release_events(ev);
  }
  T.resolved = T.n;
}

int tpsh_trace_start(void) {
  if (!tpsh_rt.initialized) return tpsh_error(TPSH_EINVAL, "tpsh is not initialised");
  if (tpsh_graph_capturing) return tpsh_graph_refuse("starts the trace (it waits on the host)");
  if (tpsh_trace_on) return TPSH_OK;
  /* Records of an earlier start were timed against the earlier reference: resolve them first. */
  int rc = tpsh_trace_resolve();
  if (rc) return rc;
  if (!T.ref && !(T.ref = event_get())) return tpsh_error(TPSH_ENOMEM, "out of memory for the trace's events");
  tpsh_stream *d = tpsh_rt.default_stream;
  /* On an idle stream the marker is reached right after it is recorded: its host time is taken as the
   * midpoint of record..synchronize. The error is at most half that window, usually microseconds but
   * milliseconds when the machine is oversubscribed (a CPU worker not scheduled at once), and it would
   * shift this rank against the others: so try a few times and keep the narrowest window. */
  tpsh_event *try = event_get();
  if (!try) return tpsh_error(TPSH_ENOMEM, "out of memory for the trace's events");
  if ((rc = BE->stream_synchronize(d)) != TPSH_OK) { event_put(try); return rc; }
  double best = 1e300;
  for (int i = 0; i < 16 && best > 0.02; i++) {
    double before = tpsh_now_ms();
    if ((rc = BE->event_record(try, d)) != TPSH_OK || (rc = BE->event_synchronize(try)) != TPSH_OK) break;
    double after = tpsh_now_ms();
    try->recorded = 1;
    if (after - before < best) {
      best = after - before;
      tpsh_event *t = T.ref; T.ref = try; try = t;      /* keep the best; record the next try on the other */
      T.ref_host = 0.5 * (before + after);
    }
  }
  event_put(try);
  if (rc != TPSH_OK) return rc;
  forget_last_ends();
  tpsh_trace_on = 1;
  return TPSH_OK;
}

int tpsh_trace_stop(void) {
  tpsh_trace_on = 0;
  forget_last_ends();
  return TPSH_OK;
}

int tpsh_trace_active(void) { return tpsh_trace_on; }

void tpsh_trace_clear(void) {
  tpsh_trace_resolve();            /* returns the events to the pool */
  T.n = T.resolved = T.dropped = 0;
  T.warned = 0;
}

int64_t tpsh_trace_count(void) { return T.n; }
int64_t tpsh_trace_dropped(void) { return T.dropped; }
const tpsh_trace_record *tpsh_trace_records(void) { return T.recs; }
int tpsh_trace_stream_count(void) { return T.nstreams; }
const char *tpsh_trace_stream_name(int i) { return i >= 0 && i < T.nstreams ? T.streams[i].name : "host"; }
uint64_t tpsh_trace_stream_id(int i) { return i >= 0 && i < T.nstreams ? T.streams[i].id : 0; }

/* ==== clocks across ranks ========================================================================= */
/* offset = (this rank's host clock) - (rank 0's). Ranks on rank 0's host share its CLOCK_MONOTONIC:
 * their offset is exactly 0 (a ping-pong estimate would only add noise, large on an oversubscribed
 * machine). Other ranks play `rounds` ping-pongs with rank 0, one rank at a time, and keep the sample
 * of the smallest round trip (its midpoint is the tightest estimate). Every rank of g calls it.
 * rounds < 0 plays -rounds ping-pongs with every rank, same host or not (the specs test that path).
 * *rtt_ms gets that round trip (0 where nothing was estimated): the estimate is off by at most half of
 * it, which on an oversubscribed machine can be milliseconds (4 ranks on 2 cores, each waiting rank
 * polling MPI, took ~10 ms a round trip). */
static int clock_offset(tpsh_group *g, int rounds, double *offset_ms, double *rtt_ms) {
  const int tag = 0x7ace;
  *offset_ms = *rtt_ms = 0;
  int force = rounds < 0;
  if (force) rounds = -rounds;
  if (rounds < 1) rounds = 1;
  char host0[MPI_MAX_PROCESSOR_NAME + 1] = {0}, mine[MPI_MAX_PROCESSOR_NAME + 1] = {0};
  int len = 0;
  MPI_Get_processor_name(mine, &len);
  memcpy(host0, mine, sizeof host0);
  if (MPI_Bcast(host0, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, g->host_comm) != MPI_SUCCESS)
    return tpsh_error(TPSH_ECOMM, "sharing rank 0's host name failed");
  int remote = force || strcmp(host0, mine) != 0;
  int *remotes = g->rank == 0 ? calloc((size_t)g->size, sizeof *remotes) : NULL;
  if (g->rank == 0 && !remotes) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  if (MPI_Gather(&remote, 1, MPI_INT, remotes, 1, MPI_INT, 0, g->host_comm) != MPI_SUCCESS) {
    free(remotes);
    return tpsh_error(TPSH_ECOMM, "gathering the ranks' hosts failed");
  }
  if (g->rank == 0) {
    for (int peer = 1; peer < g->size; peer++) {
      if (!remotes[peer]) continue;
      double best_rtt = 1e300, best = 0;
      for (int i = 0; i < rounds; i++) {
        double t0 = tpsh_now_ms(), tr = 0;
        if (MPI_Send(&t0, 1, MPI_DOUBLE, peer, tag, g->host_comm) != MPI_SUCCESS ||
            MPI_Recv(&tr, 1, MPI_DOUBLE, peer, tag, g->host_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          free(remotes);
          return tpsh_error(TPSH_ECOMM, "clock ping-pong with rank %d failed", peer);
        }
        double t1 = tpsh_now_ms();
        if (t1 - t0 < best_rtt) { best_rtt = t1 - t0; best = tr - 0.5 * (t0 + t1); }
      }
      double estimate[2] = { best, best_rtt };
      if (MPI_Send(estimate, 2, MPI_DOUBLE, peer, tag, g->host_comm) != MPI_SUCCESS) {
        free(remotes);
        return tpsh_error(TPSH_ECOMM, "sending the clock offset to rank %d failed", peer);
      }
    }
    free(remotes);
  } else if (remote) {
    for (int i = 0; i < rounds; i++) {
      double t;
      if (MPI_Recv(&t, 1, MPI_DOUBLE, 0, tag, g->host_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return tpsh_error(TPSH_ECOMM, "clock ping-pong with rank 0 failed");
      t = tpsh_now_ms();
      if (MPI_Send(&t, 1, MPI_DOUBLE, 0, tag, g->host_comm) != MPI_SUCCESS)
        return tpsh_error(TPSH_ECOMM, "clock ping-pong with rank 0 failed");
    }
    double estimate[2];
    if (MPI_Recv(estimate, 2, MPI_DOUBLE, 0, tag, g->host_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return tpsh_error(TPSH_ECOMM, "receiving the clock offset from rank 0 failed");
    *offset_ms = estimate[0];
    *rtt_ms = estimate[1];
  }
  return TPSH_OK;
}

/* A host-side exchange, counted as tp.barrier's: a rank that never comes (one that skipped
 * tp.trace.save) ends every rank through the watchdog, within seconds when that rank has finished the
 * script (as a watched wait only, it would take the whole timeout). */
int tpsh_trace_clock_offset(tpsh_group *g, int rounds, double *offset_ms, double *rtt_ms) {
  if (!g || !offset_ms) return tpsh_error(TPSH_EINVAL, "expected a group and an output");
  double rtt_unused;
  int rc = tpsh_host_exchange_begin(g, "the trace's clock alignment (tp.trace.save/svg/summary: every rank must call it)");
  if (rc) return rc;
  rc = clock_offset(g, rounds, offset_ms, rtt_ms ? rtt_ms : &rtt_unused);
  tpsh_host_exchange_end();
  return rc;
}
