/*
 * test_cpu_kernels.c: the CPU kernels (src/backend/cpu/cpu_kernels.c, cpu_matmul.c) and the f16/bf16
 * conversions (src/core/dtype_convert.c), driven through tpsh_cpu_kernel_run with tpsh_kargs built by
 * hand, against values computed here. No framework: one line per check group, then "N passed, N failed";
 * the exit status is non-zero when anything failed.
 *
 * Links: cpu_kernels.c cpu_matmul.c core/dtype_convert.c core/error.c, -lopenblas -lm.
 */
#define _POSIX_C_SOURCE 200809L
#include "backend/cpu/cpu_kernels.h"
#include "core/random.h"
#include "core/dtype_convert.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ==== checks =================================================================================== */
static int passed, failed, group_checks, group_failed;

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    group_checks++;                                                        \
    if (cond) {                                                            \
      passed++;                                                            \
    } else {                                                               \
      failed++;                                                            \
      group_failed++;                                                      \
      if (group_failed <= 10) {                                            \
        printf("  FAIL line %d: ", __LINE__);                              \
        printf(__VA_ARGS__);                                               \
        printf("\n");                                                      \
      }                                                                    \
    }                                                                      \
  } while (0)

static void group_end(const char *name) {
  printf("%s %-28s %d checks%s\n", group_failed ? "FAIL" : "ok  ", name, group_checks,
         group_failed ? " (some failed)" : "");
  group_checks = group_failed = 0;
}

/* ==== tensors built by hand ==================================================================== */
static const int all_dtypes[] = {TPSH_F32, TPSH_F16, TPSH_BF16, TPSH_F64, TPSH_I32, TPSH_I64, TPSH_U8};
static const char *const dtype_names[] = {"f32", "f16", "bf16", "f64", "i32", "i64", "u8"};

static int esize(int dt) { return dt == TPSH_U8 ? 1 : dt == TPSH_F16 || dt == TPSH_BF16 ? 2 : dt == TPSH_F64 || dt == TPSH_I64 ? 8 : 4; }
static int isflt(int dt) { return dt <= TPSH_F64; }

static tpsh_tensor mk(int dt, int ndim, const int64_t *sizes, const int64_t *strides) {
  tpsh_tensor t;
  memset(&t, 0, sizeof t);
  t.ndim = ndim;
  t.dtype_id = dt;
  t.device = -1;
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    t.sizes[d] = sizes[d];
    t.strides[d] = strides ? strides[d] : s;
    s *= sizes[d];
  }
  return t;
}

static tpsh_tensor mk2(int dt, int64_t r, int64_t c, int64_t s0, int64_t s1) {
  return mk(dt, 2, (int64_t[]){r, c}, (int64_t[]){s0, s1});
}

static int64_t numel_of(const tpsh_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
  return n;
}

/* storage elements a view with non-negative strides reaches */
static int64_t span(const tpsh_tensor *t) {
  int64_t s = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (t->sizes[d] == 0) return 1;
    s += (t->sizes[d] - 1) * t->strides[d];
  }
  return s;
}

static void *alloc_for(const tpsh_tensor *t) { return calloc((size_t)span(t), (size_t)esize(t->dtype_id)); }

/* storage offset of the l-th element in row-major order */
static int64_t off_of(const tpsh_tensor *t, int64_t l) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (l % t->sizes[d]) * t->strides[d];
    l /= t->sizes[d];
  }
  return off;
}

static double getd(const void *buf, int dt, int64_t off) {
  const char *p = (const char *)buf + off * esize(dt);
  switch (dt) {
  case TPSH_F32: { float v; memcpy(&v, p, 4); return v; }
  case TPSH_F16: { uint16_t h; memcpy(&h, p, 2); return tpsh_half_to_float(h); }
  case TPSH_BF16: { uint16_t h; memcpy(&h, p, 2); return tpsh_bf16_to_float(h); }
  case TPSH_F64: { double v; memcpy(&v, p, 8); return v; }
  case TPSH_I32: { int32_t v; memcpy(&v, p, 4); return v; }
  case TPSH_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
  default: return *(const uint8_t *)p;
  }
}

static int64_t geti(const void *buf, int dt, int64_t off) {
  const char *p = (const char *)buf + off * esize(dt);
  if (dt == TPSH_I64) { int64_t v; memcpy(&v, p, 8); return v; }
  if (dt == TPSH_I32) { int32_t v; memcpy(&v, p, 4); return v; }
  if (dt == TPSH_U8) return *(const uint8_t *)p;
  return (int64_t)getd(buf, dt, off);
}

/* only for values the dtype holds (the kernels' own casts are what is under test) */
static void setd(void *buf, int dt, int64_t off, double v) {
  char *p = (char *)buf + off * esize(dt);
  switch (dt) {
  case TPSH_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
  case TPSH_F16: { uint16_t h = tpsh_float_to_half((float)v); memcpy(p, &h, 2); break; }
  case TPSH_BF16: { uint16_t h = tpsh_float_to_bf16((float)v); memcpy(p, &h, 2); break; }
  case TPSH_F64: memcpy(p, &v, 8); break;
  case TPSH_I32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
  case TPSH_I64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
  default: *(uint8_t *)p = (uint8_t)v; break;
  }
}

static int run(int op, int nt, const tpsh_tensor *t, void *const *data, double s0, double s1) {
  tpsh_kargs k;
  memset(&k, 0, sizeof k);
  k.op = op;
  k.nt = nt;
  for (int i = 0; i < nt; i++) { k.t[i] = t[i]; k.data[i] = data[i]; }
  k.s[0] = s0;
  k.s[1] = s1;
  k.name = "test";
  return tpsh_cpu_kernel_run(&k);
}

static uint64_t rng = 0x1234567;
static double urand(void) { rng = rng * 6364136223846793005ULL + 1442695040888963407ULL; return (double)(rng >> 11) * 0x1p-53; }
static int irand(int n) { return (int)(urand() * n); }

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* ==== f16 / bf16 =============================================================================== */
/* h must be the nearest half to f, ties to even (checked against both neighbours in magnitude). */
static int half_is_nearest(float f, uint16_t h) {
  double v = tpsh_half_to_float(h), x = f, d = fabs(v - x);
  uint16_t mag = h & 0x7fff, sign = h & 0x8000;
  if (mag > 0) {
    double lo = tpsh_half_to_float(sign | (uint16_t)(mag - 1));
    if (fabs(lo - x) < d || (fabs(lo - x) == d && (h & 1))) return 0;
  }
  if (mag < 0x7bff) {
    double hi = tpsh_half_to_float(sign | (uint16_t)(mag + 1));
    if (fabs(hi - x) < d || (fabs(hi - x) == d && (h & 1))) return 0;
  }
  return (signbit(v) != 0) == (signbit(x) != 0);
}

