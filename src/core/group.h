/*
 * group.h: a group of ranks as the core sees it. Each group owns two MPI communicators duplicated from
 * its parent: one for the host-side exchanges (tp.allgather of Lua values, barriers) made by the Lua
 * thread, one for the collectives that stream workers run, so that the two never interleave on one
 * communicator (MPI requires collectives on a communicator to be issued in the same order everywhere).
 */
#ifndef TPSH_GROUP_H
#define TPSH_GROUP_H

#include "core/internal.h"
#include <mpi.h>

struct tpsh_group {
  int refcount;
  int rank, size;
  int *world_ranks;          /* group rank -> world rank */
  MPI_Comm host_comm;        /* host-side exchanges (Lua thread) */
  MPI_Comm dev_comm;         /* collectives run by stream workers (CPU backend) */
  void *backend_comm;        /* the backend's communicator (an ncclComm_t on CUDA), or NULL */
  tpsh_stream *comm_stream;  /* created on first async collective */
  uint64_t seq;              /* collectives issued on this group, in issue order */
  uint64_t collectives;      /* of those, the ones every member issues (all but sends and receives) */
  uint64_t digest;           /* the sum of those ones' tpsh_coll_digest_term (check.h) */
  uint64_t failures;         /* collectives on it that failed, as the transport reported (atomic: a
                              * stream worker adds); where one did, the ranks know, and their digests
                              * may differ on purpose (a test of the failure) */
  uint64_t host_exchanges;   /* host-side exchanges begun on host_comm (tp.allgather, barrier, split...) */
  uint64_t id;               /* names the comm stream ("comm<id>"); the world is 0 */
  int backend_ready;         /* be->group_init succeeded, so be->group_destroy is due */
  void *batch;               /* collective.c's batch being recorded (tpsh_batch_begin/end) */
  /* while the backend's group_init runs for a group made from a parent: the parent, and this rank's
   * color there (tp.new_group: 0); NULL for the world (see tpsh_backend.group_split_out) */
  tpsh_group *split_parent;
  int split_color;
};

/* Makes a group from a communicator that the group then owns (it is duplicated for dev_comm), and
 * sets up the backend's side of it. Collective over comm. */
tpsh_group *tpsh_group_from_comm(MPI_Comm comm);

/* A collective on g failed (the backend's call, or later on its stream): counted in g->failures. */
void tpsh_group_note_failure(tpsh_group *g);

/* "<call> failed: <MPI's error string><note>" as the error (TPSH_ECOMM); its status. */
int tpsh_mpi_fail_noting(int err, const char *call, const char *note);

/* Waits for request q, started by an MPI_I* call that returned e, polling with naps after the first
 * millisecond instead of busy-polling as MPI's blocking calls do (host_exchange.c). MPI's error code. */
enum { TPSH_HOST_WAIT_ENDED = -1 };      /* never an MPI error code, which are not negative */
int tpsh_host_wait(int e, MPI_Request *q);
int tpsh_host_probe(int source, int tag, MPI_Comm comm, MPI_Status *st);

/* collective.c: frees the group's batch record. */
void tpsh_group_batch_free(tpsh_group *g);

#endif /* TPSH_GROUP_H */
