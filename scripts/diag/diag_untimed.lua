-- Whether tp.time's untimed-work measure holds with and without the per-iteration collection: an async
-- all_gather of 8 MiB a rank left unwaited ("nowait") against the same with :wait(), each rank's median
-- device time, untimed time and host time. On an idle current stream the end event is recorded when
-- the host gets there, so a host thread that loses its core to the collective's busy-polling thread
-- (more busy threads than cores: 2 ranks on 2 cores) moves the untimed work into the device time.
--   mpiexec -n 2 tpsh --backend cpu scripts/diag/diag_untimed.lua [runs=3]
local runs = tonumber(arg[1]) or 3
local g = tp.world
local n = 2 * 1024 * 1024
local x, out = tp.ones({ n }), tp.empty({ n * tp.size })
for run = 1, runs do
  for _, collect in ipairs({ true, false }) do
    local r1 = tp.time(function() g:all_gather(out, x, { async = true }) end, { iters = 20, warmup = 3, collect = collect })
    local r2 = tp.time(function() g:all_gather(out, x, { async = true }):wait() end, { iters = 20, warmup = 3, collect = collect })
    print(("run %d rank %d collect=%-5s nowait median %.3f untimed %.3f host %.3f | wait median %.3f untimed %.3f")
      :format(run, tp.rank, tostring(collect), r1.median, r1.untimed, r1.host, r2.median, r2.untimed))
  end
end
