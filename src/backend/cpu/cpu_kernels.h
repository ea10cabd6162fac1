/*
 * cpu_kernels.h: the CPU backend's kernels, run synchronously by a stream's worker thread.
 *
 * Semantics shared by every op (the CUDA kernels should match them):
 *  - Float math runs in double and is rounded once to the output dtype (f16/bf16 through f32, which
 *    is exact for the narrowing: f32 has more than 2p+2 bits for p = 11 and 8). For add with alpha = 1,
 *    mul, and copies this is bit-identical to IEEE f32/f16/bf16 arithmetic; with a scale or an alpha
 *    it is at least as accurate.
 *  - When every operand is an integer, add/mul/scale/sum/matmul run in int64 with two's complement
 *    wrap-around, then wrap to the output width (u8 modulo 256, i32 modulo 2^32). A non-integral alpha
 *    or scale factor switches that op to double, truncated toward zero when stored.
 *  - A float stored into an integer dtype truncates toward zero as C does, saturates at the int64
 *    range, maps NaN to 0, and then wraps to the output width as above: -1.0 -> u8 255, 300.7 -> u8 44
 *    (what PyTorch gives on x86 CPUs).
 *  - random: floats get tpsh_rand_uniform / tpsh_rand_normal rounded to the dtype, except that a uniform
 *    that rounds to 1.0 (possible in f32/f16/bf16) is stored as the largest value below 1, so that
 *    [0, 1) holds in every dtype. Integer dtypes get uniform integers in [0, 2^31),
 *    tpsh_rand_mix(seed, counter + j) >> 33 (then wrapped: u8 keeps the low 8 bits); with normal = 1
 *    they get the normal value truncated toward zero.
 *  - compare: NaN in either operand is a violation and makes max|a-b| NaN; equal infinities agree,
 *    any other infinity is a violation (its difference counts as inf). Operands are read as double,
 *    so i64 values beyond 2^53 compare approximately.
 */
#ifndef TPSH_CPU_KERNELS_H
#define TPSH_CPU_KERNELS_H

#include "core/backend.h"

/* Runs one op synchronously on the calling (worker) thread. Returns TPSH_OK or a status with
   tpsh_error(...) set. */
int tpsh_cpu_kernel_run(const tpsh_kargs *k);

/* dst = src with casts, any strides, same number of elements; when the shapes differ the elements
   are paired in row-major order. Overlapping memory is safe only when dst and src are the same view. */
int tpsh_cpu_copy(const tpsh_tensor *dst, void *dst_data, const tpsh_tensor *src, const void *src_data);

/* Gathers src (any strides) into the contiguous buffer dst of src's dtype: the CPU to_host. */
int tpsh_cpu_copy_to_contiguous(const tpsh_tensor *src, const void *src_data, void *dst);

/* cpu_matmul.c: TPSH_K_MATMUL. */
int tpsh_cpu_matmul(const tpsh_kargs *k);

/* cpu_reduce.c: TPSH_K_REDUCE, TPSH_K_SOFTMAX and TPSH_K_NORM (name: the op's, for messages). */
int tpsh_cpu_reduce(const tpsh_kargs *k, const char *name);

/* Pairwise sum of n doubles (error O(log n) ulps): the CPU's sums share it. */
double tpsh_cpu_sum_f64(const double *x, int64_t n);
/* cpu_pointwise.c: TPSH_K_UNARY and TPSH_K_BINARY (name: the op's, for messages). */
int tpsh_cpu_pointwise(const tpsh_kargs *k, const char *name);

#endif /* TPSH_CPU_KERNELS_H */
