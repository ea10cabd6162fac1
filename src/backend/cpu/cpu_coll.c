/*
 * cpu_coll.c: the CPU backend's collectives: MPI calls made by the worker thread of the stream they
 * were enqueued on, on the group's dev_comm.
 *
 * Ordering. MPI matches collectives on a communicator by the order in which they are started, so every
 * rank must start them in the same order; but two streams' workers reach their collectives in any
 * order. Each group therefore numbers its collectives in issue order (the core's g->seq, program order
 * on every rank), and a worker starts its collective only when its number is the group's next one: it
 * waits for its turn, starts nonblocking MPI calls (MPI_I*), passes the turn on, and waits for
 * completion outside the lock. This cannot deadlock: a worker waits only for collectives issued
 * earlier, which never wait for later work (the same argument as for NCCL on several CUDA streams).
 * Holding the turn through a blocking call instead would serialise every collective of the group on
 * this rank, and could not express a batch (a send/recv ring must post every request before waiting).
 *
 * Reductions. sum, max, min and prod map to MPI's ops on the native type; max and min of floats on
 * integer keys in the floats' order (float_keys below: NaN and signed zeros alike on every rank). f16 and bf16 are converted
 * to an f32 temporary, reduced in f32 and rounded back once. avg = sum / size: on floats in the
 * reduction type, on integers in int64 (i32 and u8 are widened first, so the sum does not wrap) and
 * truncated toward zero (as C's division). u8 max and min run in i32 (work_dtype says why). Everything
 * else moves raw bytes (f16/bf16 as uint16).
 *
 * Errors: dev_comm returns MPI errors instead of aborting; a failing collective becomes the stream's
 * sticky error, reported (with the op's name) at the next host-side wait on that stream.
 */
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include <limits.h>
#include <stdio.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* A send's tag is P2P_TAG + its dtype, and a receive takes any tag from its peer, then compares: a send
 * and a recv of the same byte size but different dtypes (i32 sent, f32 received; 2 x f64 against 4 x
 * f32) completed and reinterpreted the bytes, which only --check noticed. The tag costs nothing (no
 * extra bytes, no extra call), and a receive of any tag matches the same message as before: MPI keeps
 * one sender's messages on a communicator in order whatever their tags, and nothing else receives on a
 * group's dev_comm. The count then follows from the byte size (check_status). */
enum { P2P_TAG = 7 };

/* The turn and the counts are atomics, and the mutex and condition variable serve only a thread that
 * must wait (a worker whose turn has not come, the group's destruction): a collective that finds its
 * turn took two lock pairs and a broadcast for it, and one more pair and broadcast to count itself
 * finished, each on a line the host thread writes too (issued), about 300 of the 1600 instructions a
 * worker spent on a collective outside MPI. The word each side writes sits on a line of its own. A
 * waiter announces itself (waiters, under mu) before it rechecks; the writer stores, then reads the
 * announcement (both sequentially consistent): one of them sees the other, so no wake-up is lost. */
typedef struct cpu_group {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  MPI_Comm comm;           /* the group's dev_comm (owned by the group) */
  int rank, size;
  tpsh_group *g;           /* whose failures a failed collective counts (tpsh_group_note_failure) */
  int waiters;             /* atomic: threads in cv's wait, or about to be (under mu) */
  /* Receives per peer, the matching order kept (match_recvs): the next ticket to hand out (under the
   * turn), and the ticket whose receive probes next (atomic); 2 x size words, one allocation. */
  uint64_t *recv_ticket, *recv_turn;
  _Alignas(64) uint64_t next_start;   /* atomic: the sequence number of the collective to start next */
  _Alignas(64) uint64_t issued;       /* atomic: ops enqueued (the host thread) */
  struct coll_op *spare;              /* the host's: ops of one collective to fill again */
  _Alignas(64) uint64_t finished;     /* atomic: ops whose worker is done with them */
  struct coll_op *recycled;           /* atomic: a stack of run ops of one collective (see recycle) */
} cpu_group;

typedef struct coll_op {
  struct coll_op *next;    /* on cpu_group's recycled or spare list */
  cpu_group *cg;
  int started;             /* its turn was taken (else free_arg must pass the turn on) */
  int n;
  tpsh_coll_args c[];
} coll_op;

/* ==== types ====================================================================================== */
static MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
  case TPSH_F32: return MPI_FLOAT;
  case TPSH_F64: return MPI_DOUBLE;
  case TPSH_I32: return MPI_INT32_T;
  case TPSH_I64: return MPI_INT64_T;
  case TPSH_U8: return MPI_UINT8_T;
  default: return MPI_UINT16_T;           /* f16, bf16: bytes only; reductions convert first */
  }
}

static MPI_Op mpi_op(int op) {
  switch (op) {
  case TPSH_MAX: return MPI_MAX;
  case TPSH_MIN: return MPI_MIN;
  case TPSH_PROD: return MPI_PROD;
  default: return MPI_SUM;                /* sum, avg */
  }
}

