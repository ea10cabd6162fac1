/*
 * collective.c: the front door of every communication op (backend-neutral).
 *
 * Like ops.c for kernels: every public collective checks its arguments first, so that a mistake is
 * reported before anything is enqueued, with the expected and the received shapes in the message; then
 * it describes itself as tpsh_coll_args (contiguous buffers, NCCL-style counts) and hands them to the
 * backend in one call, be->collectives(s, g, n, args), after noting that s uses each storage (for the
 * stream-ordered free) and numbering each collective with the group's sequence number (issue order,
 * which the CPU backend uses to start MPI calls in the same order on every rank).
 *
 * Batches: between tpsh_batch_begin(g) and tpsh_batch_end(s, g, ...), the collectives on g are checked
 * and recorded, not issued; batch_end issues all of them as one backend call (ncclGroupStart/End on CUDA,
 * one "start everything, then wait for all" op on the CPU), which is what makes a send/recv ring work.
 * Every single collective also goes through a batch of one, so there is one path to the backend.
 *
 * Contiguity: collective buffers must be contiguous (as in NCCL and torch.distributed); anything else
 * is rejected with a message that suggests :contiguous(). The exception is the list form of
 * all_gather, whose outputs may have any strides, since it gathers into a temporary and copies out.
 */
#include "core/backend.h"
#include "core/chaos.h"
#include "core/p2p_ledger.h"
#include "core/group.h"
#include "core/check.h"
#include "core/coll_kinds.h"
#include "core/collective.h"
#include "core/trace.h"
#include "core/work.h"
#include "core/graph.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(expr) do { int rc_ = (expr); if (rc_) return rc_; } while (0)

/* ==== the batch of a group ====================================================================== */
typedef struct coll_batch {
  tpsh_coll_args *args;
  int n, cap;
  /* The storage of every tensor used, one reference each (no allocation per call): the storages stay
   * alive until the batch is issued, which is when the uses are noted; a tensor freed in between is an
   * error then. In check mode the tensors' descriptors too, for the sanitizer (held_t[i] is held[i]'s,
   * for the first ndesc); otherwise a small collective copies no descriptor. */
  tpsh_storage **held;
  int nheld, capheld;
  tpsh_tensor *held_t;
  int ndesc, capdesc;
  /* Copies to enqueue after the collectives (list-form all_gather): copies[2i] <- copies[2i + 1]; in
   * check mode copy_loc[i] is the line of the call that made copy i, which the sanitizer reports (they
   * are issued when the batch is: g:batch's last line, else). */
  tpsh_tensor **copies;
  int ncopies, capcopies;
  const char **copy_loc;
  int capcopy_loc;
  struct coll_large *large; /* what only large batches use (below); NULL until one is: a batch of one
                             * on the stack (tpsh_collective_work) zeroes one pointer more, no more */
  int open;                 /* opened by tpsh_batch_begin (a user batch), not a batch of one */
  const tpsh_group *g;      /* whose batch it is */
  struct coll_batch *next_open;   /* the list of open batches (tpsh_batch_ahead), while open */
} coll_batch;

static coll_batch *open_batches;

static void unlink_open(coll_batch *b) {
  for (coll_batch **p = &open_batches; *p; p = &(*p)->next_open)
    if (*p == b) { *p = b->next_open; break; }
  b->next_open = NULL;
}

/* Large batches only (past HOLD_LINEAR_MAX storages, OVERLAP_PAIRWISE_MAX collectives): a set of the
 * held storages (open addressing; an entry counts when its stamp is hstamp, so clearing the set is one
 * increment, not a pass over a table that a batch of 100k left large) and the overlap check's spans.
 * Grown on first use and kept, as args and held are. */
typedef struct held_entry { const tpsh_storage *st; uint32_t stamp; } held_entry;
typedef struct coll_large {
  held_entry *hset;
  int caphset, nhashed;     /* the batch's held[0..nhashed) are in the set */
  uint32_t hstamp;
  struct coll_span *spans;
  int capspans;
} coll_large;

static coll_large *large_of(coll_batch *b) {
  if (!b->large) b->large = calloc(1, sizeof *b->large);
  return b->large;
}

static void held_set_clear(coll_large *L) {
  L->nhashed = 0;
  if (++L->hstamp == 0) {                 /* wrapped: stamps of 2^32 batches ago would count again */
    if (L->hset) memset(L->hset, 0, (size_t)L->caphset * sizeof *L->hset);
    L->hstamp = 1;
  }
}

TPSH_HOT static void batch_clear(coll_batch *b) {
  for (int i = 0; i < b->nheld; i++) tpsh_storage_unref(b->held[i]);
  for (int i = 0; i < 2 * b->ncopies; i++) tpsh_tensor_release(b->copies[i]);
  if (b->large && b->large->nhashed) held_set_clear(b->large);
  b->n = b->nheld = b->ndesc = b->ncopies = 0;
  if (b->open) unlink_open(b);
  b->open = 0;
}

TPSH_HOT static coll_batch *batch_of(tpsh_group *g) {
  if (!g->batch && (g->batch = calloc(1, sizeof(coll_batch)))) ((coll_batch *)g->batch)->g = g;
  return g->batch;
}

void tpsh_group_batch_free(tpsh_group *g) {
  coll_batch *b = g->batch;
  if (!b) return;
  batch_clear(b);
  free(b->args); free(b->held); free(b->held_t); free(b->copies); free(b->copy_loc);
  if (b->large) { free(b->large->hset); free(b->large->spans); free(b->large); }
  free(b);
  g->batch = NULL;
}

TPSH_HOT static tpsh_tensor *hold(const tpsh_tensor *t) {
  return tpsh_tensor_as_strided(t, t->ndim, t->sizes, t->strides, t->offset);
}

/* The held storages are looked up by a linear search up to this many (a batch of a few collectives, the
 * common case, allocates nothing more), in a set beyond: searching the list would make a batch of n
 * collectives of separate tensors cost n^2 / 2 compares (100k all_reduces: 5e9). */
enum { HOLD_LINEAR_MAX = 16 };

static size_t held_home(const tpsh_storage *st, int cap) {
  return (size_t)(((uint64_t)(uintptr_t)st * 11400714819323198485ull) >> 32) & (size_t)(cap - 1);
}

/* Whether st is in the set; if not and add, puts it there. */
static int held_set_has(coll_large *L, const tpsh_storage *st, int add) {
  size_t j = held_home(st, L->caphset);
  for (; L->hset[j].stamp == L->hstamp; j = (j + 1) & (size_t)(L->caphset - 1))
    if (L->hset[j].st == st) return 1;
  if (add) L->hset[j] = (held_entry){st, L->hstamp};
  return 0;
}

