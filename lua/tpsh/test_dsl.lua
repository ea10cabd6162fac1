-- tpsh.test_dsl: the spec language of `tpsh test` (busted's describe, it, hooks, pending, finally,
-- randomize), the tree it builds, and the error handler that keeps the spec's part of a traceback.
--
-- As in busted, a block's body runs when the runner comes to the block, in order with the tests before
-- it (tpsh.test_run), and registers the block's children; nothing of the tree exists before. Every call
-- form busted accepts is accepted: describe("name", fn) and describe "name" (fn), it alike.
local M = {}
local concat, insert = table.concat, table.insert

---------------------------------------------------------------------------------------------------
-- Errors: messages with the part of the traceback that belongs to the spec
---------------------------------------------------------------------------------------------------

-- Frames of the runner's own files are left out of a spec's traceback.
local RUNNER_SRC = { "tpsh/test.lua", "tpsh/test_dsl.lua", "tpsh/test_run.lua" }
M.PENDING = {}   -- marks the error object of pending() called inside a running test
local PENDING = M.PENDING

function M.error_text(e)
  if type(e) == "string" then return e end
  local mt = getmetatable(e)
  if mt and mt.__tostring then
    -- protected: an error in __tostring inside the handler would be "error in error handling", the
    -- test's own failure lost
    local ok, s = pcall(tostring, e)
    if ok then return s end
    return ("error: a %s value whose __tostring raised an error (%s)"):format(type(e), tostring(s))
  end
  -- as a script's error says it (main.c), not "table: 0x55..."
  if e == nil or type(e) == "boolean" then return "error: " .. tostring(e) end
  if type(e) == "number" then return tostring(e) end
  return ("error: a %s value (an error object without __tostring)"):format(type(e))
end
local error_text = M.error_text

local function runner_frame(line)
  for _, s in ipairs(RUNNER_SRC) do if line:find(s, 1, true) then return true end end
  return false
end

