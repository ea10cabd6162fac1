/*
 * stream.h: what stream.c offers the rest of the core beside tpsh.h's calls: the default stream, passive
 * references (holders that never enqueue), and the event pool's drain at shut-down.
 */
#ifndef TPSH_STREAM_H
#define TPSH_STREAM_H

#include "core/internal.h"

tpsh_stream *tpsh_stream_create_default(void);  /* the runtime's default stream */
/* A passive reference: one from a holder that never enqueues work on s (a storage's list of user
 * streams, a lane of Work tickets). Once every reference left is passive, nothing can reach s any more,
 * and tpsh_stream_abandoned tells a holder whether it may let go. */
void tpsh_stream_hold(tpsh_stream *s);
void tpsh_stream_unhold(tpsh_stream *s);
/* Whether every reference left to s is passive: nothing can enqueue on it any more. */
static inline int tpsh_stream_unreachable(const tpsh_stream *s) { return s->refcount == s->passive_refs; }
/* 1 when s is unreachable and its work has finished; 0 otherwise; minus a status when s failed (the
 * failure is then reported, not lost with the stream). Asks the device nothing unless s is unreachable. */
int tpsh_stream_abandoned(tpsh_stream *s);
void tpsh_event_pool_drain(void);               /* destroys the pooled events at shut-down */

#endif /* TPSH_STREAM_H */
