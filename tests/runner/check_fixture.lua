-- Fixture for tests/runner_spec.lua, run with --check: 2 passed, 1 failed (on any number of ranks).
-- A side stream reads what the default stream wrote, without waiting: a read-after-write race.
local function race()
  local side = tp.stream { name = "side" }
  local x = tp.zeros { 256 }
  tp.spin(20)
  x:fill_(1)
  local y = tp.with_stream(side, function() return x * 2 end)
  tp.synchronize()
  return y
end

describe("check fixture", function()
  it("leaves a race", function() race() end)
  it("starts with no reports", function() assert.are.equal(0, #tp.check.reports()) end)
  it("reads its race and clears it", function()
    race()
    assert.are.equal(1, #tp.check.reports())
    tp.check.clear()
  end)
end)
