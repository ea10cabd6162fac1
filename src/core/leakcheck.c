/* leakcheck.c: see leakcheck.h. */
#include "core/leakcheck.h"

static volatile int skip;

void tpsh_leakcheck_skip(void) { skip = 1; }

#ifdef TPSH_ASAN
/* LeakSanitizer calls this, where the program defines it, when its check at exit begins
 * (lsan_common.cpp, CheckForLeaks); a non-zero result skips the check. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return skip; }
#endif
