/*
 * pointwise_formulas.h: the rows of pointwise.h as functions of one float type, included by it twice:
 * with PW_T float (math functions PW_M(exp) = expf, names PW_NAME(tpsh_unary) = tpsh_unary_f32) and
 * with PW_T double (exp, tpsh_unary_f64). No include guard on purpose.
 */

/* 1 / sqrt(x): CUDA's rsqrt on the device, as PyTorch's; the host has none */
TPSH_PW_FN PW_T PW_NAME(tpsh_pw_rsqrt)(PW_T x) {
#ifdef __CUDA_ARCH__
  return PW_M(rsqrt)(x);
#else
  return (PW_T)1 / PW_M(sqrt)(x);
#endif
}

/* pow by a number: the exponents with an exact or cheaper form take it, as in PyTorch's kernels
 * (pow_tensor_scalar_optimized_kernel) */
TPSH_PW_FN PW_T PW_NAME(tpsh_pw_pow)(PW_T x, PW_T p) {
  if (p == (PW_T)2) return x * x;
  if (p == (PW_T)3) return x * x * x;
  if (p == (PW_T)0.5) return PW_M(sqrt)(x);
  if (p == (PW_T)-0.5) return PW_NAME(tpsh_pw_rsqrt)(x);
  if (p == (PW_T)-1) return (PW_T)1 / x;
  if (p == (PW_T)-2) return (PW_T)1 / (x * x);
  return PW_M(pow)(x, p);
}

/* d gelu(x) / dx = cdf(x) + x pdf(x) (the erf form) */
TPSH_PW_FN PW_T PW_NAME(tpsh_pw_gelu_grad)(PW_T x) {
  PW_T cdf = (PW_T)0.5 * ((PW_T)1 + PW_M(erf)(x * (PW_T)0.70710678118654752440));
  PW_T pdf = PW_M(exp)((PW_T)-0.5 * x * x) * (PW_T)0.39894228040143267794;   /* 1 / sqrt(2 pi) */
  return cdf + x * pdf;
}

/* d gelu_tanh(x) / dx, in PyTorch's steps */
TPSH_PW_FN PW_T PW_NAME(tpsh_pw_gelu_tanh_grad)(PW_T x) {
  const PW_T beta = (PW_T)0.79788456080286535588, kappa = (PW_T)0.044715;   /* sqrt(2 / pi) */
  PW_T x_sq = x * x, x_cube = x_sq * x;
  PW_T tanh_inner = PW_M(tanh)(beta * (x + kappa * x_cube));
  PW_T left = (PW_T)0.5 * x, right = (PW_T)1 + tanh_inner;
  PW_T left_derivative = (PW_T)0.5 * right;
  PW_T tanh_derivative = (PW_T)1 - tanh_inner * tanh_inner;
  PW_T inner_derivative = beta * ((PW_T)1 + (PW_T)3 * kappa * x_sq);
  return left_derivative + left * tanh_derivative * inner_derivative;
}

#define TPSH_PW_CASE(id, name, ints, f, i) case id: return (f);
TPSH_PW_FN PW_T PW_NAME(tpsh_unary)(int op, PW_T x, PW_T p) {
  (void)p;
  switch (op) { TPSH_UNARY_OPS(TPSH_PW_CASE) }
  return x;
}

TPSH_PW_FN PW_T PW_NAME(tpsh_binary)(int op, PW_T a, PW_T b) {
  switch (op) { TPSH_BINARY_OPS(TPSH_PW_CASE) }
  return a;
}
#undef TPSH_PW_CASE
