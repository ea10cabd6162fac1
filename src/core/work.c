/*
 * work.c: Work tickets, the end events of untimed collectives, reused without a finalizer per Work.
 *
 * Why: a Work that owns its end event must give it back when the garbage collector drops it, and in
 * LuaJIT a finalizer per call is expensive twice over: registering and running it costs host time, and a
 * finalizer that runs while a trace is being recorded aborts the recording, so the loop that issues
 * small collectives stays in the interpreter. On a 1 KiB collective (docs/perf.md) the Lua layer costs
 * about 1.2 us over the C call with a finalizer per Work, 0.2 us without.
 *
 * So a Work holds a ticket instead: a slot of this table and the slot's generation, packed in a double
 * (generation * 2^24 + slot) so that it crosses the FFI as a plain Lua number. A slot's event is reused
 * only after it has completed, and reuse moves the generation on: a ticket whose generation no longer
 * matches belongs to a collective that has completed, so waiting on it is a no-op and querying it says
 * done.
 *
 * Knowing when an event has completed must be cheap: an event query is a driver call (1.6 us on the GPU
 * machine, more than the rest of the Lua layer). So the table uses stream order instead: the busy slots
 * of each stream form a lane, in the order their events were recorded there, and when one of them is
 * known to be complete, so are all older ones of its lane. Completion becomes known
 *   - when the Work's owner sees it (tpsh_work_block, tpsh_work_query returning 1),
 *   - when the host synchronises the stream or every stream (tpsh_work_stream_done / _all_done), and
 *   - in tpsh_work_take, once the table holds SLOTS_UNQUERIED slots and has no idle one: it queries the
 *     newest of the RECLAIM_BATCH oldest slots of the lane being issued to, so that Works dropped
 *     without a wait cost about one query per batch.
 * When that slot is still pending, the host is more than a batch ahead of the device, and the table
 * grows by a whole batch, so that the next RECLAIM_BATCH takes need no query either. (Querying again at
 * every take would make a loop of small collectives that the device cannot keep up with pay two
 * queries, 2.7 us, per call: the host would become the bottleneck, at 11 us a call where NCCL alone
 * takes 9.) The table stays about as large as the collectives in flight between host waits.
 * A slot also holds the storages of the tensors its Work uses (taken over from the batch that issued it:
 * tpsh_batch_end_work), until the Work is waited on or known complete: API.md's "a Work keeps its
 * tensors referenced". Holding them here rather than in the Lua Work lets that Work be a plain cdata
 * with no references for the garbage collector to follow (work.lua says what that saved). They are
 * released only when this table is consistent again (flush_released, at the end of each entry point):
 * releasing memory may synchronise a stream, which comes back here.
 * The queries here bypass the sanitizer on purpose (the host did not look, so it learns no order), and
 * timed Works (w:elapsed reads both events after completion) and check mode (the sanitizer follows each
 * event's clock) keep owning their events from Lua. Only the Lua thread uses tickets (no lock).
 */
#include "core/backend.h"
#include "core/internal.h"
#include "core/stream.h"
#include "core/work.h"
#include "core/graph.h"
#include <stdlib.h>

#define SLOT_BITS 24
#define SLOT_MAX (1u << SLOT_BITS)
#define GEN_LIMIT (1u << (53 - SLOT_BITS))   /* generations of a slot: tickets stay below 2^53 */
#define SLOTS_UNQUERIED 256       /* grow without querying up to this many slots */
#define RECLAIM_BATCH 64          /* the oldest slots of a lane that one query can reclaim */

typedef struct slot {
  tpsh_event *event;
  uint32_t gen;
  int busy;
  int lane;                       /* index in lanes while busy */
  tpsh_storage **keep;            /* references held for the Work; the array is kept across reuses */
  int nkeep, capkeep;
} slot;

/* The busy slots recorded on one stream, oldest first, as (generation << 32 | slot): an entry whose
 * generation has moved on (the slot was recycled meanwhile) is stale and skipped. A ring buffer whose
 * capacity is a power of two; the lane holds a reference to its stream while it has entries. */
typedef struct lane {
  tpsh_stream *stream;
  uint64_t *q;
  uint32_t head, len, cap;
} lane;

static slot *slots;
static uint32_t nslots, capslots;
static uint32_t *free_list;               /* indices of idle slots */
static uint32_t nfree;
static lane *lanes;
static int nlanes, caplanes;
static tpsh_storage **released;           /* references to drop once the table is consistent */
static int nreleased, capreleased;