static int is_reduction(int kind) { return tpsh_coll_kinds[kind].has_op; }

/* max and min of floats reduce ordered integer keys (float_keys): MPI_MAX compares floats with `>` in
 * whatever order each rank's reduction meets them, so one NaN would leave the ranks with different
 * results (2 on rank 0, NaN on rank 1). */
static int minmax_keys(const tpsh_coll_args *a) {
  return is_reduction(a->kind) && (a->op == TPSH_MAX || a->op == TPSH_MIN) && tpsh_dtype_is_float(a->dtype);
}

/* The dtype the reduction runs in. */
static int work_dtype(const tpsh_coll_args *a) {
  if (!is_reduction(a->kind)) return a->dtype;
  if (minmax_keys(a)) return a->dtype == TPSH_F64 ? TPSH_I64 : TPSH_I32;
  if (a->dtype == TPSH_F16 || a->dtype == TPSH_BF16) return TPSH_F32;
  if ((a->dtype == TPSH_I32 || a->dtype == TPSH_U8) && a->op == TPSH_AVG) return TPSH_I64;
  /* u8 max and min in i32: MPICH 4.0.2 (Debian's, which tpsh is built with here) compares unsigned types
   * as signed in MPI_MAX and MPI_MIN (pmodels/mpich#6083), so the max of 87 and 140 came out 87 */
  if (a->dtype == TPSH_U8 && (a->op == TPSH_MAX || a->op == TPSH_MIN)) return TPSH_I32;
  return a->dtype;
}


static tpsh_tensor flat(int64_t n, int dtype) {
  tpsh_tensor t = {.ndim = 1, .dtype_id = dtype, .device = -1};
  t.sizes[0] = n;
  t.strides[0] = 1;
  return t;
}

static int convert(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n) {
  tpsh_tensor d = flat(n, dst_dtype), s = flat(n, src_dtype);
  return tpsh_cpu_copy(&d, dst, &s, src);
}

static int mpi_fail(int err, const char *call) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0, cls = MPI_SUCCESS;
  MPI_Error_string(err, msg, &len);
  MPI_Error_class(err, &cls);
  /* A collective (not MPI's own call, nor a send or receive, whose sizes check_status words) whose message
   * was truncated or of another size (MPICH: MPI_ERR_TRUNCATE, or MPI_ERR_OTHER with "message sizes do not
   * match" deeper in its stack): the members passed different counts or dtypes, or different collectives.
   * MPI's stack says so on one rank, in its own words, while another may complete with wrong values. */
  int sizes = cls == MPI_ERR_TRUNCATE || strstr(msg, "Message truncated") || strstr(msg, "sizes do not match");
  if (sizes && strncmp(call, "MPI_", 4) != 0 && strcmp(call, "send") != 0 && strcmp(call, "recv") != 0)
    return tpsh_error(TPSH_ECOMM, "%s failed: a message's size was not what this rank expected: the members of the group "
                      "passed different element counts or dtypes to this collective, or issued different collectives "
                      "(tpsh --check compares each collective before it is enqueued and names what every rank "
                      "passed; the other ranks' results are not to be trusted either); MPI's error: %s", call, msg);
  return tpsh_error(TPSH_ECOMM, "%s failed: %s", call, msg);
}

/* float_keys: floats as integers in the same order, for max and min: a float's bits as a signed integer when it is
 * positive, the bits with all but the sign flipped when it is negative (so -0 sorts just below +0), and
 * every NaN the lowest key for max, the highest for min. The keys reduce with MPI's own MPI_MAX/MPI_MIN
 * on integers, the same calls as any other max (an op of tpsh's own took another algorithm than MPI's
 * built-in ones in MPICH's shared memory path: ranks that passed different ops then hung instead of
 * completing, which the end's comparison reports). The result is NCCL's (fmaxf/__hmax: a NaN loses to a
 * number, NaN only where every rank has one), and the same on every rank; +0 beats -0 in max. In place,
 * over n words of 4 (bits 32) or 8 bytes; back: keys to floats, NaN as the quiet NaN. */
#define KEY_FUNCS(bits, U, S)                                                                                \
  static void floats_to_keys##bits(void *p, int64_t n, int is_max) {                                        \
    U *w = p;                                                                                                \
    const U sign = (U)1 << (bits - 1), exp = bits == 32 ? (U)0x7f800000u : (U)0x7ff0000000000000ull;        \
    for (int64_t i = 0; i < n; i++) {                                                                        \
      U u = w[i];                                                                                            \
      if ((u & ~sign) > exp) w[i] = is_max ? sign : sign - 1;             /* NaN: S's lowest or highest */    \
      else if (u & sign) w[i] = u ^ (sign - 1);                                                              \
    }                                                                                                        \
  }                                                                                                          \
  static void keys_to_floats##bits(void *p, int64_t n) {                                                    \
    U *w = p;                                                                                                \
    const U sign = (U)1 << (bits - 1), exp = bits == 32 ? (U)0x7f800000u : (U)0x7ff0000000000000ull;        \
    const U quiet = bits == 32 ? (U)0x7fc00000u : (U)0x7ff8000000000000ull;                                 \
    for (int64_t i = 0; i < n; i++) {                                                                        \
      U u = (S)w[i] < 0 ? w[i] ^ (sign - 1) : w[i];                                                          \
      w[i] = (u & ~sign) > exp ? quiet : u;                                                                  \
    }                                                                                                        \
  }
