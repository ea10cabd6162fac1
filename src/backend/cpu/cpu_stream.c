/*
 * cpu_stream.c: the CPU backend's streams, events and memory.
 *
 * A stream is a worker thread draining a FIFO of ops; the host thread enqueues and returns at once, so
 * an overlap schedule behaves on a laptop as on a GPU: ops of one stream run in order, ops of two
 * streams run concurrently. Every op gets a sequence number; "completed" is the number of the last op
 * the worker finished. An event is a (stream, sequence) pair captured when it is recorded, plus the time
 * at which the worker reached it (its marker op, or the end of the op before it where that one was still
 * queued at the record), so record/wait/query/synchronize/elapsed mean exactly
 * what they mean in CUDA. Errors inside a worker are sticky on the stream and surface, with the op's
 * name, at the next host-side wait on that stream. A stream that waits for a point of another stream
 * at or after a failed op takes that error too: what it runs next may read the failed op's output.
 */
#define _GNU_SOURCE
#include "backend/cpu/cpu_backend.h"
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ==== objects ==================================================================================== */
typedef struct cpu_stream cpu_stream;

typedef struct cpu_event {
  int refcount;                  /* atomic: the tpsh_event and pending marker ops */
  cpu_stream *stream;            /* retained; NULL until recorded; written under event_mu */
  uint64_t seq;                  /* under event_mu */
  double time_ms;                /* when the worker reached the marker (timing events); under event_mu */
  int timing;                    /* created with timing: only such an event's time is ever read */
} cpu_event;

/* (stream, seq, time_ms) of every event: set by the host at each record, stamped by the worker of the
 * record's stream. A marker of an earlier record, on another stream, may still be queued when an event
 * is recorded again (pooled events are reused at once): its sequence number can equal the new one (each
 * stream counts from 1), so the marker checks both, and the check and the stamp are one step against the
 * next record. A leaf lock: nothing else is taken while it is held. */
static pthread_mutex_t event_mu = PTHREAD_MUTEX_INITIALIZER;

/* An op's stamp once the worker has run it: no event can be its end any more. */
static cpu_event stamp_closed;

enum op_kind { OP_KERNEL, OP_FN, OP_MARKER, OP_WAIT, OP_FREE };

typedef struct cpu_op {
  struct cpu_op *next;
  uint64_t seq;
  /* An event recorded right after this op, stamped once it has run: set by the host's record (a
   * compare-and-swap from NULL), closed by the worker once the op has run (an exchange with
   * &stamp_closed), so that a record either lands before the close or sees it, without the lock. */
  cpu_event *stamp;
  int kind;
  const char *name;
  union {
    tpsh_kargs k;
    struct { int (*fn)(void *); void *arg; void (*free_arg)(void *); } fn;
    struct { cpu_event *ev; } marker;
    struct { cpu_stream *other; uint64_t seq; } wait;
    struct { void *ptr; } free;
  } u;
} cpu_op;

/* The fields are grouped by the thread that writes them, each group on cache lines of its own (the
 * struct is allocated 64-byte aligned): the host's enqueue loop and a worker keeping pace with it would
 * otherwise move one line back and forth at every op, for writes the other thread never reads. */
struct cpu_stream {
  /* Shared, under mu: the queue (the host appends; the worker takes all of it at once), the ops run that
   * the worker hands back, and what waiters and the stop ask of the worker. */
  _Alignas(64) pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  cpu_op *head, *tail;
  /* Ops run, for the host to fill again: the worker puts them on `freed` (under mu), the host moves that
   * list to `spare` (its own) when it has none left. A malloc on one thread and a free on another took
   * the allocator's arena lock from both, in turns, once a polling worker kept pace with the host. */
  struct cpu_op *freed;
  /* The lowest sequence number any waiter waits for (UINT64_MAX: none): written under mu, read by the
   * worker without it (see announce). The worker wakes the waiters only when it reaches it: a host
   * blocked in a wait behind a collective would otherwise be woken after every op and take a core from
   * the transfer it is waiting for. */
  uint64_t wake_at;
  int stop;
  /* The host thread's: */
  _Alignas(64) uint64_t enqueued;  /* written under mu */
  uint64_t completed_seen;       /* completed as room() last read it */
  struct cpu_op *spare;
  /* The op enqueued last, for an event recorded behind it. Never one of the spares while it is the last
   * (the host moves run ops to spare only in an append, which makes the appended op the last), so its
   * memory is an op's whether or not the worker has run it. */
  struct cpu_op *last;
  /* The CPUs on which the host thread last enqueued and the worker last took ops (sched_getcpu): a
   * thread does not poll for the other on the other's CPU (cpu_poll.c). Relaxed atomics, hints only. */
  int host_cpu;
  /* The worker's: the last op it completed (atomic; read by waits and queries without mu) */
  _Alignas(64) uint64_t completed;
  int worker_cpu;
  /* Read mostly: */
  _Alignas(64) int refcount;     /* atomic: the tpsh_stream, events recorded on it, waits on it */
  pthread_t thread;
  int priority;
  int status;                    /* sticky error, under mu */
  uint64_t error_seq;            /* the op that set it, under mu */
  uint64_t error_id;             /* which failure it is (error_ids), under mu */
  /* A failure taken from another stream by a wait (see OP_WAIT): where from (a reference held, until
   * it is reported), and which failure was taken last (kept after it is reported: a later wait on the
   * same stream must not pass the same failure on again). Under mu. */
  struct cpu_stream *inherited_from;
  uint64_t seen_id;
  char error[768];
  char name[TPSH_STREAM_NAME_MAX + 1];
};

