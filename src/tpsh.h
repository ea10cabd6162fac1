/*
 * tpsh.h: the flat C ABI of tpsh.
 *
 * One header is the single source of truth for the C side and the Lua side: the build extracts the
 * text between the CDEF markers below and hands it to LuaJIT's ffi.cdef (lua/tpsh/capi.lua loads the
 * generated module tpsh.cdef). That is why the region holds no macros, no #include and no expressions
 * that LuaJIT's C parser does not accept: fixed array sizes are literals, constants are enums.
 *
 * Conventions:
 *  - Every function that can fail returns int status (0 = TPSH_OK) or NULL, and leaves a message in
 *    tpsh_last_error() (thread-local). Lua names the call and raises; C never longjmps.
 *  - Functions that return a tpsh_stream* / tpsh_event* / tpsh_tensor* / tpsh_group* return a new
 *    reference that the caller releases (Lua does it from __gc / ffi.gc).
 *  - Dimensions are 0-based here; the Lua layer converts from the 1-based API.
 *  - Ops are enqueued on the stream given and return at once; tpsh_to_host and the *_synchronize calls
 *    block the host.
 */
#ifndef TPSH_H
#define TPSH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Fields Lua may read but not write: C sees nothing here, and scripts/gen_cdef.cmake writes "const" in
 * the FFI's copy, so that a script assigning t.sizes[0] or t.offset gets an error instead of a
 * descriptor that points outside its memory. */
#define TPSH_RO

/* CDEF BEGIN */

typedef enum tpsh_status {
  TPSH_OK = 0,
  TPSH_EINVAL = 1,     /* bad argument: shape, dtype, range, freed tensor */
  TPSH_ENOMEM = 2,     /* allocation failed */
  TPSH_EBACKEND = 3,   /* the backend (CUDA, BLAS, thread) failed */
  TPSH_ECOMM = 4,      /* MPI or NCCL failed */
  TPSH_ETIMEOUT = 5,   /* the watchdog expired */
  TPSH_EUNSUPPORTED = 6,
  TPSH_EINTR = 7,      /* a host wait was interrupted (the REPL's Ctrl-C: tpsh_interrupt) */
  TPSH_EENDED = 8,     /* a host wait gave way to a thread that ends the run (host_ending.c): no error */
  TPSH_ECAPTURE = 9    /* a call that a graph's capture cannot hold (tp.graph): Lua names tp.graph and the call */
} tpsh_status;

typedef enum tpsh_dtype {
  TPSH_F32 = 0, TPSH_F16 = 1, TPSH_BF16 = 2, TPSH_F64 = 3, TPSH_I32 = 4, TPSH_I64 = 5, TPSH_U8 = 6,
  TPSH_NDTYPES = 7
} tpsh_dtype;

/* TPSH_SPIN_MAX_MS: the longest tpsh_spin, 1e7 ms (about 2.8 hours). A spin stands in for compute
 * (examples use hundreds of ms), so a longer one is a mistake (a unit slip, 1e300), which would
 * otherwise hold a stream for ever; and the CUDA kernel's nanoseconds must fit a uint64. */
typedef enum tpsh_limits {
  TPSH_MAX_DIMS = 8, TPSH_STREAM_NAME_MAX = 63, TPSH_SPIN_MAX_MS = 10000000
} tpsh_limits;

typedef enum tpsh_priority { TPSH_PRIORITY_LOW = -1, TPSH_PRIORITY_NORMAL = 0, TPSH_PRIORITY_HIGH = 1 } tpsh_priority;

typedef enum tpsh_reduce_op {
  TPSH_SUM = 0, TPSH_AVG = 1, TPSH_MAX = 2, TPSH_MIN = 3, TPSH_PROD = 4
} tpsh_reduce_op;

/* The collectives by kind (tpsh_collective, tpsh_collective_work); counts are one rank's piece. */
typedef enum tpsh_coll_kind {
  TPSH_C_ALL_GATHER,      /* recv[size * count] <- every rank's send[count] */
  TPSH_C_ALL_REDUCE,      /* recv[count] <- op over ranks of send[count] (send == recv: in place) */
  TPSH_C_REDUCE_SCATTER,  /* recv[count] <- this rank's piece of op over ranks of send[size * count] */
  TPSH_C_BROADCAST,       /* recv[count] <- root's send[count] (in place: send == recv) */
  TPSH_C_REDUCE,          /* recv[count] on root <- op over ranks of send[count] */
  TPSH_C_ALL_TO_ALL,      /* recv[size * count]: piece j from rank j's send piece for this rank */
  TPSH_C_SEND,            /* send[count] to peer */
  TPSH_C_RECV,            /* recv[count] from peer */
  TPSH_C_COUNT
} tpsh_coll_kind;

typedef struct tpsh_storage tpsh_storage;   /* opaque: memory, refcount, the streams that used it */
typedef struct tpsh_stream tpsh_stream;     /* opaque: a CPU worker thread or a CUDA stream */
typedef struct tpsh_event tpsh_event;       /* opaque: a completion marker on a stream */
typedef struct tpsh_group tpsh_group;       /* opaque: a set of ranks with its communicators */

