/*
 * sanitizer.c: the stream sanitizer of --check (TPSH_CHECK=1, tp.check.enable).
 *
 * Happens-before as in ThreadSanitizer, with streams for threads. Every stream has a vector clock
 * indexed by slot (a dense number, reused once its stream is gone; slot 0 is the host). An access on
 * stream s is stamped (s, VC_s[s]).
 * The edges are the ones a GPU program has:
 *   event record on s       the event keeps a copy of VC_s; s's own epoch then moves on
 *   s waits for an event    VC_s = join(VC_s, event's copy)    (wait_stream and Work.wait are this)
 *   the host waits for s    VC_host = join(VC_host, VC_s)       (synchronize, event sync, Work.block,
 *                                                                a read to the host, a query that says
 *                                                                "done")
 *   the host enqueues on s  VC_s = join(VC_s, VC_host)          (what the host has seen finish is
 *                                                                finished for anything it enqueues
 *                                                                next; done lazily, per host epoch)
 * An earlier access (u, e) is ordered before an access on s when e <= VC_s[u]. Per storage, a short
 * list of accesses (byte range, kind, stamp, op, Lua location, shape) is kept; a new access checks the
 * overlapping entries of the other kind pair (RAW, WAR, WAW) on other streams. A storage's memory is
 * reused only after every use (the stream-ordered free), so a new storage starts with one access: its
 * allocation, a write on the allocating stream (tpsh_check_alloc says why).
 *
 * Everything here runs on the host (Lua) thread: the hooks sit on enqueue paths, never on workers.
 * The Lua layer passes the user's file:line down with tpsh_check_set_location, only in check mode.
 */
#include "core/internal.h"
#include "core/group.h"
#include "core/check.h"
#include "core/collective.h"
#include "core/intern.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tpsh_check_on;
static int strict;
static _Thread_local const char *cur_loc = "?";
static int free_origin;         /* a TPSH_FREE_*: who is freeing right now */
static int kept_by_work;        /* a batch's list copies are being launched (tpsh_check_kept_by_work) */

/* Locations and stream names outlive the Lua strings and slots that named them (core/intern.c). */
static const char *intern(const char *s) {
  const char *r = tpsh_intern(s, NULL);
  return r ? r : "?";
}

/* ==== vector clocks =============================================================================== */
typedef struct vclock { uint32_t *c; int n; } vclock;

static uint32_t vc_get(const vclock *v, int i) { return i < v->n ? v->c[i] : 0; }

static void vc_grow(vclock *v, int n) {
  if (n <= v->n) return;
  uint32_t *c = realloc(v->c, (size_t)n * sizeof *c);
  if (!c) return;                       /* out of memory: the clock stays shorter (fewer orderings) */
  memset(c + v->n, 0, (size_t)(n - v->n) * sizeof *c);
  v->c = c;
  v->n = n;
}

static void vc_join(vclock *dst, const vclock *src) {
  vc_grow(dst, src->n);
  int n = src->n < dst->n ? src->n : dst->n;
  for (int i = 0; i < n; i++)
    if (src->c[i] > dst->c[i]) dst->c[i] = src->c[i];
}

static void vc_copy(vclock *dst, const vclock *src) {
  vc_grow(dst, src->n);
  if (dst->n) memset(dst->c, 0, (size_t)dst->n * sizeof *dst->c);
  if (src->n) memcpy(dst->c, src->c, (size_t)(src->n < dst->n ? src->n : dst->n) * sizeof *dst->c);
}

/* ==== streams as slots ============================================================================ */
/* Slots are dense and recycled: a slot is given to a stream the first time a hook sees it, and freed
 * when that stream is destroyed and no access record (or record_stream entry) names it any more. Slots
 * numbered by stream id would grow every clock by one entry per stream ever created, and events copy
 * clocks: memory would go quadratic in the streams a script makes (20k short-lived streams: 1.2 GB).
 *
 * Recycling is exact, not approximate, because a slot's epochs never restart: a new owner's first
 * epoch is one past the last epoch of the previous owner (whose own entry is the largest value any
 * clock, event clock or access record holds for that slot: every such value is a copy of it). A clock
 * that still holds the old owner's entry (the host's, another stream's, an event recorded long ago)
 * therefore covers none of the new owner's accesses, as the 0 of a fresh slot would; and a clock that
 * learns the new owner's epochs holds the new owner's value, since it is larger than every old one.
 * Every comparison (e <= VC[slot]) thus gives what it would give with a slot per stream. What must not
 * survive into the new owner is an access record of the old one (its epoch would be compared with the
 * new owner's knowledge, and look ordered): a slot is pinned while records name it (refs). A storage
 * lets go of a user stream once that stream is unreachable and idle (tensor.c's prune_users), so a
 * stream can die while a live tensor's records still name it: its slot then waits, retired, until the
 * last such record goes. */
