/*
 * cuda_reduce.cu: TPSH_K_REDUCE, TPSH_K_SOFTMAX and TPSH_K_NORM on the GPU, ops over the last dim of
 * their input (the core moved the dim reduced there: core/ops_reduce.c).
 *
 * Each op is a statistic folded over a row (a sum; the first max with its index; softmax's running max
 * and sum of exponentials, rescaled when the max grows; Welford's count, mean and M2; a sum of squares),
 * combined across threads, and then either stored (the reductions) or used in a second pass that
 * writes the row (softmax and the norms). f16 and bf16 are computed in f32, f32 in f32 and f64 in f64
 * (as PyTorch's kernels do), and every result is rounded once to the output's dtype: the last bits are
 * not the CPU backend's, which computes in f64, so scripts/gpu/gpu_smoke.lua compares within tolerances.
 *
 * Two layouts, chosen by the input's stride along the row:
 *  - rows with unit stride (a reduction along the last dim, softmax and norms of contiguous tensors): a
 *    warp per row when the row has at most 1024 elements, else a block of 256 threads per row; the
 *    threads stride along the row with 16-byte loads where every row is aligned for them, and the two
 *    passes of softmax and the norms read the row from global memory once: the first pass keeps it in
 *    shared memory when it fits (48 KiB a block), else the second reads it again (from L2, mostly);
 *  - strided rows (a reduction along another dim, whose neighbouring rows are next to each other in
 *    memory): a thread per row, 32 rows a block, coalesced across the rows, and 8 threads along each
 *    row whose statistics are combined through shared memory.
 * The combination order is fixed by the launch, so reruns give the same bits (no atomics).
 */
#include "backend/cuda/cuda_backend.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

