/*
 * repl.c: the parts of the interactive session (lua/tpsh/repl.lua) that must be C.
 *
 * The logic (commands, incomplete chunks, running, output collapsing) lives in repl.lua; this file only
 * provides plain C functions that repl.lua declares in its own ffi.cdef (they are not part of the core's
 * ABI in src/tpsh.h, so the core stays usable without a REPL). Three things need C:
 *
 *  1. The terminal. Under MPICH's hydra (and Open MPI's mpirun) a rank has no controlling terminal: the
 *     launcher runs each rank in its own session with stdin/stdout on pipes, and forwards the bytes it
 *     reads from its own stdin to rank 0's stdin. So rank 0 "borrows" the launcher's terminal: it walks
 *     up its ancestors to the nearest process that has a controlling terminal (the launcher), and when
 *     that process's stdin is that terminal and it is the terminal's foreground job, opens it through
 *     /proc/PID/fd/0. That descriptor is used for the termios settings and for all REPL output; input
 *     still arrives on stdin through the launcher (reading the terminal directly would race with the
 *     launcher, which keeps reading it). Without a launcher (plain `tpsh` on a terminal) both are fd 0.
 *
 *  2. Ctrl-C. hydra turns the first SIGINT it receives into a SIGINT to every rank, and any later one
 *     into a kill of the whole job (its counter is never reset), so the terminal's own Ctrl-C could
 *     interrupt exactly one chunk per session. Instead the terminal is kept with ISIG off for the whole
 *     session: Ctrl-C reaches rank 0 as the byte 0x03. One reader thread on rank 0 owns the input: at the
 *     prompt it queues bytes for libedit; while a chunk runs, 0x03 interrupts the chunk on every rank
 *     (this rank: a Lua count hook set asynchronously, as luajit.c's laction does from its signal
 *     handler; other ranks: an MPI message to a small listener thread, which sets the same hook there),
 *     and other bytes are kept as type-ahead for the next prompt. A rank blocked outside Lua (a
 *     collective that not every rank entered) cannot be interrupted by anyone; after the first Ctrl-C
 *     the REPL says which ranks it still waits for, and a second Ctrl-C ends the session with MPI_Abort.
 *     With a timeout (--timeout / TPSH_TIMEOUT), the same happens by itself: once one rank has finished
 *     a chunk, the others get that long before they are interrupted, and that long again before abort.
 *     A real SIGINT (kill -INT, or a launcher that forwards one) interrupts the chunk on the ranks it
 *     reaches, and on rank 0 acts as a Ctrl-C.
 *
 *  3. The REPL's own messages travel on a private duplicate of MPI_COMM_WORLD, point to point, waited on
 *     by polling with short sleeps: a user collective that only some ranks entered can never match a
 *     REPL message, waiting ranks do not spin a core at 100% (MPICH's blocking calls busy-poll, which
 *     would distort the measurements the shell exists for), and rank 0 stays responsive while it waits.
 *
 * The terminal's settings are restored at exit, on SIGTERM/SIGHUP, and, should rank 0 be killed outright
 * (MPI_Abort elsewhere, SIGKILL), by a tiny guardian shell that waits for rank 0's end on a pipe.
 */
#define _GNU_SOURCE
#include "core/leakcheck.h"
#include "core/nap.h"
#include "tpsh.h"
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <locale.h>
#include <lua.h>
#include <mpi.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>
#ifdef TPSH_WITH_LIBEDIT
#include <histedit.h>
#endif

/* Called by main.c once the Lua state exists: the interrupt hook is set on it from other threads. */
void tpsh_repl_attach(lua_State *L);
void tpsh_repl_quiesce(void);

enum { TAG_CMD = 7301, TAG_RES = 7302, TAG_INTR = 7303, TAG_ERR = 7304, TAG_INTR_COUNT = 7305 };
#define ERR_TEXT 512                  /* a rank's error, as the divergence line quotes it */
#define DIVERGED_S 3.0                /* a chunk finished on some ranks this long ago: say so */

static lua_State *main_L;
static MPI_Comm comm = MPI_COMM_NULL;
static int me, nranks;
static double timeout_s;              /* 0: no automatic interrupt */

/* ---- chunk state, shared with the threads ---- */
static atomic_int running;            /* a chunk runs on this rank (set by repl.lua around it) */
static atomic_uint seq;               /* number of the current command, the same on every rank */
static atomic_int busy;               /* rank 0: from posting a command until every result is in */
static atomic_int interrupts;         /* rank 0: interrupts requested for the current command */
static atomic_int *pending;            /* rank 0: per rank, PENDING_* below */
enum { PENDING_NO = 0, PENDING_RUNNING = 1, PENDING_DONE = 2 };  /* DONE: finished, result not yet read */
static _Atomic double first_done;     /* rank 0: when the first rank finished the current command */
static atomic_int every_rank;         /* rank 0: the current command runs a chunk on every rank */
static char (*errs)[ERR_TEXT];        /* rank 0: per rank, its error in the current command ("": none) */
static pthread_mutex_t errs_mu = PTHREAD_MUTEX_INITIALIZER;
static volatile sig_atomic_t sigint_seen;
static atomic_int stopping;
static pthread_t helper;              /* rank 0: the input reader; others: the interrupt listener */
static int helper_started;
static struct sigaction prev_int;     /* SIGINT's handler outside the session (main.c's), put back at its end */
static int prev_int_saved;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
  if (!atomic_load(&running)) { lua_sethook(L, NULL, 0, 0); return; }
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
  if (main_L && atomic_load(&running)) {
    tpsh_interrupt(1);
    lua_sethook(main_L, lstop, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  }
}

