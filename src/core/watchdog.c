/*
 * watchdog.c: the collective watchdog of --timeout SEC (TPSH_TIMEOUT; default 600 s, as PyTorch's).
 *
 * One thread per rank, started by tpsh_init, wakes every 0.5 s. It fires when a collective of the
 * flight recorder has been started but not completed for longer than the timeout, or when the host
 * has been blocked in one wait (synchronize, a read to the host, a host-side exchange, the mismatch
 * check) for longer than the timeout. Firing means:
 *   1. print the stuck collective (or host wait) and the flight record, rank-prefixed;
 *   2. ask every other rank for its state: the last sequence numbers it enqueued / started / completed
 *      per group and what it is doing. Every rank's watchdog thread answers such requests each time it
 *      wakes, whatever its main thread is doing, so a live rank answers within ~0.5 s; the asking rank
 *      waits at most 2 s, then says which ranks did not answer (dead, or with MPI itself wedged);
 *   3. name the ranks that did not join the stuck collective (their last enqueued sequence number on
 *      the group is below it, or they did not answer), and those stuck in a different collective at
 *      the same sequence number of the group (the ranks issued different collectives);
 *   4. with --trace, let the host thread write this rank's own records (host_ending.c: at most 2 s for
 *      it to come from its wait, 30 s to write); run tpsh_watchdog_abort_hook (ncclCommAbort on CUDA),
 *      then MPI_Abort: every rank ends with a non-zero status. Worst case: timeout + 0.5 s to notice
 *      + 2 s to ask + the abort (+ the host's records).
 * The requests travel on a communicator of the watchdog's own (a dup of the world made at start), with
 * MPI errors returned, not fatal, so that a dead peer cannot take this thread down before it reports.
 *
 * A test that failed on one rank (`tpsh test`): the failing rank goes on to the runner's exchange, and a
 * rank still in a collective of that test waits for it forever (the failing rank will not issue it).
 * The runner tells the C side which test runs (tpsh_watch_test) and when this rank waits at its
 * exchange, with or without a failure (tpsh_watch_exchange_begin). A rank whose host has been blocked
 * outside that exchange (a host wait, or inside the backend's collective call) for PEER_ASK_MS asks the
 * others for their state (as in 2. above; again every PEER_GRACE_MS while the wait lasts), and ends
 * every rank with status 1 at once when
 *   - a rank at the exchange of this test is a member of the group of one of this rank's unfinished
 *     collectives and has issued no more collectives on it than that one's number: it will never join
 *     it (the counts are exact, so this never fires on a run that could go on), or
 *   - a rank failed this test and waits at the exchange, and the wait has lasted PEER_GRACE_MS: taken as
 *     a wait for that rank; at worst a run that has failed already stops early.
 * The message names the step (tpsh_watch_step: the test, or the loading of the spec files) and quotes
 * the other rank's failure. The other ranks are only ever asked, never sent
 * anything unasked; a question or answer still on its way when the run ends normally (a rank that
 * finished is asked by one still waiting; an answer comes after the asker's deadline) is received
 * then, by counts the ranks exchange (drain_questions): no message is left for MPI_Finalize.
 *
 * The same question, whenever this rank has been blocked for PEER_ASK_MS with a collective not known
 * complete, also compares each answering member's last collectives (their descriptions: number on the
 * group, op, dtype, count, root, reduce op) with this rank's flight entries: a collective number of a
 * group that two ranks issued differently is a mismatch no transport can match, and every rank ends
 * with status 1 at once (fire_mismatch), where without check mode it waited for the timeout.
 *
 * A plain script is one such test (TPSH_WATCH_SCRIPT, set by the host) and its end the exchange
 * (tpsh_watch_end_of_script, a barrier on a communicator of its own): a rank that has finished the
 * script issues nothing more, so a rank blocked in a collective or host-side exchange that it never
 * issued is ended the same way, 1 s into its wait rather than at the timeout.
 *
 * A rank killed with SIGKILL: under mpiexec's default clean-up the launcher ends the others at once;
 * where it does not (mpiexec -disable-auto-cleanup, some schedulers, a node that vanishes), the others
 * are stuck in a collective or a host wait and this watchdog ends them within the timeout + 3 s. A rank
 * stopped (SIGSTOP) or on a hung host while the others wait at the end of the script, the one wait
 * without a timeout: they end every rank once it has answered none of their questions for about the
 * timeout + 12 s (check_end_silence).
 *
 * The end of a script's exchange and the comparison there are watchdog_end.c's; what the two files
 * share is core/watchdog.h.
 */
#define _GNU_SOURCE
#include "core/p2p_ledger.h"
#include "core/internal.h"
#include "core/group.h"
#include "core/flight.h"
#include "core/leakcheck.h"
#include "core/nap.h"
#include "core/watchdog.h"
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void (*tpsh_watchdog_abort_hook)(void);
volatile uint64_t tpsh_watch_call_count;

enum { TAG_REQ = 0x7d01, TAG_REP = 0x7d02, TAG_END = 0x7d03, TAG_END_DONE = 0x7d04, END_WAIT_MS = 4000,
       STATUS_GROUPS = 16, ASK_MS = 2000, TICK_MS = 500, PEER_ASK_MS = 1000,
       PEER_GRACE_MS = 5000, FAILURE_TEXT = 2048, STATUS_BEHIND = 16 };

static double timeout_s = 600;           /* set by the host (tp.check.timeout), read by the watchdog: atomic */
static double get_timeout(void) { double v; __atomic_load(&timeout_s, &v, __ATOMIC_RELAXED); return v; }
static MPI_Comm wd_comm = MPI_COMM_NULL;
MPI_Comm tpsh_wd_end_comm = MPI_COMM_NULL;   /* these two: core/watchdog.h */
volatile int tpsh_wd_at_script_end;
static pthread_t thread;
static int running, stopping;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

/* ==== host waits (the host thread writes, the watchdog reads) ==================================== */
/* what, since and on are written by the host while the watchdog may read them (a new wait begins as the
 * watchdog reads the last one's): relaxed atomics, read through the accessors below. */
static const char *wait_what;
static double wait_since;
static volatile int wait_depth;
static volatile uint64_t wait_serial; /* counts outermost waits: tells one wait from the next */
static const void *wait_on;  /* what the outermost wait waits for (tpsh_watch_wait_begin_on), or NULL */
static int wait_peer = -1;  /* the world rank the wait waits for (tpsh_watch_wait_peer), or -1 */
static volatile int in_exchange;      /* the wait is `tpsh test`'s own exchange (never a peer's victim) */
static volatile uint64_t cur_test;    /* `tpsh test`: the test running now (0: none, or a plain script) */
static const char *get_wait_what(void) { return __atomic_load_n(&wait_what, __ATOMIC_RELAXED); }
static double get_wait_since(void) { double v; __atomic_load(&wait_since, &v, __ATOMIC_RELAXED); return v; }
/* The host inside the backend's collective call (tpsh_watch_call_count odd): the count the watchdog saw
 * last and since when (tpsh_now_ms; 0: the host is not inside one). The watchdog thread's only. */
static uint64_t call_seen;
static double call_since;
static const char *const CALL_WHAT = "the backend's call that launches a collective (NCCL connects to the "
  "other ranks at a communicator's first collectives, and waits there until they call it too)";
static char my_failure[FAILURE_TEXT];  /* this rank's failure in test my_failure_test (under failure_mu) */
static uint64_t my_failure_test;
static pthread_mutex_t failure_mu = PTHREAD_MUTEX_INITIALIZER;
/* The running step in words (tpsh_watch_step, under failure_mu): fire_peer's message said "this test"
 * only, and a test that only passed on the rank at the exchange was named nowhere (nor that the step was
 * the loading of the spec files, whose describe bodies may issue collectives too). */
static char my_step[512];

void tpsh_watch_wait_begin(const char *what) { tpsh_watch_wait_begin_on(what, NULL); }

void tpsh_watch_wait_begin_on(const char *what, const void *stream) {
  /* Only the host thread writes these; the time is set before the depth says "waiting", so the
   * watchdog never pairs a new wait with an old start. Nested waits keep the outer one. */
  if (__atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) == 0) {
    double now = tpsh_now_ms();
    __atomic_store_n(&wait_what, what, __ATOMIC_RELAXED);
    const void *key = stream == TPSH_WAIT_ALL_STREAMS ? stream : tpsh_stream_key(stream);
    __atomic_store_n(&wait_on, key, __ATOMIC_RELAXED);
    __atomic_store(&wait_since, &now, __ATOMIC_RELAXED);
    __atomic_store_n(&wait_serial, wait_serial + 1, __ATOMIC_RELEASE);
  }
  __atomic_add_fetch(&wait_depth, 1, __ATOMIC_ACQ_REL);
}

/* Within a wait: the host waits for world rank `rank` now (check mode's send/recv comparison, waiting for
 * its peer's announcement). That wait involves another rank: the watchdog said "this is the rank's own
 * work taking longer than the timeout" there, where a receive waited for a peer that sent elsewhere. */
void tpsh_watch_wait_peer(int rank) { __atomic_store_n(&wait_peer, rank, __ATOMIC_RELEASE); }

void tpsh_watch_wait_end(void) {
  if (__atomic_sub_fetch(&wait_depth, 1, __ATOMIC_ACQ_REL) == 0) {
    __atomic_store_n(&in_exchange, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&wait_peer, -1, __ATOMIC_RELEASE);
  }
  tpsh_watchdog_hold_if_ending();
}

void tpsh_watch_test(uint64_t test) { __atomic_store_n(&cur_test, test, __ATOMIC_RELEASE); }

void tpsh_watch_step(const char *words) {
  pthread_mutex_lock(&failure_mu);
  snprintf(my_step, sizeof my_step, "%s", words ? words : "");
  pthread_mutex_unlock(&failure_mu);
}

void tpsh_watch_exchange_begin(const char *what, const char *failure) {
  if (failure) {
    pthread_mutex_lock(&failure_mu);
    snprintf(my_failure, sizeof my_failure, "%s", failure);
    my_failure_test = __atomic_load_n(&cur_test, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&failure_mu);
  }
  __atomic_store_n(&in_exchange, 1, __ATOMIC_RELEASE);   /* before the depth says "waiting" */
  tpsh_watch_wait_begin(what);
}

/* ==== configuration =============================================================================== */
void tpsh_watchdog_set_timeout(double seconds) { if (seconds > 0) __atomic_store(&timeout_s, &seconds, __ATOMIC_RELAXED); }
double tpsh_watchdog_timeout(void) { return get_timeout(); }

/* ==== this rank's state, as another rank asks for it ============================================== */
typedef struct wd_status {
  int32_t rank, ngroups, groups_known;   /* groups_known: all of the rank's flight groups are in g[] */
  struct { uint64_t id; int64_t enqueued, started, completed, collectives, host_exchanges; int32_t shared; } g[STATUS_GROUPS];
  char doing[256];
  /* the collective this rank is stuck in, if any (started, not completed) */
  int32_t in_coll;
  uint64_t coll_group, coll_seq;
  char coll_op[32];
  /* `tpsh test`: the test running, whether this rank waits at the runner's exchange (it issues no more
   * collectives in this test), and whether it failed the test */
  uint64_t test;
  int32_t at_exchange, failed;
  /* the host-side exchange its host is blocked in (tp.barrier, tp.allgather, ...): group and number on
   * it, counted from 0; host_index -1: none */
  uint64_t host_group;
  int64_t host_index;
  char host_what[128];      /* which exchange (its wait's name: "tp.barrier", "tp.allgather (...)") */
  /* check mode: the collective whose comparison its host waits in (not yet enqueued): group, number among
   * the group's collectives (match_index -1: none) */
  uint64_t match_group;
  int64_t match_index;
  /* that group's members as world ranks (match_size 0: unknown), for an asker that has never made a
   * collective there: is it a member that has not issued it (match_match_cycle)? */
  int32_t match_size;
  int32_t match_members[TPSH_FLIGHT_MAX_MEMBERS];
  /* a collective its host's wait cannot end before (the oldest not known complete on the stream that a
   * read or synchronize waits for, or on any stream for tp.synchronize): group, number among the group's
   * collectives (dep_index -1: none, or a wait outside a stream), name, and the group's members as world
   * ranks, so that an asker that has not issued it, and never made a collective on that group, knows
   * whether it is one (wait_cross) */
  uint64_t dep_group;
  int64_t dep_index;
  char dep_op[32];
  int32_t dep_kind, dep_root;       /* its tpsh_coll_kind and root (a rank of the group; broadcast, reduce) */
  int32_t dep_size;
  int32_t dep_members[TPSH_FLIGHT_MAX_MEMBERS];
  /* the collectives issued after dep on dep's stream, not complete (at most STATUS_BEHIND, oldest first):
   * a stream runs in order, so none starts before dep has completed, and a rank waiting for one of them
   * waits for dep too (wait_cross: a rank skipped a sub-group's collective before a world one) */
  int32_t nbehind;
  struct { uint64_t group; int64_t index; } behind[STATUS_BEHIND];
  char failure[FAILURE_TEXT];
  coll_list colls;      /* compared with the asking rank's own flight entries (tpsh_wd_mismatch_with) */
  /* the sends it has enqueued to the asking rank, and the receives from it (p2p_ledger.c), so that an
   * asker blocked behind a send or recv with a rank that has finished knows whether its match will come */
  uint64_t p2p_sent, p2p_received;
} wd_status;

