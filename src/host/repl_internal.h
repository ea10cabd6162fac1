/*
 * repl_internal.h: what the REPL's C files share (repl.c's header comment says which file does what).
 * Nothing here is in repl.lua's cdef: repl.lua calls the tpsh_repl_* functions that each file says are
 * its part of the session.
 */
#ifndef TPSH_HOST_REPL_INTERNAL_H
#define TPSH_HOST_REPL_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Tags of the REPL's communicator, one place for all of them: a command and its result (repl.c), an
 * interrupt and, at the end, how many were sent (repl_interrupt.c), a rank's error (repl.c). */
enum { TAG_CMD = 7301, TAG_RES = 7302, TAG_INTR = 7303, TAG_ERR = 7304, TAG_INTR_COUNT = 7305 };
#define ERR_TEXT 512                  /* a rank's error, as the divergence line quotes it */

/* ==== the session and its current command (repl.c), shared with the helper threads ============== */
enum { PENDING_NO = 0, PENDING_RUNNING = 1, PENDING_DONE = 2 };  /* DONE: finished, result not yet read */
extern struct tpsh_repl_state {
  MPI_Comm comm;                      /* a private duplicate of MPI_COMM_WORLD */
  int me, nranks;
  double timeout_s;                   /* 0: no automatic interrupt */
  atomic_int running;                 /* a chunk runs on this rank (set by repl.lua around it) */
  atomic_uint seq;                    /* number of the current command, the same on every rank */
  atomic_int busy;                    /* rank 0: from posting a command until every result is in */
  atomic_int interrupts;              /* rank 0: interrupts requested for the current command */
  atomic_int *pending;                /* rank 0: per rank, PENDING_* above */
  _Atomic double first_done;          /* rank 0: when the first rank finished the current command */
  atomic_int every_rank;              /* rank 0: the current command runs a chunk on every rank */
  char (*errs)[ERR_TEXT];             /* rank 0: per rank, its error in the current command ("": none) */
  pthread_mutex_t errs_mu;
} tpsh_repl;
/* Rank 0: takes the error messages that rank r sent for the current command into tpsh_repl.errs. */
void tpsh_repl_take_errors(int r);

static inline double tpsh_repl_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ==== the terminal (repl_term.c), rank 0 ======================================================== */
extern int tpsh_repl_tty_fd;          /* the terminal: settings and every output of the REPL; -1 none */
extern int tpsh_repl_in_fd;           /* the input (stdin, forwarded by the launcher); -1 none */
void tpsh_repl_write(const char *s, int64_t n);   /* to the terminal (repl.lua writes so too) */
void tpsh_repl_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));   /* formatted */
void tpsh_repl_tty_restore(void);           /* the settings the session found */
void tpsh_repl_tty_enter_run_mode(void);    /* the session's: no echo, no signals, not canonical */
void tpsh_repl_guardian_release(void);      /* rank 0 ends as it should: the guardian restores nothing */

/* ==== the input queue and long lines (repl_input.c), rank 0 ===================================== */
void tpsh_repl_inq_push(const unsigned char *b, size_t n, int eof);   /* the reader thread's bytes */
int tpsh_repl_inq_pop(void);          /* the next byte (waits), or -1 at the end of the input */
int tpsh_repl_inq_ended(void);        /* the end of the input is queued */
/* Whether the line being edited, `edited` bytes so far, is read past the editor (a paste). */
int tpsh_repl_long_starts(size_t edited);
/* Reads the rest of that line after what the editor holds (before and after its cursor), and echoes
 * it; tpsh_repl_long_done then gives it: 1 with *line (malloc'd), or 2 (discarded, said why). */
void tpsh_repl_long_read(const char *before, size_t nb, const char *after, size_t na);
int tpsh_repl_long_pending(void);     /* a line read so awaits tpsh_repl_long_done */
int tpsh_repl_long_done(char **line);

/* ==== line editing (repl_edit.c), rank 0 ======================================================== */
void tpsh_repl_edit_open(const char *history_file);   /* once the terminal's settings are taken */
void tpsh_repl_edit_close(void);

/* ==== Ctrl-C and the timeout (repl_interrupt.c) ================================================= */
int tpsh_repl_interrupts_start(void); /* SIGINT taken over, host waits that poll, the helper thread */
/* The helper thread stopped, SIGINT given back, and (quit: every rank came) the interrupt messages
 * still on their way received. */
void tpsh_repl_interrupts_stop(int quit);

#endif /* TPSH_HOST_REPL_INTERNAL_H */
