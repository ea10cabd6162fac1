/*
 * cpu_pointwise.c: TPSH_K_UNARY and TPSH_K_BINARY on the CPU: the formulas of core/pointwise.h over the
 * runs of the strided iterator (cpu_elem.h), in the compute type of core/pointwise.h (f32 for f32, f16
 * and bf16; f64; int64 for integers).
 *
 * A run whose operands have the output's dtype, f32 or f64, and unit strides (a contiguous tensor is one
 * such run) is computed straight from memory by a loop made for its op: the compiler vectorises it
 * where the formula allows (relu, abs, neg, sqrt, div, maximum, ...); the transcendental formulas call
 * libm per element. Every other run goes in blocks of RUN_BLOCK elements: each operand is loaded into a
 * buffer of the compute type by a loop made for its dtype and stride (f16 and bf16, integers, an integer
 * divided into f32, a broadcast operand of stride 0, a transposed one), the op's loop runs on the
 * buffers, and the result is stored by a loop made for the output's dtype.
 */
#include "backend/cpu/cpu_elem.h"

typedef struct pw_args {
  int binary, op;
  double p;          /* a unary op's number, as a double (f64) and rounded to f32 (pf) */
  float pf;
} pw_args;

/* ==== the op's loop, one per op and compute type ====================================================== */
/* o[j] = f(a[j], b[j]) for j < n; o may be a or b (the same view: each element is read, then written) */
#define UNARY_LOOP(id, ...) case id: for (int64_t j = 0; j < n; j++) o[j] = FN(unary, id, a[j], P); break;
#define BINARY_LOOP(id, ...) case id: for (int64_t j = 0; j < n; j++) o[j] = FN(binary, id, a[j], b[j]); break;

#define FN(kind, id, x, y) tpsh_##kind##_f32(id, x, y)
#define P w->pf
static void compute_f32(const pw_args *w, int64_t n, float *o, const float *a, const float *b) {
  if (w->binary) switch (w->op) { TPSH_BINARY_OPS(BINARY_LOOP) }
  else switch (w->op) { TPSH_UNARY_OPS(UNARY_LOOP) }
}
#undef FN
#undef P

#define FN(kind, id, x, y) tpsh_##kind##_f64(id, x, y)
#define P w->p
static void compute_f64(const pw_args *w, int64_t n, double *o, const double *a, const double *b) {
  if (w->binary) switch (w->op) { TPSH_BINARY_OPS(BINARY_LOOP) }
  else switch (w->op) { TPSH_UNARY_OPS(UNARY_LOOP) }
}
#undef FN
#undef P

/* integers: only the ops whose row takes them reach here (the core refuses the others) */
#define FN(kind, id, x, y) tpsh_##kind##_i64(id, x KIND_##kind(y))
#define KIND_unary(y)
#define KIND_binary(y) , y
static void compute_i64(const pw_args *w, int64_t n, int64_t *o, const int64_t *a, const int64_t *b) {
  if (w->binary) switch (w->op) { TPSH_BINARY_OPS(BINARY_LOOP) }
  else switch (w->op) { TPSH_UNARY_OPS(UNARY_LOOP) }
}
#undef FN
#undef KIND_unary
#undef KIND_binary
#undef UNARY_LOOP
#undef BINARY_LOOP

/* ==== blocks: an operand of any dtype and stride in a buffer of the compute type ====================== */
/* x[j] = the element at a + j * sa, for j < m. Made for each dtype, and for its unit stride apart (a
 * constant stride lets the compiler vectorise the loop and its conversion; a contiguous f16 run in
 * blocks took 5x the plain C loop with the stride a variable). */