/* Makes the set hold held[0..nheld) with room for one more at half load: NULL when out of memory (the
 * caller searches the list instead). */
static coll_large *held_set_fill(coll_batch *b) {
  coll_large *L = large_of(b);
  if (!L) return NULL;
  if (2 * (b->nheld + 1) > L->caphset) {
    int cap = L->caphset ? L->caphset : 64;
    while (cap < 2 * (b->nheld + 1)) cap *= 2;
    held_entry *h = calloc((size_t)cap, sizeof *h);
    if (!h) return NULL;
    free(L->hset);
    L->hset = h;
    L->caphset = cap;
    L->hstamp = 1;
    L->nhashed = 0;                       /* a new table: every held storage goes in again */
  }
  for (; L->nhashed < b->nheld; L->nhashed++) held_set_has(L, b->held[L->nhashed], 1);
  return L;
}

/* Whether a batch past HOLD_LINEAR_MAX storages holds st already. */
__attribute__((noinline)) static int held_by_large(coll_batch *b, const tpsh_storage *st) {
  coll_large *L = held_set_fill(b);
  if (L) return held_set_has(L, st, 0);
  for (int i = 0; i < b->nheld; i++)
    if (b->held[i] == st) return 1;
  return 0;
}

TPSH_HOT static int batch_hold(coll_batch *b, const tpsh_tensor *t) {
  if (__builtin_expect(b->nheld >= HOLD_LINEAR_MAX, 0)) {
    if (held_by_large(b, t->storage)) return TPSH_OK;
  } else {
    for (int i = 0; i < b->nheld; i++)
      if (b->held[i] == t->storage) return TPSH_OK;
  }
  CHECK(tpsh_grow_array((void **)&b->held, &b->capheld, b->nheld + 1, 4, sizeof *b->held));
  if (tpsh_check_on && b->ndesc == b->nheld &&
      tpsh_grow_array((void **)&b->held_t, &b->capdesc, b->ndesc + 1, 4, sizeof *b->held_t) == TPSH_OK)
    b->held_t[b->ndesc++] = *t;
  b->held[b->nheld++] = t->storage;
  tpsh_storage_retain(t->storage);
  return TPSH_OK;
}

/* Records one collective (and the tensors it uses) in g's batch. */
TPSH_HOT static int record(tpsh_group *g, const tpsh_coll_args *a, int nt, const tpsh_tensor *const *ts) {
  coll_batch *b = batch_of(g);
  if (!b) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  CHECK(tpsh_grow_array((void **)&b->args, &b->cap, b->n + 1, 4, sizeof *b->args));
  for (int i = 0; i < nt; i++) CHECK(batch_hold(b, ts[i]));
  b->args[b->n] = *a;
  b->args[b->n++].loc = tpsh_check_on ? tpsh_check_location() : NULL;
  return TPSH_OK;
}

static int record_copy(tpsh_group *g, const tpsh_tensor *dst, const tpsh_tensor *src) {
  coll_batch *b = g->batch;
  CHECK(batch_hold(b, dst));           /* the outputs are the Work's tensors too (tpsh_batch_end_work) */
  CHECK(tpsh_grow_array((void **)&b->copies, &b->capcopies, 2 * b->ncopies + 2, 4, sizeof *b->copies));
  CHECK(tpsh_grow_array((void **)&b->copy_loc, &b->capcopy_loc, b->ncopies + 1, 4, sizeof *b->copy_loc));
  tpsh_tensor *d = hold(dst), *s = hold(src);
  if (!d || !s) { tpsh_tensor_release(d); tpsh_tensor_release(s); return TPSH_ENOMEM; }
  b->copy_loc[b->ncopies] = tpsh_check_on ? tpsh_check_location() : NULL;
  b->copies[2 * b->ncopies] = d;
  b->copies[2 * b->ncopies++ + 1] = s;
  return TPSH_OK;
}

void tpsh_coll_footprint(const tpsh_coll_args *c, int size, int rank, size_t *reads, size_t *writes) {
  size_t es = (size_t)tpsh_dtype_size(c->dtype);
  const tpsh_coll_kind_info *k = &tpsh_coll_kinds[c->kind];
  int root = c->peer == rank;
  *reads = tpsh_coll_touches(k->reads, root) ? (size_t)tpsh_coll_send_count(c->kind, c->count, size) * es : 0;
  *writes = tpsh_coll_touches(k->writes, root) ? (size_t)tpsh_coll_recv_count(c->kind, c->count, size) * es : 0;
}

/* Whether the byte spans [p, p + n) and [q, q + m) share a byte (an empty span meets nothing). */
TPSH_HOT static int spans_meet(const char *p, size_t n, const char *q, size_t m) {
  return n && m && p < q + m && q < p + n;
}

static const char *coll_name(const tpsh_coll_args *a) { return a->name ? a->name : "collective"; }

/* The collectives of one batch run at the same time (one ncclGroupStart/End; on the CPU, every MPI
 * request started before any is waited for), so one that writes memory another of the batch reads or
 * writes gives an undefined result: an in-place ring shift (send x, recv x) or all_reduces of
 * overlapping views. Refused before anything is enqueued, in every mode, as ops.c refuses an in-place
 * op whose operand overlaps its output.
 *
 * The message names the first pair (i, j), i < j, in the order of the batch. Every pair is compared
 * from collective `from` on: quadratic, for small batches and for the pair's search once
 * first_in_conflict has said where it starts. */
static int overlap_pairwise(const coll_batch *b, int size, int rank, int from) {
  for (int i = from; i < b->n; i++) {
    size_t ri, wi;
    tpsh_coll_footprint(&b->args[i], size, rank, &ri, &wi);
    const char *wi_lo = b->args[i].recv, *ri_lo = b->args[i].send;
    for (int j = i + 1; j < b->n; j++) {
      size_t rj, wj;
      tpsh_coll_footprint(&b->args[j], size, rank, &rj, &wj);
      const char *wj_lo = b->args[j].recv, *rj_lo = b->args[j].send;
      const char *what = spans_meet(wi_lo, wi, wj_lo, wj) ? "writes memory that the other writes too"
                         : spans_meet(wi_lo, wi, rj_lo, rj) ? "writes memory that the other reads"
                         : spans_meet(ri_lo, ri, wj_lo, wj) ? "reads memory that the other writes" : NULL;
      if (what)
        return tpsh_error(TPSH_EINVAL, "the %s (collective %d of the batch) %s, the %s (collective %d): the "
                          "collectives of one batch run at the same time, so the result would be undefined "
                          "(use separate buffers, or two batches)", coll_name(&b->args[i]), i + 1, what,
                          coll_name(&b->args[j]), j + 1);
    }
  }
  return TPSH_OK;
}

