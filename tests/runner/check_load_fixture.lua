-- Fixture for tests/runner_spec.lua, run with --check: a race while the file loads (its describe body
-- reads on a side stream what the default stream wrote), then 1 test that passes.
describe("check load fixture", function()
  local side = tp.stream { name = "side" }
  local x = tp.zeros { 256 }
  tp.spin(20)
  x:fill_(1)
  tp.with_stream(side, function() return x * 2 end)
  tp.synchronize()
  it("passes", function() assert.are.equal(0, #tp.check.reports()) end)
end)
