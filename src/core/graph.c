/*
 * graph.c: tp.graph: what a function enqueues, captured once and replayed as a whole (backend-neutral).
 *
 * A capture starts on one stream (the script's current stream) and takes in every stream that waits for
 * an event recorded in it, as CUDA's stream capture does (and PyTorch's torch.cuda.graph on top of it).
 * While it is open, the enqueue paths hand their work here (graph.h's hooks): kernels with their
 * tpsh_kargs, the collectives of each launch with their tpsh_coll_args, event records and cross-stream
 * waits, each on the index of its stream in the capture. That record is the graph on every backend:
 *  - the CPU backend enqueues nothing during the capture, and a replay enqueues the record again (the
 *    capture's stream mapped to the replay's, the other streams as they were), through the usual paths,
 *    so that the trace and the sanitizer see every op of every replay;
 *  - a backend that captures natively (CUDA) also gets each op on its capturing streams, and replays the
 *    instantiated graph in one launch (the record then serves for the ownership and the collectives'
 *    numbering); in check mode it enqueues the record instead, for the sanitizer's sake.
 * Collectives are numbered (sequence, digest, flight recorder, ledger) at each replay, not at the capture,
 * which runs nothing: every rank replays what it captured, so the counts the end of a script compares
 * stay the collectives that ran.
 *
 * Ownership. A graph holds every storage its ops use (graph_holds, tensor.c): the script may drop its
 * tensors, and t:free() of one is refused, since each replay reads and writes them. Tensors allocated
 * during the capture take their memory from the graph's pool (alloc.c), which keeps it for the graph when
 * they die, and a block that died may serve a later allocation of the capture on the same stream. When
 * the graph goes, its storages and its pool's blocks are freed in stream order after the streams its
 * replays ran on.
 *
 * What a capture cannot hold is refused before anything reaches the backend (TPSH_ECAPTURE, words of
 * tpsh_graph_refuse): a read to the host, a host wait or query, a host-side exchange, a wait for an event
 * recorded outside the capture, work on a stream that has not joined it. The capture tracks, per stream,
 * which point of each other stream it is ordered after (vector clocks of the capture's streams), so that a
 * stream with work the capture's own stream never waits for is an error at the end on every backend (CUDA
 * refuses such a graph too: cudaErrorStreamCaptureUnjoined), named.
 * Frees during a capture: a pool block goes back to its pool; any other storage that dies is released
 * when the capture ends (its free records events on streams, and those may be capturing), as is a graph
 * or a stream released meanwhile. Host thread only.
 */
#include "core/backend.h"
#include "core/alloc.h"
#include "core/graph.h"
#include "core/intern.h"
#include "core/trace.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BE (tpsh_rt.be)
#define CHECK(expr) do { int rc_ = (expr); if (rc_) return rc_; } while (0)

enum { MAX_STREAMS = 32 };             /* streams one capture may join */
enum { OP_LAUNCH, OP_COLL, OP_RECORD, OP_WAIT, OP_KINDS };

typedef struct graph_coll {
  tpsh_group *g;              /* retained by the graph (groups[]) */
  int n, ndesc;
  tpsh_coll_args *c;          /* numbered again at each replay */
  tpsh_tensor *desc;          /* check mode at the capture: the launch's tensors, for the sanitizer */
} graph_coll;

typedef struct graph_op {
  int32_t kind;
  int32_t stream;             /* index in streams[]: 0 is the capture's own, mapped to the replay's */
  int32_t event;              /* OP_RECORD, OP_WAIT: the graph's event */
  const char *loc;            /* check mode: the Lua line that made it (interned) */
  union { tpsh_kargs k; graph_coll coll; } u;
} graph_op;

/* An event recorded in the capture: which of the graph's events its latest record is, and the recording
 * stream's clock there (what a stream that waits for it is then ordered after). */
typedef struct cap_event {
  tpsh_event *e;              /* a reference until the capture ends */
  int slot;
  uint32_t clock[MAX_STREAMS];
} cap_event;

typedef struct capture {
  uint32_t clock[MAX_STREAMS][MAX_STREAMS];   /* [i][j]: stream i is ordered after ops 1..[i][j] of stream j */
  uint32_t last_work[MAX_STREAMS];            /* [j]: stream j's own count at its last op that is not a wait */
  cap_event *events;
  int nevents, capevents;
} capture;

