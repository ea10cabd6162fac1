/*
 * cpu_elem.h: what the CPU kernels share: element access by dtype (loads and stores through double or
 * int64 with the semantics of cpu_kernels.h), runs of one dtype in blocks, and the strided iterator.
 * cpu_kernels.c and cpu_pointwise.c include it; everything here is static inline.
 */
#ifndef TPSH_CPU_ELEM_H
#define TPSH_CPU_ELEM_H

#include "backend/cpu/cpu_kernels.h"
#include <string.h>

/* ==== element access =========================================================================== */
/* Local rather than tpsh_dtype_size so that the kernels do not depend on the core's dtype table. */
static inline int elsize(int dt) {
  switch (dt) {
  case TPSH_U8: return 1;
  case TPSH_F16: case TPSH_BF16: return 2;
  case TPSH_F32: case TPSH_I32: return 4;
  case TPSH_F64: case TPSH_I64: return 8;
  default: return 0;
  }
}

static inline int is_float(int dt) { return dt == TPSH_F32 || dt == TPSH_F16 || dt == TPSH_BF16 || dt == TPSH_F64; }

/* C leaves out-of-range float-to-int conversions undefined; pin them down (cpu_kernels.h). */
static inline int64_t f64_to_i64(double v) {
  if (v != v) return 0;
  if (v >= 0x1p63) return INT64_MAX;
  if (v < -0x1p63) return INT64_MIN;
  return (int64_t)v;
}

/* An f16/bf16 NaN widened to double, with its quiet bit set as the x86 float-to-double conversion sets
 * it. Written out because the compiler, once the conversions are inlined, may fold the float -> double ->
 * float of a copy into nothing and keep a signalling NaN's bits (f16 -> f32 copies did: the bits
 * changed from what they were when the conversion was a call). */
static inline double narrow_to_f64(float f) {
  if (f != f) f = tpsh_bits_float(tpsh_float_bits(f) | 0x00400000u);
  return f;
}

/* memcpy instead of typed pointers: no alignment or aliasing assumptions, and it compiles to a load. */
static inline double load_f64(const char *p, int dt) {
  switch (dt) {
  case TPSH_F32: { float v; memcpy(&v, p, 4); return v; }
  case TPSH_F16: { uint16_t h; memcpy(&h, p, 2); return narrow_to_f64(tpsh_half_to_float_inl(h)); }
  case TPSH_BF16: { uint16_t h; memcpy(&h, p, 2); return narrow_to_f64(tpsh_bf16_to_float_inl(h)); }
  case TPSH_F64: { double v; memcpy(&v, p, 8); return v; }
  case TPSH_I32: { int32_t v; memcpy(&v, p, 4); return v; }
  case TPSH_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
  case TPSH_U8: return *(const uint8_t *)p;
  default: return 0;
  }
}

static inline int64_t load_i64(const char *p, int dt) {
  switch (dt) {
  case TPSH_I32: { int32_t v; memcpy(&v, p, 4); return v; }
  case TPSH_I64: { int64_t v; memcpy(&v, p, 8); return v; }
  case TPSH_U8: return *(const uint8_t *)p;
  default: return f64_to_i64(load_f64(p, dt));
  }
}

static inline void store_f64(char *p, int dt, double v) {
  switch (dt) {
  case TPSH_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
  /* one rounding from the double (dtype_convert.c: through f32 it rounded twice, wrongly at times) */
  case TPSH_F16: { uint16_t h = tpsh_double_to_half_inl(v); memcpy(p, &h, 2); break; }
  case TPSH_BF16: { uint16_t h = tpsh_double_to_bf16_inl(v); memcpy(p, &h, 2); break; }
  case TPSH_F64: memcpy(p, &v, 8); break;
  case TPSH_I32: { int32_t x = (int32_t)(uint32_t)(uint64_t)f64_to_i64(v); memcpy(p, &x, 4); break; }
  case TPSH_I64: { int64_t x = f64_to_i64(v); memcpy(p, &x, 8); break; }
  case TPSH_U8: *(uint8_t *)p = (uint8_t)(uint64_t)f64_to_i64(v); break;
  default: break;
  }
}

