/*
 * backend.h: the seam between the core and a backend: what a backend implements (tpsh_backend, one
 * vtable, documented member by member) and what of the core it may call. A backend's files include this
 * header (through their own: cpu_backend.h, cpu_kernels.h, cuda_backend.h) and nothing else of core/.
 *
 * What a backend may call, beside the vtable's arguments:
 *  - the objects and their helpers of core/internal.h: tensors, storages, streams, events (their impl),
 *    tpsh_kargs, tpsh_coll_args, tpsh_rt, tpsh_error and the interrupt and asynchronous-error hooks;
 *  - core/check.h's hooks that a backend calls: tpsh_flight_mark (a backend that marks_collectives),
 *    tpsh_watch_wait_begin_on / tpsh_watch_wait_end around a host wait of its own, and
 *    tpsh_watchdog_abort_hook / tpsh_watchdog_hold_if_ending (the CUDA backend's NCCL aborts);
 *  - core/random.h and core/dtype_convert.h: the numbers and roundings every backend must give alike;
 *  - core/pointwise.h: the table of element-wise ops (TPSH_K_UNARY, TPSH_K_BINARY) and their formulas;
 *  - in C (not the .cu kernels): a group's ranks and communicators and tpsh_group_note_failure
 *    (core/group.h), and the table of collective kinds (core/coll_kinds.h).
 */
#ifndef TPSH_BACKEND_H
#define TPSH_BACKEND_H

#include "core/internal.h"
#include "core/check.h"
#include "core/random.h"
#include "core/pointwise.h"
#ifndef __cplusplus   /* C only: MPI types, designated array initializers */
#include "core/coll_kinds.h"
#include "core/dtype_convert.h"
#include "core/group.h"
#endif

/* ==== the vtable ================================================================================ */
typedef struct tpsh_backend {
  const char *name;
  /* 1: the backend marks each collective started / completed in the flight recorder itself (CPU
   * workers around their MPI calls); 0: host synchronisation settles them (tpsh_flight_settle). */
  int marks_collectives;
  /* the most elements a rank's buffer of one collective may have (0: no limit); the core refuses more
   * before it numbers the collective (collective.c check_counts) */
  int64_t max_coll_count;
  /* 1: each received message is compared with its send's dtype and element count as it arrives (the
   * CPU backend's tag); 0: the bytes alone match them (NCCL), and the end of the script compares the
   * pairs' signatures (p2p_ledger.c) */
  int checks_p2p_dtype;
  int (*init)(int device);
  void (*shutdown)(void);
  const char *(*versions)(void);
  /* memory, under the core's caching allocator (alloc.c): alloc is immediate; free_async releases after
   * the work already enqueued on s. alloc with s NULL: memory that no stream's order holds up, usable by
   * any stream at once (a graph pool's, while streams capture and nothing may be enqueued on them) */
  void *(*alloc)(size_t nbytes, tpsh_stream *s);
  int (*free_async)(void *ptr, size_t nbytes, tpsh_stream *s);
  /* points in a stream's order, for the caching allocator: stream_mark is a token for the work enqueued
   * on s so far, stream_passed says whether s has completed it (1) or may not have yet (0). Cheap (no
   * system call where the answer is known), and neither takes a stream's error nor orders the host. */
  uint64_t (*stream_mark)(tpsh_stream *s);
  int (*stream_passed)(tpsh_stream *s, uint64_t mark);
  /* hands what the backend's own pool keeps of freed memory back to the system (tp.empty_cache, once
   * every stream is idle) */
  void (*trim)(void);
  /* streams (s->priority and s->name are set before stream_create) */
  int (*stream_create)(tpsh_stream *s);
  void (*stream_destroy)(tpsh_stream *s);            /* returns once pending work is done */
  int (*stream_synchronize)(tpsh_stream *s);
  int (*stream_query)(tpsh_stream *s);
  /* events */
  int (*event_create)(tpsh_event *e);
  void (*event_destroy)(tpsh_event *e);
  int (*event_record)(tpsh_event *e, tpsh_stream *s);
  int (*stream_wait_event)(tpsh_stream *s, tpsh_event *e);
  int (*event_query)(tpsh_event *e);
  int (*event_synchronize)(tpsh_event *e);
  int (*event_elapsed)(tpsh_event *a, tpsh_event *b, double *ms);
  /* kernels */
  int (*launch)(tpsh_stream *s, const tpsh_kargs *k);
  /* blocking transfers: wait for s, then copy k->t[0] (any strides) to a contiguous host buffer */
  int (*to_host)(tpsh_stream *s, const tpsh_kargs *k, void *dst);
  /* copy a contiguous host buffer into k->t[0] (contiguous); src may be reused when this returns */
  int (*from_host)(tpsh_stream *s, const tpsh_kargs *k, const void *src);
  /* collectives: set up / tear down the backend's communicator of a group (collective over the
   * group's ranks: every member calls it, in the same order), and enqueue n collectives on s as one
   * group launch (n == 1 for a plain call; g:batch gives n > 1, as ncclGroupStart/End). */
  int (*group_init)(tpsh_group *g);
  void (*group_destroy)(tpsh_group *g);
  /* A group made from a parent (tp.new_group: the world; g:split: g) has g->split_parent and
   * g->split_color set while group_init runs, for a backend that derives the communicator from the
   * parent's (ncclCommSplit), which is collective over the parent: its members that are in no new
   * group take part through group_split_out (optional). Before it, every member of the parent says
   * through group_split_ready whether its side of the parent's communicator can be split (a failed
   * one cannot), and the ranks agree (group.c): one that cannot must not leave the others in the
   * split. */
  int (*group_split_ready)(tpsh_group *parent);
  int (*group_split_out)(tpsh_group *parent);
  int (*collectives)(tpsh_stream *s, tpsh_group *g, int n, const tpsh_coll_args *c);
  /* graphs (tp.graph, core/graph.c). The core records every op, collective and event of a capture and
   * can replay the record by enqueuing it again, which is all the CPU backend does (these are NULL).
   * A backend that captures natively is also handed each op while s captures (launch, collectives,
   * event_record, stream_wait_event on the capturing streams), and replays in one launch:
   * graph_begin: s starts capturing; a stream that waits for an event recorded in the capture joins it.
   * graph_end: the capture ends on every stream that joined it; *exec is the graph made ready to launch,
   * or NULL after abort (the core found it wrong, or the script's function raised), which must leave
   * every stream as it was before graph_begin.
   * graph_launch: exec runs once, after the work enqueued on s and before the work enqueued after it.
   * graph_destroy: frees exec; launches still in flight finish first. */
  int (*graph_begin)(tpsh_stream *s);
  int (*graph_end)(tpsh_stream *s, int abort, void **exec);
  int (*graph_launch)(void *exec, tpsh_stream *s);
  void (*graph_destroy)(void *exec);
  /* interop: the native objects behind a stream and a group (cudaStream_t, ncclComm_t; NULL where the
   * backend has none), for code that calls CUDA or NCCL itself through the FFI */
  void *(*stream_handle)(tpsh_stream *s);
  void *(*group_handle)(tpsh_group *g);
} tpsh_backend;

extern const tpsh_backend tpsh_backend_cpu;
#ifdef TPSH_WITH_CUDA
extern const tpsh_backend tpsh_backend_cuda;
#endif

#endif /* TPSH_BACKEND_H */
