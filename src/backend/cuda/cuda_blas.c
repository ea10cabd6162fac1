/*
 * cuda_blas.c: TPSH_K_MATMUL on the GPU, t[0] (m,n) = t[1] (m,k) @ t[2] (k,n), through cublasGemmEx.
 *
 * tpsh tensors are row-major and cuBLAS is column-major. A row-major matrix is the column-major
 * storage of its transpose, so a row-major C is computed as C^T = B^T A^T with the operands passed as
 * they lie; an operand (or output) whose rows are strided but whose columns are contiguous is a
 * column-major matrix, which cuBLAS reads with the opposite transpose flag. Only an operand with no
 * unit stride at all is first copied to a contiguous temporary on the stream (and an output of that
 * kind is computed into one and scattered back). The rule is cpu_matmul.c's, so both backends accept
 * the same views without copies. A batch (3-D operands, tpsh_bmm) is one cublasGemmStridedBatchedEx:
 * each operand's matrices are views of one layout a fixed stride apart (dim 0's), which every 3-D
 * tensor is. addmm's alpha and beta are cuBLAS's; an output staged through a temporary is loaded into
 * it first when beta is not 0.
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
 * would block the host behind whatever the streams are running (examples/gather.lua's third schedule:
 * 171 ms of host time behind a spin). */
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
  long long batch_stride; /* elements from one matrix to the next (a 3-D tensor's dim 0) */
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

/* The matrix of t (its last two dims) as a 2-D descriptor. */
static tpsh_tensor matrix_of(const tpsh_tensor *t) {
  tpsh_tensor m = *t;
  m.ndim = 2;
  for (int d = 0; d < 2; d++) {
    m.sizes[d] = t->sizes[t->ndim - 2 + d];
    m.strides[d] = t->strides[t->ndim - 2 + d];
  }
  return m;
}

/* t's shape, contiguous */
static tpsh_tensor dense_of(const tpsh_tensor *t) {
  tpsh_tensor c = *t;
  c.offset = 0;
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    c.strides[d] = stride;
    stride *= max1(t->sizes[d]);
  }
  return c;
}

static int stage(operand *op, const tpsh_tensor *t, void *data, cudaStream_t st, int load) {
  op->tmp = NULL;
  tpsh_tensor m = matrix_of(t);
  int64_t batch = t->ndim == 3 ? t->sizes[0] : 1;
  if (blas_view(&m, &op->row_major, &op->ld) && (batch <= 1 || t->strides[0] >= 0)) {
    op->p = data;
    op->batch_stride = batch > 1 ? t->strides[0] : 0;
    return TPSH_OK;
  }
  tpsh_note_matmul_staged();
  size_t bytes = (size_t)tpsh_tensor_numel(t) * (size_t)tpsh_dtype_size(t->dtype_id);
  if (!(op->tmp = tpsh_cuda_scratch_alloc(bytes, st))) return TPSH_ENOMEM;
  op->p = op->tmp;
  op->row_major = 1;
  op->ld = max1(m.sizes[1]);
  op->batch_stride = m.sizes[0] * m.sizes[1];
  if (!load) return TPSH_OK;
  tpsh_tensor c = dense_of(t);
  return tpsh_cuda_copy(st, &c, op->tmp, t, data);
}

/* ==== the GEMM =================================================================================== */
static int gemm(int dt, int allow_tf32, const operand *a, const operand *b, const operand *c, int64_t m,
                int64_t n, int64_t k, int64_t batch, double alpha, double beta) {
  cudaDataType_t type;
  cublasComputeType_t compute;
  float alpha_f = (float)alpha, beta_f = (float)beta;
  const void *al = &alpha_f, *be = &beta_f;
  switch (dt) {
  case TPSH_F32: type = CUDA_R_32F; compute = allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F; break;
  case TPSH_F16: type = CUDA_R_16F; compute = CUBLAS_COMPUTE_32F; break;
  case TPSH_BF16: type = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; break;
  default: type = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; al = &alpha; be = &beta; break;
  }
  /* a row-major C is the column-major C^T (n x m) = B^T (n x k) A^T (k x m); a column-major one is
   * C (m x n) = A (m x k) B (k x n), every operand with the transpose flag of its own layout */
  int rm = c->row_major;
  const operand *x = rm ? b : a, *y = rm ? a : b;
  cublasOperation_t ox = x->row_major == rm ? CUBLAS_OP_N : CUBLAS_OP_T, oy = y->row_major == rm ? CUBLAS_OP_N : CUBLAS_OP_T;
  int rows = (int)(rm ? n : m), cols = (int)(rm ? m : n);
  cublasStatus_t st;
  if (batch <= 1)
    st = cublasGemmEx(handle, ox, oy, rows, cols, (int)k, al, x->p, type, (int)x->ld, y->p, type, (int)y->ld, be, c->p,
                      type, (int)c->ld, compute, CUBLAS_GEMM_DEFAULT);
  else
    st = cublasGemmStridedBatchedEx(handle, ox, oy, rows, cols, (int)k, al, x->p, type, (int)x->ld, x->batch_stride,
                                    y->p, type, (int)y->ld, y->batch_stride, be, c->p, type, (int)c->ld,
                                    c->batch_stride, (int)batch, compute, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) {
    char call[128];
    snprintf(call, sizeof call, "%s (%s, %lld x %lldx%lldx%lld)", batch <= 1 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx",
             tpsh_dtype_name(dt), (long long)batch, (long long)m, (long long)k, (long long)n);
    return blas_fail(st, call);
  }
  return TPSH_OK;
}