static inline void store_i64(char *p, int dt, int64_t v) {
  switch (dt) {
  case TPSH_I32: { int32_t x = (int32_t)(uint32_t)(uint64_t)v; memcpy(p, &x, 4); break; }
  case TPSH_I64: memcpy(p, &v, 8); break;
  case TPSH_U8: *(uint8_t *)p = (uint8_t)(uint64_t)v; break;
  case TPSH_F32: { float f = (float)v; memcpy(p, &f, 4); break; }  /* int64 -> f32 directly: one rounding */
  default: store_f64(p, dt, (double)v); break;
  }
}

/* ==== runs of one dtype =========================================================================== */
/* The element path switches on the dtype at every load and store; the compiler does not take those
 * switches out of the loops (nor, before dtype_convert.h, inline the f16/bf16 conversions), so a cast or
 * an f16/bf16 op ran 2-20x slower than a C loop over the same bytes (docs/perf.md, "CPU: kernels against
 * plain C"). The generic paths therefore work on contiguous runs in blocks of RUN_BLOCK elements: the
 * operands' elements are loaded into a double (int64) buffer by a loop made for their dtype, computed on
 * there, and stored by a loop made for the output's dtype. Each element still goes through load_f64/
 * store_f64 (load_i64/store_i64) exactly once, in the same order, so the results are the element
 * path's bit for bit. Runs with a stride keep the element path: the same blocks over a transposed
 * operand (a run down a column, 8 KiB between elements) took 1.3-2x longer than going element by
 * element, whose loads interleave with the stores. */
enum { RUN_BLOCK = 512 };

/* always_inline with a constant dt: each case of the switches below becomes a loop of its own */
#define RUN_INLINE static inline __attribute__((always_inline))
RUN_INLINE void load_f64_run_as(double *x, const char *a, int64_t n, int dt) {
  for (int64_t j = 0; j < n; j++) x[j] = load_f64(a + j * elsize(dt), dt);
}
RUN_INLINE void store_f64_run_as(char *o, const double *x, int64_t n, int dt) {
  for (int64_t j = 0; j < n; j++) store_f64(o + j * elsize(dt), dt, x[j]);
}
RUN_INLINE void load_i64_run_as(int64_t *x, const char *a, int64_t n, int dt) {
  for (int64_t j = 0; j < n; j++) x[j] = load_i64(a + j * elsize(dt), dt);
}
RUN_INLINE void store_i64_run_as(char *o, const int64_t *x, int64_t n, int dt) {
  for (int64_t j = 0; j < n; j++) store_i64(o + j * elsize(dt), dt, x[j]);
}
#undef RUN_INLINE

/* x[j] = the j-th element of the contiguous run at a, for j < n */
static inline void load_f64_run(double *x, const char *a, int64_t n, int dt) {
  switch (dt) {
  case TPSH_F32: load_f64_run_as(x, a, n, TPSH_F32); break;
  case TPSH_F16: load_f64_run_as(x, a, n, TPSH_F16); break;
  case TPSH_BF16: load_f64_run_as(x, a, n, TPSH_BF16); break;
  case TPSH_F64: load_f64_run_as(x, a, n, TPSH_F64); break;
  case TPSH_I32: load_f64_run_as(x, a, n, TPSH_I32); break;
  case TPSH_I64: load_f64_run_as(x, a, n, TPSH_I64); break;
  default: load_f64_run_as(x, a, n, TPSH_U8); break;
  }
}

/* the j-th element of the contiguous run at o = x[j], for j < n */
static inline void store_f64_run(char *o, const double *x, int64_t n, int dt) {
  switch (dt) {
  case TPSH_F32: store_f64_run_as(o, x, n, TPSH_F32); break;
  case TPSH_F16: store_f64_run_as(o, x, n, TPSH_F16); break;
  case TPSH_BF16: store_f64_run_as(o, x, n, TPSH_BF16); break;
  case TPSH_F64: store_f64_run_as(o, x, n, TPSH_F64); break;
  case TPSH_I32: store_f64_run_as(o, x, n, TPSH_I32); break;
  case TPSH_I64: store_f64_run_as(o, x, n, TPSH_I64); break;
  default: store_f64_run_as(o, x, n, TPSH_U8); break;
  }
}