static void stream_ref(cpu_stream *s) { __atomic_add_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL); }

static void free_ops(struct cpu_op *op) {
  while (op) {
    struct cpu_op *next = op->next;
    free(op);
    op = next;
  }
}

static void stream_unref(cpu_stream *s) {
  if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  free_ops(s->freed);
  free_ops(s->spare);
  if (s->inherited_from) stream_unref(s->inherited_from);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv_work);
  pthread_cond_destroy(&s->cv_done);
  free(s);
}

static void event_ref(cpu_event *e) { __atomic_add_fetch(&e->refcount, 1, __ATOMIC_ACQ_REL); }

static void event_unref(cpu_event *e) {
  if (__atomic_sub_fetch(&e->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  if (e->stream) stream_unref(e->stream);
  free(e);
}

static uint64_t completed_of(const cpu_stream *s) { return __atomic_load_n(&s->completed, __ATOMIC_ACQUIRE); }

static int reached(void *s, uint64_t seq) {
  return completed_of(s) >= seq;
}

/* With s->mu held: polls (cpu_poll.c) for s to complete op seq, the lock let go meanwhile. */
static void poll_seq(cpu_stream *s, uint64_t seq) {
  if (tpsh_cpu_poll_ns <= 0 || completed_of(s) >= seq) return;
  pthread_mutex_unlock(&s->mu);
  tpsh_cpu_poll(reached, s, seq, &s->worker_cpu);
  pthread_mutex_lock(&s->mu);
}

/* With s->mu held: asks the worker to wake the waiters once it has completed op seq, then says whether
 * it is still to come (the waiter then sleeps on cv_done, letting mu go). The worker publishes completed
 * before it reads wake_at, without mu, and the waiter announces before it reads completed: with both
 * sequentially consistent, one of the two sees the other's store, so no wake-up is lost. (A worker that
 * sees the announcement takes mu to wake, which the waiter holds until it sleeps.) */
static int announce(cpu_stream *s, uint64_t seq) {
  if (seq < s->wake_at) __atomic_store_n(&s->wake_at, seq, __ATOMIC_SEQ_CST);
  return __atomic_load_n(&s->completed, __ATOMIC_SEQ_CST) < seq;
}

/* Waits, with s->mu held, until s has completed op seq. */
static void wait_seq(cpu_stream *s, uint64_t seq) {
  poll_seq(s, seq);
  while (announce(s, seq)) pthread_cond_wait(&s->cv_done, &s->mu);
}

/* A host wait (stream or event synchronize) for op seq, with s->mu held: wait_seq, in rounds of 50 ms
 * while host waits are interruptible (tpsh_interruptible: the REPL), so that a Ctrl-C is seen; then
 * TPSH_EINTR, the op still to come. Workers waiting for each other keep wait_seq. */
static int host_wait_seq(cpu_stream *s, uint64_t seq) {
  if (!tpsh_interrupt_polled) { wait_seq(s, seq); return TPSH_OK; }
  poll_seq(s, seq);
  while (announce(s, seq)) {
    int rc = tpsh_interrupt_check();
    if (rc) return rc;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);       /* the condition variable's clock */
    ts.tv_nsec += 50 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&s->cv_done, &s->mu, &ts);
  }
  return TPSH_OK;
}

/* ==== the worker ================================================================================= */
static uint64_t error_ids;       /* atomic: numbers the failures */

/* from (with its failure's id): the failure was taken from stream `from` by a wait (a reference is
 * taken); NULL: this stream's own. */