KEY_FUNCS(32, uint32_t, int32_t)
KEY_FUNCS(64, uint64_t, int64_t)
#undef KEY_FUNCS

/* ==== one collective: prepare, start, finish ===================================================== */
typedef struct coll_state {
  void *send, *recv;       /* the buffers MPI sees: the user's, or work-dtype temporaries */
  void *tmp;               /* one allocation for both temporaries (a recv: a message larger than its buffer) */
  int wdtype;
  /* a recv: its place among the receives from its peer, and its message once matched (match_recvs) */
  uint64_t ticket;
  int matched, sent_dtype;
  MPI_Count got;           /* the message's bytes */
} coll_state;

/* Before the turn: widen the input to the work dtype when the reduction needs it. */
static int prepare(const tpsh_coll_args *a, cpu_group *cg, coll_state *st) {
  st->send = a->send;
  st->recv = a->recv;
  st->tmp = NULL;
  st->wdtype = work_dtype(a);
  st->matched = 0;
  int64_t ns = tpsh_coll_send_count(a->kind, a->count, cg->size);
  int64_t nr = tpsh_coll_recv_count(a->kind, a->count, cg->size);
  /* Widened in place: one temporary for both, which all_reduce and reduce hand MPI as MPI_IN_PLACE.
   * Not reduce_scatter, whose output at the start of its input (rank 0's piece, or all of it on one
   * rank) is not MPI's in-place form: an f16 or bf16 one failed in MPI ("Buffers must not be aliased"). */
  /* Nor reduce at a root other than 0: MPICH 4.0.2's MPI_Reduce with MPI_IN_PLACE there reads a bad
   * address and crashes the root once the message takes its reduce-scatter-gather algorithm (from
   * about 2 KiB: pmodels/mpich#6540, fixed in later releases), so that root reduces from a copy of its
   * input into its tensor. */
  int reduce_copy = a->kind == TPSH_C_REDUCE && a->send == a->recv && a->peer == cg->rank && a->peer != 0;
  int in_place = a->send == a->recv && a->kind != TPSH_C_REDUCE_SCATTER && !reduce_copy;
  /* reduce_scatter with the output inside the input: MPI has no such in-place form, so the result
   * goes to a temporary first. */
  int rs_overlap = a->kind == TPSH_C_REDUCE_SCATTER && (char *)a->recv >= (char *)a->send &&
                   (char *)a->recv < (char *)a->send + ns * tpsh_dtype_size(a->dtype);
  if (st->wdtype == a->dtype && !rs_overlap && !reduce_copy) return TPSH_OK;
  size_t wsize = (size_t)tpsh_dtype_size(st->wdtype);
  size_t sbytes = (size_t)ns * wsize, rbytes = in_place || st->wdtype == a->dtype ? 0 : (size_t)nr * wsize;
  st->tmp = malloc(sbytes + rbytes + 1);
  if (!st->tmp) return tpsh_error(TPSH_ENOMEM, "%s: out of host memory for the reduction's buffers", a->name);
  if (st->wdtype == a->dtype && reduce_copy) {     /* the input moves, the output stays */
    memcpy(st->tmp, a->send, sbytes);
    st->send = st->tmp;
    return TPSH_OK;
  }
  if (st->wdtype == a->dtype) {          /* rs_overlap: the input stays, the output moves */
    st->recv = st->tmp;
    return TPSH_OK;
  }
  st->send = st->tmp;
  st->recv = in_place ? st->send : (char *)st->tmp + sbytes;
  if (minmax_keys(a)) {                  /* the floats, as f32 or f64, then their keys in place */
    int wide = st->wdtype == TPSH_I64;
    int rc = convert(st->send, wide ? TPSH_F64 : TPSH_F32, a->send, a->dtype, ns);
    if (rc == TPSH_OK && wide) floats_to_keys64(st->send, ns, a->op == TPSH_MAX);
    else if (rc == TPSH_OK) floats_to_keys32(st->send, ns, a->op == TPSH_MAX);
    return rc;
  }
  return convert(st->send, st->wdtype, a->send, a->dtype, ns);
}

