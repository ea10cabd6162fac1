/*
 * watchdog_abort.c: how the watchdog ends every rank. Its report is said in parts as it goes (outbuf: the
 * whole is kept, for a failed run's --trace records); with --trace it tells every other rank first, so
 * that each writes its own records, and waits for them a bounded time; then the backend's abort hook
 * (ncclCommAbort on CUDA), given 5 s on a thread of its own, and MPI_Abort.
 */
#define _GNU_SOURCE
#include "core/watchdog.h"
#include "core/leakcheck.h"
#include "core/nap.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void (*tpsh_watchdog_abort_hook)(void);

enum { END_WAIT_MS = 4000 };

/* ==== the report =============================================================================== */
void tpsh_wd_out(outbuf *o, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (len < 0) return;
  if (len >= (int)sizeof line) len = sizeof line - 1;
  char prefix[32];
  int pl = snprintf(prefix, sizeof prefix, "[rank %d] ", tpsh_rt.rank);
  size_t need = o->n + (size_t)pl + (size_t)len + 2;
  if (need > o->cap) {
    size_t cap = o->cap ? o->cap : 65536;
    while (cap < need) cap *= 2;
    char *p = realloc(o->p, cap);
    if (!p) return;
    o->p = p;
    o->cap = cap;
  }
  memcpy(o->p + o->n, prefix, (size_t)pl);
  memcpy(o->p + o->n + pl, line, (size_t)len);
  o->n += (size_t)pl + (size_t)len;
  o->p[o->n++] = '\n';
}

void tpsh_wd_flush(outbuf *o) {
  size_t at = o->said;
  while (at < o->n) {
    ssize_t w = write(2, o->p + at, o->n - at);
    if (w <= 0) break;
    at += (size_t)w;
  }
  o->said = o->n;
}

/* Set once the watchdog has decided to end every rank, before the abort hook runs: a wait or a call
 * that the abort sets free must not carry on (with aborted results, or NCCL's "internal error" of an
 * aborted communicator, which would only mislead) while the watchdog is still on its way to MPI_Abort. */
static volatile int ending;

void tpsh_watchdog_hold_if_ending(void) {
  if (!__atomic_load_n(&ending, __ATOMIC_ACQUIRE)) return;
  tpsh_host_ending_hold();              /* the watchdog's MPI_Abort ends this process */
}

static void *run_abort_hook(void *arg) {
  (void)arg;
  tpsh_watchdog_abort_hook();
  return NULL;
}

/* A line the host asks to be said when the watchdog ends the run (tpsh_watchdog_set_ending_note: the
 * --trace file that is then not written, as the host's own ending says), set once, while the watchdog
 * already runs: the text is published by note_set, which the watchdog reads first. */
static char ending_note[600];
static int note_set;
void tpsh_watchdog_set_ending_note(const char *note) {
  if (__atomic_load_n(&note_set, __ATOMIC_ACQUIRE)) return;
  snprintf(ending_note, sizeof ending_note, "%s", note ? note : "");
  __atomic_store_n(&note_set, ending_note[0] != '\0', __ATOMIC_RELEASE);
}
static int have_ending_note(void) { return __atomic_load_n(&note_set, __ATOMIC_ACQUIRE); }

/* o's text without its "[rank R] " prefixes: the report, as a failed run's trace keeps its error. */
static char *unprefixed(const outbuf *o) {
  char *t = malloc(o->n + 1);
  if (!t) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < o->n;) {
    const char *line = o->p + i, *nl = memchr(line, '\n', o->n - i);
    size_t len = nl ? (size_t)(nl - line) + 1 : o->n - i;
    size_t skip = 0;
    if (len > 6 && memcmp(line, "[rank ", 6) == 0) {
      const char *close = memchr(line, ']', len);
      if (close && (size_t)(close - line) + 2 <= len && close[1] == ' ') skip = (size_t)(close - line) + 2;
    }
    memcpy(t + n, line + skip, len - skip);
    n += len - skip;
    i += len;
  }
  while (n > 0 && t[n - 1] == '\n') n--;
  t[n] = '\0';
  return t;
}

