/*
 * watchdog.h: what the watchdog's files share (others call its hooks through core/check.h); watchdog.c
 * says which file does what. Everything here runs on the watchdog thread unless it says otherwise.
 */
#ifndef TPSH_WATCHDOG_H
#define TPSH_WATCHDOG_H

#include "core/internal.h"
#include "core/flight.h"
#include "core/check.h"
#include <mpi.h>
#include <stdint.h>

/* Tags of the watchdog's communicator (tpsh_wd_comm), one place for all of them: a question and its
 * answer (watchdog_ask.c), the notice that a rank ends the run and the answers to it (watchdog_abort.c). */
enum { TAG_REQ = 0x7d01, TAG_REP = 0x7d02, TAG_END = 0x7d03, TAG_END_DONE = 0x7d04 };
enum {
  ASK_MS = 2000,          /* how long an asking rank waits for the answers */
  STATUS_COLLS = 64,      /* the last collectives a rank's status and its end's head carry */
  STATUS_GROUPS = 16,     /* the groups a status lists (status_groups says which) */
  STATUS_BEHIND = 16,     /* the collectives queued behind the one a status's host waits for */
  FAILURE_TEXT = 2048,    /* a failed test's message, as a status quotes it */
  STEP_TEXT = 512         /* the running step in words (tpsh_watch_step) */
};

/* ==== the thread (watchdog.c) =================================================================== */
/* The questions' communicator and the end of a script's (dups of the world made at start: no script
 * call can pair with their messages or barriers), and whether this rank waits at the end of a script now
 * (the host thread writes it, watchdog_end.c; the watchdog thread reads it: check_end_silence). */
extern MPI_Comm tpsh_wd_comm, tpsh_wd_end_comm;
extern volatile int tpsh_wd_at_script_end;
/* The thread's copy of the flight record and its group table (tpsh_flight_snapshot), which the rules
 * read; answering a question refills it. */
extern tpsh_flight_entry tpsh_wd_snap[TPSH_FLIGHT_RING];
extern tpsh_flight_group tpsh_wd_snap_groups[TPSH_FLIGHT_GROUPS];
int tpsh_wd_stopping(void);            /* tpsh_watchdog_stop has begun: any thread */

/* ==== the host's waits (watchdog_waits.c): the host thread marks them, the watchdog reads ======= */
int tpsh_wd_host_waiting(void);        /* the host is in a timed wait */
uint64_t tpsh_wd_wait_serial(void);    /* counts outermost waits: tells one wait from the next */
const char *tpsh_wd_wait_what(void);   /* the outermost wait's name (NULL: none given) */
double tpsh_wd_wait_since(void);       /* and its start (tpsh_now_ms) */
/* what it waits for: a stream key (tpsh_stream_key), TPSH_WAIT_ALL_STREAMS, or NULL */
const void *tpsh_wd_wait_on(void);
int tpsh_wd_wait_peer(void);           /* the world rank it waits for now (tpsh_watch_wait_peer), or -1 */
int tpsh_wd_in_exchange(void);         /* the wait is `tpsh test`'s own exchange (never a peer's victim) */
uint64_t tpsh_wd_test(void);           /* `tpsh test`: the test running (0: none; TPSH_WATCH_SCRIPT) */
/* This rank's failure of test `test` into buf (len bytes at most): whether it failed that test. */
int tpsh_wd_failure_of(uint64_t test, char *buf, size_t len);
/* The running step in words (tpsh_watch_step) into buf, `otherwise` where none was named. */
void tpsh_wd_step(char *buf, size_t len, const char *otherwise);
/* The host-side exchange the host is blocked in now (its number on the group, *group its id), and the
 * collective check mode's comparison holds it in (*op its name); -1 where the host is in none. */
int64_t tpsh_wd_exchange_now(uint64_t *group);
int64_t tpsh_wd_match_now(uint64_t *group, const char **op);
/* The host inside the backend's collective call (tpsh_watch_call_count odd): the tick notes the count it
 * sees and since when (returned; 0: the host is not inside one); the call's name as a wait's. */
