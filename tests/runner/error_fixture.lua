-- Fixture for tests/runner_spec.lua: a test raises an error object whose __tostring raises in turn.
describe("error fixture", function()
  it("raises an object whose __tostring raises", function()
    error(setmetatable({}, { __tostring = function() error("inner") end }))
  end)
end)
