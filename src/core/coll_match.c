/*
 * coll_match.c: the collective mismatch check of check mode.
 *
 * Before a launch is enqueued, every member of the group sends every other member what it is about to
 * issue (collective number on the group, op, dtype, element count, root, reduce op), one collective at
 * a time (a batch's k-th collective may meet another rank's k-th single call), and compares. A
 * mismatch is an error on every rank, naming the ranks and what each passed, before anything is
 * enqueued: without it, mismatched collectives hang (MPI, NCCL) or silently compute garbage.
 *
 * Transport: point-to-point messages with a tag of their own on the group's host communicator, not a
 * collective. Point-to-point and collective traffic never match each other in MPI, so this cannot be
 * confused with tp.allgather on the same communicator; and messages between two ranks with one tag
 * arrive in order, so the k-th check of one rank meets the k-th check of the others. A rank that never
 * comes leaves the others blocked here: the watchdog times that wait like any host wait, and, told which
 * collective the check compares (tpsh_flight_match), ends the run a second in where a member has finished
 * the script or the test, or waits in a host-side exchange this rank has not begun, with fewer collectives
 * on the group, as it does without check mode.
 *
 * Point-to-point calls (send, recv) involve their peers only, so they are left out of that exchange
 * (the others are not there), and the number compared is the group's count of collectives issued
 * (g->collectives, the coll_index that the watchdog and the runner quote), not g->seq (which counts
 * sends and receives too, and so may differ between ranks). A mismatch is an error on every rank
 * before anything is issued, so it leaves that count as it was on all of them. Instead
 * each send tells its peer what it sends (dtype, count) on a tag of its own, and each receive compares
 * what its peer says with what it expects: MPI would fill the first part of a larger receive without a
 * word, and NCCL would hang. The k-th send from a rank to a peer meets the peer's k-th receive from
 * it, as the transfers themselves do (messages of one tag between two ranks arrive in order).
 */
#include "core/check.h"
#include "core/group.h"
#include "core/coll_kinds.h"
#include "core/host_ending.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MATCH_TAG = 0x7c4e, P2P_TAG = 0x7c4f };

typedef tpsh_coll_desc match_entry;

static int has_root(int kind) {
  const tpsh_coll_kind_info *i = tpsh_coll_kind_of(kind);
  return i && i->peer == TPSH_CK_PEER_ROOT;
}
static int has_op(int kind) {
  const tpsh_coll_kind_info *i = tpsh_coll_kind_of(kind);
  return i && i->has_op;
}
static const char *kind_name(int k) { return tpsh_coll_kind_name(k); }

static const char *op_name(int op) {
  static const char *names[] = {"sum", "avg", "max", "min", "prod"};
  return op >= 0 && op <= TPSH_PROD ? names[op] : "?";
}

int tpsh_coll_desc_format(const tpsh_coll_desc *d, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s(%s, %lld elements", kind_name(d->kind), tpsh_dtype_name(d->dtype),
                   (long long)d->count);
  if (n >= 0 && (size_t)n < len && has_root(d->kind)) n += snprintf(buf + n, len - (size_t)n, ", root=%d", d->root);
  if (n >= 0 && (size_t)n < len && has_op(d->kind)) n += snprintf(buf + n, len - (size_t)n, ", op=%s", op_name(d->op));
  if (n >= 0 && (size_t)n < len) n += snprintf(buf + n, len - (size_t)n, ")");
  return n;
}

TPSH_HOT uint64_t tpsh_coll_digest_term(int64_t number, const tpsh_coll_args *c) {
  /* splitmix64's finaliser over the number, then the description folded in: what differs in any field
   * that tpsh_coll_desc_same compares changes the term */
  uint64_t w = (uint64_t)(uint8_t)c->kind | (uint64_t)(uint8_t)c->dtype << 8 |
               (uint64_t)(has_op(c->kind) ? (uint8_t)c->op : 0) << 16 |
               (uint64_t)(has_root(c->kind) ? (uint32_t)c->peer : 0) << 24;
  uint64_t h = (uint64_t)number + 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ w ^ (h >> 27)) * 0x94d049bb133111ebull;
  h = (h ^ (uint64_t)c->count ^ (h >> 31)) * 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

