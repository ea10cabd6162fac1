-- Where chaos put its delays, and when each stream ran, in a script that reads an async all_gather's
-- output before w:wait() (gpu_check's chaos race): on CUDA it read the right value under seeds 1-8
-- while the CPU backend shows the race under each (docs/api.md, "Chaos mode"). Prints the traced records,
-- device times from the first one in ms, then the value read.
--   tpsh [--backend cuda] --chaos=SEED scripts/diag/diag_chaos_race.lua [elements]
local n = tonumber(arg and arg[1]) or 65536
tp.trace.start()
local x, out = tp.ones { n }, tp.full({ n }, -1)
tp.world:all_gather(out, x)
out:fill_(-1)
local w = tp.world:all_gather(out, x, { async = true })
local s = out:sum()
w:wait()
tp.synchronize()
local recs = tp.trace.records()
local t0 = recs[1] and recs[1][1] or 0
for _, r in ipairs(recs) do
  print(("%9.3f %9.3f  %-8s stream %-3d %s"):format(r[1] - t0, r[2] - t0, r[3], r[4], r[5]))
end
print(("read %s of %d (the race read early: %s); chaos: seed, delays, ms"):format(s:item(), n,
  tostring(s:item() ~= n)), tp.chaos())
