/*
 * work.c: Work tickets, the end events of untimed collectives, reused without a finalizer per Work.
 *
 * Why: a Work that owns its end event must give it back when the garbage collector drops it, and in
 * LuaJIT a finalizer per call is expensive twice over: registering and running it costs host time, and a
 * finalizer that runs while a trace is being recorded aborts the recording, so the loop that issues
 * small collectives stays in the interpreter. Measured on a 1 KiB collective (docs/perf.md): the Lua
 * layer cost about 1.2 us over the C call with a finalizer per Work, 0.2 us without.
 *
 * So a Work holds a ticket instead: a slot of this table and the slot's generation, packed in a double
 * (generation * 2^24 + slot) so that it crosses the FFI as a plain Lua number. A slot's event is reused
 * only after it has completed, and reuse moves the generation on: a ticket whose generation no longer
 * matches belongs to a collective that has completed, so waiting on it is a no-op and querying it says
 * done. Slots are recycled
 *   - when the Work's owner sees completion (tpsh_work_block, tpsh_work_query returning 1), and
 *   - by tpsh_work_take, which (once the table holds SLOTS_UNQUERIED slots) queries the oldest busy
 *     slots and reclaims up to RECLAIM_BATCH completed ones in one pass, so that Works dropped without
 *     a wait cost an event query only once per batch, and the table stays about as large as the
 *     collectives in flight (a pending oldest slot goes to the back and a new slot is made instead).
 *     An event query is one driver call: measured on the GPU machine, one per collective cost more
 *     than the rest of the Lua layer.
 * The query bypasses the sanitizer on purpose: the host did not look, so it learns no order from it.
 * Timed Works (w:elapsed needs both events after completion) and check mode (the sanitizer follows each
 * event's clock) keep owning their events from Lua; only the Lua thread uses tickets (no lock).
 */
#include "internal.h"
#include <stdlib.h>

#define SLOT_BITS 24
#define SLOT_MAX (1u << SLOT_BITS)
#define SLOTS_UNQUERIED 256       /* grow without querying up to this many slots */
#define RECLAIM_BATCH 64          /* slots reclaimed by one pass over the oldest */

typedef struct slot {
  tpsh_event *event;
  uint32_t gen;
  int busy;
} slot;

static slot *slots;
static uint32_t nslots, capslots;
static uint32_t *free_list;               /* indices of idle slots */
static uint32_t nfree;
/* Busy slots in the order they were taken, as (slot, generation) pairs: an entry whose generation has
 * moved on (recycled by block or query meanwhile) is skipped. A ring buffer; cap is a power of two. */
static uint64_t *queue;
static uint32_t qhead, qlen, qcap;

static double ticket_of(uint32_t i) { return (double)slots[i].gen * SLOT_MAX + i; }

/* The busy slot a ticket names, or NULL when its Work has completed (the slot moved on). */
static slot *live(double ticket, int *bad) {
  *bad = 0;
  if (!(ticket >= 0) || ticket >= 9007199254740992.0) { *bad = 1; return NULL; }
  uint64_t t = (uint64_t)ticket;
  uint32_t i = (uint32_t)(t & (SLOT_MAX - 1)), gen = (uint32_t)(t >> SLOT_BITS);
  if (i >= nslots || gen > slots[i].gen) { *bad = 1; return NULL; }
  slot *s = &slots[i];
  return s->busy && s->gen == gen ? s : NULL;
}

static void recycle(slot *s) {
  s->busy = 0;
  s->gen++;
  free_list[nfree++] = (uint32_t)(s - slots);
}

static int queue_push(uint32_t i) {
  if (qlen == qcap) {
    uint32_t cap = qcap ? 2 * qcap : 64;
    uint64_t *q = malloc((size_t)cap * sizeof *q);
    if (!q) return tpsh_error(TPSH_ENOMEM, "out of host memory");
    for (uint32_t k = 0; k < qlen; k++) q[k] = queue[(qhead + k) & (qcap - 1)];
    free(queue);
    queue = q, qcap = cap, qhead = 0;
  }
  queue[(qhead + qlen++) & (qcap - 1)] = (uint64_t)slots[i].gen << 32 | i;
  return TPSH_OK;
}

