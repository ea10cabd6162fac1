-- profile_loop.lua: one loop of 1 KiB reduce_scatters, timed, for scripts/diag/profile_collective.sh to
-- sample: arg[1] = cloop (the C loop of nccl_ref, libtpsh_nccl_ref.so) | cloop_ev (the same with an
-- end event after each call, as a Work records) | raw (ncclReduceScatter through the FFI) | public
-- (g:reduce_scatter), arg[2] = calls. CUDA only.
local ffi = require "ffi"
local C = ffi.C
local g = tp.world
local mode, N = arg[1], tonumber(arg[2] or 100000)
local x, half = tp.ones { 256 }, tp.empty { 256 / g.size }
local s = tp.current_stream()
local nccl_ref = dofile((arg[0]:match("^(.*)/") or ".") .. "/../bench/nccl_ref_lib.lua")   -- NCCL's and the C loop's calls
local comm, cst, send, recv = g:handle(), s:handle(), x:data_ptr(), half:data_ptr()
local count = 256 / g.size
local fn
if mode == "raw" then fn = function() C.ncclReduceScatter(send, recv, count, 7, 0, comm, cst) end
elseif mode == "public" then fn = function() g:reduce_scatter(half, x) end
end
local cloop = mode == "cloop" or mode == "cloop_ev"
if not fn and not cloop then
  error("profile_loop.lua: expected raw, public, cloop or cloop_ev, got " .. tostring(mode), 0)
end
local function loop(n) for _ = 1, n do fn() end end
if cloop then
  local end_event = mode == "cloop_ev" and 1 or 0
  local lib = assert(nccl_ref.load())
  local ms, enq = ffi.new("double[1]"), ffi.new("double[1]")
  loop = function(n)
    assert(lib.tpsh_nccl_ref_time(2, send, recv, 256, 7, 4, g.size, comm, cst, n, end_event, ms, enq) == 0)
  end
end
loop(2000); tp.synchronize(); g:barrier()
local t0 = tp.now()
loop(N)
tp.synchronize()
local us = (tp.now() - t0) * 1000 / N
if tp.rank == 0 then print(("%s: %.2f us a call"):format(mode, us)) end
