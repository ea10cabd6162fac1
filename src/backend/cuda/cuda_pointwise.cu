/*
 * cuda_pointwise.cu: TPSH_K_UNARY and TPSH_K_BINARY on the GPU: the formulas of core/pointwise.h, in its
 * compute types (f32 for f32, f16 and bf16, as PyTorch's opmath; f64; int64 for integers).
 *
 * Three kernels. The dense one takes a launch whose operands are contiguous, of the output's dtype and
 * 16-byte aligned (every tensor the allocator makes is): a grid-stride loop over 16-byte vectors (4 f32,
 * 8 f16 or bf16, 2 f64 a vector), kUnroll vectors a thread an iteration with their loads issued first
 * (bytes in flight are what a memory-bound kernel needs), the op a template argument so that its
 * formula is inlined; the last n % (elements a vector) by one element each. The row kernel takes a
 * contiguous operand with a row broadcast along its leading dims (a bias: add, sub, mul, div of floats)
 * in the same vectors. The strided one takes the rest (another broadcast, a transposed operand, an
 * integer divided into f32, a misaligned view): the
 * dimensions merged where they are contiguous in every operand, the linear index decoded per operand
 * in 32-bit arithmetic when the count allows, the outermost dimension without a division, the op and
 * the dtypes runtime switches (uniform across a launch). f16 is read with the hardware's conversion
 * (exact; a NaN's payload is not kept, which no op promises); stores round as the CPU does
 * (cuda_elementwise.cuh).
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_elementwise.cuh"
#include <string.h>

namespace {

constexpr int kUnroll = 2;
constexpr int kDims = 8;

/* ==== element types: the compute type, loads and stores ========================================== */
struct f16_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };

template <typename S> struct Elt;
template <> struct Elt<float> {
  using C = float;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float c) { return c; }
};
template <> struct Elt<double> {
  using C = double;
  static __device__ __forceinline__ double load(double v) { return v; }
  static __device__ __forceinline__ double store(double c) { return c; }
};
template <> struct Elt<f16_t> {
  using C = float;
  static __device__ __forceinline__ float load(f16_t v) { return __half2float(__ushort_as_half(v.bits)); }
  static __device__ __forceinline__ f16_t store(float c) { return f16_t{float_to_half(c)}; }
};
template <> struct Elt<bf16_t> {
  using C = float;
  static __device__ __forceinline__ float load(bf16_t v) { return bf16_to_float(v.bits); }
  static __device__ __forceinline__ bf16_t store(float c) { return bf16_t{float_to_bf16(c)}; }
};
/* integers compute in int64 and wrap to their width when stored (unsigned conversions: defined) */
template <typename I> struct EltInt {
  using C = int64_t;
  static __device__ __forceinline__ int64_t load(I v) { return (int64_t)v; }
  static __device__ __forceinline__ I store(int64_t c) { return (I)(uint64_t)c; }
};
template <> struct Elt<int32_t> : EltInt<int32_t> {};
template <> struct Elt<int64_t> : EltInt<int64_t> {};
template <> struct Elt<uint8_t> : EltInt<uint8_t> {};

/* the table's formulas by compute type (integer ops take no number) */
__device__ __forceinline__ float unary_of(int op, float x, float p) { return tpsh_unary_f32(op, x, p); }
__device__ __forceinline__ double unary_of(int op, double x, double p) { return tpsh_unary_f64(op, x, p); }
__device__ __forceinline__ int64_t unary_of(int op, int64_t x, int64_t) { return tpsh_unary_i64(op, x); }
__device__ __forceinline__ float binary_of(int op, float a, float b) { return tpsh_binary_f32(op, a, b); }
__device__ __forceinline__ double binary_of(int op, double a, double b) { return tpsh_binary_f64(op, a, b); }
__device__ __forceinline__ int64_t binary_of(int op, int64_t a, int64_t b) { return tpsh_binary_i64(op, a, b); }

template <bool Binary, typename C>
__device__ __forceinline__ C apply(int op, C a, C b, C p) {
  if constexpr (Binary) return binary_of(op, a, b);
  else return unary_of(op, a, p);
}

/* ==== the dense kernel ============================================================================= */
template <typename S> struct alignas(16) Vec { S v[16 / sizeof(S)]; };

/* o[j] = f(a[j], b[j]) for j < n (unary: b is a, unused); o may be a or b (the same view: each element
 * is read, then written, by one thread) */