typedef struct slot {
  vclock vc;
  uint64_t host_epoch_seen;
  uint64_t key;            /* the owner's stream id + 1 (0: the host): reports are de-duplicated per
                            * stream, not per slot */
  int refs;                /* access records and record_stream entries that name this slot */
  int state;               /* SLOT_FREE, SLOT_LIVE, SLOT_RETIRED (owner gone, still named: pinned) */
  char name[TPSH_STREAM_NAME_MAX + 1];   /* the owner's, copied: interned, a stream's name would stay
                                          * for good, one string per stream ever created */
} slot;
enum { SLOT_FREE = 0, SLOT_LIVE = 1, SLOT_RETIRED = 2 };

static slot *slots;
static int nslots, capslots;       /* slots[0] is the host's (its clock is host_vc); every clock has at
                                    * most nslots entries */
static int *free_slots;            /* freed slot numbers, reused last in, first out */
static int nfree, capfree;
static vclock host_vc;
static uint64_t host_epoch = 1;
static uint64_t generation = 1;    /* check sessions: a stream's slot and an event's clock of an earlier
                                    * session are stale (reset bumps it) */

/* Makes slot 0, the host's (its clock is host_vc), exist: a stream given no slot stands on it. */
static int host_slot(void) {
  if (nslots > 0) return TPSH_OK;
  if (tpsh_grow_array((void **)&slots, &capslots, 1, 16, sizeof *slots)) return TPSH_ENOMEM;
  memset(&slots[0], 0, sizeof slots[0]);
  nslots = 1;
  return TPSH_OK;
}

/* A slot for s: a freed one if any, else a new one; -1 when out of memory. */
static int slot_take(const tpsh_stream *s) {
  int i;
  if (nfree) i = free_slots[--nfree];
  else {
    /* the free list can hold every slot, so that freeing one never allocates */
    if (host_slot() || tpsh_grow_array((void **)&slots, &capslots, nslots + 1, 16, sizeof *slots) ||
        tpsh_grow_array((void **)&free_slots, &capfree, nslots + 1, 16, sizeof *free_slots)) return -1;
    i = nslots++;
    memset(&slots[i], 0, sizeof slots[i]);
  }
  slot *sl = &slots[i];
  uint32_t last = vc_get(&sl->vc, i);      /* the previous owner's last epoch (0: a new slot) */
  if (sl->vc.n) memset(sl->vc.c, 0, (size_t)sl->vc.n * sizeof *sl->vc.c);
  vc_grow(&sl->vc, i + 1);
  if (sl->vc.n > i) sl->vc.c[i] = last + 1;    /* epochs start above every value the slot had: a 0
                                                * entry, or an old owner's, covers nothing of this one */
  sl->host_epoch_seen = 0;
  sl->key = s->id + 1;
  sl->refs = 0;
  sl->state = SLOT_LIVE;
  snprintf(sl->name, sizeof sl->name, "%s", s->name);
  return i;
}

static void slot_free(int i) {
  slots[i].state = SLOT_FREE;
  free_slots[nfree++] = i;
}

static void slot_ref(int i) { if (i > 0) slots[i].refs++; }
static void slot_unref(int i) {
  if (i > 0 && --slots[i].refs == 0 && slots[i].state == SLOT_RETIRED) slot_free(i);
}

static int slot_of(tpsh_stream *s) {
  if (s->check_gen != generation) {
    int i = slot_take(s);
    if (i < 0) return 0;                  /* out of memory: counted as the host (fewer reports) */
    s->check_slot = i;
    s->check_gen = generation;
  }
  int i = s->check_slot;
  slot *sl = &slots[i];
  /* What the host has seen finish is ordered before anything it enqueues on s from now on. */
  if (sl->host_epoch_seen != host_epoch) {
    vc_join(&sl->vc, &host_vc);
    sl->host_epoch_seen = host_epoch;
  }
  return i;
}

void tpsh_check_stream_destroy(tpsh_stream *s) {
  if (s->check_gen != generation) return;    /* never seen in this check session */
  s->check_gen = 0;
  int i = s->check_slot;
  if (slots[i].refs > 0) slots[i].state = SLOT_RETIRED;
  else slot_free(i);
}

