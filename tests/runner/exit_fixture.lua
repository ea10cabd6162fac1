-- Fixture for tests/runner_spec.lua: os.exit inside a test fails that test, and the run goes on.
describe("exit fixture", function()
  it("calls os.exit", function() os.exit(0) end)
  it("still runs afterwards", function() assert.is_true(true) end)
end)
