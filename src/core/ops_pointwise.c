/*
 * ops_pointwise.c: the front doors of the element-wise ops: broadcasting, the checks every element-wise
 * op shares (tpsh_elementwise_args, also add, mul and scale's in ops.c), t:expand, and the unary and
 * binary ops of core/pointwise.h's table.
 *
 * Broadcasting is decided here, once, for both backends, with PyTorch's rules: shapes are aligned from
 * their last dimension, and a size 1 or a missing leading dimension repeats. The operands are then
 * expanded to the output's shape as views whose stride is 0 along what they repeat (descriptors on the
 * stack, as tpsh_cat's pieces: the launch copies them), so that a kernel sees operands of the output's
 * shape with strides, as it sees a transposed view, and needs nothing of its own for broadcasting.
 */
#include "core/backend.h"
#include "core/internal.h"
#include "core/ops_check.h"
#include <string.h>

/* ==== broadcasting ================================================================================== */
/* The broadcast shape of a and b (b NULL: a's) into sizes; its ndim, or -1 with the message set. */
static int broadcast_sizes(const tpsh_tensor *a, const tpsh_tensor *b, int64_t *sizes) {
  if (!b) {
    memcpy(sizes, a->sizes, (size_t)a->ndim * sizeof *sizes);
    return a->ndim;
  }
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int i = 1; i <= n; i++) {                    /* i-th dimension from the end */
    int64_t x = i <= a->ndim ? a->sizes[a->ndim - i] : 1, y = i <= b->ndim ? b->sizes[b->ndim - i] : 1;
    if (x != y && x != 1 && y != 1) {
      char sa[160], sb[160];
      tpsh_error(TPSH_EINVAL, "shapes %s and %s do not broadcast (dimension %d from the end: %lld against %lld)",
                 tpsh_shape_str(a, sa, sizeof sa), tpsh_shape_str(b, sb, sizeof sb), i, (long long)x, (long long)y);
      return -1;
    }
    sizes[n - i] = x == 1 ? y : x;
  }
  return n;
}

/* t seen with the shape (ndim, sizes), which t broadcasts to: stride 0 along a dimension it repeats. */
static tpsh_tensor expanded(const tpsh_tensor *t, int ndim, const int64_t *sizes) {
  tpsh_tensor e = *t;
  e.ndim = ndim;
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++) {
    e.sizes[d] = sizes[d];
    e.strides[d] = d < lead || t->sizes[d - lead] != sizes[d] ? 0 : t->strides[d - lead];
  }
  return e;
}

/* in may be written over as out is written only where it is the same view of out after the expansion;
 * otherwise the check of their memory is the one of an operand (ops_check.h), on in as given (an
 * expanded view is not dense, and the check could tell nothing) */
static int check_operand_overlap(const char *what, const tpsh_tensor *out, const tpsh_tensor *in,
                                 const tpsh_tensor *in_expanded) {
  if (in->storage != out->storage || same_view(out, in_expanded)) return TPSH_OK;
  return check_no_partial_overlap(what, out, in);
}

int tpsh_elementwise_args(tpsh_kargs *k, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b, int out_dtype) {
  if (b) CHECK(check_tensors(3, (const tpsh_tensor *[]){out, a, b}, (const char *[]){"output", "first operand",
                                                                                   "second operand"}));
  else CHECK(check_tensors(2, (const tpsh_tensor *[]){out, a}, (const char *[]){"output", "operand"}));
  if (b) CHECK(check_same_dtype("second operand", a, b));
  int64_t sizes[TPSH_MAX_DIMS];
  int ndim = broadcast_sizes(a, b, sizes);
  if (ndim < 0) return TPSH_EINVAL;
  tpsh_tensor shape = {.ndim = ndim};
  memcpy(shape.sizes, sizes, (size_t)ndim * sizeof *sizes);
  if (!same_shape(&shape, out)) {
    char so[160], sr[160], sa[160], sb[160];
    if (!b) return check_same_shape("output", a, out);
    return tpsh_error(TPSH_EINVAL, "output with shape %s does not match the broadcast shape %s (of %s and %s)",
                      tpsh_shape_str(out, so, sizeof so), tpsh_shape_str(&shape, sr, sizeof sr),
                      tpsh_shape_str(a, sa, sizeof sa), tpsh_shape_str(b, sb, sizeof sb));
  }
  if (out_dtype < 0) out_dtype = a->dtype_id;
  if (out->dtype_id != out_dtype)
    return tpsh_error(TPSH_EINVAL, "output: expected dtype %s%s, got %s", tpsh_dtype_name(out_dtype),
                      out_dtype != a->dtype_id ? " (integers divide into f32)" : "", tpsh_dtype_name(out->dtype_id));
  CHECK(check_writable("output", out));
  tpsh_tensor ea = expanded(a, ndim, sizes), eb = b ? expanded(b, ndim, sizes) : ea;
  CHECK(check_operand_overlap(b ? "first operand" : "operand", out, a, &ea));
  if (b) CHECK(check_operand_overlap("second operand", out, b, &eb));
  tpsh_kargs_set(k, 0, out);
  tpsh_kargs_set(k, 1, &ea);
  if (b) tpsh_kargs_set(k, 2, &eb);
  return TPSH_OK;
}

