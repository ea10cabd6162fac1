-- Fixture for tests/runner_spec.lua: a test that raises a table without __tostring; the runner must
-- say it as a script's error does ("a table value (an error object without __tostring)").
describe("o", function()
  it("raises a table", function() error({}) end)
end)