static void test_half(void) {
  CHECK(tpsh_float_to_half(1.0f + 0x1p-11f) == 0x3c00, "1+2^-11 ties to even 1.0");
  CHECK(tpsh_float_to_half(1.0f + 3 * 0x1p-11f) == 0x3c02, "1+3*2^-11 ties to even 1+2^-9");
  CHECK(tpsh_float_to_half(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01, "above the tie rounds up");
  CHECK(tpsh_float_to_half(65504.0f) == 0x7bff, "max half");
  CHECK(tpsh_float_to_half(65519.996f) == 0x7bff, "just below the overflow tie");
  CHECK(tpsh_float_to_half(65520.0f) == 0x7c00, "65520 rounds to inf");
  CHECK(tpsh_float_to_half(1e10f) == 0x7c00 && tpsh_float_to_half(-INFINITY) == 0xfc00, "inf");
  CHECK(tpsh_float_to_half(0x1p-14f) == 0x0400, "min normal");
  CHECK(tpsh_float_to_half(0x1p-24f) == 0x0001, "min subnormal");
  CHECK(tpsh_float_to_half(0x1p-25f) == 0x0000, "half of min subnormal ties to 0");
  CHECK(tpsh_float_to_half(3 * 0x1p-25f) == 0x0002, "1.5 subnormal ulps ties to 2");
  CHECK(tpsh_float_to_half(0x1p-25f * 1.0001f) == 0x0001, "just above the tie");
  CHECK(tpsh_float_to_half(0x1p-14f - 0x1p-25f) == 0x0400, "subnormal rounding up into the normals");
  CHECK(tpsh_float_to_half(-0.0f) == 0x8000 && tpsh_float_to_half(-1e-30f) == 0x8000, "signed zero");
  uint16_t n = tpsh_float_to_half(NAN), sn = tpsh_float_to_half(bits_f(0xff800001u));
  CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff), "NaN stays NaN: %04x", n);
  CHECK((sn & 0xfc00) == 0xfc00 && (sn & 0x3ff), "signalling -NaN stays a negative NaN: %04x", sn);
  CHECK(tpsh_half_to_float(0x0001) == 0x1p-24f && tpsh_half_to_float(0x83ff) == -0x3ffp-24f, "subnormals in");
  CHECK(isinf(tpsh_half_to_float(0xfc00)) && tpsh_half_to_float(0xfc00) < 0, "-inf in");
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = tpsh_half_to_float((uint16_t)h);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) bad += !isnan(f) || !isnan(tpsh_half_to_float(tpsh_float_to_half(f)));
    else bad += tpsh_float_to_half(f) != h;
  }
  CHECK(bad == 0, "%d of 65536 halves do not round-trip", bad);
  bad = 0;
  for (uint64_t u = 0; u < 0x100000000ULL; u += 4093) {        /* a million floats, every exponent */
    float f = bits_f((uint32_t)u);
    if (isnan(f) || fabsf(f) >= 65504.0f) continue;
    bad += !half_is_nearest(f, tpsh_float_to_half(f));
  }
  CHECK(bad == 0, "%d floats not rounded to the nearest half", bad);
#ifdef __FLT16_MAX__
  bad = 0;
  for (uint64_t u = 7; u < 0x100000000ULL; u += 4099) {
    float f = bits_f((uint32_t)u);
    _Float16 r = (_Float16)f;
    uint16_t rb;
    memcpy(&rb, &r, 2);
    if (!isnan(f)) bad += tpsh_float_to_half(f) != rb;
  }
  CHECK(bad == 0, "%d floats differ from the compiler's _Float16", bad);
#endif
  group_end("f16 conversions");
}

static void test_bf16(void) {
  CHECK(tpsh_float_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "1+2^-8 ties to even 1.0");
  CHECK(tpsh_float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82, "1+3*2^-8 ties to even");
  CHECK(tpsh_float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81, "above the tie");
  CHECK(tpsh_float_to_bf16(bits_f(0x7f7fffffu)) == 0x7f80, "FLT_MAX rounds to inf");
  CHECK(tpsh_float_to_bf16(-INFINITY) == 0xff80 && tpsh_float_to_bf16(-0.0f) == 0x8000, "inf, -0");
  uint16_t sn = tpsh_float_to_bf16(bits_f(0x7f800001u)), nn = tpsh_float_to_bf16(-NAN);
  CHECK((sn & 0x7f80) == 0x7f80 && (sn & 0x7f), "a NaN with a low payload must not become inf: %04x", sn);
  CHECK((nn & 0xff80) == 0xff80 && (nn & 0x7f), "-NaN keeps its sign: %04x", nn);
  CHECK(tpsh_float_to_bf16(0x1p-133f) == 0x0001, "subnormal bf16");
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = tpsh_bf16_to_float((uint16_t)h);
    bad += isnan(f) ? !isnan(tpsh_bf16_to_float(tpsh_float_to_bf16(f))) : tpsh_float_to_bf16(f) != h;
  }
  CHECK(bad == 0, "%d of 65536 bf16 do not round-trip", bad);
  group_end("bf16 conversions");
}

/* ==== f16 / bf16 from double: one rounding ======================================================= */
/* The nearest of cand's neighbours in magnitude (and cand) to v, ties to the even one: an independent
 * reference, given a candidate within one unit of the answer. */
static uint16_t nearest_narrow(double v, uint16_t cand, float (*to_f)(uint16_t), uint16_t max_mag) {
  uint16_t sign = cand & 0x8000, mag = cand & 0x7fff, best = cand;
  double bd = fabs((double)to_f(cand) - v);
  for (int d = -1; d <= 1; d += 2) {
    int m = (int)mag + d;
    if (m < 0 || m > max_mag) continue;
    uint16_t c = sign | (uint16_t)m;
    double cd = fabs((double)to_f(c) - v);
    if (cd < bd || (cd == bd && !(c & 1))) { best = c; bd = cd; }
  }
  return best;
}

static void test_from_double(void) {
  /* the audit's cases: just above a tie, which rounding through f32 made an exact tie */
  CHECK(tpsh_double_to_half(1 + 0x1p-11 + 0x1p-40) == 0x3c01, "f16: 1 + 2^-11 + 2^-40 rounds up");
  CHECK(tpsh_double_to_half(1 + 0x1p-11) == 0x3c00, "f16: the exact tie 1 + 2^-11 rounds to even");
  CHECK(tpsh_double_to_bf16(1 + 0x1p-8 + 0x1p-40) == 0x3f81, "bf16: 1 + 2^-8 + 2^-40 rounds up");
  CHECK(tpsh_double_to_bf16(0x1p24 + 0x1p16 + 1) == 0x4b81, "bf16: 2^24 + 2^16 + 1 rounds up");
  CHECK(tpsh_double_to_half(0x1p-25 + 0x1p-60) == 0x0001 && tpsh_double_to_half(0x1p-25) == 0x0000,
        "f16 subnormal: above the tie up, the tie to 0");
  CHECK(tpsh_double_to_half(1e300) == 0x7c00 && tpsh_double_to_bf16(-1e300) == 0xff80, "overflow to inf");
  CHECK(tpsh_double_to_half(65519.99999999) == 0x7bff && tpsh_double_to_half(65520) == 0x7c00, "f16's edge");
  CHECK(tpsh_double_to_half(-0.0) == 0x8000 && tpsh_double_to_bf16(1e-300) == 0x0000, "zeros");
  uint16_t n = tpsh_double_to_half(NAN);
  CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff), "NaN stays NaN: %04x", n);
  /* near every tie and midway between, over the whole range: value +- a small fraction of an ulp */
  int bad_h = 0, bad_b = 0, bad_c = 0;
  for (uint32_t h = 0; h < 0x7c00; h += 3) {
    double lo = tpsh_half_to_float((uint16_t)h), hi = tpsh_half_to_float((uint16_t)(h + 1));
    for (int k = 0; k < 6; k++) {
      double t = (lo + hi) / 2, off[6] = {0, 0x1p-30, -0x1p-30, 0x1p-45, -0x1p-45, 0.25};
      double v = t + off[k] * (hi - lo);
      uint16_t got = tpsh_double_to_half(v);
      bad_h += got != nearest_narrow(v, got, tpsh_half_to_float, 0x7bff);
#ifdef __FLT16_MAX__
      _Float16 r = (_Float16)v;             /* the compiler's conversion, one rounding from double */
      uint16_t rb;
      memcpy(&rb, &r, 2);
      bad_c += got != rb;
#endif
    }
  }
  for (uint32_t b = 0; b < 0x7f80; b += 7) {
    double lo = tpsh_bf16_to_float((uint16_t)b), hi = tpsh_bf16_to_float((uint16_t)(b + 1));
    for (int k = 0; k < 5; k++) {
      double off[5] = {0, 0x1p-30, -0x1p-30, 0x1p-45, -0x1p-45};
      double v = (lo + hi) / 2 + off[k] * (hi - lo);
      if (isinf(v)) continue;
      uint16_t got = tpsh_double_to_bf16(v);
      bad_b += got != nearest_narrow(v, got, tpsh_bf16_to_float, 0x7f7f);
    }
  }
  CHECK(bad_h == 0, "%d doubles near f16 ties not rounded once to the nearest", bad_h);
  CHECK(bad_c == 0, "%d doubles differ from the compiler's double -> _Float16", bad_c);
  CHECK(bad_b == 0, "%d doubles near bf16 ties not rounded once to the nearest", bad_b);
  group_end("f16/bf16 from double");
}

