/*
 * cpu_matmul.c: TPSH_K_MATMUL on the CPU, t[0] (m,n) = t[1] (m,k) @ t[2] (k,n).
 *
 * f32 and f64 go to OpenBLAS gemm. BLAS reads any matrix whose rows or columns are contiguous, so an
 * operand with a unit stride is passed as it is (row-major, or transposed); anything else, and every
 * f16/bf16 operand, is first copied into a contiguous temporary of the compute dtype (f32, or f64 if
 * any operand is f64). The output is written in place when BLAS can address it, else computed into a
 * temporary and scattered with the copy kernel, which rounds to f16/bf16 to nearest even (loaded
 * into the temporary first when beta is not 0: addmm reads its output). Integer matmuls accumulate in
 * int64 with wrap-around (cpu_kernels.h) in a plain loop: they exist for completeness, not speed. The
 * i[0] "allow tf32" flag has no meaning on the CPU and is ignored. A batched (3-D) product is a loop of
 * 2-D products over dim 0, each staged only where its operand needs it.
 */
#include "backend/cpu/cpu_kernels.h"
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static int is_float(int dt) { return dt == TPSH_F32 || dt == TPSH_F16 || dt == TPSH_BF16 || dt == TPSH_F64; }

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

static tpsh_tensor contiguous_2d(int dtype, int64_t rows, int64_t cols) {
  tpsh_tensor t;
  memset(&t, 0, sizeof t);
  t.ndim = 2;
  t.dtype_id = dtype;
  t.device = -1;
  t.sizes[0] = rows;
  t.sizes[1] = cols;
  t.strides[0] = cols;
  t.strides[1] = 1;
  return t;
}

/* Whether BLAS can read t as it lies: row-major with a unit column stride (NoTrans, ld = stride[0]),
   or column-major (Trans, ld = stride[1]). A dim of size 1 may carry any stride, and BLAS still wants
   ld >= max(1, the contiguous extent). Negative or zero (broadcast) strides do not qualify. */
static int blas_view(const tpsh_tensor *t, CBLAS_TRANSPOSE *tr, blasint *ld) {
  int64_t rows = t->sizes[0], cols = t->sizes[1], s0 = t->strides[0], s1 = t->strides[1];
  if (cols <= 1 || s1 == 1) {
    int64_t l = rows <= 1 ? max1(cols) : s0;
    if (l >= max1(cols) && l <= INT_MAX) { *tr = CblasNoTrans; *ld = (blasint)l; return 1; }
  }
  if (rows <= 1 || s0 == 1) {
    int64_t l = cols <= 1 ? max1(rows) : s1;
    if (l >= max1(rows) && l <= INT_MAX) { *tr = CblasTrans; *ld = (blasint)l; return 1; }
  }
  return 0;
}

static CBLAS_TRANSPOSE flip(CBLAS_TRANSPOSE t) { return t == CblasNoTrans ? CblasTrans : CblasNoTrans; }

static void *alloc_matrix(int64_t rows, int64_t cols, size_t elsize, int zero) {
  if (rows > 0 && cols > 0 && (uint64_t)rows > SIZE_MAX / elsize / (uint64_t)cols) return NULL;
  size_t bytes = (size_t)rows * (size_t)cols * elsize;
  return zero ? calloc(bytes ? bytes : 1, 1) : malloc(bytes ? bytes : 1);
}

typedef struct operand {
  const void *p;
  CBLAS_TRANSPOSE tr;
  blasint ld;
  void *tmp;                 /* owned copy, or NULL when p is the tensor itself */
} operand;

/* Makes t readable by gemm in the compute dtype cd, copying only when it must. */
static int stage(operand *op, const tpsh_tensor *t, const void *data, int cd) {
  op->tmp = NULL;
  if (t->dtype_id == cd && blas_view(t, &op->tr, &op->ld)) {
    op->p = data;
    return TPSH_OK;
  }
  tpsh_note_matmul_staged();
  int64_t rows = t->sizes[0], cols = t->sizes[1];
  op->tmp = alloc_matrix(rows, cols, cd == TPSH_F32 ? 4 : 8, 0);
  if (!op->tmp) return tpsh_error(TPSH_ENOMEM, "matmul: cannot allocate a %lldx%lld temporary", (long long)rows,
                                  (long long)cols);
  tpsh_tensor c = contiguous_2d(cd, rows, cols);
  op->p = op->tmp;
  op->tr = CblasNoTrans;
  op->ld = (blasint)max1(cols);
  return tpsh_cpu_copy(&c, op->tmp, t, data);
}

