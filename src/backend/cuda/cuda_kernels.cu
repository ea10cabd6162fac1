/*
 * cuda_kernels.cu: every tpsh_kop but floating-point matmul (cuda_blas.c) and the element-wise ops of
 * core/pointwise.h (cuda_pointwise.cu) on the GPU.
 *
 * The results must be the CPU backend's, bit for bit where the CPU's are defined bit for bit, so the
 * element semantics are transcribed from cpu_kernels.c/h rather than re-derived: float math in double
 * rounded once to the output dtype, integer math in int64 with wrap-around, float-to-int saturating
 * with NaN -> 0, f16/bf16 conversions with the bits of core/dtype_convert.c (NaN payloads included).
 * This file is compiled with --fmad=false (CMakeLists.txt): nvcc would otherwise contract a + s*b
 * into one fused multiply-add, which rounds once where the CPU rounds twice.
 *
 * One grid-stride kernel template serves fill, copy, add/mul/scale, arange and random. The host
 * collapses each operand's dims independently (drop size-1 dims, merge dims that are contiguous with
 * their neighbour), which keeps the row-major pairing of elements and turns a contiguous tensor into
 * one dense run; when every operand is dense the kernel indexes directly, otherwise it decodes the
 * linear index per operand, in 32-bit arithmetic when the element count allows (64-bit division is
 * many instructions on a GPU). Dtypes are runtime switches: they are uniform across a launch, so the
 * branch costs nothing next to the memory traffic, and the file stays a handful of instantiations.
 * sum and compare are deterministic two-pass reductions (fixed grid, partials in stream-ordered
 * scratch); no atomics, so reruns give the same bits.
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_elementwise.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

namespace {

constexpr int kMaxDims = 8;

/* ==== element access (cpu_kernels.c semantics) ================================================== */
__host__ __device__ __forceinline__ int64_t f64_to_i64(double v) {
  if (v != v) return 0;
  if (v >= 0x1p63) return INT64_MAX;
  if (v < -0x1p63) return INT64_MIN;
  return (int64_t)v;
}

__device__ __forceinline__ double load_f64(const char *p, int dt) {
  switch (dt) {
  case TPSH_F32: return *(const float *)p;
  case TPSH_F16: return half_to_float(*(const uint16_t *)p);
  case TPSH_BF16: return bf16_to_float(*(const uint16_t *)p);
  case TPSH_F64: return *(const double *)p;
  case TPSH_I32: return *(const int32_t *)p;
  case TPSH_I64: return (double)*(const int64_t *)p;
  default: return *(const uint8_t *)p;
  }
}

__device__ __forceinline__ int64_t load_i64(const char *p, int dt) {
  switch (dt) {
  case TPSH_I32: return *(const int32_t *)p;
  case TPSH_I64: return *(const int64_t *)p;
  case TPSH_U8: return *(const uint8_t *)p;
  default: return f64_to_i64(load_f64(p, dt));
  }
}

/* double -> f32 toward zero, the lowest bit set when inexact (round to odd): then rounding to f16 or
 * bf16 rounds once, as from the double itself (dtype_convert.c says why; through (float) it rounded
 * twice, and a value just above a tie came out below it) */
__device__ __forceinline__ float f64_to_f32_odd(double v) {
  float f = __double2float_rz(v);
  return (double)f == v || v != v ? f : __uint_as_float(__float_as_uint(f) | 1u);
}

__device__ __forceinline__ void store_f64(char *p, int dt, double v) {
  switch (dt) {
  case TPSH_F32: *(float *)p = (float)v; break;
  case TPSH_F16: *(uint16_t *)p = float_to_half(f64_to_f32_odd(v)); break;
  case TPSH_BF16: *(uint16_t *)p = float_to_bf16(f64_to_f32_odd(v)); break;
  case TPSH_F64: *(double *)p = v; break;
  case TPSH_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)f64_to_i64(v); break;
  case TPSH_I64: *(int64_t *)p = f64_to_i64(v); break;
  default: *(uint8_t *)p = (uint8_t)(uint64_t)f64_to_i64(v); break;
  }
}

__device__ __forceinline__ void store_i64(char *p, int dt, int64_t v) {
  switch (dt) {
  case TPSH_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)v; break;
  case TPSH_I64: *(int64_t *)p = v; break;
  case TPSH_U8: *(uint8_t *)p = (uint8_t)(uint64_t)v; break;
  case TPSH_F32: *(float *)p = (float)v; break;          /* one rounding, as on the CPU */
  default: store_f64(p, dt, (double)v); break;
  }
}

