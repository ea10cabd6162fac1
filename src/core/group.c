/*
 * group.c: groups of ranks (the world, tp.new_group, g:split) and the host-side exchange of bytes
 * between them (the transport under tp.allgather / tp.gather / tp.bcast of Lua values, which Lua
 * serialises with string.buffer). Creating a group is collective, on the Lua thread, over the parent's
 * host communicator; the backend then sets up its side (group_init) over the new group's ranks.
 * Every call here that waits for other ranks is a host wait of the watchdog (exchange_begin):
 * a rank that skips tp.new_group, g:split or an exchange would otherwise leave the others in MPI forever.
 */
#include "core/backend.h"
#include "core/group.h"
#include "core/nap.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static tpsh_group *world;
static uint64_t next_group_id = 1;   /* above every id this rank has given a group */

/* "<call> failed: <MPI's error string><note>" as the error; its status. */
static int mpi_fail_noting(int err, const char *call, const char *note) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  return tpsh_error(TPSH_ECOMM, "%s failed: %s%s", call, msg, note);
}
static int mpi_fail(int err, const char *call) { return mpi_fail_noting(err, call, ""); }
#define MPI_CHECK(call) do { int e_ = (call); if (e_ != MPI_SUCCESS) return mpi_fail(e_, #call); } while (0)

static int nzombies;

/* mpi_fail for a call that makes a communicator. MPI has a fixed supply of them (MPICH: about 2048
 * context ids; each group takes two), and tpsh keeps the communicators of dropped groups until the run
 * ends (see the zombies below): a program that makes a group per iteration runs out after about a
 * thousand, and the error says so. */
static int comm_fail(int err, const char *call) {
  char note[320];
  snprintf(note, sizeof note, " (this rank holds the communicators of %d dropped groups: tpsh frees them when the "
           "run ends, because freeing is collective and the garbage collector drops a group at a different moment "
           "on every rank; make groups once and reuse them)", nzombies);
  return mpi_fail_noting(err, call, note);
}

/* A new group's id, the same on every member: the largest of the members' next ids. Each rank counts
 * the creations it takes part in, and a split of a subgroup is one that the other ranks do not see, so
 * the counts drift apart; an agreed id names one group on all its members, and two groups that a rank
 * belongs to never share one. The watchdog compares collectives across ranks by (group id, collective
 * number), and the shut-down destroys groups in the order of their ids, which this keeps the same on
 * every member. One MPI_Allreduce on the new communicator, at a creation that is collective anyway. */
static int agree_id(tpsh_group *g) {
  uint64_t id = next_group_id;
  int e = MPI_Allreduce(MPI_IN_PLACE, &id, 1, MPI_UINT64_T, MPI_MAX, g->host_comm);
  if (e != MPI_SUCCESS) return mpi_fail(e, "MPI_Allreduce (the group's id)");
  g->id = id;
  next_group_id = id + 1;
  return TPSH_OK;
}

static tpsh_group *from_comm(MPI_Comm comm, tpsh_group *parent, int color);

static int backend_splits(void) { return tpsh_rt.be && tpsh_rt.be->group_split_out && tpsh_rt.be->group_split_ready; }

/* A backend that splits the parent's communicator (tpsh_backend.group_split_out): every rank of the
 * parent says whether it can take part (mine: TPSH_OK, or this rank's failure, whose message is set;
 * member: this rank is in the new group), and they agree, one MPI_Allreduce over the parent, so that
 * none is left in the split waiting for a rank that will not come. TPSH_OK where every rank can. */
enum { SPLIT_OK, SPLIT_SET_UP_FAILED, SPLIT_PARENT_FAILED };
static int agree_split(tpsh_group *parent, int mine, int member) {
  int code = mine == TPSH_OK ? SPLIT_OK : member ? SPLIT_SET_UP_FAILED : SPLIT_PARENT_FAILED;
  if (mine == TPSH_OK && tpsh_rt.be->group_split_ready(parent) != TPSH_OK) code = SPLIT_PARENT_FAILED;
  struct { int code, rank; } in = {code, tpsh_rt.rank}, worst;
  int e = MPI_Allreduce(&in, &worst, 1, MPI_2INT, MPI_MAXLOC, parent->host_comm);
  if (e != MPI_SUCCESS) return mpi_fail(e, "MPI_Allreduce (whether every rank can split the parent's communicator)");
  if (code != SPLIT_OK) return code == SPLIT_PARENT_FAILED ? TPSH_ECOMM : mine;   /* its own error is set */
  if (worst.code == SPLIT_OK) return TPSH_OK;
  return tpsh_error(TPSH_ECOMM, worst.code == SPLIT_PARENT_FAILED
                      ? "rank %d cannot split the parent group's communicator (its own error says why): no rank made the group"
                      : "rank %d could not set up its side of the new group (its own error says why): no rank made the group",
                    worst.rank);
}