/* ==== fill ===================================================================================== */
static void test_fill(void) {
  for (int di = 0; di < 7; di++) {
    int dt = all_dtypes[di];
    const char *nm = dtype_names[di];
    tpsh_tensor base = mk2(dt, 3, 4, 4, 1), view = mk2(dt, 3, 2, 4, 2);   /* every other column */
    void *buf = alloc_for(&base);
    for (int64_t i = 0; i < 12; i++) setd(buf, dt, i, 7);
    CHECK(run(TPSH_K_FILL, 1, &view, &buf, 2.5, 0) == 0, "%s fill", nm);
    int ok = 1;
    for (int64_t i = 0; i < 12; i++) ok &= getd(buf, dt, i) == (i % 2 ? 7 : (isflt(dt) ? 2.5 : 2));
    CHECK(ok, "%s strided fill touches every other element", nm);
    CHECK(run(TPSH_K_FILL, 1, &base, &buf, -1.0, 0) == 0 && getd(buf, dt, 11) == (dt == TPSH_U8 ? 255 : -1),
          "%s fill -1 (u8 wraps)", nm);
    tpsh_tensor zero_dim = mk(dt, 0, NULL, NULL), empty = mk2(dt, 3, 0, 1, 1);
    void *p5 = (char *)buf + 5 * esize(dt);
    double neg = dt == TPSH_U8 ? 255 : -1;
    CHECK(run(TPSH_K_FILL, 1, &zero_dim, &p5, 9, 0) == 0 && getd(buf, dt, 5) == 9 && getd(buf, dt, 4) == neg &&
          getd(buf, dt, 6) == neg, "%s 0-dim fill writes one element", nm);
    void *nul = NULL;
    CHECK(run(TPSH_K_FILL, 1, &empty, &nul, 9, 0) == 0, "%s zero-size fill with no data", nm);
    free(buf);
  }
  int32_t i = 5;
  void *pi = &i;
  tpsh_tensor one = mk(TPSH_I32, 0, NULL, NULL);
  CHECK(run(TPSH_K_FILL, 1, &one, &pi, NAN, 0) == 0 && i == 0, "NaN into i32 gives 0");
  CHECK(run(TPSH_K_FILL, 1, &one, &pi, -3.9, 0) == 0 && i == -3, "-3.9 into i32 truncates to -3");
  uint16_t h;
  void *ph = &h;
  one.dtype_id = TPSH_F16;
  CHECK(run(TPSH_K_FILL, 1, &one, &ph, 1e300, 0) == 0 && h == 0x7c00, "1e300 into f16 is inf");
  group_end("fill");
}

/* ==== copy ===================================================================================== */
static int copy1(int dto, int dts, double v, double *got) {   /* one element through COPY */
  tpsh_tensor t[2] = {mk(dto, 0, NULL, NULL), mk(dts, 0, NULL, NULL)};
  uint64_t o = 0, s = 0;
  setd(&s, dts, 0, v);
  void *d[2] = {&o, &s};
  int rc = run(TPSH_K_COPY, 2, t, d, 0, 0);
  *got = getd(&o, dto, 0);
  return rc;
}

static void test_copy(void) {
  const double vals[] = {0, 1, 3, 42, 100, 255};
  for (int a = 0; a < 7; a++)
    for (int b = 0; b < 7; b++) {
      int ok = 1;
      for (int v = 0; v < 6; v++) {
        double got;
        ok &= copy1(all_dtypes[a], all_dtypes[b], vals[v], &got) == 0 && got == vals[v];
      }
      CHECK(ok, "copy %s <- %s of exact values", dtype_names[a], dtype_names[b]);
    }
  double g;
  copy1(TPSH_I32, TPSH_F32, -2.7, &g); CHECK(g == -2, "f32 -2.7 -> i32 %g", g);
  copy1(TPSH_I64, TPSH_F64, 2.9, &g); CHECK(g == 2, "f64 2.9 -> i64 %g", g);
  copy1(TPSH_I32, TPSH_F32, NAN, &g); CHECK(g == 0, "NaN -> i32 %g", g);
  copy1(TPSH_I64, TPSH_F64, -NAN, &g); CHECK(g == 0, "NaN -> i64 %g", g);
  copy1(TPSH_U8, TPSH_F16, NAN, &g); CHECK(g == 0, "NaN -> u8 %g", g);
  copy1(TPSH_I64, TPSH_F32, -1e30, &g); CHECK(g == (double)INT64_MIN, "-1e30 -> i64 saturates: %g", g);
  copy1(TPSH_U8, TPSH_F32, -1, &g); CHECK(g == 255, "f32 -1 -> u8 %g", g);
  copy1(TPSH_U8, TPSH_F64, 300.7, &g); CHECK(g == 44, "f64 300.7 -> u8 %g", g);
  copy1(TPSH_U8, TPSH_I32, -1, &g); CHECK(g == 255, "i32 -1 -> u8 %g", g);
  copy1(TPSH_F16, TPSH_F64, 1 + 0x1p-11, &g); CHECK(g == 1, "f64 1+2^-11 -> f16 %g", g);
  copy1(TPSH_F16, TPSH_F32, 1e5, &g); CHECK(isinf(g), "f32 1e5 -> f16 %g", g);
  copy1(TPSH_BF16, TPSH_F16, 1 + 0x1p-8, &g); CHECK(g == 1, "f16 1+2^-8 -> bf16 %g", g);
  copy1(TPSH_F32, TPSH_BF16, -NAN, &g); CHECK(isnan(g), "bf16 NaN -> f32");
  {
    int64_t big = (1LL << 60) + 1, wide = (1LL << 32) + 5, out = 0;
    tpsh_tensor t[2] = {mk(TPSH_I64, 0, NULL, NULL), mk(TPSH_I64, 0, NULL, NULL)};
    void *d[2] = {&out, &big};
    CHECK(run(TPSH_K_COPY, 2, t, d, 0, 0) == 0 && out == big, "i64 copy is exact");
    int32_t o32 = 0;
    t[0].dtype_id = TPSH_I32;
    d[0] = &o32;
    d[1] = &wide;
    CHECK(run(TPSH_K_COPY, 2, t, d, 0, 0) == 0 && o32 == 5, "i64 2^32+5 -> i32 wraps to %d", o32);
    double huge = 1e20;
    t[0].dtype_id = TPSH_I64;
    t[1].dtype_id = TPSH_F64;
    d[0] = &out;
    d[1] = &huge;
    CHECK(run(TPSH_K_COPY, 2, t, d, 0, 0) == 0 && out == INT64_MAX, "1e20 -> i64 saturates");
  }
  /* strided, transposed and casting copies against element-by-element expectations */
  for (int a = 0; a < 7; a++) {
    int dto = all_dtypes[a], dts = all_dtypes[(a + 3) % 7];
    tpsh_tensor src = mk2(dts, 5, 3, 1, 5), dst = mk2(dto, 5, 3, 8, 2);  /* transposed in, strided out */
    void *sb = alloc_for(&src), *db = alloc_for(&dst);
    for (int64_t l = 0; l < 15; l++) setd(sb, dts, off_of(&src, l), (double)(l * 7 % 16));
    void *d[2] = {db, sb};
    tpsh_tensor t[2] = {dst, src};
    int ok = run(TPSH_K_COPY, 2, t, d, 0, 0) == 0;
    for (int64_t l = 0; l < 15; l++) ok &= getd(db, dto, off_of(&dst, l)) == (double)(l * 7 % 16);
    CHECK(ok, "strided copy %s <- %s", dtype_names[a], dtype_names[(a + 3) % 7]);
    free(sb);
    free(db);
  }
  {
    float src[6] = {0, 1, 2, 3, 4, 5}, dst[6] = {0};
    tpsh_tensor t[2] = {mk(TPSH_F32, 1, (int64_t[]){6}, NULL), mk2(TPSH_F32, 3, 2, 1, 3)};
    void *d[2] = {dst, src};
    CHECK(run(TPSH_K_COPY, 2, t, d, 0, 0) == 0 && dst[0] == 0 && dst[1] == 3 && dst[2] == 1 && dst[5] == 5,
          "shapes of equal numel pair in row-major order");
    t[1] = mk(TPSH_F32, 1, (int64_t[]){6}, NULL);
    d[1] = dst;
    CHECK(run(TPSH_K_COPY, 2, t, d, 0, 0) == 0 && dst[1] == 3, "copy onto itself");
    t[0] = mk2(TPSH_F32, 0, 4, 4, 1);
    t[1] = mk2(TPSH_F64, 0, 4, 4, 1);
    d[0] = d[1] = NULL;
    CHECK(run(TPSH_K_COPY, 2, t, d, 0, 0) == 0, "zero-size copy");
  }
  {
    /* 8 dims, source with reversed (transposed) strides and a size-1 dim carrying a junk stride */
    int64_t sz[8] = {2, 3, 1, 2, 2, 3, 2, 2}, st[8];
    int64_t s = 1;
    for (int d = 0; d < 8; d++) { st[d] = s; s *= sz[d]; }
    st[2] = 999;
    tpsh_tensor src = mk(TPSH_F64, 8, sz, st), dst = mk(TPSH_F32, 8, sz, NULL);
    int64_t n = numel_of(&src);
    void *sb = alloc_for(&src), *db = alloc_for(&dst);
    for (int64_t l = 0; l < n; l++) setd(sb, TPSH_F64, off_of(&src, l), (double)l);
    tpsh_tensor t[2] = {dst, src};
    void *d[2] = {db, sb};
    int ok = run(TPSH_K_COPY, 2, t, d, 0, 0) == 0;
    for (int64_t l = 0; l < n; l++) ok &= ((float *)db)[l] == (float)l;
    CHECK(ok, "8-d permuted copy");
    free(sb);
    free(db);
  }
  group_end("copy and casts");
}

