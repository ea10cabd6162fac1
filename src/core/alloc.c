/*
 * alloc.c: the caching allocator that every tensor's memory goes through, on both backends.
 *
 * A freed block is kept, so that a fresh temporary costs neither malloc and page faults (CPU) nor the
 * driver's pool calls (CUDA), and timings rank schedules, not allocation. The policy is PyTorch's
 * CUDACachingAllocator, which is what users of tpsh already reason with:
 *  - sizes are rounded to classes (512 B steps up to 4 KiB, then four classes per power of two: at most
 *    a quarter wasted), and a freed block waits in its class's bin;
 *  - a block freed on stream s is stream-ordered there: s takes it back at once (its later work runs
 *    after the work that used the block), another stream only once s has passed the free's point
 *    (backend stream_mark / stream_passed: a sequence number on the CPU, a query on CUDA);
 *  - a block that other streams used too is not freed until their recorded events complete (tensor.c's
 *    deferred list, the record_stream rule); it then comes here free for any stream.
 * Each stream that freed blocks has a lane of bins (found from the stream, no lookup) and a passive
 * hold on it; a lane whose stream nothing can reach any more and which has finished gives its blocks to
 * the lane of no stream, and lets the stream go. A miss asks the backend; when the backend has no
 * memory, the cache is given back to it and every stream waited for, once, before the caller hears.
 * TPSH_NO_MEMORY_CACHING=1 turns the cache off (as PYTORCH_NO_CUDA_MEMORY_CACHING does): exact sizes,
 * every free goes to the backend, so that a memory checker sees each tensor's own bounds.
 */
#include "core/backend.h"
#include "core/alloc.h"
#include "core/check.h"
#include "core/stream.h"
#include "core/trace.h"
#include "core/graph.h"
#include <stdlib.h>
#include <string.h>

#define BE (tpsh_rt.be)

typedef struct bin {
  size_t size;                     /* 0: an empty slot of the table */
  tpsh_block *head, *tail;         /* newest first */
} bin;

struct tpsh_cache_lane {
  tpsh_stream *stream;             /* NULL: the lane of blocks whose uses are all complete */
  bin *bins;                       /* open addressing by size class; a class's slot stays once made */
  size_t cap, used;
  double blocks;
  tpsh_cache_lane *next;           /* the stream lanes */
};

tpsh_alloc_stats tpsh_alloc_counters;
#define stats tpsh_alloc_counters
static tpsh_cache_lane done_lane;  /* blocks any stream may take */
static tpsh_cache_lane *lanes;     /* one per stream with cached blocks */

tpsh_alloc_stats *tpsh_alloc_stats_get(void) { return &stats; }

void tpsh_alloc_init(void) {
  const char *e = getenv("TPSH_NO_MEMORY_CACHING");
  stats.caching = !(e && strcmp(e, "1") == 0);
}

/* ==== size classes ================================================================================ */
static size_t size_class(size_t n) {
  if (n <= 512) return 512;
  if (n <= 4096) return (n + 511) & ~(size_t)511;
  int lg = 63 - __builtin_clzll((unsigned long long)(n - 1));     /* 2^lg < n <= 2^(lg+1) */
  size_t step = (size_t)1 << (lg - 2);
  return (n + step - 1) & ~(step - 1);
}

/* ==== bins ======================================================================================== */
static size_t slot_of_size(const tpsh_cache_lane *l, size_t size) {
  return (size_t)(((uint64_t)(size >> 9) * 0x9E3779B97F4A7C15ull) >> 32) & (l->cap - 1);
}

static bin *bin_find(tpsh_cache_lane *l, size_t size) {
  if (!l->cap) return NULL;
  for (size_t i = slot_of_size(l, size);; i = (i + 1) & (l->cap - 1)) {
    if (l->bins[i].size == size) return &l->bins[i];
    if (!l->bins[i].size) return NULL;
  }
}

/* The bin of size in l, made if need be; NULL when out of host memory. */
static bin *bin_get(tpsh_cache_lane *l, size_t size) {
  bin *x = bin_find(l, size);
  if (x) return x;
  if (2 * (l->used + 1) > l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    bin *nb = calloc(cap, sizeof *nb);
    if (!nb) return NULL;
    bin *old = l->bins;
    size_t oldcap = l->cap;
    l->bins = nb;
    l->cap = cap;
    for (size_t i = 0; i < oldcap; i++) {
      if (!old[i].size) continue;
      size_t j = slot_of_size(l, old[i].size);
      while (nb[j].size) j = (j + 1) & (cap - 1);
      nb[j] = old[i];
    }
    free(old);
  }
  size_t i = slot_of_size(l, size);
  while (l->bins[i].size) i = (i + 1) & (l->cap - 1);
  l->bins[i].size = size;
  l->used++;
  return &l->bins[i];
}

