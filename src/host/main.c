/*
 * main.c: the tpsh host.
 *
 * Shaped after LuaJIT's luajit.c: main() only initialises MPI and the Lua state; all work runs inside
 * one protected call (pmain), and every error goes through one traceback handler. Arguments are read in
 * two passes: the first collects tpsh's own options (so the backend is known before anything runs), the
 * second runs -e chunks, the script, the test runner or the REPL in order.
 *
 * Failure policy (the reason a researcher can trust a run): an uncaught error on any rank prints
 * "[rank R]" and the traceback, then MPI_Abort ends every rank with a non-zero status. Nothing waits
 * for a rank that is gone.
 */
#define _GNU_SOURCE
#include "tpsh.h"
#include "host/chaos_flag.h"
#include "host/finalize.h"
#include "host/repl.h"
#include "core/leakcheck.h"
#include <fcntl.h>
#include <sys/stat.h>
#include <lauxlib.h>
#include <luajit.h>
#include <lualib.h>
#include <mpi.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static const char *progname = "tpsh";
static int world_rank = 0, world_size = 1;
static const char *trace_path;           /* --trace FILE: gathered at a clean end; after a failure, die writes this rank's own */

/* ==== the Lua state's memory ===================================================================== */
/* Under AddressSanitizer (scripts/ci/sanitize.sh) the Lua state takes its memory from malloc instead of
 * LuaJIT's own allocator, which carves objects out of mmap'd arenas that ASan knows nothing of. Each Lua
 * object (an ffi.new buffer, a string) is then a block with red zones of its own, so C code overrunning
 * a buffer that Lua handed it is caught, and LeakSanitizer scans what Lua holds (else a tensor that only
 * a Lua value refers to reads as leaked). GC64 LuaJIT, the x64 default, accepts any allocator; where
 * lua_newstate refuses one, luaL_newstate is used as in the normal build. */
#ifdef TPSH_ASAN
static void *malloc_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud; (void)osize;
  if (nsize == 0) { free(ptr); return NULL; }
  return realloc(ptr, nsize);
}
/* What luaL_newstate installs (lib_aux.c). */
static int panic(lua_State *L) {
  const char *s = lua_tostring(L, -1);
  fprintf(stderr, "PANIC: unprotected error in call to Lua API (%s)\n", s ? s : "?");
  fflush(stderr);
  return 0;
}
static lua_State *new_lua_state(void) {
  lua_State *L = lua_newstate(malloc_alloc, NULL);
  if (!L) return luaL_newstate();
  lua_atpanic(L, panic);
  return L;
}
#else
static lua_State *new_lua_state(void) { return luaL_newstate(); }
#endif

/* ==== options ==================================================================================== */
typedef struct options {
  const char *backend;      /* --backend or TPSH_BACKEND */
  const char *trace;        /* --trace FILE */
  int check;                /* --check or TPSH_CHECK=1 */
  const char *chaos;        /* --chaos[=SEED] or TPSH_CHAOS: a seed, "random", or NULL (off) */
  double timeout;           /* --timeout SEC or TPSH_TIMEOUT (0: the default) */
  int device;               /* --device N (-1: from the local rank) */
  int interactive;          /* -i */
  int version;              /* -v */
  int test;                 /* tpsh test ... */
  int script;               /* index of the script in argv, 0 if none */
  int rest;                 /* first argv index after tpsh's own options */
  int has_e;                /* -e given */
} options;

static void usage(FILE *f) {
  fprintf(f,
          "usage: %s [options] [script.lua [args...]]\n"
          "       %s test [test options] [paths...]      (see %s test --help)\n"
          "Run a Lua script, or an interactive session, on every MPI rank: mpiexec -n N %s ...\n"
          "Options:\n"
          "  -e chunk        run the string 'chunk'\n"
          "  -i              enter the interactive session after the script\n"
          "  -v, --version   print the versions of tpsh, LuaJIT, MPI, BLAS, CUDA and NCCL\n"
          "  -h, --help      print this text\n"
          "  --backend B     cpu or cuda (default: cuda when a GPU is visible; env TPSH_BACKEND)\n"
          "  --device N      the GPU of this rank (default: the local rank)\n"
          "  --trace FILE    write a Chrome/Perfetto trace of all ranks at exit (.svg: a timeline picture);\n"
          "                  a run that fails, hangs or is signalled: a rank's own records (FILE.rankR)\n"
          "  --check         stream sanitizer: report unordered cross-stream accesses (env TPSH_CHECK=1);\n"
          "                  exit status 66 where reports are left at the end\n"
          "  --timeout SEC   collective watchdog (env TPSH_TIMEOUT; default 600)\n"
          "  --chaos[=SEED]  seeded random delays before stream work and collectives, to expose missing\n"
          "                  waits (a random seed without SEED; a failed run says its seed; env TPSH_CHAOS)\n"
          "  --              stop handling options\n"
          "  -               run standard input as the script\n"
          "Environment: TPSH_COLL_TIMING=1 (every collective's Work can report elapsed()),\n"
          "  TPSH_CPU_COLL_BLOCKING=0 (CPU collectives through MPI_I*), TPSH_NO_MEMORY_CACHING=1 (every free\n"
          "  straight to the backend, for memory checkers), OPENBLAS_NUM_THREADS (default 1),\n"
          "  TPSH_HISTORY (the REPL's history file), TPSH_FINALIZE_TIMEOUT (seconds a finished rank waits in\n"
          "  MPI_Finalize before it exits with its status; default 30), TPSH_CPU_SPIN_US (how long a CPU\n"
          "  stream's threads poll before they sleep; default 50 where a rank has 2 CPUs, else 0).\n"
          "  Documentation: docs/api.md.\n",
          progname, progname, progname, progname);
}

