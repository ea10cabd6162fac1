/*
 * watchdog_ask.c: the questions between the ranks' watchdogs. A watchdog asks every other rank for its
 * state (wd_status) and waits at most ASK_MS for the answers; every watchdog answers the questions that
 * have come at each tick, whatever its host is doing, so a live rank answers within about half a second.
 * The other ranks are only ever asked, never sent anything unasked; a question or answer still on its
 * way when the run ends normally (a rank that finished is asked by one still waiting; an answer comes
 * after the asker's deadline) is received then, by counts the ranks exchange (drain_questions): no
 * message is left for MPI_Finalize.
 */
#include "core/watchdog.h"
#include "core/nap.h"
#include "core/p2p_ledger.h"
#include <stdlib.h>

/* Every question and answer is counted per peer, so that the end of the run can receive each one still
 * in flight (drain_questions): a rank that finished may be asked once more by a rank still waiting, and
 * an answer may come after the asking rank's deadline. Left unreceived, they make MPI_Finalize warn
 * (UCX: "unexpected tag-receive descriptor ... was not matched"). The watchdog thread's only until it
 * stops; then the host thread's. */
typedef struct peer_counts { uint64_t asked_of, asked_by, answered_to, answers_from; } peer_counts;
static peer_counts *counts;   /* [tpsh_rt.size] */

/* An answer on its way: MPI_Isend's buffer lives until the send completes (a blocking send could wait
 * forever for an asker that gave up, and this thread with it). */
typedef struct answer { struct answer *next; MPI_Request req; wd_status st; } answer;
static answer *answers;

/* Ends receive *q, posted and maybe never matched: cancelled, or completed after all. Returns whether a
 * message came (then *s, when given, says from whom), so that the counts above stay exact. */
int tpsh_wd_end_receive(MPI_Request *q, MPI_Status *s) {
  MPI_Status st;
  int cancelled = 0;
  MPI_Cancel(q);
  MPI_Wait(q, &st);
  MPI_Test_cancelled(&st, &cancelled);
  if (s) *s = st;
  return !cancelled;
}