/* Under the turn: start the MPI call(s) of one collective. */
static int start(const tpsh_coll_args *a, cpu_group *cg, coll_state *st, MPI_Request *req) {
  MPI_Comm comm = cg->comm;
  int count = (int)a->count, e;
  MPI_Datatype t = mpi_type(st->wdtype);
  switch (a->kind) {
  case TPSH_C_ALL_GATHER: {
    /* in place when the input already sits at this rank's piece of the output */
    size_t piece = (size_t)a->count * tpsh_dtype_size(a->dtype);
    const void *in = (char *)a->send == (char *)a->recv + cg->rank * piece ? MPI_IN_PLACE : a->send;
    e = MPI_Iallgather(in, count, t, a->recv, count, t, comm, req);
    break;
  }
  case TPSH_C_ALL_REDUCE:
    e = MPI_Iallreduce(st->send == st->recv ? MPI_IN_PLACE : st->send, st->recv, count, t, mpi_op(a->op), comm, req);
    break;
  case TPSH_C_REDUCE_SCATTER:
    e = MPI_Ireduce_scatter_block(st->send, st->recv, count, t, mpi_op(a->op), comm, req);
    break;
  case TPSH_C_BROADCAST:
    e = MPI_Ibcast(a->recv, count, t, a->peer, comm, req);
    break;
  case TPSH_C_REDUCE: {
    int root = cg->rank == a->peer;
    const void *in = root && st->send == st->recv ? MPI_IN_PLACE : st->send;
    e = MPI_Ireduce(in, root ? st->recv : NULL, count, t, mpi_op(a->op), a->peer, comm, req);
    break;
  }
  case TPSH_C_ALL_TO_ALL:
    e = MPI_Ialltoall(a->send, count, t, a->recv, count, t, comm, req);
    break;
  case TPSH_C_SEND:
    e = MPI_Isend(a->send, count, t, a->peer, P2P_TAG + a->dtype, comm, req);
    break;
  case TPSH_C_RECV:         /* its ticket only: match_recvs probes and receives */
    st->ticket = cg->recv_ticket[a->peer]++;
    *req = MPI_REQUEST_NULL;
    return TPSH_OK;
  default:
    *req = MPI_REQUEST_NULL;
    return tpsh_error(TPSH_EUNSUPPORTED, "unknown collective kind %d", a->kind);
  }
  if (e != MPI_SUCCESS) { *req = MPI_REQUEST_NULL; return mpi_fail(e, tpsh_coll_kinds[a->kind].mpi_call); }
  return TPSH_OK;
}

/* Under the turn, the whole collective with MPI's blocking call (the default; see blocking_collectives). */
static int run_blocking(const tpsh_coll_args *a, cpu_group *cg, coll_state *st) {
  MPI_Comm comm = cg->comm;
  int count = (int)a->count, e = MPI_SUCCESS;
  MPI_Datatype t = mpi_type(st->wdtype);
  switch (a->kind) {
  case TPSH_C_ALL_GATHER: {
    size_t piece = (size_t)a->count * tpsh_dtype_size(a->dtype);
    const void *in = (char *)a->send == (char *)a->recv + cg->rank * piece ? MPI_IN_PLACE : a->send;
    e = MPI_Allgather(in, count, t, a->recv, count, t, comm);
    break;
  }
  case TPSH_C_ALL_REDUCE:
    e = MPI_Allreduce(st->send == st->recv ? MPI_IN_PLACE : st->send, st->recv, count, t, mpi_op(a->op), comm);
    break;
  case TPSH_C_REDUCE_SCATTER:
    e = MPI_Reduce_scatter_block(st->send, st->recv, count, t, mpi_op(a->op), comm);
    break;
  case TPSH_C_BROADCAST:
    e = MPI_Bcast(a->recv, count, t, a->peer, comm);
    break;
  case TPSH_C_REDUCE: {
    int root = cg->rank == a->peer;
    e = MPI_Reduce(root && st->send == st->recv ? MPI_IN_PLACE : st->send, root ? st->recv : NULL, count, t,
                   mpi_op(a->op), a->peer, comm);
    break;
  }
  case TPSH_C_ALL_TO_ALL:
    e = MPI_Alltoall(a->send, count, t, a->recv, count, t, comm);
    break;
  }
  return e == MPI_SUCCESS ? TPSH_OK : mpi_fail(e, a->name);
}

/* After completion: avg's division, and the narrowing back to the user's dtype. */
static int finish(const tpsh_coll_args *a, cpu_group *cg, coll_state *st) {
  int rc = TPSH_OK;
  int has_result = a->kind != TPSH_C_REDUCE || cg->rank == a->peer;
  if (is_reduction(a->kind) && has_result) {
    int64_t n = a->count;
    if (a->op == TPSH_AVG) {
      int size = cg->size;
      switch (st->wdtype) {
      case TPSH_F32: { float *x = st->recv; for (int64_t i = 0; i < n; i++) x[i] /= (float)size; break; }
      case TPSH_F64: { double *x = st->recv; for (int64_t i = 0; i < n; i++) x[i] /= size; break; }
      case TPSH_I64: { int64_t *x = st->recv; for (int64_t i = 0; i < n; i++) x[i] /= size; break; }
      default: break;
      }
    }
    if (minmax_keys(a)) {
      int wide = st->wdtype == TPSH_I64;
      if (wide) keys_to_floats64(st->recv, n);
      else keys_to_floats32(st->recv, n);
      rc = convert(a->recv, a->dtype, st->recv, wide ? TPSH_F64 : TPSH_F32, n);
    } else if (st->recv != a->recv) {
      if (st->wdtype != a->dtype) rc = convert(a->recv, a->dtype, st->recv, st->wdtype, n);
      else memcpy(a->recv, st->recv, (size_t)n * tpsh_dtype_size(a->dtype));
    }
  }
  free(st->tmp);
  st->tmp = NULL;
  return rc;
}

