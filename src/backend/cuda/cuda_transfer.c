/*
 * cuda_transfer.c: tensors to and from the host through pinned staging buffers.
 *
 * Copies from pageable memory are staged by the driver anyway, synchronously and in small pieces; our
 * own pinned buffers let a copy run at full PCIe/C2C speed and let from_host return before the data
 * reached the device. Two buffers of STAGE_BYTES take turns, so the host's memcpy of one chunk overlaps
 * the DMA of the other; each buffer carries an event that says when the DMA that used it is over, and
 * the host waits on it only before writing into that buffer again. Host thread only, like every
 * vtable call.
 */
#include "cuda_backend.h"
#include <string.h>

#define STAGE_BYTES ((size_t)16 << 20)

typedef struct stage {
  void *buf;              /* pinned, STAGE_BYTES */
  cudaEvent_t done;       /* recorded after the last copy that used buf */
  int pending;
} stage;

static stage stages[2];
static int next_stage;

static int stage_ready(void) {
  if (stages[0].buf) return TPSH_OK;
  for (int i = 0; i < 2; i++) {
    CUDA_TRY(cudaMallocHost(&stages[i].buf, STAGE_BYTES));
    CUDA_TRY(cudaEventCreateWithFlags(&stages[i].done, cudaEventDisableTiming));
  }
  return TPSH_OK;
}

/* Returns a buffer the host may write into now. */
static int stage_take(stage **out) {
  stage *sg = &stages[next_stage];
  next_stage ^= 1;
  if (sg->pending) {
    int rc = tpsh_cuda_event_wait_host(sg->done);
    if (rc) return rc;
    sg->pending = 0;
  }
  *out = sg;
  return TPSH_OK;
}

void tpsh_cuda_transfer_shutdown(void) {
  for (int i = 0; i < 2; i++) {
    if (!stages[i].buf) continue;
    cudaEventSynchronize(stages[i].done);
    cudaEventDestroy(stages[i].done);
    cudaFreeHost(stages[i].buf);
    stages[i].buf = NULL;
    stages[i].pending = 0;
  }
  (void)cudaGetLastError();
}

static size_t tensor_bytes(const tpsh_tensor *t) {
  size_t n = tpsh_dtype_size(t->dtype_id);
  for (int d = 0; d < t->ndim; d++) n *= (size_t)t->sizes[d];
  return n;
}

static tpsh_tensor dense_like(const tpsh_tensor *t) {
  tpsh_tensor c = *t;
  c.offset = 0;
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) { c.strides[d] = stride; stride *= t->sizes[d] ? t->sizes[d] : 1; }
  return c;
}

/* Device -> host in chunks: the DMA of chunk i runs while the host copies chunk i-1 out of the other
 * buffer. Everything is ordered after the work already on st. */
static int download(cudaStream_t st, const char *src, char *dst, size_t n) {
  stage *prev = NULL;
  size_t prev_off = 0, prev_len = 0;
  for (size_t off = 0; off < n || prev; off += STAGE_BYTES) {
    stage *sg = NULL;
    size_t len = off < n ? (n - off < STAGE_BYTES ? n - off : STAGE_BYTES) : 0;
    if (len) {
      int rc = stage_take(&sg);
      if (rc) return rc;
      CUDA_TRY(cudaMemcpyAsync(sg->buf, src + off, len, cudaMemcpyDeviceToHost, st));
      CUDA_TRY(cudaEventRecord(sg->done, st));
      sg->pending = 1;
    }
    if (prev) {
      int rc = tpsh_cuda_event_wait_host(prev->done);
      if (rc) return rc;
      prev->pending = 0;
      memcpy(dst + prev_off, prev->buf, prev_len);
    }
    prev = sg;
    prev_off = off;
    prev_len = len;
    if (!len) break;
  }
  return TPSH_OK;
}

int tpsh_cuda_to_host(tpsh_stream *s, const tpsh_kargs *k, void *dst) {
  const tpsh_tensor *t = &k->t[0];
  size_t n = tensor_bytes(t);
  cudaStream_t st = tpsh_cuda_stream(s);
  int rc = stage_ready();
  if (rc || n == 0) return rc ? rc : tpsh_cuda_stream_synchronize(s);
  const char *src = k->data[0];
  void *tmp = NULL;
  if (!tpsh_cuda_is_dense(t)) {        /* gather on the device first: one DMA instead of many */
    tmp = tpsh_cuda_scratch_alloc(n, st);
    if (!tmp) return TPSH_ENOMEM;
    tpsh_tensor c = dense_like(t);
    rc = tpsh_cuda_copy(st, &c, tmp, t, src);
    src = tmp;
  }
  if (rc == TPSH_OK) rc = download(st, src, dst, n);
  if (tmp) tpsh_cuda_scratch_free(tmp, st);
  return rc;
}

int tpsh_cuda_from_host(tpsh_stream *s, const tpsh_kargs *k, const void *src) {
  const tpsh_tensor *t = &k->t[0];
  size_t n = tensor_bytes(t);
  cudaStream_t st = tpsh_cuda_stream(s);
  int rc = stage_ready();
  if (rc || n == 0) return rc;
  char *dst = k->data[0];
  /* src is copied into pinned memory before this returns; the DMAs may still be in flight then. */
  for (size_t off = 0; off < n; off += STAGE_BYTES) {
    size_t len = n - off < STAGE_BYTES ? n - off : STAGE_BYTES;
    stage *sg;
    if ((rc = stage_take(&sg))) return rc;
    memcpy(sg->buf, (const char *)src + off, len);
    CUDA_TRY(cudaMemcpyAsync(dst + off, sg->buf, len, cudaMemcpyHostToDevice, st));
    CUDA_TRY(cudaEventRecord(sg->done, st));
    sg->pending = 1;
  }
  return TPSH_OK;
}
