/*
 * watchdog_waits.c: what the host is blocked in, as the watchdog reads it: the host thread marks each of
 * its waits (what, since when, on which stream or peer; `tpsh test`'s exchange, test and failure), and
 * counts its calls into the backend's collective launch; the watchdog thread reads the marks through the
 * accessors of core/watchdog.h and times the launch at its ticks (tpsh_wd_call_tick).
 */
#include "core/watchdog.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>

volatile uint64_t tpsh_watch_call_count;

/* what, since and on are written by the host while the watchdog may read them (a new wait begins as the
 * watchdog reads the last one's): relaxed atomics, read through the accessors below. */
static const char *wait_what;
static double wait_since;
static volatile int wait_depth;
static volatile uint64_t wait_serial; /* counts outermost waits: tells one wait from the next */
static const void *wait_on;  /* what the outermost wait waits for (tpsh_watch_wait_begin_on), or NULL */
static int wait_peer = -1;  /* the world rank the wait waits for (tpsh_watch_wait_peer), or -1 */
static volatile int in_exchange;      /* the wait is `tpsh test`'s own exchange (never a peer's victim) */
static volatile uint64_t cur_test;    /* `tpsh test`: the test running now (0: none, or a plain script) */
/* The host inside the backend's collective call (tpsh_watch_call_count odd): the count the watchdog saw
 * last and since when (tpsh_now_ms; 0: the host is not inside one). The watchdog thread's only. */
static uint64_t call_seen;
static double call_since;
const char *const tpsh_wd_call_what = "the backend's call that launches a collective (NCCL connects to the "
  "other ranks at a communicator's first collectives, and waits there until they call it too)";
static char my_failure[FAILURE_TEXT];  /* this rank's failure in test my_failure_test (under failure_mu) */
static uint64_t my_failure_test;
static pthread_mutex_t failure_mu = PTHREAD_MUTEX_INITIALIZER;
/* The running step in words (tpsh_watch_step, under failure_mu), which fire_peer's message names: a test
 * that passed on the rank at the exchange is named nowhere else, and the step may be the loading of the
 * spec files, whose describe bodies may issue collectives too. */
static char my_step[STEP_TEXT];

void tpsh_watch_wait_begin(const char *what) { tpsh_watch_wait_begin_on(what, NULL); }

void tpsh_watch_wait_begin_on(const char *what, const void *stream) {
  /* Only the host thread writes these; the time is set before the depth says "waiting", so the
   * watchdog never pairs a new wait with an old start. Nested waits keep the outer one. */
  if (__atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) == 0) {
    double now = tpsh_now_ms();
    __atomic_store_n(&wait_what, what, __ATOMIC_RELAXED);
    const void *key = stream == TPSH_WAIT_ALL_STREAMS ? stream : tpsh_stream_key(stream);
    __atomic_store_n(&wait_on, key, __ATOMIC_RELAXED);
    __atomic_store(&wait_since, &now, __ATOMIC_RELAXED);
    __atomic_store_n(&wait_serial, wait_serial + 1, __ATOMIC_RELEASE);
  }
  __atomic_add_fetch(&wait_depth, 1, __ATOMIC_ACQ_REL);
}

/* Within a wait: the host waits for world rank `rank` now (check mode's send/recv comparison, waiting for
 * its peer's announcement). That wait involves another rank, so that the timeout's report does not call
 * it this rank's own work taking long (a receive waits so for a peer that sends elsewhere). */
void tpsh_watch_wait_peer(int rank) { __atomic_store_n(&wait_peer, rank, __ATOMIC_RELEASE); }

void tpsh_watch_wait_end(void) {
  if (__atomic_sub_fetch(&wait_depth, 1, __ATOMIC_ACQ_REL) == 0) {
    __atomic_store_n(&in_exchange, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&wait_peer, -1, __ATOMIC_RELEASE);
  }
  tpsh_watchdog_hold_if_ending();
}

void tpsh_watch_test(uint64_t test) { __atomic_store_n(&cur_test, test, __ATOMIC_RELEASE); }

void tpsh_watch_step(const char *words) {
  pthread_mutex_lock(&failure_mu);
  snprintf(my_step, sizeof my_step, "%s", words ? words : "");
  pthread_mutex_unlock(&failure_mu);
}

void tpsh_watch_exchange_begin(const char *what, const char *failure) {
  if (failure) {
    pthread_mutex_lock(&failure_mu);
    snprintf(my_failure, sizeof my_failure, "%s", failure);
    my_failure_test = __atomic_load_n(&cur_test, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&failure_mu);
  }
  __atomic_store_n(&in_exchange, 1, __ATOMIC_RELEASE);   /* before the depth says "waiting" */
  tpsh_watch_wait_begin(what);
}

/* ==== the watchdog thread's reads ============================================================== */
int tpsh_wd_host_waiting(void) { return __atomic_load_n(&wait_depth, __ATOMIC_ACQUIRE) > 0; }
uint64_t tpsh_wd_wait_serial(void) { return __atomic_load_n(&wait_serial, __ATOMIC_ACQUIRE); }
const char *tpsh_wd_wait_what(void) { return __atomic_load_n(&wait_what, __ATOMIC_RELAXED); }
double tpsh_wd_wait_since(void) { double v; __atomic_load(&wait_since, &v, __ATOMIC_RELAXED); return v; }
const void *tpsh_wd_wait_on(void) { return __atomic_load_n(&wait_on, __ATOMIC_RELAXED); }
int tpsh_wd_wait_peer(void) { return __atomic_load_n(&wait_peer, __ATOMIC_ACQUIRE); }
int tpsh_wd_in_exchange(void) { return __atomic_load_n(&in_exchange, __ATOMIC_ACQUIRE); }
uint64_t tpsh_wd_test(void) { return __atomic_load_n(&cur_test, __ATOMIC_ACQUIRE); }

int tpsh_wd_failure_of(uint64_t test, char *buf, size_t len) {
  pthread_mutex_lock(&failure_mu);
  int failed = my_failure_test == test;
  if (failed) memcpy(buf, my_failure, len < sizeof my_failure ? len : sizeof my_failure);
  pthread_mutex_unlock(&failure_mu);
  return failed;
}

void tpsh_wd_step(char *buf, size_t len, const char *otherwise) {
  pthread_mutex_lock(&failure_mu);
  snprintf(buf, len, "%s", my_step[0] ? my_step : otherwise);
  pthread_mutex_unlock(&failure_mu);
}

/* The host-side exchange (tp.barrier, tp.allgather, ...) is the flight recorder's to say. */
int64_t tpsh_wd_exchange_now(uint64_t *group) {
  int64_t index = -1;
  if (!(tpsh_wd_host_waiting() && tpsh_flight_host_current(group, &index))) return -1;
  return index;
}

/* The collective that check mode's mismatch check compares is not in the flight ring yet (the check
 * comes before the enqueue): the flight recorder keeps it apart. */
int64_t tpsh_wd_match_now(uint64_t *group, const char **op) {
  int64_t index = -1;
  if (!(tpsh_wd_host_waiting() && tpsh_flight_match_current(group, &index, op))) return -1;
  return index;
}

uint64_t tpsh_wd_call_seen(void) { return call_seen; }
double tpsh_wd_call_since(void) { return call_since; }

double tpsh_wd_call_tick(double now) {
  uint64_t calls = __atomic_load_n(&tpsh_watch_call_count, __ATOMIC_ACQUIRE);
  if (!(calls & 1)) call_since = 0;
  else if (calls != call_seen || call_since == 0) call_seen = calls, call_since = now;
  return call_since;
}
