/*
 * cpu_kernels.c: every tpsh_kop but matmul (cpu_matmul.c) on the CPU, run by a stream's worker thread.
 *
 * One strided iterator (cpu_elem.h) serves every op: it drops size-1 dims, merges dims that are contiguous in all
 * operands, and hands out inner runs (a pointer and a byte stride per operand). Each op checks a run
 * for its fast case (same f32/f64 dtype, unit strides), which a contiguous tensor hits with a single
 * run; other contiguous runs go in blocks through loops made for each dtype ("runs of one dtype"), and
 * strided ones element by element through load/store helpers that switch on the dtype.
 * The dtype semantics (rounding, integer wrap-around, NaN) are written down in cpu_kernels.h.
 *
 * Kernels read and write only through k->data[i] and the sizes/strides of k->t[i]: the storage a
 * descriptor points at may already be released on the host side while the worker runs.
 */
#define _POSIX_C_SOURCE 200809L   /* clock_gettime under -std=c11 */
#include "backend/cpu/cpu_elem.h"
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const op_names[TPSH_K_COUNT] = {
  [TPSH_K_FILL] = "fill", [TPSH_K_COPY] = "copy", [TPSH_K_ADD] = "add", [TPSH_K_MUL] = "mul",
  [TPSH_K_SCALE] = "scale", [TPSH_K_MATMUL] = "matmul", [TPSH_K_SUM] = "sum", [TPSH_K_ARANGE] = "arange",
  [TPSH_K_RANDOM] = "random", [TPSH_K_SPIN] = "spin", [TPSH_K_COMPARE] = "compare",
  /* cpu_reduce.c */
  [TPSH_K_REDUCE] = "reduce", [TPSH_K_SOFTMAX] = "softmax", [TPSH_K_NORM] = "norm",
  [TPSH_K_UNARY] = "unary", [TPSH_K_BINARY] = "binary",
};

/* tensors each op reads from k->t[] */
static const int op_tensors[TPSH_K_COUNT] = {
  [TPSH_K_FILL] = 1, [TPSH_K_COPY] = 2, [TPSH_K_ADD] = 3, [TPSH_K_MUL] = 3, [TPSH_K_SCALE] = 2,
  [TPSH_K_MATMUL] = 3, [TPSH_K_SUM] = 2, [TPSH_K_ARANGE] = 1, [TPSH_K_RANDOM] = 1, [TPSH_K_SPIN] = 0,
  [TPSH_K_COMPARE] = 3,
  [TPSH_K_REDUCE] = 2, [TPSH_K_SOFTMAX] = 2, [TPSH_K_NORM] = 2,
  [TPSH_K_UNARY] = 2, [TPSH_K_BINARY] = 3,
};

/* ==== helpers (element access, runs of one dtype and the strided iterator: cpu_elem.h) ========== */
/* An integral scale factor keeps integer ops exact in int64 (doubles lose bits beyond 2^53). */
/* an int64 exactly: -2^63 is one (what a number operand 2^63 wraps to), 2^63 is not */
static int is_int_valued(double v) { return v == trunc(v) && v >= -0x1p63 && v < 0x1p63; }

static tpsh_tensor contiguous_like(const tpsh_tensor *shape, int dtype) {
  tpsh_tensor t;
  memset(&t, 0, sizeof t);
  t.ndim = shape->ndim;
  t.dtype_id = dtype;
  t.device = -1;
  int64_t stride = 1;
  for (int d = shape->ndim - 1; d >= 0; d--) {
    t.sizes[d] = shape->sizes[d];
    t.strides[d] = stride;
    stride *= shape->sizes[d];
  }
  return t;
}