TPSH_HOT static uint64_t entry_of(uint32_t i) { return (uint64_t)slots[i].gen << 32 | i; }
TPSH_HOT static int entry_live(uint64_t e) {
  const slot *s = &slots[(uint32_t)e];
  return s->busy && s->gen == (uint32_t)(e >> 32);
}
TPSH_HOT static uint64_t lane_at(const lane *l, uint32_t k) { return l->q[(l->head + k) & (l->cap - 1)]; }
/* Of lane l's first k entries, how many remain once the stale ones at their end are dropped: the last of
 * those is the newest live entry among them, whose completion implies the others'. */
TPSH_HOT static uint32_t live_prefix(const lane *l, uint32_t k) {
  while (k > 0 && !entry_live(lane_at(l, k - 1))) k--;
  return k;
}

/* Moves the storages s holds to the released list (dropped now, with no memory for the list). */
TPSH_HOT static void let_go(slot *s) {
  if (s->nkeep == 0) return;
  tpsh_grow_array((void **)&released, &capreleased, nreleased + s->nkeep, 64, sizeof *released);
  for (int k = 0; k < s->nkeep; k++) {
    if (nreleased < capreleased) released[nreleased++] = s->keep[k];
    else tpsh_storage_unref(s->keep[k]);              /* out of host memory: not deferred */
  }
  s->nkeep = 0;
}

/* Drops the released references: the last step of each entry point, once the table is consistent. A
 * release may come back here (freeing memory can synchronise a stream): the list is emptied first. */
TPSH_HOT static int flush_released(void) {
  int n = 0;
  for (; nreleased > 0; n++) {
    tpsh_storage *st = released[--nreleased];
    tpsh_storage_unref(st);
  }
  return n;
}

TPSH_HOT static void recycle(slot *s) {
  s->busy = 0;
  s->gen++;
  let_go(s);
  /* A ticket is a double: gen * 2^24 + slot stays exact below 2^53. A slot whose generations are spent
   * (2^29 reuses: an hour and a half of 10 us collectives, each waited on, all in slot 0) is retired
   * for good rather than wrapped, which would make a Work dropped long ago look pending again. */
  if (s->gen >= GEN_LIMIT) return;
  free_list[nfree++] = (uint32_t)(s - slots);
}

/* Recycles the first n entries of lane l (they are complete) and drops a lane left empty. */
TPSH_HOT static void lane_retire(int li, uint32_t n) {
  lane *l = &lanes[li];
  for (uint32_t k = 0; k < n; k++) {
    uint64_t e = lane_at(l, 0);
    l->head = (l->head + 1) & (l->cap - 1);
    l->len--;
    if (entry_live(e)) recycle(&slots[(uint32_t)e]);
  }
  while (l->len > 0 && !entry_live(lane_at(l, 0))) {     /* stale entries at the front go too */
    l->head = (l->head + 1) & (l->cap - 1);
    l->len--;
  }
  if (l->len > 0) return;
  tpsh_stream_unhold(l->stream);
  free(l->q);
  if (li == --nlanes) return;
  *l = lanes[nlanes];                                   /* the last lane moves into the hole */
  for (uint32_t k = 0; k < l->len; k++) {
    uint64_t e = lane_at(l, k);
    if (entry_live(e)) slots[(uint32_t)e].lane = li;
  }
}

/* Retires the entries of slot s's lane up to and including s's own. */
static void retire_through(slot *s) {
  int li = s->lane;
  lane *l = &lanes[li];
  uint64_t mine = entry_of((uint32_t)(s - slots));
  for (uint32_t k = 0; k < l->len; k++)
    if (lane_at(l, k) == mine) { lane_retire(li, k + 1); return; }
  recycle(s);                                          /* not reached: a busy slot is in its lane */
}

TPSH_HOT static int lane_find(const tpsh_stream *st) {
  for (int i = 0; i < nlanes; i++)
    if (lanes[i].stream == st) return i;
  return -1;
}

/* Retires the lanes of streams that nothing else holds once their newest Work has completed (one event
 * query each): Works dropped, or only waited on from another stream, on streams that are gone, would
 * otherwise keep those streams (a thread each on the CPU backend) until the next tpsh_synchronize. */
static void retire_abandoned_lanes(void) {
  for (int li = nlanes - 1; li >= 0; li--) {               /* from the end: lane_retire moves the last */
    lane *l = &lanes[li];
    if (!tpsh_stream_unreachable(l->stream)) continue;
    uint32_t k = live_prefix(l, l->len);
    if (k == 0 || tpsh_rt.be->event_query(slots[(uint32_t)lane_at(l, k - 1)].event) == 1) lane_retire(li, l->len);
  }
}

