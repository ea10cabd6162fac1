-- nccl_ref_lib.lua: for the scripts that time NCCL called from C and from Lua in tpsh's own process
-- (bench_collectives.lua --ref, diag_host_cost.lua, profile_loop.lua): the declarations of
-- libtpsh_nccl_ref.so (scripts/bench/nccl_ref_loop.h) and of the NCCL calls they make through the FFI, once,
-- and the library's loader.
--   local ref = dofile((arg[0]:match("^(.*)/") or ".") .. "/nccl_ref_lib.lua")
--   ref.load([path])  the library, or nil and why; without a path, the first of $TPSH_NCCL_REF,
--                     build/ and .gpu/build/ that loads
local ffi = require "ffi"

ffi.cdef [[
  int tpsh_nccl_ref_op(const char *name);
  int tpsh_nccl_ref_time(int op, void *a, void *b, long count, int nccl_type, int elsize, int nranks,
                         void *comm, void *stream, int iters, int end_event, double *ms, double *enq_ms);
  const char *tpsh_nccl_ref_error(void);
  int ncclReduceScatter(const void *send, void *recv, size_t count, int type, int op, void *comm, void *st);
  int ncclAllGather(const void *send, void *recv, size_t count, int type, void *comm, void *st);
  int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, void *comm, void *st);
]]

local M = {}

function M.load(path)
  if path then
    local ok, lib = pcall(ffi.load, path)
    if ok then return lib end
    return nil, tostring(lib)
  end
  local why
  for _, p in ipairs({ os.getenv("TPSH_NCCL_REF") or "", "build/libtpsh_nccl_ref.so", ".gpu/build/libtpsh_nccl_ref.so" }) do
    local lib, err = M.load(p)
    if lib then return lib end
    why = why or err
  end
  return nil, why
end

return M
