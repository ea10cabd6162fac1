/*
 * repl_input.c: rank 0's input between the reader thread, which is its only reader (repl_interrupt.c),
 * and the line editor (repl_edit.c): a queue of the bytes read, and long lines (pastes) read past the
 * editor.
 */
#include "host/repl_internal.h"
#include "tpsh.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the input queue: filled by the reader thread, drained by the line editor ---- */
/* It grows as needed, so that nothing typed or pasted is lost, however long the paste and however long
 * the chunk that runs meanwhile (the bytes are type-ahead for the next prompts). Should memory run out,
 * the reader waits for the editor to drain the queue instead of dropping bytes. */
static struct {
  unsigned char *buf;
  size_t cap, head, tail;             /* bytes in buf[head, tail) */
  int eof;
  pthread_mutex_t mu;
  pthread_cond_t cv;                  /* bytes arrived, or room was made */
} inq = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void inq_compact(void) {
  memmove(inq.buf, inq.buf + inq.head, inq.tail - inq.head);
  inq.tail -= inq.head;
  inq.head = 0;
}

void tpsh_repl_inq_push(const unsigned char *b, size_t n, int eof) {
  pthread_mutex_lock(&inq.mu);
  while (n > 0) {
    /* What is left moves to the front only once as much has been read as is left: moved at every push,
     * a long paste that the editor drains byte by byte would be copied once per 512 bytes (quadratic). */
    if (inq.cap - inq.tail < n && inq.head > 0 && inq.head >= inq.tail - inq.head) inq_compact();
    if (inq.cap - inq.tail < n) {
      size_t cap = inq.cap ? inq.cap : 8192;
      while (cap - inq.tail < n) cap *= 2;
      unsigned char *nb = realloc(inq.buf, cap);
      if (nb) { inq.buf = nb; inq.cap = cap; }
      else if (inq.head > 0) inq_compact();
    }
    size_t k = inq.cap - inq.tail < n ? inq.cap - inq.tail : n;
    if (k == 0) {                     /* no memory: wait for the editor to make room, if it can */
      if (inq.head == inq.tail) break;
      pthread_cond_wait(&inq.cv, &inq.mu);
      continue;
    }
    memcpy(inq.buf + inq.tail, b, k);
    inq.tail += k;
    b += k;
    n -= k;
    pthread_cond_broadcast(&inq.cv);
  }
  if (eof) inq.eof = 1;
  pthread_cond_broadcast(&inq.cv);
  pthread_mutex_unlock(&inq.mu);
}

/* Next input byte, or -1 at the end of the input. */
int tpsh_repl_inq_pop(void) {
  pthread_mutex_lock(&inq.mu);
  while (inq.head == inq.tail && !inq.eof) pthread_cond_wait(&inq.cv, &inq.mu);
  int c = -1;
  if (inq.head < inq.tail) {
    c = inq.buf[inq.head++];
    if (inq.head == inq.tail) inq.head = inq.tail = 0;
    pthread_cond_broadcast(&inq.cv);                        /* a reader short of memory may go on */
  }
  pthread_mutex_unlock(&inq.mu);
  return c;
}

/* Bytes queued now. */
static size_t inq_queued(void) {
  pthread_mutex_lock(&inq.mu);
  size_t n = inq.tail - inq.head;
  pthread_mutex_unlock(&inq.mu);
  return n;
}

/* Read without the lock, as the reader thread's poll loop only picks its wait by it. */
int tpsh_repl_inq_ended(void) { return inq.eof; }

/* ---- long lines: read past the line editor ---- */
/* libedit redraws the whole line at every key it inserts, so a pasted line of n bytes costs n redraws of
 * up to n bytes: 10 KB take about 0.5 s, 40 KB 17 s, and at 1 MB the launcher ends the run ("process
 * reading stdin too slowly"). So once a paste is seen (LONG_QUEUED bytes already queued when
 * the editor asks for one, or a line being edited that has grown to LONG_EDITED bytes), the rest of the
 * line is read here straight from the queue, in linear time, and echoed once; the editor is handed a
 * newline and its line is replaced by the whole one. Typing and short type-ahead stay the editor's. A
 * line longer than line_max (TPSH_REPL_LINE_MAX, repl.lua) is read to its end and discarded, with a
 * message: the session goes on. */
