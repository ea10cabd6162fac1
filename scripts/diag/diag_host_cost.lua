-- diag_host_cost.lua: the host's cost per enqueue, with the device cost hidden: the ops are queued
-- behind a spin kernel, few enough that CUDA's launch queue never fills (a full queue blocks the host).
--   mpiexec -n 2 tpsh --backend cuda scripts/diag/diag_host_cost.lua
-- The "ffi" cases call tpsh's C API directly (internal fields: a diagnostic, not an example), so that
-- the rows split a collective's host cost into NCCL + tpsh's core (direct call), the Work's end event
-- (batch of one with an event) and the Lua layer (the public call). A second table times the
-- reduce_scatter rows as bench_collectives.lua does (back to back while the device runs them).
local ffi = require "ffi"
local work = require "tpsh.work"
local nccl_ref = dofile((arg[0]:match("^(.*)/") or ".") .. "/../bench/nccl_ref_lib.lua")   -- NCCL's and the C loop's calls
local C = ffi.C
local g = tp.world
local p = g._p
local x, y = tp.ones { 256 }, tp.ones { 16 }
local half = tp.empty { 256 / g.size }
local whole = tp.empty { 256 * g.size }
local s = tp.current_stream()
local e0, e1 = tp.event { timing = true }, tp.event { timing = true }
local ev = C.tpsh_event_create(0)
local done = C.tpsh_event_create(0)
C.tpsh_event_record(done, s)
local N = 300

-- On CUDA: ncclReduceScatter called straight from Lua on tpsh's own communicator, stream and buffers
-- (g:handle(), s:handle(), t:data_ptr()): NCCL's cost inside this process, without tpsh's core.
local raw_nccl, raw_event_record, raw_cu_event_record, raw_cu_event_ring, raw_write_value
if tp.backend == "cuda" then
  local comm, cst = g:handle(), s:handle()
  local send, recv, gathered = x:data_ptr(), half:data_ptr(), whole:data_ptr()
  local count = 256 / g.size
  raw_nccl = {   -- ncclFloat32 = 7, ncclSum = 0
    reduce_scatter = function() C.ncclReduceScatter(send, recv, count, 7, 0, comm, cst) end,
    all_gather = function() C.ncclAllGather(send, gathered, 256, 7, comm, cst) end,
    all_reduce = function() C.ncclAllReduce(send, send, 256, 7, 0, comm, cst) end,
  }
  -- What one addition to raw NCCL costs in the same loop: an untimed event record (what a Work's end
  -- event costs) through the runtime and through the driver, and a 64-bit stream memory write
  -- (cuStreamWriteValue64, another completion marker).
  ffi.cdef [[
    int cudaEventCreateWithFlags(void **ev, unsigned flags);
    int cudaEventRecord(void *ev, void *st);
    int cudaMallocHost(void **p, size_t n);
    int cuStreamWriteValue64(void *st, uint64_t addr, uint64_t value, unsigned flags);
    int cuEventRecord(void *ev, void *st);
  ]]
  local evp = ffi.new("void *[1]")
  assert(C.cudaEventCreateWithFlags(evp, 2) == 0)              -- cudaEventDisableTiming
  local ev_raw = evp[0]
  local rs = raw_nccl.reduce_scatter
  raw_event_record = function() rs(); C.cudaEventRecord(ev_raw, cst) end
  local hp = ffi.new("void *[1]")
  local ok, cu = pcall(ffi.load, "libcuda.so.1")
  if ok then raw_cu_event_record = function() rs(); cu.cuEventRecord(ev_raw, cst) end end
  -- the same with the event taken in turn from a ring of 320, as a Work ticket's event is (work.c
  -- reuses a slot only once known complete): whether touching a different event each call costs more
  local ring, nring = {}, 320
  for k = 1, nring do
    assert(C.cudaEventCreateWithFlags(evp, 2) == 0)
    ring[k] = evp[0]
  end
  local k = 0
  if ok then
    raw_cu_event_ring = function()
      rs(); k = k % nring + 1; cu.cuEventRecord(ring[k], cst)
    end
  end
  if ok and C.cudaMallocHost(hp, 64) == 0 then
    local addr = ffi.cast("uint64_t", ffi.cast("uintptr_t", hp[0]))   -- UVA: the host pointer is the device's
    local v = ffi.new("uint64_t", 0)
    raw_write_value = function() rs(); v = v + 1; cu.cuStreamWriteValue64(cst, addr, v, 0) end
  end
end
local no_opts = {}   -- bench_collectives.lua passes an options table: so do the back-to-back rows
local function host_cost(fn)
  tp.synchronize()
  g:barrier()
  tp.spin(60)
  local t0 = tp.now()
  for _ = 1, N do fn() end
  local us = (tp.now() - t0) * 1000 / N
  tp.synchronize()
  return us
