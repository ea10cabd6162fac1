-- bench_alloc.lua: what allocation costs a schedule: ops into a fresh output against the same ops into
-- a preallocated one, the host cost of a cached allocation and free, and how far the cache grows past
-- what a loop of temporaries keeps alive.
--
--   tpsh scripts/bench/bench_alloc.lua [--rounds R] [--backend cuda]      (TPSH_NO_MEMORY_CACHING=1: cache off)
--
-- Each case runs N ops back to back R times (default 15) and takes the median per-op time over rounds,
-- fresh and preallocated alternating within each round, so both see the same machine; the time of a
-- round includes the synchronisation after its last op (the page faults of fresh memory happen in
-- the stream, not on the host). Prints one "ratio fresh/preallocated" line per case. Figures:
-- docs/perf.md, "Allocation".
local ROUNDS = 15
local i = 1
while arg and arg[i] do
  if arg[i] == "--rounds" then ROUNDS = tonumber(arg[i + 1]); i = i + 1
  else error("unknown argument " .. arg[i] .. " (expected [--rounds R])", 0) end
  i = i + 1
end

local function median(xs)
  local s = {}
  for k, v in ipairs(xs) do s[k] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or 0.5 * (s[n / 2] + s[n / 2 + 1])
end

local function per_op_us(n, fn)
  tp.synchronize()
  local t0 = tp.now()
  for _ = 1, n do fn() end
  tp.synchronize()
  return (tp.now() - t0) * 1e3 / n
end

local caching = tp.memory_stats().caching and "on" or "off"
-- out_api (the element-wise cases): the preallocated op through the public call with out= (what a
-- script writes, and PyTorch's torch.add(u, v, out=w) in torch_alloc.py), timed in the same rounds:
-- its line is the allocation's share alone, the first line that and the operator's front end.
local function pair(name, n, fresh, prealloc, out_api)
  -- Warm to the steady state: until the collector has finished two cycles, the cache holds none of the
  -- fresh outputs' garbage and each of them is a miss (on CUDA, with its larger budget, some GiB of
  -- them); the line says what that warm-up took.
  local st = tp.memory_stats()
  local cycles_at, miss_at, warm = st.gc_cycles, st.cache_misses, 0
  repeat
    per_op_us(n, fresh); per_op_us(n, prealloc)
    warm = warm + n
  until (warm >= 3 * n and tp.memory_stats().gc_cycles >= cycles_at + 2) or warm >= 100000
  local f, p, o = {}, {}, {}
  -- what the timed rounds cost the allocator: blocks from the backend (a miss: the backend's allocation,
  -- and on the CPU its page faults) and the collector's steps and cycles, per fresh op
  st = tp.memory_stats()
  local warm_misses = st.cache_misses - miss_at
  local miss0, steps0, cycles0 = st.cache_misses, st.gc_steps, st.gc_cycles
  for r = 1, ROUNDS do
    if r % 2 == 0 then f[r] = per_op_us(n, fresh); p[r] = per_op_us(n, prealloc)
    else p[r] = per_op_us(n, prealloc); f[r] = per_op_us(n, fresh) end
    if out_api then o[r] = per_op_us(n, out_api) end
  end
  st = tp.memory_stats()
  local ops = n * ROUNDS
  local mf, mp = median(f), median(p)
  -- one line a case, named with the backend and the cache's state (gpu_check's alloc step runs three)
  print(("ratio fresh/preallocated %-4s cache %-3s %-20s %.3f (fresh %.2f us, preallocated %.2f us; per fresh op "
    .. "%.3f misses, %.3f collector steps, %.3f cycles)"):format(tp.backend, caching, name, mf / mp, mf, mp,
    (st.cache_misses - miss0) / ops, (st.gc_steps - steps0) / ops, (st.gc_cycles - cycles0) / ops))
  if out_api then
    local mo = median(o)
    print(("ratio fresh/out=          %-4s cache %-3s %-20s %.3f (fresh %.2f us, out= %.2f us)"):format(tp.backend,
      caching, name, mf / mo, mf, mo))
  end
  print(("  warm-up to the steady state: %d fresh ops, %d of them misses"):format(warm, warm_misses))
end

-- The preallocated side of the element-wise cases calls the same C op with an output of its own (what
-- an out= argument does), so that both sides run the same kernel.
local C = require("tpsh.capi").C
local cur = tp.current_stream

local s = tp.memory_stats()
print(("backend %s, caching %s, rank %d of %d"):format(s.backend, caching, tp.rank, tp.size))

local a, b, c = tp.randn({ 512, 512 }), tp.randn({ 512, 512 }), tp.empty({ 512, 512 })
pair("matmul 512x512 f32", 20, function() local _ = tp.matmul(a, b) end, function() tp.matmul(a, b, c) end)
local x, y = tp.randn({ 2 ^ 20 }), tp.randn({ 2 ^ 20 })
local out_y, out_w = { out = y }, { out = tp.empty({ 1024 }) }
pair("x * x, 1M f32", 20, function() local _ = x * x end, function() C.tpsh_mul(cur(), y, x, x) end,
  function() tp.mul(x, x, out_y) end)
