/* p2p_ledger.h: this rank's sends and receives counted per peer, compared with the peers' at the end of
 * a script (p2p_ledger.c says why). */
#ifndef TPSH_P2P_LEDGER_H
#define TPSH_P2P_LEDGER_H

#include "core/internal.h"
#include <mpi.h>

/* The front end, once the n collectives c on g were issued: counts their sends and receives per peer. */
int tpsh_p2p_ledger_note(const struct tpsh_group *g, const struct tpsh_coll_args *c, int n);
/* Every rank, at the end of a script (tpsh_watch_p2p_at_end, watchdog_end.c): exchanges the counts over
 * comm and raises where a pair of ranks disagrees, on both ranks of the pair. */
int tpsh_p2p_ledger_compare(MPI_Comm comm);
/* What this rank has enqueued so far to world rank peer (sent) and from it (received); any thread (the
 * watchdog's asks it while the host issues more). Zeros before the first send or receive. */
void tpsh_p2p_ledger_counts(int peer, uint64_t *sent, uint64_t *received);
/* At shut-down. */
void tpsh_p2p_ledger_free(void);

#endif /* TPSH_P2P_LEDGER_H */
