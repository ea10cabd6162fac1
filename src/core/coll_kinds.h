/*
 * coll_kinds.h: the facts of each collective kind, one row a kind (an X-macro table, as LuaJIT's IRDEF).
 *
 * Every file that needs to know what a kind counts, reads, writes, reduces, whom it names as its peer
 * or whom its members wait for reads tpsh_coll_kind_of instead of a switch of its own: the overlap check
 * and the sanitizer (collective.c), the mismatch check (coll_match.c), the CPU backend's buffers, the
 * trace's byte count and text, the watchdog's deadlock rules, the backends' call names. The calls
 * themselves stay in the backends (their arguments differ from kind to kind).
 *
 * The enum is tpsh.h's (a header without macros, fed to ffi.cdef); rows are placed by it, and a kind
 * without a row fails to compile (TPSH_COLL_ROWS below).
 */
#ifndef TPSH_COLL_KINDS_H
#define TPSH_COLL_KINDS_H
#include "tpsh.h"

/* send, recv: the element count of the buffer, in pieces of tpsh_coll_args.count (1, or N: one per
 * member of the group), and which ranks touch it (reads the send buffer, writes the receive buffer).
 * op: whether it reduces (tpsh_coll_args.op is meaningful, and compared by the mismatch check).
 * peer: what tpsh_coll_args.peer is.
 * waits: whose arrival a member's side cannot complete without (the watchdog's "cannot end"). A
 * broadcast's root and a reduce's other members only send, and MPI (a small message, eagerly) or NCCL
 * may complete that before the receivers come. A send or a receive waits for its peer only, judged by
 * the watchdog's point-to-point rules, not by this column. */
#define TPSH_COLLDEF(_) \
  /* kind          name              send     recv        op peer  waits         NCCL, MPI (non-blocking) */ \
  _(ALL_GATHER,     "all_gather",     1, ALL,  N, ALL,     0, NONE, EVERY_MEMBER, "ncclAllGather", "MPI_Iallgather") \
  _(ALL_REDUCE,     "all_reduce",     1, ALL,  1, ALL,     1, NONE, EVERY_MEMBER, "ncclAllReduce", "MPI_Iallreduce") \
  _(REDUCE_SCATTER, "reduce_scatter", N, ALL,  1, ALL,     1, NONE, EVERY_MEMBER, "ncclReduceScatter", \
                                                                                  "MPI_Ireduce_scatter_block") \
  _(BROADCAST,      "broadcast",      1, ROOT, 1, NONROOT, 0, ROOT, ROOT_ONLY,    "ncclBroadcast", "MPI_Ibcast") \
  _(REDUCE,         "reduce",         1, ALL,  1, ROOT,    1, ROOT, AT_ROOT,      "ncclReduce", "MPI_Ireduce") \
  _(ALL_TO_ALL,     "all_to_all",     N, ALL,  N, ALL,     0, NONE, EVERY_MEMBER, "ncclSend/ncclRecv (all_to_all)", \
                                                                                  "MPI_Ialltoall") \
  _(SEND,           "send",           1, ALL,  1, NONE,    0, TO,   PEER,         "ncclSend", "MPI_Isend") \
  _(RECV,           "recv",           1, NONE, 1, ALL,     0, FROM, PEER,         "ncclRecv", "MPI_Irecv")

/* a buffer of one piece, or of one piece per member of the group (N in the table) */
enum { TPSH_CK_PIECES_1 = 1, TPSH_CK_N = -1, TPSH_CK_PIECES_N = TPSH_CK_N };

/* which ranks touch a buffer */
typedef enum { TPSH_CK_NONE, TPSH_CK_ALL, TPSH_CK_ROOT, TPSH_CK_NONROOT } tpsh_ck_ranks;
/* what tpsh_coll_args.peer is: nothing, the root (a rank of the group), the receiver, the sender */
typedef enum { TPSH_CK_PEER_NONE, TPSH_CK_PEER_ROOT, TPSH_CK_PEER_TO, TPSH_CK_PEER_FROM } tpsh_ck_peer;
/* whom a member's side waits for: every other member; the root (members other than the root); every
 * other member, at the root only; its peer */
typedef enum {
  TPSH_CK_WAITS_EVERY_MEMBER, TPSH_CK_WAITS_ROOT_ONLY, TPSH_CK_WAITS_AT_ROOT, TPSH_CK_WAITS_PEER
} tpsh_ck_waits;

typedef struct tpsh_coll_kind_info {
  const char *name;                 /* "all_gather": traces, messages, the mismatch check */
  signed char send_pieces, recv_pieces;   /* 1 or TPSH_CK_N */
  unsigned char reads, writes;      /* tpsh_ck_ranks of the send and the receive buffer */
  unsigned char has_op;
  unsigned char peer;               /* tpsh_ck_peer */
  unsigned char waits;              /* tpsh_ck_waits */
  const char *nccl_call, *mpi_call; /* for the backends' error messages */
} tpsh_coll_kind_info;

#define TPSH_COLL_ROW_(kind, name, sp, rd, rp, wr, op, peer, waits, nccl, mpi) \
  [TPSH_C_##kind] = {name, TPSH_CK_PIECES_##sp, TPSH_CK_PIECES_##rp, TPSH_CK_##rd, TPSH_CK_##wr, op, TPSH_CK_PEER_##peer, TPSH_CK_WAITS_##waits, \
                     nccl, mpi},
static const tpsh_coll_kind_info tpsh_coll_kinds[TPSH_C_COUNT] = {TPSH_COLLDEF(TPSH_COLL_ROW_)};
#undef TPSH_COLL_ROW_

#define TPSH_COLL_ONE_(...) +1
enum { TPSH_COLL_ROWS = 0 TPSH_COLLDEF(TPSH_COLL_ONE_) };
#undef TPSH_COLL_ONE_
_Static_assert((int)TPSH_COLL_ROWS == (int)TPSH_C_COUNT, "coll_kinds.h: every tpsh_coll_kind needs its row");

/* The row of kind k; NULL for a number that is no kind (Lua may pass any integer). */
static inline const tpsh_coll_kind_info *tpsh_coll_kind_of(int k) {
  return k >= 0 && k < TPSH_C_COUNT ? &tpsh_coll_kinds[k] : NULL;
}
static inline const char *tpsh_coll_kind_name(int k) {
  return k >= 0 && k < TPSH_C_COUNT ? tpsh_coll_kinds[k].name : "?";
}

/* A send or a receive: it involves its peer only, not every member of the group. */
static inline int tpsh_coll_is_p2p(int k) {
  const tpsh_coll_kind_info *i = tpsh_coll_kind_of(k);
  return i && (i->peer == TPSH_CK_PEER_TO || i->peer == TPSH_CK_PEER_FROM);
}

/* Element counts of the send and receive buffers of `count` a piece in a group of `size`. */
static inline int64_t tpsh_coll_send_count(int k, int64_t count, int size) {
  return tpsh_coll_kinds[k].send_pieces == TPSH_CK_N ? count * size : count;
}
static inline int64_t tpsh_coll_recv_count(int k, int64_t count, int size) {
  return tpsh_coll_kinds[k].recv_pieces == TPSH_CK_N ? count * size : count;
}

/* Whether a rank (the root or not) touches a buffer whose ranks are r. */
static inline int tpsh_coll_touches(int r, int is_root) {
  return r == TPSH_CK_ALL || (r == TPSH_CK_ROOT && is_root) || (r == TPSH_CK_NONROOT && !is_root);
}
#endif
