-- diag_slow_state.lua: what the GPU machine's "slow state" is. The same loop of 1 KiB collectives runs
-- at two speeds in one process (about 7 and 10 us a call, switching every few seconds: docs/perf.md),
-- and tpsh's excess over the C loop grows in the slow one. This runs chunks of the C loop, the C loop
-- with an end event after each call, and g:reduce_scatter, one after the other in each chunk, and notes
-- with every chunk what could explain a slow one:
--   - the loop's host enqueue time against its whole time (enq close to the whole: the host is the
--     bottleneck; well below it: the device is),
--   - the CPU the main thread ran on, and whether it moved,
--   - the hypervisor's steal time on that CPU (/proc/stat), and the other threads of this process that
--     used CPU time during the chunk, with their CPU (/proc/PID/task),
--   - LuaJIT's trace events during the tpsh loop, and (once, at the end) its VM states by sampling,
--   - the wall clock, to line the chunks up with the `nvidia-smi` clocks that gpu_check's `slow` step
--     logs beside it (with each CPU's interrupts, and the placements it runs this under).
--   mpiexec -n 2 tpsh --backend cuda scripts/diag/diag_slow_state.lua [chunks (default $SLOW_CHUNKS or 40)]
--     [calls per chunk (10000)]
local ffi = require "ffi"
local C = ffi.C
local nccl_ref = dofile((arg[0]:match("^(.*)/") or ".") .. "/../bench/nccl_ref_lib.lua")
ffi.cdef [[
  int sched_getcpu(void);
  int getpid(void);
  struct tpsh_diag_timespec { long sec; long nsec; };
  int clock_gettime(int clk, struct tpsh_diag_timespec *ts);
]]
if tp.backend ~= "cuda" then error("diag_slow_state.lua: CUDA only (run with --backend cuda)", 0) end
local g = tp.world
local chunks, N = tonumber(arg[1] or os.getenv("SLOW_CHUNKS") or 40), tonumber(arg[2] or 10000)

-- LuaJIT's trace events (a loop that keeps recording or aborting runs in the interpreter)
local trace_events = {}
jit.attach(function(what) trace_events[what] = (trace_events[what] or 0) + 1 end, "trace")
local function events()
  local t = {}
  for k, v in pairs(trace_events) do t[#t + 1] = k .. " " .. v end
  table.sort(t)
  for k in pairs(trace_events) do trace_events[k] = nil end
  return #t > 0 and "jit: " .. table.concat(t, ", ") or ""
end
local x, half = tp.ones { 256 }, tp.empty { 256 / g.size }
local s = tp.current_stream()
local comm, cst, send, recv = g:handle(), s:handle(), x:data_ptr(), half:data_ptr()
local lib = assert(nccl_ref.load())
local ms, enq = ffi.new("double[1]"), ffi.new("double[1]")

local function wall()
  local ts = ffi.new("struct tpsh_diag_timespec")
  C.clock_gettime(0, ts)
  return tonumber(ts.sec) + tonumber(ts.nsec) * 1e-9
end

-- us a call, whole and host enqueue, of each mode
local function cloop(end_event)
  assert(lib.tpsh_nccl_ref_time(2, send, recv, 256, 7, 4, g.size, comm, cst, N, end_event, ms, enq) == 0)
  return ms[0] * 1000, enq[0] * 1000
end
local function public()
  local t0 = tp.now()
  for _ = 1, N do g:reduce_scatter(half, x) end
  local t1 = tp.now()
  tp.synchronize()
  return (tp.now() - t0) * 1000 / N, (t1 - t0) * 1000 / N
end

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

-- steal ticks of each CPU
local function steal()
  local t = {}
  for cpu, rest in (read("/proc/stat") or ""):gmatch("\ncpu(%d+) ([^\n]*)") do
    local f = {}
    for v in rest:gmatch("%d+") do f[#f + 1] = tonumber(v) end
    t[tonumber(cpu)] = f[8] or 0
  end
  return t
end

-- each thread's CPU ticks (utime + stime) and last CPU
local function threads()
  local t = {}
  local dir = "/proc/" .. C.getpid() .. "/task/"
  local p = io.popen("ls " .. dir .. " 2>/dev/null")
  for tid in p:lines() do
    local st = read(dir .. tid .. "/stat")
    if st then
      local after = st:match("%) (.*)$")
      local f = {}
      for v in after:gmatch("%S+") do f[#f + 1] = v end
      -- fields after the name: 1 state, 12 utime, 13 stime, 37 processor (stat's 3, 14, 15, 39)
      t[tid] = { ticks = tonumber(f[12]) + tonumber(f[13]), cpu = tonumber(f[37]), comm = st:match("%((.-)%)") }
    end
  end
  p:close()
  return t
end

for _ = 1, 3 do cloop(0); public() end
g:barrier()
local rows, ratio_c, ratio_ev, c_us = {}, {}, {}, {}
for k = 1, chunks do
  local st0, th0, cpu0, t0 = steal(), threads(), C.sched_getcpu(), wall()
  local c, ce = cloop(0)
  local ev, eve = cloop(1)
  events()
  local p, pe = public()
  local jit_events = events()
  local cpu1, st1, th1 = C.sched_getcpu(), steal(), threads()
  local others = {}
  for tid, a in pairs(th1) do
    local b = th0[tid]
    local d = a.ticks - (b and b.ticks or 0)
    if d > 0 and a.cpu ~= nil then others[#others + 1] = ("%s@%d:%d"):format(a.comm, a.cpu, d) end
  end
  table.sort(others)
  ratio_c[k], ratio_ev[k], c_us[k] = p / c, p / ev, c
  rows[k] = ("%7.2f %2d %6.2f/%5.2f %6.2f/%5.2f %6.2f/%5.2f %5.3f %5.3f cpu %d->%d steal %d  %s"):format(
    t0 % 1000, k, c, ce, ev, eve, p, pe, p / c, p / ev, cpu0, cpu1, (st1[cpu1] or 0) - (st0[cpu1] or 0),
    table.concat(others, " ") .. " " .. jit_events)
  g:barrier()
end
local all = g:gather(rows, 0)
-- Where the tpsh loop's time goes, by LuaJIT's VM state (N compiled, I interpreted, C a C function
-- called from the interpreter, G garbage collector, J the compiler), sampled once at the end: the
-- profiler's callback could disturb the chunks.
local vm = {}
local profile = require "jit.profile"
profile.start("i1", function(_, samples, state) vm[state] = (vm[state] or 0) + samples end)
public()
profile.stop()
local vm_line = {}
for k, v in pairs(vm) do vm_line[#vm_line + 1] = k .. " " .. v end
table.sort(vm_line)

local function median(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  table.sort(c)
  return c[math.floor((#c + 1) / 2)]
end
local summary = g:gather(("median over %d chunks: C loop %.2f us a call, tpsh / C %.3f, tpsh / (C + end event) %.3f; "
  .. "tpsh's loop by VM state (1 ms samples): %s"):format(chunks, median(c_us), median(ratio_c), median(ratio_ev),
  table.concat(vm_line, ", ")), 0)
if tp.rank == 0 then
  print("wall%1000 k  C loop: us/enq  C+event: us/enq  tpsh: us/enq  tpsh/C tpsh/(C+ev)  main cpu  steal  threads with ticks (name@cpu:ticks)")
  for r = 1, #all do
    print(("== rank %d"):format(r - 1))
    for _, line in ipairs(all[r]) do print(line) end
  end
  for r = 1, #summary do print(("rank %d: %s"):format(r - 1, summary[r])) end
end
