/*
 * dtype_convert.h: f16 and bf16 to and from f32, bit-exact and independent of the host's F16C/AVX512
 * support, so that the CPU backend stores the same bits as a GPU's __float2half_rn / __float2bfloat16_rn.
 *
 * Both narrowings round to nearest, ties to even, keep the sign of zeros and infinities, and turn every
 * NaN into a quiet NaN of the same sign (a signalling NaN whose payload sits in the low bits must not
 * truncate to an infinity). The half path follows Fabian Giesen's float_to_half_fast3_rtne: the
 * subnormal range lets the FPU do the rounding by adding a magic constant, so it relies on the default
 * rounding mode and on subnormals not being flushed (no -ffast-math for a file that includes this one).
 *
 * The bodies are static inline here so that the CPU kernels' per-element loops inline them (a call into
 * another translation unit per element would be most of the time of an f16/bf16 cast, sum or add;
 * docs/perf.md, "CPU: kernels against plain C"); dtype_convert.c gives the rest of the core the
 * out-of-line tpsh_* names.
 */
#ifndef TPSH_DTYPE_CONVERT_H
#define TPSH_DTYPE_CONVERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t tpsh_float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float tpsh_bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ==== IEEE binary16 ============================================================================ */
static inline float tpsh_half_to_float_inl(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return tpsh_bits_float(sign | 0x7f800000u | (man << 13));     /* inf, NaN with payload */
  if (exp != 0) return tpsh_bits_float(sign | ((exp + 112u) << 23) | (man << 13)); /* rebias 15 -> 127 */
  /* zero or subnormal: man * 2^-24 is exact in f32 */
  return tpsh_bits_float(sign | tpsh_float_bits((float)man * 0x1p-24f));
}

static inline uint16_t tpsh_float_to_half_inl(float f) {
  uint32_t x = tpsh_float_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x47800000u) {                         /* |f| >= 2^16, inf or NaN: nothing rounds back */
    if (x > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((x >> 13) & 0x3ffu);
    return sign | 0x7c00u;
  }
  if (x < 0x38800000u) {                          /* below 2^-14: a half subnormal or zero */
    /* Adding 0.5 puts the half's 10 subnormal bits at the bottom of the f32 mantissa; the FPU adder
       rounds them to nearest even, and subtracting 0.5's bits leaves exactly the half's bits. */
    float r = tpsh_bits_float(x) + 0.5f;
    return sign | (uint16_t)(tpsh_float_bits(r) - 0x3f000000u);
  }
  uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000000u + 0xfffu + odd;                /* rebias 127 -> 15; a carry may reach inf: correct */
  return sign | (uint16_t)(x >> 13);
}

/* ==== bfloat16: the top half of an f32 ========================================================= */
static inline float tpsh_bf16_to_float_inl(uint16_t h) { return tpsh_bits_float((uint32_t)h << 16); }

static inline uint16_t tpsh_float_to_bf16_inl(float f) {
  uint32_t x = tpsh_float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);  /* quiet, sign kept */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* ==== from double: one rounding ==================================================================== */
/* double -> f32 -> f16/bf16 rounds twice, and the first rounding can make a tie of what was not one
 * (1 + 2^-11 + 2^-40 becomes 1 + 2^-11, which ties down to 1 in f16). Rounding to f32
 * toward zero with the lowest bit set when inexact (round to odd) keeps what the second rounding needs:
 * f32's 24 bits are at least the target's 11 (f16) or 8 (bf16) plus 2, so round to nearest even from
 * there gives the double's own nearest (Boldo and Melquiond's round-to-odd theorem). */
static inline float tpsh_f64_to_f32_odd(double v) {
  float f = (float)v;
  if ((double)f == v || v != v) return f;
  /* toward zero (an overflow to inf: FLT_MAX): f is not 0 here, so that is its magnitude's bits less one,
     as nextafterf(f, 0) gives, without a call into libm per element */
  if (fabs((double)f) > fabs(v)) f = tpsh_bits_float(tpsh_float_bits(f) - 1u);
  return tpsh_bits_float(tpsh_float_bits(f) | 1u);
}
static inline uint16_t tpsh_double_to_half_inl(double v) { return tpsh_float_to_half_inl(tpsh_f64_to_f32_odd(v)); }
static inline uint16_t tpsh_double_to_bf16_inl(double v) { return tpsh_float_to_bf16_inl(tpsh_f64_to_f32_odd(v)); }

/* ==== the same, out of line (dtype_convert.c) ================================================== */
float tpsh_half_to_float(uint16_t h);
uint16_t tpsh_float_to_half(float f);          /* round to nearest even */
float tpsh_bf16_to_float(uint16_t h);
uint16_t tpsh_float_to_bf16(float f);          /* round to nearest even, NaN kept */
uint16_t tpsh_double_to_half(double v);        /* round to nearest even, once (not through f32) */
uint16_t tpsh_double_to_bf16(double v);

#endif /* TPSH_DTYPE_CONVERT_H */
