-- bench_overhead.lua: the host cost of enqueuing small ops from Lua, next to the same loop in C.
--
--   tpsh scripts/bench_overhead.lua [iters]         (add --backend cuda on a GPU machine)
--
-- What is timed is the host loop that enqueues N ops (the stream executes them concurrently and is
-- synchronised outside the timed region, every CHUNK ops, so the queue stays short). The C reference,
-- bench_overhead_ref, runs the same loops through the same C API (src/tpsh.h); scripts/bench_overhead.sh
-- runs both in one go and prints the ratio. Figures: docs/perf.md.
local N = tonumber(arg and arg[1]) or 200000
local CHUNK, REPEATS = 10000, 5

local x, y = tp.ones({ 16 }), tp.ones({ 16 })
local side = tp.stream { name = "side" }
local ev = tp.event()

local cases = {
  { "add_ (in place)", function() x:add_(y) end },
  { "a + b (allocates)", function() local _ = x + y end },
  { "event record + stream wait", function() ev:record(); side:wait_event(ev) end },
}

local function run(fn)
  local total = 0
  local done = 0
  while done < N do
    local n = math.min(CHUNK, N - done)
    tp.synchronize()
    local t0 = tp.now()
    for _ = 1, n do fn() end
    total = total + (tp.now() - t0)
    done = done + n
  end
  tp.synchronize()
  return total * 1000 / N          -- us per op
end

local results = {}
for _, c in ipairs(cases) do
  run(c[2])                          -- warm-up: let the JIT compile the loop
  local samples = {}
  for r = 1, REPEATS do samples[r] = run(c[2]) end
  table.sort(samples)
  results[#results + 1] = { name = c[1], us = samples[math.ceil(REPEATS / 2)] }
end

if tp.rank == 0 then
  for _, r in ipairs(results) do print(("lua  %-28s %8.3f us/op"):format(r.name, r.us)) end
end