/* A byte span that a collective reads or writes (not empty), for the sweep. */
typedef struct coll_span { uintptr_t lo, hi; int owner, write; } coll_span;

static int span_cmp(const void *x, const void *y) {
  const coll_span *a = x, *b = y;
  return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Among the spans swept so far: the largest end (hi1, a span of collective own1) and the largest end of
 * a span of any other collective (hi2). For a span of collective o, own1 != o ? hi1 : hi2 is the largest
 * end of another collective's span: its own collective's spans may meet it (in place) and do not count. */
typedef struct top2 { uintptr_t hi1, hi2; int own1; } top2;

static void top2_add(top2 *t, const coll_span *s) {
  if (s->hi > t->hi1) {
    if (s->owner != t->own1) t->hi2 = t->hi1;
    t->hi1 = s->hi;
    t->own1 = s->owner;
  } else if (s->owner != t->own1 && s->hi > t->hi2) {
    t->hi2 = s->hi;
  }
}

/* The least collective that one of the spans q (sorted by start) meets in a span of another collective
 * among t (sorted by start); n if none. A span meets one that starts no later (lo' <= lo) if that one
 * ends after lo, the largest such end telling; else only the first to start after lo, whose collective
 * differs from q's (each collective has at most two spans, so it is among the next three). */
static int sweep_meets(const coll_span *q, int nq, const coll_span *t, int nt, int n) {
  int least = n, p = 0;
  top2 before = {0, 0, -1};
  for (int i = 0; i < nq; i++) {
    for (; p < nt && t[p].lo <= q[i].lo; p++) top2_add(&before, &t[p]);
    int meets = (before.own1 != q[i].owner ? before.hi1 : before.hi2) > q[i].lo;
    for (int k = p; !meets && k < nt && k < p + 3; k++)
      if (t[k].owner != q[i].owner) { meets = t[k].lo < q[i].hi; break; }
    if (meets && q[i].owner < least) least = q[i].owner;
  }
  return least;
}

/* The least collective that conflicts with another of the batch (a write that meets anything of
 * another, a read that meets another's write); b->n if none, 0 when out of memory (the caller then
 * compares every pair). Sorting the spans makes it O(n log n): the quadratic pair loop takes minutes
 * for a batch of 100k all_reduces. The least such collective is the first i of the pair loop's first pair:
 * a pair's lesser member conflicts with a later collective, and is no greater than either member. */
__attribute__((noinline)) static int first_in_conflict(coll_batch *b, int size, int rank) {
  coll_large *L = large_of(b);
  if (!L || tpsh_grow_array((void **)&L->spans, &L->capspans, 4 * b->n, 64, sizeof *L->spans)) return 0;
  coll_span *all = L->spans;
  int nall = 0;
  for (int i = 0; i < b->n; i++) {
    size_t r, w;
    tpsh_coll_footprint(&b->args[i], size, rank, &r, &w);
    if (r) all[nall++] = (coll_span){(uintptr_t)b->args[i].send, (uintptr_t)b->args[i].send + r, i, 0};
    if (w) all[nall++] = (coll_span){(uintptr_t)b->args[i].recv, (uintptr_t)b->args[i].recv + w, i, 1};
  }
  qsort(all, (size_t)nall, sizeof *all, span_cmp);
  coll_span *writes = all + nall, *reads;  /* the writes, then the reads, each still sorted */
  int nw = 0, nr = 0;
  for (int k = 0; k < nall; k++) if (all[k].write) writes[nw++] = all[k];
  reads = writes + nw;
  for (int k = 0; k < nall; k++) if (!all[k].write) reads[nr++] = all[k];
  int a = sweep_meets(writes, nw, all, nall, b->n);   /* a write against anything */
  int c = sweep_meets(reads, nr, writes, nw, b->n);   /* a read against the writes */
  return a < c ? a : c;
}

/* Collectives past this many are first swept (first_in_conflict), and only the pair it points at is
 * searched; up to it, comparing every pair is cheaper than sorting and allocates nothing. */
enum { OVERLAP_PAIRWISE_MAX = 16 };

static int check_batch_overlap(coll_batch *b, int size, int rank) {
  int from = b->n <= OVERLAP_PAIRWISE_MAX ? 0 : first_in_conflict(b, size, rank);
  return from < b->n ? overlap_pairwise(b, size, rank, from) : TPSH_OK;
}

TPSH_HOT static int is_self(const tpsh_coll_args *a, int kind, int me) { return a->kind == kind && a->peer == me; }

/* The next send (or receive) to oneself from index i of the batch on; b->n when there is none. */
static int next_self(const coll_batch *b, int i, int kind, int me) {
  while (i < b->n && !is_self(&b->args[i], kind, me)) i++;
  return i;
}

/* A send to oneself completes only with a receive from oneself in the same launch, and the k-th such
 * send meets the k-th such receive (MPI matches one tag in order; NCCL pairs them so too). They must
 * agree on dtype and element count, which neither checks: a smaller message leaves the rest of the
 * receive as it was, an f32 into an i32 moves raw bits. Across ranks only check mode compares
 * (coll_match.c), but here both sides are in this batch. */
static int check_self_p2p(const coll_batch *b, int me) {
  int s = next_self(b, 0, TPSH_C_SEND, me), r = next_self(b, 0, TPSH_C_RECV, me);
  for (; s < b->n && r < b->n; s = next_self(b, s + 1, TPSH_C_SEND, me), r = next_self(b, r + 1, TPSH_C_RECV, me)) {
    const tpsh_coll_args *x = &b->args[s], *y = &b->args[r];
    if (x->dtype == y->dtype && x->count == y->count) continue;
    return tpsh_error(TPSH_EINVAL, "the send to this rank (collective %d of the batch: %s x %lld elements) meets the "
                      "receive from it (collective %d: %s x %lld elements): a send to oneself must match its "
                      "receive in dtype and element count", s + 1, tpsh_dtype_name(x->dtype), (long long)x->count,
                      r + 1, tpsh_dtype_name(y->dtype), (long long)y->count);
  }
  if (s == r) return TPSH_OK;                                   /* both b->n: every one met its pair */
  return tpsh_error(TPSH_EINVAL, "peer %d is this rank: a %s to oneself needs a matching %s in the same batch "
                    "(g:batch)", me, s < b->n ? "send" : "receive", s < b->n ? "receive" : "send");
}

/* A count above the backend's limit (max_coll_count: MPI's int on the CPU) is refused here, before the
 * collective is numbered: refused by the backend, after the core has taken its sequence number, it would
 * leave every later collective of the group waiting for that number's turn until the watchdog's timeout. */
static int check_counts(const coll_batch *b) {
  int64_t most = tpsh_rt.be->max_coll_count;
  for (int i = 0; most > 0 && i < b->n; i++) {
    const tpsh_coll_args *a = &b->args[i];
    if (a->count <= most) continue;
    char where[48] = "";
    if (b->n > 1) snprintf(where, sizeof where, "collective %d of the batch: ", i + 1);
    return tpsh_error(TPSH_EUNSUPPORTED, "%s%s of %lld elements per rank: the %s backend's collectives take at "
                      "most %lld", where, a->name, (long long)a->count, tpsh_rt.be->name, (long long)most);
  }
  return TPSH_OK;
}

/* Numbers the n collectives of one launch on g (issue order, coll_index and the digest), gives them to the
 * flight recorder and, with call, to the backend on s (traced, watched); sends and receives go to the
 * ledger. batch_issue's last step, and the replay of a graph's collectives (core/graph.c), which count as
 * issued at each replay (call 0: the backend's graph launch runs them). */
TPSH_HOT int tpsh_coll_launch(tpsh_stream *s, tpsh_group *g, int n, tpsh_coll_args *c, int call) {
  int colls = 0;                         /* of the launch's, those every member issues */
  for (int i = 0; i < n; i++) {
    c[i].seq = g->seq++;
    int p2p = tpsh_coll_is_p2p(c[i].kind);
    c[i].coll_index = p2p ? -1 : (int64_t)g->collectives++;
    if (!p2p) {
      g->digest += tpsh_coll_digest_term(c[i].coll_index, &c[i]);
      colls++;
    }
  }
  tpsh_flight_enqueue(s, g, n, c);                                          /* flight recorder */
  int64_t traced = -1;
  if (call) {
    traced = tpsh_trace_collectives_begin(s, g, n, c);                    /* tp.trace; -1 when off */
    tpsh_watch_call_begin();                                     /* NCCL may block here: watched */
    int rc = tpsh_rt.be->collectives(s, g, n, c);
    tpsh_watch_call_end();
    if (rc && colls) tpsh_group_note_failure(g);
    CHECK(rc);
  }
  if (colls < n) CHECK(tpsh_p2p_ledger_note(g, c, n));   /* compared at the script's end */
  tpsh_trace_op_end(s, traced);
  return TPSH_OK;
}

/* A graph's collectives enqueued again (its replay on the CPU backend, and in check mode): checked as
 * batch_issue checks a launch, with the descriptors the capture kept (desc), then launched. */
int tpsh_coll_replay(tpsh_stream *s, tpsh_group *g, int n, tpsh_coll_args *c, int ndesc, const tpsh_tensor *desc) {
  TPSH_CHECK_HOOK(tpsh_check_collectives_match(g, n, c));
  TPSH_CHECK_HOOK(tpsh_check_collectives(s, g, n, c, ndesc, desc));
  return tpsh_coll_launch(s, g, n, c, 1);
}

/* Issues what batch b of group g holds on s: checks, then (when given) s waits for `after` and records
 * `start`, then the uses, sequence numbers, one backend call, the copies, and `end`. */
TPSH_HOT static int batch_issue(tpsh_stream *s, tpsh_group *g, coll_batch *b, tpsh_stream *after, tpsh_event *start,
                                tpsh_event *end) {
  if (!s) return tpsh_error(TPSH_EINVAL, "expected a stream");
  if (open_batches) unlink_open(b);      /* being issued: its own copies below come after its collectives */
  for (int i = 0; i < b->nheld; i++)
    if (!b->held[i]->data)
      return tpsh_error(TPSH_EINVAL, "a tensor used by the batch was freed before the batch was issued");
  CHECK(check_counts(b));
  CHECK(check_self_p2p(b, g->rank));
  if (b->n > 1) CHECK(check_batch_overlap(b, g->size, g->rank));
  /* tp.graph: a capture records the collectives; they are checked, numbered and issued at each replay */
  int capturing = tpsh_graph_capturing;
  if (!capturing) TPSH_CHECK_HOOK(tpsh_check_collectives_match(g, b->n, b->args));   /* check mode: ranks compare first */
  if (after && after != s) CHECK(tpsh_stream_wait_stream(s, after));
  if (tpsh_chaos_on && b->n > 0) CHECK(tpsh_chaos_delay(s, TPSH_CHAOS_COLLECTIVE));   /* after the wait: late */
  if (start) CHECK(tpsh_event_record(start, s));
  for (int i = 0; i < b->nheld; i++) CHECK(tpsh_storage_note_use(b->held[i], s));
  if (!capturing) TPSH_CHECK_HOOK(tpsh_check_collectives(s, g, b->n, b->args, b->ndesc, b->held_t));   /* sanitizer */
  if (b->n > 0)
    CHECK(capturing ? tpsh_graph_collectives(s, g, b->n, b->args, b->nheld, b->held, b->ndesc, b->held_t)
                    : tpsh_coll_launch(s, g, b->n, b->args, 1));
  for (int i = 0; i < b->ncopies; i++) {
    /* check mode: the copy is the all_gather's, at the all_gather's line (not g:batch's last line, nor
     * named "copy_") */
    const char *was = tpsh_check_on && b->copy_loc[i] ? tpsh_check_location() : NULL;
    if (was) { tpsh_check_set_location(b->copy_loc[i]); tpsh_check_kept_by_work(1); }
    int rc = tpsh_copy_named(s, b->copies[2 * i], b->copies[2 * i + 1], "all_gather (its copy to a list output)");
    if (was) { tpsh_check_set_location(was); tpsh_check_kept_by_work(0); }
    CHECK(rc);
  }
  if (end) CHECK(tpsh_event_record(end, s));
  return TPSH_OK;
}

TPSH_HOT int tpsh_batch_begin(tpsh_group *g) {
  if (!g) return tpsh_error(TPSH_EINVAL, "expected a group");
  coll_batch *b = batch_of(g);
  if (!b) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  if (b->open) return tpsh_error(TPSH_EINVAL, "a batch is already open on this group (batches do not nest)");
  batch_clear(b);
  b->open = 1;
  b->next_open = open_batches;
  open_batches = b;
  return TPSH_OK;
}

/* Check mode: the first collective recorded in an open batch that writes any of the n bytes at p, or
 * reads them when `write` is set (an op about to read or write them); NULL if none. g:batch issues its
 * collectives when its function returns, so such an op, enqueued in the function after the collective's
 * call, runs before the collective: the sanitizer reports it (it is ordered, so no race). The outputs of
 * all_gather's list form are written by copies the batch also holds, and are not looked at. */
const tpsh_coll_args *tpsh_batch_ahead(const void *p, size_t n, int write) {
  for (const coll_batch *b = open_batches; b; b = b->next_open)
    for (int i = 0; i < b->n; i++) {
      size_t reads, writes;
      tpsh_coll_footprint(&b->args[i], b->g->size, b->g->rank, &reads, &writes);
      if (spans_meet(b->args[i].recv, writes, p, n) || (write && spans_meet(b->args[i].send, reads, p, n)))
        return &b->args[i];
    }
  return NULL;
}

TPSH_HOT int tpsh_batch_end(tpsh_stream *s, tpsh_group *g, tpsh_stream *after, tpsh_event *start, tpsh_event *end) {
  if (!g) return tpsh_error(TPSH_EINVAL, "expected a group");
  coll_batch *b = g->batch;
  if (!b || !b->open) return tpsh_error(TPSH_EINVAL, "no batch is open on this group");
  int rc = batch_issue(s, g, b, after, start, end);
  batch_clear(b);
  return rc;
}

/* tpsh_batch_end with a Work ticket's event as the end event: one call from Lua per collective. The
 * ticket's slot takes over the batch's references to the storages it used, so that the Work keeps its
 * tensors alive without holding them in Lua (work.c). */
TPSH_HOT double tpsh_batch_end_work(tpsh_stream *s, tpsh_group *g, tpsh_stream *after) {
  if (!g) return -tpsh_error(TPSH_EINVAL, "expected a group");
  coll_batch *b = g->batch;
  if (!b || !b->open) return -tpsh_error(TPSH_EINVAL, "no batch is open on this group");
  double ticket = s ? tpsh_work_take(s) : -tpsh_error(TPSH_EINVAL, "expected a stream");
  int rc = ticket < 0 ? (int)-ticket : batch_issue(s, g, b, after, NULL, tpsh_work_event(ticket));
  if (rc == TPSH_OK) {
    tpsh_work_keep(ticket, b->nheld, b->held);
    b->nheld = 0;                                        /* the references are the ticket's now */
  } else if (ticket >= 0) {
    tpsh_work_drop(ticket);
  }
  batch_clear(b);
  return rc == TPSH_OK ? ticket : -rc;
}

void tpsh_batch_cancel(tpsh_group *g) {
  if (g && g->batch) batch_clear(g->batch);
}

/* A plain call: recorded into the open batch, or issued at once as a batch of one. */
TPSH_HOT static int submit(tpsh_stream *s, tpsh_group *g, int rc) {
  coll_batch *b = g->batch;
  if (b && b->open) return rc;           /* recorded; issued by tpsh_batch_end */
  if (rc == TPSH_OK) rc = batch_issue(s, g, b, NULL, NULL, NULL);
  if (b) batch_clear(b);
  return rc;
}

/* ==== argument checks ============================================================================ */
TPSH_HOT static int in_batch(const tpsh_group *g) { return g->batch && ((coll_batch *)g->batch)->open; }

TPSH_HOT static int check_call(tpsh_stream *s, tpsh_group *g) {
  if (!g) return tpsh_error(TPSH_EINVAL, "expected a group");
  if (!s && !in_batch(g)) return tpsh_error(TPSH_EINVAL, "expected a stream");
  return TPSH_OK;
}

static const char *strides_str(const tpsh_tensor *t, char *buf, size_t n) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, d ? ", %lld" : "%lld", (long long)t->strides[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

TPSH_HOT static int check_buffer(const char *what, const tpsh_tensor *t) {
  CHECK(tpsh_check_tensor(what, t));
  if (tpsh_tensor_is_contiguous(t)) return TPSH_OK;
  char a[160], b[160];
  return tpsh_error(TPSH_EINVAL, "%s: expected a contiguous tensor, got shape %s with strides %s "
                    "(call :contiguous() first)", what, tpsh_shape_str(t, a, sizeof a), strides_str(t, b, sizeof b));
}

TPSH_HOT static int check_dtype(const char *what, const tpsh_tensor *ref, const tpsh_tensor *t) {
  if (ref->dtype_id == t->dtype_id) return TPSH_OK;
  return tpsh_error(TPSH_EINVAL, "%s: expected dtype %s (the input's), got %s", what,
                    tpsh_dtype_name(ref->dtype_id), tpsh_dtype_name(t->dtype_id));
}

TPSH_HOT static int same_sizes(const tpsh_tensor *t, int ndim, const int64_t *sizes) {
  if (t->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++)
    if (t->sizes[d] != sizes[d]) return 0;
  return 1;
}

/* Writes into buf the shape of x with dimension 1 multiplied by n ("concatenated") or with a new
 * leading dimension n ("stacked"); returns ndim. */
TPSH_HOT static int scaled_shape(const tpsh_tensor *x, int64_t n, int stacked, int64_t *sizes) {
  if (stacked || x->ndim == 0) {
    sizes[0] = n;
    for (int d = 0; d < x->ndim; d++) sizes[d + 1] = x->sizes[d];
    return x->ndim + 1;
  }
  for (int d = 0; d < x->ndim; d++) sizes[d] = x->sizes[d];
  sizes[0] *= n;
  return x->ndim;
}

/* big must be x's shape times n along dimension 1, or stacked n times (as torch's
 * all_gather_into_tensor and reduce_scatter_tensor accept). */
TPSH_HOT static int check_scaled(const char *what, const tpsh_tensor *big, const tpsh_tensor *x, int64_t n,
                        const char *xname) {
  int64_t cat[TPSH_MAX_DIMS + 1] = {0}, stk[TPSH_MAX_DIMS + 1] = {0};
  int ncat = scaled_shape(x, n, 0, cat), nstk = scaled_shape(x, n, 1, stk);
  if (same_sizes(big, ncat, cat) || (nstk <= TPSH_MAX_DIMS && same_sizes(big, nstk, stk))) return TPSH_OK;
  char a[160], b[160], c[160];
  /* (tpsh_sizes_str: the stacked shape of an 8-D x has 9 sizes, and copying them into a tensor's 8 for
   * tpsh_shape_str wrote past its sizes, as -fsanitize=undefined said under scripts/ci/fuzz_api.lua) */
  return tpsh_error(TPSH_EINVAL, "%s: expected shape %s (%lld x the %s along dimension 1) or %s, got %s", what,
                    tpsh_sizes_str(ncat, cat, a, sizeof a), (long long)n, xname,
                    tpsh_sizes_str(nstk, stk, b, sizeof b), tpsh_shape_str(big, c, sizeof c));
}

TPSH_HOT static int check_same_shape(const char *what, const tpsh_tensor *ref, const tpsh_tensor *t) {
  if (same_sizes(t, ref->ndim, ref->sizes)) return TPSH_OK;
  char a[160], b[160];
  return tpsh_error(TPSH_EINVAL, "%s: expected shape %s (the input's), got %s", what,
                    tpsh_shape_str(ref, a, sizeof a), tpsh_shape_str(t, b, sizeof b));
}

TPSH_HOT static int check_rank(const char *what, const tpsh_group *g, int r) {
  if (r >= 0 && r < g->size) return TPSH_OK;
  return tpsh_error(TPSH_EINVAL, "%s %d is outside the group: expected a rank in [0, %d)", what, r, g->size);
}

TPSH_HOT static int check_op(int op) {
  if (op >= TPSH_SUM && op <= TPSH_PROD) return TPSH_OK;
  return tpsh_error(TPSH_EINVAL, "unknown reduce op %d: expected sum (0), avg (1), max (2), min (3) or prod (4)", op);
}

TPSH_HOT static char *first_byte(const tpsh_tensor *t) { return tpsh_tensor_data(t); }
TPSH_HOT static size_t nbytes(const tpsh_tensor *t) { return (size_t)tpsh_tensor_numel(t) * tpsh_tensor_elsize(t); }

TPSH_HOT static int overlap(const tpsh_tensor *a, const tpsh_tensor *b) {
  if (a->storage != b->storage) return 0;
  if (a == b) return 1;                                  /* in place: the callers allow it at once */
  return spans_meet(first_byte(a), nbytes(a), first_byte(b), nbytes(b));
}

/* One dimension of a search in views_meet: k * s for an integer k in [lo, hi]. */
typedef struct lattice_dim { int64_t s, lo, hi; } lattice_dim;

static int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); }

