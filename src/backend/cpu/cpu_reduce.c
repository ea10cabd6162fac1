/*
 * cpu_reduce.c: TPSH_K_REDUCE, TPSH_K_SOFTMAX and TPSH_K_NORM on the CPU, ops over the last dim of
 * their input (the core moved the dim reduced there: core/ops_reduce.c).
 *
 * Every op works on rows of doubles. A block of rows is gathered by the copy kernel (any strides, any
 * float dtype, nothing rounded), computed on in double, and its results are scattered back by the copy
 * kernel, rounded once to the output's dtype (cpu_kernels.h): f16 and bf16 get the double's nearest,
 * as every other CPU op gives them. A block is a run of rows along one outer dim, the one whose
 * stride in the input is the smallest: a reduction along a dim that is not the innermost (rows far
 * apart, each row's elements next to the neighbouring rows' ones) then reads memory in runs as well.
 */
#include "backend/cpu/cpu_kernels.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK_DOUBLES = 1 << 15 };   /* rows gathered at once: 256 KiB, within a core's L2 */

/* The outer dims (the input's but the last) walked a block of rows at a time: idx[bd] steps by the
 * block, the others as an odometer. */
typedef struct walk {
  int nd, bd;                  /* outer dims; the block's (-1: every outer size is 1, one row) */
  int64_t size[TPSH_MAX_DIMS], idx[TPSH_MAX_DIMS];
} walk;

static int64_t offset_of(const walk *w, const tpsh_tensor *t) {
  int64_t off = 0;
  for (int d = 0; d < w->nd; d++) off += w->idx[d] * t->strides[d];
  return off;
}

/* Moves idx past a block of cnt rows; 0 when the walk is over. */
static int walk_next(walk *w, int64_t cnt) {
  if (w->bd >= 0 && (w->idx[w->bd] += cnt) < w->size[w->bd]) return 1;
  if (w->bd >= 0) w->idx[w->bd] = 0;
  for (int d = w->nd - 1; d >= 0; d--) {
    if (d == w->bd) continue;
    if (++w->idx[d] < w->size[d]) return 1;
    w->idx[d] = 0;
  }
  return 0;
}

/* A 2-D descriptor (rows, cols) of t's elements at `data` + off: row stride rs, column stride cs. */
static tpsh_tensor block_of(const tpsh_tensor *t, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  tpsh_tensor b;
  memset(&b, 0, sizeof b);
  b.ndim = 2;
  b.dtype_id = t->dtype_id;
  b.device = -1;
  b.sizes[0] = rows;
  b.sizes[1] = cols;
  b.strides[0] = rs;
  b.strides[1] = cs;
  return b;
}

static char *at(const tpsh_kargs *k, int i, int64_t off) {
  return (char *)k->data[i] + off * (int64_t)tpsh_tensor_elsize(&k->t[i]);
}

/* ==== one row ===================================================================================== */
/* The first max (min) and its index; a NaN is both, and the first one wins. n > 0. */
static double extreme(const double *x, int64_t n, int is_min, int64_t *at_index) {
  double v = x[0];
  int64_t best = 0;
  for (int64_t j = 0; j < n && v == v; j++) {
    double e = x[j];
    if (e != e || (is_min ? e < v : e > v)) { v = e; best = j; }
  }
  *at_index = best;
  return v;
}

/* y = softmax(x) or log_softmax(x), max-subtracted; tmp holds n doubles. */
static void softmax_row(double *x, int64_t n, int log_, double *tmp) {
  int64_t unused;
  double m = extreme(x, n, 0, &unused);
  for (int64_t j = 0; j < n; j++) tmp[j] = exp(x[j] - m);
  double s = tpsh_cpu_sum_f64(tmp, n);
  if (log_) {
    double ls = log(s);
    for (int64_t j = 0; j < n; j++) x[j] = x[j] - m - ls;
  } else {
    for (int64_t j = 0; j < n; j++) x[j] = tmp[j] / s;
  }
}

/* layer_norm (rms = 0: biased variance, two passes) or rms_norm of x in place; w and b may be NULL. */
static void norm_row(double *x, int64_t n, int rms, double eps, const double *w, const double *b, double *tmp) {
  if (rms) {
    for (int64_t j = 0; j < n; j++) tmp[j] = x[j] * x[j];
    double r = 1.0 / sqrt(tpsh_cpu_sum_f64(tmp, n) / (double)n + eps);
    for (int64_t j = 0; j < n; j++) x[j] = x[j] * r * (w ? w[j] : 1.0);
    return;
  }
  double mean = tpsh_cpu_sum_f64(x, n) / (double)n;
  for (int64_t j = 0; j < n; j++) {
    x[j] -= mean;
    tmp[j] = x[j] * x[j];
  }
  double rstd = 1.0 / sqrt(tpsh_cpu_sum_f64(tmp, n) / (double)n + eps);
  for (int64_t j = 0; j < n; j++) x[j] = x[j] * rstd * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
}

/* A 1-D tensor (weight, bias) as n doubles in buf; NULL when the op has none at that slot. */
static int gather_param(const tpsh_kargs *k, int slot, int64_t n, double *buf, double **out) {
  *out = NULL;
  if (slot <= 0) return TPSH_OK;
  const tpsh_tensor *p = &k->t[slot];
  tpsh_tensor src = block_of(p, 1, n, 0, p->strides[0]), dst = block_of(p, 1, n, 0, 1);
  dst.dtype_id = TPSH_F64;
  *out = buf;
  return tpsh_cpu_copy(&dst, buf, &src, k->data[slot]);
}

