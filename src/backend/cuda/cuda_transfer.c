/*
 * cuda_transfer.c: tensors to and from the host through pinned staging buffers.
 *
 * Copies from pageable memory are staged by the driver anyway, synchronously and in small pieces; our
 * own pinned buffers let a copy run at full PCIe/C2C speed and let from_host return before the data
 * reached the device. Buffers of STAGE_BYTES take turns, so the host's memcpy of one chunk overlaps
 * the DMA of another; each buffer carries an event that says when the DMA that used it is over, and
 * the host writes into a buffer only once that event has completed. Host thread only, like every
 * vtable call.
 *
 * The buffers serve every stream, so a buffer can still hold an upload queued behind another stream's
 * work (tp.from after a long kernel). Waiting for it would make the host wait for that stream (with two
 * buffers, the third tp.from behind a spin would block the host for the spin, and so would a read on an
 * idle stream), where API.md says a read waits for its own stream only and the CPU backend's uploads
 * never block. So there are MAX_STAGES buffers, a call takes any that is free now, and only with every one
 * in flight does it wait, for the next in turn. They are pinned at start-up, all at once
 * (tpsh_cuda_transfer_init): pinned on demand, buffers added behind a spin would cost the uploads tens
 * of ms of host time (cudaMallocHost), inside whatever loop made them. Copying straight from or to
 * pageable memory is no way out: the driver's own staging then waits. One wait is left, once a
 * process: the first read on an idle stream after the first uploads queued behind a kernel still waits
 * for that kernel (scripts/diag/diag_read_behind_spin.lua's first round, 400 ms behind a 400 ms spin, 0.0 ms
 * in every later round), and a copy out of every buffer at start-up does not change it: it is not the
 * buffers' first DMA but the driver's own first time.
 */
#include "backend/cuda/cuda_backend.h"
#include <string.h>

#define STAGE_BYTES ((size_t)16 << 20)
enum { MAX_STAGES = 8 };

typedef struct stage {
  void *buf;              /* pinned, STAGE_BYTES */
  cudaEvent_t done;       /* recorded after the last copy that used buf */
  int pending;            /* done was recorded and has not been seen complete */
  int held;               /* a download has yet to copy buf out: not free whatever done says */
} stage;

static stage stages[MAX_STAGES];
static void *pinned;              /* the buffers' memory, one allocation */
static int next_stage;

int tpsh_cuda_transfer_init(void) {
  CUDA_TRY(cudaMallocHost(&pinned, (size_t)MAX_STAGES * STAGE_BYTES));
  for (int i = 0; i < MAX_STAGES; i++) {
    stages[i].buf = (char *)pinned + (size_t)i * STAGE_BYTES;
    CUDA_TRY(cudaEventCreateWithFlags(&stages[i].done, cudaEventDisableTiming));
  }
  return TPSH_OK;
}

/* Whether the host may write into sg now, without waiting. */
static int stage_free_now(stage *sg) {
  if (sg->held) return 0;
  if (!sg->pending) return 1;
  if (cudaEventQuery(sg->done) != cudaSuccess) {
    (void)cudaGetLastError();        /* not ready, or an error that a wait on it will report */
    return 0;
  }
  sg->pending = 0;
  return 1;
}

/* Returns a buffer the host may write into now: one that is free, else (all in flight) the next in
 * turn once its copy is over. */
static int stage_take(stage **out) {
  if (!pinned) return tpsh_error(TPSH_EBACKEND, "the CUDA backend's staging buffers were not made");
  for (int k = 0; k < MAX_STAGES; k++) {
    int i = (next_stage + k) % MAX_STAGES;
    if (stage_free_now(&stages[i])) {
      next_stage = (i + 1) % MAX_STAGES;
      *out = &stages[i];
      return TPSH_OK;
    }
  }
  int i = next_stage;
  while (stages[i].held) i = (i + 1) % MAX_STAGES;     /* a download holds one at most */
  next_stage = (i + 1) % MAX_STAGES;
  int rc = tpsh_cuda_event_wait_host(stages[i].done);
  if (rc) return rc;
  stages[i].pending = 0;
  *out = &stages[i];
  return TPSH_OK;
}

void tpsh_cuda_transfer_shutdown(void) {
  for (int i = 0; i < MAX_STAGES; i++) {
    if (stages[i].done) {
      cudaEventSynchronize(stages[i].done);
      cudaEventDestroy(stages[i].done);
    }
    stages[i] = (stage){0};
  }
  if (pinned) cudaFreeHost(pinned);
  pinned = NULL;
  next_stage = 0;
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

/* Device -> host in chunks: the DMA of chunk i runs while the host copies chunk i-1 out of another
 * buffer. Everything is ordered after the work already on st. A buffer is held from its DMA until the
 * host has copied it out (stage_take would otherwise hand it out again as soon as the DMA is over). */
static int download(cudaStream_t st, const char *src, char *dst, size_t n) {
  stage *prev = NULL;
  size_t prev_off = 0, prev_len = 0;
  int rc = TPSH_OK;
  for (size_t off = 0; rc == TPSH_OK && (off < n || prev); off += STAGE_BYTES) {
    stage *sg = NULL;
    size_t len = off < n ? (n - off < STAGE_BYTES ? n - off : STAGE_BYTES) : 0;
    if (len && (rc = stage_take(&sg)) == TPSH_OK) {
      cudaError_t e = cudaMemcpyAsync(sg->buf, src + off, len, cudaMemcpyDeviceToHost, st);
      if (e == cudaSuccess) e = cudaEventRecord(sg->done, st);
      if (e != cudaSuccess) { rc = tpsh_cuda_fail(e, "cudaMemcpyAsync"); sg = NULL; }
      else { sg->pending = 1; sg->held = 1; }
    }
    if (prev) {
      if (rc == TPSH_OK && (rc = tpsh_cuda_event_wait_host(prev->done)) == TPSH_OK) {
        prev->pending = 0;
        memcpy(dst + prev_off, prev->buf, prev_len);
      }
      prev->held = 0;
    }
    prev = sg;
    prev_off = off;
    prev_len = len;
    if (!len) break;
  }
  if (prev) prev->held = 0;          /* an error after its DMA was issued */
  return rc;
}

int tpsh_cuda_to_host(tpsh_stream *s, const tpsh_kargs *k, void *dst) {
  const tpsh_tensor *t = &k->t[0];
  size_t n = tensor_bytes(t);
  cudaStream_t st = tpsh_cuda_stream(s);
  if (n == 0) return tpsh_cuda_stream_synchronize(s);
  const char *src = k->data[0];
  void *tmp = NULL;
  int rc = TPSH_OK;
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
  if (n == 0) return TPSH_OK;
  char *dst = k->data[0];
  /* src is copied into pinned memory before this returns; the DMAs may still be in flight then. */
  for (size_t off = 0; off < n; off += STAGE_BYTES) {
    size_t len = n - off < STAGE_BYTES ? n - off : STAGE_BYTES;
    stage *sg;
    int rc = stage_take(&sg);
    if (rc) return rc;
    memcpy(sg->buf, (const char *)src + off, len);
    CUDA_TRY(cudaMemcpyAsync(dst + off, sg->buf, len, cudaMemcpyHostToDevice, st));
    CUDA_TRY(cudaEventRecord(sg->done, st));
    sg->pending = 1;
  }
  return TPSH_OK;
}