static void set_sticky(cpu_stream *s, uint64_t seq, int status, const char *what, const char *msg, cpu_stream *from,
                       uint64_t from_id) {
  pthread_mutex_lock(&s->mu);
  if (s->status == TPSH_OK) {
    s->status = status;
    s->error_seq = seq;
    s->error_id = from ? from_id : __atomic_add_fetch(&error_ids, 1, __ATOMIC_RELAXED);
    /* prefixed with the op's name unless the message begins with it ("all_reduce failed: ...", from
     * cpu_coll.c: "all_reduce: all_reduce failed" said it twice) */
    const char *name = what ? what : "op";
    size_t k = strlen(name);
    if (strncmp(msg, name, k) == 0 && (msg[k] == ' ' || msg[k] == ':')) snprintf(s->error, sizeof s->error, "%s", msg);
    else snprintf(s->error, sizeof s->error, "%s: %s", name, msg);
    if (from) {
      stream_ref(from);
      if (s->inherited_from) stream_unref(s->inherited_from);
      s->inherited_from = from;
      s->seen_id = from_id;
    }
  }
  pthread_mutex_unlock(&s->mu);
}

/* The worker has reached point seq of s, which event e was recorded at: its time, unless e was recorded
 * again since (pooled events are reused at once). Drops the op's reference to e. An event without timing
 * (a Work's end) is complete by the stream's count alone: no clock, no lock. */
static void stamp(cpu_stream *s, cpu_event *e, uint64_t seq) {
  if (!e->timing) { event_unref(e); return; }
  double t = tpsh_now_ms();
  pthread_mutex_lock(&event_mu);
  if (e->stream == s && e->seq == seq) e->time_ms = t;
  pthread_mutex_unlock(&event_mu);
  event_unref(e);
}

static void run_op(cpu_stream *s, cpu_op *op) {
  int rc = TPSH_OK;
  cpu_stream *from = NULL;       /* a failure taken from another stream: which, and its id */
  uint64_t from_id = 0;
  switch (op->kind) {
  case OP_KERNEL:
    rc = tpsh_cpu_kernel_run(&op->u.k);
    break;
  case OP_FN:
    rc = op->u.fn.fn(op->u.fn.arg);
    if (op->u.fn.free_arg) op->u.fn.free_arg(op->u.fn.arg);
    break;
  case OP_MARKER:
    stamp(s, op->u.marker.ev, op->seq);
    break;
  case OP_WAIT: {
    cpu_stream *o = op->u.wait.other;
    pthread_mutex_lock(&o->mu);
    wait_seq(o, op->u.wait.seq);
    /* A failure before the point waited for is this stream's too (as a CUDA error is every stream's): else
     * a host read after w:wait() on a failed async collective would return whatever the buffer holds, and
     * only a wait on the other stream itself would say anything. The other stream keeps its error until
     * this copy is reported (take_error) or its own host wait reports it; a failure already taken once is
     * not taken again by a later wait (seen_id: only this worker writes it, in set_sticky). */
    if (o->status != TPSH_OK && o->error_seq <= op->u.wait.seq &&
        o->error_id != s->seen_id) {
      rc = tpsh_error(o->status, "stream '%s' failed before the point waited for: %s", o->name, o->error);
      from = o;
      from_id = o->error_id;
    }
    pthread_mutex_unlock(&o->mu);
    if (rc != TPSH_OK) set_sticky(s, op->seq, rc, op->name, tpsh_last_error(), from, from_id);
    stream_unref(o);
    return;
  }
  case OP_FREE:
    free(op->u.free.ptr);
    break;
  }
  if (rc != TPSH_OK) set_sticky(s, op->seq, rc, op->name, tpsh_last_error(), NULL, 0);
}

static void set_thread_priority(int priority) {
  /* Linux applies nice values per thread. Raising priority needs privileges: where it is refused the
   * stream still works, at normal priority. */
  int nice_value = priority > 0 ? -5 : priority < 0 ? 5 : 0;
  if (nice_value) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice_value);
}

/* Workers told to stop that have not exited yet: their stacks come back only once they have, and a
 * stream made meanwhile may find no room for its own (cpu_stream_create). */
static pthread_mutex_t stopping_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stopping_cv = PTHREAD_COND_INITIALIZER;
static int stopping;

static void stopping_add(int d) {
  pthread_mutex_lock(&stopping_mu);
  stopping += d;
  if (stopping == 0) pthread_cond_broadcast(&stopping_cv);
  pthread_mutex_unlock(&stopping_mu);
}

