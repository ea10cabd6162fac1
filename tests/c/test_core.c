/*
 * test_core.c: the core through its C ABI alone (no Lua): tensors and views, ops and their checks,
 * streams and events on the CPU backend, the stream-ordered free, Work tickets, and the growing text of
 * core/internal.h behind the ranks' records. A world of one rank.
 * Prints one line per failed check and ends with "N passed, N failed".
 */
#include "tpsh.h"
#include "core/internal.h"   /* tpsh_stream_key */
#include "core/check.h"      /* TPSH_WAIT_ALL_STREAMS */
#include "core/backend.h"    /* the backend's p2p flag, for the ledger's signatures */
#include "core/p2p_ledger.h"
#include "core/text.h"      /* tpsh_text */
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"             /* passed, failed, CHECK */

static tpsh_stream *S;

static tpsh_tensor *vec(int64_t n, int dtype) { return tpsh_tensor_empty(1, &n, dtype, S); }

static double at(const tpsh_tensor *t, int64_t i) {
  double buf[64];
  tpsh_tensor *d = tpsh_tensor_empty(t->ndim, t->sizes, TPSH_F64, S);
  tpsh_copy(S, d, t);
  tpsh_to_host(S, d, buf);
  tpsh_tensor_release(d);
  return buf[i];
}

static void test_views(void) {
  int64_t shape[2] = {3, 4};
  tpsh_tensor *t = tpsh_tensor_empty(2, shape, TPSH_F32, S);
  CHECK(t && tpsh_tensor_numel(t) == 12 && tpsh_tensor_is_contiguous(t), "empty 3x4");
  tpsh_tensor *flat = tpsh_tensor_view(t, 1, (int64_t[]){12});
  tpsh_arange(S, flat, 0, 1);
  tpsh_tensor_release(flat);
  tpsh_tensor *tr = tpsh_tensor_transpose(t, 0, 1);
  CHECK(tr->sizes[0] == 4 && tr->strides[0] == 1 && !tpsh_tensor_is_contiguous(tr), "transpose strides");
  CHECK(tpsh_tensor_view(tr, 1, (int64_t[]){12}) == NULL && strstr(tpsh_last_error(), "strides"),
        "view of a transposed tensor refused: %s", tpsh_last_error());
  tpsh_tensor *n = tpsh_tensor_narrow(t, 1, 1, 2);
  CHECK(n->offset == 1 && n->sizes[1] == 2, "narrow offset");
  CHECK(at(n, 2) == 5, "narrow value %g", at(n, 2));
  tpsh_tensor *sel = tpsh_tensor_select(t, 0, 2);
  CHECK(sel->ndim == 1 && at(sel, 3) == 11, "select");
  CHECK(tpsh_tensor_narrow(t, 1, 3, 2) == NULL, "narrow out of range");
  CHECK(tpsh_tensor_select(t, 2, 0) == NULL && strstr(tpsh_last_error(), "dimension 3"), "select dim");
  /* a view of a size-1-padded shape keeps the strides consistent */
  tpsh_tensor *v = tpsh_tensor_view(t, 3, (int64_t[]){3, 1, 4});
  CHECK(v && v->strides[0] == 4 && v->strides[2] == 1, "view with a unit dim");
  tpsh_tensor_release(v);
  /* as_strided stays inside the storage: a view may end at its last element, not one past it */
  tpsh_tensor *tail = tpsh_tensor_as_strided(t, 1, (int64_t[]){2}, (int64_t[]){1}, 10);
  CHECK(tail && at(tail, 1) == 11, "a view ending at the storage's last element: %s", tpsh_last_error());
  tpsh_tensor_release(tail);
  CHECK(tpsh_tensor_as_strided(t, 1, (int64_t[]){2}, (int64_t[]){1}, 11) == NULL &&
        strstr(tpsh_last_error(), "[11, 12] outside a storage of 12"), "one element past the storage: %s",
        tpsh_last_error());
  tpsh_tensor_release(sel);
  tpsh_tensor_release(n);
  tpsh_tensor_release(tr);
  tpsh_tensor_release(t);
}

static void test_ops_checks(void) {
  tpsh_tensor *a = vec(3, TPSH_F32), *b = vec(4, TPSH_F32), *c = vec(3, TPSH_I32);
  CHECK(tpsh_add(S, a, a, b, 1) == TPSH_EINVAL && strstr(tpsh_last_error(), "shapes [3] and [4] do not broadcast"),
        "add shape: %s", tpsh_last_error());
  CHECK(tpsh_add(S, a, a, c, 1) == TPSH_EINVAL && strstr(tpsh_last_error(), "expected dtype f32, got i32"),
        "add dtype: %s", tpsh_last_error());
  CHECK(tpsh_spin(S, -1) == TPSH_EINVAL, "negative spin");
  CHECK(tpsh_spin(S, 1e300) == TPSH_EINVAL && strstr(tpsh_last_error(), "from 0 to 10000000 ms"),
        "absurd spin: %s", tpsh_last_error());
  CHECK(tpsh_random(S, c, 0, 1, 0) == TPSH_EINVAL && strstr(tpsh_last_error(), "expected a floating dtype"),
        "random into i32: %s", tpsh_last_error());
  tpsh_tensor *none = tpsh_tensor_empty(2, (int64_t[]){2, 0}, TPSH_F32, S);
  CHECK(none && tpsh_tensor_is_contiguous(none) && tpsh_random(S, none, 0, 1, 0) == TPSH_OK,
        "a 2x0 tensor is contiguous: %s", tpsh_last_error());
  tpsh_tensor_release(none);
  /* sum writes one element: an out of another size is refused, not partly written */
  CHECK(tpsh_sum(S, b, b) == TPSH_EINVAL && strstr(tpsh_last_error(), "out must hold one element"),
        "sum into 4 elements: %s", tpsh_last_error());
  tpsh_tensor_free(a);
  CHECK(tpsh_fill(S, a, 1) == TPSH_EINVAL && strstr(tpsh_last_error(), "freed"), "freed tensor");
  CHECK(!tpsh_tensor_alive(a), "freed is not alive");
  tpsh_tensor_release(a);
  tpsh_tensor_release(b);
  tpsh_tensor_release(c);
}