struct tpsh_graph {
  uint64_t id;                /* from 1: storages' graph_mark */
  const char *name;           /* interned: trace records keep it */
  graph_op *ops;
  int nops, capops;
  double counts[OP_KINDS];
  tpsh_stream *streams[MAX_STREAMS];          /* retained */
  int nstreams;
  tpsh_storage **held;        /* one graph_hold each */
  int nheld, capheld;
  tpsh_group **groups;        /* retained */
  int ngroups, capgroups;
  int nslots;                 /* the graph's events: one per record */
  tpsh_event **events;        /* made by the first replay that enqueues the record */
  tpsh_graph_pool *pool;
  void *exec;                 /* the backend's instantiated graph, or NULL */
  tpsh_stream **replayed;     /* streams it was replayed on (retained) */
  int nreplayed, capreplayed;
  tpsh_stream *last;          /* the last replay's, one of replayed[] */
  double replays;
  capture *cap;               /* while its capture is open */
  struct tpsh_graph *next_dead;   /* released during another capture: destroyed after it */
};

int tpsh_graph_capturing;
static tpsh_graph *cur;                /* the graph under capture */
static uint64_t next_id;
static tpsh_storage **dying;           /* storages that died during the capture (not a pool's memory) */
static int ndying, capdying;
static tpsh_stream **dying_streams;    /* streams whose last reference went during the capture */
static int ndying_streams, capdying_streams;
static tpsh_graph *dead;

static int native(void) { return BE->graph_begin != NULL; }

/* ==== refusals ==================================================================================== */
int tpsh_graph_refuse(const char *what) {
  return tpsh_error(TPSH_ECAPTURE, "%s during capture: a graph holds the device work its function enqueues "
                    "and nothing else (do it before tp.graph, or after g:replay())", what);
}

int tpsh_graph_event_refuse(const char *call) {
  return tpsh_error(TPSH_ECAPTURE, "%s an event last recorded during a capture: it marks a point inside that "
                    "graph, which nothing outside the graph can wait for or ask about (record it again outside "
                    "the graph)", call);
}

/* ==== the capture's bookkeeping =================================================================== */
static int stream_index(const tpsh_graph *g, const tpsh_stream *s) {
  for (int i = 0; i < g->nstreams; i++)
    if (g->streams[i] == s) return i;
  return -1;
}

/* s's index in the capture, or minus TPSH_ECAPTURE when it has not joined it. */
static int joined(const tpsh_graph *g, const tpsh_stream *s, const char *what, const char *name) {
  int i = stream_index(g, s);
  if (i >= 0) return i;
  return -tpsh_error(TPSH_ECAPTURE, "%s%s%s on stream '%s', which is not part of the capture: a stream joins it "
                     "by waiting for a stream of the capture (s:wait_stream(tp.current_stream()) inside the "
                     "function), and work outside it cannot be in the graph", what, name ? " " : "",
                     name ? name : "", s->name);
}

static void tick(capture *c, int i, int work) {
  c->clock[i][i]++;
  if (work) c->last_work[i] = c->clock[i][i];
}

static int hold(tpsh_graph *g, tpsh_storage *st) {
  if (!st || st->graph_mark == g->id) return TPSH_OK;
  CHECK(tpsh_grow_array((void **)&g->held, &g->capheld, g->nheld + 1, 16, sizeof *g->held));
  st->graph_mark = g->id;
  tpsh_storage_graph_hold(st);
  g->held[g->nheld++] = st;
  return TPSH_OK;
}

static int hold_group(tpsh_graph *g, tpsh_group *grp) {
  for (int i = 0; i < g->ngroups; i++)
    if (g->groups[i] == grp) return TPSH_OK;
  CHECK(tpsh_grow_array((void **)&g->groups, &g->capgroups, g->ngroups + 1, 4, sizeof *g->groups));
  tpsh_group_retain(grp);
  g->groups[g->ngroups++] = grp;
  return TPSH_OK;
}

static graph_op *op_new(tpsh_graph *g, int kind, int stream) {
  if (tpsh_grow_array((void **)&g->ops, &g->capops, g->nops + 1, 16, sizeof *g->ops)) return NULL;
  graph_op *op = &g->ops[g->nops++];
  memset(op, 0, sizeof *op);
  op->kind = kind;
  op->stream = stream;
  op->loc = tpsh_check_on ? tpsh_check_location() : NULL;
  g->counts[kind]++;
  return op;
}

