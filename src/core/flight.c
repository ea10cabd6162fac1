/*
 * flight.c: the flight recorder: this rank's last 512 collectives (sequence number, op, group, dtype,
 * sizes, stream, state enqueued / started / completed, with times), as PyTorch's NCCL flight recorder
 * keeps them. The front end adds entries when it enqueues; the backend marks them started and completed
 * (the CPU backend's worker around its MPI calls; on CUDA, whatever polls the end events). The watchdog
 * reads the ring to find a collective stuck past the timeout and prints it when it fires.
 *
 * Three threads touch the ring (the host enqueues, workers mark, the watchdog reads). The host writes
 * the entries and the group table under `mu`; a worker's marks go to tables of their own under
 * `marks_mu`, which the host never takes as it enqueues: with one mutex for both, the host's enqueue
 * and the worker's two marks a collective moved its cache line between the threads three times a call
 * (a 1-rank all_reduce loop 1.2-1.6 us a call on the build VM, 0.5-1.2 with the marks left out). A
 * mark is kept with its entry's number, so a mark of an entry the ring has since reused describes
 * nothing: an entry whose mark carries another number is still only enqueued. Readers take mu, then
 * marks_mu.
 */
#include "core/internal.h"
#include "core/group.h"
#include "core/flight.h"
#include "core/check.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tpsh_flight_entry ring[TPSH_FLIGHT_RING];
static uint64_t nrecorded;                 /* entries ever added; the ring holds the last 512 */
static tpsh_flight_group groups[TPSH_FLIGHT_GROUPS];
static int ngroups;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* Under marks_mu: an entry's state and times, with the entry's number + 1 (0: never marked), and each
 * group slot's highest sequence numbers started and completed (-1: none). */
static struct { uint64_t entry; int state; double t_started, t_completed; } marks[TPSH_FLIGHT_RING];
static struct { int64_t started, completed; } group_marks[TPSH_FLIGHT_GROUPS];
static pthread_mutex_t marks_mu = PTHREAD_MUTEX_INITIALIZER;

TPSH_HOT static tpsh_flight_group *group_entry(uint64_t id, const tpsh_group *g) {
  static int last;                                     /* under mu: most calls are for the same group */
  if (last < ngroups && groups[last].id == id) return &groups[last];
  for (int i = 0; i < ngroups; i++)
    if (groups[i].id == id) return &groups[last = i];
  int full = ngroups == TPSH_FLIGHT_GROUPS;
  int i = full ? TPSH_FLIGHT_GROUPS - 1 : ngroups++;   /* full: reuse the last */
  tpsh_flight_group *x = &groups[i];
  memset(x, 0, sizeof *x);
  x->id = id;
  x->shared = full;
  x->enqueued = x->started = x->completed = -1;
  if (!full) {                                         /* (a shared slot's numbers describe no group) */
    pthread_mutex_lock(&marks_mu);
    group_marks[i].started = group_marks[i].completed = -1;
    pthread_mutex_unlock(&marks_mu);
  }
  if (g) {
    x->size = g->size;
    for (int r = 0; r < g->size && r < TPSH_FLIGHT_MAX_MEMBERS; r++) x->members[r] = g->world_ranks[r];
  }
  return x;
}

/* The first entry the ring still holds (entries are numbered from 0 since start), under mu. */
static uint64_t oldest(void) { return nrecorded > TPSH_FLIGHT_RING ? nrecorded - TPSH_FLIGHT_RING : 0; }

/* Moves entry number i (sequence number seq, of group slot `slot`) on to state (started or completed) at
 * `now`, and its group's last such number; under marks_mu. A mark of a number the ring has reused since
 * (a newer entry's mark there) is dropped. */
static void set_state(uint64_t i, uint64_t seq, int slot, int state, double now) {
  __typeof__(marks[0]) *m = &marks[i % TPSH_FLIGHT_RING];
  if (m->entry > i + 1) return;
  if (m->entry != i + 1) {
    m->entry = i + 1;
    m->state = TPSH_FLIGHT_ENQUEUED;
    m->t_started = m->t_completed = 0;
  }
  if (state > m->state) m->state = state;
  if (state == TPSH_FLIGHT_STARTED) m->t_started = now;
  else m->t_completed = now;
  int64_t *last = state == TPSH_FLIGHT_STARTED ? &group_marks[slot].started : &group_marks[slot].completed;
  if ((int64_t)seq > *last) *last = (int64_t)seq;
}

