/*
 * flight.h: the flight recorder's entries, as the watchdog reads them (flight.c writes them).
 */
#ifndef TPSH_FLIGHT_H
#define TPSH_FLIGHT_H

#include <stddef.h>
#include <stdint.h>

/* TPSH_FLIGHT_GROUPS: MPICH runs out of communicators at about a thousand groups (two each), so the table
 * holds every group a run can make: a group that shares a slot leaves the watchdog unable to tell whether
 * a rank will join its collectives (the deadlock rules then wait for the timeout). */
enum { TPSH_FLIGHT_RING = 512, TPSH_FLIGHT_GROUPS = 1024, TPSH_FLIGHT_MAX_MEMBERS = 256 };

typedef struct tpsh_flight_entry {
  uint64_t seq;              /* the group's sequence number */
  const void *key;           /* the group's backend_comm: how a backend names the group when it marks */
  uint64_t group_id;
  int group_slot;            /* the group's slot in the table (flight.c) */
  int group_size;
  const char *op;            /* "all_reduce", ... (static strings) */
  int kind, dtype, peer, state;
  int redop;                 /* the reduce op (a tpsh_reduce_op), which the watchdog compares across ranks */
  int64_t count;             /* elements of one rank's piece, as in NCCL */
  int64_t coll_index;        /* as tpsh_coll_args.coll_index (-1: a send or a receive) */
  char stream[32];
  const void *stream_key;    /* the stream it runs on: tpsh_stream_key, its id (compared only) */
  double t_enqueued, t_started, t_completed;   /* tpsh_now_ms; 0: not yet */
} tpsh_flight_entry;

/* Per group: the highest sequence number enqueued, started and completed (-1: none), and its members
 * as world ranks, which the watchdog exchanges and compares. */
typedef struct tpsh_flight_group {
  uint64_t id;
  int64_t enqueued, started, completed;
  int64_t collectives;       /* the group's count of collectives every member issues (g->collectives) */
  int64_t host_exchanges;    /* host-side exchanges begun on the group (g->host_exchanges) */
  int shared;                /* the table was full: this last slot has served several groups, so its
                              * numbers describe none of them reliably */
  double t_active;           /* the last enqueue or host-side exchange on it (coarse tpsh_now_ms): a
                              * status that lists only some groups lists the recent ones */
  int size;
  int members[TPSH_FLIGHT_MAX_MEMBERS];
} tpsh_flight_group;

/* The host-side exchange the host is in now: its group and number; 0 when it is in none. */
int tpsh_flight_host_current(uint64_t *group_id, int64_t *index);
/* The collective that check mode's mismatch check compares now (its group, number among the group's
 * collectives and name; 0 when the host is in no such check): it is not in the ring yet, since the check
 * runs before the collective is enqueued, so the watchdog asks this to see what that wait waits for. */
int tpsh_flight_match_current(uint64_t *group_id, int64_t *index, const char **op);

/* Copies the last min(max, 512) entries (oldest first) and the group table; returns the entry count. */
int tpsh_flight_snapshot(tpsh_flight_entry *out, int max, tpsh_flight_group *groups, int *ngroups);
int tpsh_flight_format(const tpsh_flight_entry *e, double now, char *buf, size_t len);
const char *tpsh_flight_state_name(int state);

#endif