/* The group of a communicator just made by a creation over parent (new_group: the world; split), this
 * rank's color there; *out stays NULL where this rank is not a member (c is MPI_COMM_NULL), which
 * still takes part in the backend's split of the parent's communicator. */
static int adopt(MPI_Comm c, tpsh_group *parent, int color, tpsh_group **out) {
  if (c == MPI_COMM_NULL) {
    if (!backend_splits()) return TPSH_OK;
    int rc = agree_split(parent, TPSH_OK, 0);
    if (rc == TPSH_OK) rc = tpsh_rt.be->group_split_out(parent);
    if (rc == TPSH_OK) return TPSH_OK;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tpsh_last_error());
    return tpsh_error(TPSH_ECOMM, "setting up the group's communicator (this rank is not a member): %s", msg);
  }
  tpsh_group *g = from_comm(c, parent, color);
  if (!g) return TPSH_ECOMM;
  int rc = agree_id(g);
  if (rc) { tpsh_group_release(g); return rc; }
  *out = g;
  return TPSH_OK;
}

#define CHECK_GROUP(g) do { if (!(g)) return tpsh_error(TPSH_EINVAL, "expected a group"); } while (0)

typedef struct host_poll { MPI_Request *q; int source, tag; MPI_Comm comm; MPI_Status *st; } host_poll;

/* One poll of what the host waits for: a request's completion (p->q) or a message's arrival. */
static int poll_once(const host_poll *p, int *done) {
  return p->q ? MPI_Test(p->q, done, MPI_STATUS_IGNORE) : MPI_Iprobe(p->source, p->tag, p->comm, done, p->st);
}

/* Waits for what p polls (tpsh_host_wait: request q, started by an MPI_I* call that returned e;
 * tpsh_host_probe: a message) without holding a core. MPICH's blocking calls busy-poll, so a rank
 * waiting in tp.barrier, tp.allgather or at the end of the script
 * for a rank that still computed took a core from it: with more ranks and stream workers than cores
 * (mpiexec -n 16 on a 2-core laptop) the working rank got its share of the cores and no more (100 256^3
 * matmuls on rank 0 took 640 ms with 15 ranks waiting in tp.barrier, 56 alone). For the first
 * millisecond it polls back to back, as the blocking call did, so that ranks arriving together leave
 * together; then it naps between polls, 10 us doubling up to 1 ms, as the REPL waits for its messages.
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
static void exchange_end(void) {
  tpsh_watch_wait_end();
  tpsh_flight_host_exchange(NULL, -1);
}

/* 0, or TPSH_EENDED where the wait gave way to a thread that ends the run (host_ending.c: the host then
 * writes its --trace records): the exchange is over then, ended here. */
static int exchange_begin(tpsh_group *g, const char *what) {
  tpsh_flight_host_exchange(g, (int64_t)g->host_exchanges++);
  tpsh_watch_wait_begin(what);
  MPI_Request q;
  if (tpsh_host_wait(MPI_Ibarrier(g->host_comm, &q), &q) != TPSH_HOST_WAIT_ENDED) return TPSH_OK;
  exchange_end();
  return tpsh_host_ending_gave_way(what);
}

int tpsh_host_exchange_begin(tpsh_group *g, const char *what) { return exchange_begin(g, what); }
void tpsh_host_exchange_end(void) { exchange_end(); }

/* Every group made and not yet destroyed (groups live until shut-down: see the zombies below), for
 * tpsh_groups_collectives_text. */
static tpsh_group **all_groups;
static int nall, capall;

static void remember(tpsh_group *g) {
  if (nall == capall) {
    int cap = capall ? 2 * capall : 16;
    tpsh_group **a = realloc(all_groups, (size_t)cap * sizeof *a);
    if (!a) return;            /* out of host memory: the group goes unlisted, nothing worse */
    all_groups = a;
    capall = cap;
  }
  all_groups[nall++] = g;
}

static void forget(tpsh_group *g) {
  for (int i = 0; i < nall; i++)
    if (all_groups[i] == g) { all_groups[i] = all_groups[--nall]; break; }
  if (nall == 0) { free(all_groups); all_groups = NULL; capall = 0; }
}