/* ==== add, mul, scale ========================================================================== */
static void test_binary(void) {
  for (int di = 0; di < 7; di++) {
    int dt = all_dtypes[di];
    const char *nm = dtype_names[di];
    tpsh_tensor a = mk2(dt, 4, 3, 1, 4), b = mk2(dt, 4, 3, 3, 1), o = mk2(dt, 4, 3, 6, 2);
    void *ab = alloc_for(&a), *bb = alloc_for(&b), *ob = alloc_for(&o);
    for (int64_t l = 0; l < 12; l++) {
      setd(ab, dt, off_of(&a, l), (double)(l % 7));
      setd(bb, dt, off_of(&b, l), (double)(l % 5));
    }
    tpsh_tensor t[3] = {o, a, b};
    void *d[3] = {ob, ab, bb};
    int ok_add = 1, ok_mul = 1, ok_scale = 1;
    t[0] = o;
    ok_add &= run(TPSH_K_ADD, 3, t, d, 2, 0) == 0;
    for (int64_t l = 0; l < 12; l++) ok_add &= getd(ob, dt, off_of(&o, l)) == (double)(l % 7 + 2 * (l % 5));
    ok_mul &= run(TPSH_K_MUL, 3, t, d, 0, 0) == 0;
    for (int64_t l = 0; l < 12; l++) ok_mul &= getd(ob, dt, off_of(&o, l)) == (double)((l % 7) * (l % 5));
    ok_scale &= run(TPSH_K_SCALE, 2, t, d, 3, 0) == 0;
    for (int64_t l = 0; l < 12; l++) ok_scale &= getd(ob, dt, off_of(&o, l)) == (double)(3 * (l % 7));
    CHECK(ok_add && ok_mul && ok_scale, "%s strided add/mul/scale (add %d mul %d scale %d)", nm, ok_add, ok_mul,
          ok_scale);
    /* in place: out is exactly a (add_) */
    t[0] = a;
    d[0] = ab;
    int ok = run(TPSH_K_ADD, 3, t, d, 1, 0) == 0;
    for (int64_t l = 0; l < 12; l++) ok &= getd(ab, dt, off_of(&a, l)) == (double)(l % 7 + l % 5);
    CHECK(ok, "%s in-place add", nm);
    free(ab);
    free(bb);
    free(ob);
  }
  {
    uint8_t a[2] = {200, 3}, b[2] = {100, 255}, o[2];
    tpsh_tensor t[3];
    for (int i = 0; i < 3; i++) t[i] = mk(TPSH_U8, 1, (int64_t[]){2}, NULL);
    void *d[3] = {o, a, b};
    CHECK(run(TPSH_K_ADD, 3, t, d, 1, 0) == 0 && o[0] == 44 && o[1] == 2, "u8 add wraps");
    CHECK(run(TPSH_K_MUL, 3, t, d, 0, 0) == 0 && o[0] == (uint8_t)20000 && o[1] == (uint8_t)765, "u8 mul wraps");
    int32_t x[2] = {INT32_MAX, -7}, y[2] = {1, 0}, z[2];
    for (int i = 0; i < 3; i++) t[i].dtype_id = TPSH_I32;
    void *e[3] = {z, x, y};
    CHECK(run(TPSH_K_ADD, 3, t, e, 1, 0) == 0 && z[0] == INT32_MIN, "i32 add wraps");
    CHECK(run(TPSH_K_SCALE, 2, t, e, 0.5, 0) == 0 && z[0] == INT32_MAX / 2 && z[1] == -3,
          "i32 scale by 0.5 truncates toward zero: %d %d", z[0], z[1]);
    int64_t p[2] = {(1LL << 60) + 1, 5}, q[2] = {3, -2}, r[2];
    for (int i = 0; i < 3; i++) t[i].dtype_id = TPSH_I64;
    void *f[3] = {r, p, q};
    CHECK(run(TPSH_K_ADD, 3, t, f, -2, 0) == 0 && r[0] == (1LL << 60) - 5 && r[1] == 9, "i64 add exact beyond 2^53");
  }
  {
    /* f16/bf16 results round once, to nearest even */
    uint16_t a[2], b[2], o[2];
    a[0] = a[1] = tpsh_float_to_half(1.0f);
    b[0] = tpsh_float_to_half(0x1p-11f);
    b[1] = tpsh_float_to_half(3 * 0x1p-11f);
    tpsh_tensor t[3];
    for (int i = 0; i < 3; i++) t[i] = mk(TPSH_F16, 1, (int64_t[]){2}, NULL);
    void *d[3] = {o, a, b};
    CHECK(run(TPSH_K_ADD, 3, t, d, 1, 0) == 0 && o[0] == 0x3c00 && o[1] == 0x3c02, "f16 1+2^-11, 1+3*2^-11: %04x %04x",
          o[0], o[1]);
    a[0] = a[1] = tpsh_float_to_bf16(1.0f);
    b[0] = tpsh_float_to_bf16(0x1p-8f);
    b[1] = tpsh_float_to_bf16(3 * 0x1p-8f);
    for (int i = 0; i < 3; i++) t[i].dtype_id = TPSH_BF16;
    CHECK(run(TPSH_K_ADD, 3, t, d, 1, 0) == 0 && o[0] == 0x3f80 && o[1] == 0x3f82, "bf16 ties to even");
  }
  {
    /* the contiguous fast path and the strided path give the same bits */
    enum { N = 1000 };
    float *a = malloc(2 * N * sizeof *a), *b = malloc(N * sizeof *b), *o1 = malloc(N * sizeof *o1),
          *o2 = malloc(2 * N * sizeof *o2);
    for (int i = 0; i < 2 * N; i++) a[i] = (float)(urand() * 2 - 1);
    for (int i = 0; i < N; i++) b[i] = (float)(urand() * 2 - 1);
    tpsh_tensor c = mk(TPSH_F32, 1, (int64_t[]){N}, NULL), s = mk(TPSH_F32, 1, (int64_t[]){N}, (int64_t[]){2});
    int ok = 1;
    for (int op = TPSH_K_ADD; op <= TPSH_K_SCALE; op++) {
      tpsh_tensor t1[3] = {c, c, c}, t2[3] = {s, s, c};
      void *d1[3] = {o1, a, b}, *d2[3] = {o2, a, b};
      /* fast path reads a[0..N); the strided one reads every other element, so copy those first */
      float *ac = malloc(N * sizeof *ac);
      for (int i = 0; i < N; i++) ac[i] = a[2 * i];
      d1[1] = ac;
      ok &= run(op, op == TPSH_K_SCALE ? 2 : 3, t1, d1, 0.3, 0) == 0;
      ok &= run(op, op == TPSH_K_SCALE ? 2 : 3, t2, d2, 0.3, 0) == 0;
      for (int i = 0; i < N; i++) ok &= f_bits(o1[i]) == f_bits(o2[2 * i]);
      free(ac);
    }
    CHECK(ok, "f32 fast path and strided path agree bit for bit");
    free(a); free(b); free(o1); free(o2);
  }
  group_end("add, mul, scale");
}

