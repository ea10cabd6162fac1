/*
 * mpi_ref_loop.c: the C reference's MPI calls and timed loop (mpi_ref_loop.h says who shares them).
 */
#include "mpi_ref_loop.h"
#include "backend/cpu/cpu_relax.h"
#include <pthread.h>
#include <sched.h>
#include <string.h>

const char *const mpi_ref_names[MPI_REF_NOPS] = {"all_gather", "all_reduce", "reduce_scatter", "broadcast",
                                                 "all_to_all", "send_recv"};

void mpi_ref_call(int op, float *a, float *b, long count, MPI_Comm comm, int rank, int n) {
  int partner = rank % 2 == 0 ? rank + 1 : rank - 1;
  switch (op) {
  case MPI_REF_SR:
    if (partner >= n) break;
    if (rank % 2 == 0) MPI_Send(a, (int)count, MPI_FLOAT, partner, 7, comm);
    else MPI_Recv(a, (int)count, MPI_FLOAT, partner, 7, comm, MPI_STATUS_IGNORE);
    break;
  case MPI_REF_AG: MPI_Allgather(a, (int)(count / n), MPI_FLOAT, b, (int)(count / n), MPI_FLOAT, comm); break;
  case MPI_REF_AR: MPI_Allreduce(MPI_IN_PLACE, a, (int)count, MPI_FLOAT, MPI_SUM, comm); break;
  case MPI_REF_RS: MPI_Reduce_scatter_block(a, b, (int)(count / n), MPI_FLOAT, MPI_SUM, comm); break;
  case MPI_REF_BC: MPI_Bcast(a, (int)count, MPI_FLOAT, 0, comm); break;
  case MPI_REF_A2A: MPI_Alltoall(a, (int)(count / n), MPI_FLOAT, b, (int)(count / n), MPI_FLOAT, comm); break;
  }
}

int tpsh_mpi_ref_op(const char *name) {
  for (int i = 0; i < MPI_REF_NOPS; i++)
    if (!strcmp(name, mpi_ref_names[i])) return i;
  return -1;
}

double tpsh_mpi_ref_time(int op, void *a, void *b, long count, const void *comm, int iters) {
  MPI_Comm c = *(const MPI_Comm *)comm;
  int rank, n;
  MPI_Comm_rank(c, &rank);
  MPI_Comm_size(c, &n);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) mpi_ref_call(op, a, b, count, c, rank, n);
  return (MPI_Wtime() - t0) * 1e3 / (iters > 0 ? iters : 1);
}

/* ==== the calls handed to a thread (tpsh_mpi_ref_time_thread) ========================================= */
/* Polls until *p >= v, yielding the CPU now and then, as tpsh's polls do (cpu_poll.c), so that on a host with
 * fewer CPUs than threads the thread it waits for can run. */
static void wait_until(const long *p, long v) {
  for (int spins = 1; __atomic_load_n(p, __ATOMIC_ACQUIRE) < v; spins++) {
    tpsh_cpu_relax();
    if (spins % 256 == 0) sched_yield();
  }
}

/* A call as the host hands it over: a slot a cache line, as a stream's queue entry is one. */
typedef struct {
  _Alignas(64) int op;
  float *a, *b;
  long count;
} ref_call;

enum { RING = 256 };     /* a power of two; the host waits when the thread is this far behind */

typedef struct {
  ref_call ring[RING];
  _Alignas(64) long pushed;      /* the host's: calls written */
  _Alignas(64) long done;        /* the thread's: calls made (-1: not yet running) */
  MPI_Comm comm;
  int rank, n, iters;
} ref_queue;

static void *ref_thread(void *p) {
  ref_queue *q = p;
  __atomic_store_n(&q->done, 0, __ATOMIC_RELEASE);
  for (long i = 0; i < q->iters; i++) {
    wait_until(&q->pushed, i + 1);
    const ref_call *c = &q->ring[i & (RING - 1)];
    mpi_ref_call(c->op, c->a, c->b, c->count, q->comm, q->rank, q->n);
    __atomic_store_n(&q->done, i + 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

double tpsh_mpi_ref_time_thread(int op, void *a, void *b, long count, const void *comm, int iters) {
  static ref_queue q;
  q.comm = *(const MPI_Comm *)comm;
  MPI_Comm_rank(q.comm, &q.rank);
  MPI_Comm_size(q.comm, &q.n);
  q.iters = iters, q.pushed = 0, q.done = -1;
  pthread_t t;
  if (pthread_create(&t, NULL, ref_thread, &q) != 0) return -1;
  wait_until(&q.done, 0);                                             /* running before the clock starts */
  double t0 = MPI_Wtime();
  for (long i = 0; i < iters; i++) {
    wait_until(&q.done, i - RING + 1);
    ref_call *c = &q.ring[i & (RING - 1)];
    c->op = op, c->a = a, c->b = b, c->count = count;
    __atomic_store_n(&q.pushed, i + 1, __ATOMIC_RELEASE);
  }
  wait_until(&q.done, iters);
  double ms = (MPI_Wtime() - t0) * 1e3 / (iters > 0 ? iters : 1);
  pthread_join(t, NULL);
  return ms;
}
