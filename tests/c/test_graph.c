/*
 * test_graph.c: tp.graph's core through the C ABI alone (no Lua), on the CPU backend: the graph pool of
 * the caching allocator (a block freed in the capture serves its stream's next allocation there and no
 * one else's; the pool goes back to the cache once the graph is gone and its replays are done), the
 * holds on the tensors a graph uses, the refusals (TPSH_ECAPTURE) and the streams left usable, a stream
 * left unjoined, collectives counted at each replay, and events recorded in a capture. A world of one
 * rank. Prints one line per failed check and ends with "N passed, N failed".
 */
#include "tpsh.h"
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "check.h"             /* passed, failed, CHECK */

static tpsh_stream *S;

static tpsh_tensor *vec_on(int64_t n, tpsh_stream *s) { return tpsh_tensor_empty(1, &n, TPSH_F32, s); }

static float first(const tpsh_tensor *t) {
  float buf[2048];
  return tpsh_to_host(S, t, buf) == TPSH_OK ? buf[0] : -1;
}

static void test_pool(void) {
  tpsh_alloc_stats *st = tpsh_alloc_stats_get();
  if (!st->caching) return;                        /* TPSH_NO_MEMORY_CACHING=1: exact sizes */
  tpsh_stream *side = tpsh_stream_create(0, "graph-side");
  CHECK(tpsh_graph_begin(S, "pool") == TPSH_OK, "begin: %s", tpsh_last_error());
  CHECK(tpsh_graph_capture_active(), "a capture is open");
  tpsh_tensor *x = vec_on(1250, S);                /* a block of 5120 bytes */
  void *px = tpsh_tensor_data(x);
  tpsh_tensor_release(x);                          /* no op used it: back to the pool */
  tpsh_tensor *y = vec_on(1280, S);                /* the same class, the same stream */
  CHECK(tpsh_tensor_data(y) == px, "the capture's stream takes its freed block back");
  tpsh_tensor *z = vec_on(1250, side);
  void *pz = tpsh_tensor_data(z);
  CHECK(pz != px, "another allocation gets a block of its own");
  tpsh_fill(S, y, 3);
  tpsh_tensor_release(z);
  tpsh_graph *g = tpsh_graph_end();
  CHECK(g != NULL && !tpsh_graph_capture_active(), "end: %s", g ? "" : tpsh_last_error());
  tpsh_graph_info info;
  tpsh_graph_get_info(g, &info);
  CHECK(info.kernels == 1 && info.pool_bytes == 2 * 5120 && info.tensors == 1,
        "one kernel, two blocks of the pool, one tensor held (%g %g %g)", info.kernels, info.pool_bytes, info.tensors);
  int taken = 0;
  tpsh_tensor *t[8];
  for (int i = 0; i < 8; i++) {                   /* the cache never hands out a pool block */
    t[i] = vec_on(1250, i % 2 ? side : S);
    taken |= tpsh_tensor_data(t[i]) == px || tpsh_tensor_data(t[i]) == pz;
  }
  for (int i = 0; i < 8; i++) tpsh_tensor_release(t[i]);
  CHECK(!taken, "no allocation outside the capture gets the pool's memory");
  CHECK(tpsh_graph_replay(g, S) == TPSH_OK && first(y) == 3, "the replay fills y");
  tpsh_tensor_release(y);                          /* y's block stays the graph's */
  CHECK(tpsh_graph_replay(g, S) == TPSH_OK, "replay after y was dropped");
  tpsh_graph_release(g);
  CHECK(tpsh_synchronize() == TPSH_OK && st->pending_blocks == 0, "the pool's blocks are parked, then cached");
  taken = 0;
  for (int i = 0; i < 8; i++) {
    t[i] = vec_on(1250, side);
    taken |= tpsh_tensor_data(t[i]) == px || tpsh_tensor_data(t[i]) == pz;
  }
  for (int i = 0; i < 8; i++) tpsh_tensor_release(t[i]);
  CHECK(taken, "once the graph is gone its blocks serve any stream");
  /* a tensor made in a capture outlives its graph: its block stays its own, counted once */
  CHECK(tpsh_graph_begin(S, NULL) == TPSH_OK, "begin");
  tpsh_tensor *kept = vec_on(1250, S);
  tpsh_fill(S, kept, 4);
  g = tpsh_graph_end();
  tpsh_graph_replay(g, S);
  double allocated = st->allocated;
  tpsh_graph_release(g);
  CHECK(tpsh_synchronize() == TPSH_OK && st->allocated == allocated && first(kept) == 4,
        "the graph's release leaves a live tensor's memory alone (%g, %g)", st->allocated, allocated);
  tpsh_tensor_release(kept);
  CHECK(tpsh_synchronize() == TPSH_OK && st->allocated == allocated - 5120 && st->pending_blocks == 0,
        "its death frees it once (%g, %g)", st->allocated, allocated);
  tpsh_stream_release(side);
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");
}