/* A tensor is a strided view of a storage. The descriptor is public so that Lua reads shapes without
 * a call; it is created and destroyed only by the functions below. Sizes and strides are in elements. */
typedef struct tpsh_tensor {
  tpsh_storage *TPSH_RO storage;
  TPSH_RO int64_t offset;
  TPSH_RO int32_t ndim;
  TPSH_RO int32_t dtype_id;         /* a tpsh_dtype */
  TPSH_RO int32_t device;           /* -1 on the CPU backend, the CUDA device index otherwise */
  TPSH_RO int32_t flags;            /* reserved */
  TPSH_RO int64_t sizes[8];
  TPSH_RO int64_t strides[8];
} tpsh_tensor;

/* ---- runtime ---------------------------------------------------------------------------------- */
int tpsh_init(const char *backend, int device);   /* backend: "cpu", "cuda" or NULL (auto) */
void tpsh_shutdown(void);
const char *tpsh_last_error(void);
const char *tpsh_backend_name(void);
int tpsh_rank(void);
int tpsh_size(void);
int tpsh_local_rank(void);
int tpsh_device(void);
int tpsh_gpu_count(void);                      /* CUDA devices visible (0 without the CUDA backend) */
const char *tpsh_versions(void);               /* "tpsh X; MPI ...; CUDA ...; NCCL ..." */
double tpsh_now_ms(void);                      /* host monotonic clock, ms */
void tpsh_free_buffer(void *p);                /* frees buffers handed out by the tpsh_host_* calls */
/* A file written whole (the trace, the JUnit report): to a temporary beside path, renamed over it (a
 * link at path is replaced, never written through); a device or FIFO in place. TPSH_OK or an error
 * naming path. tpsh_check_writable: whether it could be, without writing it. core/file_write.c. */
int tpsh_write_whole(const char *path, const void *buf, int64_t n);
int tpsh_check_writable(const char *path);

/* ---- dtypes ----------------------------------------------------------------------------------- */
int tpsh_dtype_from_name(const char *name);    /* -1 when unknown; accepts "f32", "float32", ... */
const char *tpsh_dtype_name(int dtype);
int tpsh_dtype_size(int dtype);
int tpsh_dtype_is_float(int dtype);

/* ---- tensors ---------------------------------------------------------------------------------- */
tpsh_tensor *tpsh_tensor_empty(int ndim, const int64_t *sizes, int dtype, tpsh_stream *s);
tpsh_tensor *tpsh_tensor_as_strided(const tpsh_tensor *t, int ndim, const int64_t *sizes,
                                    const int64_t *strides, int64_t offset);
tpsh_tensor *tpsh_tensor_view(const tpsh_tensor *t, int ndim, const int64_t *sizes); /* NULL: incompatible */
tpsh_tensor *tpsh_tensor_narrow(const tpsh_tensor *t, int dim, int64_t start, int64_t len);
tpsh_tensor *tpsh_tensor_select(const tpsh_tensor *t, int dim, int64_t index);
tpsh_tensor *tpsh_tensor_transpose(const tpsh_tensor *t, int d1, int d2);
void tpsh_tensor_release(tpsh_tensor *t);
/* Lua keeps descriptors in its own (GC-managed) memory, because LuaJIT gives pointer cdata a built-in
 * arithmetic (t + 1, a - b) that would shadow the tensor operators. move_into copies a descriptor that
 * a function above returned into dst and frees the C copy; drop releases dst's storage reference. */
void tpsh_tensor_move_into(tpsh_tensor *dst, tpsh_tensor *src);
void tpsh_tensor_drop(tpsh_tensor *t);
/* tpsh_tensor_empty into a caller-owned descriptor (the hot path of every op that makes a tensor). */
int tpsh_tensor_init_empty(tpsh_tensor *dst, int ndim, const int64_t *sizes, int dtype, tpsh_stream *s);
/* A new contiguous tensor shaped like src, of dtype (-1: src's). */
int tpsh_tensor_init_like(tpsh_tensor *dst, const tpsh_tensor *src, int dtype, tpsh_stream *s);

/* The caching allocator's counters (core/alloc.c), one set per rank (a rank has one device), read by
 * Lua without a call: tp.memory_stats() copies them, tp.time counts allocations per iteration, and
 * tensor.lua paces the garbage collector by bytes_since_step (tensor memory is invisible to Lua's
 * collector, which sees small cdata) and resets it. Doubles: exact up to 2^53. */
