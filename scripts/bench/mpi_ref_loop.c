/*
 * mpi_ref_loop.c: the C reference's MPI calls and timed loop (mpi_ref_loop.h says who shares them).
 */
#include "mpi_ref_loop.h"
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