/* Whether some sum of d[i].k * d[i].s over the n dimensions lies in [tlo, thi]: depth first, the
 * largest stride first, trying only the k whose remainder the other dimensions can still reach. A view
 * whose elements do not repeat leaves one to three k per dimension; *budget bounds the steps for those
 * that do, and running out counts as no (not told). */
static int lattice_hits(const lattice_dim *d, int n, int64_t tlo, int64_t thi, int *budget) {
  if (--*budget < 0) return 0;
  if (n == 0) return tlo <= 0 && 0 <= thi;
  int64_t rmin = 0, rmax = 0;
  for (int i = 1; i < n; i++) { rmin += d[i].lo * d[i].s; rmax += d[i].hi * d[i].s; }
  int64_t klo = -floor_div(rmax - tlo, d[0].s), khi = floor_div(thi - rmin, d[0].s);
  if (klo < d[0].lo) klo = d[0].lo;
  if (khi > d[0].hi) khi = d[0].hi;
  for (int64_t k = klo; k <= khi; k++)
    if (lattice_hits(d + 1, n - 1, tlo - k * d[0].s, thi - k * d[0].s, budget)) return 1;
  return 0;
}

/* Whether the views a and b share an element, for the outputs of all_gather's list form, which may be
 * any views (interleaved chunks of one tensor share none, though their spans meet). Told exactly where
 * one of them is contiguous (is any of the other's elements in its block?) or both step alike (is the
 * distance between their first elements a difference of two index vectors?); otherwise left alone, as
 * ops.c leaves strided views it cannot tell cheaply. Offsets in elements: the callers check the dtypes
 * alike first. */
