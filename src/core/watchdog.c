/*
 * watchdog.c: the collective watchdog of --timeout SEC (TPSH_TIMEOUT; default 600 s, as PyTorch's): its
 * thread, the thread's tick, the timeout, its start and stop.
 *
 * One thread per rank, started by tpsh_init, wakes every 0.5 s. At each tick it answers the questions
 * other ranks' watchdogs have sent (watchdog_ask.c) and a notice that another rank ends the run
 * (watchdog_abort.c); it fires when a collective of the flight recorder has been started but not
 * completed for longer than the timeout, or when the host has been blocked in one wait (synchronize, a
 * read to the host, a host-side exchange, the mismatch check, the backend's collective call) for longer
 * than the timeout (watchdog_timeout.c); and where the host has been blocked for a second, it asks the
 * other ranks and ends the run at once when their answers prove that the wait cannot end
 * (watchdog_peers.c, watchdog_deadlock.c).
 *
 * The watchdog's files, one concern each, share core/watchdog.h:
 *   watchdog.c           the thread, its tick, the timeout, start and stop
 *   watchdog_waits.c     the host's waits, as the host thread marks them and the watchdog reads them
 *   watchdog_status.c    this rank's state as another rank asks for it; two ranks' collectives compared
 *   watchdog_ask.c       the questions and answers between the ranks' watchdogs
 *   watchdog_timeout.c   the report of a collective or a wait past the timeout
 *   watchdog_peers.c     a blocked host's questions: a peer that finished or failed, a mismatch, silence
 *   watchdog_deadlock.c  two ranks' waits that hold each other up
 *   watchdog_abort.c     ending every rank: the report, the others' --trace records, MPI_Abort
 *   watchdog_end.c       the end of a script: the ranks' wait and the comparison of what they issued
 * The questions travel on a communicator of the watchdog's own (a dup of the world made at start), with
 * MPI errors returned, not fatal, so that a dead peer cannot take this thread down before it reports.
 */
#define _GNU_SOURCE
#include "core/watchdog.h"
#include "core/p2p_ledger.h"
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

enum { TICK_MS = 500 };

static double timeout_s = 600;           /* set by the host (tp.check.timeout), read by the watchdog: atomic */
/* core/watchdog.h says what these are */
MPI_Comm tpsh_wd_comm = MPI_COMM_NULL;
MPI_Comm tpsh_wd_end_comm = MPI_COMM_NULL;
volatile int tpsh_wd_at_script_end;
tpsh_flight_entry tpsh_wd_snap[TPSH_FLIGHT_RING];
tpsh_flight_group tpsh_wd_snap_groups[TPSH_FLIGHT_GROUPS];
static pthread_t thread;
static int running, stopping;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

int tpsh_wd_stopping(void) { return __atomic_load_n(&stopping, __ATOMIC_ACQUIRE); }

/* ==== configuration =============================================================================== */
void tpsh_watchdog_set_timeout(double seconds) { if (seconds > 0) __atomic_store(&timeout_s, &seconds, __ATOMIC_RELAXED); }
double tpsh_watchdog_timeout(void) { double v; __atomic_load(&timeout_s, &v, __ATOMIC_RELAXED); return v; }

/* ==== the thread ================================================================================== */
static void *watch(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "tp:watchdog");
  pthread_mutex_lock(&mu);
  while (!stopping) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&cv, &mu, &ts);
    if (stopping) break;
    pthread_mutex_unlock(&mu);
    if (tpsh_wd_comm != MPI_COMM_NULL) {
      tpsh_wd_serve();
      tpsh_wd_serve_end_notice();
    }
    double now = tpsh_now_ms(), limit = tpsh_watchdog_timeout() * 1e3;
    int n = tpsh_flight_snapshot(tpsh_wd_snap, TPSH_FLIGHT_RING, NULL, NULL);
    for (int i = 0; i < n; i++)
      if (tpsh_wd_snap[i].state == TPSH_FLIGHT_STARTED && now - tpsh_wd_snap[i].t_started > limit) {
        tpsh_flight_entry stuck = tpsh_wd_snap[i];
        tpsh_wd_fire_timeout(&stuck, NULL, 0, n);
      }
    if (tpsh_wd_host_waiting()) {
      double since = tpsh_wd_wait_since();
      const char *what = tpsh_wd_wait_what();
      /* A second of grace: a rank stuck in a collective reports first, and it knows the most. */
      if (now - since > limit + 1e3 && !__atomic_load_n(&tpsh_wd_at_script_end, __ATOMIC_ACQUIRE))
        tpsh_wd_fire_timeout(NULL, what ? what : "a wait", (now - since) / 1e3, n);
    }
    double call_since = tpsh_wd_call_tick(now);
    if (call_since > 0 && now - call_since > limit + 1e3)
      tpsh_wd_fire_timeout(NULL, tpsh_wd_call_what, (now - call_since) / 1e3, n);
    tpsh_wd_check_peers(now);
    if (__atomic_load_n(&tpsh_wd_at_script_end, __ATOMIC_ACQUIRE)) tpsh_wd_check_end_silence(now);
    pthread_mutex_lock(&mu);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

int tpsh_watchdog_start(void) {
  const char *env = getenv("TPSH_TIMEOUT");
  if (env && *env && atof(env) > 0) tpsh_watchdog_set_timeout(atof(env));
  if (tpsh_wd_ask_init() != 0) return tpsh_error(TPSH_ENOMEM, "out of host memory for the watchdog");
  if (MPI_Comm_dup(MPI_COMM_WORLD, &tpsh_wd_comm) != MPI_SUCCESS) tpsh_wd_comm = MPI_COMM_NULL;
  else MPI_Comm_set_errhandler(tpsh_wd_comm, MPI_ERRORS_RETURN);
  if (MPI_Comm_dup(MPI_COMM_WORLD, &tpsh_wd_end_comm) != MPI_SUCCESS) tpsh_wd_end_comm = MPI_COMM_NULL;
  else MPI_Comm_set_errhandler(tpsh_wd_end_comm, MPI_ERRORS_RETURN);
  stopping = 0;
  if (pthread_create(&thread, NULL, watch, NULL) != 0)
    return tpsh_error(TPSH_EBACKEND, "could not start the watchdog thread");
  running = 1;
  return TPSH_OK;
}

void tpsh_watchdog_stop(void) {
  if (running) {
    pthread_mutex_lock(&mu);
    __atomic_store_n(&stopping, 1, __ATOMIC_RELEASE);   /* tpsh_wd_ask_others reads it without mu */
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(thread, NULL);
    running = 0;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  int live = !finalized && tpsh_wd_comm != MPI_COMM_NULL;
  if (live) tpsh_wd_end_notice_cancel();     /* no rank ended the run */
  tpsh_wd_ask_stop(live);
  if (live) MPI_Comm_free(&tpsh_wd_comm);
  if (!finalized && tpsh_wd_end_comm != MPI_COMM_NULL) MPI_Comm_free(&tpsh_wd_end_comm);
  tpsh_p2p_ledger_free();          /* after the thread: its answers read the counts */
}
