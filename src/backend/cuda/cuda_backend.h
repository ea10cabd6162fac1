/*
 * cuda_backend.h: what the CUDA backend's files share. Each file owns one concern (cuda_backend.c the
 * vtable and errors, cuda_memory.c the pool, cuda_stream.c streams and events, cuda_transfer.c host
 * copies, cuda_kernels.cu the kernels, cuda_pointwise.cu the element-wise ops of core/pointwise.h,
 * cuda_reduce.cu those along a dim, cuda_blas.c matmul, cuda_nccl.c communicators, cuda_graph.c stream
 * capture and graph launch, cuda_modules.c the kernels loaded at start-up); this header is the narrow seam
 * between them, and of tpsh's the only one that the .cu files include, besides what they share
 * (cuda_elementwise.cuh). Of the core it includes core/backend.h alone.
 */
#ifndef TPSH_CUDA_BACKEND_H
#define TPSH_CUDA_BACKEND_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/backend.h"

/* ==== device state (cuda_backend.c) ============================================================ */
typedef struct tpsh_cuda_device {
  int index;               /* the CUDA device this rank uses */
  int sm_count;            /* multiprocessors: sizes the grids of the elementwise kernels */
  int cc;                  /* compute capability, 90 for sm_90 */
  char name[256];
} tpsh_cuda_device;
extern tpsh_cuda_device tpsh_cuda_dev;

/* Sets tpsh_last_error to "<call> failed on rank R: <string> (<name>)" and returns TPSH_EBACKEND (or
 * TPSH_ENOMEM for cudaErrorMemoryAllocation). `call` may be the stringified call: the text from the
 * first '(' on is dropped. Also clears the runtime's last-error slot, so that a later
 * cudaGetLastError() after a kernel launch does not report this failure a second time. */
int tpsh_cuda_fail(cudaError_t e, const char *call);
/* A driver API function by name, from the runtime's entry-point query (CUDA 12.0 ABI, so that nothing
 * links libcuda), or NULL. The hot paths call the driver directly: the runtime's wrappers around
 * cuEventRecord and cuLaunchKernel cost a few tenths of a microsecond each on the GPU machine. */
void *tpsh_cuda_driver_fn(const char *name);
#define CUDA_TRY(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return tpsh_cuda_fail(e_, #call); } while (0)

/* ==== streams (cuda_stream.c) ================================================================== */
typedef struct cuda_stream {
  cudaStream_t stream;
  void *blas_ws;           /* cuBLAS workspace of this stream (device memory), made by the first matmul */
  uint64_t marks;          /* the caching allocator's points in the stream (tpsh_cuda_stream_mark) */
  uint64_t passed;         /* the last of them known complete */
} cuda_stream;

/* The host waits for ev: blocking, or polling NCCL for errors while communicators exist. */
int tpsh_cuda_event_wait_host(cudaEvent_t ev);

static inline cudaStream_t tpsh_cuda_stream(const tpsh_stream *s) { return ((cuda_stream *)s->impl)->stream; }

/* ==== memory (cuda_memory.c) =================================================================== */
int tpsh_cuda_memory_init(int device);
/* Device scratch in stream order (temporaries of matmul, sum, to_host); NULL with a message. */
void *tpsh_cuda_scratch_alloc(size_t nbytes, cudaStream_t st);
void tpsh_cuda_scratch_free(void *p, cudaStream_t st);

/* ==== transfers (cuda_transfer.c) ============================================================== */
int tpsh_cuda_transfer_init(void);          /* pins the staging buffers (cuda_transfer.c says why now) */
void tpsh_cuda_transfer_shutdown(void);

/* ==== kernels (cuda_kernels.cu) ================================================================ */
/* Enqueues every op but matmul on st. */
int tpsh_cuda_kernel(cudaStream_t st, const tpsh_kargs *k);
/* dst = src with casts: same number of elements, any strides, paired in row-major order. */
int tpsh_cuda_copy(cudaStream_t st, const tpsh_tensor *dst, void *dst_data, const tpsh_tensor *src,
                   const void *src_data);
/* Integer matmul, accumulated in int64 with wrap-around as on the CPU. */
int tpsh_cuda_matmul_int(cudaStream_t st, const tpsh_kargs *k);
/* Whether t's elements form one dense block starting at element 0 (size-1 dims ignored). */
int tpsh_cuda_is_dense(const tpsh_tensor *t);

