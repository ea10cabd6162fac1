/*
 * ops_reduce.c: the front door of the ops that reduce along a dimension (sum, mean, max and min with
 * or without indices), softmax and log_softmax, layer_norm and rms_norm, and of the GEMMs beyond
 * tpsh_matmul (addmm with alpha and beta, bmm). As ops.c: every check, with shapes in the messages,
 * before anything is enqueued, then one tpsh_kargs per launch through tpsh_launch.
 *
 * The kernels reduce along the last dim only: the core hands them views with the reduced dim moved
 * last (sizes and strides permuted, no copy), so that a backend has one layout to handle, rows that
 * are contiguous or strided, and the choice of dim is made here once.
 */
#include "core/internal.h"
#include <limits.h>
#include <math.h>
#include <stdio.h>

#define CHECK(expr) do { int rc_ = (expr); if (rc_) return rc_; } while (0)

static int want_float(const char *what, const tpsh_tensor *t) {
  if (tpsh_dtype_is_float(t->dtype_id)) return TPSH_OK;
  return tpsh_error(TPSH_EINVAL, "%s: expected a float dtype (f32, f64, f16 or bf16), got %s (convert with "
                    "t:to(\"f64\"))", what, tpsh_dtype_name(t->dtype_id));
}

static int want_dim(const tpsh_tensor *t, int dim) {
  if (dim >= 0 && dim < t->ndim) return TPSH_OK;
  char x[160];
  return tpsh_error(TPSH_EINVAL, "dimension %d out of range for shape %s", dim + 1, tpsh_shape_str(t, x, sizeof x));
}

static int want_sizes(const char *what, const tpsh_tensor *got, int ndim, const int64_t *sizes) {
  int ok = got->ndim == ndim;
  for (int d = 0; ok && d < ndim; d++) ok = got->sizes[d] == sizes[d];
  if (ok) return TPSH_OK;
  char e[160], g[160];
  return tpsh_error(TPSH_EINVAL, "%s: expected shape %s, got %s", what, tpsh_sizes_str(ndim, sizes, e, sizeof e),
                    tpsh_shape_str(got, g, sizeof g));
}

/* t with dim d moved last (the view the kernels reduce along its last dim) */
static tpsh_tensor dim_last(const tpsh_tensor *t, int d) {
  tpsh_tensor v = *t;
  for (int i = d; i < t->ndim - 1; i++) {
    v.sizes[i] = t->sizes[i + 1];
    v.strides[i] = t->strides[i + 1];
  }
  v.sizes[t->ndim - 1] = t->sizes[d];
  v.strides[t->ndim - 1] = t->strides[d];
  return v;
}

/* A reduced output as the kernels see it: the input's dims but d, then d of size 1. Without keepdim
 * the output lacks d, and its dims are already the first ones of that order. */
static tpsh_tensor reduced_view(const tpsh_tensor *out, int ndim, int d, int keepdim) {
  if (keepdim) return dim_last(out, d);
  tpsh_tensor v = *out;
  v.ndim = ndim;
  v.sizes[ndim - 1] = 1;
  v.strides[ndim - 1] = 1;
  return v;
}

/* ==== reductions along a dim ====================================================================== */
static const char *reduce_name(int op, int indices) {
  switch (op) {
  case TPSH_SUM: return "sum";
  case TPSH_AVG: return "mean";
  case TPSH_MAX: return indices ? "max" : "amax";
  default: return indices ? "min" : "amin";
  }
}

