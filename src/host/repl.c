/*
 * repl.c: the parts of the interactive session (lua/tpsh/repl.lua) that must be C, and the commands'
 * messages between the ranks.
 *
 * The logic (commands, incomplete chunks, running, output collapsing) lives in repl.lua; the C side only
 * provides plain C functions that repl.lua declares in its own ffi.cdef (they are not part of the core's
 * ABI in src/tpsh.h, so the core stays usable without a REPL). Its files, one concern each, share
 * host/repl_internal.h:
 *   repl.c            the session's start and end, and each command's messages between the ranks
 *   repl_term.c       the terminal, which rank 0 borrows from the launcher, and its settings
 *   repl_input.c      rank 0's input queue, and long lines (pastes) read past the line editor
 *   repl_edit.c       line editing (libedit or a minimal editor) and the history file
 *   repl_interrupt.c  Ctrl-C and the timeout: the reader thread, the other ranks' listeners, the hook
 *
 * The REPL's own messages travel on a private duplicate of MPI_COMM_WORLD, point to point, waited on by
 * polling with short sleeps: a user collective that only some ranks entered can never match a REPL
 * message, waiting ranks do not spin a core at 100% (MPICH's blocking calls busy-poll, which would
 * distort the measurements the shell exists for), and rank 0 stays responsive while it waits.
 */
#include "host/repl_internal.h"
#include "core/nap.h"
#include "tpsh.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct tpsh_repl_state tpsh_repl = {.comm = MPI_COMM_NULL, .errs_mu = PTHREAD_MUTEX_INITIALIZER};

/* ==== the session =============================================================================== */
/* Collective: every rank calls it when the interactive session starts. */
int tpsh_repl_start(double timeout) {
  tpsh_repl.timeout_s = timeout;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &tpsh_repl.comm) != MPI_SUCCESS) return -1;
  MPI_Comm_rank(tpsh_repl.comm, &tpsh_repl.me);
  MPI_Comm_size(tpsh_repl.comm, &tpsh_repl.nranks);
  tpsh_repl.pending = calloc((size_t)tpsh_repl.nranks, sizeof *tpsh_repl.pending);
  tpsh_repl.errs = calloc((size_t)tpsh_repl.nranks, sizeof *tpsh_repl.errs);
  return tpsh_repl_interrupts_start();
}

/* Every rank, when the session ends: after the quit command went round (quit 1), or after its loop
 * raised (quit 0: the other ranks may never get here, so nothing is waited for from them). */
void tpsh_repl_stop(int quit) {
  tpsh_repl_interrupts_stop(quit);
  tpsh_repl_edit_close();
  tpsh_repl_tty_restore();
  tpsh_repl_guardian_release();
  if (tpsh_repl.comm != MPI_COMM_NULL) MPI_Comm_free(&tpsh_repl.comm);
  free(tpsh_repl.pending);
  tpsh_repl.pending = NULL;
  free(tpsh_repl.errs);
  tpsh_repl.errs = NULL;
}

/* ==== a rank's error in the current command ==================================================== */
/* The error messages that finished ranks sent for the current command (TAG_ERR: the command's number,
 * then the text). Matched probes, since the reader thread and collect may both look. */
void tpsh_repl_take_errors(int r) {
  for (;;) {
    int flag = 0;
    MPI_Message m;
    MPI_Status st;
    MPI_Improbe(r, TAG_ERR, tpsh_repl.comm, &flag, &m, &st);
    if (!flag) return;
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    char buf[sizeof(unsigned) + ERR_TEXT];
    if (n > (int)sizeof buf) n = (int)sizeof buf;
    MPI_Mrecv(buf, n, MPI_BYTE, &m, MPI_STATUS_IGNORE);   /* n is the whole message: the sender bounds it */
    unsigned s;
    if (n < (int)sizeof s) continue;
    memcpy(&s, buf, sizeof s);
    /* Under the lock that tpsh_repl_post clears errs with, after moving seq on: an earlier command's
     * error never lands in the next command's list. */
    pthread_mutex_lock(&tpsh_repl.errs_mu);
    if (s == atomic_load(&tpsh_repl.seq))
      snprintf(tpsh_repl.errs[r], ERR_TEXT, "%.*s", n - (int)sizeof s, buf + sizeof s);
    pthread_mutex_unlock(&tpsh_repl.errs_mu);
  }
}

/* ==== each command's messages ================================================================== */
/* Rank 0: sends the next command (serialised by repl.lua) to every other rank. */
int tpsh_repl_post(const char *buf, int64_t len) {
  atomic_fetch_add(&tpsh_repl.seq, 1);
  atomic_store(&tpsh_repl.interrupts, 0);
  atomic_store(&tpsh_repl.first_done, 0.0);
  pthread_mutex_lock(&tpsh_repl.errs_mu);
  for (int r = 0; r < tpsh_repl.nranks; r++) tpsh_repl.errs[r][0] = 0;
  pthread_mutex_unlock(&tpsh_repl.errs_mu);
  for (int r = 1; r < tpsh_repl.nranks; r++) {
    atomic_store(&tpsh_repl.pending[r], PENDING_RUNNING);
    if (MPI_Send(buf, (int)len, MPI_BYTE, r, TAG_CMD, tpsh_repl.comm) != MPI_SUCCESS) return -1;
  }
  return 0;
}