static void test_streams_events(void) {
  tpsh_stream *side = tpsh_stream_create(TPSH_PRIORITY_HIGH, "side");
  CHECK(side && strcmp(tpsh_stream_name(side), "side") == 0, "stream name");
  CHECK(tpsh_stream_create(7, "x") == NULL, "bad priority refused");
  /* the bounds themselves: high (1) and low (-1) are the last accepted (mutation audit: 2 passed) */
  CHECK(tpsh_stream_create(TPSH_PRIORITY_HIGH + 1, "x") == NULL && tpsh_stream_create(TPSH_PRIORITY_LOW - 1, "x") == NULL,
        "a priority just past high or low refused");
  tpsh_event *e0 = tpsh_event_create(1), *e1 = tpsh_event_create(1);
  double t0 = tpsh_now_ms();
  tpsh_event_record(e0, side);
  tpsh_spin(side, 80);
  tpsh_event_record(e1, side);
  CHECK(tpsh_now_ms() - t0 < 40, "enqueue returns at once");
  CHECK(tpsh_event_query(e1) == 0 && tpsh_stream_query(side) == 0, "pending while spinning");
  /* the default stream waits for side: a fill there lands after the spin */
  tpsh_tensor *x = vec(8, TPSH_F64);
  tpsh_stream_wait_event(S, e1);
  tpsh_fill(S, x, 3);
  CHECK(at(x, 7) == 3, "value after cross-stream wait");
  CHECK(tpsh_now_ms() - t0 >= 75, "the wait really waited (%.1f ms)", tpsh_now_ms() - t0);
  double ms = 0;
  CHECK(tpsh_event_elapsed(e0, e1, &ms) == TPSH_OK && ms >= 75 && ms < 400, "elapsed %.2f ms", ms);
  tpsh_event *untimed = tpsh_event_create(0);
  CHECK(tpsh_event_elapsed(untimed, e1, &ms) == TPSH_EINVAL, "elapsed needs timing events");
  CHECK(tpsh_event_query(untimed) == 1, "unrecorded event is complete");
  tpsh_event_release(untimed);
  tpsh_event_release(e0);
  tpsh_event_release(e1);
  tpsh_tensor_release(x);
  tpsh_stream_release(side);
}

/* A block used by another stream must not be reused before that stream is done with it. */
static void test_stream_ordered_free(void) {
  enum { N = 1 << 16 };
  tpsh_stream *side = tpsh_stream_create(0, "reader");
  tpsh_tensor *src = vec(N, TPSH_F64), *dst = vec(N, TPSH_F64);
  tpsh_fill(S, src, 5);
  tpsh_stream_wait_stream(side, S);
  tpsh_spin(side, 100);
  tpsh_copy(side, dst, src);            /* reads src 100 ms from now */
  tpsh_tensor_release(src);             /* the last reference: freed in stream order */
  for (int i = 0; i < 16; i++) {        /* fresh allocations scribble over whatever they get */
    tpsh_tensor *junk = vec(N, TPSH_F64);
    tpsh_fill(S, junk, -1);
    tpsh_tensor_release(junk);
  }
  tpsh_stream_synchronize(side);
  double v[N];
  tpsh_to_host(side, dst, v);
  int ok = 1;
  for (int i = 0; i < N; i++) ok &= v[i] == 5;
  CHECK(ok, "reader saw its data intact after the free");
  tpsh_tensor_release(dst);
  tpsh_stream_release(side);
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");
}

/* The caching allocator (alloc.c): size classes, the same stream's immediate reuse, another stream's
 * only once the freeing stream has passed the free, a block other streams used held until their
 * events complete, the counters, and empty_cache. */
static void *data_of(const tpsh_tensor *t) { return tpsh_tensor_data(t); }

