/*
 * cuda_blas.c: TPSH_K_MATMUL on the GPU, t[0] (m,n) = t[1] (m,k) @ t[2] (k,n), through cublasGemmEx.
 *
 * tpsh tensors are row-major and cuBLAS is column-major. A row-major matrix is the column-major
 * storage of its transpose, so a row-major C is computed as C^T = B^T A^T with the operands passed as
 * they lie; an operand (or output) whose rows are strided but whose columns are contiguous is a
 * column-major matrix, which cuBLAS reads with the opposite transpose flag. Only an operand with no
 * unit stride at all is first copied to a contiguous temporary on the stream (and an output of that
 * kind is computed into one and scattered back). The rule is cpu_matmul.c's, so both backends accept
 * the same views without copies.
 *
 * Precision: f32 runs in full f32 (TF32 only when the op asks, i[0] = 1: it changes results, so it is
 * opt-in as in PyTorch); f16 and bf16 accumulate in f32 with split-K reductions also in f32; f64 in
 * f64. Integers go to a tiled kernel in cuda_kernels.cu.
 *
 * One cuBLAS handle serves every stream: it is bound to the stream and to that stream's own workspace
 * just before each call (cublasSetStream resets the workspace), because two GEMMs running
 * concurrently on two streams must not share scratch memory. A handle per stream would do the same,
 * but cublasDestroy synchronises the device, which a stream's garbage collection must not do.
 */
#include "backend/cuda/cuda_backend.h"
#include <cublas_v2.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define WORKSPACE_BYTES ((size_t)32 << 20)   /* what NVIDIA recommends for Hopper */

static cublasHandle_t handle;

static int blas_fail(cublasStatus_t st, const char *call) {
  (void)cudaGetLastError();
  return tpsh_error(st == CUBLAS_STATUS_ALLOC_FAILED ? TPSH_ENOMEM : TPSH_EBACKEND, "%s failed on rank %d: %s (%s)",
                    call, tpsh_rt.rank, cublasGetStatusString(st), cublasGetStatusName(st));
}
#define BLAS_TRY(name, call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) return blas_fail(s_, name); } while (0)

const char *tpsh_cuda_blas_version(void) {
  static char buf[64];
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  snprintf(buf, sizeof buf, "cuBLAS %d.%d.%d", major, minor, patch);
  return buf;
}

void tpsh_cuda_blas_release(cuda_stream *cs) {
  if (cs->blas_ws) tpsh_cuda_scratch_free(cs->blas_ws, cs->stream);   /* stream-ordered: no host wait */
  cs->blas_ws = NULL;
}

void tpsh_cuda_blas_shutdown(void) {
  if (handle) cublasDestroy(handle);
  handle = NULL;
}

/* At backend start-up: cublasCreate synchronises the device, so made lazily by the first matmul it
 * would block the host behind whatever the streams are running (seen in examples/gather.lua's third
 * schedule: 171 ms of host time behind a spin, on the GPU only). */