typedef struct tpsh_alloc_stats {
  double bytes_since_step;     /* tensor bytes allocated since Lua's last collector step (Lua resets it) */
  double bytes_live;           /* bytes that live storages asked for */
  double tensors_allocated;    /* storages ever made */
  double allocated, allocated_peak;   /* bytes of the blocks that live storages hold */
  double reserved, reserved_peak;     /* bytes of the blocks the backend handed out: held and cached */
  double requested_peak;       /* the peak of bytes_live */
  double allocations, frees;   /* of blocks: every allocation is a cache hit or a miss */
  double cache_hits, cache_misses;    /* a miss asks the backend */
  double backend_frees;        /* blocks given back to the backend */
  double cached_blocks, cached_bytes; /* in the cache now */
  double pending_blocks;       /* freed, waiting for other streams' uses to complete */
  double gc_steps;             /* collector steps tensor.lua took for tensor memory */
  double flushes;              /* times the cache went back to the backend because it had no memory */
  int32_t caching;             /* 0 under TPSH_NO_MEMORY_CACHING=1: every free goes to the backend */
} tpsh_alloc_stats;
tpsh_alloc_stats *tpsh_alloc_stats_get(void);
/* Gives the cached blocks back to the backend (tp.empty_cache); returns how many bytes. */
double tpsh_empty_cache(void);
/* The peaks start again from the current figures (tp.reset_peak_memory_stats). */
void tpsh_reset_peak_memory_stats(void);
int tpsh_tensor_free(tpsh_tensor *t);          /* frees the storage now, stream-ordered */
int tpsh_tensor_alive(const tpsh_tensor *t);   /* 0 once the storage was freed */
int64_t tpsh_tensor_numel(const tpsh_tensor *t);
void *tpsh_tensor_data(const tpsh_tensor *t);  /* address of element 0 (device memory on CUDA); NULL once freed */
int tpsh_tensor_is_contiguous(const tpsh_tensor *t);
uint64_t tpsh_tensor_storage_id(const tpsh_tensor *t);
int64_t tpsh_tensor_storage_nbytes(const tpsh_tensor *t);
int tpsh_record_stream(tpsh_tensor *t, tpsh_stream *s);

/* ---- ops: enqueued on s, return at once ------------------------------------------------------- */
int tpsh_fill(tpsh_stream *s, tpsh_tensor *out, double value);
int tpsh_copy(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *src);      /* casts between dtypes */
int tpsh_add(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b, double alpha);
int tpsh_mul(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b);
int tpsh_scale(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, double factor);
/* out = a * factor + shift, in double and rounded once (integers: int64 with wrap-around when factor and
 * shift are integral, else truncated): a tensor plus or minus a number */
int tpsh_scale_add(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, double factor, double shift);
int tpsh_matmul(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b);
int tpsh_sum(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a);        /* out: one element */
int tpsh_arange(tpsh_stream *s, tpsh_tensor *out, double start, double step);
int tpsh_random(tpsh_stream *s, tpsh_tensor *out, int normal, uint64_t seed, uint64_t offset);   /* float out */
int tpsh_spin(tpsh_stream *s, double ms);                 /* 0 <= ms <= TPSH_SPIN_MAX_MS */
int tpsh_cat(tpsh_stream *s, tpsh_tensor *out, int n, tpsh_tensor *const *list, int dim);

/* ---- reductions along a dim, softmax, norms, addmm, bmm: enqueued on s (src/core/ops_reduce.c) ---
 * Float dtypes (f32, f64, f16, bf16), one for every tensor but indices; f16 and bf16 are computed in
 * f32 on GPUs, every dtype in f64 on the CPU, and rounded once to the output. dim is 0-based.
 * tpsh_reduce_dim: op a tpsh_reduce_op, TPSH_SUM, TPSH_AVG (the mean), TPSH_MAX or TPSH_MIN; out is a's
 * shape without dim, or with size 1 there when keepdim; indices (NULL, or i64 of out's shape, with MAX
 * and MIN only) gets the 1-based index along dim of the first max or min. NaN propagates (it is the
 * max and the min, at its first index); the max or min of a dim of size 0 is refused. */
int tpsh_reduce_dim(tpsh_stream *s, int op, tpsh_tensor *out, tpsh_tensor *indices, const tpsh_tensor *a, int dim,
                    int keepdim);
/* out (x's shape; x itself allowed) = softmax of x along dim, max-subtracted; log_softmax when log. */
int tpsh_softmax(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *x, int dim, int log);
/* Over the last dim of x: (x - mean) / sqrt(var + eps) * weight + bias, the variance biased; and
 * x / sqrt(mean(x^2) + eps) * weight. weight and bias: NULL or 1-D of the last dim's size. */
int tpsh_layer_norm(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *x, const tpsh_tensor *weight,
                    const tpsh_tensor *bias, double eps);
int tpsh_rms_norm(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *x, const tpsh_tensor *weight, double eps);
/* out (m,n) = beta * c + alpha * a (m,k) @ b (k,n); c is (m,n) or broadcasts to it ((n), (1,n), (m,1)),
 * and out may be c itself (accumulating); beta 0 reads nothing of c (its NaNs do not propagate). */
int tpsh_addmm(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *c, const tpsh_tensor *a, const tpsh_tensor *b,
               double alpha, double beta);
/* out (B,m,n) = a (B,m,k) @ b (B,k,n), a product per batch index (every dtype, as tpsh_matmul). */
int tpsh_bmm(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b);
/* Matmul operands and outputs that a backend copied to a temporary so far on this rank (tests: a 2-D
 * view with a unit stride in one dim goes to (cu)BLAS as it lies, through the transpose flags). */