static void test_holds_and_refusals(void) {
  tpsh_tensor *x = vec_on(16, S);
  tpsh_fill(S, x, 1);
  CHECK(tpsh_graph_begin(S, NULL) == TPSH_OK, "begin");
  CHECK(tpsh_graph_begin(S, NULL) == TPSH_EINVAL && strstr(tpsh_last_error(), "do not nest"), "nested: %s",
        tpsh_last_error());
  tpsh_add(S, x, x, x, 1);                         /* x = 2x at each replay */
  float buf[16];
  CHECK(tpsh_to_host(S, x, buf) == TPSH_ECAPTURE && strstr(tpsh_last_error(), "reads to the host"), "read: %s",
        tpsh_last_error());
  CHECK(tpsh_stream_synchronize(S) == TPSH_ECAPTURE, "synchronize refused");
  CHECK(tpsh_stream_query(S) == -TPSH_ECAPTURE, "query refused");
  CHECK(tpsh_host_barrier(tpsh_world(), NULL) == TPSH_ECAPTURE, "barrier refused");
  CHECK(tpsh_tensor_free(x) == TPSH_ECAPTURE, "a free of a tensor the graph uses refused");
  tpsh_graph *g = tpsh_graph_end();
  CHECK(g != NULL, "the refusals leave the capture open until it ends: %s", g ? "" : tpsh_last_error());
  CHECK(tpsh_tensor_free(x) == TPSH_EINVAL && strstr(tpsh_last_error(), "g:free()"), "free refused: %s",
        tpsh_last_error());
  tpsh_tensor_release(x);                          /* the graph keeps it */
  for (int i = 0; i < 3; i++) tpsh_graph_replay(g, S);
  tpsh_graph_release(g);
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize after the refusals");
  /* an aborted capture ran nothing and left the stream as it was */
  tpsh_tensor *y = vec_on(4, S);
  tpsh_fill(S, y, 5);
  CHECK(tpsh_graph_begin(S, NULL) == TPSH_OK, "begin");
  tpsh_fill(S, y, 7);
  tpsh_graph_abort();
  CHECK(!tpsh_graph_capture_active() && first(y) == 5, "nothing of an aborted capture ran");
  tpsh_tensor_release(y);
}

static void test_streams_events(void) {
  tpsh_stream *side = tpsh_stream_create(0, "graph-unjoined");
  tpsh_tensor *x = vec_on(4, S);
  CHECK(tpsh_graph_begin(S, NULL) == TPSH_OK, "begin");
  tpsh_fill(S, x, 1);
  CHECK(tpsh_fill(side, x, 2) == TPSH_ECAPTURE && strstr(tpsh_last_error(), "not part of the capture"),
        "a stream outside the capture: %s", tpsh_last_error());
  tpsh_stream_wait_stream(side, S);                /* side joins */
  CHECK(tpsh_fill(side, x, 2) == TPSH_OK, "a joined stream's op is recorded");
  tpsh_graph *g = tpsh_graph_end();
  CHECK(g == NULL && strstr(tpsh_last_error(), "stream 'graph-unjoined' has work in the capture"),
        "unjoined: %s", tpsh_last_error());
  /* an event of a capture is a point inside the graph */
  tpsh_event *e = tpsh_event_create(0), *outside = tpsh_event_create(0);
  tpsh_event_record(outside, S);
  CHECK(tpsh_graph_begin(S, NULL) == TPSH_OK, "begin");
  CHECK(tpsh_stream_wait_event(S, outside) == TPSH_ECAPTURE, "a wait for work outside the capture refused");
  tpsh_fill(S, x, 3);
  tpsh_event_record(e, S);
  g = tpsh_graph_end();
  CHECK(g != NULL, "end");
  CHECK(tpsh_stream_wait_event(side, e) == TPSH_ECAPTURE && tpsh_event_query(e) == -TPSH_ECAPTURE,
        "the captured event refused outside the graph");
  CHECK(tpsh_event_record(e, S) == TPSH_OK && tpsh_event_synchronize(e) == TPSH_OK, "recorded again: usable");
  tpsh_graph_release(g);
  tpsh_event_release(e);
  tpsh_event_release(outside);
  tpsh_tensor_release(x);
  tpsh_stream_release(side);
  CHECK(tpsh_synchronize() == TPSH_OK, "synchronize");
}

/* What dies during a capture that a capture may not do (a stream's destruction) waits for its end. */
static void test_deferred(void) {
  tpsh_stream *s = tpsh_stream_create(0, "graph-dies");
  int n = tpsh_stream_count();
  CHECK(tpsh_graph_begin(S, NULL) == TPSH_OK, "begin");
  tpsh_stream_release(s);
  CHECK(tpsh_stream_count() == n, "a stream released during the capture lives on");
  tpsh_graph_abort();
  CHECK(tpsh_stream_count() == n - 1, "and goes when it ends (%d streams, %d before)", tpsh_stream_count(), n);
}

static void test_collectives_counted_at_replay(void) {
  tpsh_group *w = tpsh_world();
  tpsh_tensor *x = vec_on(8, S);
  tpsh_fill(S, x, 2);
  uint64_t seq = tpsh_group_seq(w);
  CHECK(tpsh_graph_begin(S, NULL) == TPSH_OK, "begin");
  CHECK(tpsh_all_reduce(S, w, x, x, TPSH_SUM) == TPSH_OK, "a collective recorded");
  tpsh_graph *g = tpsh_graph_end();
  CHECK(g && tpsh_group_seq(w) == seq, "the capture issues nothing");
  for (int i = 0; i < 4; i++) tpsh_graph_replay(g, S);
  CHECK(tpsh_group_seq(w) == seq + 4 && first(x) == 2, "each replay issues it: %llu",
        (unsigned long long)(tpsh_group_seq(w) - seq));
  tpsh_graph_release(g);
  tpsh_tensor_release(x);
  tpsh_group_release(w);
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (tpsh_init("cpu", -1) != TPSH_OK) { printf("init failed: %s\n", tpsh_last_error()); return 1; }
  S = tpsh_default_stream();
  test_pool();
  test_holds_and_refusals();
  test_streams_events();
  test_deferred();
  test_collectives_counted_at_replay();
  tpsh_stream_release(S);
  tpsh_shutdown();
  MPI_Finalize();
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
