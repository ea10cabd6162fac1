/*
 * internal.h: the objects the core and the backends share and Lua never sees, and the few calls on them
 * that both sides make.
 *
 * The core owns tensors, storages, streams and events as objects (refcounts, names, which streams used a
 * storage); a backend owns what is behind them (memory, a worker thread or a cudaStream_t, kernels,
 * collectives). All backend work goes through one vtable, tpsh_backend (core/backend.h), so the Lua API,
 * the Work object, the stream-ordered free and the trace are the same code on the CPU and on the GPU.
 *
 * What one concern offers the others has a header of its own beside this one: check.h (the sanitizer's,
 * mismatch check's, flight recorder's and watchdog's hooks), trace.h, alloc.h, group.h, stream.h,
 * work.h, collective.h, host_ending.h, text.h, intern.h, dtype_convert.h, coll_kinds.h.
 */
#ifndef TPSH_INTERNAL_H
#define TPSH_INTERNAL_H

#include "tpsh.h"
#include <stdlib.h>

/* ==== code placement ============================================================================ */
/* The per-call path of a collective (and of any op) runs between two calls into NCCL or the CUDA
 * driver, whose own code pushes tpsh's out of the instruction cache and TLB: a sampling profile on the
 * GPU machine put most of tpsh's host time per small collective on the first instruction after each
 * call or return into tpsh code (docs/perf.md). TPSH_HOT puts a function of that path in .text.hot,
 * which the linker keeps together (a few pages instead of one per source file), and TPSH_COLD moves the
 * error paths, which every check has, out of the hot functions' lines. */
#define TPSH_HOT __attribute__((hot))
#define TPSH_COLD __attribute__((cold))

/* ==== errors (core/error.c) ==================================================================== */
/* Sets the thread-local message returned by tpsh_last_error() and returns status, so that a failing
 * path reads `return tpsh_error(TPSH_EINVAL, "expected %d dims, got %d", a, b);`. */
int tpsh_error(int status, const char *fmt, ...) TPSH_COLD __attribute__((format(printf, 2, 3)));
/* For functions that return pointers. */
void *tpsh_error_null(int status, const char *fmt, ...) TPSH_COLD __attribute__((format(printf, 2, 3)));
/* Writes "[2, 3, 4]" into buf (used by every shape-mismatch message). */
const char *tpsh_shape_str(const tpsh_tensor *t, char *buf, size_t n);
/* The same for a list of sizes, which may be one longer than a tensor's (a stacked shape). */
const char *tpsh_sizes_str(int ndim, const int64_t *sizes, char *buf, size_t n);

/* Grows the array *p (capacity *cap elements of elsize bytes, doubling from `first`) to hold `need`
 * elements: TPSH_OK, or TPSH_ENOMEM with the message set and *p as it was. */
static inline int tpsh_grow_array(void **p, int *cap, int need, int first, size_t elsize) {
  if (need <= *cap) return TPSH_OK;
  int c = *cap ? *cap : first;
  while (c < need) c *= 2;
  void *q = realloc(*p, (size_t)c * elsize);
  if (!q) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  *p = q;
  *cap = c;
  return TPSH_OK;
}