int tpsh_tensor_init_broadcast(tpsh_tensor *dst, const tpsh_tensor *a, const tpsh_tensor *b, int dtype, tpsh_stream *s) {
  if (!a) return tpsh_error(TPSH_EINVAL, "expected a tensor");
  int64_t sizes[TPSH_MAX_DIMS];
  int ndim = broadcast_sizes(a, b, sizes);
  if (ndim < 0) return TPSH_EINVAL;
  return tpsh_tensor_init_empty(dst, ndim, sizes, dtype < 0 ? a->dtype_id : dtype, s);
}

tpsh_tensor *tpsh_tensor_expand(const tpsh_tensor *t, int ndim, const int64_t *sizes) {
  if (tpsh_check_tensor("expand", t)) return NULL;
  char from[160], to[160];
  if (ndim < t->ndim || ndim > TPSH_MAX_DIMS)
    return tpsh_error_null(TPSH_EINVAL, "cannot expand a tensor of shape %s to %d dimensions (at least %d, at most %d)",
                           tpsh_shape_str(t, from, sizeof from), ndim, t->ndim, TPSH_MAX_DIMS);
  int64_t want[TPSH_MAX_DIMS];
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++) {
    int64_t have = d < lead ? -1 : t->sizes[d - lead];
    want[d] = sizes[d] == -1 && have >= 0 ? have : sizes[d];
    if (want[d] < 0 || (have >= 0 && have != 1 && want[d] != have))
      return tpsh_error_null(TPSH_EINVAL, "cannot expand shape %s to %s: dimension %d %s", tpsh_shape_str(t, from, sizeof from),
                             tpsh_sizes_str(ndim, sizes, to, sizeof to), d + 1,
                             want[d] < 0 ? (have < 0 ? "is new and needs a size >= 0 (-1 keeps an existing one only)"
                                                     : "needs a size >= 0 or -1")
                                         : "has a size other than 1, which does not repeat");
  }
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++)
    if (__builtin_mul_overflow(numel, want[d], &numel))          /* as tpsh_tensor_view refuses it */
      return tpsh_error_null(TPSH_EINVAL, "cannot expand shape %s to %s: more than 2^63 elements",
                             tpsh_shape_str(t, from, sizeof from), tpsh_sizes_str(ndim, want, to, sizeof to));
  tpsh_tensor e = expanded(t, ndim, want);
  return tpsh_tensor_as_strided(t, ndim, e.sizes, e.strides, t->offset);
}

/* ==== the ops of the table ========================================================================== */
#define TPSH_PW_NAME(id, name, ...) [id] = name,
static const char *const unary_names[TPSH_U_COUNT] = {TPSH_UNARY_OPS(TPSH_PW_NAME)};
static const char *const binary_names[TPSH_B_COUNT] = {TPSH_BINARY_OPS(TPSH_PW_NAME)};
#undef TPSH_PW_NAME

static int find(const char *const *names, int n, const char *name) {
  for (int i = 0; name && i < n; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

int tpsh_unary_op(const char *name) { return find(unary_names, TPSH_U_COUNT, name); }
int tpsh_binary_op(const char *name) { return find(binary_names, TPSH_B_COUNT, name); }

/* The result's dtype: the operand's, f32 for an integer divided; -1 with the message where an integer
 * dtype is not taken. */
static int result_dtype(int divides, int takes_ints, int dtype) {
  if (tpsh_dtype_is_float(dtype) || takes_ints) return dtype;
  if (divides) return TPSH_F32;
  tpsh_error(TPSH_EINVAL, "expected a floating dtype (f32, f16, bf16 or f64), got %s (t:to(\"f32\") converts it)",
             tpsh_dtype_name(dtype));
  return -1;
}

static int unary_known(int op) {
  return op >= 0 && op < TPSH_U_COUNT ? TPSH_OK : tpsh_error(TPSH_EINVAL, "unknown unary op %d", op);
}
static int binary_known(int op) {
  return op >= 0 && op < TPSH_B_COUNT ? TPSH_OK : tpsh_error(TPSH_EINVAL, "unknown binary op %d", op);
}

int tpsh_unary_dtype(int op, int dtype) {
  if (unary_known(op)) return -1;
  return result_dtype(op == TPSH_U_DIV_BY || op == TPSH_U_DIV_INTO, tpsh_unary_takes_ints(op), dtype);
}

int tpsh_binary_dtype(int op, int dtype) {
  if (binary_known(op)) return -1;
  return result_dtype(op == TPSH_B_DIV, tpsh_binary_takes_ints(op), dtype);
}

int tpsh_unary(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *x, int op, double p) {
  CHECK(unary_known(op));
  CHECK(check_tensors(2, (const tpsh_tensor *[]){out, x}, (const char *[]){"output", "operand"}));
  int dtype = tpsh_unary_dtype(op, x->dtype_id);
  if (dtype < 0) return TPSH_EINVAL;
  tpsh_kargs k = {.op = TPSH_K_UNARY, .name = unary_names[op]};
  CHECK(tpsh_elementwise_args(&k, out, x, NULL, dtype));
  k.i[0] = op;
  k.s[0] = p;
  return tpsh_launch(s, &k);
}

int tpsh_binary(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b, int op) {
  CHECK(binary_known(op));
  CHECK(check_tensors(3, (const tpsh_tensor *[]){out, a, b}, (const char *[]){"output", "first operand",
                                                                            "second operand"}));
  int dtype = tpsh_binary_dtype(op, a->dtype_id);
  if (dtype < 0) return TPSH_EINVAL;
  tpsh_kargs k = {.op = TPSH_K_BINARY, .name = binary_names[op]};
  CHECK(tpsh_elementwise_args(&k, out, a, b, dtype));
  k.i[0] = op;
  return tpsh_launch(s, &k);
}
