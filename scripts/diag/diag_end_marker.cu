/*
 * diag_end_marker.cu: what a Work's end marker costs the host, an event record against the stream
 * memory operations that could stand in for it.
 *
 * Why: on 2 GPUs the end event a Work needs is the largest part of tpsh's excess over NCCL called from C
 * at 1-4 KiB (docs/perf.md). A marker written by cuStreamWriteValue64 into pinned host memory would make
 * the completion query a load instead of a driver call, and cuStreamWaitValue64 would stand in for the
 * stream-side wait, if writing it cost the host less than cudaEventRecord. This measures that, on a tiny
 * kernel and on a 1 KiB ncclAllReduce of a one-rank communicator (for one rank NCCL enqueues nothing,
 * so what remains is the marker's own cost), each variant's loop in turn, round by round:
 *   diag_end_marker [rounds] [calls a round]       prints the median host time per call of each variant
 * The time is the host's from the first enqueue until both streams are idle: the loops are host-bound.
 * The driver's functions come through cudaGetDriverEntryPointByVersion, as in the CUDA backend (no link
 * against libcuda, which the build machine lacks).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define OK(c) do { cudaError_t e_ = (c); if (e_) { fprintf(stderr, "%s: %s\n", #c, cudaGetErrorString(e_)); exit(1); } } while (0)
#define DOK(c) do { CUresult e_ = (c); if (e_) { fprintf(stderr, "%s: CUresult %d\n", #c, (int)e_); exit(1); } } while (0)
#define NOK(c) do { ncclResult_t e_ = (c); if (e_) { fprintf(stderr, "%s: %s\n", #c, ncclGetErrorString(e_)); exit(1); } } while (0)

typedef CUresult (*write64_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
typedef CUresult (*write32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
typedef CUresult (*wait64_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
typedef CUresult (*attr_fn)(int *, CUdevice_attribute, CUdevice);
static write64_fn write64;
static write32_fn write32;
static wait64_fn wait64;

static void *driver_fn(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult found;
  OK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess) { fprintf(stderr, "no driver entry point %s\n", name); exit(1); }
  return fn;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

__global__ void tiny(float *x) { if (threadIdx.x == 0) x[0] += 1; }

enum { NEVENTS = 256, MAX_ROUNDS = 64 };
static cudaStream_t s, side;
static ncclComm_t comm;
static float *buf;
static cudaEvent_t evs[NEVENTS];          /* a ring, as a Work's events come from a table of slots */
static volatile unsigned long long *hmark;
static CUdeviceptr dmark;
static unsigned long long seq;
static int use_nccl;

static void op(void) {
  if (use_nccl) ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, comm, s);
  else tiny<<<1, 32, 0, s>>>(buf);
}
static CUstream cu(cudaStream_t x) { return (CUstream)x; }
static void v_op(long i) { (void)i; op(); }
static void v_event(long i) { op(); cudaEventRecord(evs[i % NEVENTS], s); }
static void v_write64(long i) { (void)i; op(); write64(cu(s), dmark, ++seq, CU_STREAM_WRITE_VALUE_DEFAULT); }
static void v_write64_nb(long i) { (void)i; op(); write64(cu(s), dmark, ++seq, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER); }
static void v_write32(long i) { (void)i; op(); write32(cu(s), dmark, (cuuint32_t)++seq, CU_STREAM_WRITE_VALUE_DEFAULT); }
static void v_event_wait(long i) {
  op();
  cudaEventRecord(evs[i % NEVENTS], s);
  cudaStreamWaitEvent(side, evs[i % NEVENTS], 0);
}
static void v_write_wait(long i) {
  (void)i;
  op();
  write64(cu(s), dmark, ++seq, CU_STREAM_WRITE_VALUE_DEFAULT);
  wait64(cu(side), dmark, seq, CU_STREAM_WAIT_VALUE_GEQ);
}
static void v_event_query(long i) {
  op();
  cudaEventRecord(evs[i % NEVENTS], s);
  (void)cudaEventQuery(evs[(i + NEVENTS - 1) % NEVENTS]);
}
static void v_write_load(long i) { (void)i; op(); write64(cu(s), dmark, ++seq, CU_STREAM_WRITE_VALUE_DEFAULT); (void)*hmark; }

