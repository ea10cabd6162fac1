/*
 * check.h: the hooks of the stream sanitizer (sanitizer.c), the collective mismatch check
 * (coll_match.c), the flight recorder (flight.c) and the watchdog (watchdog*.c), as others' files call
 * them. Each hook is one line at its call site. The sanitizer's hooks test tpsh_check_on first, so that
 * check mode costs one predictable branch per hook when it is off; the flight recorder and the
 * watchdog's host-wait marks are always on (a few stores per collective or host wait).
 */
#ifndef TPSH_CHECK_H
#define TPSH_CHECK_H

#include "tpsh.h"

struct tpsh_kargs;
struct tpsh_coll_args;

/* ==== stream sanitizer (sanitizer.c): only called when tpsh_check_on ============================ */
extern int tpsh_check_on;
/* For hooks that may refuse the call (strict mode): `TPSH_CHECK_HOOK(tpsh_check_launch(s, k));` */
#define TPSH_CHECK_HOOK(call) do { if (__builtin_expect(tpsh_check_on, 0)) { int rc_ = (call); if (rc_) return rc_; } } while (0)
int tpsh_check_launch(tpsh_stream *s, const struct tpsh_kargs *k);        /* t[0] written, t[1..] read */
int tpsh_check_host_read(tpsh_stream *s, const tpsh_tensor *t);           /* to_host: waits for s, reads t */
void tpsh_check_event_record(tpsh_event *e, tpsh_stream *s);
void tpsh_check_stream_wait_event(tpsh_stream *s, tpsh_event *e);
void tpsh_check_host_join_stream(tpsh_stream *s);                         /* synchronize, or query said done */
void tpsh_check_host_join_event(tpsh_event *e);
void tpsh_check_host_join_all(void);
void tpsh_check_free(tpsh_storage *st);                                   /* the storage's memory is released */
/* t's new storage, on its alloc_stream; reused_from: where its cached block was freed (NULL: a new block) */
void tpsh_check_alloc(const tpsh_tensor *t, const char *reused_from);
void tpsh_check_record_stream(tpsh_storage *st, tpsh_stream *s);
void tpsh_check_stream_destroy(tpsh_stream *s);                           /* its clock slot may be reused */
/* Who frees: tpsh's own temporaries (not reported: tpsh relies on its allocator by design), the
 * garbage collector (a Lua tensor died) or t:free() (set from Lua). */
enum { TPSH_FREE_INTERNAL = 0, TPSH_FREE_GC = 1, TPSH_FREE_EXPLICIT = 2 };
void tpsh_check_set_free_origin(int origin);
/* Around the launch of a batch's copies to all_gather's list outputs: their accesses are the
 * collective's, kept by its Work (a free never needs record_stream for them). */
void tpsh_check_kept_by_work(int on);
/* Collectives of one launch on s: inputs read, outputs written. held: the tensors the batch holds. */
int tpsh_check_collectives(tpsh_stream *s, tpsh_group *g, int n, const struct tpsh_coll_args *c, int nheld,
                           const tpsh_tensor *held);
/* The Lua caller's file:line of the call being made (interned; lives until the process ends): a
 * collective recorded into a batch keeps it, since the batch is checked only when it is issued. */
const char *tpsh_check_location(void);
/* Events die outside check mode too: free the clock an event recorded in check mode keeps. */
void tpsh_check_event_forget(tpsh_event *e);
#define TPSH_CHECK_EVENT_RELEASE(e) do { if ((e)->check_clock) tpsh_check_event_forget(e); } while (0)

/* ==== collective mismatch check (coll_match.c), check mode: every member compares, before enqueue == */
int tpsh_check_collectives_match(tpsh_group *g, int n, const struct tpsh_coll_args *c);
/* What every member of a group must pass alike for its collective number `number` on the group: check
 * mode compares these before the launch, and the watchdog compares the flight recorders' when a rank
 * has waited a second (a mismatch found there ends every rank at once, not at the timeout). */
typedef struct tpsh_coll_desc {
  uint64_t number;          /* collectives issued on the group before this one (coll_index) */
  int32_t kind, dtype, op, root;
  int64_t count;
} tpsh_coll_desc;
int tpsh_coll_desc_same(const tpsh_coll_desc *a, const tpsh_coll_desc *b);       /* number included */
/* "all_reduce(f32, 4 elements, op=sum)"; returns what snprintf returns */
int tpsh_coll_desc_format(const tpsh_coll_desc *d, char *buf, size_t len);
/* A group's digest of every collective issued on it (sends and receives aside), as tpsh_coll_desc_same
 * compares them: a sum of one hash per collective, of its number on the group and its description, so
 * members that issued the same ones have the same digest, and the difference of two digests of a rank
 * covers the collectives issued in between (the test runner compares that per test, the end of a
 * script the whole). Kept without check mode: it costs a few instructions a collective. */