int tpsh_reduce_dim(tpsh_stream *s, int op, tpsh_tensor *out, tpsh_tensor *indices, const tpsh_tensor *a, int dim,
                    int keepdim) {
  CHECK(tpsh_check_tensor("out", out));
  CHECK(tpsh_check_tensor("tensor", a));
  if (indices) CHECK(tpsh_check_tensor("indices", indices));
  if (op != TPSH_SUM && op != TPSH_AVG && op != TPSH_MAX && op != TPSH_MIN)
    return tpsh_error(TPSH_EINVAL, "expected the reduction sum, avg, max or min, got op %d", op);
  if (indices && op != TPSH_MAX && op != TPSH_MIN)
    return tpsh_error(TPSH_EINVAL, "indices come with max and min only");
  CHECK(want_float("tensor", a));
  CHECK(want_dim(a, dim));
  int64_t sizes[TPSH_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < a->ndim; d++)
    if (d != dim) sizes[nd++] = a->sizes[d];
    else if (keepdim) sizes[nd++] = 1;
  CHECK(want_sizes("out", out, nd, sizes));
  CHECK(tpsh_check_same_dtype("out", a, out));
  if (indices) {
    CHECK(want_sizes("indices", indices, nd, sizes));
    if (indices->dtype_id != TPSH_I64)
      return tpsh_error(TPSH_EINVAL, "indices: expected dtype i64, got %s", tpsh_dtype_name(indices->dtype_id));
  }
  if ((op == TPSH_MAX || op == TPSH_MIN) && a->sizes[dim] == 0 && tpsh_tensor_numel(out) > 0) {
    char x[160];
    return tpsh_error(TPSH_EINVAL, "the %s over dimension %d of shape %s takes no elements, and has no identity",
                      op == TPSH_MAX ? "max" : "min", dim + 1, tpsh_shape_str(a, x, sizeof x));
  }
  CHECK(tpsh_check_no_partial_overlap("tensor", out, a));
  if (indices && indices->storage == out->storage)
    return tpsh_error(TPSH_EINVAL, "indices must not share memory with out");
  tpsh_kargs k = {.op = TPSH_K_REDUCE, .name = reduce_name(op, indices != NULL), .nw = indices ? 2 : 1};
  tpsh_tensor o = reduced_view(out, a->ndim, dim, keepdim), v = dim_last(a, dim);
  tpsh_kargs_set(&k, 0, &o);
  if (indices) {
    tpsh_tensor iv = reduced_view(indices, a->ndim, dim, keepdim);
    tpsh_kargs_set(&k, 1, &iv);
  }
  tpsh_kargs_set(&k, k.nw, &v);
  k.i[0] = op;
  return tpsh_launch(s, &k);
}

/* ==== softmax ===================================================================================== */
int tpsh_softmax(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *x, int dim, int log) {
  CHECK(tpsh_check_tensor("out", out));
  CHECK(tpsh_check_tensor("tensor", x));
  CHECK(want_float("tensor", x));
  CHECK(want_dim(x, dim));
  CHECK(tpsh_check_same_shape("out", x, out));
  CHECK(tpsh_check_same_dtype("out", x, out));
  CHECK(tpsh_check_no_partial_overlap("tensor", out, x));
  tpsh_kargs k = {.op = TPSH_K_SOFTMAX, .name = log ? "log_softmax" : "softmax"};
  tpsh_tensor o = dim_last(out, dim), v = dim_last(x, dim);
  tpsh_kargs_set(&k, 0, &o);
  tpsh_kargs_set(&k, 1, &v);
  k.i[0] = log != 0;
  return tpsh_launch(s, &k);
}

/* ==== layer_norm and rms_norm ===================================================================== */
static int want_param(const char *what, const tpsh_tensor *p, const tpsh_tensor *x, const tpsh_tensor *out) {
  if (!p) return TPSH_OK;
  CHECK(tpsh_check_tensor(what, p));
  int64_t n = x->sizes[x->ndim - 1];
  CHECK(want_sizes(what, p, 1, &n));
  CHECK(tpsh_check_same_dtype(what, x, p));
  return tpsh_check_no_partial_overlap(what, out, p);
}