/* ==== reductions along the last dim, softmax, norms (cuda_reduce.cu) =========================== */
int tpsh_cuda_reduce(cudaStream_t st, const tpsh_kargs *k);
/* ==== element-wise ops (cuda_pointwise.cu) ===================================================== */
/* TPSH_K_UNARY and TPSH_K_BINARY on st. */
int tpsh_cuda_pointwise(cudaStream_t st, const tpsh_kargs *k);

/* ==== matmul (cuda_blas.c) ===================================================================== */
int tpsh_cuda_matmul(tpsh_stream *s, const tpsh_kargs *k);
void tpsh_cuda_blas_release(cuda_stream *cs);     /* before the stream is destroyed */
void tpsh_cuda_blas_shutdown(void);
int tpsh_cuda_blas_init(void);                     /* at start-up: cublasCreate synchronises the device */
const char *tpsh_cuda_blas_version(void);

/* ==== the vtable's entries, one file each ====================================================== */
void *tpsh_cuda_alloc(size_t nbytes, tpsh_stream *s);                        /* cuda_memory.c */
int tpsh_cuda_free_async(void *ptr, size_t nbytes, tpsh_stream *s);
void tpsh_cuda_trim(void);
uint64_t tpsh_cuda_stream_mark(tpsh_stream *s);                                /* cuda_stream.c */
int tpsh_cuda_stream_passed(tpsh_stream *s, uint64_t mark);
int tpsh_cuda_stream_create(tpsh_stream *s);                                 /* cuda_stream.c */
void tpsh_cuda_stream_destroy(tpsh_stream *s);
int tpsh_cuda_stream_synchronize(tpsh_stream *s);
int tpsh_cuda_stream_query(tpsh_stream *s);
int tpsh_cuda_event_create(tpsh_event *e);
void tpsh_cuda_event_destroy(tpsh_event *e);
int tpsh_cuda_event_record(tpsh_event *e, tpsh_stream *s);
int tpsh_cuda_stream_wait_event(tpsh_stream *s, tpsh_event *e);
int tpsh_cuda_event_query(tpsh_event *e);
int tpsh_cuda_event_synchronize(tpsh_event *e);
int tpsh_cuda_event_elapsed(tpsh_event *a, tpsh_event *b, double *ms);
int tpsh_cuda_to_host(tpsh_stream *s, const tpsh_kargs *k, void *dst);      /* cuda_transfer.c */
int tpsh_cuda_from_host(tpsh_stream *s, const tpsh_kargs *k, const void *src);
int tpsh_cuda_group_split_ready(tpsh_group *parent);                         /* cuda_nccl.c */
int tpsh_cuda_group_split_out(tpsh_group *parent);                           /* cuda_nccl.c */
int tpsh_cuda_group_init(tpsh_group *g);                                     /* cuda_nccl.c */
void tpsh_cuda_group_destroy(tpsh_group *g);
void *tpsh_cuda_group_handle(tpsh_group *g);
int tpsh_cuda_collectives(tpsh_stream *s, tpsh_group *g, int n, const tpsh_coll_args *c);
int tpsh_cuda_graph_begin(tpsh_stream *s);                                   /* cuda_graph.c */
int tpsh_cuda_graph_end(tpsh_stream *s, int abort, void **exec);
int tpsh_cuda_graph_launch(void *exec, tpsh_stream *s);
void tpsh_cuda_graph_destroy(void *exec);

/* ==== tpsh's kernels loaded at start-up (cuda_modules.c) ======================================= */
/* Loads every kernel of tpsh's own modules now, not at its first launch (cuda_modules.c says why). */
int tpsh_cuda_modules_load(void);
/* Each .cu file's module, named by a kernel of it (TPSH_CUDA_MODULE_ANCHOR). */
const void *tpsh_cuda_kernels_module(void);
const void *tpsh_cuda_pointwise_module(void);
const void *tpsh_cuda_reduce_module(void);
#ifdef __CUDACC__
#define TPSH_CUDA_MODULE_ANCHOR(fn) \
  __global__ void fn##_anchor() {} \
  const void *fn(void) { return (const void *)fn##_anchor; }
#endif

/* ==== NCCL (cuda_nccl.c) ======================================================================= */
/* Polls every live communicator for an asynchronous error; on one, aborts that communicator (so that
 * its kernels stop spinning) and returns TPSH_ECOMM with the message. Cheap when there is none. */
int tpsh_cuda_nccl_poll(void);
int tpsh_cuda_nccl_active(void);      /* communicators alive: syncs must poll instead of block */
const char *tpsh_cuda_nccl_version(void);

#ifdef __cplusplus
}
#endif
#endif /* TPSH_CUDA_BACKEND_H */