__device__ __forceinline__ void copy_bytes(char *o, const char *a, int es) {
  switch (es) {
  case 1: *o = *a; break;
  case 2: *(uint16_t *)o = *(const uint16_t *)a; break;
  case 4: *(uint32_t *)o = *(const uint32_t *)a; break;
  default: *(uint64_t *)o = *(const uint64_t *)a; break;
  }
}

/* ==== operand descriptors ======================================================================= */
struct Desc {
  char *p;                      /* element 0 */
  int32_t ndim, dt;
  int64_t size[kMaxDims];       /* collapsed dims; ndim == 1 and stride[0] == elsize when dense */
  int64_t stride[kMaxDims];     /* bytes */
};

struct Pack {
  Desc t[3];
};

Desc make_desc(const tpsh_tensor *t, const void *data, bool *dense) {
  Desc d;
  memset(&d, 0, sizeof d);
  d.p = (char *)data;
  d.dt = t->dtype_id;
  int64_t es = elsize(t->dtype_id), n = 1;
  for (int k = 0; k < t->ndim; k++) {
    int64_t sz = t->sizes[k], st = t->strides[k] * es;
    n *= sz;
    if (sz == 1) continue;               /* its stride is meaningless and would block merging */
    if (d.ndim > 0 && d.stride[d.ndim - 1] == st * sz) {
      d.size[d.ndim - 1] *= sz;
      d.stride[d.ndim - 1] = st;
    } else {
      d.size[d.ndim] = sz;
      d.stride[d.ndim] = st;
      d.ndim++;
    }
  }
  *dense = d.ndim == 0 || (d.ndim == 1 && d.stride[0] == es);
  if (*dense) {
    d.ndim = 1;
    d.size[0] = n;
    d.stride[0] = es;
  }
  return d;
}

int64_t numel(const tpsh_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
  return n;
}

template <typename I>
__device__ __forceinline__ int64_t offset_of(const Desc &d, I j) {
  int64_t off = 0;
#pragma unroll
  for (int k = kMaxDims - 1; k >= 0; k--) {
    if (k < d.ndim) {
      I s = (I)d.size[k], q = j / s;
      off += (int64_t)(j - q * s) * d.stride[k];
      j = q;
    }
  }
  return off;
}

template <typename I, bool Dense>
__device__ __forceinline__ char *at(const Desc &d, I j) {
  return d.p + (Dense ? (int64_t)j * d.stride[0] : offset_of<I>(d, j));
}

/* ==== the elementwise kernel and its ops ======================================================== */
template <typename I, bool Dense, int NT, typename F>
__global__ void __launch_bounds__(kThreads) elementwise(const __grid_constant__ Pack d, I n, F f) {
  I step = (I)gridDim.x * blockDim.x;
  for (I j = (I)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += step) {
    char *p[3] = {nullptr, nullptr, nullptr};
#pragma unroll
    for (int i = 0; i < NT; i++) p[i] = at<I, Dense>(d.t[i], j);
    f(p, (int64_t)j);
  }
}

/* Dense operands need only their base pointers and element sizes. Launch cost grows with the size of
 * the parameter block, and a Pack of three strided descriptors is 432 bytes: for the small tensors of
 * an overlap experiment that is a measurable part of the host's cost per op. */
struct DensePack {
  char *p[3];
  int64_t es[3];
};

template <typename I, int NT, typename F>
__global__ void __launch_bounds__(kThreads) elementwise_dense(const DensePack d, I n, F f) {
  I step = (I)gridDim.x * blockDim.x;
  for (I j = (I)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += step) {
    char *p[3] = {nullptr, nullptr, nullptr};
#pragma unroll
    for (int i = 0; i < NT; i++) p[i] = d.p[i] + (int64_t)j * d.es[i];
    f(p, (int64_t)j);
  }
}

struct FillOp {
  double v;
  int dt;
  __device__ void operator()(char **p, int64_t) const { store_f64(p[0], dt, v); }
};

struct CopyOp {
  int dto, dts;
  __device__ void operator()(char **p, int64_t) const {
    if (dto == dts) copy_bytes(p[0], p[1], elsize(dto));
    else if (is_float(dts)) store_f64(p[0], dto, load_f64(p[1], dts));
    else store_i64(p[0], dto, load_i64(p[1], dts));     /* int64 keeps i64 sources exact */
  }
};

