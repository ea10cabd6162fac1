/*
 * error.c: the thread-local last error.
 *
 * C never raises: a failing call stores a message here and returns a status; the Lua layer reads
 * tpsh_last_error(), prefixes the name of the Lua call and raises. Thread-local so that a worker thread
 * (a CPU stream) failing an op cannot overwrite the message the host thread is about to read.
 */
#include "internal.h"
#include <stdio.h>

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
