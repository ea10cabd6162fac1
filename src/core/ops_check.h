/*
 * ops_check.h: the argument checks of the ops' front doors (ops.c, ops_pointwise.c): shapes, dtypes,
 * freed tensors, and the overlap of an operand with the output. Each returns TPSH_OK or an error
 * status with the message set; CHECK returns from the caller on an error.
 */
#ifndef TPSH_OPS_CHECK_H
#define TPSH_OPS_CHECK_H

#include "core/internal.h"

static inline int same_shape(const tpsh_tensor *a, const tpsh_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d]) return 0;
  return 1;
}

static inline int check_same_shape(const char *what, const tpsh_tensor *expected, const tpsh_tensor *got) {
  if (same_shape(expected, got)) return TPSH_OK;
  char e[160], g[160];
  return tpsh_error(TPSH_EINVAL, "%s: expected shape %s, got %s", what, tpsh_shape_str(expected, e, sizeof e),
                    tpsh_shape_str(got, g, sizeof g));
}

static inline int check_same_dtype(const char *what, const tpsh_tensor *expected, const tpsh_tensor *got) {
  if (expected->dtype_id == got->dtype_id) return TPSH_OK;
  return tpsh_error(TPSH_EINVAL, "%s: expected dtype %s, got %s", what, tpsh_dtype_name(expected->dtype_id),
                    tpsh_dtype_name(got->dtype_id));
}

static inline int check_tensors(int n, const tpsh_tensor *const *ts, const char *const *names) {
  for (int i = 0; i < n; i++) {
    int rc = tpsh_check_tensor(names[i], ts[i]);
    if (rc) return rc;
  }
  return TPSH_OK;
}

/* Whether t's elements fill a block of memory with no gaps and no element twice (PyTorch's
 * is_non_overlapping_and_dense): with its dimensions sorted by stride, each stride is the product of
 * the sizes below it. */
static inline int dense(const tpsh_tensor *t) {
  int order[TPSH_MAX_DIMS], n = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->sizes[d] == 0) return 1;                       /* no elements: nothing to overlap */
    if (t->sizes[d] == 1) continue;
    int j = n++;
    while (j > 0 && t->strides[order[j - 1]] > t->strides[d]) { order[j] = order[j - 1]; j--; }
    order[j] = d;
  }
  int64_t expected = 1;
  for (int i = 0; i < n; i++) {
    if (t->strides[order[i]] != expected) return 0;
    expected *= t->sizes[order[i]];
  }
  return 1;
}

static inline int same_view(const tpsh_tensor *a, const tpsh_tensor *b) {
  if (a->offset != b->offset || !same_shape(a, b)) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] > 1 && a->strides[d] != b->strides[d]) return 0;
  return 1;
}

/* An element-wise op writes out while it reads in: where the two are the same view each element is read
 * before it is written, and where they share no memory nothing is in the way; but where they overlap
 * otherwise (x:add_(x:t())), some elements are read after they were written, in an order that depends
 * on the backend's loop, and the result is wrong. Refused as PyTorch does: decided for dense views
 * (their memory is one block), and left alone where it cannot be told cheaply (strided views that may
 * interleave without sharing an element, such as the even and the odd elements). */
static inline int partial_overlap(const tpsh_tensor *out, const tpsh_tensor *in) {
  if (out->storage != in->storage || same_view(out, in)) return 0;
  if (!dense(out) || !dense(in)) return 0;
  int64_t n_out = tpsh_tensor_numel(out), n_in = tpsh_tensor_numel(in);
  if (n_out == 0 || n_in == 0) return 0;
  return !(out->offset + n_out <= in->offset || in->offset + n_in <= out->offset);
}
#define OVERLAP_MSG "overlaps the output in memory without being the same view (some elements would be read " \
                    "after they were written): clone() it first"

static inline int check_no_partial_overlap(const char *what, const tpsh_tensor *out, const tpsh_tensor *in) {
  return partial_overlap(out, in) ? tpsh_error(TPSH_EINVAL, "%s " OVERLAP_MSG, what) : TPSH_OK;
}

/* An output must not hold one element twice: an expanded view (stride 0 along a dimension of more than one
 * element) written element-wise would have its shared elements written by several, in an order that
 * depends on the backend (PyTorch refuses it too). */
static inline int check_writable(const char *what, const tpsh_tensor *out) {
  for (int d = 0; d < out->ndim; d++)
    if (out->sizes[d] > 1 && out->strides[d] == 0)
      return tpsh_error(TPSH_EINVAL, "%s: an expanded view (stride 0 along dimension %d) cannot be written: "
                        "its elements share memory (clone() it first)", what, d + 1);
  return TPSH_OK;
}

/* The arguments of an element-wise op out = f(a, b) (b NULL for one operand), in k->t[0..2]: a and b
 * of one dtype, broadcast (PyTorch's rules) to a shape that must be out's, out of dtype out_dtype (-1:
 * a's), writable, overlapping no operand but as the same view. The operands are k's expanded to out's
 * shape (ops_pointwise.c). */
int tpsh_elementwise_args(tpsh_kargs *k, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b, int out_dtype);

#define CHECK(expr) do { int rc_ = (expr); if (rc_) return rc_; } while (0)

#endif /* TPSH_OPS_CHECK_H */