static int views_meet(const tpsh_tensor *a, const tpsh_tensor *b) {
  if (a->storage != b->storage || !tpsh_tensor_numel(a) || !tpsh_tensor_numel(b)) return 0;
  if (tpsh_tensor_is_contiguous(b)) { const tpsh_tensor *t = a; a = b; b = t; }
  int block = tpsh_tensor_is_contiguous(a);
  if (!block && a->ndim != b->ndim) return 0;
  for (int i = 0; !block && i < a->ndim; i++)
    if (a->strides[i] != b->strides[i]) return 0;
  lattice_dim d[TPSH_MAX_DIMS];
  int n = 0;
  for (int i = 0; i < b->ndim; i++) {
    int64_t s = b->strides[i], hi = b->sizes[i] - 1, lo = block ? 0 : -(a->sizes[i] - 1);
    if (s == 0 || (lo == 0 && hi == 0)) continue;
    if (s < 0) { int64_t t = lo; lo = -hi; hi = -t; s = -s; }
    int j = n++;                                           /* insertion sort: the largest stride first */
    while (j > 0 && d[j - 1].s < s) { d[j] = d[j - 1]; j--; }
    d[j] = (lattice_dim){s, lo, hi};
  }
  /* block: an element of b at a's offset + [0, numel(a)); alike: b's element i meets a's element j */
  int64_t tlo = a->offset - b->offset, thi = block ? tlo + tpsh_tensor_numel(a) - 1 : tlo;
  int budget = 1 << 14;
  return lattice_hits(d, n, tlo, thi, &budget);
}

