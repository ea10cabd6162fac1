/*
 * cuda_nccl.c: one NCCL communicator per group, and the collectives of tpsh_coll_args on it.
 *
 * The world's communicator is made from an ncclUniqueId that rank 0 creates and broadcasts over MPI.
 * Every other group is split from its parent's (ncclCommSplit: tp.new_group from the world's, g:split
 * from g's), as PyTorch does once a default group is bound to a device: no id travels, and NCCL reuses
 * the parent's topology detection. The split is collective over the parent, as tp.new_group and g:split
 * are: members call it in group_init, the parent's other ranks with NCCL_SPLIT_NOCOLOR in
 * group_split_out. Each member's key is its rank in the new MPI communicator, so that NCCL numbers the
 * ranks as MPI does. Resources are not shared with the parent (splitShare 0): a collective on a
 * subgroup must be able to overlap one on its parent, which is what tpsh measures. Before the split the
 * parent's ranks agree that each can take part (group_split_ready, group.c): a communicator aborted on
 * one rank fails the creation on all of them, rather than leave the others waiting in the split for a
 * rank that does not come.
 *
 * Collectives are enqueued on the tpsh stream given; a batch (g:batch, n > 1) between
 * ncclGroupStart/End. NCCL reports some failures only asynchronously (a peer that died, a network
 * error): every live communicator is registered here, and the host-wait paths of cuda_stream.c poll
 * them while they wait. A communicator with an error is aborted (its kernels stop spinning, so the
 * stream drains) and every later call on it fails with the first error; the script's next wait or
 * query reports it, even when a query of tpsh's own found it (tpsh_async_error_note). When the watchdog
 * gives up on a hung rank, it aborts every communicator through tpsh_watchdog_abort_hook before
 * MPI_Abort, for the same reason.
 *
 * The flight recorder's started/completed marks are not set here: knowing when a collective starts
 * and ends on the GPU takes two events per call, a cost on every small collective that tpsh is
 * measured on. Entries stay "enqueued", which the watchdog never mistakes for a hang; a hang is still
 * caught by its timing of host waits.
 */
#include "backend/cuda/cuda_backend.h"
#include <nccl.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct comm_entry {
  ncclComm_t comm;
  tpsh_group *g;            /* not retained: the group owns the entry and removes it in group_destroy */
  int aborted;
  char error[512];          /* the asynchronous error that aborted it */
  struct comm_entry *next;
} comm_entry;

static comm_entry *comms;
static int ncomms;

