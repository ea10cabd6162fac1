/*
 * chaos.h: the hooks of chaos mode (chaos.c): seeded random delays enqueued before stream work, so
 * that a schedule missing a wait shows it as a wrong result (--chaos[=SEED], TPSH_CHAOS, tp.chaos).
 * The hot paths test tpsh_chaos_on and call nothing else when it is 0.
 */
#ifndef TPSH_CHAOS_H
#define TPSH_CHAOS_H

#include "core/internal.h"

extern int tpsh_chaos_on;

/* The kinds of work a delay goes before: they draw with different odds (chaos.c says why). */
enum { TPSH_CHAOS_OP = 0, TPSH_CHAOS_COLLECTIVE = 1 };

/* Draws this rank's next delay for work of `kind` about to be enqueued on s, and enqueues it there
 * (an idle spin) when it is not zero. Host thread only. */
int tpsh_chaos_delay(tpsh_stream *s, int kind);
/* e is recorded on s, and s is about to wait for e: what s is ordered after (chaos.c's quiet window). */
void tpsh_chaos_note_record(tpsh_event *e, const tpsh_stream *s);
void tpsh_chaos_note_wait(tpsh_stream *s, const tpsh_event *e);

#endif /* TPSH_CHAOS_H */