/* --trace FILE: the trace is written over FILE at exit, so a script's name there (`tpsh --trace
 * run.lua`, the file forgotten) would be destroyed after it ran: refuse it before anything runs. An empty
 * name would only fail at exit, after the work. Returns 0 or an error message. */
static const char *bad_trace_file(const char *v) {
  size_t n = strlen(v);
  if (n == 0) return "--trace expects the trace's file name (.json, or .svg for a picture), got an empty one";
  if (n >= 4 && strcasecmp(v + n - 4, ".lua") == 0)
    return "--trace expects the trace's file name (.json, or .svg for a picture), not the script";
  struct stat st;
  if (stat(v, &st) == 0 && S_ISDIR(st.st_mode))
    return "--trace expects the trace's file name (.json, or .svg for a picture), not a directory";
  return NULL;
}

/* A finite number of seconds > 0 (NaN is not), as --timeout and the environment's timeouts take it:
 * "inf" would turn the watchdog off, and a rank could then wait forever. */
static int seconds(const char *v, double *out) {
  char *end;
  *out = strtod(v, &end);
  return *v && !*end && *out > 0 && isfinite(*out);
}

/* The environment's settings, checked as the options are: a misspelt value must not quietly mean the
 * default. Returns NULL, or the message with *name the variable it is about. Unset or empty is the
 * default for each. */
static const char *bad_environment(const char **name) {
  static const struct { const char *name, *values[4], *expect; } switches[] = {
    {"TPSH_CHECK", {"0", "1", "error", "strict"}, "expects 0, 1 or error"},
    {"TPSH_COLL_TIMING", {"0", "1"}, "expects 0 or 1"},
    {"TPSH_CPU_COLL_BLOCKING", {"0", "1"}, "expects 0 or 1"},
    {"TPSH_NO_MEMORY_CACHING", {"0", "1"}, "expects 0 or 1"},
  };
  static const char *const timeouts[] = {"TPSH_TIMEOUT", "TPSH_FINALIZE_TIMEOUT"};
  for (size_t k = 0; k < sizeof switches / sizeof *switches; k++) {
    const char *v = getenv(*name = switches[k].name);
    if (!v || !*v) continue;
    int known = 0;
    for (int j = 0; j < 4 && switches[k].values[j]; j++) known |= strcmp(v, switches[k].values[j]) == 0;
    if (!known) return switches[k].expect;
  }
  for (size_t k = 0; k < sizeof timeouts / sizeof *timeouts; k++) {
    const char *v = getenv(*name = timeouts[k]);
    double s;
    if (v && *v && !seconds(v, &s)) return "expects a finite number of seconds > 0";
  }
  const char *v = getenv(*name = "TPSH_CPU_SPIN_US");     /* backend/cpu/cpu_poll.c */
  if (v && *v) {
    char *end;
    double us = strtod(v, &end);
    if (*end || !(us >= 0 && us <= 1e6)) return "expects a number of microseconds from 0 to 1000000";
  }
  return NULL;
}

/* Returns 0 on success, else an error message, with o->rest the index of the argument it is about
 * (-1: the environment variable *env_name). */
#define FAIL_AT(msg) do { o->rest = i; return msg; } while (0)
static const char *parse_options(int argc, char **argv, options *o, const char **env_name) {
  memset(o, 0, sizeof *o);
  o->device = -1;
  const char *why = bad_environment(env_name);
  if (why) { o->rest = -1; return why; }
  o->backend = getenv("TPSH_BACKEND");
  const char *env = getenv("TPSH_CHECK");
  o->check = env && *env && strcmp(env, "0") != 0;
  env = getenv("TPSH_CHAOS");
  if (env && *env && strcmp(env, "0") != 0) {
    if ((why = tpsh_chaos_flag_bad(env, 1))) { *env_name = "TPSH_CHAOS"; o->rest = -1; return why; }
    o->chaos = env;
  }
  int i = 1;
  env = getenv("TPSH_TIMEOUT");
  if (env && *env) seconds(env, &o->timeout);
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-') {
      if (!o->script && !o->has_e && strcmp(a, "test") == 0) {
        /* the trace is written at a script's end, which a spec run has not: F would never be written,
         * and the run would end 0 without a word */
        if (o->trace) FAIL_AT("--trace FILE is written at the end of a script, not of `tpsh test`: in a spec, "
                              "call tp.trace.start() and tp.trace.save(FILE)");
        o->test = 1;
        i++;
        break;
      }
      o->script = i;
      break;
    }
    if (strcmp(a, "--") == 0) { i++; if (i < argc) o->script = i; break; }
    if (strcmp(a, "-") == 0) { o->script = i; break; }
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { usage(stdout); exit(0); }
    if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) { o->version = 1; continue; }
    if (strcmp(a, "-i") == 0) { o->interactive = 1; continue; }
    if (strcmp(a, "--check") == 0) { o->check = 1; continue; }
    if (strcmp(a, "--chaos") == 0) { o->chaos = "random"; continue; }
    if (strncmp(a, "--chaos=", 8) == 0) {
      if ((why = tpsh_chaos_flag_bad(a + 8, 0))) FAIL_AT(why);
      o->chaos = a + 8;
      continue;
    }
    if (strcmp(a, "-e") == 0 || strcmp(a, "--backend") == 0 || strcmp(a, "--trace") == 0 ||
        strcmp(a, "--timeout") == 0 || strcmp(a, "--device") == 0) {
      if (i + 1 >= argc) FAIL_AT("an option is missing its value");
      const char *v = argv[++i];
      if (strcmp(a, "-e") == 0) o->has_e = 1;
      else if (strcmp(a, "--backend") == 0) {
        if (!*v) FAIL_AT("--backend expects cpu or cuda");
        o->backend = v;
      }
      else if (strcmp(a, "--trace") == 0) {
        const char *why = bad_trace_file(v);
        if (why) FAIL_AT(why);
        o->trace = v;
      } else if (strcmp(a, "--timeout") == 0) {
        if (!seconds(v, &o->timeout)) FAIL_AT("--timeout expects a finite number of seconds > 0");
      } else {
        char *end;
        o->device = (int)strtol(v, &end, 10);
        if (*end || o->device < 0) FAIL_AT("--device expects a device index >= 0");
      }
      continue;
    }
    if (strncmp(a, "--backend=", 10) == 0) {
      if (!a[10]) FAIL_AT("--backend expects cpu or cuda");
      o->backend = a + 10;
      continue;
    }
    if (strncmp(a, "--trace=", 8) == 0) {
      const char *why = bad_trace_file(a + 8);
      if (why) FAIL_AT(why);
      o->trace = a + 8;
      continue;
    }
    FAIL_AT("unrecognised option");
  }
  o->rest = i;
  return NULL;
}
#undef FAIL_AT