TPSH_HOT static tpsh_coll_args coll(int kind, const tpsh_tensor *send, const tpsh_tensor *recv, int64_t count) {
  tpsh_coll_args a = {.kind = kind, .name = tpsh_coll_kinds[kind].name, .count = count,
                      .dtype = (send ? send : recv)->dtype_id};
  a.send = send ? tpsh_tensor_data(send) : NULL;
  a.recv = recv ? tpsh_tensor_data(recv) : NULL;
  return a;
}

/* ==== collectives ================================================================================ */
/* A checked collective: its arguments and the tensors it uses (what a batch records). Every kind is
 * checked by its describe_* function, so that a batch and the one-call path check alike. */
typedef struct coll_desc {
  tpsh_coll_args a;
  int nt;
  const tpsh_tensor *t[2];
} coll_desc;

TPSH_HOT static int described(coll_desc *d, tpsh_coll_args a, const tpsh_tensor *t0, const tpsh_tensor *t1) {
  d->a = a;
  d->t[0] = t0;
  d->t[1] = t1;
  d->nt = t1 ? 2 : 1;
  return TPSH_OK;
}

TPSH_HOT static int describe_all_gather(const tpsh_group *g, const tpsh_tensor *out, const tpsh_tensor *in,
                                        coll_desc *d) {
  CHECK(check_buffer("input", in));
  CHECK(check_buffer("output", out));
  CHECK(check_dtype("output", in, out));
  CHECK(check_scaled("output", out, in, g->size, "input"));
  /* In place is the input at this rank's piece of the output (as in NCCL); any other overlap is not. */
  int64_t count = tpsh_tensor_numel(in);
  if (overlap(in, out) && first_byte(in) != first_byte(out) + (size_t)g->rank * nbytes(in))
    return tpsh_error(TPSH_EINVAL, "input and output overlap (only the input at this rank's piece of the "
                      "output is allowed: in place)");
  /* the output first: in place, the storage's first tensor is the one a check report shows */
  return described(d, coll(TPSH_C_ALL_GATHER, in, out, count), out, in);
}

