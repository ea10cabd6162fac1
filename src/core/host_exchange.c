/*
 * host_exchange.c: the host-side exchange of bytes between the members of a group (the transport under
 * tp.allgather / tp.gather / tp.bcast of Lua values, which Lua serialises with string.buffer, and
 * tp.barrier), and the host's waits for MPI that do not hold a core (tpsh_host_wait, tpsh_host_probe).
 * Every exchange is a host wait of the watchdog (tpsh_host_exchange_begin): a rank that skips one would
 * otherwise leave the others in MPI forever.
 */
#include "core/group.h"
#include "core/graph.h"
#include "core/nap.h"
#include "core/check.h"
#include "core/host_ending.h"
#include "core/intern.h"
#include "core/trace.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mpi_fail(int err, const char *call) { return tpsh_mpi_fail_noting(err, call, ""); }
#define MPI_CHECK(call) do { int e_ = (call); if (e_ != MPI_SUCCESS) return mpi_fail(e_, #call); } while (0)

/* ==== waits that do not hold a core ============================================================== */
typedef struct host_poll { MPI_Request *q; int source, tag; MPI_Comm comm; MPI_Status *st; } host_poll;

/* One poll of what the host waits for: a request's completion (p->q) or a message's arrival. */
static int poll_once(const host_poll *p, int *done) {
  return p->q ? MPI_Test(p->q, done, MPI_STATUS_IGNORE) : MPI_Iprobe(p->source, p->tag, p->comm, done, p->st);
}

/* Waits for what p polls (tpsh_host_wait: request q, started by an MPI_I* call that returned e;
 * tpsh_host_probe: a message) without holding a core. MPICH's blocking calls busy-poll, so a rank
 * waiting in tp.barrier, tp.allgather or at the end of the script for a rank that still computes would
 * take a core from it: with more ranks and stream workers than cores (mpiexec -n 16 on a 2-core laptop)
 * the working rank would get its share of the cores and no more (100 256^3 matmuls on rank 0: 640 ms
 * with 15 ranks busy-polling in a barrier, 56 alone). For the first millisecond it polls back to back,
 * as the blocking call does, so that ranks arriving together leave together; then it naps between
 * polls, 10 us doubling up to 1 ms, as the REPL waits for its messages.
 * Once a thread that ends the run asks for the host (host_ending.c), it gives way: TPSH_HOST_WAIT_ENDED,
 * the request left pending (the run ends). */
static int host_poll_wait(const host_poll *p) {
  double t0 = tpsh_now_ms();
  int us = 10;
  for (;;) {
    int done = 0;
    int e = poll_once(p, &done);
    if (e != MPI_SUCCESS || done) return e;
    if (tpsh_now_ms() - t0 >= 1.0) {
      if (tpsh_host_ending_asked()) return TPSH_HOST_WAIT_ENDED;
      tpsh_nap(&us, 1000);
    }
  }
}

int tpsh_host_wait(int e, MPI_Request *q) {
  return e != MPI_SUCCESS ? e : host_poll_wait(&(host_poll){.q = q});
}

/* MPI_Probe waited for as tpsh_host_wait waits (polled, napping after the first millisecond, giving way
 * with TPSH_HOST_WAIT_ENDED to a thread that ends the run): check mode's comparisons. */
int tpsh_host_probe(int source, int tag, MPI_Comm comm, MPI_Status *st) {
  return host_poll_wait(&(host_poll){.source = source, .tag = tag, .comm = comm, .st = st});
}

/* A host-side exchange on g (every member must make it, in the same order): a timed host wait, and
 * numbered for the watchdog, which in `tpsh test` compares the number with the other ranks' counts.
 * The exchange's own calls are MPI's blocking ones, so the members first wait for each other in an
 * MPI_Ibarrier, without spinning (tpsh_host_wait), and the blocking calls then find every member there.
 * The exchanges themselves stay blocking: MPICH pairs nonblocking collectives by their order alone, so a
 * rank in tp.barrier and one in tp.bcast (MPI_Ibarrier against MPI_Iallreduce) completed each other's
 * calls, and tp.bcast raised a wrong error, where blocking calls of two kinds wait, and the watchdog
 * names the two exchanges. Every exchange begins with the same MPI_Ibarrier, which always pairs. (Its
 * error, a member gone, shows again in the exchange's own calls.) */
void tpsh_host_exchange_end(void) {
  tpsh_watch_wait_end();
  tpsh_flight_host_exchange(NULL, -1);
}

/* 0, or TPSH_EENDED where the wait gave way to a thread that ends the run (host_ending.c: the host then
 * writes its --trace records): the exchange is over then, ended here. */
