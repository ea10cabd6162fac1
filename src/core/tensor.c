/*
 * tensor.c: storages, tensors and views, and the stream-ordered free.
 *
 * A tensor is a small descriptor (sizes, strides, offset) over a refcounted storage, so every view is
 * O(1) and shares memory (as in Torch7's TH). Memory comes from the caching allocator (alloc.c) and goes
 * back to it in stream order: a storage remembers the stream it was allocated on and every other stream
 * an op touched it from. When it is freed (the last view collected, or t:free()) and only its own stream
 * used it, its block is cached at once, stream-ordered on that stream. When other streams used it too,
 * tpsh records an event on each and parks the block on a deferred list that is polled on every
 * allocation: the block is cached only once all those events have completed. This is PyTorch's
 * record_stream scheme, except that tpsh notes the uses itself, so the allocating stream never has to
 * wait for another stream just to free memory.
 */
#include "core/backend.h"
#include "core/alloc.h"
#include "core/check.h"
#include "core/stream.h"
#include "core/graph.h"
#include <stdlib.h>
#include <string.h>

/* ==== deferred frees ============================================================================ */
typedef struct deferred_free {
  tpsh_block *block;
  tpsh_stream *alloc_stream;     /* retained */
  tpsh_event **events;           /* one per stream that used the block */
  int nevents;
  struct deferred_free *next;
} deferred_free;

static deferred_free *deferred_head;

/* Frees every parked block whose uses have all completed; returns how many. Cheap when the list is
 * empty. The events are asked through the backend, not tpsh_event_query / _synchronize: those tell
 * the sanitizer that the host has seen the work finish, and this bookkeeping (run from any
 * allocation) must not order the script's host after work it never waited for, or a read before its
 * w:wait() would go unreported whenever a tensor happened to be allocated in between. */
static int poll_deferred(int wait) {
  int n = 0;
  deferred_free **pp = &deferred_head;
  while (*pp) {
    deferred_free *d = *pp;
    int done = 1;
    for (int i = 0; i < d->nevents && done; i++) {
      tpsh_event *e = d->events[i];
      if (!e->recorded) continue;
      if (wait) tpsh_rt.be->event_synchronize(e);
      done = tpsh_rt.be->event_query(e) != 0;
    }
    if (!done) { pp = &d->next; continue; }
    tpsh_block_free_done(d->block, d->alloc_stream);
    tpsh_alloc_counters.pending_blocks--;
    for (int i = 0; i < d->nevents; i++) tpsh_event_release(d->events[i]);
    tpsh_stream_release(d->alloc_stream);
    free(d->events);
    *pp = d->next;
    free(d);
    n++;
  }
  return n;
}

int tpsh_storage_drain_deferred(void) { return poll_deferred(1); }

void tpsh_block_park(tpsh_block *b, tpsh_stream *alloc_stream, int n, tpsh_stream *const *streams) {
  tpsh_stream *order = alloc_stream ? alloc_stream : tpsh_rt.default_stream;   /* a free to the backend's */
  deferred_free *d = calloc(1, sizeof *d);
  tpsh_event **ev = calloc((size_t)n + 1, sizeof *ev);
  if (!d || !ev) {                        /* out of host memory: fall back to a full sync */
    free(d); free(ev);
    /* a wait cut short (the REPL's Ctrl-C, a run being ended) leaves the memory to the process: work
     * still queued may use it */
    if (tpsh_synchronize() == TPSH_OK) tpsh_block_free_done(b, order);
    return;
  }
  d->block = b;
  tpsh_alloc_counters.pending_blocks++;
  d->alloc_stream = order; tpsh_stream_retain(order);
  d->events = ev;
  for (int i = 0; i <= n; i++) {
    tpsh_stream *u = i < n ? streams[i] : alloc_stream;
    if (!u) continue;
    tpsh_event *e = tpsh_event_create(0);
    if (e && tpsh_event_record(e, u) == TPSH_OK) d->events[d->nevents++] = e;
    else if (e) { tpsh_event_release(e); tpsh_stream_synchronize(u); }
    else tpsh_stream_synchronize(u);
  }
  d->next = deferred_head;
  deferred_head = d;
}

