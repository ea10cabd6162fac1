/*
 * watchdog_timeout.c: the watchdog's report when a collective of the flight recorder has been started
 * but not completed for longer than the timeout, or the host has been blocked in one wait for longer.
 * Firing means:
 *   1. print the stuck collective (or host wait) and the flight record, rank-prefixed;
 *   2. ask every other rank for its state (watchdog_ask.c): the last sequence numbers it enqueued /
 *      started / completed per group and what it is doing; the asking rank waits at most 2 s, then says
 *      which ranks did not answer (dead, or with MPI itself wedged);
 *   3. name the ranks that did not join the stuck collective (their last enqueued sequence number on
 *      the group is below it, or they did not answer), and those stuck in a different collective at
 *      the same sequence number of the group (the ranks issued different collectives);
 *   4. end every rank (watchdog_abort.c). Worst case: timeout + 0.5 s to notice + 2 s to ask + the abort
 *      (+ the host's --trace records).
 */
#include "core/watchdog.h"
#include "core/coll_kinds.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether this rank's host wait may depend on another rank: a collective, send or receive of this rank
 * not known complete (entries 0..nsnap of tpsh_wd_snap), or the host in a host-side exchange or in check mode's
 * comparison. Where none does, a wait past the timeout is this rank's own work taking that long. */
static int wait_involves_peers(int nsnap) {
  uint64_t g;
  const char *op;
  if (tpsh_wd_exchange_now(&g) >= 0 || tpsh_wd_match_now(&g, &op) >= 0) return 1;
  if (tpsh_wd_wait_peer() >= 0) return 1;
  for (int i = 0; i < nsnap; i++)
    if (tpsh_wd_snap[i].state != TPSH_FLIGHT_COMPLETED) return 1;
  return 0;
}

