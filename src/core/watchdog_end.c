/*
 * watchdog_end.c: the end of a script (and of `tpsh test`'s run), where every rank waits for the others
 * and then they compare what they issued: their last collectives and the groups' digests, and their
 * sends and receives (p2p_ledger.c). The watchdog thread (watchdog.c) ends a rank that never comes.
 */
#include "core/watchdog.h"
#include "core/group.h"
#include "core/p2p_ledger.h"
#include "core/host_ending.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The end of a script is the one host wait without a timeout: a rank that finishes early may wait there
 * for as long as the others still work (minutes of post-processing on rank 0 are no hang). A rank that
 * never comes is stuck elsewhere, where its own watchdog times it, or cannot run at all, which its
 * silence tells (check_end_silence). */
static int compare_at_end(void);

static int compare_p2p_at_end(void) { return tpsh_p2p_ledger_compare(tpsh_wd_end_comm); }

/* Every rank waits at the end of the script for the others, then they compare (compare: their
 * collectives, or their sends and receives). last: the script's last exchange, after which the
 * watchdog asks the others nothing more; the sends' comparison comes before the wait for the streams,
 * in which a rank blocked behind a collective that another never issued must still be ended within
 * seconds (the question the watchdog asks then). */
static int end_exchange(int (*compare)(void), int last) {
  if (tpsh_rt.size < 2 || tpsh_wd_end_comm == MPI_COMM_NULL) return TPSH_OK;
  __atomic_store_n(&tpsh_wd_at_script_end, 1, __ATOMIC_RELEASE);
  tpsh_watch_exchange_begin("the end of the script, where every rank waits for the others", NULL);
  MPI_Request q;
  int e = tpsh_host_wait(MPI_Ibarrier(tpsh_wd_end_comm, &q), &q);   /* minutes, maybe: without holding a core */
  if (e == TPSH_HOST_WAIT_ENDED) {          /* the host writes its --trace records (host_ending.c) */
    tpsh_watch_wait_end();
    __atomic_store_n(&tpsh_wd_at_script_end, 0, __ATOMIC_RELEASE);
    return tpsh_host_ending_gave_way("the end of the script");
  }
  int rc = e == MPI_SUCCESS ? compare() : TPSH_OK;
  /* Past the barrier every rank goes on to the finish hooks and the shut-down: no more questions to the
   * others (a rank whose watchdog has stopped would leave them unanswered, and unreceived at finalize). */
  if (last) tpsh_watch_test(0);
  tpsh_watch_wait_end();
  __atomic_store_n(&tpsh_wd_at_script_end, 0, __ATOMIC_RELEASE);
  if (e != MPI_SUCCESS) return tpsh_error(TPSH_ECOMM, "the barrier at the end of the script failed in MPI (error %d)", e);
  return rc;
}

int tpsh_watch_end_of_script(void) { return end_exchange(compare_at_end, 1); }
int tpsh_watch_p2p_at_end(void) { return end_exchange(compare_p2p_at_end, 0); }

/* The end of a script, every rank past the barrier: each compares its last collectives with the other
 * members'. What it finds there, MPI or NCCL completed anyway (an op or a root that differs; NCCL takes
 * an all_reduce against a reduce on the GPU machine), and the script's results are not to be trusted:
 * an error, so that the run ends with a non-zero status. Where the last collectives agree, the groups'
 * digests (check.h) cover the earlier ones: a group with as many collectives on two ranks but another
 * digest had a difference before them. Every group with collectives is compared: one MPI_Allgather of
 * the last collectives and the number of groups (a few KB per rank), then one MPI_Allgatherv of the
 * groups' digests (40 bytes a group), on the end's own communicator. Each rank sends its digests sorted
 * by (id, members), so that a rank finds a group of another's by binary search: a script that made
 * thousands of groups costs milliseconds here, not a scan per group. Runs on the host thread: its own
 * snapshot, not the watchdog's. */
typedef struct end_head {
  coll_list colls;
  int64_t ngroups;
} end_head;

/* One rank's side of the end: its head and its digests, sorted. */
typedef struct end_view {
  const end_head *head;
  const tpsh_group_digest *g;
  int64_t ng;
} end_view;

static int digest_order(const void *a, const void *b) {
  const tpsh_group_digest *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->members < y->members ? -1 : x->members > y->members;
}

/* The first of v's digests whose id is id (members: that one too, unless any_members), NULL if none. */
static const tpsh_group_digest *find_group(const end_view *v, uint64_t id, uint64_t members, int any_members) {
  int64_t lo = 0, hi = v->ng;
  while (lo < hi) {               /* the first entry not below (id, members), or not below id */
    int64_t mid = lo + (hi - lo) / 2;
    const tpsh_group_digest *m = &v->g[mid];
    if (m->id < id || (m->id == id && !any_members && m->members < members)) lo = mid + 1;
    else hi = mid;
  }
  if (lo == v->ng || v->g[lo].id != id || (!any_members && v->g[lo].members != members)) return NULL;
  return &v->g[lo];
}

/* Whether a collective failed on group id, on this rank or on theirs: the transport told the script,
 * and its ranks may differ there on purpose (a test of that failure). A rank is a member of one group of
 * an id (split groups of other colours share it). */
static int failed_on(const end_view *mine, const end_view *theirs, uint64_t id) {
  const tpsh_group_digest *m = find_group(mine, id, 0, 1);
  if (!m) return 0;
  const tpsh_group_digest *t = find_group(theirs, id, m->members, 0);
  return m->failures || (t && t->failures);
}

/* A group that two ranks both list with as many collectives and different digests, and no failure on
 * either; NULL if none. */