const char *tpsh_cuda_nccl_version(void) {
  static char buf[32];
  int v = 0;
  ncclGetVersion(&v);
  /* NCCL_VERSION_CODE is major*10000 + minor*100 + patch since 2.9 */
  snprintf(buf, sizeof buf, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
  return buf;
}

int tpsh_cuda_nccl_active(void) { return ncomms > 0; }

static int nccl_fail(ncclResult_t r, ncclComm_t comm, const char *call) {
  tpsh_watchdog_hold_if_ending();       /* failed because the watchdog aborted the communicator */
  const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
  return tpsh_error(TPSH_ECOMM, "%s failed on rank %d: %s (%s)", call, tpsh_rt.rank, ncclGetErrorString(r),
                    last && *last ? last : "no details");
}

TPSH_HOT static comm_entry *entry_of(tpsh_group *g) {
  comm_entry *e = g->backend_comm;
  return e;
}

/* ==== asynchronous errors ======================================================================== */
static int check_entry(comm_entry *e) {
  if (e->aborted) return tpsh_error(TPSH_ECOMM, "%s", e->error);
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(e->comm, &async);
  if (r != ncclSuccess) async = r;
  if (async == ncclSuccess || async == ncclInProgress) return TPSH_OK;
  const char *last = ncclGetLastError(e->comm);
  snprintf(e->error, sizeof e->error,
           "NCCL asynchronous error on rank %d (group of %d ranks, group rank %d): %s (%s); "
           "the communicator was aborted", tpsh_rt.rank, e->g->size, e->g->rank, ncclGetErrorString(async),
           last && *last ? last : "no details");
  ncclCommAbort(e->comm);
  e->aborted = 1;
  tpsh_group_note_failure(e->g);
  /* The query that found it may be one the script did not make (a Work ticket's reclaim, the tracer):
   * the script's next wait or query reports it (error.c). */
  tpsh_async_error_note(e->error);
  return tpsh_error(TPSH_ECOMM, "%s", e->error);
}

int tpsh_cuda_nccl_poll(void) {
  for (comm_entry *e = comms; e; e = e->next) {
    if (e->aborted) continue;       /* reported when it happened; its stream has drained since */
    int rc = check_entry(e);
    if (rc) return rc;
  }
  return TPSH_OK;
}

/* Runs on the watchdog's thread while the host thread may be blocked in a wait: the abort is what
 * releases it. Nothing is freed, since the process ends right after. */
static void abort_all(void) {
  for (comm_entry *e = comms; e; e = e->next)
    if (!e->aborted) {
      e->aborted = 1;
      snprintf(e->error, sizeof e->error, "the communicator was aborted by the watchdog on rank %d", tpsh_rt.rank);
      ncclCommAbort(e->comm);
    }
}

/* ==== communicators ============================================================================== */
static void add_entry(comm_entry *e, tpsh_group *g) {
  e->g = g;
  e->next = comms;
  comms = e;
  ncomms++;
  g->backend_comm = e;
  tpsh_watchdog_abort_hook = abort_all;
}

/* Whether this rank's side of parent's communicator can be split: not once it has failed (asked anew
 * here, as a wait would). The ranks agree on the answer before any of them splits. */
int tpsh_cuda_group_split_ready(tpsh_group *parent) {
  comm_entry *pe = entry_of(parent);
  if (!pe) return TPSH_OK;
  if (check_entry(pe) != TPSH_OK) {
    char msg[600];
    snprintf(msg, sizeof msg, "%s", tpsh_last_error());
    return tpsh_error(TPSH_ECOMM, "ncclCommSplit: the parent group's communicator has failed: %s", msg);
  }
  return TPSH_OK;
}

/* g's communicator split from its parent's (see the top of the file); *done 0 where the parent has
 * none (a backend that made it otherwise: then every rank makes g's from an id). */
static int split_from_parent(tpsh_group *g, int *done) {
  comm_entry *pe = g->split_parent ? entry_of(g->split_parent) : NULL;
  *done = 0;
  if (!pe) return TPSH_OK;
  comm_entry *e = calloc(1, sizeof *e);
  if (!e) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  config.splitShare = 0;
  ncclResult_t r = ncclCommSplit(pe->comm, g->split_color, g->rank, &e->comm, &config);
  if (r != ncclSuccess || !e->comm) {
    free(e);
    return r != ncclSuccess ? nccl_fail(r, pe->comm, "ncclCommSplit")
                            : tpsh_error(TPSH_ECOMM, "ncclCommSplit gave no communicator to a member on rank %d", tpsh_rt.rank);
  }
  add_entry(e, g);
  *done = 1;
  return TPSH_OK;
}

/* This rank is in no group of a creation over parent: it still takes part in the parent's split. */
int tpsh_cuda_group_split_out(tpsh_group *parent) {
  comm_entry *pe = entry_of(parent);
  if (!pe) return TPSH_OK;
  ncclComm_t none = NULL;
  ncclResult_t r = ncclCommSplit(pe->comm, NCCL_SPLIT_NOCOLOR, 0, &none, NULL);
  if (r != ncclSuccess) return nccl_fail(r, pe->comm, "ncclCommSplit (NCCL_SPLIT_NOCOLOR)");
  if (none) ncclCommDestroy(none);       /* NCCL gives none to a rank without a color */
  return TPSH_OK;
}

int tpsh_cuda_group_init(tpsh_group *g) {
  int split = 0;
  int rc = split_from_parent(g, &split);
  if (rc || split) return rc;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclResult_t r = ncclSuccess;
  if (g->rank == 0) r = ncclGetUniqueId(&id);
  /* Rank 0 tells the others whether it has an id, so that a failure there is not a hang elsewhere. */
  int ok = r == ncclSuccess;
  if (MPI_Bcast(&ok, 1, MPI_INT, 0, g->host_comm) != MPI_SUCCESS)
    return tpsh_error(TPSH_ECOMM, "MPI_Bcast of the NCCL id failed on rank %d", tpsh_rt.rank);
  if (!ok) return g->rank == 0 ? nccl_fail(r, NULL, "ncclGetUniqueId")
                               : tpsh_error(TPSH_ECOMM, "ncclGetUniqueId failed on the group's rank 0");
  if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, g->host_comm) != MPI_SUCCESS)
    return tpsh_error(TPSH_ECOMM, "MPI_Bcast of the NCCL id failed on rank %d", tpsh_rt.rank);
  comm_entry *e = calloc(1, sizeof *e);
  if (!e) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  r = ncclCommInitRankConfig(&e->comm, g->size, id, g->rank, &config);
  if (r != ncclSuccess) {
    free(e);
    return nccl_fail(r, NULL, "ncclCommInitRankConfig");
  }
  add_entry(e, g);
  return TPSH_OK;
}

void tpsh_cuda_group_destroy(tpsh_group *g) {
  comm_entry *e = entry_of(g);
  if (!e) return;
  for (comm_entry **pp = &comms; *pp; pp = &(*pp)->next)
    if (*pp == e) { *pp = e->next; ncomms--; break; }
  /* ncclCommDestroy frees local resources once the communicator's work is done; an aborted one has
   * none left. */
  if (!e->aborted) ncclCommDestroy(e->comm);
  free(e);
  g->backend_comm = NULL;
}

/* The communicator, for FFI interop (NULL before group_init). */
void *tpsh_cuda_group_handle(tpsh_group *g) {
  comm_entry *e = entry_of(g);
  return e ? (void *)e->comm : NULL;
}

