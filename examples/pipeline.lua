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
--              gathers j+1.. are still in flight
-- The gathered chunk j holds, for each rank r, rows j of r's shard; they land in Y's rows of rank r at
-- chunk j, so the three schedules write the same rows of the same Y.
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

local function serial()
  local Y = tp.empty({ P * rows, N }, dtype)
  g:all_gather(X, x)
  tp.matmul(X, W, Y)
  return Y
end

local function one_shot()
  local Y = tp.empty({ P * rows, N }, dtype)
  local w = g:all_gather(X, x, { async = true })
  tp.matmul(x, W, Y:narrow(1, me * rows + 1, rows))        -- own rows: no communication needed
  w:wait()
  for r = 0, P - 1 do
    if r ~= me then tp.matmul(X:narrow(1, r * rows + 1, rows), W, Y:narrow(1, r * rows + 1, rows)) end
  end
  return Y
end

local function pipelined()
  local Y = tp.empty({ P * rows, N }, dtype)
  local works = {}
  for j = 1, k do works[j] = g:all_gather(pieces[j], chunks[j], { async = true }) end
  tp.matmul(x, W, Y:narrow(1, me * rows + 1, rows))        -- own rows first, as in one-shot
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
local res = tp.compare({
  { "serial", serial },
  { "one-shot overlap", one_shot },
  { ("pipelined (k=%d)"):format(k), pipelined },
}, { iters = iters, warmup = 2, check = true, rtol = dtype == "f32" and 1e-4 or 2e-2,
     atol = dtype == "f32" and 1e-3 or 5e-2 })
return res
