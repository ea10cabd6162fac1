/*
 * intern.h: interned strings (intern.c), for records that outlive the Lua string which named them.
 */
#ifndef TPSH_INTERN_H
#define TPSH_INTERN_H

#include <stdbool.h>

/* A copy of s that stays valid until shutdown, the same pointer for equal strings; NULL for NULL or out
 * of memory. *added (may be NULL) says whether this call made the copy. Thread-safe. */
const char *tpsh_intern(const char *s, bool *added);
/* The interned copy of s if there is one, else NULL (interns nothing). */
const char *tpsh_intern_find(const char *s);

#endif /* TPSH_INTERN_H */
