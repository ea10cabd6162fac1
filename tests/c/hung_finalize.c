/*
 * hung_finalize.c: an MPI_Finalize that never returns, put in front of MPICH's through MPI's profiling
 * interface (LD_PRELOAD; PMPI_Finalize stays the real one). It stands in for the MPICH/UCX shut-down
 * race that src/host/finalize.c bounds, which no test can bring about at will: tests/watchdog_spec.lua
 * runs a child job with it and checks that every rank still ends, with its status, in time.
 */
#include <mpi.h>
#include <unistd.h>

int MPI_Finalize(void) {
  for (;;) pause();
  return PMPI_Finalize();
}
