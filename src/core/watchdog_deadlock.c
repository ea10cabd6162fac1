/*
 * watchdog_deadlock.c: the rules that prove, from another rank's answer (wd_status) and this rank's own
 * flight record, that two ranks' waits can never end: a host-side exchange against a collective, two
 * comparisons of check mode, two collectives of two groups issued in different orders, two different
 * host-side exchanges at one number. Each rule rests on exact counts, so none fires on a run that could
 * go on; the first that holds ends every rank with status 1 and says which waits hold each other up.
 */
#include "core/watchdog.h"
#include "core/coll_kinds.h"
#include <stdio.h>
#include <string.h>

/* `tpsh test`: rank r (its state st) waits at the runner's exchange of the running test, so it issues
 * no more collectives (nor host-side exchanges) in it. Can this rank's collective number `index` on
 * the group (host: its host-side exchange number) still complete? Not when r is a member of the group
 * and has issued no more than `index` there (both counts from the flight tables; a shared slot or a
 * table that did not fit in the reply decides nothing). */
int tpsh_wd_never_joins(uint64_t group_id, int64_t index, int host, const wd_status *st, int ng, int64_t *issued) {
  *issued = 0;
  if (!tpsh_wd_entry_with(tpsh_wd_snap_groups, ng, group_id, st->rank)) return 0;
  for (int i = 0; i < st->ngroups && i < STATUS_GROUPS; i++)
    if (st->g[i].id == group_id) {
      *issued = host ? st->g[i].host_exchanges : st->g[i].collectives;
      return !st->g[i].shared && *issued <= index;
    }
  return st->groups_known;                 /* r has issued nothing on the group */
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
  const tpsh_flight_group *grp = tpsh_wd_group_of(tpsh_wd_snap_groups, ng, e->group_id);
  if (!grp) return 0;
  int r = e->peer;
  int root_world = r >= 0 && r < grp->size && r < TPSH_FLIGHT_MAX_MEMBERS ? grp->members[r] : -1;
  return waits_for_member(e->kind, root_world, tpsh_rt.rank, other);
}

/* Whether rank st->rank is blocked in a host-side exchange that this rank, a member of its group, has not
 * begun; *mine: this rank's count of exchanges begun there. The first half of wait_cycle and match_cycle. */
static int in_exchange_not_begun(const wd_status *st, int ng, int64_t *mine) {
  if (st->host_index < 0 || st->at_exchange) return 0;
  const tpsh_flight_group *h = tpsh_wd_entry_with(tpsh_wd_snap_groups, ng, st->host_group, st->rank);
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
    const tpsh_flight_entry *e = &tpsh_wd_snap[i];
    if (e->state == TPSH_FLIGHT_COMPLETED || e->coll_index < 0) continue;
    if (on != TPSH_WAIT_ALL_STREAMS && e->stream_key != on) continue;
    if (!mine_waits_for(e, ng, st->rank)) continue;
    if (tpsh_wd_never_joins(e->group_id, e->coll_index, 0, st, ng, issued)) return e;
  }
  return NULL;
}

/* A cycle of two waits that no rank can break: rank st->rank is blocked in a host-side exchange (#k of
 * group H) that this rank has not begun, and this rank's host is blocked in a wait that cannot end before
 * its collective e has (a read or synchronize of e's stream, or tp.synchronize), which that rank has not
 * issued. That rank issues nothing until this rank joins its exchange, and this rank joins nothing until
 * its wait ends: the ranks called host-side exchanges and collectives in different orders
 * (tp.barrier() on rank 0, an all_reduce and a read on rank 1), and only the timeout would end it.
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
  tpsh_wd_out(&o, "tpsh: a deadlock: %s; %s", theirs, ours);
  tpsh_wd_out(&o, "(a host-side exchange (tp.barrier, tp.allgather, tp.bcast, tp.gather) waits for every member's host: "
      "rank %d's waits for this rank, whose host waits for a collective that rank %d has yet to issue)", st->rank,
      st->rank);
  tpsh_flight_format(e, tpsh_now_ms(), line, sizeof line);
  tpsh_wd_out(&o, "  this rank's: %s", line);
  tpsh_wd_end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* As wait_cycle, where this rank's host waits in check mode's comparison of its collective #index of
 * group `group` (not yet enqueued, so in no flight entry): rank st->rank is blocked in a host-side
 * exchange that this rank has not begun, is a member of `group` and has issued no more than `index`
 * collectives there, so it never sends its side of the comparison, and this rank never joins its
 * exchange. Returns 1 then; *mine: this rank's count of exchanges begun on that rank's exchange's group. */