/* st's lane, made (holding a passive reference to st) if it has none; minus a status on failure. */
TPSH_HOT static int lane_for(tpsh_stream *st) {
  int i = lane_find(st);
  if (i >= 0) return i;
  retire_abandoned_lanes();
  if (nlanes == caplanes) {
    int cap = caplanes ? 2 * caplanes : 8;
    lane *p = realloc(lanes, (size_t)cap * sizeof *p);
    if (!p) return -tpsh_error(TPSH_ENOMEM, "out of host memory");
    lanes = p, caplanes = cap;
  }
  tpsh_stream_hold(st);
  lanes[nlanes] = (lane){ .stream = st };
  return nlanes++;
}

TPSH_HOT static int lane_push(lane *l, uint64_t e) {
  if (l->len == l->cap) {
    uint32_t cap = l->cap ? 2 * l->cap : 64;
    uint64_t *q = malloc((size_t)cap * sizeof *q);
    if (!q) return tpsh_error(TPSH_ENOMEM, "out of host memory");
    for (uint32_t k = 0; k < l->len; k++) q[k] = lane_at(l, k);
    free(l->q);
    l->q = q, l->cap = cap, l->head = 0;
  }
  l->q[(l->head + l->len++) & (l->cap - 1)] = e;
  return TPSH_OK;
}

/* Idle slots from the oldest of lane li (none when li < 0), learnt from one event query. */
TPSH_HOT static int reclaim(int li) {
  if (li < 0 || li >= nlanes || lanes[li].len == 0) return 0;
  lane *l = &lanes[li];
  uint32_t k = live_prefix(l, l->len < RECLAIM_BATCH ? l->len : RECLAIM_BATCH);
  if (k == 0) return 0;
  uint32_t before = nfree;
  if (tpsh_rt.be->event_query(slots[(uint32_t)lane_at(l, k - 1)].event) == 1) lane_retire(li, k);
  return nfree > before;
}

static slot *live(double ticket, int *bad);

static int grow(void) {
  if (nslots == SLOT_MAX) return tpsh_error(TPSH_ENOMEM, "more than %u collectives in flight", SLOT_MAX);
  if (nslots == capslots) {
    uint32_t cap = capslots ? 2 * capslots : 64;
    slot *s = realloc(slots, (size_t)cap * sizeof *s);
    if (!s) return tpsh_error(TPSH_ENOMEM, "out of host memory");
    slots = s;
    uint32_t *f = realloc(free_list, (size_t)cap * sizeof *f);
    if (!f) return tpsh_error(TPSH_ENOMEM, "out of host memory");
    free_list = f;
    capslots = cap;
  }
  tpsh_event *e = tpsh_event_create(0);
  if (!e) return TPSH_ENOMEM;
  slots[nslots] = (slot){ .event = e, .gen = 0, .busy = 0, .lane = -1 };   /* keep: none yet */
  free_list[nfree++] = nslots++;
  return TPSH_OK;
}

TPSH_HOT double tpsh_work_take(tpsh_stream *st) {
  if (!tpsh_rt.initialized) return -tpsh_error(TPSH_EINVAL, "tpsh is not initialised");
  if (!st) return -tpsh_error(TPSH_EINVAL, "expected a stream");
  /* a capture's Works own their events (group.lua): a slot's event would be queried here later */
  if (__builtin_expect(tpsh_graph_capturing, 0)) return -tpsh_graph_refuse("takes a Work ticket");
  if (nfree == 0 && nslots < SLOTS_UNQUERIED) {
    int rc = grow();
    if (rc) return -rc;
  } else if (nfree == 0 && !reclaim(lane_find(st))) {
    int rc = grow();                                   /* one slot at least, then the rest of a batch */
    if (rc) return -rc;
    for (int k = 1; k < RECLAIM_BATCH && grow() == TPSH_OK; k++) {}   /* a failure here: fewer slots */
  }
  int li = lane_for(st);                               /* after the reclaim, which may move lanes */
  if (li < 0) return li;
  uint32_t i = free_list[--nfree];
  int rc = lane_push(&lanes[li], (uint64_t)slots[i].gen << 32 | i);
  if (rc) {
    free_list[nfree++] = i;
    return -rc;
  }
  slots[i].busy = 1;
  slots[i].lane = li;
  slots[i].event->recorded = 0;
  flush_released();                                    /* what a reclaim let go of */
  return (double)slots[i].gen * SLOT_MAX + i;
}

