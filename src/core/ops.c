/*
 * ops.c: the front door of every tensor op. Checks the arguments (so a mistake is reported before
 * anything is enqueued, with shapes and dtypes in the message), fills one tpsh_kargs and hands it to
 * tpsh_launch, the single path to the backend (and the place where uses are noted for the
 * stream-ordered free, and where the trace, the sanitizer and chaos mode hook in).
 */
#include "core/backend.h"
#include "core/chaos.h"
#include "core/internal.h"
#include "core/check.h"
#include "core/trace.h"
#include "core/ops_check.h"
#include "core/graph.h"
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define BE (tpsh_rt.be)

void tpsh_kargs_set(tpsh_kargs *k, int slot, const tpsh_tensor *t) {
  k->t[slot] = *t;
  k->data[slot] = tpsh_tensor_data(t);
  if (k->nt < slot + 1) k->nt = slot + 1;
}

int tpsh_launch(tpsh_stream *s, tpsh_kargs *k) {
  if (!s) return tpsh_error(TPSH_EINVAL, "expected a stream");
  for (int i = 0; i < k->nt; i++) {
    int rc = tpsh_storage_note_use(k->t[i].storage, s);
    if (rc) return rc;
  }
  if (__builtin_expect(tpsh_graph_capturing, 0)) return tpsh_graph_launch(s, k);   /* tp.graph records it */
  return tpsh_launch_noted(s, k);
}

int tpsh_launch_noted(tpsh_stream *s, const tpsh_kargs *k) {
  TPSH_CHECK_HOOK(tpsh_check_launch(s, k));             /* stream sanitizer (check mode) */
  if (tpsh_chaos_on) {                                  /* chaos mode: a seeded delay before it */
    int rc = tpsh_chaos_delay(s, TPSH_CHAOS_OP);
    if (rc) return rc;
  }
  if (tpsh_trace_on) return tpsh_trace_launch(s, k);   /* be->launch between two timing events */
  return BE->launch(s, k);
}

/* ==== ops ======================================================================================== */
int tpsh_fill(tpsh_stream *s, tpsh_tensor *out, double value) {
  CHECK(tpsh_check_tensor("tensor", out));
  CHECK(check_writable("tensor", out));
  tpsh_kargs k = {.op = TPSH_K_FILL, .name = "fill_"};
  tpsh_kargs_set(&k, 0, out);
  k.s[0] = value;
  return tpsh_launch(s, &k);
}

int tpsh_copy(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *src) { return tpsh_copy_named(s, out, src, "copy_"); }

int tpsh_copy_named(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *src, const char *name) {
  CHECK(check_tensors(2, (const tpsh_tensor *[]){out, src}, (const char *[]){"destination", "source"}));
  CHECK(check_same_shape("source", out, src));
  CHECK(check_writable("destination", out));
  CHECK(check_no_partial_overlap("source", out, src));
  tpsh_kargs k = {.op = TPSH_K_COPY, .name = name};
  tpsh_kargs_set(&k, 0, out);
  tpsh_kargs_set(&k, 1, src);
  return tpsh_launch(s, &k);
}

static int binary(tpsh_stream *s, int op, const char *name, tpsh_tensor *out, const tpsh_tensor *a,
                  const tpsh_tensor *b, double alpha) {
  tpsh_kargs k = {.op = op, .name = name};
  CHECK(tpsh_elementwise_args(&k, out, a, b, -1));      /* broadcasts a and b to out's shape */
  k.s[0] = alpha;
  return tpsh_launch(s, &k);
}

int tpsh_add(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b, double alpha) {
  return binary(s, TPSH_K_ADD, "add", out, a, b, alpha);
}

int tpsh_mul(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b) {
  return binary(s, TPSH_K_MUL, "mul", out, a, b, 1.0);
}

/* out = a * factor, plus shift when adds (a number added, +0 too, which makes -0 + 0 = +0; a plain
 * scale adds nothing, so that -0 * 2 stays -0). Float dtypes take the unary rows mul, add and rsub of
 * core/pointwise.h where one expresses it: PyTorch's arithmetic (f32 for f32, f16 and bf16, the number
 * rounded to f32), and the table's vector kernels on both backends. TPSH_K_SCALE keeps the rest:
 * integers (int64 with wrap-around) and a factor other than 1 or -1 with a number added (the double
 * a * s + t, rounded once). */