/* ==== contiguous runs in blocks against the element path ======================================== */
/* Casts, add/mul/scale and sums of contiguous runs go through typed loops in blocks (cpu_kernels.c,
 * "runs of one dtype"); a view with a stride of 2 over the same values takes the element path. The two
 * must store the same bits for every dtype combination: random bit patterns (NaNs with payloads,
 * infinities, subnormals, values past every integer range) over a length that is not a multiple of the
 * block. */
enum { RUNS_N = 1337 };

static void fill_bits(void *buf, size_t bytes) {
  for (size_t i = 0; i < bytes; i++) ((uint8_t *)buf)[i] = (uint8_t)(urand() * 256);
}

/* a buffer of 2n elements holding x[j] at 2j (the strided operand), x itself being the dense one */
static void *spread(const void *x, int dt, int64_t n) {
  int es = esize(dt);
  char *w = calloc((size_t)(2 * n), (size_t)es);
  for (int64_t j = 0; j < n; j++) memcpy(w + 2 * j * es, (const char *)x + j * es, (size_t)es);
  return w;
}

static int same_bits(const void *dense, const void *wide, int dt, int64_t n) {
  int es = esize(dt);
  for (int64_t j = 0; j < n; j++)
    if (memcmp((const char *)dense + j * es, (const char *)wide + 2 * j * es, (size_t)es)) return 0;
  return 1;
}

static void test_block_runs(void) {
  int64_t n = RUNS_N;
  void *src[7], *src2[7], *wsrc[7], *wsrc2[7];
  for (int a = 0; a < 7; a++) {
    int dt = all_dtypes[a];
    src[a] = malloc((size_t)n * esize(dt));
    src2[a] = malloc((size_t)n * esize(dt));
    fill_bits(src[a], (size_t)n * esize(dt));
    fill_bits(src2[a], (size_t)n * esize(dt));
    /* and some ordinary values, which the random bits of a float seldom are */
    for (int64_t j = 0; j < n; j += 3) setd(src[a], dt, j, (double)(j % 19) - 9.25 * isflt(dt));
    wsrc[a] = spread(src[a], dt, n);
    wsrc2[a] = spread(src2[a], dt, n);
  }
  tpsh_tensor dense[7], strided[7];
  for (int a = 0; a < 7; a++) {
    dense[a] = mk(all_dtypes[a], 1, (int64_t[]){n}, NULL);
    strided[a] = mk(all_dtypes[a], 1, (int64_t[]){n}, (int64_t[]){2});
  }
  for (int o = 0; o < 7; o++) {
    void *out = malloc((size_t)n * 8), *wout = calloc((size_t)(2 * n), 8);
    for (int a = 0; a < 7; a++) {
      tpsh_tensor t1[2] = {dense[o], dense[a]}, t2[2] = {strided[o], strided[a]};
      void *d1[2] = {out, src[a]}, *d2[2] = {wout, wsrc[a]};
      int ok = run(TPSH_K_COPY, 2, t1, d1, 0, 0) == 0 && run(TPSH_K_COPY, 2, t2, d2, 0, 0) == 0;
      CHECK(ok && same_bits(out, wout, all_dtypes[o], n), "block cast %s <- %s = element path", dtype_names[o],
            dtype_names[a]);
    }
    /* add (alpha 1 and 0.3), mul, scale (plain and adding a number): same dtypes, and mixed ones */
    for (int a = 0; a < 7; a++) {
      int b = (a + o) % 7 == a ? o : a;          /* mixed: b = a unless that repeats the output's */
      int ok = 1;
      for (int v = 0; v < 5; v++) {
        int op = v < 2 ? TPSH_K_ADD : v == 2 ? TPSH_K_MUL : TPSH_K_SCALE, nt = op == TPSH_K_SCALE ? 2 : 3;
        double s0 = v == 1 ? 0.3 : v == 3 ? 3 : v == 4 ? -1.5 : 1;
        tpsh_kargs k1, k2;
        memset(&k1, 0, sizeof k1);
        k1.op = op;
        k1.nt = nt;
        k1.s[0] = s0;
        k1.s[1] = 2;
        k1.i[0] = v == 4;                        /* SCALE adding 2 */
        k2 = k1;
        k1.t[0] = dense[o]; k1.t[1] = dense[a]; k1.t[2] = dense[b];
        k2.t[0] = strided[o]; k2.t[1] = strided[a]; k2.t[2] = strided[b];
        k1.data[0] = out; k1.data[1] = src[a]; k1.data[2] = src2[b];
        k2.data[0] = wout; k2.data[1] = wsrc[a]; k2.data[2] = wsrc2[b];
        ok &= tpsh_cpu_kernel_run(&k1) == 0 && tpsh_cpu_kernel_run(&k2) == 0 && same_bits(out, wout, all_dtypes[o], n);
      }
      CHECK(ok, "block add/mul/scale %s <- %s, %s = element path", dtype_names[o], dtype_names[a], dtype_names[b]);
    }
    free(out);
    free(wout);
  }
  for (int a = 0; a < 7; a++) {                  /* sums: the pairwise f32/f64 runs aside, in order */
    int dt = all_dtypes[a];
    uint64_t r1 = 0, r2 = 0;
    tpsh_tensor t1[2] = {mk(isflt(dt) ? TPSH_F64 : TPSH_I64, 0, NULL, NULL), dense[a]};
    tpsh_tensor t2[2] = {t1[0], strided[a]};
    void *d1[2] = {&r1, src[a]}, *d2[2] = {&r2, wsrc[a]};
    int ok = run(TPSH_K_SUM, 2, t1, d1, 0, 0) == 0 && run(TPSH_K_SUM, 2, t2, d2, 0, 0) == 0;
    /* random bits hold NaNs: then both sums must be NaN, whatever their payloads (which NaN an addition of
       two keeps is the compiler's operand order: the ASan build's and the plain build's differed) */
    double s1, s2;
    memcpy(&s1, &r1, 8);
    memcpy(&s2, &r2, 8);
    int same = r1 == r2 || (isflt(dt) && s1 != s1 && s2 != s2);
    if (dt != TPSH_F32 && dt != TPSH_F64) CHECK(ok && same, "block sum %s = element path", dtype_names[a]);
    /* finite values only: a NaN anywhere makes both NaN, which says nothing of the order */
    for (int64_t j = 0; j < n; j++) setd(src[a], dt, j, isflt(dt) ? (urand() - 0.5) * 1e4 : (double)irand(200));
    free(wsrc[a]);
    wsrc[a] = spread(src[a], dt, n);
    d1[1] = src[a];
    d2[1] = wsrc[a];
    ok = run(TPSH_K_SUM, 2, t1, d1, 0, 0) == 0 && run(TPSH_K_SUM, 2, t2, d2, 0, 0) == 0;
    if (dt != TPSH_F32 && dt != TPSH_F64) CHECK(ok && r1 == r2, "block sum %s of finite values = element path", dtype_names[a]);
  }
  for (int a = 0; a < 7; a++) {
    free(src[a]);
    free(src2[a]);
    free(wsrc[a]);
    free(wsrc2[a]);
  }
  group_end("block runs = element path");
}