/* ==== fill and copy ============================================================================ */
static int k_fill(const tpsh_tensor *t, char *data, double v) {
  int dt = t->dtype_id, es = elsize(dt);
  char pat[8];
  store_f64(pat, dt, v);                 /* encode once; then the fill is a byte pattern */
  cpu_iter it;
  for (int64_t n = iter_begin(&it, 1, &t, &data); n; n = iter_next(&it)) {
    char *o = it.p[0];
    int64_t so = it.inner[0];
    if (so == es) {
      switch (es) {          /* constant sizes let the compiler turn each memcpy into one store */
      case 1: memset(o, pat[0], (size_t)n); break;
      case 2: for (int64_t j = 0; j < n; j++) memcpy(o + 2 * j, pat, 2); break;
      case 4: for (int64_t j = 0; j < n; j++) memcpy(o + 4 * j, pat, 4); break;
      default: for (int64_t j = 0; j < n; j++) memcpy(o + 8 * j, pat, 8); break;
      }
      continue;
    }
    for (int64_t j = 0; j < n; j++, o += so) memcpy(o, pat, (size_t)es);
  }
  return TPSH_OK;
}

static void copy_same_dtype_run(char *o, int64_t so, const char *a, int64_t sa, int64_t n, int es) {
  if (so == es && sa == es) {
    memmove(o, a, (size_t)(n * es));
    return;
  }
  switch (es) {
  case 1: for (int64_t j = 0; j < n; j++, o += so, a += sa) *o = *a; break;
  case 2: for (int64_t j = 0; j < n; j++, o += so, a += sa) memcpy(o, a, 2); break;
  case 4: for (int64_t j = 0; j < n; j++, o += so, a += sa) memcpy(o, a, 4); break;
  default: for (int64_t j = 0; j < n; j++, o += so, a += sa) memcpy(o, a, 8); break;
  }
}

/* A contiguous run cast from dts to dto in blocks: the element path's store(load(a)) (integer sources
   through int64, which keeps i64 exact; store_i64 casts to floats). */
static void copy_cast_run(char *o, const char *a, int64_t n, int dto, int dts) {
  int eo = elsize(dto), ea = elsize(dts);
  for (int64_t j = 0, m; j < n; j += m, o += m * eo, a += m * ea) {
    m = min64(RUN_BLOCK, n - j);
    if (is_float(dts)) {
      double x[RUN_BLOCK];
      load_f64_run(x, a, m, dts);
      store_f64_run(o, x, m, dto);
    } else {
      int64_t x[RUN_BLOCK];
      load_i64_run(x, a, m, dts);
      store_i64_run(o, x, m, dto);
    }
  }
}

static int copy_same_shape(const tpsh_tensor *dst, char *dd, const tpsh_tensor *src, const char *sd) {
  int dto = dst->dtype_id, dts = src->dtype_id, es = elsize(dto);
  const tpsh_tensor *ts[2] = {dst, src};
  char *ptr[2] = {dd, (char *)sd};
  cpu_iter it;
  for (int64_t n = iter_begin(&it, 2, ts, ptr); n; n = iter_next(&it)) {
    char *o = it.p[0], *a = it.p[1];
    int64_t so = it.inner[0], sa = it.inner[1];
    if (dto == dts) {
      copy_same_dtype_run(o, so, a, sa, n, es);
    } else if (dto == TPSH_F32 && dts == TPSH_F64 && so == 4 && sa == 8) {
      for (int64_t j = 0; j < n; j++) ((float *)o)[j] = (float)((const double *)a)[j];
    } else if (dto == TPSH_F64 && dts == TPSH_F32 && so == 8 && sa == 4) {
      for (int64_t j = 0; j < n; j++) ((double *)o)[j] = ((const float *)a)[j];
    } else if (so == es && sa == elsize(dts)) {
      copy_cast_run(o, a, n, dto, dts);
    } else if (is_float(dts)) {
      for (int64_t j = 0; j < n; j++, o += so, a += sa) store_f64(o, dto, load_f64(a, dts));
    } else {                     /* integer source: int64 keeps i64 exact, store_i64 casts to floats */
      for (int64_t j = 0; j < n; j++, o += so, a += sa) store_i64(o, dto, load_i64(a, dts));
    }
  }
  return TPSH_OK;
}

