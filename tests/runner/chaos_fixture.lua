-- Fixture for tests/chaos_spec.lua, run with --chaos=SEED: 2 passed, 1 failed. Each test's delays start
-- from the seed: the two tests doing the same work print the same count of delays and milliseconds.
local function work(name)
  local x = tp.ones { 8 }
  for _ = 1, 10 do x:add_(1) end
  tp.synchronize()
  local _, n, ms = tp.chaos()
  print(("%s: %d delays, %.6f ms"):format(name, n, ms))
end

describe("chaos fixture", function()
  it("first", function() work("first") end)
  it("second", function() work("second") end)
  it("fails", function() error("fails on purpose") end)
end)
