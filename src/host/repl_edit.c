/*
 * repl_edit.c: rank 0's line editing: libedit (reading from the input queue instead of its terminal) or,
 * without it, a minimal editor, and the history file.
 */
#include "host/repl_internal.h"
#include "tpsh.h"
#include <fcntl.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>
#ifdef TPSH_WITH_LIBEDIT
#include <histedit.h>
#endif

enum { HISTORY_LINE_MAX = 65536 };    /* longer lines (pastes) stay out of the history file */

static char history_path[4096];
static int line_interrupted;
static char *line_buf;                /* the last line handed out, owned here */

#ifdef TPSH_WITH_LIBEDIT
static EditLine *el;
static History *hist;
static const char *cur_prompt = "";

static char *prompt_fn(EditLine *e) { (void)e; return (char *)cur_prompt; }

/* libedit asks for characters here instead of reading its terminal: they come from the queue. */
static int getc_fn(EditLine *e, wchar_t *wc) {
  const LineInfo *li = el_line(e);
  size_t edited = li ? (size_t)(li->lastchar - li->buffer) : 0;
  if (li && tpsh_repl_long_starts(edited)) {
    tpsh_repl_long_read(li->buffer, (size_t)(li->cursor - li->buffer), li->cursor,
                        (size_t)(li->lastchar - li->cursor));
    *wc = '\n';                 /* the editor's line ends; readline takes the one read past it */
    return 1;
  }
  mbstate_t st;
  memset(&st, 0, sizeof st);
  for (;;) {
    int c = tpsh_repl_inq_pop();
    if (c < 0) return 0;
    char ch = (char)c;
    size_t r = mbrtowc(wc, &ch, 1, &st);
    if (r == (size_t)-2) continue;                              /* more bytes of a UTF-8 sequence */
    if (r == (size_t)-1) { memset(&st, 0, sizeof st); *wc = (wchar_t)(unsigned char)ch; }
    return 1;
  }
}

static unsigned char interrupt_fn(EditLine *e, int ch) {
  (void)e; (void)ch;
  line_interrupted = 1;
  return CC_NEWLINE;
}
#endif

#ifdef TPSH_WITH_LIBEDIT
/* ---- the history file ---- */
/* Never read or written through a symbolic link (a link planted at the history's name would have its
 * target rewritten and made mode 0600), and never replaced when it cannot be read (a file not in
 * libedit's format would be lost): kept aside under another name, a new history begun. Saved to a
 * temporary file beside it (mode 0600, created exclusively) and renamed over it, so that a crash or a
 * full disk mid-write leaves the last whole history. On any refusal the session goes on without it. */
static void history_off(const char *why) {
  tpsh_repl_say("tpsh: the history file %s %s; this session's history is not saved\r\n", history_path, why);
  history_path[0] = 0;
}

static void history_open(HistEvent *ev) {
  struct stat st;
  if (lstat(history_path, &st) != 0) return;                   /* none yet: made at the first save */
  if (S_ISLNK(st.st_mode)) {
    history_off("is a symbolic link, which tpsh neither follows nor replaces (TPSH_HISTORY may name the "
                "file it points to)");
    return;
  }
  if (!S_ISREG(st.st_mode)) { history_off("is not a regular file"); return; }
  if (history(hist, ev, H_LOAD, history_path) >= 0) return;
  char aside[sizeof history_path + 32];
  for (int k = 0; k < 100; k++) {
    if (k == 0) snprintf(aside, sizeof aside, "%s.unreadable", history_path);
    else snprintf(aside, sizeof aside, "%s.unreadable.%d", history_path, k);
    if (lstat(aside, &st) == 0) continue;
    if (rename(history_path, aside) != 0) break;
    tpsh_repl_say("tpsh: the history file %s could not be read (not in libedit's format?): kept as %s, and a new one "
        "begun\r\n", history_path, aside);
    return;
  }
  history_off("could not be read (not in libedit's format?) nor moved aside");
}

static void history_save(void) {
  HistEvent ev;
  char tmp[sizeof history_path + 64];
  snprintf(tmp, sizeof tmp, "%s.tpsh-%d.tmp", history_path, (int)getpid());
  unlink(tmp);                                                   /* a temporary of ours left by a crash */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;
  FILE *f = fdopen(fd, "w");
  if (!f) { close(fd); unlink(tmp); return; }
  int ok = history(hist, &ev, H_SAVE_FP, f) >= 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, history_path) != 0) unlink(tmp);
}
#endif