/* ==== collectives ================================================================================ */
TPSH_HOT static int nccl_type(int dt, ncclDataType_t *t) {
  switch (dt) {
  case TPSH_F32: *t = ncclFloat32; return 1;
  case TPSH_F16: *t = ncclFloat16; return 1;
  case TPSH_BF16: *t = ncclBfloat16; return 1;
  case TPSH_F64: *t = ncclFloat64; return 1;
  case TPSH_I32: *t = ncclInt32; return 1;
  case TPSH_I64: *t = ncclInt64; return 1;
  case TPSH_U8: *t = ncclUint8; return 1;
  default: return 0;
  }
}

TPSH_HOT static int nccl_op(int op, ncclRedOp_t *o) {
  switch (op) {
  case TPSH_SUM: *o = ncclSum; return 1;
  case TPSH_AVG: *o = ncclAvg; return 1;
  case TPSH_MAX: *o = ncclMax; return 1;
  case TPSH_MIN: *o = ncclMin; return 1;
  case TPSH_PROD: *o = ncclProd; return 1;
  default: return 0;
  }
}

/* Enqueues one collective (inside the caller's ncclGroupStart/End). */
TPSH_HOT static int enqueue_one(comm_entry *e, int size, const tpsh_coll_args *c, cudaStream_t st) {
  ncclComm_t comm = e->comm;
  ncclDataType_t t;
  ncclRedOp_t op = ncclSum;
  const tpsh_coll_kind_info *k = tpsh_coll_kind_of(c->kind);
  if (!k) return tpsh_error(TPSH_EINVAL, "unknown collective kind %d", c->kind);
  const char *call = k->nccl_call;
  if (!nccl_type(c->dtype, &t)) return tpsh_error(TPSH_EINVAL, "%s: unsupported dtype %d", call, c->dtype);
  if (k->has_op && !nccl_op(c->op, &op)) return tpsh_error(TPSH_EINVAL, "%s: unknown reduction %d", call, c->op);
  size_t count = (size_t)c->count;
  ncclResult_t r = ncclSuccess;
  switch (c->kind) {
  case TPSH_C_ALL_GATHER: r = ncclAllGather(c->send, c->recv, count, t, comm, st); break;
  case TPSH_C_ALL_REDUCE: r = ncclAllReduce(c->send, c->recv, count, t, op, comm, st); break;
  case TPSH_C_REDUCE_SCATTER: r = ncclReduceScatter(c->send, c->recv, count, t, op, comm, st); break;
  case TPSH_C_BROADCAST: r = ncclBroadcast(c->send, c->recv, count, t, c->peer, comm, st); break;
  case TPSH_C_REDUCE: r = ncclReduce(c->send, c->recv, count, t, op, c->peer, comm, st); break;
  case TPSH_C_SEND: r = ncclSend(c->send, count, t, c->peer, comm, st); break;
  case TPSH_C_RECV: r = ncclRecv(c->recv, count, t, c->peer, comm, st); break;
  case TPSH_C_ALL_TO_ALL: {
    size_t piece = count * (size_t)tpsh_dtype_size(c->dtype);
    for (int j = 0; j < size && r == ncclSuccess; j++) {
      r = ncclSend((const char *)c->send + j * piece, count, t, j, comm, st);
      if (r == ncclSuccess) r = ncclRecv((char *)c->recv + j * piece, count, t, j, comm, st);
    }
    break;
  }
  }
  return r == ncclSuccess ? TPSH_OK : nccl_fail(r, comm, call);
}

TPSH_HOT int tpsh_cuda_collectives(tpsh_stream *s, tpsh_group *g, int n, const tpsh_coll_args *c) {
  comm_entry *e = entry_of(g);
  if (!e) return tpsh_error(TPSH_EINVAL, "%s: the group has no NCCL communicator (group_init was not called)",
                            n > 0 && c[0].name ? c[0].name : "collective");
  /* A communicator that failed earlier fails every later call. Asynchronous errors are polled in the
   * host-wait paths (cuda_stream.c), as PyTorch's watchdog does, not here: the query costs host time
   * that a small collective cannot hide. */
  if (e->aborted) return tpsh_error(TPSH_ECOMM, "%s", e->error);
  int rc = TPSH_OK;
  cudaStream_t st = tpsh_cuda_stream(s);
  nvtxRangePushA(n == 1 && c[0].name ? c[0].name : "batch");
  /* A single collective goes straight to NCCL: a group around one call costs host time that a small
   * collective cannot hide. all_to_all is grouped send/recv even alone. */
  int grouped = n > 1 || c[0].kind == TPSH_C_ALL_TO_ALL;
  ncclResult_t r = grouped ? ncclGroupStart() : ncclSuccess;
  if (r != ncclSuccess) {
    nvtxRangePop();
    return nccl_fail(r, e->comm, "ncclGroupStart");
  }
  for (int i = 0; i < n && rc == TPSH_OK; i++) rc = enqueue_one(e, g->size, &c[i], st);
  /* End the group even after a failed call: the group depth is per thread and must return to 0. */
  if (grouped) r = ncclGroupEnd();
  nvtxRangePop();
  if (rc) return rc;
  if (r != ncclSuccess) return nccl_fail(r, e->comm, n == 1 ? tpsh_coll_kinds[c[0].kind].nccl_call : "ncclGroupEnd");
  return TPSH_OK;
}
