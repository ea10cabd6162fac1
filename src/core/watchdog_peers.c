/*
 * watchdog_peers.c: the questions a blocked host's watchdog asks before the timeout, and what it ends the
 * run for.
 *
 * A test that failed on one rank (`tpsh test`): the failing rank goes on to the runner's exchange, and a
 * rank still in a collective of that test waits for it forever (the failing rank will not issue it).
 * The runner tells the C side which test runs (tpsh_watch_test) and when this rank waits at its
 * exchange, with or without a failure (tpsh_watch_exchange_begin). A rank whose host has been blocked
 * outside that exchange (a host wait, or inside the backend's collective call) for PEER_ASK_MS asks the
 * others for their state (again every PEER_GRACE_MS while the wait lasts), and ends every rank with
 * status 1 at once when
 *   - a rank at the exchange of this test is a member of the group of one of this rank's unfinished
 *     collectives and has issued no more collectives on it than that one's number: it will never join
 *     it (the counts are exact, so this never fires on a run that could go on), or
 *   - a rank failed this test and waits at the exchange, and the wait has lasted PEER_GRACE_MS: taken as
 *     a wait for that rank; at worst a run that has failed already stops early.
 * The message names the step (tpsh_watch_step: the test, or the loading of the spec files) and quotes
 * the other rank's failure.
 *
 * The same question, whenever this rank has been blocked for PEER_ASK_MS with a collective not known
 * complete, also compares each answering member's last collectives (their descriptions: number on the
 * group, op, dtype, count, root, reduce op) with this rank's flight entries: a collective number of a
 * group that two ranks issued differently is a mismatch no transport can match, and every rank ends
 * with status 1 at once (fire_mismatch) rather than at the timeout, check mode or not. The answers also
 * feed the deadlock rules (watchdog_deadlock.c).
 *
 * A plain script is one such test (TPSH_WATCH_SCRIPT, set by the host) and its end the exchange
 * (tpsh_watch_end_of_script, a barrier on a communicator of its own): a rank that has finished the
 * script issues nothing more, so a rank blocked in a collective or host-side exchange that it never
 * issued is ended the same way, 1 s into its wait rather than at the timeout.
 *
 * A rank killed with SIGKILL: under mpiexec's default clean-up the launcher ends the others at once;
 * where it does not (mpiexec -disable-auto-cleanup, some schedulers, a node that vanishes), the others
 * are stuck in a collective or a host wait and the watchdog ends them within the timeout + 3 s. A rank
 * stopped (SIGSTOP) or on a hung host while the others wait at the end of the script, the one wait
 * without a timeout: they end every rank once it has answered none of their questions for about the
 * timeout + 12 s (check_end_silence).
 */
#include "core/watchdog.h"
#include "core/coll_kinds.h"
#include "core/p2p_ledger.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PEER_ASK_MS = 1000, PEER_GRACE_MS = 5000 };

static int never_joined(const tpsh_flight_entry *e, const wd_status *st, int ng, int64_t *issued) {
  if (e->state == TPSH_FLIGHT_COMPLETED || e->coll_index < 0) return 0;
  return tpsh_wd_never_joins(e->group_id, e->coll_index, 0, st, ng, issued);
}

/* Rank st->rank waits at the runner's exchange of the running test, and this rank's host is blocked
 * (outside that exchange) in what, for the reason `why` says (what that rank will never join, or that
 * it failed the test and the wait has lasted PEER_GRACE_MS). Ends every rank with status 1, quoting
 * that rank's failure as the runner would have reported it. */