static void test_caching_allocator(void) {
  tpsh_alloc_stats *st = tpsh_alloc_stats_get();
  if (!st->caching) return;                        /* TPSH_NO_MEMORY_CACHING=1 */
  tpsh_stream *side = tpsh_stream_create(0, "alloc-side");
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");
  /* a size class: 5000 bytes round up to 5120 (a quarter of 4096 above it) */
  double a0 = st->allocated;
  tpsh_tensor *x = vec(1250, TPSH_F32);
  CHECK(st->allocated - a0 == 5120, "5000 bytes hold a block of 5120 (%g)", st->allocated - a0);
  void *p = data_of(x);
  tpsh_spin(S, 100);                               /* S is busy past the checks below */
  tpsh_tensor_release(x);                          /* freed in S's order */
  CHECK(st->allocated == a0 && st->cached_bytes >= 5120, "cached, not allocated");
  tpsh_tensor *y = vec(1280, TPSH_F32);            /* 5120 bytes: the same class */
  CHECK(data_of(y) == p, "S takes its own freed block back at once");
  tpsh_tensor_release(y);
  double hits = st->cache_hits;
  tpsh_tensor *z = tpsh_tensor_empty(1, (int64_t[]){1250}, TPSH_F32, side);
  CHECK(data_of(z) != p, "another stream does not, while S has not passed the free");
  tpsh_tensor_release(z);                          /* cached on side */
  CHECK(tpsh_stream_synchronize(S) == TPSH_OK, "S done");
  z = tpsh_tensor_empty(1, (int64_t[]){1250}, TPSH_F32, side);
  CHECK(data_of(z) != p && st->cache_hits == hits + 1, "side's own block first");
  tpsh_tensor *w = tpsh_tensor_empty(1, (int64_t[]){1250}, TPSH_F32, side);
  CHECK(data_of(w) == p, "then S's, once S has passed its free");
  tpsh_tensor_release(z);
  tpsh_tensor_release(w);
  /* a block another stream read waits for that stream, even for its own stream */
  tpsh_tensor *u = vec(1250, TPSH_F32), *v = tpsh_tensor_empty(1, (int64_t[]){1250}, TPSH_F32, side);
  tpsh_stream_wait_stream(side, S);
  tpsh_spin(side, 100);
  tpsh_copy(side, v, u);                           /* side reads u later */
  void *pu = data_of(u);
  tpsh_tensor_release(u);
  CHECK(st->pending_blocks == 1, "u waits for side's event (%g pending)", st->pending_blocks);
  int reused = 0;
  for (int i = 0; i < 4; i++) {
    tpsh_tensor *t = vec(1250, TPSH_F32);
    reused |= data_of(t) == pu;
    tpsh_tensor_release(t);
  }
  CHECK(!reused, "u's block is not handed out while side may still read it");
  CHECK(tpsh_synchronize() == TPSH_OK && st->pending_blocks == 0, "synchronize drains the pending free");
  tpsh_tensor_release(v);
  /* empty_cache gives every cached block back */
  double cached = st->cached_bytes, back = st->backend_frees;
  CHECK(tpsh_empty_cache() == cached && st->cached_bytes == 0 && st->cached_blocks == 0 &&
        st->backend_frees > back, "empty_cache: %g bytes back", cached);
  CHECK(st->reserved == st->allocated, "reserved is what live blocks hold once the cache is empty (%g, %g)",
        st->reserved, st->allocated);
  tpsh_stream_release(side);
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");
}

/* Work tickets (work.c): a ticket follows its event until the event completes and is reused; a stale
 * ticket reads as completed; completion is inferred in stream order; Works dropped unwaited do not make
 * the table grow without bound. */
static double take_recorded(tpsh_stream *s) {
  double t = tpsh_work_take(s);
  tpsh_event_record(tpsh_work_event(t), s);
  return t;
}

static void test_work_tickets(void) {
  tpsh_stream *side = tpsh_stream_create(0, "work"), *other = tpsh_stream_create(0, "other");
  double a = tpsh_work_take(side);
  CHECK(a >= 0 && tpsh_work_event(a) != NULL, "take: %s", tpsh_last_error());
  tpsh_spin(side, 60);
  tpsh_event_record(tpsh_work_event(a), side);
  CHECK(tpsh_work_query(a) == 0, "pending while the stream spins");
  double b = tpsh_work_take(side);                 /* a is pending: a second slot */
  CHECK(b >= 0 && b != a && tpsh_work_event(b) != tpsh_work_event(a), "a pending slot is not reused");
  tpsh_work_drop(b);                               /* never recorded: back to the free list */
  CHECK(tpsh_work_event(b) == NULL && tpsh_work_query(b) == 1, "a dropped ticket is stale");
  tpsh_tensor *x = vec(4, TPSH_F64);
  CHECK(tpsh_work_wait(a, S) == TPSH_OK, "wait");
  double t0 = tpsh_now_ms();
  tpsh_fill(S, x, 2);
  CHECK(at(x, 0) == 2 && tpsh_now_ms() - t0 > 20, "the default stream waited for the work's stream");
  CHECK(tpsh_work_block(a) == TPSH_OK && tpsh_work_event(a) == NULL, "block recycles the slot");
  CHECK(tpsh_work_query(a) == 1 && tpsh_work_wait(a, S) == TPSH_OK && tpsh_work_block(a) == TPSH_OK,
        "a stale ticket is completed for every call");
  double c = tpsh_work_take(side);
  CHECK(c >= 0 && c != a && tpsh_work_event(c) != NULL, "the slot comes back with a new generation");
  CHECK(tpsh_work_event(a) == NULL && tpsh_work_query(a) == 1,
        "the stale ticket does not name its slot's new Work (work.c's generation check)");
  tpsh_work_drop(c);

  /* stream order: blocking on the newer Work of a stream completes the older ones there, not elsewhere */
  tpsh_spin(other, 80);
  double on_other = take_recorded(other);
  tpsh_spin(side, 30);
  double older = take_recorded(side), newer = take_recorded(side);
  CHECK(tpsh_work_block(newer) == TPSH_OK && tpsh_work_event(older) == NULL, "older Works of the stream retired");
  CHECK(tpsh_work_event(on_other) != NULL && tpsh_work_query(on_other) == 0, "another stream's Work still pending");
  CHECK(tpsh_stream_synchronize(other) == TPSH_OK && tpsh_work_event(on_other) == NULL,
        "synchronising a stream retires its Works");
  double s1 = take_recorded(side), s2 = take_recorded(other);
  CHECK(tpsh_synchronize() == TPSH_OK && tpsh_work_event(s1) == NULL && tpsh_work_event(s2) == NULL,
        "tp.synchronize retires every Work");
  /* a query that sees its Work complete retires it and the older ones of its stream, as a block does
   * (mutation audit: work.c could leave them busy, their tensors held, until the next host wait) */
  double q1 = take_recorded(side), q2 = take_recorded(side);
  CHECK(tpsh_event_synchronize(tpsh_work_event(q2)) == TPSH_OK && tpsh_work_event(q1) != NULL,
        "an event wait behind work.c's back retires nothing");
  CHECK(tpsh_work_query(q2) == 1 && tpsh_work_event(q2) == NULL && tpsh_work_event(q1) == NULL,
        "a query that says done retires the Work and the older ones of its stream");

  /* dropped Works, never waited for: takes reclaim completed slots once the table is large */
  tpsh_event *mark = tpsh_event_create(0);
  for (int i = 0; i < 10000; i++) {
    take_recorded(side);
    if (i % 100 == 99) {                          /* at most 100 in flight, and work.c is not told */
      tpsh_event_record(mark, side);
      tpsh_event_synchronize(mark);
    }
  }
  tpsh_event_release(mark);
  int grown = tpsh_work_slots();
  tpsh_stream_synchronize(side);
  /* the table grows unqueried to 256 slots, then by at most the Works in flight and a batch */
  CHECK(grown <= 512, "slots stay bounded: %d after 10000 dropped Works", grown);
  /* a stream far behind the host: a failed reclaim grows the table by a batch of 64, so that the next
   * takes do not query again (one query per take made the host the bottleneck of small collectives) */
  int n0 = tpsh_work_slots();
  CHECK(n0 >= 256, "the table is past its unqueried size: %d", n0);
  tpsh_spin(side, 100);
  for (int i = 0; i <= n0; i++) take_recorded(side);
  CHECK(tpsh_work_slots() == n0 + 64, "one pending reclaim grows by a batch: %d slots after %d", tpsh_work_slots(), n0);
  for (int i = 0; i < 63; i++) take_recorded(side);
  CHECK(tpsh_work_slots() == n0 + 64, "the batch serves the next takes: %d", tpsh_work_slots());
  tpsh_stream_synchronize(side);
  CHECK(tpsh_work_block(-1) == TPSH_EINVAL && strstr(tpsh_last_error(), "not a Work ticket"), "bad ticket: %s",
        tpsh_last_error());
  CHECK(tpsh_work_query(1e12) < 0, "a ticket from no slot");
  CHECK(tpsh_work_take(NULL) < 0, "take needs a stream");
  tpsh_tensor_release(x);
  tpsh_stream_release(other);
  tpsh_stream_release(side);
}