int tpsh_host_exchange_begin(tpsh_group *g, const char *what) {
  if (tpsh_graph_capturing) return tpsh_graph_refuse("exchanges with the other ranks on the host");
  tpsh_flight_host_exchange(g, (int64_t)g->host_exchanges++);
  tpsh_watch_wait_begin(what);
  MPI_Request q;
  if (tpsh_host_wait(MPI_Ibarrier(g->host_comm, &q), &q) != TPSH_HOST_WAIT_ENDED) return TPSH_OK;
  tpsh_host_exchange_end();
  return tpsh_host_ending_gave_way(what);
}

/* ==== host-side exchange ========================================================================= */
static int check_group(const tpsh_group *g) {
  return g ? TPSH_OK : tpsh_error(TPSH_EINVAL, "expected a group");
}

static int check_len(int64_t len) {
  if (len < 0 || len > INT32_MAX)
    return tpsh_error(TPSH_EINVAL, "message of %lld bytes is outside [0, 2^31)", (long long)len);
  return TPSH_OK;
}

/* Every member must pass the same root: MPI leaves a disagreement undefined, and MPICH pairs the
 * messages of one call with a later call's (tp.bcast returns another call's value) or waits forever.
 * One small allreduce of (root, -root) tells every member whether the roots differ, so that all of them
 * raise the same error. It comes before the root's range is checked: a root outside the group on some
 * members only (-1 where the caller had no valid root to pass; it raises why) fails every member here,
 * where a check before it would make those raise alone and leave the others waiting in the exchange. */
static int agree_root(tpsh_group *g, int root) {
  if (root < 0) root = -1;                     /* one value for every negative root: -INT_MIN overflows */
  int mine[2] = {root, -root}, all[2];
  MPI_CHECK(MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, g->host_comm));
  /* -1 is no root a caller passed (it names none; that member raises its own why): not shown as one */
  if (all[0] != -all[1] && -all[1] < 0)
    return tpsh_error(TPSH_EINVAL, "another member of the group passed no valid root (it raises why): every member "
                      "must pass the same rank in [0, %d), and this rank passed %d", g->size, root);
  if (all[0] != -all[1] && all[0] >= g->size)
    return tpsh_error(TPSH_EINVAL, "a member of the group passed a root outside it (from %d to %d; this rank %d): "
                      "every member must pass the same rank in [0, %d)", -all[1], all[0], root, g->size);
  if (all[0] != -all[1])
    return tpsh_error(TPSH_EINVAL, "the ranks passed different roots (from %d to %d; this rank %d): every "
                      "member of the group must pass the same one", -all[1], all[0], root);
  if (root < 0 || root >= g->size)
    return tpsh_error(TPSH_EINVAL, "root %d is outside the group of %d ranks", root, g->size);
  return TPSH_OK;
}

/* The first member whose length is negative (it cannot send: see gatherv), with a message for this
 * rank; TPSH_OK when every member can send and the whole fits one MPI count. */
static int lengths_ok(const tpsh_group *g, const int *counts, int mine_rc) {
  int first = -1, more = 0;
  int64_t total = 0;
  for (int r = 0; r < g->size; r++) {
    if (counts[r] >= 0) total += counts[r];
    else if (first < 0) first = r;
    else more++;
  }
  if (first < 0 && total <= INT32_MAX) return TPSH_OK;
  if (mine_rc) return mine_rc;                            /* this rank's own reason */
  if (first == g->rank) return TPSH_OK;                   /* len -1: the caller raises why */
  if (first < 0)
    return tpsh_error(TPSH_EINVAL, "the ranks' values add up to %lld bytes, more than one exchange carries (2^31)",
                      (long long)total);
  char others[48] = "";
  if (more) snprintf(others, sizeof others, " (and %d other rank%s)", more, more > 1 ? "s" : "");
  return tpsh_error(TPSH_EINVAL, "rank %d of the group%s cannot send its value (it raised the error that says why)",
                    first, others);
}

/* Variable-length gather (allgather when root < 0). lens[r] receives rank r's length. len -1: this
 * rank has nothing to send (its value could not be serialised; the caller raises why). Every member
 * learns every length first, the root's gather included: a member that cannot send (len -1, or a
 * message too large) still takes part with a negative length, and every member then raises instead of
 * waiting for bytes that are never sent (until the watchdog's timeout). */
