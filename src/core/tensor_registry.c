/*
 * tensor_registry.c: the storages of the tensors Lua holds, which have no finalizer each.
 *
 * A cdata whose metatype has __gc cost about 1,500 instructions more to make and collect than a plain
 * one (LuaJIT keeps each in its finalizer table and calls the finalizer through its interpreted FFI),
 * most of what an op into a fresh output cost more than into a preallocated one (docs/design.md). So
 * lua/tpsh/tensor.lua keeps each new tensor in a weak-valued table, at the index tpsh_tensor_register
 * returns, and this registry keeps its storage at the same index: the cdata's own memory is freed in
 * the collector's sweep, before a finalizer could read it. Once a cycle a sentinel's finalizer
 * (host/tensor_gc.c) finds the entries whose tensor the collector cleared from the table and drops
 * their storages here; an entry whose tensor lives through two sweeps leaves the registry for a
 * finalizer of its own, so that long-lived tensors cost no cycle a scan.
 */
#include "core/tensor_registry.h"
#include "core/check.h"
#include <stdlib.h>

tpsh_tensor_registry tpsh_registry;

static int grow(tpsh_tensor_registry *r) {
  int32_t cap = r->cap ? 2 * r->cap : 1024;
  if (cap < r->cap) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  tpsh_registry_entry *e = realloc(r->entry, (size_t)cap * sizeof *e);
  if (!e) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  r->entry = e;
  r->cap = cap;
  return TPSH_OK;
}

TPSH_HOT int32_t tpsh_tensor_register(const tpsh_tensor *t) {
  tpsh_tensor_registry *r = &tpsh_registry;
  if (__builtin_expect(r->n == r->cap, 0) && grow(r)) return 0;
  r->entry[r->n] = (tpsh_registry_entry){ t->storage, 0 };
  return ++r->n;
}

void tpsh_storage_drop_gc(tpsh_storage *st) {
  if (tpsh_check_on) tpsh_check_set_free_origin(TPSH_FREE_GC);        /* sanitizer: a user tensor dies */
  tpsh_storage_unref(st);
  if (tpsh_check_on) tpsh_check_set_free_origin(TPSH_FREE_INTERNAL);
}

void tpsh_tensor_registry_drop_all(void) {
  tpsh_tensor_registry *r = &tpsh_registry;
  for (int32_t i = 0; i < r->n; i++) tpsh_storage_drop_gc(r->entry[i].storage);
  free(r->entry);
  *r = (tpsh_tensor_registry){ 0 };
}
