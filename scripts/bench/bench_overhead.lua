-- bench_overhead.lua: the host cost of enqueuing small ops from Lua, next to the same loop in C.
--
--   tpsh scripts/bench/bench_overhead.lua [iters] [--ref build/libtpsh_overhead_ref.so] [--rounds R]
--                                                    (add --backend cuda on a GPU machine)
--
-- What is timed is the host loop that enqueues N ops (the stream executes them concurrently and is
-- synchronised outside the timed region, every CHUNK ops, so the queue stays short: below the CPU backend's
-- bound of 1024 pending ops a stream, past which the host would wait for room). The C reference,
-- bench_overhead_ref, runs the same loops through the same C API (src/tpsh.h); scripts/bench/bench_overhead.sh
-- runs both in one go and prints the ratio. Figures: docs/perf.md.
--
-- --ref LIB (CUDA): plain CUDA's loops (scripts/bench/overhead_ref.cu, built as libtpsh_overhead_ref.so) run in
-- this process on tpsh's streams and buffers (s:handle(), t:data_ptr()), alternately with the Lua
-- loops, R rounds a case (default 9), the order swapped every round; each case prints "paired" with the
-- median over the rounds of Lua's time over CUDA's in the same round, and both sides' medians. Two
-- processes cannot be compared that finely on the lent GPU machine: one process's host is up to 2x
-- faster than the next one's.
local ffi = require "ffi"
local N, ref_path, ROUNDS = 200000, nil, 9
local i = 1
while arg and arg[i] do
  local a = arg[i]
  if a == "--ref" then ref_path = arg[i + 1]; i = i + 1
  elseif a == "--rounds" then ROUNDS = tonumber(arg[i + 1]); i = i + 1
  elseif tonumber(a) then N = tonumber(a)
  else error("unknown argument " .. a .. " (expected [iters] [--ref LIB] [--rounds R])", 0) end
  i = i + 1
end
local CHUNK, REPEATS = 1000, 5

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

local median = require("tpsh.measure").median

if ref_path then
  if tp.backend ~= "cuda" then error("--ref: plain CUDA's loops need --backend cuda", 0) end
  ffi.cdef [[
    int tpsh_overhead_ref_time(int which, void *current, void *other, float *xp, float *yp, long n, double *us);
  ]]
  local ok, ref = pcall(ffi.load, ref_path)
  if not ok then error("--ref: cannot load " .. ref_path .. ": " .. tostring(ref), 0) end
  local us = ffi.new("double[1]")
  local cur = tp.current_stream()
  local function c_run(which)
    assert(ref.tpsh_overhead_ref_time(which, cur:handle(), side:handle(), ffi.cast("float *", x:data_ptr()),
      ffi.cast("float *", y:data_ptr()), N, us) == 0, "the CUDA reference failed")
    return us[0]
  end
  for which, c in ipairs(cases) do
    run(c[2])
    c_run(which - 1)                   -- warm-ups
    local lua, cuda, ratios = {}, {}, {}
    for r = 1, ROUNDS do
      if r % 2 == 1 then cuda[r] = c_run(which - 1) end
      lua[r] = run(c[2])
      if r % 2 == 0 then cuda[r] = c_run(which - 1) end
      ratios[r] = lua[r] / cuda[r]
    end
    if tp.rank == 0 then
      print(("paired lua/cuda %-28s %6.3fx (median of %d rounds; lua %.3f us, cuda %.3f us)"):format(c[1],
        median(ratios), ROUNDS, median(lua), median(cuda)))
    end
  end
  return
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