int tpsh_cpu_copy(const tpsh_tensor *dst, void *dst_data, const tpsh_tensor *src, const void *src_data) {
  int64_t n = numel(dst);
  if (n != numel(src))
    return tpsh_error(TPSH_EINVAL, "copy: %lld elements into %lld", (long long)numel(src), (long long)n);
  if (same_shape(dst, src)) return copy_same_shape(dst, dst_data, src, src_data);
  /* Different shapes pair elements in row-major order: gather src contiguously, then view that
     buffer with dst's shape. */
  size_t bytes = (size_t)n * (size_t)elsize(src->dtype_id);
  char *tmp = malloc(bytes ? bytes : 1);
  if (!tmp) return tpsh_error(TPSH_ENOMEM, "copy: cannot allocate %zu bytes", bytes);
  tpsh_tensor flat_src = contiguous_like(src, src->dtype_id);
  tpsh_tensor as_dst = contiguous_like(dst, src->dtype_id);
  int rc = copy_same_shape(&flat_src, tmp, src, src_data);
  if (rc == TPSH_OK) rc = copy_same_shape(dst, dst_data, &as_dst, tmp);
  free(tmp);
  return rc;
}

int tpsh_cpu_copy_to_contiguous(const tpsh_tensor *src, const void *src_data, void *dst) {
  tpsh_tensor flat = contiguous_like(src, src->dtype_id);
  return copy_same_shape(&flat, dst, src, src_data);
}

/* ==== add, mul, scale ========================================================================== */
/* k->op selects out = a + s*b, a*b or a*s. A run of f32 (f64) operands with unit strides takes a
   typed loop; its results are the ones the element path gives (cpu_kernels.h: double, one rounding). */
/* SCALE is a * s, and + t when the op adds a number (adds: kargs i[0]): a plain scale adds nothing, not
 * +0, so that -(+0) = +0 * -1 stays -0, while -0 + 0 is +0 as IEEE has it */
/* Where a is NaN the result is a, quieted. x86 returns the first operand of two NaNs, and the compiler
 * may swap the operands of a commutative + or *: the same loop kept a's NaN in one build and b's in
 * another (test_cpu_kernels, "block runs"). The element path keeps a's, and so does every loop here,
 * explicitly: b is replaced by a where a is NaN (a select before the arithmetic, which vectorises;
 * a NaN combined with itself gives it quieted whatever the order). */
static inline float a_nan_f32(float a, float b) { return a != a ? a : b; }
static inline double a_nan_f64(double a, double b) { return a != a ? a : b; }

static void binary_run_f32(int op, int64_t n, float *o, const float *a, const float *b, double s, double t,
                           int adds) {
  switch (op) {
  case TPSH_K_ADD:   /* s = 1: = the double route, rounded */
    if (s == 1.0) for (int64_t j = 0; j < n; j++) o[j] = a[j] + a_nan_f32(a[j], b[j]);
    else for (int64_t j = 0; j < n; j++) o[j] = (float)((double)a[j] + s * (double)a_nan_f32(a[j], b[j]));
    break;
  case TPSH_K_MUL: for (int64_t j = 0; j < n; j++) o[j] = a[j] * a_nan_f32(a[j], b[j]); break;
  default:
    if (!adds) for (int64_t j = 0; j < n; j++) o[j] = (float)((double)a[j] * s);
    else for (int64_t j = 0; j < n; j++) o[j] = (float)((double)a[j] * s + t);
    break;
  }
}

static void binary_run_f64(int op, int64_t n, double *o, const double *a, const double *b, double s, double t,
                           int adds) {
  switch (op) {
  case TPSH_K_ADD: for (int64_t j = 0; j < n; j++) o[j] = a[j] + s * a_nan_f64(a[j], b[j]); break;
  case TPSH_K_MUL: for (int64_t j = 0; j < n; j++) o[j] = a[j] * a_nan_f64(a[j], b[j]); break;
  default:
    if (!adds) for (int64_t j = 0; j < n; j++) o[j] = a[j] * s;
    else for (int64_t j = 0; j < n; j++) o[j] = a[j] * s + t;
    break;
  }
}

