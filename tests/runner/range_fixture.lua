-- Fixture for tests/range_spec.lua: 2 passed, 1 failed. A test that leaves a range open fails, and the
-- next test starts with none open.
describe("range fixture", function()
  it("leaves a range open", function() tp.range_push("forgotten") end)
  it("starts with none open", function() assert.are.equal(0, tp._range_depth()) end)
  it("closes what it opens", function() tp.range("closed", function() tp.range_push("inner"); tp.range_pop() end) end)
end)
