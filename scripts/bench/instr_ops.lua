-- instr_ops.lua: a loop of one op for scripts/bench/instr_ops.sh to count under callgrind.
--   tpsh instr_ops.lua CASE N      CASE: add_fresh (u + v into a new tensor), add_out (the same C op into
--                                  a preallocated output), all_reduce (4 KiB, on a world of one rank:
--                                  tpsh's own cost around MPI's, which copies the buffer)
-- Runs 20,000 ops to warm up (traces compiled, the cache and the collector at their steady state), then N.
local case, n = arg[1], tonumber(arg[2])
local C = require("tpsh.capi").C
local cur = tp.current_stream
local u, v, w = tp.randn({ 16 }), tp.randn({ 16 }), tp.empty({ 16 })
local x = tp.ones({ 1024 })
local cases = {
  add_fresh = function() local _ = u + v end,
  add_out = function() C.tpsh_add(cur(), w, u, v, 1) end,
  all_reduce = function() tp.world:all_reduce(x) end,
}
local f = cases[case]
if not f or not n then error("usage: instr_ops.lua add_fresh|add_out|all_reduce N", 0) end
for _ = 1, 20000 do f() end
tp.synchronize()
for _ = 1, n do f() end
tp.synchronize()