end
local cases = {
  { "reduce_scatter 1 KiB: ffi direct (NCCL + core)", function() C.tpsh_reduce_scatter(s, p, half, x, 0) end,
    loop = true },
  { "reduce_scatter 1 KiB: ffi batch of one + end event", function()
    C.tpsh_batch_begin(p); C.tpsh_reduce_scatter(nil, p, half, x, 0); C.tpsh_batch_end(s, p, s, nil, ev)
  end },
  { "reduce_scatter 1 KiB: ffi batch of one + Work ticket", function()
    C.tpsh_batch_begin(p); C.tpsh_reduce_scatter(nil, p, half, x, 0)
    C.tpsh_batch_end(s, p, s, nil, C.tpsh_work_event(C.tpsh_work_take(s)))
  end, loop = true },
  { "reduce_scatter 1 KiB: ffi tpsh_collective_work (one call)", function()
    C.tpsh_collective_work(s, p, s, C.TPSH_C_REDUCE_SCATTER, half, x, 0, 0)
  end, loop = true },
  { "reduce_scatter 1 KiB: the same + its Lua Work (work.ticket)", function()
    return work.ticket("group:reduce_scatter", s, C.tpsh_collective_work(s, p, s, C.TPSH_C_REDUCE_SCATTER, half, x, 0, 0))
  end, loop = true },
  { "reduce_scatter 1 KiB: g:reduce_scatter", function() g:reduce_scatter(half, x) end, loop = true },
  { "all_gather 1 KiB out: ffi direct", function() C.tpsh_all_gather(s, p, whole, x) end },
  { "all_gather 1 KiB out: g:all_gather", function() g:all_gather(whole, x) end },
  { "all_reduce 1 KiB: ffi direct", function() C.tpsh_all_reduce(s, p, x, x, 0) end },
  { "all_reduce 1 KiB: g:all_reduce", function() g:all_reduce(x) end },
  { "all_reduce async + wait", function() g:all_reduce(x, { async = true }):wait() end },
  { "add_ 16 elements", function() y:add_(y) end },
  { "untimed event record", function() C.tpsh_event_record(ev, s) end },
  { "query of a completed event", function() C.tpsh_event_query(done) end },
  { "2 timing event records", function() e0:record(); e1:record() end },
  { "tp.now() (clock_gettime, as the flight recorder's stamp)", function() tp.now() end },
}
if raw_nccl then
  table.insert(cases, 1, { "reduce_scatter 1 KiB: ncclReduceScatter from Lua", raw_nccl.reduce_scatter, loop = true })