#define BLOCK_INLINE static inline __attribute__((always_inline))
BLOCK_INLINE void load_f32_as(float *x, const char *a, int64_t sa, int64_t m, int dt) {
  uint16_t h;
  switch (dt) {
  case TPSH_F32: for (int64_t j = 0; j < m; j++) memcpy(&x[j], a + j * sa, 4); break;
  case TPSH_F16: for (int64_t j = 0; j < m; j++) { memcpy(&h, a + j * sa, 2); x[j] = tpsh_half_to_float_inl(h); } break;
  case TPSH_BF16: for (int64_t j = 0; j < m; j++) { memcpy(&h, a + j * sa, 2); x[j] = tpsh_bf16_to_float_inl(h); } break;
  case TPSH_F64: for (int64_t j = 0; j < m; j++) x[j] = (float)load_f64(a + j * sa, dt); break;   /* unused */
  default: for (int64_t j = 0; j < m; j++) x[j] = (float)load_i64(a + j * sa, dt); break;   /* an integer divided */
  }
}

BLOCK_INLINE void store_f32_as(char *o, int64_t so, const float *x, int64_t m, int dt) {
  uint16_t h;
  switch (dt) {
  case TPSH_F32: for (int64_t j = 0; j < m; j++) memcpy(o + j * so, &x[j], 4); break;
  case TPSH_F16: for (int64_t j = 0; j < m; j++) { h = tpsh_float_to_half_inl(x[j]); memcpy(o + j * so, &h, 2); } break;
  default: for (int64_t j = 0; j < m; j++) { h = tpsh_float_to_bf16_inl(x[j]); memcpy(o + j * so, &h, 2); } break;
  }
}

static void load_block_f32(float *x, const char *a, int64_t sa, int64_t m, int dt) {
  if (dt == TPSH_F16 && sa == 2) load_f32_as(x, a, 2, m, TPSH_F16);
  else if (dt == TPSH_BF16 && sa == 2) load_f32_as(x, a, 2, m, TPSH_BF16);
  else if (dt == TPSH_F32 && sa == 4) load_f32_as(x, a, 4, m, TPSH_F32);
  else load_f32_as(x, a, sa, m, dt);
}

static void store_block_f32(char *o, int64_t so, const float *x, int64_t m, int dt) {
  if (dt == TPSH_F16 && so == 2) store_f32_as(o, 2, x, m, TPSH_F16);
  else if (dt == TPSH_BF16 && so == 2) store_f32_as(o, 2, x, m, TPSH_BF16);
  else if (dt == TPSH_F32 && so == 4) store_f32_as(o, 4, x, m, TPSH_F32);
  else store_f32_as(o, so, x, m, dt);
}

static void load_block_f64(double *x, const char *a, int64_t sa, int64_t m) {
  for (int64_t j = 0; j < m; j++) memcpy(&x[j], a + j * sa, 8);
}

static void store_block_f64(char *o, int64_t so, const double *x, int64_t m) {
  for (int64_t j = 0; j < m; j++) memcpy(o + j * so, &x[j], 8);
}

/* always_inline with a constant dt: a loop per integer dtype */
BLOCK_INLINE void load_block_i64_as(int64_t *x, const char *a, int64_t sa, int64_t m, int dt) {
  for (int64_t j = 0; j < m; j++) x[j] = load_i64(a + j * sa, dt);
}
BLOCK_INLINE void store_block_i64_as(char *o, int64_t so, const int64_t *x, int64_t m, int dt) {
  for (int64_t j = 0; j < m; j++) store_i64(o + j * so, dt, x[j]);
}

static void load_block_i64(int64_t *x, const char *a, int64_t sa, int64_t m, int dt) {
  switch (dt) {
  case TPSH_I32: load_block_i64_as(x, a, sa, m, TPSH_I32); break;
  case TPSH_I64: load_block_i64_as(x, a, sa, m, TPSH_I64); break;
  default: load_block_i64_as(x, a, sa, m, TPSH_U8); break;
  }
}

static void store_block_i64(char *o, int64_t so, const int64_t *x, int64_t m, int dt) {
  switch (dt) {
  case TPSH_I32: store_block_i64_as(o, so, x, m, TPSH_I32); break;
  case TPSH_I64: store_block_i64_as(o, so, x, m, TPSH_I64); break;
  default: store_block_i64_as(o, so, x, m, TPSH_U8); break;
  }
}

#undef BLOCK_INLINE