struct BinaryOp {
  int op, dto, dta, dtb;
  bool ints;             /* every operand an integer and s (and t) integral: int64 with wrap-around */
  bool adds;             /* SCALE: a * s, + t when it adds a number (kargs i[0]), as on the CPU */
  double s, t;
  int64_t si, ti;
  __device__ void operator()(char **p, int64_t) const {
    const char *b = op == TPSH_K_SCALE ? p[1] : p[2];
    if (ints) {
      uint64_t ua = (uint64_t)load_i64(p[1], dta), ub = (uint64_t)load_i64(b, dtb), us = (uint64_t)si;
      uint64_t r = op == TPSH_K_ADD ? ua + us * ub : op == TPSH_K_MUL ? ua * ub : ua * us + (uint64_t)ti;
      store_i64(p[0], dto, (int64_t)r);
    } else {
      double x = load_f64(p[1], dta), y = load_f64(b, dtb);
      store_f64(p[0], dto, op == TPSH_K_ADD ? x + s * y : op == TPSH_K_MUL ? x * y : adds ? x * s + t : x * s);
    }
  }
};

struct ArangeOp {
  double start, step;
  uint64_t istart, istep;
  int dt;
  bool ints;
  __device__ void operator()(char **p, int64_t j) const {
    if (ints) store_i64(p[0], dt, (int64_t)(istart + (uint64_t)j * istep));
    else store_f64(p[0], dt, start + (double)j * step);
  }
};

struct RandomOp {
  uint64_t seed, counter;
  int dt;
  bool normal;
  __device__ void operator()(char **p, int64_t j) const {
    uint64_t c = counter + (uint64_t)j;
    char *o = p[0];
    if (normal) {
      store_f64(o, dt, tpsh_rand_normal(seed, c));
    } else if (!is_float(dt)) {
      store_i64(o, dt, (int64_t)(tpsh_rand_mix(seed, c) >> 33));
    } else {
      /* a uniform below 1 may round up to 1 in a narrow dtype: keep [0, 1) half-open (as the CPU) */
      double u = tpsh_rand_uniform(seed, c);
      if (dt == TPSH_F32) {
        float f = (float)u;
        *(float *)o = f >= 1.0f ? 0x1.fffffep-1f : f;
      } else if (dt == TPSH_F16) {
        uint16_t h = float_to_half(f64_to_f32_odd(u));
        *(uint16_t *)o = h == 0x3c00 ? 0x3bff : h;
      } else if (dt == TPSH_BF16) {
        uint16_t h = float_to_bf16(f64_to_f32_odd(u));
        *(uint16_t *)o = h == 0x3f80 ? 0x3f7f : h;
      } else {
        *(double *)o = u;
      }
    }
  }
};

template <typename I, int NT, typename F>
int launch_dense(cudaStream_t st, unsigned grid, const DensePack &dp, I n, const F &f, const char *what) {
  if (driver_launched<elementwise_dense<I, NT, F>>(grid, st, dp, n, f)) return TPSH_OK;
  elementwise_dense<I, NT><<<grid, kThreads, 0, st>>>(dp, n, f);
  return launch_failed(what);
}

template <typename I, int NT, typename F>
int launch_strided(cudaStream_t st, unsigned grid, const Pack &pk, I n, const F &f, const char *what) {
  if (driver_launched<elementwise<I, false, NT, F>>(grid, st, pk, n, f)) return TPSH_OK;
  elementwise<I, false, NT><<<grid, kThreads, 0, st>>>(pk, n, f);
  return launch_failed(what);
}

template <int NT, typename F>
int launch_elementwise(cudaStream_t st, const Pack &pk, bool dense, int64_t n, F f, const char *what) {
  if (n == 0) return TPSH_OK;
  unsigned grid = grid_for(n, 16);
  if (dense) {
    DensePack dp = {};                                 /* the operands past NT stay null */
    for (int i = 0; i < NT; i++) { dp.p[i] = pk.t[i].p; dp.es[i] = pk.t[i].stride[0]; }
    if (small_index(n)) return launch_dense<uint32_t, NT>(st, grid, dp, (uint32_t)n, f, what);
    return launch_dense<int64_t, NT>(st, grid, dp, n, f, what);
  }
  if (small_index(n)) return launch_strided<uint32_t, NT>(st, grid, pk, (uint32_t)n, f, what);
  return launch_strided<int64_t, NT>(st, grid, pk, n, f, what);
}