/* ==== receives ================================================================================== */
/* A receive is matched with MPI_Improbe and received with MPI_Imrecv into a buffer of its message's
 * size, so MPI never truncates: Open MPI 4.1.4's shared-memory path (ob1 with vader) never completed
 * an MPI_Irecv smaller than a message that had already arrived, unless it was the first message from
 * that peer (the rank hung until the watchdog ended it; a plain C loop of MPI_Irecv and MPI_Waitall
 * shows it, over tcp it fails as it should), and MPICH and Open MPI report truncation each in its
 * own way. The matched probe also gives the message's size and dtype (its tag) before any byte
 * moves. Receives from one peer match in the order their turns came, as posted MPI_Irecvs did: each
 * takes a ticket under the turn (start), and only the receive whose ticket is its peer's next probes.
 * The probing happens outside the turn, after a batch's blocking collectives, so a receive still
 * never holds up the group's later collectives. */

/* Receives the message m (status ps) that recv a matched: into its buffer when it fits, else into a
 * temporary of the message's size (check_status copies its first bytes), as the sender's elements. */
static int recv_matched(const tpsh_coll_args *a, coll_state *st, MPI_Message *m, MPI_Status *ps,
                        MPI_Request *req) {
  st->sent_dtype = ps->MPI_TAG - P2P_TAG;
  MPI_Get_elements_x(ps, MPI_BYTE, &st->got);
  size_t want = (size_t)a->count * tpsh_dtype_size(a->dtype);
  int known = st->sent_dtype >= 0 && st->sent_dtype < TPSH_NDTYPES;
  MPI_Count esize = known ? tpsh_dtype_size(st->sent_dtype) : 1;
  if (st->got % esize != 0) esize = 1;
  MPI_Count count = st->got / esize;
  MPI_Datatype t = esize == 1 ? MPI_BYTE : mpi_type(st->sent_dtype);
  if (count > INT_MAX)
    return tpsh_error(TPSH_ECOMM, "%s: the message from rank %d (%lld bytes) has more elements than MPI can receive "
                      "at once", a->name, a->peer, (long long)st->got);
  void *buf = a->recv;
  if ((size_t)st->got > want) {
    buf = st->tmp = malloc((size_t)st->got);
    if (!buf)
      return tpsh_error(TPSH_ENOMEM, "%s: out of host memory for the %lld bytes of a message larger than the receive "
                        "buffer (%zu bytes)", a->name, (long long)st->got, want);
  }
  int e = MPI_Imrecv(buf, (int)count, t, m, req);
  return e == MPI_SUCCESS ? TPSH_OK : mpi_fail(e, "recv");
}

/* After the sends and a batch's blocking collectives: each receive probes, in its ticket's turn, until
 * its message has come, and starts its MPI_Imrecv into req[k] (which[k]: its place in op). A failed
 * probe or start passes the ticket on all the same, so that a later receive from that peer never waits
 * for it. Polled back to back, as MPI_Waitall waits; after the first millisecond a round that matched
 * nothing yields the core (a rank that shares its core with another then leaves it to that one).
 * Yielding from the first round cost a microsecond a message: send_recv at 64 KiB on 2 cores fell
 * from 0.89 to 0.78 of the C loop. */
static int match_recvs(const coll_op *op, coll_state *st, MPI_Request *req, const int *which, int nreq) {
  cpu_group *cg = op->cg;
  int left = 0, rc = TPSH_OK;
  for (int k = 0; k < nreq; k++) left += op->c[which[k]].kind == TPSH_C_RECV;
  double t0 = left > 0 ? tpsh_now_ms() : 0;
  while (left > 0) {
    int progressed = 0;
    for (int k = 0; k < nreq; k++) {
      const tpsh_coll_args *a = &op->c[which[k]];
      coll_state *s = &st[which[k]];
      if (a->kind != TPSH_C_RECV || s->matched) continue;
      if (__atomic_load_n(&cg->recv_turn[a->peer], __ATOMIC_ACQUIRE) != s->ticket) continue;
      int flag = 0, r = TPSH_OK;
      MPI_Message m;
      MPI_Status ps;
      int e = MPI_Improbe(a->peer, MPI_ANY_TAG, cg->comm, &flag, &m, &ps);
      if (e == MPI_SUCCESS && !flag) continue;
      if (e == MPI_SUCCESS) r = recv_matched(a, s, &m, &ps, &req[k]);
      else r = mpi_fail(e, "recv");
      s->matched = 1;
      __atomic_store_n(&cg->recv_turn[a->peer], s->ticket + 1, __ATOMIC_RELEASE);
      left--;
      progressed = 1;
      if (r != TPSH_OK && rc == TPSH_OK) rc = r;
    }
    if (!progressed && tpsh_now_ms() - t0 >= 1.0) sched_yield();
  }
  return rc;
}