static void storage_release_memory(tpsh_storage *st) {
  if (!st->data) return;
  if (tpsh_check_on) tpsh_check_free(st);             /* sanitizer: uses not ordered before the free */
  /* check mode names it if the block's next tensor is misused */
  st->block->freed_at = tpsh_check_on ? tpsh_check_location() : NULL;
  tpsh_alloc_counters.bytes_live -= (double)st->nbytes;
  if (st->nusers == 0) tpsh_block_free(st->block, st->alloc_stream);
  /* a graph pool's block (the only memory freed during a capture), which no event may order now */
  else if (tpsh_graph_capturing) tpsh_block_free_captured(st->block, st->alloc_stream);
  else tpsh_block_park(st->block, st->alloc_stream, st->nusers, st->users);
  for (int i = 0; i < st->nusers; i++) tpsh_stream_unhold(st->users[i]);
  free(st->users);
  st->users = NULL;
  st->nusers = st->cap_users = 0;
  st->data = NULL;
  st->block = NULL;
}

/* Lets go of the user streams that nothing but passive holders reference and that have finished: no
 * work of theirs is left to wait for, and none can come (tpsh_stream_abandoned). Run when the list is
 * full, so that a tensor used once on each of many short-lived streams keeps only the live ones. A
 * failure of such a stream is reported here, as the next host wait would have reported it. */
static int prune_users(tpsh_storage *st) {
  int n = 0, rc = TPSH_OK;
  for (int i = 0; i < st->nusers; i++) {
    tpsh_stream *u = st->users[i];
    int r = rc == TPSH_OK ? tpsh_stream_abandoned(u) : 0;
    if (r < 0) rc = -r;
    if (r == 1) tpsh_stream_unhold(u);
    else st->users[n++] = u;
  }
  st->nusers = n;
  return rc;
}

TPSH_HOT int tpsh_storage_note_use(tpsh_storage *st, tpsh_stream *s) {
  if (s == st->alloc_stream) return TPSH_OK;
  for (int i = 0; i < st->nusers; i++)
    if (st->users[i] == s) return TPSH_OK;
  if (st->nusers == st->cap_users && st->nusers > 0) {
    int rc = prune_users(st);
    if (rc) return rc;
  }
  if (st->nusers == st->cap_users) {
    int cap = st->cap_users ? 2 * st->cap_users : 4;
    tpsh_stream **u = realloc(st->users, (size_t)cap * sizeof *u);
    if (!u) return tpsh_error(TPSH_ENOMEM, "out of host memory");
    st->users = u;
    st->cap_users = cap;
  }
  tpsh_stream_hold(s);
  st->users[st->nusers++] = s;
  return TPSH_OK;
}

TPSH_HOT void tpsh_storage_retain(tpsh_storage *st) { st->refcount++; }

/* Storage descriptors of dead tensors, kept for the next ones (host thread only, as refcount): a fresh
 * temporary's calloc and free of its descriptor were about 300 of the 2,700 instructions by which
 * `x + y` cost more than the same add into a preallocated output (callgrind, CPU backend). Bounded
 * at a collector cycle's worth of temporaries; the list stays reachable at exit. */
enum { SPARE_STORAGES = 4096 };
static tpsh_storage *spare_storage[SPARE_STORAGES];
static int nspare_storage;

static tpsh_storage *storage_new(void) {
  if (nspare_storage == 0) return calloc(1, sizeof(tpsh_storage));
  tpsh_storage *st = spare_storage[--nspare_storage];
  memset(st, 0, sizeof *st);
  return st;
}

static void storage_free(tpsh_storage *st) {
  storage_release_memory(st);
  tpsh_stream_release(st->alloc_stream);
  if (nspare_storage < SPARE_STORAGES) spare_storage[nspare_storage++] = st;
  else free(st);
}

/* The last reference went while graphs hold st (its struct, which their ops name, stays with them) or
 * while a capture is open. A graph pool's memory goes back to its pool at once, where a later allocation
 * of the capture may take it; other memory stays while a graph holds it, and is released after the
 * capture (releasing it records events on streams, which may be capturing). */
static void storage_orphaned(tpsh_storage *st) {
  int pooled = st->block && st->block->pool;
  if (pooled) storage_release_memory(st);
  if (st->graph_holds > 0) return;
  if (!pooled && tpsh_graph_capturing) tpsh_graph_defer_release(st);
  else storage_free(st);
}