/* ==== fill, copy, add/mul/scale, arange, random ================================================= */
int k_fill(cudaStream_t st, const tpsh_tensor *t, void *data, double v) {
  Pack pk;
  bool dense;
  pk.t[0] = make_desc(t, data, &dense);
  int64_t n = numel(t), es = elsize(t->dtype_id);
  if (n == 0) return TPSH_OK;
  /* Byte patterns need no kernel: zeros of every dtype (but -0.0), and any u8 value. */
  bool zero = v == 0.0 && !signbit(v);
  if (dense && (zero || t->dtype_id == TPSH_U8)) {
    int byte = zero ? 0 : (int)(uint8_t)(uint64_t)f64_to_i64(v);
    CUDA_TRY(cudaMemsetAsync(data, byte, (size_t)(n * es), st));
    return TPSH_OK;
  }
  return launch_elementwise<1>(st, pk, dense, n, FillOp{v, t->dtype_id}, "fill");
}

int k_copy(cudaStream_t st, const tpsh_tensor *dst, void *dd, const tpsh_tensor *src, const void *sd) {
  int64_t n = numel(dst);
  if (n != numel(src))
    return tpsh_error(TPSH_EINVAL, "copy: %lld elements into %lld", (long long)numel(src), (long long)n);
  if (n == 0) return TPSH_OK;
  Pack pk;
  bool d0, d1;
  pk.t[0] = make_desc(dst, dd, &d0);
  pk.t[1] = make_desc(src, sd, &d1);
  if (d0 && d1 && dst->dtype_id == src->dtype_id) {
    if (dd != sd) CUDA_TRY(cudaMemcpyAsync(dd, sd, (size_t)(n * elsize(dst->dtype_id)), cudaMemcpyDeviceToDevice, st));
    return TPSH_OK;
  }
  return launch_elementwise<2>(st, pk, d0 && d1, n, CopyOp{dst->dtype_id, src->dtype_id}, "copy");
}

bool is_int_valued(double v) { return v == trunc(v) && v >= -0x1p63 && v < 0x1p63; }   /* -2^63 is an int64 */

int k_binary(cudaStream_t st, const tpsh_kargs *k) {
  int op = k->op, nt = op == TPSH_K_SCALE ? 2 : 3;
  /* a + b, a - b (alpha 1 or -1) and a * b are rows of core/pointwise.h: one operation rounded once
   * gives the bits of the double arithmetic below (f32 holds 2p + 2 bits of f16 and bf16, f64 of f32),
   * and cuda_pointwise.cu's dense kernel reads 16-byte vectors where this one reads elements */
  if (op == TPSH_K_MUL || (op == TPSH_K_ADD && (k->s[0] == 1.0 || k->s[0] == -1.0))) {
    tpsh_kargs row = *k;
    row.op = TPSH_K_BINARY;
    row.i[0] = op == TPSH_K_MUL ? TPSH_B_MUL : k->s[0] == 1.0 ? TPSH_B_ADD : TPSH_B_SUB;
    return tpsh_cuda_pointwise(st, &row);
  }
  int64_t n = numel(&k->t[0]);
  for (int i = 1; i < nt; i++)
    if (numel(&k->t[i]) != n || k->t[i].ndim != k->t[0].ndim)
      return tpsh_error(TPSH_EINVAL, "%s: operand %d does not have the output's shape", k->name, i);
  Pack pk;
  bool dense = true;
  for (int i = 0; i < nt; i++) {
    bool d;
    pk.t[i] = make_desc(&k->t[i], k->data[i], &d);
    dense = dense && d;
  }
  if (nt == 2) pk.t[2] = pk.t[1];
  int dto = k->t[0].dtype_id, dta = k->t[1].dtype_id, dtb = k->t[nt - 1].dtype_id;
  bool adds = op == TPSH_K_SCALE && k->i[0];
  double s = op == TPSH_K_MUL ? 1.0 : k->s[0], t = adds ? k->s[1] : 0.0;
  bool ints = !is_float(dto) && !is_float(dta) && !is_float(dtb) && is_int_valued(s) && (!adds || is_int_valued(t));
  BinaryOp f{op, dto, dta, dtb, ints, adds, s, t, ints ? (int64_t)s : 0, ints ? (int64_t)t : 0};
  return launch_elementwise<3>(st, pk, dense, n, f, k->name);
}