static uint32_t epoch_of(int si) { return vc_get(&slots[si].vc, si); }
static void tick(int si) { if (slots[si].vc.n > si) slots[si].vc.c[si]++; }
static const char *slot_name(int si) { return si == 0 ? "host" : si < nslots && slots[si].name[0] ? slots[si].name : "?"; }
static unsigned long long slot_key(int si) { return si > 0 && si < nslots ? (unsigned long long)slots[si].key : 0; }

/* ==== events: the clock captured at record ======================================================== */
/* Kept in the event itself (O(1) with thousands of live events); a generation number makes the clocks
 * of a previous check session invalid without visiting every event. */
typedef struct ev_clock { uint64_t gen; vclock vc; } ev_clock;

static ev_clock *ev_find(const tpsh_event *e) {
  ev_clock *x = e->check_clock;
  return x && x->gen == generation ? x : NULL;
}

void tpsh_check_event_forget(tpsh_event *e) {
  ev_clock *x = e->check_clock;
  if (!x) return;
  free(x->vc.c);
  free(x);
  e->check_clock = NULL;
}

void tpsh_check_event_record(tpsh_event *e, tpsh_stream *s) {
  int si = slot_of(s);
  ev_clock *x = e->check_clock;
  if (!x) {
    x = calloc(1, sizeof *x);
    if (!x) return;
    e->check_clock = x;
  }
  x->gen = generation;
  vc_copy(&x->vc, &slots[si].vc);
  tick(si);
}

void tpsh_check_stream_wait_event(tpsh_stream *s, tpsh_event *e) {
  int si = slot_of(s);
  ev_clock *x = ev_find(e);
  if (x) vc_join(&slots[si].vc, &x->vc);
}

static void host_learns(const vclock *v) {
  vc_join(&host_vc, v);
  host_epoch++;
}

void tpsh_check_host_join_stream(tpsh_stream *s) {
  int si = slot_of(s);
  host_learns(&slots[si].vc);
  tick(si);
}

void tpsh_check_host_join_event(tpsh_event *e) {
  ev_clock *x = ev_find(e);
  if (x) host_learns(&x->vc);
}

void tpsh_check_host_join_all(void) {
  for (tpsh_stream *s = tpsh_rt.streams; s; s = s->next) tpsh_check_host_join_stream(s);
  /* Streams already destroyed whose accesses are still on record (retired slots: a storage let go of
   * them once they were unreachable and idle, tensor.c's prune_users) are among "every stream" that
   * tp.synchronize waits for: without this, a loop that writes one tensor from a fresh stream per step
   * and then calls tp.synchronize would have the read after it reported against every pruned step. A
   * retired slot no longer ticks, so its clock covers every access it left. */
  for (int i = 1; i < nslots; i++)
    if (slots[i].state == SLOT_RETIRED) host_learns(&slots[i].vc);
}

/* ==== per-storage access history ================================================================== */
enum { MAX_ACCESSES = 32, MAX_RS = 8 };

typedef struct access {
  int64_t lo, hi;            /* bytes of the storage */
  uint32_t epoch;
  int32_t slot;
  int32_t write;
  int32_t ndim, dtype;
  int32_t kept;              /* a collective's (or its list copy's): its Work keeps the tensor */
  const char *op, *loc;
  const char *reused;        /* an allocation's: where the cached block it got was freed (NULL: new) */
  int64_t sizes[8];
} access;

typedef struct shadow {
  uint64_t id;               /* the storage's id (never reused); 0: empty bucket */
  access *a;
  int n;
  int rs[MAX_RS], nrs;       /* slots named by t:record_stream */
  int rs_more;               /* more than MAX_RS were named: every stream counts as named (a report
                              * lost rather than a false one: a tenth record_stream reported as
                              * missing) */
} shadow;

static shadow *shadows;      /* open addressing by storage id, with backward-shift deletion */
static size_t nshadows, capshadows;

static size_t sh_home(uint64_t id) { return (size_t)(id * 11400714819323198485ull) & (capshadows - 1); }

static shadow *sh_find(uint64_t id) {
  if (!capshadows) return NULL;
  for (size_t j = sh_home(id);; j = (j + 1) & (capshadows - 1)) {
    if (shadows[j].id == id) return &shadows[j];
    if (shadows[j].id == 0) return NULL;
  }
}

