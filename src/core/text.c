/*
 * text.c: a text built line by line into a buffer that grows, handed to Lua as one string (the
 * records `tpsh test` and the REPL compare between ranks: group.c's collectives, p2p_ledger.c's sends
 * and receives). Out of memory makes the whole text NULL, which the callers report as such.
 */
#include "core/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void tpsh_text_appendf(tpsh_text *t, const char *fmt, ...) {
  while (!t->failed) {
    if (t->buf) {
      va_list ap;
      va_start(ap, fmt);
      int len = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
      va_end(ap);
      if (len < 0) { t->failed = 1; return; }                 /* an encoding error: nothing to grow for */
      if ((size_t)len < t->cap - t->len) { t->len += (size_t)len; return; }
      t->buf[t->len] = 0;                                     /* the cut piece is written again */
    }
    size_t cap = t->cap ? t->cap * 2 : 256;
    char *b = realloc(t->buf, cap);
    if (!b) { t->failed = 1; return; }
    if (!t->buf) b[0] = 0;
    t->buf = b;
    t->cap = cap;
  }
}

char *tpsh_text_take(tpsh_text *t) {
  if (!t->failed && !t->buf) tpsh_text_appendf(t, "%s", "");       /* nothing appended: "" */
  if (t->failed) { free(t->buf); t->buf = NULL; }
  char *s = t->buf;
  *t = (tpsh_text){0};
  return s;
}