/* ==== errors ===================================================================================== */
static int call_tostring(lua_State *L) {
  if (!luaL_callmeta(L, 1, "__tostring")) lua_pushnil(L);
  return 1;
}

static int traceback(lua_State *L) {
  if (!lua_isstring(L, 1)) {     /* a non-string error object: use its __tostring if it has one */
    /* Called protected: an error inside __tostring here would be "error in error handling", and the
     * failure's own message and traceback would be lost. */
    int called = 0;
    if (!lua_isnoneornil(L, 1) && luaL_getmetafield(L, 1, "__tostring")) {
      lua_pop(L, 1);
      lua_pushcfunction(L, call_tostring);
      lua_pushvalue(L, 1);
      called = lua_pcall(L, 1, 1, 0) == 0 ? 1 : -1;
    }
    if (called == 1 && lua_isstring(L, -1)) {
      lua_replace(L, 1);
    } else if (called == -1) {
      const char *why = lua_tostring(L, -1);
      lua_pushfstring(L, "error: a %s value whose __tostring raised an error (%s)", luaL_typename(L, 1),
                      why ? why : "not a string");
      lua_replace(L, 1);
    } else {
      /* Otherwise say what it is: error(nil) or error({}) must still print a line naming the rank
       * before every rank is ended, not a bare "Abort(1)". */
      lua_settop(L, 1);
      if (lua_isnoneornil(L, 1)) lua_pushliteral(L, "error: nil");
      else if (lua_isboolean(L, 1)) lua_pushstring(L, lua_toboolean(L, 1) ? "error: true" : "error: false");
      else lua_pushfstring(L, "error: a %s value (an error object without __tostring)", luaL_typename(L, 1));
      lua_replace(L, 1);
    }
  }
  luaL_traceback(L, L, lua_tostring(L, 1), 1);
  return 1;
}

/* Prints msg with every line prefixed by the rank, so that interleaved output stays readable. */
static void report(const char *msg) {
  fflush(stdout);
  const char *p = msg;
  while (*p) {
    const char *nl = strchr(p, '\n');
    int len = nl ? (int)(nl - p) : (int)strlen(p);
    fprintf(stderr, "[rank %d] %.*s\n", world_rank, len, p);
    p += len + (nl != NULL);
  }
  fflush(stderr);
}

static char failure_text[4096];   /* the last error reported (report_status): the failed trace says it */

/* --trace FILE when the run fails: the trace of all ranks is gathered at a clean end only, and the other
 * ranks are being ended (they may be gone). This rank writes its own records up to now instead
 * (tp.trace._own_line: FILE itself on one rank, else FILE.rankR; it waits for no stream), and the line
 * says where, or why not. L: the running Lua state, NULL before there is one. */
static void own_trace_line(lua_State *L, int status, char *line, size_t cap) {
  snprintf(line, cap, "tpsh: --trace %s was not written: the run ended with status %d", trace_path, status);
  if (!L) return;
  int top = lua_gettop(L);
  if (luaL_loadstring(L, "local m = package.loaded['tpsh.trace'] if m then return m._own_line(...) end") == 0) {
    lua_pushinteger(L, status);
    lua_pushstring(L, failure_text);
    if (lua_pcall(L, 2, 1, 0) == 0 && lua_isstring(L, -1)) snprintf(line, cap, "%s", lua_tostring(L, -1));
  }
  lua_settop(L, top);
}

/* Ends every rank: the failure of one rank must never leave the others waiting in a collective.
 * The shell sees only the status's low 8 bits, so a failure whose low byte is 0 (os.exit(256)) ends
 * with status 1 instead: a failing run must never look like a success. */
