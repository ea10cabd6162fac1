/*
 * mpi_ref_loop.h: the C reference's MPI calls and timed loop, shared by the standalone reference
 * (bench_collectives_ref.c, its own process) and libtpsh_mpi_ref.so, which bench_collectives.lua --ref
 * loads on the CPU backend to time the same C loop inside tpsh's process, on the group's communicator
 * (g:handle()) and tpsh's buffers, alternately with tpsh's calls: a comparison that one process's speed
 * against the next one's cannot skew (on the GPU machine's 16 CPUs two C processes in a row differ by
 * up to 2x at a size; docs/perf.md).
 */
#ifndef TPSH_MPI_REF_LOOP_H
#define TPSH_MPI_REF_LOOP_H

#include <mpi.h>

enum { MPI_REF_AG, MPI_REF_AR, MPI_REF_RS, MPI_REF_BC, MPI_REF_A2A, MPI_REF_SR, MPI_REF_NOPS };
extern const char *const mpi_ref_names[MPI_REF_NOPS];

/* One blocking call of op on float buffers, as bench_collectives.lua makes it, with count the whole
 * buffer's elements (the gathered output of all_gather, the input of reduce_scatter): all_reduce (in
 * place), broadcast and send_recv on a, the others from a to b. send_recv pairs the ranks 0-1, 2-3, ...,
 * the even one sending (an odd count leaves the last rank idle). rank and n: this rank in comm, and
 * comm's size. */
void mpi_ref_call(int op, float *a, float *b, long count, MPI_Comm comm, int rank, int n);

/* The library's entry points (ffi.cdef'd by bench_collectives.lua): the op's index by name (-1: none),
 * and iters calls back to back on *comm (the caller runs the barrier before): this rank's ms per call. */
int tpsh_mpi_ref_op(const char *name);
double tpsh_mpi_ref_time(int op, void *a, void *b, long count, const void *comm, int iters);
/* The same loop with each call handed to a thread of its own, one at a time, as a CPU stream's worker is
 * handed tpsh's calls: the host writes a call into a ring slot and goes on to the next, the thread
 * polls the ring, makes the call and publishes its count; the time ends when the thread has made them
 * all. The least a stream thread costs, done in C (both threads poll, yielding now and then, and never
 * sleep: the floor where each rank has two CPUs, as on the GPU machine's 16 at up to 8 ranks): tpsh / this
 * is tpsh's cost beyond the threads-as-streams model. -1 where the thread cannot start. */
double tpsh_mpi_ref_time_thread(int op, void *a, void *b, long count, const void *comm, int iters);

#endif