static shadow *sh_get(uint64_t id) {
  shadow *x = sh_find(id);
  if (x) return x;
  if (2 * (nshadows + 1) > capshadows) {
    size_t cap = capshadows ? 2 * capshadows : 256;
    shadow *n = calloc(cap, sizeof *n);
    if (!n) return NULL;
    shadow *old = shadows;
    size_t oldcap = capshadows;
    shadows = n;
    capshadows = cap;
    for (size_t i = 0; i < oldcap; i++)
      if (old[i].id) {
        size_t j = sh_home(old[i].id);
        while (shadows[j].id) j = (j + 1) & (cap - 1);
        shadows[j] = old[i];
      }
    free(old);
  }
  size_t j = sh_home(id);
  while (shadows[j].id) j = (j + 1) & (capshadows - 1);
  shadows[j] = (shadow){.id = id};
  shadows[j].a = calloc(MAX_ACCESSES, sizeof(access));
  if (!shadows[j].a) { shadows[j].id = 0; return NULL; }
  nshadows++;
  return &shadows[j];
}

static void sh_remove(shadow *x) {
  for (int i = 0; i < x->n; i++) slot_unref(x->a[i].slot);
  for (int i = 0; i < x->nrs; i++) slot_unref(x->rs[i]);
  free(x->a);
  size_t i = (size_t)(x - shadows);
  shadows[i].id = 0;
  nshadows--;
  /* backward shift: keep every later entry reachable from its home bucket */
  for (size_t j = (i + 1) & (capshadows - 1); shadows[j].id; j = (j + 1) & (capshadows - 1)) {
    size_t h = sh_home(shadows[j].id);
    int between = i <= j ? (h > i && h <= j) : (h > i || h <= j);
    if (between) continue;
    shadows[i] = shadows[j];
    shadows[j].id = 0;
    i = j;
  }
}

static void byte_range(const tpsh_tensor *t, int64_t *lo, int64_t *hi) {
  int64_t l = t->offset, h = t->offset;
  for (int d = 0; d < t->ndim; d++) {
    if (t->sizes[d] == 0) { *lo = *hi = 0; return; }
    int64_t span = (t->sizes[d] - 1) * t->strides[d];
    if (span < 0) l += span; else h += span;
  }
  int64_t es = tpsh_dtype_size(t->dtype_id);
  *lo = l * es;
  *hi = (h + 1) * es;
}

/* ==== reports ===================================================================================== */
static tpsh_check_report *reports;
static int nreports, capreports;
static const char **seen;          /* dedup keys (interned), linear: reports are few */
static int nseen, capseen;

static const char *shape_of(const access *a, char *buf, size_t n) {
  tpsh_tensor t = {.ndim = a->ndim};
  for (int d = 0; d < a->ndim && d < 8; d++) t.sizes[d] = a->sizes[d];
  char s[160];
  snprintf(buf, n, "%s %s", tpsh_shape_str(&t, s, sizeof s), tpsh_dtype_name(a->dtype));
  return buf;
}

static void print_prefixed(const char *msg) {
  char line[64];
  snprintf(line, sizeof line, "[rank %d] ", tpsh_rt.rank);
  fflush(stdout);
  for (const char *p = msg; *p;) {
    const char *nl = strchr(p, '\n');
    int len = nl ? (int)(nl - p) : (int)strlen(p);
    fprintf(stderr, "%s%.*s\n", line, len, p);
    p += len + (nl != NULL);
  }
  fflush(stderr);
}

/* Records and prints one report unless an identical one was made since the last clear; returns the
 * status the hook hands back: in strict mode an error every time, repeats included (a race caught by
 * a pcall and made again must not run the second time). */
