-- Fixture for tests/runner_spec.lua: a failing setup fails the tests of its block; a failing
-- teardown is reported as a failure of its own.
describe("setup breaks", function()
  setup(function() error("setup broke") end)
  it("first", function() end)
  it("second", function() end)
end)
describe("teardown breaks", function()
  teardown(function() error("teardown broke") end)
  it("runs", function() end)
end)
