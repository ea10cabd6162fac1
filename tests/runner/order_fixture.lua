-- Fixture for tests/runner_spec.lua: after a test, its finally() handlers run last registered first,
-- then the after_each hooks from the innermost block outward (as in busted). 2 passed.
local log = {}
describe("outer", function()
  after_each(function() log[#log + 1] = "ae outer" end)
  describe("inner", function()
    after_each(function() log[#log + 1] = "ae inner" end)
    it("registers two finally handlers", function()
      finally(function() log[#log + 1] = "finally 1" end)
      finally(function() log[#log + 1] = "finally 2" end)
      log[#log + 1] = "body"
    end)
  end)
end)
it("ran the finally handlers last first, then the after_each hooks innermost first", function()
  assert.are.equal("body, finally 2, finally 1, ae inner, ae outer", table.concat(log, ", "))
end)