/* as load_f64_run, in int64 (integer dtypes) */
static inline void load_i64_run(int64_t *x, const char *a, int64_t n, int dt) {
  switch (dt) {
  case TPSH_I32: load_i64_run_as(x, a, n, TPSH_I32); break;
  case TPSH_I64: load_i64_run_as(x, a, n, TPSH_I64); break;
  case TPSH_U8: load_i64_run_as(x, a, n, TPSH_U8); break;
  default: for (int64_t j = 0; j < n; j++) x[j] = load_i64(a + j * elsize(dt), dt); break;  /* floats: unused */
  }
}

/* as store_f64_run, from int64 */
static inline void store_i64_run(char *o, const int64_t *x, int64_t n, int dt) {
  switch (dt) {
  case TPSH_F32: store_i64_run_as(o, x, n, TPSH_F32); break;
  case TPSH_F16: store_i64_run_as(o, x, n, TPSH_F16); break;
  case TPSH_BF16: store_i64_run_as(o, x, n, TPSH_BF16); break;
  case TPSH_F64: store_i64_run_as(o, x, n, TPSH_F64); break;
  case TPSH_I32: store_i64_run_as(o, x, n, TPSH_I32); break;
  case TPSH_I64: store_i64_run_as(o, x, n, TPSH_I64); break;
  default: store_i64_run_as(o, x, n, TPSH_U8); break;
  }
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline int64_t numel(const tpsh_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
  return n;
}

static inline int same_shape(const tpsh_tensor *a, const tpsh_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d]) return 0;
  return 1;
}

/* ==== the strided iterator ===================================================================== */
/* An index counter over the outer dims (no recursion); the innermost dim is left to the op's loop. */
typedef struct cpu_iter {
  int nt, ndim;                           /* ndim after merging; dim ndim-1 is the inner run */
  int64_t n;                              /* elements in one inner run */
  int64_t inner[3];                       /* byte stride of each operand along the run */
  char *p[3];                             /* start of the current run in each operand */
  int64_t size[TPSH_MAX_DIMS], idx[TPSH_MAX_DIMS];
  int64_t stride[3][TPSH_MAX_DIMS];       /* bytes */
} cpu_iter;

/* Iterates over the shape of t[0]; every t[i] must have that shape. Returns the first run's length,
   0 for an empty tensor. */
static inline int64_t iter_begin(cpu_iter *it, int nt, const tpsh_tensor *const *t, char *const *data) {
  it->nt = nt;
  it->ndim = 0;
  for (int i = 0; i < nt; i++) { it->p[i] = data[i]; it->inner[i] = 0; }   /* inner: set for an empty tensor too */
  for (int d = 0; d < t[0]->ndim; d++) {
    int64_t sz = t[0]->sizes[d];
    if (sz == 0) return it->n = 0;
    if (sz == 1) continue;                /* its stride is meaningless and would block merging */
    int nd = it->ndim, merge = nd > 0;
    for (int i = 0; i < nt && merge; i++)
      merge = it->stride[i][nd - 1] == t[i]->strides[d] * elsize(t[i]->dtype_id) * sz;
    int at = merge ? nd - 1 : nd;
    for (int i = 0; i < nt; i++) it->stride[i][at] = t[i]->strides[d] * elsize(t[i]->dtype_id);
    if (merge) {
      it->size[at] *= sz;
    } else {
      it->size[at] = sz;
      it->idx[at] = 0;
      it->ndim++;
    }
  }
  if (it->ndim == 0) {                    /* 0-dim or all sizes 1: one element */
    for (int i = 0; i < nt; i++) it->inner[i] = 0;
    return it->n = 1;
  }
  for (int i = 0; i < nt; i++) it->inner[i] = it->stride[i][it->ndim - 1];
  return it->n = it->size[it->ndim - 1];
}

/* Moves to the next run; returns its length, 0 when done. */
static inline int64_t iter_next(cpu_iter *it) {
  for (int d = it->ndim - 2; d >= 0; d--) {
    if (++it->idx[d] < it->size[d]) {
      for (int i = 0; i < it->nt; i++) it->p[i] += it->stride[i][d];
      return it->n;
    }
    it->idx[d] = 0;
    for (int i = 0; i < it->nt; i++) it->p[i] -= it->stride[i][d] * (it->size[d] - 1);
  }
  return 0;
}

#endif /* TPSH_CPU_ELEM_H */