template <typename S, bool Binary, int Op>
__global__ void __launch_bounds__(kThreads) pw_dense(S *o, const S *a, const S *b, int64_t n, typename Elt<S>::C p) {
  using E = Elt<S>;
  using V = Vec<S>;
  constexpr int kLanes = 16 / sizeof(S);
  const int64_t nv = n / kLanes, step = (int64_t)gridDim.x * blockDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  V *ov = reinterpret_cast<V *>(o);
  const V *av = reinterpret_cast<const V *>(a), *bv = reinterpret_cast<const V *>(b);
  int64_t i = first;
  for (; i + (kUnroll - 1) * step < nv; i += kUnroll * step) {
    V x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      x[u] = av[i + u * step];
      if constexpr (Binary) y[u] = bv[i + u * step];
      else y[u] = x[u];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
#pragma unroll
      for (int l = 0; l < kLanes; l++)
        x[u].v[l] = E::store(apply<Binary>(Op, E::load(x[u].v[l]), E::load(y[u].v[l]), p));
      ov[i + u * step] = x[u];
    }
  }
  for (; i < nv; i += step) {
    V x = av[i], y;
    if constexpr (Binary) y = bv[i];
    else y = x;
#pragma unroll
    for (int l = 0; l < kLanes; l++) x.v[l] = E::store(apply<Binary>(Op, E::load(x.v[l]), E::load(y.v[l]), p));
    ov[i] = x;
  }
  int64_t j = nv * kLanes + first;                   /* fewer than kLanes elements are left */
  if (j < n) o[j] = E::store(apply<Binary>(Op, E::load(a[j]), E::load(b[j]), p));
}

template <typename S, bool Binary, int Op>
int launch_dense(cudaStream_t st, void *o, const void *a, const void *b, int64_t n, double p, const char *what) {
  using C = typename Elt<S>::C;
  S *o_ = (S *)o;
  const S *a_ = (const S *)a, *b_ = (const S *)b;
  C p_ = (C)p;
  int64_t nv = n / (16 / (int64_t)sizeof(S));
  unsigned grid = grid_for((nv + kUnroll - 1) / kUnroll, 2048 / kThreads);   /* one resident wave at most */
  if (driver_launched<pw_dense<S, Binary, Op>>(grid, st, o_, a_, b_, n, p_)) return TPSH_OK;
  pw_dense<S, Binary, Op><<<grid, kThreads, 0, st>>>(o_, a_, b_, n, p_);
  return launch_failed(what);
}

/* the op's dense kernel for dtype dt; -1: none (the strided kernel takes it) */
template <bool Binary, int Op, bool Ints>
int dense_for(int dt, cudaStream_t st, void *o, const void *a, const void *b, int64_t n, double p, const char *what) {
  switch (dt) {
  case TPSH_F32: return launch_dense<float, Binary, Op>(st, o, a, b, n, p, what);
  case TPSH_F64: return launch_dense<double, Binary, Op>(st, o, a, b, n, p, what);
  case TPSH_F16: return launch_dense<f16_t, Binary, Op>(st, o, a, b, n, p, what);
  case TPSH_BF16: return launch_dense<bf16_t, Binary, Op>(st, o, a, b, n, p, what);
  default: break;
  }
  if constexpr (Ints) {
    switch (dt) {
    case TPSH_I32: return launch_dense<int32_t, Binary, Op>(st, o, a, b, n, p, what);
    case TPSH_I64: return launch_dense<int64_t, Binary, Op>(st, o, a, b, n, p, what);
    case TPSH_U8: return launch_dense<uint8_t, Binary, Op>(st, o, a, b, n, p, what);
    default: break;
    }
  }
  return -1;
}

int dense(bool binary, int op, int dt, cudaStream_t st, void *o, const void *a, const void *b, int64_t n, double p,
          const char *what) {
#define UNARY_DENSE(id, name, ints, ...) case id: return dense_for<false, id, ints>(dt, st, o, a, b, n, p, what);
#define BINARY_DENSE(id, name, ints, ...) case id: return dense_for<true, id, ints>(dt, st, o, a, b, n, p, what);
  if (binary) switch (op) { TPSH_BINARY_OPS(BINARY_DENSE) }
  else switch (op) { TPSH_UNARY_OPS(UNARY_DENSE) }
#undef UNARY_DENSE
#undef BINARY_DENSE
  return -1;
}