/* A group over comm, which it owns from here on (freed here too when the group cannot be made). */
tpsh_group *tpsh_group_from_comm(MPI_Comm comm) { return from_comm(comm, NULL, 0); }

static tpsh_group *from_comm(MPI_Comm comm, tpsh_group *parent, int color) {
  tpsh_group *g = calloc(1, sizeof *g);
  if (!g) {
    MPI_Comm_free(&comm);
    tpsh_error(TPSH_ENOMEM, "out of host memory");
    if (parent && backend_splits()) agree_split(parent, TPSH_ENOMEM, 1);   /* the others must not split */
    return NULL;
  }
  g->refcount = 1;
  g->host_comm = comm;
  g->dev_comm = MPI_COMM_NULL;
  MPI_Comm_rank(comm, &g->rank);
  MPI_Comm_size(comm, &g->size);
  /* The dup agrees on a context id over every member, so it fails on all of them alike (MPICH has about
   * 2048: see comm_fail). Unchecked, a failure left dev_comm null and the group failed at its first
   * collective instead. */
  int e = MPI_Comm_dup(comm, &g->dev_comm);
  if (e != MPI_SUCCESS) {
    g->dev_comm = MPI_COMM_NULL;
    comm_fail(e, "MPI_Comm_dup");
    goto fail;
  }
  g->world_ranks = calloc((size_t)g->size, sizeof *g->world_ranks);
  if (!g->world_ranks) { tpsh_error(TPSH_ENOMEM, "out of host memory"); goto fail; }
  int wr;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  e = MPI_Allgather(&wr, 1, MPI_INT, g->world_ranks, 1, MPI_INT, comm);
  if (e != MPI_SUCCESS) { mpi_fail(e, "MPI_Allgather (the group's world ranks)"); goto fail; }
  int rc = parent && backend_splits() ? agree_split(parent, TPSH_OK, 1) : TPSH_OK;
  if (rc == TPSH_OK && tpsh_rt.be && tpsh_rt.be->group_init) {
    g->split_parent = parent;
    g->split_color = color;
    rc = tpsh_rt.be->group_init(g);
    g->split_parent = NULL;                  /* not a reference: the parent may go first */
    if (rc == TPSH_OK) g->backend_ready = 1;
  }
  if (rc != TPSH_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tpsh_last_error());
    tpsh_group_release(g);
    return tpsh_error_null(TPSH_ECOMM, "setting up the group's communicator: %s", msg);
  }
  remember(g);
  return g;

fail:                                    /* the error is set; nothing of the group was shared yet */
  if (parent && backend_splits()) agree_split(parent, TPSH_ECOMM, 1);   /* the others must not split */
  if (g->dev_comm != MPI_COMM_NULL) MPI_Comm_free(&g->dev_comm);
  MPI_Comm_free(&g->host_comm);
  free(g->world_ranks);
  free(g);
  return NULL;
}

int tpsh_world_init(void) {
  MPI_Comm c;
  int e = MPI_Comm_dup(MPI_COMM_WORLD, &c);
  if (e != MPI_SUCCESS) return mpi_fail(e, "MPI_Comm_dup");
  world = tpsh_group_from_comm(c);
  return world ? TPSH_OK : TPSH_ENOMEM;
}

tpsh_group *tpsh_world(void) {
  if (!world) return tpsh_error_null(TPSH_EINVAL, "tpsh is not initialised");
  world->refcount++;
  return world;
}

void tpsh_group_retain(tpsh_group *g) { if (g) g->refcount++; }

/* Groups whose last reference went while tpsh runs. Their communicators are destroyed only at
 * shut-down: freeing an MPI communicator is collective in the standard's eyes, and ncclCommDestroy
 * finalises with the communicator's peers, but the garbage collector drops a group at a different
 * moment on every rank, so destroying it then can block one rank while the others wait for it in a
 * collective. At shut-down every rank destroys the same groups in the same order (by id). The cost: a
 * program that makes many groups keeps their communicators until it exits. */
static tpsh_group **zombies;
static int capzombies;            /* nzombies is above, for comm_fail */

static void group_destroy(tpsh_group *g) {
  /* The backend first waits for the collectives still queued on this group (they use dev_comm). */
  if (g->backend_ready) tpsh_rt.be->group_destroy(g);
  tpsh_group_batch_free(g);
  if (g->comm_stream) tpsh_stream_release(g->comm_stream);
  /* Freeing communicators is collective in spirit; after MPI_Finalize it is not allowed at all. */
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Comm_free(&g->dev_comm);
    MPI_Comm_free(&g->host_comm);
  }
  if (g == world) world = NULL;
  forget(g);
  free(g->world_ranks);
  free(g);
}

