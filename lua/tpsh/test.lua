-- tpsh.test: the spec runner of `tpsh test` (busted style, run on every MPI rank).
--
-- The host calls os.exit(require("tpsh.test").main(args)) on every rank. The whole design rests on
-- one rule: every rank makes the same sequence of collective calls whatever its tests do. So
--   * rank 0 finds the spec files and broadcasts the list;
--   * every rank loads every file (collecting the describe/it tree) and ONE allgather exchanges each
--     file's load result and the names it registered: a file that fails or registers different tests
--     on some rank is dropped on all ranks alike;
--   * every test (and its hooks) runs inside xpcall, then ONE allgather per test tells every rank the
--     outcome on every rank. A failing assert can never skip a collective of the runner;
--   * the ranks also agree after each setup and each level of before_each hooks, so that a test body
--     (or an inner hook) runs on every rank or on none: a hook that failed on one rank must not leave
--     the others alone in the body's collectives;
--   * all these exchanges run on a group of the runner's own, never on the world that specs use, and
--     each payload names its step: ranks found at different steps are reported and the run stops.
-- A test passes only when it passes on all ranks; a failure names its ranks and each distinct message.
-- Output is written by rank 0 only (tpsh.test_output holds the formats).

local ffi = require "ffi"
local output = require "tpsh.test_output"
local issued = require "tpsh.issued"
local fail_record = output.fail_record

local M = {}
local concat, fmt, insert = table.concat, string.format, table.insert

---------------------------------------------------------------------------------------------------
-- Clock and terminal (symbols renamed with __asm__ so they cannot clash with the host's cdefs)
---------------------------------------------------------------------------------------------------

local C = ffi.C
local have_ffi = pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } tpsh_test_timespec;
int tpsh_test_clock_gettime(int clk, tpsh_test_timespec *ts) __asm__("clock_gettime");
int tpsh_test_isatty(int fd) __asm__("isatty");
int tpsh_test_nanosleep(const tpsh_test_timespec *req, tpsh_test_timespec *rem) __asm__("nanosleep");
]])
local ts = have_ffi and ffi.new("tpsh_test_timespec")

-- Wall time, monotonic: os.clock is CPU time and would miss a test that waits on a collective.
local function now()
  if ts and C.tpsh_test_clock_gettime(1 --[[CLOCK_MONOTONIC]], ts) == 0 then
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
  end
  return os.clock()
end

local function sleep(seconds)
  if not have_ffi then return end
  local req = ffi.new("tpsh_test_timespec", math.floor(seconds), (seconds % 1) * 1e9)
  C.tpsh_test_nanosleep(req, nil)
end

local function stdout_is_terminal()
  local term = os.getenv("TERM")
  return term ~= nil and term ~= "dumb" and have_ffi and C.tpsh_test_isatty(1) == 1
end

---------------------------------------------------------------------------------------------------
-- Command line
---------------------------------------------------------------------------------------------------

local USAGE = [[
usage: tpsh test [options] [paths...]       (mpiexec -n N tpsh test ...)
Runs the *_spec.lua files found under paths (files or directories; default: tests/ or spec/).
  --filter PATTERN        run only tests whose full name matches the Lua pattern (repeatable)
  --exclude PATTERN       skip tests whose full name matches (repeatable; also --filter-out)
  -t, --tags T1,T2        run only tests tagged #T1 or #T2 in their names
  --exclude-tags T1,T2    skip tests carrying one of these tags
  -l, --list              print the full names of the selected tests, run nothing
  --repeat N              run the selected tests N times
  --shuffle               shuffle tests within each describe block (same order on every rank)
  --seed N                seed of the shuffle, in [0, 2^53) (implies --shuffle; default: chosen, printed)
  -o, --output FORMAT     utf | plain | tap | junit (default: utf on a terminal, else plain)
  --junit FILE            also write a JUnit XML report to FILE
  -p, --pattern PATTERN   Lua pattern for spec file names in directories (default: _spec%.lua$)
  -h, --help              this text
A test passes when it passes on every rank; failures name the ranks. Exit status 1 when any failed.
]]

