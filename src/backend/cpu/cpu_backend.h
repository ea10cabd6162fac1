/*
 * cpu_backend.h: what the CPU backend's files share: the kernel entry point run by stream workers,
 * a way for the collectives to run a function on a stream's worker, in stream order, and how long
 * the streams' threads poll before they sleep.
 */
#ifndef TPSH_CPU_BACKEND_H
#define TPSH_CPU_BACKEND_H

#include "core/backend.h"

/* Runs one op synchronously on the calling thread (cpu_kernels.c). */
int tpsh_cpu_kernel_run(const tpsh_kargs *k);

/* Enqueues fn(arg) on s; free_arg(arg) runs after it (NULL: nothing). A non-zero return of fn becomes
 * the stream's sticky error, reported at the next host wait, with tpsh_last_error() of the worker. */
int tpsh_cpu_enqueue_fn(tpsh_stream *s, const char *name, int (*fn)(void *), void *arg,
                        void (*free_arg)(void *));

/* Collectives (cpu_coll.c): the backend's group_init, group_destroy and collectives. */
int tpsh_cpu_group_init(tpsh_group *g);
void tpsh_cpu_coll_init(void);              /* MPI errors returned, not fatal (once) */
void tpsh_cpu_group_destroy(tpsh_group *g);
void *tpsh_cpu_group_handle(tpsh_group *g);
int tpsh_cpu_collectives(tpsh_stream *s, tpsh_group *g, int n, const tpsh_coll_args *c);

/* One-time set-up of BLAS (cpu_blas.c): one OpenBLAS thread per rank unless OPENBLAS_NUM_THREADS says
 * otherwise, since ranks and stream workers already share the cores. */
int tpsh_cpu_kernels_init(void);
const char *tpsh_cpu_blas_version(void);

/* Polling before sleeping (cpu_poll.c): how long, in ns (0: never), set once by tpsh_cpu_poll_init, and
 * the poll: ready(a, b) until it holds (1) or the time is up (ready's last answer); other_cpu (or NULL)
 * the CPU on which the thread that makes ready true last ran. */
extern int64_t tpsh_cpu_poll_ns;
void tpsh_cpu_poll_init(void);
int tpsh_cpu_poll(int (*ready)(void *, uint64_t), void *a, uint64_t b, const int *other_cpu);

#endif
