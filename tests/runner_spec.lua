-- The spec runner and the command line tested from outside: `tpsh test` runs the fixtures of
-- tests/runner/ (named *_fixture.lua so that discovery skips them, some failing on purpose) as a
-- subprocess, and the output lines and exit status are checked for every format; then tpsh's own
-- options, good and bad. Rank 0 runs each command once and broadcasts what it saw, so the spec works
-- under any `mpiexec -n N`.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local FIX = here .. "runner/"
-- The binary under test: $TPSH_EXE, else the running executable when it is a tpsh, else build/tpsh.
local function self_exe()
  local ffi = require "ffi"
  pcall(ffi.cdef, [[long tpsh_runner_spec_readlink(const char *, char *, unsigned long) __asm__("readlink");]])
  local buf = ffi.new("char[4096]")
  local ok, n = pcall(function() return ffi.C.tpsh_runner_spec_readlink("/proc/self/exe", buf, 4096) end)
  local path = ok and n > 0 and ffi.string(buf, n) or nil
  return path and path:match("/tpsh$") and path or nil
end
local EXE = os.getenv("TPSH_EXE") or self_exe() or "build/tpsh"

-- The parent job's process-manager variables scrubbed (CLEAN), and sh quoting: as the other specs that
-- run whole jobs (support/child_job.lua).
local child = dofile(here .. "support/child_job.lua")
local CLEAN, q = child.CLEAN, child.quote

local cache = {}
-- Runs `tpsh <args>` (under `mpiexec -n np` when np is given) on rank 0; every rank gets
-- { out =, code =, lines = }, out being stdout and stderr together. pcall so that rank 0 always
-- reaches the broadcast.
-- The text of a file that a nested run wrote (false where there is none), read and removed on rank 0,
-- on every rank.
local function take_file(path)
  local text = false
  if tp.rank == 0 then
    local f = io.open(path)
    text = f and f:read("*a") or false
    if f then f:close() end
    os.remove(path)
  end
  return tp.bcast(text, 0)
end

-- A temporary file holding text, written on rank 0; its path on every rank (the caller removes it).
local function temp_file(text)
  local path = tp.bcast(tp.rank == 0 and os.tmpname() or nil, 0)
  if tp.rank == 0 then
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
  end
  return path
end

