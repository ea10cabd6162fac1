/*
 * random.h: the counter-based generator behind tp.rand and tp.randn.
 *
 * Element j of a tensor filled from (seed, counter) is a pure function of seed and counter + j, so the
 * CPU worker threads and the CUDA kernels produce the same numbers without sharing state, in any order
 * and in parallel. The mixing function is SplitMix64's finaliser (Steele, Lea, Flood 2014), applied to
 * seed ^ (index * golden ratio): statistically sound for simulation workloads, not for cryptography.
 * Included by C and by CUDA (.cu) code alike.
 */
#ifndef TPSH_RANDOM_H
#define TPSH_RANDOM_H

#include <stdint.h>
#include <math.h>

#ifdef __CUDACC__
#define TPSH_HD __host__ __device__ __forceinline__
#else
#define TPSH_HD static inline
#endif

TPSH_HD uint64_t tpsh_rand_mix(uint64_t seed, uint64_t index) {
  uint64_t z = seed ^ (index * 0x9E3779B97F4A7C15ULL);
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
TPSH_HD double tpsh_rand_uniform(uint64_t seed, uint64_t index) {
  return (double)(tpsh_rand_mix(seed, index) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal by Box-Muller from the uniforms at 2*index and 2*index + 1. */
TPSH_HD double tpsh_rand_normal(uint64_t seed, uint64_t index) {
  double u1 = 1.0 - tpsh_rand_uniform(seed, 2 * index);      /* (0, 1]: log is finite */
  double u2 = tpsh_rand_uniform(seed, 2 * index + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif /* TPSH_RANDOM_H */
