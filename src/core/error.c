/*
 * error.c: the thread-local last error.
 *
 * C never raises: a failing call stores a message here and returns a status; the Lua layer reads
 * tpsh_last_error(), prefixes the name of the Lua call and raises. Thread-local so that a worker thread
 * (a CPU stream) failing an op cannot overwrite the message the host thread is about to read.
 *
 * An asynchronous error (NCCL's: a communicator failed while its kernels ran) is found by whichever
 * query of the backend asks first, and that is often one the script did not make: the reclaim of Work
 * tickets, the tracer, the parked frees, which ignore the status. Without a record here the error would
 * be lost: the aborted communicator's kernels stop, the stream drains, the Work's event completes, and a
 * later w:block() would return OK over data that never arrived. So the backend notes the error here
 * (tpsh_async_error_note), and every call of the script that waits, asks or orders (w:wait/block/
 * is_completed, stream and event synchronize, query and wait, tp.synchronize, a read to the host)
 * returns it (tpsh_async_error_settle) until Lua has raised it: capi.lua's last_error, the one way a C
 * error becomes a Lua error, tells tpsh_async_error_raised. Clearing it anywhere else would lose it
 * wherever a caller of tpsh's own takes the status and goes on (a fallback that synchronises and ignores
 * the result, w:elapsed's query that reads any answer but 1 as "not yet").
 */
#include "core/internal.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *tpsh_last_error(void) { return last_error; }

static void set_error(const char *fmt, va_list ap) { vsnprintf(last_error, sizeof last_error, fmt, ap); }

int tpsh_error(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_error(fmt, ap);
  va_end(ap);
  return status;
}

/* Host thread only: the backends' host waits and queries find asynchronous errors there, and Lua runs
 * there. */
static int async_pending;
static char async_message[1024];

void tpsh_async_error_note(const char *message) {
  if (async_pending) return;           /* the first error is the cause; later ones follow from it */
  snprintf(async_message, sizeof async_message, "%s", message);
  async_pending = 1;
}

/* A call that failed on its own reports its own error (the noted one, when its own wait found it, or
 * one that followed from it, or a bad argument, the REPL's interrupt); a call that succeeded reports the
 * noted one. */
TPSH_COLD static int async_report(int rc) { return rc ? rc : tpsh_error(TPSH_ECOMM, "%s", async_message); }

TPSH_HOT int tpsh_async_error_settle(int rc) { return __builtin_expect(async_pending, 0) ? async_report(rc) : rc; }

int tpsh_async_error_check(void) { return tpsh_async_error_settle(TPSH_OK); }

/* Lua is about to raise the last error: if it carries the noted one, the script has been told. Another
 * error (another communicator's, a bad argument) leaves it noted. */
void tpsh_async_error_raised(void) {
  if (async_pending && strstr(last_error, async_message)) async_pending = 0;
}

void *tpsh_error_null(int status, const char *fmt, ...) {
  (void)status;
  va_list ap;
  va_start(ap, fmt);
  set_error(fmt, ap);
  va_end(ap);
  return NULL;
}

const char *tpsh_sizes_str(int ndim, const int64_t *sizes, char *buf, size_t n) {
  size_t used = 0;
  used += (size_t)snprintf(buf + used, n - used, "[");
  for (int d = 0; d < ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, d ? ", %lld" : "%lld", (long long)sizes[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

const char *tpsh_shape_str(const tpsh_tensor *t, char *buf, size_t n) {
  return tpsh_sizes_str(t->ndim, t->sizes, buf, n);
}