static const tpsh_group_digest *digest_differs(const end_view *mine, const end_view *theirs) {
  for (int64_t i = 0; i < mine->ng; i++) {
    const tpsh_group_digest *m = &mine->g[i], *t = find_group(theirs, m->id, m->members, 0);
    if (t && t->collectives == m->collectives && t->digest != m->digest && !t->failures && !m->failures) return m;
  }
  return NULL;
}

/* Gathers every rank's digests (n of its own in g, sorted) into *all, and views[r] for each rank; the
 * heads are gathered already, so every rank takes the same branch. TPSH_OK with *all NULL and no
 * digests in views when they would not fit one MPI call (2^31 bytes: 50 million groups): the last
 * collectives are still compared. */
static int gather_digests(const tpsh_group_digest *g, const end_head *heads, end_view *views,
                          tpsh_group_digest **all) {
  int size = tpsh_rt.size, me = tpsh_rt.rank;
  int64_t total = 0;
  *all = NULL;
  for (int r = 0; r < size; r++) {
    views[r] = (end_view){.head = &heads[r]};
    total += heads[r].ngroups;
  }
  if (total > INT_MAX / (int64_t)sizeof **all) return TPSH_OK;
  int *counts = malloc((size_t)size * sizeof *counts), *displs = malloc((size_t)size * sizeof *displs);
  *all = malloc((size_t)(total ? total : 1) * sizeof **all);
  if (!counts || !displs || !*all) {      /* the others wait in the Allgatherv: the error ends every rank */
    free(counts), free(displs), free(*all);
    *all = NULL;
    return tpsh_error(TPSH_ENOMEM, "out of host memory comparing the ranks' collectives at the end of the script");
  }
  for (int r = 0, at = 0; r < size; r++) {
    counts[r] = (int)(heads[r].ngroups * (int64_t)sizeof **all);
    displs[r] = at;
    at += counts[r];
  }
  int ok = MPI_Allgatherv(g, counts[me], MPI_BYTE, *all, counts, displs, MPI_BYTE, tpsh_wd_end_comm);
  if (ok == MPI_SUCCESS)
    for (int r = 0; r < size; r++) {
      views[r].g = *all + displs[r] / (int)sizeof **all;
      views[r].ng = heads[r].ngroups;
    }
  free(counts);
  free(displs);
  if (ok != MPI_SUCCESS)
    return tpsh_error(TPSH_ECOMM, "comparing the ranks' collectives at the end of the script failed in MPI (error %d)", ok);
  return TPSH_OK;
}

static int compare_at_end(void) {
  int size = tpsh_rt.size, me = tpsh_rt.rank, rc = TPSH_OK;
  int ngroups = tpsh_groups_digests(NULL, 0);
  tpsh_flight_entry *e = malloc(TPSH_FLIGHT_RING * sizeof *e);
  tpsh_flight_group *groups = malloc(TPSH_FLIGHT_GROUPS * sizeof *groups);
  tpsh_group_digest *mine_g = malloc((size_t)(ngroups ? ngroups : 1) * sizeof *mine_g), *all_g = NULL;
  end_head *heads = calloc((size_t)size, sizeof *heads), *mine = calloc(1, sizeof *mine);
  end_view *views = calloc((size_t)size, sizeof *views);
  int n = 0, ng = 0;
  if (!e || !groups || !mine_g || !heads || !mine || !views) {
    /* the others wait in the exchange below: the error ends every rank (tp._finish raises it) */
    free(e), free(groups), free(mine_g), free(heads), free(mine), free(views);
    return tpsh_error(TPSH_ENOMEM, "out of host memory comparing the ranks' collectives at the end of the script");
  }
  n = tpsh_flight_snapshot(e, TPSH_FLIGHT_RING, groups, &ng);
  tpsh_wd_recent_collectives(e, n, &mine->colls);
  mine->ngroups = tpsh_groups_digests(mine_g, ngroups);
  qsort(mine_g, (size_t)mine->ngroups, sizeof *mine_g, digest_order);
  int ok = MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, heads, (int)sizeof *mine, MPI_BYTE, tpsh_wd_end_comm);
  if (ok != MPI_SUCCESS)
    rc = tpsh_error(TPSH_ECOMM, "comparing the ranks' collectives at the end of the script failed in MPI (error %d)", ok);
  else
    rc = gather_digests(mine_g, heads, views, &all_g);
  static const char *const COMPLETED = "and the transport completed it anyway: the script's results are not to be "
    "trusted (--check compares each collective before it is enqueued and raises at the call)";
  for (int r = 0; r < size && rc == TPSH_OK; r++) {
    const tpsh_coll_desc *theirs = NULL;
    const tpsh_flight_entry *x = r != me ? tpsh_wd_mismatch_with(&heads[r].colls, r, e, n, groups, ng, 1, &theirs) : NULL;
    if (!x || failed_on(&views[me], &views[r], x->group_id)) continue;
    char text[512];
    tpsh_wd_mismatch_text(text, sizeof text, x, theirs, r);
    rc = tpsh_error(TPSH_EINVAL, "the ranks issued different collectives: %s, %s", text, COMPLETED);
  }
  for (int r = 0; r < size && rc == TPSH_OK; r++) {
    const tpsh_group_digest *d = r != me ? digest_differs(&views[me], &views[r]) : NULL;
    if (!d) continue;
    rc = tpsh_error(TPSH_EINVAL, "the ranks issued different collectives: on group %llu this rank and rank %d each "
                    "issued %llu, and at least one of them differs in its kind, element type, count, root or reduce "
                    "op (one not among the last %d collectives that rank %d reported, which would have named it), %s",
                    (unsigned long long)d->id, r, (unsigned long long)d->collectives, STATUS_COLLS, r, COMPLETED);
  }
  free(e);
  free(groups);
  free(mine_g);
  free(all_g);
  free(heads);
  free(mine);
  free(views);
  return rc;
}