/* Each entry formatted, joined by "; ". */
static void describe(const match_entry *e, int n, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = 0;
  if (n == 0) { snprintf(buf, len, "no collective"); return; }
  for (int i = 0; i < n && used < len; i++) {
    if (i) used += (size_t)snprintf(buf + used, len - used, "; ");
    if (used < len) used += (size_t)tpsh_coll_desc_format(&e[i], buf + used, len - used);
  }
}

int tpsh_coll_desc_same(const tpsh_coll_desc *a, const tpsh_coll_desc *b) {
  if (a->number != b->number || a->kind != b->kind || a->dtype != b->dtype || a->count != b->count) return 0;
  if (has_root(a->kind) && a->root != b->root) return 0;
  if (has_op(a->kind) && a->op != b->op) return 0;
  return 1;
}

static int same(const match_entry *a, int na, const match_entry *b, int nb) {
  if (na != nb) return 0;
  for (int i = 0; i < na; i++)
    if (!tpsh_coll_desc_same(&a[i], &b[i])) return 0;
  return 1;
}

/* Exchanges this rank's entries with every other member; all[r], nall[r]: rank r's. Where the wait gives
 * way to a thread that ends the run (host_ending.c), the sends and their buffer are left as they are. */
static int exchange(tpsh_group *g, const match_entry *entries, int n, match_entry **all, int *nall) {
  int size = g->size, e = MPI_SUCCESS;
  int bytes = n * (int)sizeof *entries;
  if (size < 1 || n < 1) return tpsh_error(TPSH_EINVAL, "nothing to compare");
  MPI_Request *req = calloc((size_t)size, sizeof *req);
  match_entry *mine = calloc((size_t)n + 1, sizeof *mine);   /* the sends' own: it outlives a wait that gives way */
  if (!req || !mine) { free(req); free(mine); return tpsh_error(TPSH_ENOMEM, "out of host memory"); }
  memcpy(mine, entries, (size_t)n * sizeof *mine);
  for (int r = 0; r < size && e == MPI_SUCCESS; r++) {
    req[r] = MPI_REQUEST_NULL;
    if (r != g->rank) e = MPI_Isend(mine, bytes, MPI_BYTE, r, MATCH_TAG, g->host_comm, &req[r]);
  }
  tpsh_flight_match(g, (int64_t)mine->number, kind_name(mine->kind));   /* before the wait: the watchdog */
  tpsh_watch_wait_begin("the collective mismatch check (waiting for the other ranks' collective)");
  for (int r = 0; r < size && e == MPI_SUCCESS; r++) {
    if (r == g->rank) {
      all[r] = malloc((size_t)bytes + 1);
      if (all[r]) memcpy(all[r], mine, (size_t)bytes);
      nall[r] = n;
      continue;
    }
    MPI_Status st;
    int got = 0;
    e = tpsh_host_probe(r, MATCH_TAG, g->host_comm, &st);
    if (e == TPSH_HOST_WAIT_ENDED) {
      tpsh_watch_wait_end();
      tpsh_flight_match(NULL, -1, NULL);
      return tpsh_host_ending_gave_way("check mode's comparison");
    }
    if (e == MPI_SUCCESS) MPI_Get_count(&st, MPI_BYTE, &got);
    all[r] = malloc((size_t)got + 1);
    nall[r] = got / (int)sizeof *mine;
    if (e == MPI_SUCCESS) e = MPI_Recv(all[r], got, MPI_BYTE, r, MATCH_TAG, g->host_comm, MPI_STATUS_IGNORE);
  }
  tpsh_watch_wait_end();
  tpsh_flight_match(NULL, -1, NULL);
  for (int r = 0; r < size && e == MPI_SUCCESS; r++) e = MPI_Wait(&req[r], MPI_STATUS_IGNORE);
  free(req);
  free(mine);
  if (e != MPI_SUCCESS) return tpsh_error(TPSH_ECOMM, "the collective mismatch check failed in MPI (error %d)", e);
  return TPSH_OK;
}