local function run_tpsh(args, np, env)
  local key = args .. "|" .. tostring(np) .. "|" .. tostring(env)
  if cache[key] then return cache[key] end
  local res = false
  if tp.rank == 0 then
    local ok, r = pcall(function()
      local launch = np and ("mpiexec -n " .. np .. " ") or ""
      local exports = env and ("export " .. env .. "; ") or ""
      local p = assert(io.popen(CLEAN .. exports .. "timeout 120 " .. launch .. q(EXE) .. " " .. args
        .. " 2>&1; echo \"__EXIT=$?\""))
      local out = p:read("*a")
      p:close()
      local code = tonumber(out:match("__EXIT=(%d+)%s*$"))
      return { out = (out:gsub("__EXIT=%d+%s*$", "")), code = code }
    end)
    res = ok and r or { out = "runner_spec: " .. tostring(r), code = -1 }
  end
  res = tp.bcast(res, 0)
  res.lines = {}
  for l in (res.out .. "\n"):gmatch("(.-)\n") do res.lines[#res.lines + 1] = l end
  while res.lines[#res.lines] == "" do res.lines[#res.lines] = nil end
  cache[key] = res
  return res
end

-- The runner is under test, not a backend: the CPU backend runs any number of ranks anywhere (on a
-- GPU machine three ranks would not fit two GPUs).
local function tpsh_test(args, np) return run_tpsh("--backend cpu test " .. args, np) end

local function last(r) return r.lines[#r.lines] end
local function count(r, pat)
  local n = 0
  for _, l in ipairs(r.lines) do if l:find(pat) then n = n + 1 end end
  return n
end
local function has(r, pat) return count(r, pat) > 0 end

local have_mpiexec = tp.bcast(tp.rank == 0 and os.execute("command -v mpiexec >/dev/null 2>&1") == 0, 0)

describe("tpsh test", function()
  describe("plain output", function()
    it("prints one line per test and the summary last", function()
      local r = tpsh_test("-o plain " .. FIX .. "fail_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.are.equal("2 passed, 3 failed, 1 skipped", last(r), r.out)
      assert.is_true(has(r, "^PASS fail fixture passes$"), r.out)
      assert.is_true(has(r, "^FAIL fail fixture fails an assertion %[0%]$"), r.out)
      assert.is_true(has(r, "^FAIL fail fixture raises an error %[0%]$"), r.out)
      assert.is_true(has(r, "^SKIP fail fixture skips itself$"), r.out)
      assert.is_true(has(r, "^FAIL fail fixture with a failing before_each never runs its body"), r.out)
      assert.is_true(has(r, "before_each broke"), r.out)
      -- the recap just above the summary, one line per failure, in the order they ran
      local n = #r.lines
      assert.are.equal("Failed (3):", r.lines[n - 4], r.out)
      assert.is_truthy(r.lines[n - 3]:find("^  fail fixture fails an assertion %[0%] at .*fail_fixture%.lua:%d+: Expected objects to be equal%.$"), r.out)
      assert.is_truthy(r.lines[n - 2]:find("^  fail fixture raises an error %[0%] at .*fail_fixture%.lua:%d+: deliberate <&> error$"), r.out)
      assert.is_truthy(r.lines[n - 1]:find("^  fail fixture with a failing before_each never runs its body %[0%] at .*before_each broke"), r.out)
    end)

    it("prints the summary last under mpiexec, after what the other ranks printed in the last test", function()
      if not have_mpiexec then pending("mpiexec not found") end
      -- each rank's stdout reaches the terminal through its own pipe: without the runner's ordering a
      -- line printed on rank 1 ended the output in half of the runs on two ranks; four runs here
      for seed = 1, 4 do
        local r = tpsh_test("-o plain --seed " .. seed .. " " .. FIX .. "print_fixture.lua", 2)
        assert.are.equal(0, r.code, r.out)
        assert.are.equal(3, count(r, "^rank 1's line %d$"), r.out)
        assert.are.equal("1 passed, 0 failed, 0 skipped", last(r), r.out)
      end
    end)

    it("fails a test whose error object's __tostring raises, saying so", function()
      local r = tpsh_test("-o plain " .. FIX .. "error_fixture.lua")
      assert.are.equal("0 passed, 1 failed, 0 skipped", last(r), r.out)
      assert.is_true(has(r, "error: a table value whose __tostring raised an error %(.*inner%)$"), r.out)
    end)

    it("says an error object without __tostring as a script's error does, not by its address", function()
      local r = tpsh_test("-o plain " .. FIX .. "table_error_fixture.lua")
      assert.are.equal("0 passed, 1 failed, 0 skipped", last(r), r.out)
      assert.is_true(has(r, "error: a table value %(an error object without __tostring%)"), r.out)
      assert.is_nil(r.out:find("table: 0x", 1, true), r.out)
    end)

    it("exits 0 when nothing failed, pending counting as skipped", function()
      local r = tpsh_test("-o plain " .. FIX .. "pass_fixture.lua")
      assert.are.equal(0, r.code, r.out)
      assert.are.equal("3 passed, 0 failed, 1 skipped", last(r), r.out)
      assert.are.equal(3, count(r, "^PASS "))
    end)

    it("names a file that does not compile as one failure", function()
      local r = tpsh_test("-o plain " .. FIX .. "syntax_fixture.lua " .. FIX .. "pass_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL .*syntax_fixture%.lua"), r.out)
      assert.are.equal("3 passed, 1 failed, 1 skipped", last(r), r.out)
    end)

    it("fails a setup that failed, leaving its block's tests out as busted, and a failing teardown", function()
      local r = tpsh_test("-o plain " .. FIX .. "hooks_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL setup breaks %(setup%) %[0%]$"), r.out)
      assert.is_false(has(r, "setup breaks first"), r.out)
      assert.is_true(has(r, "^PASS teardown breaks runs$"), r.out)
      assert.is_true(has(r, "^FAIL teardown breaks %(teardown%)"), r.out)
      assert.is_true(has(r, "^    at .*hooks_fixture%.lua:3$"), r.out)   -- the block's line, not [C]
      assert.are.equal("1 passed, 2 failed, 0 skipped", last(r), r.out)
    end)

    it("runs after_each hooks from the block whose before_each failed outward, as busted", function()
      local r = tpsh_test("-o plain " .. FIX .. "after_each_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL outer inner never runs its body"), r.out)
      assert.is_true(has(r, "^PASS ran the hooks from the failing block outward$"), r.out)
      assert.are.equal("1 passed, 1 failed, 0 skipped", last(r), r.out)
    end)

    -- test.lua runs a test's finally() handlers last first and the after_each levels innermost first:
    -- either loop could run forward (after_each_fixture's failing before_each leaves one level to run)
    it("runs finally() handlers last first, then after_each hooks from the innermost block outward", function()
      local r = tpsh_test("-o plain " .. FIX .. "order_fixture.lua")
      assert.are.equal(0, r.code, r.out)
      assert.is_true(has(r, "^PASS ran the finally handlers last first, then the after_each hooks innermost first$"),
        r.out)
      assert.are.equal("2 passed, 0 failed, 0 skipped", last(r), r.out)
    end)

    it("runs finally() of setup and teardown, and places it() inside a hook at the spec's line", function()
      local r = tpsh_test("-o plain " .. FIX .. "finally_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^PASS finally in hooks runs the setup's after the setup$"), r.out)
      assert.is_true(has(r, "^PASS runs the teardown's after the teardown$"), r.out)
      assert.is_true(has(r, "^FAIL it inside a hook %(setup%)"), r.out)
      assert.is_true(has(r, "finally_fixture%.lua:10: it%(%) may only be called in a spec file or a describe body"), r.out)
      assert.are.equal("2 passed, 1 failed, 0 skipped", last(r), r.out)
    end)

    it("undoes an insulate block's globals and package.loaded when the block ends", function()
      local r = tpsh_test("-o plain " .. FIX .. "insulate_fixture.lua")
      assert.are.equal(0, r.code, r.out)
      assert.are.equal("5 passed, 0 failed, 0 skipped", last(r), r.out)
    end)

    it("fails a test that calls os.exit, and goes on with the next", function()
      local r = tpsh_test("-o plain " .. FIX .. "exit_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL exit fixture calls os.exit"), r.out)
      assert.is_true(has(r, "os.exit%(0%) inside a spec"), r.out)
      assert.are.equal("1 passed, 1 failed, 0 skipped", last(r), r.out)
    end)
  end)

  describe("tap output", function()
    it("is TAP version 13 with a plan and diagnostics", function()
      local r = tpsh_test("-o tap " .. FIX .. "fail_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.are.equal("TAP version 13", r.lines[1])
      assert.are.equal(3, count(r, "^ok %d+ %- "))          -- 2 passed + 1 skipped
      assert.are.equal(3, count(r, "^not ok %d+ %- "))
      assert.are.equal(1, count(r, "^ok %d+ %- .* # SKIP"))
      assert.are.equal(3, count(r, "^  %-%-%-$"))
      assert.are.equal("1..6", r.lines[#r.lines - 1])
      assert.are.equal("2 passed, 3 failed, 1 skipped", last(r))
    end)
  end)

  describe("junit output", function()
    it("is one well-formed testsuite, nothing after it on stdout", function()
      local r = tpsh_test("-o junit " .. FIX .. "fail_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      local xml = r.out:match("(<%?xml.-</testsuites>)")
      assert.is_string(xml, r.out)
      assert.is_truthy(xml:find('<testsuite name="tpsh" tests="6" failures="3" errors="0" skipped="1"', 1, true))
      assert.are.equal(6, select(2, xml:gsub("<testcase ", "")))
      assert.are.equal(3, select(2, xml:gsub("<failure ", "")))
      assert.are.equal(3, select(2, xml:gsub("</failure>", "")))
      assert.are.equal(1, select(2, xml:gsub("<skipped ", "")))
      assert.is_truthy(xml:find("deliberate &lt;&amp;&gt; error", 1, true))
      assert.is_falsy(xml:find("<&>", 1, true))
      assert.is_truthy(xml:find('classname="fail fixture with a failing before_each"', 1, true))
      assert.is_truthy(xml:find('message="ranks [0]: ', 1, true))   -- a failure names its ranks
      assert.are.equal("</testsuites>", last(r), r.out)
    end)

    it("is valid UTF-8 when names and messages are not (each bad byte becomes U+FFFD)", function()
      local clean = require("tpsh.utf8").clean
      local r = tpsh_test("-o junit " .. FIX .. "bytes_fixture.lua")
      local xml = r.out:match("(<%?xml.-</testsuites>)")
      assert.is_string(xml, r.out)
      assert.are.equal(clean(xml), xml)
      assert.is_truthy(xml:find('name="has \239\191\189 in its name"', 1, true), xml)
      assert.is_truthy(xml:find("a message with \239\191\189\239\191\189 in it", 1, true), xml)
      local file = tp.bcast(tp.rank == 0 and os.tmpname() or false, 0)
      r = tpsh_test("-o plain --junit " .. file .. " " .. FIX .. "bytes_fixture.lua")
      local text = take_file(file)
      assert.are.equal(1, r.code, r.out)
      assert.is_string(text, r.out)
      assert.are.equal(clean(text), text)
    end)

    it("also writes the report to --junit FILE", function()
      local file = os.tmpname()
      local r = tpsh_test("-o plain --junit " .. file .. " " .. FIX .. "pass_fixture.lua")
      assert.are.equal(0, r.code, r.out)
      local text = tp.bcast(tp.rank == 0 and (io.open(file):read("*a")) or false, 0)
      if tp.rank == 0 then os.remove(file) end
      assert.is_truthy(text:find("^<%?xml"))
      assert.is_truthy(text:find("</testsuites>%s*$"))
      assert.is_truthy(text:find('tests="4" failures="0" errors="0" skipped="1"', 1, true))
    end)

    it("fails the run when the report cannot be written whole", function()
      -- a full disk (here /dev/full, which opens but takes no byte) cut the report short: the run ended 0
      local r = tpsh_test("-o plain --junit /dev/full " .. FIX .. "pass_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_truthy(r.out:find("tpsh test: cannot write /dev/full: No space left on device (what it holds is cut "
        .. "short)", 1, true), r.out)
    end)

    it("refuses a --junit FILE it could not write before any test runs, and a Lua file", function()
      -- a spec file given as FILE (the name forgotten) was overwritten with the report, and a path it
      -- could not write was said only after every test had run
      local spec = FIX .. "pass_fixture.lua"
      local r = tpsh_test("-o plain --junit " .. spec .. " " .. spec)
      assert.are.equal(1, r.code, r.out)
      assert.is_truthy(r.out:find("--junit expects the report's file name (.xml), got a Lua file", 1, true), r.out)
      r = tpsh_test("-o plain --junit /nonexistent-dir/j.xml " .. spec)
      assert.are.equal(1, r.code, r.out)
      assert.is_truthy(r.out:find("cannot write the JUnit report: /nonexistent-dir/j.xml", 1, true), r.out)
      assert.is_falsy(r.out:find("PASS", 1, true), r.out)
      -- and --trace, written at a script's end, is refused before `test` (it was never written)
      local t = run_tpsh("--backend cpu --trace /tmp/tpsh-runner-spec.json test " .. spec)
      assert.are.equal(1, t.code, t.out)
      assert.is_truthy(t.out:find("--trace FILE is written at the end of a script, not of `tpsh test`", 1, true), t.out)
    end)
  end)

  describe("selection", function()
    it("--list prints full names and runs nothing", function()
      local r = tpsh_test("--list " .. FIX .. "fail_fixture.lua")
      assert.are.equal(0, r.code, r.out)
      assert.are.equal(6, #r.lines, r.out)
      assert.are.equal("fail fixture passes", r.lines[1])
      assert.is_false(has(r, "^PASS"))
    end)

    it("--filter and --exclude match full names", function()
      local r = tpsh_test("-o plain --filter 'pass' --exclude 'again' " .. FIX .. "fail_fixture.lua")
      assert.are.equal(0, r.code, r.out)
      assert.are.equal("1 passed, 0 failed, 0 skipped", last(r), r.out)
    end)

    it("--tags keeps tests carrying one of the tags", function()
      local r = tpsh_test("-o plain --tags fast,slow " .. FIX .. "pass_fixture.lua")
      assert.are.equal("2 passed, 0 failed, 0 skipped", last(r), r.out)
    end)

    it("--tags and --exclude-tags take any tag: '#' and the non-space characters after it", function()
      local r = tpsh_test("-o plain --tags x.y,#gpu:2 " .. FIX .. "tags_fixture.lua")
      assert.are.equal("2 passed, 0 failed, 0 skipped", last(r), r.out)
      assert.is_true(has(r, "^PASS tags fixture is dotted #x%.y$"), r.out)
      assert.is_true(has(r, "^PASS tags fixture has a count #gpu:2$"), r.out)
      r = tpsh_test("-o plain --exclude-tags gpu:2,x.y " .. FIX .. "tags_fixture.lua")
      assert.are.equal("2 passed, 0 failed, 0 skipped", last(r), r.out)
      r = tpsh_test("-o plain --tags gpu " .. FIX .. "tags_fixture.lua")   -- a prefix, as busted: #gpu:2
      assert.are.equal("1 passed, 0 failed, 0 skipped", last(r), r.out)
      r = tpsh_test("-o plain --exclude-tags gp " .. FIX .. "tags_fixture.lua")
      assert.is_false(has(r, "gpu:2"), r.out)
    end)

    it("--repeat runs everything again", function()
      local r = tpsh_test("-o plain --repeat 3 " .. FIX .. "pass_fixture.lua")
      assert.are.equal("9 passed, 0 failed, 3 skipped", last(r), r.out)
    end)

    it("--repeat reports a file or describe body that fails in a later repetition", function()
      -- each repetition loads the files anew; what failed to load after the first was dropped unsaid,
      -- its tests left out, and the run ended with status 0
      local r = tpsh_test("-o plain --repeat 3 " .. FIX .. "repeat_load_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL repeat load fixture %(describe%)"), r.out)
      assert.is_true(has(r, "the describe body breaks on load 2$"), r.out)
      assert.is_true(has(r, "^FAIL .*repeat_load_fixture%.lua %[0%]$"), r.out)
      assert.is_true(has(r, "the file breaks on load 3$"), r.out)
      -- as busted: a describe body that raised runs none of its children
      assert.are.equal("2 passed, 2 failed, 0 skipped", last(r), r.out)
      -- a missing file is said once, not once per repetition
      r = tpsh_test("-o plain --repeat 2 " .. FIX .. "pass_fixture.lua " .. FIX .. "no_such_fixture.lua")
      assert.are.equal(1, count(r, "^FAIL .*no_such_fixture%.lua"), r.out)
      assert.are.equal("6 passed, 1 failed, 2 skipped", last(r), r.out)
    end)

    it("--shuffle --seed gives a reproducible order and prints the seed", function()
      local a = tpsh_test("-o plain --shuffle --seed 7 " .. FIX .. "fail_fixture.lua")
      local b = tpsh_test("--seed 7 -o plain " .. FIX .. "fail_fixture.lua")
      assert.is_true(has(a, "seed 7"), a.out)
      assert.are.same(a.lines, b.lines)
    end)

    it("--shuffle reorders every block, one of two tests too", function()
      -- pass_fixture's nested block holds two tests: over eight seeds, both of their orders come up
      local seen = {}
      for seed = 1, 8 do
        local r = tpsh_test("-o plain --seed " .. seed .. " " .. FIX .. "pass_fixture.lua")
        local spy, pend
        for i, l in ipairs(r.lines) do
          if l:find("pass fixture nested has a spy", 1, true) then spy = i end
          if l:find("pass fixture nested is pending", 1, true) then pend = i end
        end
        assert.is_truthy(spy and pend, r.out)
        seen[spy < pend and "as written" or "swapped"] = true
      end
      assert.is_true(seen["as written"] and seen.swapped, "one order only over seeds 1 to 8")
    end)

    it("refuses a --seed that would not give its order back (outside [0, 2^53))", function()
      for _, seed in ipairs { "1e20", "-1", "9007199254740992", "1.5" } do
        local r = tpsh_test("-o plain --seed " .. seed .. " " .. FIX .. "pass_fixture.lua")
        assert.are.equal(1, r.code, seed .. ": " .. r.out)
        assert.is_true(has(r, "%-%-seed needs an integer in %[0, 2%^53%), got " .. seed:gsub("%p", "%%%0")), r.out)
        assert.is_false(has(r, "passed"), r.out)
      end
      local r = tpsh_test("-o plain --seed 9007199254740991 " .. FIX .. "tags_fixture.lua")
      assert.are.equal(0, r.code, r.out)
      assert.is_true(has(r, "seed 9007199254740991"), r.out)
    end)

    it("refuses a --repeat that is not a positive integer, running nothing", function()
      for _, n in ipairs { "0", "-1", "1.5", "x" } do
        local r = tpsh_test("-o plain --repeat " .. n .. " " .. FIX .. "pass_fixture.lua")
        assert.are.equal(1, r.code, n .. ": " .. r.out)
        assert.is_true(has(r, "%-%-repeat needs a positive integer"), n .. ": " .. r.out)
        assert.is_false(has(r, "passed"), n .. ": " .. r.out)
      end
    end)

    it("rejects an unknown option with a non-zero status", function()
      local r = tpsh_test("--no-such-option")
      assert.are_not.equal(0, r.code)
      assert.is_true(has(r, "unknown option"), r.out)
    end)
  end)

  -- Real spec suites written for busted: its language, its file handling, its options and formats.
  describe("as busted", function()
    it("runs busted's language: call forms, require 'busted', bodies in order, randomize, 9000 tests in a block, arg",
        function()
      -- under mpiexec the fixture also starts a child tpsh: it must not join this job (status 13 before)
      local r = tpsh_test("-o plain " .. FIX .. "busted_fixture.lua", have_mpiexec and 2 or nil)
      assert.are.equal(0, r.code, r.out)
      assert.are.equal("9025 passed, 0 failed, 0 skipped", last(r), r.out)
    end)

    it("resets package.loaded and _G after each spec file, unless --no-auto-insulate", function()
      local files = FIX .. "loaded_a_fixture.lua " .. FIX .. "loaded_b_fixture.lua"
      local r = tpsh_test("-o plain " .. files)
      assert.are.equal("2 passed, 0 failed, 0 skipped", last(r), r.out)
      r = tpsh_test("-o plain --no-auto-insulate " .. files)
      assert.are.equal("1 passed, 1 failed, 0 skipped", last(r), r.out)
    end)

    it("takes --helper, --lpath and --cpath", function()
      local r = tpsh_test("-o plain --helper " .. FIX .. "helper_fixture.lua --lpath " .. q(FIX .. "lpath/?.lua")
        .. " --cpath '/fixture_cpath/?.so' " .. FIX .. "options_fixture.lua")
      assert.are.equal(0, r.code, r.out)
      assert.are.equal("3 passed, 0 failed, 0 skipped", last(r), r.out)
      r = tpsh_test("-o plain --helper /no/such/helper.lua " .. FIX .. "pass_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL /no/such/helper%.lua %(helper%)"), r.out)
    end)

    it("accepts busted's output names, each failure naming its ranks", function()
      local f = FIX .. "fail_fixture.lua"
      local r = tpsh_test("-o TAP " .. f)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^not ok 2 %- fail fixture fails an assertion$"), r.out)
      assert.is_true(has(r, "^  ranks: %[0%]$"), r.out)
      r = tpsh_test("-o json " .. f)
      assert.are.equal(1, #r.lines, r.out)   -- one document, nothing after it
      assert.truthy(r.out:find('"failures":[{', 1, true), r.out)
      assert.truthy(r.out:find('"ranks":[0]', 1, true), r.out)
      assert.truthy(r.out:find('"successes":[{', 1, true), r.out)
      r = tpsh_test("-o gtest " .. f)
      assert.is_true(has(r, "^%[       OK %] fail fixture passes %(%d+%.%d+ ms%)$"), r.out)
      assert.is_true(has(r, "^%[  FAILED  %] fail fixture raises an error %[0%]$"), r.out)
      assert.are.equal("2 passed, 3 failed, 1 skipped", last(r), r.out)
      r = tpsh_test("-o plainTerminal " .. f)
      assert.is_true(has(r, "^PASS fail fixture passes$"), r.out)
      r = tpsh_test("-o utfTerminal " .. f)
      assert.are.equal("2 passed, 3 failed, 1 skipped", last(r), r.out)
    end)

    it("takes the tasks of a .busted file with -r/--run, the command line winning", function()
      local dir = tp.bcast(tp.rank == 0 and os.tmpname() or nil, 0)
      if tp.rank == 0 then
        os.remove(dir); os.execute("mkdir -p " .. q(dir))
        local p = io.popen("pwd"); local cwd = p:read("*l"); p:close()
        local abs = FIX:sub(1, 1) == "/" and FIX or (cwd .. "/" .. FIX)
        local cfg = assert(io.open(dir .. "/.busted", "w"))
        cfg:write(("return { default = { output = 'TAP' }, fast = { ROOT = { %q }, tags = 'fast' } }\n")
          :format(abs .. "pass_fixture.lua"))
        cfg:close()
      end
      tp.barrier()
      local r = run_tpsh("--backend cpu test -r fast", nil, "TPSH_UNUSED=1; cd " .. q(dir))
      local plain = run_tpsh("--backend cpu test -r fast -o plain", nil, "TPSH_UNUSED=1; cd " .. q(dir))
      local missing = run_tpsh("--backend cpu test -r slow", nil, "TPSH_UNUSED=1; cd " .. q(dir))
      if tp.rank == 0 then os.execute("rm -rf " .. q(dir)) end
      assert.are.equal(0, r.code, r.out)
      assert.is_true(has(r, "^ok 1 %- pass fixture adds \\#fast$"), r.out)
      assert.are.equal("1 passed, 0 failed, 0 skipped", last(r), r.out)
      assert.is_true(has(plain, "^PASS pass fixture adds #fast$"), plain.out)
      assert.are.equal(1, missing.code, missing.out)
      assert.is_true(has(missing, "task 'slow' not found in %.busted"), missing.out)
    end)
  end)

  describe("discovery", function()
    -- A directory on rank 0 holding real/x_spec.lua, a link to it, a link to real/, order.spec (a spec
    -- whatever its name when named), a hidden directory with a spec, and an empty directory.
    local dir = false
    local function tree()
      if dir then return dir end
      if tp.rank == 0 then
        local p = io.popen("mktemp -d")
        dir = p:read("*l")
        p:close()
        -- (.hidden/h_spec.lua: skipped, as busted skips hidden files and directories)
        local ok = os.execute(("mkdir %s/real %s/empty %s/.hidden && cp %s %s/real/x_spec.lua && cp %s %s/order.spec && "
          .. "cp %s %s/.hidden/h_spec.lua && ln -s real/x_spec.lua %s/l_spec.lua && ln -s real %s/link_dir"):format(
          q(dir), q(dir), q(dir), q(FIX .. "pass_fixture.lua"), q(dir), q(FIX .. "pass_fixture.lua"), q(dir),
          q(FIX .. "pass_fixture.lua"), q(dir), q(dir), q(dir)))
        if ok ~= 0 then dir = "/nonexistent" end
      end
      dir = tp.bcast(dir, 0)
      return dir
    end
    teardown(function()
      if tp.rank == 0 and dir and dir:find("^/tmp") then os.execute("rm -rf " .. q(dir)) end
    end)

    it("follows links to files and directories, and takes a file named explicitly whatever its name", function()
      for _, path in ipairs { "l_spec.lua", "link_dir", "order.spec" } do
        local r = tpsh_test("-o plain " .. q(tree() .. "/" .. path))
        assert.are.equal(0, r.code, path .. ": " .. r.out)
        assert.are.equal("3 passed, 0 failed, 1 skipped", last(r), path .. ": " .. r.out)
      end
      local r = tpsh_test("-o plain " .. q(tree()))   -- real/, link_dir/ and l_spec.lua; not order.spec nor .hidden/
      assert.are.equal("9 passed, 0 failed, 3 skipped", last(r), r.out)
      r = tpsh_test("-o plain -p '^l_' " .. q(tree()))
      assert.are.equal("3 passed, 0 failed, 1 skipped", last(r), r.out)
    end)

    it("ends with a non-zero status when it finds no spec file", function()
      local r = tpsh_test("-o plain " .. q(tree() .. "/empty"))
      assert.are_not.equal(0, r.code, r.out)
      assert.is_true(has(r, "no spec files found"), r.out)
      r = tpsh_test("--list " .. q(tree() .. "/empty"))
      assert.are_not.equal(0, r.code, r.out)
    end)
  end)

  describe("in check mode (--check)", function()
    it("fails a test that leaves a sanitizer report, and the next test starts without it", function()
      local np = have_mpiexec and 2 or nil
      local r = run_tpsh("--backend cpu --check test -o plain " .. FIX .. "check_fixture.lua", np)
      assert.are.equal(1, r.code, r.out)
      assert.are.equal("3 passed, 3 failed, 0 skipped", last(r), r.out)
      local ranks = "%[0" .. (np and ",1" or "") .. "%]$"
      assert.is_true(has(r, "^FAIL check fixture leaves a race " .. ranks), r.out)
      assert.is_true(has(r, "^%s+the stream sanitizer reported:$"), r.out)
      assert.is_true(has(r, "^%s+tpsh check: read%-after%-write race on a tensor of shape %[256%] f32$"), r.out)
      assert.is_true(has(r, "^PASS check fixture starts with no reports$"), r.out)
      assert.is_true(has(r, "^PASS check fixture reads its race and clears it$"), r.out)
      -- a tensor freed by the garbage collector: reported in the test that dropped it, not where the
      -- collector happened to run
      assert.is_true(has(r, "^FAIL check fixture drops a tensor that a side stream still reads " .. ranks), r.out)
      assert.is_true(has(r, "^%s+tpsh check: free while in use on another stream"), r.out)
      assert.is_true(has(r, "^PASS check fixture collects garbage after it$"), r.out)
      -- a report made in a setup fails it, as its error would
      assert.is_true(has(r, "^FAIL check fixture with a race in its setup %(setup%) " .. ranks), r.out)
      assert.is_true(has(r, "setup of 'check fixture with a race in its setup': the stream sanitizer reported:"), r.out)
      -- the recap's line brings the report's first line along ("the stream sanitizer reported:" alone said
      -- nothing)
      assert.is_true(has(r, "^  check fixture leaves a race " .. ranks:sub(1, -2) .. " at .*check_fixture%.lua:%d+: "
        .. "the stream sanitizer reported: tpsh check: read%-after%-write race on a tensor of shape %[256%] f32$"), r.out)
    end)

    it("fails a spec file whose describe bodies leave a report, and charges no test with it", function()
      local r = run_tpsh("--backend cpu --check test -o plain " .. FIX .. "check_load_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL check load fixture %(describe%)"), r.out)
      assert.is_true(has(r, "while loading: the stream sanitizer reported:"), r.out)
      assert.is_true(has(r, "^PASS check load fixture passes$"), r.out)
    end)
  end)

  -- The formatters' merging of the ranks' failures, called directly (valid at any rank count).
  describe("failure merging", function()
    local output = require "tpsh.test_output"

    it("takes messages that differ only in table addresses for one message", function()
      local _, failures = output.merge({ { 1, "Expected (table: 0x55aa10) got (table: 0x55aa40)" },
        { 0, "Expected (table: 0x7f0020) got (table: 0x7f0090)" }, { 2, "another message" } })
      assert.are.equal(2, #failures)
      assert.are.same({ 0, 1 }, failures[1].ranks)
      assert.are.same({ 2 }, failures[2].ranks)
    end)

    it("names the ranks of a failure except in a world of one rank", function()
      local rec = output.fail_record("t", "c", "f.lua", 1, { { 1, "boom" } })
      assert.are.equal("on rank [1]:\n  boom", output.failure_text(rec, 2))
      assert.are.equal("boom", output.failure_text(output.fail_record("t", "c", "f.lua", 1, { { 0, "boom" } }), 1))
      rec = output.fail_record("t", "c", "f.lua", 1, { { 0, "a" }, { 1, "a" }, { 2, "a" }, { 4, "b" } })
      assert.are.equal("on ranks [0-2]:\n  a\non rank [4]:\n  b", output.failure_text(rec, 5))
      -- two ranks are "ranks" too, and a rank that reports one message twice is named once
      rec = output.fail_record("t", "c", "f.lua", 1, { { 1, "a" }, { 0, "a" }, { 1, "a" } })
      assert.are.equal("on ranks [0,1]:\n  a", output.failure_text(rec, 2))
    end)

    -- The formatters on records made here, without a child run: what their lines say.
    local function render(format, recs, size)
      local text, failed = {}, 0
      local f = output.new(format, function(s) text[#text + 1] = s end)
      f.start({ size = size or 1 })
      for _, rec in ipairs(recs) do
        f.result(rec)
        if rec.status == "fail" then failed = failed + 1 end
      end
      f.finish({ passed = #recs - failed, failed = failed, skipped = 0, total = #recs, time = 0 })
      return table.concat(text)
    end

    it("recaps each failure on one line, its place said once, a heading's next line brought along", function()
      local text = render("plain", {
        output.fail_record("own", "c", "f.lua", 3, { { 0, "f.lua:3: boom" } }),
        output.fail_record("heading", "c", "f.lua", 0, { { 0, "the stream sanitizer reported:\n  a race on x\n  more" } }),
      })
      assert.is_truthy(text:find("\n  own [0] at f.lua:3: boom\n", 1, true), text)
      -- line 0 (unknown) is left out of the place
      assert.is_truthy(text:find("\n  heading [0] at f.lua: the stream sanitizer reported: a race on x\n", 1, true), text)
    end)

    it("escapes '#' in TAP descriptions and gives a pending test's reason after SKIP", function()
      local text = render("tap", { { name = "a #slow test", status = "pass" },
        { name = "later", status = "skip", reason = "not yet #2" } })
      assert.is_truthy(text:find("ok 1 - a \\#slow test\n", 1, true), text)
      assert.is_truthy(text:find("ok 2 - later # SKIP not yet \\#2\n", 1, true), text)
    end)

    it("leaves out of the JUnit XML the control characters XML 1.0 forbids", function()
      assert.are.equal("ab\tc\n &lt;", output.xml_escape("a\1b\tc\n\27 <"))
    end)
  end)

  -- tpsh.issued on records made here (what group.c and p2p_ledger.c write), without a child run.
  describe("issued records", function()
    local issued = require "tpsh.issued"

    it("compares sends and receives since the last call, in number and in groups", function()
      local seen = {}
      local function p2p(r0, r1) return { { p2p = r0 }, { p2p = r1 } } end
      -- rank 0 sent one message to rank 1 on a group whose digest is aa; rank 1 received one from rank 0 on bb
      local all = p2p("1 1 00000000000000aa 0 0000000000000000\n", "0 0 0000000000000000 1 00000000000000bb\n")
      local found = issued.p2p_unmatched(all, seen)
      assert.are.same({ { from = 0, to = 1, sent = 1, received = 1, groups = true } }, found)
      -- nothing new since: nothing to say (the last call's counts were kept)
      assert.is_nil(issued.p2p_unmatched(all, seen))
      -- one more send that rank 1 does not receive: one message, counted since the last call
      all = p2p("1 2 0000000000000154 0 0000000000000000\n", "0 0 0000000000000000 1 00000000000000bb\n")
      assert.are.same({ { from = 0, to = 1, sent = 1, received = 0, groups = false } }, issued.p2p_unmatched(all, seen))
    end)

    it("compares the collectives issued since the last call, leaving out a member on which one failed", function()
      local seen = {}
      local function colls(d0, f0, d1, f1)
        return issued.listed { { colls = ("0 0,1 1 %s %d\n"):format(d0, f0) }, { colls = ("0 0,1 1 %s %d\n"):format(d1, f1) } }
      end
      local found = issued.different(colls("0000000000000001", 0, "0000000000000002", 0), seen)
      assert.are.equal(1, found and #found)
      assert.are.same({ 0, 1 }, { found[1].a, found[1].b })
      -- rank 1's next collective failed (its transport told it): not compared, though the digests differ
      assert.is_nil(issued.different(colls("0000000000000003", 0, "0000000000000009", 1), seen))
      -- and the comparison after it covers only what came since
      assert.is_nil(issued.different(colls("0000000000000005", 0, "000000000000000b", 1), seen))
    end)
  end)

  describe("on several ranks", function()
    it("names the one failing rank (mpiexec -n 2)", function()
      if not have_mpiexec then pending("mpiexec not found") end
      local r = tpsh_test("-o plain " .. FIX .. "rank_fixture.lua", 2)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL rank fixture fails on rank 1 %[1%]$"), r.out)
      assert.is_true(has(r, "^PASS rank fixture raises on rank 2$"), r.out)
      assert.is_true(has(r, "^PASS rank fixture still runs collectives afterwards$"), r.out)
      assert.are.equal("3 passed, 1 failed, 0 skipped", last(r), r.out)
    end)

    it("names rank 2 for an error raised there, without hanging (mpiexec -n 3)", function()
      if not have_mpiexec then pending("mpiexec not found") end
      local r = tpsh_test("-o tap " .. FIX .. "rank_fixture.lua", 3)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^  ranks: %[2%]$"), r.out)
      assert.is_true(has(r, "rank 2 raised"), r.out)
      assert.are.equal("2 passed, 2 failed, 0 skipped", last(r), r.out)
    end)

    -- The runner's exchanges are on a group of their own: a host-side exchange that one rank calls alone
    -- waits for the others instead of pairing with the runner's exchange, which told later tests the
    -- outcome of earlier ones. The waiting rank's watchdog then finds the other rank at the runner's
    -- exchange, having begun fewer exchanges on the world, and ends the run at once (watchdog.c); with
    -- --timeout 100 the timeout cannot be what ends it.
    it("never pairs a collective that one rank calls alone with its own exchanges", function()
      if not have_mpiexec then pending("mpiexec not found") end
      for _, who in ipairs({ { alone = 1, other = 0, filter = "rank 1 only" }, { alone = 0, other = 1, filter = "rank 0 only" } }) do
        local r = run_tpsh("--backend cpu --timeout 100 test -o plain --filter '" .. who.filter .. "' --filter 'passes' "
          .. FIX .. "step_fixture.lua", 2)
        assert.are.equal(1, r.code, r.out)
        assert.is_false(has(r, "^PASS step fixture"), r.out)
        assert.is_false(has(r, "attempt to index"), r.out)
        -- the test named, with its place (the message said "this test" only)
        assert.is_true(has(r, ("^%%[rank %d%%] tpsh test: rank %d has finished test 'step fixture calls tp%%.allgather "
          .. "on rank %d only[^']*' %%(.*step_fixture%%.lua:%%d+%%) and waits for the other ranks at the runner's "
          .. "exchange; this rank has been blocked in tp%%.allgather"):format(who.alone, who.other, who.alone)), r.out)
        assert.is_true(has(r, ("this rank's host%%-side exchange is #%%d+ of group 0 %%(counted from 0%%), and rank %d "
          .. "has begun %%d+ there: it will not join it"):format(who.other)), r.out)
        assert.is_false(has(r, "tpsh watchdog:"), r.out)
      end
    end)

    it("says that ranks are out of step, and stops, when their runners are at different tests", function()
      if not have_mpiexec then pending("mpiexec not found") end
      local r = run_tpsh("--backend cpu --timeout 10 test -o plain --filter 'drops' --filter 'dropped' "
        .. "--filter 'never' " .. FIX .. "step_fixture.lua", 2)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL ranks are out of step %[1%]$"), r.out)
      assert.is_true(has(r, "ranks are out of step: rank 1 is at test 'step fixture is never reached', its result "
        .. "%(exchange %d+%), rank 0 at test 'step fixture is dropped on rank 1', its result"), r.out)
      assert.are.equal("1 passed, 1 failed, 0 skipped", last(r), r.out)
    end)

    -- A test that fails on rank 1 before a collective leaves the others waiting in it: the run ends
    -- within seconds (the blocked ranks' watchdogs ask after 1 s, watchdog.c), quoting rank 1's failure,
    -- not at the timeout (100 s). The first two tests fail on rank 1 without ending it (rank 0 waits 1 s
    -- for its own stream in one, long enough to ask).
    for _, np in ipairs({ 2, 3 }) do
      it(("ends the run quoting rank 1's failure when the others wait for it in a collective (mpiexec -n %d)")
          :format(np), function()
        if not have_mpiexec then pending("mpiexec not found") end
        local r = run_tpsh("--backend cpu --timeout 100 test -o plain " .. FIX .. "peer_fixture.lua", np)
        assert.are.equal(1, r.code, r.out)
        assert.is_true(has(r, "^FAIL peer fixture fails on rank 1 while rank 0 waits for its stream %[1%]$"), r.out)
        assert.is_true(has(r, "^FAIL peer fixture fails on rank 1 after the collective %[1%]$"), r.out)
        -- (rank 0 or, with 3 ranks, rank 2: whichever ends the run first)
        assert.is_true(has(r, "^%[rank [02]%] tpsh test: rank 1 failed test 'peer fixture fails on rank 1 before the "
          .. "collective' %(.*peer_fixture%.lua:%d+%) and waits for the other ranks at the runner's exchange; this rank "
          .. "has been blocked in a read to the host"), r.out)
        assert.is_true(has(r, "^%[rank [02]%]   test 'peer fixture fails on rank 1 before the collective': .*peer_fixture"
          .. "%.lua:%d+: Expected objects to be equal%.$"), r.out)
        assert.is_true(has(r, "^%[rank [02]%]   %(string%) 'the value rank 1 expected'$"), r.out)
        assert.is_true(has(r, "not known complete here: seq %d+ group 0: all_reduce f32 x 4"), r.out)
        assert.is_true(has(r, "this rank's all_reduce %(seq 1 of group 0%) is collective #1 of the group %(counted "
          .. "from 0, sends and receives aside%), and rank 1 has issued 1 there: it will not join it"), r.out)
        assert.is_false(has(r, "never reached"), r.out)
        assert.is_false(has(r, "tpsh watchdog:"), r.out)
      end)
    end

    -- Describe bodies run while the files load, before any test: a collective there that one rank never
    -- reaches (it raised first) waited for --timeout, and one left waiting was blamed on the first test.
    it("ends the run within seconds when a describe body fails on one rank before a collective", function()
      if not have_mpiexec then pending("mpiexec not found") end
      for _, np in ipairs({ 2, 3 }) do
        local r = run_tpsh("--backend cpu --timeout 100 test -o plain " .. FIX .. "load_peer_fixture.lua", np)
        assert.are.equal(1, r.code, r.out)
        assert.is_true(has(r, "^%[rank [02]%] tpsh test: rank 1 failed the body of describe 'load peer fixture' %(.*"
          .. "load_peer_fixture%.lua:%d+%) and waits for the other ranks at the runner's exchange; this rank has been "
          .. "blocked in tp%.barrier"), r.out)
        assert.is_true(has(r, "^%[rank [02]%]   the body of describe 'load peer fixture' %(.*load_peer_fixture%.lua:%d+%): "
          .. ".*load_peer_fixture%.lua:%d+: the describe body fails on rank 1$"), r.out)
        assert.is_false(has(r, "tpsh watchdog:"), r.out)
        assert.is_false(has(r, "never reached"), r.out)
      end
    end)

    it("fails the test during which an asynchronous error was noted and raised by none of its calls", function()
      if not have_mpiexec then pending("mpiexec not found") end
      -- `tpsh test` has no end-of-script synchronize: the error was raised by the next test's first wait,
      -- or, after the last test, by nothing, and the run passed
      local r = tpsh_test("-o plain " .. FIX .. "async_error_fixture.lua", 2)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL async error fixture notes an error that none of its calls raises %[0,1%]$"), r.out)
      assert.is_true(has(r, "an asynchronous error, noted during the test and raised by none of its calls: NCCL "
        .. "asynchronous error %(noted by the fixture%)"), r.out)
      assert.is_true(has(r, "^PASS async error fixture runs on without it$"), r.out)
      assert.is_true(has(r, "^PASS async error fixture raises it from w:elapsed, not as a Work not yet complete$"), r.out)
      assert.is_true(has(r, "^2 passed, 1 failed, 0 skipped$"), r.out)
    end)

    it("says that describe bodies left a collective waiting, blaming no test", function()
      if not have_mpiexec then pending("mpiexec not found") end
      local r = tpsh_test("-o plain " .. FIX .. "load_dangle_fixture.lua", 2)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL collectives left waiting %[0,1%]$"), r.out)
      assert.is_true(has(r, "after the body of describe 'load dangle fixture' %(.*%) the ranks have issued different "
        .. "numbers of collectives on group 0 %(world ranks 0,1%): rank 0 1, rank 1 0%."), r.out)
      assert.is_false(has(r, "issues nothing"), r.out)
      assert.is_true(has(r, "^0 passed, 1 failed, 0 skipped$"), r.out)
    end)

    it("stops, and ends every rank, when a test leaves a collective that one rank called alone", function()
      if not have_mpiexec then pending("mpiexec not found") end
      local r = run_tpsh("--backend cpu --timeout 100 test -o plain " .. FIX .. "dangle_fixture.lua", 2)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL dangle fixture enqueues an all_reduce on rank 0 only, then raises there %[0%]$"), r.out)
      assert.is_true(has(r, "^FAIL collectives left waiting %[0,1%]$"), r.out)
      assert.is_true(has(r, "after test 'dangle fixture enqueues an all_reduce on rank 0 only, then raises there' the "
        .. "ranks have issued different numbers of collectives on group 0 %(world ranks 0,1%): rank 0 1, rank 1 0%."), r.out)
      assert.is_true(has(r, "^0 passed, 2 failed, 0 skipped$"), r.out)
      assert.is_false(has(r, "never reached"), r.out)
      assert.is_false(has(r, "tpsh watchdog:"), r.out)
    end)

    it("says that no spec file was found where neither tests/ nor spec/ exists, failing no made-up test", function()
      if not have_mpiexec then pending("mpiexec not found") end
      local dir = tp.bcast(tp.rank == 0 and os.tmpname() or nil, 0)
      if tp.rank == 0 then os.remove(dir); os.execute("mkdir -p " .. dir) end
      tp.barrier()
      -- (run_tpsh's third argument is put after "export ": the cd rides along)
      local r = run_tpsh("--backend cpu --timeout 100 test -o plain", 1, "TPSH_UNUSED=1; cd " .. q(dir))
      if tp.rank == 0 then os.execute("rm -rf " .. dir) end
      assert.are.equal(1, r.code, r.out)
      assert.truthy(r.out:find("no spec files found: no path was given, and this directory has neither tests/ nor spec/",
        1, true), r.out)
      -- (the message is on stderr, the count on stdout: their order in r.out is not fixed)
      assert.is_true(has(r, "^0 passed, 0 failed, 0 skipped$"), r.out)
    end)

    it("names the first test that the ranks register differently", function()
      if not have_mpiexec then pending("mpiexec not found") end
      local r = run_tpsh("--backend cpu --timeout 100 test -o plain " .. FIX .. "names_differ_fixture.lua", 2)
      assert.are.equal(1, r.code, r.out)
      assert.truthy(r.out:find('registers other tests than rank 0 (2 against 2); the first difference: '
        .. '"it named b" here, "it named a" on rank 0', 1, true), r.out)
    end)

    it("stops the run after a test whose sends and receives do not match, naming the pair", function()
      if not have_mpiexec then pending("mpiexec not found") end
      -- the small send completed without a receiver (MPI's eager protocol): the test passed, the message
      -- was left for a later receive from rank 0 to take, and the run went on
      local r = run_tpsh("--backend cpu --timeout 100 test -o plain " .. FIX .. "p2p_fixture.lua", 3)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^PASS p2p fixture passes a ring in a batch, and sends to oneself$"), r.out)
      assert.is_true(has(r, "^FAIL sends and receives left unmatched %[0,2%]$"), r.out)
      assert.is_true(has(r, "in test 'p2p fixture sends from rank 0 to rank 2, which receives nothing' rank 0 sent 1 "
        .. "message%(s%) to rank 2, which received 0 from it %(a send that no rank receives is lost on the CPU backend, "
        .. "or taken by a later receive, and waits forever on NCCL%): the run stops here"), r.out)
      assert.is_falsy(r.out:find("never runs", 1, true), r.out)
    end)

    it("fails a test whose ranks issued different collectives that MPI completed, and goes on", function()
      if not have_mpiexec then pending("mpiexec not found") end
      local r = run_tpsh("--backend cpu --timeout 100 test -o plain " .. FIX .. "differ_fixture.lua", 3)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^PASS differ fixture agrees$"), r.out)
      assert.is_true(has(r, "^FAIL differ fixture reduces with sum on rank 0 and max elsewhere %[0%-2%]$"), r.out)
      assert.is_true(has(r, "in test 'differ fixture reduces with sum on rank 0 and max elsewhere' the ranks issued "
        .. "different collectives on group 0 %(world ranks 0,1,2%): as many as each other, but rank 0's and rank 1's "
        .. "differ in the kind, element type, count, root or reduce op of at least one%."), r.out)
      -- each test is compared on what it issued itself: the earlier difference is not charged again
      assert.is_true(has(r, "^PASS differ fixture agrees after the test that differed$"), r.out)
      assert.is_true(has(r, "^PASS differ fixture issues different collectives on groups of one rank each, which share "
        .. "an id$"), r.out)
      assert.is_true(has(r, "^FAIL differ fixture reduces with min on the last rank and max elsewhere, in a group of its "
        .. "own %[0%-2%]$"), r.out)
      assert.is_true(has(r, "on group %d+ %(world ranks 0,1,2%): as many as each other, but rank 0's and rank 2's differ"),
        r.out)
      assert.is_true(has(r, "^FAIL differ fixture reduces differently on ranks 0 and 1 after a broadcast failed on the "
        .. "last rank only %[0%-2%]$"), r.out)
      assert.is_true(has(r, "in test 'differ fixture reduces differently on ranks 0 and 1 after a broadcast failed on "
        .. "the last rank only' the ranks issued different collectives on group 0 %(world ranks 0,1,2%): as many as "
        .. "each other, but rank 0's and rank 1's differ"), r.out)
      assert.is_true(has(r, "^3 passed, 3 failed, 0 skipped$"), r.out)
    end)

    it("runs no test body on any rank when a before_each or setup failed on some (mpiexec -n 2)", function()
      if not have_mpiexec then pending("mpiexec not found") end
      local r = run_tpsh("--backend cpu --timeout 10 test -o plain " .. FIX .. "rank_hooks_fixture.lua", 2)
      assert.are.equal(1, r.code, r.out)
      assert.is_false(has(r, "watchdog"), r.out)
      assert.is_true(has(r, "^FAIL rank hooks fixture before_each fails on rank 1 has a collective in its body %[1%]$"), r.out)
      assert.is_true(has(r, "before_each of 'rank hooks fixture before_each fails on rank 1' failed: .*before_each "
        .. "broke on rank 1"), r.out)
      -- a setup that failed on one rank: its block's tests run on no rank (as busted, one failure)
      assert.is_true(has(r, "^FAIL rank hooks fixture setup fails on rank 1 %(setup%) %[1%]$"), r.out)
      assert.is_false(has(r, "has a collective in its body %[0"), r.out)
      assert.is_true(has(r, "setup of 'rank hooks fixture setup fails on rank 1' failed: .*setup broke on rank 1"), r.out)
      assert.is_true(has(r, "^PASS rank hooks fixture still runs collectives afterwards$"), r.out)
      assert.are.equal("1 passed, 2 failed, 0 skipped", last(r), r.out)
    end)
  end)

  describe("assert.tensor_close", function()
    it("shows shapes, dtypes and the max abs diff", function()
      if not tp.ones then pending("no tensors in this build") end
      local r = tpsh_test("-o plain " .. FIX .. "tensor_fixture.lua")
      assert.are.equal("3 passed, 8 failed, 0 skipped", last(r), r.out)
      -- the default tolerances, rtol 1e-5 and atol 1e-8
      assert.is_true(has(r, "^PASS tensor fixture default tolerances accept a relative difference of 1e%-6$"), r.out)
      assert.is_true(has(r, "^FAIL tensor fixture default tolerances refuse a relative difference of 1e%-4"), r.out)
      assert.is_true(has(r, "^FAIL tensor fixture default tolerances refuse an absolute difference of 1e%-6 at 0"), r.out)
      assert.is_true(has(r, "^FAIL tensor fixture reports far tensors"), r.out)
      assert.is_true(has(r, "assert.tensor_close: expected rtol %(argument 3%) as a number >= 0, got %-1"), r.out)
      assert.is_true(has(r, "assert.tensor_close: expected rtol %(argument 3%) as a number >= 0, got x"), r.out)
      assert.is_true(has(r, "assert.tensor_close: the tensors cannot be compared: tp.allclose: second tensor: "
        .. "expected shape %[2%], got %[2, 1%]"), r.out)
      assert.is_true(has(r, "assert.tensor_close: expected two tensors, got cdata and number"), r.out)
      assert.is_true(has(r, "shape {2,3} dtype f32"), r.out)
      assert.is_true(has(r, "shape {3,2} dtype f32"), r.out)
      assert.is_true(has(r, "max abs diff: 1"), r.out)
    end)
  end)
end)

describe("the command line", function()
  -- GNU timeout, itself sent SIGTERM, sends it to tpsh and then to its process group: two handlers at
  -- once on two threads each said the line (in 2 runs of 10 before). The signal comes once the script
  -- runs (it says "ready"): a fixed delay raced the start-up, and a signal before the handlers are
  -- installed (after MPI_Init) ends the process without a line.
  it("says 'ended by SIGTERM' once when the signal comes twice", function()
    local res = child.run(("for i in 1 2 3 4 5 6; do f=$(mktemp); timeout -s TERM 20 %s --backend cpu "
      .. "-e 'print(\"ready\"); while true do end' > \"$f\" 2>&1 & t=$!; n=0; "
      .. "until grep -q ready \"$f\" || [ $n -ge 200 ]; do sleep 0.05; n=$((n + 1)); done; "
      .. "kill -TERM $t; { wait $t; } 2>/dev/null; grep -v '^ready$' \"$f\"; rm -f \"$f\"; done"):format(q(EXE)), 60)
    local n = select(2, res.output:gsub("ended by SIGTERM", ""))
    assert.are.equal(6, n, res.output)
  end)

  it("names the argument that is wrong, prints the usage and exits 1", function()
    local cases = {
      { "--bogus x.lua", "unrecognised option: %-%-bogus$" },
      { "--timeout 0 x.lua", "%-%-timeout expects a finite number of seconds > 0: 0$" },
      { "--timeout abc x.lua", "%-%-timeout expects a finite number of seconds > 0: abc$" },
      { "--timeout nan x.lua", "%-%-timeout expects a finite number of seconds > 0: nan$" },
      { "--timeout inf x.lua", "%-%-timeout expects a finite number of seconds > 0: inf$" },
      { "--backend '' x.lua", "%-%-backend expects cpu or cuda: \"\"$" },
      { "--device -1 x.lua", "%-%-device expects a device index >= 0: %-1$" },
      -- the whole value must be a number, and --backend= must name one (main.c seconds, --device, --backend=)
      { "--timeout 5x x.lua", "%-%-timeout expects a finite number of seconds > 0: 5x$" },
      { "--device 1x x.lua", "%-%-device expects a device index >= 0: 1x$" },
      { "--backend= x.lua", "%-%-backend expects cpu or cuda: %-%-backend=$" },
      { "--timeout", "an option is missing its value: %-%-timeout$" },
      { "--trace=x.lua y.lua", "%-%-trace expects the trace's file name %(%.json, or %.svg for a picture%), not the "
        .. "script: %-%-trace=x%.lua$" },
      { "--trace '' x.lua", "%-%-trace expects the trace's file name %(%.json, or %.svg for a picture%), got an "
        .. "empty one: \"\"$" },
    }
    for _, c in ipairs(cases) do
      local r = run_tpsh(c[1])
      assert.are.equal(1, r.code, c[1] .. ": " .. r.out)
      assert.is_truthy(r.lines[1] and r.lines[1]:find(c[2]), c[1] .. ": " .. r.out)
      assert.is_true(has(r, "^usage:"), c[1] .. ": " .. r.out)
    end
    -- a bad setting in the environment is an error too, not the default (TPSH_CHECK=bogus used to
    -- run unchecked, TPSH_TIMEOUT=abc with 600 s)
    local env_cases = {
      { "TPSH_TIMEOUT=abc", "TPSH_TIMEOUT expects a finite number of seconds > 0: abc$" },
      { "TPSH_TIMEOUT=5x", "TPSH_TIMEOUT expects a finite number of seconds > 0: 5x$" },
      { "TPSH_FINALIZE_TIMEOUT=-1", "TPSH_FINALIZE_TIMEOUT expects a finite number of seconds > 0: %-1$" },
      { "TPSH_CHECK=bogus", "TPSH_CHECK expects 0, 1 or error: bogus$" },
      { "TPSH_COLL_TIMING=yes", "TPSH_COLL_TIMING expects 0 or 1: yes$" },
      { "TPSH_CPU_COLL_BLOCKING=2", "TPSH_CPU_COLL_BLOCKING expects 0 or 1: 2$" },
      { "TPSH_CPU_SPIN_US=-1", "TPSH_CPU_SPIN_US expects a number of microseconds from 0 to 1000000: %-1$" },
      { "TPSH_CPU_SPIN_US=50us", "TPSH_CPU_SPIN_US expects a number of microseconds from 0 to 1000000: 50us$" },
    }
    for _, c in ipairs(env_cases) do
      local r = run_tpsh("-e 'print(1)'", nil, c[1])
      assert.are.equal(1, r.code, c[1] .. ": " .. r.out)
      assert.is_truthy(r.lines[1] and r.lines[1]:find(c[2]), c[1] .. ": " .. r.out)
    end
    -- and the values the docs name still run
    for _, env in ipairs { "TPSH_CHECK=error", "TPSH_COLL_TIMING=1", "TPSH_CPU_COLL_BLOCKING=0", "TPSH_CHECK=",
      "TPSH_CPU_SPIN_US=0", "TPSH_CPU_SPIN_US=12.5" } do
      local r = run_tpsh("-e 'print(1)'", nil, env)
      assert.are.equal(0, r.code, env .. ": " .. r.out)
    end
  end)

  -- main.c: `test` is the subcommand only as tpsh's first word; after -e it names the script
  it("takes `test` after -e as the script's name, not as the test subcommand", function()
    local r = run_tpsh([[--backend cpu -e 'print(7)' test /nonexistent-tpsh-dir]])
    assert.are.equal(1, r.code, r.out)
    assert.is_true(has(r, "^7$"), r.out)
    assert.is_true(has(r, "cannot open test"), r.out)
  end)

  it("refuses a script as --trace's file before anything runs, leaving the script as it was", function()
    -- `tpsh --trace victim.lua`, the trace's file forgotten: the trace used to be written over the script.
    local path, text = nil, "print('the victim')\n"
    if tp.rank == 0 then
      path = os.tmpname()
      os.remove(path)
      path = path .. "_victim.lua"
      local f = assert(io.open(path, "w"))
      f:write(text)
      f:close()
    end
    path = tp.bcast(path, 0)
    local r = run_tpsh("--backend cpu --trace " .. q(path) .. " < /dev/null")
    local kept = take_file(path)
    assert.are.equal(1, r.code, r.out)
    assert.is_truthy(r.lines[1] and r.lines[1]:find("%-%-trace expects the trace's file name %(%.json, or %.svg for "
      .. "a picture%), not the script: " .. path:gsub("%p", "%%%0") .. "$"), r.out)
    assert.is_true(has(r, "^usage:"), r.out)
    assert.are.equal(text, kept, r.out)
  end)

  -- trace.lua: a --trace name ending in .svg, in any case, is drawn as a picture; any other is JSON
  it("writes --trace FILE as an SVG picture where FILE ends in .svg or .SVG, else as JSON", function()
    local base = tp.bcast(tp.rank == 0 and os.tmpname() or nil, 0)
    for _, ext in ipairs { ".svg", ".SVG", ".json" } do
      local r = run_tpsh("--backend cpu --trace " .. q(base .. ext) .. [[ -e 'tp.ones({8}):add_(1)']])
      local text = take_file(base .. ext)
      assert.are.equal(0, r.code, r.out)
      assert.is_string(text, ext .. ": no trace written: " .. r.out)
      if ext == ".json" then assert.is_truthy(text:find('^{"displayTimeUnit"'), ext .. ": " .. text:sub(1, 80))
      else assert.is_truthy(text:find("<svg", 1, true), ext .. ": " .. text:sub(1, 80)) end
    end
    if tp.rank == 0 then os.remove(base) end
  end)

  it("writes the --trace file at os.exit(0), and the failing rank's own records after an error", function()
    -- os.exit(0) skipped the end of the script: no trace, and nothing said
    local path = tp.rank == 0 and (os.tmpname() .. "_exit.json") or nil
    path = tp.bcast(path, 0)
    local own1 = path:gsub("%.json$", ".rank1.json")
    local np = have_mpiexec and 2 or nil
    local r = run_tpsh("--backend cpu --trace " .. q(path) .. [[ -e 'tp.ones({8}):add_(1); os.exit(0)']], np)
    local text = take_file(path)
    assert.are.equal(0, r.code, r.out)
    assert.is_string(text, "no trace written at os.exit(0): " .. r.out)
    assert.is_truthy(text:find('"name":"add"', 1, true), "the trace lacks the op")
    -- one rank: the trace of all ranks is this rank's, written to the file itself up to the error
    r = run_tpsh("--backend cpu --trace " .. q(path) .. [[ -e 'tp.ones({8}):add_(1); tp.synchronize(); error("boom")']])
    assert.are.equal(1, r.code, r.out)
    assert.is_true(has(r, "^%[rank 0%] tpsh: the run ended with status 1; %-%-trace .*_exit%.json holds its records up to then$"), r.out)
    text = take_file(path)
    assert.is_string(text, "no trace written after the error: " .. r.out)
    assert.is_truthy(text:find('"name":"add"', 1, true), text)
    assert.is_truthy(text:find('"run_ended_by_failure":{"0":{"status":1,"ops_not_finished":0,"ops_not_started":0,'
      .. '"message":"(command line):1: boom\\nstack traceback:', 1, true), text)
    -- the file cannot be written (its directory is gone): the line says why
    local dir = tp.bcast(tp.rank == 0 and (os.tmpname() .. "_dir") or nil, 0)
    if tp.rank == 0 then assert(os.execute("mkdir " .. q(dir)) == 0) end
    tp.barrier()
    r = run_tpsh("--backend cpu --trace " .. q(dir .. "/t.json") .. " -e " .. q("os.remove(" .. ("%q"):format(dir) .. [[) error("boom")]]))
    assert.are.equal(1, r.code, r.out)
    assert.is_true(has(r, "^%[rank 0%] tpsh: %-%-trace .*/t%.json was not written: the run ended with status 1 %(nor were "
      .. "this rank's own records: .*/t%.json: No such file or directory%)$"), r.out)
    if tp.rank == 0 then os.remove(dir) end
    if np then
      -- the failing rank writes its own records beside the file (the others are aborted by it), whichever
      -- rank it is
      r = run_tpsh("--backend cpu --trace " .. q(path) .. [[ -e 'if tp.rank == 1 then os.exit(4) end tp.barrier()']], np)
      assert.are.equal(4, r.code, r.out)
      assert.is_true(has(r, "^%[rank 1%] tpsh: %-%-trace .*_exit%.json was not written: the run ended with status 4; "
        .. "this rank's own records up to then are in .*_exit%.rank1%.json$"), r.out)
      assert.is_false(take_file(path), "a trace of all ranks was written after a failure")
      text = take_file(own1)
      assert.is_string(text, "no trace of rank 1's own: " .. r.out)
      assert.is_truthy(text:find('"run_ended_by_failure":{"1":{"status":4,"ops_not_finished":0,"ops_not_started":0}}', 1, true), text)
      -- an op a stream stood in when the run ended: drawn up to the end, and named so; what was queued
      -- behind it is counted
      r = run_tpsh("--backend cpu --trace " .. q(path) .. " -e " .. q([[if tp.rank == 1 then
          tp.world:all_reduce(tp.ones({4}), {async = true})
          tp.with_stream(tp.world:comm_stream(), function() tp.spin(1) end)
          local t = tp.now() while tp.now() - t < 300 do end error("one") end tp.barrier()]]), np)
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^%[rank 1%] tpsh: %-%-trace .* was not written: the run ended with status 1; "
        .. "this rank's own records up to then are in .*_exit%.rank1%.json %(1 op not finished, 1 not started%)$"), r.out)
      assert.is_false(take_file(path), "a trace of all ranks was written after a failure")
      text = take_file(own1)
      assert.is_string(text, "no trace of rank 1's own: " .. r.out)
      local dur = text:match('"name":"all_reduce %(not finished%)","cat":"comm","pid":2,"tid":%d+,"ts":[%d.]+,"dur":([%d.]+)')
      assert.is_truthy(dur, text)
      assert.is_true(tonumber(dur) >= 250e3, "the unfinished all_reduce should last until the error (us): " .. dur)
      assert.is_falsy(text:find('"name":"spin', 1, true), "the spin behind it never started: " .. text)
      assert.is_truthy(text:find('"ops_not_finished":1,"ops_not_started":1', 1, true), text)
    end
    -- a directory is refused before the run, as a script's name is
    r = run_tpsh("--backend cpu --trace /tmp -e 'print(1)'")
    assert.are.equal(1, r.code, r.out)
    assert.is_truthy(r.lines[1]:find("not a directory: /tmp$"), r.out)
  end)

  it("ends with status 66 when check mode's reports are left at the end of the script", function()
    local race = [[local s = tp.stream{name = "side"}; local x = tp.zeros{256}; tp.spin(20); x:fill_(1); ]]
      .. [[tp.with_stream(s, function() return x * 2 end); tp.synchronize(); ]]
    local np = have_mpiexec and 3 or nil
    local r = run_tpsh("--backend cpu --check -e '" .. race .. "'", np)
    assert.are.equal(66, r.code, r.out)
    assert.is_true(has(r, "^%[rank 0%] tpsh: the stream sanitizer made 1 report %(printed above%): exit status 66$"), r.out)
    -- one rank with reports is enough; a script that reads and clears them ends with 0, as one without
    r = run_tpsh("--backend cpu --check -e '" .. race .. "if tp.rank ~= 0 then tp.check.clear() end'", np)
    assert.are.equal(66, r.code, r.out)
    assert.are.equal(0, count(r, "^%[rank [12]%] tpsh: the stream sanitizer made"), r.out)
    r = run_tpsh("--backend cpu --check -e '" .. race .. "tp.check.clear()'", np)
    assert.are.equal(0, r.code, r.out)
    r = run_tpsh("--backend cpu -e '" .. race .. "'", np)
    assert.are.equal(0, r.code, r.out)
    -- at os.exit(0) as at the end of the script
    r = run_tpsh("--backend cpu --check -e '" .. race .. "os.exit(0)'", np)
    assert.are.equal(66, r.code, r.out)
  end)

  it("closes the Lua state at os.exit(0) as at the end of the script, running the __gc handlers", function()
    -- os.exit(0) shut the core down under a live Lua state and exited: no __gc ran, and every tensor a
    -- Lua value held was left allocated (LeakSanitizer's reports under scripts/ci/sanitize.sh)
    local gc = [[local ffi = require("ffi"); keep = ffi.gc(ffi.new("int[1]"), function() print("collected") end); ]]
      .. [[x = tp.ones({8}); ]]
    local r = run_tpsh("--backend cpu -e '" .. gc .. "os.exit(0)'")
    assert.are.equal(0, r.code, r.out)
    assert.is_true(has(r, "^collected$"), r.out)
    r = run_tpsh("--backend cpu -e '" .. gc .. "'")
    assert.are.equal(0, r.code, r.out)
    assert.is_true(has(r, "^collected$"), r.out)
  end)

  it("never ends with status 0 after a failing os.exit whose low 8 bits are 0 (os.exit(256))", function()
    local r = run_tpsh([[--backend cpu -e 'os.exit(256)']])
    assert.are.equal(1, r.code, r.out)
    r = run_tpsh([[--backend cpu -e 'os.exit(4294967296)']])
    assert.are.equal(1, r.code, r.out)
    if not have_mpiexec then return pending("mpiexec not found") end
    r = run_tpsh([[--backend cpu -e 'if tp.rank == 1 then os.exit(256) end; tp.barrier()']], 2)
    assert.are.equal(1, r.code, r.out)
  end)

  it("names the rank and says error: nil for error(nil), which carries no message", function()
    local r = run_tpsh([[--backend cpu -e 'error(nil)']])
    assert.are.equal(1, r.code, r.out)
    assert.is_true(has(r, "^%[rank 0%] error: nil$"), r.out)
    assert.is_true(has(r, "stack traceback"), r.out)
    r = run_tpsh([[--backend cpu -e 'error({})']])
    assert.are.equal(1, r.code, r.out)
    assert.is_true(has(r, "^%[rank 0%] error: a table value"), r.out)
    -- an error object whose __tostring raises: said, with the traceback ("error in error handling" before)
    r = run_tpsh([[--backend cpu -e 'error(setmetatable({}, {__tostring = function() error("inner") end}))']])
    assert.are.equal(1, r.code, r.out)
    assert.is_true(has(r, "^%[rank 0%] error: a table value whose __tostring raised an error %(.*inner%)$"), r.out)
    assert.is_true(has(r, "stack traceback"), r.out)
    if not have_mpiexec then return pending("mpiexec not found") end
    r = run_tpsh([[--backend cpu -e 'if tp.rank == 1 then error(nil) end; tp.barrier()']], 2)
    assert.are_not.equal(0, r.code, r.out)
    assert.is_true(has(r, "^%[rank 1%] error: nil$"), r.out)
  end)

  it("runs -e chunks with the script's arguments in arg, and exits with os.exit's status", function()
    local r = run_tpsh([[--backend cpu -e 'print(arg[1], #arg)' -e 'os.exit(3)' - a b < /dev/null]])
    assert.are.equal(3, r.code, r.out)
    assert.are.equal("a\t2", r.lines[1], r.out)
  end)

  -- `tpsh -` under mpiexec: only rank 0 has the standard input; the others waited in read() forever.
  it("runs `tpsh -` (the script on stdin) on every rank, #! line skipped and line numbers kept", function()
    if not have_mpiexec then pending("mpiexec not found") end
    local path = temp_file('#!/usr/bin/env tpsh\nprint("rank " .. tp.rank .. " " .. arg[1])\nerror("third line")\n')
    local r = run_tpsh("--backend cpu --timeout 60 - x < " .. q(path), 3)
    if tp.rank == 0 then os.remove(path) end
    assert.are.equal(1, r.code, r.out)
    for rank = 0, 2 do assert.is_true(has(r, "^rank " .. rank .. " x$"), r.out) end
    assert.is_true(has(r, "^%[rank %d%] stdin:3: third line$"), r.out)
    r = run_tpsh("--backend cpu --timeout 60 - < /dev/null", 2)
    assert.are.equal(0, r.code, r.out)
  end)

  -- mpiexec gives the ranks other than 0 a pipe it never writes nor closes: io.read() there waited
  -- until the watchdog; standard input is rank 0's, the others read end of file at once
  it("gives standard input to rank 0 only: io.read() on the other ranks returns nil", function()
    if not have_mpiexec then pending("mpiexec not found") end
    local path = temp_file("a line\n")
    local r = run_tpsh([[--backend cpu --timeout 60 -e 'print("read", tp.rank, io.read())' < ]] .. q(path), 3)
    if tp.rank == 0 then os.remove(path) end
    assert.are.equal(0, r.code, r.out)
    assert.is_true(has(r, "^read\t0\ta line$"), r.out)
    assert.is_true(has(r, "^read\t1\tnil$"), r.out)
    assert.is_true(has(r, "^read\t2\tnil$"), r.out)
  end)

  it("ends with status 1 and the rank's traceback on an uncaught error", function()
    local r = run_tpsh([[--backend cpu -e 'error("boom")']])
    assert.are.equal(1, r.code, r.out)
    assert.is_true(has(r, "^%[rank 0%] .*boom"), r.out)
    assert.is_true(has(r, "stack traceback"), r.out)
  end)

  it("finds out before the script runs that --trace's file cannot be written", function()
    local r = run_tpsh([[--backend cpu --trace /nonexistent-dir/x.json -e 'print("ran")']])
    assert.are.equal(1, r.code, r.out)
    assert.is_true(has(r, "^%[rank 0%] %-%-trace: cannot write the trace: /nonexistent%-dir/x%.json"), r.out)
    assert.is_false(has(r, "^ran$"), r.out)
    -- on every rank: rank 1 began the script while rank 0 alone had found out (audit, 2026-12-01)
    if not have_mpiexec then return end
    r = run_tpsh([[--backend cpu --trace /nonexistent-dir/x.json -e 'print("ran", tp.rank)']], 2)
    assert.are.equal(1, r.code, r.out)
    assert.is_false(has(r, "^ran%s"), r.out)
  end)

  it("says that a stream's error was found at the end of the script, not in a call it never made", function()
    if not have_mpiexec then return pending("mpiexec not found") end
    -- the ranks disagree on the count: MPI fails the all_reduce inside rank 0's stream, and nothing
    -- in the script waits for it
    local r = run_tpsh([[--backend cpu -e 'tp.world:all_reduce(tp.ones(tp.rank == 0 and 4 or 8))']], 2)
    assert.are_not.equal(0, r.code, r.out)
    assert.is_true(has(r, "at the end of the script, waiting for every stream: on stream 'default': all_reduce"), r.out)
    assert.is_false(has(r, "stack traceback"), r.out)   -- it would point into tpsh's end, not the script
  end)

  it("refuses an unknown backend by name", function()
    local r = run_tpsh([[--backend nope -e 'print(1)']])
    assert.are_not.equal(0, r.code, r.out)
    assert.is_true(has(r, "nope"), r.out)
  end)
end)