/* A Work ticket holds the storages of the collective's tensors until it is waited on or known complete
 * (tpsh_batch_end_work), so that a tensor dropped right after an async call keeps its memory. */
static void test_work_keeps_tensors(void) {
  tpsh_stream *side = tpsh_stream_create(0, "keeper");
  tpsh_group *w = tpsh_world();
  tpsh_alloc_stats *st = tpsh_alloc_stats_get();
  tpsh_synchronize();
  double live0 = st->bytes_live;
  tpsh_spin(side, 60);
  tpsh_tensor *y = vec(1 << 18, TPSH_F32);                  /* 1 MiB */
  CHECK(tpsh_batch_begin(w) == TPSH_OK && tpsh_all_reduce(NULL, w, y, y, TPSH_SUM) == TPSH_OK, "recorded");
  double t = tpsh_batch_end_work(side, w, S);
  CHECK(t >= 0 && tpsh_work_query(t) == 0, "a pending ticket: %s", tpsh_last_error());
  tpsh_tensor_release(y);
  CHECK(st->bytes_live - live0 == 1 << 20, "the ticket holds the dropped tensor's memory (%g bytes live)",
        st->bytes_live - live0);
  CHECK(tpsh_work_block(t) == TPSH_OK && st->bytes_live == live0, "released once complete (%g bytes live)",
        st->bytes_live - live0);
  /* waited on from a stream: released at once, the free ordered after the wait */
  tpsh_spin(side, 30);
  y = vec(1 << 18, TPSH_F32);
  tpsh_batch_begin(w);
  tpsh_all_reduce(NULL, w, y, y, TPSH_SUM);
  t = tpsh_batch_end_work(side, w, S);
  tpsh_tensor_release(y);
  CHECK(tpsh_work_wait(t, S) == TPSH_OK && st->bytes_live == live0 && tpsh_work_query(t) == 0,
        "a wait lets the tensors go while the Work is pending");
  /* a failed issue drops the batch and its references, and issues nothing */
  y = vec(4, TPSH_F32);
  uint64_t seq = tpsh_group_seq(w);
  tpsh_batch_begin(w);
  tpsh_all_reduce(NULL, w, y, y, TPSH_SUM);
  CHECK(tpsh_batch_end_work(NULL, w, S) < 0 && tpsh_group_seq(w) == seq, "no stream: an error, nothing issued");
  CHECK(tpsh_batch_end_work(side, w, S) < 0 && strstr(tpsh_last_error(), "no batch is open"), "the batch is gone");
  tpsh_tensor_release(y);
  CHECK(tpsh_synchronize() == TPSH_OK && st->bytes_live == live0 && tpsh_stream_query(S) == 1 &&
        tpsh_stream_query(side) == 1, "synchronize leaves every stream idle after the frees it caused");
  tpsh_stream_release(side);
}

/* tpsh_collective_work: the one-call path of Lua's collectives, the same checks and Work as the batch
 * path; a failure leaves no batch open and issues nothing. */
