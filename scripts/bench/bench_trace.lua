-- bench_trace.lua: what tracing costs. Two figures, both with and without tracing in the same process:
--   1. per op: the host + device cost of a traced op (two timing events around it), from a loop of
--      tiny ops where the op itself costs almost nothing
--   2. on tp.compare's table at the example sizes: examples/pipeline.lua run in alternating rounds,
--      tracing off / on, the median of each variant's medians over the rounds, and the difference
--
--   mpiexec -n 2 tpsh scripts/bench/bench_trace.lua [rounds] [pipeline args...]
-- On GPUs: mpiexec -n 2 tpsh scripts/bench/bench_trace.lua 5 4096 8192 8192 4 20 bf16
local rounds = tonumber(arg[1]) or 5
local pargs = { select(2, unpack(arg)) }
local say = function(...) if tp.rank == 0 then print(string.format(...)) end end
local median = function(xs)
  local s = { unpack(xs) }
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or 0.5 * (s[n / 2] + s[n / 2 + 1])
end

-- ==== 1. per op ====================================================================================
local t = tp.zeros({ 16 })
local n_ops = 20000
local function tiny() for _ = 1, n_ops do t:fill_(1) end end
local per_op = { off = {}, on = {} }
for _ = 1, rounds do
  for _, mode in ipairs { "off", "on" } do
    if mode == "on" then tp.trace.start() end
    tp.synchronize()
    local t0 = tp.now()
    tiny()
    tp.synchronize()
    per_op[mode][#per_op[mode] + 1] = (tp.now() - t0) / n_ops * 1e3
    tp.trace.stop()
    tp.trace.clear()
  end
end
local off_us, on_us = median(per_op.off), median(per_op.on)
say("per op (fill_ of 16 elements, %d ops, median of %d rounds): %.2f us untraced, %.2f us traced: +%.2f us",
  n_ops, rounds, off_us, on_us, on_us - off_us)

-- ==== 2. the compare table of examples/pipeline.lua ============================================
local chunk = assert(loadfile("examples/pipeline.lua"))
local function run_pipeline()
  local saved_arg, saved_print = arg, print
  arg = pargs
  print = function() end                       -- the example prints its own table each round
  local ok, res = pcall(chunk, unpack(pargs))
  arg, print = saved_arg, saved_print
  if not ok then error(res, 0) end
  return res
end

local med, best = { off = {}, on = {} }, { off = {}, on = {} }
local names, nrec
for _ = 1, rounds do
  for _, mode in ipairs { "off", "on" } do
    if mode == "on" then tp.trace.start() end
    local rows = run_pipeline()
    if mode == "on" then nrec = tp.trace.count() end
    tp.trace.stop()
    tp.trace.clear()
    names = {}
    for i, r in ipairs(rows) do
      names[i] = r.name
      med[mode][r.name] = med[mode][r.name] or {}
      table.insert(med[mode][r.name], r.median)
      best[mode][r.name] = math.min(best[mode][r.name] or math.huge, r.min)
    end
  end
end
say("\nexamples/pipeline.lua %s: tp.compare medians (ms; median over %d alternating rounds) and minima",
  table.concat(pargs, " "), rounds)
say("%-22s %10s %10s %9s   %10s %10s %9s", "variant", "untraced", "traced", "overhead", "min off", "min on",
  "overhead")
say("(a traced run of the example made %d records on rank 0: variants x (warm-up + iterations) x ops)", nrec)
for _, name in ipairs(names) do
  local a, b = median(med.off[name]), median(med.on[name])
  local c, d = best.off[name], best.on[name]
  say("%-22s %10.3f %10.3f %8.1f%%   %10.3f %10.3f %8.1f%%", name, a, b, (b / a - 1) * 100, c, d, (d / c - 1) * 100)
end
