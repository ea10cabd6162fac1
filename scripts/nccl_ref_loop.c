/*
 * nccl_ref_loop.c: the C reference's NCCL calls and its timed loop (nccl_ref_loop.h says who shares
 * them and why). Plain C against NCCL and the CUDA runtime, nothing of tpsh's.
 */
#include "nccl_ref_loop.h"
#include <stdint.h>
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

/* The end markers that end_event selects (docs/perf.md, diag_end_marker.lua): what a Work's end could
 * cost the host a call. 1: cudaEventRecord of a non-timing event (the runtime's wrapper); 2: the
 * driver's cuEventRecord (what tpsh calls); 3 and 4: cuStreamWriteValue64 / 32 of a counter into
 * host-mapped memory (a timeline the host reads without a driver call). */
typedef int (*event_record_fn)(cudaEvent_t, cudaStream_t);
typedef int (*write_value64_fn)(cudaStream_t, unsigned long long, uint64_t, unsigned);
typedef int (*write_value32_fn)(cudaStream_t, unsigned long long, uint32_t, unsigned);

static void *driver_fn(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess)
    return fn;
  (void)cudaGetLastError();
  return NULL;
}

static volatile uint64_t *timeline;            /* host-mapped, for modes 3 and 4 */
static unsigned long long timeline_dev;

uint64_t tpsh_nccl_ref_timeline(void) { return timeline ? *timeline : 0; }

int tpsh_nccl_ref_time(int op, void *a, void *b, long count, int nccl_type, int elsize, int nranks,
                       void *comm, void *stream, int iters, int end_event, double *ms, double *enq_ms) {
  static cudaEvent_t done;                 /* the end event, reused as nccl_ref reuses its own */
  static event_record_fn cu_record;
  static write_value64_fn write64;
  static write_value32_fn write32;
  static uint64_t value;
  cudaStream_t st = stream;
  if (op < 0 || op >= NCCL_REF_NOPS || iters < 1 || !comm || end_event < 0 || end_event > 4) {
    snprintf(error, sizeof error, "tpsh_nccl_ref_time: bad arguments (op %d, %d calls, comm %p, end marker %d)", op,
             iters, comm, end_event);
    return -1;
  }
  if (end_event && !done && cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
    snprintf(error, sizeof error, "cudaEventCreateWithFlags failed: %s", cudaGetErrorString(cudaGetLastError()));
    return -1;
  }
  if (end_event >= 2 && !cu_record) {
    cu_record = (event_record_fn)driver_fn("cuEventRecord");
    write64 = (write_value64_fn)driver_fn("cuStreamWriteValue64");
    write32 = (write_value32_fn)driver_fn("cuStreamWriteValue32");
    void *h = NULL;
    if (cudaHostAlloc(&h, 64, cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer((void **)&timeline_dev, h, 0) != cudaSuccess) {
      snprintf(error, sizeof error, "mapped host memory: %s", cudaGetErrorString(cudaGetLastError()));
      return -1;
    }
    timeline = h;
    *timeline = 0;
  }
  if (end_event >= 2 && !(cu_record && write64 && write32)) {
    snprintf(error, sizeof error, "a driver entry point (cuEventRecord, cuStreamWriteValue64/32) is missing");
    return -1;
  }
  double t0 = nccl_ref_now_ms();
  for (int i = 0; i < iters; i++) {
    ncclResult_t r = nccl_ref_call(op, a, b, count, (size_t)elsize, (ncclDataType_t)nccl_type, nranks, comm, st);
    if (r != ncclSuccess) {
      snprintf(error, sizeof error, "%s (NCCL) failed: %s", nccl_ref_names[op], ncclGetErrorString(r));
      return -1;
    }
    int bad = 0;
    switch (end_event) {
    case 1: bad = cudaEventRecord(done, st) != cudaSuccess; break;
    case 2: bad = cu_record(done, st) != 0; break;
    case 3: bad = write64(st, timeline_dev, ++value, 0) != 0; break;
    case 4: bad = write32(st, timeline_dev, (uint32_t)++value, 0) != 0; break;
    default: break;
    }
    if (bad) {
      snprintf(error, sizeof error, "end marker %d failed: %s", end_event, cudaGetErrorString(cudaGetLastError()));
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