-- Keeps the frames of the spec and the code it calls; drops the runner's, luassert's and C frames.
-- A lone frame that the message already points at is left out, as busted does.
function M.handler(e)
  if type(e) == "table" and e[PENDING] then return e end
  local msg = error_text(e)
  local kept = {}
  for line in debug.traceback("", 2):gmatch("[^\n]+") do
    if line:find("in function 'xpcall'", 1, true) then break end   -- the runner's side of the call
    if line:sub(1, 1) == "\t" and not (line:find("[C]:", 1, true) or runner_frame(line)
        or line:find("luassert/", 1, true) or line:find("/say/", 1, true)
        or line:find("(tail call)", 1, true)) then
      kept[#kept + 1] = line
    end
  end
  if #kept == 0 then return msg end
  if #kept == 1 then
    local loc = kept[1]:match("^\t([^:]+:%d+):")
    if loc and msg:sub(1, #loc) == loc then return msg end
  end
  return msg .. "\nstack traceback:\n" .. concat(kept, "\n")
end
local handler = M.handler

---------------------------------------------------------------------------------------------------
-- The tree
---------------------------------------------------------------------------------------------------

-- The runner's state that the DSL reads: the block whose body runs (children register into it), the
-- phase ("collect" while a body runs, "run" while a test or hook runs), the finally() list of the
-- running test or hook.
local S = { block = nil, phase = nil, finally = nil }
M.state = S

local function join(a, b) return a == "" and b or (a .. " " .. b) end

-- fn: the body (nil for a file's root, whose chunk the runner loads).
function M.new_block(name, parent, file, line, fn)
  return { kind = "block", name = name, full = parent and join(parent.full, name) or "", parent = parent,
           file = file, line = line, fn = fn, children = {}, setup = {}, teardown = {}, lazy_setup = {},
           lazy_teardown = {}, before_each = {}, after_each = {}, env = parent and parent.env }
end

local function where(level)
  local info = debug.getinfo(level + 1, "Sl")
  return (info.source:gsub("^@", "")), info.currentline
end

-- level: of the spec's call, counted from need_collect's caller (as error's level is).
local function need_collect(what, level)
  if S.phase ~= "collect" then
    error(what .. "() may only be called in a spec file or a describe body, not inside a test or hook", level + 1)
  end
end

---------------------------------------------------------------------------------------------------
-- The DSL
---------------------------------------------------------------------------------------------------

local dsl = {}
M.dsl = dsl

-- describe("name", fn), or describe "name" (fn): busted's two call forms for every block and test.
local function curried(register)
  return function(name, fn, ...)
    if fn == nil and type(name) == "string" and S.phase == "collect" then
      local file, line = where(2)
      return function(f) return register(name, f, file, line) end
    end
    register(name, fn, nil, nil)   -- not a tail call: add_block counts the spec's frame above this one
  end
end

local function add_block(kind, name, fn, file, line, insulated)
  need_collect(kind, 4)
  if type(name) ~= "string" or type(fn) ~= "function" then
    error(kind .. "(name, fn) expects a string and a function", 4)
  end
  if not file then file, line = where(4) end
  local b = M.new_block(name, S.block, file, line, fn)
  b.insulated = insulated
  insert(S.block.children, b)
end

dsl.describe = curried(function(n, f, file, line) add_block("describe", n, f, file, line, false) end)
-- insulate: what the block's tests and hooks do to globals (the spec file's and _G) and to
-- package.loaded is undone when the block is left, as in busted.
dsl.insulate = curried(function(n, f, file, line) add_block("insulate", n, f, file, line, true) end)

-- Called by dsl.it and dsl.pending, whose caller is the spec.
local function add_test(name, fn, pending)
  need_collect(pending and "pending" or "it", 3)
  if type(name) ~= "string" then error("it(name, fn) expects a string name", 3) end
  if fn ~= nil and type(fn) ~= "function" then
    error(("it(name, fn) expects a function, got %s for %q"):format(type(fn), name), 3)
  end
  local file, line = where(3)
  local b = S.block
  insert(b.children, { kind = "test", name = name, full = join(b.full, name), fn = fn, parent = b,
    file = file, line = line, pending = pending or fn == nil })
end

-- it("name") alone registers a pending test; it "name" (fn) then gives it its body.
function dsl.it(name, fn)
  add_test(name, fn, false)
  if fn == nil and type(name) == "string" then
    local t = S.block.children[#S.block.children]
    return function(f)
      if type(f) ~= "function" then error(("it %q (fn) expects a function, got %s"):format(name, type(f)), 2) end
      t.fn, t.pending = f, false
    end
  end
end

-- pending(name) registers a skipped test; called inside a running test it skips that test.
function dsl.pending(name, fn)
  if S.phase == "run" then error({ [PENDING] = true, reason = tostring(name or "pending") }) end
  add_test(name, fn, true)
  return function() end   -- pending "name" (fn): the body is never run
end

local function hook(kind)
  return function(fn)
    need_collect(kind, 2)
    if type(fn) ~= "function" then error(kind .. "(fn) expects a function", 2) end
    insert(S.block[kind], fn)
  end
end
-- busted: setup and teardown are strict (the block's start and end, whether its tests run or not);
-- lazy_setup runs before the block's first test that runs, lazy_teardown after the block if it ran.
dsl.setup, dsl.teardown = hook("setup"), hook("teardown")
dsl.strict_setup, dsl.strict_teardown = dsl.setup, dsl.teardown
dsl.lazy_setup, dsl.lazy_teardown = hook("lazy_setup"), hook("lazy_teardown")
dsl.before_each, dsl.after_each = hook("before_each"), hook("after_each")

-- finally(fn) inside a test: cleanup that runs after the test body, whatever happened.
function dsl.finally(fn)
  if S.phase ~= "run" then error("finally() may only be called inside a test", 2) end
  insert(S.finally, fn)
end

-- randomize() / randomize(true) / randomize(seed) / randomize(true, seed) in a describe body: that
-- block's children run shuffled (busted's seed rule: the first number given, else the run's seed).
-- randomize(false) keeps them in order even under --shuffle.
function dsl.randomize(...)
  need_collect("randomize", 2)
  local n, a, b = select("#", ...), ...
  local on = n == 0 or (a and true or false)
  S.block.randomize = on
  if on then S.block.seed = tonumber(a) or tonumber(b) end
end

-- busted's aliases.
dsl.context, dsl.expose = dsl.describe, dsl.describe     -- expose: files share _G here anyway
dsl.spec, dsl.test = dsl.it, dsl.it

---------------------------------------------------------------------------------------------------
-- Running a body
---------------------------------------------------------------------------------------------------

-- Runs fn as block b's body (a file's chunk, or a describe's function): its calls register b's
-- children. Returns nil or the error's text.
function M.run_body(b, fn)
  local saved_block, saved_phase = S.block, S.phase
  S.block, S.phase = b, "collect"
  local ok, e = xpcall(fn, handler)
  S.block, S.phase = saved_block, saved_phase
  if not ok then return error_text(e) end
end

-- The names a block registered, one a line ("{name" and "}" around blocks are not needed here: only
-- the direct children are known): ranks must agree on them, or per-test exchanges would not line up.
function M.signature(b)
  local names = {}
  for _, c in ipairs(b.children) do names[#names + 1] = (c.kind == "test" and "it " or "describe ") .. c.name end
  return concat(names, "\n"), #names
end

return M