/* Waits up to 10 s for every stopping worker to exit (they first drain their queues). */
static void wait_stopping_workers(void) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&stopping_mu);
  while (stopping > 0 && pthread_cond_timedwait(&stopping_cv, &stopping_mu, &until) != ETIMEDOUT) {}
  pthread_mutex_unlock(&stopping_mu);
}

/* Work queued, or a stop asked for: what an idle worker polls for before it sleeps. head and stop are
 * written under mu, atomically, for this read without it. */
static int has_work(void *s, uint64_t unused) {
  (void)unused;
  cpu_stream *c = s;
  return __atomic_load_n(&c->head, __ATOMIC_RELAXED) || __atomic_load_n(&c->stop, __ATOMIC_RELAXED);
}

/* The worker has completed op seq: published for waits and queries; the waiters woken if one waits
 * for it (announce says why mu is taken only then). */
static void complete(cpu_stream *s, uint64_t seq) {
  __atomic_store_n(&s->completed, seq, __ATOMIC_SEQ_CST);
  if (seq < __atomic_load_n(&s->wake_at, __ATOMIC_SEQ_CST)) return;
  pthread_mutex_lock(&s->mu);
  if (seq >= s->wake_at) {
    s->wake_at = UINT64_MAX;
    pthread_cond_broadcast(&s->cv_done);
  }
  pthread_mutex_unlock(&s->mu);
}

/* The worker takes the whole queue at once and runs it without the lock: the host appends meanwhile
 * to a queue of its own, and the worker takes mu once a batch, not twice an op. */
static void *worker(void *arg) {
  cpu_stream *s = arg;
  set_thread_priority(s->priority);
  char tname[16];
  snprintf(tname, sizeof tname, "tp:%.12s", s->name);   /* the kernel keeps 15 characters */
  pthread_setname_np(pthread_self(), tname);
  cpu_op *ran = NULL, *ran_last = NULL;                  /* the last batch's ops, to hand back */
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (ran) {
      ran_last->next = s->freed;
      s->freed = ran;
      ran = NULL;
    }
    if (!s->head && !s->stop && tpsh_cpu_poll_ns > 0) {
      pthread_mutex_unlock(&s->mu);
      tpsh_cpu_poll(has_work, s, 0, &s->host_cpu);
      pthread_mutex_lock(&s->mu);
    }
    while (!s->head && !s->stop) pthread_cond_wait(&s->cv_work, &s->mu);
    if (!s->head) break;                   /* stop requested and the queue is drained */
    cpu_op *op = s->head;
    __atomic_store_n(&s->head, NULL, __ATOMIC_RELAXED);
    s->tail = NULL;
    if (tpsh_cpu_poll_ns > 0) __atomic_store_n(&s->worker_cpu, sched_getcpu(), __ATOMIC_RELAXED);
    pthread_mutex_unlock(&s->mu);
    ran_last = op;
    while (op) {
      cpu_op *next = op->next;
      run_op(s, op);
      cpu_event *st = __atomic_exchange_n(&op->stamp, &stamp_closed, __ATOMIC_ACQ_REL);
      if (st) stamp(s, st, op->seq);                    /* before its completion is seen */
      complete(s, op->seq);
      op->next = ran;
      ran = op;
      op = next;
    }
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  stream_unref(s);
  stopping_add(-1);
  return NULL;
}

/* ==== enqueue ==================================================================================== */
static cpu_stream *impl(tpsh_stream *s) { return (cpu_stream *)s->impl; }

/* An op for stream s, from its spare ones where it has any (host thread only). */
static cpu_op *op_new(cpu_stream *s, int kind, const char *name) {
  cpu_op *op = s->spare;
  if (op) s->spare = op->next;
  else if (!(op = malloc(sizeof *op))) return tpsh_error_null(TPSH_ENOMEM, "out of host memory");
  op->next = NULL;
  op->stamp = NULL;
  op->kind = kind;
  op->name = name;
  return op;
}

/* Ops a stream holds before the host waits for room, as a GPU's launch queue makes cudaLaunchKernel
 * wait at about a thousand. Without a bound a host that ran ahead of its streams grew the queue, and
 * the memory its ops keep alive (a tensor dropped after use on another stream stays parked until that
 * op has run), until the kernel killed the process. The wait is a watched host wait (a stream stuck in
 * a collective its peer never joins ends at the timeout, named) and an interruptible one (the REPL). */
#define QUEUE_MAX 1024

