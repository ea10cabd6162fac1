/*
 * repl_term.c: the REPL's terminal on rank 0. Under MPICH's hydra (and Open MPI's mpirun) a rank has no
 * controlling terminal: the launcher runs each rank in its own session with stdin/stdout on pipes, and
 * forwards the bytes it reads from its own stdin to rank 0's stdin. So rank 0 "borrows" the launcher's
 * terminal: it walks up its ancestors to the nearest process that has a controlling terminal (the
 * launcher), and when that process's stdin is that terminal and it is the terminal's foreground job,
 * opens it through /proc/PID/fd/0. That descriptor is used for the termios settings and for all REPL
 * output; input still arrives on stdin through the launcher (reading the terminal directly would race
 * with the launcher, which keeps reading it). Without a launcher (plain `tpsh` on a terminal) both are
 * fd 0.
 *
 * The terminal's settings are restored at exit, on SIGTERM/SIGHUP, and, should rank 0 be killed outright
 * (MPI_Abort elsewhere, SIGKILL), by a tiny guardian shell that waits for rank 0's end on a pipe.
 */
#define _GNU_SOURCE
#include "host/repl_internal.h"
#include "tpsh.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

int tpsh_repl_tty_fd = -1, tpsh_repl_in_fd = -1;
static struct termios tty_saved, tty_run;
static int tty_owned;                 /* tty_saved holds settings to restore */
static int guard_fd = -1;             /* write end of the guardian's pipe */
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

void tpsh_repl_tty_restore(void) {
  if (tty_owned) tcsetattr(tpsh_repl_tty_fd, TCSADRAIN, &tty_saved);
}

void tpsh_repl_tty_enter_run_mode(void) {
  if (tty_owned) tcsetattr(tpsh_repl_tty_fd, TCSADRAIN, &tty_run);
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
  write_all(tpsh_repl_tty_fd >= 0 ? tpsh_repl_tty_fd : 1, s, (size_t)n);
  pthread_mutex_unlock(&out_lock);
}

void tpsh_repl_say(const char *fmt, ...) {
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
  posix_spawn_file_actions_adddup2(&fa, tpsh_repl_tty_fd, 3);
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

void tpsh_repl_guardian_release(void) {
  if (guard_fd >= 0) { write_all(guard_fd, "ok\n", 3); close(guard_fd); guard_fd = -1; }
}

/* SIGTERM and SIGHUP: the terminal first, then the handler that was there before (main.c's, which ends
 * every rank with a line and the status 128 + sig; a death by the signal mpiexec mostly reports as 0). */
static struct sigaction prev_term, prev_hup;
static void on_fatal_signal(int sig) {
  tpsh_repl_tty_restore();
  struct sigaction *prev = sig == SIGTERM ? &prev_term : &prev_hup;
  if (!(prev->sa_flags & SA_SIGINFO) && prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
    prev->sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Returns 1 when an interactive terminal was found (this rank is then the REPL's reader), else 0. */
int tpsh_repl_term_open(const char *history_file) {
  if (isatty(0)) tpsh_repl_tty_fd = dup(0), tpsh_repl_in_fd = 0;
  else if ((tpsh_repl_tty_fd = find_terminal()) >= 0) tpsh_repl_in_fd = 0;
  else return 0;
  /* The launcher's pipe to stdin, as large as an unprivileged process may make it (1 MiB by default):
   * the launcher ends the run when it finds the pipe full, and a paste arrives faster than it is read
   * while the reader thread waits for a core on a loaded machine. Fails harmlessly on a terminal. */
  if (tpsh_repl_in_fd == 0 && !isatty(0)) (void)fcntl(0, F_SETPIPE_SZ, 1 << 20);
  fcntl(tpsh_repl_tty_fd, F_SETFD, FD_CLOEXEC);
  if (tcgetattr(tpsh_repl_tty_fd, &tty_saved) == 0) {
    tty_owned = 1;
    tty_run = tty_saved;
    /* Ctrl-C, Ctrl-Z, Ctrl-\ arrive as bytes; nothing echoes behind the REPL's back; bytes are forwarded
     * by the launcher as they are typed. Output processing (\n -> \r\n) stays as it was. */
    tty_run.c_lflag &= ~(tcflag_t)(ISIG | ICANON | ECHO | IEXTEN);
    tty_run.c_cc[VMIN] = 1;
    tty_run.c_cc[VTIME] = 0;
    start_guardian();
    atexit(tpsh_repl_tty_restore);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &prev_term);
    sigaction(SIGHUP, &sa, &prev_hup);
    tpsh_repl_tty_enter_run_mode();
  }
  tpsh_repl_edit_open(history_file);
  return 1;
}