double tpsh_wd_call_tick(double now);
uint64_t tpsh_wd_call_seen(void);
double tpsh_wd_call_since(void);
extern const char *const tpsh_wd_call_what;

/* ==== this rank's state (watchdog_status.c) ===================================================== */
/* A rank's last collectives (sends and receives aside), oldest first, as every member of their group
 * must have passed them alike (tpsh_coll_desc: check mode's description). */
typedef struct coll_list {
  int32_t n;
  struct { uint64_t group; tpsh_coll_desc d; } c[STATUS_COLLS];
} coll_list;

/* A rank's answer to a question: sent as bytes between ranks of one build. */
typedef struct wd_status {
  int32_t rank, ngroups, groups_known;   /* groups_known: all of the rank's flight groups are in g[] */
  struct { uint64_t id; int64_t enqueued, started, completed, collectives, host_exchanges; int32_t shared; } g[STATUS_GROUPS];
  char doing[256];
  /* the collective this rank is stuck in, if any (started, not completed) */
  int32_t in_coll;
  uint64_t coll_group, coll_seq;
  char coll_op[32];
  /* `tpsh test`: the test running, whether this rank waits at the runner's exchange (it issues no more
   * collectives in this test), and whether it failed the test */
  uint64_t test;
  int32_t at_exchange, failed;
  /* the host-side exchange its host is blocked in (tp.barrier, tp.allgather, ...): group and number on
   * it, counted from 0; host_index -1: none */
  uint64_t host_group;
  int64_t host_index;
  char host_what[128];      /* which exchange (its wait's name: "tp.barrier", "tp.allgather (...)") */
  /* check mode: the collective whose comparison its host waits in (not yet enqueued): group, number among
   * the group's collectives (match_index -1: none) */
  uint64_t match_group;
  int64_t match_index;
  /* that group's members as world ranks (match_size 0: unknown), for an asker that has never made a
   * collective there: is it a member that has not issued it (match_match_cycle)? */
  int32_t match_size;
  int32_t match_members[TPSH_FLIGHT_MAX_MEMBERS];
  /* a collective its host's wait cannot end before (the oldest not known complete on the stream that a
   * read or synchronize waits for, or on any stream for tp.synchronize): group, number among the group's
   * collectives (dep_index -1: none, or a wait outside a stream), name, and the group's members as world
   * ranks, so that an asker that has not issued it, and never made a collective on that group, knows
   * whether it is one (wait_cross) */
  uint64_t dep_group;
  int64_t dep_index;
  char dep_op[32];
  int32_t dep_kind, dep_root;       /* its tpsh_coll_kind and root (a rank of the group; broadcast, reduce) */
  int32_t dep_size;
  int32_t dep_members[TPSH_FLIGHT_MAX_MEMBERS];
  /* the collectives issued after dep on dep's stream, not complete (at most STATUS_BEHIND, oldest first):
   * a stream runs in order, so none starts before dep has completed, and a rank waiting for one of them
   * waits for dep too (wait_cross: a rank skipped a sub-group's collective before a world one) */
  int32_t nbehind;
  struct { uint64_t group; int64_t index; } behind[STATUS_BEHIND];
  char failure[FAILURE_TEXT];
  coll_list colls;      /* compared with the asking rank's own flight entries (tpsh_wd_mismatch_with) */
  /* the sends it has enqueued to the asking rank, and the receives from it (p2p_ledger.c), so that an
   * asker blocked behind a send or recv with a rank that has finished knows whether its match will come */
  uint64_t p2p_sent, p2p_received;
} wd_status;

/* This rank's state (refills tpsh_wd_snap). */
void tpsh_wd_fill_status(wd_status *st);
/* The entry of group id among groups[0..ng) (the last, should a shared slot repeat it), NULL if none. */
const tpsh_flight_group *tpsh_wd_group_of(const tpsh_flight_group *groups, int ng, uint64_t id);
/* Whether world rank r is one of grp's members (as far as the table holds them). */
int tpsh_wd_has_member(const tpsh_flight_group *grp, int r);
/* The entry of group id when it is usable (not a shared slot) and names world rank r; NULL otherwise. */
const tpsh_flight_group *tpsh_wd_entry_with(const tpsh_flight_group *groups, int ng, uint64_t id, int r);
/* The last STATUS_COLLS collectives of the n flight entries e (oldest first) into l. */
void tpsh_wd_recent_collectives(const tpsh_flight_entry *e, int n, coll_list *l);
/* The first of this rank's n flight entries e that rank `rank` issued differently (theirs: its last
 * collectives; *what: how); NULL when all agree (watchdog_status.c says more). */