typedef struct p2p_entry { int32_t dtype; int64_t count; } p2p_entry;
typedef struct p2p_sends { p2p_entry *out; MPI_Request *req; int n; } p2p_sends;

/* The sends of a launch announce themselves to their peers, nonblocking, before anything of the launch
 * waits: a batch that sends to and receives from the same peer (a ring) must not wait for a receive
 * check before its own send check is out, nor may a peer's receive check wait for this launch's
 * collective exchange. */
static int announce_sends(tpsh_group *g, int n, const tpsh_coll_args *c, p2p_sends *ps) {
  int nsend = 0, e = MPI_SUCCESS;
  for (int i = 0; i < n; i++) nsend += c[i].kind == TPSH_C_SEND && c[i].peer != g->rank;
  ps->n = 0;
  ps->out = calloc((size_t)nsend + 1, sizeof *ps->out);
  ps->req = calloc((size_t)nsend + 1, sizeof *ps->req);
  if (!ps->out || !ps->req) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  for (int i = 0; i < n && e == MPI_SUCCESS; i++) {
    if (c[i].kind != TPSH_C_SEND || c[i].peer == g->rank) continue;
    ps->out[ps->n] = (p2p_entry){.dtype = c[i].dtype, .count = c[i].count};
    e = MPI_Isend(&ps->out[ps->n], (int)sizeof ps->out[0], MPI_BYTE, c[i].peer, P2P_TAG, g->host_comm,
                  &ps->req[ps->n]);
    if (e == MPI_SUCCESS) ps->n++;
  }
  if (e != MPI_SUCCESS) return tpsh_error(TPSH_ECOMM, "the send/recv mismatch check failed in MPI (error %d)", e);
  return TPSH_OK;
}

static void sends_done(p2p_sends *ps) {
  for (int i = 0; i < ps->n; i++) MPI_Wait(&ps->req[i], MPI_STATUS_IGNORE);
  free(ps->out);
  free(ps->req);
}

/* Then its receives check what their peers announced (after the launch's collectives are compared: a
 * peer that issues those one by one announces its send only after them). */
static int check_receives(tpsh_group *g, int n, const tpsh_coll_args *c) {
  int e = MPI_SUCCESS, rc = TPSH_OK, any = 0;
  for (int i = 0; i < n; i++) any |= c[i].kind == TPSH_C_RECV && c[i].peer != g->rank;
  if (!any) return TPSH_OK;
  tpsh_watch_wait_begin("the send/recv mismatch check (waiting for the sending rank)");
  for (int i = 0; i < n && e == MPI_SUCCESS && rc == TPSH_OK; i++) {
    if (c[i].kind != TPSH_C_RECV || c[i].peer == g->rank) continue;
    p2p_entry in;
    tpsh_watch_wait_peer(g->world_ranks[c[i].peer]);
    MPI_Status st;
    e = tpsh_host_probe(c[i].peer, P2P_TAG, g->host_comm, &st);
    if (e == TPSH_HOST_WAIT_ENDED) {
      tpsh_watch_wait_end();
      return tpsh_host_ending_gave_way("check mode's comparison");
    }
    if (e == MPI_SUCCESS) e = MPI_Recv(&in, (int)sizeof in, MPI_BYTE, c[i].peer, P2P_TAG, g->host_comm, MPI_STATUS_IGNORE);
    if (e == MPI_SUCCESS && (in.dtype != c[i].dtype || in.count != c[i].count))
      rc = tpsh_error(TPSH_EINVAL, "send/recv mismatch on group %llu: rank %d sends %s x %lld elements to rank %d, "
                      "which receives %s x %lld elements", (unsigned long long)g->id, g->world_ranks[c[i].peer],
                      tpsh_dtype_name(in.dtype), (long long)in.count, g->world_ranks[g->rank],
                      tpsh_dtype_name(c[i].dtype), (long long)c[i].count);
  }
  tpsh_watch_wait_end();
  if (e != MPI_SUCCESS) return tpsh_error(TPSH_ECOMM, "the send/recv mismatch check failed in MPI (error %d)", e);
  return rc;
}

static int match_collectives(tpsh_group *g, int n, const tpsh_coll_args *c);