void tpsh_repl_attach(lua_State *L) { main_L = L; }

/* ==== the terminal (rank 0) ====================================================================== */
static int tty_fd = -1, in_fd = -1;
static struct termios tty_saved, tty_run;
static int tty_owned;                 /* tty_saved holds settings to restore */
static int guard_fd = -1;             /* write end of the guardian's pipe */
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void tty_restore(void) {
  if (tty_owned) tcsetattr(tty_fd, TCSADRAIN, &tty_saved);
}

static void tty_enter_run_mode(void) {
  if (tty_owned) tcsetattr(tty_fd, TCSADRAIN, &tty_run);
}

static void write_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0) { if (errno == EINTR) continue; return; }
    s += w;
    n -= (size_t)w;
  }
}

void tpsh_repl_write(const char *s, int64_t n) {
  pthread_mutex_lock(&out_lock);
  write_all(tty_fd >= 0 ? tty_fd : 1, s, (size_t)n);
  pthread_mutex_unlock(&out_lock);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof msg - 1) n = (int)sizeof msg - 1;
  tpsh_repl_write(msg, n);
}

/* Reads /proc/PID/stat: the parent, the process group, the controlling terminal and its foreground
 * group. The command name (field 2) may hold spaces, so parsing starts after its closing ')'. */
static int proc_stat(pid_t pid, pid_t *ppid, pid_t *pgrp, int *tty_nr, pid_t *tpgid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  int pp, pg, sid, tn, tp;
  if (!p || sscanf(p + 2, "%*c %d %d %d %d %d", &pp, &pg, &sid, &tn, &tp) != 5) return -1;
  *ppid = pp; *pgrp = pg; *tty_nr = tn; *tpgid = tp;
  return 0;
}

/* The terminal that the user typed `mpiexec ... tpsh` on, or -1. See the header comment. */
static int find_terminal(void) {
  pid_t pid = getppid();
  for (int depth = 0; depth < 8 && pid > 1; depth++) {
    pid_t ppid, pgrp, tpgid;
    int tty_nr;
    if (proc_stat(pid, &ppid, &pgrp, &tty_nr, &tpgid) != 0) return -1;
    if (tty_nr != 0) {
      /* The nearest ancestor with a terminal is the launcher (or the shell, for a plain tpsh): use the
       * terminal only when it is that process's stdin and it runs in the foreground, so that
       * `echo ... | mpiexec tpsh` and `mpiexec tpsh &` stay non-interactive. */
      if (pgrp != tpgid) return -1;
      char path[64];
      snprintf(path, sizeof path, "/proc/%d/fd/0", (int)pid);
      int fd = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
      if (fd < 0) return -1;
      struct stat st;
      if (!isatty(fd) || fstat(fd, &st) != 0 || (int)st.st_rdev != tty_nr) { close(fd); return -1; }
      return fd;
    }
    pid = ppid;
  }
  return -1;
}

/* The guardian: `sh` in its own session, reading a pipe that only rank 0 holds. When rank 0 ends without
 * saying "ok" (killed by MPI_Abort from another rank, SIGKILL), it restores the terminal's settings, so
 * the user's shell does not inherit a terminal without echo or Ctrl-C. */
static void start_guardian(void) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return;
  char saved[512];
  int n = snprintf(saved, sizeof saved, "%x:%x:%x:%x", (unsigned)tty_saved.c_iflag,
                   (unsigned)tty_saved.c_oflag, (unsigned)tty_saved.c_cflag, (unsigned)tty_saved.c_lflag);
  for (int i = 0; i < NCCS && n < (int)sizeof saved - 4; i++)
    n += snprintf(saved + n, sizeof saved - (size_t)n, ":%x", (unsigned)tty_saved.c_cc[i]);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  posix_spawn_file_actions_adddup2(&fa, p[0], 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, tty_fd, 3);
  /* Nothing else: holding the launcher's pipes or sockets open would keep it waiting for us. */
  posix_spawn_file_actions_addclosefrom_np(&fa, 4);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID);
  char *argv[] = {"sh", "-c", "IFS= read -r x; [ \"$x\" = ok ] || stty \"$0\" <&3", saved, NULL};
  extern char **environ;
  pid_t pid;
  if (posix_spawn(&pid, "/bin/sh", &fa, &at, argv, environ) == 0) guard_fd = p[1];
  else close(p[1]);
  close(p[0]);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
}

static void guardian_release(void) {
  if (guard_fd >= 0) { write_all(guard_fd, "ok\n", 3); close(guard_fd); guard_fd = -1; }
}

/* SIGTERM and SIGHUP: the terminal first, then the handler that was there before (main.c's, which ends
 * every rank with a line and the status 128 + sig; a death by the signal, mpiexec mostly reported as 0). */