/* ==== kernels: the one shape of every device op ================================================= */
typedef enum tpsh_kop {
  TPSH_K_FILL,        /* t[0] = s[0] */
  TPSH_K_COPY,        /* t[0] = t[1], casting dtypes; same shape, any strides */
  TPSH_K_ADD,         /* t[0] = t[1] + s[0] * t[2] */
  TPSH_K_MUL,         /* t[0] = t[1] * t[2] */
  TPSH_K_SCALE,       /* t[0] = t[1] * s[0], + s[1] when i[0] (a number added: tpsh_scale_add); from the
                         front door for integers and the float cases no unary row expresses (ops.c) */
  TPSH_K_MATMUL,      /* t[0] (m,n) = t[1] (m,k) @ t[2] (k,n); 2-D, any strides; i[0] = allow tf32.
                         The core (ops.c) has checked: one dtype for all three, and for a float dtype
                         m, n, k at most INT_MAX, as (cu)BLAS takes int dimensions. 3-D operands
                         (b,m,n) = (b,m,k) @ (b,k,n): a product per index of dim 0 (tpsh_bmm).
                         i[1] = 1: t[0] = s[0] * t[1] @ t[2] + s[1] * t[0] (alpha, beta: tpsh_addmm;
                         float dtypes only; beta 0 never reads t[0]) */
  TPSH_K_SUM,         /* t[0] (one element) = sum of t[1] (accumulated in f64, or i64 for integers) */
  TPSH_K_ARANGE,      /* t[0] (contiguous) [j] = s[0] + j * s[1] */
  TPSH_K_RANDOM,      /* t[0] (contiguous) [j] = uniform [0,1) or normal (i[0] = 1) from seed i[1],
                         counter i[2] + j: the same numbers on every backend (core/random.h) */
  TPSH_K_SPIN,        /* busy for s[0] milliseconds; i[0] = 1: idle instead (a chaos delay, chaos.c: the CPU
                         worker sleeps, the GPU spins one block), holding no core the other work needs */
  TPSH_K_COMPARE,     /* t[0] (f64, 2 elements) = { violations of |a-b| <= s[1] + s[0]|b|, max|a-b| }
                         for a = t[1], b = t[2] */
  /* reductions, softmax and norms (core/ops_reduce.c; kernels cpu_reduce.c, cuda_reduce.cu): the core
     hands views whose last dim is the one reduced, float dtypes only, one dtype for all but indices */
  TPSH_K_REDUCE,      /* t[0] (last dim of size 1) = i[0] (a tpsh_reduce_op: sum, avg, max or min) over
                         the last dim of t[nw]; nw = 2: t[1] (i64) gets the 1-based index of the first
                         max or min (NaN counts as the max and the min, as in PyTorch) */
  TPSH_K_SOFTMAX,     /* t[0] = softmax (i[0] = 1: log_softmax) of t[1] along the last dim */
  TPSH_K_NORM,        /* t[0] = layer_norm (i[0] = 0) or rms_norm (i[0] = 1) of t[1] over the last dim,
                         eps s[0]; weight t[i[1]] and bias t[i[2]] (1-D, the last dim's size) where > 0 */
  /* element-wise ops of the table in core/pointwise.h; the core (ops_pointwise.c) has checked the
     dtypes and expanded the operands to t[0]'s shape (stride 0 where they broadcast) */
  TPSH_K_UNARY,       /* t[0] = unary op i[0] (TPSH_U_*) of t[1], its number s[0]; t[1]'s dtype
                         is t[0]'s, or an integer one where t[0] is f32 (a division) */
  TPSH_K_BINARY,      /* t[0] = binary op i[0] (TPSH_B_*) of t[1] and t[2], of one dtype:
                         t[0]'s, or an integer one where t[0] is f32 (a division) */
  TPSH_K_COUNT
} tpsh_kop;

typedef struct tpsh_kargs {
  int32_t op;            /* a tpsh_kop */
  int32_t nt;            /* tensors used in t[] */
  int32_t nw;            /* the op writes t[0 .. nw), reads the others; 0 means 1 (t[0] alone) */
  tpsh_tensor t[4];      /* descriptors; kernels must not dereference t[i].storage (it may be gone) */
  void *data[4];         /* address of element 0 of t[i] (storage data + offset * element size) */
  double s[2];
  int64_t i[4];
  const char *name;      /* the op's name for traces and NVTX ("add_", "matmul") */
} tpsh_kargs;

/* ==== collectives: the one shape of every communication op ====================================== */
/* Buffers are contiguous and sized as in NCCL: count is the element count of one rank's piece; the
 * kinds (tpsh_coll_kind) are in tpsh.h. */

