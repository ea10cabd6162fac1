-- Host time of each step of a read on an idle side stream while the default stream spins (CUDA):
-- which call waits for the other stream. Prints one line per step. With "warm", the staging buffers
-- that the uploads need already exist (none is allocated during the timed steps).
local function ms(f) local t0 = tp.now(); local r = f(); return tp.now() - t0, r end
local side = tp.stream { name = "side" }
tp.with_stream(side, function() tp.full({ 5 }, 1):sum():item() end)   -- warm side's first use
tp.synchronize()
for _, pre in ipairs { "none", "uploads", "warm", "uploads", "side-up" } do
  tp.spin(400)
  if pre == "warm" then for i = 1, 7 do tp.from({ i }) end; tp.synchronize(); tp.spin(400) end
  local tu = ms(function()
    if pre == "uploads" or pre == "warm" then for i = 1, 4 do tp.from({ i, i + 1 }) end end
    if pre == "side-up" then tp.with_stream(side, function() for i = 1, 4 do tp.from({ i, i + 1 }) end end) end
  end)
  local t, x = ms(function() return tp.with_stream(side, function() return tp.full({ 5 }, 2) end) end)
  local t2, s = ms(function() return tp.with_stream(side, function() return x:sum() end) end)
  local t3 = ms(function() return tp.with_stream(side, function() return s:item() end) end)
  print(("before: %-8s uploads %.1f ms, full %.1f ms, sum %.1f ms, item %.1f ms"):format(pre, tu, t, t2, t3))
  tp.synchronize()
end