static int room(tpsh_stream *ts, int interruptible) {
  cpu_stream *s = impl(ts);
  /* enqueued is written by the host thread only, which is this one; completed is read again only when
   * the last reading leaves no room (each reading moves the worker's cache line to the host) */
  if (s->enqueued - s->completed_seen < QUEUE_MAX) return TPSH_OK;
  s->completed_seen = completed_of(s);
  if (s->enqueued - s->completed_seen < QUEUE_MAX) return TPSH_OK;
  /* Named without its stream: the wait is for the older half of the queue only, and the watchdog's rules
   * take a wait on a stream for one on everything enqueued there (a collective queued after the half
   * would be taken for waited for, and a program that completes would be ended as a deadlock). */
  tpsh_watch_wait_begin("a full stream queue (1024 ops pending: the host waits for room, as a GPU's launch "
                        "queue makes it)");
  pthread_mutex_lock(&s->mu);
  uint64_t target = s->enqueued - QUEUE_MAX / 2;             /* half: one wait per 512 ops, not per op */
  int rc = TPSH_OK;
  if (interruptible) rc = host_wait_seq(s, target);
  else wait_seq(s, target);
  pthread_mutex_unlock(&s->mu);
  tpsh_watch_wait_end();
  return rc;
}

/* With s->mu held: puts op (its seq set) at the queue's end and wakes the worker; takes back the ops the
 * worker has run when the host has no spare left. */
static void append_locked(cpu_stream *s, cpu_op *op) {
  if (s->tail) s->tail->next = op; else __atomic_store_n(&s->head, op, __ATOMIC_RELAXED);
  s->tail = op;
  s->last = op;
  if (!s->spare) { s->spare = s->freed; s->freed = NULL; }
  if (tpsh_cpu_poll_ns > 0) __atomic_store_n(&s->host_cpu, sched_getcpu(), __ATOMIC_RELAXED);
  pthread_cond_signal(&s->cv_work);
}

/* Appends op and returns its sequence number. */
static uint64_t enqueue(cpu_stream *s, cpu_op *op) {
  pthread_mutex_lock(&s->mu);
  uint64_t seq = op->seq = ++s->enqueued;
  append_locked(s, op);
  pthread_mutex_unlock(&s->mu);
  return seq;
}

int tpsh_cpu_enqueue_fn(tpsh_stream *s, const char *name, int (*fn)(void *), void *arg,
                        void (*free_arg)(void *)) {
  /* Not interruptible: a collective's sequence number is taken already, and a collective that never
   * enqueues must still pass its turn on (free_colls), which waits for the ones before it anyway. */
  room(s, 0);
  cpu_op *op = op_new(impl(s), OP_FN, name);
  if (!op) { if (free_arg) free_arg(arg); return TPSH_ENOMEM; }
  op->u.fn.fn = fn;
  op->u.fn.arg = arg;
  op->u.fn.free_arg = free_arg;
  enqueue(impl(s), op);
  return TPSH_OK;
}

/* ==== backend: memory ============================================================================ */
static double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

/* A /proc/meminfo field in bytes, or -1. */
static double meminfo(const char *field) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  double v = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, n) == 0 && line[n] == ':') { v = atof(line + n + 1) * 1024.0; break; }
  fclose(f);
  return v;
}

/* As the CUDA backend's: what was asked for, what this rank's tensors hold (the core's count; the
 * garbage collector has run and stream-ordered frees have been waited for by then), and what the
 * machine has left, to tell a leak from a machine that is simply too small. */
static void *oom(size_t nbytes) {
  double avail = meminfo("MemAvailable"), total = meminfo("MemTotal");
  char machine[96] = "";
  if (avail >= 0 && total > 0)
    snprintf(machine, sizeof machine, "; the machine has %.3f GiB available of %.3f GiB", gib(avail), gib(total));
  return tpsh_error_null(TPSH_ENOMEM, "out of host memory on rank %d: cannot allocate %zu bytes (%.3f GiB); "
                         "this rank's tensors hold %.3f GiB%s", tpsh_rt.rank, nbytes, gib((double)nbytes),
                         gib(tpsh_alloc_stats_get()->bytes_live), machine);
}

/* Tensors of 2 MiB and more sit on transparent huge pages where the kernel allows them (its setting
 * "madvise" or "always"), as PyTorch's CPU allocator does (THP_MEM_ALLOC_ENABLE). glibc serves such
 * sizes with fresh mmaps, and each of their 4 KiB pages is faulted in at its first write: on the build
 * VM a fault takes ~15 us, so `x + 1` on 16 MiB would cost 200-340 ms against 8 ms for x:add_(1) in
 * place (docs/perf.md, "Allocation"). One fault per 2 MiB instead: the kernel zeroes the huge page at
 * memory speed. The advice is a hint: where it is refused the pages are ordinary ones. */