/* a's NaN kept explicitly (a_nan_f64), as in the typed loops: left to the compiler, the element path
   kept a's in one build and b's in another (RelWithDebInfo against Release) */
static inline double binary_f64(int op, double a, double b, double s, double t, int adds) {
  b = a_nan_f64(a, b);
  return op == TPSH_K_ADD ? a + s * b : op == TPSH_K_MUL ? a * b : adds ? a * s + t : a * s;
}

/* unsigned arithmetic: wrap-around is defined, signed overflow is not */
static inline int64_t binary_i64(int op, int64_t a, int64_t b, int64_t s, int64_t t) {
  uint64_t ua = (uint64_t)a, ub = (uint64_t)b, us = (uint64_t)s;
  return (int64_t)(op == TPSH_K_ADD ? ua + us * ub : op == TPSH_K_MUL ? ua * ub : ua * us + (uint64_t)t);
}

/* Contiguous runs of any dtypes in blocks: the element path's store(binary(load(a), load(b))), a's NaN
   kept explicitly as above. */
static void binary_block_run(int op, int64_t n, char *o, const char *a, const char *b, int dto, int dta, int dtb,
                             int ints, double s, double t, int adds, int64_t si, int64_t ti) {
  int eo = elsize(dto), ea = elsize(dta), eb = elsize(dtb);
  for (int64_t j = 0, m; j < n; j += m, o += m * eo, a += m * ea, b += m * eb) {
    m = min64(RUN_BLOCK, n - j);
    if (ints) {
      int64_t x[RUN_BLOCK], y[RUN_BLOCK];
      load_i64_run(x, a, m, dta);
      load_i64_run(y, b, m, dtb);
      for (int64_t r = 0; r < m; r++) x[r] = binary_i64(op, x[r], y[r], si, ti);
      store_i64_run(o, x, m, dto);
    } else {
      double x[RUN_BLOCK], y[RUN_BLOCK];
      load_f64_run(x, a, m, dta);
      load_f64_run(y, b, m, dtb);
      for (int64_t r = 0; r < m; r++) x[r] = binary_f64(op, x[r], y[r], s, t, adds);
      store_f64_run(o, x, m, dto);
    }
  }
}

static int k_binary(const tpsh_kargs *k, const char *name) {
  int op = k->op, nt = op == TPSH_K_SCALE ? 2 : 3;
  for (int i = 1; i < nt; i++)
    if (!same_shape(&k->t[0], &k->t[i]))
      return tpsh_error(TPSH_EINVAL, "%s: operand %d does not have the output's shape", name, i);
  /* SCALE has no t[2]: let b alias a so that the run loops need no special case */
  const tpsh_tensor *ts[3] = {&k->t[0], &k->t[1], &k->t[nt == 3 ? 2 : 1]};
  char *ptr[3] = {k->data[0], k->data[1], k->data[nt == 3 ? 2 : 1]};
  int dto = ts[0]->dtype_id, dta = ts[1]->dtype_id, dtb = ts[2]->dtype_id;
  int adds = op == TPSH_K_SCALE && k->i[0];            /* SCALE adding a number t */
  double s = op == TPSH_K_MUL ? 1.0 : k->s[0], t = adds ? k->s[1] : 0.0;
  int ints = !is_float(dto) && !is_float(dta) && !is_float(dtb) && is_int_valued(s) && (!adds || is_int_valued(t));
  int64_t si = ints ? (int64_t)s : 0, ti = ints ? (int64_t)t : 0;
  int all_f32 = dto == TPSH_F32 && dta == TPSH_F32 && dtb == TPSH_F32;
  int all_f64 = dto == TPSH_F64 && dta == TPSH_F64 && dtb == TPSH_F64;
  cpu_iter it;
  for (int64_t n = iter_begin(&it, 3, ts, ptr); n; n = iter_next(&it)) {
    char *o = it.p[0], *a = it.p[1], *b = it.p[2];
    int64_t so = it.inner[0], sa = it.inner[1], sb = it.inner[2];
    if (all_f32 && so == 4 && sa == 4 && sb == 4) {
      binary_run_f32(op, n, (float *)o, (const float *)a, (const float *)b, s, t, adds);
    } else if (all_f64 && so == 8 && sa == 8 && sb == 8) {
      binary_run_f64(op, n, (double *)o, (const double *)a, (const double *)b, s, t, adds);
    } else if (so == elsize(dto) && sa == elsize(dta) && sb == elsize(dtb)) {
      binary_block_run(op, n, o, a, b, dto, dta, dtb, ints, s, t, adds, si, ti);
    } else if (ints) {
      for (int64_t j = 0; j < n; j++, o += so, a += sa, b += sb)
        store_i64(o, dto, binary_i64(op, load_i64(a, dta), load_i64(b, dtb), si, ti));
    } else {
      for (int64_t j = 0; j < n; j++, o += so, a += sa, b += sb)
        store_f64(o, dto, binary_f64(op, load_f64(a, dta), load_f64(b, dtb), s, t, adds));
    }
  }
  return TPSH_OK;
}