/* After the wait: whether a receive got a message of its buffer's size and dtype (its sender's tag);
 * a larger one leaves its first bytes in the buffer. Either way the two ranks disagree on the dtype
 * or the number of elements, which only the receiving rank can see. Another request's failure is
 * MPI's own message. */
static int check_status(const tpsh_coll_args *a, coll_state *s, int i, int n, const MPI_Status *st) {
  int err = st->MPI_ERROR;
  if (err == MPI_ERR_PENDING) return TPSH_OK;          /* not completed: another request failed */
  char where[64] = "";
  if (n > 1) snprintf(where, sizeof where, "%s (collective %d of the batch): ", a->name, i + 1);
  if (err != MPI_SUCCESS) {
    int rc = mpi_fail(err, a->name);
    return n > 1 ? tpsh_error(rc, "%s%s", where, tpsh_last_error()) : rc;
  }
  if (a->kind != TPSH_C_RECV) return TPSH_OK;
  size_t want = (size_t)a->count * tpsh_dtype_size(a->dtype), got = (size_t)s->got;
  if (got == want && s->sent_dtype == a->dtype) return TPSH_OK;
  if (got > want) memcpy(a->recv, s->tmp, want);
  if (s->sent_dtype != a->dtype) {
    char what[96];
    if (s->sent_dtype >= 0 && s->sent_dtype < TPSH_NDTYPES)
      snprintf(what, sizeof what, "%zu bytes: %zu x %s", got, got / (size_t)tpsh_dtype_size(s->sent_dtype),
               tpsh_dtype_name(s->sent_dtype));
    else
      snprintf(what, sizeof what, "%zu bytes of an unknown dtype", got);
    return tpsh_error(TPSH_ECOMM, "%sthe message from rank %d (%s) is not what this recv expects (%zu bytes: %lld x %s): "
                      "the send and the recv must agree on the dtype and the number of elements; the receive buffer "
                      "now holds the message's bytes, not values", where, a->peer, what, want, (long long)a->count,
                      tpsh_dtype_name(a->dtype));
  }
  return tpsh_error(TPSH_ECOMM, "%sthe message from rank %d (%zu bytes) is %s than the receive buffer (%zu bytes: %lld x %s): "
                    "the send and the recv must agree on the dtype and the number of elements", where, a->peer, got,
                    got < want ? "smaller" : "larger", want, (long long)a->count, tpsh_dtype_name(a->dtype));
}

/* ==== the op run by the worker =================================================================== */
/* Waits under mu until *word reaches at least want (cpu_group says why no wake-up is lost). */
static void wait_for(cpu_group *cg, const uint64_t *word, uint64_t want) {
  if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= want) return;
  pthread_mutex_lock(&cg->mu);
  __atomic_add_fetch(&cg->waiters, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(word, __ATOMIC_SEQ_CST) < want) pthread_cond_wait(&cg->cv, &cg->mu);
  __atomic_sub_fetch(&cg->waiters, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&cg->mu);
}

/* After a store to a word that wait_for may be waiting on. */
static void wake_waiters(cpu_group *cg) {
  if (__atomic_load_n(&cg->waiters, __ATOMIC_SEQ_CST) == 0) return;
  pthread_mutex_lock(&cg->mu);
  pthread_cond_broadcast(&cg->cv);
  pthread_mutex_unlock(&cg->mu);
}

/* Turns come in order (a collective's seq is next_start's value, never below it): waiting for
 * next_start >= seq is waiting for equality. */
static void take_turn(cpu_group *cg, uint64_t seq) { wait_for(cg, &cg->next_start, seq); }

static void pass_turn(cpu_group *cg, uint64_t next) {
  __atomic_store_n(&cg->next_start, next, __ATOMIC_SEQ_CST);
  wake_waiters(cg);
}

/* By default a collective calls MPI's blocking version while it holds the turn (so the group's
 * collectives on this rank run one at a time, as kernels of one NCCL communicator do): MPICH's blocking
 * algorithms beat its nonblocking schedules for some collectives (reduce_scatter at 1 MiB: 0.75x of
 * the C loop with MPI_I*, 0.97x blocking; docs/perf.md). TPSH_CPU_COLL_BLOCKING=0 selects MPI_I* and a
 * wait outside the turn instead. A collective is blocking in a batch too: MPI never matches a blocking
 * collective with a nonblocking one, and one rank may batch what another issues one by one (a batch of
 * two all_reduces on rank 0 against two single ones on rank 1 would hang until the timeout).
 * Sends and receives are always nonblocking: the sends start and the receives take their tickets
 * before a batch's collectives, the receives are matched after them, and all are waited for together
 * (a ring of them must start all before waiting for any). */