namespace {

constexpr int kThreads = 256;
constexpr int kMaxDims = 8;
constexpr int kColRows = 32, kColLanes = kThreads / kColRows;   /* the strided layout's block */
constexpr size_t kCacheBytes = 48 * 1024;                       /* shared memory without the opt-in */
constexpr unsigned kFull = 0xffffffffu;

/* ==== element types: loaded as the accumulation type A, stored rounded to nearest even ============= */
template <typename T> struct Elem;
template <> struct Elem<float> {
  using A = float;
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
template <> struct Elem<double> {
  using A = double;
  __device__ static double load(double v) { return v; }
  __device__ static double store(double v) { return v; }
};
template <> struct Elem<__half> {
  using A = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
template <> struct Elem<__nv_bfloat16> {
  using A = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

__device__ __forceinline__ float expa(float x) { return expf(x); }
__device__ __forceinline__ double expa(double x) { return exp(x); }
__device__ __forceinline__ float loga(float x) { return logf(x); }
__device__ __forceinline__ double loga(double x) { return log(x); }
__device__ __forceinline__ float sqrta(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrta(double x) { return sqrt(x); }

/* the larger, NaN winning (fmax drops NaN) */
template <typename A> __device__ __forceinline__ A nan_max(A a, A b) { return a != a || a > b ? a : b; }

/* shuffles of every field of a statistic (each one a float, double or long long) */
struct ShflDown {
  int delta;
  template <typename V> __device__ V operator()(V v) const { return __shfl_down_sync(kFull, v, delta); }
};
struct ShflFrom {
  int lane;
  template <typename V> __device__ V operator()(V v) const { return __shfl_sync(kFull, v, lane); }
};

/* ==== the statistics ============================================================================== */
template <typename A> struct SumStat {
  A s;
  __device__ static SumStat init() { return {A(0)}; }
  __device__ void fold(A x, int64_t) { s += x; }
  __device__ static SumStat combine(SumStat a, SumStat b) { return {a.s + b.s}; }
  template <typename F> __device__ SumStat map(F f) const { return {f(s)}; }
};

/* the first max: a NaN beats every number, equal values the later index (min is the max of -x) */
template <typename A> struct MaxStat {
  A v;
  long long i;
  __device__ static MaxStat init() { return {A(-INFINITY), 0x7fffffffffffffffLL}; }
  __device__ static MaxStat combine(MaxStat a, MaxStat b) {
    bool an = a.v != a.v, bn = b.v != b.v;
    if (an != bn) return an ? a : b;
    if (an || a.v == b.v) return a.i <= b.i ? a : b;
    return a.v > b.v ? a : b;
  }
  __device__ void fold(A x, int64_t j) { *this = combine(*this, MaxStat{x, (long long)j}); }
  template <typename F> __device__ MaxStat map(F f) const { return {f(v), f(i)}; }
};

/* softmax's running max m and sum s of exp(x - m), rescaled when m grows (a NaN or +inf makes s NaN) */
template <typename A> struct SoftStat {
  A m, s;
  __device__ static A rescale(A old_m, A m) { return old_m == m ? A(1) : expa(old_m - m); }
  __device__ static SoftStat init() { return {A(-INFINITY), A(0)}; }
  __device__ void fold(A x, int64_t) {
    if (x == A(-INFINITY)) return;                    /* exp(-inf - m) is 0; a row of them stays NaN */
    A nm = nan_max(m, x);
    s = s * rescale(m, nm) + expa(x - nm);
    m = nm;
  }
  __device__ static SoftStat combine(SoftStat a, SoftStat b) {
    A m = nan_max(a.m, b.m);
    return {m, a.s * rescale(a.m, m) + b.s * rescale(b.m, m)};
  }
  template <typename F> __device__ SoftStat map(F f) const { return {f(m), f(s)}; }
};

/* Welford's count, mean and sum of squared deviations; combined by Chan's rule */
template <typename A> struct WelfordStat {
  A mean, m2;
  long long n;
  __device__ static WelfordStat init() { return {A(0), A(0), 0}; }
  __device__ void fold(A x, int64_t) {
    n++;
    A d = x - mean;
    mean += d / A(n);
    m2 += d * (x - mean);
  }
  __device__ static WelfordStat combine(WelfordStat a, WelfordStat b) {
    if (a.n == 0) return b;
    if (b.n == 0) return a;
    long long n = a.n + b.n;
    A d = b.mean - a.mean, fb = A(b.n) / A(n);
    return {a.mean + d * fb, a.m2 + b.m2 + d * d * A(a.n) * fb, n};
  }
  template <typename F> __device__ WelfordStat map(F f) const { return {f(mean), f(m2), f(n)}; }
};

template <typename A> struct SquaresStat {
  A s;
  __device__ static SquaresStat init() { return {A(0)}; }
  __device__ void fold(A x, int64_t) { s += x * x; }
  __device__ static SquaresStat combine(SquaresStat a, SquaresStat b) { return {a.s + b.s}; }
  template <typename F> __device__ SquaresStat map(F f) const { return {f(s)}; }
};

/* ==== the arguments =============================================================================== */
/* The rows: the input's outer dims (merged where every tensor allows), their strides in elements in
 * the input x, the output o and the indices i, and the strides along a row. */
struct Rows {
  int32_t nd;
  int64_t size[kMaxDims], x[kMaxDims], o[kMaxDims], i[kMaxDims];
  int64_t n, xs, os;
  int64_t count;             /* rows */
};

struct Offsets { int64_t x, o, i; };

__device__ __forceinline__ Offsets offsets_of(const Rows &r, int64_t row) {
  Offsets f{0, 0, 0};
#pragma unroll
  for (int k = kMaxDims - 1; k >= 0; k--) {
    if (k < r.nd) {
      int64_t q = row / r.size[k], j = row - q * r.size[k];
      f.x += j * r.x[k];
      f.o += j * r.o[k];
      f.i += j * r.i[k];
      row = q;
    }
  }
  return f;
}

enum Kind { SUM, MEAN, MAX, MIN, SOFTMAX, LOG_SOFTMAX, LAYER_NORM, RMS_NORM };

template <typename T> struct Args {
  const T *x;
  T *o;
  long long *idx;              /* max and min with indices, else null */
  const T *w, *b;              /* the norms' weight and bias, or null */
  int64_t ws, bs;              /* their strides */
  double eps;
  int kind;
  bool cached, vec;            /* rows layout: the row kept in shared memory; 16-byte loads and stores */
  Rows r;
};

/* ==== per op: the statistic, and what is written ================================================== */
template <int K, typename A> struct StatOf { using S = SumStat<A>; };
template <typename A> struct StatOf<MAX, A> { using S = MaxStat<A>; };
template <typename A> struct StatOf<SOFTMAX, A> { using S = SoftStat<A>; };
template <typename A> struct StatOf<LAYER_NORM, A> { using S = WelfordStat<A>; };
template <typename A> struct StatOf<RMS_NORM, A> { using S = SquaresStat<A>; };
/* MEAN and MIN fold as SUM and MAX; LOG_SOFTMAX as SOFTMAX (the launch passes the family's K) */

template <int K> constexpr bool kWritesRows = K == SOFTMAX || K == LAYER_NORM || K == RMS_NORM;

/* A reduction's result, by the thread that holds the row's statistic. */
template <int K, typename T, typename S>
__device__ void store_result(const Args<T> &p, const Offsets &f, const S &st) {
  using A = typename Elem<T>::A;
  if constexpr (K == MAX) {
    A v = p.kind == MIN ? -st.v : st.v;
    p.o[f.o] = Elem<T>::store(v);
    if (p.idx) p.idx[f.i] = st.i + 1;                /* 1-based, as the Lua API's dims */
  } else {
    A v = st.s;
    if (p.kind == MEAN) v = v / A(p.r.n);             /* 0 / 0: the mean of nothing is NaN */
    p.o[f.o] = Elem<T>::store(v);
  }
}

/* What the second pass needs from the statistic: two numbers. */
template <int K, typename T, typename S> __device__ void coefficients(const Args<T> &p, const S &st,
                                                                      typename Elem<T>::A *c) {
  using A = typename Elem<T>::A;
  if constexpr (K == SOFTMAX) {
    c[0] = st.m;
    c[1] = p.kind == LOG_SOFTMAX ? st.m + loga(st.s) : A(1) / st.s;
  } else if constexpr (K == LAYER_NORM) {
    c[0] = st.mean;
    c[1] = A(1) / sqrta(st.m2 / A(st.n) + A(p.eps));
  } else {
    c[0] = A(0);
    c[1] = A(1) / sqrta(st.s / A(p.r.n) + A(p.eps));
  }
}

template <int K, typename T> __device__ __forceinline__ typename Elem<T>::A
row_value(const Args<T> &p, typename Elem<T>::A x, int64_t j, const typename Elem<T>::A *c) {
  using A = typename Elem<T>::A;
  if constexpr (K == SOFTMAX) {
    return p.kind == LOG_SOFTMAX ? x - c[1] : expa(x - c[0]) * c[1];
  } else {
    A y = (x - c[0]) * c[1];
    if (p.w) y *= Elem<T>::load(p.w[j * p.ws]);
    if (p.b) y += Elem<T>::load(p.b[j * p.bs]);
    return y;
  }
}

template <typename T> __device__ __forceinline__ typename Elem<T>::A fold_input(const Args<T> &p, typename Elem<T>::A x) {
  return p.kind == MIN ? -x : x;
}

/* ==== rows with unit stride: a group of G threads per row (a warp, or the block) ==================== */
/* The group's statistic, the same in every thread of the group (lane 0's, broadcast). */
template <int G, typename S> __device__ S group_combine(S v) {
  for (int d = 16; d > 0; d >>= 1) v = S::combine(v, v.map(ShflDown{d}));
  v = v.map(ShflFrom{0});
  if constexpr (G > 32) {
    __shared__ S parts[G / 32];
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) parts[warp] = v;
    __syncthreads();
    v = parts[0];
    for (int k = 1; k < G / 32; k++) v = S::combine(v, parts[k]);
    __syncthreads();                                  /* parts is free for the next row */
  }
  return v;
}

template <typename T> struct alignas(16) Vec16 { T v[16 / sizeof(T)]; };

template <int K, typename T, int G>
__global__ void __launch_bounds__(kThreads) row_kernel(const __grid_constant__ Args<T> p) {
  using A = typename Elem<T>::A;
  using S = typename StatOf<K, A>::S;
  constexpr int V = 16 / sizeof(T), kGroups = kThreads / G;
  extern __shared__ __align__(16) unsigned char cache_bytes[];
  const int group = threadIdx.x / G, lane = threadIdx.x % G;
  const int64_t n = p.r.n;
  A *cache = p.cached ? (A *)cache_bytes + group * n : nullptr;
  for (int64_t row = (int64_t)blockIdx.x * kGroups + group; row < p.r.count; row += (int64_t)gridDim.x * kGroups) {
    Offsets f = offsets_of(p.r, row);
    const T *x = p.x + f.x;
    S st = S::init();
    if (p.vec) {
      for (int64_t j0 = (int64_t)lane * V; j0 < n; j0 += (int64_t)G * V) {
        Vec16<T> in = *(const Vec16<T> *)(x + j0);
#pragma unroll
        for (int q = 0; q < V; q++) {
          A a = Elem<T>::load(in.v[q]);
          if (cache) cache[j0 + q] = a;
          st.fold(fold_input(p, a), j0 + q);
        }
      }
    } else {
      for (int64_t j = lane; j < n; j += G) {
        A a = Elem<T>::load(x[j * p.r.xs]);
        if (cache) cache[j] = a;
        st.fold(fold_input(p, a), j);
      }
    }
    st = group_combine<G>(st);
    if constexpr (!kWritesRows<K>) {
      if (lane == 0) store_result<K>(p, f, st);
    } else {
      /* each thread reads back the cache entries it wrote itself: no barrier needed */
      A c[2];
      coefficients<K>(p, st, c);
      T *o = p.o + f.o;
      if (p.vec) {
        for (int64_t j0 = (int64_t)lane * V; j0 < n; j0 += (int64_t)G * V) {
          Vec16<T> in, out;
          if (!cache) in = *(const Vec16<T> *)(x + j0);
#pragma unroll
          for (int q = 0; q < V; q++)
            out.v[q] = Elem<T>::store(row_value<K>(p, cache ? cache[j0 + q] : Elem<T>::load(in.v[q]), j0 + q, c));
          *(Vec16<T> *)(o + j0) = out;
        }
      } else {
        for (int64_t j = lane; j < n; j += G)
          o[j * p.r.os] = Elem<T>::store(row_value<K>(p, cache ? cache[j] : Elem<T>::load(x[j * p.r.xs]), j, c));
      }
    }
  }
}

/* ==== strided rows: a thread per row, kColLanes threads along it ================================== */
template <int K, typename T>
__global__ void __launch_bounds__(kThreads) col_kernel(const __grid_constant__ Args<T> p) {
  using A = typename Elem<T>::A;
  using S = typename StatOf<K, A>::S;
  __shared__ S parts[kColLanes][kColRows];
  const int tx = threadIdx.x % kColRows, ty = threadIdx.x / kColRows;
  const int64_t n = p.r.n;
  for (int64_t tile = blockIdx.x; tile * kColRows < p.r.count; tile += gridDim.x) {
    int64_t row = tile * kColRows + tx;
    bool live = row < p.r.count;
    Offsets f = live ? offsets_of(p.r, row) : Offsets{0, 0, 0};
    S st = S::init();
    if (live) {
#pragma unroll 4                                        /* loads in flight: a thread walks a long row */
      for (int64_t j = ty; j < n; j += kColLanes) st.fold(fold_input(p, Elem<T>::load(p.x[f.x + j * p.r.xs])), j);
    }
    parts[ty][tx] = st;
    __syncthreads();
    if (ty == 0) {
      for (int k = 1; k < kColLanes; k++) st = S::combine(st, parts[k][tx]);
      parts[0][tx] = st;
    }
    __syncthreads();
    st = parts[0][tx];
    __syncthreads();                                  /* parts is free for the next tile */
    if (!live) continue;
    if constexpr (!kWritesRows<K>) {
      if (ty == 0) store_result<K>(p, f, st);
    } else {
      A c[2];
      coefficients<K>(p, st, c);
      for (int64_t j = ty; j < n; j += kColLanes)
        p.o[f.o + j * p.r.os] = Elem<T>::store(row_value<K>(p, Elem<T>::load(p.x[f.x + j * p.r.xs]), j, c));
    }
  }
}

/* ==== the host side =============================================================================== */
int launch_failed(const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return TPSH_OK;
  char call[96];
  snprintf(call, sizeof call, "%s kernel launch", what);
  return tpsh_cuda_fail(e, call);
}

/* The rows of the op: x = t[nw], o = t[0], indices t[1] when nw = 2. Outer dims of size 1 are dropped
 * and neighbours merged where all three tensors lay them out as one. */
Rows rows_of(const tpsh_kargs *k) {
  int nw = tpsh_kargs_writes(k);
  const tpsh_tensor *x = &k->t[nw], *o = &k->t[0], *ix = nw == 2 ? &k->t[1] : nullptr;
  Rows r;
  memset(&r, 0, sizeof r);
  int last = x->ndim - 1;
  r.n = x->sizes[last];
  r.xs = x->strides[last];
  r.os = o->strides[last];
  r.count = 1;
  for (int d = 0; d < last; d++) {
    int64_t sz = x->sizes[d], xs = x->strides[d], os = o->strides[d], is = ix ? ix->strides[d] : 0;
    r.count *= sz;
    if (sz == 1) continue;
    int m = r.nd - 1;
    if (m >= 0 && r.x[m] == xs * sz && r.o[m] == os * sz && r.i[m] == is * sz) {
      r.size[m] *= sz;
      r.x[m] = xs;
      r.o[m] = os;
      r.i[m] = is;
    } else {
      r.size[r.nd] = sz;
      r.x[r.nd] = xs;
      r.o[r.nd] = os;
      r.i[r.nd] = is;
      r.nd++;
    }
  }
  return r;
}

/* Whether every row of t (at data, strides rows) starts on 16 bytes and holds whole 16-byte vectors. */
bool rows_aligned(const void *data, const Rows &r, const int64_t *outer, int64_t es) {
  if ((uintptr_t)data % 16 || (r.n * es) % 16) return false;
  for (int d = 0; d < r.nd; d++)
    if ((outer[d] * es) % 16) return false;
  return true;
}

unsigned grid_for(int64_t units) {
  int64_t cap = (int64_t)(tpsh_cuda_dev.sm_count > 0 ? tpsh_cuda_dev.sm_count : 1) * 8;
  return (unsigned)(units < 1 ? 1 : units < cap ? units : cap);
}

template <int K, typename T> int launch(cudaStream_t st, const tpsh_kargs *k, Args<T> &p) {
  const Rows &r = p.r;
  if (r.xs == 1 || r.n <= 1) {
    using A = typename Elem<T>::A;
    bool warp = r.n <= 1024;
    int groups = warp ? kThreads / 32 : 1;
    size_t cache = (size_t)groups * (size_t)r.n * sizeof(A);
    p.cached = kWritesRows<K> && cache <= kCacheBytes;
    p.vec = r.xs == 1 && rows_aligned(p.x, r, r.x, sizeof(T)) &&
            (!kWritesRows<K> || (r.os == 1 && rows_aligned(p.o, r, r.o, sizeof(T))));
    unsigned grid = grid_for((r.count + groups - 1) / groups);
    size_t shmem = p.cached ? cache : 0;
    if (warp) row_kernel<K, T, 32><<<grid, kThreads, shmem, st>>>(p);
    else row_kernel<K, T, kThreads><<<grid, kThreads, shmem, st>>>(p);
  } else {
    col_kernel<K, T><<<grid_for((r.count + kColRows - 1) / kColRows), kThreads, 0, st>>>(p);
  }
  return launch_failed(k->name ? k->name : "reduce");
}

template <typename T> int run(cudaStream_t st, const tpsh_kargs *k) {
  Args<T> p;
  memset(&p, 0, sizeof p);
  p.r = rows_of(k);
  if (p.r.count == 0) return TPSH_OK;
  int nw = tpsh_kargs_writes(k);
  p.x = (const T *)k->data[nw];
  p.o = (T *)k->data[0];
  switch (k->op) {
  case TPSH_K_REDUCE:
    if (p.r.n == 0 && (k->i[0] == TPSH_MAX || k->i[0] == TPSH_MIN))
      return tpsh_error(TPSH_EINVAL, "%s: the max or min of no elements", k->name);
    if (k->i[0] == TPSH_MAX || k->i[0] == TPSH_MIN) {
      p.kind = k->i[0] == TPSH_MAX ? MAX : MIN;
      p.idx = nw == 2 ? (long long *)k->data[1] : nullptr;
      return launch<MAX>(st, k, p);
    }
    p.kind = k->i[0] == TPSH_AVG ? MEAN : SUM;
    return launch<SUM>(st, k, p);
  case TPSH_K_SOFTMAX:
    if (p.r.n == 0) return TPSH_OK;
    p.kind = k->i[0] == 1 ? LOG_SOFTMAX : SOFTMAX;
    return launch<SOFTMAX>(st, k, p);
  default: {
    if (p.r.n == 0) return TPSH_OK;
    int ws = (int)k->i[1], bs = (int)k->i[2];
    p.w = ws > 0 ? (const T *)k->data[ws] : nullptr;
    p.b = bs > 0 ? (const T *)k->data[bs] : nullptr;
    p.ws = ws > 0 ? k->t[ws].strides[0] : 0;
    p.bs = bs > 0 ? k->t[bs].strides[0] : 0;
    p.eps = k->s[0];
    if (k->i[0] == 1) {
      p.kind = RMS_NORM;
      return launch<RMS_NORM>(st, k, p);
    }
    p.kind = LAYER_NORM;
    return launch<LAYER_NORM>(st, k, p);
  }
  }
}

} /* namespace */

extern "C" int tpsh_cuda_reduce(cudaStream_t st, const tpsh_kargs *k) {
  switch (k->t[tpsh_kargs_writes(k)].dtype_id) {
  case TPSH_F32: return run<float>(st, k);
  case TPSH_F64: return run<double>(st, k);
  case TPSH_F16: return run<__half>(st, k);
  case TPSH_BF16: return run<__nv_bfloat16>(st, k);
  default: return tpsh_error(TPSH_EINVAL, "%s: expected a float dtype", k->name ? k->name : "reduce");
  }
}

/* this file's module, which cuda_modules.c loads whole at start-up */
TPSH_CUDA_MODULE_ANCHOR(tpsh_cuda_reduce_module)