/* ==== a row broadcast ================================================================================ */
/* o = f(x, row) or f(row, x) (row_first) with o and x contiguous [R, L] and row one [L] read by every
 * row (stride 0 along the leading dims: a bias, a scale), L a multiple of a vector: the dense kernel's
 * 16-byte vectors of x and o, the row's vector at the index modulo L's vectors, read through the
 * read-only cache (it stays there: L is small next to x). The strided kernel decoded both operands'
 * offsets per element (0.53x PyTorch's bf16 bias add on the H100). 32-bit indices (n < 2^31). */
template <typename S> __device__ __forceinline__ Vec<S> load_cached(const Vec<S> *p) {
  uint4 u = __ldg(reinterpret_cast<const uint4 *>(p));
  Vec<S> v;
  memcpy(&v, &u, sizeof v);
  return v;
}

template <typename S, int Op>
__global__ void __launch_bounds__(kThreads) pw_row(S *o, const S *x, const S *row, uint32_t nv, uint32_t lv,
                                                   bool row_first) {
  using E = Elt<S>;
  using V = Vec<S>;
  constexpr int kLanes = 16 / sizeof(S);
  const uint32_t step = gridDim.x * blockDim.x;
  V *ov = reinterpret_cast<V *>(o);
  const V *xv = reinterpret_cast<const V *>(x), *rv = reinterpret_cast<const V *>(row);
  auto f = [&](const V &a, const V &r, V &out) {
#pragma unroll
    for (int l = 0; l < kLanes; l++) {
      typename E::C u = E::load(a.v[l]), w = E::load(r.v[l]);
      out.v[l] = E::store(binary_of(Op, row_first ? w : u, row_first ? u : w));
    }
  };
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * step < nv; i += kUnroll * step) {
    V a[kUnroll], r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      a[u] = xv[i + u * step];
      r[u] = load_cached(rv + (i + u * step) % lv);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      f(a[u], r[u], a[u]);
      ov[i + u * step] = a[u];
    }
  }
  for (; i < nv; i += step) {
    V a = xv[i];
    f(a, load_cached(rv + i % lv), a);
    ov[i] = a;
  }
}

template <typename S, int Op>
int launch_row(cudaStream_t st, void *o, const void *x, const void *row, int64_t n, int64_t len, bool row_first,
               const char *what) {
  constexpr int64_t kLanes = 16 / sizeof(S);
  uint32_t nv = (uint32_t)(n / kLanes), lv = (uint32_t)(len / kLanes);
  S *o_ = (S *)o;
  const S *x_ = (const S *)x, *r_ = (const S *)row;
  unsigned grid = grid_for((nv + kUnroll - 1) / kUnroll, 2048 / kThreads);
  if (driver_launched<pw_row<S, Op>>(grid, st, o_, x_, r_, nv, lv, row_first)) return TPSH_OK;
  pw_row<S, Op><<<grid, kThreads, 0, st>>>(o_, x_, r_, nv, lv, row_first);
  return launch_failed(what);
}

/* the ops and dtypes a row broadcast takes this way (the ones of a bias or a scale) */
#define TPSH_ROW_OPS(X) X(TPSH_B_ADD) X(TPSH_B_SUB) X(TPSH_B_MUL) X(TPSH_B_DIV)

template <int Op>
int row_for(int dt, cudaStream_t st, void *o, const void *x, const void *row, int64_t n, int64_t len, bool row_first,
            const char *what) {
  switch (dt) {
  case TPSH_F32: return launch_row<float, Op>(st, o, x, row, n, len, row_first, what);
  case TPSH_F64: return launch_row<double, Op>(st, o, x, row, n, len, row_first, what);
  case TPSH_F16: return launch_row<f16_t, Op>(st, o, x, row, n, len, row_first, what);
  case TPSH_BF16: return launch_row<bf16_t, Op>(st, o, x, row, n, len, row_first, what);
  default: return -1;
  }
}

/* ==== the strided kernel =========================================================================== */
struct Strided {
  char *p[3];                   /* element 0 of the output and the operands */
  int32_t dt[3], ndim;
  int64_t size[kDims];          /* merged dimensions, the innermost last */
  int64_t stride[3][kDims];     /* bytes */
};