static cap_event *cap_find(capture *c, const tpsh_event *e) {
  for (int i = c->nevents - 1; i >= 0; i--)
    if (c->events[i].e == e) return &c->events[i];
  return NULL;
}

/* ==== the hooks =================================================================================== */
int tpsh_graph_launch(tpsh_stream *s, const tpsh_kargs *k) {
  tpsh_graph *g = cur;
  int i = joined(g, s, "enqueues", k->name);
  if (i < 0) return -i;
  for (int t = 0; t < k->nt; t++) CHECK(hold(g, k->t[t].storage));
  graph_op *op = op_new(g, OP_LAUNCH, i);
  if (!op) return TPSH_ENOMEM;
  op->u.k = *k;
  tick(g->cap, i, 1);
  return native() ? BE->launch(s, k) : TPSH_OK;
}

int tpsh_graph_collectives(tpsh_stream *s, tpsh_group *grp, int n, const tpsh_coll_args *c, int nheld,
                           tpsh_storage *const *held, int ndesc, const tpsh_tensor *desc) {
  tpsh_graph *g = cur;
  int i = joined(g, s, "enqueues", n == 1 ? c[0].name : "a batch of collectives");
  if (i < 0) return -i;
  for (int t = 0; t < nheld; t++) CHECK(hold(g, held[t]));
  CHECK(hold_group(g, grp));
  tpsh_coll_args *copy = malloc((size_t)n * sizeof *copy);
  tpsh_tensor *dcopy = ndesc > 0 ? malloc((size_t)ndesc * sizeof *dcopy) : NULL;
  graph_op *op = copy && (dcopy || ndesc == 0) ? op_new(g, OP_COLL, i) : NULL;
  if (!op) {
    free(copy);
    free(dcopy);
    return tpsh_error(TPSH_ENOMEM, "out of host memory");
  }
  memcpy(copy, c, (size_t)n * sizeof *copy);
  if (ndesc > 0) memcpy(dcopy, desc, (size_t)ndesc * sizeof *dcopy);
  op->u.coll = (graph_coll){.g = grp, .n = n, .ndesc = ndesc, .c = copy, .desc = dcopy};
  tick(g->cap, i, 1);
  if (!native()) return TPSH_OK;
  tpsh_watch_call_begin();                 /* NCCL may connect to its peers here: watched */
  int rc = BE->collectives(s, grp, n, c);
  tpsh_watch_call_end();
  return rc;
}

int tpsh_graph_event_record(tpsh_event *e, tpsh_stream *s) {
  tpsh_graph *g = cur;
  capture *c = g->cap;
  int i = joined(g, s, "records an event", NULL);
  if (i < 0) return -i;
  cap_event *ce = cap_find(c, e);
  if (!ce) {
    CHECK(tpsh_grow_array((void **)&c->events, &c->capevents, c->nevents + 1, 16, sizeof *c->events));
    ce = &c->events[c->nevents++];
    ce->e = e;
    e->refcount++;                         /* not reused by another record meanwhile */
  }
  graph_op *op = op_new(g, OP_RECORD, i);
  if (!op) return TPSH_ENOMEM;
  tick(c, i, 1);
  op->event = ce->slot = g->nslots++;
  memcpy(ce->clock, c->clock[i], sizeof ce->clock);
  if (native()) CHECK(BE->event_record(e, s));
  e->recorded = 1;
  e->captured = 1;
  return TPSH_OK;
}

int tpsh_graph_wait_event(tpsh_stream *s, tpsh_event *e) {
  tpsh_graph *g = cur;
  capture *c = g->cap;
  cap_event *ce = cap_find(c, e);
  if (!ce)
    return tpsh_error(TPSH_ECAPTURE, "%s", e->captured
                      ? "waits for an event recorded during another capture"
                      : "waits for an event recorded outside the capture: a graph cannot depend on work outside it "
                        "(wait before tp.graph, or record the event inside the function)");
  int i = stream_index(g, s);
  if (i < 0) {                             /* s joins the capture */
    if (g->nstreams == MAX_STREAMS)
      return tpsh_error(TPSH_EUNSUPPORTED, "stream '%s' would be stream %d of the capture: a capture joins at most "
                        "%d streams", s->name, MAX_STREAMS + 1, MAX_STREAMS);
    i = g->nstreams++;
    g->streams[i] = s;
    tpsh_stream_retain(s);
  }
  graph_op *op = op_new(g, OP_WAIT, i);
  if (!op) return TPSH_ENOMEM;
  for (int j = 0; j < MAX_STREAMS; j++)
    if (ce->clock[j] > c->clock[i][j]) c->clock[i][j] = ce->clock[j];
  tick(c, i, 0);
  op->event = ce->slot;
  return native() ? BE->stream_wait_event(s, e) : TPSH_OK;
}

