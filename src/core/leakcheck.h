/* leakcheck.h: LeakSanitizer's check at exit, skipped where a rank ends abnormally.
 *
 * A rank that ends through MPI_Abort or exit on an error (die in main.c, the watchdog, the REPL's abort)
 * deliberately frees nothing: the Lua state is not closed and the streams are not stopped, since another
 * rank may be stuck in a collective and a teardown could wait on it. Everything still allocated then is
 * by design, and LeakSanitizer's report would also replace the rank's exit status with its own. A clean
 * end (the end of a script, os.exit(0), `tpsh test`) is checked as always. Without the sanitizer this
 * only sets a flag that nothing reads. */
#ifndef TPSH_LEAKCHECK_H
#define TPSH_LEAKCHECK_H

/* Defined when the build has AddressSanitizer (and with it LeakSanitizer): gcc and clang. */
#if defined(__SANITIZE_ADDRESS__)
#define TPSH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TPSH_ASAN 1
#endif
#endif

void tpsh_leakcheck_skip(void);
#endif