typedef struct tpsh_coll_args {
  int32_t kind;           /* a tpsh_coll_kind */
  int32_t op;             /* a tpsh_reduce_op */
  int32_t dtype;          /* a tpsh_dtype */
  int32_t peer;           /* root (broadcast, reduce) or peer (send, recv), as a rank of the group */
  int64_t count;
  void *send, *recv;      /* device addresses, already offset */
  uint64_t seq;           /* the group's sequence number of this collective (issue order) */
  int64_t coll_index;     /* its number among the group's collectives that every member issues (-1:
                           * a send or a receive), as group.c counts them (g->collectives) */
  const char *name;       /* "all_gather", ... for traces and NVTX */
  uint64_t flight;        /* its flight recorder entry (entries ever added before it), set when issued */
  int32_t flight_slot;    /* its group's slot in the flight recorder's table, set when issued */
  const char *loc;        /* check mode: the Lua file:line that made it (NULL otherwise) */
} tpsh_coll_args;

/* ==== objects ================================================================================== */
struct tpsh_storage {
  void *data;              /* NULL once freed */
  size_t nbytes;
  int refcount;            /* tensors (views) that point here; touched by the host thread only */
  int device;
  uint64_t id;
  struct tpsh_block *block;    /* the caching allocator's (alloc.c): data is its memory */
  tpsh_stream *alloc_stream;   /* the stream a free is ordered on */
  tpsh_stream **users;         /* other streams that used it (held: tpsh_stream_hold) */
  int nusers, cap_users;
  int graph_holds;             /* graphs whose ops use it (core/graph.c): the struct lives until they let go,
                                * and the memory too unless a graph pool's (that goes back to its pool) */
  uint64_t graph_mark;         /* the id of the last graph that took a hold: one hold per graph */
};

struct tpsh_stream {
  int refcount;            /* host thread only */
  int passive_refs;        /* of those, holders that never enqueue on it (tpsh_stream_hold) */
  int priority;
  int is_default;
  uint64_t id;
  char name[TPSH_STREAM_NAME_MAX + 1];
  void *impl;              /* the backend's */
  tpsh_stream *prev, *next; /* the list of live streams (tpsh_synchronize walks it) */
  int check_slot;          /* the sanitizer's slot (its vector clock entry), valid while check_gen is
                            * the sanitizer's generation (sanitizer.c) */
  uint64_t check_gen;
  struct tpsh_cache_lane *cache_lane;  /* the caching allocator's blocks freed on this stream (alloc.c) */
  struct { uint64_t epoch, draws, knows; uint32_t index; } chaos;   /* chaos.c's draws on this stream */
};

/* A stream's key in the flight record and the watchdog's waits: its id, which no later stream takes. Its
 * address would not do: a freed stream's is the next one's, and on CUDA a collective stays "not known
 * complete" until a host synchronisation, so one of a freed stream would seem to sit on the new stream,
 * before its collectives (the watchdog's stream-order rules would see an order that is not there). Never
 * NULL (no stream) nor TPSH_WAIT_ALL_STREAMS (check.h). */
static inline const void *tpsh_stream_key(const tpsh_stream *s) {
  return s ? (const void *)(uintptr_t)(s->id + 2) : NULL;
}

struct tpsh_event {
  int refcount;
  int timing;
  int recorded;
  void *impl;
  void *check_clock;       /* the sanitizer's copy of the recording stream's clock (check mode) */
  uint64_t chaos_knows;    /* chaos mode: the recording stream's chaos.knows (chaos.c) */
  int captured;            /* last recorded during a graph's capture: a point inside that graph */
};

/* ==== runtime (core/runtime.c) ================================================================= */
typedef struct tpsh_backend tpsh_backend;   /* the vtable: core/backend.h */
typedef struct tpsh_runtime {
  const tpsh_backend *be;
  int initialized;
  int rank, size, local_rank, local_size, device;   /* local: among the processes of this host */
  tpsh_stream *default_stream;
  tpsh_stream *streams;       /* live streams */
  uint64_t next_stream_id, next_storage_id;
} tpsh_runtime;
extern tpsh_runtime tpsh_rt;