TPSH_HOT void tpsh_work_keep(double ticket, int n, tpsh_storage *const *st) {
  int bad;
  slot *s = live(ticket, &bad);
  if (s && tpsh_grow_array((void **)&s->keep, &s->capkeep, s->nkeep + n, 2, sizeof *s->keep) == TPSH_OK) {
    for (int i = 0; i < n; i++) s->keep[s->nkeep++] = st[i];
    return;
  }
  /* completed already, or no memory: the stream-ordered free suffices */
  for (int i = 0; i < n; i++) tpsh_storage_unref(st[i]);
}

/* The busy slot a ticket names, or NULL when its Work has completed (the slot moved on); *bad when the
 * number is no ticket at all. */
TPSH_HOT static slot *live(double ticket, int *bad) {
  *bad = 0;
  if (!(ticket >= 0) || ticket >= 9007199254740992.0) { *bad = 1; return NULL; }
  uint64_t t = (uint64_t)ticket;
  uint32_t i = (uint32_t)(t & (SLOT_MAX - 1)), gen = (uint32_t)(t >> SLOT_BITS);
  if (i >= nslots || gen > slots[i].gen) { *bad = 1; return NULL; }
  slot *s = &slots[i];
  return s->busy && s->gen == gen ? s : NULL;
}

TPSH_HOT tpsh_event *tpsh_work_event(double ticket) {
  int bad;
  slot *s = live(ticket, &bad);
  return s ? s->event : NULL;
}

TPSH_HOT void tpsh_work_drop(double ticket) {
  int bad;
  slot *s = live(ticket, &bad);
  if (s) recycle(s);                                   /* its lane entry goes stale */
  flush_released();
}

#define BAD_TICKET(name) tpsh_error(TPSH_EINVAL, "%s: not a Work ticket: %.17g", name, ticket)

int tpsh_work_wait(double ticket, tpsh_stream *st) {
  int bad;
  slot *s = live(ticket, &bad);
  if (bad) return BAD_TICKET("work wait");
  /* A stale ticket's collective completed, or its communicator was aborted: the settle reports that. */
  if (!s) return tpsh_async_error_settle(TPSH_OK);
  int rc = tpsh_stream_wait_event(st, s->event);      /* settles, as the stale branch above */
  if (rc == TPSH_OK) let_go(s);                        /* waited on: its tensors are the caller's again */
  flush_released();
  return rc;
}

int tpsh_work_block(double ticket) {
  int bad;
  slot *s = live(ticket, &bad);
  if (bad) return BAD_TICKET("work block");
  if (!s) return tpsh_async_error_settle(TPSH_OK);
  int rc = tpsh_event_synchronize(s->event);
  if (rc == TPSH_OK) retire_through(s);
  flush_released();
  return rc;
}

int tpsh_work_query(double ticket) {
  int bad;
  slot *s = live(ticket, &bad);
  if (bad) return -BAD_TICKET("work query");
  if (!s) return tpsh_query_settle(1);
  int r = tpsh_event_query(s->event);
  if (r == 1) retire_through(s);
  flush_released();
  return r;
}

int tpsh_work_slots(void) { return (int)nslots; }

void tpsh_work_age(uint32_t gens) {
  for (uint32_t k = 0; k < nfree; k++) {
    slot *s = &slots[free_list[k]];
    s->gen = gens < GEN_LIMIT - 1 - s->gen ? s->gen + gens : GEN_LIMIT - 1;
  }
}

/* The host has waited for stream st (or for every stream): its slots are complete. Returns how many
 * storage references that released: freeing memory enqueues work (the free, and events on the streams
 * that used it), which the caller's promise of idle streams must then wait for too. */
int tpsh_work_stream_done(tpsh_stream *st) {
  int i = lane_find(st);
  if (i >= 0) lane_retire(i, lanes[i].len);
  return flush_released();
}

int tpsh_work_all_done(void) {
  while (nlanes > 0) lane_retire(nlanes - 1, lanes[nlanes - 1].len);
  return flush_released();
}

/* At shut-down, after the streams have drained and before the event pool goes. */
void tpsh_work_shutdown(void) {
  tpsh_work_all_done();
  for (uint32_t i = 0; i < nslots; i++) {
    let_go(&slots[i]);                 /* a dropped ticket's slot is idle and holds nothing; to be sure */
    tpsh_event_release(slots[i].event);
    free(slots[i].keep);
  }
  flush_released();
  free(slots);
  free(free_list);
  free(lanes);
  free(released);
  slots = NULL, free_list = NULL, lanes = NULL, released = NULL;
  nslots = capslots = nfree = 0;
  nlanes = caplanes = 0;
  nreleased = capreleased = 0;
}
