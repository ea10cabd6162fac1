-- check_mode.lua: what the specs of the stream sanitizer share (check_spec, check_streams_spec): check
-- mode on for a test's duration, the line an access must be reported at, and one report expected. Not
-- a spec itself (discovery takes *_spec.lua); a spec loads it with dofile from its own directory.
local M = {}

-- The line after the caller's: written just above the access that must be reported.
function M.next_line() return debug.getinfo(2, "l").currentline + 1 end

-- at(loc, line): whether loc ("path:line") is that line of the spec file whose name matches `file`.
function M.at_of(file)
  return function(loc, line) return loc:match(file .. ":(%d+)$") == tostring(line) end
end

function M.describe_reports(rs)
  local s = {}
  for _, r in ipairs(rs) do s[#s + 1] = r.kind .. " at " .. r.location .. " vs " .. r.other_location end
  return table.concat(s, "; ")
end

-- Exactly one report, of a kind matching kind_pattern, at line (and, when given, against other_line);
-- at is the spec's M.at_of. Returns the report.
function M.expect_report(at, kind_pattern, line, other_line)
  tp.synchronize()
  local rs = tp.check.reports()
  assert.are.equal(1, #rs, "expected one report, got " .. #rs .. ": " .. M.describe_reports(rs))
  local r = rs[1]
  assert.truthy(r.kind:find(kind_pattern), "kind: " .. r.kind)
  assert.is_true(at(r.location, line), ("reported at %s, expected line %d"):format(r.location, line))
  if other_line then
    assert.is_true(at(r.other_location, other_line),
      ("conflicting access at %s, expected line %d"):format(r.other_location, other_line))
  end
  return r
end

function M.expect_none()
  tp.synchronize()
  local rs = tp.check.reports()
  assert.are.equal(0, #rs, M.describe_reports(rs))
end

-- before_each / after_each: check mode on, not strict, no reports, for the test only (the suite may run
-- with --check, which stays on). What the script dropped is collected first, so that no free of an
-- earlier test's tensor lands in this one.
local was_on
function M.on()
  collectgarbage()
  collectgarbage()
  tp.synchronize()
  was_on = tp.check.enabled()
  tp.check.enable(true)
  tp.check.strict(false)
  tp.check.clear()
end

function M.off()
  tp.synchronize()
  tp.check.clear()
  if not was_on then tp.check.enable(false) end
end

return M