local u, v = tp.randn({ 1024 }), tp.randn({ 1024 })
local w = tp.empty({ 1024 })
pair("a + b, 4 KiB f32", 2000, function() local _ = u + v end, function() C.tpsh_add(cur(), w, u, v, 1) end,
  function() tp.add(u, v, out_w) end)

-- The host cost of a cache hit: allocate and free (explicitly, and by the collector), no op enqueued.
local function host_us(n, fn)
  local t0 = tp.now()
  for _ = 1, n do fn() end
  return (tp.now() - t0) * 1e3 / n
end
local hosts, hosts_gc = {}, {}
for r = 1, ROUNDS do
  hosts[r] = host_us(100000, function() local t = tp.empty({ 1024 }); t:free() end)
  hosts_gc[r] = host_us(100000, function() local _ = tp.empty({ 1024 }) end)
end
print(("%-34s %.3f us (t:free), %.3f us (the collector frees)"):format("cached alloc + free, host", median(hosts),
  median(hosts_gc)))

-- 100k temporaries: the cache's reserve against the loop's peak of live blocks, and against what the
-- script keeps reachable (x and one temporary; the rest is garbage the collector has not reached yet).
for _, n in ipairs { 1024, 2 ^ 16, 2 ^ 20 } do
  local iters = n >= (2 ^ 20) and 2000 or 100000
  local z = tp.randn({ n })
  collectgarbage(); collectgarbage()
  tp.synchronize()
  tp.empty_cache()
  tp.reset_peak_memory_stats()
  local base = tp.memory_stats()
  local t0 = tp.now()
  for _ = 1, iters do local _ = z + 1 end
  tp.synchronize()
  local ms = tp.now() - t0
  local m = tp.memory_stats()
  local reach = 2 * n * 4
  print(("%-34s reserved peak %8.2f MiB, allocated peak %8.2f MiB (ratio %.2f), reachable %.3f MiB; %.2f us/op, %d steps")
    :format(("%d temporaries of %d KiB"):format(iters, n * 4 / 1024), m.reserved_peak / 2 ^ 20,
      m.allocated_peak / 2 ^ 20, m.reserved_peak / m.allocated_peak, reach / 2 ^ 20, ms * 1e3 / iters,
      m.gc_steps - base.gc_steps))
end
-- The collector's pacing: the 256 KiB loop again with the pacing off (the collector left to the Lua
-- heap alone, as before the allocator counted tensor bytes for it).
do
  local pace = require "tpsh.memory"
  local step = pace.step
  local z = tp.randn({ 2 ^ 16 })
  for _, on in ipairs { true, false } do
    collectgarbage(); collectgarbage()
    tp.synchronize()
    tp.empty_cache()
    tp.reset_peak_memory_stats()
    if not on then pace.step = function() pace.stats.bytes_since_step = 0 end end
    local t0 = tp.now()
    for _ = 1, 20000 do local _ = z + 1 end
    tp.synchronize()
    local us = (tp.now() - t0) * 1e3 / 20000
    pace.step = step
    local m = tp.memory_stats()
    print(("%-34s %.2f us/op, reserved peak %8.2f MiB, %d of 20000 from the backend"):format(
      "pacing " .. (on and "on" or "off") .. ", 256 KiB temporaries", us, m.reserved_peak / 2 ^ 20,
      m.cache_misses))
  end
end

-- A sequence-parallel MLP (all_gather -> GEMM -> GEMM -> reduce_scatter) with fresh temporaries
-- against the same schedule into preallocated buffers, through tp.compare.
do
  local g, rows, d = tp.world, 128, 256
  local x = tp.randn({ rows, d })
  local w1, w2 = tp.randn({ d, 2 * d }), tp.randn({ 2 * d, d })
  local full, h, y = tp.empty({ g.size * rows, d }), tp.empty({ g.size * rows, 2 * d }), tp.empty({ g.size * rows, d })
  local out = tp.empty({ rows, d })
  local r = tp.compare({
    { "mlp, fresh temporaries", function()
      local f = tp.empty({ g.size * rows, d })
      g:all_gather(f, x)
      local o = tp.empty({ rows, d })
      g:reduce_scatter(o, tp.matmul(tp.matmul(f, w1), w2))
      return o
    end },
    { "mlp, preallocated", function()
      g:all_gather(full, x)
      tp.matmul(full, w1, h)
      tp.matmul(h, w2, y)
      g:reduce_scatter(out, y)
      return out
    end },
  }, { iters = 20, check = true, quiet = tp.rank ~= 0 })
  if tp.rank == 0 then
    print(("%-34s ratio %.3f (fresh / preallocated, tp.compare's medians)"):format("mlp on " .. g.size .. " ranks",
      r[1].median / r[2].median))
  end
end
print(tp.memory_summary())