enum { LONG_QUEUED = 1024, LONG_EDITED = 4096, LONG_ECHOED = 65536 };
static size_t line_max = (size_t)16 << 20;
enum { LONG_NONE, LONG_LINE, LONG_INTERRUPTED, LONG_TOO_LONG };
static struct { char *buf; size_t len, cap, dropped; int state; } longl;

static void long_put(const char *s, size_t n) {
  if (longl.state == LONG_TOO_LONG || longl.len + n > line_max) {
    longl.state = LONG_TOO_LONG;
    longl.dropped += n;
    return;
  }
  if (longl.len + n + 1 > longl.cap) {
    size_t cap = longl.cap ? longl.cap : 65536;
    while (cap < longl.len + n + 1) cap *= 2;
    char *nb = realloc(longl.buf, cap);
    if (!nb) { longl.state = LONG_TOO_LONG; longl.dropped += n; return; }
    longl.buf = nb;
    longl.cap = cap;
  }
  memcpy(longl.buf + longl.len, s, n);
  longl.len += n;
  longl.buf[longl.len] = 0;
}

/* Reads the rest of a line (to '\r', '\n' or the end of the input) after what the editor holds
 * (before and after its cursor), and echoes what it read; longl.state says how it ended. */
void tpsh_repl_long_read(const char *before, size_t nb, const char *after, size_t na) {
  longl.len = longl.dropped = 0;
  longl.state = LONG_LINE;
  long_put(before, nb);
  size_t from = longl.len;
  char chunk[4096];
  size_t k = 0;
  for (;;) {
    int c = tpsh_repl_inq_pop();
    if (c < 0 || c == '\r' || c == '\n') break;
    if (c == 3) { longl.state = LONG_INTERRUPTED; break; }
    chunk[k++] = (char)c;
    if (k == sizeof chunk) { long_put(chunk, k); k = 0; }
  }
  long_put(chunk, k);
  long_put(after, na);
  if (longl.state != LONG_LINE) return;
  size_t n = longl.len - from;
  const char *p = longl.buf + from;
  if (n <= LONG_ECHOED) { tpsh_repl_write(p, (int64_t)n); return; }
  char mid[96];
  int m = snprintf(mid, sizeof mid, " [... %zu bytes in all ...] ", longl.len);
  tpsh_repl_write(p, 200);
  tpsh_repl_write(mid, m);
  tpsh_repl_write(p + n - 200, 200);
}

void tpsh_repl_set_line_max(int64_t n) { if (n > 0) line_max = (size_t)n; }

int tpsh_repl_long_starts(size_t edited) { return edited >= LONG_EDITED || inq_queued() >= LONG_QUEUED; }

int tpsh_repl_long_pending(void) { return longl.state != LONG_NONE; }

/* The end of a line that tpsh_repl_long_read read: 1 (*line is it), or 2 (discarded, said why). */
int tpsh_repl_long_done(char **line) {
  int state = longl.state;
  longl.state = LONG_NONE;
  if (state == LONG_INTERRUPTED) { tpsh_repl_write("^C\n", 3); return 2; }
  if (state == LONG_TOO_LONG) {
    tpsh_repl_say("tpsh: a line of %zu bytes was discarded: longer than %zu bytes (TPSH_REPL_LINE_MAX); run a "
                  "longer chunk from a file (dofile)\r\n", longl.len + longl.dropped, line_max);
    return 2;
  }
  char *s = *line = malloc(longl.len + 1);
  if (!s) { tpsh_repl_say("tpsh: out of host memory for a line of %zu bytes; discarded\r\n", longl.len); return 2; }
  memcpy(s, longl.buf ? longl.buf : "", longl.len);
  s[longl.len] = 0;
  if (longl.cap > 1 << 20) { free(longl.buf); longl.buf = NULL; longl.cap = 0; }   /* keep no megabytes */
  return 1;
}