int64_t tpsh_matmul_staged(void);
/* ---- element-wise ops (src/core/ops_pointwise.c): enqueued on s, return at once ------------------
 * Operands broadcast with PyTorch's rules (shapes aligned from the last dimension; a size 1 or a missing
 * leading dimension repeats), here and in tpsh_add, tpsh_mul, tpsh_scale(_add); out must have the
 * broadcast shape. Unary and binary ops are the rows of src/core/pointwise.h, found by name; p is a
 * unary op's number (pow's exponent, a division's number). */
int tpsh_unary_op(const char *name);             /* "relu", "gelu_tanh", "pow", ...: its id, -1 when unknown */
int tpsh_binary_op(const char *name);            /* "div", "maximum", "gelu_backward", ... */
/* The dtype of op's result for operands of dtype (an integer divided: f32); -1, with the message, for a
 * dtype op does not take (exp of an integer) */
int tpsh_unary_dtype(int op, int dtype);
int tpsh_binary_dtype(int op, int dtype);
int tpsh_unary(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *x, int op, double p);
int tpsh_binary(tpsh_stream *s, tpsh_tensor *out, const tpsh_tensor *a, const tpsh_tensor *b, int op);
/* A new contiguous tensor of the broadcast shape of a and b (b NULL: a's shape), of dtype (-1: a's). */
int tpsh_tensor_init_broadcast(tpsh_tensor *dst, const tpsh_tensor *a, const tpsh_tensor *b, int dtype,
                               tpsh_stream *s);
/* t viewed with the shape sizes (-1 keeps a size of t): a dimension of size 1 repeats (stride 0), new
 * dimensions come first; NULL with the message where a size other than 1 would change. */
tpsh_tensor *tpsh_tensor_expand(const tpsh_tensor *t, int ndim, const int64_t *sizes);

/* ---- to and from the host: wait for s only ---------------------------------------------------- */
int tpsh_to_host(tpsh_stream *s, const tpsh_tensor *t, void *dst);         /* dst: numel * dtype size */
int tpsh_from_host(tpsh_stream *s, tpsh_tensor *t, const void *src);       /* t contiguous */
/* Elementwise comparison, on the device, then read back: result[0] = elements that violate
 * |a - b| <= atol + rtol * |b| (NaN violates), result[1] = max |a - b|. */
int tpsh_compare(tpsh_stream *s, const tpsh_tensor *a, const tpsh_tensor *b, double rtol, double atol,
                 double *result);

/* ---- streams ---------------------------------------------------------------------------------- */
tpsh_stream *tpsh_stream_create(int priority, const char *name);
tpsh_stream *tpsh_default_stream(void);
void tpsh_stream_retain(tpsh_stream *s);
void tpsh_stream_release(tpsh_stream *s);
int tpsh_stream_synchronize(tpsh_stream *s);
int tpsh_stream_query(tpsh_stream *s);           /* 1: all work done, 0: pending, < 0: error */
int tpsh_stream_wait_event(tpsh_stream *s, tpsh_event *e);
int tpsh_stream_wait_stream(tpsh_stream *s, tpsh_stream *other);
const char *tpsh_stream_name(const tpsh_stream *s);
int tpsh_stream_priority(const tpsh_stream *s);
uint64_t tpsh_stream_id(const tpsh_stream *s);
void *tpsh_stream_handle(tpsh_stream *s);         /* cudaStream_t on CUDA; NULL on the CPU backend */
int tpsh_synchronize(void);                       /* every stream of this rank */
int tpsh_stream_count(void);                      /* live streams of this rank (tests) */

/* ---- events ----------------------------------------------------------------------------------- */
tpsh_event *tpsh_event_create(int timing);
void tpsh_event_release(tpsh_event *e);
int tpsh_event_record(tpsh_event *e, tpsh_stream *s);
int tpsh_event_query(tpsh_event *e);             /* 1: reached (or never recorded), 0: pending */
int tpsh_event_synchronize(tpsh_event *e);
int tpsh_event_elapsed(tpsh_event *start, tpsh_event *end, double *ms);

/* ---- Work tickets (src/core/work.c): the end events of untimed collectives, without a finalizer ---
 * A ticket (a double: generation * 2^24 + slot) names a pooled event; the event is reused only after it
 * has completed, and then the ticket's generation is stale: its Work has completed. */
double tpsh_work_take(tpsh_stream *s);                /* a new ticket for an event to record on s next;
                                                         < 0 (minus a status) on failure */
tpsh_event *tpsh_work_event(double ticket);           /* borrowed; NULL once the Work has completed */
void tpsh_work_drop(double ticket);                   /* gives back a ticket whose event went unused */
int tpsh_work_wait(double ticket, tpsh_stream *s);    /* s waits for the Work's end */
int tpsh_work_block(double ticket);                   /* the host waits for it */
int tpsh_work_query(double ticket);                   /* 1: completed, 0: pending, < 0: error */
int tpsh_work_slots(void);                            /* events the tickets hold (tests) */
void tpsh_work_age(uint32_t gens);                    /* idle slots as if reused gens times more (tests) */