static int blocking_collectives(void) {
  static int mode = -1;
  if (mode < 0) { const char *e = getenv("TPSH_CPU_COLL_BLOCKING"); mode = !(e && *e == '0'); }
  return mode;
}

/* A failed op counts in its group's failures (tpsh_group_note_failure) when it held a collective that
 * every member issues (a coll_index, as the core numbers them); a failed send or receive concerns two
 * ranks only, and no digest covers it. */
static void note_failure(const coll_op *op) {
  for (int i = 0; i < op->n; i++)
    if (op->c[i].coll_index >= 0) { tpsh_group_note_failure(op->cg->g); return; }
}

static int run_colls(void *arg) {
  coll_op *op = arg;
  cpu_group *cg = op->cg;
  int n = op->n, rc = TPSH_OK;
  coll_state stack_st[4];
  MPI_Request stack_req[4];
  MPI_Status stack_status[4];
  int stack_which[4];
  coll_state *st = n <= 4 ? stack_st : malloc((size_t)n * sizeof *st);
  MPI_Request *req = n <= 4 ? stack_req : malloc((size_t)n * sizeof *req);
  MPI_Status *status = n <= 4 ? stack_status : malloc((size_t)n * sizeof *status);
  int *which = n <= 4 ? stack_which : malloc((size_t)n * sizeof *which);   /* a request's call */
  if (!st || !req || !status || !which) rc = tpsh_error(TPSH_ENOMEM, "out of host memory");
  int prepared = 0;
  for (; rc == TPSH_OK && prepared < n; prepared++) rc = prepare(&op->c[prepared], cg, &st[prepared]);
  /* The turn is taken and passed on even after a failure, or the group's later collectives would
   * wait forever; the other ranks then see this rank's collective missing (the --timeout watchdog). */
  take_turn(cg, op->c[0].seq);
  op->started = 1;
  tpsh_flight_mark(op->c, n, TPSH_FLIGHT_STARTED);       /* the watchdog times it from here */
  int blocking = blocking_collectives();
  if (n == 1 && blocking && !tpsh_coll_is_p2p(op->c[0].kind)) {      /* the common case, on its own */
    if (rc == TPSH_OK) rc = run_blocking(&op->c[0], cg, &st[0]);
    pass_turn(cg, op->c[0].seq + 1);
    tpsh_flight_mark(op->c, n, TPSH_FLIGHT_COMPLETED);
    if (rc == TPSH_OK) rc = finish(&op->c[0], cg, &st[0]);
    else free(st[0].tmp);
    if (rc) note_failure(op);
    return rc;
  }
  /* the nonblocking calls first (sends and receives; every call with TPSH_CPU_COLL_BLOCKING=0), then
   * the blocking collectives in the batch's order, under the turn; then the wait for the requests */
  int nstarted = 0;
  for (int i = 0; rc == TPSH_OK && i < n; i++) {
    if (blocking && !tpsh_coll_is_p2p(op->c[i].kind)) continue;
    rc = start(&op->c[i], cg, &st[i], &req[nstarted]);
    if (rc == TPSH_OK) which[nstarted++] = i;
  }
  for (int i = 0; blocking && rc == TPSH_OK && i < n; i++)
    if (!tpsh_coll_is_p2p(op->c[i].kind)) rc = run_blocking(&op->c[i], cg, &st[i]);
  pass_turn(cg, op->c[n - 1].seq + 1);
  if (nstarted > 0) {
    int r = match_recvs(op, st, req, which, nstarted);      /* even after a failure: the tickets */
    if (rc == TPSH_OK) rc = r;
    int e = MPI_Waitall(nstarted, req, status);
    if (e != MPI_SUCCESS && e != MPI_ERR_IN_STATUS && rc == TPSH_OK) rc = mpi_fail(e, "MPI_Waitall");
    /* On success MPI leaves the statuses' MPI_ERROR fields as they were: set here for check_status. */
    for (int k = 0; k < nstarted && rc == TPSH_OK; k++) {
      if (e == MPI_SUCCESS) status[k].MPI_ERROR = MPI_SUCCESS;
      rc = check_status(&op->c[which[k]], &st[which[k]], which[k], n, &status[k]);
    }
  }
  tpsh_flight_mark(op->c, n, TPSH_FLIGHT_COMPLETED);
  for (int i = 0; i < prepared; i++) {
    int r = rc == TPSH_OK ? finish(&op->c[i], cg, &st[i]) : (free(st[i].tmp), TPSH_OK);
    if (r != TPSH_OK && rc == TPSH_OK) rc = r;
  }
  if (st && st != stack_st) free(st);
  if (req && req != stack_req) free(req);
  if (status && status != stack_status) free(status);
  if (which && which != stack_which) free(which);
  if (rc) note_failure(op);
  return rc;
}

