-- overlap.lua: all_gather + matmul, serial versus overlapped, both checked.
--
--   mpiexec -n 2 tpsh examples/overlap.lua [N] [MiB_per_rank] [dtype] [iters]
--   defaults: N = 512 (an N x N x N matmul), 8 MiB gathered per rank, f32, 5 iterations
--   on GPUs: mpiexec -n 8 tpsh examples/overlap.lua 8192 256 bf16
--
-- The pattern of tensor-parallel layers: gather the next layer's input while this layer's matmul
-- runs. Serial: the gather and the matmul on the current stream, one after the other. Overlapped:
-- the gather on the group's comm stream (async = true), the matmul on the current stream at the same
-- time, then the current stream waits for the gather (w:wait(), the host does not block). The two
-- are independent, so the overlapped schedule should take about max(comm, compute) instead of the
-- sum. (On the CPU backend the "device" is the same cores as MPI's progress: on a 2-core machine
-- with 2 ranks the matmul and the polling MPI transfer compete for them and overlap gains little or
-- nothing; on a GPU, NCCL and the matmul use different engines.)
local g = tp.world
local n, r = g.size, g.rank
local N = tonumber(arg[1]) or 512
local MiB = tonumber(arg[2]) or 8
local dtype = arg[3] or "f32"
local iters = tonumber(arg[4]) or 5

local function say(...) if r == 0 then print(string.format(...)) end end
-- The matmul's check uses 0.5 (b's entries): a float dtype, which is what the schedule is about anyway.
local floats = { f32 = true, f64 = true, f16 = true, bf16 = true }
if not floats[dtype] then
  error(("overlap.lua: dtype %s: expected a float dtype (f32, f64, f16 or bf16)"):format(tostring(dtype)), 0)
end

local esize = tp.empty({ 1 }, dtype):nbytes()
local count = math.max(1, math.floor(MiB * 2 ^ 20 / esize))
local x = tp.full({ count }, r + 1, dtype)       -- rank q contributes q + 1 everywhere
local gathered = tp.empty({ n * count }, dtype)
local a = tp.full({ N, N }, 1, dtype)
local b = tp.full({ N, N }, 0.5, dtype)
local c = tp.empty({ N, N }, dtype)

-- The expected results, computed without communication.
local expected_gather = tp.cat((function()
  local parts = {}
  for q = 0, n - 1 do parts[q + 1] = tp.full({ count }, q + 1, dtype) end
  return parts
end)(), 1)
local expected_c = tp.full({ N, N }, N * 0.5, dtype)

local function check(name)
  assert(tp.equal(gathered, expected_gather), name .. ": the gathered tensor is wrong")
  assert(tp.allclose(c, expected_c, 1e-2, 0), name .. ": the matmul result is wrong")
end

local schedules = {
  { "comm only", function() g:all_gather(gathered, x) end },
  { "matmul only", function() tp.matmul(a, b, c) end },
  { "serial", function()
      g:all_gather(gathered, x)
      tp.matmul(a, b, c)
    end },
  { "overlapped", function()
      local w = g:all_gather(gathered, x, { async = true })
      tp.matmul(a, b, c)
      w:wait()
    end },
}

say("# all_gather of %.1f MiB per rank (%d rank%s) + %d^3 %s matmul, median of %d", count * esize / 2 ^ 20,
  n, n == 1 and "" or "s", N, dtype, iters)
local results = {}
for _, sch in ipairs(schedules) do
  local name, fn = sch[1], sch[2]
  gathered:fill_(0)
  c:fill_(0)
  fn()                                           -- warm-up
  local times = {}
  for i = 1, iters do
    tp.synchronize()
    g:barrier()
    local t0 = tp.now()
    fn()
    tp.synchronize()
    times[i] = tp.now() - t0
  end
  table.sort(times)
  local med = 0.5 * (times[math.floor((iters + 1) / 2)] + times[math.floor(iters / 2) + 1])
  local worst = 0
  for _, v in ipairs(g:allgather(med)) do worst = math.max(worst, v) end
  results[name] = worst
  if name == "serial" or name == "overlapped" then check(name) end
  say("%-12s %9.2f ms", name, worst)
end
local comm, mm = results["comm only"], results["matmul only"]
say("overlapped / serial = %.2f (ideal: max(comm, matmul) / (comm + matmul) = %.2f)",
  results.overlapped / results.serial, math.max(comm, mm) / (comm + mm))
-- How much of the shorter part the overlap hid: 1 = all of it, 0 = none (DEVICE.md's definition; the
-- serial sum is taken from the parts measured alone, as the C reference does).
local efficiency = (mm + comm - results.overlapped) / math.min(mm, comm)
say("overlap efficiency = (matmul + comm - overlapped) / min(matmul, comm) = %.2f", efficiency)
-- Said rather than clamped, so that the figure stays what was measured.
if efficiency < 0 then
  say("  (below 0: overlapped took longer than the two parts one after the other; on the CPU backend the "
    .. "comm and compute threads may share too few cores)")
elseif efficiency > 1 then
  say("  (above 1: each figure is a median of its own runs, and their spread is larger than the shorter "
    .. "part; more iterations give a figure to trust)")
end