static void test_collective_work(void) {
  tpsh_group *w = tpsh_world();
  tpsh_tensor *y = vec(8, TPSH_F32), *z = vec(3, TPSH_F32);
  tpsh_fill(S, y, 2.0);
  uint64_t seq = tpsh_group_seq(w);
  double t = tpsh_collective_work(S, w, S, TPSH_C_ALL_REDUCE, y, y, 0, TPSH_SUM);
  CHECK(t >= 0 && tpsh_group_seq(w) == seq + 1, "an all_reduce issued with a ticket: %s", tpsh_last_error());
  CHECK(tpsh_work_block(t) == TPSH_OK, "its Work completes");
  double got = at(y, 7);
  CHECK(got == 2.0 * tpsh_group_size(w), "the sum over ranks (%g)", got);
  double bad = tpsh_collective_work(S, w, S, TPSH_C_ALL_REDUCE, y, z, 0, TPSH_SUM);
  CHECK(bad < 0 && strstr(tpsh_last_error(), "expected shape"), "a shape mismatch: %s", tpsh_last_error());
  bad = tpsh_collective_work(S, w, S, 99, y, y, 0, TPSH_SUM);
  CHECK(bad < 0 && strstr(tpsh_last_error(), "unknown collective kind 99"), "a bad kind: %s", tpsh_last_error());
  CHECK(tpsh_collective_work(NULL, w, S, TPSH_C_ALL_REDUCE, y, y, 0, TPSH_SUM) < 0, "no stream: an error");
  CHECK(tpsh_group_seq(w) == seq + 1, "the failures issued nothing");
  CHECK(tpsh_batch_begin(w) == TPSH_OK, "and left no batch open");
  /* inside a user batch the call is refused and the batch stays as it was */
  CHECK(tpsh_collective_work(S, w, S, TPSH_C_ALL_REDUCE, y, y, 0, TPSH_SUM) < 0 &&
        strstr(tpsh_last_error(), "already open"), "an open batch: %s", tpsh_last_error());
  CHECK(tpsh_all_reduce(NULL, w, y, y, TPSH_SUM) == TPSH_OK && tpsh_batch_end(S, w, S, NULL, NULL) == TPSH_OK &&
        tpsh_group_seq(w) == seq + 2, "the open batch still records and issues");
  /* all_reduce between two views of one storage (Lua passes one tensor; the C call takes two): views
   * that overlap without starting at the same element are refused; the same elements are in place */
  {
    tpsh_tensor *lo = tpsh_tensor_narrow(y, 0, 0, 4), *hi = tpsh_tensor_narrow(y, 0, 2, 4);
    tpsh_tensor *alias = tpsh_tensor_narrow(y, 0, 0, 4);
    CHECK(tpsh_all_reduce(S, w, hi, lo, TPSH_SUM) == TPSH_EINVAL &&
          strstr(tpsh_last_error(), "input and output overlap without being the same tensor"),
          "all_reduce of overlapping views: %s", tpsh_last_error());
    CHECK(tpsh_group_seq(w) == seq + 2, "the refusal issued nothing");
    CHECK(tpsh_all_reduce(S, w, alias, lo, TPSH_SUM) == TPSH_OK && tpsh_group_seq(w) == seq + 3,
          "the same elements through another view are in place: %s", tpsh_last_error());
    seq++;
    tpsh_tensor_release(lo);
    tpsh_tensor_release(hi);
    tpsh_tensor_release(alias);
  }
  /* two storages (reduce_scatter: the input and the output), dropped at once: the ticket keeps both */
  int n = tpsh_group_size(w);
  tpsh_tensor *in = vec(n * 64, TPSH_F32), *out = vec(64, TPSH_F32);      /* at() reads 64 at most */
  tpsh_fill(S, in, 1.0);
  tpsh_alloc_stats *st = tpsh_alloc_stats_get();
  double live = st->bytes_live;
  t = tpsh_collective_work(S, w, S, TPSH_C_REDUCE_SCATTER, out, in, 0, TPSH_SUM);
  CHECK(t >= 0, "a reduce_scatter: %s", tpsh_last_error());
  tpsh_tensor_release(in);
  CHECK(st->bytes_live == live, "its input is kept by the ticket (%g bytes freed)", live - st->bytes_live);
  CHECK(tpsh_work_block(t) == TPSH_OK && at(out, 0) == n, "then completes with the sum (%g)", at(out, 0));
  CHECK(st->bytes_live == live - (double)n * 256, "and lets the input go (%g bytes freed)", live - st->bytes_live);
  tpsh_tensor_release(out);
  /* check mode takes the batch path (the sanitizer reads the batch's descriptors): same result */
  tpsh_check_enable(1);
  tpsh_fill(S, y, 1.0);
  t = tpsh_collective_work(S, w, S, TPSH_C_ALL_REDUCE, y, y, 0, TPSH_SUM);
  CHECK(t >= 0 && tpsh_work_block(t) == TPSH_OK && at(y, 0) == n, "in check mode: %s", tpsh_last_error());
  tpsh_check_enable(0);
  tpsh_tensor_release(y);
  tpsh_tensor_release(z);
}

/* A reclaim (a take with no idle slot, past the unqueried size) retires the completed oldest Works of
 * the lane it queried, and only those: the pending Works behind them keep their slots and tickets. */
static void test_work_reclaim_keeps_pending(void) {
  tpsh_stream *side = tpsh_stream_create(0, "reclaim");
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");
  int n = tpsh_work_slots();
  CHECK(n >= 256, "the table is past its unqueried size: %d", n);
  tpsh_event *mark = tpsh_event_create(0);
  for (int i = 0; i < 64; i++) take_recorded(side);        /* complete, but work.c is not told */
  tpsh_event_record(mark, side);
  tpsh_event_synchronize(mark);
  tpsh_event_release(mark);
  tpsh_spin(side, 1000);
  double pending = take_recorded(side), last = pending;
  for (int i = 65; i < n; i++) last = take_recorded(side); /* every slot busy now */
  double t = take_recorded(side);                          /* queries the 64th oldest: complete */
  CHECK(t >= 0 && tpsh_work_slots() == n, "the reclaim found idle slots: %d slots, %d before", tpsh_work_slots(), n);
  CHECK(tpsh_work_event(pending) != NULL && tpsh_work_query(pending) == 0 && tpsh_work_query(last) == 0,
        "the Works behind the spin are still pending");
  CHECK(tpsh_stream_synchronize(side) == TPSH_OK && tpsh_work_event(pending) == NULL, "then complete");
  tpsh_stream_release(side);
}

