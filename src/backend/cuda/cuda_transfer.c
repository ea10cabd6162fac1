/*
 * cuda_transfer.c: tensors to and from the host through pinned staging buffers.
 *
 * Copies from pageable memory are staged by the driver anyway, synchronously and in small pieces; our
 * own pinned buffers let a copy run at full PCIe/C2C speed and let from_host return before the data
 * reached the device. Two buffers of STAGE_BYTES take turns, so the host's memcpy of one chunk overlaps
 * the DMA of the other; each buffer carries an event that says when the DMA that used it is over, and
 * the host waits on it only before writing into that buffer again. Host thread only, like every
 * vtable call.
 *
 * The buffers serve every stream, so a buffer can still hold an upload queued behind another stream's
 * work (tp.from after a long kernel). Waiting for it would make the host wait for that stream: the third
 * tp.from behind a spin blocked the host for the spin, and a read on an idle stream waited for another
 * stream's queue, where API.md says a read waits for its own stream only and the CPU backend's uploads
 * never block. So a buffer still in flight is not waited for: an upload then goes from the caller's
 * memory (the driver copies pageable memory to its own staging before cudaMemcpyAsync returns), and a
 * read waits for its own stream and then copies to pageable memory directly.
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

static int stages_ready;

static int stage_ready(void) {
  if (stages_ready) return TPSH_OK;
  for (int i = 0; i < 2; i++) {      /* after a failure, the next call makes what is still missing */
    if (!stages[i].buf) CUDA_TRY(cudaMallocHost(&stages[i].buf, STAGE_BYTES));
    if (!stages[i].done) CUDA_TRY(cudaEventCreateWithFlags(&stages[i].done, cudaEventDisableTiming));
  }
  stages_ready = 1;
  return TPSH_OK;
}

/* Whether the next buffer is free now, without waiting: not in flight, or its copy has completed. */
static int stage_free_now(int which) {
  stage *sg = &stages[which];
  if (!sg->pending) return 1;
  cudaError_t e = cudaEventQuery(sg->done);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();        /* not ready, or an error that stage_take's wait will report */
    return 0;
  }
  sg->pending = 0;
  return 1;
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
  stages_ready = 0;
  for (int i = 0; i < 2; i++) {
    if (stages[i].done) {
      cudaEventSynchronize(stages[i].done);
      cudaEventDestroy(stages[i].done);
      stages[i].done = NULL;
    }
    if (stages[i].buf) cudaFreeHost(stages[i].buf);
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

/* A read while a buffer it needs still holds a copy of another stream: wait for this stream only
 * (interruptibly, polling NCCL), then let the driver copy to pageable memory; st is idle by then, so
 * the copy is all that cudaStreamSynchronize waits for. */
static int download_direct(tpsh_stream *s, const char *src, char *dst, size_t n) {
  cudaStream_t st = tpsh_cuda_stream(s);
  int rc = tpsh_cuda_stream_synchronize(s);
  if (rc) return rc;
  CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, st));
  CUDA_TRY(cudaStreamSynchronize(st));
  return TPSH_OK;
}

int tpsh_cuda_to_host(tpsh_stream *s, const tpsh_kargs *k, void *dst) {
  const tpsh_tensor *t = &k->t[0];
  size_t n = tensor_bytes(t);
  cudaStream_t st = tpsh_cuda_stream(s);
  int rc = stage_ready();
  if (rc || n == 0) return rc ? rc : tpsh_cuda_stream_synchronize(s);
  /* the buffers download() takes first: the next, and the other one too for more than one chunk */
  int direct = !stage_free_now(next_stage) || (n > STAGE_BYTES && !stage_free_now(next_stage ^ 1));
  const char *src = k->data[0];
  void *tmp = NULL;
  if (!tpsh_cuda_is_dense(t)) {        /* gather on the device first: one DMA instead of many */
    tmp = tpsh_cuda_scratch_alloc(n, st);
    if (!tmp) return TPSH_ENOMEM;
    tpsh_tensor c = dense_like(t);
    rc = tpsh_cuda_copy(st, &c, tmp, t, src);
    src = tmp;
  }
  if (rc == TPSH_OK) rc = direct ? download_direct(s, src, dst, n) : download(st, src, dst, n);
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
  /* src is copied into pinned memory before this returns; the DMAs may still be in flight then. A
   * buffer still in flight from an earlier call is not waited for (the top of the file says why); one
   * that this call filled is, as its DMA is this upload's own. */
  int earlier[2] = {stages[0].pending, stages[1].pending};
  for (size_t off = 0; off < n; off += STAGE_BYTES) {
    size_t len = n - off < STAGE_BYTES ? n - off : STAGE_BYTES;
    int i = next_stage;
    if (earlier[i] && !stage_free_now(i)) {
      next_stage ^= 1;                       /* the other buffer may be free for the next piece */
      CUDA_TRY(cudaMemcpyAsync(dst + off, (const char *)src + off, len, cudaMemcpyHostToDevice, st));
      continue;
    }
    earlier[i] = 0;
    stage *sg;
    if ((rc = stage_take(&sg))) return rc;
    memcpy(sg->buf, (const char *)src + off, len);
    CUDA_TRY(cudaMemcpyAsync(dst + off, sg->buf, len, cudaMemcpyHostToDevice, st));
    CUDA_TRY(cudaEventRecord(sg->done, st));
    sg->pending = 1;
  }
  return TPSH_OK;
}