static tpsh_flight_entry snap[TPSH_FLIGHT_RING];     /* the watchdog thread's only */
static tpsh_flight_group snap_groups[TPSH_FLIGHT_GROUPS];

/* The entry of group id among groups[0..ng) (the last, should a shared slot repeat it), NULL if none. */
static const tpsh_flight_group *group_of(const tpsh_flight_group *groups, int ng, uint64_t id) {
  for (int i = ng - 1; i >= 0; i--)
    if (groups[i].id == id) return &groups[i];
  return NULL;
}

/* Whether world rank r is one of grp's members (as far as the table holds them). */
static int has_member(const tpsh_flight_group *grp, int r) {
  for (int k = 0; k < grp->size && k < TPSH_FLIGHT_MAX_MEMBERS; k++)
    if (grp->members[k] == r) return 1;
  return 0;
}

/* The host-side exchange the host is blocked in now (tp.barrier, tp.allgather, ...): its number on the
 * group, *group its id; -1 when the host waits in none. */
static int64_t exchange_now(uint64_t *group) {
  int64_t index = -1;
  if (!(__atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0 && tpsh_flight_host_current(group, &index))) return -1;
  return index;
}

/* The entry of group id among groups[0..ng) when it is usable (not a shared slot) and names world rank
 * r as a member; NULL otherwise (an entry that cannot say decides nothing). */
static const tpsh_flight_group *entry_with(const tpsh_flight_group *groups, int ng, uint64_t id, int r) {
  const tpsh_flight_group *grp = group_of(groups, ng, id);
  return grp && !grp->shared && has_member(grp, r) ? grp : NULL;
}

/* Whether world rank self's side of a collective (kind; root_world: its root as a world rank, -1 where
 * unknown) cannot complete before world rank other has issued its own: what each "cannot end" of the
 * deadlock rules rests on (the waits column of coll_kinds.h says why a root that only sends does not).
 * Unknown members, sends and receives: no. */
static int waits_for_member(int kind, int root_world, int self, int other) {
  const tpsh_coll_kind_info *k = tpsh_coll_kind_of(kind);
  switch (k ? k->waits : TPSH_CK_WAITS_PEER) {
  case TPSH_CK_WAITS_EVERY_MEMBER: return 1;
  case TPSH_CK_WAITS_ROOT_ONLY: return root_world == other && self != other;
  case TPSH_CK_WAITS_AT_ROOT: return root_world == self && self != other;
  default: return 0;
  }
}

/* The same for this rank's own collective e (its root a rank of its group in this rank's table). */
static int mine_waits_for(const tpsh_flight_entry *e, int ng, int other) {
  const tpsh_flight_group *grp = group_of(snap_groups, ng, e->group_id);
  if (!grp) return 0;
  int r = e->peer;
  int root_world = r >= 0 && r < grp->size && r < TPSH_FLIGHT_MAX_MEMBERS ? grp->members[r] : -1;
  return waits_for_member(e->kind, root_world, tpsh_rt.rank, other);
}

static int64_t match_now(uint64_t *group, const char **op);

static void describe_doing(char *buf, size_t len, double now) {
  int ng = 0;
  int n = tpsh_flight_snapshot(snap, TPSH_FLIGHT_RING, snap_groups, &ng);
  for (int i = 0; i < n; i++)
    if (snap[i].state == TPSH_FLIGHT_STARTED) {
      snprintf(buf, len, "in %s seq %llu of group %llu for %.1f s", snap[i].op, (unsigned long long)snap[i].seq,
               (unsigned long long)snap[i].group_id, (now - snap[i].t_started) / 1e3);
      return;
    }
  uint64_t calls = __atomic_load_n(&tpsh_watch_call_count, __ATOMIC_ACQUIRE);
  const char *what = get_wait_what();
  uint64_t mg;
  const char *mop = NULL;
  int64_t mi = match_now(&mg, &mop);
  if (__atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0 && mi >= 0)
    /* which comparison: "the collective mismatch check" alone named neither group nor collective */
    snprintf(buf, len, "host blocked in %s of its %s, collective #%lld of group %llu, for %.1f s", what ? what : "a wait",
             mop ? mop : "collective", (long long)mi, (unsigned long long)mg, (now - get_wait_since()) / 1e3);
  else if (__atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0)
    snprintf(buf, len, "host blocked in %s for %.1f s", what ? what : "a wait", (now - get_wait_since()) / 1e3);
  else if (calls & 1) {
    /* Inside the backend's launch (NCCL waiting there for the others to join): the collective is the
     * newest entry, recorded just before the call. Without this a rank stuck there answered "running",
     * as the 4-GPU run of the skipped-collective check showed its peers. The tick times the call it saw
     * (call_seen); a call begun since then has just begun. */
    double since = calls == call_seen && call_since > 0 ? call_since : now;
    const tpsh_flight_entry *e = n > 0 && snap[n - 1].state == TPSH_FLIGHT_ENQUEUED ? &snap[n - 1] : NULL;
    char which[96] = "";
    if (e) snprintf(which, sizeof which, " (%s seq %llu of group %llu)", e->op, (unsigned long long)e->seq,
                    (unsigned long long)e->group_id);
    snprintf(buf, len, "host blocked in the backend's call that launches a collective%s for %.1f s", which,
             (now - since) / 1e3);
  } else
    snprintf(buf, len, "running (no collective in flight, host not waiting)");
}

static void desc_of(const tpsh_flight_entry *e, tpsh_coll_desc *d) {
  *d = (tpsh_coll_desc){.number = (uint64_t)e->coll_index, .kind = e->kind, .dtype = e->dtype, .op = e->redop,
                        .root = e->peer, .count = e->count};
}

/* The last STATUS_COLLS collectives of the n flight entries e (oldest first) into l. */
void tpsh_wd_recent_collectives(const tpsh_flight_entry *e, int n, coll_list *l) {
  int first = n;
  for (int k = 0; first > 0 && k < STATUS_COLLS; first--) k += e[first - 1].coll_index >= 0;
  l->n = 0;
  for (int i = first; i < n; i++)
    if (e[i].coll_index >= 0) {
      l->c[l->n].group = e[i].group_id;
      desc_of(&e[i], &l->c[l->n].d);
      l->n++;
    }
}

/* Which of the rank's flight groups a status lists (indices into gs, at most STATUS_GROUPS): all of them
 * when they fit; otherwise the group of the host-side exchange under way, the group of the collective
 * that has started, then the most recently active, so that the group a peer asks about (the one its
 * stuck collective or exchange is on) is among them. Listing the first sixteen the table had, as this
 * did, left a program's newer groups out, and the deadlock rule could not decide for them. */
static int status_groups(const tpsh_flight_group *gs, int ng, const wd_status *st, int *pick) {
  if (ng <= STATUS_GROUPS) {
    for (int i = 0; i < ng; i++) pick[i] = i;
    return ng;
  }
  int np = 0;
  for (int want = 0; want < 2; want++) {
    int on = want == 0 ? st->host_index >= 0 : st->in_coll;
    uint64_t id = want == 0 ? st->host_group : st->coll_group;
    for (int i = 0; on && i < ng; i++)
      if (gs[i].id == id && (np == 0 || pick[0] != i)) { pick[np++] = i; break; }
  }
  while (np < STATUS_GROUPS) {                         /* then by recency: a selection, 16 passes at most */
    int best = -1;
    for (int i = 0; i < ng; i++) {
      int taken = 0;
      for (int k = 0; k < np && !taken; k++) taken = pick[k] == i;
      if (!taken && (best < 0 || gs[i].t_active > gs[best].t_active)) best = i;
    }
    if (best < 0) break;
    pick[np++] = best;
  }
  return np;
}

/* A status's copy of grp's members (world ranks) into *size and members[]: 0, nothing written, where the
 * table cannot give them whole (no entry, a shared slot, more members than it keeps). */
static int copy_members(const tpsh_flight_group *grp, int32_t *size, int32_t *members) {
  if (!grp || grp->shared || grp->size > TPSH_FLIGHT_MAX_MEMBERS) return 0;
  *size = grp->size;
  memcpy(members, grp->members, (size_t)grp->size * sizeof grp->members[0]);
  return 1;
}

static void fill_status(wd_status *st) {
  memset(st, 0, sizeof *st);
  st->rank = tpsh_rt.rank;
  st->test = __atomic_load_n(&cur_test, __ATOMIC_ACQUIRE);
  if (st->test && __atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0 && __atomic_load_n(&in_exchange, __ATOMIC_ACQUIRE)) {
    st->at_exchange = 1;
    pthread_mutex_lock(&failure_mu);
    if (my_failure_test == st->test) {
      st->failed = 1;
      memcpy(st->failure, my_failure, sizeof st->failure);
    }
    pthread_mutex_unlock(&failure_mu);
  }
  describe_doing(st->doing, sizeof st->doing, tpsh_now_ms());
  st->host_index = exchange_now(&st->host_group);
  { const char *mop = NULL; st->match_index = match_now(&st->match_group, &mop); }
  if (st->host_index >= 0) { const char *w = get_wait_what(); snprintf(st->host_what, sizeof st->host_what, "%s", w ? w : "?"); }
  int n = tpsh_flight_snapshot(snap, TPSH_FLIGHT_RING, NULL, NULL);
  for (int i = 0; i < n && !st->in_coll; i++)
    if (snap[i].state == TPSH_FLIGHT_STARTED) {
      st->in_coll = 1;
      st->coll_group = snap[i].group_id;
      st->coll_seq = snap[i].seq;
      snprintf(st->coll_op, sizeof st->coll_op, "%s", snap[i].op);
    }
  tpsh_wd_recent_collectives(snap, n, &st->colls);
  int ng = 0;
  tpsh_flight_snapshot(snap, 0, snap_groups, &ng);
  int pick[STATUS_GROUPS];
  int np = status_groups(snap_groups, ng, st, pick);
  for (int i = 0; i < np; i++) {
    const tpsh_flight_group *x = &snap_groups[pick[i]];
    st->g[i].id = x->id;
    st->g[i].enqueued = x->enqueued;
    st->g[i].started = x->started;
    st->g[i].completed = x->completed;
    st->g[i].collectives = x->collectives;
    st->g[i].host_exchanges = x->host_exchanges;
    st->g[i].shared = x->shared;
    st->ngroups = i + 1;
  }
  st->groups_known = ng <= STATUS_GROUPS && ng < TPSH_FLIGHT_GROUPS;
  if (st->match_index >= 0)          /* tpsh_flight_match put the compared group in the table */
    copy_members(group_of(snap_groups, ng, st->match_group), &st->match_size, st->match_members);
  st->dep_index = -1;
  const void *on = __atomic_load_n(&wait_on, __ATOMIC_RELAXED);
  if (on && __atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0 && !__atomic_load_n(&in_exchange, __ATOMIC_ACQUIRE) &&
      st->host_index < 0)
    for (int i = 0; i < n; i++) {
      const tpsh_flight_entry *e = &snap[i];
      if (e->state == TPSH_FLIGHT_COMPLETED || e->coll_index < 0) continue;
      if (on != TPSH_WAIT_ALL_STREAMS && e->stream_key != on) continue;
      const tpsh_flight_group *d = group_of(snap_groups, ng, e->group_id);
      if (!copy_members(d, &st->dep_size, st->dep_members)) break;
      st->dep_group = e->group_id;
      st->dep_index = e->coll_index;
      st->dep_kind = e->kind;
      st->dep_root = e->peer;
      snprintf(st->dep_op, sizeof st->dep_op, "%s", e->op);
      for (int j = i + 1; j < n && st->nbehind < STATUS_BEHIND; j++)   /* the snapshot is in issue order */
        if (snap[j].stream_key == e->stream_key && snap[j].state != TPSH_FLIGHT_COMPLETED && snap[j].coll_index >= 0) {
          st->behind[st->nbehind].group = snap[j].group_id;
          st->behind[st->nbehind].index = snap[j].coll_index;
          st->nbehind++;
        }
      break;
    }
}

