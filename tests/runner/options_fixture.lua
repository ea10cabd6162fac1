-- Fixture for tests/runner_spec.lua, run with --helper helper_fixture.lua, --lpath <runner/lpath/?.lua> and
-- --cpath /fixture_cpath/?.so.
it("sees what the helper set", function() assert.are.equal("ran", rawget(_G, "FIXTURE_HELPER")) end)
it("requires a module through --lpath", function() assert.are.equal("lpath", require("fixture_lpath_mod").where) end)
it("finds --cpath first in package.cpath", function()
  assert.are.equal(1, package.cpath:find("/fixture_cpath/?.so", 1, true), package.cpath)
end)
