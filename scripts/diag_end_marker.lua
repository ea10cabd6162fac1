-- diag_end_marker.lua: what each way of marking a collective's end costs the host, a call. A Work
-- needs its collective's end marked on the stream (w:wait, w:block and w:is_completed answer from it);
-- tpsh records an event (the driver's cuEventRecord), and on the GPU machine that record is about half
-- of what tpsh adds to a 1 KiB collective (docs/perf.md). The alternative measured here: the stream
-- writes a counter into host-mapped memory (cuStreamWriteValue64/32), a timeline whose value the host
-- reads without a driver call and another stream can wait on (cuStreamWaitValue64).
-- Chunks of N 1 KiB reduce_scatters on 2 GPUs, each chunk every mode in turn (rotated, so none always
-- runs first): the C loop alone, + cudaEventRecord, + cuEventRecord, + cuStreamWriteValue64,
-- + cuStreamWriteValue32, and g:reduce_scatter. Prints per rank the median us a call of each mode and
-- the median of each chunk's ratio to the C loop.
--   mpiexec -n 2 tpsh --backend cuda scripts/diag_end_marker.lua [chunks (20)] [calls per chunk (10000)]
local ffi = require "ffi"
local nccl_ref = dofile((arg[0]:match("^(.*)/") or ".") .. "/nccl_ref_lib.lua")
ffi.cdef [[ uint64_t tpsh_nccl_ref_timeline(void); ]]
if tp.backend ~= "cuda" then error("diag_end_marker.lua: CUDA only (run with --backend cuda)", 0) end
local g = tp.world
local chunks, N = tonumber(arg[1] or 20), tonumber(arg[2] or 10000)
local x, half = tp.ones { 256 }, tp.empty { 256 / g.size }
local comm, cst, send, recv = g:handle(), tp.current_stream():handle(), x:data_ptr(), half:data_ptr()
local lib = assert(nccl_ref.load())
local ms, enq = ffi.new("double[1]"), ffi.new("double[1]")

local names = { "C", "C+cudaEventRecord", "C+cuEventRecord", "C+WriteValue64", "C+WriteValue32", "g:reduce_scatter" }
local function run(mode)
  if mode <= 5 then
    local rc = lib.tpsh_nccl_ref_time(2, send, recv, 256, 7, 4, g.size, comm, cst, N, mode - 1, ms, enq)
    if rc ~= 0 then error(ffi.string(lib.tpsh_nccl_ref_error()), 0) end
    return ms[0] * 1000, enq[0] * 1000
  end
  local t0 = tp.now()
  for _ = 1, N do g:reduce_scatter(half, x) end
  local t1 = tp.now()
  tp.synchronize()
  return (tp.now() - t0) * 1000 / N, (t1 - t0) * 1000 / N
end

local function median(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  table.sort(c)
  return c[math.floor((#c + 1) / 2)]
end

for m = 1, #names do run(m) end                          -- warm-up, and the timeline's first writes
local writes = 0
local us, enq_us, ratio = {}, {}, {}
for m = 1, #names do us[m], enq_us[m], ratio[m] = {}, {}, {} end
g:barrier()
for k = 1, chunks do
  local t = {}
  for j = 0, #names - 1 do
    local m = (k + j - 1) % #names + 1
    g:barrier()
    t[m], enq_us[m][k] = run(m)
    if m == 4 or m == 5 then writes = writes + N end
  end
  for m = 1, #names do us[m][k], ratio[m][k] = t[m], t[m] / t[1] end
end
-- the timeline counted every write (mode 4 and 5 write 1, 2, ...: the last value is the writes made)
local last = tonumber(lib.tpsh_nccl_ref_timeline())
local lines = { ("rank %d: %d chunks of %d calls; the timeline read %d after %d writes (+%d warm-up)"):format(
  tp.rank, chunks, N, last, writes, 2 * N) }
for m = 1, #names do
  lines[#lines + 1] = ("  %-18s %6.2f us a call (enqueue %6.2f), x C %.3f"):format(names[m], median(us[m]),
    median(enq_us[m]), median(ratio[m]))
end
local all = g:gather(table.concat(lines, "\n"), 0)
if tp.rank == 0 then for _, l in ipairs(all) do print(l) end end
