/* nap.h: a host thread's wait that costs nearly nothing and still sees its event soon.
 *
 * Waiting for another rank (an MPI request, the REPL's next command) by polling back to back holds a
 * core; with more ranks than cores it takes that core from the rank being waited for. Sleeping between
 * polls, a little longer each time up to a cap, keeps the reply seen within about the cap while an idle
 * wait costs nearly nothing. Used by host_exchange.c (host-side exchanges) and the REPL (host/repl.c,
 * host/repl_interrupt.c); and a plain sleep, for the threads that wait on a clock (the watchdog's,
 * host_ending.c). */
#ifndef TPSH_NAP_H
#define TPSH_NAP_H

#include <time.h>

/* Sleeps ms milliseconds (the watchdog's ticks and deadlines, host_ending.c's waits for the host). */
static inline void tpsh_sleep_ms(int ms) {
  nanosleep(&(struct timespec){ .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L }, NULL);
}

/* Sleeps *us microseconds, then doubles *us, up to cap_us. */
static inline void tpsh_nap(int *us, int cap_us) {
  nanosleep(&(struct timespec){ .tv_nsec = (long)*us * 1000 }, NULL);
  if (*us < cap_us) *us = *us * 2 > cap_us ? cap_us : *us * 2;
}

#endif