/* An op of one collective (most are) goes back to its group when run, for the host to fill again: a malloc
 * on the host and a free on the worker took glibc's arena lock from both threads at every collective once
 * the worker kept pace. Workers push onto a lock-free stack; the host takes the whole stack at once (one
 * consumer taking everything: no ABA). Pushed before the op counts as finished, after which the group may
 * be destroyed. */
static void recycle(cpu_group *cg, coll_op *op) {
  coll_op *head = __atomic_load_n(&cg->recycled, __ATOMIC_RELAXED);
  do op->next = head;
  while (!__atomic_compare_exchange_n(&cg->recycled, &head, op, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
}

static coll_op *take_spare(cpu_group *cg) {
  if (!cg->spare) cg->spare = __atomic_exchange_n(&cg->recycled, NULL, __ATOMIC_ACQUIRE);
  coll_op *op = cg->spare;
  if (op) cg->spare = op->next;
  return op;
}

static void free_list(coll_op *op) {
  while (op) {
    coll_op *next = op->next;
    free(op);
    op = next;
  }
}

static void free_colls(void *arg) {
  coll_op *op = arg;
  cpu_group *cg = op->cg;
  if (!op->started) {            /* never ran (the enqueue failed): pass its turn on all the same */
    take_turn(cg, op->c[0].seq);
    pass_turn(cg, op->c[op->n - 1].seq + 1);
  }
  if (op->n == 1) recycle(cg, op); else free(op);
  __atomic_add_fetch(&cg->finished, 1, __ATOMIC_SEQ_CST);
  wake_waiters(cg);
}

/* ==== backend entry points ======================================================================= */
int tpsh_cpu_collectives(tpsh_stream *s, tpsh_group *g, int n, const tpsh_coll_args *c) {
  cpu_group *cg = g->backend_comm;
  if (n < 1) return TPSH_OK;               /* counts fit MPI's int: the core checks max_coll_count */
  coll_op *op = n == 1 ? take_spare(cg) : NULL;
  if (!op && !(op = malloc(sizeof *op + (size_t)n * sizeof *c))) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  op->cg = cg;
  op->started = 0;
  op->n = n;
  memcpy(op->c, c, (size_t)n * sizeof *c);
  __atomic_add_fetch(&cg->issued, 1, __ATOMIC_RELAXED);    /* read by this thread only (group_destroy) */
  return tpsh_cpu_enqueue_fn(s, n == 1 ? c[0].name : "batch", run_colls, op, free_colls);
}

int tpsh_cpu_group_init(tpsh_group *g) {
  cpu_group *cg = aligned_alloc(64, (sizeof *cg + 63) / 64 * 64);     /* its lines apart (cpu_group) */
  if (!cg) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  memset(cg, 0, sizeof *cg);
  pthread_mutex_init(&cg->mu, NULL);
  pthread_cond_init(&cg->cv, NULL);
  cg->next_start = g->seq;
  cg->comm = g->dev_comm;
  cg->rank = g->rank;
  cg->size = g->size;
  cg->g = g;
  cg->recv_ticket = calloc(2 * (size_t)g->size, sizeof *cg->recv_ticket);
  if (!cg->recv_ticket) { free(cg); return tpsh_error(TPSH_ENOMEM, "out of host memory"); }
  cg->recv_turn = cg->recv_ticket + g->size;
  MPI_Comm_set_errhandler(cg->comm, MPI_ERRORS_RETURN);
  g->backend_comm = cg;
  return TPSH_OK;
}

/* Once, at the backend's start. MPI_Waitall takes requests, not a communicator: MPICH raises its errors
 * on MPI_COMM_WORLD's handler (MPI 4 names MPI_COMM_SELF's), whose default ends the process, so a
 * receive that truncated its message ended the rank with MPI's "Fatal error in internal_Waitall"
 * instead of the stream error that run_colls makes of it. (tpsh's own calls on MPI_COMM_WORLD, the
 * script's broadcast and the barrier before finalize, could fail only with a process gone, and the
 * launcher ends the job then.) */
void tpsh_cpu_coll_init(void) {
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  (void)blocking_collectives();          /* read the mode here, before any worker can race to set it */
}

/* Interop: the communicator the stream workers run g's collectives on. */
void *tpsh_cpu_group_handle(tpsh_group *g) { return &g->dev_comm; }

void tpsh_cpu_group_destroy(tpsh_group *g) {
  cpu_group *cg = g->backend_comm;
  if (!cg) return;
  /* Queued collectives use cg and dev_comm: wait until the workers are done with them. */
  wait_for(cg, &cg->finished, __atomic_load_n(&cg->issued, __ATOMIC_RELAXED));
  free_list(cg->spare);
  free_list(cg->recycled);
  pthread_mutex_destroy(&cg->mu);
  pthread_cond_destroy(&cg->cv);
  free(cg->recv_ticket);
  free(cg);
  g->backend_comm = NULL;
}