static void fire_peer(const wd_status *st, const char *why, const char *what, double blocked_s, int nsnap) {
  outbuf o = {0};
  double now = tpsh_now_ms();
  int script = st->test == TPSH_WATCH_SCRIPT;
  /* the step is the same on both ranks: tpsh_wd_check_peers compares st->test with this rank's (a script's
   * step is named only after an interactive session: the host's "the interactive session") */
  char step[STEP_TEXT];
  tpsh_wd_step(step, sizeof step, script ? "the script" : "this test");
  if (script)
    tpsh_wd_out(&o, "tpsh: rank %d has finished %s and waits for the other ranks at its end; this rank has been "
        "blocked in %s for %.1f s", st->rank, step, what ? what : "a wait", blocked_s);
  else {
    tpsh_wd_out(&o, "tpsh test: rank %d %s %s and waits for the other ranks at the runner's exchange; this rank "
        "has been blocked in %s for %.1f s", st->rank, st->failed ? "failed" : "has finished", step,
        what ? what : "a wait", blocked_s);
  }
  tpsh_wd_out(&o, "%s", why);
  char line[512];
  for (int i = 0; i < nsnap; i++)
    if (tpsh_wd_snap[i].state != TPSH_FLIGHT_COMPLETED) {
      tpsh_flight_format(&tpsh_wd_snap[i], now, line, sizeof line);
      tpsh_wd_out(&o, "  not known complete here: %s", line);   /* CUDA settles entries only at a synchronize */
    }
  if (st->failed) {
    tpsh_wd_out(&o, "rank %d's failure:", st->rank);
    for (const char *p = st->failure; *p;) {
      const char *nl = strchr(p, '\n');
      int len = nl ? (int)(nl - p) : (int)strlen(p);
      tpsh_wd_out(&o, "  %.*s", len, p);
      p += len + (nl ? 1 : 0);
    }
  }
  tpsh_wd_end_every_rank(&o, script ? "tpsh: ending every rank (MPI_Abort, status 1)"
                            : "tpsh test: ending every rank (MPI_Abort, status 1); the tests that were to follow did not run", 1);
}

/* Rank st->rank issued collective #k of a group differently from this rank's entry e (both from the
 * flight recorders; a group's id is the same on all its members, group.c): what no transport can
 * match. Ends every rank with status 1 at once, rather than at the timeout. */
