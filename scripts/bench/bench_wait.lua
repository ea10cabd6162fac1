-- bench_wait.lua: what a host's wait for a stream costs, against the ops alone: a tiny op followed by
-- tp.synchronize() (a round trip: host to worker and back), the same op in a loop synchronised once, and a
-- one-rank all_reduce loop. On the CPU backend compare TPSH_CPU_SPIN_US=0 (the threads sleep at once)
-- with the default (they poll first: docs/design.md); figures in docs/perf.md.
--   tpsh [--backend cuda] scripts/bench/bench_wait.lua [iters]
local n = tonumber(arg and arg[1]) or 20000
local x = tp.ones { 16 }
local function per_op(fn)
  fn(); tp.synchronize()
  local t0 = tp.now()
  for _ = 1, n do fn() end
  tp.synchronize()
  return (tp.now() - t0) * 1e3 / n
end
print(("op + synchronize  %8.2f us a round trip"):format(per_op(function() x:add_(1); tp.synchronize() end)))
print(("op loop           %8.2f us an op"):format(per_op(function() x:add_(1) end)))
print(("all_reduce loop   %8.2f us a call (%d rank%s)"):format(per_op(function() tp.world:all_reduce(x) end),
  tp.size, tp.size == 1 and "" or "s"))