TPSH_HOT void tpsh_storage_unref(tpsh_storage *st) {
  if (--st->refcount > 0) return;
  if (__builtin_expect(st->graph_holds > 0 || tpsh_graph_capturing, 0)) { storage_orphaned(st); return; }
  storage_free(st);
}

void tpsh_storage_graph_hold(tpsh_storage *st) { st->graph_holds++; }

void tpsh_storage_graph_drop(tpsh_storage *st) {
  if (--st->graph_holds > 0 || st->refcount > 0) return;
  storage_orphaned(st);
}

void tpsh_storage_release_deferred(tpsh_storage *st) {
  if (st->refcount == 0 && st->graph_holds == 0) storage_free(st);
}

/* ==== tensors ==================================================================================== */
TPSH_HOT size_t tpsh_tensor_elsize(const tpsh_tensor *t) { return (size_t)tpsh_dtype_size(t->dtype_id); }

TPSH_HOT void *tpsh_tensor_data(const tpsh_tensor *t) {
  if (!t->storage->data) return NULL;
  return (char *)t->storage->data + (size_t)t->offset * tpsh_tensor_elsize(t);
}

TPSH_HOT int tpsh_check_tensor(const char *what, const tpsh_tensor *t) {
  if (!t) return tpsh_error(TPSH_EINVAL, "%s: expected a tensor, got nil", what);
  if (!t->storage || !t->storage->data) return tpsh_error(TPSH_EINVAL, "%s: the tensor was freed", what);
  return TPSH_OK;
}

TPSH_HOT int64_t tpsh_tensor_numel(const tpsh_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
  return n;
}

/* The backends' sums walk this: a sum adds every element once whatever the order, and walked in the
 * view's own order a transposed 2048 x 2048 f32 sum went down columns one element at a time on the CPU,
 * 28x the time of the contiguous sum (docs/perf.md), and read memory uncoalesced on the GPU. The order of
 * a floating sum is then the memory's: its last bits may differ from a sum of the same values laid out
 * otherwise. Insertion sort, stable: ndim <= 8. */
/* an expanded dim (stride 0) sorts outermost of all */
static uint64_t stride_rank(int64_t stride) { return stride == 0 ? UINT64_MAX : (uint64_t)stride; }

tpsh_tensor tpsh_tensor_memory_order(const tpsh_tensor *t) {
  tpsh_tensor w = *t;
  for (int d = 1; d < w.ndim; d++) {
    int64_t sz = w.sizes[d], st = w.strides[d];
    int e = d;
    for (; e > 0; e--) {
      if (stride_rank(w.strides[e - 1]) >= stride_rank(st)) break;
      w.sizes[e] = w.sizes[e - 1];
      w.strides[e] = w.strides[e - 1];
    }
    w.sizes[e] = sz;
    w.strides[e] = st;
  }
  return w;
}

int tpsh_tensor_is_contiguous(const tpsh_tensor *t) {
  /* No elements, nothing out of place (as in PyTorch): a 0 in any dimension but the last left the
   * strides of the dimensions before it unequal to the product of the sizes after (0), and ops that
   * need a contiguous buffer (random, from_host, collectives) refused tp.zeros({2, 0}). */
  if (tpsh_tensor_numel(t) == 0) return 1;
  int64_t expected = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->sizes[d] == 1) continue;
    if (t->strides[d] != expected) return 0;
    expected *= t->sizes[d];
  }
  return 1;
}

int tpsh_tensor_alive(const tpsh_tensor *t) { return t && t->storage && t->storage->data != NULL; }
/* 0 for a descriptor without a storage (one made by ffi.new from Lua), rather than read through NULL. */
uint64_t tpsh_tensor_storage_id(const tpsh_tensor *t) { return t->storage ? t->storage->id : 0; }
int64_t tpsh_tensor_storage_nbytes(const tpsh_tensor *t) { return (int64_t)t->storage->nbytes; }

static tpsh_tensor *tensor_alloc_like(const tpsh_tensor *base) {
  tpsh_tensor *t = malloc(sizeof *t);
  if (!t) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  *t = *base;
  t->storage->refcount++;
  return t;
}

