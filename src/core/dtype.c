/*
 * dtype.c: the table of element types: names (short and long, as PyTorch spells them), sizes.
 * The conversions of f16 and bf16 live in dtype_convert.c.
 */
#include "core/internal.h"
#include <string.h>

static const struct {
  const char *name;
  const char *aliases[3];
  int size, is_float;
} dtypes[TPSH_NDTYPES] = {
  [TPSH_F32] = {"f32", {"float32", "float", NULL}, 4, 1},
  [TPSH_F16] = {"f16", {"float16", "half", NULL}, 2, 1},
  [TPSH_BF16] = {"bf16", {"bfloat16", NULL, NULL}, 2, 1},
  [TPSH_F64] = {"f64", {"float64", "double", NULL}, 8, 1},
  [TPSH_I32] = {"i32", {"int32", "int", NULL}, 4, 0},
  [TPSH_I64] = {"i64", {"int64", "long", NULL}, 8, 0},
  [TPSH_U8] = {"u8", {"uint8", "byte", NULL}, 1, 0},
};

int tpsh_dtype_from_name(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < TPSH_NDTYPES; i++) {
    if (strcmp(name, dtypes[i].name) == 0) return i;
    for (int a = 0; a < 3 && dtypes[i].aliases[a]; a++)
      if (strcmp(name, dtypes[i].aliases[a]) == 0) return i;
  }
  return -1;
}

static int valid(int dtype) { return dtype >= 0 && dtype < TPSH_NDTYPES; }

const char *tpsh_dtype_name(int dtype) { return valid(dtype) ? dtypes[dtype].name : "?"; }
TPSH_HOT int tpsh_dtype_size(int dtype) { return valid(dtype) ? dtypes[dtype].size : 0; }
int tpsh_dtype_is_float(int dtype) { return valid(dtype) && dtypes[dtype].is_float; }
