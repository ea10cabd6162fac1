-- tpsh.test: `tpsh test`, the spec runner (busted style, run on every MPI rank).
--
-- The host calls os.exit(require("tpsh.test").main(args)) on every rank. This file sets the stage and
-- ends the run; the parts are files of their own:
--   tpsh.test_args      the command line and the .busted configuration file
--   tpsh.test_select    discovery of the spec files, selection of tests, order
--   tpsh.test_dsl       the spec language (describe, it, hooks, ...) and its tree
--   tpsh.test_run       running blocks and tests on every rank, in step (the rules are there)
--   tpsh.test_exchange  the runner's exchanges between ranks and what they compare
--   tpsh.test_assert    luassert, with assert.tensor_close
--   tpsh.test_output    the formats; output is written by rank 0 only
local ffi = require "ffi"
local args_ = require "tpsh.test_args"
local output = require "tpsh.test_output"
local D = require "tpsh.test_dsl"
local select_ = require "tpsh.test_select"
local exchange = require "tpsh.test_exchange"
local run = require "tpsh.test_run"
local assert_ = require "tpsh.test_assert"

local M = {}
local fail_record = output.fail_record
local OUT_OF_STEP = exchange.OUT_OF_STEP
local now = run.now

---------------------------------------------------------------------------------------------------
-- Terminal and pause (symbols renamed with __asm__ so they cannot clash with the host's cdefs)
---------------------------------------------------------------------------------------------------

local C = ffi.C
local have_ffi = pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } tpsh_test_pause_ts;
int tpsh_test_isatty(int fd) __asm__("isatty");
int tpsh_test_nanosleep(const tpsh_test_pause_ts *req, tpsh_test_pause_ts *rem) __asm__("nanosleep");
]])

local function sleep(seconds)
  if not have_ffi then return end
  local req = ffi.new("tpsh_test_pause_ts", math.floor(seconds), (seconds % 1) * 1e9)
  C.tpsh_test_nanosleep(req, nil)
end

local function stdout_is_terminal()
  local term = os.getenv("TERM")
  return term ~= nil and term ~= "dumb" and have_ffi and C.tpsh_test_isatty(1) == 1
end

---------------------------------------------------------------------------------------------------
-- The specs' world: globals, require "busted", paths, os.exit
---------------------------------------------------------------------------------------------------

-- Plain luajit (development, tooling) has no tp: behave as a world of one rank.
local function single_rank_tp()
  return { rank = 0, size = 1, allgather = function(v) return { v } end,
           bcast = function(v) return v end, barrier = function() end }
end

local DSL_GLOBALS = { "describe", "context", "insulate", "expose", "it", "spec", "test", "pending",
  "setup", "teardown", "lazy_setup", "lazy_teardown", "strict_setup", "strict_teardown",
  "before_each", "after_each", "finally", "randomize", "assert", "spy", "stub", "mock", "match" }

-- Sets the globals and hooks the specs see; returns the function that undoes all of it, so that the
-- host finds _G, package and os as they were.
local function stage(o, luassert)
  local saved = {}
  for _, k in ipairs(DSL_GLOBALS) do saved[k] = rawget(_G, k) end
  local api = { assert = luassert, spy = require "luassert.spy", stub = require "luassert.stub",
                mock = require "luassert.mock", match = require "luassert.match" }
  for k, v in pairs(D.dsl) do api[k] = v end
  for k, v in pairs(api) do _G[k] = v end
  -- require "busted" gives the DSL, as under busted; a standalone spec's require "busted.runner"()
  -- does nothing here (the runner already runs)
  local preload = { busted = package.preload.busted, ["busted.runner"] = package.preload["busted.runner"] }
  local loaded = { busted = package.loaded.busted, ["busted.runner"] = package.loaded["busted.runner"] }
  package.loaded.busted, package.loaded["busted.runner"] = nil, nil
  package.preload.busted = function() return setmetatable({}, { __index = api }) end
  package.preload["busted.runner"] = function() return function() end end
  -- busted's --lpath and --cpath come first in the search
  local path, cpath = package.path, package.cpath
  package.path = ((o.lpath or "") .. ";" .. package.path):gsub(";;+", ";")
  package.cpath = ((o.cpath or "") .. ";" .. package.cpath):gsub(";;+", ";")
  -- os.exit inside a spec would end this rank's run with no summary, and leave the other ranks
  -- waiting in the next test's exchange: while specs run it raises instead (a failure of that test).
  local real_exit = os.exit
  os.exit = function(code)
    error(("os.exit(%s) inside a spec would end this rank's run: raise an error instead, or run what "
      .. "exits as a child process ($TPSH_EXE)"):format(tostring(code)), 2)
  end
  return function()
    for _, k in ipairs(DSL_GLOBALS) do _G[k] = saved[k] end
    for k, v in pairs(preload) do package.preload[k] = v end
    for k, v in pairs(loaded) do package.loaded[k] = v end
    package.path, package.cpath = path, cpath
    os.exit = real_exit
  end
end