template <typename C> __device__ __forceinline__ C load_as(const char *p, int dt);
template <> __device__ __forceinline__ float load_as<float>(const char *p, int dt) {
  switch (dt) {
  case TPSH_F32: return *(const float *)p;
  case TPSH_F16: return __half2float(__ushort_as_half(*(const uint16_t *)p));
  case TPSH_BF16: return bf16_to_float(*(const uint16_t *)p);
  case TPSH_I32: return (float)*(const int32_t *)p;              /* integers divided into f32 */
  case TPSH_I64: return (float)*(const int64_t *)p;
  default: return (float)*(const uint8_t *)p;
  }
}
template <> __device__ __forceinline__ double load_as<double>(const char *p, int) { return *(const double *)p; }
template <> __device__ __forceinline__ int64_t load_as<int64_t>(const char *p, int dt) {
  switch (dt) {
  case TPSH_I32: return *(const int32_t *)p;
  case TPSH_I64: return *(const int64_t *)p;
  default: return *(const uint8_t *)p;
  }
}

__device__ __forceinline__ void store_from(char *p, int dt, float v) {
  switch (dt) {
  case TPSH_F32: *(float *)p = v; break;
  case TPSH_F16: *(uint16_t *)p = float_to_half(v); break;
  default: *(uint16_t *)p = float_to_bf16(v); break;
  }
}
__device__ __forceinline__ void store_from(char *p, int, double v) { *(double *)p = v; }
__device__ __forceinline__ void store_from(char *p, int dt, int64_t v) {
  switch (dt) {
  case TPSH_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)v; break;
  case TPSH_I64: *(int64_t *)p = v; break;
  default: *(uint8_t *)p = (uint8_t)(uint64_t)v; break;
  }
}

template <typename C, typename I, bool Binary>
__global__ void __launch_bounds__(kThreads) pw_strided(const __grid_constant__ Strided d, I n, int op, C p) {
  const int nt = Binary ? 3 : 2;
  I step = (I)gridDim.x * blockDim.x;
  for (I j = (I)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += step) {
    int64_t off[3] = {0, 0, 0};
    I rest = j;
#pragma unroll
    for (int k = kDims - 1; k > 0; k--) {
      if (k < d.ndim) {
        I s = (I)d.size[k], q = rest / s;
        int64_t r = (int64_t)(rest - q * s);
#pragma unroll
        for (int t = 0; t < nt; t++) off[t] += r * d.stride[t][k];
        rest = q;
      }
    }
#pragma unroll
    for (int t = 0; t < nt; t++) off[t] += (int64_t)rest * d.stride[t][0];   /* the outermost: no division */
    C a = load_as<C>(d.p[1] + off[1], d.dt[1]);
    C b = Binary ? load_as<C>(d.p[2] + off[2], d.dt[2]) : a;
    store_from(d.p[0] + off[0], d.dt[0], apply<Binary>(op, a, b, p));
  }
}

template <typename C, bool Binary>
int launch_strided(cudaStream_t st, const Strided &d, int64_t n, int op, double p, const char *what) {
  unsigned grid = grid_for(n, 16);
  C p_ = (C)p;
  if (small_index(n)) {
    uint32_t n32 = (uint32_t)n;
    if (driver_launched<pw_strided<C, uint32_t, Binary>>(grid, st, d, n32, op, p_)) return TPSH_OK;
    pw_strided<C, uint32_t, Binary><<<grid, kThreads, 0, st>>>(d, n32, op, p_);
  } else {
    if (driver_launched<pw_strided<C, int64_t, Binary>>(grid, st, d, n, op, p_)) return TPSH_OK;
    pw_strided<C, int64_t, Binary><<<grid, kThreads, 0, st>>>(d, n, op, p_);
  }
  return launch_failed(what);
}

/* The operands' dims merged where contiguous in all of them (size-1 dims dropped): the CPU iterator's
 * rule (cpu_elem.h), which keeps the elements' row-major pairing. */
Strided merge(const tpsh_kargs *k, int nt) {
  Strided d;
  memset(&d, 0, sizeof d);
  const tpsh_tensor *t0 = &k->t[0];
  for (int t = 0; t < 3; t++) {
    int i = t < nt ? t : nt - 1;
    d.p[t] = (char *)k->data[i];
    d.dt[t] = k->t[i].dtype_id;
  }
  for (int dim = 0; dim < t0->ndim; dim++) {
    int64_t sz = t0->sizes[dim];
    if (sz == 1) continue;
    bool join = d.ndim > 0;
    for (int t = 0; t < nt && join; t++)
      join = d.stride[t][d.ndim - 1] == k->t[t].strides[dim] * elsize(d.dt[t]) * sz;
    int at = join ? d.ndim - 1 : d.ndim;
    for (int t = 0; t < nt; t++) d.stride[t][at] = k->t[t].strides[dim] * elsize(d.dt[t]);
    if (join) d.size[at] *= sz;
    else { d.size[at] = sz; d.ndim++; }
  }
  if (d.ndim == 0) { d.ndim = 1; d.size[0] = 1; }   /* one element */
  return d;
}