local function parse_args(args)
  local o = { paths = {}, filters = {}, excludes = {}, tags = {}, exclude_tags = {},
              rep = 1, pattern = "_spec%.lua$" }
  local function csv(list, s) for w in s:gmatch("[^,%s]+") do list[#list + 1] = w:gsub("^#", "") end end
  local i = 1
  while i <= #args do
    local a, inline = args[i], nil
    local name, v = a:match("^(%-%-[%w%-]+)=(.*)$")
    if name then a, inline = name, v end
    local function val()
      if inline then return inline end
      i = i + 1
      if args[i] == nil then error("option " .. a .. " needs a value", 0) end
      return args[i]
    end
    if a == "-h" or a == "--help" then o.help = true
    elseif a == "--filter" then insert(o.filters, val())
    elseif a == "--exclude" or a == "--filter-out" then insert(o.excludes, val())
    elseif a == "-t" or a == "--tags" then csv(o.tags, val())
    elseif a == "--exclude-tags" then csv(o.exclude_tags, val())
    elseif a == "-l" or a == "--list" then o.list = true
    elseif a == "--repeat" then o.rep = tonumber(val())
      if not o.rep or o.rep < 1 or o.rep % 1 ~= 0 then error("--repeat needs a positive integer", 0) end
    elseif a == "--shuffle" then o.shuffle = true
    elseif a == "--seed" then
      local v = val()
      o.seed, o.shuffle = tonumber(v), true
      -- as tp.manual_seed: beyond 2^53 a double is no longer every integer, and the printed seed
      -- would not give the order back
      if not o.seed or o.seed % 1 ~= 0 or o.seed < 0 or o.seed >= 2 ^ 53 then
        error("--seed needs an integer in [0, 2^53), got " .. v, 0)
      end
    elseif a == "-o" or a == "--output" then o.format = val()
      if not output.formats[o.format] then error("unknown output format '" .. o.format .. "'", 0) end
    elseif a == "--junit" then o.junit = val()
      -- written over at the end of the run: a spec file given here (`--junit a_spec.lua`, the file name
      -- forgotten) was overwritten with the report, as --trace refuses a script's
      local why = o.junit == "" and "an empty one" or o.junit:lower():match("%.lua$") and "a Lua file (" .. o.junit .. ")"
      if why then error("--junit expects the report's file name (.xml), got " .. why, 0) end
    elseif a == "-p" or a == "--pattern" then o.pattern = val()
    elseif a:sub(1, 1) == "-" and a ~= "-" then error("unknown option " .. a, 0)
    else insert(o.paths, a) end
    i = i + 1
  end
  -- A bad pattern would otherwise raise in the middle of selection.
  for _, list in ipairs { o.filters, o.excludes, { o.pattern } } do
    for _, p in ipairs(list) do
      if not pcall(string.find, "", p) then error("bad Lua pattern '" .. p .. "'", 0) end
    end
  end
  return o
end

---------------------------------------------------------------------------------------------------
-- Discovery (rank 0 only; the result is broadcast)
---------------------------------------------------------------------------------------------------

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function exists(p) local f = io.open(p, "r"); if f then f:close() end return f ~= nil end

-- Directories give their files whose base name matches the pattern, sorted bytewise (LC_ALL=C) so
-- that the order never depends on a locale; a file named explicitly is taken whatever its name.
-- Symbolic links are followed (find -L), to files and to directories alike.
local function discover(paths, pattern)
  if #paths == 0 then
    local dir = exists("tests") and "tests" or exists("spec") and "spec"
    -- neither: no spec files, said as such (a missing "tests" counted as a failed test)
    if not dir then return { files = {}, missing = {}, no_default = true } end
    paths = { dir }
  end
  local files, missing, seen = {}, {}, {}
  for _, p in ipairs(paths) do
    if not exists(p) then
      insert(missing, p)
    else
      local pipe = io.popen("find -L " .. shell_quote(p) .. " -type f 2>/dev/null | LC_ALL=C sort")
      for f in pipe:lines() do
        local explicit = (f == p)
        if (explicit or f:match("[^/]*$"):find(pattern)) and not seen[f] then
          seen[f] = true
          insert(files, f)
        end
      end
      pipe:close()
    end
  end
  return { files = files, missing = missing }
end

---------------------------------------------------------------------------------------------------
-- Errors: messages with the part of the traceback that belongs to the spec
---------------------------------------------------------------------------------------------------

local SELF_SRC = debug.getinfo(1, "S").short_src
local PENDING = {}   -- marks the error object of pending() called inside a running test

local function error_text(e)
  if type(e) == "string" then return e end
  local mt = getmetatable(e)
  if mt and mt.__tostring then
    -- protected: an error in __tostring inside the handler was "error in error handling", the test's
    -- own failure lost
    local ok, s = pcall(tostring, e)
    if ok then return s end
    return ("error: a %s value whose __tostring raised an error (%s)"):format(type(e), tostring(s))
  end
  -- as a script's error says it (main.c), not "table: 0x55..." (audit, 2026-12-01)
  if e == nil or type(e) == "boolean" then return "error: " .. tostring(e) end
  if type(e) == "number" then return tostring(e) end
  return ("error: a %s value (an error object without __tostring)"):format(type(e))
end

-- Keeps the frames of the spec and the code it calls; drops the runner's, luassert's and C frames.
-- A lone frame that the message already points at is left out, as busted does.
local function handler(e)
  if type(e) == "table" and e[PENDING] then return e end
  local msg = error_text(e)
  local kept = {}
  for line in debug.traceback("", 2):gmatch("[^\n]+") do
    if line:find("in function 'xpcall'", 1, true) then break end   -- the runner's side of the call
    if line:sub(1, 1) == "\t" and not (line:find("[C]:", 1, true) or line:find(SELF_SRC, 1, true)
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

---------------------------------------------------------------------------------------------------
-- The tree and the DSL
---------------------------------------------------------------------------------------------------

local cur_block       -- the block that describe/it/hooks register into while a file loads
local phase           -- "collect" while a file loads, "run" while a test runs, else nil
local cur_finally     -- finally() handlers of the running test
local collect_errs    -- errors raised by describe bodies of the file being loaded

local function join(a, b) return a == "" and b or (a .. " " .. b) end

local function new_block(name, parent, file, line)
  return { kind = "block", name = name, full = parent and join(parent.full, name) or "", parent = parent,
           file = file, line = line, children = {}, setup = {}, teardown = {}, before_each = {},
           after_each = {} }
end

local function where(level)
  local info = debug.getinfo(level + 1, "Sl")
  return (info.source:gsub("^@", "")), info.currentline
end

-- level: of the spec's call, counted from need_collect's caller (as error's level is).
local function need_collect(what, level)
  if phase ~= "collect" then
    error(what .. "() may only be called while a spec file loads, not inside a test or hook", level + 1)
  end
end

local dsl = {}

local function add_block(kind, name, fn, insulated)
  need_collect(kind, 3)
  if type(name) ~= "string" or type(fn) ~= "function" then
    error(kind .. "(name, fn) expects a string and a function", 3)
  end
  local file, line = where(3)
  local b = new_block(name, cur_block, file, line)
  b.insulated = insulated
  insert(cur_block.children, b)
  local saved = cur_block
  cur_block = b
  local ok, err = xpcall(fn, handler)
  cur_block = saved
  if not ok then insert(collect_errs, { name = b.full, file = file, line = line, msg = error_text(err) }) end
end

function dsl.describe(name, fn) add_block("describe", name, fn, false) end
-- insulate: what the block's tests and hooks do to globals (the spec file's and _G) and to
-- package.loaded is undone when the block is left, as in busted.
function dsl.insulate(name, fn) add_block("insulate", name, fn, true) end

local function add_test(name, fn, pending, level)
  need_collect(pending and "pending" or "it", level)
  if type(name) ~= "string" then error("it(name, fn) expects a string name", level) end
  if fn ~= nil and type(fn) ~= "function" then
    error(("it(name, fn) expects a function, got %s for %q"):format(type(fn), name), level)
  end
  local file, line = where(level)
  insert(cur_block.children, { kind = "test", name = name, full = join(cur_block.full, name),
    fn = fn, parent = cur_block, file = file, line = line, pending = pending or fn == nil })
end

function dsl.it(name, fn) add_test(name, fn, false, 3) end

-- pending(name) registers a skipped test; called inside a running test it skips that test.
function dsl.pending(name, fn)
  if phase == "run" then error({ [PENDING] = true, reason = tostring(name or "pending") }) end
  add_test(name, fn, true, 3)
end

local function hook(kind)
  return function(fn)
    need_collect(kind, 2)
    if type(fn) ~= "function" then error(kind .. "(fn) expects a function", 2) end
    insert(cur_block[kind], fn)
  end
end
dsl.setup, dsl.teardown = hook("setup"), hook("teardown")
dsl.before_each, dsl.after_each = hook("before_each"), hook("after_each")

-- finally(fn) inside a test: cleanup that runs after the test body, whatever happened.
function dsl.finally(fn)
  if phase ~= "run" then error("finally() may only be called inside a test", 2) end
  insert(cur_finally, fn)
end

-- busted's aliases. setup is lazy (only for blocks with tests to run); strict_* are the same here.
dsl.context, dsl.expose = dsl.describe, dsl.describe     -- expose: files share _G here anyway
dsl.spec, dsl.test = dsl.it, dsl.it
dsl.lazy_setup, dsl.strict_setup = dsl.setup, dsl.setup
dsl.lazy_teardown, dsl.strict_teardown = dsl.teardown, dsl.teardown

---------------------------------------------------------------------------------------------------
-- luassert, with assert.tensor_close
---------------------------------------------------------------------------------------------------

local function require_luassert()
  local ok, luassert = pcall(require, "luassert")
  if not ok then   -- the Debian location, in case the host's package.path lacks it
    package.path = package.path .. ";/usr/share/lua/5.1/?.lua;/usr/share/lua/5.1/?/init.lua"
    luassert = require "luassert"
  end
  return luassert
end

local function shape_str(t)
  local ok, shape = pcall(function() return t.shape end)
  return ok and type(shape) == "table" and ("{" .. concat(shape, ",") .. "}") or "?"
end

local function register_tensor_close(luassert, tp)
  local say = require "say"
  say:set("assertion.tensor_close.positive", "Expected tensors to be close (rtol=%s, atol=%s).\n%s\n%s\n%s")
  say:set("assertion.tensor_close.negative", "Expected tensors not to be close (rtol=%s, atol=%s).\n%s\n%s\n%s")
  local function is_tensor(x)
    if tp.is_tensor then return tp.is_tensor(x) end
    return type(x) ~= "nil" and pcall(function() return x.shape and x.dtype end)
  end
  local function show(label, x)
    if not is_tensor(x) then return fmt("%s: (%s) %s  -- not a tensor", label, type(x), tostring(x)) end
    return fmt("%s: shape %s dtype %s\n  %s", label, shape_str(x), tostring(x.dtype),
      (tostring(x):gsub("\n", "\n  ")))
  end
  -- The arguments are rewritten in place into the text luassert prints (it formats them after the
  -- callback returns), so the message carries shapes, dtypes and the max abs diff.
  -- Misuse (a tolerance that is not a number >= 0, tensors that cannot be compared: not tensors,
  -- shapes that differ, freed) is an error, not an answer: read as "not close" it let the negated form
  -- pass on anything.
  local function misuse(msg) error("assert.tensor_close: " .. msg, 0) end
  local function tolerance(v, default, what)
    if v == nil then return default end
    if type(v) ~= "number" or not (v >= 0) then misuse(fmt("expected %s as a number >= 0, got %s", what, tostring(v))) end
    return v
  end
  local function tensor_close(state, args)
    local a, b = args[1], args[2]
    local rtol, atol = tolerance(args[3], 1e-5, "rtol (argument 3)"), tolerance(args[4], 1e-8, "atol (argument 4)")
    local close, diff = false, "n/a"
    if is_tensor(a) and is_tensor(b) then
      local ok, res = pcall(tp.allclose, a, b, rtol, atol)
      if not ok then
        misuse(fmt("the tensors cannot be compared: %s\n%s\n%s", (tostring(res):gsub("^[^:\n]+:%d+: ", "")),
          show("a", a), show("b", b)))
      end
      close = res == true
      local okd, d = pcall(a.max_abs_diff, a, b)
      diff = okd and tostring(d) or ("n/a (" .. tostring(d) .. ")")
    elseif state.mod == false then
      misuse("expected two tensors, got " .. type(a) .. " and " .. type(b))
    end
    if args[5] ~= nil then rawset(state, "failure_message", args[5]) end
    local text = { tostring(rtol), tostring(atol), show("a", a), show("b", b), "max abs diff: " .. diff }
    for i = 1, math.max(args.n or 0, 5) do args[i] = text[i] end
    args.n, args.nofmt = 5, { true, true, true, true, true }
    return close
  end
  luassert:register("assertion", "tensor_close", tensor_close,
    "assertion.tensor_close.positive", "assertion.tensor_close.negative")
end

---------------------------------------------------------------------------------------------------
-- Loading specs
---------------------------------------------------------------------------------------------------

-- Each file runs in its own environment (reads fall through to _G) so that its globals do not
-- leak into the next file; the functions it defines share that environment.
local function load_spec(path)
  local root = new_block("", nil, path, 0)
  collect_errs = {}
  local res = { ok = true }
  local chunk, err = loadfile(path)
  if not chunk then
    res.ok, res.msg = false, err
  else
    root.env = setmetatable({}, { __index = _G })
    setfenv(chunk, root.env)
    cur_block, phase = root, "collect"
    local ok, e = xpcall(chunk, handler)
    cur_block, phase = nil, nil
    if not ok then res.ok, res.msg = false, error_text(e) end
  end
  res.errs = collect_errs
  -- The registered names: ranks must agree on them, or per-test collectives would not line up.
  local names, count = {}, 0
  local function walk(b)
    for _, c in ipairs(b.children) do
      if c.kind == "test" then names[#names + 1], count = c.full, count + 1
      else names[#names + 1] = "{" .. c.name; walk(c); names[#names + 1] = "}" end
    end
  end
  walk(root)
  res.sig, res.count = concat(names, "\n"), count
  return root, res
end

---------------------------------------------------------------------------------------------------
-- Selection and order
---------------------------------------------------------------------------------------------------

-- A tag is '#' followed by non-space characters, anywhere in the full name (#slow, #x.y, #gpu:2);
-- --tags and --exclude-tags compare whole tags.
local function tags_of(name)
  local t = {}
  for tag in name:gmatch("#(%S+)") do t[tag] = true end
  return t
end

local function selected(o, t)
  local name = t.full
  local function any(list, f) for _, x in ipairs(list) do if f(x) then return true end end return false end
  if #o.filters > 0 and not any(o.filters, function(p) return name:find(p) end) then return false end
  if any(o.excludes, function(p) return name:find(p) end) then return false end
  local tags = tags_of(name)
  if #o.tags > 0 and not any(o.tags, function(g) return tags[g] end) then return false end
  return not any(o.exclude_tags, function(g) return tags[g] end)
end

-- Park-Miller: exact in doubles, so every rank (and every LuaJIT) draws the same numbers, and it
-- leaves math.random alone for the specs.
local function new_rng(seed)
  local s = seed % 2147483646 + 1
  return function(n) s = s * 16807 % 2147483647; return s % n + 1 end
end

local function ordered_tests(roots, o, rng)
  local list = {}
  local function walk(b)
    local kids = { unpack(b.children) }
    if rng then
      for i = #kids, 2, -1 do local j = rng(i); kids[i], kids[j] = kids[j], kids[i] end
    end
    for _, c in ipairs(kids) do
      if c.kind == "block" then walk(c) elseif selected(o, c) then list[#list + 1] = c end
    end
  end
  for _, r in ipairs(roots) do walk(r) end
  return list
end

---------------------------------------------------------------------------------------------------
-- The runner's exchanges
---------------------------------------------------------------------------------------------------

-- Every exchange of the runner runs on a group of its own (a copy of the world, made once before
-- the first exchange), never on the world that the specs use: a test where one rank calls
-- tp.allgather and the others do not would otherwise pair that call with the runner's exchange on
-- the other ranks, and the runner would tell every later test another test's outcome. Each payload
-- also names its step (a count, and the test and stage in words): ranks found at different steps are
-- reported as out of step and the run stops, rather than being trusted.
local OUT_OF_STEP = {}   -- key of the error object raised by an exchange that found ranks out of step

-- The watchdog names the wait it times out on; the runner's waits say which test they follow.
local have_watch = have_ffi and pcall(function()
  return C.tpsh_watch_exchange_begin, C.tpsh_watch_wait_end, C.tpsh_watch_test, C.tpsh_watch_step
end)

-- An asynchronous error (NCCL's: a peer gone) that tpsh noted during a test and no call of the test
-- raised: the test fails with it. Without this the next test's first wait raised it, or, after the
-- last test, nothing did (`tpsh test` has no end-of-script synchronize).
local have_async = have_ffi and pcall(function() return C.tpsh_async_error_check end)
local function async_error_left()
  if have_async and C.tpsh_async_error_check() ~= 0 then return require("tpsh.capi").last_error() end
end

local function new_exchange(tp)
  local g   -- the runner's group; with one rank nothing can be out of step, and tp's calls are local
  if tp.size > 1 then g = tp.world:split(0, tp.rank) end
  local x = { n = 0, keep = {}, check = tp.check }   -- check: tp.check, for reports a test leaves

  -- failure: this rank's failure in the running test, told to the other ranks' watchdogs (a rank
  -- blocked in a collective that this rank will now never call ends the run quoting it, watchdog.c).
  local function watched(what, f, v, failure)
    if not (g and have_watch) then return f(v) end
    local label = "tpsh test's exchange at " .. what .. "; a rank that has not come to it is still in an "
      .. "earlier step (in a collective that not every rank called?)"
    x.keep[x.n % 4] = label          -- the watchdog reads the text while the wait lasts
    C.tpsh_watch_exchange_begin(label, failure)
    local ok, r = pcall(f, v)
    C.tpsh_watch_wait_end()
    if not ok then error(r, 0) end
    return r
  end
  local function allgather(v) if g then return g:allgather(v) end return tp.allgather(v) end

  -- A test begins (before its setup): the watchdog takes notices of failures in this test only.
  -- step: the test (or the loading) in words, for the message should the watchdog end the run in it.
  x.tests = 0
  x.digests = {}   -- different_collectives' record of each group's digests after the last test
  x.p2p_seen = {}  -- unmatched_p2p's record of every rank's sends and receives after the last test
  function x.begin_test(step)
    x.tests = x.tests + 1
    if g and have_watch then C.tpsh_watch_step(step); C.tpsh_watch_test(x.tests) end
  end
  function x.end_tests() if g and have_watch then C.tpsh_watch_test(0); C.tpsh_watch_step(nil) end end

  function x.bcast(v) if g then return g:bcast(v, 0) end return tp.bcast(v, 0) end

  -- Every rank's payload (a table); what: the step in words ("test 'x', its result").
  -- note: words for the watchdog's message only (this rank's own news), not compared across ranks.
  -- failure: this rank's failure in the running test, if any, for the other ranks' watchdogs.
  function x.all(payload, what, note, failure)
    x.n = x.n + 1
    payload.step, payload.at = x.n, what
    local all = watched(what .. (note or ""), allgather, payload, failure)
    local function at(p)
      if type(p) ~= "table" or type(p.at) ~= "string" or type(p.step) ~= "number" then
        return "something that is not the runner's (" .. type(p) .. ")"
      end
      return fmt("%s (exchange %d)", p.at, p.step)
    end
    local bad, ref = {}, at(all[1])
    for r = 2, #all do
      local a = at(all[r])
      if a ~= ref then
        insert(bad, { r - 1, fmt("ranks are out of step: rank %d is at %s, rank 0 at %s; the run stops here",
          r - 1, a, ref) })
      end
    end
    if #bad > 0 then error({ [OUT_OF_STEP] = bad }, 0) end
    return all
  end

  -- The ranks agree on how a step before a test body went. mine: nil, { err = text } or
  -- { skip = reason }. Returns "ok", "fail" (some rank failed) or "skip", the same on every rank.
  function x.agree(mine, what)
    local failure = mine and mine.err and (what .. ": " .. tostring(mine.err)) or nil
    local all, st = x.all({ err = mine and mine.err, skip = mine and mine.skip }, what, nil, failure), "ok"
    for _, p in ipairs(all) do
      if p.err then return "fail" end
      if p.skip then st = "skip" end
    end
    return st
  end
  return x
end

-- After a test, the members of a group must have issued the same number of collectives on it (sends
-- and receives aside): where they have not, a collective that not every rank called waits for the
-- others (on a stream: the test may have passed), and every later one on that group would be paired
-- with the wrong call. Returns nil, or the failure's entries ({rank, message}), the same on every rank.
local function uneven_collectives(groups, step)
  local entries = {}
  for _, gr in ipairs(issued.uneven(groups) or {}) do
    local msg = fmt("after %s the ranks have issued different numbers of collectives on group %s (world "
      .. "ranks %s): %s. The ones that not every rank called wait for the others, and later ones would be paired "
      .. "with the wrong calls: the run stops here", step, gr.id, gr.ranks, issued.counts_text(gr))
    for _, m in ipairs(gr.members) do insert(entries, { m, msg }) end
  end
  return #entries > 0 and entries or nil
end

-- After a test whose ranks issued as many collectives on each group, they must have issued the same
-- ones in it (issued.different). MPI and NCCL complete some such pairs (two reduce ops, two roots; NCCL
-- an all_reduce against a reduce), so the test may have passed on results not to be trusted.
-- seen: issued.different's record, kept across tests. Returns nil, or the failure's entries.
local function different_collectives(groups, step, seen)
  local entries = {}
  for _, f in ipairs(issued.different(groups, seen) or {}) do
    local gr = f.group
    local msg = fmt("in %s the ranks issued different collectives on group %s (world ranks %s): as many as "
      .. "each other, but rank %d's and rank %d's differ in the kind, element type, count, root or reduce op of at "
      .. "least one. MPI or NCCL completed them, so the test's results are not to be trusted (--check names the call)",
      step, gr.id, gr.ranks, f.a, f.b)
    for _, m in ipairs(gr.members) do insert(entries, { m, msg }) end
  end
  return #entries > 0 and entries or nil
end

---------------------------------------------------------------------------------------------------
-- After a test, what each rank sent to another in it must be what that one received (issued.p2p_unmatched).
-- A send without its receive completes unnoticed when small (MPI's eager protocol on the CPU backend) and
-- a later receive from that rank would take its message; a receive without its send waits on its stream.
-- Either way later tests cannot be trusted: the run stops there, as it does for collectives left waiting.
-- Returns nil, or the failure's entries ({rank, message}) for both ranks of each pair, the same everywhere.
local function unmatched_p2p(all, step, seen)
  local entries = {}
  for _, u in ipairs(issued.p2p_unmatched(all, seen) or {}) do
    local msg = u.groups
      and fmt("in %s rank %d sent %d message(s) to rank %d, which received as many from it, but not on the "
        .. "same groups (a send meets only a receive on its own group)", step, u.from, u.sent, u.to)
      or fmt("in %s rank %d sent %d message(s) to rank %d, which received %d from it (%s)", step, u.from, u.sent,
        u.to, u.received, u.sent > u.received and "a send that no rank receives is lost on the CPU backend, or taken "
        .. "by a later receive, and waits forever on NCCL" or "a receive whose send never comes waits forever")
    msg = msg .. ": the run stops here"
    insert(entries, { u.from, msg })
    if u.to ~= u.from then insert(entries, { u.to, msg }) end
  end
  return #entries > 0 and entries or nil
end

---------------------------------------------------------------------------------------------------
-- Running
---------------------------------------------------------------------------------------------------

-- Adds a rank's named errors ({name, file, line, msg}) to groups, one group per name, in order.
local function group(groups, errs, rank)
  for _, e in ipairs(errs or {}) do
    if not groups[e.name] then groups[e.name] = { e = e, entries = {} }; insert(groups, groups[e.name]) end
    insert(groups[e.name].entries, { rank, e.msg })
  end
end

local function chain_of(t)
  local c, b = {}, t.parent
  while b do insert(c, 1, b); b = b.parent end
  return c
end

local function block_label(b) return b.full ~= "" and b.full or b.file end

-- Check mode: the text of the sanitizer reports made since mark and still held (nil: none), which are
-- then cleared so that what follows starts clean. A full collection first: a tensor dropped while a
-- stream still used it is freed (and reported) here, in the step that dropped it, and not in whichever
-- later test the collector happens to run in.
local function reports_left(x, mark)
  if not mark then return nil end
  if x.check.enabled() then collectgarbage(); collectgarbage() end
  local left = x.check._since(mark)
  if #left == 0 then return nil end
  x.check.clear()
  return "the stream sanitizer reported:\n" .. concat(left, "\n")
end

-- Runs hooks and body of one test on this rank; returns the payload that is allgathered.
-- The body runs only when every rank is ready: a setup or before_each that failed on one rank
-- would otherwise leave the others alone in the body's collectives. The ranks agree after each
-- level of before_each hooks (so that an inner hook's collectives are called by all or none);
-- after_each hooks run from the level whose before_each failed outward, as in busted.
local function run_one(t, chain, state, luassert, x)
  local t0 = now()
  local res = { ok = true }
  if t.pending then
    res.skip = true
    return res
  end
  local errs, blocked = {}, false
  for _, b in ipairs(chain) do
    local st = state[b]
    if st and st.blocked then
      blocked = true
      if st.err then errs[1] = st.err end
      break
    end
  end
  if not blocked then
    local mark = x.check and x.check._mark()
    local snap = luassert:snapshot()   -- spies and stubs are reverted after each test
    phase, cur_finally = "run", {}
    -- "ok", "fail" or "skip" (pending() was called)
    local function call(label, fn)
      local ok, e = xpcall(fn, handler)
      if ok then return "ok" end
      if type(e) == "table" and e[PENDING] then res.skip, res.reason = true, e.reason; return "skip" end
      errs[#errs + 1] = label and (label .. ": " .. e) or e
      return "fail"
    end
    local go, last = true, #chain   -- last: the innermost level whose after_each hooks are due
    for k, b in ipairs(chain) do
      if #b.before_each > 0 then
        local label = "before_each of '" .. block_label(b) .. "'"
        local mine
        for _, fn in ipairs(b.before_each) do
          local r = call(label .. " failed", fn)
          if r ~= "ok" then
            mine = r == "fail" and { err = errs[#errs] } or { skip = res.reason or "pending" }
            break
          end
        end
        if x.agree(mine, fmt("test '%s', after %s", t.full, label)) ~= "ok" then go, last = false, k; break end
      end
    end
    if go then call(nil, t.fn) end
    for i = #cur_finally, 1, -1 do call("finally failed", cur_finally[i]) end
    for i = last, 1, -1 do
      for _, fn in ipairs(chain[i].after_each) do call("after_each of '" .. block_label(chain[i]) .. "' failed", fn) end
    end
    phase, cur_finally = nil, nil
    pcall(snap.revert, snap)
    -- Check mode: a report the test made and left (one that provokes a race on purpose reads the
    -- reports and clears them) fails it; an identical race in the next test is reported again.
    errs[#errs + 1] = reports_left(x, mark)
  end
  if #errs > 0 then res.ok, res.skip, res.msg = false, nil, concat(errs, "\n") end
  res.t = now() - t0
  return res
end

-- Runs a block's setup or teardown hooks, each followed by the finally() handlers it registered;
-- returns nil or the first error's text (a sanitizer report the hooks left is one).
local function run_hooks(fns, kind, label, x)
  local mark = #fns > 0 and x.check and x.check._mark()
  for _, fn in ipairs(fns) do
    phase, cur_finally = "run", {}
    local err
    local ok, e = xpcall(fn, handler)
    if not ok then err = kind .. " of '" .. label .. "' failed: " .. error_text(type(e) == "table" and e.reason or e) end
    for i = #cur_finally, 1, -1 do
      local okf, ef = xpcall(cur_finally[i], handler)
      if not okf and not err then
        err = "finally in " .. kind .. " of '" .. label .. "' failed: " .. error_text(type(ef) == "table" and ef.reason or ef)
      end
    end
    phase, cur_finally = nil, nil
    if err then return err end
  end
  local left = reports_left(x, mark)
  return left and (kind .. " of '" .. label .. "': " .. left) or nil
end

-- An insulated block's view of the tables it protects, taken when it is entered: the spec file's
-- globals, _G and package.loaded (raw copies of each).
local function snapshot(root)
  local tabs, copies = { root.env, _G, package.loaded }, {}
  for i, t in ipairs(tabs) do
    local c = {}
    for k, v in next, t do c[k] = v end
    copies[i] = c
  end
  return { tabs = tabs, copies = copies }
end

local function restore(snap)
  for i, t in ipairs(snap.tabs) do
    local c, added = snap.copies[i], {}
    for k in next, t do if c[k] == nil then added[#added + 1] = k end end
    for _, k in ipairs(added) do rawset(t, k, nil) end
    for k, v in next, c do if rawget(t, k) ~= v then rawset(t, k, v) end end
  end
end

-- Runs the list once. Blocks are entered (setup) before their first selected test and left
-- (teardown) after their last one; the order of entering and leaving follows the list, which is the
-- same on every rank. The ranks agree after each setup: when it failed on any rank, the block's tests
-- run on no rank (they fail, naming the ranks where it failed) and its teardown runs on no rank.
-- Teardown errors travel with the exchange of the test after which they ran.
local function run_list(list, x, luassert, emit)
  local stack, state = {}, {}
  for i, t in ipairs(list) do
    x.test = t
    x.begin_test(fmt("test '%s' (%s:%d)", t.full, t.file, t.line))
    local chain = chain_of(t)
    if not t.pending then
      for k = #stack + 1, #chain do
        local b = chain[k]
        stack[k] = b
        local parent = k > 1 and state[chain[k - 1]] or nil
        local st = { snap = b.insulated and snapshot(chain[1]) or nil }   -- before its setup runs
        if parent and parent.blocked then
          st.blocked, st.err = true, parent.err
        elseif #b.setup > 0 then
          st.err = run_hooks(b.setup, "setup", block_label(b), x)
          st.blocked = x.agree(st.err and { err = st.err }, fmt("test '%s', after setup of '%s'", t.full,
            block_label(b))) ~= "ok"
        end
        state[b] = st
      end
    end
    local res = run_one(t, chain, state, luassert, x)
    local next_chain = list[i + 1] and chain_of(list[i + 1]) or {}
    while #stack > 0 and stack[#stack] ~= next_chain[#stack] do
      local b = table.remove(stack)
      if not state[b].blocked then
        local err = run_hooks(b.teardown, "teardown", block_label(b), x)
        if err then
          res.td = res.td or {}
          insert(res.td, { name = block_label(b), file = b.file, line = b.line, msg = err })
        end
      end
      if state[b].snap then restore(state[b].snap) end
    end
    local late = async_error_left()
    if late then
      local what = "an asynchronous error, noted during the test and raised by none of its calls: " .. late
      if res.ok then res.ok, res.msg = false, what else res.msg = tostring(res.msg) .. "\n" .. what end
    end
    -- Every rank learns every rank's outcome.
    -- The step's words also say how the test went here: should the other ranks never come (stuck in a
    -- collective this rank left when it failed), the watchdog's message still carries the failure.
    local here = res.ok and "" or ("; on this rank it failed: " .. tostring(res.msg or "?"):match("^[^\n]*"))
    local failure
    if not res.ok or res.td then
      local parts = { res.msg }
      for _, e in ipairs(res.td or {}) do parts[#parts + 1] = e.msg end
      failure = fmt("test '%s': %s", t.full, concat(parts, "\n"))
    end
    res.colls = have_watch and issued.mine() or nil
    res.p2p = have_watch and issued.p2p_mine() or nil
    local all = x.all(res, fmt("test '%s', its result", t.full), here, failure)
    local fails, skip, reason, tmax, td = {}, false, nil, 0, {}
    local listed = issued.listed(all)
    local step = fmt("test '%s'", t.full)
    local uneven = uneven_collectives(listed, step)
    -- (with uneven counts the run stops below; digests only compare collectives issued alike in number)
    local differ = not uneven and different_collectives(listed, step, x.digests)
    local unmatched = unmatched_p2p(all, step, x.p2p_seen)
    for r, p in ipairs(all) do
      if not p.ok then insert(fails, { r - 1, p.msg or "?" })
      elseif p.skip then skip, reason = true, reason or p.reason end
      tmax = math.max(tmax, p.t or 0)
      group(td, p.td, r - 1)
    end
    for _, e in ipairs(differ or {}) do insert(fails, e) end
    local classname = t.parent.full ~= "" and t.parent.full or t.file
    if #fails > 0 then
      emit(fail_record(t.full, classname, t.file, t.line, fails, tmax))
    else
      emit({ name = t.full, classname = classname, file = t.file, line = t.line, time = tmax,
             status = skip and "skip" or "pass", reason = reason, ranks = {}, failures = {} })
    end
    for _, e in ipairs(td) do
      emit(fail_record(e.e.name .. " (teardown)", e.e.name, e.e.file, e.e.line, e.entries, 0))
    end
    if uneven then error({ [OUT_OF_STEP] = uneven, title = "collectives left waiting", abandon = true }, 0) end
    if unmatched then
      error({ [OUT_OF_STEP] = unmatched, title = "sends and receives left unmatched", abandon = true }, 0)
    end
  end
  x.test = nil
  x.end_tests()
end

-- Loads every file on every rank, then ONE exchange of the load results and registered names.
-- Returns the file roots all ranks agree on and the failures known before anything runs. Called
-- once per --repeat so that every run starts from freshly executed describe bodies, as in busted.
-- Where two ranks' lists of test names (sig: the names, one a line) first differ, said for the error:
-- the counts alone read "2 tests against 2" for a test named differently (audit, 2026-12-01).
local function first_difference(mine, theirs)
  local a, b = {}, {}
  for l in (mine .. "\n"):gmatch("(.-)\n") do a[#a + 1] = l end
  for l in (theirs .. "\n"):gmatch("(.-)\n") do b[#b + 1] = l end
  for k = 1, math.max(#a, #b) do
    if a[k] ~= b[k] then        -- (the lines are test names and "{name" / "}" around describe blocks)
      local function say(l) return not l and "nothing" or l == "}" and "the end of a describe block"
        or l:sub(1, 1) == "{" and fmt("describe %q", l:sub(2)) or fmt("%q", l) end
      return fmt("; the first difference: %s here, %s on rank 0", say(a[k]), say(b[k]))
    end
  end
  return ""
end

-- again: a repetition (--repeat): the files are loaded anew, so their failures are reported anew, but
-- the missing ones were said once already.
-- Describe bodies are spec code, and may issue collectives: the loading is watched as a test is. The
-- watchdog is told a step runs (without it a rank blocked in a collective that another rank's describe
-- body never issued, that one having raised first, waited for --timeout, 600 s by default, with nothing
-- on the screen), and this rank's load errors travel with the exchange for the message. After it, what
-- the ranks issued is compared as after a test (else the first test was blamed for it).
-- Returns the roots, the failures known before anything runs, and nil or the error that stops the run.
local LOADING = "the loading of the spec files"
local function collect(found, tp, x, again)
  local roots, mine, failure = {}, {}, {}
  x.begin_test(LOADING .. " (their describe bodies)")
  for i, path in ipairs(found.files) do
    local mark = x.check and x.check._mark()
    roots[i], mine[i] = load_spec(path)
    -- a report the file's describe bodies left fails as their errors do (and no test is charged with it)
    local left = reports_left(x, mark)
    if left then insert(mine[i].errs, { name = path, file = path, line = 0, msg = "while loading: " .. left }) end
    if not mine[i].ok then insert(failure, path .. ": " .. tostring(mine[i].msg)) end
    for _, e in ipairs(mine[i].errs) do insert(failure, fmt("describe '%s' (%s:%d): %s", e.name, e.file, e.line, e.msg)) end
  end
  failure = #failure > 0 and (LOADING .. ": " .. concat(failure, "\n")) or nil
  local all = x.all({ files = mine, colls = have_watch and issued.mine() or nil,
    p2p = have_watch and issued.p2p_mine() or nil }, LOADING, failure and ("; on this rank it failed: "
    .. failure:match("^[^\n]*")), failure)
  x.end_tests()
  local listed = issued.listed(all)
  local step = LOADING .. " (in describe bodies)"
  local uneven = uneven_collectives(listed, step)
  local differ = not uneven and different_collectives(listed, step, x.digests)
  local unmatched = unmatched_p2p(all, step, x.p2p_seen)
  for r = 1, tp.size do all[r] = all[r].files end

  local pre = {}   -- failures known before anything runs
  for _, p in ipairs(again and {} or found.missing) do
    local e = {}
    for r = 0, tp.size - 1 do e[#e + 1] = { r, p .. ": no such file or directory" } end
    insert(pre, fail_record(p, p, p, 0, e))
  end
  local kept = {}
  for i, path in ipairs(found.files) do
    local loadf, differ, cerrs = {}, {}, {}
    for r = 1, tp.size do
      local x = all[r][i]
      if not x.ok then insert(loadf, { r - 1, x.msg or "?" }) end
      if x.sig ~= all[1][i].sig then
        insert(differ, { r - 1, fmt("registers other tests than rank 0 (%d tests against %d)%s", x.count,
          all[1][i].count, first_difference(x.sig, all[1][i].sig)) })
      end
      group(cerrs, x.errs, r - 1)
    end
    if #loadf > 0 then
      insert(pre, fail_record(path, path, path, 0, loadf))
    elseif #differ > 0 then
      insert(pre, fail_record(path .. " (ranks disagree on the tests)", path, path, 0, differ))
    else
      insert(kept, roots[i])
    end
    for _, x in ipairs(cerrs) do
      insert(pre, fail_record(x.e.name .. " (describe)", path, x.e.file, x.e.line, x.entries))
    end
  end
  if differ then insert(pre, fail_record(step, "", nil, 0, differ)) end
  local stop = uneven and { [OUT_OF_STEP] = uneven, title = "collectives left waiting", abandon = true }
    or unmatched and { [OUT_OF_STEP] = unmatched, title = "sends and receives left unmatched", abandon = true }
  return kept, pre, stop or nil
end

---------------------------------------------------------------------------------------------------
-- main
---------------------------------------------------------------------------------------------------

-- Plain luajit (development, tooling) has no tp: behave as a world of one rank.
local function single_rank_tp()
  return { rank = 0, size = 1, allgather = function(v) return { v } end,
           bcast = function(v) return v end, barrier = function() end }
end

local DSL_GLOBALS = { "describe", "context", "insulate", "expose", "it", "spec", "test", "pending",
  "setup", "teardown", "lazy_setup", "lazy_teardown", "strict_setup", "strict_teardown",
  "before_each", "after_each", "finally", "assert", "spy", "stub", "mock", "match" }

function M.main(args)
  local tp = rawget(_G, "tp") or single_rank_tp()
  local rank0 = tp.rank == 0
  local function out(s) if rank0 then io.stdout:write(s); io.stdout:flush() end end
  local function err(s) if rank0 then io.stderr:write(s); io.stderr:flush() end end

  local ok, o = pcall(parse_args, args or {})
  if not ok then err("tpsh test: " .. tostring(o) .. "\n(tpsh test --help lists the options)\n"); return 1 end
  if o.help then out(USAGE); return 0 end
  -- Rank 0 writes the JUnit file at the end: find out now, not after every test, that it cannot.
  if o.junit then
    local why = tp.bcast(rank0 and require("tpsh.capi").unwritable(o.junit) or false, 0)
    if why then err("tpsh test: cannot write the JUnit report: " .. why .. "\n"); return 1 end
  end

  -- The runner's own group (collective: every rank makes it here, before anything else is exchanged).
  local x = new_exchange(tp)

  -- Globals for the specs (restored at the end so the host finds _G as it was).
  local luassert = require_luassert()
  register_tensor_close(luassert, tp)
  local saved = {}
  for _, k in ipairs(DSL_GLOBALS) do saved[k] = rawget(_G, k) end
  for k, v in pairs(dsl) do _G[k] = v end
  _G.assert, _G.spy, _G.stub = luassert, require "luassert.spy", require "luassert.stub"
  _G.mock, _G.match = require "luassert.mock", require "luassert.match"
  -- os.exit inside a spec would end this rank's run with no summary, and leave the other ranks
  -- waiting in the next test's exchange: while specs run it raises instead (a failure of that test).
  local real_exit = os.exit
  os.exit = function(code)
    error(("os.exit(%s) inside a spec would end this rank's run: raise an error instead, or run what "
      .. "exits as a child process ($TPSH_EXE)"):format(tostring(code)), 2)
  end
  local function restore()
    for _, k in ipairs(DSL_GLOBALS) do _G[k] = saved[k] end
    os.exit = real_exit
  end

  local t_start = now()
  local found = x.bcast(rank0 and discover(o.paths, o.pattern) or false)

  local function out_of_step(e) return type(e) == "table" and e[OUT_OF_STEP] end
  local okc, kept, pre, stop = pcall(collect, found, tp, x)
  if not okc then
    restore()
    if not out_of_step(kept) then error(kept, 0) end
    err("tpsh test: " .. output.failure_text(fail_record("", "", nil, 0, kept[OUT_OF_STEP]), 2) .. "\n")
    return 1
  end
  -- A run of no test at all must not look like a run where everything passed.
  local none = #found.files == 0 and #found.missing == 0
  if none then
    err(found.no_default and "tpsh test: no spec files found: no path was given, and this directory has neither "
      .. "tests/ nor spec/\n" or "tpsh test: no spec files found (pattern " .. o.pattern .. ")\n")
  end

  if o.list then
    for _, t in ipairs(ordered_tests(kept, o, nil)) do out(t.full .. "\n") end
    for _, rec in ipairs(pre) do err("error: " .. rec.name .. "\n" .. output.failure_text(rec, tp.size) .. "\n") end
    if stop then
      err("error: " .. stop.title .. "\n" .. output.failure_text(fail_record("", "", nil, 0, stop[OUT_OF_STEP]), 2) .. "\n")
    end
    restore()
    return (#pre > 0 or none or stop) and 1 or 0, stop and stop.abandon or nil
  end

  local seed
  if o.shuffle then
    seed = o.seed or x.bcast(rank0 and (os.time() * 1000 + math.floor(now() * 1000) % 1000) % 2147483646 or 0)
    math.randomseed(seed)
  end
  local format = o.format or (rank0 and stdout_is_terminal() and "utf" or "plain")
  local info = { size = tp.size, seed = seed, format = format }
  local fmtr = output.new(format, out, { color = format == "utf" and stdout_is_terminal() })
  local records, summary = {}, { passed = 0, failed = 0, skipped = 0, total = 0 }
  local function emit(rec)
    records[#records + 1] = rec
    summary.total = summary.total + 1
    if rec.status == "pass" then summary.passed = summary.passed + 1
    elseif rec.status == "fail" then summary.failed = summary.failed + 1
    else summary.skipped = summary.skipped + 1 end
    fmtr.result(rec)
  end

  fmtr.start(info)
  for _, rec in ipairs(pre) do emit(rec) end
  local rng = seed and new_rng(seed)
  local abandon   -- a collective is left waiting: the ranks cannot finish cleanly (main.c ends them)
  local okr, e = pcall(function()
    for r = 1, o.rep do
      if r > 1 then
        -- what failed to load this time is a failure of this repetition: dropped, a file or describe
        -- body that broke in the second run left its tests out and the run ended with status 0
        local again
        kept, again, stop = collect(found, tp, x, true)
        for _, rec in ipairs(again) do emit(rec) end
      end
      if stop then error(stop, 0) end   -- describe bodies left a collective waiting: no test can run
      run_list(ordered_tests(kept, o, rng), x, luassert, emit)
    end
  end)
  if not okr then
    phase, cur_finally = nil, nil
    if not out_of_step(e) then restore(); error(e, 0) end
    -- Every rank left the same exchange, so every rank stops here: the tests left are not run.
    local t = x.test
    emit(fail_record(e.title or "ranks are out of step", t and t.parent.full or "", t and t.file, t and t.line or 0,
      e[OUT_OF_STEP], 0))
    abandon = e.abandon
  end
  summary.time = now() - t_start
  -- The summary is the last line of stdout: the other ranks' output of the last test is flushed and
  -- handed to the launcher before it. Each rank's stdout is its own pipe to mpiexec, which forwards
  -- whichever has data: a line written just before rank 0's summary could overtake or follow it. After
  -- the exchange every rank has written its last line; the pause gives the launcher time to forward
  -- it (one pause a run). Not after a run that stopped out of step: a rank may be gone.
  if okr and tp.size > 1 then
    io.stdout:flush()
    io.stderr:flush()
    x.all({}, "the summary")
    if rank0 then sleep(0.1) end
  end
  fmtr.finish(summary)

  local code = (summary.failed == 0 and not none) and 0 or 1
  if o.junit and rank0 then
    -- write and close are checked too: a full disk cut the report short and the run still ended 0
    local why = require("tpsh.capi").write_whole(o.junit, output.junit_xml(records, summary, info))
    if why then err("tpsh test: cannot write " .. why .. "\n"); code = 1 end
  end
  restore()
  return code, abandon or nil
end

return M