static int report(const char *kind, const access *now, const access *other, const char *what_now,
                  const char *what_other, const char *advice) {
  /* One report per pair of accesses: an in-place op (t:add_(1), an all_reduce in place) both reads and
   * writes t, and its read and its write race with the same access elsewhere: the kind is not part of
   * the key, so that the pair is reported once (as the read, checked first), not twice (as a
   * read-after-write and a write-after-write, counted as two races at the exit) */
  char key[768];
  snprintf(key, sizeof key, "%s|%s|%s|%s|%llu|%lld|%s", now->loc, other ? other->loc : "", now->op,
           other ? other->op : "", slot_key(now->slot), other ? (long long)slot_key(other->slot) : -1LL,
           other ? "" : kind);
  const char *k = intern(key);
  int repeat = 0;
  for (int i = 0; i < nseen && !repeat; i++) repeat = seen[i] == k;
  if (repeat && !strict) return TPSH_OK;
  if (!repeat && nseen == capseen) {
    int cap = capseen ? 2 * capseen : 32;
    const char **n = realloc(seen, (size_t)cap * sizeof *n);
    if (!n) return strict ? tpsh_error(TPSH_ENOMEM, "out of host memory") : TPSH_OK;
    seen = n;
    capseen = cap;
  }
  if (!repeat) seen[nseen++] = k;
  char shape[200], msg[2048];
  shape_of(other ? other : now, shape, sizeof shape);
  int len = snprintf(msg, sizeof msg, "tpsh check: %s on a tensor of shape %s\n  %s %s on stream '%s' at %s\n",
                     kind, shape, what_now, now->op, slot_name(now->slot), now->loc);
  if (other && len < (int)sizeof msg)
    len += snprintf(msg + len, sizeof msg - (size_t)len, "  %s %s on stream '%s' at %s\n", what_other, other->op,
                    slot_name(other->slot), other->loc);
  if (len < (int)sizeof msg) snprintf(msg + len, sizeof msg - (size_t)len, "  %s", advice);
  if (repeat) return tpsh_error(TPSH_EINVAL, "%s", msg);    /* strict: printed the first time */
  print_prefixed(msg);
  if (nreports == capreports) {
    int cap = capreports ? 2 * capreports : 16;
    tpsh_check_report *n = realloc(reports, (size_t)cap * sizeof *n);
    if (n) { reports = n; capreports = cap; }
  }
  if (nreports < capreports) {
    tpsh_check_report *r = &reports[nreports++];
    r->kind = kind;
    r->message = strdup(msg);
    r->location = now->loc;
    r->other_location = other ? other->loc : "";
    r->op = now->op;
    r->other_op = other ? other->op : "";
    r->stream = intern(slot_name(now->slot));        /* a slot's name changes with its owner */
    r->other_stream = other ? intern(slot_name(other->slot)) : "";
    r->shape = intern(shape);
  }
  return strict ? tpsh_error(TPSH_EINVAL, "%s", msg) : TPSH_OK;
}

/* ==== accesses ==================================================================================== */
/* The op of an allocation's access (compared by address): see tpsh_check_alloc. */
static const char ALLOC_OP[] = "the allocation";

static void fill_access(access *a, const tpsh_tensor *t, int si, int write, const char *op) {
  byte_range(t, &a->lo, &a->hi);
  a->slot = si;
  a->epoch = epoch_of(si);
  a->write = write;
  a->op = op ? op : "op";
  a->loc = cur_loc;
  a->ndim = t->ndim;
  a->dtype = t->dtype_id;
  a->kept = kept_by_work;
  a->reused = NULL;
  for (int d = 0; d < t->ndim && d < 8; d++) a->sizes[d] = t->sizes[d];
}

static int overlaps(const access *a, const access *b) { return a->lo < b->hi && b->lo < a->hi; }
static int contains(const access *outer, const access *in) { return outer->lo <= in->lo && in->hi <= outer->hi; }

/* Adds access a to a storage's history. Keep the history short: an access supersedes the same stream's
 * earlier ones (and a write, every one) that it covers. */
static void record_access(shadow *x, const access *a) {
  int k = 0;
  for (int i = 0; i < x->n; i++) {
    const access *r = &x->a[i];
    int drop = contains(a, r) && (a->write || (r->slot == a->slot && !r->write));
    if (!drop) x->a[k++] = *r;
    else slot_unref(r->slot);
  }
  x->n = k;
  if (x->n == MAX_ACCESSES) {          /* full: forget the oldest (a missed report, never a false one) */
    slot_unref(x->a[0].slot);
    memmove(x->a, x->a + 1, (size_t)(MAX_ACCESSES - 1) * sizeof *x->a);
    x->n--;
  }
  slot_ref(a->slot);
  x->a[x->n++] = *a;
}

/* record 0: checks a against the storage's history (reports); record 1: adds a to the history. The
 * callers check every access of a call first and record them only when the call goes ahead: in strict
 * mode a refused call never runs, and recording its accesses would let them supersede the racing ones,
 * so that the same race made again (after a pcall) would no longer be seen. Checking all before
 * recording any changes nothing else: the accesses of one call are on one stream, never checked
 * against each other. */
