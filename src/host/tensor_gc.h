/* tensor_gc.h: the sweep that frees the storages of the tensors Lua collected (host/tensor_gc.c). */
#ifndef TPSH_HOST_TENSOR_GC_H
#define TPSH_HOST_TENSOR_GC_H
#include <lua.h>
/* Makes require("tpsh.tensor_gc") the sweep's installer (lua/tpsh/tensor.lua calls it): before tpsh loads. */
void tpsh_tensor_gc_preload(lua_State *L);
/* lua_close(L), then the storages of the tensors it still held. */
void tpsh_tensor_gc_close(lua_State *L);
#endif
