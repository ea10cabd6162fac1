/*
 * text.h: a text appended to piece by piece (text.c), for messages whose length is not known ahead.
 */
#ifndef TPSH_TEXT_H
#define TPSH_TEXT_H

#include <stddef.h>

/* tpsh_text_take hands the text over (free it; "" when nothing was appended, NULL when memory ran out
 * on the way). Start from (tpsh_text){0}. */
typedef struct tpsh_text { char *buf; size_t len, cap; int failed; } tpsh_text;
void tpsh_text_appendf(tpsh_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *tpsh_text_take(tpsh_text *t);

#endif /* TPSH_TEXT_H */
