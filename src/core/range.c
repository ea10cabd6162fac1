/*
 * range.c: the script's named ranges (tp.range, tp.range_push, tp.range_pop): phases a researcher names
 * ("layer 3 backward") to find them in a timeline.
 *
 * One stack on the host thread, which alone runs Lua: ranges nest, and a pop must close the innermost.
 * A closed range becomes a record of tpsh's trace (trace.c, category TPSH_TRACE_RANGE, its depth in
 * seq), drawn on a track of its own per rank; and, in a build with CUDA, an NVTX range on this thread
 * (nvtxRangePushA / nvtxRangePop), which Nsight Systems shows beside the CUDA work it encloses. NVTX
 * costs a call through a null pointer when no tool is attached, so it is pushed on either backend.
 */
#include "core/internal.h"
#include "core/trace.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef TPSH_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#define NVTX_PUSH(name) nvtxRangePushA(name)
#define NVTX_POP() nvtxRangePop()
#else
#define NVTX_PUSH(name) ((void)0)
#define NVTX_POP() ((void)0)
#endif

/* Deeper than any real nesting: a loop that pushes without popping is told so at once. */
enum { MAX_DEPTH = 1000 };

typedef struct range { char *name; char where[160]; double t0; } range;
static range stack[MAX_DEPTH];
static int depth;

int tpsh_range_push(const char *name, const char *where) {
  if (!name) return tpsh_error(TPSH_EINVAL, "expected a name");
  if (depth == MAX_DEPTH)
    return tpsh_error(TPSH_EINVAL, "%d ranges are open already, the innermost '%s' (pushed at %s): a "
                      "push without its pop in a loop?", MAX_DEPTH, stack[depth - 1].name, stack[depth - 1].where);
  range *r = &stack[depth];
  if (!(r->name = strdup(name))) return tpsh_error(TPSH_ENOMEM, "out of host memory");
  snprintf(r->where, sizeof r->where, "%s", where && *where ? where : "?");
  r->t0 = tpsh_now_ms();
  depth++;
  NVTX_PUSH(name);
  return TPSH_OK;
}

/* Closes the innermost range: its record, its NVTX pop. */
static void close_top(int unfinished, const char *note) {
  range *r = &stack[--depth];
  tpsh_trace_range(r->name, r->t0, depth, unfinished, note);
  NVTX_POP();
  free(r->name);
  r->name = NULL;
}

int tpsh_range_pop(const char *name) {
  if (depth == 0) return tpsh_error(TPSH_EINVAL, "no range is open (a pop without its push)");
  const range *top = &stack[depth - 1];
  if (name && strcmp(name, top->name) != 0)
    return tpsh_error(TPSH_EINVAL, "the innermost open range is '%s' (pushed at %s), not '%s': ranges close "
                      "innermost first", top->name, top->where, name);
  close_top(0, NULL);
  return TPSH_OK;
}

int tpsh_range_depth(void) { return depth; }
const char *tpsh_range_name(int d) { return d >= 0 && d < depth ? stack[d].name : ""; }
const char *tpsh_range_where(int d) { return d >= 0 && d < depth ? stack[d].where : ""; }

void tpsh_range_pop_to(int d, const char *note) {
  while (depth > d && depth > 0) close_top(0, note);
}

int tpsh_range_close_open(int unfinished) {
  int n = depth;
  while (depth > 0) close_top(unfinished, unfinished ? NULL : "left open at the end of the script");
  return n;
}
