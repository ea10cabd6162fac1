/*
 * host_ending.h: what the core's host waits need of a run that the watchdog or a signal ends while the
 * host is in one (host_ending.c; tpsh.h has the calls of the threads that end it and of the host).
 */
#ifndef TPSH_HOST_ENDING_H
#define TPSH_HOST_ENDING_H

/* Host waits poll from now on, for tpsh_host_ending_ask (stream.c); whether one asks now, and the status
 * (TPSH_EENDED, "what gave way") of a wait that gives way to it. */
void tpsh_interrupt_poll_for_ending(void);
int tpsh_host_ending_asked(void);
int tpsh_host_ending_gave_way(const char *what);

#endif /* TPSH_HOST_ENDING_H */
