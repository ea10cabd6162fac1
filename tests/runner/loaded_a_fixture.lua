-- Fixture for tests/runner_spec.lua, run before loaded_b_fixture.lua: what this file leaves in _G and
-- package.loaded is reset before the next file, as busted does.
package.loaded["fixture.mod"] = { "from file a" }
rawset(_G, "FIXTURE_LEAK", true)
it("leaves a module and a global", function() assert.truthy(package.loaded["fixture.mod"]) end)