static int norm(tpsh_stream *s, int rms, tpsh_tensor *out, const tpsh_tensor *x, const tpsh_tensor *weight,
                const tpsh_tensor *bias, double eps) {
  CHECK(tpsh_check_tensor("out", out));
  CHECK(tpsh_check_tensor("tensor", x));
  CHECK(want_float("tensor", x));
  if (x->ndim < 1) return tpsh_error(TPSH_EINVAL, "expected a tensor of 1 or more dimensions, got a 0-d one");
  if (!(eps >= 0) || isinf(eps)) return tpsh_error(TPSH_EINVAL, "eps must be a finite number >= 0, got %g", eps);
  CHECK(tpsh_check_same_shape("out", x, out));
  CHECK(tpsh_check_same_dtype("out", x, out));
  CHECK(tpsh_check_no_partial_overlap("tensor", out, x));
  CHECK(want_param("weight", weight, x, out));
  CHECK(want_param("bias", bias, x, out));
  tpsh_kargs k = {.op = TPSH_K_NORM, .name = rms ? "rms_norm" : "layer_norm"};
  tpsh_kargs_set(&k, 0, out);
  tpsh_kargs_set(&k, 1, x);
  k.i[0] = rms;
  if (weight) {
    k.i[1] = k.nt;
    tpsh_kargs_set(&k, k.nt, weight);
  }
  if (bias) {
    k.i[2] = k.nt;
    tpsh_kargs_set(&k, k.nt, bias);
  }
  k.s[0] = eps;
  return tpsh_launch(s, &k);
}

int tpsh_layer_norm(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *x, const tpsh_tensor *weight,
                    const tpsh_tensor *bias, double eps) {
  return norm(s, 0, out, x, weight, bias, eps);
}

int tpsh_rms_norm(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *x, const tpsh_tensor *weight, double eps) {
  return norm(s, 1, out, x, weight, NULL, eps);
}

/* ==== addmm and bmm =============================================================================== */
/* (cu)BLAS takes int dimensions; refused here, not on the CPU's stream worker (tpsh_matmul says why). */
static int want_blas_dims(const tpsh_tensor *a, const tpsh_tensor *b, int64_t m, int64_t n, int64_t kk) {
  if (!tpsh_dtype_is_float(a->dtype_id) || m == 0 || n == 0 || kk == 0 || (m <= INT_MAX && n <= INT_MAX && kk <= INT_MAX))
    return TPSH_OK;
  char x[160], y[160];
  return tpsh_error(TPSH_EUNSUPPORTED, "dimensions beyond 2^31 - 1 do not fit BLAS: %s @ %s",
                    tpsh_shape_str(a, x, sizeof x), tpsh_shape_str(b, y, sizeof y));
}

static int want_operands(const tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b, int nd) {
  char x[160], y[160];
  if (a->ndim != nd || b->ndim != nd)
    return tpsh_error(TPSH_EINVAL, "expected %d-D operands, got shapes %s and %s", nd, tpsh_shape_str(a, x, sizeof x),
                      tpsh_shape_str(b, y, sizeof y));
  if (a->sizes[nd - 1] != b->sizes[nd - 2] || (nd == 3 && a->sizes[0] != b->sizes[0]))
    return tpsh_error(TPSH_EINVAL, "%s: %s @ %s", nd == 3 ? "batch or inner dimensions differ" : "inner dimensions differ",
                      tpsh_shape_str(a, x, sizeof x), tpsh_shape_str(b, y, sizeof y));
  CHECK(tpsh_check_same_dtype("b", a, b));
  CHECK(tpsh_check_same_dtype("out", a, out));
  int64_t sizes[3] = {a->sizes[0], a->sizes[nd - 2], b->sizes[nd - 1]};
  if (nd == 2) sizes[0] = a->sizes[0], sizes[1] = b->sizes[1];
  CHECK(want_sizes("out", out, nd, sizes));
  if (out->storage == a->storage || out->storage == b->storage)
    return tpsh_error(TPSH_EINVAL, "out must not share memory with an operand");
  return want_blas_dims(a, b, a->sizes[nd - 2], b->sizes[nd - 1], a->sizes[nd - 1]);
}

/* c broadcast to out's (m, n) shape, PyTorch's rules: (m, n), (1, n), (m, 1), (n), (1) or 0-d; size-1
 * dims read with stride 0. */