static int access_storage(const tpsh_storage *st, const access *a, int record) {
  if (a->hi <= a->lo) return TPSH_OK;
  shadow *x = sh_get(st->id);
  if (!x) return TPSH_OK;
  if (record) { record_access(x, a); return TPSH_OK; }
  const vclock *vc = &slots[a->slot].vc;
  int rc = TPSH_OK;
  for (int i = 0; i < x->n && rc == TPSH_OK; i++) {
    const access *r = &x->a[i];
    if (r->slot == a->slot || (!a->write && !r->write) || !overlaps(a, r)) continue;
    if (r->epoch <= vc_get(vc, r->slot)) continue;
    if (r->op == ALLOC_OP) {
      char advice[1024];        /* five names of up to 63 bytes and a location fit */
      char from[384] = "";
      if (r->reused)
        snprintf(from, sizeof from, " (this one's block was freed at %.256s and handed to it from the cache)",
                 r->reused);
      snprintf(advice, sizeof advice, "a new tensor's memory is ordered on the stream it was allocated on: the "
               "caching allocator may hand it a block that work still queued on '%s' uses (a tensor freed "
               "there)%s, and '%s' did not wait for that work; make '%s' wait for '%s' after the allocation "
               "(s:wait_stream), or allocate the tensor on '%s' (inside tp.with_stream)", slot_name(r->slot),
               from, slot_name(a->slot), slot_name(a->slot), slot_name(r->slot), slot_name(a->slot));
      rc = report("use of a new tensor on a stream that did not wait for its allocation", a, r,
                  a->write ? "write by" : "read by", "of memory from", advice);
    } else if (r->write && a->write)
      rc = report("write-after-write race", a, r, "write by", "races with the write by",
                  "neither write is ordered before the other: order the streams (an event, wait_stream, w:wait())");
    else if (r->write)
      rc = report("read-after-write race", a, r, "read by", "of the write by",
                  "the write is not ordered before the read: make the reading stream wait (w:wait(), "
                  "s:wait_stream(...), e:wait(s))");
    else
      rc = report("write-after-read race", a, r, "write by", "while it may still be read by",
                  "the read is not ordered before the write: make the writing stream wait for the reader");
  }
  return rc;
}

/* An op inside g:batch's function on memory that a collective recorded there uses: ordered (the batch
 * is issued later on a stream that waits for this one), so no race, but it runs before the collective
 * that the program shows first (all_reduce(t); t:add_(1) adds before the sum). */
static int ahead_of_batch(const tpsh_storage *st, const access *a) {
  if (a->hi <= a->lo || !st->data) return TPSH_OK;
  const tpsh_coll_args *c = tpsh_batch_ahead((char *)st->data + a->lo, (size_t)(a->hi - a->lo), a->write);
  if (!c) return TPSH_OK;
  char advice[512];
  snprintf(advice, sizeof advice, "the %s made at %s is in a g:batch that is still open: the batch issues it when "
           "its function returns, after this op; move the op out of the function (after g:batch, or before "
           "the %s)", c->name, c->loc ? c->loc : "?", c->name);
  return report("op run ahead of a batched collective", a, NULL, a->write ? "write by" : "read by", NULL, advice);
}

int tpsh_check_launch(tpsh_stream *s, const tpsh_kargs *k) {
  int si = slot_of(s);
  int rc = TPSH_OK;
  /* check every access, then record them unless the launch is refused (strict mode); reads first, so
   * that an in-place op's write supersedes its own read */
  int nw = tpsh_kargs_writes(k);
  for (int record = 0; record < 2 && (rc == TPSH_OK || !strict); record++)
    for (int pass = 0; pass < 2; pass++)
      for (int i = pass ? 0 : nw; i < (pass ? nw : k->nt); i++) {
        const tpsh_tensor *t = &k->t[i];
        if (!t->storage) continue;
        if (rc) continue;         /* strict: refused at the first report, which is the one raised (not
                                   * the next access's repeat of that pair) */
        access a;
        fill_access(&a, t, si, pass == 1, k->name);
        rc = access_storage(t->storage, &a, record);
      }
  /* the write first: an in-place op on a batch's buffer is reported as the write it is */
  for (int i = 0; i < k->nt && rc == TPSH_OK; i++) {
    const tpsh_tensor *t = &k->t[i];
    if (!t->storage) continue;
    access a;
    fill_access(&a, t, si, i < nw, k->name);
    rc = ahead_of_batch(t->storage, &a);
  }
  return rc;
}

int tpsh_check_host_read(tpsh_stream *s, const tpsh_tensor *t) {
  tpsh_check_host_join_stream(s);                /* the read waits for s first */
  shadow *x = sh_find(t->storage->id);
  access a;
  fill_access(&a, t, 0, 0, "to_host");
  int rc = TPSH_OK;
  for (int i = 0; x && i < x->n && rc == TPSH_OK; i++) {
    const access *r = &x->a[i];
    if (!r->write || !overlaps(&a, r) || r->epoch <= vc_get(&host_vc, r->slot)) continue;
    char advice[384];           /* three names of up to 63 bytes fit */
    snprintf(advice, sizeof advice, "the read waited for stream '%s' only: synchronize '%s' (or w:block(), "
             "or make '%s' wait for it) before reading", s->name, slot_name(r->slot), s->name);
    rc = report("host read of an unsynchronised write", &a, r, "host read by", "of the write by", advice);
  }
  return rc ? rc : ahead_of_batch(t->storage, &a);
}