static void fire_mismatch(const tpsh_flight_entry *e, const wd_status *st, const tpsh_coll_desc *theirs,
                          const char *what, double blocked_s) {
  outbuf o = {0};
  char text[512], line[512];
  tpsh_wd_mismatch_text(text, sizeof text, e, theirs, st->rank);
  tpsh_wd_out(&o, "tpsh: the ranks issued different collectives: %s", text);
  tpsh_flight_format(e, tpsh_now_ms(), line, sizeof line);
  tpsh_wd_out(&o, "  this rank's: %s", line);
  tpsh_wd_out(&o, "this rank has been blocked in %s for %.1f s; rank %d: %s", what ? what : "a wait", blocked_s, st->rank,
      st->doing);
  tpsh_wd_out(&o, "(with --check the ranks compare each collective before it is enqueued, and the call raises a Lua error)");
  tpsh_wd_end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

/* Whether this rank has a collective that is not known complete, or (in_wait) its host is in a host-side
 * exchange or in check mode's comparison of a collective: what a rank that will issue nothing more could
 * leave waiting. */
static int waits_for_peers(int in_wait) {
  uint64_t g = 0;
  const char *op;
  if (in_wait && (tpsh_wd_exchange_now(&g) >= 0 || tpsh_wd_match_now(&g, &op) >= 0)) return 1;
  int n = tpsh_flight_snapshot(tpsh_wd_snap, TPSH_FLIGHT_RING, NULL, NULL);
  for (int i = 0; i < n; i++) {
    const tpsh_flight_entry *e = &tpsh_wd_snap[i];
    if (e->state != TPSH_FLIGHT_COMPLETED && (e->coll_index >= 0 || tpsh_coll_is_p2p(e->kind))) return 1;
  }
  return 0;
}

/* This rank's send or recv e, not known complete, is with world rank r, which waits at the end (of the
 * script, or of the test) and so issues nothing more, and which has enqueued fewer receives from this
 * rank (a send) or sends to it (a recv) than this rank has enqueued sends to it or receives from it:
 * one of them, at least, never completes. The counts are exact (every send and receive is counted when
 * it is issued), so this never fires on a run that could go on; without it a recv whose sender has
 * finished would wait for the timeout (600 s by default). *mine, *theirs: the two counts. */
static int p2p_never_matched(const tpsh_flight_entry *e, const wd_status *st, int ng, int r, uint64_t *mine,
                             uint64_t *theirs) {
  if (e->state == TPSH_FLIGHT_COMPLETED || !tpsh_coll_is_p2p(e->kind)) return 0;
  const tpsh_flight_group *grp = tpsh_wd_group_of(tpsh_wd_snap_groups, ng, e->group_id);
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

/* `tpsh test`: the host has been blocked outside the runner's exchange for PEER_ASK_MS (then again
 * every PEER_GRACE_MS while the same wait lasts): asks every other rank for its state, and fires
 * fire_peer when a rank at the exchange of this test will never join one of this rank's collectives,
 * or when one failed this test and the wait has lasted PEER_GRACE_MS. */
void tpsh_wd_check_peers(double now) {
  static double last_ask, asked_since;
  uint64_t test = tpsh_wd_test();
  int size = tpsh_rt.size;
  if (!test || size < 2 || tpsh_wd_comm == MPI_COMM_NULL || tpsh_wd_in_exchange()) return;
  double since;
  const char *what;
  int in_wait = tpsh_wd_host_waiting();
  uint64_t serial = in_wait ? tpsh_wd_wait_serial() : tpsh_wd_call_seen();
  if (in_wait) since = tpsh_wd_wait_since(), what = tpsh_wd_wait_what();
  else if (tpsh_wd_call_since() > 0) since = tpsh_wd_call_since(), what = tpsh_wd_call_what;
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
    tpsh_wd_ask_others(rep, got, size);   /* answering others refills tpsh_wd_snap: take this rank's state after */
    int ng = 0;
    int n = tpsh_flight_snapshot(tpsh_wd_snap, TPSH_FLIGHT_RING, tpsh_wd_snap_groups, &ng);
    uint64_t host_group = 0, match_group = 0;
    const char *match_op = NULL;
    int64_t host_index = in_wait ? tpsh_wd_exchange_now(&host_group) : -1;
    int64_t match_index = in_wait ? tpsh_wd_match_now(&match_group, &match_op) : -1;
    /* The answers are only comparable with this snapshot if the host is still in the wait it was in
     * before asking (it enqueued nothing meanwhile, and the answers came during that wait): an answer
     * can arrive after both ranks have moved on by a test or two. */
    int same = in_wait ? tpsh_wd_host_waiting() && tpsh_wd_wait_serial() == serial && !tpsh_wd_in_exchange()
                       : __atomic_load_n(&tpsh_watch_call_count, __ATOMIC_ACQUIRE) == serial;
    same = same && tpsh_wd_test() == test;
    double blocked_s = (tpsh_now_ms() - since) / 1e3;
    /* Different collectives at one number of a group, one of them still waited for here: no transport
     * completes it, whatever the ranks do now. */
    for (int r = 0; r < size; r++) {
      const tpsh_coll_desc *theirs = NULL;
      const tpsh_flight_entry *e = r != tpsh_rt.rank && got[r]
        ? tpsh_wd_mismatch_with(&rep[r].colls, r, tpsh_wd_snap, n, tpsh_wd_snap_groups, ng, 0, &theirs) : NULL;
      if (e) fire_mismatch(e, &rep[r], theirs, what, blocked_s);
    }
    /* This rank's wait and another rank's, holding each other up (watchdog_deadlock.c) */
    const wd_self me = {.on = tpsh_wd_wait_on(), .n = n, .ng = ng, .host_group = host_group,
                        .match_group = match_group, .host_index = host_index, .match_index = match_index,
                        .match_op = match_op, .what = what, .blocked_s = blocked_s};
    for (int r = 0; same && in_wait && r < size; r++)
      if (r != tpsh_rt.rank && got[r]) tpsh_wd_find_deadlock(&rep[r], &me);
    for (int r = 0; same && r < size; r++) {
      if (!got[r] || !rep[r].at_exchange || rep[r].test != test) continue;
      int64_t issued;
      char why[512];
      for (int i = 0; i < n; i++)
        if (never_joined(&tpsh_wd_snap[i], &rep[r], ng, &issued)) {
          snprintf(why, sizeof why, "this rank's %s (seq %llu of group %llu) is collective #%lld of the group "
                   "(counted from 0, sends and receives aside), and rank %d has issued %lld there: it will not "
                   "join it", tpsh_wd_snap[i].op, (unsigned long long)tpsh_wd_snap[i].seq,
                   (unsigned long long)tpsh_wd_snap[i].group_id, (long long)tpsh_wd_snap[i].coll_index, r,
                   (long long)issued);
          fire_peer(&rep[r], why, what, blocked_s, n);
        }
      for (int i = 0; i < n; i++) {
        uint64_t mine_p2p, theirs_p2p;
        if (!p2p_never_matched(&tpsh_wd_snap[i], &rep[r], ng, r, &mine_p2p, &theirs_p2p)) continue;
        int send = tpsh_wd_snap[i].kind == TPSH_C_SEND;
        snprintf(why, sizeof why, "this rank's %s (seq %llu of group %llu) %s rank %d will not complete: this rank "
                 "has issued %llu %s rank %d, and rank %d has issued %llu %s this rank", tpsh_wd_snap[i].op,
                 (unsigned long long)tpsh_wd_snap[i].seq, (unsigned long long)tpsh_wd_snap[i].group_id,
                 send ? "to" : "from", r,
                 (unsigned long long)mine_p2p, send ? "sends to" : "receives from", r, r,
                 (unsigned long long)theirs_p2p, send ? "receives from" : "sends to");
        fire_peer(&rep[r], why, what, blocked_s, n);
      }
      if (match_index >= 0 && tpsh_wd_never_joins(match_group, match_index, 0, &rep[r], ng, &issued)) {
        snprintf(why, sizeof why, "this rank's %s is collective #%lld of group %llu (counted from 0, sends and "
                 "receives aside), which check mode compares with every member before it is enqueued, and rank "
                 "%d has issued %lld there: it will not join it", match_op ? match_op : "collective",
                 (long long)match_index, (unsigned long long)match_group, r, (long long)issued);
        fire_peer(&rep[r], why, what, blocked_s, n);
      }
      if (host_index >= 0 && tpsh_wd_never_joins(host_group, host_index, 1, &rep[r], ng, &issued)) {
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
 * for that long has its process stopped (SIGSTOP, a debugger) or its host hung, and the others would
 * wait for it for ever. */
enum { SILENT_ASKS = 3 };

static void fire_silent(int r, int asks, double waited_s) {
  outbuf o = {0};
  tpsh_wd_out(&o, "tpsh: rank %d has answered none of this rank's last %d questions (its watchdog answers within a "
      "second while its process runs: the process is stopped or gone, or its host hung or unreachable), and this "
      "rank has waited for the others at the end of the script for %.1f s (--timeout %g)", r, asks, waited_s,
      tpsh_watchdog_timeout());
  tpsh_wd_end_every_rank(&o, "tpsh: ending every rank (MPI_Abort, status 1)", 1);
}

void tpsh_wd_check_end_silence(double now) {
  static double last_ask;
  static uint64_t serial;
  static int *silent;
  int size = tpsh_rt.size;
  if (size < 2 || tpsh_wd_comm == MPI_COMM_NULL || !tpsh_wd_host_waiting()) return;
  double since = tpsh_wd_wait_since();
  uint64_t sn = tpsh_wd_wait_serial();
  if (now - since < tpsh_watchdog_timeout() * 1e3 || now - last_ask < PEER_GRACE_MS) return;
  if (!silent && !(silent = calloc((size_t)size, sizeof *silent))) return;
  if (sn != serial) {                           /* another wait at the end (the p2p comparison's, then the last) */
    serial = sn;
    memset(silent, 0, (size_t)size * sizeof *silent);
  }
  last_ask = now;
  wd_status *rep = calloc((size_t)size, sizeof *rep);
  int *got = calloc((size_t)size, sizeof *got);
  if (rep && got) {
    tpsh_wd_ask_others(rep, got, size);
    for (int r = 0; r < size; r++) {
      if (r == tpsh_rt.rank) continue;
      silent[r] = got[r] ? 0 : silent[r] + 1;
      /* still at the end, in the same wait: the answers may have come as the wait ended */
      if (silent[r] >= SILENT_ASKS && __atomic_load_n(&tpsh_wd_at_script_end, __ATOMIC_ACQUIRE) &&
          tpsh_wd_wait_serial() == sn)
        fire_silent(r, silent[r], (tpsh_now_ms() - since) / 1e3);
    }
  }
  free(rep);
  free(got);
}
