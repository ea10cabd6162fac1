/*
 * cpu_relax.h: the pause a polling loop takes between two looks (the CPU streams' polls, cpu_poll.c, and the
 * C reference's stream thread, scripts/bench/mpi_ref_loop.c): it lets the core's other hardware thread run
 * and keeps the loop from flooding the memory system with loads.
 */
#ifndef TPSH_CPU_RELAX_H
#define TPSH_CPU_RELAX_H

static inline void tpsh_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

#endif