/* ---- groups and host-side exchange of bytes (Lua values serialised by string.buffer) ---------- */
tpsh_group *tpsh_world(void);
void tpsh_group_retain(tpsh_group *g);
void tpsh_group_release(tpsh_group *g);
int tpsh_group_rank(const tpsh_group *g);
int tpsh_group_size(const tpsh_group *g);
int tpsh_group_world_rank(const tpsh_group *g, int group_rank);
/* All ranks of g call these. Buffers returned in *out are released with tpsh_free_buffer. A root of
 * tpsh_host_bcast that has nothing to send (its value could not be serialised) passes len -1: every
 * rank then fails, the others with a message that says so, instead of waiting for bytes never sent. */
int tpsh_host_allgather(tpsh_group *g, const void *buf, int64_t len, void **out, int64_t *lens);
int tpsh_host_gather(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *lens);
int tpsh_host_bcast(tpsh_group *g, const void *buf, int64_t len, int root, void **out, int64_t *out_len);
/* what: the caller's name for the barrier ("group:barrier", "tp.time"), which the watchdog reports when
 * a rank never comes; NULL for "tp.barrier". */
int tpsh_host_barrier(tpsh_group *g, const char *what);

/* New groups: collective over the world (tpsh_new_group) or over g (tpsh_group_split). The status says
 * whether the call failed; *out is the new group, or NULL on a rank that is not a member (not an
 * error). tpsh_new_group checks that every rank passed the same valid list (an error on every rank
 * otherwise); group rank i is world rank world_ranks[i]. A negative color leaves the rank out. */
int tpsh_new_group(int n, const int *world_ranks, tpsh_group **out);
int tpsh_group_split(tpsh_group *g, int color, int key, tpsh_group **out);
uint64_t tpsh_group_id(const tpsh_group *g);
uint64_t tpsh_group_seq(const tpsh_group *g);        /* collectives issued on g so far */
/* The backend's communicator: ncclComm_t on CUDA; on the CPU backend a pointer to the MPI_Comm that
 * carries g's collectives. For FFI interop: what is enqueued through it is invisible to tpsh. */
void *tpsh_group_handle(tpsh_group *g);
tpsh_stream *tpsh_group_comm_stream(tpsh_group *g);  /* new reference; "comm<id>", high priority */

/* ---- collectives: enqueued on s, return at once (src/core/collective.c) ------------------------
 * Buffers are contiguous (except the outputs of all_gather_list); out and in may be the same tensor
 * for all_reduce, or in may be this rank's piece of out (all_gather) / out of in (reduce_scatter).
 * all_gather: out is {size * in.sizes[0], ...} or {size, in.sizes...}; reduce_scatter the reverse.
 * all_to_all: dimension 0 of in splits into size pieces, piece j goes to rank j. op: a tpsh_reduce_op;
 * avg on integers truncates. A send or receive to oneself needs its match in the same batch.
 * Between tpsh_batch_begin(g) and tpsh_batch_end(s, g, ...), calls on g are checked and recorded
 * (their s may be NULL; all_gather_list allocates its temporary on s, so give the stream the batch
 * will run on) and batch_end issues them on s as one group launch. */
int tpsh_all_gather(tpsh_stream *s, tpsh_group *g, tpsh_tensor *out, const tpsh_tensor *in);
int tpsh_all_gather_list(tpsh_stream *s, tpsh_group *g, int n, tpsh_tensor *const *outs, const tpsh_tensor *in);
int tpsh_all_reduce(tpsh_stream *s, tpsh_group *g, tpsh_tensor *out, const tpsh_tensor *in, int op);
int tpsh_reduce_scatter(tpsh_stream *s, tpsh_group *g, tpsh_tensor *out, const tpsh_tensor *in, int op);
int tpsh_broadcast(tpsh_stream *s, tpsh_group *g, tpsh_tensor *t, int root);
int tpsh_reduce(tpsh_stream *s, tpsh_group *g, tpsh_tensor *t, int root, int op);
int tpsh_all_to_all(tpsh_stream *s, tpsh_group *g, tpsh_tensor *out, const tpsh_tensor *in);
int tpsh_send(tpsh_stream *s, tpsh_group *g, const tpsh_tensor *t, int peer);
int tpsh_recv(tpsh_stream *s, tpsh_group *g, tpsh_tensor *t, int peer);
int tpsh_batch_begin(tpsh_group *g);
/* Checks and issues the batch on s; when given, s first waits for `after` (a stream), and the events
 * start and end are recorded on s around the collectives. On error nothing is enqueued. */
int tpsh_batch_end(tpsh_stream *s, tpsh_group *g, tpsh_stream *after, tpsh_event *start, tpsh_event *end);
/* The same with a new Work ticket's event as the end event (tpsh_work_take): returns the ticket, whose
 * Work holds the batch's tensors' storages until it is waited on or known complete, or minus a status
 * (nothing issued, the batch dropped). */
