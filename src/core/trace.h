/*
 * trace.h: the trace's hooks (trace.c) as the core's paths that enqueue work or block the host call them.
 * The hot paths test tpsh_trace_on and call nothing else when it is 0 (tracing costs one branch off).
 */
#ifndef TPSH_TRACE_H
#define TPSH_TRACE_H

#include "core/internal.h"

/* op_begin/op_end bracket an enqueue on s with timing events; begin returns a record id, or -1 when
 * tracing is off (op_end ignores -1). collectives_begin is op_begin for a call of be->collectives. */
extern int tpsh_trace_on;
int tpsh_trace_launch(tpsh_stream *s, const tpsh_kargs *k);          /* be->launch, traced */
int tpsh_trace_wait_event(tpsh_stream *s, tpsh_event *e);           /* be->stream_wait_event, traced */
int64_t tpsh_trace_op_begin(tpsh_stream *s, const char *name, int category, double bytes, int64_t seq);
void tpsh_trace_op_end(tpsh_stream *s, int64_t id);
/* Work about to be enqueued on s with no record of its own (a free, an upload): the next op there must
 * start at a marker of its own, not at the previous op's end, which comes before that work. */
void tpsh_trace_untraced(tpsh_stream *s);
int64_t tpsh_trace_collectives_begin(tpsh_stream *s, const tpsh_group *g, int n, const tpsh_coll_args *c);
/* A host block that began at t0 (tpsh_now_ms) and ends now; s: the stream waited for, or NULL. */
void tpsh_trace_host(const char *name, const tpsh_stream *s, double t0);
/* A range of the script (range.c) from t0 to now at depth (0 outermost); note: its args, or NULL. */
void tpsh_trace_range(const char *name, double t0, int depth, int unfinished, const char *note);

#endif /* TPSH_TRACE_H */
