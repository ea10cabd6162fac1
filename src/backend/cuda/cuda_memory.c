/*
 * cuda_memory.c: device memory from the device's default stream-ordered pool.
 *
 * cudaMallocAsync/cudaFreeAsync give the semantics the core's allocator is built on: a block freed on
 * a stream is reused by later allocations on that stream at once, and by other streams only once the
 * free has completed. The core (tensor.c) already handles blocks that several streams used (it parks
 * them until every user's event has completed, then frees them here on their own stream), so this file
 * only talks to the pool. The pool's release threshold is raised to "never": by default the driver
 * hands freed memory back to the OS at every synchronisation, and the next allocation pays for
 * mapping it again (tens of microseconds per op in a loop that allocates temporaries). And the pool
 * may not reuse a block whose free is still pending on another stream by making the allocating stream
 * wait for that stream (cudaMemPoolReuseAllowInternalDependencies, on by default): such a hidden
 * dependency would serialise a communication stream behind a long matmul on the compute stream, the
 * very overlap tpsh measures. Without it the pool grows a little instead.
 */
#include "backend/cuda/cuda_backend.h"
#include <stdint.h>

static cudaMemPool_t pool;
static cudaStream_t any_stream;    /* where memory for no stream in particular is allocated */

int tpsh_cuda_memory_init(int device) {
  CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, device));
  CUDA_TRY(cudaStreamCreateWithFlags(&any_stream, cudaStreamNonBlocking));
  uint64_t keep = UINT64_MAX;
  CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  int no = 0;
  CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no));
  return TPSH_OK;
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

/* The OOM message says what was asked for and where the memory went, which is what one needs to tell
 * fragmentation or a leak (high reserved, low used) from a real shortage (used near the total). */
static void *oom(size_t nbytes) {
  uint64_t reserved = 0, used = 0;
  size_t free_b = 0, total_b = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = total_b = 0;
  (void)cudaGetLastError();
  return tpsh_error_null(TPSH_ENOMEM,
                         "out of device memory on rank %d (device %d): cannot allocate %zu bytes (%.3f GiB); "
                         "the pool holds %.3f GiB reserved, %.3f GiB in use by tensors; the device has "
                         "%.3f GiB free of %.3f GiB",
                         tpsh_rt.rank, tpsh_cuda_dev.index, nbytes, gib(nbytes), gib(reserved), gib(used),
                         gib(free_b), gib(total_b));
}

/* Memory that any stream may use at once (the vtable's alloc with no stream: a graph pool's, while the
 * script's streams capture, and cuBLAS workspaces): allocated from the pool on a stream that never
 * captures, and waited for. On a capturing stream cudaMallocAsync would be a node of the graph, memory
 * that each launch allocates anew and that no free outside the graph may touch. The calls are made in
 * relaxed capture mode, whatever this thread captures: a wait for a stream that does not capture is
 * safe, and thread-local mode refuses every wait. */
static void *alloc_for_any_stream(size_t nbytes) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, nbytes, any_stream);
  if (e == cudaSuccess && (e = cudaStreamSynchronize(any_stream)) != cudaSuccess) (void)cudaFreeAsync(p, any_stream);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    oom(nbytes);                       /* sets the message */
  } else if (e != cudaSuccess) {
    tpsh_cuda_fail(e, "cudaMallocAsync (memory for any stream)");
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  return e == cudaSuccess ? p : NULL;
}

void *tpsh_cuda_alloc(size_t nbytes, tpsh_stream *s) {
  if (!s) return alloc_for_any_stream(nbytes);
  void *p = NULL;
  cudaStream_t st = tpsh_cuda_stream(s);
  cudaError_t e = cudaMallocAsync(&p, nbytes, st);
  if (e == cudaErrorMemoryAllocation) {
    /* Blocks freed on other streams return to the pool only when those frees have run: let every
     * stream catch up and trim what the pool keeps cached, then try once more before giving up. */
    (void)cudaGetLastError();
    /* a host wait like tp.synchronize's (tpsh_streams_wait_idle), not cudaDeviceSynchronize, which
     * blocks in the driver, deaf to NCCL's errors and the watchdog; its error (NCCL's, an interrupt) is
     * the one set */
    if (tpsh_streams_wait_idle("an allocation that waits for every stream's frees") != TPSH_OK) return NULL;
    if (cudaMemPoolTrimTo(pool, 0) == cudaSuccess) e = cudaMallocAsync(&p, nbytes, st);
    if (e == cudaErrorMemoryAllocation) return oom(nbytes);
  }
  if (e != cudaSuccess) {
    tpsh_cuda_fail(e, "cudaMallocAsync");
    return NULL;
  }
  return p;
}

int tpsh_cuda_free_async(void *ptr, size_t nbytes, tpsh_stream *s) {
  (void)nbytes;
  CUDA_TRY(cudaFreeAsync(ptr, tpsh_cuda_stream(s)));
  return TPSH_OK;
}

void tpsh_cuda_trim(void) {
  if (cudaMemPoolTrimTo(pool, 0) != cudaSuccess) (void)cudaGetLastError();
}

void *tpsh_cuda_scratch_alloc(size_t nbytes, cudaStream_t st) {
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, nbytes ? nbytes : 1, st);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return oom(nbytes);
  }
  if (e != cudaSuccess) {
    tpsh_cuda_fail(e, "cudaMallocAsync");
    return NULL;
  }
  return p;
}

void tpsh_cuda_scratch_free(void *p, cudaStream_t st) {
  if (p && cudaFreeAsync(p, st) != cudaSuccess) (void)cudaGetLastError();
}
