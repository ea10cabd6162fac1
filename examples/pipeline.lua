-- pipeline.lua: all_gather + matmul, split into chunks so that each chunk's matmul waits only for its
-- own piece of the gather.
--
--   mpiexec -n 2 tpsh examples/pipeline.lua [rows K N chunks iters dtype]
--   mpiexec -n 2 tpsh --trace pipeline.svg examples/pipeline.lua      (adds comm / compute / overlap)
--
-- Every rank holds x, rows x K (its shard of the activations) and W, K x N; the result is
-- Y = all_gather(x) @ W, (size * rows) x N, the same on every rank (sequence parallelism's gather
-- before a column-parallel linear layer). Three schedules, compared with tp.compare (check = true: all
-- three must give the same Y):
--   serial     gather on the current stream, then one matmul: the matmul waits for the whole gather
--   one-shot   gather on the comm stream (async); meanwhile the matmul of this rank's own rows, which
--              needs no communication; then wait for the gather and multiply the other ranks' rows
--   pipelined  x in k chunks, each gathered by its own async collective; the matmul of chunk j waits
--              (w[j]:wait(), a stream wait, not a host block) only for gather j, so it runs while
--              gathers j+1.. are still in flight; the own rows' matmul is enqueued first
-- The gathered chunk j holds, for each rank r, rows j of r's shard; they land in Y's rows of rank r at
-- chunk j, so the three schedules write the same rows of the same Y. The parts are timed alone
-- first, and the lines they print say which schedule can win at these sizes and why.
local rows = tonumber(arg[1]) or 256
local K = tonumber(arg[2]) or 1024
local N = tonumber(arg[3]) or 512
local k = tonumber(arg[4]) or 4
local iters = tonumber(arg[5]) or 10
local dtype = arg[6] or "f32"
assert(rows % k == 0, ("rows (%d) must be a multiple of chunks (%d)"):format(rows, k))
local c = rows / k

local g, P, me = tp.world, tp.world.size, tp.world.rank
tp.manual_seed(1)                                          -- W: the same on every rank
local W = tp.randn({ K, N }, dtype)
local x = tp.randn({ rows, K }, dtype, { seed = 100 + me }) -- x: this rank's shard
local X = tp.empty({ P * rows, K }, dtype)                 -- the gathered activations
local chunks = x:chunk(k, 1)                               -- views of x, c rows each
local pieces = {}                                          -- gathered chunks: {P * c, K}
for j = 1, k do pieces[j] = tp.empty({ P * c, K }, dtype) end

-- Y's rows of rank r: its rows (r * rows + 1 ..), and of those, chunk j's c rows.
local function y_rows(Y, r, j, n) return Y:narrow(1, r * rows + (j - 1) * c + 1, n or c) end

-- Each schedule writes its own preallocated Y, so that the timings are the schedules' and not the
-- allocator's, and check = true compares three results.
local outs = { tp.empty({ P * rows, N }, dtype), tp.empty({ P * rows, N }, dtype), tp.empty({ P * rows, N }, dtype) }

local function serial()
  local Y = outs[1]
  g:all_gather(X, x)
  tp.matmul(X, W, Y)
  return Y
end

local function one_shot()
  local Y = outs[2]
  local w = g:all_gather(X, x, { async = true })
  tp.matmul(x, W, Y:narrow(1, me * rows + 1, rows))        -- own rows: no communication needed
  w:wait()
  for r = 0, P - 1 do
    if r ~= me then tp.matmul(X:narrow(1, r * rows + 1, rows), W, Y:narrow(1, r * rows + 1, rows)) end
  end
  return Y
end

local function pipelined()
  local Y = outs[3]
  -- The own rows' matmul is enqueued before the k gathers: the host issues in program order, and
  -- behind k async collectives (tens of us of host time each) the compute stream sat idle; the gathers
  -- still start a few us later, beside the matmul.
  tp.matmul(x, W, Y:narrow(1, me * rows + 1, rows))
  local works = {}
  for j = 1, k do works[j] = g:all_gather(pieces[j], chunks[j], { async = true }) end
  for j = 1, k do
    works[j]:wait()                                        -- chunk j only
    for r = 0, P - 1 do
      if r ~= me then tp.matmul(pieces[j]:narrow(1, r * c + 1, c), W, y_rows(Y, r, j)) end
    end
  end
  return Y
end

if tp.rank == 0 then
  print(("all_gather + matmul on %d rank%s (%s): x %dx%d per rank, W %dx%d, %d chunks, backend %s"):format(
    P, P == 1 and "" or "s", dtype, rows, K, K, N, k, tp.backend))
end

-- Which schedule can win is decided by the parts alone, timed first (the slowest rank's median):
-- one-shot hides the gather behind the matmul of this rank's own rows, so it hides all of it once that
-- matmul is the longer; only a gather longer than it leaves anything for chunks to hide, and chunks
-- cost k - 1 more collectives and k times as many smaller matmuls.
local function slowest(fn)
  local ms = 0
  for _, m in ipairs(tp.allgather(tp.time(fn, { iters = iters, warmup = 2 }).median)) do ms = math.max(ms, m) end
  return ms
end
local t_gather = slowest(function() g:all_gather(X, x) end)
local t_chunks = slowest(function() for j = 1, k do g:all_gather(pieces[j], chunks[j]) end end)
local t_own = slowest(function() tp.matmul(x, W, outs[1]:narrow(1, me * rows + 1, rows)) end)
local t_rest = P > 1 and slowest(function()
  for r = 0, P - 1 do
    if r ~= me then tp.matmul(X:narrow(1, r * rows + 1, rows), W, outs[1]:narrow(1, r * rows + 1, rows)) end
  end
end) or 0
if tp.rank == 0 then
  local left, one_shot_est = t_gather - t_own, math.max(t_gather, t_own) + t_rest
  local pipelined_est = math.max(t_own + t_rest, t_chunks + t_rest / k)   -- the last chunk's matmul waits
  print(("parts alone (ms): gather %.3f (in %d chunks %.3f), matmul of own rows %.3f, of the others' %.3f"):format(
    t_gather, k, t_chunks, t_own, t_rest))
  print(("  serial ~ %.3f, one-shot ~ %.3f (the gather hidden behind the own rows' matmul)"):format(
    t_gather + t_own + t_rest, one_shot_est))
  if left <= 0 then
    print("  that matmul covers the whole gather: chunks have nothing left to hide, and add their costs")
  elseif pipelined_est < one_shot_est then
    print(("  the gather outlasts that matmul by %.3f, which chunks can hide: pipelined at best ~ %.3f"):format(
      left, pipelined_est))
  else
    print(("  the gather outlasts that matmul by %.3f, but %d chunked gathers take %.3f: chunks cost more "
      .. "than they can hide (pipelined at best ~ %.3f)"):format(left, k, t_chunks, pipelined_est))
  end
end
local res = tp.compare({
  { "serial", serial },
  { "one-shot overlap", one_shot },
  { ("pipelined (k=%d)"):format(k), pipelined },
}, { iters = iters, warmup = 2, check = true, rtol = dtype == "f32" and 1e-4 or 2e-2,
     atol = dtype == "f32" and 1e-3 or 5e-2 })
return res
