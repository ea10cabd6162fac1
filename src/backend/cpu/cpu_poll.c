/*
 * cpu_poll.c: how long a CPU stream's threads poll before they sleep.
 *
 * A worker that has drained its queue, a host waiting for a stream, and a worker waiting for another
 * stream's point first poll for up to tpsh_cpu_poll_ns, then sleep on a condition variable. Waking a
 * sleeping thread costs the waker a futex call and the woken one the scheduler's wake-up latency, tens of
 * microseconds on a VM's idle CPUs: a host's wait for an op of a microsecond took 44-72 us, and an 8-rank
 * 4 KiB broadcast 9.2 us a call against 4.3 polling (docs/perf.md). MPI's own blocking calls poll too.
 *
 * Polling takes a CPU, so it is on only where each rank of the host has two CPUs, one for its host
 * thread and one for a worker: the rank's affinity mask where mpiexec bound it, else the host's CPUs
 * shared among its ranks. On the 2-core CI machine with 2 ranks a polling worker would take the core that
 * its own host thread or the other rank needs. TPSH_CPU_SPIN_US sets the time (0: never poll).
 */
#define _GNU_SOURCE
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_relax.h"
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { DEFAULT_POLL_US = 50 };

int64_t tpsh_cpu_poll_ns;

/* The default: DEFAULT_POLL_US where this rank has two CPUs to itself, else 0. */
static int64_t default_poll_ns(void) {
  cpu_set_t set;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online < 1 || sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  long mine = CPU_COUNT(&set);
  int ranks = tpsh_rt.local_size > 0 ? tpsh_rt.local_size : 1;
  long share = mine >= online ? online / ranks : mine;     /* bound by mpiexec: the mask is its own */
  return share >= 2 ? (int64_t)DEFAULT_POLL_US * 1000 : 0;
}

void tpsh_cpu_poll_init(void) {
  const char *e = getenv("TPSH_CPU_SPIN_US");           /* checked by the host (main.c) */
  tpsh_cpu_poll_ns = e && *e ? (int64_t)(strtod(e, NULL) * 1000.0) : default_poll_ns();
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A poll does not start on the CPU where the thread it waits for last ran (the scheduler may put the host
 * thread and its worker on one CPU where the ranks have two each and nothing to spare: the poll would
 * hold the other thread off), and yields its CPU every YIELD_NS in case that thread comes there. */
enum { YIELD_NS = 2000 };

int tpsh_cpu_poll(int (*ready)(void *, uint64_t), void *a, uint64_t b, const int *other_cpu) {
  if (tpsh_cpu_poll_ns <= 0) return ready(a, b);
  /* the thread that makes ready true runs on this CPU (or last did): polling would only hold it off */
  if (other_cpu && __atomic_load_n(other_cpu, __ATOMIC_RELAXED) == sched_getcpu()) return ready(a, b);
  int64_t t = now_ns(), until = t + tpsh_cpu_poll_ns, yield_at = t + YIELD_NS;
  for (;;) {
    for (int i = 0; i < 16; i++) {
      if (ready(a, b)) return 1;
      tpsh_cpu_relax();
    }
    t = now_ns();
    if (t >= until) return ready(a, b);
    if (t >= yield_at) {
      sched_yield();
      yield_at = now_ns() + YIELD_NS;
    }
  }
}
