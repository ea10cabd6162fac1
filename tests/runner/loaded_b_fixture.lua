-- Fixture for tests/runner_spec.lua: runs after loaded_a_fixture.lua.
it("finds neither the module nor the global of the file before", function()
  assert.is_nil(package.loaded["fixture.mod"])
  assert.is_nil(rawget(_G, "FIXTURE_LEAK"))
end)
