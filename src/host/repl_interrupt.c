/*
 * repl_interrupt.c: Ctrl-C and the timeout. hydra turns the first SIGINT it receives into a SIGINT to
 * every rank, and any later one into a kill of the whole job (its counter is never reset), so the
 * terminal's own Ctrl-C could interrupt exactly one chunk per session. Instead the terminal is kept with
 * ISIG off for the whole session: Ctrl-C reaches rank 0 as the byte 0x03. One reader thread on rank 0
 * owns the input: at the prompt it queues bytes for the line editor; while a chunk runs, 0x03 interrupts
 * the chunk on every rank (this rank: a Lua count hook set asynchronously, as luajit.c's laction does
 * from its signal handler; other ranks: an MPI message to a small listener thread, which sets the same
 * hook there), and other bytes are kept as type-ahead for the next prompt. A rank blocked outside Lua
 * (a collective that not every rank entered) cannot be interrupted by anyone; after the first Ctrl-C
 * the REPL says which ranks it still waits for, and a second Ctrl-C ends the session with MPI_Abort.
 * With a timeout (--timeout / TPSH_TIMEOUT), the same happens by itself: once one rank has finished a
 * chunk, the others get that long before they are interrupted, and that long again before abort. A
 * real SIGINT (kill -INT, or a launcher that forwards one) interrupts the chunk on the ranks it reaches,
 * and on rank 0 acts as a Ctrl-C.
 */
#define _GNU_SOURCE
#include "host/repl.h"
#include "host/repl_internal.h"
#include "core/leakcheck.h"
#include "core/nap.h"
#include "tpsh.h"
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DIVERGED_S 3.0                /* a chunk finished on some ranks this long ago: say so */

static lua_State *main_L;
static volatile sig_atomic_t sigint_seen;
static atomic_int stopping;
static pthread_t helper;              /* rank 0: the input reader; others: the interrupt listener */
static int helper_started;
static struct sigaction prev_int;     /* SIGINT's handler outside the session (main.c's), put back at its end */
static int prev_int_saved;

/* ==== interrupting the Lua chunk ================================================================ */
/* The innermost Lua function running (C functions, such as `error` called from tpsh's Lua, skipped):
 * 1 when it is tp's own (lua/tpsh/), which is not interrupted halfway (a batch half recorded, a check
 * location half set), and whose line would be named instead of the chunk's; else 0 with ar filled. */
static int in_own_code(lua_State *L, lua_Debug *ar) {
  for (int level = 0; lua_getstack(L, level, ar); level++) {
    if (!lua_getinfo(L, "Sl", ar)) return 0;
    if (strcmp(ar->what, "C") != 0) return strstr(ar->source, "/lua/tpsh/") != NULL;
  }
  ar->currentline = -1;
  return 0;
}

static void lstop(lua_State *L, lua_Debug *hook_ar) {
  (void)hook_ar;
  /* The hook may fire in the REPL's own code just after the chunk ended: only a chunk is interrupted. */
  if (!atomic_load(&tpsh_repl.running)) { lua_sethook(L, NULL, 0, 0); return; }
  lua_Debug ar;
  if (in_own_code(L, &ar)) return;  /* the hook stays set: it fires again once the chunk's code runs */
  lua_sethook(L, NULL, 0, 0);
  if (ar.currentline > 0) lua_pushfstring(L, "%s:%d: interrupted", ar.short_src, ar.currentline);
  else lua_pushliteral(L, "interrupted");
  lua_error(L);
}

/* Safe from a signal handler or another thread, as in luajit.c: it only sets the hook fields, and the
 * flag that ends a host wait (tpsh_interrupt), where the chunk may be blocked outside Lua. */