/* ==== core helpers used by backends and the collectives ======================================== */
/* t's dims reordered by stride, largest outermost (an expanded dim, stride 0, outermost of all): the
 * order in which a full reduction reads memory in runs (tensor.c). */
tpsh_tensor tpsh_tensor_memory_order(const tpsh_tensor *t);
int tpsh_check_tensor(const char *what, const tpsh_tensor *t);   /* non-NULL, storage alive */
/* ops.c's checks, for the other front doors (ops_reduce.c): errors that name `what` and show both sides */
int tpsh_check_same_shape(const char *what, const tpsh_tensor *expected, const tpsh_tensor *got);
int tpsh_check_same_dtype(const char *what, const tpsh_tensor *expected, const tpsh_tensor *got);
int tpsh_check_no_partial_overlap(const char *what, const tpsh_tensor *out, const tpsh_tensor *in);
/* The tensors an op writes (kargs nw: 0 means 1). */
static inline int tpsh_kargs_writes(const struct tpsh_kargs *k) { return k->nw > 0 ? k->nw : 1; }
/* A backend's matmul copied an operand (or its output) to a temporary before (cu)BLAS could take it:
 * counted for tpsh_matmul_staged (ops_reduce.c; any thread). */
void tpsh_note_matmul_staged(void);
size_t tpsh_tensor_elsize(const tpsh_tensor *t);
void tpsh_kargs_set(tpsh_kargs *k, int slot, const tpsh_tensor *t);
/* Enqueue k on s after noting that s used each tensor's storage (for the stream-ordered free). */
int tpsh_launch(tpsh_stream *s, tpsh_kargs *k);
/* The enqueue of tpsh_launch once the uses are noted (a graph's replay: the graph keeps its memory). */
int tpsh_launch_noted(tpsh_stream *s, const tpsh_kargs *k);
/* tpsh_copy under another name in the sanitizer's reports (list-form all_gather's copies). */
int tpsh_copy_named(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *src, const char *name);
/* Note that s uses t's storage, so that a free waits for s. */
int tpsh_storage_note_use(tpsh_storage *st, tpsh_stream *s);
/* A reference to a storage without a tensor around it (a descriptor copied by value holds one); the
 * last unref frees the memory in stream order. Host thread only. */
void tpsh_storage_retain(tpsh_storage *st);
void tpsh_storage_unref(tpsh_storage *st);
/* A host wait's check of tpsh_interrupt (stream.c): TPSH_EINTR, with its message, once it is set;
 * TPSH_EENDED once a thread that ends the run asks for the host (host_ending.c); 0 otherwise.
 * tpsh_interrupt_polled: host waits must poll (tpsh_interruptible), not block for good. */
int tpsh_interrupt_check(void);
extern int tpsh_interrupt_polled;
/* Asynchronous errors (error.c): a backend notes one where it finds it; every call of the script that
 * waits, asks or orders settles its status through tpsh_async_error_settle, which turns TPSH_OK into
 * the noted error until Lua has raised it (tpsh_async_error_raised, tpsh.h). */
void tpsh_async_error_note(const char *message);
int tpsh_async_error_settle(int rc);
int tpsh_query_settle(int r);           /* the same for a query's answer: 1, 0 or -status (stream.c) */

/* tpsh_now_ms's clock at the kernel tick's resolution (runtime.c): for stamps read in seconds. */
double tpsh_now_coarse_ms(void);
/* Waits for and frees every block parked by the stream-ordered free (at synchronize and shutdown). */
int tpsh_storage_drain_deferred(void);  /* frees the parked blocks (waits for their uses); how many */
/* Waits until every stream of this rank is idle, as a host wait (polled, NCCL's errors asked for,
 * interruptible, timed by the watchdog under the name why), not as cudaDeviceSynchronize, which blocks
 * in the driver deaf to all of that (stream.c); the first stream's error. No trace record, no sanitizer
 * join: for the runtime's own waits (an allocation's retry, tp.empty_cache). */
int tpsh_streams_wait_idle(const char *why);

#endif /* TPSH_INTERNAL_H */