static int scale_op(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, double factor, int adds, double shift) {
  tpsh_kargs k = {.op = TPSH_K_SCALE, .name = adds ? "add" : "mul"};
  CHECK(tpsh_elementwise_args(&k, out, a, NULL, -1));
  int row = !tpsh_dtype_is_float(k.t[1].dtype_id) ? -1
            : !adds                               ? TPSH_U_MUL_BY
            : factor == 1.0                       ? TPSH_U_ADD_NUM
            : factor == -1.0                      ? TPSH_U_SUB_FROM
                                                  : -1;
  if (row >= 0) {
    k.op = TPSH_K_UNARY;
    k.i[0] = row;
    k.s[0] = adds ? shift : factor;
    return tpsh_launch(s, &k);
  }
  k.s[0] = factor;
  k.s[1] = shift;
  k.i[0] = adds;
  return tpsh_launch(s, &k);
}

int tpsh_scale(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, double factor) {
  return scale_op(s, out, a, factor, 0, 0);
}

int tpsh_scale_add(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, double factor, double shift) {
  return scale_op(s, out, a, factor, 1, shift);
}

int tpsh_matmul(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b) {
  CHECK(check_tensors(3, (const tpsh_tensor *[]){out, a, b}, (const char *[]){"out", "a", "b"}));
  char x[160], y[160];
  if (a->ndim != 2 || b->ndim != 2)
    return tpsh_error(TPSH_EINVAL, "expected 2-D operands, got shapes %s and %s", tpsh_shape_str(a, x, sizeof x),
                      tpsh_shape_str(b, y, sizeof y));
  if (a->sizes[1] != b->sizes[0])
    return tpsh_error(TPSH_EINVAL, "inner dimensions differ: %s @ %s", tpsh_shape_str(a, x, sizeof x),
                      tpsh_shape_str(b, y, sizeof y));
  CHECK(check_same_dtype("b", a, b));
  CHECK(check_same_dtype("out", a, out));
  if (out->ndim != 2 || out->sizes[0] != a->sizes[0] || out->sizes[1] != b->sizes[1])
    return tpsh_error(TPSH_EINVAL, "out: expected shape [%lld, %lld], got %s", (long long)a->sizes[0],
                      (long long)b->sizes[1], tpsh_shape_str(out, x, sizeof x));
  if (out->storage == a->storage || out->storage == b->storage)
    return tpsh_error(TPSH_EINVAL, "out must not share memory with an operand");
  /* BLAS and cuBLAS take int dimensions. Both backends refuse more, but the CPU's check runs on the
   * stream's worker: the call returned, and the error ("matmul: matmul: ...") came at the next read of
   * the stream, whatever it read. Integer matmuls are plain loops, and an empty product calls no BLAS. */
  int64_t m = a->sizes[0], kk = a->sizes[1], n = b->sizes[1];
  if (tpsh_dtype_is_float(a->dtype_id) && m > 0 && n > 0 && kk > 0 && (m > INT_MAX || n > INT_MAX || kk > INT_MAX))
    return tpsh_error(TPSH_EUNSUPPORTED, "dimensions beyond 2^31 - 1 do not fit BLAS: %s @ %s",
                      tpsh_shape_str(a, x, sizeof x), tpsh_shape_str(b, y, sizeof y));
  tpsh_kargs k = {.op = TPSH_K_MATMUL, .name = "matmul"};
  tpsh_kargs_set(&k, 0, out);
  tpsh_kargs_set(&k, 1, a);
  tpsh_kargs_set(&k, 2, b);
  return tpsh_launch(s, &k);
}

int tpsh_sum(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a) {
  CHECK(check_tensors(2, (const tpsh_tensor *[]){out, a}, (const char *[]){"out", "tensor"}));
  CHECK(check_same_dtype("out", a, out));
  if (tpsh_tensor_numel(out) != 1) return tpsh_error(TPSH_EINVAL, "out must hold one element");
  tpsh_kargs k = {.op = TPSH_K_SUM, .name = "sum"};
  tpsh_kargs_set(&k, 0, out);
  tpsh_kargs_set(&k, 1, a);
  return tpsh_launch(s, &k);
}