void tpsh_group_release(tpsh_group *g) {
  if (!g || --g->refcount > 0) return;
  if (tpsh_rt.initialized && g != world) {
    if (nzombies == capzombies) {
      int cap = capzombies ? 2 * capzombies : 16;
      tpsh_group **z = realloc(zombies, (size_t)cap * sizeof *z);
      if (!z) return;            /* out of host memory: keep the group (a leak, never a hang) */
      zombies = z;
      capzombies = cap;
    }
    zombies[nzombies++] = g;
    /* Its stream can go now (a worker thread on the CPU backend): nothing can enqueue on the group any
     * more, and the collectives queued there finish first. */
    if (g->comm_stream) { tpsh_stream_release(g->comm_stream); g->comm_stream = NULL; }
    return;
  }
  group_destroy(g);
}

static int by_id(const void *a, const void *b) {
  uint64_t x = (*(tpsh_group *const *)a)->id, y = (*(tpsh_group *const *)b)->id;
  return (x > y) - (x < y);
}

void tpsh_world_shutdown(void) {
  /* qsort's array argument is declared nonnull even for zero elements, and zombies is NULL until the
     first group is released. */
  if (nzombies > 1) qsort(zombies, (size_t)nzombies, sizeof *zombies, by_id);
  for (int i = 0; i < nzombies; i++) group_destroy(zombies[i]);
  free(zombies);
  zombies = NULL;
  nzombies = capzombies = 0;
  if (world) { tpsh_group *w = world; world = NULL; group_destroy(w); }
}

/* ==== new groups ================================================================================= */
static const char *ranks_str(int n, const int *r, char *buf, size_t len) {
  size_t used = (size_t)snprintf(buf, len, "{");
  for (int i = 0; i < n && used < len; i++) {
    if (i == 16 && n > 17) { used += (size_t)snprintf(buf + used, len - used, ", ... (%d ranks)", n); break; }
    used += (size_t)snprintf(buf + used, len - used, i ? ", %d" : "%d", r[i]);
  }
  if (used < len) snprintf(buf + used, len - used, "}");
  return buf;
}

/* Checks a list of world ranks locally (range, duplicates); returns 0 or writes why into msg. */
static int bad_ranks(int n, const int *ranks, int wsize, char *msg, size_t len) {
  if (n < 1) { snprintf(msg, len, "expected at least one rank, got %d", n); return 1; }
  char *seen = calloc((size_t)wsize, 1);
  if (!seen) { snprintf(msg, len, "out of host memory"); return 1; }
  int bad = 0;
  for (int i = 0; i < n && !bad; i++) {
    int r = ranks[i];
    if (r < 0 || r >= wsize) { snprintf(msg, len, "rank %d is outside the world: expected ranks in [0, %d)", r, wsize); bad = 1; }
    else if (seen[r]) { snprintf(msg, len, "rank %d appears twice", r); bad = 1; }
    else seen[r] = 1;
  }
  free(seen);
  return bad;
}

