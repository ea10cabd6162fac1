-- Fixture for tests/runner_spec.lua: insulate undoes what its block did to the spec file's globals,
-- to _G and to package.loaded (setup included); describe does not.
insulate("insulated", function()
  setup(function() from_setup = true end)
  it("sets globals and loads a module", function()
    plain = 1
    _G.in_G = 2
    package.loaded["insulate_fixture.mod"] = {}
  end)
  it("still sees them inside the block", function()
    assert.are.equal(1, plain)
    assert.are.equal(2, in_G)
    assert.is_true(from_setup)
  end)
end)
describe("after the insulated block", function()
  it("sees none of them", function()
    assert.is_nil(plain)
    assert.is_nil(from_setup)
    assert.is_nil(rawget(_G, "in_G"))
    assert.is_nil(package.loaded["insulate_fixture.mod"])
  end)
end)
describe("a plain block", function()
  it("sets a global", function() leaked = 1 end)
end)
describe("after the plain block", function()
  it("still sees it", function() assert.are.equal(1, leaked) end)
end)
