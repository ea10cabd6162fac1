/*
 * intern.c: copies of strings that stay valid until shutdown, one per distinct string.
 *
 * Records that outlive the call which named them (the sanitizer's locations and stream names, the
 * trace's span names, the name of the host exchange the watchdog reports) point at an interned copy:
 * the Lua string they came from may be collected while the record is still read, by another thread
 * for the watchdog. A run names a handful of distinct things, so the copies are never freed.
 */
#include "core/intern.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;   /* the sanitizer interns from stream workers */
static char **strs;
static size_t nstrs, capstrs;                             /* open addressing, capstrs a power of two */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;                    /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int grow(void) {
  size_t cap = capstrs ? 2 * capstrs : 256;
  char **n = calloc(cap, sizeof *n);
  if (!n) return -1;
  for (size_t i = 0; i < capstrs; i++)
    if (strs[i]) {
      size_t j = hash_str(strs[i]) & (cap - 1);
      while (n[j]) j = (j + 1) & (cap - 1);
      n[j] = strs[i];
    }
  free(strs);
  strs = n;
  capstrs = cap;
  return 0;
}

/* The slot of s, or the empty slot where it would go (the lock held, capstrs > 0). */
static size_t slot_of(const char *s) {
  size_t j = hash_str(s) & (capstrs - 1);
  while (strs[j] && strcmp(strs[j], s) != 0) j = (j + 1) & (capstrs - 1);
  return j;
}

const char *tpsh_intern(const char *s, bool *added) {
  if (added) *added = false;
  if (!s) return NULL;
  pthread_mutex_lock(&mu);
  const char *r = NULL;
  if (2 * (nstrs + 1) <= capstrs || grow() == 0) {
    size_t j = slot_of(s);
    if (!strs[j] && (strs[j] = strdup(s))) {
      nstrs++;
      if (added) *added = true;
    }
    r = strs[j];
  }
  pthread_mutex_unlock(&mu);
  return r;
}

const char *tpsh_intern_find(const char *s) {
  if (!s) return NULL;
  pthread_mutex_lock(&mu);
  const char *r = capstrs ? strs[slot_of(s)] : NULL;
  pthread_mutex_unlock(&mu);
  return r;
}
