/*
 * watchdog_status.c: this rank's state as another rank's watchdog asks for it (wd_status: its groups'
 * counts, what its host is doing, the collectives its host waits for, its last collectives), the flight
 * tables' lookups the watchdog's rules share, and the comparison of two ranks' last collectives, which
 * the watchdog makes while a rank waits and the end of a script once every rank has come.
 */
#include "core/watchdog.h"
#include <stdio.h>
#include <string.h>

/* The entry of group id among groups[0..ng) (the last, should a shared slot repeat it), NULL if none. */
const tpsh_flight_group *tpsh_wd_group_of(const tpsh_flight_group *groups, int ng, uint64_t id) {
  for (int i = ng - 1; i >= 0; i--)
    if (groups[i].id == id) return &groups[i];
  return NULL;
}

/* Whether world rank r is one of grp's members (as far as the table holds them). */
int tpsh_wd_has_member(const tpsh_flight_group *grp, int r) {
  for (int k = 0; k < grp->size && k < TPSH_FLIGHT_MAX_MEMBERS; k++)
    if (grp->members[k] == r) return 1;
  return 0;
}

/* The entry of group id among groups[0..ng) when it is usable (not a shared slot) and names world rank
 * r as a member; NULL otherwise (an entry that cannot say decides nothing). */
const tpsh_flight_group *tpsh_wd_entry_with(const tpsh_flight_group *groups, int ng, uint64_t id, int r) {
  const tpsh_flight_group *grp = tpsh_wd_group_of(groups, ng, id);
  return grp && !grp->shared && tpsh_wd_has_member(grp, r) ? grp : NULL;
}

