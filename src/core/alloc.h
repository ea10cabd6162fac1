/*
 * alloc.h: the caching allocator (core/alloc.c), which both backends' memory goes through.
 *
 * A block is memory of one size class that the backend handed out once. Freed, it stays in the cache:
 * the stream it was freed on (in stream order) takes it back at once, any other stream only once that
 * stream has passed the point of the free, as PyTorch's CUDACachingAllocator and CUDA's own pools do.
 * Host thread only.
 */
#ifndef TPSH_ALLOC_H
#define TPSH_ALLOC_H

#include "core/internal.h"

typedef struct tpsh_cache_lane tpsh_cache_lane;
typedef struct tpsh_graph_pool tpsh_graph_pool;

typedef struct tpsh_block {
  void *ptr;
  size_t size;                 /* its size class: what the backend allocated */
  size_t requested;            /* what the storage that has it asked for */
  uint64_t mark;               /* while cached: the free's point in lane's stream (backend stream_mark) */
  tpsh_cache_lane *lane;       /* while cached: where (the stream of its free, or none) */
  struct tpsh_block *prev, *next;    /* while cached: its bin, newest first */
  const char *freed_at;        /* check mode: the Lua location of its last free (interned), or NULL */
  tpsh_graph_pool *pool;       /* the graph pool it belongs to (tp.graph), or NULL */
  int freed;                   /* parked by a graph pool that let it go: its free was counted already */
} tpsh_block;

/* The counters of tpsh_alloc_stats_get (tpsh.h); tensor.c keeps the storages' own. */
extern tpsh_alloc_stats tpsh_alloc_counters;

/* Reads TPSH_NO_MEMORY_CACHING (tpsh_init). */
void tpsh_alloc_init(void);
/* A block of at least nbytes for work on s: a cached one where the rule above allows, else a new one
 * from the backend (after giving the cache back to it once, if the backend had none); NULL with the
 * message set when there is no memory. *reused says whether it came from the cache. */
tpsh_block *tpsh_block_alloc(size_t nbytes, tpsh_stream *s, int *reused);
/* Frees b in stream order on s: later work on s may use it at once, other streams once s has passed
 * this point. */
void tpsh_block_free(tpsh_block *b, tpsh_stream *s);
/* Frees b, whose every use is known complete: any stream may take it at once (s: the stream a free to
 * the backend is ordered on, when the cache is off). */
void tpsh_block_free_done(tpsh_block *b, tpsh_stream *s);
/* A stream that nothing can enqueue on any more (tpsh_stream_unreachable): once it has finished, its
 * cached blocks go to every stream and the cache lets go of it. */
void tpsh_alloc_stream_unreachable(tpsh_stream *s);
/* Lets go of streams that became unreachable and finished (run where the host has waited anyway). */
void tpsh_alloc_tidy(void);
/* Gives every cached block back to the backend (stream-ordered); returns how many bytes. */
double tpsh_alloc_release_cached(void);
/* At shut-down, after the last storage died and every stream is idle. */
void tpsh_alloc_shutdown(void);

/* ==== graph pools (tp.graph) ====================================================================== */
/* While a pool is open (a capture), every allocation comes from it: a block that the capture freed on
 * the same stream with no other user (reused in that stream's order, as the main cache does), else a new
 * one from the backend (alloc with no stream: nothing may be enqueued on capturing streams). The main
 * cache is not touched, so that no block a graph replays into is ever another user's. A pool block
 * freed comes back to its pool, where it stays while the graph lives; tpsh_alloc_pool_release (the
 * graph is gone) hands every block back to the main cache once the streams the graph ran on have passed
 * this point (and each block once its storage dies too). Host thread only. */
tpsh_graph_pool *tpsh_alloc_pool_open(void);       /* NULL when out of host memory (message set) */
void tpsh_alloc_pool_close(tpsh_graph_pool *p);     /* the capture is over: allocations go to the cache */
void tpsh_alloc_pool_release(tpsh_graph_pool *p, int n, tpsh_stream *const *streams);
double tpsh_alloc_pool_bytes(const tpsh_graph_pool *p);   /* what the backend gave it */
/* b (a pool's) freed during a capture by a storage that other streams used: kept, not reused by the
 * capture (no event can order the reuse while the streams capture). */
void tpsh_block_free_captured(tpsh_block *b, tpsh_stream *s);
/* tensor.c: b is freed for good once each of streams[0..n) and alloc_stream (may be NULL) has passed the
 * work enqueued on it so far (events, the deferred list); then any stream may take it. */
void tpsh_block_park(tpsh_block *b, tpsh_stream *alloc_stream, int n, tpsh_stream *const *streams);

#endif /* TPSH_ALLOC_H */
