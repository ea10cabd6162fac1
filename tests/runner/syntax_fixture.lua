-- Fixture for tests/runner_spec.lua: a file that does not compile.
describe("broken", function()
  it("never loads", function() end
end)