static void bin_push(tpsh_cache_lane *l, bin *x, tpsh_block *b) {
  b->lane = l;
  b->prev = NULL;
  b->next = x->head;
  if (x->head) x->head->prev = b; else x->tail = b;
  x->head = b;
  l->blocks++;
  stats.cached_blocks++;
  stats.cached_bytes += (double)b->size;
}

static void bin_unlink(bin *x, tpsh_block *b) {
  if (b->prev) b->prev->next = b->next; else x->head = b->next;
  if (b->next) b->next->prev = b->prev; else x->tail = b->prev;
  b->prev = b->next = NULL;
  b->lane->blocks--;
  b->lane = NULL;
  stats.cached_blocks--;
  stats.cached_bytes -= (double)b->size;
}

static void cache(tpsh_cache_lane *l, tpsh_block *b, tpsh_stream *s);

/* ==== lanes ======================================================================================= */
static tpsh_cache_lane *lane_of(tpsh_stream *s) {
  if (s->cache_lane) return s->cache_lane;
  tpsh_cache_lane *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->stream = s;
  tpsh_stream_hold(s);             /* passive: the lane never enqueues on s */
  s->cache_lane = l;
  l->next = lanes;
  lanes = l;
  return l;
}

/* Moves every block of l to the lane of no stream (its stream has passed every free), then drops l. */
static void lane_retire(tpsh_cache_lane *l) {
  for (size_t i = 0; i < l->cap; i++) {
    bin *x = &l->bins[i];
    while (x->head) {
      tpsh_block *b = x->head;
      bin_unlink(x, b);
      cache(&done_lane, b, l->stream);
    }
  }
  for (tpsh_cache_lane **pp = &lanes; *pp; pp = &(*pp)->next)
    if (*pp == l) { *pp = l->next; break; }
  tpsh_stream *s = l->stream;
  s->cache_lane = NULL;
  free(l->bins);
  free(l);
  tpsh_stream_unhold(s);            /* may destroy s */
}

static int lane_finished(tpsh_cache_lane *l) {
  return tpsh_stream_unreachable(l->stream) && BE->stream_passed(l->stream, BE->stream_mark(l->stream));
}

void tpsh_alloc_stream_unreachable(tpsh_stream *s) {
  if (s->cache_lane && lane_finished(s->cache_lane)) lane_retire(s->cache_lane);
}

void tpsh_alloc_tidy(void) {
  tpsh_cache_lane **pp = &lanes;
  while (*pp) {
    tpsh_cache_lane *l = *pp;
    if (lane_finished(l)) lane_retire(l);          /* unlinks l: *pp is the next one */
    else pp = &l->next;
  }
}

/* ==== giving memory back ========================================================================== */
static void release_block(tpsh_block *b, tpsh_stream *s) {
  tpsh_trace_untraced(s);
  BE->free_async(b->ptr, b->size, s);
  stats.reserved -= (double)b->size;
  stats.backend_frees++;
  free(b);
}

static double release_lane(tpsh_cache_lane *l) {
  double bytes = 0;
  tpsh_stream *s = l->stream ? l->stream : tpsh_rt.default_stream;
  for (size_t i = 0; i < l->cap; i++) {
    bin *x = &l->bins[i];
    while (x->head) {
      tpsh_block *b = x->head;
      bytes += (double)b->size;
      bin_unlink(x, b);
      release_block(b, s);         /* in s's order: work still queued there may use it */
    }
  }
  return bytes;
}

double tpsh_alloc_release_cached(void) {
  double bytes = release_lane(&done_lane);
  for (tpsh_cache_lane *l = lanes; l; l = l->next) bytes += release_lane(l);
  return bytes;
}

/* Every stream idle, as a host wait (watched, interruptible), without telling the sanitizer that the
 * script's host has seen their work finish: it did not ask. */
/* As PyTorch's empty_cache, and synchronous like it: the memory is back with the system on return. */
double tpsh_empty_cache(void) {
  if (!tpsh_rt.initialized || tpsh_graph_capturing) return 0;     /* (memory.lua refuses it in a capture) */
  double bytes = tpsh_alloc_release_cached();
  if (tpsh_streams_wait_idle("tp.empty_cache") == TPSH_OK) {
    tpsh_alloc_tidy();
    BE->trim();
  }
  return bytes;
}

void tpsh_reset_peak_memory_stats(void) {
  stats.allocated_peak = stats.allocated;
  stats.reserved_peak = stats.reserved;
  stats.requested_peak = stats.bytes_live;
}

void tpsh_alloc_shutdown(void) {
  tpsh_alloc_release_cached();
  while (lanes) lane_retire(lanes);     /* empty now: lets the streams go */
  free(done_lane.bins);
  memset(&done_lane, 0, sizeof done_lane);
}

