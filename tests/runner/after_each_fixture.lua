-- Fixture for tests/runner_spec.lua: when a before_each fails, the after_each hooks run from its block
-- outward (as in busted), not those of the inner blocks whose before_each never ran. 1 passed, 1 failed.
local log = {}
describe("outer", function()
  before_each(function() log[#log + 1] = "be outer"; error("outer before_each broke") end)
  after_each(function() log[#log + 1] = "ae outer" end)
  describe("inner", function()
    before_each(function() log[#log + 1] = "be inner" end)
    after_each(function() log[#log + 1] = "ae inner" end)
    it("never runs its body", function() log[#log + 1] = "body" end)
  end)
end)
it("ran the hooks from the failing block outward", function()
  assert.are.equal("be outer, ae outer", table.concat(log, ", "))
end)