/* Streams that nothing reaches any more are let go by their passive holders (stream.c): a long-lived
 * tensor used once on each of many short-lived streams, or a Work waited on from another stream, kept
 * every such stream (a worker thread each) until the tensor died or the host synchronised. */
static void test_abandoned_streams(void) {
  tpsh_tensor *x = vec(4, TPSH_F32);
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");
  int before = tpsh_stream_count();
  for (int i = 0; i < 200; i++) {
    tpsh_stream *s = tpsh_stream_create(0, NULL);
    tpsh_fill(s, x, i);                                /* x's storage holds s for its free */
    tpsh_stream_synchronize(s);
    tpsh_stream_release(s);
  }
  CHECK(at(x, 0) == 199, "the fills ran: %g", at(x, 0));
  CHECK(tpsh_stream_count() - before <= 8, "a tensor's finished user streams are let go: %d kept",
        tpsh_stream_count() - before);
  tpsh_tensor_release(x);
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");

  before = tpsh_stream_count();
  for (int i = 0; i < 200; i++) {
    tpsh_stream *s = tpsh_stream_create(0, NULL);
    double t = take_recorded(s);
    tpsh_work_wait(t, S);                              /* a stream-side wait: the lane keeps s */
    tpsh_event_synchronize(tpsh_work_event(t));        /* complete, but work.c is not told */
    tpsh_stream_release(s);
  }
  CHECK(tpsh_stream_count() - before <= 2, "Work lanes let go of finished streams: %d kept",
        tpsh_stream_count() - before);
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");
}

/* A stream's key (the flight record's and the watchdog's) is never a freed stream's: malloc hands the
 * next stream the freed one's address, and a CUDA collective left "not known complete" on the freed
 * stream then seemed to sit on the new one, before its collectives. */
static void test_stream_keys(void) {
  const void *keys[64];
  const tpsh_stream *addrs[64];
  int same_address = 0;
  for (int i = 0; i < 64; i++) {
    tpsh_stream *s = tpsh_stream_create(0, NULL);
    CHECK(s != NULL, "stream %d", i);
    keys[i] = tpsh_stream_key(s);
    addrs[i] = s;
    CHECK(keys[i] != NULL && keys[i] != TPSH_WAIT_ALL_STREAMS, "a key is neither NULL nor 'every stream'");
    for (int j = 0; j < i; j++) {
      CHECK(keys[j] != keys[i], "stream %d has stream %d's key", i, j);
      same_address += addrs[j] == addrs[i];
    }
    tpsh_stream_release(s);
  }
  printf("  (stream keys: %d streams reused a freed stream's address)\n", same_address);
  CHECK(tpsh_stream_key(NULL) == NULL, "no stream, no key");
}

/* A slot whose generations are spent is retired, not wrapped: a ticket is exact below 2^53 only. */
static void test_work_generations(void) {
  tpsh_stream *side = tpsh_stream_create(0, "gens");
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");
  tpsh_work_age(1u << 30);                           /* every idle slot at its last generation */
  int n = tpsh_work_slots() + 2, ok = 1, i;
  double first = -1, t = 0;
  for (i = 0; i < n && ok; i++) {                   /* each slot once more, and then new ones */
    t = take_recorded(side);
    if (first < 0) first = t;
    ok = t >= 0 && t < 9007199254740992.0 && tpsh_work_block(t) == TPSH_OK;
  }
  CHECK(ok, "take %d of %d after the generations ran out: %.17g %s", i, n, t, tpsh_last_error());
  CHECK(tpsh_work_query(first) == 1 && tpsh_work_block(first) == TPSH_OK, "a retired slot's last ticket is completed");
  tpsh_stream_release(side);
}

/* The growing text (core/text.c) and the two records built with it: "" when empty, every piece kept
 * across the buffer's growth (256 bytes first). */
/* An asynchronous error that a query of tpsh's own found (NCCL's, noted by cuda_nccl.c: this test stands
 * in for the communicator, which a CPU build has not) reaches every later wait, query or read of the
 * script, even through a ticket whose slot was reclaimed meanwhile (the aborted communicator's stream
 * drains, so its Works look complete), until Lua raises it (tpsh_async_error_raised, which capi.lua
 * calls as it reads the message). */
static int raised_ecomm(int rc, const char *text) {
  int ok = rc == TPSH_ECOMM && strstr(tpsh_last_error(), text) != NULL;
  tpsh_async_error_raised();
  return ok;
}

