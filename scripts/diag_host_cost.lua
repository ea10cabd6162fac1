-- diag_host_cost.lua: the host's cost per enqueue, with the device cost hidden: the ops are queued
-- behind a spin kernel, few enough that CUDA's launch queue never fills (a full queue blocks the host).
--   mpiexec -n 2 tpsh --backend cuda scripts/diag_host_cost.lua
local g = tp.world
local x, y = tp.ones { 256 }, tp.ones { 16 }
local e0, e1 = tp.event { timing = true }, tp.event { timing = true }
local N = 300
local function host_cost(fn)
  tp.synchronize()
  g:barrier()
  tp.spin(60)
  local t0 = tp.now()
  for _ = 1, N do fn() end
  local us = (tp.now() - t0) * 1000 / N
  tp.synchronize()
  return us
end
local cases = {
  { "all_reduce 1 KiB", function() g:all_reduce(x) end },
  { "all_reduce async + wait", function() g:all_reduce(x, { async = true }):wait() end },
  { "add_ 16 elements", function() y:add_(y) end },
  { "2 timing event records", function() e0:record(); e1:record() end },
}
for r = 1, 3 do
  local parts = {}
  for _, c in ipairs(cases) do parts[#parts + 1] = ("%s %.2f us"):format(c[1], host_cost(c[2])) end
  if tp.rank == 0 then print(("round %d: %s"):format(r, table.concat(parts, ", "))) end
end