int tpsh_tensor_init_empty(tpsh_tensor *t, int ndim, const int64_t *sizes, int dtype, tpsh_stream *s) {
  if (!tpsh_rt.initialized) return tpsh_error(TPSH_EINVAL, "tpsh is not initialised");
  if (ndim < 0 || ndim > TPSH_MAX_DIMS)
    return tpsh_error(TPSH_EINVAL, "expected at most %d dimensions, got %d", TPSH_MAX_DIMS, ndim);
  if (dtype < 0 || dtype >= TPSH_NDTYPES) return tpsh_error(TPSH_EINVAL, "unknown dtype id %d", dtype);
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (sizes[d] < 0)
      return tpsh_error(TPSH_EINVAL, "size of dimension %d must be >= 0, got %lld", d + 1, (long long)sizes[d]);
    if (sizes[d] && numel > INT64_MAX / 16 / sizes[d]) return tpsh_error(TPSH_EINVAL, "shape is too large");
    numel *= sizes[d];
  }
  if (!s) s = tpsh_rt.default_stream;
  /* Not during a capture: an event query there (cudaEventQuery, of any event) invalidates it. */
  if (deferred_head && !tpsh_graph_capturing) poll_deferred(0);
  tpsh_storage *st = storage_new();
  if (!st) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  memset(t, 0, sizeof *t);
  st->nbytes = (size_t)numel * (size_t)tpsh_dtype_size(dtype);
  /* Zero-size tensors still get a distinct, non-NULL block: "alive" is data != NULL. */
  int reused;
  tpsh_block *b = tpsh_block_alloc(st->nbytes ? st->nbytes : 1, s, &reused);
  if (!b && deferred_head && !tpsh_graph_capturing) {    /* (a capture cannot wait) */
    /* Blocks parked on the deferred list may be all that stands in the way: wait for them, retry. */
    poll_deferred(1);
    b = tpsh_block_alloc(st->nbytes ? st->nbytes : 1, s, &reused);
  }
  if (!b) { free(st); return TPSH_ENOMEM; }          /* the allocator set the message */
  st->block = b;
  st->data = b->ptr;
  tpsh_alloc_stats *c = &tpsh_alloc_counters;
  c->bytes_since_step += (double)st->nbytes;
  c->bytes_live += (double)st->nbytes;
  if (c->bytes_live > c->requested_peak) c->requested_peak = c->bytes_live;
  c->tensors_allocated += 1;
  st->refcount = 1;
  st->device = tpsh_rt.device;
  st->id = ++tpsh_rt.next_storage_id;
  st->alloc_stream = s;
  tpsh_stream_retain(s);
  t->storage = st;
  t->ndim = ndim;
  t->dtype_id = dtype;
  t->device = tpsh_rt.device;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    t->sizes[d] = sizes[d];
    t->strides[d] = stride;
    stride *= sizes[d] ? sizes[d] : 1;
  }
  if (tpsh_check_on) tpsh_check_alloc(t, reused ? b->freed_at : NULL);   /* sanitizer: s's memory, in s's order */
  return TPSH_OK;
}

int tpsh_tensor_init_like(tpsh_tensor *dst, const tpsh_tensor *src, int dtype, tpsh_stream *s) {
  if (!src) return tpsh_error(TPSH_EINVAL, "expected a tensor");
  return tpsh_tensor_init_empty(dst, src->ndim, src->sizes, dtype < 0 ? src->dtype_id : dtype, s);
}

tpsh_tensor *tpsh_tensor_empty(int ndim, const int64_t *sizes, int dtype, tpsh_stream *s) {
  tpsh_tensor *t = malloc(sizeof *t);
  if (!t) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  if (tpsh_tensor_init_empty(t, ndim, sizes, dtype, s) != TPSH_OK) { free(t); return NULL; }
  return t;
}

void tpsh_tensor_release(tpsh_tensor *t) {
  if (!t) return;
  tpsh_storage_unref(t->storage);
  free(t);
}

void tpsh_tensor_move_into(tpsh_tensor *dst, tpsh_tensor *src) {
  *dst = *src;
  free(src);
}