/* ==== sum ====================================================================================== */
/* Pairwise summation of contiguous runs (error O(log n) ulps, and vectorisable), Neumaier's compensated
   sum across runs and along strided ones. */
/* One definition for both element types: four partial sums over runs of up to 64, halves above. */
#define PAIRWISE(name, type)                                                                          \
  static double name(const type *x, int64_t n) {                                                     \
    if (n <= 64) {                                                                                    \
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                                          \
      int64_t j = 0;                                                                                  \
      for (; j + 4 <= n; j += 4) { s0 += x[j]; s1 += x[j + 1]; s2 += x[j + 2]; s3 += x[j + 3]; }     \
      for (; j < n; j++) s0 += x[j];                                                                  \
      return (s0 + s1) + (s2 + s3);                                                                   \
    }                                                                                                 \
    int64_t h = n / 2;                                                                                \
    return name(x, h) + name(x + h, n - h);                                                           \
  }
PAIRWISE(pairwise_f32, float)
PAIRWISE(pairwise_f64, double)
#undef PAIRWISE

double tpsh_cpu_sum_f64(const double *x, int64_t n) { return pairwise_f64(x, n); }

static inline void neumaier_add(double *sum, double *comp, double x) {
  double t = *sum + x;
  *comp += fabs(*sum) >= fabs(x) ? (*sum - t) + x : (x - t) + *sum;
  *sum = t;
}