-- --helper: a Lua file (or a module's name) run on every rank before the specs; ONE exchange of how it
-- went. Returns the failure's record or nil.
local function run_helper(helper, x)
  x.begin_test("the helper " .. helper)
  local ok, e = xpcall(function()
    if helper:match("%.lua$") then dofile(helper) else require(helper) end
  end, D.handler)
  local err = not ok and D.error_text(e) or nil
  local all = x.all({ err = err }, "the helper " .. helper, nil, err and ("the helper " .. helper .. ": " .. err))
  local entries = {}
  for r, p in ipairs(all) do if p.err then entries[#entries + 1] = { r - 1, p.err } end end
  if #entries > 0 then return fail_record(helper .. " (helper)", helper, helper, 0, entries) end
end

---------------------------------------------------------------------------------------------------
-- main
---------------------------------------------------------------------------------------------------

function M.main(args)
  local tp = rawget(_G, "tp") or single_rank_tp()
  local rank0 = tp.rank == 0
  local function out(s) if rank0 then io.stdout:write(s); io.stdout:flush() end end
  local function err(s) if rank0 then io.stderr:write(s); io.stderr:flush() end end

  local ok, o = pcall(args_.parse, args or {})
  if not ok then err("tpsh test: " .. tostring(o) .. "\n(tpsh test --help lists the options)\n"); return 1 end
  if o.help then out(args_.USAGE); return 0 end
  -- Rank 0 writes the JUnit file at the end: find out now, not after every test, that it cannot.
  if o.junit then
    local why = tp.bcast(rank0 and require("tpsh.capi").unwritable(o.junit) or false, 0)
    if why then err("tpsh test: cannot write the JUnit report: " .. why .. "\n"); return 1 end
  end

  -- The runner's own group (collective: every rank makes it here, before anything else is exchanged).
  local x = exchange.new(tp)
  local luassert = assert_.luassert()
  assert_.register_tensor_close(luassert, tp)

  local t_start = now()
  local found = x.bcast(rank0 and select_.discover(o.paths, o.patterns) or false)
  -- A run of no test at all must not look like a run where everything passed.
  local none = #found.files == 0 and #found.missing == 0
  if none then
    err(found.no_default and "tpsh test: no spec files found: no path was given, and this directory has neither "
      .. "tests/ nor spec/\n" or "tpsh test: no spec files found (pattern " .. table.concat(o.patterns, ", ") .. ")\n")
  end

  -- --shuffle's seed, printed; without --shuffle one is drawn all the same (not printed) for the
  -- blocks that call randomize() without a seed, as busted draws its own. One seed for every rank.
  local seed = o.seed or x.bcast(rank0 and (os.time() * 1000 + math.floor(now() * 1000) % 1000) % 2147483646 or 0)
  if o.shuffle then math.randomseed(seed) end
  local run_seed = seed
  if not o.shuffle then seed = nil end
  local format = o.format or (rank0 and stdout_is_terminal() and "utf" or "plain")
  local info = { size = tp.size, seed = seed, format = format }
  local fmtr = o.list and { start = function() end, result = function() end, finish = function() end }
    or output.new(format, out, { color = format == "utf" and stdout_is_terminal() })
  local records, summary = {}, { passed = 0, failed = 0, skipped = 0, total = 0 }
  local function emit(rec)
    records[#records + 1] = rec
    summary.total = summary.total + 1
    if rec.status == "pass" then summary.passed = summary.passed + 1
    elseif rec.status == "fail" then summary.failed = summary.failed + 1
    else summary.skipped = summary.skipped + 1 end
    if o.list and rec.status == "fail" then
      err("error: " .. rec.name .. "\n" .. output.failure_text(rec, tp.size) .. "\n")
    end
    fmtr.result(rec)
  end

  local restore = stage(o, luassert)
  fmtr.start(info)
  for _, p in ipairs(found.missing) do
    local e = {}
    for r = 0, tp.size - 1 do e[#e + 1] = { r, p .. ": no such file or directory" } end
    emit(fail_record(p, p, p, 0, e))
  end
  local R = { x = x, o = o, luassert = luassert, emit = emit, out = out, seed = run_seed }
  local abandon   -- a collective is left waiting: the ranks cannot finish cleanly (main.c ends them)
  local okr, e = pcall(function()
    if o.helper then
      local rec = run_helper(o.helper, x)
      if rec then emit(rec); return end   -- busted stops too: the specs would run without what it sets up
    end
    for _ = 1, o.rep do run.run_files(R, found.files) end
  end)
  if not okr then
    D.state.phase, D.state.finally, D.state.block = nil, nil, nil
    if type(e) ~= "table" or not e[OUT_OF_STEP] then restore(); error(e, 0) end
    -- Every rank left the same exchange, so every rank stops here: the tests left are not run.
    local t = x.test
    local parent = t and (t.parent or t)
    emit(fail_record(e.title or "ranks are out of step", parent and parent.full or "", t and t.file,
      t and t.line or 0, e[OUT_OF_STEP], 0))
    abandon = e.abandon
  end
  restore()
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
  if o.junit and rank0 and not o.list then
    -- write and close are checked too: a full disk cut the report short and the run still ended 0
    local why = require("tpsh.capi").write_whole(o.junit, output.junit_xml(records, summary, info))
    if why then err("tpsh test: cannot write " .. why .. "\n"); code = 1 end
  end
  return code, abandon or nil
end

return M
