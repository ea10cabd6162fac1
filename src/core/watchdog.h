/*
 * watchdog.h: what the watchdog's files share (others call its hooks through core/check.h):
 * watchdog.c (the thread, the status exchange between ranks, the deadlock diagnosis) and watchdog_end.c
 * (the end of a script: the ranks' wait for each other, then the comparison of their collectives).
 */
#ifndef TPSH_WATCHDOG_H
#define TPSH_WATCHDOG_H

#include "core/check.h"
#include "core/flight.h"
#include <mpi.h>
#include <stdint.h>

enum { STATUS_COLLS = 64 };    /* the last collectives a rank's status and its end's head carry */

/* A rank's last collectives (sends and receives aside), oldest first, as every member of their group
 * must have passed them alike (tpsh_coll_desc: check mode's description). */
typedef struct coll_list {
  int32_t n;
  struct { uint64_t group; tpsh_coll_desc d; } c[STATUS_COLLS];
} coll_list;

/* The end of a script's communicator (a dup of the world made at start: no script call can pair with
 * its barrier), and whether this rank waits there now (the watchdog thread reads it: check_end_silence). */
extern MPI_Comm tpsh_wd_end_comm;
extern volatile int tpsh_wd_at_script_end;

/* The last STATUS_COLLS collectives of the n flight entries e (oldest first) into l. */
void tpsh_wd_recent_collectives(const tpsh_flight_entry *e, int n, coll_list *l);
/* The first of this rank's n flight entries e that rank `rank` issued differently (theirs: its last
 * collectives; *what: how); NULL when all agree (watchdog.c says more). */
const tpsh_flight_entry *tpsh_wd_mismatch_with(const coll_list *theirs, int rank, const tpsh_flight_entry *e, int n,
                                               const tpsh_flight_group *groups, int ng, int completed,
                                               const tpsh_coll_desc **what);
/* "collective #3 of group 0 (...) is X on this rank and Y on rank r" */
void tpsh_wd_mismatch_text(char *buf, size_t len, const tpsh_flight_entry *e, const tpsh_coll_desc *theirs, int rank);

#endif /* TPSH_WATCHDOG_H */
