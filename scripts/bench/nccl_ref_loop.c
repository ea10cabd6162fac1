/*
 * nccl_ref_loop.c: the C reference's NCCL calls and its timed loop (nccl_ref_loop.h says who shares
 * them and why). Plain C against NCCL and the CUDA runtime, nothing of tpsh's.
 */
#include "nccl_ref_loop.h"
#include <stdio.h>
#include <string.h>
#include <time.h>

const char *const nccl_ref_names[NCCL_REF_NOPS] = {"all_gather", "all_reduce", "reduce_scatter", "broadcast",
                                                   "all_to_all"};

ncclResult_t nccl_ref_call(int op, char *a, char *b, long count, size_t es, ncclDataType_t t, int nranks,
                           ncclComm_t comm, cudaStream_t st) {
  size_t c = (size_t)count, piece = c / (size_t)nranks;
  switch (op) {
  case NCCL_REF_AG: return ncclAllGather(a, b, piece, t, comm, st);
  case NCCL_REF_AR: return ncclAllReduce(a, a, c, t, ncclSum, comm, st);
  case NCCL_REF_RS: return ncclReduceScatter(a, b, piece, t, ncclSum, comm, st);
  case NCCL_REF_BC: return ncclBroadcast(a, a, c, t, 0, comm, st);
  default: {
    ncclResult_t r = ncclGroupStart();
    for (int j = 0; j < nranks && r == ncclSuccess; j++) {
      r = ncclSend(a + (size_t)j * piece * es, piece, t, j, comm, st);
      if (r == ncclSuccess) r = ncclRecv(b + (size_t)j * piece * es, piece, t, j, comm, st);
    }
    ncclResult_t end = ncclGroupEnd();     /* always: the group depth must return to 0 */
    return r != ncclSuccess ? r : end;
  }
  }
}

/* ==== the library's entry points ================================================================== */
static char error[256];

const char *tpsh_nccl_ref_error(void) { return error; }

int tpsh_nccl_ref_op(const char *name) {
  for (int i = 0; i < NCCL_REF_NOPS; i++)
    if (!strcmp(name, nccl_ref_names[i])) return i;
  return -1;
}

double nccl_ref_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int tpsh_nccl_ref_time(int op, void *a, void *b, long count, int nccl_type, int elsize, int nranks,
                       void *comm, void *stream, int iters, int end_event, double *ms, double *enq_ms) {
  static cudaEvent_t done;                 /* the end event, reused as nccl_ref reuses its own */
  cudaStream_t st = stream;
  if (op < 0 || op >= NCCL_REF_NOPS || iters < 1 || !comm) {
    snprintf(error, sizeof error, "tpsh_nccl_ref_time: bad arguments (op %d, %d calls, comm %p)", op, iters, comm);
    return -1;
  }
  if (end_event && !done && cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
    snprintf(error, sizeof error, "cudaEventCreateWithFlags failed: %s", cudaGetErrorString(cudaGetLastError()));
    return -1;
  }
  double t0 = nccl_ref_now_ms();
  for (int i = 0; i < iters; i++) {
    ncclResult_t r = nccl_ref_call(op, a, b, count, (size_t)elsize, (ncclDataType_t)nccl_type, nranks, comm, st);
    if (r != ncclSuccess) {
      snprintf(error, sizeof error, "%s (NCCL) failed: %s", nccl_ref_names[op], ncclGetErrorString(r));
      return -1;
    }
    if (end_event && cudaEventRecord(done, st) != cudaSuccess) {
      snprintf(error, sizeof error, "cudaEventRecord failed: %s", cudaGetErrorString(cudaGetLastError()));
      return -1;
    }
  }
  double t1 = nccl_ref_now_ms();
  cudaError_t e = cudaStreamSynchronize(st);
  if (e != cudaSuccess) {
    snprintf(error, sizeof error, "cudaStreamSynchronize failed: %s", cudaGetErrorString(e));
    return -1;
  }
  *enq_ms = (t1 - t0) / iters;
  *ms = (nccl_ref_now_ms() - t0) / iters;
  return 0;
}