static int k_sum(const tpsh_kargs *k, const char *name) {
  const tpsh_tensor *out = &k->t[0], *src = &k->t[1];
  if (numel(out) != 1) return tpsh_error(TPSH_EINVAL, "%s: the output must hold one element", name);
  int dt = src->dtype_id;
  char *ptr = k->data[1];
  tpsh_tensor walk = tpsh_tensor_memory_order(src);   /* every element once, read in runs */
  const tpsh_tensor *in = &walk;
  cpu_iter it;
  if (!is_float(dt)) {
    uint64_t acc = 0;
    int64_t x[RUN_BLOCK];
    for (int64_t n = iter_begin(&it, 1, &in, &ptr); n; n = iter_next(&it)) {
      const char *a = it.p[0];
      int64_t sa = it.inner[0];
      if (sa != elsize(dt)) {
        for (int64_t j = 0; j < n; j++, a += sa) acc += (uint64_t)load_i64(a, dt);
        continue;
      }
      for (int64_t j = 0, m; j < n; j += m, a += m * sa) {
        m = min64(RUN_BLOCK, n - j);
        load_i64_run(x, a, m, dt);
        for (int64_t r = 0; r < m; r++) acc += (uint64_t)x[r];
      }
    }
    store_i64(k->data[0], out->dtype_id, (int64_t)acc);
    return TPSH_OK;
  }
  double sum = 0, comp = 0;
  for (int64_t n = iter_begin(&it, 1, &in, &ptr); n; n = iter_next(&it)) {
    const char *a = it.p[0];
    int64_t sa = it.inner[0];
    if (dt == TPSH_F32 && sa == 4) neumaier_add(&sum, &comp, pairwise_f32((const float *)a, n));
    else if (dt == TPSH_F64 && sa == 8) neumaier_add(&sum, &comp, pairwise_f64((const double *)a, n));
    else if (sa == elsize(dt)) {
      double x[RUN_BLOCK];
      for (int64_t j = 0, m; j < n; j += m, a += m * sa) {
        m = min64(RUN_BLOCK, n - j);
        load_f64_run(x, a, m, dt);
        for (int64_t r = 0; r < m; r++) neumaier_add(&sum, &comp, x[r]);
      }
    } else {
      for (int64_t j = 0; j < n; j++, a += sa) neumaier_add(&sum, &comp, load_f64(a, dt));
    }
  }
  /* an inf or NaN sum makes the compensation NaN (inf - inf); the plain sum is then the answer */
  store_f64(k->data[0], out->dtype_id, isfinite(sum) ? sum + comp : sum);
  return TPSH_OK;
}

/* ==== arange and random ======================================================================== */
/* Both number the elements in row-major order, so they are also right for a non-contiguous t[0]. */
static int k_arange(const tpsh_kargs *k) {
  const tpsh_tensor *t = &k->t[0];
  int dt = t->dtype_id;
  double start = k->s[0], step = k->s[1];
  int ints = !is_float(dt) && is_int_valued(start) && is_int_valued(step);
  uint64_t istart = ints ? (uint64_t)(int64_t)start : 0, istep = ints ? (uint64_t)(int64_t)step : 0;
  char *ptr = k->data[0];
  uint64_t j = 0;
  cpu_iter it;
  for (int64_t n = iter_begin(&it, 1, &t, &ptr); n; n = iter_next(&it)) {
    char *o = it.p[0];
    for (int64_t r = 0; r < n; r++, j++, o += it.inner[0]) {
      if (ints) store_i64(o, dt, (int64_t)(istart + j * istep));
      else store_f64(o, dt, start + (double)j * step);
    }
  }
  return TPSH_OK;
}

/* A 53-bit uniform below 1 can round up to 1 in a narrower dtype; keep the interval half-open. */
static void store_uniform(char *o, int dt, double u) {
  if (dt == TPSH_F32) {
    float f = (float)u;
    if (f >= 1.0f) f = 0x1.fffffep-1f;
    memcpy(o, &f, 4);
  } else if (dt == TPSH_F16) {
    uint16_t h = tpsh_double_to_half_inl(u);
    if (h == 0x3c00) h = 0x3bff;
    memcpy(o, &h, 2);
  } else if (dt == TPSH_BF16) {
    uint16_t h = tpsh_double_to_bf16_inl(u);
    if (h == 0x3f80) h = 0x3f7f;
    memcpy(o, &h, 2);
  } else {
    store_f64(o, dt, u);
  }
}

static int k_random(const tpsh_kargs *k) {
  const tpsh_tensor *t = &k->t[0];
  int dt = t->dtype_id, normal = k->i[0] == 1;
  uint64_t seed = (uint64_t)k->i[1], counter = (uint64_t)k->i[2];
  char *ptr = k->data[0];
  cpu_iter it;
  for (int64_t n = iter_begin(&it, 1, &t, &ptr); n; n = iter_next(&it)) {
    char *o = it.p[0];
    for (int64_t r = 0; r < n; r++, counter++, o += it.inner[0]) {
      if (normal) store_f64(o, dt, tpsh_rand_normal(seed, counter));
      else if (is_float(dt)) store_uniform(o, dt, tpsh_rand_uniform(seed, counter));
      else store_i64(o, dt, (int64_t)(tpsh_rand_mix(seed, counter) >> 33));
    }
  }
  return TPSH_OK;
}

