/* chaos_flag.h: --chaos[=SEED] and TPSH_CHAOS (chaos_flag.c), for main.c. */
#ifndef TPSH_HOST_CHAOS_FLAG_H
#define TPSH_HOST_CHAOS_FLAG_H
/* NULL when v is a seed tpsh_chaos_set takes ("random" too where random is allowed), else the message. */
const char *tpsh_chaos_flag_bad(const char *v, int random_allowed);
/* After tpsh_init, on every rank: chaos on with the seed v ("random" or NULL: one that rank 0 draws and
 * sends to every rank). Returns 0, or the status of tpsh_chaos_set. */
int tpsh_chaos_flag_start(const char *v, int world_rank, int world_size);
/* The line that a failed run says (on stderr, the rank prefixed) while chaos mode is on. */
void tpsh_chaos_flag_say(int world_rank);
#endif