static int matmul_blas(const tpsh_kargs *k, int cd, int64_t m, int64_t n, int64_t kk) {
  const tpsh_tensor *c = &k->t[0];
  double alpha = k->i[1] ? k->s[0] : 1.0, beta = k->i[1] ? k->s[1] : 0.0;
  operand a, b, out;
  a.tmp = b.tmp = out.tmp = NULL;
  int rc = stage(&a, &k->t[1], k->data[1], cd);
  if (rc == TPSH_OK) rc = stage(&b, &k->t[2], k->data[2], cd);
  if (rc != TPSH_OK) goto done;
  /* the core forbids out sharing an operand's storage; a temp keeps a stray alias from corrupting gemm */
  int direct = c->dtype_id == cd && k->data[0] != k->data[1] && k->data[0] != k->data[2] &&
               blas_view(c, &out.tr, &out.ld);
  if (direct) {
    out.p = k->data[0];
  } else {
    tpsh_note_matmul_staged();
    out.tmp = alloc_matrix(m, n, cd == TPSH_F32 ? 4 : 8, 0);
    if (!out.tmp) { rc = tpsh_error(TPSH_ENOMEM, "matmul: cannot allocate the %lldx%lld result", (long long)m, (long long)n); goto done; }
    out.p = out.tmp;
    out.tr = CblasNoTrans;
    out.ld = (blasint)max1(n);
    if (beta != 0) {              /* gemm adds beta * out: the temporary starts as out */
      tpsh_tensor t = contiguous_2d(cd, m, n);
      rc = tpsh_cpu_copy(&t, out.tmp, c, k->data[0]);
      if (rc != TPSH_OK) goto done;
    }
  }
  /* A column-major output is the row-major C^T = B^T A^T. */
  blasint M = (blasint)m, N = (blasint)n, K = (blasint)kk;
  if (cd == TPSH_F32) {
    float al = (float)alpha, be = (float)beta;
    if (out.tr == CblasNoTrans)
      cblas_sgemm(CblasRowMajor, a.tr, b.tr, M, N, K, al, a.p, a.ld, b.p, b.ld, be, (float *)out.p, out.ld);
    else
      cblas_sgemm(CblasRowMajor, flip(b.tr), flip(a.tr), N, M, K, al, b.p, b.ld, a.p, a.ld, be, (float *)out.p, out.ld);
  } else {
    if (out.tr == CblasNoTrans)
      cblas_dgemm(CblasRowMajor, a.tr, b.tr, M, N, K, alpha, a.p, a.ld, b.p, b.ld, beta, (double *)out.p, out.ld);
    else
      cblas_dgemm(CblasRowMajor, flip(b.tr), flip(a.tr), N, M, K, alpha, b.p, b.ld, a.p, a.ld, beta, (double *)out.p, out.ld);
  }
  if (out.tmp) {
    tpsh_tensor t = contiguous_2d(cd, m, n);
    rc = tpsh_cpu_copy(c, k->data[0], &t, out.tmp);
  }
done:
  free(a.tmp);
  free(b.tmp);
  free(out.tmp);
  return rc;
}

