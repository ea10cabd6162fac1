/* repl.h: the REPL's C side as main.c calls it (repl.lua calls the rest through its own cdef). */
#ifndef TPSH_HOST_REPL_H
#define TPSH_HOST_REPL_H

#include <lua.h>

/* Once the Lua state exists: the REPL interrupts a running chunk with a Lua hook set on this state
 * from another thread (repl_interrupt.c). */
void tpsh_repl_attach(lua_State *L);
/* The REPL's helper thread stopped, before MPI finalizes (main.c's os.exit). */
void tpsh_repl_quiesce(void);

#endif /* TPSH_HOST_REPL_H */