static void test_async_errors(void) {
  tpsh_stream *side = tpsh_stream_create(0, "async");
  double a = take_recorded(side);
  CHECK(tpsh_stream_synchronize(side) == TPSH_OK && tpsh_work_event(a) == NULL, "the ticket went stale");
  tpsh_async_error_note("NCCL asynchronous error on rank 0: remote process exited");
  tpsh_async_error_note("a later error, caused by the first");
  CHECK(tpsh_work_block(a) == TPSH_ECOMM && strstr(tpsh_last_error(), "remote process exited"),
        "a stale ticket's block reports the noted error: %s", tpsh_last_error());
  CHECK(tpsh_synchronize() == TPSH_ECOMM, "and so does every wait while Lua has not raised it");
  CHECK(tpsh_async_error_check() == TPSH_ECOMM, "the runner's check");
  tpsh_error(TPSH_EINVAL, "another error");
  tpsh_async_error_raised();
  CHECK(tpsh_work_block(a) == TPSH_ECOMM, "raising another error leaves it noted");
  CHECK(raised_ecomm(tpsh_work_block(a), "remote process exited") && tpsh_work_block(a) == TPSH_OK &&
        tpsh_async_error_check() == TPSH_OK, "raised: told once");
  tpsh_async_error_note("e2");
  int q = tpsh_work_query(a);
  CHECK(raised_ecomm(-q, "e2") && tpsh_work_query(a) == 1, "a stale ticket's query");
  tpsh_async_error_note("e3");
  CHECK(raised_ecomm(tpsh_work_wait(a, S), "e3") && tpsh_work_wait(a, S) == TPSH_OK, "a stale ticket's wait");
  tpsh_async_error_note("e4");
  CHECK(tpsh_work_block(-1) == TPSH_EINVAL, "a bad ticket is its own error");
  /* a call that failed on its own keeps its status and message through the settle (error.c's
     async_report), the noted error staying for the next call */
  tpsh_error(TPSH_EINVAL, "its own error");
  CHECK(tpsh_async_error_settle(TPSH_EINVAL) == TPSH_EINVAL && strcmp(tpsh_last_error(), "its own error") == 0,
        "a failed call's own error is not replaced by the noted one: %s", tpsh_last_error());
  CHECK(raised_ecomm(tpsh_synchronize(), "e4"), "and leaves the noted one to the next call: %s", tpsh_last_error());
  tpsh_async_error_note("e5");
  q = tpsh_stream_query(side);
  CHECK(raised_ecomm(-q, "e5") && tpsh_stream_query(side) == 1, "stream query");
  tpsh_async_error_note("e6");
  CHECK(raised_ecomm(tpsh_stream_synchronize(side), "e6") && tpsh_stream_synchronize(side) == TPSH_OK, "stream sync");
  tpsh_event *e = tpsh_event_create(0);
  tpsh_async_error_note("e7");
  q = tpsh_event_query(e);
  CHECK(raised_ecomm(-q, "e7") && tpsh_event_query(e) == 1, "an unrecorded event's query");
  tpsh_event_record(e, side);
  tpsh_async_error_note("e8");
  CHECK(raised_ecomm(tpsh_event_synchronize(e), "e8") && tpsh_event_synchronize(e) == TPSH_OK, "event sync");
  tpsh_async_error_note("e9");
  CHECK(raised_ecomm(tpsh_stream_wait_event(S, e), "e9") && tpsh_stream_wait_event(S, e) == TPSH_OK,
        "a stream-side wait (a table Work's w:wait)");
  tpsh_async_error_note("e10");
  double v = 0;
  tpsh_tensor *one = vec(1, TPSH_F64);
  tpsh_fill(S, one, 3);
  CHECK(raised_ecomm(tpsh_to_host(S, one, &v), "e10") && tpsh_to_host(S, one, &v) == TPSH_OK && v == 3, "a read");
  tpsh_tensor_release(one);
  /* what the script does not ask for does not consume it */
  tpsh_async_error_note("e11");
  double b = take_recorded(side);
  tpsh_work_drop(b);
  tpsh_tensor *x = vec(4, TPSH_F32);
  tpsh_fill(side, x, 1);
  tpsh_tensor_release(x);
  CHECK(raised_ecomm(tpsh_synchronize(), "e11"), "kept until asked: %s", tpsh_last_error());
  tpsh_event_release(e);
  tpsh_stream_release(side);
}