int tpsh_check_collectives_match(tpsh_group *g, int n, const tpsh_coll_args *c) {
  if (!g || g->size < 2) return TPSH_OK;
  p2p_sends ps = {0};
  int rc = announce_sends(g, n, c, &ps);
  if (rc == TPSH_OK) rc = match_collectives(g, n, c);
  if (rc == TPSH_OK) rc = check_receives(g, n, c);
  if (rc != TPSH_EENDED) sends_done(&ps);      /* (the run is being ended: no wait for them) */
  return rc;
}

static int match_collectives(tpsh_group *g, int n, const tpsh_coll_args *c) {
  match_entry *mine = calloc((size_t)n + 1, sizeof *mine);
  if (!mine) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (tpsh_coll_is_p2p(c[i].kind)) continue;
    mine[m] = (match_entry){.number = (uint64_t)g->collectives + (uint64_t)m, .kind = c[i].kind, .dtype = c[i].dtype,
                            .op = c[i].op, .root = c[i].peer, .count = c[i].count};
    m++;
  }
  if (m == 0) { free(mine); return TPSH_OK; }
  match_entry **all = calloc((size_t)g->size, sizeof *all);
  int *nall = calloc((size_t)g->size, sizeof *nall);
  int rc = all && nall ? TPSH_OK : tpsh_error(TPSH_ENOMEM, "out of host memory");
  /* One exchange per collective, in order, stopping at the first that differs: a rank may batch what
   * another issues call by call (NCCL allows it, and so does the CPU backend), so the k-th collective of
   * a batch meets the k-th single call of another rank, which comparing whole launches would refuse.
   * Stopping at the first difference leaves no message of this launch unread. */
  for (int k = 0; k < m && rc == TPSH_OK; k++) {
    for (int r = 0; r < g->size; r++) { free(all[r]); all[r] = NULL; }
    rc = exchange(g, &mine[k], 1, all, nall);
    if (rc != TPSH_OK) break;
    /* Group the ranks by what they passed; every rank builds the same message from the same data. */
    int *cls = calloc((size_t)g->size, sizeof *cls), ncls = 0;
    for (int r = 0; cls && r < g->size; r++) {
      cls[r] = -1;
      for (int q = 0; q < r && cls[r] < 0; q++)
        if (same(all[q], nall[q], all[r], nall[r])) cls[r] = cls[q];
      if (cls[r] < 0) cls[r] = ncls++;
    }
    if (ncls > 1) {
      char msg[4096], what[1024];
      size_t used = (size_t)snprintf(msg, sizeof msg, "collective mismatch on group %llu (collective #%llu of "
                                     "the group, counted from 0 as the watchdog and the runner count): the ranks "
                                     "passed different collectives",
                                     (unsigned long long)g->id, (unsigned long long)mine[k].number);
      for (int c = 0; c < ncls && used < sizeof msg; c++) {
        int first = -1;
        char ranks[512];
        size_t ru = 0;
        int cnt = 0;
        for (int r = 0; r < g->size && ru < sizeof ranks; r++)
          if (cls[r] == c) {
            if (first < 0) first = r;
            ru += (size_t)snprintf(ranks + ru, sizeof ranks - ru, "%s%d", cnt++ ? ", " : "", g->world_ranks[r]);
          }
        const match_entry *e = all[first];
        describe(e, nall[first], what, sizeof what);
        if (nall[first] > 0 && e[0].number != mine[k].number)
          snprintf(what + strlen(what), sizeof what - strlen(what), " as collective #%llu",
                   (unsigned long long)e[0].number);
        used += (size_t)snprintf(msg + used, sizeof msg - used, "; %s %s: %s", cnt > 1 ? "ranks" : "rank", ranks, what);
      }
      if (m > 1 && used < sizeof msg)
        snprintf(msg + used, sizeof msg - used, " (collective %d of this rank's batch of %d: none of it was issued)",
                 k + 1, m);
      rc = tpsh_error(TPSH_EINVAL, "%s", msg);
    }
    free(cls);
  }
  for (int r = 0; all && r < g->size; r++) free(all[r]);
  free(all);
  free(nall);
  free(mine);
  return rc;
}
