/*
 * dtype_convert.c: the out-of-line f16/bf16 conversions of internal.h; the bodies, and why they are
 * bit-exact, are in dtype_convert.h (inline there for the CPU kernels' loops).
 */
#include "core/dtype_convert.h"

float tpsh_half_to_float(uint16_t h) { return tpsh_half_to_float_inl(h); }
uint16_t tpsh_float_to_half(float f) { return tpsh_float_to_half_inl(f); }
float tpsh_bf16_to_float(uint16_t h) { return tpsh_bf16_to_float_inl(h); }
uint16_t tpsh_float_to_bf16(float f) { return tpsh_float_to_bf16_inl(f); }
uint16_t tpsh_double_to_half(double v) { return tpsh_double_to_half_inl(v); }
uint16_t tpsh_double_to_bf16(double v) { return tpsh_double_to_bf16_inl(v); }