static void test_texts(void) {
  tpsh_text t = {0};
  char *s = tpsh_text_take(&t);
  CHECK(s && strcmp(s, "") == 0, "an empty text is \"\": %s", s ? s : "NULL");
  free(s);
  char want[4096] = "";
  for (int i = 0; i < 300; i++) {
    tpsh_text_appendf(&t, "%d,", i);
    snprintf(want + strlen(want), sizeof want - strlen(want), "%d,", i);
  }
  s = tpsh_text_take(&t);
  CHECK(s && strcmp(s, want) == 0, "300 pieces across growth: %.40s...", s ? s : "NULL");
  free(s);
  CHECK(t.buf == NULL && t.len == 0 && t.cap == 0, "take leaves the text empty");
  /* a piece that fills the buffer exactly, its terminating zero not fitting, is written again after
     the growth, not kept cut by one byte */
  char exact[257];
  memset(exact, 'a', 256);
  exact[256] = 0;
  tpsh_text_appendf(&t, "%s", exact);
  tpsh_text_appendf(&t, "%s", "b");
  s = tpsh_text_take(&t);
  CHECK(s && strlen(s) == 257 && s[255] == 'a' && s[256] == 'b', "a piece of exactly 256 bytes: length %zu",
        s ? strlen(s) : 0);
  free(s);
  /* a send to oneself and its receive, in one batch: one of each to peer 0 on the world (id 0) */
  tpsh_group *w = tpsh_world();
  tpsh_tensor *a = vec(4, TPSH_F32), *b = vec(4, TPSH_F32);
  tpsh_fill(S, a, 1);
  CHECK(tpsh_batch_begin(w) == TPSH_OK && tpsh_send(S, w, a, 0) == TPSH_OK && tpsh_recv(S, w, b, 0) == TPSH_OK &&
        tpsh_batch_end(S, w, NULL, NULL, NULL) == TPSH_OK, "a batch of a send and a receive to oneself: %s", tpsh_last_error());
  s = tpsh_p2p_ledger_text();
  unsigned long long sn = 0, rn = 0, sg = 1, rg = 2;
  CHECK(s && sscanf(s, "0 %llu %llx %llu %llx\n", &sn, &sg, &rn, &rg) == 4 && sn >= 1 && sn == rn && sg == rg,
        "the ledger's line for peer 0: %s", s ? s : "NULL");
  free(s);
  /* The signatures (p2p_ledger.c): where the backend does not compare each message (NCCL), a send and
     a receive of the same bytes but another dtype or count are a mismatch at the end of the script.
     Noted straight into the ledger (no message moves), compared as NCCL's backend would have it. */
  CHECK(tpsh_p2p_ledger_compare(MPI_COMM_WORLD) == TPSH_OK, "the pairs agree so far: %s", tpsh_last_error());
  tpsh_coll_args sig[2] = {{.kind = TPSH_C_SEND, .dtype = TPSH_I32, .peer = 0, .count = 4},
                           {.kind = TPSH_C_RECV, .dtype = TPSH_F32, .peer = 0, .count = 4}};
  CHECK(tpsh_p2p_ledger_note(w, sig, 2) == TPSH_OK, "noted: %s", tpsh_last_error());
  tpsh_backend bytes_alone = *tpsh_rt.be;
  const tpsh_backend *was = tpsh_rt.be;
  bytes_alone.checks_p2p_dtype = 0;
  tpsh_rt.be = &bytes_alone;
  int rc = tpsh_p2p_ledger_compare(MPI_COMM_WORLD);
  CHECK(rc == TPSH_EINVAL && strstr(tpsh_last_error(), "but not of the same dtypes and element counts"),
        "i32 x 4 sent, f32 x 4 received: %d %s", rc, tpsh_last_error());
  tpsh_rt.be = was;
  CHECK(tpsh_p2p_ledger_compare(MPI_COMM_WORLD) == TPSH_OK, "a backend that compares each message has raised "
        "already: %s", tpsh_last_error());
  tpsh_rt.be = &bytes_alone;            /* the same dtype and count received: the pairs agree again */
  sig[0].dtype = TPSH_F32;
  sig[1].dtype = TPSH_I32;
  CHECK(tpsh_p2p_ledger_note(w, sig, 2) == TPSH_OK, "noted: %s", tpsh_last_error());
  rc = tpsh_p2p_ledger_compare(MPI_COMM_WORLD);
  CHECK(rc == TPSH_EINVAL, "positional: f32 then i32 sent, i32 then f32 received still differ: %s", tpsh_last_error());
  tpsh_rt.be = was;
  s = tpsh_groups_collectives_text();
  CHECK(s != NULL, "the groups' record");
  free(s);
  tpsh_tensor_release(a);
  tpsh_tensor_release(b);
}

/* host_ending.c: a thread that ends the run asks the host for its --trace records. One run's worth: the
 * state machine is once per process, so this comes last. */
typedef struct asker { int status, result; const char *message; } asker;
static void *ask_thread(void *arg) {
  asker *a = arg;
  a->result = tpsh_host_ending_ask(a->status, a->message);
  return NULL;
}
static void *done_thread(void *arg) {
  tpsh_host_ending_done(arg);          /* says the line and holds this thread until the process ends */
  return NULL;
}

static void test_host_ending(void) {
  CHECK(tpsh_host_ending_ask(1, "not enabled") == 0, "without --trace no one is asked");
  tpsh_host_ending_enable();
  tpsh_spin(S, 1500);
  asker first = {124, -1, "the watchdog's report"}, second = {143, -1, "a signal"};
  pthread_t a, c, d;
  double t0 = tpsh_now_ms();
  pthread_create(&a, NULL, ask_thread, &first);
  int rc = tpsh_stream_synchronize(S);
  double waited = tpsh_now_ms() - t0;
  CHECK(rc == TPSH_EENDED, "a host wait gives way once asked: %d %s", rc, tpsh_last_error());
  CHECK(waited < 1000, "at once, not after the spin: %.0f ms", waited);
  CHECK(tpsh_host_ending_begin() == 1 && tpsh_host_ending_begin() == 0, "the host begins once");
  CHECK(tpsh_host_ending_status() == 124 && strcmp(tpsh_host_ending_message(), "the watchdog's report") == 0,
        "the asker's status and message: %d %s", tpsh_host_ending_status(), tpsh_host_ending_message());
  pthread_create(&c, NULL, ask_thread, &second);      /* a second asker, while the host writes */
  usleep(100 * 1000);
  CHECK(second.result == -1, "a second asker waits for the writing under way");
  pthread_create(&d, NULL, done_thread, "tpsh: test_core's own line, said by tpsh_host_ending_done");
  pthread_detach(d);
  pthread_join(a, NULL);
  pthread_join(c, NULL);
  CHECK(first.result == 1 && second.result == 1, "both askers learn that the host wrote: %d %d", first.result,
        second.result);
  CHECK(tpsh_stream_synchronize(S) == TPSH_OK, "waits go on as before once the host is done: %s", tpsh_last_error());
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (tpsh_init("cpu", -1) != TPSH_OK) { printf("init failed: %s\n", tpsh_last_error()); return 1; }
  S = tpsh_default_stream();
  test_views();
  test_ops_checks();
  test_streams_events();
  test_collective_work();
  test_stream_ordered_free();
  test_caching_allocator();
  test_work_tickets();
  test_work_reclaim_keeps_pending();
  test_work_keeps_tensors();
  test_abandoned_streams();
  test_stream_keys();
  test_work_generations();
  test_async_errors();
  test_texts();
  test_host_ending();
  tpsh_stream_release(S);
  tpsh_shutdown();
  MPI_Finalize();
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