int k_arange(cudaStream_t st, const tpsh_kargs *k) {
  const tpsh_tensor *t = &k->t[0];
  Pack pk;
  bool dense;
  pk.t[0] = make_desc(t, k->data[0], &dense);
  double start = k->s[0], step = k->s[1];
  bool ints = !is_float(t->dtype_id) && is_int_valued(start) && is_int_valued(step);
  ArangeOp f{start, step, ints ? (uint64_t)(int64_t)start : 0, ints ? (uint64_t)(int64_t)step : 0, t->dtype_id, ints};
  return launch_elementwise<1>(st, pk, dense, numel(t), f, "arange");
}

int k_random(cudaStream_t st, const tpsh_kargs *k) {
  const tpsh_tensor *t = &k->t[0];
  Pack pk;
  bool dense;
  pk.t[0] = make_desc(t, k->data[0], &dense);
  RandomOp f{(uint64_t)k->i[1], (uint64_t)k->i[2], t->dtype_id, k->i[0] == 1};
  return launch_elementwise<1>(st, pk, dense, numel(t), f, "random");
}

/* ==== reductions ================================================================================ */
/* Neumaier's compensated sum as a (sum, compensation) pair, so that partial sums combine exactly as
 * the CPU's running sum does; the NaN/inf rule (the plain sum wins when it is not finite) too. */
struct FSum {
  double s, c;
  __device__ static FSum combine(FSum a, FSum b) {
    double t = a.s + b.s;
    double c = a.c + b.c + (fabs(a.s) >= fabs(b.s) ? (a.s - t) + b.s : (b.s - t) + a.s);
    return FSum{t, c};
  }
  __device__ static FSum shfl(FSum v, int o) {
    return FSum{__shfl_down_sync(0xffffffffu, v.s, o), __shfl_down_sync(0xffffffffu, v.c, o)};
  }
};

struct ISum {
  unsigned long long s;
  __device__ static ISum combine(ISum a, ISum b) { return ISum{a.s + b.s}; }
  __device__ static ISum shfl(ISum v, int o) { return ISum{__shfl_down_sync(0xffffffffu, v.s, o)}; }
};

struct Cmp {
  double violations, max_diff;
  int saw_nan;
  __device__ static Cmp combine(Cmp a, Cmp b) {
    return Cmp{a.violations + b.violations, fmax(a.max_diff, b.max_diff), a.saw_nan | b.saw_nan};
  }
  __device__ static Cmp shfl(Cmp v, int o) {
    return Cmp{__shfl_down_sync(0xffffffffu, v.violations, o), __shfl_down_sync(0xffffffffu, v.max_diff, o),
               __shfl_down_sync(0xffffffffu, v.saw_nan, o)};
  }
};

