/*
 * bench_sizes.h: what the collective benchmarks' C references share with scripts/bench/bench_collectives.lua,
 * so that tpsh and the reference time the same number of calls on the same sizes: "--min 1K" style
 * sizes, and about 256 MiB moved per measurement, 10 to 1000 calls, after a tenth as many warm-up
 * calls (3 to 100; 1 from 16 MiB on). Keep in step with iters_for / warmup_for in bench_collectives.lua.
 */
#ifndef TPSH_BENCH_SIZES_H
#define TPSH_BENCH_SIZES_H

#include <stdlib.h>

static long parse_size(const char *s) {
  char *end;
  long v = strtol(s, &end, 10);
  switch (*end) {
  case 'k': case 'K': v <<= 10; break;
  case 'm': case 'M': v <<= 20; break;
  case 'g': case 'G': v <<= 30; break;
  default: break;
  }
  return v;
}

static int iters_for(long bytes, int fixed) {
  if (fixed > 0) return fixed;
  long it = (256L << 20) / bytes;
  return (int)(it < 10 ? 10 : it > 1000 ? 1000 : it);
}

/* Below 16 MiB a tenth of the timed calls (3 to 100): tpsh's JIT compiles its timing loop during the
 * warm-up (bench_collectives.lua says why); the references warm up as long, to compare like with like. */
static int warmup_for(long bytes, int fixed) {
  if (fixed >= 0) return fixed;
  if (bytes >= (16L << 20)) return 1;
  int w = iters_for(bytes, 0) / 10;
  return w < 3 ? 3 : w > 100 ? 100 : w;
}

#endif