int tpsh_cuda_blas_init(void) {
  if (handle) return TPSH_OK;
  BLAS_TRY("cublasCreate", cublasCreate(&handle));
  BLAS_TRY("cublasSetMathMode", cublasSetMathMode(handle, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  return TPSH_OK;
}

static int bind(tpsh_stream *s) {
  cuda_stream *cs = s->impl;
  if (!handle) {
    int rc = tpsh_cuda_blas_init();
    if (rc) return rc;
  }
  /* The workspace outlives the call: allocated for no stream in particular, so that the first matmul of a
   * stream may be inside a graph's capture (on the capturing stream it would be memory of the graph). */
  if (!cs->blas_ws && !(cs->blas_ws = tpsh_cuda_alloc(WORKSPACE_BYTES, NULL))) return TPSH_ENOMEM;
  BLAS_TRY("cublasSetStream", cublasSetStream(handle, cs->stream));
  BLAS_TRY("cublasSetWorkspace", cublasSetWorkspace(handle, cs->blas_ws, WORKSPACE_BYTES));
  return TPSH_OK;
}

/* ==== operands ================================================================================== */
static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

typedef struct operand {
  void *p;
  int row_major;          /* else column-major */
  int64_t ld;
  void *tmp;              /* a contiguous copy in device scratch, or NULL */
} operand;

/* Whether cuBLAS can address t as it lies (cpu_matmul.c's blas_view). A dim of size 1 may carry any
 * stride; ld must still be at least the contiguous extent. Negative or zero strides do not qualify. */
static int blas_view(const tpsh_tensor *t, int *row_major, int64_t *ld) {
  int64_t rows = t->sizes[0], cols = t->sizes[1], s0 = t->strides[0], s1 = t->strides[1];
  if (cols <= 1 || s1 == 1) {
    int64_t l = rows <= 1 ? max1(cols) : s0;
    if (l >= max1(cols) && l <= INT_MAX) { *row_major = 1; *ld = l; return 1; }
  }
  if (rows <= 1 || s0 == 1) {
    int64_t l = cols <= 1 ? max1(rows) : s1;
    if (l >= max1(rows) && l <= INT_MAX) { *row_major = 0; *ld = l; return 1; }
  }
  return 0;
}

static tpsh_tensor dense_2d(const tpsh_tensor *t) {
  tpsh_tensor c = *t;
  c.offset = 0;
  c.strides[1] = 1;
  c.strides[0] = max1(t->sizes[1]);
  return c;
}

static int stage(operand *op, const tpsh_tensor *t, void *data, cudaStream_t st, int load) {
  op->tmp = NULL;
  if (blas_view(t, &op->row_major, &op->ld)) {
    op->p = data;
    return TPSH_OK;
  }
  size_t bytes = (size_t)t->sizes[0] * (size_t)t->sizes[1] * (size_t)tpsh_dtype_size(t->dtype_id);
  if (!(op->tmp = tpsh_cuda_scratch_alloc(bytes, st))) return TPSH_ENOMEM;
  op->p = op->tmp;
  op->row_major = 1;
  op->ld = max1(t->sizes[1]);
  if (!load) return TPSH_OK;
  tpsh_tensor c = dense_2d(t);
  return tpsh_cuda_copy(st, &c, op->tmp, t, data);
}

/* ==== the GEMM =================================================================================== */
static int gemm(int dt, int allow_tf32, const operand *a, const operand *b, const operand *c, int64_t m,
                int64_t n, int64_t k) {
  cudaDataType_t type;
  cublasComputeType_t compute;
  float one_f = 1.0f, zero_f = 0.0f;
  double one_d = 1.0, zero_d = 0.0;
  const void *alpha = &one_f, *beta = &zero_f;
  switch (dt) {
  case TPSH_F32: type = CUDA_R_32F; compute = allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F; break;
  case TPSH_F16: type = CUDA_R_16F; compute = CUBLAS_COMPUTE_32F; break;
  case TPSH_BF16: type = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; break;
  default: type = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; alpha = &one_d; beta = &zero_d; break;
  }
  cublasStatus_t st;
  if (c->row_major)      /* C^T (n x m) = B^T (n x k) A^T (k x m) */
    st = cublasGemmEx(handle, b->row_major ? CUBLAS_OP_N : CUBLAS_OP_T, a->row_major ? CUBLAS_OP_N : CUBLAS_OP_T,
                      (int)n, (int)m, (int)k, alpha, b->p, type, (int)b->ld, a->p, type, (int)a->ld, beta, c->p, type,
                      (int)c->ld, compute, CUBLAS_GEMM_DEFAULT);
  else                   /* C (m x n) = A (m x k) B (k x n), all column-major */
    st = cublasGemmEx(handle, a->row_major ? CUBLAS_OP_T : CUBLAS_OP_N, b->row_major ? CUBLAS_OP_T : CUBLAS_OP_N,
                      (int)m, (int)n, (int)k, alpha, a->p, type, (int)a->ld, b->p, type, (int)b->ld, beta, c->p, type,
                      (int)c->ld, compute, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) {
    char call[96];
    snprintf(call, sizeof call, "cublasGemmEx (%s, %lldx%lldx%lld)", tpsh_dtype_name(dt), (long long)m,
             (long long)k, (long long)n);
    return blas_fail(st, call);
  }
  return TPSH_OK;
}

int tpsh_cuda_matmul(tpsh_stream *s, const tpsh_kargs *k) {
  const tpsh_tensor *tc = &k->t[0], *ta = &k->t[1], *tb = &k->t[2];
  if (tc->ndim != 2 || ta->ndim != 2 || tb->ndim != 2 || ta->sizes[1] != tb->sizes[0] || tc->sizes[0] != ta->sizes[0] ||
      tc->sizes[1] != tb->sizes[1])
    return tpsh_error(TPSH_EINVAL, "matmul: expected (m,n) = (m,k) @ (k,n) with 2-D tensors");
  int64_t m = ta->sizes[0], kk = ta->sizes[1], n = tb->sizes[1];
  cudaStream_t st = tpsh_cuda_stream(s);
  if (m == 0 || n == 0) return TPSH_OK;
  int dt = tc->dtype_id;
  if (kk == 0 || !(dt == TPSH_F32 || dt == TPSH_F16 || dt == TPSH_BF16 || dt == TPSH_F64)) {
    if (kk > 0) return tpsh_cuda_matmul_int(st, k);
    tpsh_kargs fill = {.op = TPSH_K_FILL, .nt = 1, .name = "matmul"};   /* an empty sum: zeros */
    fill.t[0] = *tc;
    fill.data[0] = k->data[0];
    return tpsh_cuda_kernel(st, &fill);
  }
  int rc = bind(s);
  if (rc) return rc;
  operand a = {0}, b = {0}, c = {0};
  rc = stage(&a, ta, k->data[1], st, 1);
  if (rc == TPSH_OK) rc = stage(&b, tb, k->data[2], st, 1);
  if (rc == TPSH_OK) rc = stage(&c, tc, k->data[0], st, 0);
  if (rc == TPSH_OK) rc = gemm(dt, k->i[0] == 1, &a, &b, &c, m, n, kk);
  if (rc == TPSH_OK && c.tmp) {
    tpsh_tensor dense = dense_2d(tc);
    rc = tpsh_cuda_copy(st, tc, k->data[0], &dense, c.tmp);
  }
  tpsh_cuda_scratch_free(a.tmp, st);
  tpsh_cuda_scratch_free(b.tmp, st);
  tpsh_cuda_scratch_free(c.tmp, st);
  return rc;
}
