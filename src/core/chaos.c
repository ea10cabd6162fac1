/*
 * chaos.c: chaos mode. Seeded random delays go onto a stream before its work (ops from tpsh_launch and
 * uploads, collectives from batch_issue), so that a schedule that misses a wait gives a wrong result
 * instead of the right one by luck of timing, and the same seed gives the same delays again.
 *
 * A delay is an idle spin enqueued on the stream (TPSH_K_SPIN with i[0] = 1: the CPU worker sleeps, the
 * GPU spins one small block), so it delays exactly what comes after it on that stream, on every backend.
 *
 * The model (docs/design.md "Chaos mode"). A race is an op B that should wait for an op A issued before
 * it on another stream and does not; it shows when A's stream is further behind the host than B's when
 * B starts. So:
 *  - a draw is a delay of 2 to 6 ms (long beside the small ops of a test, and beside a loaded machine's
 *    scheduling latency, so that a seed that exposes a race exposes it every time) or nothing;
 *  - ops are delayed half the time, collectives three times in four: a collective's output read, or its
 *    input overwritten, before w:wait() needs the collective late, and it is the commonest race (11 of
 *    the 21 of tests/chaos_spec.lua, the sanitizer's corpus);
 *  - after a delay on stream S, the next QUIET draws on streams not ordered after it are nothing: those
 *    are the ops that may race with the delayed one, and a delay of theirs as long would hide the race.
 *    A stream ordered after it (it waited for an event recorded on S after the delay, or for one of a
 *    stream so ordered) draws as usual: its work cannot race with the delayed op. What a stream is
 *    ordered after is one number (chaos.knows: the last delay it follows), passed on by the events it
 *    records and waits for, a vector clock of one entry.
 * Draws come from a counter-based generator (random.h): the i-th draw on the k-th stream to draw since
 * the seed was set is a function of (seed, rank, k, i), so the delays follow the program's order of
 * ops, not timing. The quiet window depends on that order too (host thread only).
 */
#include "core/chaos.h"
#include "core/backend.h"
#include "core/random.h"
#include "core/trace.h"
#include <stdio.h>

#define BE (tpsh_rt.be)

int tpsh_chaos_on;

enum { QUIET = 4 };
static const double DELAY_MIN_MS = 2.0, DELAY_MAX_MS = 6.0;
static const double ODDS[] = {[TPSH_CHAOS_OP] = 0.5, [TPSH_CHAOS_COLLECTIVE] = 0.75};

/* The seed as given (what a failed run says), 0: off. Atomic: the watchdog's thread says it too. */
static uint64_t seed_now;

static struct {
  uint64_t rank_seed;     /* the seed mixed with this rank */
  uint64_t epoch;         /* each tpsh_chaos_set starts one: every stream's draws start again */
  uint32_t next_index;    /* streams numbered in the order of their first draw in the epoch */
  uint64_t draws;         /* draws ever made (never reset: chaos.knows of every epoch compares with it) */
  uint64_t slow_draw;     /* the last delay's draw (a stream's chaos.knows names the last it follows) */
  int quiet;              /* draws of streams not ordered after it still to be nothing */
  uint64_t delays;        /* since the last set: delays enqueued and their milliseconds */
  double delayed_ms;
} X;

int tpsh_chaos_set(double seed) {
  if (seed < 0) {
    tpsh_chaos_on = 0;
    __atomic_store_n(&seed_now, 0, __ATOMIC_RELAXED);
    return TPSH_OK;
  }
  if (!(seed >= 1 && seed <= 9007199254740991.0 && seed == (double)(uint64_t)seed))
    return tpsh_error(TPSH_EINVAL, "expected a seed, an integer from 1 to 2^53 - 1, got %.17g", seed);
  __atomic_store_n(&seed_now, (uint64_t)seed, __ATOMIC_RELAXED);
  X.rank_seed = tpsh_rand_mix((uint64_t)seed, 0x63686173ULL + (uint64_t)tpsh_rt.rank);   /* "chas" + rank */
  X.epoch++;
  X.next_index = 0;
  X.quiet = 0;
  X.delays = 0;
  X.delayed_ms = 0;
  tpsh_chaos_on = 1;
  return TPSH_OK;
}

double tpsh_chaos_seed(void) {
  uint64_t s = __atomic_load_n(&seed_now, __ATOMIC_RELAXED);
  return s ? (double)s : -1;
}

const char *tpsh_chaos_line(char *buf, size_t n) {
  uint64_t s = __atomic_load_n(&seed_now, __ATOMIC_RELAXED);
  if (!s) return NULL;
  snprintf(buf, n, "tpsh: chaos seed %llu (--chaos=%llu gives the same delays again)", (unsigned long long)s,
           (unsigned long long)s);
  return buf;
}

void tpsh_chaos_stats(double out[2]) {
  out[0] = (double)X.delays;
  out[1] = X.delayed_ms;
}

void tpsh_chaos_note_record(tpsh_event *e, const tpsh_stream *s) { e->chaos_knows = s->chaos.knows; }

void tpsh_chaos_note_wait(tpsh_stream *s, const tpsh_event *e) {
  if (e->chaos_knows > s->chaos.knows) s->chaos.knows = e->chaos_knows;
}

/* This rank's next delay on s, in ms (0: none). */
static double draw(tpsh_stream *s, int kind) {
  if (s->chaos.epoch != X.epoch) {
    s->chaos.epoch = X.epoch;
    s->chaos.index = X.next_index++;
    s->chaos.draws = 0;
  }
  uint64_t stream_seed = X.rank_seed ^ ((uint64_t)s->chaos.index * 0xD1B54A32D192ED03ULL);
  uint64_t i = s->chaos.draws++;
  uint64_t g = ++X.draws;
  if (X.quiet > 0 && s->chaos.knows < X.slow_draw) {
    X.quiet--;
    return 0;
  }
  if (tpsh_rand_uniform(stream_seed, 2 * i) >= ODDS[kind]) return 0;
  X.slow_draw = s->chaos.knows = g;
  X.quiet = QUIET;
  return DELAY_MIN_MS + (DELAY_MAX_MS - DELAY_MIN_MS) * tpsh_rand_uniform(stream_seed, 2 * i + 1);
}

int tpsh_chaos_delay(tpsh_stream *s, int kind) {
  if (!s) return TPSH_OK;                 /* the caller reports the missing stream */
  double ms = draw(s, kind);
  if (ms <= 0) return TPSH_OK;
  tpsh_kargs k = {.op = TPSH_K_SPIN, .name = "chaos"};
  k.s[0] = ms;
  k.i[0] = 1;                             /* idle: it must not take a core from the work it reorders */
  X.delays++;
  X.delayed_ms += ms;
  if (!tpsh_trace_on) return BE->launch(s, &k);
  /* traced, so that a timeline shows where the delays went: as a stall (a wait), not as compute, which
   * the summary's figures would count */
  int64_t id = tpsh_trace_op_begin(s, "chaos", TPSH_TRACE_WAIT, 0, -1);
  int rc = BE->launch(s, &k);
  if (rc == TPSH_OK) tpsh_trace_op_end(s, id);     /* (without an end the record is left out) */
  return rc;
}