/* ==== the kernel ================================================================================== */
int tpsh_cpu_reduce(const tpsh_kargs *k, const char *name) {
  int nw = tpsh_kargs_writes(k), op = k->op;
  const tpsh_tensor *x = &k->t[nw], *out = &k->t[0];
  int nd = x->ndim - 1;
  if (nd < 0 || out->ndim != x->ndim) return tpsh_error(TPSH_EINVAL, "%s: expected views of one rank, 1-D or more", name);
  int64_t n = x->sizes[nd], rows = 1;
  walk w = {.nd = nd, .bd = -1};
  for (int d = 0; d < nd; d++) {
    w.size[d] = x->sizes[d];
    w.idx[d] = 0;
    rows *= x->sizes[d];
    if (x->sizes[d] > 1 && (w.bd < 0 || llabs(x->strides[d]) <= llabs(x->strides[w.bd]))) w.bd = d;
  }
  int reduces = op == TPSH_K_REDUCE, rop = (int)k->i[0];
  if (rows == 0 || (!reduces && n == 0)) return TPSH_OK;
  if (reduces && n == 0 && (rop == TPSH_MAX || rop == TPSH_MIN))
    return tpsh_error(TPSH_EINVAL, "%s: the max or min of no elements", name);
  int64_t len = w.bd >= 0 ? w.size[w.bd] : 1, width = n > 0 ? n : 1;
  int64_t per = BLOCK_DOUBLES / width, cnt_max = per < 1 ? 1 : per < len ? per : len;
  /* rows of the block, then a row of scratch, the block's results, weight and bias */
  size_t doubles = (size_t)(cnt_max * width + width + cnt_max + 2 * width);
  double *buf = malloc(doubles * sizeof(double));
  int64_t *index = reduces && nw == 2 ? malloc((size_t)cnt_max * sizeof(int64_t)) : NULL;
  if (!buf || (reduces && nw == 2 && !index)) {
    free(buf);
    free(index);
    return tpsh_error(TPSH_ENOMEM, "%s: cannot allocate %zu bytes of rows", name, doubles * sizeof(double));
  }
  double *tmp = buf + cnt_max * width, *res = tmp + width, *wts = NULL, *bias = NULL;
  int rc = TPSH_OK;
  if (op == TPSH_K_NORM) {
    rc = gather_param(k, (int)k->i[1], n, res + cnt_max, &wts);
    if (rc == TPSH_OK) rc = gather_param(k, (int)k->i[2], n, res + cnt_max + width, &bias);
  }
  int64_t xs = w.bd >= 0 ? x->strides[w.bd] : 0, os = w.bd >= 0 ? out->strides[w.bd] : 0, cnt = 0;
  if (rc == TPSH_OK) do {
    int64_t start = w.bd >= 0 ? w.idx[w.bd] : 0;
    cnt = len - start < cnt_max ? len - start : cnt_max;
    tpsh_tensor src = block_of(x, cnt, n, xs, x->strides[nd]), rowsd = block_of(x, cnt, n, n, 1);
    rowsd.dtype_id = TPSH_F64;
    if ((rc = tpsh_cpu_copy(&rowsd, buf, &src, at(k, nw, offset_of(&w, x)))) != TPSH_OK) break;
    if (reduces) {
      for (int64_t r = 0; r < cnt; r++) {
        const double *row = buf + r * width;
        if (rop == TPSH_MAX || rop == TPSH_MIN) {
          int64_t j;
          res[r] = extreme(row, n, rop == TPSH_MIN, &j);
          if (index) index[r] = j + 1;           /* 1-based, as the Lua API's dims */
        } else {
          res[r] = tpsh_cpu_sum_f64(row, n);
          if (rop == TPSH_AVG) res[r] /= (double)n;   /* 0 / 0: the mean of nothing is NaN */
        }
      }
      tpsh_tensor dst = block_of(out, cnt, 1, os, 1), vals = block_of(out, cnt, 1, 1, 1);
      vals.dtype_id = TPSH_F64;
      rc = tpsh_cpu_copy(&dst, at(k, 0, offset_of(&w, out)), &vals, res);
      if (rc == TPSH_OK && index) {
        const tpsh_tensor *it = &k->t[1];
        tpsh_tensor idst = block_of(it, cnt, 1, w.bd >= 0 ? it->strides[w.bd] : 0, 1), isrc = block_of(it, cnt, 1, 1, 1);
        rc = tpsh_cpu_copy(&idst, at(k, 1, offset_of(&w, it)), &isrc, index);
      }
    } else {
      for (int64_t r = 0; r < cnt; r++) {
        double *row = buf + r * width;
        if (op == TPSH_K_SOFTMAX) softmax_row(row, n, k->i[0] == 1, tmp);
        else norm_row(row, n, k->i[0] == 1, k->s[0], wts, bias, tmp);
      }
      tpsh_tensor dst = block_of(out, cnt, n, os, out->strides[nd]);
      rc = tpsh_cpu_copy(&dst, at(k, 0, offset_of(&w, out)), &rowsd, buf);
    }
  } while (rc == TPSH_OK && walk_next(&w, cnt));
  free(buf);
  free(index);
  return rc;
}