void tpsh_wd_fire_timeout(const tpsh_flight_entry *stuck, const char *host_what, double host_s, int nsnap) {
  outbuf o = {0};
  double now = tpsh_now_ms();
  if (stuck)
    tpsh_wd_out(&o, "tpsh watchdog: %s (seq %llu on group %llu, %s x %lld elements, stream '%s') started %.1f s ago "
        "and has not completed (timeout %g s)", stuck->op, (unsigned long long)stuck->seq,
        (unsigned long long)stuck->group_id, tpsh_dtype_name(stuck->dtype), (long long)stuck->count,
        stuck->stream, (now - stuck->t_started) / 1e3, tpsh_watchdog_timeout());
  else
    tpsh_wd_out(&o, "tpsh watchdog: the host has been blocked in %s for %.1f s (timeout %g s)", host_what, host_s,
                tpsh_watchdog_timeout());
  /* The timeout bounds every host wait, a long local computation's too (a hung device would otherwise
   * hold the rank for ever): say so where nothing the wait depends on involves another rank, so that the
   * reader raises --timeout rather than looks for a peer at fault. */
  if (!stuck && !wait_involves_peers(nsnap))
    tpsh_wd_out(&o, "no collective, send or receive of this rank is unfinished and the host is in no exchange with "
        "other ranks: this is the rank's own work taking longer than the timeout (if that is expected, raise "
        "--timeout or TPSH_TIMEOUT)");
  int first = nsnap > 32 ? nsnap - 32 : 0;
  tpsh_wd_out(&o, "flight record (this rank's last %d collectives, oldest first):", nsnap - first);
  char line[512];
  for (int i = first; i < nsnap; i++) {
    tpsh_flight_format(&tpsh_wd_snap[i], now, line, sizeof line);
    tpsh_wd_out(&o, "  %s", line);
  }
  tpsh_wd_flush(&o);

  int size = tpsh_rt.size;
  wd_status *rep = calloc((size_t)size, sizeof *rep);
  int *got = calloc((size_t)size, sizeof *got);
  if (size > 1 && rep && got) {
    tpsh_wd_out(&o, "asking the other ranks for their state (up to %d s)...", ASK_MS / 1000);
    tpsh_wd_flush(&o);
    tpsh_wd_ask_others(rep, got, size);
    char missing[1024] = "", behind[1024] = "";
    size_t mu_ = 0, bu = 0;
    int nmissing = 0, ndiffer = 0, nbehind = 0;
    /* The members of the stuck collective's group, as world ranks (all ranks when unknown). */
    int ng = 0;
    tpsh_flight_snapshot(tpsh_wd_snap, 0, tpsh_wd_snap_groups, &ng);
    const tpsh_flight_group *sg = stuck ? tpsh_wd_group_of(tpsh_wd_snap_groups, ng, stuck->group_id) : NULL;
    /* A send or receive waits for its peer alone, and the members' sequence numbers, which count every
     * member's own sends and receives, say nothing of it: read as a collective's, a receive from a rank
     * that sent elsewhere would name a bystander as "did not join" and leave the peer out. */
    int p2p = stuck && tpsh_coll_is_p2p(stuck->kind);
    int peer = -1;   /* its world rank, where known */
    if (p2p && sg && !sg->shared && stuck->peer >= 0 && stuck->peer < sg->size && stuck->peer < TPSH_FLIGHT_MAX_MEMBERS)
      peer = sg->members[stuck->peer];
    if (!stuck) peer = tpsh_wd_wait_peer();
    for (int r = 0; r < size; r++) {
      if (r == tpsh_rt.rank) continue;
      int member = !sg || tpsh_wd_has_member(sg, r);
      int counts = p2p ? r == peer : member;   /* whose silence holds the stuck call up */
      if (!got[r]) {
        tpsh_wd_out(&o, "  rank %d: no answer (it has finished its script or died, or its MPI is wedged)", r);
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
        tpsh_wd_out(&o, "  rank %d: not a member of group %llu; now %s", r, (unsigned long long)stuck->group_id, st->doing);
      else if (stuck)
        tpsh_wd_out(&o, "  rank %d: group %llu: last seq enqueued %lld, started %lld, completed %lld; now %s", r,
            (unsigned long long)stuck->group_id, (long long)enq, (long long)started, (long long)completed, st->doing);
      else
        tpsh_wd_out(&o, "  rank %d: %s", r, st->doing);
      if (p2p) continue;
      if (stuck && member && (!knows || enq < (int64_t)stuck->seq) && mu_ < sizeof missing)
        mu_ += (size_t)snprintf(missing + mu_, sizeof missing - mu_, "%s%d (last seq %lld)", nmissing++ ? ", " : "", r,
                                (long long)enq);
      /* Issued there but not started (only the CPU backend marks starts, and only it gives a stuck entry):
       * the member's stream, or the group's turn, holds it behind earlier work that has not finished, e.g.
       * a collective of another group that the ranks issued in another order: no transport's fault. */
      else if (stuck && member && knows && started < (int64_t)stuck->seq && bu < sizeof behind)
        bu += (size_t)snprintf(behind + bu, sizeof behind - bu, "%s%d (now %s)", nbehind++ ? ", " : "", r, st->doing);
    }
    if (stuck && nmissing)
      tpsh_wd_out(&o, "ranks that did not join %s seq %llu of group %llu: %s", stuck->op, (unsigned long long)stuck->seq,
          (unsigned long long)stuck->group_id, missing);
    /* A rank whose sequence number counts the collective as issued may be stuck in another one at the
     * same place of the group: the ranks issued different collectives, which no transport can match. */
    for (int r = 0; stuck && !p2p && r < size; r++) {
      const wd_status *st = &rep[r];
      if (r == tpsh_rt.rank || !got[r] || !st->in_coll || st->coll_group != stuck->group_id ||
          st->coll_seq != stuck->seq || strncmp(st->coll_op, stuck->op, sizeof st->coll_op) == 0)
        continue;
      tpsh_wd_out(&o, "rank %d is in %.*s seq %llu of group %llu, not %s: the ranks issued different collectives", r,
          (int)sizeof st->coll_op, st->coll_op, (unsigned long long)st->coll_seq, (unsigned long long)st->coll_group,
          stuck->op);
      ndiffer++;
    }
    if (stuck && nbehind)
      tpsh_wd_out(&o, "ranks that issued %s seq %llu of group %llu but have not started it: %s; work issued before it there "
          "has not finished (on its stream, or an earlier collective of the group on another stream): where that is "
          "a collective of another group, the ranks issued the two groups' collectives in different orders, and "
          "they wait for each other for good", stuck->op, (unsigned long long)stuck->seq,
          (unsigned long long)stuck->group_id, behind);
    if (stuck && !nmissing && !ndiffer && !nbehind && p2p) {
      /* A send completes against its peer's receive, not against the same call on every rank: two sends
       * (or two receives) at the same place match nothing, and no transport is at fault */
      char from[320] = "";
      if (peer >= 0)
        snprintf(from, sizeof from, ", %s rank %d (%s)", stuck->kind == TPSH_C_SEND ? "to" : "from", peer,
                 peer == tpsh_rt.rank ? "this rank" : got[peer] ? rep[peer].doing : "no answer");
      tpsh_wd_out(&o, "this rank's %s (seq %llu of group %llu) waits for its peer's matching %s%s: a send completes only "
          "against a receive posted on its peer (and a receive against a send); a peer that sends to or receives "
          "from another rank (a wrong peer), or has finished, never matches it, and ranks that all send first, or all "
          "receive first, wait for each other for good: pair them (rank 0 sends while rank 1 receives), or issue a "
          "ring's sends and receives in one g:batch", stuck->op, (unsigned long long)stuck->seq,
          (unsigned long long)stuck->group_id, stuck->kind == TPSH_C_SEND ? "recv" : "send", from);
    } else if (stuck && p2p)
      tpsh_wd_out(&o, "this rank's %s (seq %llu of group %llu) waits for its peer, rank %d, which did not answer",
          stuck->op, (unsigned long long)stuck->seq, (unsigned long long)stuck->group_id, peer);
    else if (stuck && !nmissing && !ndiffer && !nbehind)
      tpsh_wd_out(&o, "every rank that answered has issued %s seq %llu: the collective is stuck inside the transport",
          stuck->op, (unsigned long long)stuck->seq);
    else if (!stuck) {
      /* This rank is blocked on the host: if another rank is stuck in a collective, say who has not
       * issued it (this rank included), from everyone's last sequence numbers on that group. */
      const wd_status *in = NULL;
      for (int r = 0; r < size && !in; r++)
        if (got[r] && rep[r].in_coll) in = &rep[r];
      if (in) {
        tpsh_wd_fill_status(&rep[tpsh_rt.rank]);
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
        tpsh_wd_out(&o, "rank %d is stuck in %s seq %llu of group %llu; ranks that did not join it: %s", in->rank,
            in->coll_op, (unsigned long long)in->coll_seq, (unsigned long long)in->coll_group, nwho ? who : "none");
      } else if (peer >= 0 && peer < size) {
        tpsh_wd_out(&o, "this rank's receive waits for rank %d to say what it sends (check mode compares each receive with "
            "its send before it is enqueued); rank %d is now %s: a rank that sends to another rank (a wrong peer), "
            "or never sends, leaves the receive waiting for good", peer, peer, got[peer] ? rep[peer].doing : "(no answer)");
      } else if (nmissing) {
        tpsh_wd_out(&o, "ranks that did not answer: %s", missing);
      }
    }
  }
  tpsh_wd_end_every_rank(&o, "tpsh watchdog: ending every rank (MPI_Abort)", 124);
}