double tpsh_batch_end_work(tpsh_stream *s, tpsh_group *g, tpsh_stream *after);
void tpsh_batch_cancel(tpsh_group *g);                /* drops what was recorded; nothing is issued */
/* One collective by kind, as the calls above: a and b are (out, in) of all_gather, all_reduce,
 * reduce_scatter and all_to_all, or the one tensor of broadcast, reduce, send and recv (b NULL); arg is
 * the root or the peer, op the reduce op. tpsh_collective records it in g's open batch or issues it at
 * once on s; tpsh_collective_work issues it at once on s (after s waits for `after`) with a new Work
 * ticket's event as its end event, as tpsh_batch_begin, the call and tpsh_batch_end_work would, in one
 * call: returns the ticket, or minus a status (nothing issued). */
int tpsh_collective(tpsh_stream *s, tpsh_group *g, int kind, tpsh_tensor *a, const tpsh_tensor *b, int arg, int op);
double tpsh_collective_work(tpsh_stream *s, tpsh_group *g, tpsh_stream *after, int kind, tpsh_tensor *a,
                            const tpsh_tensor *b, int arg, int op);

/* ---- graphs: tp.graph (src/core/graph.c) --------------------------------------------------------
 * Between tpsh_graph_begin(s) and tpsh_graph_end, what is enqueued on s and on the streams that wait for
 * an event recorded in the capture (ops, collectives, event records and waits) is recorded, not run (on
 * CUDA it is captured into a CUDA graph as well); tensors allocated meanwhile take their memory from the
 * graph's pool, which no one else uses while the graph lives. Reads to the host, host waits, queries and
 * host-side exchanges are refused with TPSH_ECAPTURE, and work on a stream that has not joined the
 * capture with TPSH_ECAPTURE too. tpsh_graph_end returns the graph, or NULL (the capture failed: a stream
 * left unjoined, the backend's instantiation) with the streams as before; tpsh_graph_abort ends a capture
 * without a graph (the function raised). tpsh_graph_replay runs the graph again after the work enqueued on
 * s, and after its previous replay. tpsh_graph_release: the graph lets go of its tensors and memory
 * (stream-ordered, after its replays). The graph holds every tensor its ops use. */
typedef struct tpsh_graph tpsh_graph;
int tpsh_graph_begin(tpsh_stream *s, const char *name);
tpsh_graph *tpsh_graph_end(void);
void tpsh_graph_abort(void);
int tpsh_graph_replay(tpsh_graph *g, tpsh_stream *s);
void tpsh_graph_release(tpsh_graph *g);
int tpsh_graph_capture_active(void);
int tpsh_graph_refuse(const char *what);       /* TPSH_ECAPTURE: `what` ("waits on the host") is refused */
const char *tpsh_graph_name(const tpsh_graph *g);
/* What g holds: kernels, collectives, event records, waits, streams, tensors held, pool bytes, replays,
 * and whether it replays natively (1: one CUDA graph launch; 0: the record is enqueued again). */
typedef struct tpsh_graph_info {
  double kernels, collectives, records, waits, streams, tensors, pool_bytes, replays;
  int32_t native;
} tpsh_graph_info;
void tpsh_graph_get_info(const tpsh_graph *g, tpsh_graph_info *out);

/* ---- trace: what tp.trace records (src/core/trace.c) -------------------------------------------
 * When on, every op, collective, cross-stream wait and host block of this rank becomes a record.
 * Device records are timed by events and get their times at tpsh_trace_resolve (which waits for
 * them); t0/t1 are then ms on this rank's host clock (tpsh_now_ms). The pointer from
 * tpsh_trace_records is valid until the next traced call. Records past a cap (1M) are dropped. */
typedef enum tpsh_trace_category {
  TPSH_TRACE_COMPUTE = 0, TPSH_TRACE_COMM = 1, TPSH_TRACE_WAIT = 2, TPSH_TRACE_HOST = 3,
  TPSH_TRACE_SPAN = 4,        /* a named stretch of the script's time (tp.trace.span, tp.compare) */
  TPSH_TRACE_RANGE = 5        /* a named range of the script (tp.range): its own track, nested */
} tpsh_trace_category;
typedef struct tpsh_trace_record {
  double t0, t1;              /* ms, host clock of this rank (device records: once resolved) */
  double bytes;               /* what the op reads and writes; collectives: the larger buffer */
  int64_t seq;                /* collectives: the group's sequence number; ops: this rank's op count;
                               * ranges: the depth (0 outermost) */
  int32_t category;           /* a tpsh_trace_category; -1: not timed (the op failed), to be skipped */
  int32_t stream;             /* index in the trace's stream table, -1: the host */
  int32_t unfinished;         /* 1: not finished when a failed run ended (tpsh_trace_resolve_reached) */
  const char *name;           /* "matmul", "all_gather", "wait", "synchronize", ... */
  char args[88];              /* shapes and dtypes, or the collective's size and group */
} tpsh_trace_record;
int tpsh_trace_start(void);                    /* records the reference event (waits for the default stream) */
int tpsh_trace_stop(void);
int tpsh_trace_active(void);
void tpsh_trace_clear(void);
int tpsh_trace_resolve(void);
/* Without waiting (a failed run's end): records not ended yet run to now, marked unfinished; those not
 * started are dropped. counts: [0] unfinished, [1] not started. */