/* One run of n elements in blocks: p[0] the output, p[1..] the operands, s[] their byte strides. */
static void run_blocks(const pw_args *w, int64_t n, char *const *p, const int64_t *s, const int *dt) {
  char *o = p[0];
  const char *a = p[1], *b = p[2];
  for (int64_t j = 0, m; j < n; j += m, o += m * s[0], a += m * s[1], b += m * s[2]) {
    m = min64(RUN_BLOCK, n - j);
    if (dt[0] == TPSH_F64) {
      double x[RUN_BLOCK], y[RUN_BLOCK];
      load_block_f64(x, a, s[1], m);
      if (w->binary) load_block_f64(y, b, s[2], m);
      compute_f64(w, m, x, x, y);
      store_block_f64(o, s[0], x, m);
    } else if (is_float(dt[0])) {
      float x[RUN_BLOCK], y[RUN_BLOCK];
      load_block_f32(x, a, s[1], m, dt[1]);
      if (w->binary) load_block_f32(y, b, s[2], m, dt[2]);
      compute_f32(w, m, x, x, y);
      store_block_f32(o, s[0], x, m, dt[0]);
    } else {
      int64_t x[RUN_BLOCK], y[RUN_BLOCK];
      load_block_i64(x, a, s[1], m, dt[1]);
      if (w->binary) load_block_i64(y, b, s[2], m, dt[2]);
      compute_i64(w, m, x, x, y);
      store_block_i64(o, s[0], x, m, dt[0]);
    }
  }
}

/* ==== entry point ====================================================================================== */
int tpsh_cpu_pointwise(const tpsh_kargs *k, const char *name) {
  pw_args w = {.binary = k->op == TPSH_K_BINARY, .op = (int)k->i[0], .p = k->s[0], .pf = (float)k->s[0]};
  int nt = w.binary ? 3 : 2;
  if (w.op < 0 || w.op >= (w.binary ? (int)TPSH_B_COUNT : (int)TPSH_U_COUNT))
    return tpsh_error(TPSH_EINVAL, "%s: unknown element-wise op %d", name, w.op);
  for (int i = 1; i < nt; i++)
    if (!same_shape(&k->t[0], &k->t[i]))
      return tpsh_error(TPSH_EINVAL, "%s: operand %d does not have the output's shape", name, i);
  int dt[3] = {k->t[0].dtype_id, k->t[1].dtype_id, k->t[nt - 1].dtype_id};
  if (!is_float(dt[0]) && !(w.binary ? tpsh_binary_takes_ints(w.op) : tpsh_unary_takes_ints(w.op)))
    return tpsh_error(TPSH_EINVAL, "%s: expected a floating dtype, got dtype %d", name, dt[0]);
  int same = dt[1] == dt[0] && dt[2] == dt[0];
  if (!same && !(dt[0] == TPSH_F32 && !is_float(dt[1]) && dt[2] == dt[1]))
    return tpsh_error(TPSH_EINVAL, "%s: operands of dtypes %d and %d into %d", name, dt[1], dt[2], dt[0]);
  /* unary: b aliases a, so that the loops need no case of their own */
  const tpsh_tensor *ts[3] = {&k->t[0], &k->t[1], &k->t[nt - 1]};
  char *ptr[3] = {k->data[0], k->data[1], k->data[nt - 1]};
  int es = elsize(dt[0]);
  cpu_iter it;
  for (int64_t n = iter_begin(&it, 3, ts, ptr); n; n = iter_next(&it)) {
    int unit = same && it.inner[0] == es && it.inner[1] == es && it.inner[2] == es;
    if (unit && dt[0] == TPSH_F32)
      compute_f32(&w, n, (float *)it.p[0], (const float *)it.p[1], (const float *)it.p[2]);
    else if (unit && dt[0] == TPSH_F64)
      compute_f64(&w, n, (double *)it.p[0], (const double *)it.p[1], (const double *)it.p[2]);
    else
      run_blocks(&w, n, it.p, it.inner, dt);
  }
  return TPSH_OK;
}
