-- diag_alloc_rotation.lua: does a fresh output cost its op time because the op writes to another
-- block each time (garbage collected in batches rotates the outputs over many blocks, out of the
-- GPU's L2), or because of the host's allocation? `x * x` on 1M f32 into preallocated outputs
-- rotating over K blocks, beside the fresh loop, in bench_alloc.lua's rounds (20 ops and a sync).
--
--   tpsh --backend cuda scripts/diag/diag_alloc_rotation.lua
local C = require("tpsh.capi").C
local cur = tp.current_stream
local N, ROUNDS = 20, 15
local x = tp.randn({ 2 ^ 20 })

local function per_op_us(fn)
  tp.synchronize()
  local t0 = tp.now()
  for _ = 1, N do fn() end
  tp.synchronize()
  return (tp.now() - t0) * 1e3 / N
end
local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local cases = { { "fresh", function() local _ = x * x end } }
for _, k in ipairs { 1, 4, 16, 64 } do
  local outs = {}
  for j = 1, k do outs[j] = tp.empty({ 2 ^ 20 }) end
  local j = 0
  cases[#cases + 1] = { ("preallocated, %d blocks in turn"):format(k), function()
    j = j % k + 1
    C.tpsh_mul(cur(), outs[j], x, x)
  end }
end
-- Warm-up, as bench_alloc's: until the collector has finished two cycles (before them every fresh
-- output is a miss), at least 200 rounds of each case.
local cycles_at, rounds = tp.memory_stats().gc_cycles, 0
repeat
  for _, c in ipairs(cases) do per_op_us(c[2]) end
  rounds = rounds + 1
until (rounds >= 200 and tp.memory_stats().gc_cycles >= cycles_at + 2) or rounds * N >= 100000
local t = {}
for r = 1, ROUNDS do
  for i, c in ipairs(cases) do
    t[i] = t[i] or {}
    t[i][r] = per_op_us(c[2])
  end
end
for i, c in ipairs(cases) do print(("%-34s %.2f us an op"):format(c[1], median(t[i]))) end
