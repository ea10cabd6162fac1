/*
 * cuda_elementwise.cuh: what the kernel files (cuda_kernels.cu, cuda_pointwise.cu) share: the block
 * size, element sizes, the f16/bf16 conversions with the CPU backend's bits, and the launch path of the element-wise
 * kernels (the driver's cuLaunchKernel, the grid's size). Each includer gets its own copy (an anonymous
 * namespace), as each kernel has its own function handle.
 */
#ifndef TPSH_CUDA_ELEMENTWISE_CUH
#define TPSH_CUDA_ELEMENTWISE_CUH

#include "backend/cuda/cuda_backend.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>

namespace {

constexpr int kThreads = 256;

/* ==== dtypes ==================================================================================== */
__host__ __device__ __forceinline__ int elsize(int dt) {
  switch (dt) {
  case TPSH_U8: return 1;
  case TPSH_F16: case TPSH_BF16: return 2;
  case TPSH_F32: case TPSH_I32: return 4;
  default: return 8;
  }
}

__host__ __device__ __forceinline__ bool is_float(int dt) {
  return dt == TPSH_F32 || dt == TPSH_F16 || dt == TPSH_BF16 || dt == TPSH_F64;
}

/* ==== f16 and bf16 (core/dtype_convert.h's bits) ================================================= */
__device__ __forceinline__ float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
  return __uint_as_float(sign | __float_as_uint((float)man * 0x1p-24f));
}

/* Round to nearest even is what the hardware conversion does; only NaNs need the CPU's payload rule. */
__device__ __forceinline__ uint16_t float_to_half(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
  return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float bf16_to_float(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* ==== launches ================================================================================== */
inline int launch_failed(const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return TPSH_OK;
  char call[96];
  snprintf(call, sizeof call, "%s kernel launch", what);
  return tpsh_cuda_fail(e, call);
}

inline unsigned grid_for(int64_t n, int per_sm) {
  int64_t blocks = (n + kThreads - 1) / kThreads, cap = (int64_t)tpsh_cuda_dev.sm_count * per_sm;
  if (cap < 1) cap = 1;
  return (unsigned)(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}

/* 32-bit indices when every linear index and the grid-stride step fit in 31 bits. */
inline bool small_index(int64_t n) { return n < ((int64_t)1 << 31); }

/* Elementwise launches go to the driver's cuLaunchKernel (a small op's host cost is the point of the
 * overlap experiments): the runtime's <<<>>> costs about 0.3 us more a launch on the GPU machine, and
 * the cudaGetLastError after it 0.1 us (scripts/bench/overhead_ref.cu's "cudax" lines; docs/perf.md). The
 * kernel's function comes from cudaGetFuncBySymbol once per instantiation. Where the driver path is
 * missing or refuses, the runtime launches instead, and its error is the one reported. */
typedef int (*cu_launch_fn)(cudaFunction_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shmem, cudaStream_t st, void **params, void **extra);

inline cu_launch_fn driver_launch() {
  static cu_launch_fn fn;
  static bool looked_up;
  if (!looked_up) {
    looked_up = true;
    fn = (cu_launch_fn)tpsh_cuda_driver_fn("cuLaunchKernel");
  }
  return fn;
}

template <auto K>
cudaFunction_t function_of() {
  static cudaFunction_t f;
  static bool looked_up;
  if (!looked_up) {
    looked_up = true;
    if (cudaGetFuncBySymbol(&f, (const void *)K) != cudaSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
  }
  return f;
}

/* K<<<grid, kThreads, 0, st>>>(args...) through the driver; false when the caller must launch. */
template <auto K, typename... A>
bool driver_launched(unsigned grid, cudaStream_t st, const A &...args) {
  cu_launch_fn launch = driver_launch();
  cudaFunction_t f = function_of<K>();
  if (!launch || !f) return false;
  void *params[] = {const_cast<A *>(&args)...};        /* the driver only reads them */
  return launch(f, grid, 1, 1, kThreads, 1, 1, 0, st, params, nullptr) == 0;
}

} /* namespace */

#endif /* TPSH_CUDA_ELEMENTWISE_CUH */