void tpsh_graph_defer_release(tpsh_storage *st) {
  /* out of host memory for the list: the storage is left to the process */
  if (tpsh_grow_array((void **)&dying, &capdying, ndying + 1, 16, sizeof *dying) == TPSH_OK) dying[ndying++] = st;
}

void tpsh_graph_defer_stream(tpsh_stream *s) {
  /* out of host memory for the list: the stream is left to the process */
  if (tpsh_grow_array((void **)&dying_streams, &capdying_streams, ndying_streams + 1, 8, sizeof *dying_streams) ==
      TPSH_OK)
    dying_streams[ndying_streams++] = s;
}

/* ==== destruction ================================================================================= */
static void destroy(tpsh_graph *g) {
  if (g->exec) BE->graph_destroy(g->exec);
  for (int i = 0; g->events && i < g->nslots; i++) tpsh_event_release(g->events[i]);
  free(g->events);
  /* the pool's blocks go back once every stream the graph may have run on has passed this point */
  int n = g->nstreams + g->nreplayed;
  tpsh_stream **ran = malloc((size_t)(n > 0 ? n : 1) * sizeof *ran);
  if (ran) {
    memcpy(ran, g->streams, (size_t)g->nstreams * sizeof *ran);
    if (g->nreplayed > 0) memcpy(ran + g->nstreams, g->replayed, (size_t)g->nreplayed * sizeof *ran);
  } else {                                 /* out of host memory: wait for them instead */
    for (int i = 0; i < g->nreplayed; i++) tpsh_stream_synchronize(g->replayed[i]);
    n = 0;
  }
  tpsh_alloc_pool_release(g->pool, n, ran);
  free(ran);
  for (int i = 0; i < g->nheld; i++) tpsh_storage_graph_drop(g->held[i]);
  for (int i = 0; i < g->nops; i++)
    if (g->ops[i].kind == OP_COLL) { free(g->ops[i].u.coll.c); free(g->ops[i].u.coll.desc); }
  for (int i = 0; i < g->ngroups; i++) tpsh_group_release(g->groups[i]);
  for (int i = 0; i < g->nstreams; i++) tpsh_stream_release(g->streams[i]);
  for (int i = 0; i < g->nreplayed; i++) tpsh_stream_release(g->replayed[i]);
  free(g->ops);
  free(g->held);
  free(g->groups);
  free(g->replayed);
  free(g);
}

void tpsh_graph_release(tpsh_graph *g) {
  if (!g) return;
  if (tpsh_graph_capturing) {              /* its frees would record events on capturing streams */
    g->next_dead = dead;
    dead = g;
    return;
  }
  destroy(g);
}

/* What waited for the capture to end: the storages that died in it and the graphs released in it. */
static void release_deferred(void) {
  while (ndying > 0) tpsh_storage_release_deferred(dying[--ndying]);
  free(dying);
  dying = NULL;
  capdying = 0;
  while (ndying_streams > 0) tpsh_stream_release(dying_streams[--ndying_streams]);
  free(dying_streams);
  dying_streams = NULL;
  capdying_streams = 0;
  while (dead) {
    tpsh_graph *g = dead;
    dead = g->next_dead;
    destroy(g);
  }
}

/* ==== begin and end =============================================================================== */
int tpsh_graph_capture_active(void) { return tpsh_graph_capturing; }