void tpsh_trace_resolve_reached(int64_t counts[2]);
/* A span from t0 (tpsh_now_ms) to now on the host, named name (copied): when tracing is on. */
void tpsh_trace_span(const char *name, double t0);
int64_t tpsh_trace_count(void);
int64_t tpsh_trace_dropped(void);
const tpsh_trace_record *tpsh_trace_records(void);
int tpsh_trace_stream_count(void);
const char *tpsh_trace_stream_name(int i);
uint64_t tpsh_trace_stream_id(int i);
/* This rank's host clock minus rank 0's: 0 on rank 0's host, else by ping-pong (min round trip);
 * rounds < 0 forces -rounds ping-pongs with every rank. Every rank of g calls it. *rtt_ms (may be
 * NULL) gets the round trip of the sample kept, 0 where nothing was estimated; the error is <= half. */
int tpsh_trace_clock_offset(tpsh_group *g, int rounds, double *offset_ms, double *rtt_ms);

/* ---- named ranges (src/core/range.c; Lua: tp.range, tp.range_push, tp.range_pop) -----------------
 * Ranges nest on the host thread's one stack. Each closed range is a record of the trace (when tracing
 * is on: TPSH_TRACE_RANGE, seq = its depth, 0 outermost) and, in a build with CUDA, an NVTX range.
 * push: name and where (the script's file:line, for messages; may be NULL) are copied. pop: name NULL
 * closes the innermost range, else the innermost must be named so (an error otherwise, nothing popped).
 * pop_to closes every range above depth, note (may be NULL) in their records (tp.range's way out of an
 * error). tpsh_range_close_open closes
 * every open range as left open (the end of a script, or unfinished: a failed run's own trace) and
 * says how many there were. */
int tpsh_range_push(const char *name, const char *where);
int tpsh_range_pop(const char *name);
int tpsh_range_depth(void);
const char *tpsh_range_name(int depth);      /* the open range at depth (0 outermost), "" past the top */
const char *tpsh_range_where(int depth);
void tpsh_range_pop_to(int depth, const char *note);
int tpsh_range_close_open(int unfinished);

/* ---- chaos mode (src/core/chaos.c; Lua: tp.chaos; --chaos[=SEED], TPSH_CHAOS) --------------------
 * Seeded random delays before stream work and collectives (docs/design.md "Chaos mode"). set: on with
 * seed (an integer from 1 to 2^53 - 1), every stream's draws start again; seed < 0: off. seed: the seed,
 * -1 when off. stats: out[0] delays enqueued since the last set, out[1] their total ms. */
int tpsh_chaos_set(double seed);
double tpsh_chaos_seed(void);
void tpsh_chaos_stats(double out[2]);
/* The line a failed run says while chaos mode is on, "tpsh: chaos seed N (--chaos=N gives the same delays
 * again)", in buf; NULL when it is off. Any thread (the watchdog's end of a run says it too). */
const char *tpsh_chaos_line(char *buf, size_t n);

/* ---- stream sanitizer, collective checks, flight recorder, watchdog ------------------------------
 * (src/core/sanitizer.c, coll_match.c, flight.c, watchdog*.c; Lua: tp.check). Check mode tracks, per
 * stream, a vector clock and, per storage, the accesses, and reports unordered cross-stream accesses,
 * host reads of unsynchronised writes and frees that rely on the stream-ordered allocator; it also
 * compares every collective across the group's ranks before it is enqueued. Reports are printed
 * (rank-prefixed) and kept until tpsh_check_clear; strict mode turns the first one into an error of
 * the call that found it. Strings of a report stay valid until tpsh_check_clear. */
typedef struct tpsh_check_report {
  const char *kind;            /* "read-after-write race", ... */
  const char *message;         /* the full printed text */
  const char *location;        /* file:line of the access that found it */
  const char *other_location;  /* file:line of the conflicting access ("" for none) */
  const char *op, *other_op;
  const char *stream, *other_stream;
  const char *shape;           /* "[4, 8] f32" */
} tpsh_check_report;
void tpsh_check_enable(int on);                /* turning it on starts from a clean state */
int tpsh_check_enabled(void);
void tpsh_check_set_strict(int on);
int tpsh_check_strict(void);
void tpsh_check_set_location(const char *file_line);   /* the user's current Lua line (check mode) */
void tpsh_check_set_explicit_free(int on);              /* Lua, around t:free() */
int tpsh_check_report_count(void);
const tpsh_check_report *tpsh_check_report_get(int i);
void tpsh_check_clear(void);
/* The entries of the sanitizer's vector clocks (the host's included; 0 when check mode is off): one per
 * stream alive at once at most, since a destroyed stream's slot is reused, not one per stream ever made. */