static int broadcast_c(const tpsh_tensor *c, const tpsh_tensor *out, tpsh_tensor *view) {
  *view = *c;
  view->ndim = 2;
  for (int d = 0; d < 2; d++) {
    int cd = c->ndim - 2 + d;                  /* c's dim under out's dim d (aligned on the right) */
    int64_t size = cd >= 0 ? c->sizes[cd] : 1;
    if (size != out->sizes[d] && size != 1) {
      char x[160], y[160];
      return tpsh_error(TPSH_EINVAL, "c: shape %s does not broadcast to the product's %s", tpsh_shape_str(c, x, sizeof x),
                        tpsh_shape_str(out, y, sizeof y));
    }
    view->sizes[d] = out->sizes[d];
    view->strides[d] = size == 1 ? 0 : c->strides[cd];
  }
  return TPSH_OK;
}

int tpsh_addmm(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *c, const tpsh_tensor *a, const tpsh_tensor *b,
               double alpha, double beta) {
  CHECK(tpsh_check_tensor("out", out));
  CHECK(tpsh_check_tensor("c", c));
  CHECK(tpsh_check_tensor("a", a));
  CHECK(tpsh_check_tensor("b", b));
  CHECK(want_float("a", a));
  CHECK(want_operands(out, a, b, 2));
  CHECK(tpsh_check_same_dtype("c", a, c));
  if (c->ndim > 2) {
    char x[160];
    return tpsh_error(TPSH_EINVAL, "c: expected at most 2 dimensions, got shape %s", tpsh_shape_str(c, x, sizeof x));
  }
  tpsh_tensor cv;
  CHECK(broadcast_c(c, out, &cv));
  CHECK(tpsh_check_no_partial_overlap("c", out, c));
  int in_place = out->storage == c->storage && out->offset == c->offset && c->ndim == 2;
  for (int d = 0; in_place && d < 2; d++)
    in_place = c->sizes[d] == out->sizes[d] && (c->sizes[d] == 1 || c->strides[d] == out->strides[d]);
  /* c into out first, and gemm then makes it beta * c + alpha * a @ b (beta 0: c is not read, as in BLAS) */
  if (beta != 0 && !in_place) {
    tpsh_kargs copy = {.op = TPSH_K_COPY, .name = "addmm"};
    tpsh_kargs_set(&copy, 0, out);
    tpsh_kargs_set(&copy, 1, &cv);
    CHECK(tpsh_launch(s, &copy));
  }
  tpsh_kargs k = {.op = TPSH_K_MATMUL, .name = "addmm"};
  tpsh_kargs_set(&k, 0, out);
  tpsh_kargs_set(&k, 1, a);
  tpsh_kargs_set(&k, 2, b);
  k.i[1] = 1;
  k.s[0] = alpha;
  k.s[1] = beta;
  return tpsh_launch(s, &k);
}

int tpsh_bmm(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b) {
  CHECK(tpsh_check_tensor("out", out));
  CHECK(tpsh_check_tensor("a", a));
  CHECK(tpsh_check_tensor("b", b));
  CHECK(want_operands(out, a, b, 3));
  if (tpsh_dtype_is_float(a->dtype_id) && a->sizes[0] > INT_MAX)
    return tpsh_error(TPSH_EUNSUPPORTED, "a batch of %lld products does not fit cuBLAS's int count",
                      (long long)a->sizes[0]);
  tpsh_kargs k = {.op = TPSH_K_MATMUL, .name = "bmm"};
  tpsh_kargs_set(&k, 0, out);
  tpsh_kargs_set(&k, 1, a);
  tpsh_kargs_set(&k, 2, b);
  return tpsh_launch(s, &k);
}

/* ==== staged matmul operands (tests) ============================================================== */
static int64_t matmul_staged;

void tpsh_note_matmul_staged(void) { __atomic_fetch_add(&matmul_staged, 1, __ATOMIC_RELAXED); }

int64_t tpsh_matmul_staged(void) { return __atomic_load_n(&matmul_staged, __ATOMIC_RELAXED); }
