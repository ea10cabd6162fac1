/*
 * overhead_ref.cu: the host cost per op of plain CUDA, for scripts/bench/bench_overhead.lua on a GPU.
 *
 * bench_overhead_ref.c measures the tpsh C API (so the Lua/C ratio isolates the Lua layer); this program
 * measures what the same three cases cost when written against CUDA directly, with no tpsh at all, so
 * that tpsh as a whole (Lua + core + CUDA backend) can be held to "at most 1.1x plain CUDA":
 *   add_ (in place)            one elementwise kernel on 16 floats
 *   a + b (allocates)          cudaMallocAsync + that kernel + cudaFreeAsync (a temporary per op)
 *   event record + stream wait cudaEventRecord on the stream, cudaStreamWaitEvent on a second stream
 * Timing is bench_overhead.lua's: host time of the enqueue loop, streams synchronised every CHUNK ops
 * outside the timed region, median of 5 after a warm-up run. Streams are non-blocking, created like
 * tpsh's; events disable timing, as tpsh's ordering events do.
 *   overhead_ref [iters]          prints "cuda <case> <us> us/op", one line per case
 * Then "cudax" lines: add_ with one of the things tpsh's CUDA backend adds to a launch (a 48-byte
 * parameter block like its DensePack, cudaGetLastError after the launch, an NVTX range around it), so
 * that a gap between tpsh and plain CUDA can be put down to a part.
 *
 * Built a second time as libtpsh_overhead_ref.so (OVERHEAD_REF_LIB: no main), whose
 * tpsh_overhead_ref_time runs one case's loop on streams and buffers it is given: bench_overhead.lua
 * --ref calls it inside tpsh's own process, on tpsh's streams and tensors, round by round with its own
 * loop, so that one process's host speed against the next (up to 2x apart on the lent GPU machine)
 * cannot skew the ratio.
 */
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CUDA_OK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); exit(1); } } while (0)

enum { CHUNK = 1000, REPEATS = 5 };

__global__ void add_kernel(float *o, const float *a, const float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) o[i] = a[i] + b[i];
}

static cudaStream_t cur, side;
static cudaEvent_t ev;
static float *x, *y;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void add_inplace(void) { add_kernel<<<1, 256, 0, cur>>>(x, x, y, 16); }

#ifndef OVERHEAD_REF_LIB   /* the parts, for the program's "cudax" lines only */
struct Pack48 { float *p[3]; long long es[3]; };
__global__ void add_kernel48(Pack48 pk, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) pk.p[0][i * pk.es[0]] = pk.p[1][i * pk.es[1]] + pk.p[2][i * pk.es[2]];
}
static void add_params48(void) { add_kernel48<<<1, 256, 0, cur>>>(Pack48{{x, x, y}, {1, 1, 1}}, 16); }
static void add_last_error(void) { add_kernel<<<1, 256, 0, cur>>>(x, x, y, 16); (void)cudaGetLastError(); }
/* the same kernel through the driver's cuLaunchKernel (CUfunction from cudaGetFuncBySymbol, entry
 * point from cudaGetDriverEntryPointByVersion): what the runtime's launch adds */
typedef int (*cu_launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shmem, cudaStream_t st, void **params, void **extra);
static cu_launch_fn cu_launch;
static cudaFunction_t add_fn;
static void add_driver(void) {
  int n = 16;
  void *args[] = {&x, &x, &y, &n};
  cu_launch((void *)add_fn, 1, 1, 1, 256, 1, 1, 0, cur, args, NULL);
}
static void add_nvtx(void) {
  nvtxRangePushA("add_");
  add_kernel<<<1, 256, 0, cur>>>(x, x, y, 16);
  nvtxRangePop();
}
#endif

static void add_alloc(void) {
  float *out;
  cudaMallocAsync((void **)&out, 16 * sizeof(float), cur);
  add_kernel<<<1, 256, 0, cur>>>(out, x, y, 16);
  cudaFreeAsync(out, cur);
}

static void record_wait(void) {
  cudaEventRecord(ev, cur);
  cudaStreamWaitEvent(side, ev, 0);
}

static double run(void (*fn)(void), long n_total) {
  double total = 0;
  for (long done = 0; done < n_total;) {
    long n = n_total - done < CHUNK ? n_total - done : CHUNK;
    CUDA_OK(cudaDeviceSynchronize());
    double t0 = now_ms();
    for (long i = 0; i < n; i++) fn();
    total += now_ms() - t0;
    done += n;
  }
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
  return total * 1000.0 / (double)n_total;
}

#ifndef OVERHEAD_REF_LIB
static int cmp(const void *a, const void *b) {
  double p = *(const double *)a, q = *(const double *)b;
  return (p > q) - (p < q);
}

static double median(void (*fn)(void), long n) {
  run(fn, n);
  double s[REPEATS];
  for (int r = 0; r < REPEATS; r++) s[r] = run(fn, n);
  qsort(s, REPEATS, sizeof s[0], cmp);
  return s[REPEATS / 2];
}
#endif

/* The library's entry point: case `which` (0 add_, 1 a + b, 2 event record + stream wait) on stream
 * `current` (and `other` for the wait), on 16-float device buffers xp and yp; n ops; *us = host us per
 * op. Returns 0, or 1 with the CUDA error printed. */
extern "C" int tpsh_overhead_ref_time(int which, void *current, void *other, float *xp, float *yp, long n,
                                      double *us) {
  static void (*const fns[])(void) = {add_inplace, add_alloc, record_wait};
  if (which < 0 || which > 2 || n < 1) return 1;
  if (!ev && cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) return 1;
  cur = (cudaStream_t)current, side = (cudaStream_t)other, x = xp, y = yp;
  *us = run(fns[which], n);              /* CUDA_OK inside exits on an error, after printing it */
  return 0;
}

#ifndef OVERHEAD_REF_LIB
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&cur, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaMemPool_t pool;
  unsigned long long keep = ~0ull;                 /* as tpsh: the pool keeps what it has */
  CUDA_OK(cudaDeviceGetDefaultMemPool(&pool, 0));
  CUDA_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  CUDA_OK(cudaMalloc((void **)&x, 16 * sizeof(float)));
  CUDA_OK(cudaMalloc((void **)&y, 16 * sizeof(float)));
  CUDA_OK(cudaMemset(x, 0, 16 * sizeof(float)));
  CUDA_OK(cudaMemset(y, 0, 16 * sizeof(float)));
  struct { const char *name; void (*fn)(void); } cases[] = {
    {"add_ (in place)", add_inplace}, {"a + b (allocates)", add_alloc}, {"event record + stream wait", record_wait}};
  struct { const char *name; void (*fn)(void); } parts[] = {
    {"add_ 48-byte params", add_params48}, {"add_ + cudaGetLastError", add_last_error}, {"add_ + NVTX range", add_nvtx},
    {"add_ via cuLaunchKernel", add_driver}};
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult found;
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 12000, cudaEnableDefault, &found));
  cu_launch = (cu_launch_fn)fn;
  CUDA_OK(cudaGetFuncBySymbol(&add_fn, (const void *)add_kernel));
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) printf("cuda %-28s %8.3f us/op\n", cases[c].name, median(cases[c].fn, n));
  for (size_t c = 0; c < sizeof parts / sizeof parts[0]; c++) printf("cudax %-27s %8.3f us/op\n", parts[c].name, median(parts[c].fn, n));
  return 0;
}
#endif