/* What the host is doing, in words (wd_status.doing). */
static void describe_doing(char *buf, size_t len, double now) {
  int ng = 0;
  int n = tpsh_flight_snapshot(tpsh_wd_snap, TPSH_FLIGHT_RING, tpsh_wd_snap_groups, &ng);
  for (int i = 0; i < n; i++)
    if (tpsh_wd_snap[i].state == TPSH_FLIGHT_STARTED) {
      snprintf(buf, len, "in %s seq %llu of group %llu for %.1f s", tpsh_wd_snap[i].op,
               (unsigned long long)tpsh_wd_snap[i].seq, (unsigned long long)tpsh_wd_snap[i].group_id,
               (now - tpsh_wd_snap[i].t_started) / 1e3);
      return;
    }
  uint64_t calls = __atomic_load_n(&tpsh_watch_call_count, __ATOMIC_ACQUIRE);
  const char *what = tpsh_wd_wait_what();
  uint64_t mg;
  const char *mop = NULL;
  int64_t mi = tpsh_wd_match_now(&mg, &mop);
  if (tpsh_wd_host_waiting() && mi >= 0)
    /* which comparison: "the collective mismatch check" alone named neither group nor collective */
    snprintf(buf, len, "host blocked in %s of its %s, collective #%lld of group %llu, for %.1f s", what ? what : "a wait",
             mop ? mop : "collective", (long long)mi, (unsigned long long)mg, (now - tpsh_wd_wait_since()) / 1e3);
  else if (tpsh_wd_host_waiting())
    snprintf(buf, len, "host blocked in %s for %.1f s", what ? what : "a wait", (now - tpsh_wd_wait_since()) / 1e3);
  else if (calls & 1) {
    /* Inside the backend's launch (NCCL waiting there for the others to join): the collective is the
     * newest entry, recorded just before the call (a rank stuck there is not "running"). The tick times
     * the call it saw (tpsh_wd_call_tick); a call begun since then has just begun. */
    double since = calls == tpsh_wd_call_seen() && tpsh_wd_call_since() > 0 ? tpsh_wd_call_since() : now;
    const tpsh_flight_entry *last = n > 0 ? &tpsh_wd_snap[n - 1] : NULL;
    const tpsh_flight_entry *e = last && last->state == TPSH_FLIGHT_ENQUEUED ? last : NULL;
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
 * stuck collective or exchange is on) is among them: the table's first sixteen would leave a program's
 * newer groups out, and the deadlock rules could not decide for them. */
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

/* ==== this rank's state ========================================================================= */
void tpsh_wd_fill_status(wd_status *st) {
  memset(st, 0, sizeof *st);
  st->rank = tpsh_rt.rank;
  st->test = tpsh_wd_test();
  if (st->test && tpsh_wd_host_waiting() && tpsh_wd_in_exchange()) {
    st->at_exchange = 1;
    st->failed = tpsh_wd_failure_of(st->test, st->failure, sizeof st->failure);
  }
  describe_doing(st->doing, sizeof st->doing, tpsh_now_ms());
  st->host_index = tpsh_wd_exchange_now(&st->host_group);
  { const char *mop = NULL; st->match_index = tpsh_wd_match_now(&st->match_group, &mop); }
  if (st->host_index >= 0) {
    const char *w = tpsh_wd_wait_what();
    snprintf(st->host_what, sizeof st->host_what, "%s", w ? w : "?");
  }
  int n = tpsh_flight_snapshot(tpsh_wd_snap, TPSH_FLIGHT_RING, NULL, NULL);
  for (int i = 0; i < n && !st->in_coll; i++)
    if (tpsh_wd_snap[i].state == TPSH_FLIGHT_STARTED) {
      st->in_coll = 1;
      st->coll_group = tpsh_wd_snap[i].group_id;
      st->coll_seq = tpsh_wd_snap[i].seq;
      snprintf(st->coll_op, sizeof st->coll_op, "%s", tpsh_wd_snap[i].op);
    }
  tpsh_wd_recent_collectives(tpsh_wd_snap, n, &st->colls);
  int ng = 0;
  tpsh_flight_snapshot(tpsh_wd_snap, 0, tpsh_wd_snap_groups, &ng);
  int pick[STATUS_GROUPS];
  int np = status_groups(tpsh_wd_snap_groups, ng, st, pick);
  for (int i = 0; i < np; i++) {
    const tpsh_flight_group *x = &tpsh_wd_snap_groups[pick[i]];
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
    copy_members(tpsh_wd_group_of(tpsh_wd_snap_groups, ng, st->match_group), &st->match_size, st->match_members);
  st->dep_index = -1;
  const void *on = tpsh_wd_wait_on();
  if (on && tpsh_wd_host_waiting() && !tpsh_wd_in_exchange() && st->host_index < 0)
    for (int i = 0; i < n; i++) {
      const tpsh_flight_entry *e = &tpsh_wd_snap[i];
      if (e->state == TPSH_FLIGHT_COMPLETED || e->coll_index < 0) continue;
      if (on != TPSH_WAIT_ALL_STREAMS && e->stream_key != on) continue;
      const tpsh_flight_group *d = tpsh_wd_group_of(tpsh_wd_snap_groups, ng, e->group_id);
      if (!copy_members(d, &st->dep_size, st->dep_members)) break;
      st->dep_group = e->group_id;
      st->dep_index = e->coll_index;
      st->dep_kind = e->kind;
      st->dep_root = e->peer;
      snprintf(st->dep_op, sizeof st->dep_op, "%s", e->op);
      for (int j = i + 1; j < n && st->nbehind < STATUS_BEHIND; j++)   /* the snapshot is in issue order */
        if (tpsh_wd_snap[j].stream_key == e->stream_key && tpsh_wd_snap[j].state != TPSH_FLIGHT_COMPLETED &&
            tpsh_wd_snap[j].coll_index >= 0) {
          st->behind[st->nbehind].group = tpsh_wd_snap[j].group_id;
          st->behind[st->nbehind].index = tpsh_wd_snap[j].coll_index;
          st->nbehind++;
        }
      break;
    }
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
    if (!tpsh_wd_entry_with(groups, ng, e[i].group_id, rank)) continue;
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