static struct sigaction prev_term, prev_hup;
static void on_fatal_signal(int sig) {
  tty_restore();
  struct sigaction *prev = sig == SIGTERM ? &prev_term : &prev_hup;
  if (!(prev->sa_flags & SA_SIGINFO) && prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
    prev->sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

/* ---- the input queue: filled by the reader thread, drained by the line editor ---- */
/* It grows as needed, so that nothing typed or pasted is lost, however long the paste and however long
 * the chunk that runs meanwhile (the bytes are type-ahead for the next prompts). Should memory run out,
 * the reader waits for the editor to drain the queue instead of dropping bytes. */
static struct {
  unsigned char *buf;
  size_t cap, head, tail;             /* bytes in buf[head, tail) */
  int eof;
  pthread_mutex_t mu;
  pthread_cond_t cv;                  /* bytes arrived, or room was made */
} inq = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void inq_compact(void) {
  memmove(inq.buf, inq.buf + inq.head, inq.tail - inq.head);
  inq.tail -= inq.head;
  inq.head = 0;
}

static void inq_push(const unsigned char *b, size_t n, int eof) {
  pthread_mutex_lock(&inq.mu);
  while (n > 0) {
    /* What is left moves to the front only once as much has been read as is left: moved at every push,
     * a long paste that the editor drained byte by byte was copied once per 512 bytes (quadratic). */
    if (inq.cap - inq.tail < n && inq.head > 0 && inq.head >= inq.tail - inq.head) inq_compact();
    if (inq.cap - inq.tail < n) {
      size_t cap = inq.cap ? inq.cap : 8192;
      while (cap - inq.tail < n) cap *= 2;
      unsigned char *nb = realloc(inq.buf, cap);
      if (nb) { inq.buf = nb; inq.cap = cap; }
      else if (inq.head > 0) inq_compact();
    }
    size_t k = inq.cap - inq.tail < n ? inq.cap - inq.tail : n;
    if (k == 0) {                     /* no memory: wait for the editor to make room, if it can */
      if (inq.head == inq.tail) break;
      pthread_cond_wait(&inq.cv, &inq.mu);
      continue;
    }
    memcpy(inq.buf + inq.tail, b, k);
    inq.tail += k;
    b += k;
    n -= k;
    pthread_cond_broadcast(&inq.cv);
  }
  if (eof) inq.eof = 1;
  pthread_cond_broadcast(&inq.cv);
  pthread_mutex_unlock(&inq.mu);
}

/* Next input byte, or -1 at the end of the input. */
static int inq_pop(void) {
  pthread_mutex_lock(&inq.mu);
  while (inq.head == inq.tail && !inq.eof) pthread_cond_wait(&inq.cv, &inq.mu);
  int c = -1;
  if (inq.head < inq.tail) {
    c = inq.buf[inq.head++];
    if (inq.head == inq.tail) inq.head = inq.tail = 0;
    pthread_cond_broadcast(&inq.cv);                        /* a reader short of memory may go on */
  }
  pthread_mutex_unlock(&inq.mu);
  return c;
}

/* Bytes queued now. */
static size_t inq_queued(void) {
  pthread_mutex_lock(&inq.mu);
  size_t n = inq.tail - inq.head;
  pthread_mutex_unlock(&inq.mu);
  return n;
}

/* ---- long lines: read past the line editor ---- */
/* libedit redraws the whole line at every key it inserts, so a pasted line of n bytes cost n redraws of
 * up to n bytes: 10 KB took 0.5 s, 40 KB 17 s, 70 KB over 98 s, and at 1 MB the launcher ended the run
 * ("process reading stdin too slowly"). So once a paste is seen (LONG_QUEUED bytes already queued when
 * the editor asks for one, or a line being edited that has grown to LONG_EDITED bytes), the rest of the
 * line is read here straight from the queue, in linear time, and echoed once; the editor is handed a
 * newline and its line is replaced by the whole one. Typing and short type-ahead stay the editor's. A
 * line longer than line_max (TPSH_REPL_LINE_MAX, repl.lua) is read to its end and discarded, with a
 * message: the session goes on. */
enum { LONG_QUEUED = 1024, LONG_EDITED = 4096, LONG_ECHOED = 65536, HISTORY_LINE_MAX = 65536 };
static size_t line_max = (size_t)16 << 20;
enum { LONG_NONE, LONG_LINE, LONG_INTERRUPTED, LONG_TOO_LONG };
static struct { char *buf; size_t len, cap, dropped; int state; } longl;

static void long_put(const char *s, size_t n) {
  if (longl.state == LONG_TOO_LONG || longl.len + n > line_max) {
    longl.state = LONG_TOO_LONG;
    longl.dropped += n;
    return;
  }
  if (longl.len + n + 1 > longl.cap) {
    size_t cap = longl.cap ? longl.cap : 65536;
    while (cap < longl.len + n + 1) cap *= 2;
    char *nb = realloc(longl.buf, cap);
    if (!nb) { longl.state = LONG_TOO_LONG; longl.dropped += n; return; }
    longl.buf = nb;
    longl.cap = cap;
  }
  memcpy(longl.buf + longl.len, s, n);
  longl.len += n;
  longl.buf[longl.len] = 0;
}

/* Reads the rest of a line (to '\r', '\n' or the end of the input) after what the editor holds
 * (before and after its cursor), and echoes what it read; longl.state says how it ended. */
static void long_read(const char *before, size_t nb, const char *after, size_t na) {
  longl.len = longl.dropped = 0;
  longl.state = LONG_LINE;
  long_put(before, nb);
  size_t from = longl.len;
  char chunk[4096];
  size_t k = 0;
  for (;;) {
    int c = inq_pop();
    if (c < 0 || c == '\r' || c == '\n') break;
    if (c == 3) { longl.state = LONG_INTERRUPTED; break; }
    chunk[k++] = (char)c;
    if (k == sizeof chunk) { long_put(chunk, k); k = 0; }
  }
  long_put(chunk, k);
  long_put(after, na);
  if (longl.state != LONG_LINE) return;
  size_t n = longl.len - from;
  const char *p = longl.buf + from;
  if (n <= LONG_ECHOED) { tpsh_repl_write(p, (int64_t)n); return; }
  char mid[96];
  int m = snprintf(mid, sizeof mid, " [... %zu bytes in all ...] ", longl.len);
  tpsh_repl_write(p, 200);
  tpsh_repl_write(mid, m);
  tpsh_repl_write(p + n - 200, 200);
}

void tpsh_repl_set_line_max(int64_t n) { if (n > 0) line_max = (size_t)n; }

static void abort_session(const char *why) {
  say("\r\ntpsh: %s: ending the session on every rank\r\n", why);
  tty_restore();
  guardian_release();
  tpsh_leakcheck_skip();
  MPI_Abort(MPI_COMM_WORLD, 130);
}

/* Interrupt messages sent to each rank (rank 0's reader thread) and received (a rank's listener): a
 * rank that had already finished the command, or that :on left out, never receives its message while
 * the command runs, and tpsh_repl_stop receives what is left by these counts. Left unreceived,
 * MPI_Finalize complained of them ("UCX WARN unexpected tag-receive descriptor ... was not matched")
 * at the end of every session where Ctrl-C had interrupted a chunk that some rank was not running. */
static unsigned *intr_sent;
static atomic_uint intr_got;

static void send_interrupts(void) {
  /* Static, not on the stack: the requests are freed unwaited, and MPI may read the buffer after this
   * returns (MPICH's shared-memory transport queues a send when the receiver's cells are full). Only
   * the reader thread sends, once a command. */
  static unsigned s;
  s = atomic_load(&seq);
  for (int r = 1; r < nranks; r++) {
    MPI_Request rq;
    MPI_Isend(&s, 1, MPI_UNSIGNED, r, TAG_INTR, comm, &rq);   /* a small eager message */
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
  for (int r = 1; r < nranks; r++) {
    if (atomic_load(&pending[r]) != PENDING_RUNNING) continue;
    int flag = 0;
    MPI_Iprobe(r, TAG_RES, comm, &flag, MPI_STATUS_IGNORE);
    if (!flag) continue;
    int expected = PENDING_RUNNING;
    atomic_compare_exchange_strong(&pending[r], &expected, PENDING_DONE);
    double zero = 0.0;
    atomic_compare_exchange_strong(&first_done, &zero, now_s());
  }
}

/* The ranks still running the current command, and (done, unless NULL) those that have finished it,
 * each as "1,3", from one look at every rank. */
static void list_ranks(char *running_out, char *done_out, size_t cap) {
  size_t n[2] = {0, 0};
  char *out[2] = {running_out, done_out};
  running_out[0] = 0;
  if (done_out) done_out[0] = 0;
  for (int r = 0; r < nranks; r++) {
    int k = (r == 0 ? atomic_load(&running) : atomic_load(&pending[r]) == PENDING_RUNNING) ? 0 : 1;
    if (out[k] && n[k] + 16 < cap)
      n[k] += (size_t)snprintf(out[k] + n[k], cap - n[k], "%s%d", n[k] ? "," : "", r);
  }
}

/* Takes the error messages that finished ranks sent for the current command (TAG_ERR: the command's
 * number, then the text). Matched probes, since the reader thread and collect may both look. */
static void take_errors(int r) {
  for (;;) {
    int flag = 0;
    MPI_Message m;
    MPI_Status st;
    MPI_Improbe(r, TAG_ERR, comm, &flag, &m, &st);
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
    pthread_mutex_lock(&errs_mu);
    if (s == atomic_load(&seq)) snprintf(errs[r], ERR_TEXT, "%.*s", n - (int)sizeof s, buf + sizeof s);
    pthread_mutex_unlock(&errs_mu);
  }
}

/* The divergence line's second part: each finished rank's error, first line only. */
static void say_errors(void) {
  for (int r = 0; r < nranks; r++) {
    if (r > 0) take_errors(r);
    pthread_mutex_lock(&errs_mu);
    char e[ERR_TEXT];
    snprintf(e, sizeof e, "%s", errs[r]);
    pthread_mutex_unlock(&errs_mu);
    if (!e[0]) continue;
    e[strcspn(e, "\n")] = 0;
    say("tpsh:   rank %d failed: %s\r\n", r, e);
  }
}

/* Ctrl-C (why NULL) or the timeout while a command runs: the first request interrupts every rank (why
 * says why), a later one ends the session (why then says what the ranks still running failed to do). */
static void request_interrupt(const char *why) {
  int n = atomic_fetch_add(&interrupts, 1) + 1;
  if (n == 1) {
    if (why) say("\r\ntpsh: %s: interrupting every rank\r\n", why);
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
    struct pollfd p = {in_fd, POLLIN, 0};
    int r = inq.eof ? poll(NULL, 0, 50) : poll(&p, 1, 50);
    if (r > 0) {
      /* Large reads: the launcher ends the run when rank 0's stdin pipe fills (a paste of 1 MB did). */
      static unsigned char b[65536];
      ssize_t n = read(in_fd, b, sizeof b);
      if (n <= 0) {
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        inq_push(NULL, 0, 1);
        continue;
      }
      size_t keep = 0;
      for (ssize_t i = 0; i < n; i++) {
        if (b[i] == 3 && atomic_load(&busy)) request_interrupt(NULL);
        else b[keep++] = b[i];
      }
      inq_push(b, keep, 0);
    }
    if (sigint_seen) {
      sigint_seen = 0;
      if (atomic_load(&busy)) request_interrupt(NULL);
      else inq_push((const unsigned char *)"\003", 1, 0);    /* at the prompt: discard the line */
    }
    if (!atomic_load(&busy)) continue;
    double t = now_s();
    /* A new command: its own state. Keyed on the command's number, since a typed-ahead command can
     * start between two turns of this loop, which would then never see the rank idle. */
    unsigned cur = atomic_load(&seq);
    if (cur != state_seq) { state_seq = cur; seen = 0; hinted_for = -1; busy_at = t; told_diverged = 0; }
    int ints = atomic_load(&interrupts);
    if (ints > 0 && !seen) { seen = 1; interrupted_at = t; }
    /* Only while rank 0 runs its part: after that, collect reads the results itself. Four times a
     * second at most, and only when it matters (a timeout, an interrupt, or a chunk of every rank that
     * has run for a second), to stay out of the way. */
    int every = atomic_load(&every_rank);
    if (atomic_load(&running) && (timeout_s > 0 || ints > 0 || (every && t - busy_at > 1.0)) &&
        t - probed_at > 0.25) {
      probed_at = t;
      note_finished();
    }
    /* A chunk that every rank runs, finished on some ranks 3 s ago and still running on others: the
     * common way to get there is an error (or a branch) on some ranks before a collective that the
     * others then wait in, which nothing would otherwise show until Ctrl-C. Said once a command. */
    double fd0 = atomic_load(&first_done);
    if (every && ints == 0 && fd0 > 0 && t - fd0 > DIVERGED_S && !told_diverged) {
      told_diverged = 1;
      char ranks[256], done[256];
      list_ranks(ranks, done, sizeof ranks);
      if (ranks[0] && done[0]) {
        say("tpsh: rank(s) %s still running %g s after rank(s) %s finished (waiting in a collective that "
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
        say("tpsh: still waiting for rank(s) %s, blocked outside Lua (in MPI or NCCL: a collective or a "
            "host-side exchange that not every rank entered?); Ctrl-C again ends the session\r\n", ranks);
    }
    double fd = atomic_load(&first_done);
    if (timeout_s > 0 && fd > 0) {
      char why[80];
      if (ints == 0 && t - fd > timeout_s) {
        snprintf(why, sizeof why, "ranks still running %g s after the first one finished", timeout_s);
        request_interrupt(why);
      } else if (ints > 0 && seen && t - interrupted_at > timeout_s) {
        snprintf(why, sizeof why, "still not finished %g s after the interrupt", timeout_s);  /* rank(s) ... */
        atomic_store(&interrupts, 1);
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
    if (atomic_load(&running)) {
      MPI_Iprobe(0, TAG_INTR, comm, &flag, MPI_STATUS_IGNORE);
      if (flag) {
        unsigned s;
        MPI_Recv(&s, 1, MPI_UNSIGNED, 0, TAG_INTR, comm, MPI_STATUS_IGNORE);
        atomic_fetch_add(&intr_got, 1);
        if (s == atomic_load(&seq)) interrupt_here();
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

/* ==== line editing ================================================================================ */
static char history_path[4096];
static int line_interrupted;
static char *line_buf;                /* the last line handed out, owned here */

#ifdef TPSH_WITH_LIBEDIT
static EditLine *el;
static History *hist;
static const char *cur_prompt = "";

static char *prompt_fn(EditLine *e) { (void)e; return (char *)cur_prompt; }

/* libedit asks for characters here instead of reading its terminal: they come from the queue. */
static int getc_fn(EditLine *e, wchar_t *wc) {
  const LineInfo *li = el_line(e);
  size_t edited = li ? (size_t)(li->lastchar - li->buffer) : 0;
  if (li && (edited >= LONG_EDITED || inq_queued() >= LONG_QUEUED)) {
    long_read(li->buffer, (size_t)(li->cursor - li->buffer), li->cursor, (size_t)(li->lastchar - li->cursor));
    *wc = '\n';                                   /* the editor's line ends; readline takes longl's */
    return 1;
  }
  mbstate_t st;
  memset(&st, 0, sizeof st);
  for (;;) {
    int c = inq_pop();
    if (c < 0) return 0;
    char ch = (char)c;
    size_t r = mbrtowc(wc, &ch, 1, &st);
    if (r == (size_t)-2) continue;                              /* more bytes of a UTF-8 sequence */
    if (r == (size_t)-1) { memset(&st, 0, sizeof st); *wc = (wchar_t)(unsigned char)ch; }
    return 1;
  }
}

static unsigned char interrupt_fn(EditLine *e, int ch) {
  (void)e; (void)ch;
  line_interrupted = 1;
  return CC_NEWLINE;
}
#endif

#ifdef TPSH_WITH_LIBEDIT
/* ---- the history file ---- */
/* Never read or written through a symbolic link (a link planted at the history's name had its target
 * rewritten and made mode 0600), and never replaced when it cannot be read (a file not in libedit's
 * format was overwritten outright): kept aside under another name, a new history begun. Saved to a
 * temporary file beside it (mode 0600, created exclusively) and renamed over it, so that a crash or a
 * full disk mid-write leaves the last whole history. On any refusal the session goes on without it. */
static void history_off(const char *why) {
  say("tpsh: the history file %s %s; this session's history is not saved\r\n", history_path, why);
  history_path[0] = 0;
}

static void history_open(HistEvent *ev) {
  struct stat st;
  if (lstat(history_path, &st) != 0) return;                   /* none yet: made at the first save */
  if (S_ISLNK(st.st_mode)) {
    history_off("is a symbolic link, which tpsh neither follows nor replaces (TPSH_HISTORY may name the "
                "file it points to)");
    return;
  }
  if (!S_ISREG(st.st_mode)) { history_off("is not a regular file"); return; }
  if (history(hist, ev, H_LOAD, history_path) >= 0) return;
  char aside[sizeof history_path + 32];
  for (int k = 0; k < 100; k++) {
    if (k == 0) snprintf(aside, sizeof aside, "%s.unreadable", history_path);
    else snprintf(aside, sizeof aside, "%s.unreadable.%d", history_path, k);
    if (lstat(aside, &st) == 0) continue;
    if (rename(history_path, aside) != 0) break;
    say("tpsh: the history file %s could not be read (not in libedit's format?): kept as %s, and a new one "
        "begun\r\n", history_path, aside);
    return;
  }
  history_off("could not be read (not in libedit's format?) nor moved aside");
}

static void history_save(void) {
  HistEvent ev;
  char tmp[sizeof history_path + 64];
  snprintf(tmp, sizeof tmp, "%s.tpsh-%d.tmp", history_path, (int)getpid());
  unlink(tmp);                                                   /* a temporary of ours left by a crash */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;
  FILE *f = fdopen(fd, "w");
  if (!f) { close(fd); unlink(tmp); return; }
  int ok = history(hist, &ev, H_SAVE_FP, f) >= 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, history_path) != 0) unlink(tmp);
}
#endif

/* Returns 1 when an interactive terminal was found (this rank is then the REPL's reader), else 0. */
int tpsh_repl_term_open(const char *history_file) {
  if (isatty(0)) tty_fd = dup(0), in_fd = 0;
  else if ((tty_fd = find_terminal()) >= 0) in_fd = 0;
  else return 0;
  /* The launcher's pipe to stdin, as large as an unprivileged process may make it (1 MiB by default):
   * the launcher ends the run when it finds the pipe full, and a paste arrives faster than it is read
   * while the reader thread waits for a core on a loaded machine. Fails harmlessly on a terminal. */
  if (in_fd == 0 && !isatty(0)) (void)fcntl(0, F_SETPIPE_SZ, 1 << 20);
  fcntl(tty_fd, F_SETFD, FD_CLOEXEC);
  if (tcgetattr(tty_fd, &tty_saved) == 0) {
    tty_owned = 1;
    tty_run = tty_saved;
    /* Ctrl-C, Ctrl-Z, Ctrl-\ arrive as bytes; nothing echoes behind the REPL's back; bytes are forwarded
     * by the launcher as they are typed. Output processing (\n -> \r\n) stays as it was. */
    tty_run.c_lflag &= ~(tcflag_t)(ISIG | ICANON | ECHO | IEXTEN);
    tty_run.c_cc[VMIN] = 1;
    tty_run.c_cc[VTIME] = 0;
    start_guardian();
    atexit(tty_restore);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &prev_term);
    sigaction(SIGHUP, &sa, &prev_hup);
    tty_enter_run_mode();
  }
  if (history_file) snprintf(history_path, sizeof history_path, "%s", history_file);
#ifdef TPSH_WITH_LIBEDIT
  setlocale(LC_CTYPE, "");            /* UTF-8 input; LC_NUMERIC stays "C" for Lua's number formats */
  FILE *fin = fdopen(dup(tty_fd), "r"), *fout = fdopen(dup(tty_fd), "w");
  el = el_init_fd("tpsh", fin, fout, fout, tty_fd, tty_fd, tty_fd);
  hist = history_init();
  HistEvent ev;
  history(hist, &ev, H_SETSIZE, 1000);
  history(hist, &ev, H_SETUNIQUE, 1);
  if (history_path[0]) history_open(&ev);
  el_set(el, EL_EDITOR, "emacs");
  el_set(el, EL_HIST, history, hist);
  el_set(el, EL_PROMPT, prompt_fn);
  el_set(el, EL_GETCFN, getc_fn);
  el_set(el, EL_SETTY, "-d", "-isig", NULL);   /* while editing too: Ctrl-C is a key, not a signal */
  /* libedit's "cooked" mode (el_init sets it at once, el_gets on return) is canonical by default. With
   * ICANON on, the kernel keeps at most 4095 bytes of a line that has no newline yet and drops the rest,
   * and the launcher reads nothing before the newline: a paste that arrives then loses bytes (seen on a
   * loaded machine when a 20 KB line was pasted just as the first prompt appeared, before libedit's raw
   * mode). So cooked is our run mode here; the terminal is never canonical while the REPL owns it. */
  el_set(el, EL_SETTY, "-x", "-icanon", "-echo", "-isig", "-iexten", NULL);
  el_set(el, EL_ADDFN, "tpsh-interrupt", "discard the line", interrupt_fn);
  el_set(el, EL_BIND, "^C", "tpsh-interrupt", NULL);
  el_set(el, EL_BIND, "^R", "em-inc-search-prev", NULL);
  /* These would signal rank 0's own process group (stopping it under the launcher's feet). */
  el_set(el, EL_BIND, "^Z", "ed-insert", NULL);
  el_set(el, EL_BIND, "^\\", "ed-insert", NULL);
  el_source(el, NULL);                /* the user's ~/.editrc */
  tty_enter_run_mode();               /* whatever el_init and ~/.editrc set */
#endif
  return 1;
}

/* 1: *line is the next line (no newline); 0: end of input; 2: Ctrl-C discarded the line. */
/* The end of a line that long_read read: 1 (line_buf is it), or 2 (discarded, said why). */
static int long_done(void) {
  int state = longl.state;
  longl.state = LONG_NONE;
  if (state == LONG_INTERRUPTED) { tpsh_repl_write("^C\n", 3); return 2; }
  if (state == LONG_TOO_LONG) {
    say("tpsh: a line of %zu bytes was discarded: longer than %zu bytes (TPSH_REPL_LINE_MAX); run a longer "
        "chunk from a file (dofile)\r\n", longl.len + longl.dropped, line_max);
    return 2;
  }
  line_buf = malloc(longl.len + 1);
  if (!line_buf) { say("tpsh: out of host memory for a line of %zu bytes; discarded\r\n", longl.len); return 2; }
  memcpy(line_buf, longl.buf ? longl.buf : "", longl.len);
  line_buf[longl.len] = 0;
  if (longl.cap > 1 << 20) { free(longl.buf); longl.buf = NULL; longl.cap = 0; }   /* keep no megabytes */
  return 1;
}

int tpsh_repl_readline(const char *prompt, const char **line) {
  line_interrupted = 0;
  free(line_buf);
  line_buf = NULL;
#ifdef TPSH_WITH_LIBEDIT
  cur_prompt = prompt;
  el_resize(el);                      /* SIGWINCH goes to the launcher, not to us: ask each time */
  int n = 0;
  const char *s = el_gets(el, &n);
  tty_enter_run_mode();               /* libedit sets its "cooked" mode (ours, above) on return */
  if (longl.state != LONG_NONE) {
    int rc = long_done();
    if (rc != 1) return rc;
    *line = line_buf;
    return 1;
  }
  if (line_interrupted) { tpsh_repl_write("^C\n", 3); return 2; }
  if (!s || n <= 0) { tpsh_repl_write("\n", 1); return 0; }
  line_buf = strndup(s, (size_t)n);
#else
  /* Without libedit: a minimal editor (echo, backspace, Ctrl-C, Ctrl-D), since the terminal is raw. */
  tpsh_repl_write(prompt, (int64_t)strlen(prompt));
  size_t cap = 256, len = 0;
  line_buf = malloc(cap);
  for (;;) {
    if (len >= LONG_EDITED || inq_queued() >= LONG_QUEUED) {
      long_read(line_buf, len, "", 0);
      free(line_buf);
      line_buf = NULL;
      tpsh_repl_write("\n", 1);
      int rc = long_done();
      if (rc != 1) return rc;
      *line = line_buf;
      return 1;
    }
    int c = inq_pop();
    if (c < 0 || (c == 4 && len == 0)) { tpsh_repl_write("\n", 1); free(line_buf); line_buf = NULL; return 0; }
    if (c == 3) { tpsh_repl_write("^C\n", 3); return 2; }
    if (c == '\r' || c == '\n') { tpsh_repl_write("\n", 1); break; }
    if (c == 127 || c == 8) { if (len) { len--; tpsh_repl_write("\b \b", 3); } continue; }
    if (c < 32 && c != '\t') continue;
    if (len + 2 > cap) line_buf = realloc(line_buf, cap *= 2);
    line_buf[len++] = (char)c;
    char ch = (char)c;
    tpsh_repl_write(&ch, 1);
  }
  line_buf[len] = 0;
#endif
  size_t len2 = strlen(line_buf);
  while (len2 && (line_buf[len2 - 1] == '\n' || line_buf[len2 - 1] == '\r')) line_buf[--len2] = 0;
  *line = line_buf;
  return 1;
}

void tpsh_repl_history_add(const char *line) {
#ifdef TPSH_WITH_LIBEDIT
  HistEvent ev;
  if (!hist) return;
  /* A pasted line of megabytes would make the file as large, and be loaded at every start. */
  if (strlen(line) > HISTORY_LINE_MAX) return;
  history(hist, &ev, H_ENTER, line);
  if (history_path[0]) history_save();
#else
  (void)line;
#endif
}

/* ==== the REPL's messages between ranks ============================================================ */
/* Collective: every rank calls it when the interactive session starts. */
int tpsh_repl_start(double timeout) {
  timeout_s = timeout;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS) return -1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &nranks);
  pending = calloc((size_t)nranks, sizeof *pending);
  errs = calloc((size_t)nranks, sizeof *errs);
  intr_sent = calloc((size_t)nranks, sizeof *intr_sent);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  prev_int_saved = sigaction(SIGINT, &sa, &prev_int) == 0;
  tpsh_interruptible(1);              /* host waits poll for a Ctrl-C */
  if (me == 0 && in_fd >= 0) helper_started = pthread_create(&helper, NULL, reader_main, NULL) == 0;
  else if (me != 0) helper_started = pthread_create(&helper, NULL, listener_main, NULL) == 0;
  return 0;
}

/* Every rank, when the session ends: after the quit command went round (quit 1), or after its loop
 * raised (quit 0: the other ranks may never get here, so nothing is waited for from them). */
/* The helper thread ends before anything else does: it makes MPI calls (a listener probes while a chunk
 * runs), which must not meet MPI_Finalize (a segfault, at os.exit in a chunk). main.c's os.exit calls
 * this too, for a chunk that calls the C function through a reference taken before the session (the
 * session's own os.exit unwinds the chunk instead: repl.lua). */
void tpsh_repl_quiesce(void) {
  atomic_store(&stopping, 1);
  if (helper_started) pthread_join(helper, NULL);
  helper_started = 0;
}

void tpsh_repl_stop(int quit) {
  tpsh_repl_quiesce();
  if (prev_int_saved) sigaction(SIGINT, &prev_int, NULL);
  else signal(SIGINT, SIG_DFL);
  prev_int_saved = 0;
  tpsh_interruptible(0);
  tpsh_interrupt(0);
  /* The interrupt messages still unreceived (see intr_sent): rank 0 says how many it sent. */
  if (quit && comm != MPI_COMM_NULL && nranks > 1) {
    if (me == 0) {
      for (int r = 1; r < nranks; r++) MPI_Send(&intr_sent[r], 1, MPI_UNSIGNED, r, TAG_INTR_COUNT, comm);
    } else {
      unsigned sent = 0, s;
      MPI_Recv(&sent, 1, MPI_UNSIGNED, 0, TAG_INTR_COUNT, comm, MPI_STATUS_IGNORE);
      for (unsigned got = atomic_load(&intr_got); got < sent; got++)
        MPI_Recv(&s, 1, MPI_UNSIGNED, 0, TAG_INTR, comm, MPI_STATUS_IGNORE);
    }
  }
#ifdef TPSH_WITH_LIBEDIT
  if (el) { el_end(el); el = NULL; }
  if (hist) { history_end(hist); hist = NULL; }
#endif
  tty_restore();
  guardian_release();
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  free(pending);
  pending = NULL;
  free(errs);
  errs = NULL;
  free(intr_sent);
  intr_sent = NULL;
}

/* Rank 0: sends the next command (serialised by repl.lua) to every other rank. */
int tpsh_repl_post(const char *buf, int64_t len) {
  atomic_fetch_add(&seq, 1);
  atomic_store(&interrupts, 0);
  atomic_store(&first_done, 0.0);
  pthread_mutex_lock(&errs_mu);
  for (int r = 0; r < nranks; r++) errs[r][0] = 0;
  pthread_mutex_unlock(&errs_mu);
  for (int r = 1; r < nranks; r++) {
    atomic_store(&pending[r], PENDING_RUNNING);
    if (MPI_Send(buf, (int)len, MPI_BYTE, r, TAG_CMD, comm) != MPI_SUCCESS) return -1;
  }
  return 0;
}

/* Ranks > 0: waits for the next command; *out is released with tpsh_repl_free. */
int64_t tpsh_repl_next(void **out) {
  MPI_Status st;
  int flag = 0, us = 50;
  for (;;) {
    MPI_Iprobe(0, TAG_CMD, comm, &flag, &st);
    if (flag) break;
    tpsh_nap(&us, 20000);
  }
  int n = 0;
  MPI_Get_count(&st, MPI_BYTE, &n);
  char *b = malloc((size_t)n + 1);
  MPI_Recv(b, n, MPI_BYTE, 0, TAG_CMD, comm, MPI_STATUS_IGNORE);
  atomic_fetch_add(&seq, 1);
  *out = b;
  return n;
}

/* Ranks > 0: the result of the command, to rank 0. */
int tpsh_repl_reply(const char *buf, int64_t len) {
  return MPI_Send(buf, (int)len, MPI_BYTE, 0, TAG_RES, comm) == MPI_SUCCESS ? 0 : -1;
}

/* Rank 0: every other rank's result, concatenated in rank order, lens[r] bytes each (lens[0] = 0). */
int tpsh_repl_collect(void **out, int64_t *lens) {
  char **parts = calloc((size_t)nranks, sizeof *parts);
  int left = nranks - 1, us = 50;
  lens[0] = 0;
  while (left > 0) {
    int got = 0;
    for (int r = 1; r < nranks; r++) {
      if (atomic_load(&pending[r]) == PENDING_NO) continue;
      MPI_Status st;
      int flag = 0;
      MPI_Iprobe(r, TAG_RES, comm, &flag, &st);
      if (!flag) continue;
      int n = 0;
      MPI_Get_count(&st, MPI_BYTE, &n);
      parts[r] = malloc((size_t)n + 1);
      MPI_Recv(parts[r], n, MPI_BYTE, r, TAG_RES, comm, MPI_STATUS_IGNORE);
      take_errors(r);                 /* sent before the result: none is left for a later command */
      lens[r] = n;
      double zero = 0.0;
      atomic_compare_exchange_strong(&first_done, &zero, now_s());
      atomic_store(&pending[r], PENDING_NO);
      left--;
      got = 1;
    }
    if (got) us = 50;
    else if (left > 0) tpsh_nap(&us, 5000);
  }
  int64_t total = 0;
  for (int r = 1; r < nranks; r++) total += lens[r];
  char *all = malloc((size_t)total + 1), *p = all;
  for (int r = 1; r < nranks; r++) { memcpy(p, parts[r], (size_t)lens[r]); p += lens[r]; free(parts[r]); }
  free(parts);
  *out = all;
  return 0;
}

/* Rank 0: 1 from posting a command until its results are in (Ctrl-C then interrupts), 0 after.
 * every: the command runs a chunk on every rank (not :on, not :ranks), so ranks that finish long
 * before the others are worth a word (reader_main). */
void tpsh_repl_busy(int on, int every) {
  atomic_store(&every_rank, on && every);
  atomic_store(&busy, on);
}

/* Every rank: 1 while the chunk runs here (an interrupt may stop it), 0 after. */
void tpsh_repl_running(int on) {
  tpsh_interrupt(0);                  /* an interrupt ends with the chunk it was for */
  atomic_store(&running, on);
  if (!on && me == 0) {
    double zero = 0.0;
    atomic_compare_exchange_strong(&first_done, &zero, now_s());
  }
}

/* Every rank: its chunk failed with msg. Rank 0 keeps it; the others send it at once (a small eager
 * message), so that rank 0 can quote it while other ranks still run (reader_main). */
void tpsh_repl_tell_error(const char *msg, int64_t len) {
  if (len > ERR_TEXT - 1) len = ERR_TEXT - 1;
  if (me == 0) {
    pthread_mutex_lock(&errs_mu);
    snprintf(errs[0], ERR_TEXT, "%.*s", (int)len, msg);
    pthread_mutex_unlock(&errs_mu);
    return;
  }
  char buf[sizeof(unsigned) + ERR_TEXT];
  unsigned s = atomic_load(&seq);
  memcpy(buf, &s, sizeof s);
  memcpy(buf + sizeof s, msg, (size_t)len);
  MPI_Send(buf, (int)(sizeof s + (size_t)len), MPI_BYTE, 0, TAG_ERR, comm);
}

void tpsh_repl_free(void *p) { free(p); }

const char *tpsh_repl_hostname(void) {
  static char name[256];
  if (gethostname(name, sizeof name - 1) != 0) strcpy(name, "?");
  return name;
}