static double now_ms(void) { return tpsh_now_ms(); }

/* Every question and answer is counted per peer, so that the end of the run can receive each one still
 * in flight (drain_questions): a rank that finished may be asked once more by a rank still waiting, and
 * an answer may come after the asking rank's deadline. Left unreceived, MPI_Finalize complained of them
 * ("UCX WARN unexpected tag-receive descriptor ... was not matched"). The watchdog thread's only until
 * it stops; then the host thread's. */
typedef struct peer_counts { uint64_t asked_of, asked_by, answered_to, answers_from; } peer_counts;
static peer_counts *counts;   /* [tpsh_rt.size] */

/* An answer on its way: MPI_Isend's buffer lives until the send completes (a blocking send could wait
 * forever for an asker that gave up, and this thread with it). */
typedef struct answer { struct answer *next; MPI_Request req; wd_status st; } answer;
static answer *answers;

/* Ends receive *q, posted and maybe never matched: cancelled, or completed after all. Returns whether a
 * message came (then *s, when given, says from whom), so that the counts above stay exact. */
static int end_receive(MPI_Request *q, MPI_Status *s) {
  MPI_Status st;
  int cancelled = 0;
  MPI_Cancel(q);
  MPI_Wait(q, &st);
  MPI_Test_cancelled(&st, &cancelled);
  if (s) *s = st;
  return !cancelled;
}