static void die(lua_State *L, int status) {
  fflush(stdout);
  if ((status & 0xff) == 0) status = 1;
  if (trace_path) {
    char line[1400];
    own_trace_line(L, status, line, sizeof line);
    report(line);
  }
  tpsh_chaos_flag_say(world_rank);
  fflush(stderr);
  tpsh_leakcheck_skip();
  if (world_size > 1) {
    /* The message is in the pipe to mpiexec, but MPI_Abort at once tears that pipe down before mpiexec
     * has read it (the rank's error is then often lost, whole or cut after a line): give it time, as the
     * watchdog does before its abort. */
    usleep(300 * 1000);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  exit(status);
}

/* ==== signals that end the run =================================================================== */
/* SIGINT (Ctrl-C: mpiexec passes its first one on to every rank), SIGTERM (kill, a scheduler ending the
 * job; mpiexec passes it on too) and SIGHUP end the run with a line that says so and the status
 * 128 + the signal's number, as a shell reports a death by that signal. Left to their default action,
 * the rank would die without a word, and hydra's mpiexec reports status 0 for such a run in many cases:
 * on one rank always (SIGINT and SIGTERM), on 2 and 3 ranks in some runs. The proxy takes a rank whose
 * PMI socket closes without PMI's finalize for a failed one, presets the status of every other rank to 0
 * and kills them; what it reports then depends on which it handles first (an _exit(130) from the handler
 * fares no better). So the rank ends the run as an error does, through MPI_Abort, whose status mpiexec
 * reports as it is, except on one rank when mpiexec itself got the signal: it then reports 0 whatever
 * the rank does (a shell script's `exit 130` too, in some runs), which tpsh cannot change; the line still
 * says what happened. MPI_Abort is no call for a signal handler: the handler posts a semaphore, and a
 * thread of its own writes the line and calls it (MPI_THREAD_MULTIPLE, as the watchdog's thread does).
 * A second signal while that is under way ends the rank at once.
 * Without a launcher (plain `tpsh` on a terminal) the handler writes the line and raises the signal
 * again, so that the shell sees a death by SIGINT and stops a loop around tpsh, as for other programs.
 * The REPL takes SIGINT over during a session (repl_interrupt.c: Ctrl-C interrupts a chunk there) and
 * chains its SIGTERM/SIGHUP to these after restoring the terminal (repl_term.c). */
enum { ENDING_SIGNALS = 3 };
static const int ending_signal[ENDING_SIGNALS] = {SIGINT, SIGTERM, SIGHUP};
/* Made before any signal, the handler only writes them: one per signal for each phase of the --trace
 * file (nothing is said without --trace). The file is written at the end of the script (tp._finish), by
 * rank 0 after the others' part has returned: from then on a rank cannot tell whether the file is not
 * there yet, cut short (opening truncates it; a 60 MB trace takes about 0.5 s to write) or whole, and
 * says which, rather than "was not written" of a file cut short or written whole. */
enum { TRACE_PENDING, TRACE_WRITING, TRACE_PHASES };
/* Beside the phases' lines: the bare line (no note: the host is asked for its own records first) and the
 * note alone, said when it did not write them. */
enum { LINE_BARE = TRACE_PHASES, LINE_UNWRITTEN, ENDING_LINES };
static const char *const signal_names[ENDING_SIGNALS] = {"SIGINT", "SIGTERM", "SIGHUP"};
static char ending_line[ENDING_LINES][ENDING_SIGNALS][700];
static volatile sig_atomic_t trace_phase;
static int under_launcher;
static int ending_thread_made;        /* under a launcher, or with --trace (the host's records) */
static sem_t ending_sem;
/* Who ends this rank: no one yet, the ending thread (a signal came first), or MPI_Finalize (the rank
 * finished first; MPI_Abort is then no longer allowed, and a signal ends this rank alone). A lock-free
 * exchange, so that a rank whose script ends within the thread's 0.3 s does not finish with status 0. */
enum { ENDING_NONE, ENDING_SIGNAL, ENDING_FINALIZE };
static int ending_state;
static volatile sig_atomic_t ending_sig;
static int ending_phase;             /* trace_phase when the signal came (the ending thread's line says it) */

static void write_ending_line(int sig, int phase) {
  const char *line = NULL;
  for (int k = 0; k < ENDING_SIGNALS; k++)
    if (ending_signal[k] == sig) line = ending_line[phase][k];
  if (line && write(STDERR_FILENO, line, strlen(line)) < 0) { /* nothing left to tell */ }
}

/* The handler's own line is said once per process: a signal is blocked only on the thread that
 * handles it, so a second one (GNU timeout sends SIGTERM to its child and then to the child's process
 * group) can run the handler on another thread at the same time, and the line would come out twice. */
static int handler_said;
static void say_ending_line_once(int sig, int phase) {
  if (__atomic_exchange_n(&handler_said, 1, __ATOMIC_SEQ_CST) == 0) write_ending_line(sig, phase);
}

static void on_ending_signal(int sig) {
  if (!ending_thread_made) {
    say_ending_line_once(sig, trace_phase);
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  int none = ENDING_NONE;
  if (__atomic_compare_exchange_n(&ending_state, &none, ENDING_SIGNAL, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    ending_sig = sig;
    /* After the exchange, as finish_script sets the phase before it looks at ending_state: one of the
     * two sees the other (both sequentially consistent), so a line that says "was not written" is
     * never printed while the file is being written. */
    ending_phase = __atomic_load_n(&trace_phase, __ATOMIC_SEQ_CST);
    sem_post(&ending_sem);
    return;
  }
  if (none == ENDING_FINALIZE) say_ending_line_once(sig, trace_phase);
  if (!under_launcher) {             /* a death by the signal, as the shell expects: delivered on return */
    signal(sig, SIG_DFL);            /* (blocked while its handler runs, so not before) */
    raise(sig);
    return;
  }
  _exit(128 + sig);                 /* a second signal (the first is under way, or stuck), or finalizing */
}

static void *ending_thread(void *arg) {
  (void)arg;
  while (sem_wait(&ending_sem) != 0) {}         /* EINTR: a signal handled on this thread */
  int sig = ending_sig, status = 128 + sig;
  /* Before the file is written (--trace), the host writes this rank's own records if it comes
   * (host_ending.c), and says where; else the line says that the file was not written. */
  int phase = ending_phase;
  if (trace_path && phase == TRACE_PENDING) {
    write_ending_line(sig, LINE_BARE);
    char why[64] = "";
    for (int k = 0; k < ENDING_SIGNALS; k++)
      if (ending_signal[k] == sig) snprintf(why, sizeof why, "ended by %s (status %d)", signal_names[k], status);
    if (!tpsh_host_ending_ask(status, why)) write_ending_line(sig, LINE_UNWRITTEN);
  } else {
    write_ending_line(sig, phase);
  }
  tpsh_leakcheck_skip();
  usleep(300 * 1000);                           /* as die(): mpiexec reads the line before the abort */
  if (!under_launcher) {                        /* a death by the signal, as the shell expects */
    signal(sig, SIG_DFL);
    raise(sig);
  }
  MPI_Abort(MPI_COMM_WORLD, status);
  _exit(status);
}

static void install_signal_handlers(void) {
  under_launcher = world_size > 1 || getenv("PMI_RANK") || getenv("PMIX_RANK");
  if (under_launcher || trace_path) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* Without the thread the signals keep their default action under a launcher; without a launcher
     * the handler says the line itself. */
    ending_thread_made = sem_init(&ending_sem, 0, 0) == 0 && pthread_create(&t, &attr, ending_thread, NULL) == 0;
    pthread_attr_destroy(&attr);
    if (!ending_thread_made && under_launcher) return;
  }
  static const char *const notes[ENDING_LINES] = {"; --trace %s was not written",
                                                  "; --trace %s may not have been written whole", "", ""};
  for (int k = 0; k < ENDING_SIGNALS; k++) {
    for (int ph = 0; ph < ENDING_LINES; ph++) {
      char *line = ending_line[ph][k];
      size_t cap = sizeof ending_line[ph][k];
      int n = ph == LINE_UNWRITTEN
                  ? snprintf(line, cap, "[rank %d] tpsh: --trace %s was not written", world_rank, trace_path)
                  : snprintf(line, cap, "[rank %d] tpsh: ended by %s (status %d)", world_rank, signal_names[k],
                             128 + ending_signal[k]);
      if (trace_path && ph < TRACE_PHASES && n > 0 && n < (int)cap)
        snprintf(line + n, cap - (size_t)n, notes[ph], trace_path);
      size_t len = strlen(line);
      if (len > cap - 2) len = cap - 2;
      memcpy(line + len, "\n", 2);
    }
    /* A signal ignored from the start stays so (`nohup mpiexec ...`, a background job of a script). */
    struct sigaction sa, old;
    if (sigaction(ending_signal[k], NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN)
      continue;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_ending_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(ending_signal[k], &sa, NULL);
  }
}

/* MPI_Finalize, unless a signal came first: its thread then ends every rank (MPI_Abort is erroneous
 * after finalize, and this rank must not finish with status 0 meanwhile). */
static void finalize(int code) {
  int none = ENDING_NONE;
  if (ending_thread_made &&
      !__atomic_compare_exchange_n(&ending_state, &none, ENDING_FINALIZE, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
    for (;;) pause();
  tpsh_finalize_bounded(world_rank, code);
}

static int docall(lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int status = lua_pcall(L, narg, nres, base);
  lua_remove(L, base);
  return status;
}

static int report_status(lua_State *L, int status) {
  if (status) {
    const char *msg = lua_tostring(L, -1);
    msg = msg ? msg : lua_isnil(L, -1) ? "error: nil" : "(error object is not a string)";
    snprintf(failure_text, sizeof failure_text, "%s", msg);
    report(msg);
    lua_pop(L, 1);
  }
  return status;
}

static int collect_all(lua_State *L) {
  lua_gc(L, LUA_GCCOLLECT, 0);
  lua_gc(L, LUA_GCCOLLECT, 0);       /* a finalizer may free what the first pass kept for it */
  return 0;
}

/* What finish_script returns for an error (reported; every rank then ends), as against a status of the
 * rank's own. */
#define FINISH_FAILED 1

/* The end of a script: tp._finish waits for the streams and runs the finish hooks (--trace FILE is
 * written there). Returns FINISH_FAILED after reporting an error, else this rank's exit status (0, or
 * check mode's 66). Where tp is not set up yet (os.exit while tpsh loads) there is nothing to finish. */
static int finish_script(lua_State *L) {
  lua_getglobal(L, "tp");
  if (!lua_istable(L, -1)) { lua_pop(L, 1); return 0; }
  lua_getfield(L, -1, "_finish");
  lua_remove(L, -2);
  /* The hooks write --trace FILE (what a signal's line says of it). The phase a signal saw is the one
   * its line names (chosen when the ending thread wakes, it could come after this rank has gone on to
   * write the file, and say "was not written" of a file being written), and a signal that came before
   * this point stops the rank here, the file not begun, until the ending thread's MPI_Abort. */
  __atomic_store_n(&trace_phase, TRACE_WRITING, __ATOMIC_SEQ_CST);
  if (ending_thread_made && __atomic_load_n(&ending_state, __ATOMIC_SEQ_CST) == ENDING_SIGNAL)
    for (;;) pause();
  if (report_status(L, docall(L, 0, 1))) return FINISH_FAILED;
  /* What the end found wrong (unmatched sends, an error inside a stream): its message, said alone */
  if (lua_type(L, -1) == LUA_TSTRING) { report_status(L, 1); return FINISH_FAILED; }
  /* A status of this rank's own (check mode's 66): the run itself went well, every rank finishes. */
  int code = (int)lua_tointeger(L, -1) & 0xff;
  lua_pop(L, 1);
  /* The finalizers of what the script left unreachable (its main chunk's locals) run here, in a
   * protected call, so that an error one raises fails the run (lua_close swallows them; what a global
   * still holds is finalized only there: close_lua sees those). */
  lua_pushcfunction(L, collect_all);
  if (report_status(L, docall(L, 0, 0))) return FINISH_FAILED;
  return code;
}

/* A finalizer's error while the Lua state closes (lua/tpsh/finalizers.lua): lua_close drops it, so the
 * hook keeps the first one here, and close_lua reports it and fails the rank. Raised at any other time,
 * the error reached the script as before, and the hook ignores it. */
static int lua_closing;
static char finalizer_error[1024];

static int l_note_finalizer_error(lua_State *L) {
  if (!lua_closing || finalizer_error[0]) return 0;
  const char *msg = lua_tostring(L, 1);
  snprintf(finalizer_error, sizeof finalizer_error, "%s", msg ? msg : luaL_typename(L, 1));
  return 0;
}

/* Closes the Lua state (its __gc handlers free the tensors through the core, before tpsh_shutdown);
 * returns code, or 1 where a finalizer raised meanwhile. */
static int close_lua(lua_State *L, int code) {
  lua_closing = 1;
  lua_close(L);
  if (!finalizer_error[0]) return code;
  char msg[1200];
  snprintf(msg, sizeof msg, "tpsh: a finalizer raised while the Lua state closed (at the end of the script): %s",
           finalizer_error);
  report(msg);
  return code ? code : 1;
}

/* os.exit(code): 0 finishes this rank cleanly; anything else ends every rank with that status (1 where
 * its low 8 bits, all the shell sees, are 0: see die). */
static int l_exit(lua_State *L) {
  /* Reduced here, in the full width, so that no code (not 256, not 2^32) turns into 0 on the way. */
  lua_Integer c = lua_isboolean(L, 1) ? !lua_toboolean(L, 1) : luaL_optinteger(L, 1, 0);
  int code = c == 0 ? 0 : (c & 0xff) ? (int)(c & 0xff) : 1;
  fflush(stdout);
  tpsh_repl_quiesce();
  if (code != 0) die(L, code);
  /* What the end of a script does first: without it os.exit(0) left the trace unwritten without a word. */
  int fin = finish_script(L);
  if (fin == FINISH_FAILED) die(L, 1);
  /* Then as main() ends: the Lua state closed first, so that its __gc handlers free the tensors through
   * the core before tpsh_shutdown (else they, and LuaJIT's own buffers with them, stay allocated).
   * LuaJIT closes the state inside a call as its own os.exit(code, true) does; nothing returns to Lua. */
  fin = close_lua(L, fin);
  tpsh_shutdown();
  finalize(fin);
  exit(fin);
  return 0;
}

/* ==== running ==================================================================================== */
static int dochunk(lua_State *L, int status) {
  if (status == 0) status = docall(L, 0, 0);
  return report_status(L, status);
}

/* The arg table as luajit builds it: arg[0] the script, arg[1..] its arguments, negative indices the
 * interpreter and its options. Under `tpsh test` the word test stands where busted has its script:
 * arg[0] = "test", arg[1..] the runner's arguments, so that a library that starts its interpreter again
 * from arg[-1], arg[-2], ... (Penlight's app.lua) starts this tpsh with the same host options. */
static void set_arg_table(lua_State *L, char **argv, int argc, int script) {
  int first = script ? script : argc;
  lua_createtable(L, argc - first, first);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - first);
  }
  lua_setglobal(L, "arg");
}

/* `tpsh -`: the script is standard input, which under mpiexec only rank 0 has (the other ranks would wait
 * in read() forever). Rank 0 reads it whole and sends it to every rank; a leading #! line is skipped
 * (as luaL_loadfile does, keeping the line count). Not a watched wait: rank 0 may be reading a person's
 * typing. */
static int load_stdin_script(lua_State *L) {
  char *buf = NULL;
  long long n = 0;
  if (world_rank == 0) {
    size_t cap = 0, len = 0;
    for (;;) {
      if (len == cap) {
        char *b = realloc(buf, cap = cap ? 2 * cap : 65536);
        if (!b) { n = -1; break; }
        buf = b;
      }
      size_t got = fread(buf + len, 1, cap - len, stdin);
      len += got;
      if (got == 0) { if (ferror(stdin)) n = -1; break; }
    }
    if (n == 0) n = len > INT_MAX ? -2 : (long long)len;
  }
  if (world_size > 1) {
    MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    /* A rank with no memory for the script raises instead of taking part: its error ends every rank. */
    if (world_rank != 0 && n > 0 && !(buf = malloc((size_t)n))) n = -1;
    else if (n > 0) MPI_Bcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
  }
  if (n < 0) {
    free(buf);
    lua_pushstring(L, n == -2 ? "cannot read stdin: the script is larger than 2 GiB"
                              : "cannot read stdin (or out of host memory)");
    return LUA_ERRFILE;
  }
  const char *p = buf ? buf : "";
  size_t len = (size_t)n;
  if (len > 0 && p[0] == '#') {            /* #! line: skipped, its newline kept */
    const char *nl = memchr(p, '\n', len);
    len = nl ? len - (size_t)(nl - p) : 0;
    p = nl ? nl : p + len;
  }
  int status = luaL_loadbuffer(L, p, len, "=stdin");
  free(buf);
  return status;
}

static int run_script(lua_State *L, char **argv, int argc, int script) {
  const char *fname = argv[script];
  int from_stdin = strcmp(fname, "-") == 0 && strcmp(argv[script - 1], "--") != 0;
  int status = from_stdin ? load_stdin_script(L) : luaL_loadfile(L, fname);
  int nargs = 0;
  if (status == 0) {
    for (int i = script + 1; i < argc; i++) { lua_pushstring(L, argv[i]); nargs++; }
    status = docall(L, nargs, 0);
  }
  return report_status(L, status);
}

/* Calls require(mod)[fn](...) with the strings argv[from..argc-1] as one list argument; leaves its
 * integer result (default 0) in *code, and where abandon is given, whether its second result is true
 * (the ranks cannot finish cleanly: `tpsh test` found a collective left waiting). */
static int run_module(lua_State *L, const char *mod, const char *fn, char **argv, int from, int argc, int *code,
                      int *abandon) {
  lua_getglobal(L, "require");
  lua_pushstring(L, mod);
  int status = docall(L, 1, 1);
  if (status == 0) {
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
    lua_createtable(L, argc - from, 0);
    for (int i = from; i < argc; i++) { lua_pushstring(L, argv[i]); lua_rawseti(L, -2, i - from + 1); }
    status = docall(L, 1, 2);
    if (status == 0) {
      *code = lua_isnumber(L, -2) ? (int)lua_tointeger(L, -2) : 0;
      if (abandon) *abandon = lua_toboolean(L, -1);
      lua_pop(L, 2);
    }
  }
  return report_status(L, status);
}

/* code: the exit status; agreed: every rank computed the same code (the test runner's verdict), so
 * the ranks can finish cleanly instead of aborting each other. */
typedef struct pmain_args { int argc; char **argv; options *o; int code; int agreed; } pmain_args;

/* A tensor's __gc: LuaJIT calls a Lua C function directly, where a C function's cdata (the FFI's
 * C.tpsh_tensor_drop) goes through its interpreted call, with the argument's conversion. */
static int l_tensor_gc(lua_State *L) {
  tpsh_tensor_drop((tpsh_tensor *)lua_topointer(L, 1));
  return 0;
}

static int pmain(lua_State *L) {
  pmain_args *a = lua_touserdata(L, 1);
  options *o = a->o;
  char **argv = a->argv;
  int argc = a->argc;
  int repl_status = 0;
  lua_gc(L, LUA_GCSTOP, 0);
  luaL_openlibs(L);
  lua_gc(L, LUA_GCRESTART, -1);
  lua_getglobal(L, "os");
  lua_pushcfunction(L, l_exit);
  lua_setfield(L, -2, "exit");
  lua_pop(L, 1);
  set_arg_table(L, argv, argc, o->test ? o->rest - 1 : o->script);

  /* The tensors' finalizer as a Lua C function (see l_tensor_gc), for tensor.lua's metatype. */
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_tensor_gc);
  lua_setfield(L, -2, "tensor_gc");
  lua_setfield(L, -2, "tpsh.native");
  lua_pop(L, 2);
  /* tp = require("tpsh"), then hand it the command-line configuration. */
  lua_getglobal(L, "require");
  lua_pushstring(L, "tpsh");
  if (report_status(L, docall(L, 1, 1))) { a->code = 1; return 0; }   /* reported once, then every rank ends */
  lua_pushvalue(L, -1);
  lua_setglobal(L, "tp");
  lua_getglobal(L, "require");
  lua_pushstring(L, "tpsh.finalizers");
  if (report_status(L, docall(L, 1, 1))) { a->code = 1; return 0; }
  lua_pushcfunction(L, l_note_finalizer_error);
  if (report_status(L, docall(L, 1, 0))) { a->code = 1; return 0; }
  lua_getfield(L, -1, "_configure");
  lua_createtable(L, 0, 4);
  if (o->trace) { lua_pushstring(L, o->trace); lua_setfield(L, -2, "trace"); }
  lua_pushboolean(L, o->check);
  lua_setfield(L, -2, "check");
  if (o->timeout > 0) { lua_pushnumber(L, o->timeout); lua_setfield(L, -2, "timeout"); }
  lua_pushboolean(L, o->test);
  lua_setfield(L, -2, "test");
  /* Its errors are about the command line and the environment (a --trace file that cannot be written):
   * the message alone, without a traceback. */
  if (report_status(L, lua_pcall(L, 1, 0, 0))) { trace_path = NULL; a->code = 1; return 0; }
  lua_pop(L, 1);
  if (trace_path) {       /* the watchdog's end of the run says it too, as die() does */
    char note[512];
    snprintf(note, sizeof note, "tpsh: --trace %s was not written: the run was ended on every rank", trace_path);
    tpsh_watchdog_set_ending_note(note);
    tpsh_host_ending_enable();   /* ...unless the host writes its own records first (host_ending.c) */
  }

  if (o->version) {
    if (world_rank == 0) printf("%s\nLuaJIT: %s\n", tpsh_versions(), LUAJIT_VERSION);
    if (!o->script && !o->has_e && !o->interactive && !o->test) return 0;
  }
  if (o->test) {
    int abandon = 0;
    if (run_module(L, "tpsh.test", "main", argv, o->rest, argc, &a->code, &abandon)) a->code = 1;
    else a->agreed = !abandon;   /* a collective left waiting would hang the shut-down: die() ends them */
    return 0;
  }
  /* Second pass: -e chunks in order, then the script. For the watchdog they are one "test", whose end
   * (tp._finish) every rank waits at: a rank blocked in a collective that a finished rank never issued
   * is ended within seconds (watchdog.c). The interactive session is not: its ranks wait for rank 0. */
  tpsh_watch_test(TPSH_WATCH_SCRIPT);
  for (int i = 1; i < o->rest; i++) {
    if (strcmp(argv[i], "-e") == 0) {
      const char *chunk = argv[++i];
      if (dochunk(L, luaL_loadbuffer(L, chunk, strlen(chunk), "=(command line)"))) { a->code = 1; return 0; }
    } else if (strcmp(argv[i], "--backend") == 0 || strcmp(argv[i], "--trace") == 0 ||
               strcmp(argv[i], "--timeout") == 0 || strcmp(argv[i], "--device") == 0) {
      i++;
    }
  }
  if (o->script && run_script(L, argv, argc, o->script)) { a->code = 1; return 0; }
  if (o->interactive || (!o->script && !o->has_e && !o->version)) {
    tpsh_watch_test(0);
    /* An os.exit in the session ends it on every rank with that status (repl.lua): the end of the
     * script below runs first, as after Ctrl-D, and the ranks then finish with the status together. */
    if (run_module(L, "tpsh.repl", "main", argv, o->rest, argc, &repl_status, NULL)) a->code = 1;
    /* After the session its end is a script's: a rank still waiting there for a collective that another
     * rank, now at the end, never issued (a chunk run `:on` some ranks) is ended within seconds too,
     * not at the timeout. */
    tpsh_watch_test(TPSH_WATCH_SCRIPT);
    tpsh_watch_step("the interactive session");   /* what a rank stuck there is told the others finished */
  }
  if (a->code == 0) {
    a->code = finish_script(L);
    a->agreed = a->code != FINISH_FAILED;   /* 66: this rank's own status, after a run that went well */
    if (a->agreed && repl_status != 0) a->code = repl_status;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argv[0] && argv[0][0]) progname = argv[0];
  options o;
  const char *env_name = NULL;
  const char *err = parse_options(argc, argv, &o, &env_name);
  trace_path = o.trace;
  if (err) {
    /* An empty argument is shown as "" so that the line still says which value was wrong. */
    if (o.rest < 0)                    /* about the environment */
      fprintf(stderr, "%s: %s %s: %s\n", progname, env_name, err, getenv(env_name));
    else
      fprintf(stderr, "%s: %s: %s\n", progname, err, *argv[o.rest] ? argv[o.rest] : "\"\"");
    usage(stderr);
    return 1;
  }
  /* Specs and scripts find the binary (to run it as a subprocess) through TPSH_EXE. */
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) { exe[n] = 0; setenv("TPSH_EXE", exe, 1); }

  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    fprintf(stderr, "%s: MPI_Init_thread failed\n", progname);
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  /* MPICH's MPI_Init makes stdout unbuffered (setbuf(stdout, NULL)): Lua's print then writes each value
   * and the newline in writes of their own, and under mpiexec two ranks' lines come out mixed ("rank 0
   * xrank 2 x"). Line buffering writes each line whole, and still at once. The buffer must be given:
   * glibc's setvbuf keeps the 1-byte buffer that setbuf left when handed NULL. */
  static char stdout_buf[BUFSIZ];
  setvbuf(stdout, stdout_buf, _IOLBF, sizeof stdout_buf);
  install_signal_handlers();
  /* Standard input belongs to rank 0, as mpiexec delivers it. MPICH's launcher gives the other ranks
   * a pipe that it never writes nor closes, where io.read() would wait forever; they read /dev/null
   * instead (end of file at once), as Open MPI's ranks do. A terminal or a file is left as it is. */
  struct stat in_st;
  if (world_rank != 0 && fstat(0, &in_st) == 0 && (S_ISFIFO(in_st.st_mode) || S_ISSOCK(in_st.st_mode))) {
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd > 0) { dup2(null_fd, 0); close(null_fd); }
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    /* Stream workers make MPI calls concurrently with the Lua thread: nothing less is safe. */
    report("tpsh: the MPI library does not provide MPI_THREAD_MULTIPLE, which tpsh's streams need");
    die(NULL, 1);
  }
  if (tpsh_init(o.backend, o.device) != TPSH_OK) {
    char msg[1200];
    snprintf(msg, sizeof msg, "tpsh: %s", tpsh_last_error());
    report(msg);
    die(NULL, 1);
  }
  if (o.chaos && tpsh_chaos_flag_start(o.chaos, world_rank, world_size) != TPSH_OK) {
    char msg[1200];
    snprintf(msg, sizeof msg, "tpsh: --chaos: %s", tpsh_last_error());
    report(msg);
    die(NULL, 1);
  }
  lua_State *L = new_lua_state();
  if (!L) { report("tpsh: cannot create the Lua state: not enough memory"); die(NULL, 1); }
  tpsh_repl_attach(L);
  pmain_args a = {argc, argv, &o, 0, 0};
  int status = lua_cpcall(L, pmain, &a);
  if (status) { report_status(L, status); a.code = 1; a.agreed = 0; }
  if (a.code != 0 && !a.agreed) die(L, a.code);
  a.code = close_lua(L, a.code);
  if (a.code != 0 && world_rank == 0) tpsh_chaos_flag_say(world_rank);   /* a verdict every rank agreed on */
  tpsh_shutdown();
  finalize(a.code);
  return a.code;
}
