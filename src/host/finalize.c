/*
 * finalize.c: MPI_Finalize with a bound on how long it may take.
 *
 * MPICH's MPI_Finalize over UCX can deadlock: one rank blocks in the PMI barrier, which does not
 * progress UCX, while another still waits in UCX for that rank to complete their disconnect (one rank in
 * ucp_worker_progress and another in read(), both under PMPI_Finalize; openucx/ucx#2254 and
 * flux-framework/flux-core#5460 describe the race).
 * By then everything tpsh had to do is done, its output flushed and its exit status agreed by every
 * rank, so a finalize that has not returned after TPSH_FINALIZE_TIMEOUT seconds (default 30) ends the
 * process with that status, saying so on stderr: a hang would leave mpiexec, and whoever waits for it,
 * waiting forever. The clock starts after a barrier, once every rank has finished its work: a rank
 * that is still busy is never cut off by another's guard (when one rank exits inside finalize, mpiexec
 * ends the others).
 */
#define _GNU_SOURCE
#include "host/finalize.h"
#include <errno.h>
#include <mpi.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int guard_rank, guard_code;
static double guard_seconds = 30;
static int pmi_fd = -1;                 /* the launcher's PMI-1 socket (hydra's PMI_FD), or -1 */
static dev_t pmi_dev;                   /* ... and its identity, to know it is still that socket */
static ino_t pmi_ino;

/* Tells the launcher that this process has finished, as MPI_Finalize's last step does ("cmd=finalize",
 * answered by "cmd=finalize_ack"), before the guard exits. Without it hydra's proxy sees the PMI socket
 * close without a finalize, takes the process for a failed one and, depending on which it handles
 * first (the socket's close or the process's exit), reports status 1 for a run that had succeeded
 * (printed as "EXIT CODE: 1 ... Hangup (signal 1)": the raw status read as a signal). It waits for the
 * answer (up to 2 s): the proxy writes it at once and would take a closed socket for an error. Where
 * the main thread is itself blocked reading that socket (in PMI's barrier), it may take the answer;
 * the wait then ends by its deadline. Only async-signal-safe calls. */
static void pmi_finalize(void) {
  if (pmi_fd < 0) return;
  /* MPICH closes the socket at the end of its own PMI finalize (a hang after that point has nothing
   * to tell the proxy), and the number may have been reused since: only that very socket is written
   * to, and without SIGPIPE should the proxy have closed its end. */
  struct stat st;
  if (fstat(pmi_fd, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_dev != pmi_dev || st.st_ino != pmi_ino) return;
  static const char cmd[] = "cmd=finalize\n";
  if (send(pmi_fd, cmd, sizeof cmd - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof cmd - 1)) return;
  struct pollfd p = {pmi_fd, POLLIN, 0};
  if (poll(&p, 1, 2000) > 0) {
    char ack[64];
    if (read(pmi_fd, ack, sizeof ack) < 0) { /* the answer or the end: either way, done */ }
  }
}

static void *guard(void *arg) {
  (void)arg;
  struct timespec left = {(time_t)guard_seconds, (long)((guard_seconds - (double)(time_t)guard_seconds) * 1e9)};
  while (nanosleep(&left, &left) == -1 && errno == EINTR) {}
  /* Only async-signal-safe calls from here: the main thread is somewhere inside MPI. */
  char msg[200];
  int len = snprintf(msg, sizeof msg, "[rank %d] tpsh: MPI_Finalize has not returned after %g s (a known "
                     "MPICH/UCX shut-down race); exiting with status %d\n", guard_rank, guard_seconds, guard_code);
  if (len > 0 && write(STDERR_FILENO, msg, (size_t)len) < 0) { /* nothing left to tell */ }
  pmi_finalize();
  _exit(guard_code);
}

/* Hydra's simple PMI (version 1, its default): the socket's number is in PMI_FD. PMI-2 speaks another
 * wire format, and other launchers (PMIx, Slurm's PMI-2) have no PMI_FD: nothing is sent there. */
static int find_pmi_fd(void) {
  const char *fd = getenv("PMI_FD"), *version = getenv("PMI_VERSION");
  if (!fd || !*fd || (version && *version && strcmp(version, "1") != 0)) return -1;
  char *end;
  long v = strtol(fd, &end, 10);
  struct stat st;
  if (*end || v < 0 || v > 1 << 20 || fstat((int)v, &st) != 0 || !S_ISSOCK(st.st_mode)) return -1;
  pmi_dev = st.st_dev;
  pmi_ino = st.st_ino;
  return (int)v;
}

void tpsh_finalize_bounded(int rank, int code) {
  guard_rank = rank;
  guard_code = code;
  const char *env = getenv("TPSH_FINALIZE_TIMEOUT");
  if (env && *env) {
    char *end;
    double v = strtod(env, &end);
    if (*end == 0 && v > 0) guard_seconds = v;
  }
  pmi_fd = find_pmi_fd();
  fflush(NULL);                          /* _exit would drop what stdio still buffers */
  MPI_Barrier(MPI_COMM_WORLD);
  /* (hydra's status 1 for a process gone without PMI's finalize reads like a death by SIGHUP after both
   * guards have said "exiting with status 0"; see pmi_finalize. No hang-up is sent.) */
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  /* Should the thread not start, finalize runs unbounded, as it would without this file. */
  (void)pthread_create(&t, &attr, guard, NULL);
  pthread_attr_destroy(&attr);
  MPI_Finalize();
}