/* ==== spin ===================================================================================== */
static double monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Synthetic compute for overlap studies: it holds the core as a real kernel would (no sleep), but stands
 * for a GPU kernel, which takes nothing from the host: every 50 us it yields, so that a host thread
 * waiting for this core runs at once rather than after the scheduler's slice (milliseconds). */
static int k_spin(const tpsh_kargs *k) {
  double ms = k->s[0];
  if (!(ms > 0)) return TPSH_OK;
  if (k->i[0]) {              /* a chaos delay: it must leave the cores to the work it reorders */
    long ns = (long)(ms * 1e6);
    nanosleep(&(struct timespec){ .tv_sec = ns / 1000000000L, .tv_nsec = ns % 1000000000L }, NULL);
    return TPSH_OK;
  }
  double now = monotonic_ms(), end = now + ms, yield_at = now + 0.05;
  volatile uint64_t work = 0;
  while ((now = monotonic_ms()) < end) {
    for (int r = 0; r < 256; r++) work = work + 1;
    if (now >= yield_at) { sched_yield(); yield_at = now + 0.05; }
  }
  return TPSH_OK;
}

/* ==== compare ================================================================================== */
typedef struct compare_acc {
  double violations, max_diff;
  int saw_nan;
} compare_acc;

static inline void compare_one(compare_acc *c, double a, double b, double rtol, double atol) {
  if (isnan(a) || isnan(b)) {
    c->violations += 1;
    c->saw_nan = 1;
    return;
  }
  if (a == b) return;                      /* also equal infinities, whose difference is NaN */
  double d = fabs(a - b);                  /* inf when one side is infinite */
  if (d > c->max_diff) c->max_diff = d;
  /* an infinite b would make the tolerance infinite too: any unequal infinity violates */
  if (isinf(a) || isinf(b) || !(d <= atol + rtol * fabs(b))) c->violations += 1;
}

/* Two integers (i64 past 2^53 included) compare exactly: in double, 2^53 + 1 equalled 2^53. The
 * difference is exact as an unsigned 64-bit number and rounded once for max_diff and the tolerance. */
static inline void compare_ints(compare_acc *c, int64_t a, int64_t b, double rtol, double atol) {
  if (a == b) return;
  double d = (double)(a > b ? (uint64_t)a - (uint64_t)b : (uint64_t)b - (uint64_t)a);
  if (d > c->max_diff) c->max_diff = d;
  if (!(d <= atol + rtol * fabs((double)b))) c->violations += 1;
}

static int k_compare(const tpsh_kargs *k, const char *name) {
  const tpsh_tensor *r = &k->t[0];
  if (r->dtype_id != TPSH_F64 || r->ndim != 1 || r->sizes[0] != 2)
    return tpsh_error(TPSH_EINVAL, "%s: the result must be an f64 tensor of 2 elements", name);
  if (!same_shape(&k->t[1], &k->t[2]))
    return tpsh_error(TPSH_EINVAL, "%s: the operands' shapes differ", name);
  const tpsh_tensor *ts[2] = {&k->t[1], &k->t[2]};
  char *ptr[2] = {k->data[1], k->data[2]};
  int dta = ts[0]->dtype_id, dtb = ts[1]->dtype_id;
  double rtol = k->s[0], atol = k->s[1];
  compare_acc c = {0, 0, 0};
  cpu_iter it;
  for (int64_t n = iter_begin(&it, 2, ts, ptr); n; n = iter_next(&it)) {
    const char *a = it.p[0], *b = it.p[1];
    int64_t sa = it.inner[0], sb = it.inner[1];
    if (dta == TPSH_F32 && dtb == TPSH_F32 && sa == 4 && sb == 4) {
      for (int64_t j = 0; j < n; j++) compare_one(&c, ((const float *)a)[j], ((const float *)b)[j], rtol, atol);
    } else if (dta == TPSH_F64 && dtb == TPSH_F64 && sa == 8 && sb == 8) {
      for (int64_t j = 0; j < n; j++) compare_one(&c, ((const double *)a)[j], ((const double *)b)[j], rtol, atol);
    } else if (!is_float(dta) && !is_float(dtb)) {
      for (int64_t j = 0; j < n; j++, a += sa, b += sb) compare_ints(&c, load_i64(a, dta), load_i64(b, dtb), rtol, atol);
    } else {
      for (int64_t j = 0; j < n; j++, a += sa, b += sb) compare_one(&c, load_f64(a, dta), load_f64(b, dtb), rtol, atol);
    }
  }
  double out[2] = {c.violations, c.saw_nan ? NAN : c.max_diff};
  char *o = k->data[0];
  memcpy(o, &out[0], 8);
  memcpy(o + r->strides[0] * 8, &out[1], 8);
  return TPSH_OK;
}