void tpsh_tensor_drop(tpsh_tensor *t) {
  if (!t || !t->storage) return;
  if (tpsh_check_on) tpsh_check_set_free_origin(TPSH_FREE_GC);        /* sanitizer: a user tensor dies */
  tpsh_storage_unref(t->storage);
  if (tpsh_check_on) tpsh_check_set_free_origin(TPSH_FREE_INTERNAL);
  t->storage = NULL;
}

int tpsh_tensor_free(tpsh_tensor *t) {
  if (!t || !t->storage) return tpsh_error(TPSH_EINVAL, "expected a tensor");
  tpsh_storage *st = t->storage;
  if (tpsh_graph_capturing && st->graph_holds > 0) return tpsh_graph_refuse("frees a tensor that a graph's ops use");
  if (st->graph_holds > 0)
    return tpsh_error(TPSH_EINVAL, "the tensor's memory is used by %d graph%s (tp.graph) that replay into it: "
                      "free %s first (g:free())", st->graph_holds, st->graph_holds == 1 ? "" : "s",
                      st->graph_holds == 1 ? "it" : "them");
  if (tpsh_graph_capturing && st->data && !st->block->pool) return tpsh_graph_refuse("frees a tensor made outside it");
  storage_release_memory(st);
  return TPSH_OK;
}

int tpsh_record_stream(tpsh_tensor *t, tpsh_stream *s) {
  int rc = tpsh_check_tensor("record_stream", t);
  if (rc) return rc;
  if (!s) return tpsh_error(TPSH_EINVAL, "expected a stream");
  if (tpsh_check_on) tpsh_check_record_stream(t->storage, s);   /* sanitizer: frees covered on s */
  return tpsh_storage_note_use(t->storage, s);
}

/* ==== views ====================================================================================== */
static int check_dim(const tpsh_tensor *t, int dim) {
  if (dim < 0 || dim >= t->ndim)
    return tpsh_error(TPSH_EINVAL, "dimension %d out of range for a tensor of %d dimensions", dim + 1,
                      t->ndim);
  return TPSH_OK;
}

tpsh_tensor *tpsh_tensor_as_strided(const tpsh_tensor *base, int ndim, const int64_t *sizes,
                                    const int64_t *strides, int64_t offset) {
  if (tpsh_check_tensor("as_strided", base)) return NULL;
  if (ndim < 0 || ndim > TPSH_MAX_DIMS)
    return tpsh_error_null(TPSH_EINVAL, "expected at most %d dimensions, got %d", TPSH_MAX_DIMS, ndim);
  /* The view must stay inside the storage: its lowest and highest element addresses. */
  int64_t lo = offset, hi = offset, numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (sizes[d] < 0) return tpsh_error_null(TPSH_EINVAL, "negative size %lld", (long long)sizes[d]);
    numel *= sizes[d];
    if (sizes[d] == 0) continue;
    int64_t span = (sizes[d] - 1) * strides[d];
    if (span < 0) lo += span; else hi += span;
  }
  int64_t cap = (int64_t)(base->storage->nbytes / tpsh_tensor_elsize(base));
  if (numel > 0 && (lo < 0 || hi >= cap))
    return tpsh_error_null(TPSH_EINVAL, "view reaches elements [%lld, %lld] outside a storage of %lld",
                           (long long)lo, (long long)hi, (long long)cap);
  tpsh_tensor *t = tensor_alloc_like(base);
  if (!t) return NULL;
  t->ndim = ndim;
  t->offset = offset;
  for (int d = 0; d < ndim; d++) { t->sizes[d] = sizes[d]; t->strides[d] = strides[d]; }
  return t;
}

/* Strides for viewing t as `sizes` without a copy, or 0 when the memory layout does not allow it.
 * The algorithm of PyTorch's computeStride: walk the old dims in chunks that are contiguous with each
 * other and match each chunk's element count with a run of new dims. */