/* ==== matmul =================================================================================== */
enum { L_ROW, L_PAD, L_TRANS, L_STRIDED, L_NLAYOUTS };
static const char *const layout_names[] = {"row", "padded", "trans", "strided"};

static tpsh_tensor mat(int dt, int64_t r, int64_t c, int layout) {
  switch (layout) {
  case L_PAD: return mk2(dt, r, c, c + 3, 1);
  case L_TRANS: return mk2(dt, r, c, 1, r > 0 ? r : 1);
  case L_STRIDED: return mk2(dt, r, c, 2 * c + 1, 2);
  default: return mk2(dt, r, c, c, 1);
  }
}

static int check_matmul(int dt, int64_t m, int64_t kk, int64_t n, int la, int lb, int lc) {
  tpsh_tensor a = mat(dt, m, kk, la), b = mat(dt, kk, n, lb), c = mat(dt, m, n, lc);
  void *ab = alloc_for(&a), *bb = alloc_for(&b), *cb = alloc_for(&c);
  for (int64_t l = 0; l < m * kk; l++)
    setd(ab, dt, off_of(&a, l), isflt(dt) ? urand() * 2 - 1 : (double)irand(dt == TPSH_U8 ? 256 : 2001) - (dt == TPSH_U8 ? 0 : 1000));
  for (int64_t l = 0; l < kk * n; l++)
    setd(bb, dt, off_of(&b, l), isflt(dt) ? urand() * 2 - 1 : (double)irand(dt == TPSH_U8 ? 256 : 2001) - (dt == TPSH_U8 ? 0 : 1000));
  for (int64_t l = 0; l < m * n; l++) setd(cb, dt, off_of(&c, l), 7);   /* garbage BLAS must overwrite */
  tpsh_tensor t[3] = {c, a, b};
  void *d[3] = {cb, ab, bb};
  int ok = run(TPSH_K_MATMUL, 3, t, d, 0, 0) == 0;
  double tol = dt == TPSH_F64 ? 1e-12 : dt == TPSH_F32 ? 1e-5 : dt == TPSH_F16 ? 2e-3 : 1e-2;
  for (int64_t i = 0; i < m && ok; i++)
    for (int64_t j = 0; j < n; j++) {
      double ref = 0, mag = 0;
      uint64_t iref = 0;
      for (int64_t p = 0; p < kk; p++) {
        double x = getd(ab, dt, off_of(&a, i * kk + p)), y = getd(bb, dt, off_of(&b, p * n + j));
        ref += x * y;
        mag += fabs(x * y);
        iref += (uint64_t)geti(ab, dt, off_of(&a, i * kk + p)) * (uint64_t)geti(bb, dt, off_of(&b, p * n + j));
      }
      int64_t o = off_of(&c, i * n + j);
      if (isflt(dt)) ok &= fabs(getd(cb, dt, o) - ref) <= tol * (mag + 1e-30) + 1e-300;
      else if (dt == TPSH_U8) ok &= geti(cb, dt, o) == (int64_t)(uint8_t)iref;
      else if (dt == TPSH_I32) ok &= geti(cb, dt, o) == (int64_t)(int32_t)(uint32_t)iref;
      else ok &= geti(cb, dt, o) == (int64_t)iref;
    }
  free(ab);
  free(bb);
  free(cb);
  return ok;
}

static void test_matmul(void) {
  static const int64_t shapes[][3] = {{3, 4, 5}, {1, 7, 1}, {6, 1, 4}, {17, 33, 9}, {64, 64, 64}};
  int bad = 0, total = 0;
  for (int la = 0; la < L_NLAYOUTS; la++)
    for (int lb = 0; lb < L_NLAYOUTS; lb++)
      for (int lc = 0; lc < L_NLAYOUTS; lc++)
        for (int s = 0; s < 5; s++) {
          int ok = check_matmul(TPSH_F32, shapes[s][0], shapes[s][1], shapes[s][2], la, lb, lc);
          total++;
          if (!ok && bad++ < 5)
            printf("  f32 %lldx%lldx%lld a %s b %s c %s wrong\n", (long long)shapes[s][0], (long long)shapes[s][1],
                   (long long)shapes[s][2], layout_names[la], layout_names[lb], layout_names[lc]);
        }
  CHECK(bad == 0, "f32 matmul: %d of %d layouts/shapes wrong", bad, total);
  for (int di = 1; di < 7; di++) {
    int dt = all_dtypes[di];
    bad = total = 0;
    for (int la = 0; la < L_NLAYOUTS; la++)
      for (int lc = 0; lc < L_NLAYOUTS; lc++)
        for (int s = 0; s < 5; s++) {
          total++;
          bad += !check_matmul(dt, shapes[s][0], shapes[s][1], shapes[s][2], la, (la + lc) % L_NLAYOUTS, lc);
        }
    CHECK(bad == 0, "%s matmul: %d of %d layouts/shapes wrong", dtype_names[di], bad, total);
  }
  /* m, n or k == 0 */
  for (int di = 0; di < 7; di++) {
    int dt = all_dtypes[di];
    CHECK(check_matmul(dt, 0, 3, 4, L_ROW, L_ROW, L_ROW) && check_matmul(dt, 3, 4, 0, L_ROW, L_TRANS, L_ROW),
          "%s matmul with m or n == 0", dtype_names[di]);
    tpsh_tensor c = mk2(dt, 3, 2, 2, 1), a = mk2(dt, 3, 0, 1, 1), b = mk2(dt, 0, 2, 2, 1);
    void *cb = alloc_for(&c);
    for (int i = 0; i < 6; i++) setd(cb, dt, i, 7);
    tpsh_tensor t[3] = {c, a, b};
    void *d[3] = {cb, NULL, NULL};
    int ok = run(TPSH_K_MATMUL, 3, t, d, 0, 0) == 0;
    for (int i = 0; i < 6; i++) ok &= getd(cb, dt, i) == 0;
    CHECK(ok, "%s matmul with k == 0 gives zeros", dtype_names[di]);
    free(cb);
  }
  group_end("matmul");
}

/* ==== sum ====================================================================================== */
static double sum_of(int dt, int64_t n, const int64_t *stride, double (*value)(int64_t), int *rc) {
  tpsh_tensor src = mk(dt, 1, &n, stride), out = mk(dt, 0, NULL, NULL);
  void *sb = alloc_for(&src);
  uint64_t ob = 0;
  for (int64_t l = 0; l < n; l++) setd(sb, dt, off_of(&src, l), value(l));
  tpsh_tensor t[2] = {out, src};
  void *d[2] = {&ob, sb};
  *rc = run(TPSH_K_SUM, 2, t, d, 0, 0);
  free(sb);
  return getd(&ob, dt, 0);
}