typedef void (*variant)(long);
static const struct { const char *name; variant fn; } variants[] = {
  {"op", v_op},
  {"op + event record", v_event},
  {"op + write64", v_write64},
  {"op + write64, no barrier", v_write64_nb},
  {"op + write32", v_write32},
  {"op + event + stream wait", v_event_wait},
  {"op + write64 + wait value", v_write_wait},
  {"op + event + query", v_event_query},
  {"op + write64 + load", v_write_load},
};
enum { NV = sizeof variants / sizeof variants[0] };

static double run(variant f, long n) {
  OK(cudaDeviceSynchronize());
  double t0 = now_us();
  for (long i = 0; i < n; i++) f(i);
  OK(cudaStreamSynchronize(s));
  OK(cudaStreamSynchronize(side));
  return (now_us() - t0) / (double)n;
}

static int cmp(const void *a, const void *b) {
  double p = *(const double *)a, q = *(const double *)b;
  return (p > q) - (p < q);
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 15;
  long n = argc > 2 ? atol(argv[2]) : 10000;
  if (rounds < 1 || rounds > MAX_ROUNDS || n < 1) { fprintf(stderr, "usage: diag_end_marker [rounds 1-64] [calls]\n"); return 2; }
  OK(cudaSetDevice(0));
  OK(cudaFree(0));
  write64 = (write64_fn)driver_fn("cuStreamWriteValue64");
  write32 = (write32_fn)driver_fn("cuStreamWriteValue32");
  wait64 = (wait64_fn)driver_fn("cuStreamWaitValue64");
  attr_fn attr = (attr_fn)driver_fn("cuDeviceGetAttribute");
  int a;
  DOK(attr(&a, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0));
  printf("CAN_USE_STREAM_MEM_OPS_V1 %d", a);
  DOK(attr(&a, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1, 0));
  printf(", CAN_USE_64_BIT_STREAM_MEM_OPS_V1 %d\n", a);
  OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  OK(cudaMalloc((void **)&buf, 4096));
  for (int i = 0; i < NEVENTS; i++) OK(cudaEventCreateWithFlags(&evs[i], cudaEventDisableTiming));
  void *h, *d;
  OK(cudaHostAlloc(&h, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  hmark = (volatile unsigned long long *)h;
  *hmark = 0;
  OK(cudaHostGetDevicePointer(&d, h, 0));
  dmark = (CUdeviceptr)d;
  int devs[1] = {0};
  NOK(ncclCommInitAll(&comm, 1, devs));
  static double t[NV][MAX_ROUNDS];
  for (use_nccl = 0; use_nccl < 2; use_nccl++) {
    for (int v = 0; v < NV; v++) run(variants[v].fn, n);                  /* warm-up */
    for (int r = 0; r < rounds; r++)
      for (int v = 0; v < NV; v++) t[v][r] = run(variants[v].fn, n);
    printf("%s: %ld calls a round, %d rounds; host us a call, median (min, max)\n",
           use_nccl ? "ncclAllReduce 1 KiB on one rank" : "a tiny kernel", n, rounds);
    for (int v = 0; v < NV; v++) {
      qsort(t[v], (size_t)rounds, sizeof(double), cmp);
      printf("  %-28s %7.3f  (%.3f %.3f)\n", variants[v].name, t[v][rounds / 2], t[v][0], t[v][rounds - 1]);
    }
    if (*hmark != seq) { fprintf(stderr, "the host reads marker %llu, %llu written\n", *hmark, seq); return 1; }
  }
  ncclCommDestroy(comm);
  return 0;
}