static void interrupt_here(void) {
  if (main_L && atomic_load(&tpsh_repl.running)) {
    tpsh_interrupt(1);
    lua_sethook(main_L, lstop, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  }
}

void tpsh_repl_attach(lua_State *L) { main_L = L; }

static void abort_session(const char *why) {
  tpsh_repl_say("\r\ntpsh: %s: ending the session on every rank\r\n", why);
  tpsh_repl_tty_restore();
  tpsh_repl_guardian_release();
  tpsh_leakcheck_skip();
  MPI_Abort(MPI_COMM_WORLD, 130);
}

/* Interrupt messages sent to each rank (rank 0's reader thread) and received (a rank's listener): a
 * rank that had already finished the command, or that :on left out, never receives its message while
 * the command runs, and tpsh_repl_interrupts_stop receives what is left by these counts. Left
 * unreceived, they make MPI_Finalize warn (UCX: "unexpected tag-receive descriptor ... was not matched")
 * at the end of a session where Ctrl-C interrupted a chunk that some rank was not running. */
static unsigned *intr_sent;
static atomic_uint intr_got;

static void send_interrupts(void) {
  /* Static, not on the stack: the requests are freed unwaited, and MPI may read the buffer after this
   * returns (MPICH's shared-memory transport queues a send when the receiver's cells are full). Only
   * the reader thread sends, once a command. */
  static unsigned s;
  s = atomic_load(&tpsh_repl.seq);
  for (int r = 1; r < tpsh_repl.nranks; r++) {
    MPI_Request rq;
    MPI_Isend(&s, 1, MPI_UNSIGNED, r, TAG_INTR, tpsh_repl.comm, &rq);   /* a small eager message */
    MPI_Request_free(&rq);
    intr_sent[r]++;
  }
}

/* The reader thread, while a command runs: which ranks have finished it. Rank 0 only reads the results
 * (tpsh_repl_collect) once its own part of the chunk is done, so while rank 0 itself is still running
 * (or blocked), the reader looks for them without taking them: a result that has arrived means its rank
 * is done. That keeps "still waiting for rank(s) ..." accurate, and starts the timeout's clock when
 * another rank finishes first. Only probes (never receives), so it cannot take a message from collect. */
static void note_finished(void) {
  for (int r = 1; r < tpsh_repl.nranks; r++) {
    if (atomic_load(&tpsh_repl.pending[r]) != PENDING_RUNNING) continue;
    int flag = 0;
    MPI_Iprobe(r, TAG_RES, tpsh_repl.comm, &flag, MPI_STATUS_IGNORE);
    if (!flag) continue;
    int expected = PENDING_RUNNING;
    atomic_compare_exchange_strong(&tpsh_repl.pending[r], &expected, PENDING_DONE);
    double zero = 0.0;
    atomic_compare_exchange_strong(&tpsh_repl.first_done, &zero, tpsh_repl_now_s());
  }
}

/* The ranks still running the current command, and (done, unless NULL) those that have finished it,
 * each as "1,3", from one look at every rank. */
static void list_ranks(char *running_out, char *done_out, size_t cap) {
  size_t n[2] = {0, 0};
  char *out[2] = {running_out, done_out};
  running_out[0] = 0;
  if (done_out) done_out[0] = 0;
  for (int r = 0; r < tpsh_repl.nranks; r++) {
    int busy_r = r == 0 ? atomic_load(&tpsh_repl.running) : atomic_load(&tpsh_repl.pending[r]) == PENDING_RUNNING;
    int k = busy_r ? 0 : 1;
    if (out[k] && n[k] + 16 < cap)
      n[k] += (size_t)snprintf(out[k] + n[k], cap - n[k], "%s%d", n[k] ? "," : "", r);
  }
}

/* The divergence line's second part: each finished rank's error, first line only. */
static void say_errors(void) {
  for (int r = 0; r < tpsh_repl.nranks; r++) {
    if (r > 0) tpsh_repl_take_errors(r);
    pthread_mutex_lock(&tpsh_repl.errs_mu);
    char e[ERR_TEXT];
    snprintf(e, sizeof e, "%s", tpsh_repl.errs[r]);
    pthread_mutex_unlock(&tpsh_repl.errs_mu);
    if (!e[0]) continue;
    e[strcspn(e, "\n")] = 0;
    tpsh_repl_say("tpsh:   rank %d failed: %s\r\n", r, e);
  }
}

/* Ctrl-C (why NULL) or the timeout while a command runs: the first request interrupts every rank (why
 * says why), a later one ends the session (why then says what the ranks still running failed to do). */
static void request_interrupt(const char *why) {
  int n = atomic_fetch_add(&tpsh_repl.interrupts, 1) + 1;
  if (n == 1) {
    if (why) tpsh_repl_say("\r\ntpsh: %s: interrupting every rank\r\n", why);
    interrupt_here();
    send_interrupts();
  } else {
    char ranks[256];
    note_finished();
    list_ranks(ranks, NULL, sizeof ranks);
    char msg[400];
    if (why) snprintf(msg, sizeof msg, "rank(s) %s %s", ranks[0] ? ranks : "?", why);
    else snprintf(msg, sizeof msg, "interrupted again while rank(s) %s had not finished", ranks[0] ? ranks : "?");
    abort_session(msg);
  }
}

/* The reader thread (rank 0): the only reader of the input. See the header comment. */
static void *reader_main(void *arg) {
  (void)arg;
  double hinted_for = -1, interrupted_at = 0, probed_at = 0, busy_at = 0;
  int seen = 0, told_diverged = 0;
  unsigned state_seq = 0;             /* the command the state below is about */
  while (!atomic_load(&stopping)) {
    struct pollfd p = {tpsh_repl_in_fd, POLLIN, 0};
    int r = tpsh_repl_inq_ended() ? poll(NULL, 0, 50) : poll(&p, 1, 50);
    if (r > 0) {
      /* Large reads: the launcher ends the run when rank 0's stdin pipe fills (a paste of 1 MB can). */
      static unsigned char b[65536];
      ssize_t n = read(tpsh_repl_in_fd, b, sizeof b);
      if (n <= 0) {
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        tpsh_repl_inq_push(NULL, 0, 1);
        continue;
      }
      size_t keep = 0;
      for (ssize_t i = 0; i < n; i++) {
        if (b[i] == 3 && atomic_load(&tpsh_repl.busy)) request_interrupt(NULL);
        else b[keep++] = b[i];
      }
      tpsh_repl_inq_push(b, keep, 0);
    }
    if (sigint_seen) {
      sigint_seen = 0;
      if (atomic_load(&tpsh_repl.busy)) request_interrupt(NULL);
      else tpsh_repl_inq_push((const unsigned char *)"\003", 1, 0);    /* at the prompt: discard the line */
    }
    if (!atomic_load(&tpsh_repl.busy)) continue;
    double t = tpsh_repl_now_s();
    /* A new command: its own state. Keyed on the command's number, since a typed-ahead command can
     * start between two turns of this loop, which would then never see the rank idle. */
    unsigned cur = atomic_load(&tpsh_repl.seq);
    if (cur != state_seq) { state_seq = cur; seen = 0; hinted_for = -1; busy_at = t; told_diverged = 0; }
    int ints = atomic_load(&tpsh_repl.interrupts);
    if (ints > 0 && !seen) { seen = 1; interrupted_at = t; }
    /* Only while rank 0 runs its part: after that, collect reads the results itself. Four times a
     * second at most, and only when it matters (a timeout, an interrupt, or a chunk of every rank that
     * has run for a second), to stay out of the way. */
    int every = atomic_load(&tpsh_repl.every_rank);
    if (atomic_load(&tpsh_repl.running) && (tpsh_repl.timeout_s > 0 || ints > 0 || (every && t - busy_at > 1.0)) &&
        t - probed_at > 0.25) {
      probed_at = t;
      note_finished();
    }
    /* A chunk that every rank runs, finished on some ranks 3 s ago and still running on others: the
     * common way to get there is an error (or a branch) on some ranks before a collective that the
     * others then wait in, which nothing would otherwise show until Ctrl-C. Said once a command. */
    double fd0 = atomic_load(&tpsh_repl.first_done);
    if (every && ints == 0 && fd0 > 0 && t - fd0 > DIVERGED_S && !told_diverged) {
      told_diverged = 1;
      char ranks[256], done[256];
      list_ranks(ranks, done, sizeof ranks);
      if (ranks[0] && done[0]) {
        tpsh_repl_say("tpsh: rank(s) %s still running %g s after rank(s) %s finished (waiting in a collective that "
            "not every rank entered?); Ctrl-C interrupts\r\n", ranks, DIVERGED_S, done);
        say_errors();
      }
    }
    /* A second after an interrupt, say who is still running: those ranks are outside Lua. */
    if (seen && t - interrupted_at > 1.0 && hinted_for != interrupted_at) {
      hinted_for = interrupted_at;
      char ranks[256];
      note_finished();
      list_ranks(ranks, NULL, sizeof ranks);
      if (ranks[0])
        tpsh_repl_say("tpsh: still waiting for rank(s) %s, blocked outside Lua (in MPI or NCCL: a collective or a "
            "host-side exchange that not every rank entered?); Ctrl-C again ends the session\r\n", ranks);
    }
    double fd = atomic_load(&tpsh_repl.first_done);
    if (tpsh_repl.timeout_s > 0 && fd > 0) {
      char why[80];
      if (ints == 0 && t - fd > tpsh_repl.timeout_s) {
        snprintf(why, sizeof why, "ranks still running %g s after the first one finished", tpsh_repl.timeout_s);
        request_interrupt(why);
      } else if (ints > 0 && seen && t - interrupted_at > tpsh_repl.timeout_s) {
        /* (said as "rank(s) ... still not finished") */
        snprintf(why, sizeof why, "still not finished %g s after the interrupt", tpsh_repl.timeout_s);
        atomic_store(&tpsh_repl.interrupts, 1);
        request_interrupt(why);
      }
    }
  }
  return NULL;
}

/* The listener thread (ranks > 0): turns rank 0's interrupt messages into the Lua hook. Polls only
 * while a chunk runs; an interrupt for an earlier command is dropped. */
static void *listener_main(void *arg) {
  (void)arg;
  while (!atomic_load(&stopping)) {
    int flag = 0, us = 10000;
    if (atomic_load(&tpsh_repl.running)) {
      MPI_Iprobe(0, TAG_INTR, tpsh_repl.comm, &flag, MPI_STATUS_IGNORE);
      if (flag) {
        unsigned s;
        MPI_Recv(&s, 1, MPI_UNSIGNED, 0, TAG_INTR, tpsh_repl.comm, MPI_STATUS_IGNORE);
        atomic_fetch_add(&intr_got, 1);
        if (s == atomic_load(&tpsh_repl.seq)) interrupt_here();
        continue;
      }
    }
    tpsh_nap(&us, us);
  }
  return NULL;
}

static void on_sigint(int sig) {
  (void)sig;
  sigint_seen = 1;
  interrupt_here();
}

/* The helper thread ends before anything else does: it makes MPI calls (a listener probes while a chunk
 * runs), which must not meet MPI_Finalize (a segfault, at os.exit in a chunk). main.c's os.exit calls
 * this too, for a chunk that calls the C function through a reference taken before the session (the
 * session's own os.exit unwinds the chunk instead: repl.lua). */
void tpsh_repl_quiesce(void) {
  atomic_store(&stopping, 1);
  if (helper_started) pthread_join(helper, NULL);
  helper_started = 0;
}

int tpsh_repl_interrupts_start(void) {
  intr_sent = calloc((size_t)tpsh_repl.nranks, sizeof *intr_sent);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  prev_int_saved = sigaction(SIGINT, &sa, &prev_int) == 0;
  tpsh_interruptible(1);              /* host waits poll for a Ctrl-C */
  void *(*helper_main)(void *) = tpsh_repl.me != 0 ? listener_main : tpsh_repl_in_fd >= 0 ? reader_main : NULL;
  if (helper_main) helper_started = pthread_create(&helper, NULL, helper_main, NULL) == 0;
  return 0;
}

void tpsh_repl_interrupts_stop(int quit) {
  tpsh_repl_quiesce();
  if (prev_int_saved) sigaction(SIGINT, &prev_int, NULL);
  else signal(SIGINT, SIG_DFL);
  prev_int_saved = 0;
  tpsh_interruptible(0);
  tpsh_interrupt(0);
  /* The interrupt messages still unreceived (see intr_sent): rank 0 says how many it sent. */
  if (quit && tpsh_repl.comm != MPI_COMM_NULL && tpsh_repl.nranks > 1) {
    if (tpsh_repl.me == 0) {
      for (int r = 1; r < tpsh_repl.nranks; r++)
        MPI_Send(&intr_sent[r], 1, MPI_UNSIGNED, r, TAG_INTR_COUNT, tpsh_repl.comm);
    } else {
      unsigned sent = 0, s;
      MPI_Recv(&sent, 1, MPI_UNSIGNED, 0, TAG_INTR_COUNT, tpsh_repl.comm, MPI_STATUS_IGNORE);
      for (unsigned got = atomic_load(&intr_got); got < sent; got++)
        MPI_Recv(&s, 1, MPI_UNSIGNED, 0, TAG_INTR, tpsh_repl.comm, MPI_STATUS_IGNORE);
    }
  }
  free(intr_sent);
  intr_sent = NULL;
}
