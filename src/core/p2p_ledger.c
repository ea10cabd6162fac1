/*
 * p2p_ledger.c: this rank's sends and receives, counted per peer, and compared with the peers' at the
 * end of a script.
 *
 * The core compares collectives (every member issues each one), but a send and its receive are issued
 * by two ranks alone, and no collective check sees them: a small send that no rank receives completes
 * on the CPU backend (MPI's eager protocol) and the script would end with status 0, its message lost;
 * a receive whose send never comes, or a large send, would wait at the end of the script until the
 * watchdog's timeout (600 s by default); on NCCL either one waits. Each rank counts what it enqueued,
 * per peer (world ranks) and per group (a digest of the groups' ids: a send on one group does not meet
 * a receive on another), and at the end of the script, before waiting for its streams, every rank
 * exchanges its counts with every other (one MPI_Alltoall a pair) and raises where a pair disagrees,
 * on both ranks of the pair.
 *
 * The counts carry the messages' signatures too (dtype and element count, by position): NCCL matches a
 * send and a receive by their byte size alone, so i32 sent and f32 received, or 2 x f64 sent and 4 x f32
 * received, would complete and reinterpret the bytes. The CPU backend compares each message as it
 * arrives (cpu_coll.c, the dtype in the tag); on NCCL a check per message would be a host message beside
 * each send, and the end of the script is where a mismatch is certain to be seen at no cost to the
 * schedule. The signature is positional (the k-th message of a pair on a group), in LANES by group so
 * that messages of two groups, which are matched apart, may interleave differently on the two ranks.
 */
#include "core/p2p_ledger.h"
#include "core/backend.h"
#include "core/group.h"
#include "core/random.h"
#include "core/coll_kinds.h"
#include "core/text.h"
#include <stdio.h>
#include <stdlib.h>

enum { LANES = 8 };
/* n messages, the sum of their groups' mixed ids, and per lane (a group's id mod LANES) the messages so
   far and the sum of their positional signatures */
typedef struct ledger_entry { uint64_t n, groups, lane_n[LANES], sig; } ledger_entry;
/* per peer: what this rank sent to it and received from it; then what it said (sent to this rank,
   received from this rank) */
typedef struct ledger_pair { ledger_entry sent, received; } ledger_pair;

static ledger_pair *mine;      /* tpsh_rt.size entries, by world rank; NULL until ledger() makes them */

/* The counts, made at the first send or receive, or at the comparison (every rank takes part in it). */
static int ledger(void) {
  if (!mine) __atomic_store_n(&mine, calloc((size_t)tpsh_rt.size, sizeof *mine), __ATOMIC_RELEASE);
  return mine ? TPSH_OK : tpsh_error(TPSH_ENOMEM, "out of host memory for the count of sends and receives");
}

void tpsh_p2p_ledger_counts(int peer, uint64_t *sent, uint64_t *received) {
  ledger_pair *m = __atomic_load_n(&mine, __ATOMIC_ACQUIRE);
  *sent = *received = 0;
  if (!m || peer < 0 || peer >= tpsh_rt.size) return;
  *sent = __atomic_load_n(&m[peer].sent.n, __ATOMIC_ACQUIRE);
  *received = __atomic_load_n(&m[peer].received.n, __ATOMIC_ACQUIRE);
}

int tpsh_p2p_ledger_note(const tpsh_group *g, const tpsh_coll_args *c, int n) {
  int rc = ledger();
  if (rc) return rc;
  for (int i = 0; i < n; i++) {
    if (!tpsh_coll_is_p2p(c[i].kind)) continue;
    ledger_pair *p = &mine[g->world_ranks[c[i].peer]];
    ledger_entry *e = c[i].kind == TPSH_C_SEND ? &p->sent : &p->received;
    __atomic_add_fetch(&e->n, 1, __ATOMIC_RELEASE);       /* (the watchdog's thread reads it: ledger_counts) */
    e->groups += tpsh_rand_mix(g->id, 0);   /* the id spread over 64 bits: sums of ids seldom agree by chance */
    uint64_t *pos = &e->lane_n[g->id % LANES];
    e->sig += tpsh_rand_mix(tpsh_rand_mix(g->id, (*pos)++), ((uint64_t)(uint32_t)c[i].dtype << 48) ^ (uint64_t)c[i].count);
  }
  return TPSH_OK;
}

