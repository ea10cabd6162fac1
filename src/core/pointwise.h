/*
 * pointwise.h: the element-wise ops of TPSH_K_UNARY and TPSH_K_BINARY, one row each: the op's id, its
 * name, whether integer dtypes take it, and its scalar formula, which the CPU kernels (cpu_pointwise.c)
 * and the CUDA kernels (cuda_pointwise.cu) both compute by calling the functions below. A new op is a
 * row here: the core's checks, both backends' kernels and their dispatch are made from the table.
 *
 * Floats compute in f32 for f32, f16 and bf16 (loaded exactly, rounded once when stored), in f64 for
 * f64: PyTorch's "opmath" types, and the formulas are PyTorch's (ActivationGeluKernel.cu and the like),
 * so that results match it to the last bits where the math library does. Integer dtypes compute in
 * int64 with wrap-around (unsigned arithmetic), then wrap to their width when stored, as add and mul do.
 * Formulas are expressions of x and p (unary: p is the op's number, the exponent of pow, the divisor of
 * a division by a number, a factor, a number added) or a and b (binary) of type PW_T, math functions
 * named PW_M(exp), constants cast to PW_T; integer formulas of v, or va and vb, of type int64_t.
 * pointwise_formulas.h turns them into tpsh_unary_f32/_f64 and tpsh_binary_f32/_f64 (switches on the
 * op, folded away where the op is a constant); tpsh_unary_i64 and tpsh_binary_i64 are below.
 */
#ifndef TPSH_POINTWISE_H
#define TPSH_POINTWISE_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define TPSH_PW_FN static __host__ __device__ __forceinline__
#else
#define TPSH_PW_FN static inline __attribute__((always_inline))
#endif

/* ==== unary ops: t[0] = f(t[1], p) ================================================================ */
/* id, name, ints (1: integer dtypes take it), float formula, integer formula (unused where ints is 0) */
#define TPSH_UNARY_OPS(X)                                                                                    \
  X(TPSH_U_RELU, "relu", 1, x <= (PW_T)0 ? (PW_T)0 : x, v < 0 ? 0 : v)                                         \
  X(TPSH_U_GELU, "gelu", 0, x * (PW_T)0.5 * ((PW_T)1 + PW_M(erf)(x * (PW_T)0.70710678118654752440)), v)        \
  X(TPSH_U_GELU_TANH, "gelu_tanh", 0,                                                                        \
    (PW_T)0.5 * x * ((PW_T)1 + PW_M(tanh)((PW_T)0.79788456080286535588 * (x + (PW_T)0.044715 * (x * x * x)))), \
    v)                                                                                                       \
  X(TPSH_U_SILU, "silu", 0, x / ((PW_T)1 + PW_M(exp)(-x)), v)                                                 \
  X(TPSH_U_SIGMOID, "sigmoid", 0, (PW_T)1 / ((PW_T)1 + PW_M(exp)(-x)), v)                                     \
  X(TPSH_U_TANH, "tanh", 0, PW_M(tanh)(x), v)                                                                 \
  X(TPSH_U_EXP, "exp", 0, PW_M(exp)(x), v)                                                                    \
  X(TPSH_U_LOG, "log", 0, PW_M(log)(x), v)                                                                    \
  X(TPSH_U_SQRT, "sqrt", 0, PW_M(sqrt)(x), v)                                                                 \
  X(TPSH_U_RSQRT, "rsqrt", 0, PW_NAME(tpsh_pw_rsqrt)(x), v)                                                   \
  X(TPSH_U_ABS, "abs", 1, PW_M(fabs)(x), v < 0 ? (int64_t)(0 - (uint64_t)v) : v)                              \
  X(TPSH_U_NEG, "neg", 1, -x, (int64_t)(0 - (uint64_t)v))                                                     \
  X(TPSH_U_POW, "pow", 0, PW_NAME(tpsh_pw_pow)(x, p), v)                                                      \
  X(TPSH_U_DIV_BY, "div", 0, x / p, v)              /* t / number */                                         \
  X(TPSH_U_DIV_INTO, "rdiv", 0, p / x, v)           /* number / t */                                         \
  X(TPSH_U_MUL_BY, "mul", 0, x * p, v)              /* t * number (tpsh_scale) */                            \
  X(TPSH_U_ADD_NUM, "add", 0, x + p, v)             /* t + number (tpsh_scale_add, factor 1) */              \
  X(TPSH_U_SUB_FROM, "rsub", 0, p - x, v)           /* number - t (tpsh_scale_add, factor -1) */

