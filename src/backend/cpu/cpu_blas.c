/*
 * cpu_blas.c: OpenBLAS set-up for the CPU backend.
 *
 * Several ranks on one host, each with several stream workers, already compete for the cores; letting
 * OpenBLAS start its own thread pool in every rank on top of that oversubscribes the machine and makes
 * an overlap schedule measure the scheduler. So each rank's GEMM runs on the calling worker thread
 * alone unless the user sets OPENBLAS_NUM_THREADS (then OpenBLAS reads it itself).
 */
#include "backend/cpu/cpu_backend.h"
#include <stdio.h>
#include <stdlib.h>

void openblas_set_num_threads(int n);
char *openblas_get_config(void);

int tpsh_cpu_kernels_init(void) {
  if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
  return TPSH_OK;
}

const char *tpsh_cpu_blas_version(void) {
  static char buf[256];
  snprintf(buf, sizeof buf, "BLAS: %s", openblas_get_config());
  return buf;
}