int tpsh_check_clock_size(void);
char *tpsh_flight_record_text(void);           /* the flight record, one line per collective (free it) */
char *tpsh_groups_collectives_text(void);      /* "id world-ranks count digest failures" per group (free it; group.c) */
void tpsh_watchdog_set_timeout(double seconds);
void tpsh_watchdog_set_ending_note(const char *note);   /* said when the watchdog ends the run (NULL: none) */
double tpsh_watchdog_timeout(void);
/* The host blocks (synchronize, a read to the host, a host-side exchange): the watchdog times it, and
 * names `what` when it expires. Nested waits keep the outer one's name (`tpsh test` labels its own
 * exchanges so). */
void tpsh_watch_wait_begin(const char *what);
void tpsh_watch_wait_end(void);
/* Interrupting the host's waits for streams (stream and event synchronize, w:block, tp.synchronize, a
 * read to the host): while tpsh_interrupt(1) stands, they return TPSH_EINTR instead of waiting on; the
 * work itself goes on on its stream. The REPL sets it on Ctrl-C (from another thread: it only stores a
 * flag) and clears it when the chunk ends. tpsh_interruptible(1) makes every host wait poll for it
 * (the CUDA backend otherwise blocks in the driver, where nothing can interrupt it). stream.c. */
void tpsh_interrupt(int on);
void tpsh_interruptible(int on);
/* A run that the watchdog or a signal ends (host_ending.c): with --trace the host writes its own records
 * first. tpsh_host_ending_enable (the host, with --trace) makes host waits poll; tpsh_host_ending_ask (the
 * ending thread) makes them return TPSH_EENDED and waits, boundedly, for the host: 1 if it wrote. The host
 * (capi.lua) then calls _begin (0: not asked now: hold), reads the status and message (the ending
 * thread's report), writes, and hands its line to _done, which says it and holds the thread for good. */
void tpsh_host_ending_enable(void);
int tpsh_host_ending_ask(int status, const char *message);
/* The two halves of _ask: _request waits (at most 2 s) for the host to begin, 1 if it did; _finish
 * waits (at most 30 s) for it to be done, 1 if it wrote. */
int tpsh_host_ending_request(int status, const char *message);
int tpsh_host_ending_finish(void);
int tpsh_host_ending_begin(void);
int tpsh_host_ending_status(void);
const char *tpsh_host_ending_message(void);
void tpsh_host_ending_done(const char *line);
void tpsh_host_ending_hold(void);
/* An asynchronous error (NCCL's: a peer gone, a network failure) that a query of tpsh's own found and
 * the script has not been told yet: TPSH_ECOMM with its message (the runner asks after each test), else
 * 0. Every host wait, query, stream-side wait and read returns it too, until Lua raises an error that
 * carries it, which capi.lua says by tpsh_async_error_raised (error.c). */
int tpsh_async_error_check(void);
void tpsh_async_error_raised(void);
/* `tpsh test`: the test that runs now (a count, 0: none), and the runner's own exchange as a wait.
 * failure (NULL: none): this rank failed the test. Another rank's watchdog, once its host has been
 * blocked elsewhere in the same test for 1 s, asks for both, and ends the run quoting the failure
 * when this rank will never join what it waits for (watchdog_peers.c). */
void tpsh_watch_test(uint64_t test);
/* `tpsh test`: words naming the step that runs now, for the message that ends the run ("test 'X'
 * (file:line)", "the loading of the spec files"; copied). NULL: "this test". */
void tpsh_watch_step(const char *words);
void tpsh_watch_exchange_begin(const char *what, const char *failure);
/* A plain script (tpsh script.lua, -e, -): the whole script is one "test" for the watchdog
 * (tpsh_watch_test(TPSH_WATCH_SCRIPT), set by the host), and its end an exchange where every rank
 * waits for the others (tp._finish calls it after the streams are done, before the finish hooks). A
 * rank blocked in a collective or a host-side exchange that a rank waiting there never issued is
 * then ended within seconds, not at the timeout. Returns TPSH_OK or an error status. */
int tpsh_watch_end_of_script(void);
/* The end of a script, before the wait for the streams (tp._finish): every rank waits for the others,
 * and they compare their sends and receives, pair by pair (p2p_ledger.c). An unmatched send or receive
 * raises on both ranks of the pair, rather than be lost silently (a small send on the CPU backend) or
 * wait until the timeout. Returns TPSH_OK or an error status. */
int tpsh_watch_p2p_at_end(void);
/* This rank's sends and receives so far, one line per peer it has any with: "peer sent groups received
 * groups" (world rank, counts, and each a hex digest of the groups they were on), e.g.
 * "1 3 5f0c1e27a9b3d410 0 0000000000000000". `tpsh test` compares the ranks' after every test
 * (lua/tpsh/issued.lua). Free it with tpsh_free_buffer; NULL when out of memory. p2p_ledger.c. */
char *tpsh_p2p_ledger_text(void);
/* How many times this rank's watchdog has asked the other ranks for their state (diagnostics, specs). */
uint64_t tpsh_watch_questions(void);

/* CDEF END */
#define TPSH_WATCH_SCRIPT UINT64_MAX   /* tpsh_watch_test: a plain script, not one of tpsh test's tests */

#ifdef __cplusplus
}
#endif
#endif /* TPSH_H */