TPSH_HOT static int describe_all_reduce(const tpsh_tensor *out, const tpsh_tensor *in, int op, coll_desc *d) {
  CHECK(check_op(op));
  CHECK(check_buffer("input", in));
  CHECK(check_buffer("output", out));
  CHECK(check_dtype("output", in, out));
  CHECK(check_same_shape("output", in, out));
  if (in != out && overlap(in, out) && first_byte(in) != first_byte(out))
    return tpsh_error(TPSH_EINVAL, "input and output overlap without being the same tensor");
  tpsh_coll_args a = coll(TPSH_C_ALL_REDUCE, in, out, tpsh_tensor_numel(in));
  a.op = op;
  return described(d, a, in, out);
}

TPSH_HOT static int describe_reduce_scatter(const tpsh_group *g, const tpsh_tensor *out, const tpsh_tensor *in, int op,
                                            coll_desc *d) {
  CHECK(check_op(op));
  CHECK(check_buffer("input", in));
  CHECK(check_buffer("output", out));
  CHECK(check_dtype("output", in, out));
  CHECK(check_scaled("input", in, out, g->size, "output"));
  if (overlap(in, out) && first_byte(out) != first_byte(in) + (size_t)g->rank * nbytes(out))
    return tpsh_error(TPSH_EINVAL, "input and output overlap (only the output at this rank's piece of the "
                      "input is allowed: in place)");
  tpsh_coll_args a = coll(TPSH_C_REDUCE_SCATTER, in, out, tpsh_tensor_numel(out));
  a.op = op;
  return described(d, a, in, out);
}

/* broadcast and reduce: one tensor, in place, and a root (reduce also an op) */
TPSH_HOT static int describe_rooted(const tpsh_group *g, int kind, const tpsh_tensor *t, int root, int op,
                                    coll_desc *d) {
  int reduces = tpsh_coll_kinds[kind].has_op;
  if (reduces) CHECK(check_op(op));
  CHECK(check_buffer("tensor", t));
  CHECK(check_rank("root", g, root));
  tpsh_coll_args a = coll(kind, t, t, tpsh_tensor_numel(t));
  a.peer = root;
  if (reduces) a.op = op;
  return described(d, a, t, NULL);
}

TPSH_HOT static int describe_all_to_all(const tpsh_group *g, const tpsh_tensor *out, const tpsh_tensor *in,
                                        coll_desc *d) {
  CHECK(check_buffer("input", in));
  CHECK(check_buffer("output", out));
  CHECK(check_dtype("output", in, out));
  CHECK(check_same_shape("output", in, out));
  int64_t lead = in->ndim ? in->sizes[0] : 1;
  /* a 0-d input has no dimension 1 to name: its one element is what does not split */
  if (lead % g->size != 0 && in->ndim == 0)
    return tpsh_error(TPSH_EINVAL, "input: a 0-d tensor (one element) does not split into %d equal pieces (one "
                      "per rank); give it a first dimension divisible by the group's size", g->size);
  if (lead % g->size != 0)
    return tpsh_error(TPSH_EINVAL, "input: dimension 1 of size %lld does not split into %d equal pieces "
                      "(one per rank)", (long long)lead, g->size);
  if (overlap(in, out)) return tpsh_error(TPSH_EINVAL, "input and output must not overlap");
  return described(d, coll(TPSH_C_ALL_TO_ALL, in, out, tpsh_tensor_numel(in) / g->size), in, out);
}

TPSH_HOT static int describe_point_to_point(const tpsh_group *g, int kind, const tpsh_tensor *t, int peer,
                                            coll_desc *d) {
  CHECK(check_buffer("tensor", t));
  CHECK(check_rank("peer", g, peer));
  int send = kind == TPSH_C_SEND;
  tpsh_coll_args a = coll(kind, send ? t : NULL, send ? NULL : t, tpsh_tensor_numel(t));
  a.peer = peer;
  return described(d, a, t, NULL);
}

/* By kind, with the arguments of tpsh_collective (a: the output or the one tensor, b: the input). */
TPSH_HOT static int describe(const tpsh_group *g, int kind, const tpsh_tensor *a, const tpsh_tensor *b, int arg,
                             int op, coll_desc *d) {
  switch (kind) {
  case TPSH_C_ALL_GATHER: return describe_all_gather(g, a, b, d);
  case TPSH_C_ALL_REDUCE: return describe_all_reduce(a, b, op, d);
  case TPSH_C_REDUCE_SCATTER: return describe_reduce_scatter(g, a, b, op, d);
  case TPSH_C_BROADCAST: return describe_rooted(g, kind, a, arg, 0, d);
  case TPSH_C_REDUCE: return describe_rooted(g, kind, a, arg, op, d);
  case TPSH_C_ALL_TO_ALL: return describe_all_to_all(g, a, b, d);
  case TPSH_C_SEND: case TPSH_C_RECV: return describe_point_to_point(g, kind, a, arg, d);
  default: return tpsh_error(TPSH_EINVAL, "unknown collective kind %d", kind);
  }
}

/* ==== by kind: one entry point for Lua, and the public calls ===================================== */
TPSH_HOT int tpsh_collective(tpsh_stream *s, tpsh_group *g, int kind, tpsh_tensor *a, const tpsh_tensor *b, int arg,
                             int op) {
  CHECK(check_call(s, g));
  coll_desc d;
  CHECK(describe(g, kind, a, b, arg, op, &d));
  return submit(s, g, record(g, &d.a, d.nt, d.t));
}

TPSH_HOT int tpsh_all_gather(tpsh_stream *s, tpsh_group *g, tpsh_tensor *out, const tpsh_tensor *in) {
  return tpsh_collective(s, g, TPSH_C_ALL_GATHER, out, in, 0, 0);
}

TPSH_HOT int tpsh_all_reduce(tpsh_stream *s, tpsh_group *g, tpsh_tensor *out, const tpsh_tensor *in, int op) {
  return tpsh_collective(s, g, TPSH_C_ALL_REDUCE, out, in, 0, op);
}

TPSH_HOT int tpsh_reduce_scatter(tpsh_stream *s, tpsh_group *g, tpsh_tensor *out, const tpsh_tensor *in, int op) {
  return tpsh_collective(s, g, TPSH_C_REDUCE_SCATTER, out, in, 0, op);
}

TPSH_HOT int tpsh_broadcast(tpsh_stream *s, tpsh_group *g, tpsh_tensor *t, int root) {
  return tpsh_collective(s, g, TPSH_C_BROADCAST, t, NULL, root, 0);
}

