/*
 * bench_kernels_ref.c: the C references of scripts/bench/bench_kernels.lua, loaded into tpsh through the FFI
 * (built as libtpsh_kernels_ref.so, -O2) and timed in the same process as the tpsh ops they stand for.
 *
 * Each function is the plain loop a C programmer would write over the same bytes: memcpy, the obvious
 * conversion loop for casts (f16/bf16 through tpsh's own inline conversions, core/dtype_convert.h, the
 * same rounding), a plain or a Neumaier sum (the order tpsh keeps for f16/bf16). They are references
 * of speed, not of results.
 */
#include "core/dtype_convert.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

void ref_memcpy(void *dst, const void *src, int64_t bytes) { memcpy(dst, src, (size_t)bytes); }

void ref_f32_to_f64(double *o, const float *a, int64_t n) { for (int64_t j = 0; j < n; j++) o[j] = a[j]; }
void ref_f32_to_i32(int32_t *o, const float *a, int64_t n) { for (int64_t j = 0; j < n; j++) o[j] = (int32_t)a[j]; }
void ref_i32_to_f32(float *o, const int32_t *a, int64_t n) { for (int64_t j = 0; j < n; j++) o[j] = (float)a[j]; }

/* f16/bf16 <-> f32 by bits, with tpsh's own conversions (round to nearest even, NaN kept) in a plain loop */
void ref_f32_to_bf16(uint16_t *o, const float *a, int64_t n) { for (int64_t j = 0; j < n; j++) o[j] = tpsh_float_to_bf16_inl(a[j]); }
void ref_bf16_to_f32(float *o, const uint16_t *a, int64_t n) { for (int64_t j = 0; j < n; j++) o[j] = tpsh_bf16_to_float_inl(a[j]); }
void ref_f32_to_f16(uint16_t *o, const float *a, int64_t n) { for (int64_t j = 0; j < n; j++) o[j] = tpsh_float_to_half_inl(a[j]); }
void ref_f16_to_f32(float *o, const uint16_t *a, int64_t n) { for (int64_t j = 0; j < n; j++) o[j] = tpsh_half_to_float_inl(a[j]); }

double ref_sum_f32(const float *a, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) { s0 += a[j]; s1 += a[j + 1]; s2 += a[j + 2]; s3 += a[j + 3]; }
  for (; j < n; j++) s0 += a[j];
  return (s0 + s1) + (s2 + s3);
}

/* the order tpsh's sum keeps for f16/bf16 (cpu_kernels.c): Neumaier's compensated sum, element by element */
static double neumaier(double sum, double comp) { return isfinite(sum) ? sum + comp : sum; }
#define NEUMAIER_STEP(x)                                                      \
  do {                                                                        \
    double v = (x), t = sum + v;                                              \
    comp += fabs(sum) >= fabs(v) ? (sum - t) + v : (v - t) + sum;             \
    sum = t;                                                                  \
  } while (0)
double ref_sum_neumaier_bf16(const uint16_t *a, int64_t n) {
  double sum = 0, comp = 0;
  for (int64_t j = 0; j < n; j++) NEUMAIER_STEP(tpsh_bf16_to_float_inl(a[j]));
  return neumaier(sum, comp);
}
double ref_sum_neumaier_f16(const uint16_t *a, int64_t n) {
  double sum = 0, comp = 0;
  for (int64_t j = 0; j < n; j++) NEUMAIER_STEP(tpsh_half_to_float_inl(a[j]));
  return neumaier(sum, comp);
}

int64_t ref_sum_i32(const int32_t *a, int64_t n) {
  int64_t s = 0;
  for (int64_t j = 0; j < n; j++) s += a[j];
  return s;
}

void ref_add_f32(float *o, const float *a, const float *b, int64_t n) { for (int64_t j = 0; j < n; j++) o[j] = a[j] + b[j]; }
void ref_add_i32(int32_t *o, const int32_t *a, const int32_t *b, int64_t n) {
  for (int64_t j = 0; j < n; j++) o[j] = (int32_t)((uint32_t)a[j] + (uint32_t)b[j]);
}
/* f32 arithmetic rounded once to bf16/f16: exact for a sum of two (f32 has 2p + 2 bits of either) */
void ref_add_bf16(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n) {
  for (int64_t j = 0; j < n; j++) o[j] = tpsh_float_to_bf16_inl(tpsh_bf16_to_float_inl(a[j]) + tpsh_bf16_to_float_inl(b[j]));
}
void ref_add_f16(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n) {
  for (int64_t j = 0; j < n; j++) o[j] = tpsh_float_to_half_inl(tpsh_half_to_float_inl(a[j]) + tpsh_half_to_float_inl(b[j]));
}

/* ==== element-wise ops (scripts/bench/bench_pointwise.lua) =============================================== */
/* The formulas of core/pointwise.h in the loop a C programmer writes, one loop per op, f32 in memory or
 * bf16 through f32. With the vectoriser's flags of cpu_pointwise.c (CMakeLists.txt says why), so that
 * the two loops are compiled alike. */
#include "core/pointwise.h"
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")

#define REF_UNARY(id, ...) case id: for (int64_t j = 0; j < n; j++) o[j] = tpsh_unary_f32(id, a[j], p); break;
#define REF_BINARY(id, ...) case id: for (int64_t j = 0; j < n; j++) o[j] = tpsh_binary_f32(id, a[j], b[j]); break;
void ref_unary_f32(int op, float *o, const float *a, int64_t n, float p) {
  switch (op) { TPSH_UNARY_OPS(REF_UNARY) }
}
void ref_binary_f32(int op, float *o, const float *a, const float *b, int64_t n) {
  switch (op) { TPSH_BINARY_OPS(REF_BINARY) }
}
#undef REF_UNARY
#undef REF_BINARY

#define REF_UNARY(id, ...)                                                                               \
  case id:                                                                                               \
    for (int64_t j = 0; j < n; j++) o[j] = tpsh_float_to_bf16_inl(tpsh_unary_f32(id, tpsh_bf16_to_float_inl(a[j]), p)); \
    break;
#define REF_BINARY(id, ...)                                                                              \
  case id:                                                                                               \
    for (int64_t j = 0; j < n; j++)                                                                      \
      o[j] = tpsh_float_to_bf16_inl(tpsh_binary_f32(id, tpsh_bf16_to_float_inl(a[j]), tpsh_bf16_to_float_inl(b[j]))); \
    break;
void ref_unary_bf16(int op, uint16_t *o, const uint16_t *a, int64_t n, float p) {
  switch (op) { TPSH_UNARY_OPS(REF_UNARY) }
}
void ref_binary_bf16(int op, uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n) {
  switch (op) { TPSH_BINARY_OPS(REF_BINARY) }
}
#undef REF_UNARY
#undef REF_BINARY

/* a matrix of rows x cols plus a row of cols (the bias of a layer) */
void ref_add_row_f32(float *o, const float *a, const float *row, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) o[i * cols + j] = a[i * cols + j] + row[j];
}
