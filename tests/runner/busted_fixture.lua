-- Fixture for tests/runner_spec.lua: busted's language as real spec suites use it. 9025 passed.
local busted = require "busted"          -- the DSL, as under busted
local ran = {}

busted.describe "call form" (function()  -- describe 'name' (function() ... end)
  it "runs" (function() ran[#ran + 1] = "call form" end)
end)

describe("bodies in order", function()
  -- the body runs when the runner comes to the block, after the test before it (as busted does)
  local before = #ran
  it("sees the test that ran before its block", function() assert.are.equal(1, before) end)
end)

describe("randomize", function()
  randomize(7)                           -- this block's children run shuffled, with seed 7
  for i = 1, 20 do it("r" .. i, function() ran[#ran + 1] = i end) end
end)

describe("randomized order", function()
  it("is not the written one, and the same on every rank", function()
    local got = {}
    for i = #ran - 19, #ran do got[#got + 1] = ran[i] end
    local text = table.concat(got, ",")
    assert.are_not.equal("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20", text)
    local all = tp.allgather(text)
    for r = 2, #all do assert.are.equal(all[1], all[r]) end
  end)
end)

describe("a large block", function()
  -- 9000 tests in one describe (more than LuaJIT's unpack takes)
  for i = 1, 9000 do it("t" .. i, function() end) end
end)

it("sees arg as busted sets it", function()
  assert.are.equal("test", arg[0])
  assert.is_string(arg[-1])
  local first = -1
  while arg[first - 1] do first = first - 1 end
  assert.truthy(arg[first]:find("tpsh$"), arg[first])
end)

it("runs a child tpsh without the launcher's connection", function()
  if tp.rank ~= 0 then return end
  local p = io.popen("'" .. os.getenv("TPSH_EXE") .. "' --backend cpu -e 'io.write(tp.size)' 2>&1")
  local out = p:read("*a")
  p:close()
  assert.are.equal("1", out)
  assert.is_nil(os.execute("env | grep -q '^PMI_FD='") == 0 and "PMI_FD seen" or nil)
end)