static double v_index(int64_t l) { return (double)(l + 1); }
static double v_tenth(int64_t l) { (void)l; return 0.1; }
static double v_small(int64_t l) { return (double)(l % 4); }

static void test_sum(void) {
  int rc;
  double s = sum_of(TPSH_F32, 1000, NULL, v_index, &rc);
  CHECK(rc == 0 && s == 500500, "f32 sum 1..1000 = %.17g", s);
  s = sum_of(TPSH_F32, 1000, (int64_t[]){3}, v_index, &rc);
  CHECK(rc == 0 && s == 500500, "strided f32 sum = %.17g", s);
  s = sum_of(TPSH_F64, 100000, NULL, v_tenth, &rc);
  CHECK(rc == 0 && fabs(s - 10000) < 1e-9, "f64 sum of 100000 x 0.1 = %.17g", s);
  s = sum_of(TPSH_F64, 100000, (int64_t[]){2}, v_tenth, &rc);
  CHECK(rc == 0 && fabs(s - 10000) < 1e-9, "strided f64 sum (compensated) = %.17g", s);
  for (int di = 0; di < 7; di++) {
    s = sum_of(all_dtypes[di], 50, (int64_t[]){2}, v_small, &rc);
    CHECK(rc == 0 && s == 73, "%s strided sum %g", dtype_names[di], s);
    s = sum_of(all_dtypes[di], 0, NULL, v_small, &rc);
    CHECK(rc == 0 && s == 0, "%s zero-size sum", dtype_names[di]);
  }
  {
    uint8_t a[2] = {200, 100}, o = 0;
    tpsh_tensor t[2] = {mk(TPSH_U8, 1, (int64_t[]){1}, NULL), mk(TPSH_U8, 1, (int64_t[]){2}, NULL)};
    void *d[2] = {&o, a};
    CHECK(run(TPSH_K_SUM, 2, t, d, 0, 0) == 0 && o == 44, "u8 sum wraps: %d", o);
    int64_t b[3] = {(1LL << 60) + 1, 1LL << 60, 1}, ob = 0;
    t[0].dtype_id = t[1].dtype_id = TPSH_I64;
    t[1].sizes[0] = 3;
    d[0] = &ob;
    d[1] = b;
    CHECK(run(TPSH_K_SUM, 2, t, d, 0, 0) == 0 && ob == (1LL << 61) + 2, "i64 sum exact beyond 2^53");
    float f[3] = {1, INFINITY, 2}, of = 0;
    t[0].dtype_id = t[1].dtype_id = TPSH_F32;
    d[0] = &of;
    d[1] = f;
    CHECK(run(TPSH_K_SUM, 2, t, d, 0, 0) == 0 && isinf(of), "inf sum");
    f[2] = -INFINITY;
    CHECK(run(TPSH_K_SUM, 2, t, d, 0, 0) == 0 && isnan(of), "inf + -inf is NaN");
    t[1] = mk(TPSH_F32, 0, NULL, NULL);
    CHECK(run(TPSH_K_SUM, 2, t, d, 0, 0) == 0 && of == 1, "0-dim sum");
    t[0] = mk(TPSH_F32, 1, (int64_t[]){2}, NULL);
    CHECK(run(TPSH_K_SUM, 2, t, d, 0, 0) == TPSH_EINVAL, "sum into 2 elements is refused");
  }
  group_end("sum");
}

/* ==== arange, random =========================================================================== */
static void test_arange(void) {
  for (int di = 0; di < 7; di++) {
    int dt = all_dtypes[di];
    tpsh_tensor t = mk(dt, 1, (int64_t[]){20}, NULL);
    void *b = alloc_for(&t);
    int ok = run(TPSH_K_ARANGE, 1, &t, &b, 3, 2) == 0;
    for (int64_t j = 0; j < 20; j++) ok &= getd(b, dt, j) == 3 + 2 * (double)j;
    CHECK(ok, "%s arange 3, 5, ...", dtype_names[di]);
    free(b);
  }
  float f[4];
  void *pf = f;
  tpsh_tensor t = mk(TPSH_F32, 2, (int64_t[]){2, 2}, NULL);
  CHECK(run(TPSH_K_ARANGE, 1, &t, &pf, 1.5, 0.25) == 0 && f[0] == 1.5f && f[3] == 2.25f, "f32 arange 1.5 by 0.25");
  int64_t l[3];
  void *pl = l;
  t = mk(TPSH_I64, 1, (int64_t[]){3}, NULL);
  CHECK(run(TPSH_K_ARANGE, 1, &t, &pl, 0x1p60, 3) == 0 && l[2] == (1LL << 60) + 6, "i64 arange exact");
  uint8_t u[8];
  void *pu = u;
  t = mk(TPSH_U8, 1, (int64_t[]){8}, NULL);
  CHECK(run(TPSH_K_ARANGE, 1, &t, &pu, 250, 1) == 0 && u[5] == 255 && u[6] == 0, "u8 arange wraps");
  int32_t i[3];
  void *pi = i;
  t = mk(TPSH_I32, 1, (int64_t[]){3}, NULL);
  CHECK(run(TPSH_K_ARANGE, 1, &t, &pi, -0.5, 0.75) == 0 && i[0] == 0 && i[1] == 0 && i[2] == 1,
        "i32 arange -0.5 by 0.75 truncates: %d %d %d", i[0], i[1], i[2]);
  t = mk(TPSH_F32, 1, (int64_t[]){0}, NULL);
  void *nul = NULL;
  CHECK(run(TPSH_K_ARANGE, 1, &t, &nul, 0, 1) == 0, "zero-size arange");
  group_end("arange");
}

static int run_random(tpsh_tensor *t, void *data, int normal, uint64_t seed, uint64_t counter) {
  tpsh_kargs k;
  memset(&k, 0, sizeof k);
  k.op = TPSH_K_RANDOM;
  k.nt = 1;
  k.t[0] = *t;
  k.data[0] = data;
  k.i[0] = normal;
  k.i[1] = (int64_t)seed;
  k.i[2] = (int64_t)counter;
  return tpsh_cpu_kernel_run(&k);
}

static void test_random(void) {
  enum { N = 20000 };
  const uint64_t seed = 42, ctr = 1000;
  for (int di = 0; di < 7; di++) {
    int dt = all_dtypes[di];
    tpsh_tensor t = mk(dt, 2, (int64_t[]){100, N / 100}, NULL);
    void *b = alloc_for(&t);
    int ok = run_random(&t, b, 0, seed, ctr) == 0;
    double mean = 0;
    for (int64_t j = 0; j < N; j++) {
      double v = getd(b, dt, j), u = tpsh_rand_uniform(seed, ctr + (uint64_t)j);
      mean += v / N;
      if (dt == TPSH_F64) ok &= v == u;
      else if (dt == TPSH_F32) ok &= v == (double)(float)u && v < 1;
      else if (isflt(dt)) ok &= fabs(v - u) <= 1.0 / 128 && v < 1;
      else ok &= geti(b, dt, j) == (int64_t)((tpsh_rand_mix(seed, ctr + (uint64_t)j) >> 33) & (dt == TPSH_U8 ? 0xff : 0x7fffffff));
    }
    double expect = dt == TPSH_U8 ? 127.5 : isflt(dt) ? 0.5 : 0x1p30;
    CHECK(ok && fabs(mean / expect - 1) < 0.03, "%s uniform (mean %g)", dtype_names[di], mean);
    free(b);
  }
  {
    tpsh_tensor t = mk(TPSH_F64, 1, (int64_t[]){N}, NULL);
    double *b = malloc(N * sizeof *b);
    int ok = run_random(&t, b, 1, seed, ctr) == 0;
    double mean = 0, var = 0;
    for (int j = 0; j < N; j++) {
      ok &= b[j] == tpsh_rand_normal(seed, ctr + (uint64_t)j);
      mean += b[j] / N;
      var += b[j] * b[j] / N;
    }
    CHECK(ok && fabs(mean) < 0.05 && fabs(var - 1) < 0.05, "f64 normal (mean %g, var %g)", mean, var);
    t.dtype_id = TPSH_BF16;
    uint16_t h[4];
    t.sizes[0] = 4;
    ok = run_random(&t, h, 1, seed, ctr) == 0;
    for (int j = 0; j < 4; j++) ok &= h[j] == tpsh_float_to_bf16((float)tpsh_rand_normal(seed, ctr + (uint64_t)j));
    CHECK(ok, "bf16 normal");
    free(b);
  }
  {
    /* a uniform that rounds up to 1.0 in f16 is stored as the largest half below 1 */
    uint64_t c = 0;
    while (tpsh_rand_uniform(7, c) < 1.0 - 0x1p-12 && c < 10000000) c++;
    uint16_t h;
    tpsh_tensor t = mk(TPSH_F16, 0, NULL, NULL);
    CHECK(run_random(&t, &h, 0, 7, c) == 0 && h == 0x3bff, "f16 uniform stays below 1 (counter %llu: %04x)",
          (unsigned long long)c, h);
  }
  group_end("random");
}

