-- Fixture for tests/runner_spec.lua, run with --check: 3 passed, 3 failed (on any number of ranks).
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

-- A tensor dropped while a side stream still reads it: the garbage collector frees it whenever it runs.
local function dropped_while_read()
  local side = tp.stream { name = "side" }
  local x = tp.ones { 256 }
  side:wait_stream(tp.current_stream())
  tp.with_stream(side, function() tp.spin(50); return x * 2 end)
end

describe("check fixture", function()
  it("leaves a race", function() race() end)
  it("starts with no reports", function() assert.are.equal(0, #tp.check.reports()) end)
  it("reads its race and clears it", function()
    race()
    assert.are.equal(1, #tp.check.reports())
    tp.check.clear()
  end)
  it("drops a tensor that a side stream still reads", function() dropped_while_read() end)
  it("collects garbage after it", function() collectgarbage(); collectgarbage() end)
  describe("with a race in its setup", function()
    setup(function() race() end)
    it("never runs", function() end)
  end)
end)