static uint64_t queue_pop(void) {
  uint64_t e = queue[qhead];
  qhead = (qhead + 1) & (qcap - 1);
  qlen--;
  return e;
}

/* Idle slots from the oldest busy ones, while their events have completed (up to RECLAIM_BATCH, so that
 * the queries are few: one per batch of takes while the device keeps up). Stale entries are dropped; the
 * first pending one goes to the back (so that one stream stalled for long does not make every take
 * grow the table) and ends the batch. Returns how many slots became idle. */
static int reclaim(void) {
  int got = 0;
  while (qlen > 0 && got < RECLAIM_BATCH) {
    uint64_t e = queue_pop();
    slot *s = &slots[(uint32_t)e];
    if (!s->busy || s->gen != (uint32_t)(e >> 32)) continue;      /* recycled meanwhile */
    if (tpsh_rt.be->event_query(s->event) != 1) {
      queue[(qhead + qlen++) & (qcap - 1)] = e;                      /* still pending: to the back */
      break;
    }
    recycle(s);
    got++;
  }
  return got;
}

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
  slots[nslots] = (slot){ .event = e, .gen = 0, .busy = 0 };
  free_list[nfree++] = nslots++;
  return TPSH_OK;
}

double tpsh_work_take(void) {
  if (!tpsh_rt.initialized) return -tpsh_error(TPSH_EINVAL, "tpsh is not initialised");
  /* Below SLOTS_UNQUERIED slots the table just grows: no event query at all for a script that keeps
   * fewer Works than that in flight or unobserved; above, a query reclaims a batch of completed ones. */
  if (nfree == 0 && (nslots < SLOTS_UNQUERIED || !reclaim())) {
    int rc = grow();
    if (rc) return -rc;
  }
  uint32_t i = free_list[--nfree];
  int rc = queue_push(i);
  if (rc) {
    free_list[nfree++] = i;
    return -rc;
  }
  slots[i].busy = 1;
  slots[i].event->recorded = 0;
  return ticket_of(i);
}

tpsh_event *tpsh_work_event(double ticket) {
  int bad;
  slot *s = live(ticket, &bad);
  return s ? s->event : NULL;
}

void tpsh_work_drop(double ticket) {
  int bad;
  slot *s = live(ticket, &bad);
  if (s) recycle(s);
}

#define BAD_TICKET(name) tpsh_error(TPSH_EINVAL, "%s: not a Work ticket: %.17g", name, ticket)

int tpsh_work_wait(double ticket, tpsh_stream *st) {
  int bad;
  slot *s = live(ticket, &bad);
  if (bad) return BAD_TICKET("work wait");
  return s ? tpsh_stream_wait_event(st, s->event) : TPSH_OK;
}

int tpsh_work_block(double ticket) {
  int bad;
  slot *s = live(ticket, &bad);
  if (bad) return BAD_TICKET("work block");
  if (!s) return TPSH_OK;
  int rc = tpsh_event_synchronize(s->event);
  if (rc == TPSH_OK) recycle(s);
  return rc;
}

int tpsh_work_query(double ticket) {
  int bad;
  slot *s = live(ticket, &bad);
  if (bad) return -BAD_TICKET("work query");
  if (!s) return 1;
  int r = tpsh_event_query(s->event);
  if (r == 1) recycle(s);
  return r;
}

int tpsh_work_slots(void) { return (int)nslots; }

/* At shut-down, after the streams have drained and before the event pool goes. */
void tpsh_work_shutdown(void) {
  for (uint32_t i = 0; i < nslots; i++) tpsh_event_release(slots[i].event);
  free(slots);
  free(free_list);
  free(queue);
  slots = NULL, free_list = NULL, queue = NULL;
  nslots = capslots = nfree = qhead = qlen = qcap = 0;
}