int tpsh_arange(tpsh_stream *s, tpsh_tensor *out, double start, double step) {
  CHECK(tpsh_check_tensor("tensor", out));
  if (!tpsh_tensor_is_contiguous(out)) return tpsh_error(TPSH_EINVAL, "expected a contiguous tensor");
  tpsh_kargs k = {.op = TPSH_K_ARANGE, .name = "arange"};
  tpsh_kargs_set(&k, 0, out);
  k.s[0] = start;
  k.s[1] = step;
  return tpsh_launch(s, &k);
}

int tpsh_random(tpsh_stream *s, tpsh_tensor *out, int normal, uint64_t seed, uint64_t offset) {
  CHECK(tpsh_check_tensor("tensor", out));
  if (!tpsh_tensor_is_contiguous(out)) return tpsh_error(TPSH_EINVAL, "expected a contiguous tensor");
  /* The kernels write uniform or normal floats; an integer tensor would get their raw bits. */
  if (!tpsh_dtype_is_float(out->dtype_id))
    return tpsh_error(TPSH_EINVAL, "expected a floating dtype (f32, f16, bf16 or f64), got %s",
                      tpsh_dtype_name(out->dtype_id));
  tpsh_kargs k = {.op = TPSH_K_RANDOM, .name = normal ? "randn" : "rand"};
  tpsh_kargs_set(&k, 0, out);
  k.i[0] = normal != 0;
  k.i[1] = (int64_t)seed;
  k.i[2] = (int64_t)offset;
  return tpsh_launch(s, &k);
}

int tpsh_spin(tpsh_stream *s, double ms) {
  if (!(ms >= 0 && ms <= TPSH_SPIN_MAX_MS))
    return tpsh_error(TPSH_EINVAL, "expected a duration from 0 to %d ms, got %g", TPSH_SPIN_MAX_MS, ms);
  tpsh_kargs k = {.op = TPSH_K_SPIN, .name = "spin"};
  k.s[0] = ms;
  return tpsh_launch(s, &k);
}

int tpsh_cat(tpsh_stream *s, tpsh_tensor *out, int n, tpsh_tensor *const *list, int dim) {
  CHECK(tpsh_check_tensor("out", out));
  if (n < 1) return tpsh_error(TPSH_EINVAL, "expected a non-empty list of tensors");
  const tpsh_tensor *first = list[0];
  char x[160], y[160];
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    const tpsh_tensor *t = list[i];
    if (tpsh_check_tensor("item", t)) {                 /* again, to say which: "item N: the tensor was freed" */
      char item[32];
      snprintf(item, sizeof item, "item %d", i + 1);
      return tpsh_check_tensor(item, t);
    }
    if (t->dtype_id != first->dtype_id)
      return tpsh_error(TPSH_EINVAL, "item %d: expected dtype %s, got %s", i + 1,
                        tpsh_dtype_name(first->dtype_id), tpsh_dtype_name(t->dtype_id));
    if (t->ndim != first->ndim || dim < 0 || dim >= t->ndim)
      return tpsh_error(TPSH_EINVAL, "item %d: shape %s cannot be joined along dimension %d with %s", i + 1,
                        tpsh_shape_str(t, x, sizeof x), dim + 1, tpsh_shape_str(first, y, sizeof y));
    for (int d = 0; d < t->ndim; d++)
      if (d != dim && t->sizes[d] != first->sizes[d])
        return tpsh_error(TPSH_EINVAL, "item %d: shape %s does not match %s outside dimension %d", i + 1,
                          tpsh_shape_str(t, x, sizeof x), tpsh_shape_str(first, y, sizeof y), dim + 1);
    total += t->sizes[dim];
  }
  CHECK(check_same_dtype("out", first, out));
  int ok = out->ndim == first->ndim && out->sizes[dim] == total;
  for (int d = 0; ok && d < out->ndim; d++) ok = d == dim || out->sizes[d] == first->sizes[d];
  if (!ok) return tpsh_error(TPSH_EINVAL, "out: shape %s does not hold the %lld joined slices of %s",
                             tpsh_shape_str(out, x, sizeof x), (long long)total, tpsh_shape_str(first, y, sizeof y));
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    tpsh_tensor piece = *out;          /* a narrow() of out, on the stack: no refcount needed */
    piece.offset += at * out->strides[dim];
    piece.sizes[dim] = list[i]->sizes[dim];
    at += list[i]->sizes[dim];
    if (partial_overlap(&piece, list[i])) return tpsh_error(TPSH_EINVAL, "item %d " OVERLAP_MSG, i + 1);
    tpsh_kargs k = {.op = TPSH_K_COPY, .name = "cat"};
    tpsh_kargs_set(&k, 0, &piece);
    tpsh_kargs_set(&k, 1, list[i]);
    CHECK(tpsh_launch(s, &k));
  }
  return TPSH_OK;
}