static void say(char *buf, size_t len, int sender, int receiver, const ledger_entry *sent, const ledger_entry *got) {
  char s[32], r[32];
  snprintf(s, sizeof s, sender == tpsh_rt.rank ? "this rank" : "rank %d", sender);
  snprintf(r, sizeof r, receiver == tpsh_rt.rank ? "this rank" : "rank %d", receiver);
  if (sent->n != got->n)
    snprintf(buf, len, "%s sent %llu message(s) to %s, which received %llu from it (%s)", s,
             (unsigned long long)sent->n, r, (unsigned long long)got->n,
             sent->n > got->n ? "a send that no rank receives is lost on the CPU backend and waits forever on NCCL"
                              : "a receive whose send never comes waits forever");
  else if (sent->groups != got->groups)
    snprintf(buf, len, "%s sent %llu message(s) to %s, which received as many from it, but not on the same "
             "groups (a send meets only a receive on its own group)", s, (unsigned long long)sent->n, r);
  else
    snprintf(buf, len, "%s sent %llu message(s) to %s, which received as many from it, but not of the same "
             "dtypes and element counts (a send and its recv must agree on both: NCCL matches the bytes alone, "
             "and a receive of another dtype reinterprets them)", s, (unsigned long long)sent->n, r);
}

/* The signatures count only where the backend does not compare each message: there a mismatched pair
 * has raised already, and the script may have gone on past it (a spec that catches the error). */
static int entries_agree(const ledger_entry *sent, const ledger_entry *got) {
  return sent->n == got->n && sent->groups == got->groups && (tpsh_rt.be->checks_p2p_dtype || sent->sig == got->sig);
}

int tpsh_p2p_ledger_compare(MPI_Comm comm) {
  int size = tpsh_rt.size, me = tpsh_rt.rank;
  /* Every rank takes part, with zeros where it sent and received nothing: the others wait in the call. */
  ledger_pair *theirs = malloc((size_t)size * sizeof *theirs);
  int rc = theirs ? ledger() : tpsh_error(TPSH_ENOMEM, "out of host memory comparing the ranks' sends and receives");
  if (rc == TPSH_OK) {
    int e = MPI_Alltoall(mine, (int)sizeof *theirs, MPI_BYTE, theirs, (int)sizeof *theirs, MPI_BYTE, comm);
    if (e != MPI_SUCCESS)
      rc = tpsh_error(TPSH_ECOMM, "comparing the ranks' sends and receives failed in MPI (error %d)", e);
  }
  char text[400];
  for (int r = 0; r < size && rc == TPSH_OK; r++) {
    /* theirs[r]: what rank r sent to this rank and received from it */
    const ledger_entry *sent_to = &mine[r].sent, *got_from = &mine[r].received;
    if (!entries_agree(&theirs[r].sent, got_from))
      say(text, sizeof text, r, me, &theirs[r].sent, got_from);
    else if (!entries_agree(sent_to, &theirs[r].received))
      say(text, sizeof text, me, r, sent_to, &theirs[r].received);
    else
      continue;
    rc = tpsh_error(TPSH_EINVAL, "the ranks' sends and receives do not match: %s", text);
  }
  free(theirs);
  return rc;
}

char *tpsh_p2p_ledger_text(void) {
  tpsh_text t = {0};
  for (int r = 0; mine && r < tpsh_rt.size; r++) {
    const ledger_pair *p = &mine[r];
    if (p->sent.n || p->received.n)
      tpsh_text_appendf(&t, "%d %llu %016llx %llu %016llx\n", r, (unsigned long long)p->sent.n,
                        (unsigned long long)p->sent.groups, (unsigned long long)p->received.n,
                        (unsigned long long)p->received.groups);
  }
  return tpsh_text_take(&t);
}

void tpsh_p2p_ledger_free(void) {
  free(__atomic_exchange_n(&mine, NULL, __ATOMIC_ACQ_REL));
}