/* ==== allocation and free ========================================================================= */
static tpsh_block *take(bin *x, tpsh_block *b) {
  bin_unlink(x, b);
  return b;
}

/* A cached block of class size that s may use now, or NULL. Its own lane's newest first (the memory
 * most likely in cache), then one that every use has left, then the oldest of another stream's lane
 * whose free that stream has passed. */
static tpsh_block *cached_block(size_t size, tpsh_stream *s) {
  bin *x;
  if (s->cache_lane && (x = bin_find(s->cache_lane, size)) && x->head) return take(x, x->head);
  if ((x = bin_find(&done_lane, size)) && x->tail) return take(x, x->tail);
  for (tpsh_cache_lane *l = lanes; l; l = l->next) {
    if (l->stream == s || !(x = bin_find(l, size)) || !x->tail) continue;
    if (BE->stream_passed(l->stream, x->tail->mark)) return take(x, x->tail);
  }
  return NULL;
}

static void note_allocated(tpsh_block *b) {
  stats.allocations++;
  stats.allocated += (double)b->size;
  if (stats.allocated > stats.allocated_peak) stats.allocated_peak = stats.allocated;
}

static tpsh_graph_pool *open_pool;     /* a capture's: every allocation comes from it (below) */
static tpsh_block *pool_alloc(tpsh_graph_pool *p, size_t nbytes, tpsh_stream *s, int *reused);

TPSH_HOT tpsh_block *tpsh_block_alloc(size_t nbytes, tpsh_stream *s, int *reused) {
  if (__builtin_expect(open_pool != NULL, 0)) return pool_alloc(open_pool, nbytes, s, reused);
  size_t size = stats.caching ? size_class(nbytes) : nbytes;
  *reused = 0;
  if (stats.cached_blocks > 0) {
    tpsh_block *b = cached_block(size, s);
    if (b) {
      b->requested = nbytes;
      stats.cache_hits++;
      note_allocated(b);
      *reused = 1;
      return b;
    }
  }
  tpsh_block *b = calloc(1, sizeof *b);
  if (!b) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  if (lanes) tpsh_alloc_tidy();
  b->ptr = BE->alloc(size, s);
  if (!b->ptr && stats.cached_blocks > 0) {
    /* The cache may hold what the backend lacks: give it all back, let the frees run, once more. */
    stats.flushes++;
    tpsh_alloc_release_cached();
    if (tpsh_streams_wait_idle("an allocation that gives the cache back") == TPSH_OK) b->ptr = BE->alloc(size, s);
  }
  if (!b->ptr) { free(b); return NULL; }                /* the backend set the message */
  b->size = size;
  b->requested = nbytes;
  stats.cache_misses++;
  stats.reserved += (double)size;
  if (stats.reserved > stats.reserved_peak) stats.reserved_peak = stats.reserved;
  note_allocated(b);
  return b;
}

static void cache(tpsh_cache_lane *l, tpsh_block *b, tpsh_stream *s) {
  bin *x = l ? bin_get(l, b->size) : NULL;
  if (x) bin_push(l, x, b);
  else release_block(b, s);        /* out of host memory for the bins: the backend orders the free */
}

static void pool_take_back(tpsh_block *b, tpsh_stream *s, int reusable);

TPSH_HOT void tpsh_block_free(tpsh_block *b, tpsh_stream *s) {
  stats.frees++;
  stats.allocated -= (double)b->size;
  if (__builtin_expect(b->pool != NULL, 0)) { pool_take_back(b, s, 1); return; }
  if (!stats.caching) { release_block(b, s); return; }
  tpsh_cache_lane *l = lane_of(s);
  if (l) b->mark = BE->stream_mark(s);
  cache(l, b, s);
}

void tpsh_block_free_done(tpsh_block *b, tpsh_stream *s) {
  if (b->freed) {
    b->freed = 0;
  } else {
    stats.frees++;
    stats.allocated -= (double)b->size;
  }
  if (b->pool) { pool_take_back(b, NULL, 0); return; }
  if (!stats.caching) { release_block(b, s); return; }
  cache(&done_lane, b, s);
}

void tpsh_block_free_captured(tpsh_block *b, tpsh_stream *s) {
  stats.frees++;
  stats.allocated -= (double)b->size;
  pool_take_back(b, s, 0);
}

/* ==== graph pools ================================================================================= */
/* PyTorch's private pools of CUDA graphs, with one difference: a graph here holds every tensor its ops
 * use (core/graph.c), so the pool only has to keep the memory of tensors that died, which the graph's
 * replays still write. A block freed during the capture is reused by a later allocation of the capture on
 * the same stream only (stream order makes that safe inside the graph as it does outside); after the
 * capture nothing takes a pool block until the graph is gone. */