int tpsh_graph_begin(tpsh_stream *s, const char *name) {
  if (!tpsh_rt.initialized) return tpsh_error(TPSH_EINVAL, "tpsh is not initialised");
  if (!s) return tpsh_error(TPSH_EINVAL, "expected a stream");
  if (cur) return tpsh_error(TPSH_EINVAL, "a capture is already under way: graphs do not nest (tp.graph inside the "
                             "function of another tp.graph)");
  tpsh_graph *g = calloc(1, sizeof *g);
  capture *c = calloc(1, sizeof *c);
  const char *nm = tpsh_intern(name && *name ? name : "graph", NULL);
  if (!g || !c || !nm) {
    free(g);
    free(c);
    return tpsh_error(TPSH_ENOMEM, "out of host memory");
  }
  g->id = ++next_id;
  g->name = nm;
  g->cap = c;
  g->streams[0] = s;
  g->nstreams = 1;
  tpsh_stream_retain(s);
  g->pool = tpsh_alloc_pool_open();
  int rc = g->pool ? TPSH_OK : TPSH_ENOMEM;
  if (rc == TPSH_OK && native()) rc = BE->graph_begin(s);
  if (rc) {
    free(c);
    g->cap = NULL;
    destroy(g);
    return rc;
  }
  cur = g;
  tpsh_graph_capturing = 1;
  return TPSH_OK;
}

/* A stream with work in the capture that the capture's own stream is not ordered after: the graph would
 * end before that work, which CUDA refuses and the CPU's replay would leave running. */
static int check_joined(const tpsh_graph *g) {
  const capture *c = g->cap;
  for (int j = 1; j < g->nstreams; j++)
    if (c->last_work[j] > c->clock[0][j])
      return tpsh_error(TPSH_EINVAL, "stream '%s' has work in the capture that the capture's stream '%s' does not "
                        "wait for: a graph ends where its stream does, so join it before the function returns "
                        "(tp.current_stream():wait_stream(s), or w:wait() for an async collective)",
                        g->streams[j]->name, g->streams[0]->name);
  return TPSH_OK;
}

/* Before a capture that is given up ends: the capture's stream waits for every other stream of it, so that
 * the backend's capture ends whole on each of them (a stream left unjoined could stay in the capture). The
 * graph made is thrown away; a capture the backend invalidated already refuses these, which is no matter. */
static void join_all(const tpsh_graph *g) {
  tpsh_event *e = g->nstreams > 1 ? tpsh_event_create(0) : NULL;
  for (int i = 1; e && i < g->nstreams; i++)
    if (BE->event_record(e, g->streams[i]) == TPSH_OK) BE->stream_wait_event(g->streams[0], e);
  tpsh_event_release(e);
}

static tpsh_graph *finish(int abort) {
  tpsh_graph *g = cur;
  if (!g) return tpsh_error_null(TPSH_EINVAL, "no capture is under way");
  int rc = abort ? TPSH_OK : check_joined(g);
  void *exec = NULL;
  if (native()) {
    /* a graph of no kernel and no collective has nothing to launch (only waits and records, or nothing) */
    int empty = g->counts[OP_LAUNCH] + g->counts[OP_COLL] == 0;
    if (abort || rc != TPSH_OK) join_all(g);
    int r = BE->graph_end(g->streams[0], abort || rc != TPSH_OK || empty, &exec);
    if (rc == TPSH_OK && !abort && !empty) rc = r;
  }
  char msg[1024] = "";
  if (rc) snprintf(msg, sizeof msg, "%s", tpsh_last_error());
  cur = NULL;
  tpsh_graph_capturing = 0;
  tpsh_alloc_pool_close(g->pool);
  g->exec = exec;
  capture *c = g->cap;
  g->cap = NULL;
  for (int i = 0; i < c->nevents; i++) tpsh_event_release(c->events[i].e);
  free(c->events);
  free(c);
  release_deferred();
  if (abort || rc) {
    destroy(g);
    if (rc) tpsh_error(rc, "%s", msg);
    return NULL;
  }
  return g;
}

tpsh_graph *tpsh_graph_end(void) { return finish(0); }
void tpsh_graph_abort(void) { if (cur) finish(1); }

/* ==== replay ====================================================================================== */
/* A replay on s, for the first time there: the graph's tensors are used by s from now on, for their
 * stream-ordered free (a storage whose memory went back to the pool has nothing to free). */
static int note_replay_stream(tpsh_graph *g, tpsh_stream *s) {
  for (int i = 0; i < g->nreplayed; i++)
    if (g->replayed[i] == s) return TPSH_OK;
  CHECK(tpsh_grow_array((void **)&g->replayed, &g->capreplayed, g->nreplayed + 1, 4, sizeof *g->replayed));
  for (int i = 0; i < g->nheld; i++)
    if (g->held[i]->data) CHECK(tpsh_storage_note_use(g->held[i], s));
  tpsh_stream_retain(s);
  g->replayed[g->nreplayed++] = s;
  return TPSH_OK;
}