TPSH_HOT int tpsh_reduce(tpsh_stream *s, tpsh_group *g, tpsh_tensor *t, int root, int op) {
  return tpsh_collective(s, g, TPSH_C_REDUCE, t, NULL, root, op);
}

int tpsh_all_to_all(tpsh_stream *s, tpsh_group *g, tpsh_tensor *out, const tpsh_tensor *in) {
  return tpsh_collective(s, g, TPSH_C_ALL_TO_ALL, out, in, 0, 0);
}

TPSH_HOT int tpsh_send(tpsh_stream *s, tpsh_group *g, const tpsh_tensor *t, int peer) {
  return tpsh_collective(s, g, TPSH_C_SEND, (tpsh_tensor *)t, NULL, peer, 0);
}

TPSH_HOT int tpsh_recv(tpsh_stream *s, tpsh_group *g, tpsh_tensor *t, int peer) {
  return tpsh_collective(s, g, TPSH_C_RECV, t, NULL, peer, 0);
}

int tpsh_all_gather_list(tpsh_stream *s, tpsh_group *g, int n, tpsh_tensor *const *outs, const tpsh_tensor *in) {
  CHECK(check_call(s, g));
  CHECK(check_buffer("input", in));
  if (n != g->size)
    return tpsh_error(TPSH_EINVAL, "output list: expected %d tensors (the group's size), got %d", g->size, n);
  char what[48];
  for (int i = 0; i < n; i++) {
    snprintf(what, sizeof what, "output %d", i + 1);
    CHECK(tpsh_check_tensor(what, outs[i]));
    CHECK(check_dtype(what, in, outs[i]));
    CHECK(check_same_shape(what, in, outs[i]));
  }
  /* The copies out run in list order, so outputs that share memory would keep whichever piece came
   * last; and an input inside another rank's output is the single-tensor form's mistake. Refused as
   * there; in place, the input as this rank's output (the same elements), is allowed. */
  for (int i = 0; i < n; i++) {
    const tpsh_tensor *o = outs[i];
    int in_place = i == g->rank && o->storage == in->storage && o->offset == in->offset && tpsh_tensor_is_contiguous(o);
    if (!in_place && views_meet(in, o))
      return tpsh_error(TPSH_EINVAL, "output %d and the input overlap (only the input as output %d, this rank's "
                        "piece, is allowed: in place)", i + 1, g->rank + 1);
    for (int j = 0; j < i; j++)
      if (views_meet(outs[j], o))
        return tpsh_error(TPSH_EINVAL, "outputs %d and %d overlap: each needs memory of its own", j + 1, i + 1);
  }
  /* Gather into a temporary (contiguous), then copy each piece out: the outputs may be any views. */
  int64_t sizes[TPSH_MAX_DIMS + 1];
  int nd = scaled_shape(in, n, 1, sizes);
  if (nd > TPSH_MAX_DIMS) return tpsh_error(TPSH_EINVAL, "input: at most %d dimensions", TPSH_MAX_DIMS - 1);
  /* On s, the stream the collective will run on (in a batch too: Lua passes g:batch's), not on another
   * that s does not wait for: CUDA's pool hands a block freed on a stream to that stream's next
   * allocation at once, so a temporary from the default stream could be memory that work still queued
   * there uses, written meanwhile by the collective on s. */
  tpsh_tensor *tmp = tpsh_tensor_empty(nd, sizes, in->dtype_id, s ? s : tpsh_rt.default_stream);
  if (!tmp) return TPSH_ENOMEM;
  int rc = TPSH_OK;
  if (!batch_of(g)) rc = tpsh_error(TPSH_ENOMEM, "out of host memory");
  tpsh_coll_args a = coll(TPSH_C_ALL_GATHER, in, tmp, tpsh_tensor_numel(in));
  if (rc == TPSH_OK) rc = record(g, &a, 2, (const tpsh_tensor *[]){in, tmp});
  for (int i = 0; i < n && rc == TPSH_OK; i++) {
    tpsh_tensor *piece = tpsh_tensor_select(tmp, 0, i);
    rc = piece ? record_copy(g, outs[i], piece) : TPSH_ENOMEM;
    tpsh_tensor_release(piece);
  }
  tpsh_tensor_release(tmp);     /* the batch holds it; freed in stream order after the copies */
  return submit(s, g, rc);
}

/* Why one call: every call into tpsh between two NCCL calls costs more host time than its instructions
 * (a sampling profile on the GPU machine put it on the first instructions after each entry and return:
 * docs/perf.md), and a small collective from Lua made three (begin, record, end).
 * Why a batch of one on the stack: g's batch is heap memory (the batch, its argument and storage
 * arrays) that only this path would touch between two NCCL calls, to record one collective and clear
 * it again. Inside a user batch, and in check mode (the sanitizer wants the tensors' descriptors that
 * the batch keeps), the call takes the batch path. */
TPSH_HOT double tpsh_collective_work(tpsh_stream *s, tpsh_group *g, tpsh_stream *after, int kind, tpsh_tensor *a,
                                     const tpsh_tensor *b, int arg, int op) {
  if (!g) return -tpsh_error(TPSH_EINVAL, "expected a group");
  int rc;
  if (__builtin_expect(tpsh_check_on, 0) || in_batch(g)) {
    rc = tpsh_batch_begin(g);                          /* refuses an open batch; end_work checks s */
    if (rc) return -rc;
    rc = tpsh_collective(NULL, g, kind, a, b, arg, op);
    if (rc) {
      batch_clear(g->batch);
      return -rc;
    }
    return tpsh_batch_end_work(s, g, after);
  }
  coll_desc d;
  rc = describe(g, kind, a, b, arg, op, &d);
  if (rc) return -rc;
  if (!s) return -tpsh_error(TPSH_EINVAL, "expected a stream");
  tpsh_storage *held[2] = {d.t[0]->storage, d.t[1] ? d.t[1]->storage : NULL};
  int nheld = held[1] && held[1] != held[0] ? 2 : 1;
  coll_batch one = {.args = &d.a, .n = 1, .cap = 1, .held = held, .nheld = nheld, .capheld = 2};
  double ticket = tpsh_work_take(s);
  if (ticket < 0) return ticket;
  rc = batch_issue(s, g, &one, after, NULL, tpsh_work_event(ticket));
  if (rc) {
    tpsh_work_drop(ticket);
    return -rc;
  }
  for (int i = 0; i < nheld; i++) tpsh_storage_retain(held[i]);    /* the ticket's references now */
  tpsh_work_keep(ticket, nheld, held);
  return ticket;
}