static void reap_answers(void) {
  for (answer **p = &answers; *p;) {
    int done = 0;
    if (MPI_Test(&(*p)->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
    if (!done) { p = &(*p)->next; continue; }
    answer *a = *p;
    *p = a->next;
    free(a);
  }
}

/* Questions arrive in a receive that is always posted: MPI_Test completes one that has come in the
 * same call that makes progress, where MPI_Iprobe (MPICH) looks before it makes progress and so sees a
 * question only at the next tick, which would make answers take a second rather than half of one. */
static MPI_Request question = MPI_REQUEST_NULL;
static int question_from;                 /* the receive's buffer: the asking rank */

/* Answers every pending request of another rank's watchdog. */
void tpsh_wd_serve(void) {
  reap_answers();
  for (;;) {
    if (question == MPI_REQUEST_NULL &&
        MPI_Irecv(&question_from, 1, MPI_INT, MPI_ANY_SOURCE, TAG_REQ, tpsh_wd_comm, &question) != MPI_SUCCESS) {
      question = MPI_REQUEST_NULL;
      return;
    }
    int done = 0;
    MPI_Status s;
    if (MPI_Test(&question, &done, &s) != MPI_SUCCESS) { question = MPI_REQUEST_NULL; return; }
    if (!done) return;
    int from = s.MPI_SOURCE;
    counts[from].asked_by++;
    answer *a = malloc(sizeof *a);
    if (!a) continue;                      /* out of memory: the asker's deadline passes */
    tpsh_wd_fill_status(&a->st);
    tpsh_p2p_ledger_counts(from, &a->st.p2p_sent, &a->st.p2p_received);
    if (MPI_Isend(&a->st, (int)sizeof a->st, MPI_BYTE, from, TAG_REP, tpsh_wd_comm, &a->req) != MPI_SUCCESS) { free(a); continue; }
    counts[from].answered_to++;
    a->next = answers;
    answers = a;
  }
}

/* The posted receive ends before the counts are exchanged: cancelled, or it had a question after all. */
static void end_question_receive(void) {
  if (question == MPI_REQUEST_NULL) return;
  MPI_Status s;
  if (tpsh_wd_end_receive(&question, &s)) counts[s.MPI_SOURCE].asked_by++;
  question = MPI_REQUEST_NULL;
}

/* Receives from rank r on tag what it still owes this rank (*got up to want) into buf, and drops it.
 * Returns 0 when the deadline passed (a count was wrong: the drain stops there). */
static int receive_owed(int r, int tag, void *buf, int count, MPI_Datatype type, uint64_t *got, uint64_t want,
                        double deadline) {
  while (*got < want) {
    MPI_Request q;
    if (MPI_Irecv(buf, count, type, r, tag, tpsh_wd_comm, &q) != MPI_SUCCESS) return 1;
    int done = 0;
    while (MPI_Test(&q, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && tpsh_now_ms() < deadline) tpsh_sleep_ms(1);
    if (!done) { tpsh_wd_end_receive(&q, NULL); return 0; }
    (*got)++;
  }
  return 1;
}

/* At the end of the run, every rank (no watchdog thread left anywhere once the exchange of counts is
 * done): receive the questions and answers the others sent this rank and it has not received, then
 * wait for this rank's own answers to be received. Bounded, should a count ever be wrong. */
static void drain_questions(void) {
  int size = tpsh_rt.size, me = tpsh_rt.rank;
  uint64_t *sent = calloc(4 * (size_t)size, sizeof *sent), *to_me = sent ? sent + 2 * size : NULL;
  if (!sent) return;
  for (int r = 0; r < size; r++) sent[2 * r] = counts[r].asked_of, sent[2 * r + 1] = counts[r].answered_to;
  if (MPI_Alltoall(sent, 2, MPI_UINT64_T, to_me, 2, MPI_UINT64_T, tpsh_wd_comm) != MPI_SUCCESS) { free(sent); return; }
  static int who;
  static wd_status late;                   /* answers no one reads any more */
  double deadline = tpsh_now_ms() + 5 * ASK_MS;
  int on = 1;
  for (int r = 0; r < size && on; r++)
    if (r != me)
      on = receive_owed(r, TAG_REQ, &who, 1, MPI_INT, &counts[r].asked_by, to_me[2 * r], deadline) &&
           receive_owed(r, TAG_REP, &late, (int)sizeof late, MPI_BYTE, &counts[r].answers_from, to_me[2 * r + 1],
                        deadline);
  free(sent);
  if (!on) return;
  while (answers && tpsh_now_ms() < deadline) {
    reap_answers();
    if (answers) tpsh_sleep_ms(1);
  }
}

static uint64_t questions;     /* atomic: tpsh_wd_ask_others calls */
uint64_t tpsh_watch_questions(void) { return __atomic_load_n(&questions, __ATOMIC_ACQUIRE); }

/* Asks every other rank for its state; got[r] says whether rank r answered within ASK_MS. */
void tpsh_wd_ask_others(wd_status *rep, int *got, int size) {
  static int me;                               /* the question: its buffer outlives the sends */
  me = tpsh_rt.rank;
  __atomic_add_fetch(&questions, 1, __ATOMIC_ACQ_REL);
  MPI_Request *rr = calloc((size_t)size, sizeof *rr), *sr = calloc((size_t)size, sizeof *sr);
  if (!rr || !sr) { free(rr); free(sr); return; }
  for (int r = 0; r < size; r++) {
    rr[r] = sr[r] = MPI_REQUEST_NULL;
    if (r == me) continue;
    if (MPI_Irecv(&rep[r], (int)sizeof *rep, MPI_BYTE, r, TAG_REP, tpsh_wd_comm, &rr[r]) != MPI_SUCCESS) rr[r] = MPI_REQUEST_NULL;
    if (MPI_Isend(&me, 1, MPI_INT, r, TAG_REQ, tpsh_wd_comm, &sr[r]) != MPI_SUCCESS) sr[r] = MPI_REQUEST_NULL;
    else counts[r].asked_of++;
  }
  double deadline = tpsh_now_ms() + ASK_MS;
  int pending = size - 1;
  while (pending > 0 && tpsh_now_ms() < deadline && !tpsh_wd_stopping()) {
    tpsh_wd_serve();                                   /* another rank may be asking us at the same moment */
    for (int r = 0; r < size; r++) {
      if (r == me || got[r] || rr[r] == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&rr[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        rr[r] = MPI_REQUEST_NULL;
        counts[r].answers_from++;              /* consumed by the failed receive */
        pending--;
        continue;
      }
      if (done) { got[r] = 1; counts[r].answers_from++; pending--; }
    }
    if (pending > 0) tpsh_sleep_ms(10);
  }
  /* A receive for a rank that never answered is cancelled (the run may go on: tpsh_wd_check_peers asks too);
   * the answer may have come in the meantime, and then it counts; one still to come is received at the
   * end of the run (drain_questions). The question sent stays posted, as its watchdog may still
   * answer it. rep[] is the caller's to free once this returns: each receive has ended by then. */
  for (int r = 0; r < size; r++)
    if (r != me && !got[r] && rr[r] != MPI_REQUEST_NULL && tpsh_wd_end_receive(&rr[r], NULL)) counts[r].answers_from++;
  for (int r = 0; r < size; r++)
    if (sr[r] != MPI_REQUEST_NULL) MPI_Request_free(&sr[r]);
  free(rr);
  free(sr);
}

int tpsh_wd_ask_init(void) {
  counts = calloc((size_t)tpsh_rt.size, sizeof *counts);
  return counts ? 0 : -1;
}

void tpsh_wd_ask_stop(int mpi_alive) {
  if (mpi_alive) {
    end_question_receive();
    if (tpsh_rt.size > 1) drain_questions();
  }
  free(counts);
  counts = NULL;
}
