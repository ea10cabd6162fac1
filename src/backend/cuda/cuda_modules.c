/*
 * cuda_modules.c: tpsh's own kernels loaded at start-up, not at their first launch.
 *
 * Under CUDA's lazy loading (the default since CUDA 12.2) a kernel is loaded at its first launch, and
 * the load may wait for the kernels running in the context: a script's first sum on the compute stream
 * ran only after a spin on the communication stream had ended, so chaos mode's delay before an async
 * all_gather hid the race it was to show (scripts/diag/diag_chaos_race.lua), and a first op beside a long
 * collective runs after it instead of beside it. CUDA's guide names the remedy: load the kernels first
 * (its "Lazy Loading" chapter, as NCCL does with its own). Every function of the three modules (one per
 * .cu file, each found by its anchor kernel) is enumerated and loaded here. cuBLAS's kernels stay lazy:
 * its library holds thousands, and which ones a matmul needs depends on its shape; a first matmul of a
 * shape may still wait (tp.compare's warm-up runs it first; CUDA_MODULE_LOADING=EAGER loads them all).
 * Where the driver lacks the calls (before CUDA 12.4), the kernels stay lazy.
 */
#include "backend/cuda/cuda_backend.h"
#include <cuda.h>
#include <stdlib.h>

typedef CUresult (*get_module_fn)(CUmodule *, CUfunction);
typedef CUresult (*count_fn)(unsigned *, CUmodule);
typedef CUresult (*enumerate_fn)(CUfunction *, unsigned, CUmodule);
typedef CUresult (*is_loaded_fn)(CUfunctionLoadingState *, CUfunction);
typedef CUresult (*load_fn)(CUfunction);

/* A driver function of the CUDA 12.4 ABI, where these calls appeared, or NULL. */
static void *driver_fn_124(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12040, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess)
    return fn;
  (void)cudaGetLastError();
  return NULL;
}

int tpsh_cuda_modules_load(void) {
  get_module_fn get_module = (get_module_fn)driver_fn_124("cuFuncGetModule");
  count_fn count = (count_fn)driver_fn_124("cuModuleGetFunctionCount");
  enumerate_fn enumerate = (enumerate_fn)driver_fn_124("cuModuleEnumerateFunctions");
  is_loaded_fn is_loaded = (is_loaded_fn)driver_fn_124("cuFuncIsLoaded");
  load_fn load = (load_fn)driver_fn_124("cuFuncLoad");
  if (!get_module || !count || !enumerate || !is_loaded || !load) return TPSH_OK;
  /* Nothing here is fatal: a kernel not loaded now is loaded at its first launch, as without this file,
   * and a load that fails there reports its error at that launch. */
  const void *anchors[] = {tpsh_cuda_kernels_module(), tpsh_cuda_pointwise_module(), tpsh_cuda_reduce_module()};
  for (size_t a = 0; a < sizeof anchors / sizeof anchors[0]; a++) {
    cudaFunction_t f;
    CUmodule mod;
    unsigned n = 0;
    if (cudaGetFuncBySymbol(&f, anchors[a]) != cudaSuccess) { (void)cudaGetLastError(); continue; }
    if (get_module(&mod, (CUfunction)f) != CUDA_SUCCESS || count(&n, mod) != CUDA_SUCCESS || n == 0) continue;
    CUfunction *fns = malloc(n * sizeof *fns);
    if (!fns) continue;
    if (enumerate(fns, n, mod) == CUDA_SUCCESS) {
      for (unsigned i = 0; i < n; i++) {
        CUfunctionLoadingState st = CU_FUNCTION_LOADING_STATE_LOADED;
        if (is_loaded(&st, fns[i]) == CUDA_SUCCESS && st == CU_FUNCTION_LOADING_STATE_LOADED) continue;
        (void)load(fns[i]);
      }
    }
    free(fns);
  }
  return TPSH_OK;
}
