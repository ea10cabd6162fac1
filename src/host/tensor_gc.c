/*
 * tensor_gc.c: the sweep that frees the storages of the tensors Lua collected, once a collector cycle.
 *
 * Lua's tensors have no finalizer each (core/tensor_registry.c says why): lua/tpsh/tensor.lua keeps
 * each new one in a weak-valued table at the index of its registry entry. A sentinel, a userdata made
 * garbage at once, is finalized at the end of every cycle, after the cycle cleared the table's dead
 * tensors: its finalizer drops their storages, so that memory is back by the end of the cycle that
 * found the tensor dead (a full collectgarbage() frees what it found, as a finalizer per tensor did),
 * and makes the next sentinel. The sweep is C over the Lua API: in Lua it would run interpreted
 * (LuaJIT records no trace in a finalizer), where each call into C costs some 700 instructions.
 *
 * Only the tensors made since the sweep before last are scanned: one that was alive at the last sweep
 * and is still alive gets a finalizer of its own (ffi.gc with tpsh_tensor_drop) and leaves the
 * registry, so that long-lived tensors cost no scan per cycle. Two sweeps rather than one because the
 * tensors made between a cycle's clearing of weak tables and its sweep are alive at that sweep
 * whether or not anything keeps them: in an incremental cycle, many of a loop's temporaries.
 *
 * The sweep runs inside whatever allocation finishes a cycle, with the collector held off (LuaJIT runs
 * no step during a finalizer); it registers nothing and runs no Lua but ffi.gc, so the registry does
 * not change under it.
 */
#include "host/tensor_gc.h"
#include "core/tensor_registry.h"
#include <lauxlib.h>

static int closing;   /* lua_close is running (tpsh_tensor_gc_close) */

/* A new sentinel (mt: its metatable), garbage at once: the next cycle finalizes it. */
static void arm(lua_State *L, int mt) {
  lua_newuserdata(L, 0);
  lua_pushvalue(L, mt);
  lua_setmetatable(L, -2);
  lua_pop(L, 1);
}

/* The tensor on top of the stack gets its own finalizer (upvalues 2 and 3: ffi.gc, tpsh_tensor_drop);
 * 0 if ffi.gc failed (out of memory): it then stays registered. The tensor stays on the stack. */
static int promote(lua_State *L) {
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_pushvalue(L, -2);
  lua_pushvalue(L, lua_upvalueindex(3));
  if (lua_pcall(L, 2, 0, 0) == 0) return 1;
  lua_pop(L, 1);
  return 0;
}

/* The weak table's array part keeps the largest size it ever had, and the collector counts it in the
 * Lua heap, which sets the budget of tensor bytes between cycles (memory.lua): after a burst of small
 * temporaries, a loop of large ones would keep several more of them alive. A sweep that finds far
 * fewer entries than the table was made for moves the survivors to a new one. */
enum { SHRINK_FROM = 4096 };
static int32_t table_high;   /* the most entries the current table has held at a sweep */

/* The sentinel's __gc. Upvalues: 1 the holder, whose field `tensors` is the weak table (index ->
 * tensor), 2 ffi.gc, 3 tpsh_tensor_drop, 4 the sentinel's metatable. Compacts the registry and the
 * table alike: the survivors of their first sweep move to the front, in order. */
static int sweep(lua_State *L) {
  /* While the state closes, ffi.gc adds no finalizer (LuaJIT's finalizer table is off by then) and no
   * cycle clears the table: what is registered then is dropped after lua_close. */
  if (closing) return 0;
  arm(L, lua_upvalueindex(4));
  tpsh_tensor_registry *r = &tpsh_registry;
  int32_t n = r->n, k = 0;
  lua_getfield(L, lua_upvalueindex(1), "tensors");
  int src = lua_gettop(L), dst = src;
  if (n > table_high) table_high = n;
  if (table_high >= SHRINK_FROM && n < table_high / 8) {
    lua_createtable(L, n, 0);
    lua_getmetatable(L, src);
    lua_setmetatable(L, -2);
    dst = lua_gettop(L);
    table_high = n;
  }
  for (int32_t i = 0; i < n; i++) {
    tpsh_registry_entry e = r->entry[i];
    lua_rawgeti(L, src, i + 1);
    if (lua_isnil(L, -1)) {                        /* collected: its storage goes */
      lua_pop(L, 1);
      tpsh_storage_drop_gc(e.storage);
      continue;
    }
    if (e.swept && promote(L)) {                   /* long-lived: its own finalizer has the reference */
      lua_pop(L, 1);
      if (dst == src) { lua_pushnil(L); lua_rawseti(L, src, i + 1); }
      continue;
    }
    r->entry[k] = (tpsh_registry_entry){ e.storage, 1 };
    if (dst != src || k != i) {
      lua_rawseti(L, dst, k + 1);
      if (dst == src) { lua_pushnil(L); lua_rawseti(L, src, i + 1); }
    } else {
      lua_pop(L, 1);
    }
    k++;
  }
  r->n = k;
  if (dst != src) lua_setfield(L, lua_upvalueindex(1), "tensors");
  return 0;
}

/* require("tpsh.tensor_gc")(holder, ffi.gc, C.tpsh_tensor_drop): arms the first sentinel. holder.tensors
 * is the weak table, which the sweep may replace. */
static int install(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 3);
  lua_newtable(L);
  for (int i = 1; i <= 4; i++) lua_pushvalue(L, i);
  lua_pushcclosure(L, sweep, 4);
  lua_setfield(L, 4, "__gc");
  arm(L, 4);
  return 0;
}

void tpsh_tensor_gc_preload(lua_State *L) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_pushcfunction(L, install);
  lua_setfield(L, -2, "tpsh.tensor_gc");
  lua_pop(L, 2);
}

/* The registered storages are dropped after lua_close, not by a last sweep inside it: the finalizers
 * that run while the state closes (the script's ffi.gc ones too) find every registered tensor alive,
 * tensors they make are dropped as well, and no Lua code is left to touch a dropped one. Tensors with
 * a finalizer of their own are dropped inside lua_close, as before: their descriptor's storage is
 * NULL then, and a later finalizer that uses one gets tpsh's "the tensor was freed". */
void tpsh_tensor_gc_close(lua_State *L) {
  closing = 1;
  lua_close(L);
  tpsh_tensor_registry_drop_all();
  closing = 0;
}
