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

typedef struct tpsh_block {
  void *ptr;
  size_t size;                 /* its size class: what the backend allocated */
  size_t requested;            /* what the storage that has it asked for */
  uint64_t mark;               /* while cached: the free's point in lane's stream (backend stream_mark) */
  tpsh_cache_lane *lane;       /* while cached: where (the stream of its free, or none) */
  struct tpsh_block *prev, *next;    /* while cached: its bin, newest first */
  const char *freed_at;        /* check mode: the Lua location of its last free (interned), or NULL */
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

#endif /* TPSH_ALLOC_H */