const tpsh_flight_entry *tpsh_wd_mismatch_with(const coll_list *theirs, int rank, const tpsh_flight_entry *e, int n,
                                               const tpsh_flight_group *groups, int ng, int completed,
                                               const tpsh_coll_desc **what);
/* "collective #3 of group 0 (...) is X on this rank and Y on rank r" */
void tpsh_wd_mismatch_text(char *buf, size_t len, const tpsh_flight_entry *e, const tpsh_coll_desc *theirs, int rank);

/* ==== questions between the ranks (watchdog_ask.c) ============================================== */
int tpsh_wd_ask_init(void);            /* at start: 0, or -1 out of memory */
/* At stop, after the thread: with MPI alive, receives what is still on its way; frees the counts. */
void tpsh_wd_ask_stop(int mpi_alive);
void tpsh_wd_serve(void);              /* answers the questions that have come */
/* Asks every other rank for its state (rep[r]); got[r] says whether rank r answered within ASK_MS. */
void tpsh_wd_ask_others(wd_status *rep, int *got, int size);
/* Ends receive *q, posted and maybe never matched; returns whether a message came (*s: from whom). */
int tpsh_wd_end_receive(MPI_Request *q, MPI_Status *s);

/* ==== ending every rank (watchdog_abort.c) ====================================================== */
/* Text said in parts (tpsh_wd_flush): it keeps the whole, which a rank's own --trace records quote. */
typedef struct outbuf { char *p; size_t n, cap, said; } outbuf;
void tpsh_wd_out(outbuf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));   /* a line */
void tpsh_wd_flush(outbuf *o);         /* says what is new to stderr */
/* Says o and its last line, then ends every rank with status (MPI_Abort). */
void tpsh_wd_end_every_rank(outbuf *o, const char *last, int status) __attribute__((noreturn));
void tpsh_wd_serve_end_notice(void);   /* the tick: another rank's notice that it ends the run */
void tpsh_wd_end_notice_cancel(void);  /* at stop: the notice's posted receive */

/* ==== the timeout (watchdog_timeout.c) ========================================================== */
/* stuck: the collective past the timeout; else the host has been blocked in host_what for host_s
 * seconds. nsnap: the entries of tpsh_wd_snap. Ends every rank with status 124. */
void tpsh_wd_fire_timeout(const tpsh_flight_entry *stuck, const char *host_what, double host_s, int nsnap)
  __attribute__((noreturn));

/* ==== a blocked host's questions (watchdog_peers.c) ============================================= */
void tpsh_wd_check_peers(double now);         /* each tick */
void tpsh_wd_check_end_silence(double now);   /* each tick at the end of a script */

/* ==== deadlocks between two ranks (watchdog_deadlock.c) ========================================= */
/* This rank's side, as tpsh_wd_check_peers took it after asking: what its host's wait waits on
 * (tpsh_wd_wait_on), tpsh_wd_snap's n entries and ng groups, the host-side exchange and the comparison
 * its host is in (index -1: none), the wait's name and how long it has lasted. */
typedef struct wd_self {
  const void *on;
  int n, ng;
  uint64_t host_group, match_group;
  int64_t host_index, match_index;
  const char *match_op, *what;
  double blocked_s;
} wd_self;
/* Ends every rank with status 1 where this rank's wait and rank st->rank's hold each other up. */
void tpsh_wd_find_deadlock(const wd_status *st, const wd_self *me);
/* Whether rank st->rank, which issues nothing more in the running test, will never join this rank's
 * collective (host: host-side exchange) number `index` of group_id; *issued: its count there. */
int tpsh_wd_never_joins(uint64_t group_id, int64_t index, int host, const wd_status *st, int ng, int64_t *issued);

#endif /* TPSH_WATCHDOG_H */