/* ==== spin, compare ============================================================================ */
static double clock_ms(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void test_spin(void) {
  tpsh_kargs k;
  memset(&k, 0, sizeof k);
  k.op = TPSH_K_SPIN;
  k.s[0] = 30;
  double w0 = clock_ms(CLOCK_MONOTONIC), c0 = clock_ms(CLOCK_THREAD_CPUTIME_ID);
  int rc = tpsh_cpu_kernel_run(&k);
  double wall = clock_ms(CLOCK_MONOTONIC) - w0, cpu = clock_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
  CHECK(rc == 0 && wall >= 30 && wall < 1000, "spin 30 ms took %.1f ms", wall);
  /* A busy loop, not a sleep: a sleep uses well under a millisecond of CPU. The bound leaves room for a
   * loaded machine, where the thread gets a share of a core (a quarter at a load of 7 on 2 cores). */
  CHECK(cpu >= 3, "spin keeps the thread busy (%.1f ms of CPU in %.1f ms)", cpu, wall);
  k.s[0] = 0;
  w0 = clock_ms(CLOCK_MONOTONIC);
  rc = tpsh_cpu_kernel_run(&k);
  double zero = clock_ms(CLOCK_MONOTONIC) - w0;
  CHECK(rc == 0 && zero < 25, "spin 0 returns at once (%.1f ms)", zero);   /* far below 30: no default */
  group_end("spin");
}

static int compare(int dta, const double *a, int dtb, const double *b, int64_t n, int64_t stride, double rtol,
                   double atol, double res[2]) {
  tpsh_tensor ta = mk(dta, 1, &n, (int64_t[]){stride}), tb = mk(dtb, 1, &n, NULL), tr = mk(TPSH_F64, 1, (int64_t[]){2}, NULL);
  void *ab = alloc_for(&ta), *bb = alloc_for(&tb);
  for (int64_t i = 0; i < n; i++) {
    setd(ab, dta, off_of(&ta, i), a[i]);
    setd(bb, dtb, i, b[i]);
  }
  tpsh_tensor t[3] = {tr, ta, tb};
  void *d[3] = {res, ab, bb};
  int rc = run(TPSH_K_COMPARE, 3, t, d, rtol, atol);
  free(ab);
  free(bb);
  return rc;
}

static void test_compare(void) {
  double r[2];
  const double a[] = {1, 2, 3, 4}, b[] = {1, 2, 3.001, 4};
  CHECK(compare(TPSH_F64, a, TPSH_F64, a, 4, 1, 0, 0, r) == 0 && r[0] == 0 && r[1] == 0, "equal");
  CHECK(compare(TPSH_F64, b, TPSH_F64, a, 4, 1, 0, 1e-2, r) == 0 && r[0] == 0 && fabs(r[1] - 1e-3) < 1e-12, "within atol");
  CHECK(compare(TPSH_F64, b, TPSH_F64, a, 4, 1, 0, 1e-4, r) == 0 && r[0] == 1, "outside atol");
  CHECK(compare(TPSH_F64, b, TPSH_F64, a, 4, 1, 1e-3, 0, r) == 0 && r[0] == 0, "within rtol * |b|");
  CHECK(compare(TPSH_F32, b, TPSH_F32, a, 4, 3, 0, 1e-4, r) == 0 && r[0] == 1 && fabs(r[1] - 1e-3) < 1e-6,
        "strided f32 %g %g", r[0], r[1]);
  const double inf_a[] = {INFINITY, -INFINITY, INFINITY, 1, 5}, inf_b[] = {INFINITY, -INFINITY, -INFINITY, INFINITY, 5};
  CHECK(compare(TPSH_F32, inf_a, TPSH_F64, inf_b, 2, 1, 0, 0, r) == 0 && r[0] == 0 && r[1] == 0, "equal infinities");
  CHECK(compare(TPSH_F64, inf_a, TPSH_F64, inf_b, 5, 1, 1, 1, r) == 0 && r[0] == 2 && isinf(r[1]),
        "unequal infinities violate: %g %g", r[0], r[1]);
  const double nan_a[] = {1, NAN, 3}, nan_b[] = {1, 2, NAN};
  CHECK(compare(TPSH_F16, nan_a, TPSH_BF16, nan_b, 3, 2, 1, 1, r) == 0 && r[0] == 2 && isnan(r[1]), "NaN violates");
  CHECK(compare(TPSH_I32, a, TPSH_F32, b, 4, 1, 0, 1e-4, r) == 0 && r[0] == 1, "i32 against f32");
  CHECK(compare(TPSH_U8, a, TPSH_I64, a, 0, 1, 0, 0, r) == 0 && r[0] == 0 && r[1] == 0, "zero-size");
  group_end("compare");
}

/* ==== errors =================================================================================== */
static void test_errors(void) {
  tpsh_kargs k;
  memset(&k, 0, sizeof k);
  k.op = 99;
  CHECK(tpsh_cpu_kernel_run(&k) == TPSH_EINVAL && tpsh_last_error()[0], "unknown op");
  float f = 0;
  tpsh_tensor t = mk(TPSH_F32, 0, NULL, NULL);
  void *pf = &f;
  t.dtype_id = 17;
  CHECK(run(TPSH_K_FILL, 1, &t, &pf, 1, 0) == TPSH_EINVAL && strstr(tpsh_last_error(), "dtype"), "bad dtype: %s",
        tpsh_last_error());
  t.dtype_id = TPSH_F32;
  t.ndim = 9;
  CHECK(run(TPSH_K_FILL, 1, &t, &pf, 1, 0) == TPSH_EINVAL, "9 dims");
  CHECK(run(TPSH_K_ADD, 1, &t, &pf, 1, 0) == TPSH_EINVAL, "too few tensors");
  t.ndim = 0;
  void *nul = NULL;
  CHECK(run(TPSH_K_FILL, 1, &t, &nul, 1, 0) == TPSH_EINVAL, "no data");
  tpsh_tensor ts[3] = {mk(TPSH_I32, 1, (int64_t[]){2}, NULL), t, t};
  void *d[3] = {&f, &f, &f};
  CHECK(run(TPSH_K_COMPARE, 3, ts, d, 0, 0) == TPSH_EINVAL, "compare into a non-f64 result");
  group_end("errors");
}

int main(void) {
  test_half();
  test_bf16();
  test_from_double();
  test_fill();
  test_copy();
  test_binary();
  test_block_runs();
  test_matmul();
  test_sum();
  test_arange();
  test_random();
  test_spin();
  test_compare();
  test_errors();
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