/* An empty sum (k = 0): zeros, or beta * out for addmm, without relying on cuBLAS's k = 0 corner. */
static int empty_product(cudaStream_t st, const tpsh_kargs *k) {
  double beta = k->i[1] ? k->s[1] : 0.0;
  tpsh_kargs z = {.op = beta != 0 ? TPSH_K_SCALE : TPSH_K_FILL, .nt = beta != 0 ? 2 : 1, .name = k->name};
  z.t[0] = z.t[1] = k->t[0];
  z.data[0] = z.data[1] = k->data[0];
  z.s[0] = beta;
  return tpsh_cuda_kernel(st, &z);
}

/* Integer products, one tiled kernel launch per matrix of a batch. */
static int matmul_int(cudaStream_t st, const tpsh_kargs *k) {
  if (k->t[0].ndim == 2) return tpsh_cuda_matmul_int(st, k);
  tpsh_kargs one = *k;
  for (int64_t i = 0; i < k->t[1].sizes[0]; i++) {
    for (int j = 0; j < 3; j++) {
      one.t[j] = matrix_of(&k->t[j]);
      one.data[j] = (char *)k->data[j] + i * k->t[j].strides[0] * (int64_t)tpsh_tensor_elsize(&k->t[j]);
    }
    int rc = tpsh_cuda_matmul_int(st, &one);
    if (rc) return rc;
  }
  return TPSH_OK;
}

int tpsh_cuda_matmul(tpsh_stream *s, const tpsh_kargs *k) {
  const tpsh_tensor *tc = &k->t[0], *ta = &k->t[1], *tb = &k->t[2];
  int nd = ta->ndim, base = nd - 2;
  if ((nd != 2 && nd != 3) || tc->ndim != nd || tb->ndim != nd || ta->sizes[base + 1] != tb->sizes[base] ||
      tc->sizes[base] != ta->sizes[base] || tc->sizes[base + 1] != tb->sizes[base + 1] ||
      (nd == 3 && (tb->sizes[0] != ta->sizes[0] || tc->sizes[0] != ta->sizes[0])))
    return tpsh_error(TPSH_EINVAL, "matmul: expected (m,n) = (m,k) @ (k,n) with 2-D tensors, or a batch of them (3-D)");
  int64_t m = ta->sizes[base], kk = ta->sizes[base + 1], n = tb->sizes[base + 1], batch = nd == 3 ? ta->sizes[0] : 1;
  cudaStream_t st = tpsh_cuda_stream(s);
  if (m == 0 || n == 0 || batch == 0) return TPSH_OK;
  if (kk == 0) return empty_product(st, k);
  int dt = tc->dtype_id;
  if (!(dt == TPSH_F32 || dt == TPSH_F16 || dt == TPSH_BF16 || dt == TPSH_F64)) return matmul_int(st, k);
  double alpha = k->i[1] ? k->s[0] : 1.0, beta = k->i[1] ? k->s[1] : 0.0;
  int rc = bind(s);
  if (rc) return rc;
  operand a = {0}, b = {0}, c = {0};
  rc = stage(&a, ta, k->data[1], st, 1);
  if (rc == TPSH_OK) rc = stage(&b, tb, k->data[2], st, 1);
  if (rc == TPSH_OK) rc = stage(&c, tc, k->data[0], st, beta != 0);
  if (rc == TPSH_OK) rc = gemm(dt, k->i[0] == 1, &a, &b, &c, m, n, kk, batch, alpha, beta);
  if (rc == TPSH_OK && c.tmp) {
    tpsh_tensor dense = dense_of(tc);
    rc = tpsh_cuda_copy(st, tc, k->data[0], &dense, c.tmp);
  }
  tpsh_cuda_scratch_free(a.tmp, st);
  tpsh_cuda_scratch_free(b.tmp, st);
  tpsh_cuda_scratch_free(c.tmp, st);
  return rc;
}
