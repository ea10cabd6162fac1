/*
 * tensor_registry.h: the storages of the tensors Lua holds (core/tensor_registry.c), for the sweep that
 * finds the dead ones once a collector cycle (host/tensor_gc.c). Host thread only.
 */
#ifndef TPSH_TENSOR_REGISTRY_H
#define TPSH_TENSOR_REGISTRY_H

#include "core/internal.h"

typedef struct tpsh_registry_entry {
  tpsh_storage *storage;   /* the reference that the tensor's descriptor holds */
  int32_t swept;           /* it has lived through a sweep already */
} tpsh_registry_entry;

/* entry[i] belongs to the tensor at index i + 1 of Lua's weak table (tpsh_tensor_register's answer). */
typedef struct tpsh_tensor_registry {
  tpsh_registry_entry *entry;
  int32_t n, cap;
} tpsh_tensor_registry;

extern tpsh_tensor_registry tpsh_registry;

/* Drops one tensor's reference to st as the collector's free (check mode names it so). */
void tpsh_storage_drop_gc(tpsh_storage *st);
/* Drops every storage still registered and empties the registry: the Lua state has closed. */
void tpsh_tensor_registry_drop_all(void);

#endif
