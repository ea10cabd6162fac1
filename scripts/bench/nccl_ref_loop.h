/*
 * nccl_ref_loop.h: the C reference's NCCL calls and timed loop, shared by the standalone reference
 * (nccl_ref.c, its own process) and libtpsh_nccl_ref.so, which bench_collectives.lua --ref loads to
 * time the same C loop inside tpsh's process, on tpsh's communicator, stream and buffers, alternately
 * with its own calls: a comparison that the host speed of one process against the next cannot skew
 * (on the lent GPU machine it differs by up to 2x between processes; docs/perf.md).
 */
#ifndef TPSH_NCCL_REF_LOOP_H
#define TPSH_NCCL_REF_LOOP_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <stddef.h>

enum { NCCL_REF_AG, NCCL_REF_AR, NCCL_REF_RS, NCCL_REF_BC, NCCL_REF_A2A, NCCL_REF_NOPS };
extern const char *const nccl_ref_names[NCCL_REF_NOPS];

/* One call of op as bench_collectives.lua makes it, with count the whole buffer's elements (the
 * gathered output of all_gather, the input of reduce_scatter): all_reduce and broadcast in place on a,
 * the others from a to b; all_to_all as grouped send/recv, as tpsh's CUDA backend issues it. */
ncclResult_t nccl_ref_call(int op, char *a, char *b, long count, size_t es, ncclDataType_t t, int nranks,
                           ncclComm_t comm, cudaStream_t st);

double nccl_ref_now_ms(void);                 /* CLOCK_MONOTONIC in ms */

/* The library's entry points (ffi.cdef'd by bench_collectives.lua). tpsh_nccl_ref_time enqueues iters
 * calls back to back on stream, each followed by an untimed event record when end_event (what a Work's
 * end event costs), then waits for the stream: *ms = host time per call from the first enqueue until
 * the stream is done, *enq_ms = the enqueue loop alone per call. The caller runs the barrier before.
 * Returns 0, or -1 with the failing call in tpsh_nccl_ref_error(). */
int tpsh_nccl_ref_op(const char *name);        /* index of a collective's name, -1 if unknown */
int tpsh_nccl_ref_time(int op, void *a, void *b, long count, int nccl_type, int elsize, int nranks,
                       void *comm, void *stream, int iters, int end_event, double *ms, double *enq_ms);
const char *tpsh_nccl_ref_error(void);

#endif
