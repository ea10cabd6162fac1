/* check.h: the C tests' counters and CHECK(cond, fmt, ...), which counts a pass or prints the failure
 * with its file and line and goes on (the test's main prints the totals). */
#ifndef TPSH_TEST_CHECK_H
#define TPSH_TEST_CHECK_H

#include <stdio.h>

static int passed, failed;

#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (cond) passed++;                                       \
    else {                                                    \
      failed++;                                               \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);             \
      printf(__VA_ARGS__);                                    \
      printf("\n");                                           \
    }                                                         \
  } while (0)

#endif /* TPSH_TEST_CHECK_H */
