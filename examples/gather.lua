-- gather.lua: Megatron's GatherFromTensorModelParallelRegion (forward: all_gather along the last
-- dimension) in three schedules, each checked against the expected result, with host-clock timings.
--
--   mpiexec -n 2 tpsh examples/gather.lua [rows] [cols_per_rank] [compute_ms]
--
-- Megatron's _gather_along_last_dim: every rank holds x of shape {rows, cols}; the output is
-- {rows, size * cols}, rank q's x in columns q*cols+1 .. (q+1)*cols. As in Megatron, we gather into a
-- list of size tensors and concatenate along the last dimension.
--
-- Does wait() block the host?  No. What this example prints on the CPU backend (2 ranks, the 2-core
-- build machine; a GPU behaves the same way) for schedule 2, where the collective is queued behind 200 ms
-- of compute on the current stream:
--     async call returned after     0.1 ms (host)
--     w:wait() returned after       0.1 ms (host)    <- the host did not wait
--     result complete after       200.6 ms (host), 0.4 ms on the comm stream
--                                                    <- w:block(): now the host waits; the gather
--                                                       itself took 0.4 ms once the compute was done
-- In 20 runs the async call returned in 0.0-0.3 ms (once 1.5 ms), and the gather took 0.2-13 ms (once
-- 58 ms): on 2 cores each rank's host and comm stream share the cores with the other rank's, and the
-- ranks' spins end at different times (a spinning stream yields its core every 50 us).
-- wait() only makes the current stream wait for the collective's end event (cudaStreamWaitEvent):
-- ops enqueued after it are ordered after the gather, the host runs on at once. Only w:block(),
-- reading a tensor back (totable, item) or tp.synchronize() block the host.
local g = tp.world
local n, r = g.size, g.rank
local rows = tonumber(arg[1]) or 64
local cols = tonumber(arg[2]) or 256
local compute_ms = tonumber(arg[3]) or 200

local function say(...) if r == 0 then print(string.format(...)) end end

-- x on rank q: q * 1e4 + row * 100 + col (1-based row, col), exact in f32 for these sizes
local function input_of(q)
  local x = tp.empty({ rows, cols })
  local row = tp.arange(cols, "f32")
  for i = 1, rows do x:select(1, i):copy_(row) end
  x:add_(q * 1e4 + 1)
  local rowoff = tp.arange(rows, "f32"):mul_(100):view({ rows, 1 })
  for j = 1, cols do x:narrow(2, j, 1):add_(rowoff) end
  return x
end

-- The expected output, built without communication.
local expected = tp.cat((function()
  local parts = {}
  for q = 0, n - 1 do parts[q + 1] = input_of(q) end
  return parts
end)(), -1)

local function gather_along_last_dim(x, opts)
  local list = {}
  for q = 1, n do list[q] = tp.empty_like(x) end
  local w = g:all_gather(list, x, opts)
  return list, w
end

local function check(name, out)
  assert(tp.equal(out, expected), name .. ": wrong result")
  say("%-34s ok: shape {%d, %d}", name, out:size(1), out:size(2))
end

local x = input_of(r)
tp.synchronize()

-- 1. On the current stream: in order with everything else, nothing to wait for.
local list = gather_along_last_dim(x)
check("1. current stream", tp.cat(list, -1))

-- 2. async + wait: the gather runs on the group's comm stream, which first waits for the current
--    stream (here: compute_ms of compute); wait() orders the current stream after it.
g:comm_stream()               -- created on first use (a thread): made here so that the timing is the call's
g:barrier()
local t0 = tp.now()
tp.spin(compute_ms)
local list2, w = gather_along_last_dim(x, { async = true, timing = true })   -- timing: for w:elapsed()
local t_call = tp.now() - t0
w:wait()
local t_wait = tp.now() - t0
local out2 = tp.cat(list2, -1)                  -- enqueued after the gather, on the current stream
w:block()
local t_done = tp.now() - t0
check("2. async + wait", out2)
say("   async call returned after %7.1f ms (host)", t_call)
say("   w:wait() returned after   %7.1f ms (host)", t_wait)
say("   result complete after     %7.1f ms (host), %.1f ms on the comm stream", t_done, w:elapsed())

-- 3. Launched from a custom stream, with compute in between on the default stream: the gather is
--    enqueued on s (the current stream inside with_stream), the default stream computes meanwhile,
--    then waits for the gather before using its result.
local s = tp.stream { name = "tp-gather" }
-- Warm-up: on 2 H200s, without this line, the first matmul of the process blocked the host behind the
-- compute queued ahead of it (the host "enqueued" schedule 3 in 128 ms, not 0.2). The likely cause is
-- CUDA's lazy module loading (a kernel's first launch loads its module and can wait for the device);
-- warming up keeps first-use costs out of any measurement.
tp.matmul(tp.ones({ 64, 64 }), tp.ones({ 64, 64 }))
tp.synchronize()
g:barrier()
t0 = tp.now()
local list3, w3 = tp.with_stream(s, gather_along_last_dim, x)
tp.spin(compute_ms / 2)                          -- compute on the default stream, concurrently
local y = tp.matmul(tp.ones({ 64, 64 }), tp.ones({ 64, 64 }))
w3:wait()                                        -- the default stream waits for s's gather
local out3 = tp.cat(list3, -1)
t_call = tp.now() - t0
tp.synchronize()
check("3. custom stream + compute", out3)
assert(y:max_abs_diff(tp.full({ 64, 64 }, 64)) == 0, "compute went wrong")
say("   host enqueued everything in %.1f ms; all done after %.1f ms", t_call, tp.now() - t0)