/* Ranks > 0: waits for the next command; *out is released with tpsh_repl_free. */
int64_t tpsh_repl_next(void **out) {
  MPI_Status st;
  int flag = 0, us = 50;
  for (;;) {
    MPI_Iprobe(0, TAG_CMD, tpsh_repl.comm, &flag, &st);
    if (flag) break;
    tpsh_nap(&us, 20000);
  }
  int n = 0;
  MPI_Get_count(&st, MPI_BYTE, &n);
  char *b = malloc((size_t)n + 1);
  MPI_Recv(b, n, MPI_BYTE, 0, TAG_CMD, tpsh_repl.comm, MPI_STATUS_IGNORE);
  atomic_fetch_add(&tpsh_repl.seq, 1);
  *out = b;
  return n;
}

/* Ranks > 0: the result of the command, to rank 0. */
int tpsh_repl_reply(const char *buf, int64_t len) {
  return MPI_Send(buf, (int)len, MPI_BYTE, 0, TAG_RES, tpsh_repl.comm) == MPI_SUCCESS ? 0 : -1;
}

/* Rank 0: every other rank's result, concatenated in rank order, lens[r] bytes each (lens[0] = 0). */
int tpsh_repl_collect(void **out, int64_t *lens) {
  char **parts = calloc((size_t)tpsh_repl.nranks, sizeof *parts);
  int left = tpsh_repl.nranks - 1, us = 50;
  lens[0] = 0;
  while (left > 0) {
    int got = 0;
    for (int r = 1; r < tpsh_repl.nranks; r++) {
      if (atomic_load(&tpsh_repl.pending[r]) == PENDING_NO) continue;
      MPI_Status st;
      int flag = 0;
      MPI_Iprobe(r, TAG_RES, tpsh_repl.comm, &flag, &st);
      if (!flag) continue;
      int n = 0;
      MPI_Get_count(&st, MPI_BYTE, &n);
      parts[r] = malloc((size_t)n + 1);
      MPI_Recv(parts[r], n, MPI_BYTE, r, TAG_RES, tpsh_repl.comm, MPI_STATUS_IGNORE);
      tpsh_repl_take_errors(r);                 /* sent before the result: none is left for a later command */
      lens[r] = n;
      double zero = 0.0;
      atomic_compare_exchange_strong(&tpsh_repl.first_done, &zero, tpsh_repl_now_s());
      atomic_store(&tpsh_repl.pending[r], PENDING_NO);
      left--;
      got = 1;
    }
    if (got) us = 50;
    else if (left > 0) tpsh_nap(&us, 5000);
  }
  int64_t total = 0;
  for (int r = 1; r < tpsh_repl.nranks; r++) total += lens[r];
  char *all = malloc((size_t)total + 1), *p = all;
  for (int r = 1; r < tpsh_repl.nranks; r++) { memcpy(p, parts[r], (size_t)lens[r]); p += lens[r]; free(parts[r]); }
  free(parts);
  *out = all;
  return 0;
}

/* Rank 0: 1 from posting a command until its results are in (Ctrl-C then interrupts), 0 after.
 * every: the command runs a chunk on every rank (not :on, not :ranks), so ranks that finish long
 * before the others are worth a word (reader_main). */
void tpsh_repl_busy(int on, int every) {
  atomic_store(&tpsh_repl.every_rank, on && every);
  atomic_store(&tpsh_repl.busy, on);
}

/* Every rank: 1 while the chunk runs here (an interrupt may stop it), 0 after. */
void tpsh_repl_running(int on) {
  tpsh_interrupt(0);                  /* an interrupt ends with the chunk it was for */
  atomic_store(&tpsh_repl.running, on);
  if (!on && tpsh_repl.me == 0) {
    double zero = 0.0;
    atomic_compare_exchange_strong(&tpsh_repl.first_done, &zero, tpsh_repl_now_s());
  }
}

/* Every rank: its chunk failed with msg. Rank 0 keeps it; the others send it at once (a small eager
 * message), so that rank 0 can quote it while other ranks still run (reader_main). */
void tpsh_repl_tell_error(const char *msg, int64_t len) {
  if (len > ERR_TEXT - 1) len = ERR_TEXT - 1;
  if (tpsh_repl.me == 0) {
    pthread_mutex_lock(&tpsh_repl.errs_mu);
    snprintf(tpsh_repl.errs[0], ERR_TEXT, "%.*s", (int)len, msg);
    pthread_mutex_unlock(&tpsh_repl.errs_mu);
    return;
  }
  char buf[sizeof(unsigned) + ERR_TEXT];
  unsigned s = atomic_load(&tpsh_repl.seq);
  memcpy(buf, &s, sizeof s);
  memcpy(buf + sizeof s, msg, (size_t)len);
  MPI_Send(buf, (int)(sizeof s + (size_t)len), MPI_BYTE, 0, TAG_ERR, tpsh_repl.comm);
}

void tpsh_repl_free(void *p) { free(p); }

const char *tpsh_repl_hostname(void) {
  static char name[256];
  if (gethostname(name, sizeof name - 1) != 0) strcpy(name, "?");
  return name;
}
