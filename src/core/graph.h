/*
 * graph.h: the hooks of tp.graph's capture (core/graph.c), as the files on the enqueue paths call them.
 *
 * While a capture is open (tpsh_graph_capturing), what the script enqueues is handed to the capture
 * instead of (CPU) or besides (CUDA: the backend's streams are capturing) the usual path: each hook is
 * one branch at its call site, on a flag that is 0 outside a capture. Calls that a graph cannot hold (a
 * read to the host, a host wait, a host-side exchange) refuse with tpsh_graph_refuse: TPSH_ECAPTURE,
 * which Lua words as "tp.graph: <call>() <what> during capture ...".
 */
#ifndef TPSH_GRAPH_H
#define TPSH_GRAPH_H

#include "core/internal.h"

/* 1 while a capture is open (host thread only; read by group.lua too, to give Works events of their own). */
extern int tpsh_graph_capturing;

/* tpsh_graph_refuse (tpsh.h): TPSH_ECAPTURE, `what` ("reads to the host") is not done during a capture. */

/* The enqueue paths, during a capture: a kernel (ops.c, after the uses are noted), the collectives of one
 * launch (collective.c, numbered at each replay instead), an event record and a cross-stream wait
 * (stream.c). Each checks that s is part of the capture, records the op, and on a backend that captures
 * natively enqueues it too. */
int tpsh_graph_launch(tpsh_stream *s, const tpsh_kargs *k);
int tpsh_graph_collectives(tpsh_stream *s, tpsh_group *g, int n, const tpsh_coll_args *c, int nheld,
                           tpsh_storage *const *held, int ndesc, const tpsh_tensor *desc);
int tpsh_graph_event_record(tpsh_event *e, tpsh_stream *s);
int tpsh_graph_wait_event(tpsh_stream *s, tpsh_event *e);
/* An event last recorded during a capture stands for a point inside a graph, which no stream outside
 * the graph can wait for nor the host ask about: TPSH_ECAPTURE naming `call`, else TPSH_OK. */
int tpsh_graph_event_refuse(const char *call) TPSH_COLD;
static inline int tpsh_graph_event_usable(const tpsh_event *e, const char *call) {
  return __builtin_expect(e->captured, 0) && !tpsh_graph_capturing ? tpsh_graph_event_refuse(call) : TPSH_OK;
}

/* collective.c, for a replay: numbers and issues (call 1) or only numbers (call 0: inside the backend's
 * graph launch) the n collectives of one captured launch; tpsh_coll_replay checks them first as a launch
 * outside a graph is checked (check mode), with the descriptors of the tensors the capture kept. */
int tpsh_coll_launch(tpsh_stream *s, tpsh_group *g, int n, tpsh_coll_args *c, int call);
int tpsh_coll_replay(tpsh_stream *s, tpsh_group *g, int n, tpsh_coll_args *c, int ndesc, const tpsh_tensor *desc);

/* Storages. A storage whose last reference goes during a capture and whose memory is not the capture's
 * own is released when the capture ends (releasing it records events on streams, which may be
 * capturing): graph.c keeps it meanwhile (tpsh_graph_defer_release), then hands it to
 * tpsh_storage_release_deferred (tensor.c). A graph holds every storage its ops use (graph_holds, one per
 * graph: tensor.c's hold and drop): the struct lives on while it does, and its memory too unless it is
 * a graph pool's (that goes back to its pool, alloc.c). */
void tpsh_graph_defer_release(tpsh_storage *st);
void tpsh_storage_release_deferred(tpsh_storage *st);
/* A stream whose last reference went during a capture (stream.c): graph.c takes that reference and
 * drops it once the capture ends, since a stream's destruction is not among what a capture may do. */
void tpsh_graph_defer_stream(tpsh_stream *s);
void tpsh_storage_graph_hold(tpsh_storage *st);
void tpsh_storage_graph_drop(tpsh_storage *st);

#endif /* TPSH_GRAPH_H */