/* Under mu and marks_mu: entry number i's state and times from its marks (e as the host wrote it). */
static void read_marks(tpsh_flight_entry *e, uint64_t i) {
  const __typeof__(marks[0]) *m = &marks[i % TPSH_FLIGHT_RING];
  int marked = m->entry == i + 1;
  e->state = marked ? m->state : TPSH_FLIGHT_ENQUEUED;
  e->t_started = marked ? m->t_started : 0;
  e->t_completed = marked ? m->t_completed : 0;
}

/* The enqueue stamp is only ever compared with seconds ("enqueued 12.0 s ago"), so it is read from the
 * coarse clock (tpsh_now_coarse_ms); started and completed marks keep the full one. */
TPSH_HOT void tpsh_flight_enqueue(tpsh_stream *s, tpsh_group *g, int n, tpsh_coll_args *c) {
  double now = tpsh_now_coarse_ms();
  /* the stream's name, copied once and bounded: this runs for every collective, so no snprintf */
  const char *sname = s ? s->name : "?";
  size_t slen = strnlen(sname, sizeof ring[0].stream - 1);
  pthread_mutex_lock(&mu);
  tpsh_flight_group *ge = group_entry(g->id, g);
  int slot = (int)(ge - groups);
  for (int i = 0; i < n; i++) {
    c[i].flight = nrecorded;
    c[i].flight_slot = slot;
    tpsh_flight_entry *e = &ring[nrecorded++ % TPSH_FLIGHT_RING];
    /* every field is written (no memset of the whole entry: this runs for every collective) */
    e->seq = c[i].seq;
    e->key = g->backend_comm;
    e->group_id = g->id;
    e->group_slot = slot;
    e->group_size = g->size;
    e->op = c[i].name;
    e->kind = c[i].kind;
    e->dtype = c[i].dtype;
    e->count = c[i].count;
    e->coll_index = c[i].coll_index;
    e->peer = c[i].peer;
    e->redop = c[i].op;
    e->t_enqueued = now;                  /* (state and times: the marks, read_marks) */
    memcpy(e->stream, sname, slen);
    e->stream[slen] = 0;
    e->stream_key = tpsh_stream_key(s);
    if ((int64_t)c[i].seq > ge->enqueued) ge->enqueued = (int64_t)c[i].seq;
  }
  ge->collectives = (int64_t)g->collectives;
  ge->t_active = now;
  pthread_mutex_unlock(&mu);
}

/* Each collective knows its entry and its group's slot (c[i].flight, c[i].flight_slot), so a mark costs
 * no search: searching the ring from its newest entry would cost the CPU backend's worker 16,000
 * instructions a call whenever the host is hundreds of collectives ahead. */
void tpsh_flight_mark(const tpsh_coll_args *c, int n, int state) {
  double now = tpsh_now_ms();
  pthread_mutex_lock(&marks_mu);
  for (int k = 0; k < n; k++) set_state(c[k].flight, c[k].seq, c[k].flight_slot, state, now);
  pthread_mutex_unlock(&marks_mu);
}

/* The host has synchronised stream s (NULL: every stream): whatever was enqueued there has completed.
 * Backends that cannot mark completions cheaply (CUDA: that would take an event per collective) are
 * settled this way at no cost to the collective itself. */
void tpsh_flight_settle(const tpsh_stream *s) {
  const void *stream_key = tpsh_stream_key(s);
  double now = tpsh_now_ms();
  pthread_mutex_lock(&mu);
  pthread_mutex_lock(&marks_mu);
  for (uint64_t i = oldest(); i < nrecorded; i++) {
    tpsh_flight_entry *e = &ring[i % TPSH_FLIGHT_RING];
    const __typeof__(marks[0]) *m = &marks[i % TPSH_FLIGHT_RING];
    if ((m->entry == i + 1 && m->state == TPSH_FLIGHT_COMPLETED) || (stream_key && e->stream_key != stream_key))
      continue;
    set_state(i, e->seq, e->group_slot, TPSH_FLIGHT_COMPLETED, now);
  }
  pthread_mutex_unlock(&marks_mu);
  pthread_mutex_unlock(&mu);
}

static struct { uint64_t id; int64_t index; int in; } host_now;   /* under mu */

void tpsh_flight_host_exchange(tpsh_group *g, int64_t index) {
  pthread_mutex_lock(&mu);
  if (g) {
    tpsh_flight_group *ge = group_entry(g->id, g);
    ge->host_exchanges = index + 1;
    ge->t_active = tpsh_now_coarse_ms();
    host_now.id = g->id, host_now.index = index, host_now.in = 1;
  } else {
    host_now.in = 0;
  }
  pthread_mutex_unlock(&mu);
}