/* ==== host transfers ============================================================================= */
int tpsh_to_host(tpsh_stream *s, const tpsh_tensor *t, void *dst) {
  CHECK(tpsh_check_tensor("tensor", t));
  if (!s || !dst) return tpsh_error(TPSH_EINVAL, "expected a stream and a destination");
  if (tpsh_graph_capturing) return tpsh_graph_refuse("reads to the host");
  tpsh_kargs k = {.op = TPSH_K_COPY, .name = "to_host"};
  tpsh_kargs_set(&k, 0, t);
  CHECK(tpsh_storage_note_use(t->storage, s));
  TPSH_CHECK_HOOK(tpsh_check_host_read(s, t));          /* stream sanitizer: the host reads t */
  double t0 = tpsh_trace_on ? tpsh_now_ms() : 0;      /* a host block, for the trace */
  tpsh_watch_wait_begin_on("a read to the host (to_host)", s);
  int rc = BE->to_host(s, &k, dst);
  tpsh_watch_wait_end();
  if (tpsh_trace_on) tpsh_trace_host("to_host", s, t0);
  return tpsh_async_error_settle(rc);                 /* a read over an aborted collective's output */
}

int tpsh_from_host(tpsh_stream *s, tpsh_tensor *t, const void *src) {
  CHECK(tpsh_check_tensor("tensor", t));
  if (!s || !src) return tpsh_error(TPSH_EINVAL, "expected a stream and a source");
  if (tpsh_graph_capturing) return tpsh_graph_refuse("uploads from the host");
  if (!tpsh_tensor_is_contiguous(t)) return tpsh_error(TPSH_EINVAL, "expected a contiguous tensor");
  tpsh_kargs k = {.op = TPSH_K_COPY, .name = "from_host"};
  tpsh_kargs_set(&k, 0, t);
  CHECK(tpsh_storage_note_use(t->storage, s));
  TPSH_CHECK_HOOK(tpsh_check_launch(s, &k));            /* stream sanitizer: s writes t */
  if (tpsh_chaos_on) CHECK(tpsh_chaos_delay(s, TPSH_CHAOS_OP));
  tpsh_trace_untraced(s);                             /* the upload is stream work without a record */
  return BE->from_host(s, &k, src);
}

int tpsh_compare(tpsh_stream *s, const tpsh_tensor *a, const tpsh_tensor *b, double rtol, double atol,
                 double *result) {
  CHECK(check_tensors(2, (const tpsh_tensor *[]){a, b}, (const char *[]){"first tensor", "second tensor"}));
  CHECK(check_same_shape("second tensor", a, b));
  int64_t two = 2;
  tpsh_tensor *r = tpsh_tensor_empty(1, &two, TPSH_F64, s);
  if (!r) return TPSH_ENOMEM;
  tpsh_kargs k = {.op = TPSH_K_COMPARE, .name = "compare"};
  tpsh_kargs_set(&k, 0, r);
  tpsh_kargs_set(&k, 1, a);
  tpsh_kargs_set(&k, 2, b);
  k.s[0] = rtol;
  k.s[1] = atol;
  int rc = tpsh_launch(s, &k);
  if (rc == TPSH_OK) rc = tpsh_to_host(s, r, result);
  tpsh_tensor_release(r);
  return rc;
}

/* ==== the checks, for the other front doors (ops_reduce.c) ======================================== */
int tpsh_check_same_shape(const char *what, const tpsh_tensor *expected, const tpsh_tensor *got) {
  return check_same_shape(what, expected, got);
}

int tpsh_check_same_dtype(const char *what, const tpsh_tensor *expected, const tpsh_tensor *got) {
  return check_same_dtype(what, expected, got);
}

int tpsh_check_no_partial_overlap(const char *what, const tpsh_tensor *out, const tpsh_tensor *in) {
  return check_no_partial_overlap(what, out, in);
}