static int matmul_int(const tpsh_kargs *k, int64_t m, int64_t n, int64_t kk) {
  uint64_t *a = alloc_matrix(m, kk, 8, 0), *b = alloc_matrix(kk, n, 8, 0), *acc = alloc_matrix(m, n, 8, 1);
  int rc = TPSH_OK;
  if (!a || !b || !acc) {
    rc = tpsh_error(TPSH_ENOMEM, "matmul: cannot allocate int64 temporaries for %lldx%lldx%lld", (long long)m,
                    (long long)kk, (long long)n);
    goto done;
  }
  tpsh_tensor ta = contiguous_2d(TPSH_I64, m, kk), tb = contiguous_2d(TPSH_I64, kk, n);
  rc = tpsh_cpu_copy(&ta, a, &k->t[1], k->data[1]);
  if (rc == TPSH_OK) rc = tpsh_cpu_copy(&tb, b, &k->t[2], k->data[2]);
  if (rc != TPSH_OK) goto done;
  /* i-p-j order: the inner loop streams rows of b and of the accumulator */
  for (int64_t i = 0; i < m; i++)
    for (int64_t p = 0; p < kk; p++) {
      uint64_t x = a[i * kk + p];
      const uint64_t *brow = b + p * n;
      uint64_t *crow = acc + i * n;
      for (int64_t j = 0; j < n; j++) crow[j] += x * brow[j];
    }
  tpsh_tensor tc = contiguous_2d(TPSH_I64, m, n);
  rc = tpsh_cpu_copy(&k->t[0], k->data[0], &tc, acc);
done:
  free(a);
  free(b);
  free(acc);
  return rc;
}

/* One 2-D product: k's tensors are 2-D. */
static int matmul_2d(const tpsh_kargs *k) {
  const tpsh_tensor *c = &k->t[0], *a = &k->t[1], *b = &k->t[2];
  int64_t m = a->sizes[0], kk = a->sizes[1], n = b->sizes[1];
  if (m == 0 || n == 0) return TPSH_OK;
  if (kk == 0) {             /* an empty sum: zeros (beta * out for addmm), without gemm's k = 0 corner */
    double beta = k->i[1] ? k->s[1] : 0.0;
    tpsh_kargs z = {.op = beta != 0 ? TPSH_K_SCALE : TPSH_K_FILL, .nt = beta != 0 ? 2 : 1, .name = k->name};
    z.t[0] = z.t[1] = *c;
    z.data[0] = z.data[1] = k->data[0];
    z.s[0] = beta != 0 ? beta : 0.0;
    return tpsh_cpu_kernel_run(&z);
  }
  int da = a->dtype_id, db = b->dtype_id, dc = c->dtype_id;
  if (!is_float(da) && !is_float(db) && !is_float(dc)) return matmul_int(k, m, n, kk);
  int cd = da == TPSH_F64 || db == TPSH_F64 || dc == TPSH_F64 ? TPSH_F64 : TPSH_F32;
  return matmul_blas(k, cd, m, n, kk);
}

/* t's matrix number i of a 3-D tensor, as a 2-D descriptor, and its data */
static tpsh_tensor batch_slice(const tpsh_tensor *t, void *data, int64_t i, void **slice_data) {
  tpsh_tensor s = *t;
  s.ndim = 2;
  for (int d = 0; d < 2; d++) { s.sizes[d] = t->sizes[d + 1]; s.strides[d] = t->strides[d + 1]; }
  *slice_data = (char *)data + i * t->strides[0] * (int64_t)tpsh_tensor_elsize(t);
  return s;
}

int tpsh_cpu_matmul(const tpsh_kargs *k) {
  const tpsh_tensor *c = &k->t[0], *a = &k->t[1], *b = &k->t[2];
  int nd = a->ndim, base = nd - 2;
  if ((nd != 2 && nd != 3) || c->ndim != nd || b->ndim != nd || a->sizes[base + 1] != b->sizes[base] ||
      c->sizes[base] != a->sizes[base] || c->sizes[base + 1] != b->sizes[base + 1] ||
      (nd == 3 && (b->sizes[0] != a->sizes[0] || c->sizes[0] != a->sizes[0])))
    return tpsh_error(TPSH_EINVAL, "matmul: expected (m,n) = (m,k) @ (k,n) with 2-D tensors, or a batch of them (3-D)");
  if (nd == 2) return matmul_2d(k);
  tpsh_kargs one = *k;
  for (int64_t i = 0; i < a->sizes[0]; i++) {
    for (int j = 0; j < 3; j++) one.t[j] = batch_slice(&k->t[j], k->data[j], i, &one.data[j]);
    int rc = matmul_2d(&one);
    if (rc) return rc;
  }
  return TPSH_OK;
}