static int new_group(int n, const int *ranks, tpsh_group **out) {
  if (!world) return tpsh_error(TPSH_EINVAL, "tpsh is not initialised");
  char why[256] = "", a[256], b[256];
  int flags = bad_ranks(n, ranks, world->size, why, sizeof why);
  /* Every rank must pass the same list: compare with rank 0's, then agree on the outcome, so that a
   * mistake raises on every rank instead of leaving some of them inside MPI_Comm_create. */
  int n0 = n;
  MPI_CHECK(MPI_Bcast(&n0, 1, MPI_INT, 0, world->host_comm));
  int *r0 = calloc((size_t)(n0 > 0 ? n0 : 1), sizeof *r0);
  if (!r0) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  if (world->rank == 0 && n0 > 0) memcpy(r0, ranks, (size_t)n0 * sizeof *r0);
  int e = n0 > 0 ? MPI_Bcast(r0, n0, MPI_INT, 0, world->host_comm) : MPI_SUCCESS;
  if (e != MPI_SUCCESS) { free(r0); return mpi_fail(e, "MPI_Bcast"); }
  if (n != n0 || (n > 0 && memcmp(r0, ranks, (size_t)n * sizeof *r0) != 0)) flags |= 2;
  int all = 0;
  e = MPI_Allreduce(&flags, &all, 1, MPI_INT, MPI_BOR, world->host_comm);
  if (e != MPI_SUCCESS) { free(r0); return mpi_fail(e, "MPI_Allreduce"); }
  if (all) {
    int rc;
    if (flags & 1) rc = tpsh_error(TPSH_EINVAL, "%s", why);
    /* an invalid list is the mistake to name first: where it was rank 0's, "rank 0 passed {}" (what an
     * invalid list sends) was said, a list that rank never passed */
    else if (all & 1)
      rc = tpsh_error(TPSH_EINVAL, "another rank passed an invalid list of ranks (its own error says why); this "
                      "rank passed %s", ranks_str(n, ranks, a, sizeof a));
    else if (flags & 2)
      rc = tpsh_error(TPSH_EINVAL, "every rank must pass the same ranks: rank 0 passed %s, this rank %s",
                      ranks_str(n0, r0, a, sizeof a), ranks_str(n, ranks, b, sizeof b));
    else   /* all & 2: another rank's list differs from rank 0's */
      rc = tpsh_error(TPSH_EINVAL, "every rank must pass the same ranks: this rank passed %s, another rank "
                      "passed a different list", ranks_str(n, ranks, a, sizeof a));
    free(r0);
    return rc;
  }
  free(r0);
  MPI_Group wg, ng;
  MPI_CHECK(MPI_Comm_group(world->host_comm, &wg));
  e = MPI_Group_incl(wg, n, ranks, &ng);
  MPI_Group_free(&wg);
  if (e != MPI_SUCCESS) return mpi_fail(e, "MPI_Group_incl");
  MPI_Comm c = MPI_COMM_NULL;
  e = MPI_Comm_create(world->host_comm, ng, &c);
  MPI_Group_free(&ng);
  if (e != MPI_SUCCESS) return comm_fail(e, "MPI_Comm_create");
  return adopt(c, world, 0, out);                  /* not a member: no group, no error */
}

/* The whole creation is one host wait (nested waits keep the outer one): a rank that skips it leaves
 * the others in MPI_Bcast / MPI_Comm_create / the new group's set-up, and the watchdog must end them. */
int tpsh_new_group(int n, const int *ranks, tpsh_group **out) {
  *out = NULL;
  if (!world) return tpsh_error(TPSH_EINVAL, "tpsh is not initialised");
  int rc = exchange_begin(world, "tp.new_group (collective over the world: every rank must call it)");
  if (rc) return rc;
  rc = new_group(n, ranks, out);
  exchange_end();
  return rc;
}

static int group_split(tpsh_group *parent, int color, int key, tpsh_group **out) {
  MPI_Comm c = MPI_COMM_NULL;
  int e = MPI_Comm_split(parent->host_comm, color < 0 ? MPI_UNDEFINED : color, key, &c);
  if (e != MPI_SUCCESS) return comm_fail(e, "MPI_Comm_split");
  return adopt(c, parent, color, out);
}

int tpsh_group_split(tpsh_group *parent, int color, int key, tpsh_group **out) {
  *out = NULL;
  CHECK_GROUP(parent);
  int rc = exchange_begin(parent, "group:split (collective over the group: every member must call it)");
  if (rc) return rc;
  rc = group_split(parent, color, key, out);
  exchange_end();
  return rc;
}

uint64_t tpsh_group_id(const tpsh_group *g) { return g ? g->id : 0; }
void *tpsh_group_handle(tpsh_group *g) {
  return g && tpsh_rt.be->group_handle ? tpsh_rt.be->group_handle(g) : NULL;
}
uint64_t tpsh_group_seq(const tpsh_group *g) { return g ? g->seq : 0; }

tpsh_stream *tpsh_group_comm_stream(tpsh_group *g) {
  if (!g) return tpsh_error_null(TPSH_EINVAL, "expected a group");
  if (!g->comm_stream) {
    char name[32];
    snprintf(name, sizeof name, "comm%llu", (unsigned long long)g->id);
    g->comm_stream = tpsh_stream_create(TPSH_PRIORITY_HIGH, name);
    if (!g->comm_stream) return NULL;
  }
  tpsh_stream_retain(g->comm_stream);
  return g->comm_stream;
}

