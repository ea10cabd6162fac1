-- bench_collectives.lua: an nccl-tests-style sweep of tpsh's collectives.
--
--   mpiexec -n N tpsh scripts/bench/bench_collectives.lua [--min 1K] [--max 64M] [--ops all_gather,...]
--                [--dtype f32] [--iters N] [--warmup N] [--async] [--csv FILE]
--                [--rounds R] [--ref build/libtpsh_nccl_ref.so [--ref-event]]
--                (CPU backend: --ref build/libtpsh_mpi_ref.so [--ref-thread])
--
-- For each collective and size: the time of one call (us), algbw = size / time and busbw = algbw x
-- nccl-tests' factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast
-- 1). "size" is nccl-tests' too: the whole gathered output (all_gather), the whole input
-- (reduce_scatter), the buffer (all_reduce, broadcast), one rank's send buffer (all_to_all).
-- Timing: after a barrier, `iters` calls are enqueued back to back on the current stream (or with
-- --async on the comm stream) and the host waits for the last; the time is the slowest rank's. The
-- iteration counts depend on the size only (iters_for below), exactly as in bench_collectives_ref.c,
-- so that scripts/bench/bench_collectives.sh compares like with like. The CSV also has the host time of the
-- enqueue loop alone per call (enqueue_us): while it stays below the time per call, the device is what
-- limits the loop; where it reaches it, the host is.
--
-- --rounds R times each size R times and keeps the best (the lowest time, as nccl-tests users read the
-- best of several runs). --ref LIB adds the C reference in this same process: on CUDA the loop of
-- scripts/bench/nccl_ref_loop.c, which nccl_ref also runs, loaded from libtpsh_nccl_ref.so and called on this
-- process's communicator, stream and buffers (g:handle(), s:handle(), t:data_ptr()); on the CPU backend
-- the blocking MPI loop of scripts/bench/mpi_ref_loop.c, which bench_collectives_ref also runs, from
-- libtpsh_mpi_ref.so, called from the host thread on the group's communicator and tpsh's buffers (f32
-- only). Either alternates with tpsh's calls, round by round, the order swapped every round. Both sides then share whatever makes one
-- process faster than another (on the lent GPU machine a small collective costs the host 6 us in one
-- process and 10 in the next, each steady within itself; docs/perf.md), which a comparison of two
-- processes cannot cancel. The table and the CSV add the reference's best time and the median over the
-- rounds of tpsh's time over the reference's in the same round (the CSV also each round's ratio).
-- --ref-event adds a third side, the same C loop with an untimed event recorded after every call (what
-- a Work's end event costs; PyTorch records one too), taken in turn with the other two: tpsh over it
-- is what tpsh costs beyond NCCL and the Work contract (CSV: ref_event_time_us, paired_ratio_event,
-- round_ratios_event). --ref-thread is the CPU backend's third side: the C loop's calls handed one at a
-- time to a thread of their own (tpsh_mpi_ref_time_thread), as tpsh's are to a stream's worker: tpsh over
-- it is what tpsh costs beyond the threads-as-streams model (CSV: ref_thread_time_us, paired_ratio_thread,
-- round_ratios_thread, in the event columns' places).
local ffi = require "ffi"
local g = tp.world
local n = g.size

local function parse_size(s)
  local num, unit = tostring(s):match("^(%d+)([KkMmGg]?)i?[Bb]?$")
  if not num then error("bad size " .. tostring(s) .. " (expected e.g. 1024, 1K, 64M)", 0) end
  local mult = ({ [""] = 1, k = 2 ^ 10, m = 2 ^ 20, g = 2 ^ 30 })[unit:lower()]
  return tonumber(num) * mult
end

local opts = { min = 2 ^ 10, max = 64 * 2 ^ 20, dtype = "f32",
  ops = { "all_gather", "all_reduce", "reduce_scatter", "broadcast", "all_to_all" } }
local i = 1
while arg[i] do
  local a, v = arg[i], arg[i + 1]
  if a == "--min" then opts.min = parse_size(v); i = i + 1
  elseif a == "--max" then opts.max = parse_size(v); i = i + 1
  elseif a == "--dtype" then opts.dtype = v; i = i + 1
  elseif a == "--iters" then opts.iters = tonumber(v); i = i + 1
  elseif a == "--warmup" then opts.warmup = tonumber(v); i = i + 1
  elseif a == "--csv" then opts.csv = v; i = i + 1
  elseif a == "--rounds" then opts.rounds = tonumber(v); i = i + 1
  elseif a == "--ref" then opts.ref = v; i = i + 1
  elseif a == "--ref-event" then opts.ref_event = true
  elseif a == "--ref-thread" then opts.ref_thread = true
  elseif a == "--async" then opts.async = true
  elseif a == "--ops" then
    opts.ops = {}
    for op in v:gmatch("[^,]+") do opts.ops[#opts.ops + 1] = op end
    i = i + 1
  else error("unknown argument " .. a, 0) end
  i = i + 1
end

local rounds = opts.rounds or 1
if rounds ~= math.floor(rounds) or rounds < 1 then error("--rounds: expected a positive integer", 0) end

-- The in-process C reference (--ref): NCCL's dtype numbers, and the buffers as the C loop takes them
-- (a = the send buffer, b = the receive buffer; one buffer for the in-place collectives).
local ref
local nccl_types = { f32 = 7, f16 = 6, bf16 = 9, f64 = 8 }
for _, o in ipairs { "ref_event", "ref_thread" } do
  local flag = "--" .. o:gsub("_", "-")
  if opts[o] and not opts.ref then error(flag .. ": it adds a side to --ref LIB, which is missing", 0) end
end
local cpu_ref = opts.ref and tp.backend ~= "cuda"
if opts.ref_thread and not cpu_ref then error("--ref-thread: a side of the CPU backend's C loop (CUDA: --ref-event)", 0) end
if cpu_ref then
  if opts.dtype ~= "f32" then error("--ref: the CPU backend's C loop calls MPI on floats: --dtype f32 only", 0) end
  if opts.ref_event then error("--ref-event: the CPU backend's C loop has no events (CUDA only; CPU: --ref-thread)", 0) end
  if opts.async then error("--ref: the CPU backend's C loop runs on the host thread, tpsh's on the current stream "
    .. "(leave out --async)", 0) end
  ffi.cdef [[
    int tpsh_mpi_ref_op(const char *name);
    double tpsh_mpi_ref_time(int op, void *a, void *b, long count, const void *comm, int iters);
    double tpsh_mpi_ref_time_thread(int op, void *a, void *b, long count, const void *comm, int iters);
  ]]
  local ok, lib = pcall(ffi.load, opts.ref)
  if not ok then error("--ref: cannot load " .. opts.ref .. ": " .. tostring(lib), 0) end
  ref = lib
elseif opts.ref then
  if not nccl_types[opts.dtype] then error("--ref: dtype " .. opts.dtype .. " has no NCCL type here", 0) end
  local lib, why = dofile((arg[0]:match("^(.*)/") or ".") .. "/nccl_ref_lib.lua").load(opts.ref)
  if not lib then error("--ref: cannot load " .. opts.ref .. ": " .. why, 0) end
  ref = lib
end

-- Same formula as bench_collectives_ref.c: about 256 MiB per measurement, 10 to 1000 calls (fewer
-- make the figures of a shared 2-core machine too noisy to compare).
local function iters_for(bytes)
  if opts.iters then return opts.iters end
  return math.max(10, math.min(1000, math.floor(256 * 2 ^ 20 / bytes)))
end
-- Warm-up calls, untimed: below 16 MiB a tenth of the timed calls (at least 3, at most 100), so that
-- LuaJIT has compiled the timing loop before it is timed (it records a loop after 56 iterations, and a
-- side trace after 10 exits). With 3 warm-up calls, the first ~60 timed calls ran in the interpreter and
-- the compilation was timed too: about 0.5 us more per call, averaged over 1000 calls of 1 KiB.
-- bench_sizes.h gives the C references the same counts.
local function warmup_for(bytes)
  if opts.warmup then return opts.warmup end
  if bytes >= 16 * 2 ^ 20 then return 1 end
  return math.max(3, math.min(100, math.floor(iters_for(bytes) / 10)))
end

local esize = tp.empty({ 1 }, opts.dtype):nbytes()
local factor = { all_reduce = 2 * (n - 1) / n, all_gather = (n - 1) / n, reduce_scatter = (n - 1) / n,
  broadcast = 1, all_to_all = (n - 1) / n, send_recv = 1 }
-- send_recv: ranks in pairs (0-1, 2-3, ...), the even one sending, the odd one receiving, one message a
-- call (an odd count leaves the last rank idle); "size" is the message's.
local partner = (tp.rank % 2 == 0 and tp.rank + 1 or tp.rank - 1)
if partner >= n then partner = nil end

-- Buffers for one (op, size) and the call to time: one function per collective, called with the
-- buffers, so that every size runs the same compiled code (a closure per size would be a new function
-- to LuaJIT, whose traces specialise on it). Counts are rounded to what divides evenly.
local o = { async = opts.async }
local calls = {
  all_gather = function(out, x) return g:all_gather(out, x, o) end,
  reduce_scatter = function(out, x) return g:reduce_scatter(out, x, o) end,
  all_reduce = function(t) return g:all_reduce(t, o) end,
  broadcast = function(t) return g:broadcast(t, o) end,
  all_to_all = function(out, x) return g:all_to_all(out, x, o) end,
  send_recv = function(t)
    if not partner then return nil end
    if tp.rank % 2 == 0 then return g:send(t, partner, o) end
    return g:recv(t, partner, o)
  end,
}
local function setup(op, bytes)
  if not calls[op] then error("unknown collective " .. op, 0) end
  local count = math.max(1, math.floor(bytes / esize))
  if op == "all_gather" or op == "reduce_scatter" or op == "all_to_all" then
    count = math.max(n, count - count % n)
  end
  if op == "all_gather" then
    return count, tp.empty({ count }, opts.dtype), tp.ones({ count / n }, opts.dtype)
  elseif op == "reduce_scatter" then
    return count, tp.empty({ count / n }, opts.dtype), tp.ones({ count }, opts.dtype)
  elseif op == "all_reduce" then
    return count, tp.zeros({ count }, opts.dtype)
  elseif op == "broadcast" or op == "send_recv" then
    return count, tp.ones({ count }, opts.dtype)
  end
  return count, tp.empty({ count }, opts.dtype), tp.ones({ count }, opts.dtype)   -- all_to_all
end

-- The loop that is timed, and run the same way to warm up: the warm-up compiles this very code.
local function run(call, iters, a, b)
  local w
  for _ = 1, iters do w = call(a, b) end
  return w
end

-- The slowest rank's {time, enqueue time} per call, in ms.
local function slowest(ms, enq)
  local worst, worst_enq = 0, 0
  for _, v in ipairs(g:allgather({ ms, enq })) do worst, worst_enq = math.max(worst, v[1]), math.max(worst_enq, v[2]) end
  return worst, worst_enq
end

-- tpsh: after a barrier, iters calls back to back, then the host waits for the last one's Work.
local function time_tpsh(call, iters, a, b)
  tp.synchronize()
  g:barrier()
  local t0 = tp.now()
  local w = run(call, iters, a, b)
  local enq = (tp.now() - t0) / iters
  if w then w:block() end
  return slowest((tp.now() - t0) / iters, enq)
end

-- The C loop on the same communicator, stream, buffers and counts; third: the third side (CUDA: an end
-- event after every call; CPU: the calls handed to a thread).
local ref_ms, ref_enq = ffi.new("double[1]"), ffi.new("double[1]")
local function time_ref(op, iters, a, b, count, third)
  local two = b ~= nil
  if cpu_ref then
    -- mpi_ref_call's buffers: the input first (a), the output second; one tensor: a alone
    local send, recv = (two and b or a):data_ptr(), two and a:data_ptr() or nil
    tp.synchronize()
    g:barrier()
    local ms = (third and ref.tpsh_mpi_ref_time_thread or ref.tpsh_mpi_ref_time)(ref.tpsh_mpi_ref_op(op), send, recv,
      count, g:handle(), iters)
    if ms < 0 then error("--ref-thread: the C loop's thread did not start", 0) end
    return slowest(ms, ms)
  end
  local send, recv = (two and b or a):data_ptr(), a:data_ptr()
  tp.synchronize()
  g:barrier()
  local rc = ref.tpsh_nccl_ref_time(ref.tpsh_nccl_ref_op(op), send, recv, count, nccl_types[opts.dtype], esize, n,
    g:handle(), tp.current_stream():handle(), iters, third or 0, ref_ms, ref_enq)
  if rc ~= 0 then error("--ref: " .. ffi.string(ref.tpsh_nccl_ref_error()), 0) end
  return slowest(ref_ms[0], ref_enq[0])
end

local median = require("tpsh.measure").median

-- An op's first size also runs one untimed loop of iters calls before its warm-up (so does
-- bench_collectives_ref.c): after the warm-up alone the first size of a process read up to 4x its time
-- in a later process's sweep (broadcast 4 KiB on 2 ranks: 6.9 us first, 1.7 us after 1000 warm-up calls),
-- so every sweep's 4 KiB row, the first of `--min 4K`, compared a cold tpsh with a warm C loop.
local primed = {}
local function measure(op, bytes)
  local count, a, b = setup(op, bytes)
  local call = calls[op]
  local size = count * esize
  local iters = iters_for(size)
  if not primed[op] then time_tpsh(call, iters, a, b); primed[op] = true end
  run(call, warmup_for(size), a, b)
  if ref then time_ref(op, warmup_for(size), a, b, count) end
  local best, best_enq, best_ref, best_ref_enq, ratios = math.huge, math.huge, math.huge, math.huge, {}
  local best_ev, ratios_ev = math.huge, {}
  local with_third = ref and (opts.ref_event or opts.ref_thread)
  for r = 1, rounds do
    -- the sides in turn: the C loop, tpsh (and the third side: the C loop with events, or on a thread) in
    -- one order, then swapped
    local ms, enq, rms, renq, ems
    if ref and r % 2 == 1 then rms, renq = time_ref(op, iters, a, b, count) end
    if with_third and r % 2 == 0 then ems = time_ref(op, iters, a, b, count, 1) end
    ms, enq = time_tpsh(call, iters, a, b)
    if with_third and r % 2 == 1 then ems = time_ref(op, iters, a, b, count, 1) end
    if ref and r % 2 == 0 then rms, renq = time_ref(op, iters, a, b, count) end
    if ms < best then best, best_enq = ms, enq end
    if ref then
      if rms < best_ref then best_ref, best_ref_enq = rms, renq end
      ratios[r] = ms / rms
    end
    if with_third then
      best_ev = math.min(best_ev, ems)
      ratios_ev[r] = ms / ems
    end
  end
  local algbw = size / (best * 1e-3) / 1e9
  return { op = op, bytes = size, count = count, iters = iters, time_us = best * 1e3, algbw = algbw,
    busbw = algbw * factor[op], enq_us = best_enq * 1e3, ref_us = ref and best_ref * 1e3,
    ref_enq_us = ref and best_ref_enq * 1e3, rounds = ref and table.concat(ratios, ";"),
    paired = ref and median(ratios), ref_ev_us = with_third and best_ev * 1e3,
    rounds_ev = with_third and table.concat(ratios_ev, ";"), paired_ev = with_third and median(ratios_ev) }
end

local rows = {}
if tp.rank == 0 then
  print(("# tpsh %s, backend %s, %d ranks, dtype %s%s, best of %d round%s%s"):format(tp.version, tp.backend, n,
    opts.dtype, opts.async and ", async (comm stream)" or ", current stream", rounds, rounds > 1 and "s" or "",
    ref and ", against the C loop in this process (C us; x C: median of tpsh / C per round)" or ""))
  print(("%-15s %12s %12s %7s %12s %10s %10s%s%s"):format("collective", "size (B)", "count", "iters", "time (us)",
    "algbw GB/s", "busbw GB/s", ref and ("%10s %7s"):format("C us", "x C") or "",
    opts.ref_event and ("%8s"):format("x C+ev") or opts.ref_thread and ("%8s"):format("x C+thr") or ""))
end
for _, op in ipairs(opts.ops) do
  local bytes = opts.min
  while bytes <= opts.max do
    local r = measure(op, bytes)
    rows[#rows + 1] = r
    if tp.rank == 0 then
      print(("%-15s %12d %12d %7d %12.1f %10.3f %10.3f%s%s"):format(r.op, r.bytes, r.count, r.iters, r.time_us,
        r.algbw, r.busbw, ref and ("%10.1f %7.3f"):format(r.ref_us, r.paired) or "",
        r.paired_ev and ("%8.3f"):format(r.paired_ev) or ""))
    end
    bytes = bytes * 2
    collectgarbage()
  end
end

if opts.csv and tp.rank == 0 then
  local f = assert(io.open(opts.csv, "w"))
  local ev = ref and (opts.ref_event and "event" or opts.ref_thread and "thread")
  f:write("collective,bytes,count,iters,time_us,algbw_GBps,busbw_GBps,enqueue_us",
    ref and ",ref_time_us,ref_enqueue_us,paired_ratio,round_ratios" or "",
    ev and (",ref_%s_time_us,paired_ratio_%s,round_ratios_%s\n"):format(ev, ev, ev) or "\n")
  for _, r in ipairs(rows) do
    f:write(("%s,%d,%d,%d,%.3f,%.4f,%.4f,%.3f"):format(r.op, r.bytes, r.count, r.iters, r.time_us, r.algbw,
      r.busbw, r.enq_us), ref and (",%.3f,%.3f,%.4f,%s"):format(r.ref_us, r.ref_enq_us, r.paired, r.rounds) or "",
      ev and (",%.3f,%.4f,%s\n"):format(r.ref_ev_us, r.paired_ev, r.rounds_ev) or "\n")
  end
  f:close()
end