/* The held tensor that the collective's buffer p (nbytes long) is, for the report's shape: the one
 * whose data starts at p and spans nbytes, else one that starts at p, else any whose storage holds p
 * (an in-place all_gather's output and input share a storage: the output is the one that spans it). */
static const tpsh_tensor *holder(void *p, size_t nbytes, int nheld, const tpsh_tensor *held) {
  const tpsh_tensor *starts = NULL, *within = NULL;
  for (int i = 0; i < nheld; i++) {
    const tpsh_storage *st = held[i].storage;
    if (!st->data || (char *)p < (char *)st->data || (char *)p >= (char *)st->data + st->nbytes) continue;
    if (tpsh_tensor_data(&held[i]) == p) {
      if ((size_t)tpsh_tensor_numel(&held[i]) * tpsh_tensor_elsize(&held[i]) == nbytes) return &held[i];
      if (!starts) starts = &held[i];
    }
    if (!within) within = &held[i];
  }
  return starts ? starts : within;
}

/* The access of collective c to nbytes at p (its tensor among the batch's held ones); NULL: none. */
static const tpsh_tensor *coll_span(int si, void *p, size_t nbytes, int write, const tpsh_coll_args *c, int nheld,
                                    const tpsh_tensor *held, access *a) {
  if (!p || nbytes == 0) return NULL;
  const tpsh_tensor *h = holder(p, nbytes, nheld, held);
  if (!h) return NULL;
  fill_access(a, h, si, write, c->name);
  a->kept = 1;                            /* the Work holds h until it is waited on or completed */
  if (c->loc) a->loc = c->loc;            /* where the collective was made, not where its batch was issued */
  a->lo = (char *)p - (char *)h->storage->data;
  a->hi = a->lo + (int64_t)nbytes;
  return h;
}

static int coll_access(int si, void *p, size_t nbytes, int write, const tpsh_coll_args *c, int nheld,
                       const tpsh_tensor *held, int record) {
  access a;
  const tpsh_tensor *h = coll_span(si, p, nbytes, write, c, nheld, held, &a);
  return h ? access_storage(h->storage, &a, record) : TPSH_OK;
}

/* A collective issued now (another group's, inside g:batch's function) on memory that a collective of a
 * batch still open uses: it runs first, as an op there would (ahead_of_batch). */
static int coll_ahead(int si, void *p, size_t nbytes, int write, const tpsh_coll_args *c, int nheld,
                      const tpsh_tensor *held) {
  access a;
  const tpsh_tensor *h = coll_span(si, p, nbytes, write, c, nheld, held, &a);
  return h ? ahead_of_batch(h->storage, &a) : TPSH_OK;
}

int tpsh_check_collectives(tpsh_stream *s, tpsh_group *g, int n, const tpsh_coll_args *c, int nheld,
                           const tpsh_tensor *held) {
  int si = slot_of(s);
  int rc = TPSH_OK;
  /* check, then record unless refused (strict mode): as tpsh_check_launch */
  for (int record = 0; record < 2 && (rc == TPSH_OK || !strict); record++)
    for (int i = 0; i < n && rc == TPSH_OK; i++) {   /* strict: the first report is the one raised */
      size_t reads, writes;
      tpsh_coll_footprint(&c[i], g->size, g->rank, &reads, &writes);
      rc = coll_access(si, c[i].send, reads, 0, &c[i], nheld, held, record);
      if (!rc) rc = coll_access(si, c[i].recv, writes, 1, &c[i], nheld, held, record);
    }
  /* then, as for an op: another group's batch still open (this batch left the list when issued); the
   * write first, so that an in-place collective is reported as the write it is (g2:all_reduce(t) inside
   * g1:batch runs before g1's all_reduce(t)) */
  for (int i = 0; i < n && rc == TPSH_OK; i++) {
    size_t reads, writes;
    tpsh_coll_footprint(&c[i], g->size, g->rank, &reads, &writes);
    rc = coll_ahead(si, c[i].recv, writes, 1, &c[i], nheld, held);
    if (rc == TPSH_OK) rc = coll_ahead(si, c[i].send, reads, 0, &c[i], nheld, held);
  }
  return rc;
}

void tpsh_check_record_stream(tpsh_storage *st, tpsh_stream *s) {
  shadow *x = sh_get(st->id);
  if (!x) return;
  int si = slot_of(s);
  for (int i = 0; i < x->nrs; i++)
    if (x->rs[i] == si) return;
  if (x->nrs < MAX_RS) { x->rs[x->nrs++] = si; slot_ref(si); }
  else x->rs_more = 1;
}