typedef struct pool_entry {
  tpsh_block *b;
  tpsh_stream *s;            /* the stream its free was ordered on (held); NULL: its uses had completed */
  int reusable;              /* freed during the capture by a storage that only s used */
} pool_entry;

struct tpsh_graph_pool {
  int open, released;
  double live;               /* blocks that live storages hold */
  double bytes;              /* what the backend gave it */
  pool_entry *free;
  int nfree, capfree;
  tpsh_stream **streams;     /* once released: the streams its graph ran on (held) */
  int nstreams;
};

tpsh_graph_pool *tpsh_alloc_pool_open(void) {
  tpsh_graph_pool *p = calloc(1, sizeof *p);
  if (!p) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  p->open = 1;
  open_pool = p;
  return p;
}

void tpsh_alloc_pool_close(tpsh_graph_pool *p) {
  if (open_pool == p) open_pool = NULL;
  p->open = 0;
  for (int i = 0; i < p->nfree; i++) p->free[i].reusable = 0;
}

double tpsh_alloc_pool_bytes(const tpsh_graph_pool *p) { return p ? p->bytes : 0; }

static void pool_destroy(tpsh_graph_pool *p) {
  for (int i = 0; i < p->nstreams; i++) tpsh_stream_unhold(p->streams[i]);
  free(p->streams);
  free(p->free);
  free(p);
}

/* b goes back to the main cache for good, once p's streams and s have passed this point. */
static void pool_give_back(tpsh_graph_pool *p, tpsh_block *b, tpsh_stream *s) {
  b->pool = NULL;
  b->freed = 1;                      /* counted when its storage died: the deferred list's free is not */
  tpsh_block_park(b, s, p->nstreams, p->streams);
}

static void pool_take_back(tpsh_block *b, tpsh_stream *s, int reusable) {
  tpsh_graph_pool *p = b->pool;
  p->live--;
  if (p->released) {
    pool_give_back(p, b, s);
    if (p->live == 0) pool_destroy(p);
    return;
  }
  /* Out of host memory for the list: the block is left to the process (its graph may still replay into
   * it, so it cannot go back). */
  if (tpsh_grow_array((void **)&p->free, &p->capfree, p->nfree + 1, 16, sizeof *p->free)) return;
  if (s) tpsh_stream_hold(s);
  p->free[p->nfree++] = (pool_entry){b, s, reusable && p->open};
}

static tpsh_block *pool_alloc(tpsh_graph_pool *p, size_t nbytes, tpsh_stream *s, int *reused) {
  size_t size = stats.caching ? size_class(nbytes) : nbytes;
  *reused = 0;
  for (int i = p->nfree - 1; i >= 0; i--) {          /* the newest first, as the cache's own lane */
    pool_entry *e = &p->free[i];
    if (!e->reusable || e->s != s || e->b->size != size) continue;
    tpsh_block *b = e->b;
    tpsh_stream_unhold(e->s);
    memmove(e, e + 1, (size_t)(p->nfree - i - 1) * sizeof *e);
    p->nfree--;
    b->requested = nbytes;
    stats.cache_hits++;
    note_allocated(b);
    p->live++;
    *reused = 1;
    return b;
  }
  tpsh_block *b = calloc(1, sizeof *b);
  if (!b) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  /* No stream: the backend must not enqueue on capturing streams. And no flush of the cache and wait for
   * every stream on a miss, as outside a capture: a capture cannot wait. */
  b->ptr = BE->alloc(size, NULL);
  if (!b->ptr) { free(b); return NULL; }               /* the backend set the message */
  b->size = size;
  b->requested = nbytes;
  b->pool = p;
  stats.cache_misses++;
  stats.reserved += (double)size;
  if (stats.reserved > stats.reserved_peak) stats.reserved_peak = stats.reserved;
  note_allocated(b);
  p->live++;
  p->bytes += (double)size;
  return b;
}

void tpsh_alloc_pool_release(tpsh_graph_pool *p, int n, tpsh_stream *const *streams) {
  if (!p) return;
  tpsh_alloc_pool_close(p);
  p->released = 1;
  p->streams = n > 0 ? malloc((size_t)n * sizeof *p->streams) : NULL;
  if (p->streams || n == 0) {
    for (int i = 0; i < n; i++) tpsh_stream_hold(p->streams[i] = streams[i]);
    p->nstreams = n;
  } else {
    /* out of host memory: wait for the streams now, so that the blocks need no order */
    for (int i = 0; i < n; i++) tpsh_stream_synchronize(streams[i]);
  }
  for (int i = 0; i < p->nfree; i++) {
    pool_give_back(p, p->free[i].b, p->free[i].s);
    if (p->free[i].s) tpsh_stream_unhold(p->free[i].s);
  }
  p->nfree = 0;
  if (p->live == 0) pool_destroy(p);
}