/* The backend's launch, after numbering the collectives it holds; one trace record on s. */
static int launch_native(tpsh_graph *g, tpsh_stream *s) {
  for (int i = 0; i < g->nops; i++) {
    if (g->ops[i].kind != OP_COLL) continue;
    graph_coll *c = &g->ops[i].u.coll;
    CHECK(tpsh_coll_launch(s, c->g, c->n, c->c, 0));
  }
  int comm_only = g->counts[OP_COLL] > 0 && g->counts[OP_LAUNCH] == 0;
  int64_t traced = tpsh_trace_on ? tpsh_trace_op_begin(s, g->name, comm_only ? TPSH_TRACE_COMM : TPSH_TRACE_COMPUTE,
                                                        0, -1) : -1;
  int rc = BE->graph_launch(g->exec, s);
  tpsh_trace_op_end(s, traced);
  return rc;
}

/* The record enqueued again through the usual paths: the capture's stream is s, the others are the
 * streams they were; each record and wait on the graph's own events. */
static int enqueue_record(tpsh_graph *g, tpsh_stream *s) {
  if (!g->events && g->nslots > 0) {
    tpsh_event **ev = calloc((size_t)g->nslots, sizeof *ev);
    if (!ev) return tpsh_error(TPSH_ENOMEM, "out of host memory");
    for (int i = 0; i < g->nslots; i++)
      if (!(ev[i] = tpsh_event_create(0))) {
        while (i-- > 0) tpsh_event_release(ev[i]);
        free(ev);
        return TPSH_ENOMEM;
      }
    g->events = ev;
  }
  tpsh_stream *on[MAX_STREAMS];
  on[0] = s;
  for (int i = 1; i < g->nstreams; i++) on[i] = g->streams[i];
  for (int i = 0; i < g->nops; i++) {
    graph_op *op = &g->ops[i];
    tpsh_stream *st = on[op->stream];
    /* check mode: a report names the line that made the op, not the replay's */
    const char *was = tpsh_check_on && op->loc ? tpsh_check_location() : NULL;
    if (was) tpsh_check_set_location(op->loc);
    int rc;
    switch (op->kind) {
    case OP_LAUNCH: rc = tpsh_launch_noted(st, &op->u.k); break;
    case OP_COLL: rc = tpsh_coll_replay(st, op->u.coll.g, op->u.coll.n, op->u.coll.c, op->u.coll.ndesc, op->u.coll.desc); break;
    case OP_RECORD: rc = tpsh_event_record(g->events[op->event], st); break;
    default: rc = tpsh_stream_wait_event(st, g->events[op->event]); break;
    }
    if (was) tpsh_check_set_location(was);
    if (rc) return rc;
  }
  return TPSH_OK;
}

/* Whether a replay launches the native graph (in check mode it enqueues the record: the file's head). */
static int replays_native(const tpsh_graph *g) { return g->exec != NULL && !tpsh_check_on; }

int tpsh_graph_replay(tpsh_graph *g, tpsh_stream *s) {
  if (!g || !s) return tpsh_error(TPSH_EINVAL, "expected a graph and a stream");
  if (tpsh_graph_capturing) return tpsh_graph_refuse("replays a graph");
  CHECK(note_replay_stream(g, s));
  /* Replays of one graph run one after another, as CUDA orders the launches of one graph: they share
   * its memory. On the same stream that is the stream's order. */
  if (g->last && g->last != s) CHECK(tpsh_stream_wait_stream(s, g->last));
  g->last = s;
  int rc = replays_native(g) ? launch_native(g, s) : enqueue_record(g, s);
  if (rc == TPSH_OK) g->replays++;
  return rc;
}

/* ==== what it holds =============================================================================== */
const char *tpsh_graph_name(const tpsh_graph *g) { return g ? g->name : ""; }

void tpsh_graph_get_info(const tpsh_graph *g, tpsh_graph_info *out) {
  memset(out, 0, sizeof *out);
  if (!g) return;
  out->kernels = g->counts[OP_LAUNCH];
  out->collectives = g->counts[OP_COLL];
  out->records = g->counts[OP_RECORD];
  out->waits = g->counts[OP_WAIT];
  out->streams = g->nstreams;
  out->tensors = g->nheld;
  out->pool_bytes = tpsh_alloc_pool_bytes(g->pool);
  out->replays = g->replays;
  out->native = replays_native(g);
}