/* ==== the other ranks' own --trace records at this rank's end ==================================== */
/* With --trace, a rank that ends the run tells every other rank first (TAG_END: its status and why):
 * each one's watchdog asks its host thread to write its own records, as this rank's does (host_ending.c),
 * and answers twice (TAG_END_DONE): whether its host began (END_BEGAN / END_NOT_COMING), then, where it
 * did, whether it wrote (END_WROTE / END_NOT_WRITTEN). This rank waits for the first answers until
 * END_WAIT_MS after telling (the notice waits for the other's next tick, its host up to 2 s), for a rank
 * that began as long as it may write (30 s more), then ends every rank, naming the ranks that did not
 * answer (a rank whose watchdog is busy ending the run itself answers late or never). */
enum { END_NOT_COMING = 0, END_BEGAN = 1, END_NOT_WRITTEN = 2, END_WROTE = 3, END_WRITE_MS = 30000 };
typedef struct end_notice { int from, status; char why[504]; } end_notice;
static MPI_Request notice_req = MPI_REQUEST_NULL;
static end_notice notice_in;
static int noticed;               /* a notice was served: there is no second */

/* The watchdog's loop: a notice from the rank that ends the run, once. */
void tpsh_wd_serve_end_notice(void) {
  if (!have_ending_note() || noticed) return;
  if (notice_req == MPI_REQUEST_NULL &&
      MPI_Irecv(&notice_in, (int)sizeof notice_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_END, tpsh_wd_comm, &notice_req) !=
          MPI_SUCCESS) {
    notice_req = MPI_REQUEST_NULL;
    return;
  }
  int done = 0;
  if (MPI_Test(&notice_req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) return;
  notice_req = MPI_REQUEST_NULL;
  notice_in.why[sizeof notice_in.why - 1] = '\0';
  noticed = 1;
  static int answers[2];          /* the sends' buffers: never waited for */
  MPI_Request q;
  answers[0] = tpsh_host_ending_request(notice_in.status, notice_in.why) ? END_BEGAN : END_NOT_COMING;
  if (MPI_Isend(&answers[0], 1, MPI_INT, notice_in.from, TAG_END_DONE, tpsh_wd_comm, &q) == MPI_SUCCESS) MPI_Request_free(&q);
  if (answers[0] != END_BEGAN) return;
  answers[1] = tpsh_host_ending_finish() ? END_WROTE : END_NOT_WRITTEN;
  if (MPI_Isend(&answers[1], 1, MPI_INT, notice_in.from, TAG_END_DONE, tpsh_wd_comm, &q) == MPI_SUCCESS) MPI_Request_free(&q);
}

/* Tells every other rank that this one ends the run; returns how many were told. */
static int tell_others_ending(int status, const char *report, double *told_at) {
  int size = tpsh_rt.size, me = tpsh_rt.rank, told = 0;
  if (size < 2 || tpsh_wd_comm == MPI_COMM_NULL) return 0;
  static end_notice n;                  /* outlives the sends, which are never waited for */
  n.from = me;
  n.status = status;
  size_t first = strcspn(report ? report : "", "\n");
  snprintf(n.why, sizeof n.why, "rank %d ended the run (status %d): %.*s", me, status, (int)first,
           report ? report : "");
  for (int r = 0; r < size; r++) {
    MPI_Request q;
    if (r != me && MPI_Isend(&n, (int)sizeof n, MPI_BYTE, r, TAG_END, tpsh_wd_comm, &q) == MPI_SUCCESS) {
      MPI_Request_free(&q);
      told++;
    }
  }
  *told_at = tpsh_now_ms();
  return told;
}

/* Waits for the answers of the told ranks (above), then names those whose records may be missing. */
static void await_others_records(outbuf *o, int told, double told_at) {
  int size = tpsh_rt.size;
  char *seen = told ? calloc((size_t)size, 1) : NULL;      /* per rank: 0 no answer, 1 began, 2 over */
  if (!seen) return;
  int silent = told, writing = 0;
  static int got;
  for (;;) {
    double deadline = told_at + END_WAIT_MS + (writing > 0 ? END_WRITE_MS : 0);
    if ((silent == 0 && writing == 0) || tpsh_now_ms() >= deadline) break;
    MPI_Request q;
    MPI_Status st;
    if (MPI_Irecv(&got, 1, MPI_INT, MPI_ANY_SOURCE, TAG_END_DONE, tpsh_wd_comm, &q) != MPI_SUCCESS) break;
    int done = 0;
    while (MPI_Test(&q, &done, &st) == MPI_SUCCESS && !done && tpsh_now_ms() < deadline) tpsh_sleep_ms(5);
    if (!done && !tpsh_wd_end_receive(&q, &st)) continue;             /* the deadline passed: the loop ends */
    int r = st.MPI_SOURCE;
    if (r < 0 || r >= size) continue;
    if (seen[r] == 0) {
      seen[r] = got == END_BEGAN ? 1 : 2;
      silent--;
      writing += got == END_BEGAN;
    } else if (seen[r] == 1 && got >= END_NOT_WRITTEN) {
      seen[r] = 2;
      writing--;
    }
  }
  char ranks[2][256] = {"", ""};
  for (int r = 0; r < size; r++) {
    int k = seen[r] == 0 && r != tpsh_rt.rank ? 0 : seen[r] == 1 ? 1 : -1;
    size_t at = k >= 0 ? strlen(ranks[k]) : 0;
    if (k >= 0 && at + 16 < sizeof ranks[k]) snprintf(ranks[k] + at, sizeof ranks[k] - at, "%s%d", at ? ", " : "", r);
  }
  if (ranks[0][0])
    tpsh_wd_out(o, "tpsh: no answer from rank(s) %s about their own --trace records within %d s (busy ending the run "
        "themselves, or gone): theirs may be missing", ranks[0], END_WAIT_MS / 1000);
  if (ranks[1][0])
    tpsh_wd_out(o, "tpsh: rank(s) %s still wrote their own --trace records after %d s: theirs may be cut short", ranks[1],
        (END_WAIT_MS + END_WRITE_MS) / 1000);
  free(seen);
}

/* ==== the end ================================================================================== */
/* Prints o and its last line, then ends every rank with status. The backend's abort hook runs first,
 * on a thread of its own, for at most 5 s: ncclCommAbort can block for minutes while the host thread
 * waits in the stuck collective, and this rank must end whatever the hook does. */
void tpsh_wd_end_every_rank(outbuf *o, const char *last, int status) {
  if (have_ending_note()) {
    /* --trace: the host writes this rank's own records up to now if it comes (host_ending.c), saying
     * where; else the note says that the file was not written. The others are asked to write theirs. */
    char *report = unprefixed(o);
    tpsh_wd_flush(o);
    double told_at = 0;
    int told = tell_others_ending(status, report, &told_at);
    int wrote = tpsh_host_ending_ask(status, report);
    free(report);
    if (!wrote) tpsh_wd_out(o, "%s", ending_note);
    await_others_records(o, told, told_at);
  }
  tpsh_wd_out(o, "%s", last);
  char chaos[160];
  if (tpsh_chaos_line(chaos, sizeof chaos)) tpsh_wd_out(o, "%s", chaos);   /* the delays that led here */
  tpsh_wd_flush(o);
  __atomic_store_n(&ending, 1, __ATOMIC_RELEASE);
  tpsh_sleep_ms(300);           /* let mpiexec forward this text before the abort tears its pipes down */
  pthread_t hook;
  if (tpsh_watchdog_abort_hook && pthread_create(&hook, NULL, run_abort_hook, NULL) == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    if (pthread_timedjoin_np(hook, NULL, &ts) != 0) {
      tpsh_wd_out(o, "tpsh watchdog: the backend's abort (ncclCommAbort) has not returned after 5 s: aborting without it");
      tpsh_wd_flush(o);
    }
  }
  tpsh_leakcheck_skip();
  MPI_Abort(MPI_COMM_WORLD, status);
  _exit(status);
}

/* No rank ended the run: the posted receive of a notice ends (cancelled). */
void tpsh_wd_end_notice_cancel(void) {
  if (notice_req != MPI_REQUEST_NULL) tpsh_wd_end_receive(&notice_req, NULL);
}