void tpsh_check_free(tpsh_storage *st) {
  shadow *x = sh_find(st->id);
  if (!x) return;
  if (free_origin == TPSH_FREE_INTERNAL) { sh_remove(x); return; }
  int si = slot_of(st->alloc_stream);        /* the free is ordered on the allocating stream */
  const vclock *vc = &slots[si].vc;
  for (int i = 0; i < x->n; i++) {
    const access *r = &x->a[i];
    /* A collective's accesses never call for record_stream: API.md promises that a Work keeps the
     * tensors it was given until it is waited on or completed (a ticket Work holds them in C even once
     * dropped; check mode's Works are Lua tables, which die with them), as PyTorch's ProcessGroupNCCL
     * records its streams itself: a fire-and-forget broadcast of a temporary never needs
     * t:record_stream(comm), and a report must not advise it. */
    if (r->slot == si || r->kept || r->epoch <= vc_get(vc, r->slot)) continue;
    int covered = x->rs_more;
    for (int j = 0; j < x->nrs; j++) covered |= x->rs[j] == r->slot;
    if (covered) continue;
    access f = *r;
    f.slot = si;
    f.op = free_origin == TPSH_FREE_EXPLICIT ? "t:free()" : "the garbage collector (near the last tpsh call)";
    f.loc = cur_loc;
    char advice[512];
    snprintf(advice, sizeof advice, "tpsh's allocator kept the memory safe (it waits for every stream that used "
             "a block), but the code relies on it: make '%s' wait for '%s' before the tensor dies, or call "
             "t:record_stream(%s) as a PyTorch script would have to", slot_name(si), slot_name(r->slot),
             slot_name(r->slot));
    report("free while in use on another stream", &f, r, "freed by", r->write ? "still being written by" :
           "still being read by", advice);
    break;
  }
  sh_remove(x);
}

/* A new storage's memory is stream-ordered on the stream that allocated it: the caching allocator
 * (alloc.c) hands a block freed on s to s's next allocation at once, on the CPU backend as on CUDA,
 * while work queued on s before the free may still use it. So the allocation counts as a write on s,
 * and a use on another stream that has not waited for s since is reported (what tp.empty, or a
 * temporary allocated on the default stream and filled on a comm stream, leaves open), naming where a
 * reused block was freed. An op on s itself supersedes it, so tp.zeros and the result of a + b on s keep
 * one access. */
void tpsh_check_alloc(const tpsh_tensor *t, const char *reused_from) {
  access a;
  fill_access(&a, t, slot_of(t->storage->alloc_stream), 1, ALLOC_OP);
  a.reused = reused_from;
  access_storage(t->storage, &a, 1);
}

/* ==== the C API of tp.check ======================================================================= */
static void reset(void) {
  for (int i = 0; i < nslots; i++) free(slots[i].vc.c);
  free(slots); slots = NULL; nslots = capslots = 0;
  free(free_slots); free_slots = NULL; nfree = capfree = 0;
  free(host_vc.c); host_vc = (vclock){0};
  host_epoch++;
  for (size_t i = 0; i < capshadows; i++) if (shadows[i].id) free(shadows[i].a);
  free(shadows); shadows = NULL; nshadows = capshadows = 0;
  generation++;
}

void tpsh_check_enable(int on) {
  if (on && !tpsh_check_on) reset();
  tpsh_check_on = on != 0;
  if (!on) reset();
  /* the host is slot 0 of every clock; slots[0] exists, so that a stream given no slot (out of memory)
   * can stand on it */
  if (on) { vc_grow(&host_vc, 1); if (host_vc.n) host_vc.c[0] = 1; }
  if (on) host_slot();
}

int tpsh_check_enabled(void) { return tpsh_check_on; }
int tpsh_check_clock_size(void) { return tpsh_check_on ? nslots : 0; }
void tpsh_check_set_strict(int on) { strict = on != 0; }
int tpsh_check_strict(void) { return strict; }
void tpsh_check_set_location(const char *loc) { cur_loc = intern(loc); }
const char *tpsh_check_location(void) { return cur_loc; }
void tpsh_check_set_free_origin(int origin) { free_origin = origin; }
void tpsh_check_kept_by_work(int on) { kept_by_work = on != 0; }
void tpsh_check_set_explicit_free(int on) { free_origin = on ? TPSH_FREE_EXPLICIT : TPSH_FREE_INTERNAL; }
int tpsh_check_report_count(void) { return nreports; }
const tpsh_check_report *tpsh_check_report_get(int i) { return i >= 0 && i < nreports ? &reports[i] : NULL; }

void tpsh_check_clear(void) {
  for (int i = 0; i < nreports; i++) free((void *)reports[i].message);
  nreports = 0;
  nseen = 0;
}