int tpsh_flight_host_current(uint64_t *group_id, int64_t *index) {
  pthread_mutex_lock(&mu);
  int in = host_now.in;
  *group_id = host_now.id;
  *index = host_now.index;
  pthread_mutex_unlock(&mu);
  return in;
}

static struct { uint64_t id; int64_t index; const char *op; int in; } match_now;   /* under mu */

void tpsh_flight_match(tpsh_group *g, int64_t index, const char *op) {
  pthread_mutex_lock(&mu);
  if (g) {
    group_entry(g->id, g);          /* its members, for the watchdog, on a group's first collective too */
    match_now.id = g->id, match_now.index = index, match_now.op = op, match_now.in = 1;
  } else {
    match_now.in = 0;
  }
  pthread_mutex_unlock(&mu);
}

int tpsh_flight_match_current(uint64_t *group_id, int64_t *index, const char **op) {
  pthread_mutex_lock(&mu);
  int in = match_now.in;
  *group_id = match_now.id;
  *index = match_now.index;
  *op = match_now.op;
  pthread_mutex_unlock(&mu);
  return in;
}

int tpsh_flight_snapshot(tpsh_flight_entry *out, int max, tpsh_flight_group *gout, int *ng) {
  pthread_mutex_lock(&mu);
  pthread_mutex_lock(&marks_mu);
  uint64_t have = nrecorded < TPSH_FLIGHT_RING ? nrecorded : TPSH_FLIGHT_RING;
  int n = (int)(have < (uint64_t)max ? have : (uint64_t)max);
  for (int i = 0; i < n; i++) {
    uint64_t k = nrecorded - (uint64_t)n + (uint64_t)i;
    out[i] = ring[k % TPSH_FLIGHT_RING];
    read_marks(&out[i], k);
  }
  if (gout) {
    memcpy(gout, groups, (size_t)ngroups * sizeof *groups);
    for (int i = 0; i < ngroups; i++) {
      if (groups[i].shared) continue;            /* (its own numbers, -1: as the table keeps them) */
      gout[i].started = group_marks[i].started;
      gout[i].completed = group_marks[i].completed;
    }
    *ng = ngroups;
  }
  pthread_mutex_unlock(&marks_mu);
  pthread_mutex_unlock(&mu);
  return n;
}

const char *tpsh_flight_state_name(int state) {
  return state == TPSH_FLIGHT_COMPLETED ? "completed" : state == TPSH_FLIGHT_STARTED ? "started" : "enqueued";
}

/* One line per entry, oldest first: what the watchdog prints and tp.check.flight_record() returns. */
int tpsh_flight_format(const tpsh_flight_entry *e, double now, char *buf, size_t len) {
  char t[96] = "";
  if (e->state == TPSH_FLIGHT_COMPLETED)
    snprintf(t, sizeof t, "took %.1f ms", e->t_completed - (e->t_started > 0 ? e->t_started : e->t_enqueued));
  else if (e->state == TPSH_FLIGHT_STARTED)
    snprintf(t, sizeof t, "started %.1f s ago", (now - e->t_started) / 1e3);
  else
    snprintf(t, sizeof t, "enqueued %.1f s ago", (now - e->t_enqueued) / 1e3);
  return snprintf(buf, len, "seq %llu group %llu: %s %s x %lld on stream '%s': %s (%s)",
                  (unsigned long long)e->seq, (unsigned long long)e->group_id, e->op, tpsh_dtype_name(e->dtype),
                  (long long)e->count, e->stream, tpsh_flight_state_name(e->state), t);
}

/* The text of the whole ring, for tp.check.flight_record(); the caller frees it (tpsh_free_buffer). */
char *tpsh_flight_record_text(void) {
  static tpsh_flight_entry snap[TPSH_FLIGHT_RING];
  int n = tpsh_flight_snapshot(snap, TPSH_FLIGHT_RING, NULL, NULL);
  size_t cap = (size_t)n * 200 + 1;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  size_t used = 0;
  buf[0] = 0;
  double now = tpsh_now_ms();
  for (int i = 0; i < n && used < cap; i++) {
    used += (size_t)tpsh_flight_format(&snap[i], now, buf + used, cap - used);
    if (used < cap - 1) buf[used++] = '\n', buf[used] = 0;
  }
  return buf;
}