static int view_strides(const tpsh_tensor *t, int ndim, const int64_t *sizes, int64_t *strides) {
  int64_t numel = tpsh_tensor_numel(t);
  if (numel == 0) {
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) { strides[d] = st; st *= sizes[d] ? sizes[d] : 1; }
    return 1;
  }
  int view_d = ndim - 1;
  int64_t chunk_base_stride = t->ndim ? t->strides[t->ndim - 1] : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int td = t->ndim - 1; td >= 0; td--) {
    tensor_numel *= t->sizes[td];
    if (td == 0 || (t->sizes[td - 1] != 1 && t->strides[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || sizes[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= sizes[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return 0;
      if (td > 0) {
        chunk_base_stride = t->strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) {
    /* remaining leading dims of size 1 */
    for (; view_d >= 0; view_d--) {
      if (sizes[view_d] != 1) return 0;
      strides[view_d] = 1;
    }
  }
  return 1;
}

tpsh_tensor *tpsh_tensor_view(const tpsh_tensor *t, int ndim, const int64_t *sizes) {
  if (tpsh_check_tensor("view", t)) return NULL;
  if (ndim < 0 || ndim > TPSH_MAX_DIMS)
    return tpsh_error_null(TPSH_EINVAL, "expected at most %d dimensions, got %d", TPSH_MAX_DIMS, ndim);
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (sizes[d] < 0) return tpsh_error_null(TPSH_EINVAL, "negative size %lld", (long long)sizes[d]);
    /* The product wrapped: an empty tensor would take the view {2^40, 2^40} (2^80 elements, read as 0),
     * which later ops would try to allocate or walk. */
    if (__builtin_mul_overflow(numel, sizes[d], &numel))
      return tpsh_error_null(TPSH_EINVAL, "shape is too large: more than 2^63 elements");
  }
  char buf[160];
  if (numel != tpsh_tensor_numel(t))
    return tpsh_error_null(TPSH_EINVAL, "cannot view a tensor of shape %s (%lld elements) as %lld elements",
                           tpsh_shape_str(t, buf, sizeof buf), (long long)tpsh_tensor_numel(t),
                           (long long)numel);
  int64_t strides[TPSH_MAX_DIMS];
  if (!view_strides(t, ndim, sizes, strides))
    return tpsh_error_null(TPSH_EINVAL,
                           "the strides of a tensor of shape %s do not allow this view; "
                           "call contiguous() first", tpsh_shape_str(t, buf, sizeof buf));
  return tpsh_tensor_as_strided(t, ndim, sizes, strides, t->offset);
}

tpsh_tensor *tpsh_tensor_narrow(const tpsh_tensor *t, int dim, int64_t start, int64_t len) {
  if (tpsh_check_tensor("narrow", t) || check_dim(t, dim)) return NULL;
  if (start < 0 || len < 0 || start + len > t->sizes[dim])
    return tpsh_error_null(TPSH_EINVAL,
                           "range [%lld, %lld] (start %lld, length %lld) is outside dimension %d of size %lld",
                           (long long)start + 1, (long long)(start + len), (long long)start + 1,
                           (long long)len, dim + 1, (long long)t->sizes[dim]);
  tpsh_tensor *v = tensor_alloc_like(t);
  if (!v) return NULL;
  v->offset += start * t->strides[dim];
  v->sizes[dim] = len;
  return v;
}

tpsh_tensor *tpsh_tensor_select(const tpsh_tensor *t, int dim, int64_t index) {
  if (tpsh_check_tensor("select", t) || check_dim(t, dim)) return NULL;
  if (index < 0 || index >= t->sizes[dim])
    return tpsh_error_null(TPSH_EINVAL, "index %lld is outside dimension %d of size %lld",
                           (long long)index + 1, dim + 1, (long long)t->sizes[dim]);
  tpsh_tensor *v = tensor_alloc_like(t);
  if (!v) return NULL;
  v->offset += index * t->strides[dim];
  for (int d = dim; d < t->ndim - 1; d++) { v->sizes[d] = t->sizes[d + 1]; v->strides[d] = t->strides[d + 1]; }
  v->ndim--;
  return v;
}

tpsh_tensor *tpsh_tensor_transpose(const tpsh_tensor *t, int d1, int d2) {
  if (tpsh_check_tensor("transpose", t) || check_dim(t, d1) || check_dim(t, d2)) return NULL;
  tpsh_tensor *v = tensor_alloc_like(t);
  if (!v) return NULL;
  v->sizes[d1] = t->sizes[d2]; v->strides[d1] = t->strides[d2];
  v->sizes[d2] = t->sizes[d1]; v->strides[d2] = t->strides[d1];
  return v;
}