int tpsh_group_rank(const tpsh_group *g) { return g ? g->rank : -1; }
int tpsh_group_size(const tpsh_group *g) { return g ? g->size : 0; }
int tpsh_group_world_rank(const tpsh_group *g, int r) {
  return g && r >= 0 && r < g->size ? g->world_ranks[r] : -1;
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

/* Every member must pass the same root: MPI leaves a disagreement undefined, and MPICH paired the
 * messages of one call with a later call's (tp.bcast returned another call's value) or waited forever.
 * One small allreduce of (root, -root) tells every member whether the roots differ, so that all of them
 * raise the same error. It comes before the root's range is checked: a root outside the group on some
 * members only (-1 where the caller had no valid root to pass; it raises why) fails every member here,
 * where a check before it made those raise alone and left the others waiting in the exchange. */
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
 * waiting for bytes that are never sent (until the watchdog's timeout, as it was). */
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
  rc = exchange_begin(g, "tp.allgather (a host-side exchange)");   /* the watchdog times host waits */
  if (rc) return rc;
  rc = gatherv(g, buf, len, -1, out, lens);
  exchange_end();
  return rc;
}

int tpsh_host_gather(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *lens) {
  *out = NULL;
  int rc = check_group(g);
  if (rc) return rc;
  rc = exchange_begin(g, "tp.gather (a host-side exchange)");
  if (rc) return rc;
  rc = agree_root(g, root);
  if (rc == TPSH_OK) rc = gatherv(g, buf, len, root, out, lens);
  exchange_end();
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
  rc = exchange_begin(g, "tp.bcast (a host-side exchange)");
  if (rc) return rc;
  rc = agree_root(g, root);
  if (rc == TPSH_OK) rc = bcast(g, buf, len, root, out, out_len);
  exchange_end();
  return rc;
}

int tpsh_host_barrier(tpsh_group *g, const char *what) {
  int rc = check_group(g);
  if (rc) return rc;
  /* the watchdog may read the name after the Lua string it came from is collected: an interned copy */
  const char *name = what ? tpsh_intern(what, NULL) : NULL;
  /* a host block as tp.synchronize's is, traced: the host track showed nothing while a rank waited
   * here for the others, as if its host were idle */
  double t0 = tpsh_trace_on ? tpsh_now_ms() : 0;
  rc = exchange_begin(g, name ? name : "tp.barrier");
  if (rc) return rc;
  int e = MPI_Barrier(g->host_comm);
  exchange_end();
  if (tpsh_trace_on) tpsh_trace_host("barrier", NULL, t0);
  MPI_CHECK(e);
  return TPSH_OK;
}

void tpsh_free_buffer(void *p) { free(p); }

void tpsh_group_note_failure(tpsh_group *g) { __atomic_add_fetch(&g->failures, 1, __ATOMIC_RELAXED); }

int tpsh_groups_digests(tpsh_group_digest *out, int max) {
  int n = 0;
  for (int i = 0; i < nall && (!out || n < max); i++) {
    const tpsh_group *g = all_groups[i];
    if (!g->collectives) continue;
    if (!out) { n++; continue; }
    uint64_t members = 0xcbf29ce484222325ull;            /* FNV-1a over the world ranks */
    for (int r = 0; r < g->size; r++) members = (members ^ (uint64_t)(uint32_t)g->world_ranks[r]) * 0x100000001b3ull;
    out[n++] = (tpsh_group_digest){g->id, members, g->collectives, g->digest,
                                   __atomic_load_n(&g->failures, __ATOMIC_RELAXED)};
  }
  return n;
}

/* One line per group with collectives issued: "id world-ranks count digest failures", e.g.
 * "0 0,1,2 14 5f0c1e27a9b3d410 0". Members of a group issue the same collectives, so ranks whose counts
 * for one group differ have left a collective waiting, and ranks whose digests moved apart issued
 * different ones (`tpsh test` compares them after every test, the REPL after every command:
 * lua/tpsh/issued.lua). Split groups of different colours share an id, hence the members in the line. */
char *tpsh_groups_collectives_text(void) {
  tpsh_text t = {0};
  for (int i = 0; i < nall; i++) {
    const tpsh_group *g = all_groups[i];
    if (!g->collectives) continue;
    tpsh_text_appendf(&t, "%llu ", (unsigned long long)g->id);
    for (int r = 0; r < g->size; r++) tpsh_text_appendf(&t, "%s%d", r ? "," : "", g->world_ranks[r]);
    tpsh_text_appendf(&t, " %llu %016llx %llu\n", (unsigned long long)g->collectives, (unsigned long long)g->digest,
                      (unsigned long long)__atomic_load_n(&g->failures, __ATOMIC_RELAXED));
  }
  return tpsh_text_take(&t);
}