/* ==== entry point ============================================================================== */
static int check_operand(const tpsh_kargs *k, int i, const char *name) {
  const tpsh_tensor *t = &k->t[i];
  if (elsize(t->dtype_id) == 0) return tpsh_error(TPSH_EINVAL, "%s: tensor %d has an unknown dtype %d", name, i, t->dtype_id);
  if (t->ndim < 0 || t->ndim > TPSH_MAX_DIMS)
    return tpsh_error(TPSH_EINVAL, "%s: tensor %d has %d dims (at most %d)", name, i, t->ndim, TPSH_MAX_DIMS);
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] < 0) return tpsh_error(TPSH_EINVAL, "%s: tensor %d has a negative size", name, i);
  if (!k->data[i] && numel(t) > 0) return tpsh_error(TPSH_EINVAL, "%s: tensor %d has no data", name, i);
  return TPSH_OK;
}

int tpsh_cpu_kernel_run(const tpsh_kargs *k) {
  if (!k) return tpsh_error(TPSH_EINVAL, "kernel: no arguments");
  if (k->op < 0 || k->op >= TPSH_K_COUNT) return tpsh_error(TPSH_EINVAL, "kernel: unknown op %d", (int)k->op);
  const char *name = k->name ? k->name : op_names[k->op];
  int need = op_tensors[k->op];
  if (k->nt < need) return tpsh_error(TPSH_EINVAL, "%s: expected %d tensors, got %d", name, need, (int)k->nt);
  for (int i = 0; i < need; i++) {
    int rc = check_operand(k, i, name);
    if (rc) return rc;
  }
  switch ((tpsh_kop)k->op) {
  case TPSH_K_FILL: return k_fill(&k->t[0], k->data[0], k->s[0]);
  case TPSH_K_COPY: return tpsh_cpu_copy(&k->t[0], k->data[0], &k->t[1], k->data[1]);
  case TPSH_K_ADD: case TPSH_K_MUL: case TPSH_K_SCALE: return k_binary(k, name);
  case TPSH_K_MATMUL: return tpsh_cpu_matmul(k);
  case TPSH_K_SUM: return k_sum(k, name);
  case TPSH_K_ARANGE: return k_arange(k);
  case TPSH_K_RANDOM: return k_random(k);
  case TPSH_K_SPIN: return k_spin(k);
  case TPSH_K_COMPARE: return k_compare(k, name);
  case TPSH_K_REDUCE: case TPSH_K_SOFTMAX: case TPSH_K_NORM: return tpsh_cpu_reduce(k, name);
  case TPSH_K_UNARY: case TPSH_K_BINARY: return tpsh_cpu_pointwise(k, name);
  case TPSH_K_COUNT: break;
  }
  return tpsh_error(TPSH_EINVAL, "kernel: unknown op %d", (int)k->op);
}