/* The row kernel's launch where d is [R, L]: the output and one operand contiguous, the other stride 0
 * along R and unit along L, L a multiple of a vector, one float dtype, 16-byte aligned, n < 2^31; -1
 * where it is not (the strided kernel takes it). */
int row_broadcast(int op, const Strided &d, cudaStream_t st, int64_t n, const char *what) {
  int dt = d.dt[0];
  int64_t es = elsize(dt), len = d.size[1];
  if (d.ndim != 2 || !small_index(n) || len % (16 / es) != 0) return -1;
  auto dense2 = [&](int t) { return d.stride[t][1] == es && d.stride[t][0] == len * es; };
  auto row2 = [&](int t) { return d.stride[t][1] == es && d.stride[t][0] == 0; };
  if (!dense2(0)) return -1;
  int r = dense2(1) && row2(2) ? 2 : dense2(2) && row2(1) ? 1 : 0;
  if (!r) return -1;
  const char *x = d.p[3 - r], *row = d.p[r];
#define ROW_CASE(id) case id: return row_for<id>(dt, st, d.p[0], x, row, n, len, r == 1, what);
  switch (op) { TPSH_ROW_OPS(ROW_CASE) }
#undef ROW_CASE
  return -1;
}

} /* namespace */

/* ==== entry point =================================================================================== */
extern "C" int tpsh_cuda_pointwise(cudaStream_t st, const tpsh_kargs *k) {
  bool binary = k->op == TPSH_K_BINARY;
  int op = (int)k->i[0], nt = binary ? 3 : 2;
  if (op < 0 || op >= (binary ? (int)TPSH_B_COUNT : (int)TPSH_U_COUNT))
    return tpsh_error(TPSH_EINVAL, "%s: unknown element-wise op %d", k->name, op);
  const tpsh_tensor *t0 = &k->t[0];
  int64_t n = 1;
  for (int d = 0; d < t0->ndim; d++) n *= t0->sizes[d];
  for (int i = 1; i < nt; i++) {
    bool same = k->t[i].ndim == t0->ndim;
    for (int d = 0; same && d < t0->ndim; d++) same = k->t[i].sizes[d] == t0->sizes[d];
    if (!same) return tpsh_error(TPSH_EINVAL, "%s: operand %d does not have the output's shape", k->name, i);
  }
  if (n == 0) return TPSH_OK;
  Strided d = merge(k, nt);
  int dt = d.dt[0];
  bool one_dtype = d.dt[1] == dt && d.dt[2] == dt, aligned = true, contiguous = d.ndim == 1;
  for (int t = 0; t < 3; t++) {
    aligned = aligned && ((uintptr_t)d.p[t] & 15) == 0;
    contiguous = contiguous && (t >= nt || d.stride[t][0] == elsize(dt));
  }
  if (one_dtype && aligned && contiguous) {
    int rc = dense(binary, op, dt, st, d.p[0], d.p[1], d.p[2], n, k->s[0], k->name);
    if (rc >= 0) return rc;
  }
  if (binary && one_dtype && aligned) {
    int rc = row_broadcast(op, d, st, n, k->name);
    if (rc >= 0) return rc;
  }
  if (dt == TPSH_F64) return binary ? launch_strided<double, true>(st, d, n, op, k->s[0], k->name)
                         : launch_strided<double, false>(st, d, n, op, k->s[0], k->name);
  if (is_float(dt)) return binary ? launch_strided<float, true>(st, d, n, op, k->s[0], k->name)
                        : launch_strided<float, false>(st, d, n, op, k->s[0], k->name);
  return binary ? launch_strided<int64_t, true>(st, d, n, op, k->s[0], k->name)
                : launch_strided<int64_t, false>(st, d, n, op, k->s[0], k->name);
}

/* this file's module, which cuda_modules.c loads whole at start-up */
TPSH_CUDA_MODULE_ANCHOR(tpsh_cuda_pointwise_module)