static int gatherv(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *lens) {
  int rc = check_group(g);
  if (rc) return rc;
  int mine_rc = len == -1 ? TPSH_OK : check_len(len);
  int n = g->size, me = len == -1 ? -1 : mine_rc ? -2 : (int)len, receives = root < 0 || root == g->rank;
  int *counts = calloc((size_t)n, sizeof *counts), *displs = calloc((size_t)n, sizeof *displs);
  if (!counts || !displs) { free(counts); free(displs); return tpsh_error(TPSH_ENOMEM, "out of host memory"); }
  const char *call = "MPI_Allgather";
  int e = MPI_Allgather(&me, 1, MPI_INT, counts, 1, MPI_INT, g->host_comm);
  if (e == MPI_SUCCESS && ((rc = lengths_ok(g, counts, mine_rc)) || me < 0)) {
    free(counts);
    free(displs);
    return rc;
  }
  int64_t total = 0;
  if (e == MPI_SUCCESS && receives)
    for (int r = 0; r < n; r++) { displs[r] = (int)total; total += counts[r]; lens[r] = counts[r]; }
  char *all = NULL;
  if (e == MPI_SUCCESS && receives && !(all = malloc((size_t)total + 1))) e = MPI_ERR_NO_MEM;
  if (e == MPI_SUCCESS) {
    call = root < 0 ? "MPI_Allgatherv" : "MPI_Gatherv";
    e = root < 0 ? MPI_Allgatherv(buf, me, MPI_BYTE, all, counts, displs, MPI_BYTE, g->host_comm)
                 : MPI_Gatherv(buf, me, MPI_BYTE, all, counts, displs, MPI_BYTE, root, g->host_comm);
  }
  free(counts);
  free(displs);
  if (e != MPI_SUCCESS) { free(all); return mpi_fail(e, e == MPI_ERR_NO_MEM ? "malloc" : call); }
  *out = all;
  return TPSH_OK;
}

int tpsh_host_allgather(tpsh_group *g, const void *buf, int64_t len, void **out, int64_t *lens) {
  int rc = check_group(g);
  if (rc) return rc;
  rc = tpsh_host_exchange_begin(g, "tp.allgather (a host-side exchange)");   /* the watchdog times host waits */
  if (rc) return rc;
  rc = gatherv(g, buf, len, -1, out, lens);
  tpsh_host_exchange_end();
  return rc;
}

int tpsh_host_gather(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *lens) {
  *out = NULL;
  int rc = check_group(g);
  if (rc) return rc;
  rc = tpsh_host_exchange_begin(g, "tp.gather (a host-side exchange)");
  if (rc) return rc;
  rc = agree_root(g, root);
  if (rc == TPSH_OK) rc = gatherv(g, buf, len, root, out, lens);
  tpsh_host_exchange_end();
  return rc;
}

static int bcast(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *out_len) {
  int rc = TPSH_OK;
  int64_t n = g->rank == root ? len : 0;
  if (g->rank == root && len == -1) n = -2;                /* nothing to send: the others give up */
  else if (g->rank == root && (rc = check_len(len))) n = -1;   /* tell the others to give up too */
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, root, g->host_comm));
  if (n == -2)
    return tpsh_error(TPSH_EINVAL, "the root (rank %d of the group) cannot send its value (it raised the error "
                      "that says why)", root);
  if (n < 0) return rc ? rc : tpsh_error(TPSH_EINVAL, "the root's message was too large");
  char *data = malloc((size_t)n + 1);
  if (!data) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  if (g->rank == root) memcpy(data, buf, (size_t)n);
  int e = MPI_Bcast(data, (int)n, MPI_BYTE, root, g->host_comm);
  if (e != MPI_SUCCESS) { free(data); return mpi_fail(e, "MPI_Bcast"); }
  *out = data;
  *out_len = n;
  return TPSH_OK;
}

int tpsh_host_bcast(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *out_len) {
  int rc = check_group(g);
  if (rc) return rc;
  *out = NULL;
  /* A non-root waits for the root's bytes: when the root never calls, only the watchdog ends it. */
  rc = tpsh_host_exchange_begin(g, "tp.bcast (a host-side exchange)");
  if (rc) return rc;
  rc = agree_root(g, root);
  if (rc == TPSH_OK) rc = bcast(g, buf, len, root, out, out_len);
  tpsh_host_exchange_end();
  return rc;
}

int tpsh_host_barrier(tpsh_group *g, const char *what) {
  int rc = check_group(g);
  if (rc) return rc;
  /* the watchdog may read the name after the Lua string it came from is collected: an interned copy */
  const char *name = what ? tpsh_intern(what, NULL) : NULL;
  /* a host block as tp.synchronize's is, traced: else the host track shows nothing while a rank waits
   * here for the others, as if its host were idle */
  double t0 = tpsh_trace_on ? tpsh_now_ms() : 0;
  rc = tpsh_host_exchange_begin(g, name ? name : "tp.barrier");
  if (rc) return rc;
  int e = MPI_Barrier(g->host_comm);
  tpsh_host_exchange_end();
  if (tpsh_trace_on) tpsh_trace_host("barrier", NULL, t0);
  MPI_CHECK(e);
  return TPSH_OK;
}

void tpsh_free_buffer(void *p) { free(p); }
