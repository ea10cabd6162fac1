-- Fixture for tests/runner_spec.lua: finally() inside setup and teardown runs after the hook; it()
-- inside a hook fails at the spec's line. 2 passed, 1 failed.
local ran = {}
describe("finally in hooks", function()
  setup(function() finally(function() ran.setup = true end) end)
  teardown(function() finally(function() ran.teardown = true end) end)
  it("runs the setup's after the setup", function() assert.is_true(ran.setup) end)
end)
describe("it inside a hook", function()
  setup(function() it("nested", function() end) end)
  it("fails the block's tests", function() end)
end)
it("runs the teardown's after the teardown", function() assert.is_true(ran.teardown) end)