/* The block's combined value in thread 0. blockDim.x is a multiple of 32. */
template <typename T>
__device__ T block_reduce(T v) {
  __shared__ T warp_part[32];
  for (int o = 16; o > 0; o >>= 1) v = T::combine(v, T::shfl(v, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? warp_part[lane] : T{};
    for (int o = 16; o > 0; o >>= 1) v = T::combine(v, T::shfl(v, o));
  }
  return v;
}

__device__ __forceinline__ void fsum_add(FSum &a, double x) {
  double t = a.s + x;
  a.c += fabs(a.s) >= fabs(x) ? (a.s - t) + x : (x - t) + a.s;
  a.s = t;
}

template <typename I, bool Dense>
__global__ void __launch_bounds__(kThreads) sum_partial(const __grid_constant__ Desc d, I n, FSum *fp, ISum *ip) {
  I step = (I)gridDim.x * blockDim.x;
  I j = (I)blockIdx.x * blockDim.x + threadIdx.x;
  if (is_float(d.dt)) {
    FSum acc{0, 0};
    for (; j < n; j += step) fsum_add(acc, load_f64(at<I, Dense>(d, j), d.dt));
    acc = block_reduce(acc);
    if (threadIdx.x == 0) fp[blockIdx.x] = acc;
  } else {
    ISum acc{0};
    for (; j < n; j += step) acc.s += (unsigned long long)load_i64(at<I, Dense>(d, j), d.dt);
    acc = block_reduce(acc);
    if (threadIdx.x == 0) ip[blockIdx.x] = acc;
  }
}

__global__ void __launch_bounds__(1024) sum_final(const FSum *fp, const ISum *ip, int nparts, bool fl, char *out, int dt) {
  if (fl) {
    FSum acc{0, 0};
    if ((int)threadIdx.x < nparts) acc = fp[threadIdx.x];
    acc = block_reduce(acc);
    if (threadIdx.x == 0) store_f64(out, dt, isfinite(acc.s) ? acc.s + acc.c : acc.s);
  } else {
    ISum acc{0};
    if ((int)threadIdx.x < nparts) acc = ip[threadIdx.x];
    acc = block_reduce(acc);
    if (threadIdx.x == 0) store_i64(out, dt, (int64_t)acc.s);
  }
}

__device__ __forceinline__ void compare_one(Cmp &c, double a, double b, double rtol, double atol) {
  if (isnan(a) || isnan(b)) {
    c.violations += 1;
    c.saw_nan = 1;
    return;
  }
  if (a == b) return;                      /* also equal infinities, whose difference is NaN */
  double d = fabs(a - b);
  c.max_diff = fmax(c.max_diff, d);
  if (isinf(a) || isinf(b) || !(d <= atol + rtol * fabs(b))) c.violations += 1;
}

/* Two integers compare exactly (as the CPU backend's compare_ints): in double, 2^53 + 1 equalled 2^53. */
__device__ __forceinline__ void compare_ints(Cmp &c, int64_t a, int64_t b, double rtol, double atol) {
  if (a == b) return;
  double d = (double)(a > b ? (uint64_t)a - (uint64_t)b : (uint64_t)b - (uint64_t)a);
  c.max_diff = fmax(c.max_diff, d);
  if (!(d <= atol + rtol * fabs((double)b))) c.violations += 1;
}

template <typename I, bool Dense>
__global__ void __launch_bounds__(kThreads) compare_partial(const __grid_constant__ Pack d, I n, double rtol,
                                                            double atol, Cmp *parts) {
  I step = (I)gridDim.x * blockDim.x;
  Cmp acc{0, 0, 0};
  bool ints = !is_float(d.t[0].dt) && !is_float(d.t[1].dt);
  for (I j = (I)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += step) {
    const char *a = at<I, Dense>(d.t[0], j), *b = at<I, Dense>(d.t[1], j);
    if (ints) compare_ints(acc, load_i64(a, d.t[0].dt), load_i64(b, d.t[1].dt), rtol, atol);
    else compare_one(acc, load_f64(a, d.t[0].dt), load_f64(b, d.t[1].dt), rtol, atol);
  }
  acc = block_reduce(acc);
  if (threadIdx.x == 0) parts[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(1024) compare_final(const Cmp *parts, int nparts, double *out, int64_t stride1) {
  Cmp acc{0, 0, 0};
  if ((int)threadIdx.x < nparts) acc = parts[threadIdx.x];
  acc = block_reduce(acc);
  if (threadIdx.x == 0) {
    out[0] = acc.violations;
    out[stride1] = acc.saw_nan ? __longlong_as_double(0x7ff8000000000000LL) : acc.max_diff;
  }
}

constexpr int kMaxParts = 1024;     /* the final kernels combine one partial per thread */

int k_sum(cudaStream_t st, const tpsh_kargs *k) {
  const tpsh_tensor *src = &k->t[1];
  if (numel(&k->t[0]) != 1) return tpsh_error(TPSH_EINVAL, "%s: the output must hold one element", k->name);
  /* in memory order (tensor.c): a transposed dense view reads as the dense one, coalesced */
  tpsh_tensor walk = tpsh_tensor_memory_order(src);
  bool dense;
  Desc d = make_desc(&walk, k->data[1], &dense);
  int64_t n = numel(src);
  bool fl = is_float(src->dtype_id);
  int nparts = n ? (int)grid_for(n, 4) : 0;
  if (nparts > kMaxParts) nparts = kMaxParts;
  void *parts = tpsh_cuda_scratch_alloc((size_t)(nparts ? nparts : 1) * sizeof(FSum), st);
  if (!parts) return TPSH_ENOMEM;
  FSum *fp = (FSum *)parts;
  ISum *ip = (ISum *)parts;
  int rc = TPSH_OK;
  if (nparts) {
    if (small_index(n)) {
      if (dense) sum_partial<uint32_t, true><<<nparts, kThreads, 0, st>>>(d, (uint32_t)n, fp, ip);
      else sum_partial<uint32_t, false><<<nparts, kThreads, 0, st>>>(d, (uint32_t)n, fp, ip);
    } else {
      if (dense) sum_partial<int64_t, true><<<nparts, kThreads, 0, st>>>(d, n, fp, ip);
      else sum_partial<int64_t, false><<<nparts, kThreads, 0, st>>>(d, n, fp, ip);
    }
    rc = launch_failed(k->name);
  }
  if (rc == TPSH_OK) {
    sum_final<<<1, 1024, 0, st>>>(fp, ip, nparts, fl, (char *)k->data[0], k->t[0].dtype_id);
    rc = launch_failed(k->name);
  }
  tpsh_cuda_scratch_free(parts, st);
  return rc;
}

int k_compare(cudaStream_t st, const tpsh_kargs *k) {
  const tpsh_tensor *r = &k->t[0];
  if (r->dtype_id != TPSH_F64 || r->ndim != 1 || r->sizes[0] != 2)
    return tpsh_error(TPSH_EINVAL, "%s: the result must be an f64 tensor of 2 elements", k->name);
  int64_t n = numel(&k->t[1]);
  if (n != numel(&k->t[2])) return tpsh_error(TPSH_EINVAL, "%s: the operands' shapes differ", k->name);
  Pack pk;
  bool da, db;
  pk.t[0] = make_desc(&k->t[1], k->data[1], &da);
  pk.t[1] = make_desc(&k->t[2], k->data[2], &db);
  int nparts = n ? (int)grid_for(n, 4) : 0;
  if (nparts > kMaxParts) nparts = kMaxParts;
  Cmp *parts = (Cmp *)tpsh_cuda_scratch_alloc((size_t)(nparts ? nparts : 1) * sizeof(Cmp), st);
  if (!parts) return TPSH_ENOMEM;
  int rc = TPSH_OK;
  double rtol = k->s[0], atol = k->s[1];
  if (nparts) {
    bool dense = da && db;
    if (small_index(n)) {
      if (dense) compare_partial<uint32_t, true><<<nparts, kThreads, 0, st>>>(pk, (uint32_t)n, rtol, atol, parts);
      else compare_partial<uint32_t, false><<<nparts, kThreads, 0, st>>>(pk, (uint32_t)n, rtol, atol, parts);
    } else {
      if (dense) compare_partial<int64_t, true><<<nparts, kThreads, 0, st>>>(pk, n, rtol, atol, parts);
      else compare_partial<int64_t, false><<<nparts, kThreads, 0, st>>>(pk, n, rtol, atol, parts);
    }
    rc = launch_failed(k->name);
  }
  if (rc == TPSH_OK) {
    compare_final<<<1, 1024, 0, st>>>(parts, nparts, (double *)k->data[0], r->strides[0]);
    rc = launch_failed(k->name);
  }
  tpsh_cuda_scratch_free(parts, st);
  return rc;
}

/* ==== spin ====================================================================================== */
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Busy, not sleeping: the point is a kernel that holds SMs like real compute. One small block per SM
 * occupies every SM (so it competes as a GEMM would) yet leaves room for NCCL's blocks beside it.
 * %globaltimer is the device's nanosecond clock, independent of the SM clock's boost state. */
__global__ void spin_kernel(uint64_t ns) {
  uint64_t start = globaltimer_ns();
  float x = (float)threadIdx.x;
  while (globaltimer_ns() - start < ns) {
#pragma unroll 16
    for (int r = 0; r < 64; r++) x = x * 0.9999f + 0.0001f;
  }
  asm volatile("" ::"f"(x));       /* keep the arithmetic alive */
}

/* idle (a chaos delay): one block, which leaves the SMs to the work it reorders */
int k_spin(cudaStream_t st, double ms, int idle) {
  uint64_t ns = ms > 0 ? (uint64_t)(ms * 1e6) : 0;
  int grid = !idle && tpsh_cuda_dev.sm_count > 0 ? tpsh_cuda_dev.sm_count : 1;
  spin_kernel<<<grid, 32, 0, st>>>(ns);
  return launch_failed("spin");
}

/* ==== integer matmul ============================================================================ */
struct Mat {
  char *p;
  int dt;
  int64_t s0, s1;                 /* bytes */
};

constexpr int kTile = 16;

__global__ void matmul_int_kernel(Mat a, Mat b, Mat c, int64_t m, int64_t n, int64_t kk) {
  __shared__ unsigned long long as[kTile][kTile], bs[kTile][kTile];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t row = (int64_t)blockIdx.y * kTile + ty, col = (int64_t)blockIdx.x * kTile + tx;
  unsigned long long acc = 0;
  for (int64_t p0 = 0; p0 < kk; p0 += kTile) {
    as[ty][tx] = row < m && p0 + tx < kk ? (unsigned long long)load_i64(a.p + row * a.s0 + (p0 + tx) * a.s1, a.dt) : 0;
    bs[ty][tx] = p0 + ty < kk && col < n ? (unsigned long long)load_i64(b.p + (p0 + ty) * b.s0 + col * b.s1, b.dt) : 0;
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kTile; q++) acc += as[ty][q] * bs[q][tx];
    __syncthreads();
  }
  if (row < m && col < n) store_i64(c.p + row * c.s0 + col * c.s1, c.dt, (int64_t)acc);
}

Mat make_mat(const tpsh_tensor *t, void *data) {
  int64_t es = elsize(t->dtype_id);
  return Mat{(char *)data, t->dtype_id, t->strides[0] * es, t->strides[1] * es};
}

} /* namespace */

/* ==== entry points ============================================================================== */
extern "C" int tpsh_cuda_is_dense(const tpsh_tensor *t) {
  bool dense;
  (void)make_desc(t, nullptr, &dense);
  return dense;
}

extern "C" int tpsh_cuda_copy(cudaStream_t st, const tpsh_tensor *dst, void *dst_data, const tpsh_tensor *src,
                              const void *src_data) {
  return k_copy(st, dst, dst_data, src, src_data);
}

extern "C" int tpsh_cuda_matmul_int(cudaStream_t st, const tpsh_kargs *k) {
  int64_t m = k->t[1].sizes[0], kk = k->t[1].sizes[1], n = k->t[2].sizes[1];
  if (m == 0 || n == 0) return TPSH_OK;
  int64_t gy = (m + kTile - 1) / kTile, gx = (n + kTile - 1) / kTile;
  if (gy > 65535 || gx > INT32_MAX)
    return tpsh_error(TPSH_EUNSUPPORTED, "matmul: %lld rows exceed the integer kernel's grid", (long long)m);
  matmul_int_kernel<<<dim3((unsigned)gx, (unsigned)gy), dim3(kTile, kTile), 0, st>>>(
      make_mat(&k->t[1], k->data[1]), make_mat(&k->t[2], k->data[2]), make_mat(&k->t[0], k->data[0]), m, n, kk);
  return launch_failed("matmul");
}

extern "C" int tpsh_cuda_kernel(cudaStream_t st, const tpsh_kargs *k) {
  switch ((tpsh_kop)k->op) {
  case TPSH_K_FILL: return k_fill(st, &k->t[0], k->data[0], k->s[0]);
  case TPSH_K_COPY: return k_copy(st, &k->t[0], k->data[0], &k->t[1], k->data[1]);
  case TPSH_K_ADD: case TPSH_K_MUL: case TPSH_K_SCALE: return k_binary(st, k);
  case TPSH_K_SUM: return k_sum(st, k);
  case TPSH_K_ARANGE: return k_arange(st, k);
  case TPSH_K_RANDOM: return k_random(st, k);
  case TPSH_K_SPIN: return k_spin(st, k->s[0], k->i[0] != 0);
  case TPSH_K_COMPARE: return k_compare(st, k);
  case TPSH_K_REDUCE: case TPSH_K_SOFTMAX: case TPSH_K_NORM: return tpsh_cuda_reduce(st, k);
  case TPSH_K_UNARY: case TPSH_K_BINARY: return tpsh_cuda_pointwise(st, k);
  case TPSH_K_MATMUL: case TPSH_K_COUNT: break;
  }
  return tpsh_error(TPSH_EINVAL, "kernel: unknown op %d", (int)k->op);
}

/* this file's module, which cuda_modules.c loads whole at start-up */
TPSH_CUDA_MODULE_ANCHOR(tpsh_cuda_kernels_module)
