/*
 * cuda_backend.c: the CUDA backend's vtable, start-up, versions, errors, and the one launch path.
 *
 * The backend is linked into every build where the toolkit is found, including builds that run on
 * machines without a GPU (CI, laptops): nothing here may abort or print when there is no driver.
 * tpsh_cuda_device_count() answers 0 there, runtime.c then picks the CPU backend, and `--backend cuda`
 * fails with a message. versions() works without a device too, because `tpsh -v` is what a bug report
 * from such a machine needs.
 */
#include "backend/cuda/cuda_backend.h"
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <string.h>

tpsh_cuda_device tpsh_cuda_dev = {.index = -1};

/* ==== errors ===================================================================================== */
int tpsh_cuda_fail(cudaError_t e, const char *call) {
  (void)cudaGetLastError();          /* consume it: the next launch check must not see it again */
  int len = (int)strcspn(call, "(");
  return tpsh_error(e == cudaErrorMemoryAllocation ? TPSH_ENOMEM : TPSH_EBACKEND,
                    "%.*s failed on rank %d: %s (%s)", len, call, tpsh_rt.rank, cudaGetErrorString(e),
                    cudaGetErrorName(e));
}

/* ==== devices ==================================================================================== */
int tpsh_cuda_device_count(void) {
  /* Cached: the answer cannot change while the process runs, and auto-selection asks on every rank. */
  static int count = -1;
  if (count >= 0) return count;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {   /* no driver, no device, or a driver too old */
    (void)cudaGetLastError();
    n = 0;
  }
  count = n;
  return count;
}

void *tpsh_cuda_driver_fn(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess)
    return fn;
  (void)cudaGetLastError();
  return NULL;
}

static int cuda_init(int device) {
  int count = tpsh_cuda_device_count();
  if (count <= 0)
    return tpsh_error(TPSH_EBACKEND, "the CUDA backend needs a GPU, and none is visible on rank %d", tpsh_rt.rank);
  /* runtime.c has recorded the request in tpsh_rt.device: -1 when the device comes from the local rank.
   * A --device that names no GPU is an error: taken modulo the count, it ran on a GPU nobody asked for. */
  if (tpsh_rt.device >= count)
    return tpsh_error(TPSH_EINVAL, "--device %d: rank %d sees %d GPU%s (indices 0 to %d)", tpsh_rt.device,
                      tpsh_rt.rank, count, count == 1 ? "" : "s", count - 1);
  /* More ranks than GPUs on a host share them round-robin (NCCL refuses two ranks of one communicator
   * on one GPU, but single-rank runs and CPU-side experiments still work). */
  int dev = (device < 0 ? 0 : device) % count;
  CUDA_TRY(cudaSetDevice(dev));
  CUDA_TRY(cudaFree(0));             /* create the primary context now, not inside the first timed op */
  CUDA_TRY(cudaDeviceGetAttribute(&tpsh_cuda_dev.sm_count, cudaDevAttrMultiProcessorCount, dev));
  struct cudaDeviceProp prop;
  CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  snprintf(tpsh_cuda_dev.name, sizeof tpsh_cuda_dev.name, "%s", prop.name);
  tpsh_cuda_dev.cc = prop.major * 10 + prop.minor;
  tpsh_cuda_dev.index = dev;
  /* runtime.c records the requested device (-1: by local rank); tensors and tp.device must carry the
   * index actually in use. */
  tpsh_rt.device = dev;
  int rc = tpsh_cuda_memory_init(dev);
  if (rc == TPSH_OK) rc = tpsh_cuda_modules_load();
  if (rc == TPSH_OK) rc = tpsh_cuda_transfer_init();
  return rc ? rc : tpsh_cuda_blas_init();
}

static void cuda_shutdown(void) {
  (void)cudaDeviceSynchronize();
  tpsh_cuda_transfer_shutdown();
  tpsh_cuda_blas_shutdown();
  (void)cudaGetLastError();
}

static const char *cuda_versions(void) {
  static char buf[512];
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
  char dev[320] = "no device";
  if (tpsh_cuda_dev.index >= 0) {
    snprintf(dev, sizeof dev, "device %d %s (sm_%d)", tpsh_cuda_dev.index, tpsh_cuda_dev.name,
             tpsh_cuda_dev.cc);
  } else if (tpsh_cuda_device_count() > 0) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
      snprintf(dev, sizeof dev, "%d device(s), device 0 %s (sm_%d%d)", tpsh_cuda_device_count(), prop.name,
               prop.major, prop.minor);
    else
      (void)cudaGetLastError();
  }
  char drvs[32] = "none";
  if (drv) snprintf(drvs, sizeof drvs, "%d.%d", drv / 1000, drv % 1000 / 10);
  snprintf(buf, sizeof buf, "CUDA runtime %d.%d, driver %s, %s; %s; %s", rt / 1000, rt % 1000 / 10, drvs, dev,
           tpsh_cuda_nccl_version(), tpsh_cuda_blas_version());
  return buf;
}

/* ==== launch ===================================================================================== */
/* NVTX ranges cover the host-side enqueue; Nsight Systems links them to the kernels they launched, so
 * a timeline shows "add_" or "matmul" on the GPU row too. Without a tool attached they cost a branch. */
static int cuda_launch(tpsh_stream *s, const tpsh_kargs *k) {
  nvtxRangePushA(k->name ? k->name : "op");
  int rc = k->op == TPSH_K_MATMUL ? tpsh_cuda_matmul(s, k) : tpsh_cuda_kernel(tpsh_cuda_stream(s), k);
  nvtxRangePop();
  return rc;
}

/* ==== interop ==================================================================================== */
static void *cuda_stream_handle(tpsh_stream *s) { return tpsh_cuda_stream(s); }

/* ==== the vtable ================================================================================= */
const tpsh_backend tpsh_backend_cuda = {
  .name = "cuda",
  .init = cuda_init,
  .shutdown = cuda_shutdown,
  .versions = cuda_versions,
  .alloc = tpsh_cuda_alloc,
  .free_async = tpsh_cuda_free_async,
  .stream_mark = tpsh_cuda_stream_mark,
  .stream_passed = tpsh_cuda_stream_passed,
  .trim = tpsh_cuda_trim,
  .stream_create = tpsh_cuda_stream_create,
  .stream_destroy = tpsh_cuda_stream_destroy,
  .stream_synchronize = tpsh_cuda_stream_synchronize,
  .stream_query = tpsh_cuda_stream_query,
  .event_create = tpsh_cuda_event_create,
  .event_destroy = tpsh_cuda_event_destroy,
  .event_record = tpsh_cuda_event_record,
  .stream_wait_event = tpsh_cuda_stream_wait_event,
  .event_query = tpsh_cuda_event_query,
  .event_synchronize = tpsh_cuda_event_synchronize,
  .event_elapsed = tpsh_cuda_event_elapsed,
  .launch = cuda_launch,
  .to_host = tpsh_cuda_to_host,
  .from_host = tpsh_cuda_from_host,
  .group_init = tpsh_cuda_group_init,
  .group_split_ready = tpsh_cuda_group_split_ready,
  .group_split_out = tpsh_cuda_group_split_out,
  .group_destroy = tpsh_cuda_group_destroy,
  .collectives = tpsh_cuda_collectives,
  .graph_begin = tpsh_cuda_graph_begin,
  .graph_end = tpsh_cuda_graph_end,
  .graph_launch = tpsh_cuda_graph_launch,
  .graph_destroy = tpsh_cuda_graph_destroy,
  .stream_handle = cuda_stream_handle,
  .group_handle = tpsh_cuda_group_handle,
};