/* ==== binary ops: t[0] = f(t[1], t[2]), the operands broadcast to t[0]'s shape by the core ========= */
/* maximum and minimum: a NaN of either operand is the result (a's first), then std::max(a, b) /
 * std::min(a, b), as PyTorch's, which also decides which zero of -0 and +0 comes out. gelu_backward:
 * a is the incoming gradient, b the forward input. add, sub, mul: the CUDA backend's TPSH_K_ADD (alpha
 * 1 or -1) and TPSH_K_MUL (cuda_kernels.cu says why); tp.add and the rest reach them through those.
 * A tensor and a number (x * 2.5, x + 3, 3 - x) are the unary rows mul, add and rsub on both backends:
 * ops.c's scale_op picks them for float dtypes; integers, and a factor other than 1 or -1 with a number
 * added, stay on TPSH_K_SCALE (int64 wrap-around, or one rounding of the double x * s + t). */
#define TPSH_BINARY_OPS(X)                                                                                   \
  X(TPSH_B_DIV, "div", 0, a / b, va)                                                                        \
  X(TPSH_B_ADD, "add", 1, a + b, (int64_t)((uint64_t)va + (uint64_t)vb))                                    \
  X(TPSH_B_SUB, "sub", 1, a - b, (int64_t)((uint64_t)va - (uint64_t)vb))                                    \
  X(TPSH_B_MUL, "mul", 1, a * b, (int64_t)((uint64_t)va * (uint64_t)vb))                                    \
  X(TPSH_B_MAXIMUM, "maximum", 1, a != a ? a : b != b ? b : a < b ? b : a, va < vb ? vb : va)                 \
  X(TPSH_B_MINIMUM, "minimum", 1, a != a ? a : b != b ? b : b < a ? b : a, vb < va ? vb : va)                 \
  X(TPSH_B_GELU_BACKWARD, "gelu_backward", 0, a * PW_NAME(tpsh_pw_gelu_grad)(b), va)                         \
  X(TPSH_B_GELU_TANH_BACKWARD, "gelu_tanh_backward", 0, a * PW_NAME(tpsh_pw_gelu_tanh_grad)(b), va)

#define TPSH_PW_ENUM(id, ...) id,
enum tpsh_unary_ops { TPSH_UNARY_OPS(TPSH_PW_ENUM) TPSH_U_COUNT };
enum tpsh_binary_ops { TPSH_BINARY_OPS(TPSH_PW_ENUM) TPSH_B_COUNT };
#undef TPSH_PW_ENUM

/* ==== the formulas in f32 and f64 =================================================================== */
#define PW_T float
#define PW_M(fn) fn##f
#define PW_NAME(fn) fn##_f32
#include "core/pointwise_formulas.h"
#undef PW_T
#undef PW_M
#undef PW_NAME
#define PW_T double
#define PW_M(fn) fn
#define PW_NAME(fn) fn##_f64
#include "core/pointwise_formulas.h"
#undef PW_T
#undef PW_M
#undef PW_NAME

/* ==== integers ======================================================================================== */
#define TPSH_PW_INT_CASE(id, name, ints, f, i) case id: return (i);
TPSH_PW_FN int64_t tpsh_unary_i64(int op, int64_t v) {
  switch (op) { TPSH_UNARY_OPS(TPSH_PW_INT_CASE) }
  return v;
}
TPSH_PW_FN int64_t tpsh_binary_i64(int op, int64_t va, int64_t vb) {
  (void)vb;
  switch (op) { TPSH_BINARY_OPS(TPSH_PW_INT_CASE) }
  return va;
}
#undef TPSH_PW_INT_CASE

/* Whether integer dtypes take the op (its row's ints). */
#define TPSH_PW_INTS_CASE(id, name, ints, f, i) case id: return ints;
TPSH_PW_FN int tpsh_unary_takes_ints(int op) {
  switch (op) { TPSH_UNARY_OPS(TPSH_PW_INTS_CASE) }
  return 0;
}
TPSH_PW_FN int tpsh_binary_takes_ints(int op) {
  switch (op) { TPSH_BINARY_OPS(TPSH_PW_INTS_CASE) }
  return 0;
}
#undef TPSH_PW_INTS_CASE

#endif /* TPSH_POINTWISE_H */
