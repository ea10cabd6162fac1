/*
 * collective.h: what the collectives' front end (collective.c) tells the rest of the core about the
 * bytes a collective touches: the sanitizer's accesses and the overlap checks of ops and batches.
 */
#ifndef TPSH_COLLECTIVE_H
#define TPSH_COLLECTIVE_H

#include "core/internal.h"

/* What collective c touches on this rank (of a group of `size`): *reads bytes from c->send and
 * *writes bytes at c->recv, 0 where it does not (broadcast writes everywhere but at its root, reduce
 * only at its root). For the sanitizer and for the overlap check of a batch. */
void tpsh_coll_footprint(const tpsh_coll_args *c, int size, int rank, size_t *reads, size_t *writes);
/* Check mode: a collective recorded in an open g:batch that an op touching those bytes (writing them
 * when `write`) would run ahead of; NULL if none (for the sanitizer). */
const tpsh_coll_args *tpsh_batch_ahead(const void *p, size_t n, int write);

#endif /* TPSH_COLLECTIVE_H */
