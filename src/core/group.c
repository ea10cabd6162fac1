/*
 * group.c: groups of ranks and the host-side exchange of bytes between them (the transport under
 * tp.allgather / tp.gather / tp.bcast of Lua values, which Lua serialises with string.buffer).
 */
#include "group.h"
#include <stdlib.h>
#include <string.h>

static tpsh_group *world;

static int mpi_fail(int err, const char *call) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  return tpsh_error(TPSH_ECOMM, "%s failed: %s", call, msg);
}
#define MPI_CHECK(call) do { int e_ = (call); if (e_ != MPI_SUCCESS) return mpi_fail(e_, #call); } while (0)

tpsh_group *tpsh_group_from_comm(MPI_Comm comm) {
  tpsh_group *g = calloc(1, sizeof *g);
  if (!g) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  g->refcount = 1;
  g->host_comm = comm;
  MPI_Comm_rank(comm, &g->rank);
  MPI_Comm_size(comm, &g->size);
  MPI_Comm_dup(comm, &g->dev_comm);
  g->world_ranks = calloc((size_t)g->size, sizeof *g->world_ranks);
  if (!g->world_ranks) { free(g); return tpsh_error_null(TPSH_ENOMEM, "out of host memory"); }
  int wr;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Allgather(&wr, 1, MPI_INT, g->world_ranks, 1, MPI_INT, comm);
  return g;
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

void tpsh_group_release(tpsh_group *g) {
  if (!g || --g->refcount > 0) return;
  if (g->comm_stream) tpsh_stream_release(g->comm_stream);
  /* Freeing communicators is collective in spirit; after MPI_Finalize it is not allowed at all. */
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Comm_free(&g->dev_comm);
    MPI_Comm_free(&g->host_comm);
  }
  if (g == world) world = NULL;
  free(g->world_ranks);
  free(g);
}

void tpsh_world_shutdown(void) {
  if (world) { tpsh_group *w = world; world = NULL; tpsh_group_release(w); }
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

/* Variable-length gather (allgather when root < 0). lens[r] receives rank r's length. */
static int gatherv(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *lens) {
  int rc = check_group(g);
  if (rc == TPSH_OK) rc = check_len(len);
  if (rc) return rc;
  int n = g->size, me = len, receives = root < 0 || root == g->rank;
  int *counts = calloc((size_t)n, sizeof *counts), *displs = calloc((size_t)n, sizeof *displs);
  if (!counts || !displs) { free(counts); free(displs); return tpsh_error(TPSH_ENOMEM, "out of host memory"); }
  int e = root < 0 ? MPI_Allgather(&me, 1, MPI_INT, counts, 1, MPI_INT, g->host_comm)
                   : MPI_Gather(&me, 1, MPI_INT, counts, 1, MPI_INT, root, g->host_comm);
  int64_t total = 0;
  if (e == MPI_SUCCESS && receives) {
    for (int r = 0; r < n; r++) { displs[r] = (int)total; total += counts[r]; lens[r] = counts[r]; }
    if (total > INT32_MAX) e = MPI_ERR_COUNT;
  }
  char *all = NULL;
  if (e == MPI_SUCCESS && receives && !(all = malloc((size_t)total + 1))) e = MPI_ERR_NO_MEM;
  if (e == MPI_SUCCESS)
    e = root < 0 ? MPI_Allgatherv(buf, me, MPI_BYTE, all, counts, displs, MPI_BYTE, g->host_comm)
                 : MPI_Gatherv(buf, me, MPI_BYTE, all, counts, displs, MPI_BYTE, root, g->host_comm);
  free(counts);
  free(displs);
  if (e != MPI_SUCCESS) { free(all); return mpi_fail(e, root < 0 ? "MPI_Allgatherv" : "MPI_Gatherv"); }
  *out = all;
  return TPSH_OK;
}

int tpsh_host_allgather(tpsh_group *g, const void *buf, int64_t len, void **out, int64_t *lens) {
  return gatherv(g, buf, len, -1, out, lens);
}

int tpsh_host_gather(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *lens) {
  if (g && (root < 0 || root >= g->size))
    return tpsh_error(TPSH_EINVAL, "root %d is outside the group of %d ranks", root, g->size);
  *out = NULL;
  return gatherv(g, buf, len, root, out, lens);
}

int tpsh_host_bcast(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *out_len) {
  int rc = check_group(g);
  if (rc) return rc;
  if (root < 0 || root >= g->size)
    return tpsh_error(TPSH_EINVAL, "root %d is outside the group of %d ranks", root, g->size);
  int64_t n = g->rank == root ? len : 0;
  if (g->rank == root && (rc = check_len(len))) n = -1;   /* tell the others to give up too */
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, root, g->host_comm));
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

int tpsh_host_barrier(tpsh_group *g) {
  int rc = check_group(g);
  if (rc) return rc;
  MPI_CHECK(MPI_Barrier(g->host_comm));
  return TPSH_OK;
}

void tpsh_free_buffer(void *p) { free(p); }