static int match_cycle(const wd_status *st, uint64_t group, int64_t index, int ng, int64_t *mine, int64_t *issued) {
  if (index < 0 || !in_exchange_not_begun(st, ng, mine)) return 0;
  return tpsh_wd_never_joins(group, index, 0, st, ng, issued);
}

static void fire_match_cycle(const wd_status *st, uint64_t group, int64_t index, const char *op, int64_t mine,
                             int64_t issued, double blocked_s) {
  outbuf o = {0};
  char theirs[512], ours[512];
  peer_in_exchange(theirs, sizeof theirs, st, mine);
  mine_in_comparison(ours, sizeof ours, st, group, index, op, issued, blocked_s);
  tpsh_wd_out(&o, "tpsh: a deadlock: %s; %s", theirs, ours);
  tpsh_wd_out(&o, "(a host-side exchange (tp.barrier, tp.allgather, tp.bcast, tp.gather) waits for every member's host: "
      "rank %d's waits for this rank, whose collective waits for rank %d to issue it too)", st->rank, st->rank);
  tpsh_wd_end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* This rank's count of collectives on group id (*mine), where an asked rank's status names the group's
 * members (world ranks members[0..size)) and this rank is one: its group of that id is that group (a
 * rank's groups never share an id; split groups of other colours do, hence the members); none in the
 * table: it has issued nothing there, unless the table is full and lost it. Returns 0 where this rank
 * is no member or the count cannot be said (a shared slot), so that nothing is decided on it. One rule
 * for match_match_cycle and wait_cross, which covers a group this rank has never issued on (two first
 * collectives on two groups in different orders). */
static int my_count_on(uint64_t id, const int32_t *members, int size, int ng, int64_t *mine) {
  int member = 0;
  for (int k = 0; k < size && k < TPSH_FLIGHT_MAX_MEMBERS && !member; k++) member = members[k] == tpsh_rt.rank;
  if (!member) return 0;
  const tpsh_flight_group *d = tpsh_wd_group_of(tpsh_wd_snap_groups, ng, id);
  if (d ? d->shared : ng >= TPSH_FLIGHT_GROUPS) return 0;
  *mine = d ? d->collectives : 0;
  return 1;
}

/* Check mode, both hosts in a comparison: this rank's of its collective #index of `group`, which rank
 * st->rank, a member, has not issued (*issued there), and that rank's of its collective #st->match_index of
 * another group, which this rank, a member, has not issued (*mine there). Neither host issues anything
 * while it compares, so neither comparison ends (a rank skipped a sub-group's collective before a world
 * one, or the ranks issued two groups' collectives in different orders). Exact counts, as in
 * match_cycle; a group this rank knows nothing of decides nothing. Returns 1 then. */
static int match_match_cycle(const wd_status *st, uint64_t group, int64_t index, int ng, int64_t *mine,
                             int64_t *issued) {
  if (index < 0 || st->match_index < 0 || st->match_group == group || st->at_exchange) return 0;
  if (!tpsh_wd_never_joins(group, index, 0, st, ng, issued)) return 0;
  return my_count_on(st->match_group, st->match_members, st->match_size, ng, mine) && *mine <= st->match_index;
}

static void fire_match_match(const wd_status *st, uint64_t group, int64_t index, const char *op, int64_t mine,
                             int64_t issued, double blocked_s) {
  outbuf o = {0};
  char ours[512];
  mine_in_comparison(ours, sizeof ours, st, group, index, op, issued, blocked_s);
  tpsh_wd_out(&o, "tpsh: a deadlock: rank %d is %s, which waits for this rank to issue collective #%lld of group %llu too "
      "(this rank has issued %lld there); %s (a rank skipped a collective of one group, or the ranks issued two "
      "groups' collectives in different orders)", st->rank, st->doing, (long long)st->match_index,
      (unsigned long long)st->match_group, (long long)mine, ours);
  tpsh_wd_end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
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
  if (!tpsh_wd_entry_with(tpsh_wd_snap_groups, ng, e->group_id, st->rank) || !mine_waits_for(e, ng, st->rank)) return 0;
  for (int k = 0; k < st->nbehind && k < STATUS_BEHIND; k++)
    if (st->behind[k].group == e->group_id && st->behind[k].index == e->coll_index) return 1;
  return 0;
}

/* The first of this rank's collectives not known complete on what its host's wait on `on` waits for, that
 * rank st->rank has issued but queued on its stream behind the collective its host waits for (st->behind:
 * it cannot start before that one completes); NULL when there is none. The other half of wait_cross: a
 * rank that skipped a sub-group's collective and then issued a world one, where the other rank issued
 * both, each reading its result (without check mode too). */
static const tpsh_flight_entry *awaited_queued_behind(const wd_status *st, const void *on, int n, int ng) {
  for (int i = 0; i < n; i++) {
    const tpsh_flight_entry *e = &tpsh_wd_snap[i];
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
  tpsh_wd_out(&o, "tpsh: a deadlock: rank %d's host waits for its %s (collective #%lld of group %llu), and this rank has "
      "issued %lld collectives there; %s", st->rank, st->dep_op, (long long)st->dep_index,
      (unsigned long long)st->dep_group, (long long)mine, ours);
  if (queued)
    tpsh_wd_out(&o, "(this rank skipped a collective of group %llu, or has yet to issue it, and issued one of group %llu "
        "that rank %d's stream runs after it: every member must issue a group's collectives, and a rank's groups "
        "in one order)", (unsigned long long)st->dep_group, (unsigned long long)e->group_id, st->rank);
  else
    tpsh_wd_out(&o, "(the ranks issued collectives on groups %llu and %llu in different orders, and each waits on the host "
        "for the one it issued first: every member must issue a group's collectives, and a rank's groups in one "
        "order)", (unsigned long long)e->group_id, (unsigned long long)st->dep_group);
  tpsh_flight_format(e, tpsh_now_ms(), line, sizeof line);
  tpsh_wd_out(&o, "  this rank's: %s", line);
  tpsh_wd_end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* Two collectives that this rank's stream and rank st->rank's run in opposite orders: that rank's host
 * waits for its collective D (st->dep_*) and has queued this rank's collective A behind it on D's stream
 * (st->behind), while this rank's stream holds its own D after A, A not complete. This A cannot complete
 * before that rank's A runs, which waits for its D, which waits for this rank's D, which waits for this A:
 * certain, whatever either host does (rank 0: g then the world, rank 1: the world then g), where the flight
 * record says only that each has issued both. Returns A, and *d: this rank's D; NULL when there is none. */
static const tpsh_flight_entry *crossed_order(const wd_status *st, int n, int ng, const tpsh_flight_entry **d) {
  if (st->dep_index < 0 || st->at_exchange || st->host_index >= 0 || st->nbehind <= 0) return NULL;
  /* that rank's D must wait for this rank's */
  if (!tpsh_wd_entry_with(tpsh_wd_snap_groups, ng, st->dep_group, st->rank) || !dep_waits_for_me(st)) return NULL;
  for (int j = 0; j < n; j++) {            /* this rank's D, then an A before it on its stream */
    const tpsh_flight_entry *dd = &tpsh_wd_snap[j];
    if (dd->group_id != st->dep_group || dd->coll_index != st->dep_index || dd->state == TPSH_FLIGHT_COMPLETED)
      continue;
    for (int i = 0; i < j; i++) {
      const tpsh_flight_entry *a = &tpsh_wd_snap[i];
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
  tpsh_wd_out(&o, "tpsh: a deadlock: this rank's stream runs its %s (collective #%lld of group %llu) before its %s "
      "(collective #%lld of group %llu), and rank %d's stream runs them the other way round: each waits for the "
      "other rank's first one, which its stream holds behind its second", a->op, (long long)a->coll_index,
      (unsigned long long)a->group_id, d->op, (long long)d->coll_index, (unsigned long long)d->group_id, st->rank);
  tpsh_wd_out(&o, "(the ranks issued collectives on groups %llu and %llu in different orders: every member must issue a "
      "group's collectives, and a rank's groups in one order)", (unsigned long long)a->group_id,
      (unsigned long long)d->group_id);
  tpsh_flight_format(a, tpsh_now_ms(), line, sizeof line);
  tpsh_wd_out(&o, "  this rank's: %s", line);
  tpsh_flight_format(d, tpsh_now_ms(), line, sizeof line);
  tpsh_wd_out(&o, "  this rank's: %s", line);
  tpsh_wd_end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* Rank st->rank is blocked in host-side exchange #index of group `group` as this rank is, but in another
 * call (tp.barrier against tp.bcast): MPI pairs neither with anything the other will make, and both
 * would wait for the timeout. Certain: a member that has begun exchange #index of a group makes no other
 * there (the counts are exact), and this rank is in its own. */
static int other_exchange(const wd_status *st, uint64_t group, int64_t index, const char *what, int ng) {
  if (index < 0 || st->host_index != index || st->host_group != group || st->at_exchange || !what) return 0;
  const tpsh_flight_group *h = tpsh_wd_entry_with(tpsh_wd_snap_groups, ng, group, st->rank);
  if (!h || h->size > TPSH_FLIGHT_MAX_MEMBERS) return 0;
  return strncmp(st->host_what, what, sizeof st->host_what - 1) != 0;
}

static void fire_exchange(const wd_status *st, const char *what, double blocked_s) {
  outbuf o = {0};
  tpsh_wd_out(&o, "tpsh: the ranks made different host-side exchanges: #%lld of group %llu (counted from 0) is %s on this "
      "rank and %s on rank %d; this rank has been blocked in it for %.1f s, and neither completes (every member "
      "of a group makes the same host-side exchanges in the same order)", (long long)st->host_index,
      (unsigned long long)st->host_group, what, st->host_what, st->rank, blocked_s);
  tpsh_wd_end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* The rules in turn; the first that holds ends the run. First a rank in another host-side exchange at
 * this one's number, or in one this rank's wait keeps it out of (an exchange's wait names no stream, so
 * at most one of the two applies). */
void tpsh_wd_find_deadlock(const wd_status *st, const wd_self *me) {
  if (other_exchange(st, me->host_group, me->host_index, me->what, me->ng)) fire_exchange(st, me->what, me->blocked_s);
  int64_t mine = 0, issued = 0;
  const tpsh_flight_entry *e = wait_cycle(st, me->on, me->n, me->ng, &mine, &issued);
  if (e) fire_cycle(st, e, mine, issued, me->what, me->blocked_s);
  int queued = 0;
  e = wait_cross(st, me->on, me->n, me->ng, &mine, &issued, &queued);
  if (e) fire_cross(st, e, mine, issued, queued, me->what, me->blocked_s);
  const tpsh_flight_entry *d = NULL;
  e = crossed_order(st, me->n, me->ng, &d);
  if (e) fire_crossed(st, e, d);
  if (match_cycle(st, me->match_group, me->match_index, me->ng, &mine, &issued))
    fire_match_cycle(st, me->match_group, me->match_index, me->match_op, mine, issued, me->blocked_s);
  if (match_match_cycle(st, me->match_group, me->match_index, me->ng, &mine, &issued))
    fire_match_match(st, me->match_group, me->match_index, me->match_op, mine, issued, me->blocked_s);
}
