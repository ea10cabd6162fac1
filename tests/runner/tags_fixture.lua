-- Fixture for tests/runner_spec.lua: a tag is '#' followed by non-space characters. 4 passed.
describe("tags fixture", function()
  it("is dotted #x.y", function() end)
  it("has a count #gpu:2", function() end)
  it("is fast #fast", function() end)
  it("has none", function() end)
end)
