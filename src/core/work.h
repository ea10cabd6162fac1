/*
 * work.h: what work.c offers the rest of the core beside tpsh.h's calls: the Works' tickets as the host's
 * waits and the collectives' front end see them.
 */
#ifndef TPSH_WORK_H
#define TPSH_WORK_H

#include "core/internal.h"

void tpsh_work_shutdown(void);                  /* gives the tickets' events back, before the drain */
int tpsh_work_stream_done(tpsh_stream *s);      /* the host waited for s: its Works completed */
int tpsh_work_all_done(void);                   /* ... for every stream */
/* The ticket's Work takes over one reference to each of st[0..n) (dropped at once if the Work has
 * completed). */
void tpsh_work_keep(double ticket, int n, tpsh_storage *const *st);

#endif /* TPSH_WORK_H */