/* 1: *line is the next line (no newline); 0: end of input; 2: Ctrl-C discarded the line. */
int tpsh_repl_readline(const char *prompt, const char **line) {
  line_interrupted = 0;
  free(line_buf);
  line_buf = NULL;
#ifdef TPSH_WITH_LIBEDIT
  cur_prompt = prompt;
  el_resize(el);                      /* SIGWINCH goes to the launcher, not to us: ask each time */
  int n = 0;
  const char *s = el_gets(el, &n);
  tpsh_repl_tty_enter_run_mode();     /* libedit sets its "cooked" mode (ours: edit_open) on return */
  if (tpsh_repl_long_pending()) {
    int rc = tpsh_repl_long_done(&line_buf);
    if (rc != 1) return rc;
    *line = line_buf;
    return 1;
  }
  if (line_interrupted) { tpsh_repl_write("^C\n", 3); return 2; }
  if (!s || n <= 0) { tpsh_repl_write("\n", 1); return 0; }
  line_buf = strndup(s, (size_t)n);
#else
  /* Without libedit: a minimal editor (echo, backspace, Ctrl-C, Ctrl-D), since the terminal is raw. */
  tpsh_repl_write(prompt, (int64_t)strlen(prompt));
  size_t cap = 256, len = 0;
  line_buf = malloc(cap);
  for (;;) {
    if (tpsh_repl_long_starts(len)) {
      tpsh_repl_long_read(line_buf, len, "", 0);
      free(line_buf);
      line_buf = NULL;
      tpsh_repl_write("\n", 1);
      int rc = tpsh_repl_long_done(&line_buf);
      if (rc != 1) return rc;
      *line = line_buf;
      return 1;
    }
    int c = tpsh_repl_inq_pop();
    if (c < 0 || (c == 4 && len == 0)) { tpsh_repl_write("\n", 1); free(line_buf); line_buf = NULL; return 0; }
    if (c == 3) { tpsh_repl_write("^C\n", 3); return 2; }
    if (c == '\r' || c == '\n') { tpsh_repl_write("\n", 1); break; }
    if (c == 127 || c == 8) { if (len) { len--; tpsh_repl_write("\b \b", 3); } continue; }
    if (c < 32 && c != '\t') continue;
    if (len + 2 > cap) line_buf = realloc(line_buf, cap *= 2);
    line_buf[len++] = (char)c;
    char ch = (char)c;
    tpsh_repl_write(&ch, 1);
  }
  line_buf[len] = 0;
#endif
  size_t len2 = strlen(line_buf);
  while (len2 && (line_buf[len2 - 1] == '\n' || line_buf[len2 - 1] == '\r')) line_buf[--len2] = 0;
  *line = line_buf;
  return 1;
}

void tpsh_repl_history_add(const char *line) {
#ifdef TPSH_WITH_LIBEDIT
  HistEvent ev;
  if (!hist) return;
  /* A pasted line of megabytes would make the file as large, and be loaded at every start. */
  if (strlen(line) > HISTORY_LINE_MAX) return;
  history(hist, &ev, H_ENTER, line);
  if (history_path[0]) history_save();
#else
  (void)line;
#endif
}

void tpsh_repl_edit_open(const char *history_file) {
  if (history_file) snprintf(history_path, sizeof history_path, "%s", history_file);
#ifdef TPSH_WITH_LIBEDIT
  setlocale(LC_CTYPE, "");            /* UTF-8 input; LC_NUMERIC stays "C" for Lua's number formats */
  FILE *fin = fdopen(dup(tpsh_repl_tty_fd), "r"), *fout = fdopen(dup(tpsh_repl_tty_fd), "w");
  el = el_init_fd("tpsh", fin, fout, fout, tpsh_repl_tty_fd, tpsh_repl_tty_fd, tpsh_repl_tty_fd);
  hist = history_init();
  HistEvent ev;
  history(hist, &ev, H_SETSIZE, 1000);
  history(hist, &ev, H_SETUNIQUE, 1);
  if (history_path[0]) history_open(&ev);
  el_set(el, EL_EDITOR, "emacs");
  el_set(el, EL_HIST, history, hist);
  el_set(el, EL_PROMPT, prompt_fn);
  el_set(el, EL_GETCFN, getc_fn);
  el_set(el, EL_SETTY, "-d", "-isig", NULL);   /* while editing too: Ctrl-C is a key, not a signal */
  /* libedit's "cooked" mode (el_init sets it at once, el_gets on return) is canonical by default. With
   * ICANON on, the kernel keeps at most 4095 bytes of a line that has no newline yet and drops the rest,
   * and the launcher reads nothing before the newline: a paste that arrives then loses bytes (a 20 KB
   * line pasted as the first prompt appears, before libedit's raw mode, on a loaded machine). So cooked
   * is our run mode here; the terminal is never canonical while the REPL owns it. */
  el_set(el, EL_SETTY, "-x", "-icanon", "-echo", "-isig", "-iexten", NULL);
  el_set(el, EL_ADDFN, "tpsh-interrupt", "discard the line", interrupt_fn);
  el_set(el, EL_BIND, "^C", "tpsh-interrupt", NULL);
  el_set(el, EL_BIND, "^R", "em-inc-search-prev", NULL);
  /* These would signal rank 0's own process group (stopping it under the launcher's feet). */
  el_set(el, EL_BIND, "^Z", "ed-insert", NULL);
  el_set(el, EL_BIND, "^\\", "ed-insert", NULL);
  el_source(el, NULL);                /* the user's ~/.editrc */
  tpsh_repl_tty_enter_run_mode();     /* whatever el_init and ~/.editrc set */
#endif
}

void tpsh_repl_edit_close(void) {
#ifdef TPSH_WITH_LIBEDIT
  if (el) { el_end(el); el = NULL; }
  if (hist) { history_end(hist); hist = NULL; }
#endif
}