static void reap_answers(void) {
  for (answer **p = &answers; *p;) {
    int done = 0;
    if (MPI_Test(&(*p)->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
    if (!done) { p = &(*p)->next; continue; }
    answer *a = *p;
    *p = a->next;
    free(a);
  }
}

/* Questions arrive in a receive that is always posted: MPI_Test completes one that has come in the
 * same call that makes progress, where MPI_Iprobe (MPICH) first looked, found nothing, made progress and
 * only saw the question at the next tick, so that answers took a second rather than half of one. */
static MPI_Request question = MPI_REQUEST_NULL;
static int question_from;                 /* the receive's buffer: the asking rank */

/* Answers every pending request of another rank's watchdog. */
static void serve(void) {
  reap_answers();
  for (;;) {
    if (question == MPI_REQUEST_NULL &&
        MPI_Irecv(&question_from, 1, MPI_INT, MPI_ANY_SOURCE, TAG_REQ, wd_comm, &question) != MPI_SUCCESS) {
      question = MPI_REQUEST_NULL;
      return;
    }
    int done = 0;
    MPI_Status s;
    if (MPI_Test(&question, &done, &s) != MPI_SUCCESS) { question = MPI_REQUEST_NULL; return; }
    if (!done) return;
    int from = s.MPI_SOURCE;
    counts[from].asked_by++;
    answer *a = malloc(sizeof *a);
    if (!a) continue;                      /* out of memory: the asker's deadline passes */
    fill_status(&a->st);
    tpsh_p2p_ledger_counts(from, &a->st.p2p_sent, &a->st.p2p_received);
    if (MPI_Isend(&a->st, (int)sizeof a->st, MPI_BYTE, from, TAG_REP, wd_comm, &a->req) != MPI_SUCCESS) { free(a); continue; }
    counts[from].answered_to++;
    a->next = answers;
    answers = a;
  }
}

/* The posted receive ends before the counts are exchanged: cancelled, or it had a question after all. */
static void end_question_receive(void) {
  if (question == MPI_REQUEST_NULL) return;
  MPI_Status s;
  if (end_receive(&question, &s)) counts[s.MPI_SOURCE].asked_by++;
  question = MPI_REQUEST_NULL;
}

/* Receives from rank r on tag what it still owes this rank (*got up to want) into buf, and drops it.
 * Returns 0 when the deadline passed (a count was wrong: the drain stops there). */
static int receive_owed(int r, int tag, void *buf, int count, MPI_Datatype type, uint64_t *got, uint64_t want,
                        double deadline) {
  while (*got < want) {
    MPI_Request q;
    if (MPI_Irecv(buf, count, type, r, tag, wd_comm, &q) != MPI_SUCCESS) return 1;
    int done = 0;
    while (MPI_Test(&q, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && now_ms() < deadline) tpsh_sleep_ms(1);
    if (!done) { end_receive(&q, NULL); return 0; }
    (*got)++;
  }
  return 1;
}

/* At the end of the run, every rank (no watchdog thread left anywhere once the exchange of counts is
 * done): receive the questions and answers the others sent this rank and it has not received, then
 * wait for this rank's own answers to be received. Bounded, should a count ever be wrong. */
static void drain_questions(void) {
  int size = tpsh_rt.size, me = tpsh_rt.rank;
  uint64_t *sent = calloc(4 * (size_t)size, sizeof *sent), *to_me = sent ? sent + 2 * size : NULL;
  if (!sent) return;
  for (int r = 0; r < size; r++) sent[2 * r] = counts[r].asked_of, sent[2 * r + 1] = counts[r].answered_to;
  if (MPI_Alltoall(sent, 2, MPI_UINT64_T, to_me, 2, MPI_UINT64_T, wd_comm) != MPI_SUCCESS) { free(sent); return; }
  static int who;
  static wd_status late;                   /* answers no one reads any more */
  double deadline = now_ms() + 5 * ASK_MS;
  int on = 1;
  for (int r = 0; r < size && on; r++)
    if (r != me)
      on = receive_owed(r, TAG_REQ, &who, 1, MPI_INT, &counts[r].asked_by, to_me[2 * r], deadline) &&
           receive_owed(r, TAG_REP, &late, (int)sizeof late, MPI_BYTE, &counts[r].answers_from, to_me[2 * r + 1],
                        deadline);
  free(sent);
  if (!on) return;
  while (answers && now_ms() < deadline) {
    reap_answers();
    if (answers) tpsh_sleep_ms(1);
  }
}

/* ==== firing ====================================================================================== */
/* Text said in parts (flush): it keeps the whole, which a rank's own --trace records quote at the end. */
typedef struct outbuf { char *p; size_t n, cap, said; } outbuf;

static void out(outbuf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(outbuf *o, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (len < 0) return;
  if (len >= (int)sizeof line) len = sizeof line - 1;
  char prefix[32];
  int pl = snprintf(prefix, sizeof prefix, "[rank %d] ", tpsh_rt.rank);
  size_t need = o->n + (size_t)pl + (size_t)len + 2;
  if (need > o->cap) {
    size_t cap = o->cap ? o->cap : 65536;
    while (cap < need) cap *= 2;
    char *p = realloc(o->p, cap);
    if (!p) return;
    o->p = p;
    o->cap = cap;
  }
  memcpy(o->p + o->n, prefix, (size_t)pl);
  memcpy(o->p + o->n + pl, line, (size_t)len);
  o->n += (size_t)pl + (size_t)len;
  o->p[o->n++] = '\n';
}

static void flush(outbuf *o) {
  size_t at = o->said;
  while (at < o->n) {
    ssize_t w = write(2, o->p + at, o->n - at);
    if (w <= 0) break;
    at += (size_t)w;
  }
  o->said = o->n;
}

static uint64_t questions;     /* atomic: ask_others calls */
uint64_t tpsh_watch_questions(void) { return __atomic_load_n(&questions, __ATOMIC_ACQUIRE); }

/* Asks every other rank for its state; got[r] says whether rank r answered within ASK_MS. */
static void ask_others(wd_status *rep, int *got, int size) {
  static int me;                               /* the question: its buffer outlives the sends */
  me = tpsh_rt.rank;
  __atomic_add_fetch(&questions, 1, __ATOMIC_ACQ_REL);
  MPI_Request *rr = calloc((size_t)size, sizeof *rr), *sr = calloc((size_t)size, sizeof *sr);
  if (!rr || !sr) { free(rr); free(sr); return; }
  for (int r = 0; r < size; r++) {
    rr[r] = sr[r] = MPI_REQUEST_NULL;
    if (r == me) continue;
    if (MPI_Irecv(&rep[r], (int)sizeof *rep, MPI_BYTE, r, TAG_REP, wd_comm, &rr[r]) != MPI_SUCCESS) rr[r] = MPI_REQUEST_NULL;
    if (MPI_Isend(&me, 1, MPI_INT, r, TAG_REQ, wd_comm, &sr[r]) != MPI_SUCCESS) sr[r] = MPI_REQUEST_NULL;
    else counts[r].asked_of++;
  }
  double deadline = now_ms() + ASK_MS;
  int pending = size - 1;
  while (pending > 0 && now_ms() < deadline && !__atomic_load_n(&stopping, __ATOMIC_ACQUIRE)) {
    serve();                                   /* another rank may be asking us at the same moment */
    for (int r = 0; r < size; r++) {
      if (r == me || got[r] || rr[r] == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&rr[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        rr[r] = MPI_REQUEST_NULL;
        counts[r].answers_from++;              /* consumed by the failed receive */
        pending--;
        continue;
      }
      if (done) { got[r] = 1; counts[r].answers_from++; pending--; }
    }
    if (pending > 0) tpsh_sleep_ms(10);
  }
  /* A receive for a rank that never answered is cancelled (the run may go on: check_peers asks too);
   * the answer may have come in the meantime, and then it counts; one still to come is received at the
   * end of the run (drain_questions). The question sent stays posted, as its watchdog may still
   * answer it. rep[] is the caller's to free once this returns: each receive has ended by then. */
  for (int r = 0; r < size; r++)
    if (r != me && !got[r] && rr[r] != MPI_REQUEST_NULL && end_receive(&rr[r], NULL)) counts[r].answers_from++;
  for (int r = 0; r < size; r++)
    if (sr[r] != MPI_REQUEST_NULL) MPI_Request_free(&sr[r]);
  free(rr);
  free(sr);
}

/* Set once the watchdog has decided to end every rank, before the abort hook runs: a wait or a call
 * that the abort sets free must not carry on (with aborted results, or NCCL's "internal error" of an
 * aborted communicator, which would only mislead) while the watchdog is still on its way to MPI_Abort. */
static volatile int ending;

void tpsh_watchdog_hold_if_ending(void) {
  if (!__atomic_load_n(&ending, __ATOMIC_ACQUIRE)) return;
  tpsh_host_ending_hold();              /* the watchdog's MPI_Abort ends this process */
}

static void *run_abort_hook(void *arg) {
  (void)arg;
  tpsh_watchdog_abort_hook();
  return NULL;
}

/* Prints o and its last line, then ends every rank with status. The backend's abort hook runs first,
 * on a thread of its own, for at most 5 s: ncclCommAbort blocked for minutes on the GPU machine while
 * the host thread waited for the stuck collective, and this rank must end whatever the hook does. */
/* A line the host asks to be said when the watchdog ends the run (tpsh_watchdog_set_ending_note: the
 * --trace file that is then not written, as the host's own ending says). */
static char ending_note[600];
void tpsh_watchdog_set_ending_note(const char *note) {
  snprintf(ending_note, sizeof ending_note, "%s", note ? note : "");
}

/* o's text without its "[rank R] " prefixes: the report, as a failed run's trace keeps its error. */
static char *unprefixed(const outbuf *o) {
  char *t = malloc(o->n + 1);
  if (!t) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < o->n;) {
    const char *line = o->p + i, *nl = memchr(line, '\n', o->n - i);
    size_t len = nl ? (size_t)(nl - line) + 1 : o->n - i;
    size_t skip = 0;
    if (len > 6 && memcmp(line, "[rank ", 6) == 0) {
      const char *close = memchr(line, ']', len);
      if (close && (size_t)(close - line) + 2 <= len && close[1] == ' ') skip = (size_t)(close - line) + 2;
    }
    memcpy(t + n, line + skip, len - skip);
    n += len - skip;
    i += len;
  }
  while (n > 0 && t[n - 1] == '\n') n--;
  t[n] = '\0';
  return t;
}

/* ==== the other ranks' own --trace records at this rank's end ==================================== */
/* With --trace, a rank that ends the run tells every other rank first (TAG_END: its status and why):
 * each one's watchdog asks its host thread to write its own records, as this rank's does (host_ending.c),
 * and answers twice (TAG_END_DONE): whether its host began (END_BEGAN / END_NOT_COMING), then, where it
 * did, whether it wrote (END_WROTE / END_NOT_WRITTEN). This rank waits for the first answers until
 * END_WAIT_MS after telling (the notice waits for the other's next tick, its host up to 2 s), for a rank
 * that began as long as it may write (30 s more), then ends every rank, naming the ranks that did not
 * answer (a rank whose watchdog is busy ending the run itself answers late or never). */
enum { END_NOT_COMING = 0, END_BEGAN = 1, END_NOT_WRITTEN = 2, END_WROTE = 3, END_WRITE_MS = 30000 };
typedef struct end_notice { int from, status; char why[504]; } end_notice;
static MPI_Request notice_req = MPI_REQUEST_NULL;
static end_notice notice_in;
static int noticed;               /* a notice was served: there is no second */

/* The watchdog's loop: a notice from the rank that ends the run, once. */
static void serve_end_notice(void) {
  if (!ending_note[0] || noticed) return;
  if (notice_req == MPI_REQUEST_NULL &&
      MPI_Irecv(&notice_in, (int)sizeof notice_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_END, wd_comm, &notice_req) !=
          MPI_SUCCESS) {
    notice_req = MPI_REQUEST_NULL;
    return;
  }
  int done = 0;
  if (MPI_Test(&notice_req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) return;
  notice_req = MPI_REQUEST_NULL;
  notice_in.why[sizeof notice_in.why - 1] = '\0';
  noticed = 1;
  static int answers[2];          /* the sends' buffers: never waited for */
  MPI_Request q;
  answers[0] = tpsh_host_ending_request(notice_in.status, notice_in.why) ? END_BEGAN : END_NOT_COMING;
  if (MPI_Isend(&answers[0], 1, MPI_INT, notice_in.from, TAG_END_DONE, wd_comm, &q) == MPI_SUCCESS) MPI_Request_free(&q);
  if (answers[0] != END_BEGAN) return;
  answers[1] = tpsh_host_ending_finish() ? END_WROTE : END_NOT_WRITTEN;
  if (MPI_Isend(&answers[1], 1, MPI_INT, notice_in.from, TAG_END_DONE, wd_comm, &q) == MPI_SUCCESS) MPI_Request_free(&q);
}

/* Tells every other rank that this one ends the run; returns how many were told. */
static int tell_others_ending(int status, const char *report, double *told_at) {
  int size = tpsh_rt.size, me = tpsh_rt.rank, told = 0;
  if (size < 2 || wd_comm == MPI_COMM_NULL) return 0;
  static end_notice n;                  /* outlives the sends, which are never waited for */
  n.from = me;
  n.status = status;
  size_t first = strcspn(report ? report : "", "\n");
  snprintf(n.why, sizeof n.why, "rank %d ended the run (status %d): %.*s", me, status, (int)first,
           report ? report : "");
  for (int r = 0; r < size; r++) {
    MPI_Request q;
    if (r != me && MPI_Isend(&n, (int)sizeof n, MPI_BYTE, r, TAG_END, wd_comm, &q) == MPI_SUCCESS) {
      MPI_Request_free(&q);
      told++;
    }
  }
  *told_at = now_ms();
  return told;
}

/* Waits for the answers of the told ranks (above), then names those whose records may be missing. */
static void await_others_records(outbuf *o, int told, double told_at) {
  int size = tpsh_rt.size;
  char *seen = told ? calloc((size_t)size, 1) : NULL;      /* per rank: 0 no answer, 1 began, 2 over */
  if (!seen) return;
  int silent = told, writing = 0;
  static int got;
  for (;;) {
    double deadline = told_at + END_WAIT_MS + (writing > 0 ? END_WRITE_MS : 0);
    if ((silent == 0 && writing == 0) || now_ms() >= deadline) break;
    MPI_Request q;
    MPI_Status st;
    if (MPI_Irecv(&got, 1, MPI_INT, MPI_ANY_SOURCE, TAG_END_DONE, wd_comm, &q) != MPI_SUCCESS) break;
    int done = 0;
    while (MPI_Test(&q, &done, &st) == MPI_SUCCESS && !done && now_ms() < deadline) tpsh_sleep_ms(5);
    if (!done && !end_receive(&q, &st)) continue;             /* the deadline passed: the loop ends */
    int r = st.MPI_SOURCE;
    if (r < 0 || r >= size) continue;
    if (seen[r] == 0) {
      seen[r] = got == END_BEGAN ? 1 : 2;
      silent--;
      writing += got == END_BEGAN;
    } else if (seen[r] == 1 && got >= END_NOT_WRITTEN) {
      seen[r] = 2;
      writing--;
    }
  }
  char ranks[2][256] = {"", ""};
  for (int r = 0; r < size; r++) {
    int k = seen[r] == 0 && r != tpsh_rt.rank ? 0 : seen[r] == 1 ? 1 : -1;
    size_t at = k >= 0 ? strlen(ranks[k]) : 0;
    if (k >= 0 && at + 16 < sizeof ranks[k]) snprintf(ranks[k] + at, sizeof ranks[k] - at, "%s%d", at ? ", " : "", r);
  }
  if (ranks[0][0])
    out(o, "tpsh: no answer from rank(s) %s about their own --trace records within %d s (busy ending the run "
        "themselves, or gone): theirs may be missing", ranks[0], END_WAIT_MS / 1000);
  if (ranks[1][0])
    out(o, "tpsh: rank(s) %s still wrote their own --trace records after %d s: theirs may be cut short", ranks[1],
        (END_WAIT_MS + END_WRITE_MS) / 1000);
  free(seen);
}

static void end_every_rank(outbuf *o, const char *last, int status) __attribute__((noreturn));
static void end_every_rank(outbuf *o, const char *last, int status) {
  if (ending_note[0]) {
    /* --trace: the host writes this rank's own records up to now if it comes (host_ending.c), saying
     * where; else the note says that the file was not written. The others are asked to write theirs. */
    char *report = unprefixed(o);
    flush(o);
    double told_at = 0;
    int told = tell_others_ending(status, report, &told_at);
    int wrote = tpsh_host_ending_ask(status, report);
    free(report);
    if (!wrote) out(o, "%s", ending_note);
    await_others_records(o, told, told_at);
  }
  out(o, "%s", last);
  char chaos[160];
  if (tpsh_chaos_line(chaos, sizeof chaos)) out(o, "%s", chaos);   /* the delays that led here */
  flush(o);
  __atomic_store_n(&ending, 1, __ATOMIC_RELEASE);
  tpsh_sleep_ms(300);           /* let mpiexec forward this text before the abort tears its pipes down */
  pthread_t hook;
  if (tpsh_watchdog_abort_hook && pthread_create(&hook, NULL, run_abort_hook, NULL) == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    if (pthread_timedjoin_np(hook, NULL, &ts) != 0) {
      out(o, "tpsh watchdog: the backend's abort (ncclCommAbort) has not returned after 5 s: aborting without it");
      flush(o);
    }
  }
  tpsh_leakcheck_skip();
  MPI_Abort(MPI_COMM_WORLD, status);
  _exit(status);
}

static int64_t match_now(uint64_t *group, const char **op);

/* Whether this rank's host wait may depend on another rank: a collective, send or receive of this rank
 * not known complete (entries 0..nsnap of snap), or the host in a host-side exchange or in check mode's
 * comparison. Where none does, a wait past the timeout is this rank's own work taking that long. */
static int wait_involves_peers(int nsnap) {
  uint64_t g;
  const char *op;
  if (exchange_now(&g) >= 0 || match_now(&g, &op) >= 0) return 1;
  if (__atomic_load_n(&wait_peer, __ATOMIC_ACQUIRE) >= 0) return 1;
  for (int i = 0; i < nsnap; i++)
    if (snap[i].state != TPSH_FLIGHT_COMPLETED) return 1;
  return 0;
}

static void fire(const tpsh_flight_entry *stuck, const char *host_what, double host_s, int nsnap) {
  outbuf o = {0};
  double now = now_ms();
  if (stuck)
    out(&o, "tpsh watchdog: %s (seq %llu on group %llu, %s x %lld elements, stream '%s') started %.1f s ago "
        "and has not completed (timeout %g s)", stuck->op, (unsigned long long)stuck->seq,
        (unsigned long long)stuck->group_id, tpsh_dtype_name(stuck->dtype), (long long)stuck->count,
        stuck->stream, (now - stuck->t_started) / 1e3, get_timeout());
  else
    out(&o, "tpsh watchdog: the host has been blocked in %s for %.1f s (timeout %g s)", host_what, host_s, get_timeout());
  /* The timeout bounds every host wait, a long local computation's too (a hung device would otherwise
   * hold the rank for ever): say so where nothing the wait depends on involves another rank, so that the
   * reader raises --timeout rather than looks for a peer at fault (audit, 2026-12-02). */
  if (!stuck && !wait_involves_peers(nsnap))
    out(&o, "no collective, send or receive of this rank is unfinished and the host is in no exchange with "
        "other ranks: this is the rank's own work taking longer than the timeout (if that is expected, raise "
        "--timeout or TPSH_TIMEOUT)");
  int first = nsnap > 32 ? nsnap - 32 : 0;
  out(&o, "flight record (this rank's last %d collectives, oldest first):", nsnap - first);
  char line[512];
  for (int i = first; i < nsnap; i++) {
    tpsh_flight_format(&snap[i], now, line, sizeof line);
    out(&o, "  %s", line);
  }
  flush(&o);

  int size = tpsh_rt.size;
  wd_status *rep = calloc((size_t)size, sizeof *rep);
  int *got = calloc((size_t)size, sizeof *got);
  if (size > 1 && rep && got) {
    out(&o, "asking the other ranks for their state (up to %d s)...", ASK_MS / 1000);
    flush(&o);
    ask_others(rep, got, size);
    char missing[1024] = "", behind[1024] = "";
    size_t mu_ = 0, bu = 0;
    int nmissing = 0, ndiffer = 0, nbehind = 0;
    /* The members of the stuck collective's group, as world ranks (all ranks when unknown). */
    int ng = 0;
    tpsh_flight_snapshot(snap, 0, snap_groups, &ng);
    const tpsh_flight_group *sg = stuck ? group_of(snap_groups, ng, stuck->group_id) : NULL;
    /* A send or receive waits for its peer alone, and the members' sequence numbers, which count every
     * member's own sends and receives, say nothing of it: a receive from a rank that had sent elsewhere
     * named a bystander as "did not join" and left the peer out (audit, 2026-12-02). */
    int p2p = stuck && tpsh_coll_is_p2p(stuck->kind);
    int peer = -1;   /* its world rank, where known */
    if (p2p && sg && !sg->shared && stuck->peer >= 0 && stuck->peer < sg->size && stuck->peer < TPSH_FLIGHT_MAX_MEMBERS)
      peer = sg->members[stuck->peer];
    if (!stuck) peer = __atomic_load_n(&wait_peer, __ATOMIC_ACQUIRE);
    for (int r = 0; r < size; r++) {
      if (r == tpsh_rt.rank) continue;
      int member = !sg || has_member(sg, r);
      int counts = p2p ? r == peer : member;   /* whose silence holds the stuck call up */
      if (!got[r]) {
        out(&o, "  rank %d: no answer (it has finished its script or died, or its MPI is wedged)", r);
        if (counts && mu_ < sizeof missing)
          mu_ += (size_t)snprintf(missing + mu_, sizeof missing - mu_, "%s%d (no answer)", nmissing++ ? ", " : "", r);
        continue;
      }
      const wd_status *st = &rep[r];
      int64_t enq = -1, started = -1, completed = -1;
      int knows = 0;
      for (int i = 0; stuck && i < st->ngroups && i < STATUS_GROUPS; i++)
        if (st->g[i].id == stuck->group_id) {
          enq = st->g[i].enqueued; started = st->g[i].started; completed = st->g[i].completed; knows = 1;
        }
      if (stuck && !member)      /* its -1s would read as a member that has issued nothing there */
        out(&o, "  rank %d: not a member of group %llu; now %s", r, (unsigned long long)stuck->group_id, st->doing);
      else if (stuck)
        out(&o, "  rank %d: group %llu: last seq enqueued %lld, started %lld, completed %lld; now %s", r,
            (unsigned long long)stuck->group_id, (long long)enq, (long long)started, (long long)completed, st->doing);
      else
        out(&o, "  rank %d: %s", r, st->doing);
      if (p2p) continue;
      if (stuck && member && (!knows || enq < (int64_t)stuck->seq) && mu_ < sizeof missing)
        mu_ += (size_t)snprintf(missing + mu_, sizeof missing - mu_, "%s%d (last seq %lld)", nmissing++ ? ", " : "", r,
                                (long long)enq);
      /* Issued there but not started (only the CPU backend marks starts, and only it gives a stuck entry):
       * the member's stream, or the group's turn, holds it behind earlier work that has not finished, e.g.
       * a collective of another group that the ranks issued in another order. That is no transport's
       * fault, and "stuck inside the transport" was said (audit of sub-groups, 2026-12-02). */
      else if (stuck && member && knows && started < (int64_t)stuck->seq && bu < sizeof behind)
        bu += (size_t)snprintf(behind + bu, sizeof behind - bu, "%s%d (now %s)", nbehind++ ? ", " : "", r, st->doing);
    }
    if (stuck && nmissing)
      out(&o, "ranks that did not join %s seq %llu of group %llu: %s", stuck->op, (unsigned long long)stuck->seq,
          (unsigned long long)stuck->group_id, missing);
    /* A rank whose sequence number counts the collective as issued may be stuck in another one at the
     * same place of the group: the ranks issued different collectives, which no transport can match. */
    for (int r = 0; stuck && !p2p && r < size; r++) {
      const wd_status *st = &rep[r];
      if (r == tpsh_rt.rank || !got[r] || !st->in_coll || st->coll_group != stuck->group_id ||
          st->coll_seq != stuck->seq || strncmp(st->coll_op, stuck->op, sizeof st->coll_op) == 0)
        continue;
      out(&o, "rank %d is in %.*s seq %llu of group %llu, not %s: the ranks issued different collectives", r,
          (int)sizeof st->coll_op, st->coll_op, (unsigned long long)st->coll_seq, (unsigned long long)st->coll_group,
          stuck->op);
      ndiffer++;
    }
    if (stuck && nbehind)
      out(&o, "ranks that issued %s seq %llu of group %llu but have not started it: %s; work issued before it there "
          "has not finished (on its stream, or an earlier collective of the group on another stream): where that is "
          "a collective of another group, the ranks issued the two groups' collectives in different orders, and "
          "they wait for each other for good", stuck->op, (unsigned long long)stuck->seq,
          (unsigned long long)stuck->group_id, behind);
    if (stuck && !nmissing && !ndiffer && !nbehind && p2p) {
      /* A send completes against its peer's receive, not against the same call on every rank: two sends
       * (or two receives) at the same place match nothing (audit: "stuck inside the transport" was said) */
      char from[320] = "";
      if (peer >= 0)
        snprintf(from, sizeof from, ", %s rank %d (%s)", stuck->kind == TPSH_C_SEND ? "to" : "from", peer,
                 peer == tpsh_rt.rank ? "this rank" : got[peer] ? rep[peer].doing : "no answer");
      out(&o, "this rank's %s (seq %llu of group %llu) waits for its peer's matching %s%s: a send completes only "
          "against a receive posted on its peer (and a receive against a send); a peer that sends to or receives "
          "from another rank (a wrong peer), or has finished, never matches it, and ranks that all send first, or all "
          "receive first, wait for each other for good: pair them (rank 0 sends while rank 1 receives), or issue a "
          "ring's sends and receives in one g:batch", stuck->op, (unsigned long long)stuck->seq,
          (unsigned long long)stuck->group_id, stuck->kind == TPSH_C_SEND ? "recv" : "send", from);
    } else if (stuck && p2p)
      out(&o, "this rank's %s (seq %llu of group %llu) waits for its peer, rank %d, which did not answer",
          stuck->op, (unsigned long long)stuck->seq, (unsigned long long)stuck->group_id, peer);
    else if (stuck && !nmissing && !ndiffer && !nbehind)
      out(&o, "every rank that answered has issued %s seq %llu: the collective is stuck inside the transport",
          stuck->op, (unsigned long long)stuck->seq);
    else if (!stuck) {
      /* This rank is blocked on the host: if another rank is stuck in a collective, say who has not
       * issued it (this rank included), from everyone's last sequence numbers on that group. */
      const wd_status *in = NULL;
      for (int r = 0; r < size && !in; r++)
        if (got[r] && rep[r].in_coll) in = &rep[r];
      if (in) {
        fill_status(&rep[tpsh_rt.rank]);
        got[tpsh_rt.rank] = 1;
        char who[1024] = "";
        size_t wu = 0;
        int nwho = 0;
        for (int r = 0; r < size && wu < sizeof who; r++) {
          int64_t enq = -1;
          for (int i = 0; got[r] && i < rep[r].ngroups && i < STATUS_GROUPS; i++)
            if (rep[r].g[i].id == in->coll_group) enq = rep[r].g[i].enqueued;
          if (!got[r]) wu += (size_t)snprintf(who + wu, sizeof who - wu, "%s%d (no answer)", nwho++ ? ", " : "", r);
          else if (enq < (int64_t)in->coll_seq)
            wu += (size_t)snprintf(who + wu, sizeof who - wu, "%s%d (last seq %lld)", nwho++ ? ", " : "", r, (long long)enq);
        }
        out(&o, "rank %d is stuck in %s seq %llu of group %llu; ranks that did not join it: %s", in->rank,
            in->coll_op, (unsigned long long)in->coll_seq, (unsigned long long)in->coll_group, nwho ? who : "none");
      } else if (peer >= 0 && peer < size) {
        out(&o, "this rank's receive waits for rank %d to say what it sends (check mode compares each receive with "
            "its send before it is enqueued); rank %d is now %s: a rank that sends to another rank (a wrong peer), "
            "or never sends, leaves the receive waiting for good", peer, peer, got[peer] ? rep[peer].doing : "(no answer)");
      } else if (nmissing) {
        out(&o, "ranks that did not answer: %s", missing);
      }
    }
  }
  end_every_rank(&o, "tpsh watchdog: ending every rank (MPI_Abort)", 124);
}

/* `tpsh test`: rank r (its state st) waits at the runner's exchange of the running test, so it issues
 * no more collectives (nor host-side exchanges) in it. Can this rank's collective number `index` on
 * the group (host: its host-side exchange number) still complete? Not when r is a member of the group
 * and has issued no more than `index` there (both counts from the flight tables; a shared slot or a
 * table that did not fit in the reply decides nothing). */
static int never_joins(uint64_t group_id, int64_t index, int host, const wd_status *st, int ng, int64_t *issued) {
  *issued = 0;
  if (!entry_with(snap_groups, ng, group_id, st->rank)) return 0;
  for (int i = 0; i < st->ngroups && i < STATUS_GROUPS; i++)
    if (st->g[i].id == group_id) {
      *issued = host ? st->g[i].host_exchanges : st->g[i].collectives;
      return !st->g[i].shared && *issued <= index;
    }
  return st->groups_known;                 /* r has issued nothing on the group */
}

static int never_joined(const tpsh_flight_entry *e, const wd_status *st, int ng, int64_t *issued) {
  if (e->state == TPSH_FLIGHT_COMPLETED || e->coll_index < 0) return 0;
  return never_joins(e->group_id, e->coll_index, 0, st, ng, issued);
}

/* Rank st->rank waits at the runner's exchange of the running test, and this rank's host is blocked
 * (outside that exchange) in what, for the reason `why` says (what that rank will never join, or that
 * it failed the test and the wait has lasted PEER_GRACE_MS). Ends every rank with status 1, quoting
 * that rank's failure as the runner would have reported it. */
static void fire_peer(const wd_status *st, const char *why, const char *what, double blocked_s, int nsnap) {
  outbuf o = {0};
  double now = now_ms();
  int script = st->test == TPSH_WATCH_SCRIPT;
  /* the step is the same on both ranks: check_peers compares st->test with this rank's (a script's
   * step is named only after an interactive session: the host's "the interactive session") */
  char step[sizeof my_step];
  pthread_mutex_lock(&failure_mu);
  snprintf(step, sizeof step, "%s", my_step[0] ? my_step : script ? "the script" : "this test");
  pthread_mutex_unlock(&failure_mu);
  if (script)
    out(&o, "tpsh: rank %d has finished %s and waits for the other ranks at its end; this rank has been "
        "blocked in %s for %.1f s", st->rank, step, what ? what : "a wait", blocked_s);
  else {
    out(&o, "tpsh test: rank %d %s %s and waits for the other ranks at the runner's exchange; this rank "
        "has been blocked in %s for %.1f s", st->rank, st->failed ? "failed" : "has finished", step,
        what ? what : "a wait", blocked_s);
  }
  out(&o, "%s", why);
  char line[512];
  for (int i = 0; i < nsnap; i++)
    if (snap[i].state != TPSH_FLIGHT_COMPLETED) {
      tpsh_flight_format(&snap[i], now, line, sizeof line);
      out(&o, "  not known complete here: %s", line);   /* CUDA settles entries only at a synchronize */
    }
  if (st->failed) {
    out(&o, "rank %d's failure:", st->rank);
    for (const char *p = st->failure; *p;) {
      const char *nl = strchr(p, '\n');
      int len = nl ? (int)(nl - p) : (int)strlen(p);
      out(&o, "  %.*s", len, p);
      p += len + (nl ? 1 : 0);
    }
  }
  end_every_rank(&o, script ? "tpsh: ending every rank (MPI_Abort, status 1)"
                            : "tpsh test: ending every rank (MPI_Abort, status 1); the tests that were to follow did not run", 1);
}

/* The first of this rank's n flight entries e (oldest first; its group table: groups, ng) that rank
 * `rank`, a member of the entry's group, issued differently (theirs: that rank's last collectives);
 * *what: how it did. NULL when all agree. Unless `completed` too, only entries not known complete are
 * compared: a mismatch that MPI completed with an error the script caught (collectives_spec does so on
 * purpose) holds nothing up while the run goes on. */
const tpsh_flight_entry *tpsh_wd_mismatch_with(const coll_list *theirs, int rank, const tpsh_flight_entry *e, int n,
                                              const tpsh_flight_group *groups, int ng, int completed,
                                              const tpsh_coll_desc **what) {
  for (int i = 0; i < n; i++) {
    if (e[i].coll_index < 0 || (!completed && e[i].state == TPSH_FLIGHT_COMPLETED)) continue;
    if (!entry_with(groups, ng, e[i].group_id, rank)) continue;
    tpsh_coll_desc d;
    desc_of(&e[i], &d);
    for (int k = 0; k < theirs->n && k < STATUS_COLLS; k++)
      if (theirs->c[k].group == e[i].group_id && theirs->c[k].d.number == d.number) {
        if (tpsh_coll_desc_same(&d, &theirs->c[k].d)) break;
        *what = &theirs->c[k].d;
        return &e[i];
      }
  }
  return NULL;
}

/* "collective #3 of group 0 (...) is X on this rank and Y on rank r" */
void tpsh_wd_mismatch_text(char *buf, size_t len, const tpsh_flight_entry *e, const tpsh_coll_desc *theirs, int rank) {
  char mine[160], other[160];
  tpsh_coll_desc d;
  desc_of(e, &d);
  tpsh_coll_desc_format(&d, mine, sizeof mine);
  tpsh_coll_desc_format(theirs, other, sizeof other);
  snprintf(buf, len, "collective #%lld of group %llu (counted from 0, sends and receives aside) is %s on this rank "
           "and %s on rank %d", (long long)e->coll_index, (unsigned long long)e->group_id, mine, other, rank);
}

/* Rank st->rank issued collective #k of a group differently from this rank's entry e (both from the
 * flight recorders; a group's id is the same on all its members, group.c): what no transport can
 * match. Ends every rank with status 1 at once, rather than at the timeout. */
static void fire_mismatch(const tpsh_flight_entry *e, const wd_status *st, const tpsh_coll_desc *theirs,
                          const char *what, double blocked_s) {
  outbuf o = {0};
  char text[512], line[512];
  tpsh_wd_mismatch_text(text, sizeof text, e, theirs, st->rank);
  out(&o, "tpsh: the ranks issued different collectives: %s", text);
  tpsh_flight_format(e, now_ms(), line, sizeof line);
  out(&o, "  this rank's: %s", line);
  out(&o, "this rank has been blocked in %s for %.1f s; rank %d: %s", what ? what : "a wait", blocked_s, st->rank,
      st->doing);
  out(&o, "(with --check the ranks compare each collective before it is enqueued, and the call raises a Lua error)");
  end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* The collective that check mode's mismatch check compares while the host waits there (not yet in the
 * flight ring: the check comes before the enqueue): its number on the group, *group its id, *op its
 * name; -1 when the host is in no such check. */
static int64_t match_now(uint64_t *group, const char **op) {
  int64_t index = -1;
  if (!(__atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0 && tpsh_flight_match_current(group, &index, op))) return -1;
  return index;
}

/* Whether this rank has a collective that is not known complete, or (in_wait) its host is in a host-side
 * exchange or in check mode's comparison of a collective: what a rank that will issue nothing more could
 * leave waiting. */
static int waits_for_peers(int in_wait) {
  uint64_t g = 0;
  const char *op;
  if (in_wait && (exchange_now(&g) >= 0 || match_now(&g, &op) >= 0)) return 1;
  int n = tpsh_flight_snapshot(snap, TPSH_FLIGHT_RING, NULL, NULL);
  for (int i = 0; i < n; i++)
    if (snap[i].state != TPSH_FLIGHT_COMPLETED && (snap[i].coll_index >= 0 || tpsh_coll_is_p2p(snap[i].kind)))
      return 1;
  return 0;
}

/* This rank's send or recv e, not known complete, is with world rank r, which waits at the end (of the
 * script, or of the test) and so issues nothing more, and which has enqueued fewer receives from this
 * rank (a send) or sends to it (a recv) than this rank has enqueued sends to it or receives from it:
 * one of them, at least, never completes. The counts are exact (every send and receive is counted when
 * it is issued), so this never fires on a run that could go on. A recv whose sender had finished waited
 * for the timeout (600 s by default), where a collective was diagnosed within seconds. *mine, *theirs:
 * the two counts. */
static int p2p_never_matched(const tpsh_flight_entry *e, const wd_status *st, int ng, int r, uint64_t *mine,
                             uint64_t *theirs) {
  if (e->state == TPSH_FLIGHT_COMPLETED || !tpsh_coll_is_p2p(e->kind)) return 0;
  const tpsh_flight_group *grp = group_of(snap_groups, ng, e->group_id);
  if (!grp || grp->shared || e->peer < 0 || e->peer >= grp->size || e->peer >= TPSH_FLIGHT_MAX_MEMBERS ||
      grp->members[e->peer] != r)
    return 0;
  uint64_t sent, received;
  tpsh_p2p_ledger_counts(r, &sent, &received);
  int send = e->kind == TPSH_C_SEND;
  *mine = send ? sent : received;
  *theirs = send ? st->p2p_received : st->p2p_sent;
  return *mine > *theirs;
}

/* Whether rank st->rank is blocked in a host-side exchange that this rank, a member of its group, has not
 * begun; *mine: this rank's count of exchanges begun there. The first half of wait_cycle and match_cycle. */
static int in_exchange_not_begun(const wd_status *st, int ng, int64_t *mine) {
  if (st->host_index < 0 || st->at_exchange) return 0;
  const tpsh_flight_group *h = entry_with(snap_groups, ng, st->host_group, st->rank);
  if (!h || h->size > TPSH_FLIGHT_MAX_MEMBERS || h->host_exchanges > st->host_index) return 0;
  *mine = h->host_exchanges;
  return 1;
}

/* The first of this rank's collectives not known complete on what its host's wait on `on` waits for (a
 * stream key, or TPSH_WAIT_ALL_STREAMS) that rank st->rank will never join (*issued: that rank's count
 * there); NULL when there is none. The second half of wait_cycle and wait_cross. */
static const tpsh_flight_entry *awaited_not_joined(const wd_status *st, const void *on, int n, int ng,
                                                   int64_t *issued) {
  for (int i = 0; i < n; i++) {
    const tpsh_flight_entry *e = &snap[i];
    if (e->state == TPSH_FLIGHT_COMPLETED || e->coll_index < 0) continue;
    if (on != TPSH_WAIT_ALL_STREAMS && e->stream_key != on) continue;
    if (!mine_waits_for(e, ng, st->rank)) continue;
    if (never_joins(e->group_id, e->coll_index, 0, st, ng, issued)) return e;
  }
  return NULL;
}

/* A cycle of two waits that no rank can break: rank st->rank is blocked in a host-side exchange (#k of
 * group H) that this rank has not begun, and this rank's host is blocked in a wait that cannot end before
 * its collective e has (a read or synchronize of e's stream, or tp.synchronize), which that rank has not
 * issued. That rank issues nothing until this rank joins its exchange, and this rank joins nothing until
 * its wait ends: the ranks called host-side exchanges and collectives in different orders
 * (tp.barrier() on rank 0, an all_reduce and a read on rank 1). Without this only the timeout ended it.
 * Each step is certain: the exchange waits for every member of H (this rank is one: H's entry here
 * names that rank, and a rank has one group of an id), and e waits for every member of its group. A
 * wait whose dependence on e is not known (w:block(), a stream made to wait for another) decides
 * nothing. Returns e, or NULL; *mine: this rank's count of exchanges begun on H. */
static const tpsh_flight_entry *wait_cycle(const wd_status *st, const void *on, int n, int ng, int64_t *mine,
                                           int64_t *issued) {
  if (!on || !in_exchange_not_begun(st, ng, mine)) return NULL;
  return awaited_not_joined(st, on, n, ng, issued);
}

/* The deadlock lines of fire_cycle, fire_match_cycle, fire_cross and fire_match_match pair one of two
 * sides of rank st->rank (in a host-side exchange this rank has not begun; waiting for a collective this
 * rank has not issued) with one of two of this rank (a host wait for its collective e; check mode's
 * comparison of a collective not yet enqueued). Each side is written once here. */
static void peer_in_exchange(char *b, size_t n, const wd_status *st, int64_t mine) {
  snprintf(b, n, "rank %d is %s, in host-side exchange #%lld of group %llu (counted from 0), which this rank has "
           "not begun (it has begun %lld there)", st->rank, st->doing, (long long)st->host_index,
           (unsigned long long)st->host_group, (long long)mine);
}

static void mine_in_wait(char *b, size_t n, const wd_status *st, const tpsh_flight_entry *e, int64_t issued,
                         const char *what, double blocked_s) {
  snprintf(b, n, "this rank has been blocked in %s for %.1f s, which waits for its %s (seq %llu of group %llu, "
           "collective #%lld of the group), and rank %d has issued %lld collectives there: neither rank can go on",
           what ? what : "a wait", blocked_s, e->op, (unsigned long long)e->seq, (unsigned long long)e->group_id,
           (long long)e->coll_index, st->rank, (long long)issued);
}

static void mine_in_comparison(char *b, size_t n, const wd_status *st, uint64_t group, int64_t index, const char *op,
                               int64_t issued, double blocked_s) {
  snprintf(b, n, "this rank has been blocked for %.1f s in check mode's comparison of its %s (collective #%lld of "
           "group %llu), which waits for every member to issue it, and rank %d has issued %lld collectives there: "
           "neither rank can go on", blocked_s, op ? op : "collective", (long long)index, (unsigned long long)group,
           st->rank, (long long)issued);
}

static void fire_cycle(const wd_status *st, const tpsh_flight_entry *e, int64_t mine, int64_t issued,
                       const char *what, double blocked_s) {
  outbuf o = {0};
  char line[512], theirs[512], ours[512];
  peer_in_exchange(theirs, sizeof theirs, st, mine);
  mine_in_wait(ours, sizeof ours, st, e, issued, what, blocked_s);
  out(&o, "tpsh: a deadlock: %s; %s", theirs, ours);
  out(&o, "(a host-side exchange (tp.barrier, tp.allgather, tp.bcast, tp.gather) waits for every member's host: "
      "rank %d's waits for this rank, whose host waits for a collective that rank %d has yet to issue)", st->rank,
      st->rank);
  tpsh_flight_format(e, now_ms(), line, sizeof line);
  out(&o, "  this rank's: %s", line);
  end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* As wait_cycle, where this rank's host waits in check mode's comparison of its collective #index of
 * group `group` (not yet enqueued, so in no flight entry): rank st->rank is blocked in a host-side
 * exchange that this rank has not begun, is a member of `group` and has issued no more than `index`
 * collectives there, so it never sends its side of the comparison, and this rank never joins its
 * exchange. Returns 1 then; *mine: this rank's count of exchanges begun on that rank's exchange's group. */
static int match_cycle(const wd_status *st, uint64_t group, int64_t index, int ng, int64_t *mine, int64_t *issued) {
  if (index < 0 || !in_exchange_not_begun(st, ng, mine)) return 0;
  return never_joins(group, index, 0, st, ng, issued);
}

static void fire_match_cycle(const wd_status *st, uint64_t group, int64_t index, const char *op, int64_t mine,
                             int64_t issued, double blocked_s) {
  outbuf o = {0};
  char theirs[512], ours[512];
  peer_in_exchange(theirs, sizeof theirs, st, mine);
  mine_in_comparison(ours, sizeof ours, st, group, index, op, issued, blocked_s);
  out(&o, "tpsh: a deadlock: %s; %s", theirs, ours);
  out(&o, "(a host-side exchange (tp.barrier, tp.allgather, tp.bcast, tp.gather) waits for every member's host: "
      "rank %d's waits for this rank, whose collective waits for rank %d to issue it too)", st->rank, st->rank);
  end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* This rank's count of collectives on group id (*mine), where an asked rank's status names the group's
 * members (world ranks members[0..size)) and this rank is one: its group of that id is that group (a
 * rank's groups never share an id; split groups of other colours do, hence the members); none in the
 * table: it has issued nothing there, unless the table is full and lost it. Returns 0 where this rank
 * is no member or the count cannot be said (a shared slot), so that nothing is decided on it. One rule
 * for match_match_cycle and wait_cross: the first took this rank's own table entry, and said nothing of
 * a group it had never issued on (two first collectives on two groups in different orders waited for
 * --timeout). */
static int my_count_on(uint64_t id, const int32_t *members, int size, int ng, int64_t *mine) {
  int member = 0;
  for (int k = 0; k < size && k < TPSH_FLIGHT_MAX_MEMBERS && !member; k++) member = members[k] == tpsh_rt.rank;
  if (!member) return 0;
  const tpsh_flight_group *d = group_of(snap_groups, ng, id);
  if (d ? d->shared : ng >= TPSH_FLIGHT_GROUPS) return 0;
  *mine = d ? d->collectives : 0;
  return 1;
}

/* Check mode, both hosts in a comparison: this rank's of its collective #index of `group`, which rank
 * st->rank, a member, has not issued (*issued there), and that rank's of its collective #st->match_index of
 * another group, which this rank, a member, has not issued (*mine there). Neither host issues anything
 * while it compares, so neither comparison ends (a rank skipped a sub-group's collective before a world
 * one, or the ranks issued two groups' collectives in different orders: audit, 2026-12-02, where it waited
 * for --timeout and said only "host blocked in the collective mismatch check" of every rank). Exact
 * counts, as in match_cycle; a group this rank knows nothing of decides nothing. Returns 1 then. */
static int match_match_cycle(const wd_status *st, uint64_t group, int64_t index, int ng, int64_t *mine,
                             int64_t *issued) {
  if (index < 0 || st->match_index < 0 || st->match_group == group || st->at_exchange) return 0;
  if (!never_joins(group, index, 0, st, ng, issued)) return 0;
  return my_count_on(st->match_group, st->match_members, st->match_size, ng, mine) && *mine <= st->match_index;
}

static void fire_match_match(const wd_status *st, uint64_t group, int64_t index, const char *op, int64_t mine,
                             int64_t issued, double blocked_s) {
  outbuf o = {0};
  char ours[512];
  mine_in_comparison(ours, sizeof ours, st, group, index, op, issued, blocked_s);
  out(&o, "tpsh: a deadlock: rank %d is %s, which waits for this rank to issue collective #%lld of group %llu too "
      "(this rank has issued %lld there); %s (a rank skipped a collective of one group, or the ranks issued two "
      "groups' collectives in different orders)", st->rank, st->doing, (long long)st->match_index,
      (unsigned long long)st->match_group, (long long)mine, ours);
  end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* Whether rank st->rank's collective D, which its host waits for (st->dep_*), waits for this rank's. */
static int dep_waits_for_me(const wd_status *st) {
  int r = st->dep_root;
  int root_world = r >= 0 && r < st->dep_size && r < TPSH_FLIGHT_MAX_MEMBERS ? st->dep_members[r] : -1;
  return waits_for_member(st->dep_kind, root_world, st->rank, tpsh_rt.rank);
}

/* Whether this rank's collective e, which waits for rank st->rank's, is one that rank has queued behind its
 * D (st->behind). Its group of e's id is e's only where it is a member here (split groups of other
 * colours share ids). */
static int queued_behind_dep(const wd_status *st, const tpsh_flight_entry *e, int ng) {
  if (!entry_with(snap_groups, ng, e->group_id, st->rank) || !mine_waits_for(e, ng, st->rank)) return 0;
  for (int k = 0; k < st->nbehind && k < STATUS_BEHIND; k++)
    if (st->behind[k].group == e->group_id && st->behind[k].index == e->coll_index) return 1;
  return 0;
}

/* The first of this rank's collectives not known complete on what its host's wait on `on` waits for, that
 * rank st->rank has issued but queued on its stream behind the collective its host waits for (st->behind:
 * it cannot start before that one completes); NULL when there is none. The other half of wait_cross: a
 * rank that skipped a sub-group's collective and then issued a world one, where the other rank issued
 * both, each reading its result (without check mode it waited for --timeout). */
static const tpsh_flight_entry *awaited_queued_behind(const wd_status *st, const void *on, int n, int ng) {
  for (int i = 0; i < n; i++) {
    const tpsh_flight_entry *e = &snap[i];
    if (e->state == TPSH_FLIGHT_COMPLETED || e->coll_index < 0) continue;
    if (on != TPSH_WAIT_ALL_STREAMS && e->stream_key != on) continue;
    if (queued_behind_dep(st, e, ng)) return e;
  }
  return NULL;
}

/* Two collectives on two groups that the ranks issued in different orders (rank 0: g1 then g2, rank 1:
 * g2 then g1, each then reading its first one's result): rank st->rank's host waits for its collective
 * #dep_index of group dep_group, which this rank, a member, has not issued (it has issued *mine there), and
 * this rank's host waits for its own collective e, which that rank has not issued (*issued). Neither host
 * issues anything while it waits, so neither wait ends. Each step is certain as in wait_cycle: the waits
 * are on streams whose collectives they cannot pass, and the counts are exact. Or (*queued = 1) that rank
 * has issued e, but on the stream of the collective its host waits for, after it: e cannot start there
 * before that one ends, which this rank's blocked host never issues (rank 0 skipped a sub-group's
 * collective, then issued a world one; rank 1 issued both; each reads its result). That rank's host
 * need not even be blocked for this, but only a waiting rank names the collective its stream is held
 * in. Returns e, or NULL. */
static const tpsh_flight_entry *wait_cross(const wd_status *st, const void *on, int n, int ng, int64_t *mine,
                                           int64_t *issued, int *queued) {
  *queued = 0;
  if (!on || st->dep_index < 0 || st->at_exchange || st->host_index >= 0) return NULL;
  if (!my_count_on(st->dep_group, st->dep_members, st->dep_size, ng, mine) || *mine > st->dep_index) return NULL;
  if (!dep_waits_for_me(st)) return NULL;
  const tpsh_flight_entry *e = awaited_not_joined(st, on, n, ng, issued);
  if (e) return e;
  e = awaited_queued_behind(st, on, n, ng);
  *queued = e != NULL;
  return e;
}

static void fire_cross(const wd_status *st, const tpsh_flight_entry *e, int64_t mine, int64_t issued, int queued,
                       const char *what, double blocked_s) {
  outbuf o = {0};
  char line[512], ours[512];
  if (queued)
    snprintf(ours, sizeof ours, "this rank has been blocked in %s for %.1f s, which waits for its %s (seq %llu of "
             "group %llu, collective #%lld of the group), which rank %d has issued on the stream of that %s, after "
             "it: it cannot start before that one ends, and neither rank can go on", what ? what : "a wait",
             blocked_s, e->op, (unsigned long long)e->seq, (unsigned long long)e->group_id,
             (long long)e->coll_index, st->rank, st->dep_op);
  else
    mine_in_wait(ours, sizeof ours, st, e, issued, what, blocked_s);
  out(&o, "tpsh: a deadlock: rank %d's host waits for its %s (collective #%lld of group %llu), and this rank has "
      "issued %lld collectives there; %s", st->rank, st->dep_op, (long long)st->dep_index,
      (unsigned long long)st->dep_group, (long long)mine, ours);
  if (queued)
    out(&o, "(this rank skipped a collective of group %llu, or has yet to issue it, and issued one of group %llu "
        "that rank %d's stream runs after it: every member must issue a group's collectives, and a rank's groups "
        "in one order)", (unsigned long long)st->dep_group, (unsigned long long)e->group_id, st->rank);
  else
    out(&o, "(the ranks issued collectives on groups %llu and %llu in different orders, and each waits on the host "
        "for the one it issued first: every member must issue a group's collectives, and a rank's groups in one "
        "order)", (unsigned long long)e->group_id, (unsigned long long)st->dep_group);
  tpsh_flight_format(e, now_ms(), line, sizeof line);
  out(&o, "  this rank's: %s", line);
  end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* Two collectives that this rank's stream and rank st->rank's run in opposite orders: that rank's host
 * waits for its collective D (st->dep_*) and has queued this rank's collective A behind it on D's stream
 * (st->behind), while this rank's stream holds its own D after A, A not complete. This A cannot complete
 * before that rank's A runs, which waits for its D, which waits for this rank's D, which waits for this
 * A: certain, whatever either host does (rank 0: g then the world, rank 1: the world then g). Without
 * this the ranks waited for --timeout, and the flight record said only that each had issued both.
 * Returns A, and *d: this rank's D; NULL when there is none. */
static const tpsh_flight_entry *crossed_order(const wd_status *st, int n, int ng, const tpsh_flight_entry **d) {
  if (st->dep_index < 0 || st->at_exchange || st->host_index >= 0 || st->nbehind <= 0) return NULL;
  /* that rank's D must wait for this rank's */
  if (!entry_with(snap_groups, ng, st->dep_group, st->rank) || !dep_waits_for_me(st)) return NULL;
  for (int j = 0; j < n; j++) {            /* this rank's D, then an A before it on its stream */
    const tpsh_flight_entry *dd = &snap[j];
    if (dd->group_id != st->dep_group || dd->coll_index != st->dep_index || dd->state == TPSH_FLIGHT_COMPLETED)
      continue;
    for (int i = 0; i < j; i++) {
      const tpsh_flight_entry *a = &snap[i];
      if (a->stream_key != dd->stream_key || a->state == TPSH_FLIGHT_COMPLETED || a->coll_index < 0) continue;
      if (queued_behind_dep(st, a, ng)) { *d = dd; return a; }
    }
    return NULL;
  }
  return NULL;
}

static void fire_crossed(const wd_status *st, const tpsh_flight_entry *a, const tpsh_flight_entry *d) {
  outbuf o = {0};
  char line[512];
  out(&o, "tpsh: a deadlock: this rank's stream runs its %s (collective #%lld of group %llu) before its %s "
      "(collective #%lld of group %llu), and rank %d's stream runs them the other way round: each waits for the "
      "other rank's first one, which its stream holds behind its second", a->op, (long long)a->coll_index,
      (unsigned long long)a->group_id, d->op, (long long)d->coll_index, (unsigned long long)d->group_id, st->rank);
  out(&o, "(the ranks issued collectives on groups %llu and %llu in different orders: every member must issue a "
      "group's collectives, and a rank's groups in one order)", (unsigned long long)a->group_id,
      (unsigned long long)d->group_id);
  tpsh_flight_format(a, now_ms(), line, sizeof line);
  out(&o, "  this rank's: %s", line);
  tpsh_flight_format(d, now_ms(), line, sizeof line);
  out(&o, "  this rank's: %s", line);
  end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* Rank st->rank is blocked in host-side exchange #index of group `group` as this rank is, but in another
 * call (tp.barrier against tp.bcast): MPI pairs neither with anything the other will make, and both
 * waited for the timeout. Certain: a member that has begun exchange #index of a group makes no other
 * there (the counts are exact), and this rank is in its own. */
static int other_exchange(const wd_status *st, uint64_t group, int64_t index, const char *what, int ng) {
  if (index < 0 || st->host_index != index || st->host_group != group || st->at_exchange || !what) return 0;
  const tpsh_flight_group *h = entry_with(snap_groups, ng, group, st->rank);
  if (!h || h->size > TPSH_FLIGHT_MAX_MEMBERS) return 0;
  return strncmp(st->host_what, what, sizeof st->host_what - 1) != 0;
}

static void fire_exchange(const wd_status *st, const char *what, double blocked_s) {
  outbuf o = {0};
  out(&o, "tpsh: the ranks made different host-side exchanges: #%lld of group %llu (counted from 0) is %s on this "
      "rank and %s on rank %d; this rank has been blocked in it for %.1f s, and neither completes (every member "
      "of a group makes the same host-side exchanges in the same order)", (long long)st->host_index,
      (unsigned long long)st->host_group, what, st->host_what, st->rank, blocked_s);
  end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* `tpsh test`: the host has been blocked outside the runner's exchange for PEER_ASK_MS (then again
 * every PEER_GRACE_MS while the same wait lasts): asks every other rank for its state, and fires
 * fire_peer when a rank at the exchange of this test will never join one of this rank's collectives,
 * or when one failed this test and the wait has lasted PEER_GRACE_MS. */
static void check_peers(double now) {
  static double last_ask, asked_since;
  uint64_t test = __atomic_load_n(&cur_test, __ATOMIC_ACQUIRE);
  int size = tpsh_rt.size;
  if (!test || size < 2 || wd_comm == MPI_COMM_NULL || __atomic_load_n(&in_exchange, __ATOMIC_ACQUIRE)) return;
  double since;
  const char *what;
  int in_wait = __atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0;
  uint64_t serial = in_wait ? __atomic_load_n(&wait_serial, __ATOMIC_ACQUIRE) : call_seen;
  if (in_wait) since = get_wait_since(), what = get_wait_what();
  else if (call_since > 0) since = call_since, what = CALL_WHAT;
  else return;
  if (now - since < PEER_ASK_MS || (since == asked_since && now - last_ask < PEER_GRACE_MS)) return;
  /* A plain script: only a collective or host-side exchange that is not known complete can wait for a
   * rank that has finished (nobody there fails a test and waits): a long synchronize after local work
   * asks nobody. Every question costs each other rank a message, in every tick of a long wait. */
  if (test == TPSH_WATCH_SCRIPT && !waits_for_peers(in_wait)) return;
  last_ask = now;
  asked_since = since;
  wd_status *rep = calloc((size_t)size, sizeof *rep);
  int *got = calloc((size_t)size, sizeof *got);
  if (rep && got) {
    ask_others(rep, got, size);           /* answering others refills snap: take this rank's state after */
    int ng = 0;
    int n = tpsh_flight_snapshot(snap, TPSH_FLIGHT_RING, snap_groups, &ng);
    uint64_t host_group = 0, match_group = 0;
    const char *match_op = NULL;
    int64_t host_index = in_wait ? exchange_now(&host_group) : -1;
    int64_t match_index = in_wait ? match_now(&match_group, &match_op) : -1;
    /* The answers are only comparable with this snapshot if the host is still in the wait it was in
     * before asking (it enqueued nothing meanwhile, and the answers came during that wait): an answer
     * can arrive after both ranks have moved on by a test or two. */
    int same = in_wait ? __atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0 &&
                         __atomic_load_n(&wait_serial, __ATOMIC_ACQUIRE) == serial &&
                         !__atomic_load_n(&in_exchange, __ATOMIC_ACQUIRE)
                       : __atomic_load_n(&tpsh_watch_call_count, __ATOMIC_ACQUIRE) == serial;
    same = same && __atomic_load_n(&cur_test, __ATOMIC_ACQUIRE) == test;
    double blocked_s = (now_ms() - since) / 1e3;
    /* Different collectives at one number of a group, one of them still waited for here: no transport
     * completes it, whatever the ranks do now. */
    for (int r = 0; r < size; r++) {
      const tpsh_coll_desc *theirs = NULL;
      const tpsh_flight_entry *e =
        r != tpsh_rt.rank && got[r] ? tpsh_wd_mismatch_with(&rep[r].colls, r, snap, n, snap_groups, ng, 0, &theirs) : NULL;
      if (e) fire_mismatch(e, &rep[r], theirs, what, blocked_s);
    }
    /* A rank in another host-side exchange at this one's number, or in one this rank's wait keeps it out
     * of (an exchange's wait names no stream, so at most one of the two applies) */
    const void *on = __atomic_load_n(&wait_on, __ATOMIC_RELAXED);
    for (int r = 0; same && in_wait && r < size; r++) {
      if (r == tpsh_rt.rank || !got[r]) continue;
      if (other_exchange(&rep[r], host_group, host_index, what, ng)) fire_exchange(&rep[r], what, blocked_s);
      int64_t mine = 0, issued = 0;
      const tpsh_flight_entry *e = wait_cycle(&rep[r], on, n, ng, &mine, &issued);
      if (e) fire_cycle(&rep[r], e, mine, issued, what, blocked_s);
      int queued = 0;
      e = wait_cross(&rep[r], on, n, ng, &mine, &issued, &queued);
      if (e) fire_cross(&rep[r], e, mine, issued, queued, what, blocked_s);
      const tpsh_flight_entry *d = NULL;
      e = crossed_order(&rep[r], n, ng, &d);
      if (e) fire_crossed(&rep[r], e, d);
      if (match_cycle(&rep[r], match_group, match_index, ng, &mine, &issued))
        fire_match_cycle(&rep[r], match_group, match_index, match_op, mine, issued, blocked_s);
      if (match_match_cycle(&rep[r], match_group, match_index, ng, &mine, &issued))
        fire_match_match(&rep[r], match_group, match_index, match_op, mine, issued, blocked_s);
    }
    for (int r = 0; same && r < size; r++) {
      if (!got[r] || !rep[r].at_exchange || rep[r].test != test) continue;
      int64_t issued;
      char why[512];
      for (int i = 0; i < n; i++)
        if (never_joined(&snap[i], &rep[r], ng, &issued)) {
          snprintf(why, sizeof why, "this rank's %s (seq %llu of group %llu) is collective #%lld of the group "
                   "(counted from 0, sends and receives aside), and rank %d has issued %lld there: it will not "
                   "join it", snap[i].op, (unsigned long long)snap[i].seq, (unsigned long long)snap[i].group_id,
                   (long long)snap[i].coll_index, r, (long long)issued);
          fire_peer(&rep[r], why, what, blocked_s, n);
        }
      for (int i = 0; i < n; i++) {
        uint64_t mine_p2p, theirs_p2p;
        if (!p2p_never_matched(&snap[i], &rep[r], ng, r, &mine_p2p, &theirs_p2p)) continue;
        int send = snap[i].kind == TPSH_C_SEND;
        snprintf(why, sizeof why, "this rank's %s (seq %llu of group %llu) %s rank %d will not complete: this rank "
                 "has issued %llu %s rank %d, and rank %d has issued %llu %s this rank", snap[i].op,
                 (unsigned long long)snap[i].seq, (unsigned long long)snap[i].group_id, send ? "to" : "from", r,
                 (unsigned long long)mine_p2p, send ? "sends to" : "receives from", r, r,
                 (unsigned long long)theirs_p2p, send ? "receives from" : "sends to");
        fire_peer(&rep[r], why, what, blocked_s, n);
      }
      if (match_index >= 0 && never_joins(match_group, match_index, 0, &rep[r], ng, &issued)) {
        snprintf(why, sizeof why, "this rank's %s is collective #%lld of group %llu (counted from 0, sends and "
                 "receives aside), which check mode compares with every member before it is enqueued, and rank "
                 "%d has issued %lld there: it will not join it", match_op ? match_op : "collective",
                 (long long)match_index, (unsigned long long)match_group, r, (long long)issued);
        fire_peer(&rep[r], why, what, blocked_s, n);
      }
      if (host_index >= 0 && never_joins(host_group, host_index, 1, &rep[r], ng, &issued)) {
        snprintf(why, sizeof why, "this rank's host-side exchange is #%lld of group %llu (counted from 0), and rank "
                 "%d has begun %lld there: it will not join it", (long long)host_index,
                 (unsigned long long)host_group, r, (long long)issued);
        fire_peer(&rep[r], why, what, blocked_s, n);
      }
      if (rep[r].failed && blocked_s * 1e3 >= PEER_GRACE_MS) {
        snprintf(why, sizeof why, "waiting (in all likelihood) for rank %d, which will not come", r);
        fire_peer(&rep[r], why, what, blocked_s, n);
      }
    }
  }
  free(rep);
  free(got);
}

/* The end of a script waits without a timeout (a rank may still work there for minutes), but not for a
 * rank that cannot come: once this rank's wait there has lasted the timeout, it asks the others every
 * PEER_GRACE_MS, and a rank whose watchdog has answered none of SILENT_ASKS questions in a row ends
 * every rank. A rank at work answers within a tick, whatever its script does; one that answers nothing
 * for that long has its process stopped (SIGSTOP, a debugger) or its host hung, and without this the
 * others waited for it for ever. */
enum { SILENT_ASKS = 3 };

static void fire_silent(int r, int asks, double waited_s) {
  outbuf o = {0};
  out(&o, "tpsh: rank %d has answered none of this rank's last %d questions (its watchdog answers within a second "
      "while its process runs: the process is stopped or gone, or its host hung or unreachable), and this rank "
      "has waited for the others at the end of the script for %.1f s (--timeout %g)", r, asks, waited_s, get_timeout());
  end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

static void check_end_silence(double now) {
  static double last_ask;
  static uint64_t serial;
  static int *silent;
  int size = tpsh_rt.size;
  if (size < 2 || wd_comm == MPI_COMM_NULL || __atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) == 0) return;
  double since = get_wait_since();
  uint64_t sn = __atomic_load_n(&wait_serial, __ATOMIC_ACQUIRE);
  if (now - since < get_timeout() * 1e3 || now - last_ask < PEER_GRACE_MS) return;
  if (!silent && !(silent = calloc((size_t)size, sizeof *silent))) return;
  if (sn != serial) {                           /* another wait at the end (the p2p comparison's, then the last) */
    serial = sn;
    memset(silent, 0, (size_t)size * sizeof *silent);
  }
  last_ask = now;
  wd_status *rep = calloc((size_t)size, sizeof *rep);
  int *got = calloc((size_t)size, sizeof *got);
  if (rep && got) {
    ask_others(rep, got, size);
    for (int r = 0; r < size; r++) {
      if (r == tpsh_rt.rank) continue;
      silent[r] = got[r] ? 0 : silent[r] + 1;
      /* still at the end, in the same wait: the answers may have come as the wait ended */
      if (silent[r] >= SILENT_ASKS && __atomic_load_n(&tpsh_wd_at_script_end, __ATOMIC_ACQUIRE) &&
          __atomic_load_n(&wait_serial, __ATOMIC_ACQUIRE) == sn)
        fire_silent(r, silent[r], (now_ms() - since) / 1e3);
    }
  }
  free(rep);
  free(got);
}

/* ==== the thread ================================================================================== */
static void *watch(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "tp:watchdog");
  pthread_mutex_lock(&mu);
  while (!stopping) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&cv, &mu, &ts);
    if (stopping) break;
    pthread_mutex_unlock(&mu);
    if (wd_comm != MPI_COMM_NULL) {
      serve();
      serve_end_notice();
    }
    double now = now_ms(), limit = get_timeout() * 1e3;
    int n = tpsh_flight_snapshot(snap, TPSH_FLIGHT_RING, NULL, NULL);
    for (int i = 0; i < n; i++)
      if (snap[i].state == TPSH_FLIGHT_STARTED && now - snap[i].t_started > limit) {
        tpsh_flight_entry stuck = snap[i];
        fire(&stuck, NULL, 0, n);
      }
    if (__atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0) {
      double since = get_wait_since();
      const char *what = get_wait_what();
      /* A second of grace: a rank stuck in a collective reports first, and it knows the most. */
      if (now - since > limit + 1e3 && !__atomic_load_n(&tpsh_wd_at_script_end, __ATOMIC_ACQUIRE))
        fire(NULL, what ? what : "a wait", (now - since) / 1e3, n);
    }
    uint64_t calls = __atomic_load_n(&tpsh_watch_call_count, __ATOMIC_ACQUIRE);
    if (!(calls & 1)) call_since = 0;
    else if (calls != call_seen || call_since == 0) call_seen = calls, call_since = now;
    if (call_since > 0 && now - call_since > limit + 1e3) fire(NULL, CALL_WHAT, (now - call_since) / 1e3, n);
    check_peers(now);
    if (__atomic_load_n(&tpsh_wd_at_script_end, __ATOMIC_ACQUIRE)) check_end_silence(now);
    pthread_mutex_lock(&mu);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

int tpsh_watchdog_start(void) {
  const char *env = getenv("TPSH_TIMEOUT");
  if (env && *env && atof(env) > 0) tpsh_watchdog_set_timeout(atof(env));
  counts = calloc((size_t)tpsh_rt.size, sizeof *counts);
  if (!counts) return tpsh_error(TPSH_ENOMEM, "out of host memory for the watchdog");
  if (MPI_Comm_dup(MPI_COMM_WORLD, &wd_comm) != MPI_SUCCESS) wd_comm = MPI_COMM_NULL;
  else MPI_Comm_set_errhandler(wd_comm, MPI_ERRORS_RETURN);
  if (MPI_Comm_dup(MPI_COMM_WORLD, &tpsh_wd_end_comm) != MPI_SUCCESS) tpsh_wd_end_comm = MPI_COMM_NULL;
  else MPI_Comm_set_errhandler(tpsh_wd_end_comm, MPI_ERRORS_RETURN);
  stopping = 0;
  if (pthread_create(&thread, NULL, watch, NULL) != 0)
    return tpsh_error(TPSH_EBACKEND, "could not start the watchdog thread");
  running = 1;
  return TPSH_OK;
}

void tpsh_watchdog_stop(void) {
  if (running) {
    pthread_mutex_lock(&mu);
    __atomic_store_n(&stopping, 1, __ATOMIC_RELEASE);   /* ask_others reads it without mu */
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(thread, NULL);
    running = 0;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && wd_comm != MPI_COMM_NULL) {
    end_question_receive();
    if (notice_req != MPI_REQUEST_NULL) end_receive(&notice_req, NULL);   /* no rank ended the run */
    if (tpsh_rt.size > 1) drain_questions();
    MPI_Comm_free(&wd_comm);
  }
  if (!finalized && tpsh_wd_end_comm != MPI_COMM_NULL) MPI_Comm_free(&tpsh_wd_end_comm);
  free(counts);
  counts = NULL;
  tpsh_p2p_ledger_free();          /* after the thread: its answers read the counts */
}
