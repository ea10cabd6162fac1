/*
 * group.c: groups of ranks (the world, tp.new_group, g:split). Creating a group is collective, on the
 * Lua thread, over the parent's host communicator; the backend then sets up its side (group_init) over
 * the new group's ranks. A creation is a host-side exchange (host_exchange.c), timed by the watchdog:
 * a rank that skips tp.new_group or g:split would otherwise leave the others in MPI forever.
 */
#include "core/backend.h"
#include "core/group.h"
#include "core/check.h"
#include "core/text.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tpsh_group *world;
static uint64_t next_group_id = 1;   /* above every id this rank has given a group */

int tpsh_mpi_fail_noting(int err, const char *call, const char *note) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  return tpsh_error(TPSH_ECOMM, "%s failed: %s%s", call, msg, note);
}
static int mpi_fail(int err, const char *call) { return tpsh_mpi_fail_noting(err, call, ""); }
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
  return tpsh_mpi_fail_noting(err, call, note);
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
    /* an invalid list is the mistake to name first: where it is rank 0's, the comparison would say "rank 0
     * passed {}" (what an invalid list sends), a list that rank never passed */
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
  int rc = tpsh_host_exchange_begin(world, "tp.new_group (collective over the world: every rank must call it)");
  if (rc) return rc;
  rc = new_group(n, ranks, out);
  tpsh_host_exchange_end();
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
  int rc = tpsh_host_exchange_begin(parent, "group:split (collective over the group: every member must call it)");
  if (rc) return rc;
  rc = group_split(parent, color, key, out);
  tpsh_host_exchange_end();
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
