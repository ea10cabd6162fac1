-- Fixture for tests/runner_spec.lua: loads fine the first time; on the second load (--repeat) a
-- describe body raises, and on the third the file itself does. Not a *_spec.lua on purpose. The count
-- lives in the registry: _G is given back as it was after each file (busted's auto-insulation).
local reg = debug.getregistry()
local loads = (reg.REPEAT_LOAD_FIXTURE or 0) + 1
reg.REPEAT_LOAD_FIXTURE = loads
if loads == 3 then error("the file breaks on load " .. loads) end
describe("repeat load fixture", function()
  it("passes", function() end)
  if loads == 2 then error("the describe body breaks on load " .. loads) end
  it("passes too", function() end)
end)
