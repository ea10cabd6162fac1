/*
 * chaos_flag.c: chaos mode from the command line (--chaos, --chaos=SEED) and the environment
 * (TPSH_CHAOS=SEED, TPSH_CHAOS=random; 0 or empty: off), and the seed said when a run fails, so that
 * --chaos=SEED gives the same delays again (src/core/chaos.c draws them from the seed and the rank).
 */
#include "host/chaos_flag.h"
#include "tpsh.h"
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *tpsh_chaos_flag_bad(const char *v, int random_allowed) {
  if (random_allowed && strcmp(v, "random") == 0) return NULL;
  char *end;
  unsigned long long n = strtoull(v, &end, 10);
  if (*v < '0' || *v > '9' || *end || n < 1 || n > (1ULL << 53) - 1)
    return random_allowed ? "expects a seed (an integer from 1 to 2^53 - 1), random, or 0 for off"
                          : "--chaos=SEED expects a seed, an integer from 1 to 2^53 - 1 (--chaos alone: a random one)";
  return NULL;
}

int tpsh_chaos_flag_start(const char *v, int world_rank, int world_size) {
  double seed;
  if (v && strcmp(v, "random") != 0) {
    seed = (double)strtoull(v, NULL, 10);
  } else {
    /* Six digits at most: a seed read off a failed run's last lines is retyped by hand. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ULL ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 20);
    z ^= z >> 31;
    seed = (double)(z % 999999 + 1);
    /* every rank takes rank 0's: the delays of rank r come from (seed, r) */
    if (world_size > 1) MPI_Bcast(&seed, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
  (void)world_rank;
  return tpsh_chaos_set(seed);
}

void tpsh_chaos_flag_say(int world_rank) {
  char line[160];
  if (!tpsh_chaos_line(line, sizeof line)) return;
  fprintf(stderr, "[rank %d] %s\n", world_rank, line);
  fflush(stderr);
}