end
-- Rows of the back-to-back table only: the reduce_scatter's parts one by one (raw NCCL plus one
-- addition; tpsh's batch of one without its end event), then each collective raw and through the
-- public call with options.
local public = {
  reduce_scatter = { "reduce_scatter 1 KiB: g:reduce_scatter(out, x, {})", function() g:reduce_scatter(half, x, no_opts) end },
  all_gather = { "all_gather 1 KiB out: g:all_gather(out, x, {})", function() g:all_gather(whole, x, no_opts) end },
  all_reduce = { "all_reduce 1 KiB: g:all_reduce(x, {})", function() g:all_reduce(x, no_opts) end },
}
local loop_only = {
  { "reduce_scatter 1 KiB: ffi batch of one, no end event", function()
    C.tpsh_batch_begin(p); C.tpsh_reduce_scatter(nil, p, half, x, 0); C.tpsh_batch_end(s, p, s, nil, nil)
  end },
  public.reduce_scatter,
}
if raw_nccl then
  table.insert(loop_only, 1, { "reduce_scatter 1 KiB: raw + cudaEventRecord", raw_event_record })
  if raw_cu_event_record then
    table.insert(loop_only, 2, { "reduce_scatter 1 KiB: raw + cuEventRecord (driver)", raw_cu_event_record })
  end
  if raw_cu_event_ring then
    table.insert(loop_only, 3, { "reduce_scatter 1 KiB: raw + cuEventRecord, ring of 320", raw_cu_event_ring })
  end
  if raw_write_value then
    table.insert(loop_only, 3, { "reduce_scatter 1 KiB: raw + cuStreamWriteValue64", raw_write_value })
  end
  -- the core's parts on their own, each after raw NCCL: the checks and the batch record (then
  -- cancelled), and a Work ticket taken and dropped; what is left of the core call is the issue
  local rs = raw_nccl.reduce_scatter
  loop_only[#loop_only + 1] = { "reduce_scatter 1 KiB: raw + checks and record", function()
    rs(); C.tpsh_batch_begin(p); C.tpsh_reduce_scatter(nil, p, half, x, 0); C.tpsh_batch_cancel(p)
  end }
  loop_only[#loop_only + 1] = { "reduce_scatter 1 KiB: raw + ticket take, drop", function()
    rs(); C.tpsh_work_drop(C.tpsh_work_take(s))
  end }
  loop_only[#loop_only + 1] = { "all_gather 1 KiB out: ncclAllGather from Lua", raw_nccl.all_gather }
end
loop_only[#loop_only + 1] = public.all_gather
if raw_nccl then loop_only[#loop_only + 1] = { "all_reduce 1 KiB: ncclAllReduce from Lua", raw_nccl.all_reduce } end
loop_only[#loop_only + 1] = public.all_reduce
local results = {}
for r = 1, 5 do
  for i, c in ipairs(cases) do
    results[i] = results[i] or {}
    results[i][r] = host_cost(c[2])
  end
end
if tp.rank == 0 then
  print(("# host us per call, %d ranks, backend %s; min and median of 5 rounds of %d calls"):format(g.size,
    tp.backend, N))
  for i, c in ipairs(cases) do
    table.sort(results[i])
    print(("%-55s %7.2f %7.2f"):format(c[1], results[i][1], results[i][3]))
  end
end

-- The rows marked `loop` and those of loop_only, as bench_collectives.lua times them: 1000 calls back to
-- back after a barrier while the device runs them, the rows taken in turn, 7 rounds; "enqueue" is the
-- host loop alone, "per call" until the last has completed (best and median). This is the loop in which
-- tpsh's small-message figures are judged, here with NCCL and tpsh in one process (same cores, same
-- memory placement), which separate processes (bench_collectives against nccl_ref) cannot promise.
local LOOP = 1000
local function loop_cost(fn)
  tp.synchronize()
  g:barrier()
  local t0 = tp.now()
  for _ = 1, LOOP do fn() end
  local enq = (tp.now() - t0) * 1000 / LOOP
  tp.synchronize()
  return enq, (tp.now() - t0) * 1000 / LOOP
end
-- With the C reference's library at hand (TPSH_NCCL_REF, else build/ or .gpu/build/), its loop runs as
-- two more rows: NCCL from C, alone and with an untimed event recorded after each call.
local ref_loop
if raw_nccl then
  ref_loop = nccl_ref.load()
end
local ms, enq_ms = ffi.new("double[1]"), ffi.new("double[1]")
local function c_loop(end_event)
  return function()
    tp.synchronize()
    g:barrier()
    -- op 2 = reduce_scatter (nccl_ref_loop.h), count = the whole input, f32
    assert(ref_loop.tpsh_nccl_ref_time(2, x:data_ptr(), half:data_ptr(), 256, 7, 4, g.size, g:handle(), s:handle(),
      LOOP, end_event, ms, enq_ms) == 0)
    return enq_ms[0] * 1000, ms[0] * 1000
  end
end
local loops = {}
if ref_loop then
  loops[1] = { "reduce_scatter 1 KiB: the C loop of nccl_ref", own = c_loop(0) }
  loops[2] = { "reduce_scatter 1 KiB: the C loop + an end event", own = c_loop(1) }
end
for _, c in ipairs(cases) do if c.loop then loops[#loops + 1] = c end end
for _, c in ipairs(loop_only) do loops[#loops + 1] = c end
-- "x C": the median over rounds of the row's per-call time over the C loop's in the same round. The
-- machine's speed moves between rounds (docs/perf.md: two levels, 6-7 and 9-11 us a call), which the
-- minima and medians of the absolute times mix; the ratio within a round cancels it, as
-- bench_collectives --ref does.
local ROUNDS = 15
local enqs, pers = {}, {}
for r = 1, ROUNDS do
  for i, c in ipairs(loops) do
    enqs[i], pers[i] = enqs[i] or {}, pers[i] or {}
    if c.own then enqs[i][r], pers[i][r] = c.own() else enqs[i][r], pers[i][r] = loop_cost(c[2]) end
  end
end
if tp.rank == 0 then
  local median = require("tpsh.measure").median
  local xc = {}
  for i = 1, #loops do
    local q = {}
    for r = 1, ROUNDS do q[r] = pers[i][r] / pers[1][r] end
    xc[i] = median(q)
  end
  print(("# back to back, %d calls while the device runs them, %d rounds: enqueue and per-call us, best and median%s")
    :format(LOOP, ROUNDS, ref_loop and "; x C: median of per call / the C loop's in the same round" or ""))
  print(("%-55s %7s %7s %7s %7s%s"):format("", "enq min", "med", "per min", "med", ref_loop and "     x C" or ""))
  local mid = math.floor((ROUNDS + 1) / 2)
  for i, c in ipairs(loops) do
    table.sort(enqs[i]); table.sort(pers[i])
    print(("%-55s %7.2f %7.2f %7.2f %7.2f%s"):format(c[1], enqs[i][1], enqs[i][mid], pers[i][1], pers[i][mid],
      ref_loop and ("  %6.3f"):format(xc[i]) or ""))
  end
end
C.tpsh_event_release(ev)
C.tpsh_event_release(done)
