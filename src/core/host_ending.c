/*
 * host_ending.c: the host thread's part of a run that another thread ends (the watchdog, a signal).
 *
 * With --trace FILE, a run that fails on the host writes this rank's own records up to then (main.c's
 * die, tp.trace._save_own). A run that the watchdog or a signal ends is ended by a thread of its own,
 * which must not run Lua: the Lua state is the host thread's, and that thread is most often blocked in
 * the very wait that made the run hang. So the ending thread asks (tpsh_host_ending_ask), and host waits
 * answer: while --trace is on they poll (as for the REPL's Ctrl-C, stream.c), and once asked they
 * return TPSH_EENDED; capi.lua's check takes that status to mean "write your records, say where, and
 * hold" (tpsh_host_ending_begin / _done), never as an error a pcall could catch. The ending thread waits
 * at most BEGIN_MS for the host to begin (a host computing in Lua, or blocked where no wait polls, does
 * not come: the run then ends without those records, saying "was not written") and at most WRITE_MS
 * for the file. Only then does it end every rank, so the records are those of a live process, before
 * ncclCommAbort. A second asker (a signal during the watchdog's end, or the other way round) waits for
 * the first one's outcome rather than end the process under a host that is writing.
 */
#include "core/internal.h"
#include "core/nap.h"
#include "core/host_ending.h"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { BEGIN_MS = 2000, WRITE_MS = 30000 };
enum { IDLE, CLAIMED, ASKED, WRITING, DONE, GAVE_UP };

static int enabled;             /* --trace: written by the host before the run, read by the asker */
static int state;               /* atomic: one of the above */
static int end_status;
static char end_message[8192];  /* written before the state leaves IDLE, read after */

void tpsh_host_ending_enable(void) {
  __atomic_store_n(&enabled, 1, __ATOMIC_RELEASE);
  tpsh_interrupt_poll_for_ending();
}

/* A second asker (the watchdog and a signal may both end the run): waits for the first one's host to
 * begin, or for that asker to give up. 1 if the host began. */
static int await_begin(void) {
  for (int waited = 0; waited <= BEGIN_MS + 100; waited += 10) {
    int st = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (st == WRITING || st == DONE) return 1;
    if (st == GAVE_UP) return 0;
    tpsh_sleep_ms(10);
  }
  return 0;
}

int tpsh_host_ending_request(int status, const char *message) {
  if (!__atomic_load_n(&enabled, __ATOMIC_ACQUIRE)) return 0;
  int idle = IDLE;
  if (!__atomic_compare_exchange_n(&state, &idle, CLAIMED, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return await_begin();
  end_status = status;
  snprintf(end_message, sizeof end_message, "%s", message ? message : "");
  __atomic_store_n(&state, ASKED, __ATOMIC_RELEASE);
  for (int waited = 0; __atomic_load_n(&state, __ATOMIC_ACQUIRE) == ASKED && waited < BEGIN_MS; waited += 10)
    tpsh_sleep_ms(10);
  int asked = ASKED;        /* the host did not come: a late one must not begin while the run ends */
  return !__atomic_compare_exchange_n(&state, &asked, GAVE_UP, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

int tpsh_host_ending_finish(void) {
  for (int waited = 0; __atomic_load_n(&state, __ATOMIC_ACQUIRE) == WRITING && waited < WRITE_MS; waited += 10)
    tpsh_sleep_ms(10);
  return __atomic_load_n(&state, __ATOMIC_ACQUIRE) == DONE;
}

int tpsh_host_ending_ask(int status, const char *message) {
  return tpsh_host_ending_request(status, message) && tpsh_host_ending_finish();
}

int tpsh_host_ending_asked(void) { return __atomic_load_n(&state, __ATOMIC_RELAXED) == ASKED; }

int tpsh_host_ending_gave_way(const char *what) {
  return tpsh_error(TPSH_EENDED, "%s gave way: the run is being ended", what);
}

int tpsh_host_ending_begin(void) {
  int asked = ASKED;
  return __atomic_compare_exchange_n(&state, &asked, WRITING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

int tpsh_host_ending_status(void) { return end_status; }
const char *tpsh_host_ending_message(void) { return end_message; }

void tpsh_host_ending_done(const char *line) {
  if (line && *line) {
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "[rank %d] %s\n", tpsh_rt.rank, line);
    if (n > (int)sizeof buf - 1) { n = (int)sizeof buf - 1; buf[n - 1] = '\n'; }
    fflush(stdout);
    if (n > 0 && write(2, buf, (size_t)n) < 0) { /* nothing left to tell */ }
  }
  __atomic_store_n(&state, DONE, __ATOMIC_RELEASE);
  tpsh_host_ending_hold();
}

void tpsh_host_ending_hold(void) {
  for (;;) tpsh_sleep_ms(1000);        /* the ending thread ends this process */
}