enum { HUGE_PAGE = 2 << 20 };

static void *cpu_alloc(size_t nbytes, tpsh_stream *s) {
  (void)s;
  void *p = NULL;
  /* 64-byte alignment: cache lines, and what AVX-512 loads like; a huge page's for the large ones. */
  int huge = nbytes >= HUGE_PAGE;
  if (posix_memalign(&p, huge ? HUGE_PAGE : 64, nbytes) != 0) return oom(nbytes);
  if (huge) madvise(p, nbytes / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);   /* whole huge pages only */
  return p;
}

static int cpu_free_async(void *ptr, size_t nbytes, tpsh_stream *s) {
  (void)nbytes;
  cpu_op *op = op_new(impl(s), OP_FREE, "free");
  if (!op) {                 /* cannot order the free: wait for the stream, then free */
    if (tpsh_stream_synchronize(s) == TPSH_OK) free(ptr);   /* (a wait cut short: left to the process) */
    return TPSH_OK;
  }
  op->u.free.ptr = ptr;
  enqueue(impl(s), op);
  return TPSH_OK;
}

/* Points in a stream's order for the caching allocator: a sequence number, and whether the worker has
 * completed it (enqueued is written by the host thread only, which is the caller). */
static uint64_t cpu_stream_mark(tpsh_stream *ts) { return impl(ts)->enqueued; }
static int cpu_stream_passed(tpsh_stream *ts, uint64_t mark) {
  return completed_of(impl(ts)) >= mark;
}

/* glibc keeps freed small blocks in its arenas: tp.empty_cache hands them back too. */
static void cpu_trim(void) { malloc_trim(0); }

/* ==== backend: streams =========================================================================== */
static int cpu_stream_create(tpsh_stream *ts) {
  cpu_stream *s = aligned_alloc(64, sizeof *s);         /* (its size is a multiple of 64) */
  if (!s) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  memset(s, 0, sizeof *s);
  s->refcount = 2;                       /* the tpsh_stream and the worker */
  s->wake_at = UINT64_MAX;
  s->host_cpu = s->worker_cpu = -1;
  s->priority = ts->priority;
  snprintf(s->name, sizeof s->name, "%s", ts->name);
  /* adaptive: with the threads polling (cpu_poll.c), host and worker take mu within microseconds of each
   * other, and a plain mutex then sleeps in the kernel for a hold of a few stores */
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&s->mu, &attr);
  pthread_mutexattr_destroy(&attr);
  pthread_cond_init(&s->cv_work, NULL);
  pthread_cond_init(&s->cv_done, NULL);
  int e = pthread_create(&s->thread, NULL, worker, s);
  /* Out of threads or of address space for a stack: workers of streams just dropped (tp.stream's retry
   * runs the garbage collector first) are exiting and give theirs back. First every stopping worker
   * exits (hundreds of them, on a loaded machine, can take longer than the 100 ms below alone allow);
   * then the stacks come back within milliseconds. */
  if (e == EAGAIN) wait_stopping_workers();
  for (int tries = 0; e == EAGAIN && tries < 100; tries++) {
    nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
    e = pthread_create(&s->thread, NULL, worker, s);
  }
  if (e) {
    free(s);
    return tpsh_error(TPSH_EBACKEND, "could not start the worker thread of stream '%s': %s", ts->name,
                      strerror(e));
  }
  pthread_detach(s->thread);
  ts->impl = s;
  return TPSH_OK;
}