uint64_t tpsh_coll_digest_term(int64_t number, const struct tpsh_coll_args *c);
/* Up to max of this rank's groups that have collectives: id, count and digest (group.c); returns how
 * many were written, or with out NULL how many there are. members: a hash of the group's world ranks,
 * since ids are agreed among a group's members only (two ranks' groups of one rank each may share an
 * id). failures: g->failures. */
typedef struct tpsh_group_digest { uint64_t id, members, collectives, digest, failures; } tpsh_group_digest;
int tpsh_groups_digests(tpsh_group_digest *out, int max);

/* ==== flight recorder (flight.c) ================================================================ */
enum { TPSH_FLIGHT_ENQUEUED = 0, TPSH_FLIGHT_STARTED = 1, TPSH_FLIGHT_COMPLETED = 2 };
/* The front end, once the collectives have their sequence numbers; sets each c[i].flight. */
void tpsh_flight_enqueue(tpsh_stream *s, tpsh_group *g, int n, struct tpsh_coll_args *c);
/* A backend, when the n collectives c (as issued) start or complete (CPU: the worker around its MPI
 * calls). */
void tpsh_flight_mark(const struct tpsh_coll_args *c, int n, int state);
/* After a successful host synchronisation of stream s (NULL: all streams), on backends whose
 * collectives are not marked by a worker (CUDA). */
void tpsh_flight_settle(const tpsh_stream *s);
/* The host begins host-side exchange number `index` of g (host_exchange.c), or has ended it (g NULL): the
 * group's count, and which one the host is in, for the watchdog. */
void tpsh_flight_host_exchange(struct tpsh_group *g, int64_t index);
/* Check mode's mismatch check (coll_match.c) compares collective number `index` (among g's collectives,
 * sends and receives aside) named op with the other members, or has ended (g NULL): for the watchdog,
 * which can then tell a member that will never issue it (one that has finished the script or the test). */
void tpsh_flight_match(struct tpsh_group *g, int64_t index, const char *op);
/* A host-side exchange on g (tp.barrier, tp.allgather, a group's creation, the trace's clock alignment):
 * a timed host wait, numbered on g, so that the watchdog ends a run whose ranks do not all come within
 * seconds (host_exchange.c). */
int tpsh_host_exchange_begin(struct tpsh_group *g, const char *what);   /* 0, or TPSH_EENDED */
void tpsh_host_exchange_end(void);

/* ==== watchdog (watchdog.c, watchdog_waits.c, watchdog_abort.c) ================================= */
int tpsh_watchdog_start(void);         /* tpsh_init: collective over the world (dups MPI_COMM_WORLD) */
void tpsh_watchdog_stop(void);         /* tpsh_shutdown, before MPI_Finalize */
/* tpsh_watch_wait_begin / _end (a timed host wait) are in tpsh.h: `tpsh test` labels its waits too. */
/* tpsh_watch_wait_begin for a wait that cannot end before everything enqueued on `stream` so far has (a
 * read to the host, stream:synchronize; TPSH_WAIT_ALL_STREAMS: tp.synchronize): the watchdog then knows
 * which of this rank's collectives the host waits for (a rank blocked in a host-side exchange that has
 * not issued one of them will never let the wait end). */
#define TPSH_WAIT_ALL_STREAMS ((const void *)1)
void tpsh_watch_wait_begin_on(const char *what, const void *stream);   /* a tpsh_stream, or that */
/* Inside a wait: it waits for world rank `rank` now (-1: none); the end of the wait clears it. */
void tpsh_watch_wait_peer(int rank);
/* Called by the watchdog just before MPI_Abort (CUDA: ncclCommAbort on every communicator, so that no
 * kernel keeps a GPU spinning), on a thread of its own and given 5 s: ncclCommAbort itself can block
 * (behind a host stuck in a synchronize). Set by the CUDA backend in
 * cuda_nccl.c; NULL on the CPU. */
extern void (*tpsh_watchdog_abort_hook)(void);
/* Once the watchdog is ending every rank, the calling (host) thread waits here for its MPI_Abort:
 * called where the abort sets a blocked host free (the end of a timed wait; a failed NCCL call). */
void tpsh_watchdog_hold_if_ending(void);
/* The host is inside the backend's collective call (collective.c, around be->collectives), which can
 * block it: NCCL connects to the peers at a communicator's first collectives and waits there for the
 * other ranks, outside any timed wait. Odd while inside; two stores and no clock, since this runs for
 * every collective: the watchdog times it by seeing the same odd count at its ticks. */
extern volatile uint64_t tpsh_watch_call_count;
static inline void tpsh_watch_call_begin(void) {
  __atomic_store_n(&tpsh_watch_call_count, tpsh_watch_call_count + 1, __ATOMIC_RELEASE);
}
static inline void tpsh_watch_call_end(void) {
  __atomic_store_n(&tpsh_watch_call_count, tpsh_watch_call_count + 1, __ATOMIC_RELEASE);
}

#endif /* TPSH_CHECK_H */