static void cpu_stream_destroy(tpsh_stream *ts) {
  /* The worker finishes what is queued, then exits: dropping a stream never blocks the host. */
  cpu_stream *s = impl(ts);
  stopping_add(1);                       /* before the worker can see stop, exit and count down */
  pthread_mutex_lock(&s->mu);
  __atomic_store_n(&s->stop, 1, __ATOMIC_RELAXED);
  pthread_cond_signal(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  stream_unref(s);
  ts->impl = NULL;
}

/* Reports and clears the sticky error (s->mu held), so that a REPL session can go on after a failed op.
 * A failure taken from another stream is then reported: that stream's copy is cleared too, or its own
 * next host wait (the end of the script's, at the latest) would report the same failure again.
 * (Lock order: s->mu, then the other's; a worker never holds two.) */
static int take_error(cpu_stream *s) {
  if (s->status == TPSH_OK) return TPSH_OK;
  int rc = tpsh_error(s->status, "on stream '%s': %s", s->name, s->error);
  s->status = TPSH_OK;
  cpu_stream *o = s->inherited_from;
  if (o) {
    s->inherited_from = NULL;
    if (o != s) {
      pthread_mutex_lock(&o->mu);
      if (o->status != TPSH_OK && o->error_id == s->seen_id) o->status = TPSH_OK;
      pthread_mutex_unlock(&o->mu);
    }
    stream_unref(o);
  }
  return rc;
}


static int cpu_stream_synchronize(tpsh_stream *ts) {
  cpu_stream *s = impl(ts);
  pthread_mutex_lock(&s->mu);
  int rc = host_wait_seq(s, s->enqueued);
  if (!rc) rc = take_error(s);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int cpu_stream_query(tpsh_stream *ts) {
  cpu_stream *s = impl(ts);
  pthread_mutex_lock(&s->mu);
  int done = completed_of(s) >= s->enqueued;
  int rc = take_error(s);
  pthread_mutex_unlock(&s->mu);
  return rc ? -rc : done;
}

/* ==== backend: events ============================================================================ */
static int cpu_event_create(tpsh_event *te) {
  cpu_event *e = calloc(1, sizeof *e);
  if (!e) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  e->refcount = 1;
  e->timing = te->timing;
  te->impl = e;
  return TPSH_OK;
}

static void cpu_event_destroy(tpsh_event *te) { event_unref((cpu_event *)te->impl); }

/* Sets the point an event stands for (with a reference on its stream), its time not yet stamped: under
 * event_mu, as a worker's stamp of an earlier record of the same event checks it there. */
static void event_point(cpu_event *e, cpu_stream *s, uint64_t seq) {
  stream_ref(s);
  pthread_mutex_lock(&event_mu);
  cpu_stream *old = e->stream;
  e->stream = s;
  e->seq = seq;
  e->time_ms = 0;
  pthread_mutex_unlock(&event_mu);
  if (old) stream_unref(old);
}

/* An event recorded behind the stream's last op is that op's end: the worker stamps it once the op has
 * run (one op fewer for the worker where a Work records an end event after every collective), or, where
 * the worker has run it already, the stream is idle at that point and the event's time is now (as a
 * GPU's is for a record on an idle stream). Neither takes the stream's lock. Else (no op yet, or the last
 * op is another event's end already) a marker op of its own. */
static int cpu_event_record(tpsh_event *te, tpsh_stream *ts) {
  cpu_event *e = te->impl;
  cpu_stream *s = impl(ts);
  cpu_op *last = s->last;
  if (last) {
    /* the point first, for a stamp that follows the swap at once */
    event_point(e, s, last->seq);
    event_ref(e);                            /* the op's reference, dropped by its stamp */
    cpu_event *expected = NULL;
    if (__atomic_compare_exchange_n(&last->stamp, &expected, e, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return TPSH_OK;
    event_unref(e);
    if (expected == &stamp_closed) {         /* run already: reached now */
      if (e->timing) {
        pthread_mutex_lock(&event_mu);
        e->time_ms = tpsh_now_ms();
        pthread_mutex_unlock(&event_mu);
      }
      return TPSH_OK;
    }
  }
  int rc = room(ts, 1);
  if (rc) return rc;
  cpu_op *op = op_new(s, OP_MARKER, "event");
  if (!op) return TPSH_ENOMEM;
  event_ref(e);
  op->u.marker.ev = e;
  /* The pair (stream, seq) must be set before the worker can reach the point: hold the lock. */
  pthread_mutex_lock(&s->mu);
  op->seq = ++s->enqueued;
  event_point(e, s, op->seq);
  append_locked(s, op);
  pthread_mutex_unlock(&s->mu);
  return TPSH_OK;
}

static int cpu_stream_wait_event(tpsh_stream *ts, tpsh_event *te) {
  cpu_event *e = te->impl;
  if (!e->stream) return TPSH_OK;
  if (e->stream == impl(ts)) return TPSH_OK;         /* a stream is ordered with itself */
  int rc = room(ts, 1);
  if (rc) return rc;
  cpu_op *op = op_new(impl(ts), OP_WAIT, "wait_event");
  if (!op) return TPSH_ENOMEM;
  stream_ref(e->stream);
  op->u.wait.other = e->stream;
  op->u.wait.seq = e->seq;
  enqueue(impl(ts), op);
  return TPSH_OK;
}

static int cpu_event_query(tpsh_event *te) {
  cpu_event *e = te->impl;
  if (!e->stream) return 1;
  return completed_of(e->stream) >= e->seq;
}

static int cpu_event_synchronize(tpsh_event *te) {
  cpu_event *e = te->impl;
  if (!e->stream) return TPSH_OK;
  cpu_stream *s = e->stream;
  pthread_mutex_lock(&s->mu);
  int rc = host_wait_seq(s, e->seq);
  if (!rc) rc = take_error(s);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int cpu_event_elapsed(tpsh_event *ta, tpsh_event *tb, double *ms) {
  cpu_event *a = ta->impl, *b = tb->impl;
  if (!cpu_event_query(ta) || !cpu_event_query(tb))
    return tpsh_error(TPSH_EINVAL, "the events have not completed yet (synchronize first)");
  pthread_mutex_lock(&event_mu);
  *ms = b->time_ms - a->time_ms;
  pthread_mutex_unlock(&event_mu);
  return TPSH_OK;
}

/* ==== backend: kernels and transfers ============================================================= */
static int cpu_launch(tpsh_stream *ts, const tpsh_kargs *k) {
  int rc = room(ts, 1);
  if (rc) return rc;
  cpu_op *op = op_new(impl(ts), OP_KERNEL, k->name);
  if (!op) return TPSH_ENOMEM;
  op->u.k = *k;
  enqueue(impl(ts), op);
  return TPSH_OK;
}

static tpsh_tensor contiguous_like(const tpsh_tensor *t) {
  tpsh_tensor c = *t;
  c.offset = 0;
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) { c.strides[d] = stride; stride *= t->sizes[d] ? t->sizes[d] : 1; }
  return c;
}

static int cpu_to_host(tpsh_stream *ts, const tpsh_kargs *src, void *dst) {
  int rc = cpu_stream_synchronize(ts);
  if (rc) return rc;
  tpsh_kargs k = {.op = TPSH_K_COPY, .nt = 2, .name = "to_host"};
  k.t[0] = contiguous_like(&src->t[0]);
  k.data[0] = dst;
  k.t[1] = src->t[0];
  k.data[1] = src->data[0];
  return tpsh_cpu_kernel_run(&k);
}

typedef struct upload { void *dst, *src; size_t n; } upload;

static int run_upload(void *arg) {
  upload *u = arg;
  memcpy(u->dst, u->src, u->n);
  return TPSH_OK;
}

static int cpu_from_host(tpsh_stream *ts, const tpsh_kargs *k, const void *src) {
  /* Copy the source now (the caller may reuse it) and write it in stream order. */
  size_t n = (size_t)tpsh_tensor_numel(&k->t[0]) * tpsh_tensor_elsize(&k->t[0]);
  upload *u = malloc(sizeof *u + n);
  if (!u) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  u->dst = k->data[0];
  u->src = u + 1;
  u->n = n;
  memcpy(u->src, src, n);
  return tpsh_cpu_enqueue_fn(ts, "from_host", run_upload, u, free);
}

/* ==== backend ==================================================================================== */
static int cpu_init(int device) {
  (void)device;
  tpsh_cpu_poll_init();
  tpsh_cpu_coll_init();
  return tpsh_cpu_kernels_init();
}
static void cpu_shutdown(void) {}
static const char *cpu_versions(void) { return tpsh_cpu_blas_version(); }

const tpsh_backend tpsh_backend_cpu = {
  .name = "cpu",
  .marks_collectives = 1,
  .max_coll_count = INT_MAX,             /* MPI's counts are int (cpu_coll.c) */
  .checks_p2p_dtype = 1,                 /* the send's tag carries its dtype (cpu_coll.c) */
  .init = cpu_init,
  .shutdown = cpu_shutdown,
  .versions = cpu_versions,
  .alloc = cpu_alloc,
  .free_async = cpu_free_async,
  .stream_mark = cpu_stream_mark,
  .stream_passed = cpu_stream_passed,
  .trim = cpu_trim,
  .stream_create = cpu_stream_create,
  .stream_destroy = cpu_stream_destroy,
  .stream_synchronize = cpu_stream_synchronize,
  .stream_query = cpu_stream_query,
  .event_create = cpu_event_create,
  .event_destroy = cpu_event_destroy,
  .event_record = cpu_event_record,
  .stream_wait_event = cpu_stream_wait_event,
  .event_query = cpu_event_query,
  .event_synchronize = cpu_event_synchronize,
  .event_elapsed = cpu_event_elapsed,
  .launch = cpu_launch,
  .to_host = cpu_to_host,
  .from_host = cpu_from_host,
  .group_init = tpsh_cpu_group_init,
  .group_destroy = tpsh_cpu_group_destroy,
  .collectives = tpsh_cpu_collectives,
  .group_handle = tpsh_cpu_group_handle,     /* streams are threads: no stream_handle */
};
